//! The engine behind an initialized `TransferEngine` ([`Inner`]): starting it from `initialize`'s arguments, batches
//! with Mooncake's results, device and managed buffers, byte copies into and out of registered memory, notifications.
//!
//! `engine.rs` holds the Python class; every method there calls one of these with the GIL released, inside
//! `guarded`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use aiv_transport::config::{AivOptions, ProcessEnvironment};
use aiv_transport::device::DeviceBuffer;
use aiv_transport::engine::AivDevice;
use aiv_transport::metadata::handshake::{Frame, FrameKind, HandshakeClient};
use aiv_transport::metadata::MetadataOptions;
use aiv_transport::{BatchId, Opcode, Protocol, TransferState};

use crate::config;
use crate::memory::{self, HostAllocation};

/// The engine behind an initialized `TransferEngine`.
///
/// Field order is drop order: the buffers go before the device and the engine.
#[derive(Debug)]
pub(crate) struct Inner {
    /// Device buffers of `allocate_device_buffer`, by address.
    device_buffers: Mutex<BTreeMap<u64, DeviceBuffer>>,
    /// Host buffers of `allocate_managed_buffer`, by address (each one registered on its own).
    managed: Mutex<HashMap<u64, HostAllocation>>,
    /// Batches started with empty lists: Mooncake gives them an id whose status is success. Each holds an engine
    /// batch (so ids stay unique) with no task.
    empty_batches: Mutex<BTreeSet<u64>>,
    /// The engine's device, once this binding opened it (a device protocol, or `allocate_device_buffer`).
    device: Mutex<Option<Arc<AivDevice>>>,
    /// For Notify messages and probes.
    handshake: HandshakeClient,
    pub(crate) engine: aiv_transport::TransferEngine,
}

/// Device ids that an engine of this process has opened (see [`Inner::open_device`]).
static DEVICES_IN_USE: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

impl Drop for Inner {
    fn drop(&mut self) {
        if lock(&self.device).is_some() {
            lock(&DEVICES_IN_USE).remove(&self.engine.config().aiv.device_id);
        }
        let buffers = std::mem::take(&mut *lock(&self.device_buffers));
        for &addr in buffers.keys() {
            memory::forget_device_range(addr);
            let _ = self.engine.unregister_memory(addr);
        }
        drop(buffers);
        let managed = std::mem::take(&mut *lock(&self.managed));
        for &addr in managed.keys() {
            let _ = self.engine.unregister_memory(addr);
        }
    }
}

impl Inner {
    pub(crate) fn start(
        local_hostname: &str,
        server: &str,
        protocol: &str,
        device_name: &str,
        device_id: Option<u32>,
    ) -> Result<Inner, String> {
        let config = config::engine_config(local_hostname, server, protocol, device_name, device_id)?;
        let options = MetadataOptions::from_env(&ProcessEnvironment).map_err(|error| error.to_string())?;
        let handshake = HandshakeClient {
            connect_timeout: config.aiv.metadata_connect_timeout.unwrap_or(options.client_connect_timeout),
            deadline: config.aiv.metadata_deadline.unwrap_or(options.client_deadline),
        };
        let device_path = config.protocol.is_device_path();
        let engine = aiv_transport::TransferEngine::with_metadata_options(config, &options)
            .map_err(|error| error.to_string())?;
        let inner = Inner {
            device_buffers: Mutex::new(BTreeMap::new()),
            managed: Mutex::new(HashMap::new()),
            empty_batches: Mutex::new(BTreeSet::new()),
            device: Mutex::new(None),
            handshake,
            engine,
        };
        // A device protocol needs its transport before the first transfer: open the device now, so that a device
        // that cannot be opened fails initialize, as Mooncake's does when its transport cannot be installed.
        if device_path {
            inner.open_device().map_err(|error| format!("open the device: {error}"))?;
        }
        Ok(inner)
    }

    pub(crate) fn open_device(&self) -> Result<Arc<AivDevice>, String> {
        let mut slot = lock(&self.device);
        if let Some(device) = &*slot {
            return Ok(device.clone());
        }
        let id = self.engine.config().aiv.device_id;
        // One engine per device in a process: a second one would fail deep in the device's start-up.
        if !lock(&DEVICES_IN_USE).insert(id) {
            return Err(format!(
                "device {id} is already driven by another TransferEngine of this process; give this one another \
                 device with TransferEngine(device_id=N) (or \"aiv\": {{\"device_id\": N}} in mooncake.json)"
            ));
        }
        match self.engine.device() {
            Ok(device) => {
                *slot = Some(device.clone());
                Ok(device)
            }
            Err(error) => {
                lock(&DEVICES_IN_USE).remove(&id);
                Err(error.to_string())
            }
        }
    }

    pub(crate) fn register(&self, addr: u64, length: u64, location: &str) -> i32 {
        self.register_batch(&[addr], &[length], location)
    }

    /// The location a region is registered with: `"*"`/empty resolved to a device buffer's location, or -1 (as
    /// Mooncake's InvalidArgument) for a range partly inside a device buffer.
    fn resolve_location(&self, addr: u64, length: u64, location: &str) -> Result<String, i32> {
        match location.trim() {
            "*" | "" => match device_memory(Some(self), addr, length.max(1)) {
                Ok(Some(device)) => Ok(device.location()),
                Ok(None) => Ok("*".to_owned()),
                // Registered as Host memory it could reach a Host copy (tcp): refused, as Mooncake's InvalidArgument.
                Err(reason) => {
                    limited!(warn, addr, length, %reason, "register_memory refused");
                    Err(-1)
                }
            },
            other => Ok(other.to_owned()),
        }
    }

    /// Registers `addrs[i], lengths[i]` (lists of one length), all or nothing, with one publication of the
    /// descriptor: 0, or the code of the first region refused (none of them stays registered).
    pub(crate) fn register_batch(&self, addrs: &[u64], lengths: &[u64], location: &str) -> i32 {
        let mut locations = Vec::with_capacity(addrs.len());
        for (&addr, &length) in addrs.iter().zip(lengths) {
            match self.resolve_location(addr, length, location) {
                Ok(resolved) => locations.push(resolved),
                Err(code) => return code,
            }
        }
        let regions: Vec<(u64, u64, &str)> = addrs
            .iter()
            .zip(lengths)
            .zip(&locations)
            .map(|((&addr, &length), location)| (addr, length, location.as_str()))
            .collect();
        // SAFETY: Mooncake's contract, passed on to the Python caller (docs/python.md): each range is memory of this
        // process that stays valid until it is unregistered and every transfer using it has finished.
        match unsafe { self.engine.register_memory_batch(&regions) } {
            Ok(()) => 0,
            Err((index, error)) => {
                let (addr, length, location) = regions.get(index).copied().unwrap_or((0, 0, ""));
                limited!(warn, addr, length, location, index, %error, "register_memory failed");
                -error.mooncake_code()
            }
        }
    }

    pub(crate) fn unregister(&self, addr: u64) -> i32 {
        self.unregister_batch(&[addr])
    }

    /// Unregisters every buffer of `addrs` that is registered, with one publication of the descriptor: 0, or the
    /// code of the first address that starts no registered buffer.
    pub(crate) fn unregister_batch(&self, addrs: &[u64]) -> i32 {
        match self.engine.unregister_memory_batch(addrs) {
            Ok(()) => 0,
            Err(error) => {
                limited!(warn, %error, "unregister_memory failed");
                -error.mooncake_code()
            }
        }
    }

    /// Submits one batch; its id, or why not.
    pub(crate) fn submit(
        &self,
        opcode: Opcode,
        target: &str,
        buffers: &[u64],
        peers: &[u64],
        lengths: &[u64],
        hint: &str,
    ) -> Result<BatchId, String> {
        if buffers.is_empty() && peers.is_empty() && lengths.is_empty() {
            // Mooncake: an empty batch is a batch, finished at once (its status is success).
            let batch = self.engine.allocate_batch(1).map_err(|error| error.to_string())?;
            lock(&self.empty_batches).insert(batch.0);
            return Ok(batch);
        }
        // A segment a synchronous transfer to which failed is fetched again first (TransferEngine::suspect_segment).
        self.engine.refresh_if_suspect(target);
        let protocol = hint_protocol(&self.engine.config().aiv, hint);
        self.engine
            .batch_transfer_async_over(opcode, target, buffers, peers, lengths, protocol)
            .map_err(|error| error.to_string())
    }

    /// Waits for a batch (bounded by the transfer timeout), frees it, and says why it did not complete.
    pub(crate) fn finish(&self, batch: BatchId) -> Result<(), String> {
        if self.take_empty(batch) {
            return Ok(());
        }
        let outcome = match self.engine.wait_batch(batch) {
            Ok(status) if status.state == TransferState::Completed => Ok(()),
            Ok(status) => {
                Err(format!("{:?} after {} bytes: {}", status.state, status.transferred_bytes, self.reason(batch)))
            }
            // Unknown batch: nothing to free.
            Err(error) => return Err(error.to_string()),
        };
        if let Err(error) = self.engine.free_batch(batch) {
            limited!(warn, batch = batch.0, %error, "could not free the batch");
        }
        outcome
    }

    /// Frees `batch` if it is an empty batch (see [`Inner::empty_batches`]); whether it was.
    pub(crate) fn take_empty(&self, batch: BatchId) -> bool {
        if !lock(&self.empty_batches).remove(&batch.0) {
            return false;
        }
        if let Err(error) = self.engine.free_batch(batch) {
            limited!(warn, batch = batch.0, %error, "could not free the empty batch");
        }
        true
    }

    /// The first failure reason a task of the batch recorded.
    pub(crate) fn reason(&self, batch: BatchId) -> String {
        (0..)
            .map_while(|task| self.engine.task_reason(batch, task).ok())
            .enumerate()
            .find_map(|(task, reason)| reason.map(|reason| format!("task {task}: {reason}")))
            .unwrap_or_else(|| "no reason recorded".into())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sync(
        &self,
        opcode: Opcode,
        target: &str,
        buffers: &[u64],
        peers: &[u64],
        lengths: &[u64],
        notify: Option<(String, String)>,
        hint: &str,
    ) -> i32 {
        let operation = opcode.as_str();
        if buffers.is_empty() && peers.is_empty() && lengths.is_empty() && notify.is_none() {
            return 0;
        }
        let moved = if buffers.is_empty() && peers.is_empty() && lengths.is_empty() {
            Ok(())
        } else {
            self.submit(opcode, target, buffers, peers, lengths, hint).and_then(|batch| self.finish(batch))
        };
        if let Err(error) = moved {
            limited!(warn, operation, segment = %target, requests = buffers.len(), %error, "transfer failed");
            // The next submission to it fetches its descriptor again, so a peer restarted under the same name is
            // found with its new buffers. Mooncake's Python engine drops a segment when a submission fails and the
            // segment's status check fails too (docs/python.md says where the two differ).
            self.engine.suspect_segment(target);
            return -1;
        }
        if let Some((name, message)) = notify {
            if let Err(error) = self.notify(target, &name, &message) {
                limited!(warn, segment = %target, %error, "the transfer completed but its notify message was not delivered");
                return -1;
            }
        }
        0
    }

    pub(crate) fn start_batch(
        &self,
        opcode: Opcode,
        target: &str,
        buffers: &[u64],
        peers: &[u64],
        lengths: &[u64],
        hint: &str,
    ) -> u64 {
        match self.submit(opcode, target, buffers, peers, lengths, hint) {
            Ok(batch) => batch.0,
            Err(error) => {
                limited!(warn, operation = opcode.as_str(), segment = %target, requests = buffers.len(), %error, "could not start the transfer");
                0
            }
        }
    }

    pub(crate) fn wait_batches(&self, batch_ids: &[u64]) -> i32 {
        let mut failed = false;
        for &id in batch_ids {
            if let Err(error) = self.finish(BatchId(id)) {
                limited!(warn, batch = id, %error, "batch did not complete");
                failed = true;
            }
        }
        if failed {
            -1
        } else {
            0
        }
    }

    pub(crate) fn check(&self, batch_id: u64) -> i32 {
        let batch = BatchId(batch_id);
        if self.take_empty(batch) {
            return 1;
        }
        match self.engine.transfer_status(batch, 0) {
            Ok(status) => match status.state {
                TransferState::Completed => {
                    let _ = self.engine.free_batch(batch);
                    1
                }
                TransferState::Timeout => -2,
                TransferState::Waiting | TransferState::Pending => 0,
                state => {
                    limited!(warn, batch = batch_id, ?state, reason = %self.reason(batch), "transfer failed");
                    let _ = self.engine.free_batch(batch);
                    -1
                }
            },
            Err(error) => {
                limited!(warn, batch = batch_id, %error, "transfer_check_status failed");
                -1
            }
        }
    }

    pub(crate) fn notify(&self, target: &str, name: &str, message: &str) -> Result<(), String> {
        let rpc = self.engine.metadata().fetch_rpc_meta(target).map_err(|error| error.to_string())?;
        let payload = serde_json::json!({"name": name, "notify_msg": message}).to_string();
        let reply = self
            .handshake
            .exchange(&rpc.ip_or_host_name, rpc.rpc_port, &Frame::typed(FrameKind::Notify, payload))
            .map_err(|error| error.to_string())?;
        let answer: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap_or_default();
        if answer.get("notify_msg").and_then(serde_json::Value::as_str) == Some("success") {
            Ok(())
        } else {
            Err(format!("the peer did not accept it: {:?}", String::from_utf8_lossy(&reply.payload)))
        }
    }

    pub(crate) fn probe(&self, peer: &str) -> i32 {
        let result = self
            .engine
            .metadata()
            .fetch_rpc_meta(peer)
            .and_then(|rpc| self.handshake.probe(&rpc.ip_or_host_name, rpc.rpc_port));
        match result {
            Ok(()) => 0,
            Err(error) => {
                limited!(warn, peer = %peer, %error, "send_probe failed");
                -error.mooncake_code()
            }
        }
    }

    pub(crate) fn allocate_managed(&self, length: u64) -> u64 {
        let Some(buffer) = HostAllocation::new(length) else {
            limited!(warn, length, "allocate_managed_buffer: cannot allocate that many bytes");
            return 0;
        };
        let addr = buffer.addr();
        // SAFETY: the allocation is owned by this engine and outlives its registration (freed only after
        // unregistering, in free_managed or when the engine is dropped).
        if let Err(error) = unsafe { self.engine.register_memory(addr, buffer.len(), "*") } {
            limited!(warn, length, %error, "allocate_managed_buffer: cannot register the buffer");
            return 0;
        }
        lock(&self.managed).insert(addr, buffer);
        addr
    }

    pub(crate) fn free_managed(&self, addr: u64, length: u64) -> i32 {
        let Some(buffer) = lock(&self.managed).remove(&addr) else {
            limited!(warn, addr, length, "free_managed_buffer: not an address allocate_managed_buffer returned");
            return -1;
        };
        let _ = self.engine.unregister_memory(addr);
        drop(buffer);
        0
    }

    pub(crate) fn allocate_device(&self, length: u64) -> u64 {
        let device = match self.open_device() {
            Ok(device) => device,
            Err(error) => {
                limited!(warn, length, %error, "allocate_device_buffer: the device cannot be opened");
                return 0;
            }
        };
        match device.allocate(length) {
            Ok(buffer) => {
                let addr = buffer.addr();
                memory::record_device_range(addr, buffer.len(), &device);
                lock(&self.device_buffers).insert(addr, buffer);
                addr
            }
            Err(error) => {
                limited!(warn, length, %error, "allocate_device_buffer failed");
                0
            }
        }
    }

    pub(crate) fn free_device(&self, addr: u64) -> i32 {
        let Some(buffer) = lock(&self.device_buffers).remove(&addr) else {
            limited!(warn, addr, "free_device_buffer: not an address allocate_device_buffer returned");
            return -1;
        };
        memory::forget_device_range(addr);
        let _ = self.engine.unregister_memory(addr);
        drop(buffer);
        0
    }
}

/// The device whose memory `[addr, addr + length)` is: a buffer the binding allocated (any engine's), or memory of
/// `inner`'s open device at either end of the range (that device refuses what it does not map). A range that runs
/// over the edge of an allocated device buffer is refused: the Host never copies device memory itself, and a copy
/// must not run past a buffer.
fn device_memory(inner: Option<&Inner>, addr: u64, length: u64) -> Result<Option<Arc<AivDevice>>, String> {
    match memory::device_range(addr, length) {
        memory::DeviceRange::Inside(device) => return Ok(Some(device)),
        memory::DeviceRange::Partial { start, length: size } => {
            return Err(format!("[{addr:#x}, +{length}) runs over the edge of the device buffer [{start:#x}, +{size})"))
        }
        memory::DeviceRange::Outside => {}
    }
    let Some(device) = inner.and_then(|inner| lock(&inner.device).clone()) else { return Ok(None) };
    let last = addr.saturating_add(length.max(1) - 1);
    let backend = device.backend();
    Ok((backend.is_own_memory(addr, 1) || backend.is_own_memory(last, 1)).then_some(device))
}

pub(crate) fn write_bytes(inner: Option<&Inner>, addr: u64, data: &[u8], length: u64) -> i32 {
    let Some(data) = usize::try_from(length).ok().and_then(|length| data.get(..length)) else {
        limited!(warn, length, given = data.len(), "write_bytes_to_buffer: length exceeds the bytes given");
        return -1;
    };
    if data.is_empty() {
        return 0;
    }
    if let Err(reason) = memory::check_host_range(addr, length) {
        limited!(warn, addr, length, %reason, "write_bytes_to_buffer refused");
        return -1;
    }
    let device = match device_memory(inner, addr, length) {
        Ok(device) => device,
        Err(reason) => {
            limited!(warn, addr, length, %reason, "write_bytes_to_buffer refused");
            return -1;
        }
    };
    if let Some(device) = device {
        return match device.write(addr, data) {
            Ok(()) => 0,
            Err(error) => {
                limited!(warn, addr, length, %error, "write_bytes_to_buffer: the device refused the copy");
                -1
            }
        };
    }
    // SAFETY: Host memory at an address the caller gave, as Mooncake's write_bytes_to_buffer copies to it: the
    // caller guarantees it is writable memory of this process (docs/python.md); an unmapped page is an error of
    // the checked copy. Device memory never gets here.
    match unsafe { memory::write_host(addr, data) } {
        Ok(()) => 0,
        Err(reason) => {
            limited!(warn, addr, length, %reason, "write_bytes_to_buffer failed");
            -1
        }
    }
}

/// Why `read_bytes_from_buffer` could not read.
pub(crate) enum ReadError {
    Argument(String),
    Memory(String),
    Device(String),
}

impl From<String> for ReadError {
    fn from(message: String) -> Self {
        ReadError::Device(message)
    }
}

impl From<&str> for ReadError {
    fn from(message: &str) -> Self {
        ReadError::Device(message.to_owned())
    }
}

pub(crate) fn read_bytes(inner: Option<&Inner>, addr: u64, length: u64) -> Result<Vec<u8>, ReadError> {
    let size = usize::try_from(length).map_err(|_| ReadError::Argument(format!("length {length} is too large")))?;
    if size == 0 {
        return Ok(Vec::new());
    }
    memory::check_host_range(addr, length).map_err(ReadError::Argument)?;
    let mut out = Vec::new();
    out.try_reserve_exact(size)
        .map_err(|_| ReadError::Memory(format!("cannot allocate {length} bytes to read into")))?;
    if let Some(device) = device_memory(inner, addr, length).map_err(ReadError::Argument)? {
        out.resize(size, 0);
        device
            .read(addr, &mut out)
            .map_err(|error| format!("the device refused to copy [{addr:#x}, +{length}): {error}"))?;
        return Ok(out);
    }
    // SAFETY: Host memory at an address the caller gave, as Mooncake's read_bytes_from_buffer reads it: the caller
    // guarantees it is readable memory of this process (docs/python.md); an unmapped page is an error of the
    // checked copy. Device memory never gets here.
    unsafe { memory::read_host(addr, &mut out, size) }.map_err(ReadError::Argument)?;
    Ok(out)
}

/// The protocol a `transport_hint` names, if it names one of this engine's (`"ascend"` as the configuration maps it,
/// [`AivOptions::resolve_protocol`]); other hints are ignored, as Mooncake's builds without its TENT runtime ignore
/// them.
fn hint_protocol(options: &AivOptions, hint: &str) -> Option<Protocol> {
    if hint.trim().is_empty() {
        return None;
    }
    let protocol = options.resolve_protocol(hint).ok();
    if protocol.is_none() {
        tracing::debug!(hint, "transport_hint names no protocol of this engine; ignored");
    }
    protocol
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
