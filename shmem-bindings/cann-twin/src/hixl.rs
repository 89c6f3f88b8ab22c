//! HiXL's plain C client/server API (`ascendcl_sys::hixl::HixlApi`), implemented on the twin: resolved in-process
//! by [`resolve_hixl`] ([`hixl_api`]) and exported under the C names from the cdylib, with
//! [`HixlCSClientGetRemoteMem`], which `hixl_cs.h` declares and `HixlApi` does not, and the twin-only
//! [`cannTwinHixlClientEvidence`] (not a HiXL API: a client's records, which `HixlApi` declares optional).
//!
//! A server listens on the TCP address of its [`HixlServerDesc`] (`server_ip`, `server_port`); a client connects to
//! the address of its [`HixlClientDesc`] and gets the server's registrations in the hello answer. Then a batch takes
//! one of two paths:
//!
//! - **the device path** (module `device`): HiXL's client-server mode with a device endpoint, as the vendor's library
//!   runs it. The server exports its DEVICE registrations; a client with a device imports them into its own device
//!   address space at connect; a batch between device memory and live imports is copied to device memory and
//!   launched as AI-CPU tasks on the client's stream (one per 128 entries), which write SQEs into an SDMA channel of
//!   the emulated AI CPU (module `aicpu`), followed by a copy of a device constant 1 into the batch's Host flag;
//!   the status query reads that flag and the batch's error status only;
//! - **the wire path**, for what cannot be imported (remote HOST memory, which HiXL's HCCS client-server mode does
//!   not reach; a client without a device; memory a server could not export): the bytes go over the one TCP
//!   connection, each side reading and writing its own memory only through its own process's ACL copies
//!   (`aclrtMemcpy` with `ACL_MEMCPY_DEFAULT`, so device and Host registrations both work). Host-submitted, and its
//!   records say so.
//!
//! Endpoints are accepted and not interpreted (no HCCS, RoCE or UB transport is modelled).
//!
//! Checks: every local range of a batch must lie inside one of the client's registrations, every remote range
//! inside one of the server's registrations (the list the server sent at connect, checked again by the server
//! against its registrations of the moment), else the call returns `HIXL_PARAM_INVALID` and submits nothing.
//! Handles are ids looked up in tables, never dereferenced: an unknown handle is `HIXL_PARAM_INVALID`.
//!
//! Wire protocol (little-endian, [`VERSION`] 2; docs/twin-runtime.md has the full table):
//! - hello, client to server: `HIXLTWN1`, `u32` version; the server answers `HIXLTWN1`, `u32` status, `u32` count,
//!   `u64` its registry's export token, then `count` times `(u64 addr, u64 size, i32 CommMemType, u32 tag length,
//!   u64 export token, u64 stamp, u32 registry slot, u32 0, tag)` of its registrations (at most
//!   [`MAX_REGISTRATIONS`], tags at most [`MAX_TAG_LEN`] bytes): what [`HixlCSClientGetRemoteMem`] returns, and what
//!   the device path imports;
//! - request: `u32` op (1 put, 2 get), `u32` 0, `u64` remote address, `u64` length (at most [`MAX_ENTRY_LEN`]);
//!   a put is followed by `length` bytes, answered by one `u32` status; a get is answered by a `u32` status, and
//!   when it is 0 by `length` bytes and a second `u32` status (a copy that failed midway still sends the bytes).
//!
//! Bounds: connect within the call's `timeout_ms`; a batch within its deadline (the Sync calls' `timeout_ms`,
//! [`ASYNC_TIMEOUT`] for the Async ones, counted from submission), else `HIXL_COMPLETE_STATUS_TIMEOUT` (on the wire
//! path the connection is then closed: the stream is out of step; on the device path the task stops at the deadline);
//! a vanished server fails the batch at once (reset or end of stream, which the client's worker also watches for while
//! idle: the device path's link is then revoked) or at its deadline. The server: the hello within [`HELLO_TIMEOUT`], a frame's remaining bytes within
//! [`FRAME_TIMEOUT`] of its first, at most [`MAX_CONNECTIONS`] connections; anything malformed closes that
//! connection only.

use core::ffi::{c_char, c_void, CStr};
use std::collections::{BTreeMap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::*;
use ascendcl_sys::sys::{ACL_MEMCPY_DEFAULT, ACL_SUCCESS};

mod device;
pub mod fabric_mem;

pub use device::{RegionExport, MAX_KERNEL_ENTRIES};

/// What [`HixlApi::path`] reports for [`hixl_api`].
pub const IN_PROCESS_HIXL_PATH: &str = "cann-twin HiXL (in-process)";
/// Unqueried transfers a client may hold: entries of batches not yet seen in a final state (the CS
/// documentation's "4K"); a batch that would pass it is `HIXL_RESOURCE_EXHAUSTED`.
pub const MAX_PENDING: usize = 4096;
/// The deadline of an Async batch, from its submission.
pub const ASYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// The server waits this long for a connection's hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Once a frame's first byte arrived, the server waits this long for each further part of it.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections a server serves at once; more are closed on accept.
pub const MAX_CONNECTIONS: usize = 64;
/// Registrations a server may hold (and a hello may list).
pub const MAX_REGISTRATIONS: usize = 4096;
/// The longest entry of a batch (4 GiB; a twin limit).
pub const MAX_ENTRY_LEN: u64 = 1 << 32;
/// The longest memory tag (bytes; a twin limit).
pub const MAX_TAG_LEN: usize = 255;
/// The protocol's magic.
pub const MAGIC: &[u8; 8] = b"HIXLTWN1";
/// The protocol's version (2: the hello answer carries the exports of the device path).
pub const VERSION: u32 = 2;
/// Bytes of the hello answer before its registrations: magic, status, count, the registry's token.
pub const HELLO_ANSWER_BYTES: usize = 24;
/// Bytes of one registration in the hello answer before its tag: address, size, `CommMemType`, tag length, export
/// token (0: not exported), stamp, slot, a reserved 0.
pub const HELLO_ENTRY_BYTES: usize = 48;
/// Request opcode of a put.
pub const OP_PUT: u32 = 1;
/// Request opcode of a get.
pub const OP_GET: u32 = 2;

const CHUNK: usize = 1 << 20;
/// Entries in flight at once on a connection (see `run_batch`).
const WINDOW: usize = 256;
const POLL: Duration = Duration::from_millis(100);

type Status = Result<(), HixlStatus>;

fn guard(body: impl FnOnce() -> Status) -> HixlStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => HIXL_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => HIXL_FAILED,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn not_null<T>(pointer: *const T) -> Status {
    if pointer.is_null() {
        Err(HIXL_PARAM_INVALID)
    } else {
        Ok(())
    }
}

/// Copies `len` bytes through this process's ACL (`ACL_MEMCPY_DEFAULT`: device or Host on either side).
fn acl_copy(dst: usize, src: usize, len: usize) -> Status {
    // SAFETY: the twin's aclrtMemcpy translates device addresses and refuses bad ranges; the Host side is a live
    // buffer of this module or registered memory the caller vouched for at registration.
    let code =
        unsafe { crate::acl::aclrtMemcpy(dst as *mut c_void, len, src as *const c_void, len, ACL_MEMCPY_DEFAULT) };
    if code == ACL_SUCCESS {
        Ok(())
    } else {
        Err(HIXL_FAILED)
    }
}

/// A registered range, its `CommMemType`, its tag and (a server's DEVICE registration) its export.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Region {
    addr: u64,
    size: u64,
    kind: i32,
    tag: Vec<u8>,
    export: Option<RegionExport>,
}

fn inside<'a>(regions: impl IntoIterator<Item = &'a Region>, addr: u64, len: u64) -> bool {
    len > 0
        && addr.checked_add(len).is_some_and(|end| {
            regions.into_iter().any(|r| addr >= r.addr && r.addr.checked_add(r.size).is_some_and(|r_end| end <= r_end))
        })
}

fn region_of(mem: *const CommMem, tag: *const c_char) -> Result<Region, HixlStatus> {
    not_null(mem)?;
    let tag = if tag.is_null() {
        Vec::new()
    } else {
        // SAFETY: non-null NUL-terminated string by the C contract.
        unsafe { CStr::from_ptr(tag) }.to_bytes().to_vec()
    };
    if tag.len() > MAX_TAG_LEN {
        return Err(HIXL_PARAM_INVALID);
    }
    // SAFETY: non-null; the C contract makes it a readable CommMem.
    let mem = unsafe { mem.read() };
    if mem.r#type != COMM_MEM_TYPE_DEVICE && mem.r#type != COMM_MEM_TYPE_HOST {
        return Err(HIXL_PARAM_INVALID);
    }
    let addr = mem.addr as u64;
    if addr == 0 || mem.size == 0 || addr.checked_add(mem.size).is_none() {
        return Err(HIXL_PARAM_INVALID);
    }
    Ok(Region { addr, size: mem.size, kind: mem.r#type.0, tag, export: None })
}

/// Handle tables: handles are ids (never 0), never pointers into this process.
struct Table<T> {
    next: usize,
    items: BTreeMap<usize, Arc<T>>,
}

impl<T> Table<T> {
    /// Ids after `start`: servers and clients count from different starts, so one is never taken for the other.
    const fn new(start: usize) -> Self {
        Table { next: start, items: BTreeMap::new() }
    }
    fn insert(&mut self, item: Arc<T>) -> usize {
        self.next += 1;
        self.items.insert(self.next, item);
        self.next
    }
}

fn servers() -> MutexGuard<'static, Table<Server>> {
    static SERVERS: Mutex<Table<Server>> = Mutex::new(Table::new(0x1000));
    lock(&SERVERS)
}

fn clients() -> MutexGuard<'static, Table<Client>> {
    static CLIENTS: Mutex<Table<Client>> = Mutex::new(Table::new(0x4000_0000));
    lock(&CLIENTS)
}

fn next_mem_handle() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Endpoints a server description may list (a twin limit).
pub const MAX_ENDPOINTS: u32 = 1024;

/// Makes `device` current on the calling thread (a HiXL worker), so that its copies count as that device's
/// copy-engine work; nothing if the creating thread had no device.
fn bind_device(device: Option<i32>) {
    if let Some(device) = device {
        let _ = crate::runtime::runtime().set_current_without_reference(device);
    }
}

/// The documentation's rule for a local device endpoint: `aclrtSetDevice` on the calling thread first. Without
/// one (or before `aclInit`) the call fails with `HIXL_FAILED`.
fn device_bound_if(endpoints: &[EndpointDesc]) -> Status {
    if endpoints.iter().any(|endpoint| endpoint.loc.locType == ENDPOINT_LOC_TYPE_DEVICE) {
        crate::runtime::runtime().current_device().map_err(|_| HIXL_FAILED)?;
    }
    Ok(())
}

fn ip_address(ip: *const c_char, port: u32) -> Result<SocketAddr, HixlStatus> {
    not_null(ip)?;
    let port = u16::try_from(port).map_err(|_| HIXL_PARAM_INVALID)?;
    // SAFETY: non-null NUL-terminated string by the C contract.
    let ip = unsafe { CStr::from_ptr(ip) }.to_str().map_err(|_| HIXL_PARAM_INVALID)?;
    let ip: std::net::IpAddr = ip.trim().parse().map_err(|_| HIXL_PARAM_INVALID)?;
    Ok(SocketAddr::new(ip, port))
}

// ---------------------------------------------------------------------------------------------------------------
// Bounded socket I/O.

/// Why a bounded read or write stopped.
#[derive(Debug, PartialEq, Eq)]
enum Io {
    /// The deadline passed.
    Timeout,
    /// End of stream, reset, or another error: the peer is gone.
    Gone,
    /// The owner asked to stop.
    Stopped,
}

fn read_full(stream: &mut TcpStream, buf: &mut [u8], deadline: Option<Instant>, stop: &AtomicBool) -> Result<(), Io> {
    let mut done = 0;
    while done < buf.len() {
        if stop.load(Ordering::Relaxed) {
            return Err(Io::Stopped);
        }
        let wait = match deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Io::Timeout);
                }
                left.min(POLL)
            }
            None => POLL,
        };
        stream.set_read_timeout(Some(wait)).map_err(|_| Io::Gone)?;
        match stream.read(&mut buf[done..]) {
            Ok(0) => return Err(Io::Gone),
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => return Err(Io::Gone),
        }
    }
    Ok(())
}

fn write_full(stream: &mut TcpStream, buf: &[u8], deadline: Instant, stop: &AtomicBool) -> Result<(), Io> {
    let mut done = 0;
    while done < buf.len() {
        if stop.load(Ordering::Relaxed) {
            return Err(Io::Stopped);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Io::Timeout);
        }
        stream.set_write_timeout(Some(left.min(POLL))).map_err(|_| Io::Gone)?;
        match stream.write(&buf[done..]) {
            Ok(0) => return Err(Io::Gone),
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => return Err(Io::Gone),
        }
    }
    Ok(())
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

// ---------------------------------------------------------------------------------------------------------------
// Server.

#[derive(Debug, Default)]
struct ServerState {
    regions: Vec<(usize, Region)>,
    listening: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    /// The registry page of the device path (`None` if it could not be made: every batch then takes the wire path).
    registry: Option<device::Registry>,
}

#[derive(Debug)]
struct Server {
    address: SocketAddr,
    /// The device current on the thread that created it, made current on its threads (their copies are that
    /// device's copy-engine work).
    device: Option<i32>,
    state: Mutex<ServerState>,
    /// The registrations the connections check against.
    shared: Arc<Mutex<Vec<Region>>>,
}

impl Server {
    fn publish(&self, state: &ServerState) {
        *lock(&self.shared) = state.regions.iter().map(|(_, region)| region.clone()).collect();
    }
}

/// Servers whose connections hold every request before serving it (`control::stall_hixl_server`).
static STALLED: Mutex<Vec<SocketAddr>> = Mutex::new(Vec::new());

/// Stalls (`true`) or releases the server listening at `address`: a request it receives waits, unanswered, until
/// the release (or the server stops); the clients' own deadlines decide what they see meanwhile.
pub(crate) fn set_stalled(address: SocketAddr, stalled: bool) {
    let mut servers = lock(&STALLED);
    servers.retain(|other| *other != address);
    if stalled {
        servers.push(address);
    }
}

fn wait_while_stalled(address: SocketAddr, stop: &AtomicBool) {
    while lock(&STALLED).contains(&address) && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn accept_loop(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    regions: Arc<Mutex<Vec<Region>>>,
    device: Option<i32>,
    registry: u64,
) {
    let address = listener.local_addr().ok();
    let live = Arc::new(AtomicUsize::new(0));
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                workers.retain(|worker| !worker.is_finished());
                if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    drop(stream);
                    continue;
                }
                live.fetch_add(1, Ordering::Relaxed);
                let (stop, regions, live_done) = (stop.clone(), regions.clone(), live.clone());
                let spawned =
                    std::thread::Builder::new().name(format!("{}hixl-conn", crate::THREAD_PREFIX)).spawn(move || {
                        bind_device(device);
                        let _ = catch_unwind(AssertUnwindSafe(|| {
                            serve_connection(stream, &stop, &regions, address, registry)
                        }));
                        live_done.fetch_sub(1, Ordering::Relaxed);
                    });
                match spawned {
                    Ok(worker) => workers.push(worker),
                    Err(_) => {
                        live.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    // Every connection thread checks `stop` at least every POLL.
    for worker in workers {
        let _ = worker.join();
    }
}

fn serve_connection(
    mut stream: TcpStream,
    stop: &AtomicBool,
    regions: &Mutex<Vec<Region>>,
    address: Option<SocketAddr>,
    registry: u64,
) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_nonblocking(false);
    let mut hello = [0u8; 12];
    if read_full(&mut stream, &mut hello, Some(Instant::now() + HELLO_TIMEOUT), stop).is_err()
        || &hello[..8] != MAGIC
        || u32_at(&hello, 8) != VERSION
    {
        return;
    }
    let listed: Vec<Region> = lock(regions).clone();
    let mut reply = Vec::with_capacity(HELLO_ANSWER_BYTES + HELLO_ENTRY_BYTES * listed.len());
    reply.extend_from_slice(MAGIC);
    reply.extend_from_slice(&HIXL_SUCCESS.to_le_bytes());
    reply.extend_from_slice(&(listed.len() as u32).to_le_bytes());
    reply.extend_from_slice(&registry.to_le_bytes());
    for region in &listed {
        let export = region.export.unwrap_or(RegionExport { token: 0, slot: 0, stamp: 0 });
        reply.extend_from_slice(&region.addr.to_le_bytes());
        reply.extend_from_slice(&region.size.to_le_bytes());
        reply.extend_from_slice(&region.kind.to_le_bytes());
        reply.extend_from_slice(&(region.tag.len() as u32).to_le_bytes());
        reply.extend_from_slice(&export.token.to_le_bytes());
        reply.extend_from_slice(&export.stamp.to_le_bytes());
        reply.extend_from_slice(&export.slot.to_le_bytes());
        reply.extend_from_slice(&0u32.to_le_bytes());
        reply.extend_from_slice(&region.tag);
    }
    if write_full(&mut stream, &reply, Instant::now() + FRAME_TIMEOUT, stop).is_err() {
        return;
    }
    let mut staging = vec![0u8; CHUNK];
    loop {
        // Idle between frames: wait for the first byte without a deadline (stop still checked).
        let mut header = [0u8; 24];
        if read_full(&mut stream, &mut header[..1], None, stop).is_err()
            || read_full(&mut stream, &mut header[1..], Some(Instant::now() + FRAME_TIMEOUT), stop).is_err()
        {
            return;
        }
        if let Some(address) = address {
            wait_while_stalled(address, stop);
        }
        let (op, reserved, remote, len) =
            (u32_at(&header, 0), u32_at(&header, 4), u64_at(&header, 8), u64_at(&header, 16));
        if reserved != 0 || len == 0 || len > MAX_ENTRY_LEN || (op != OP_PUT && op != OP_GET) {
            return;
        }
        let valid = inside(lock(regions).iter(), remote, len);
        let served = if op == OP_PUT {
            serve_put(&mut stream, stop, &mut staging, valid, remote, len)
        } else {
            serve_get(&mut stream, stop, &mut staging, valid, remote, len)
        };
        if served.is_err() {
            return;
        }
    }
}

fn serve_put(
    stream: &mut TcpStream,
    stop: &AtomicBool,
    staging: &mut [u8],
    valid: bool,
    remote: u64,
    len: u64,
) -> Result<(), Io> {
    let mut status = if valid { HIXL_SUCCESS } else { HIXL_PARAM_INVALID };
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        read_full(stream, &mut staging[..n], Some(Instant::now() + FRAME_TIMEOUT), stop)?;
        if status == HIXL_SUCCESS && acl_copy((remote + done) as usize, staging.as_ptr() as usize, n).is_err() {
            status = HIXL_FAILED;
        }
        done += n as u64;
    }
    write_full(stream, &status.to_le_bytes(), Instant::now() + FRAME_TIMEOUT, stop)
}

fn serve_get(
    stream: &mut TcpStream,
    stop: &AtomicBool,
    staging: &mut [u8],
    valid: bool,
    remote: u64,
    len: u64,
) -> Result<(), Io> {
    if !valid {
        return write_full(stream, &HIXL_PARAM_INVALID.to_le_bytes(), Instant::now() + FRAME_TIMEOUT, stop);
    }
    write_full(stream, &HIXL_SUCCESS.to_le_bytes(), Instant::now() + FRAME_TIMEOUT, stop)?;
    let mut status = HIXL_SUCCESS;
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        if status == HIXL_SUCCESS && acl_copy(staging.as_mut_ptr() as usize, (remote + done) as usize, n).is_err() {
            status = HIXL_FAILED;
        }
        if status != HIXL_SUCCESS {
            staging[..n].fill(0);
        }
        write_full(stream, &staging[..n], Instant::now() + FRAME_TIMEOUT, stop)?;
        done += n as u64;
    }
    write_full(stream, &status.to_le_bytes(), Instant::now() + FRAME_TIMEOUT, stop)
}

/// `HixlCSServerCreate`: records the listening address (bound by `HixlCSServerListen`).
///
/// # Safety
/// The C contract: pointers are null or valid for reading (`server_handle` for writing).
#[no_mangle]
pub unsafe extern "C" fn HixlCSServerCreate(
    server_desc: *const HixlServerDesc,
    config: *const HixlServerConfig,
    server_handle: *mut HixlServerHandle,
) -> HixlStatus {
    guard(|| {
        not_null(server_desc)?;
        not_null(server_handle)?;
        // The documentation refuses a null config; its JSON (ports, channels, QoS) is not modelled.
        not_null(config)?;
        // SAFETY: non-null, readable by the C contract.
        let desc = unsafe { server_desc.read() };
        if desc.endpoint_list_num == 0 || desc.endpoint_list_num > MAX_ENDPOINTS {
            return Err(HIXL_PARAM_INVALID);
        }
        not_null(desc.endpoint_list)?;
        let address = ip_address(desc.server_ip, desc.server_port)?;
        // SAFETY: non-null; the C contract makes it `endpoint_list_num` readable descriptors.
        let endpoints = unsafe { core::slice::from_raw_parts(desc.endpoint_list, desc.endpoint_list_num as usize) };
        device_bound_if(endpoints)?;
        let id = create_server(address, crate::runtime::runtime().current_device().ok());
        // SAFETY: non-null, writable by the C contract.
        unsafe { server_handle.write(id as HixlServerHandle) };
        Ok(())
    })
}

/// A server at `address` (bound by [`listen_server`]) whose threads make `device` current; its id. Also the control
/// server of the twin's FabricMem engine (module `fabric_mem`), which serves the same hello.
pub(crate) fn create_server(address: SocketAddr, device: Option<i32>) -> usize {
    // The device path's registry: without one (no memfd, no export service) batches take the wire path.
    let state = ServerState { registry: device::Registry::new().ok(), ..ServerState::default() };
    let server = Arc::new(Server { address, device, state: Mutex::new(state), shared: Arc::default() });
    servers().insert(server)
}

/// Registers `region` with server `id` (a DEVICE range exported for importers); the registration's handle.
fn register_with_server(id: usize, region: Region) -> Result<usize, HixlStatus> {
    let server = servers().items.get(&id).cloned().ok_or(HIXL_PARAM_INVALID)?;
    let mut state = lock(&server.state);
    let ServerState { regions, registry, .. } = &mut *state;
    let handle = add_registration(regions, region)?;
    if let (Some(registry), Some((_, added))) = (registry.as_mut(), regions.last_mut()) {
        added.export = registry.export(added);
    }
    server.publish(&state);
    Ok(handle)
}

/// Binds server `id`'s address and starts serving.
fn listen_server(id: usize) -> Status {
    let server = servers().items.get(&id).cloned().ok_or(HIXL_PARAM_INVALID)?;
    let mut state = lock(&server.state);
    if state.listening.is_some() {
        return Err(HIXL_PARAM_INVALID);
    }
    let listener = TcpListener::bind(server.address).map_err(|_| HIXL_FAILED)?;
    listener.set_nonblocking(true).map_err(|_| HIXL_FAILED)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (thread_stop, regions, device) = (stop.clone(), server.shared.clone(), server.device);
    let registry = state.registry.as_ref().map_or(0, device::Registry::token);
    let thread = std::thread::Builder::new()
        .name(format!("{}hixl-server", crate::THREAD_PREFIX))
        .spawn(move || accept_loop(listener, thread_stop, regions, device, registry))
        .map_err(|_| HIXL_FAILED)?;
    state.listening = Some((stop, thread));
    Ok(())
}

/// Removes registration `handle` of server `id`: its importers see it gone, later imports are refused.
fn unregister_with_server(id: usize, handle: usize) -> Status {
    let server = servers().items.get(&id).cloned().ok_or(HIXL_PARAM_INVALID)?;
    let mut state = lock(&server.state);
    let ServerState { regions, registry, .. } = &mut *state;
    let export = regions.iter().find(|(other, _)| *other == handle).and_then(|(_, region)| region.export);
    remove_registration(regions, handle as MemHandle)?;
    if let (Some(export), Some(registry)) = (export, registry.as_mut()) {
        registry.withdraw(&export);
    }
    server.publish(&state);
    Ok(())
}

/// Stops server `id` (its listener and every connection, within about 100 ms), withdraws its exports, forgets it.
fn destroy_server(id: usize) -> Status {
    let server = servers().items.remove(&id).ok_or(HIXL_PARAM_INVALID)?;
    let listening = lock(&server.state).listening.take();
    if let Some((stop, thread)) = listening {
        stop.store(true, Ordering::Relaxed);
        let _ = thread.join();
    }
    // Every export withdrawn, the registry's stamps zeroed (importers see their imports gone).
    let mut state = lock(&server.state);
    let ServerState { regions, registry, .. } = &mut *state;
    if let Some(mut registry) = registry.take() {
        for export in regions.iter().filter_map(|(_, region)| region.export) {
            registry.withdraw(&export);
        }
    }
    Ok(())
}

/// `HixlCSServerRegMem`: `mem` becomes reachable by clients (those connecting from now on see it listed). DEVICE
/// memory of this process that is one heap allocation or lies in one mapping is exported for the device path.
///
/// # Safety
/// The C contract; `mem` stays allocated until unregistered.
#[no_mangle]
pub unsafe extern "C" fn HixlCSServerRegMem(
    server_handle: HixlServerHandle,
    mem_tag: *const c_char,
    mem: *const CommMem,
    mem_handle: *mut MemHandle,
) -> HixlStatus {
    guard(|| {
        not_null(mem_handle)?;
        let region = region_of(mem, mem_tag)?;
        let id = register_with_server(server_handle as usize, region)?;
        // SAFETY: non-null, writable by the C contract.
        unsafe { mem_handle.write(id as MemHandle) };
        Ok(())
    })
}

/// `HixlCSServerListen`: binds the address and starts serving (`backlog` is not modelled).
///
/// # Safety
/// None beyond the C contract (the handle is looked up, never dereferenced).
#[no_mangle]
pub unsafe extern "C" fn HixlCSServerListen(server_handle: HixlServerHandle, backlog: u32) -> HixlStatus {
    guard(|| {
        let _ = backlog;
        listen_server(server_handle as usize)
    })
}

/// Adds `region` to `registrations` under a new handle: `HIXL_RESOURCE_EXHAUSTED` past [`MAX_REGISTRATIONS`],
/// `HIXL_PARAM_INVALID` if it overlaps one already there.
fn add_registration(registrations: &mut Vec<(usize, Region)>, region: Region) -> Result<usize, HixlStatus> {
    if registrations.len() >= MAX_REGISTRATIONS {
        return Err(HIXL_RESOURCE_EXHAUSTED);
    }
    if registrations.iter().any(|(_, r)| r.addr < region.addr + region.size && region.addr < r.addr + r.size) {
        return Err(HIXL_PARAM_INVALID);
    }
    let id = next_mem_handle();
    registrations.push((id, region));
    Ok(id)
}

/// Removes the registration `handle` names from `registrations`; `HIXL_PARAM_INVALID` if none does.
fn remove_registration(registrations: &mut Vec<(usize, Region)>, handle: MemHandle) -> Status {
    let before = registrations.len();
    registrations.retain(|(id, _)| *id != handle as usize);
    if registrations.len() == before {
        return Err(HIXL_PARAM_INVALID);
    }
    Ok(())
}

/// `HixlCSServerUnregMem`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn HixlCSServerUnregMem(server_handle: HixlServerHandle, mem_handle: MemHandle) -> HixlStatus {
    guard(|| unregister_with_server(server_handle as usize, mem_handle as usize))
}

/// `HixlCSServerDestroy`: stops listening, closes every connection (within about 100 ms), forgets the handle.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn HixlCSServerDestroy(server_handle: HixlServerHandle) -> HixlStatus {
    guard(|| destroy_server(server_handle as usize))
}

// ---------------------------------------------------------------------------------------------------------------
// Client.

/// The final or current state of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Waiting,
    Completed,
    Failed,
    Timeout,
}

#[derive(Debug)]
struct Batch {
    put: bool,
    entries: Vec<HixlOneSideOpDesc>,
    deadline: Instant,
    /// The wire path's outcome (the client's worker sets it).
    outcome: Mutex<Outcome>,
    done: Condvar,
    /// On the device path: the batch's launches, Host flag and error status (its outcome is read from them).
    device: Option<device::DeviceBatch>,
}

impl Batch {
    fn finish(&self, outcome: Outcome) {
        *lock(&self.outcome) = outcome;
        self.done.notify_all();
    }
}

#[derive(Debug)]
struct Connection {
    remote: Vec<Region>,
    queue: mpsc::Sender<Arc<Batch>>,
    stream: TcpStream,
    thread: JoinHandle<()>,
    /// The server's registrations imported for the device path (`None`: every batch takes the wire path).
    imports: Option<device::Imports>,
}

impl Connection {
    /// Ends the connection: its link revoked (device batches on it stop), the socket shut, the worker joined (bounded:
    /// it checks its stop flag at least every 100 ms). The imports are handed back, to be dropped once the client's
    /// stream no longer runs a batch that uses them.
    fn close(self) -> Option<device::Imports> {
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
struct ClientState {
    local: Vec<(usize, Region)>,
    connection: Option<Connection>,
    /// Batches not yet seen final by a query.
    pending: HashMap<usize, Arc<Batch>>,
    next_batch: usize,
    /// What the last `HixlCSClientGetRemoteMem` handed out (kept until the next call or destroy).
    remote_view: Option<RemoteView>,
    /// The client's device resources (its stream, the constant 1), made at its first connect with imports.
    slot: Option<device::Slot>,
    /// Device batches seen final (or abandoned) while their launches or Host-flag copy still ran: dropped once quiet.
    retired: Vec<Arc<Batch>>,
    /// Imports of connections that ended while batches may still have used them: dropped once the stream is idle.
    old_imports: Vec<device::Imports>,
}

impl ClientState {
    /// Drops the retired device batches that no longer run.
    fn reap(&mut self) {
        self.retired.retain(|batch| !batch.device.as_ref().is_none_or(device::DeviceBatch::quiet));
        if self.retired.is_empty() && self.pending.values().all(|batch| batch.device.is_none()) {
            self.old_imports.clear();
        }
    }
}

/// The server's registrations as `HixlCSClientGetRemoteMem` returns them: arrays this module owns.
#[derive(Debug)]
struct RemoteView {
    mems: Vec<CommMem>,
    _tags: Vec<std::ffi::CString>,
    tag_ptrs: Vec<*mut c_char>,
}

// SAFETY: the pointers point into the view's own `_tags` (heap buffers that do not move), read only by the caller.
unsafe impl Send for RemoteView {}

#[derive(Debug)]
struct Client {
    address: SocketAddr,
    /// As [`Server::device`].
    device: Option<i32>,
    state: Mutex<ClientState>,
    stop: Arc<AtomicBool>,
    /// Set when the connection failed: later batches fail at once.
    broken: Arc<AtomicBool>,
    /// Its counts ([`cannTwinHixlClientEvidence`]).
    tallies: Arc<device::Tallies>,
}

// SAFETY: a HixlOneSideOpDesc is plain addresses (integers to this module: every access goes through aclrtMemcpy).
unsafe impl Send for Batch {}
// SAFETY: as above; the mutable parts are behind a mutex.
unsafe impl Sync for Batch {}

fn client_of(handle: HixlClientHandle) -> Result<Arc<Client>, HixlStatus> {
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
type Hello = (TcpStream, Vec<Region>, u64);

fn hello(address: SocketAddr, deadline: Instant, stop: &AtomicBool) -> Result<Hello, HixlStatus> {
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

/// Whether the server closed or reset the connection (a peek that does not wait: the server sends nothing unasked).
fn peer_gone(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    // SAFETY: peeks at most one byte into a live local buffer, without blocking.
    let read =
        unsafe { libc::recv(stream.as_raw_fd(), byte.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    match read {
        0 => true,
        n if n > 0 => false,
        _ => !matches!(
            std::io::Error::last_os_error().kind(),
            ErrorKind::WouldBlock | ErrorKind::Interrupted | ErrorKind::TimedOut
        ),
    }
}

/// Whether the client's server is gone (its connection closed or reset: its process killed, or its server destroyed),
/// looked at when a device batch ends: the imported memory outlives its exporter, so a batch that ran on into it
/// after the server went did not reach the server. The client is then broken and its link revoked, as its worker
/// does when it finds the loss while idle.
fn server_lost(client: &Client, state: &ClientState) -> bool {
    let Some(connection) = state.connection.as_ref() else { return true };
    if client.broken.load(Ordering::Relaxed) || peer_gone(&connection.stream) {
        client.broken.store(true, Ordering::Relaxed);
        if let Some(imports) = &connection.imports {
            imports.link.revoke();
        }
        return true;
    }
    false
}

/// The client's worker: runs the wire path's batches in order, and while idle watches the connection (every
/// [`POLL`]): a server that is gone (its process killed, or destroyed) breaks the client and revokes the device path's
/// link, so device batches on it fail.
fn run_client(
    mut stream: TcpStream,
    batches: mpsc::Receiver<Arc<Batch>>,
    stop: &AtomicBool,
    broken: &AtomicBool,
    link: Option<&device::Link>,
    tallies: &device::Tallies,
) {
    let lost = |stream: &TcpStream| {
        broken.store(true, Ordering::Relaxed);
        let _ = stream.shutdown(Shutdown::Both);
        if let Some(link) = link {
            link.revoke();
        }
    };
    let mut staging = Vec::with_capacity(CHUNK + 64);
    loop {
        let batch = match batches.recv_timeout(POLL) {
            Ok(batch) => batch,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if !broken.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) && peer_gone(&stream) {
                    lost(&stream);
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        if broken.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
            batch.finish(Outcome::Failed);
            continue;
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| run_batch(&mut stream, &batch, &mut staging, stop, tallies)))
            .unwrap_or(Err(Io::Gone));
        match outcome {
            Ok(true) => batch.finish(Outcome::Completed),
            Ok(false) => batch.finish(Outcome::Failed),
            Err(io) => {
                // The stream is out of step or gone: no later batch may use it.
                lost(&stream);
                batch.finish(if io == Io::Timeout { Outcome::Timeout } else { Outcome::Failed });
            }
        }
    }
}

/// Runs every entry; `Ok(false)` when an entry failed but the stream is still in step.
///
/// Entries are pipelined in windows of [`WINDOW`]: the window's requests (with a put's bytes) are sent, coalesced
/// into writes of up to 1 MiB, then its answers are read. Neither side can block the other for good: a window's
/// put answers are `4 * WINDOW` bytes and its get requests `24 * WINDOW`, far below any socket buffer.
fn run_batch(
    stream: &mut TcpStream,
    batch: &Batch,
    staging: &mut Vec<u8>,
    stop: &AtomicBool,
    tallies: &device::Tallies,
) -> Result<bool, Io> {
    let deadline = batch.deadline;
    let mut all_ok = true;
    for window in batch.entries.chunks(WINDOW) {
        staging.clear();
        let mut local_ok = [true; WINDOW];
        for (index, entry) in window.iter().enumerate() {
            let (remote, local, len) = (entry.remote_buf as u64, entry.local_buf as u64, entry.len);
            staging.extend_from_slice(&(if batch.put { OP_PUT } else { OP_GET }).to_le_bytes());
            staging.extend_from_slice(&0u32.to_le_bytes());
            staging.extend_from_slice(&remote.to_le_bytes());
            staging.extend_from_slice(&len.to_le_bytes());
            let mut done = 0u64;
            while batch.put && done < len {
                if staging.len() >= CHUNK {
                    write_full(stream, staging, deadline, stop)?;
                    staging.clear();
                }
                let n = (len - done).min((CHUNK - staging.len()) as u64) as usize;
                let at = staging.len();
                staging.resize(at + n, 0);
                if local_ok[index] {
                    tallies.host_copy(n);
                    if acl_copy(staging[at..].as_mut_ptr() as usize, (local + done) as usize, n).is_err() {
                        // The bytes must still go (zeros, already there): the stream stays in step.
                        local_ok[index] = false;
                        staging[at..].fill(0);
                    }
                }
                done += n as u64;
            }
        }
        write_full(stream, staging, deadline, stop)?;
        staging.clear();
        let mut word = [0u8; 4];
        for (index, entry) in window.iter().enumerate() {
            read_full(stream, &mut word, Some(deadline), stop)?;
            if batch.put || u32::from_le_bytes(word) != HIXL_SUCCESS {
                all_ok &= local_ok[index] && u32::from_le_bytes(word) == HIXL_SUCCESS;
                continue;
            }
            let (local, len) = (entry.local_buf as u64, entry.len);
            staging.resize(CHUNK, 0);
            let mut ok = true;
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(CHUNK as u64) as usize;
                read_full(stream, &mut staging[..n], Some(deadline), stop)?;
                if ok {
                    tallies.host_copy(n);
                    ok = acl_copy((local + done) as usize, staging.as_ptr() as usize, n).is_ok();
                }
                done += n as u64;
            }
            read_full(stream, &mut word, Some(deadline), stop)?;
            all_ok &= ok && u32::from_le_bytes(word) == HIXL_SUCCESS;
        }
    }
    Ok(all_ok)
}

/// Test-only mis-wiring ([`crate::control::hixl_host_copies`]): the devices whose clients' batches all take the wire
/// path (Host copies).
static HOST_COPIES: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Makes every batch of the clients on `device` take the wire path (`true`), or lets the device path run again.
pub(crate) fn set_host_copies(device: i32, on: bool) {
    let mut devices = lock(&HOST_COPIES);
    devices.retain(|&other| other != device);
    if on {
        devices.push(device);
    }
}

fn host_copies(device: Option<i32>) -> bool {
    device.is_some_and(|device| lock(&HOST_COPIES).contains(&device))
}

/// A submitted batch: its client, its handle's id, the batch, and (device path) the stream it runs on.
struct Submitted {
    client: Arc<Client>,
    id: usize,
    batch: Arc<Batch>,
    stream: Option<Arc<crate::stream::Stream>>,
}

/// Whether `[address, address + len)` is device memory of this process (its first and last byte device addresses).
fn device_range(address: u64, len: u64) -> bool {
    let end = address.saturating_add(len.saturating_sub(1));
    crate::runtime::is_device_address(address as usize) && crate::runtime::is_device_address(end as usize)
}

/// Checks a batch and hands it to its path; the id of its handle.
///
/// The device path when the connection imported the server's memory, the client has its slot, every remote range lies
/// in one live import and every local range is device memory of this process (HiXL's HCCS client-server mode does not
/// reach remote Host memory: `hicann/hixl` `benchmarks/performance.md`); the wire path otherwise.
fn submit(
    client_handle: HixlClientHandle,
    put: bool,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout: Duration,
    with_flag: bool,
) -> Result<Submitted, HixlStatus> {
    let client = client_of(client_handle)?;
    not_null(desc_list)?;
    if list_num == 0 {
        return Err(HIXL_PARAM_INVALID);
    }
    // A batch above the limit can never be accepted: refused before its list is read.
    if list_num as usize > MAX_PENDING {
        return Err(HIXL_RESOURCE_EXHAUSTED);
    }
    // SAFETY: non-null; the C contract makes it `list_num` readable descriptors.
    let entries = unsafe { core::slice::from_raw_parts(desc_list, list_num as usize) }.to_vec();
    let mut state = lock(&client.state);
    let Some(connection) = state.connection.as_ref() else { return Err(HIXL_FAILED) };
    if client.broken.load(Ordering::Relaxed) {
        return Err(HIXL_FAILED);
    }
    for entry in &entries {
        if entry.len > MAX_ENTRY_LEN
            || !inside(state.local.iter().map(|(_, r)| r), entry.local_buf as u64, entry.len)
            || !inside(&connection.remote, entry.remote_buf as u64, entry.len)
        {
            return Err(HIXL_PARAM_INVALID);
        }
    }
    // The limit counts entries (the documentation's "4K transfers"), not batches: the stricter reading.
    let pending: usize = state.pending.values().map(|batch| batch.entries.len()).sum();
    if pending + entries.len() > MAX_PENDING {
        return Err(HIXL_RESOURCE_EXHAUSTED);
    }
    let deadline = Instant::now() + timeout;
    let relocated: Option<Vec<HixlOneSideOpDesc>> = match (&state.slot, &connection.imports) {
        (Some(_), Some(imports)) if !host_copies(client.device) => entries
            .iter()
            .map(|entry| {
                let remote = imports.link.relocate(entry.remote_buf as u64, entry.len)?;
                device_range(entry.local_buf as u64, entry.len)
                    .then_some(HixlOneSideOpDesc { remote_buf: remote as *mut c_void, ..*entry })
            })
            .collect(),
        _ => None,
    };
    let on_device = match (relocated, &state.slot, &connection.imports) {
        (Some(list), Some(slot), Some(imports)) => {
            let launched = device::launch(slot, &imports.link, &client.tallies, put, &list, deadline, with_flag)?;
            Some((launched, slot.stream()))
        }
        _ => None,
    };
    let (device, stream) = on_device.map_or((None, None), |(launched, stream)| (Some(launched), Some(stream)));
    let batch =
        Arc::new(Batch { put, entries, deadline, outcome: Mutex::new(Outcome::Waiting), done: Condvar::new(), device });
    if stream.is_none() {
        // Not importable: the batch runs on the connection's wire worker.
        connection.queue.send(batch.clone()).map_err(|_| HIXL_FAILED)?;
    }
    client.tallies.batch(batch.entries.len(), stream.is_some());
    state.next_batch += 1;
    let id = state.next_batch;
    state.pending.insert(id, batch.clone());
    state.reap();
    drop(state);
    Ok(Submitted { client, id, batch, stream })
}

fn submit_async(
    client_handle: HixlClientHandle,
    put: bool,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut CompleteHandle,
) -> Status {
    not_null(complete_handle)?;
    let Submitted { id, .. } = submit(client_handle, put, list_num, desc_list, ASYNC_TIMEOUT, true)?;
    // SAFETY: non-null, writable by the C contract.
    unsafe { complete_handle.write(id as CompleteHandle) };
    Ok(())
}

fn submit_sync(
    client_handle: HixlClientHandle,
    put: bool,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> Status {
    if timeout_ms == 0 {
        return Err(HIXL_PARAM_INVALID);
    }
    let timeout = Duration::from_millis(u64::from(timeout_ms));
    let Submitted { client, id, batch, stream } = submit(client_handle, put, list_num, desc_list, timeout, false)?;
    let outcome = match (&batch.device, stream) {
        // The device path's Sync calls wait for the client's stream (`aclrtSynchronizeStreamWithTimeout`), then read
        // the batch's error status.
        (Some(launched), Some(stream)) => {
            let left = batch.deadline.saturating_duration_since(Instant::now());
            let synchronized = stream.synchronize(Some(left));
            if synchronized == ascendcl_sys::sys::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT || launched.timed_out() {
                Outcome::Timeout
            } else if launched.failed() || server_lost(&client, &lock(&client.state)) {
                Outcome::Failed
            } else {
                Outcome::Completed
            }
        }
        _ => {
            // The worker ends the batch by its deadline; the extra second only covers scheduling.
            let limit = batch.deadline + Duration::from_secs(1);
            let mut outcome = lock(&batch.outcome);
            while *outcome == Outcome::Waiting {
                let left = limit.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                outcome = batch.done.wait_timeout(outcome, left).unwrap_or_else(|p| p.into_inner()).0;
            }
            *outcome
        }
    };
    let mut state = lock(&client.state);
    state.pending.remove(&id);
    if batch.device.as_ref().is_some_and(|launched| !launched.quiet()) {
        state.retired.push(batch);
    }
    state.reap();
    drop(state);
    match outcome {
        Outcome::Completed => Ok(()),
        Outcome::Waiting | Outcome::Timeout => Err(HIXL_TIMEOUT),
        Outcome::Failed => Err(HIXL_FAILED),
    }
}

/// `HixlCSClientBatchPutAsync`: `local_buf` to `remote_buf` for every entry; the handle for
/// `HixlCSClientQueryCompleteStatus`.
///
/// # Safety
/// The C contract: `desc_list` holds `list_num` descriptors; the ranges stay registered until the batch is final.
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientBatchPutAsync(
    client_handle: HixlClientHandle,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut CompleteHandle,
) -> HixlStatus {
    guard(|| submit_async(client_handle, true, list_num, desc_list, complete_handle))
}

/// `HixlCSClientBatchGetAsync`: `remote_buf` to `local_buf` for every entry.
///
/// # Safety
/// As [`HixlCSClientBatchPutAsync`].
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientBatchGetAsync(
    client_handle: HixlClientHandle,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut CompleteHandle,
) -> HixlStatus {
    guard(|| submit_async(client_handle, false, list_num, desc_list, complete_handle))
}

/// `HixlCSClientBatchPutSync`: as the Async call, waiting up to `timeout_ms` (`HIXL_TIMEOUT` past it).
///
/// # Safety
/// As [`HixlCSClientBatchPutAsync`].
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientBatchPutSync(
    client_handle: HixlClientHandle,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> HixlStatus {
    guard(|| submit_sync(client_handle, true, list_num, desc_list, timeout_ms))
}

/// `HixlCSClientBatchGetSync`.
///
/// # Safety
/// As [`HixlCSClientBatchPutAsync`].
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientBatchGetSync(
    client_handle: HixlClientHandle,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> HixlStatus {
    guard(|| submit_sync(client_handle, false, list_num, desc_list, timeout_ms))
}

/// `HixlCSClientQueryCompleteStatus`: waiting, completed, failed or timeout; a final state releases the handle
/// (a later query of it is `HIXL_PARAM_INVALID`).
///
/// # Safety
/// The C contract: `complete_status` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientQueryCompleteStatus(
    client_handle: HixlClientHandle,
    complete_handle: CompleteHandle,
    complete_status: *mut HixlCompleteStatus,
) -> HixlStatus {
    guard(|| {
        let client = client_of(client_handle)?;
        not_null(complete_status)?;
        let mut state = lock(&client.state);
        let id = complete_handle as usize;
        let batch = state.pending.get(&id).cloned().ok_or(HIXL_PARAM_INVALID)?;
        let outcome = match &batch.device {
            // The device path: the Host flag and the error status only (no synchronisation, no copy).
            Some(launched) if launched.landed() => {
                if launched.timed_out() {
                    Outcome::Timeout
                } else if launched.failed() || server_lost(&client, &state) {
                    Outcome::Failed
                } else {
                    Outcome::Completed
                }
            }
            Some(_) if Instant::now() >= batch.deadline => Outcome::Timeout,
            Some(_) => Outcome::Waiting,
            None => *lock(&batch.outcome),
        };
        let status = match outcome {
            Outcome::Waiting => HIXL_COMPLETE_STATUS_WAITING,
            Outcome::Completed => HIXL_COMPLETE_STATUS_COMPLETED,
            Outcome::Failed => HIXL_COMPLETE_STATUS_FAILED,
            Outcome::Timeout => HIXL_COMPLETE_STATUS_TIMEOUT,
        };
        if outcome != Outcome::Waiting {
            state.pending.remove(&id);
            if batch.device.is_some() {
                // Its list is freed once nothing of it runs (the next submit reaps it).
                state.retired.push(batch);
            }
        }
        // SAFETY: non-null, writable by the C contract.
        unsafe { complete_status.write(status) };
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

// ---------------------------------------------------------------------------------------------------------------
// Table.

macro_rules! hixl_exports {
    ($($name:ident),* $(,)?) => {
        /// The C names of every HiXL function this runtime implements and exports.
        pub const HIXL_EXPORTED: &[&str] = &[$(stringify!($name)),*];

        /// The address of the implemented HiXL function called `name`, or `None`: the resolver for
        /// [`HixlApi::from_resolver`]. Each function has exactly the prototype `ascendcl_sys::hixl` declares.
        pub fn resolve_hixl(name: &str) -> Option<*const c_void> {
            match name {
                $(stringify!($name) => Some($name as *const c_void),)*
                _ => None,
            }
        }
    };
}

hixl_exports! {
    HixlCSServerCreate,
    HixlCSServerRegMem,
    HixlCSServerListen,
    HixlCSServerUnregMem,
    HixlCSServerDestroy,
    HixlCSClientCreate,
    HixlCSClientConnect,
    HixlCSClientGetRemoteMem,
    HixlCSClientRegMem,
    HixlCSClientUnregMem,
    HixlCSClientBatchPutAsync,
    HixlCSClientBatchGetAsync,
    HixlCSClientBatchPutSync,
    HixlCSClientBatchGetSync,
    HixlCSClientQueryCompleteStatus,
    HixlCSClientDestroy,
    cannTwinHixlClientEvidence,
}

/// The process-wide HiXL table resolved to this runtime, built once.
pub fn hixl_api() -> &'static HixlApi {
    static API: OnceLock<HixlApi> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: `resolve_hixl` returns only functions of this module declared with the prototypes of the table's
        // fields of the same names, callable from any thread for the life of the process.
        match unsafe { HixlApi::from_resolver(PathBuf::from(IN_PROCESS_HIXL_PATH), &resolve_hixl) } {
            Ok(api) => api,
            Err(error) => panic!("cann-twin does not implement a required HiXL symbol: {error}"),
        }
    })
}

/// What [`fabric_mem_api`]'s table reports as its path.
pub const IN_PROCESS_FABRIC_MEM_PATH: &str = "cann-twin FabricMem (in-process)";

/// **Twin-only**: the FabricMem engine's C functions ([`fabric_mem`]) as the process-wide table
/// `ascendcl_sys::hixl::FabricMemApi`, built once.
pub fn fabric_mem_api() -> &'static ascendcl_sys::hixl::FabricMemApi {
    static API: OnceLock<ascendcl_sys::hixl::FabricMemApi> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: `resolve_fabric_mem` returns only functions of module `fabric_mem` declared with the prototypes of
        // the table's fields of the same names, callable from any thread for the life of the process.
        match unsafe {
            ascendcl_sys::hixl::FabricMemApi::from_resolver(
                PathBuf::from(IN_PROCESS_FABRIC_MEM_PATH),
                &fabric_mem::resolve_fabric_mem,
            )
        } {
            Ok(api) => api,
            Err(error) => panic!("cann-twin does not implement a required FabricMem symbol: {error}"),
        }
    })
}
