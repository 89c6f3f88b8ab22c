//! The HiXL client's state and life: its table entry, registrations, the hello and connect (with the device path's
//! imports), the server's registrations as `HixlCSClientGetRemoteMem` returns them, destroy, and the twin-only
//! evidence call.

use core::ffi::{c_char, c_void};
use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::*;

use super::batch::run_client;
use super::common::{
    bind_device, device_bound_if, guard, ip_address, lock, not_null, region_of, Region, HELLO_ANSWER_BYTES,
    HELLO_ENTRY_BYTES, MAGIC, MAX_REGISTRATIONS, MAX_TAG_LEN, VERSION,
};
use super::device;
use super::device::RegionExport;
use super::server::{add_registration, remove_registration};
use super::socket::{read_full, u32_at, u64_at, write_full, Io};

/// The final or current state of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Waiting,
    Completed,
    Failed,
    Timeout,
}

#[derive(Debug)]
pub(super) struct Batch {
    pub(super) put: bool,
    pub(super) entries: Vec<HixlOneSideOpDesc>,
    pub(super) deadline: Instant,
    /// The wire path's outcome (the client's worker sets it).
    pub(super) outcome: Mutex<Outcome>,
    pub(super) done: Condvar,
    /// On the device path: the batch's launches, Host flag and error status (its outcome is read from them).
    pub(super) device: Option<device::DeviceBatch>,
}

impl Batch {
    pub(super) fn finish(&self, outcome: Outcome) {
        *lock(&self.outcome) = outcome;
        self.done.notify_all();
    }
}

#[derive(Debug)]
pub(super) struct Connection {
    pub(super) remote: Vec<Region>,
    pub(super) queue: mpsc::Sender<Arc<Batch>>,
    pub(super) stream: TcpStream,
    pub(super) thread: JoinHandle<()>,
    /// The server's registrations imported for the device path (`None`: every batch takes the wire path).
    pub(super) imports: Option<device::Imports>,
}

impl Connection {
    /// Ends the connection: its link revoked (device batches on it stop), the socket shut, the worker joined (bounded:
    /// it checks its stop flag at least every 100 ms). The imports are handed back, to be dropped once the client's
    /// stream no longer runs a batch that uses them.
    pub(super) fn close(self) -> Option<device::Imports> {
        if let Some(imports) = &self.imports {
            imports.link.revoke();
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        drop(self.queue);
        let _ = self.thread.join();
        self.imports
    }
}

#[derive(Debug, Default)]
pub(super) struct ClientState {
    pub(super) local: Vec<(usize, Region)>,
    pub(super) connection: Option<Connection>,
    /// Batches not yet seen final by a query.
    pub(super) pending: HashMap<usize, Arc<Batch>>,
    pub(super) next_batch: usize,
    /// What the last `HixlCSClientGetRemoteMem` handed out (kept until the next call or destroy).
    pub(super) remote_view: Option<RemoteView>,
    /// The client's device resources (its stream, the constant 1), made at its first connect with imports.
    pub(super) slot: Option<device::Slot>,
    /// Device batches seen final (or abandoned) while their launches or Host-flag copy still ran: dropped once quiet.
    pub(super) retired: Vec<Arc<Batch>>,
    /// Imports of connections that ended while batches may still have used them: dropped once the stream is idle.
    pub(super) old_imports: Vec<device::Imports>,
}

impl ClientState {
    /// Drops the retired device batches that no longer run.
    pub(super) fn reap(&mut self) {
        self.retired.retain(|batch| !batch.device.as_ref().is_none_or(device::DeviceBatch::quiet));
        if self.retired.is_empty() && self.pending.values().all(|batch| batch.device.is_none()) {
            self.old_imports.clear();
        }
    }
}

/// The server's registrations as `HixlCSClientGetRemoteMem` returns them: arrays this module owns.
#[derive(Debug)]
pub(super) struct RemoteView {
    pub(super) mems: Vec<CommMem>,
    pub(super) _tags: Vec<std::ffi::CString>,
    pub(super) tag_ptrs: Vec<*mut c_char>,
}

// SAFETY: the pointers point into the view's own `_tags` (heap buffers that do not move), read only by the caller.
unsafe impl Send for RemoteView {}

#[derive(Debug)]
pub(super) struct Client {
    pub(super) address: SocketAddr,
    /// As [`super::server::Server::device`].
    pub(super) device: Option<i32>,
    pub(super) state: Mutex<ClientState>,
    pub(super) stop: Arc<AtomicBool>,
    /// Set when the connection failed: later batches fail at once.
    pub(super) broken: Arc<AtomicBool>,
    /// Its counts ([`cannTwinHixlClientEvidence`]).
    pub(super) tallies: Arc<device::Tallies>,
}

// SAFETY: a HixlOneSideOpDesc is plain addresses (integers to this module: every access goes through aclrtMemcpy).
unsafe impl Send for Batch {}
// SAFETY: as above; the mutable parts are behind a mutex.
unsafe impl Sync for Batch {}

pub(super) fn client_of(handle: HixlClientHandle) -> Result<Arc<Client>, HixlStatus> {
    clients().items.get(&(handle as usize)).cloned().ok_or(HIXL_PARAM_INVALID)
}

/// `HixlCSClientCreate`: records the server's address (`server_ip`, `server_port`); the endpoints are not modelled.
///
/// # Safety
/// The C contract: pointers are null or valid for reading (`client_handle` for writing).
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientCreate(
    client_desc: *const HixlClientDesc,
    config: *const HixlClientConfig,
    client_handle: *mut HixlClientHandle,
) -> HixlStatus {
    guard(|| {
        not_null(client_desc)?;
        not_null(client_handle)?;
        // The documentation refuses a null config; its JSON (ports, channels, QoS) is not modelled.
        not_null(config)?;
        // SAFETY: non-null, readable by the C contract.
        let desc = unsafe { client_desc.read() };
        not_null(desc.local_endpoint)?;
        not_null(desc.remote_endpoint)?;
        let address = ip_address(desc.server_ip, desc.server_port)?;
        // SAFETY: non-null, readable by the C contract.
        device_bound_if(&[unsafe { desc.local_endpoint.read() }])?;
        let client = Arc::new(Client {
            address,
            device: crate::runtime::runtime().current_device().ok(),
            state: Mutex::default(),
            stop: Arc::new(AtomicBool::new(false)),
            broken: Arc::new(AtomicBool::new(false)),
            tallies: Arc::default(),
        });
        let id = clients().insert(client);
        // SAFETY: non-null, writable by the C contract.
        unsafe { client_handle.write(id as HixlClientHandle) };
        Ok(())
    })
}

/// `HixlCSClientRegMem`: local memory batches may name.
///
/// # Safety
/// The C contract; `mem` stays allocated until unregistered.
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientRegMem(
    client_handle: HixlClientHandle,
    mem_tag: *const c_char,
    mem: *const CommMem,
    mem_handle: *mut MemHandle,
) -> HixlStatus {
    guard(|| {
        let client = client_of(client_handle)?;
        not_null(mem_handle)?;
        let region = region_of(mem, mem_tag)?;
        let mut state = lock(&client.state);
        let id = add_registration(&mut state.local, region)?;
        // SAFETY: non-null, writable by the C contract.
        unsafe { mem_handle.write(id as MemHandle) };
        Ok(())
    })
}

/// `HixlCSClientUnregMem`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientUnregMem(client_handle: HixlClientHandle, mem_handle: MemHandle) -> HixlStatus {
    guard(|| {
        let client = client_of(client_handle)?;
        let mut state = lock(&client.state);
        remove_registration(&mut state.local, mem_handle)?;
        Ok(())
    })
}

/// What the hello answer gave: the stream, the server's registrations, its registry's token.
pub(super) type Hello = (TcpStream, Vec<Region>, u64);

pub(super) fn hello(address: SocketAddr, deadline: Instant, stop: &AtomicBool) -> Result<Hello, HixlStatus> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HIXL_TIMEOUT);
    }
    let mut stream = TcpStream::connect_timeout(&address, left).map_err(|e| match e.kind() {
        ErrorKind::TimedOut | ErrorKind::WouldBlock => HIXL_TIMEOUT,
        _ => HIXL_FAILED,
    })?;
    let _ = stream.set_nodelay(true);
    let io = |e: Io| if e == Io::Timeout { HIXL_TIMEOUT } else { HIXL_FAILED };
    let mut request = [0u8; 12];
    request[..8].copy_from_slice(MAGIC);
    request[8..].copy_from_slice(&VERSION.to_le_bytes());
    write_full(&mut stream, &request, deadline, stop).map_err(io)?;
    let mut head = [0u8; HELLO_ANSWER_BYTES];
    read_full(&mut stream, &mut head, Some(deadline), stop).map_err(io)?;
    let count = u32_at(&head, 12) as usize;
    if &head[..8] != MAGIC || u32_at(&head, 8) != HIXL_SUCCESS || count > MAX_REGISTRATIONS {
        return Err(HIXL_FAILED);
    }
    let registry = u64_at(&head, 16);
    let mut remote = Vec::with_capacity(count);
    for _ in 0..count {
        let mut entry = [0u8; HELLO_ENTRY_BYTES];
        read_full(&mut stream, &mut entry, Some(deadline), stop).map_err(io)?;
        let tag_len = u32_at(&entry, 20) as usize;
        if tag_len > MAX_TAG_LEN {
            return Err(HIXL_FAILED);
        }
        let mut tag = vec![0u8; tag_len];
        read_full(&mut stream, &mut tag, Some(deadline), stop).map_err(io)?;
        let kind = u32_at(&entry, 16) as i32;
        let (token, stamp, slot) = (u64_at(&entry, 24), u64_at(&entry, 32), u32_at(&entry, 40));
        let export =
            (token != 0 && (slot as usize) < device::REGISTRY_SLOTS).then_some(RegionExport { token, slot, stamp });
        remote.push(Region { addr: u64_at(&entry, 0), size: u64_at(&entry, 8), kind, tag, export });
    }
    Ok((stream, remote, registry))
}

/// `HixlCSClientConnect`: TCP connect and hello, both within `timeout_ms` (`HIXL_TIMEOUT` past it). A client with a
/// device then imports the server's exported DEVICE registrations into its own device address space (the device
/// path); what cannot be imported is left to the wire path.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientConnect(client_handle: HixlClientHandle, timeout_ms: u32) -> HixlStatus {
    guard(|| {
        let client = client_of(client_handle)?;
        if timeout_ms == 0 {
            return Err(HIXL_PARAM_INVALID);
        }
        let mut state = lock(&client.state);
        if state.connection.is_some() {
            if !client.broken.load(Ordering::Relaxed) {
                return Err(HIXL_PARAM_INVALID);
            }
            // A connection that failed is replaced: its worker has failed or fails every batch it holds, and the
            // device batches on its link stop.
            if let Some(imports) = state.connection.take().and_then(Connection::close) {
                state.old_imports.push(imports);
            }
            state.reap();
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        let (stream, remote, registry) = hello(client.address, deadline, &client.stop)?;
        let imports = match client.device {
            Some(device) => {
                let imports = device::import(registry, &remote);
                if imports.is_some() && state.slot.is_none() {
                    state.slot = device::Slot::new(device).ok();
                }
                imports.filter(|_| state.slot.is_some())
            }
            None => None,
        };
        let worker_stream = stream.try_clone().map_err(|_| HIXL_FAILED)?;
        let (queue, batches) = mpsc::channel::<Arc<Batch>>();
        let (stop, broken, device) = (client.stop.clone(), client.broken.clone(), client.device);
        let (link, tallies) = (imports.as_ref().map(|imports| Arc::clone(&imports.link)), client.tallies.clone());
        client.broken.store(false, Ordering::Relaxed);
        let thread = std::thread::Builder::new()
            .name(format!("{}hixl-client", crate::THREAD_PREFIX))
            .spawn(move || {
                bind_device(device);
                run_client(worker_stream, batches, &stop, &broken, link.as_deref(), &tallies)
            })
            .map_err(|_| HIXL_FAILED)?;
        state.connection = Some(Connection { remote, queue, stream, thread, imports });
        Ok(())
    })
}

/// `HixlCSClientGetRemoteMem` (in `hixl_cs.h`, not in `HixlApi`): the server's registrations as the connection
/// received them; the arrays stay valid until the next call or `HixlCSClientDestroy`. `timeout_ms` is not needed:
/// the list came with the connect.
///
/// # Safety
/// The C contract: the three output pointers are null or writable.
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientGetRemoteMem(
    client_handle: HixlClientHandle,
    remote_mem_list: *mut *mut CommMem,
    mem_tag_list: *mut *mut *mut c_char,
    list_num: *mut u32,
    timeout_ms: u32,
) -> HixlStatus {
    guard(|| {
        let client = client_of(client_handle)?;
        not_null(remote_mem_list)?;
        not_null(mem_tag_list)?;
        not_null(list_num)?;
        let _ = timeout_ms;
        let mut state = lock(&client.state);
        let Some(connection) = state.connection.as_ref() else { return Err(HIXL_FAILED) };
        let mems: Vec<CommMem> = connection
            .remote
            .iter()
            .map(|r| CommMem { r#type: CommMemType(r.kind), addr: r.addr as *mut c_void, size: r.size })
            .collect();
        let tags: Vec<std::ffi::CString> = connection
            .remote
            .iter()
            .map(|r| std::ffi::CString::new(r.tag.iter().copied().filter(|&b| b != 0).collect::<Vec<u8>>()))
            .collect::<Result<_, _>>()
            .map_err(|_| HIXL_FAILED)?;
        let tag_ptrs: Vec<*mut c_char> = tags.iter().map(|t| t.as_ptr().cast_mut()).collect();
        let mut view = RemoteView { mems, _tags: tags, tag_ptrs };
        // SAFETY: all three checked non-null, writable by the C contract; the arrays live in `state` until replaced.
        unsafe {
            remote_mem_list.write(view.mems.as_mut_ptr());
            mem_tag_list.write(view.tag_ptrs.as_mut_ptr());
            list_num.write(view.mems.len() as u32);
        }
        state.remote_view = Some(view);
        Ok(())
    })
}

/// `HixlCSClientDestroy`: closes the connection, fails queued batches, forgets the handle (bounded: the worker
/// checks its stop flag at least every 100 ms).
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientDestroy(client_handle: HixlClientHandle) -> HixlStatus {
    guard(|| {
        let client = clients().items.remove(&(client_handle as usize)).ok_or(HIXL_PARAM_INVALID)?;
        client.stop.store(true, Ordering::Relaxed);
        let mut state = std::mem::take(&mut *lock(&client.state));
        // The link revoked first: the device batches still queued or running stop at their next check.
        let imports = state.connection.take().and_then(Connection::close);
        // Every task of the stream runs (at once, for a revoked link), then the worker is joined.
        drop(state.slot.take());
        drop(state);
        // Nothing uses the windows any more.
        drop(imports);
        Ok(())
    })
}

/// **Twin-only, not a HiXL API** (the vendor's library has no such function; `ascendcl_sys::hixl::HixlApi` declares
/// it optional): the counts of one client ([`CannTwinHixlEvidence`]), made where each act happened: the AI-CPU ops'
/// SQEs, doorbells and flags from the consumption log of the AI CPU's channel, the launches the client made, the wire
/// path's Host copies. The caller sets `version` ([`TWIN_HIXL_EVIDENCE_VERSION`]) and `size` (at least the
/// structure's); `HIXL_PARAM_INVALID` for an unknown client, a null pointer, another version or a smaller size
/// (nothing written).
///
/// # Safety
/// `evidence` is null or points to `evidence->size` writable bytes, aligned for a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cannTwinHixlClientEvidence(
    client_handle: HixlClientHandle,
    evidence: *mut CannTwinHixlEvidence,
) -> HixlStatus {
    guard(|| {
        let client = client_of(client_handle)?;
        not_null(evidence)?;
        // SAFETY: non-null; the contract makes the two header words readable.
        let (version, size) = unsafe { ((*evidence).version, (*evidence).size) };
        if version != TWIN_HIXL_EVIDENCE_VERSION || (size as usize) < core::mem::size_of::<CannTwinHixlEvidence>() {
            return Err(HIXL_PARAM_INVALID);
        }
        // SAFETY: non-null, at least the structure's size and aligned (checked and the contract).
        unsafe { evidence.write(client.tallies.snapshot()) };
        Ok(())
    })
}

/// The clients of this process by handle.
pub(super) fn clients() -> std::sync::MutexGuard<'static, super::common::Table<Client>> {
    static CLIENTS: Mutex<super::common::Table<Client>> = Mutex::new(super::common::Table::new(0x4000_0000));
    lock(&CLIENTS)
}
