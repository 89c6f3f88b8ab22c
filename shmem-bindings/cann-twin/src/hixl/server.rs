//! The HiXL server: its table entry, the accept loop and one thread per connection serving the hello and the wire
//! path's puts and gets, and the `HixlCSServer*` C functions.

use core::ffi::c_char;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::*;

use super::common::{
    acl_copy, bind_device, device_bound_if, guard, inside, ip_address, lock, next_mem_handle, not_null, region_of,
    Region, Status, CHUNK, FRAME_TIMEOUT, HELLO_ANSWER_BYTES, HELLO_ENTRY_BYTES, HELLO_TIMEOUT, MAGIC, MAX_CONNECTIONS,
    MAX_ENDPOINTS, MAX_ENTRY_LEN, MAX_REGISTRATIONS, OP_GET, OP_PUT, VERSION,
};
use super::device;
use super::device::RegionExport;
use super::socket::{read_full, u32_at, u64_at, write_full, Io};

#[derive(Debug, Default)]
struct ServerState {
    regions: Vec<(usize, Region)>,
    listening: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    /// The registry page of the device path (`None` if it could not be made: every batch then takes the wire path).
    registry: Option<device::Registry>,
}

#[derive(Debug)]
pub(super) struct Server {
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
pub(super) fn register_with_server(id: usize, region: Region) -> Result<usize, HixlStatus> {
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
pub(super) fn listen_server(id: usize) -> Status {
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
pub(super) fn unregister_with_server(id: usize, handle: usize) -> Status {
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
pub(super) fn destroy_server(id: usize) -> Status {
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
pub(super) fn add_registration(registrations: &mut Vec<(usize, Region)>, region: Region) -> Result<usize, HixlStatus> {
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
pub(super) fn remove_registration(registrations: &mut Vec<(usize, Region)>, handle: MemHandle) -> Status {
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

/// The servers of this process by handle.
pub(super) fn servers() -> std::sync::MutexGuard<'static, super::common::Table<Server>> {
    static SERVERS: Mutex<super::common::Table<Server>> = Mutex::new(super::common::Table::new(0x1000));
    lock(&SERVERS)
}
