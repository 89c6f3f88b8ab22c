//! **Twin-only, not a CANN API**: HiXL's FabricMem engine (`hicann/hixl` `src/hixl/engine/fabric_mem_engine.cc`,
//! `src/hixl/fabric_mem/`) for the twin's `adxl::AdxlEngine` (`cxx/adxl_engine.cpp`, which calls the C functions
//! `cannTwinFabricMem*` below, resolved at run time). *Twin runtime, unverified on hardware.*
//!
//! - **Memory** (`fabric_mem_memory.cc`, facts B.4 of the vendor's code): each local DEVICE registration is exported
//!   when it is registered and the peer imports and maps it at connect, into its own device address space. The
//!   vendor exports with `aclrtMemExportToShareableHandleV2`, which needs a physical allocation; Mooncake registers
//!   `aclrtMalloc` memory, so the twin exports the heap range (or mapping) behind a registration with its range
//!   export (`vmm_share::export_range`, the HiXL server's: this engine's control server *is* a server of module
//!   `hixl`, listening on the engine's own `ip:port`; the vendor's `FabricMemControlServer` serves the share handles
//!   over TCP and `FabricMemControlClient::Fetch` gets them). A local HOST registration gets a device window of this
//!   process (the vendor imports Host memory back locally onto a VMM address). Remote HOST registrations are not
//!   exported by the twin (its Host memory is no memfd): a transfer naming one is `PARAM_INVALID` (a *twin limit*).
//! - **Addresses** (`ResolveTransferAddrs`, `fabric_mem_transfer_service.cc`): every remote range is relocated into
//!   the local mapping of the import it lies in, every local range into its registration's device address, so the
//!   copies are between local device addresses (`LINK_ONCHIP`, `fabric_mem_a3_rtsq.h`).
//! - **AI-CPU unfold** (`fabric_mem_aicpu_dispatcher.cc`, the default): the descriptor list uploaded to device memory,
//!   one AI-CPU launch per 128 descriptors on the engine's stream, each writing the SDMA SQEs into the AI CPU's own
//!   channel, committing the tail and polling its completion word: the HiXL client-server device path's batch op
//!   (module `device`: [`super::device::launch`]), one way to do it. The Sync calls wait for the stream
//!   (`aclrtSynchronizeStreamWithTimeout` on the control stream in the vendor's); the Async ones read a Host flag
//!   the stream sets after the launches.
//! - **Host unfold** (`fabric_mem_host_transfer_service.cc`): one `aclrtMemcpyAsync` (device to device) per
//!   operation, round-robin over `task_stream_num` streams; Sync: each stream synchronised; Async: a device
//!   constant 1 copied into a Host flag per stream, polled, then each stream synchronised (`host_transfer_service.cc`).
//!   Those are the ACL functions of this runtime, so its evidence counts them as the Host's copies.
//!
//! **Records** (twin-only, [`cannTwinFabricMemEvidence`], the structure of `cannTwinHixlClientEvidence`): an
//! engine counts, where each act happens, its batches (`device_batches`: run by AI-CPU launches, `wire_batches`: moved
//! by Host copies), its AI-CPU launches and the SQEs, doorbells and flags the AI CPU's channel log shows for them, and
//! each `aclrtMemcpyAsync` it made for data (`host_copies`). A test-only mis-wiring
//! ([`crate::control::fabric_mem_host_copies`]) makes an AI-CPU-unfold engine copy with the Host instead: the records
//! then name the Host, whatever the option said.
//!
//! Status codes are `adxl::Status` values. Waits are bounded: a Sync transfer by its timeout (10 s when not
//! positive), an Async one by 10 s from its submission, a connect by its timeout. A peer that has gone away (its
//! control connection closed) fails the transfer and is forgotten.

use core::ffi::{c_char, c_void, CStr};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::{
    CannTwinHixlEvidence, HixlOneSideOpDesc, COMM_MEM_TYPE_DEVICE, COMM_MEM_TYPE_HOST, TWIN_HIXL_EVIDENCE_VERSION,
};
use ascendcl_sys::sys::*;

use super::common::{Region, Table};
use super::device::{self, DeviceBatch, Imports, Slot, Tallies};

/// `adxl::Status` values (`hicann/hixl` `include/adxl/adxl_types.h`).
pub const SUCCESS: u32 = 0;
pub const PARAM_INVALID: u32 = 103_900;
pub const TIMEOUT: u32 = 103_901;
pub const NOT_CONNECTED: u32 = 103_902;
pub const ALREADY_CONNECTED: u32 = 103_903;
pub const FAILED: u32 = 503_900;

/// `adxl::TransferStatus` values.
pub const STATUS_WAITING: i32 = 0;
pub const STATUS_COMPLETED: i32 = 1;
pub const STATUS_TIMEOUT: i32 = 2;
pub const STATUS_FAILED: i32 = 3;

/// The deadline of a Sync transfer whose timeout is not positive, and of every Async one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Streams of the Host unfold at most (`fabric_memory.task_stream_num`, `hixl_options.cc`).
pub const MAX_TASK_STREAMS: u32 = 8;

type Checked<T> = Result<T, u32>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A local registration: where the caller's range is, and the device address of its first byte in this process.
#[derive(Debug)]
struct Local {
    /// The control server's handle of the registration.
    handle: usize,
    addr: u64,
    size: u64,
    device: u64,
    /// A HOST registration's device window (removed with it).
    window: bool,
}

/// A connected peer: the control connection (watched for the peer's loss) and its imported memory.
#[derive(Debug)]
struct Peer {
    stream: TcpStream,
    imports: Imports,
}

/// How the engine moves data.
#[derive(Debug)]
enum Unfold {
    /// One AI-CPU launch per 128 descriptors on the slot's stream.
    AiCpu(Slot),
    /// `aclrtMemcpyAsync` round-robin over these streams; `const_one` is a device word holding 1 (the Async flags).
    Host { streams: Vec<usize>, const_one: u64 },
}

/// An Async transfer not yet seen final.
#[derive(Debug)]
enum Request {
    Device { batch: DeviceBatch, deadline: Instant },
    Host { flags: Vec<Arc<AtomicU64>>, streams: Vec<usize>, deadline: Instant },
}

#[derive(Debug, Default)]
struct State {
    local: Vec<Local>,
    peers: HashMap<String, Peer>,
    requests: HashMap<u64, Request>,
    next_request: u64,
    /// Device batches seen final (or abandoned) while their launches or Host flag still ran.
    retired: Vec<DeviceBatch>,
    /// Imports of peers that went while batches may still have used them: dropped once nothing runs.
    old_imports: Vec<Imports>,
    /// Host flags of Async transfers abandoned before their copies landed (the stream still writes them).
    old_flags: Vec<Arc<AtomicU64>>,
}

impl State {
    fn reap(&mut self) {
        self.retired.retain(|batch| !batch.quiet());
        let device_pending = self.requests.values().any(|r| matches!(r, Request::Device { .. }));
        if self.retired.is_empty() && !device_pending {
            self.old_imports.clear();
        }
    }
}

/// One FabricMem engine.
#[derive(Debug)]
struct Engine {
    /// Its control server (a server of module `hixl`).
    server: usize,
    /// The device it was created on.
    device: i32,
    unfold: Unfold,
    state: Mutex<State>,
    tallies: Arc<Tallies>,
    stop: AtomicBool,
}

fn engines() -> MutexGuard<'static, Table<Engine>> {
    static ENGINES: Mutex<Table<Engine>> = Mutex::new(Table::new(0x7000_0000));
    lock(&ENGINES)
}

fn engine_of(handle: u64) -> Checked<Arc<Engine>> {
    engines().items.get(&(handle as usize)).cloned().ok_or(PARAM_INVALID)
}

/// "ip:port" or "[ip]:port" (a literal address).
fn endpoint(name: &str) -> Checked<SocketAddr> {
    let (host, port) = name.rsplit_once(':').ok_or(PARAM_INVALID)?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let ip: IpAddr = host.parse().map_err(|_| PARAM_INVALID)?;
    let port: u16 = port.parse().map_err(|_| PARAM_INVALID)?;
    Ok(SocketAddr::new(ip, port))
}

fn text(pointer: *const c_char) -> Checked<String> {
    if pointer.is_null() {
        return Err(PARAM_INVALID);
    }
    // SAFETY: non-null NUL-terminated string by the C contract.
    Ok(unsafe { CStr::from_ptr(pointer) }.to_string_lossy().into_owned())
}

fn guard(body: impl FnOnce() -> Checked<()>) -> u32 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => FAILED,
    }
}

fn acl(code: aclError) -> Checked<()> {
    if code == ACL_SUCCESS {
        Ok(())
    } else {
        Err(FAILED)
    }
}

impl Engine {
    fn create(local: SocketAddr, aicpu_unfold: bool, task_streams: u32) -> Checked<Engine> {
        let device = crate::runtime::runtime().current_device().map_err(|_| FAILED)?;
        let unfold = if aicpu_unfold {
            Unfold::AiCpu(Slot::new(device).map_err(|_| FAILED)?)
        } else {
            let const_one = crate::space::with_space_mut(|space| space.malloc(8, crate::memory::LIBRARY_OWNED))
                .map_err(|_| FAILED)? as u64;
            let mut streams = Vec::new();
            let mut made = crate::sdma::write_device(const_one, &1u64.to_le_bytes()).map_err(|_| FAILED);
            for _ in 0..task_streams.clamp(1, MAX_TASK_STREAMS) {
                if made.is_err() {
                    break;
                }
                let mut stream: aclrtStream = core::ptr::null_mut();
                // SAFETY: a writable handle; the calling thread's current device is the engine's.
                made = acl(unsafe { crate::acl::aclrtCreateStream(&mut stream) });
                if made.is_ok() {
                    streams.push(stream as usize);
                }
            }
            let unfold = Unfold::Host { streams, const_one };
            if let Err(code) = made {
                release(&unfold);
                return Err(code);
            }
            unfold
        };
        let server = super::server::create_server(local, Some(device));
        if local.port() > 0 {
            if let Err(code) = super::server::listen_server(server) {
                let _ = super::server::destroy_server(server);
                release(&unfold);
                // A port another socket holds, an address not of this host.
                return Err(if code == ascendcl_sys::hixl::HIXL_PARAM_INVALID { PARAM_INVALID } else { FAILED });
            }
        }
        Ok(Engine {
            server,
            device,
            unfold,
            state: Mutex::default(),
            tallies: Arc::default(),
            stop: AtomicBool::new(false),
        })
    }

    fn register(&self, addr: u64, size: u64, host: bool) -> Checked<u64> {
        if addr == 0 || size == 0 || addr.checked_add(size).is_none() {
            return Err(PARAM_INVALID);
        }
        let kind = if host { COMM_MEM_TYPE_HOST } else { COMM_MEM_TYPE_DEVICE };
        let region = Region { addr, size, kind: kind.0, tag: Vec::new(), export: None };
        let len = usize::try_from(size).map_err(|_| PARAM_INVALID)?;
        // A HOST range gets a device window of this process; a DEVICE range must be device memory here.
        let device = if host {
            crate::space::with_space_mut(|space| space.register(addr as usize, len, false)).map_err(|_| FAILED)? as u64
        } else if super::batch::device_range(addr, size) {
            addr
        } else {
            return Err(PARAM_INVALID);
        };
        let handle = match super::server::register_with_server(self.server, region) {
            Ok(handle) => handle,
            Err(_) => {
                if host {
                    let _ = crate::space::with_space_mut(|space| space.unregister(addr as usize));
                }
                return Err(PARAM_INVALID);
            }
        };
        lock(&self.state).local.push(Local { handle, addr, size, device, window: host });
        Ok(handle as u64)
    }

    fn deregister(&self, handle: u64) -> Checked<()> {
        let mut state = lock(&self.state);
        let at = state.local.iter().position(|l| l.handle as u64 == handle).ok_or(PARAM_INVALID)?;
        let local = state.local.remove(at);
        drop(state);
        let _ = super::server::unregister_with_server(self.server, local.handle);
        if local.window {
            let _ = crate::space::with_space_mut(|space| space.unregister(local.addr as usize));
        }
        Ok(())
    }

    fn connect(&self, remote: &str, timeout: Duration) -> Checked<()> {
        let address = endpoint(remote)?;
        if lock(&self.state).peers.contains_key(remote) {
            return Err(ALREADY_CONNECTED);
        }
        let deadline = Instant::now() + timeout;
        let (stream, regions, registry) = super::client::hello(address, deadline, &self.stop).map_err(|code| {
            if code == ascendcl_sys::hixl::HIXL_TIMEOUT {
                TIMEOUT
            } else {
                FAILED
            }
        })?;
        let imports = device::import(registry, &regions).ok_or(FAILED)?;
        let mut state = lock(&self.state);
        if state.peers.contains_key(remote) {
            return Err(ALREADY_CONNECTED);
        }
        state.peers.insert(remote.to_owned(), Peer { stream, imports });
        Ok(())
    }

    fn disconnect(&self, remote: &str) -> Checked<()> {
        let mut state = lock(&self.state);
        let peer = state.peers.remove(remote).ok_or(NOT_CONNECTED)?;
        peer.imports.link.revoke();
        state.old_imports.push(peer.imports);
        state.reap();
        Ok(())
    }

    /// The operations with both sides relocated into this process's device addresses (`remote_buf`: the import's
    /// mapping, `local_buf`: the registration's device address).
    fn resolve(state: &State, peer: &Peer, ops: &[[u64; 3]]) -> Checked<Vec<HixlOneSideOpDesc>> {
        ops.iter()
            .map(|&[local, remote, len]| {
                let end = local.checked_add(len).ok_or(PARAM_INVALID)?;
                if len == 0 || len > super::common::MAX_ENTRY_LEN {
                    return Err(PARAM_INVALID);
                }
                let mine =
                    state.local.iter().find(|l| local >= l.addr && end <= l.addr + l.size).ok_or(PARAM_INVALID)?;
                let far = peer.imports.link.relocate(remote, len).ok_or(PARAM_INVALID)?;
                Ok(HixlOneSideOpDesc {
                    remote_buf: far as *mut c_void,
                    local_buf: (mine.device + (local - mine.addr)) as *mut c_void,
                    len,
                })
            })
            .collect()
    }

    /// Submits `ops` (`[local, remote, len]`) to `remote`; `Ok(Some(id))` for an Async transfer, `Ok(None)` once a
    /// Sync one completed.
    fn transfer(
        &self,
        remote: &str,
        write: bool,
        ops: &[[u64; 3]],
        timeout: Duration,
        asynchronous: bool,
    ) -> Checked<Option<u64>> {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.state);
        state.reap();
        let peer = state.peers.get(remote).ok_or(NOT_CONNECTED)?;
        if super::batch::peer_gone(&peer.stream) || peer.imports.link.revoked() {
            drop(state);
            let _ = self.disconnect(remote);
            return Err(FAILED);
        }
        let list = Engine::resolve(&state, peer, ops)?;
        if list.is_empty() {
            return Ok(None);
        }
        let mis_wired = matches!(self.unfold, Unfold::AiCpu(_)) && host_copies(self.device);
        self.tallies.batch(list.len(), matches!(self.unfold, Unfold::AiCpu(_)) && !mis_wired);
        if mis_wired {
            drop(state);
            let outcome = self.copy_with_the_host(write, &list);
            let outcome = self.still_there(remote, outcome)?;
            if asynchronous {
                let mut state = lock(&self.state);
                let id = self.next_id(&mut state);
                let request = Request::Host { flags: Vec::new(), streams: Vec::new(), deadline: Instant::now() };
                state.requests.insert(id, request);
                return Ok(Some(id));
            }
            return Ok(outcome);
        }
        match &self.unfold {
            Unfold::AiCpu(slot) => {
                let link = Arc::clone(&peer.imports.link);
                let batch = device::launch(slot, &link, &self.tallies, write, &list, deadline, asynchronous)
                    .map_err(|_| FAILED)?;
                if asynchronous {
                    let id = self.next_id(&mut state);
                    state.requests.insert(id, Request::Device { batch, deadline });
                    return Ok(Some(id));
                }
                drop(state);
                let left = deadline.saturating_duration_since(Instant::now());
                let synchronized = slot.stream().synchronize(Some(left));
                let outcome = if synchronized == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT || batch.timed_out() {
                    Err(TIMEOUT)
                } else if batch.failed() {
                    Err(FAILED)
                } else {
                    Ok(None)
                };
                let mut state = lock(&self.state);
                if !batch.quiet() {
                    state.retired.push(batch);
                }
                drop(state);
                self.still_there(remote, outcome)
            }
            Unfold::Host { streams, const_one } => {
                drop(state);
                let kind = ACL_MEMCPY_DEVICE_TO_DEVICE;
                for (i, op) in list.iter().enumerate() {
                    let stream = streams[i % streams.len()] as aclrtStream;
                    let len = op.len as usize;
                    let (dst, src) = if write { (op.remote_buf, op.local_buf) } else { (op.local_buf, op.remote_buf) };
                    // SAFETY: both are device addresses of this process (relocated above); the twin's copy checks them.
                    acl(unsafe { crate::acl::aclrtMemcpyAsync(dst, len, src, len, kind, stream) })?;
                    self.tallies.host_copy(len);
                }
                let used: Vec<usize> = streams.iter().copied().take(list.len()).collect();
                if asynchronous {
                    let mut flags = Vec::with_capacity(used.len());
                    for &stream in &used {
                        let flag = Arc::new(AtomicU64::new(0));
                        let dst = flag.as_ptr().cast::<c_void>();
                        // SAFETY: `flag` is a live Host word, kept until the copy has landed; `const_one` a device word.
                        let code = unsafe {
                            crate::acl::aclrtMemcpyAsync(
                                dst,
                                8,
                                *const_one as *const c_void,
                                8,
                                ACL_MEMCPY_DEVICE_TO_HOST,
                                stream as aclrtStream,
                            )
                        };
                        flags.push(flag);
                        acl(code)?;
                    }
                    let mut state = lock(&self.state);
                    let id = self.next_id(&mut state);
                    state.requests.insert(id, Request::Host { flags, streams: used, deadline });
                    return Ok(Some(id));
                }
                let outcome = synchronize(&used, deadline);
                self.still_there(remote, outcome.map(|()| None))
            }
        }
    }

    /// The test-only mis-wiring: every operation one synchronous Host runtime copy (`aclrtMemcpy`), counted as such.
    fn copy_with_the_host(&self, write: bool, list: &[HixlOneSideOpDesc]) -> Checked<Option<u64>> {
        for op in list {
            let len = op.len as usize;
            let (dst, src) = if write { (op.remote_buf, op.local_buf) } else { (op.local_buf, op.remote_buf) };
            // SAFETY: both are device addresses of this process (relocated by `resolve`); the twin's copy checks them.
            acl(unsafe { crate::acl::aclrtMemcpy(dst, len, src, len, ACL_MEMCPY_DEVICE_TO_DEVICE) })?;
            self.tallies.host_copy(len);
        }
        Ok(None)
    }

    fn next_id(&self, state: &mut State) -> u64 {
        state.next_request += 1;
        state.next_request
    }

    /// `outcome`, unless the peer went away meanwhile (its memory may be gone: the transfer failed).
    fn still_there<T>(&self, remote: &str, outcome: Checked<T>) -> Checked<T> {
        let gone = lock(&self.state).peers.get(remote).is_some_and(|peer| super::batch::peer_gone(&peer.stream));
        if gone {
            let _ = self.disconnect(remote);
            return Err(FAILED);
        }
        outcome
    }

    /// An Async transfer's status (`adxl::TransferStatus`); a final one forgets the request.
    fn query(&self, id: u64) -> Checked<i32> {
        let mut state = lock(&self.state);
        let request = state.requests.get(&id).ok_or(PARAM_INVALID)?;
        let status = match request {
            Request::Device { batch, deadline } => {
                if batch.landed() {
                    if batch.timed_out() {
                        STATUS_TIMEOUT
                    } else if batch.failed() {
                        STATUS_FAILED
                    } else {
                        STATUS_COMPLETED
                    }
                } else if Instant::now() >= *deadline {
                    STATUS_TIMEOUT
                } else {
                    STATUS_WAITING
                }
            }
            Request::Host { flags, streams, deadline } => {
                if flags.iter().all(|flag| flag.load(Ordering::Acquire) == 1) {
                    // Every stream's copies ran: their outcome (a synchronisation that waits for nothing more).
                    match synchronize(streams, Instant::now() + Duration::from_millis(100)) {
                        Ok(()) => STATUS_COMPLETED,
                        Err(_) => STATUS_FAILED,
                    }
                } else if Instant::now() >= *deadline {
                    STATUS_TIMEOUT
                } else {
                    STATUS_WAITING
                }
            }
        };
        if status != STATUS_WAITING {
            match state.requests.remove(&id) {
                Some(Request::Device { batch, .. }) if !batch.quiet() => state.retired.push(batch),
                Some(Request::Host { flags, .. }) => {
                    let pending = flags.into_iter().filter(|flag| flag.load(Ordering::Acquire) != 1);
                    let kept: Vec<_> = pending.collect();
                    state.old_flags.extend(kept);
                }
                _ => {}
            }
            state.reap();
        }
        Ok(status)
    }

    /// Stops the control server, revokes every peer's link, lets the streams finish what they hold (a revoked link's
    /// launches stop at once), then unmaps the imports and the Host windows.
    fn destroy(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = super::server::destroy_server(self.server);
        let mut state = std::mem::take(&mut *lock(&self.state));
        for (_, peer) in state.peers.drain() {
            peer.imports.link.revoke();
            state.old_imports.push(peer.imports);
        }
        match &self.unfold {
            Unfold::AiCpu(slot) => slot.stream().shut_down(),
            Unfold::Host { streams, .. } => {
                let _ = synchronize(streams, Instant::now() + DEFAULT_TIMEOUT);
                destroy_streams(streams);
            }
        }
        for local in state.local.drain(..) {
            if local.window {
                let _ = crate::space::with_space_mut(|space| space.unregister(local.addr as usize));
            }
        }
        drop(state);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Unfold::Host { const_one, .. } = &self.unfold {
            let _ = crate::space::with_space_mut(|space| space.free(*const_one as usize));
        }
    }
}

/// Test-only mis-wiring ([`crate::control::fabric_mem_host_copies`]): the devices whose AI-CPU-unfold engines copy
/// with the Host instead.
static HOST_COPIES: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Makes the AI-CPU-unfold engines on `device` move every batch with Host copies (`true`), or lets them launch again.
pub(crate) fn set_host_copies(device: i32, on: bool) {
    let mut devices = lock(&HOST_COPIES);
    devices.retain(|&other| other != device);
    if on {
        devices.push(device);
    }
}

fn host_copies(device: i32) -> bool {
    lock(&HOST_COPIES).contains(&device)
}

/// Synchronises every stream in `streams` by `deadline`: `TIMEOUT` past it, `FAILED` for a failed copy.
fn synchronize(streams: &[usize], deadline: Instant) -> Checked<()> {
    for &stream in streams {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: a stream this engine created and has not destroyed.
        match unsafe { crate::acl::aclrtSynchronizeStreamWithTimeout(stream as aclrtStream, ms) } {
            ACL_SUCCESS => {}
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT => return Err(TIMEOUT),
            _ => return Err(FAILED),
        }
    }
    Ok(())
}

/// Releases what [`Engine::create`] made for `unfold` when the engine is not made after all.
fn release(unfold: &Unfold) {
    match unfold {
        Unfold::AiCpu(slot) => slot.stream().shut_down(),
        Unfold::Host { streams, const_one } => {
            destroy_streams(streams);
            let _ = crate::space::with_space_mut(|space| space.free(*const_one as usize));
        }
    }
}

fn destroy_streams(streams: &[usize]) {
    for &stream in streams {
        // SAFETY: a stream this engine created; destroyed once.
        let _ = unsafe { crate::acl::aclrtDestroyStream(stream as aclrtStream) };
    }
}

/// Creates a FabricMem engine for `local_engine` ("ip:port"; port 0: no control server listens, the engine only
/// connects) on the calling thread's current device, with AI-CPU unfold (`aicpu_unfold` nonzero) or Host unfold
/// over `task_stream_num` streams (1 to 8); writes its handle.
///
/// # Safety
/// `local_engine` is null or a NUL-terminated string; `engine` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cannTwinFabricMemCreate(
    local_engine: *const c_char,
    aicpu_unfold: u32,
    task_stream_num: u32,
    engine: *mut u64,
) -> u32 {
    guard(|| {
        if engine.is_null() || !(1..=MAX_TASK_STREAMS).contains(&task_stream_num) {
            return Err(PARAM_INVALID);
        }
        let local = endpoint(&text(local_engine)?)?;
        let created = Engine::create(local, aicpu_unfold != 0, task_stream_num)?;
        let id = engines().insert(Arc::new(created));
        // SAFETY: non-null, writable by the contract.
        unsafe { engine.write(id as u64) };
        Ok(())
    })
}

/// Registers `[addr, addr + len)` (`mem_type` 0 device, 1 Host) with `engine`: exported for its peers; writes the
/// registration's handle.
///
/// # Safety
/// `handle` is null or writable; the range stays allocated until deregistered.
#[no_mangle]
pub unsafe extern "C" fn cannTwinFabricMemRegister(
    engine: u64,
    addr: u64,
    len: u64,
    mem_type: i32,
    handle: *mut u64,
) -> u32 {
    guard(|| {
        if handle.is_null() || !(0..=1).contains(&mem_type) {
            return Err(PARAM_INVALID);
        }
        let id = engine_of(engine)?.register(addr, len, mem_type == 1)?;
        // SAFETY: non-null, writable by the contract.
        unsafe { handle.write(id) };
        Ok(())
    })
}

/// Withdraws a registration (its importers see it gone).
#[no_mangle]
pub extern "C" fn cannTwinFabricMemDeregister(engine: u64, handle: u64) -> u32 {
    guard(|| engine_of(engine)?.deregister(handle))
}

/// Fetches the peer `remote` ("ip:port")'s registrations from its control server and imports them, within
/// `timeout_ms` (`TIMEOUT` past it, `FAILED` if nobody answers).
///
/// # Safety
/// `remote` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cannTwinFabricMemConnect(engine: u64, remote: *const c_char, timeout_ms: u32) -> u32 {
    guard(|| {
        let timeout = if timeout_ms == 0 { DEFAULT_TIMEOUT } else { Duration::from_millis(u64::from(timeout_ms)) };
        engine_of(engine)?.connect(&text(remote)?, timeout)
    })
}

/// Forgets the peer `remote` (its imports are unmapped once nothing runs on them).
///
/// # Safety
/// `remote` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cannTwinFabricMemDisconnect(engine: u64, remote: *const c_char) -> u32 {
    guard(|| engine_of(engine)?.disconnect(&text(remote)?))
}

/// Moves `count` operations, `ops[3 i..3 i + 3]` = local address, remote address, length: `op` 1 writes local to
/// remote, 0 reads. With `request` null the call waits (at most `timeout_ms`, 10 s when not positive); otherwise it
/// returns at once with the request's id for [`cannTwinFabricMemQuery`].
///
/// # Safety
/// `remote` is null or a NUL-terminated string; `ops` is null only with `count` 0, else `3 count` readable words;
/// `request` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cannTwinFabricMemTransfer(
    engine: u64,
    remote: *const c_char,
    op: i32,
    ops: *const u64,
    count: u64,
    timeout_ms: i32,
    request: *mut u64,
) -> u32 {
    guard(|| {
        if !(0..=1).contains(&op) || (count > 0 && ops.is_null()) || count > (1 << 20) {
            return Err(PARAM_INVALID);
        }
        let engine = engine_of(engine)?;
        let remote = text(remote)?;
        let list: Vec<[u64; 3]> = (0..count as usize)
            .map(|i| {
                // SAFETY: `3 count` readable words by the contract; `i < count`.
                unsafe { [*ops.add(3 * i), *ops.add(3 * i + 1), *ops.add(3 * i + 2)] }
            })
            .collect();
        let asynchronous = !request.is_null();
        let timeout = match timeout_ms {
            ms if ms > 0 && !asynchronous => Duration::from_millis(ms as u64),
            _ => DEFAULT_TIMEOUT,
        };
        let id = engine.transfer(&remote, op == 1, &list, timeout, asynchronous)?;
        if asynchronous {
            // An empty list completes at once: a request already final.
            let id = match id {
                Some(id) => id,
                None => {
                    let mut state = lock(&engine.state);
                    let id = engine.next_id(&mut state);
                    state
                        .requests
                        .insert(id, Request::Host { flags: Vec::new(), streams: Vec::new(), deadline: Instant::now() });
                    id
                }
            };
            // SAFETY: non-null, writable by the contract.
            unsafe { request.write(id) };
        }
        Ok(())
    })
}

/// The status of an Async transfer (`adxl::TransferStatus`: 0 waiting, 1 completed, 2 timeout, 3 failed); a final
/// one releases the request (`PARAM_INVALID` after).
///
/// # Safety
/// `status` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cannTwinFabricMemQuery(engine: u64, request: u64, status: *mut i32) -> u32 {
    guard(|| {
        if status.is_null() {
            return Err(PARAM_INVALID);
        }
        let value = engine_of(engine)?.query(request)?;
        // SAFETY: non-null, writable by the contract.
        unsafe { status.write(value) };
        Ok(())
    })
}

/// Stops the engine: its control server, its peers' imports, its streams; forgets the handle.
#[no_mangle]
pub extern "C" fn cannTwinFabricMemDestroy(engine: u64) -> u32 {
    guard(|| {
        let engine = engines().items.remove(&(engine as usize)).ok_or(PARAM_INVALID)?;
        engine.destroy();
        Ok(())
    })
}

/// **Twin-only**: the counts of one engine since it was created, in the structure of `cannTwinHixlClientEvidence`
/// (`device_batches` / `launches` / SQEs, doorbells and flags by who did each: its AI-CPU-unfold batches, from the
/// consumption log of the AI CPU's channel; `wire_batches` / `host_copies` / `host_copy_bytes`: its batches moved by
/// Host runtime copies and those copies). The caller sets `version` (`TWIN_HIXL_EVIDENCE_VERSION`) and `size` (at
/// least the structure's); `PARAM_INVALID` for an unknown engine, a null pointer, another version or a smaller size
/// (nothing written).
///
/// # Safety
/// `evidence` is null or points to `evidence->size` writable bytes, aligned for a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cannTwinFabricMemEvidence(engine: u64, evidence: *mut CannTwinHixlEvidence) -> u32 {
    guard(|| {
        let engine = engine_of(engine)?;
        if evidence.is_null() {
            return Err(PARAM_INVALID);
        }
        // SAFETY: non-null; the contract makes the two header words readable.
        let (version, size) = unsafe { ((*evidence).version, (*evidence).size) };
        if version != TWIN_HIXL_EVIDENCE_VERSION || (size as usize) < core::mem::size_of::<CannTwinHixlEvidence>() {
            return Err(PARAM_INVALID);
        }
        // SAFETY: non-null, at least the structure's size and aligned (checked and the contract).
        unsafe { evidence.write(engine.tallies.snapshot()) };
        Ok(())
    })
}

/// The C names of the FabricMem functions (twin-only), exported by the cdylib.
pub const FABRIC_MEM_EXPORTED: &[&str] = &[
    "cannTwinFabricMemCreate",
    "cannTwinFabricMemRegister",
    "cannTwinFabricMemDeregister",
    "cannTwinFabricMemConnect",
    "cannTwinFabricMemDisconnect",
    "cannTwinFabricMemTransfer",
    "cannTwinFabricMemQuery",
    "cannTwinFabricMemDestroy",
    "cannTwinFabricMemEvidence",
];

/// The address of the FabricMem function called `name` (one of [`FABRIC_MEM_EXPORTED`]), or `None`: the in-process
/// resolver of `ascendcl_sys::hixl::FabricMemApi`. Each function has exactly the prototype declared there.
pub fn resolve_fabric_mem(name: &str) -> Option<*const c_void> {
    Some(match name {
        "cannTwinFabricMemCreate" => cannTwinFabricMemCreate as *const c_void,
        "cannTwinFabricMemRegister" => cannTwinFabricMemRegister as *const c_void,
        "cannTwinFabricMemDeregister" => cannTwinFabricMemDeregister as *const c_void,
        "cannTwinFabricMemConnect" => cannTwinFabricMemConnect as *const c_void,
        "cannTwinFabricMemDisconnect" => cannTwinFabricMemDisconnect as *const c_void,
        "cannTwinFabricMemTransfer" => cannTwinFabricMemTransfer as *const c_void,
        "cannTwinFabricMemQuery" => cannTwinFabricMemQuery as *const c_void,
        "cannTwinFabricMemDestroy" => cannTwinFabricMemDestroy as *const c_void,
        "cannTwinFabricMemEvidence" => cannTwinFabricMemEvidence as *const c_void,
        _ => return None,
    })
}
