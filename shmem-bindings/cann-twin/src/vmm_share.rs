//! VMM export and import across processes: `aclrtMemExportToShareableHandle[V2]` and
//! `aclrtMemImportFromShareableHandle[V2]`. The importer's physical handle is backed by the *same memfd pages* as
//! the exporter's `aclrtMallocPhysical` allocation, so what one process's device side writes the other's reads.
//! IPC keys (`aclrtIpcMemGetExportKey`, `aclrtIpcMemImportByKey`, `aclrtIpcMemClose`) share `aclrtMalloc` ranges
//! on the same service (see the section at the end of this file and docs/twin-runtime.md), and so do the twin-internal
//! range exports of the twin's HiXL server (`export_range`, `import_range`: request op 3).
//!
//! # The shareable handle
//!
//! A `u64`: bits 63..42 are the exporting process's pid (Linux pids are below `PID_MAX_LIMIT`, 2^22), bits 41..0 a
//! token of 42 random bits from `getrandom(2)`, never 0, unique among the process's live exports. The token is the
//! capability: the service hands out an export only for the exact 64-bit value. The V2 fabric handle
//! (`aclrtMemFabricHandle`, 128 bytes) carries the same `u64` little-endian in bytes 0..8, the magic
//! [`FABRIC_MAGIC`] in bytes 8..24, zeros in bytes 24..128; anything else is refused.
//!
//! # The export service
//!
//! Each process that exports runs one service thread (`cann-twin-vmm`) listening on the abstract Unix socket
//! [`socket_name`]`(pid)`: `cann-twin-vmm-<pid>`. It starts with the first live export and stops (thread joined,
//! socket closed, the name free again) when the last one is withdrawn. An import in the exporting process itself
//! does not use the socket (it looks the export up directly). Another process connects to the name its handle's pid
//! gives and checks with `SO_PEERCRED` that the listener *is* that pid; the service checks that the peer has the
//! same effective uid (others are closed at once, unanswered).
//!
//! Wire: the request is exactly [`REQUEST_LEN`] (16) bytes: [`REQUEST_MAGIC`] (4), the op (u32 LE: 1 VMM import,
//! 2 IPC import, 3 range import), the shareable handle, key value or range token (u64 LE). The reply is exactly [`REPLY_LEN`] (24) bytes:
//! [`REPLY_MAGIC`] (4), a status (u32 LE, [`Status`]), the size (u64 LE), the offset in the memfd (u64 LE; 0 for
//! VMM); with status OK the memfd is attached
//! (`SCM_RIGHTS`). A request of the wrong magic, op or length is answered `BadRequest`; a handle not exported
//! (forged, withdrawn, freed) `Unknown`, whatever export the process has (nothing about other exports is revealed).
//!
//! Limits (the service never blocks on a peer): the socket is non-blocking and one thread polls everything; a
//! connection must deliver its 16 bytes within [`REQUEST_DEADLINE`] (500 ms) of being accepted, else it is answered
//! `Timeout` and closed; at most [`MAX_CONNECTIONS`] (64) connections wait at once (a new one over it evicts the
//! oldest, answered `Busy`) and at most [`MAX_PER_PID`] (16) of one pid (a new one over it is answered `Busy`);
//! replies are sent with `MSG_DONTWAIT` (24 bytes into an empty socket buffer) and dropped if they would block.
//!
//! Client: one deadline, [`IMPORT_TIMEOUT`] (2 s), bounds the whole import (connect, a full listen backlog, retries
//! after `Busy`, the request and the reply). Any failure of the exchange is reported as `ACL_ERROR_RT_IPC_ERROR`
//! when the exporting process is gone (no such pid, or a zombie), and only then: the peer-loss signal (see the crate
//! docs); nobody listening is immediate. A live exporter that does not listen (it exports nothing any more) or
//! closes without a reply gives `ACL_ERROR_RT_INVALID_HANDLE`; a listener that is not the pid the handle names, or
//! a reply that breaks the protocol, `ACL_ERROR_RT_INTERNAL_ERROR`. A reused pid reads as a live process with no
//! such export.
//!
//! # Flags
//!
//! `ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION` (1) lets any same-uid process import. The default (0) makes the
//! vendor require the importer's pid be whitelisted with `aclrtMemSetPidToShareableHandle`, which `ascendcl-sys`
//! does not declare: so with flags 0 the twin refuses every import from another process (`ACL_ERROR_RT_NO_PERMISSION`).
//!
//! Lock order: the runtime mutex, then `SERVICE`, then `EXPORTS`. The service thread takes only `EXPORTS`, so
//! stopping it (joined under `SERVICE`) cannot deadlock.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;

use crate::memory::{Physical, GRANULARITY};
use crate::runtime::runtime;

/// Bits of the handle that hold the token (the low bits); the pid is above them.
pub const TOKEN_BITS: u32 = 42;
/// Bits of the handle that hold the exporting pid.
pub const PID_BITS: u32 = 64 - TOKEN_BITS;
const TOKEN_MASK: u64 = (1 << TOKEN_BITS) - 1;
/// The prefix of the abstract socket name of a process's export service; the decimal pid follows.
pub const SOCKET_PREFIX: &str = "cann-twin-vmm-";
/// Length of a request.
pub const REQUEST_LEN: usize = 16;
/// Length of a reply.
pub const REPLY_LEN: usize = 24;
/// First bytes of a request.
pub const REQUEST_MAGIC: [u8; 4] = *b"CTVQ";
/// First bytes of a reply.
pub const REPLY_MAGIC: [u8; 4] = *b"CTVR";
/// The request's op for a VMM import.
pub const OP_IMPORT: u32 = 1;
/// The request's op for an IPC key import.
pub const OP_IPC_IMPORT: u32 = 2;
/// The request's op for a twin-internal range import (`export_range`: a HiXL server's registration, its registry).
pub const OP_RANGE_IMPORT: u32 = 3;
/// The prefix of a twin IPC key; 16 lowercase hex digits of the key value (laid out as a shareable handle) follow.
pub const IPC_KEY_PREFIX: &str = "cann-twin-ipc-";
/// The length of a twin IPC key, without its NUL.
pub const IPC_KEY_LEN: usize = IPC_KEY_PREFIX.len() + 16;
/// Bytes 8..24 of a twin fabric handle.
pub const FABRIC_MAGIC: [u8; 16] = *b"cann-twin-fabric";
/// The whole import's deadline.
pub const IMPORT_TIMEOUT: Duration = Duration::from_secs(2);
/// A connection's deadline for its whole request, from accept.
pub const REQUEST_DEADLINE: Duration = Duration::from_millis(500);
/// Connections waiting for their request at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections of one peer pid waiting at once.
pub const MAX_PER_PID: usize = 16;
/// Connections accepted per turn of the loop (so waiting ones are read between bursts).
const ACCEPT_BURST: usize = 32;
/// Pause between a client's retries after `Busy` or a full backlog.
const RETRY_PAUSE: Duration = Duration::from_millis(5);

/// A reply's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// The memfd is attached.
    Ok = 0,
    /// No live export has this handle.
    Unknown = 1,
    /// The export checks pids and the importer is not whitelisted (flags 0).
    NoPermission = 2,
    /// Wrong magic, op or length.
    BadRequest = 3,
    /// Over a connection limit: retry.
    Busy = 4,
    /// The request did not arrive within the deadline.
    Timeout = 5,
}

impl Status {
    fn from_u32(value: u32) -> Option<Status> {
        [Status::Ok, Status::Unknown, Status::NoPermission, Status::BadRequest, Status::Busy, Status::Timeout]
            .into_iter()
            .find(|status| *status as u32 == value)
    }
}

/// The abstract socket name (without the leading NUL) of `pid`'s export service.
pub fn socket_name(pid: u32) -> Vec<u8> {
    format!("{SOCKET_PREFIX}{pid}").into_bytes()
}

/// The exporting pid a shareable handle names.
pub fn handle_pid(handle: u64) -> u32 {
    (handle >> TOKEN_BITS) as u32
}

/// Whether this process's export service is running (for tests: it stops with the last export).
pub fn service_running() -> bool {
    lock(&SERVICE).as_ref().is_some_and(|running| running.pid == own_pid())
}

fn own_pid() -> u32 {
    std::process::id()
}

/// One live export.
#[derive(Debug)]
struct Export {
    fd: Arc<OwnedFd>,
    size: usize,
    check_pid: bool,
    /// The exported physical handle.
    handle: usize,
}

/// One live IPC export: `size` bytes at `offset` of the heap memfd.
#[derive(Debug)]
struct IpcExport {
    fd: Arc<OwnedFd>,
    offset: usize,
    size: usize,
    check_pid: bool,
    /// The `aclrtMalloc` allocation the range lies in (its free withdraws the key).
    allocation: usize,
}

/// One IPC import: a shared mapping of the exporter's pages, registered as a device window.
#[derive(Debug)]
struct IpcImport {
    view: usize,
    map_len: usize,
    /// The window's Host start (`view` plus the offset inside the first page), its registration key.
    host: usize,
}

/// One twin-internal range export ([`export_range`]): `size` bytes at `offset` of a memfd.
#[derive(Debug)]
struct RangeExport {
    fd: Arc<OwnedFd>,
    offset: usize,
    size: usize,
}

#[derive(Debug, Default)]
struct Exports {
    /// By shareable handle.
    live: HashMap<u64, Export>,
    /// Imported physical handle -> the shareable handle it came from (one import per handle in a process).
    imported: HashMap<usize, u64>,
    /// IPC exports by key value.
    ipc: HashMap<u64, IpcExport>,
    /// IPC imports by key value.
    ipc_imported: HashMap<u64, IpcImport>,
    /// Twin-internal range exports by token.
    ranges: HashMap<u64, RangeExport>,
}

impl Exports {
    fn is_empty(&self) -> bool {
        self.live.is_empty() && self.ipc.is_empty() && self.ranges.is_empty()
    }
}

#[derive(Debug)]
struct Service {
    /// The process that started it: after a `fork` the child inherits this record but not the thread.
    pid: u32,
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    thread: JoinHandle<()>,
}

/// The running service's listening descriptor, or -1: a `fork` child closes its copy at once (`pthread_atfork`), so
/// that the parent's name is freed when the parent closes it, and never answered by a child without the thread.
static LISTENER_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn close_listener_in_child() {
    let fd = LISTENER_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: close is async-signal-safe; the descriptor is this child's copy of the listener, used by no
        // thread here (the serving thread does not exist in the child).
        unsafe { libc::close(fd) };
    }
}

/// Drops the record of a service inherited across `fork` (its thread is not in this process), and the exports
/// of the parent (their handles name the parent's pid).
fn forget_inherited(service: &mut Option<Service>) {
    if service.as_ref().is_some_and(|running| running.pid != own_pid()) {
        if let Some(inherited) = service.take() {
            // Never joined: the thread does not exist here.
            core::mem::forget(inherited);
        }
    }
    let pid = own_pid();
    with_exports(|exports| {
        exports.live.retain(|&value, _| handle_pid(value) == pid);
        exports.ipc.retain(|&value, _| handle_pid(value) == pid);
        exports.ranges.retain(|&value, _| handle_pid(value) == pid);
    });
}

static SERVICE: Mutex<Option<Service>> = Mutex::new(None);
static EXPORTS: Mutex<Option<Exports>> = Mutex::new(None);

fn lock<T>(mutex: &'static Mutex<T>) -> MutexGuard<'static, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn with_exports<R>(body: impl FnOnce(&mut Exports) -> R) -> R {
    let mut guard = lock(&EXPORTS);
    body(guard.get_or_insert_with(Exports::default))
}

fn random_token() -> Result<u64, aclError> {
    let mut bytes = [0u8; 8];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: writes at most the remaining bytes of a live local buffer.
        let got = unsafe { libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0) };
        if got < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ACL_ERROR_RT_INTERNAL_ERROR);
        }
        filled += got as usize;
    }
    Ok(u64::from_le_bytes(bytes) & TOKEN_MASK)
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd, aclError> {
    fd.try_clone().map_err(|_| ACL_ERROR_RT_RESOURCE_ALLOC_FAIL)
}

fn check_export_flags(flags: u64) -> Result<bool, aclError> {
    match flags {
        ACL_RT_VMM_EXPORT_FLAG_DEFAULT => Ok(true),
        ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION => Ok(false),
        _ => Err(ACL_ERROR_INVALID_PARAM),
    }
}

/// Exports physical `handle` (arguments already checked for null and type); returns the shareable handle.
pub(crate) fn export(handle: usize, flags: u64) -> Result<u64, aclError> {
    let check_pid = check_export_flags(flags)?;
    let runtime = runtime();
    runtime.ready()?;
    let physical = runtime.physical.get(&handle).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
    let pid = u64::from(own_pid());
    if pid >> PID_BITS != 0 {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    let mut service = lock(&SERVICE);
    forget_inherited(&mut service);
    let shareable = with_exports(|exports| -> Result<u64, aclError> {
        if exports.imported.contains_key(&handle) {
            // Only memory this process allocated is exported (`acl_rt.h`: the handle comes from aclrtMallocPhysical
            // in the exporting process).
            return Err(ACL_ERROR_RT_INVALID_HANDLE);
        }
        if exports.live.values().any(|export| export.handle == handle) {
            // One shareable handle per physical handle: a second export is an error (vendor documentation).
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        let shareable = loop {
            let token = random_token()?;
            let candidate = (pid << TOKEN_BITS) | token;
            if token != 0 && !exports.live.contains_key(&candidate) {
                break candidate;
            }
        };
        let fd = Arc::new(dup(physical.fd())?);
        exports.live.insert(shareable, Export { fd, size: physical.size, check_pid, handle });
        Ok(shareable)
    })?;
    if service.is_none() {
        match Service::start() {
            Ok(started) => *service = Some(started),
            Err(code) => {
                with_exports(|exports| exports.live.remove(&shareable));
                return Err(code);
            }
        }
    }
    Ok(shareable)
}

/// Physical `handle` was freed: withdraw its export (later imports fail; existing mappings keep the pages) and
/// forget it as an import. Stops the service with the last export. Called under the runtime lock.
pub(crate) fn forget_handle(handle: usize) {
    let mut service = lock(&SERVICE);
    let now_empty = with_exports(|exports| {
        exports.imported.remove(&handle);
        let before = exports.live.len();
        exports.live.retain(|_, export| export.handle != handle);
        before != exports.live.len() && exports.is_empty()
    });
    if now_empty {
        if let Some(running) = service.take() {
            running.stop();
        }
    }
}

/// Exports whose imports are answered as unknown handles for now (`control::withhold_export`).
static WITHHELD: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

fn is_withheld(shareable: u64) -> bool {
    WITHHELD.lock().unwrap_or_else(|p| p.into_inner()).contains(&shareable)
}

/// Withholds (`true`) or grants again an export of this process: while withheld, an import of it is answered as
/// one of an unknown handle (`ACL_ERROR_RT_INVALID_HANDLE`), as if its memory were gone; mappings already made stay.
pub(crate) fn set_withheld(shareable: u64, withheld: bool) {
    let mut handles = WITHHELD.lock().unwrap_or_else(|p| p.into_inner());
    handles.retain(|&other| other != shareable);
    if withheld {
        handles.push(shareable);
    }
}

/// Imports `shareable` as a new physical handle (device id checked by the caller under the runtime lock).
pub(crate) fn import(shareable: u64) -> Result<usize, aclError> {
    let pid = handle_pid(shareable);
    if pid == 0 || shareable & TOKEN_MASK == 0 {
        return Err(ACL_ERROR_RT_INVALID_HANDLE);
    }
    // One import of a shareable handle per process (vendor documentation; the code is a guess). Checked once the
    // exporter has answered, so that a gone exporter, a forged or freed handle, or a refusal take precedence: a
    // second import tells whether the exporter still grants the handle.
    let (fd, size) = if pid == own_pid() {
        with_exports(|exports| -> Result<(OwnedFd, usize), aclError> {
            let export =
                exports.live.get(&shareable).filter(|_| !is_withheld(shareable)).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
            Ok((dup(&export.fd)?, export.size))
        })?
    } else {
        let (fd, size, _) = fetch(pid, OP_IMPORT, shareable)?;
        (fd, size)
    };
    if with_exports(|exports| exports.imported.values().any(|&from| from == shareable)) {
        return Err(ACL_ERROR_RT_PARAM_INVALID);
    }
    let physical = Physical::from_fd(fd, size)?;
    let mut runtime = runtime();
    runtime.ready()?;
    let handle = runtime.new_handle();
    with_exports(|exports| {
        if exports.imported.values().any(|&from| from == shareable) {
            // Nothing was added: `physical` (the second view of the pages) is dropped on return.
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        exports.imported.insert(handle, shareable);
        Ok(())
    })?;
    runtime.physical.insert(handle, physical);
    Ok(handle)
}

/// The V2 fabric handle for `shareable`.
pub(crate) fn fabric_handle(shareable: u64) -> aclrtMemFabricHandle {
    let mut data = [0u8; 128];
    data[..8].copy_from_slice(&shareable.to_le_bytes());
    data[8..24].copy_from_slice(&FABRIC_MAGIC);
    aclrtMemFabricHandle { data }
}

/// The shareable handle inside a twin fabric handle, or `ACL_ERROR_RT_INVALID_HANDLE`.
pub(crate) fn from_fabric(fabric: &aclrtMemFabricHandle) -> Result<u64, aclError> {
    let data = &fabric.data;
    if data[8..24] != FABRIC_MAGIC || data[24..].iter().any(|&byte| byte != 0) {
        return Err(ACL_ERROR_RT_INVALID_HANDLE);
    }
    let mut value = [0u8; 8];
    value.copy_from_slice(&data[..8]);
    Ok(u64::from_le_bytes(value))
}

// ---------------------------------------------------------------------------------------------------------------
// The service.

impl Service {
    fn start() -> Result<Service, aclError> {
        let address =
            SocketAddr::from_abstract_name(socket_name(own_pid())).map_err(|_| ACL_ERROR_RT_INTERNAL_ERROR)?;
        // A stopped service's thread has been joined, so its listener is closed and the name free. The name is
        // taken only when a second copy of this runtime in the process (the cdylib and the rlib) exports too.
        static AT_FORK: std::sync::Once = std::sync::Once::new();
        AT_FORK.call_once(|| {
            // SAFETY: registers a child handler that only closes a descriptor (async-signal-safe).
            unsafe { libc::pthread_atfork(None, None, Some(close_listener_in_child)) };
        });
        let listener = UnixListener::bind_addr(&address).map_err(|_| ACL_ERROR_RT_RESOURCE_ALLOC_FAIL)?;
        listener.set_nonblocking(true).map_err(|_| ACL_ERROR_RT_RESOURCE_ALLOC_FAIL)?;
        let listener_fd = listener.as_raw_fd();
        // SAFETY: eventfd has no memory preconditions.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL);
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_stop, thread_wake) = (Arc::clone(&stop), Arc::clone(&wake));
        let thread = std::thread::Builder::new()
            .name("cann-twin-vmm".into())
            .spawn(move || serve(listener, &thread_stop, &thread_wake))
            .map_err(|_| ACL_ERROR_RT_RESOURCE_ALLOC_FAIL)?;
        LISTENER_FD.store(listener_fd, Ordering::Release);
        Ok(Service { pid: own_pid(), stop, wake, thread })
    }

    fn stop(self) {
        if self.pid != own_pid() {
            // Inherited across fork: there is no thread to stop or join here.
            core::mem::forget(self);
            return;
        }
        // The listener closes when the thread ends; a fork from now on has nothing to close.
        LISTENER_FD.store(-1, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local to the eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        // The loop never blocks but in poll, which the eventfd wakes: the join is prompt.
        let _ = self.thread.join();
    }
}

/// One connection waiting for its request.
#[derive(Debug)]
struct Waiting {
    stream: UnixStream,
    pid: i32,
    accepted: Instant,
    request: [u8; REQUEST_LEN],
    got: usize,
}

/// (pid, uid) of the peer of `fd` (SO_PEERCRED).
fn peer_credentials(fd: libc::c_int) -> Option<(i32, u32)> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = core::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `credentials` and `len` are live locals of the sizes passed.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut credentials as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some((credentials.pid, credentials.uid))
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn serve(listener: UnixListener, stop: &AtomicBool, wake: &OwnedFd) {
    let mut waiting: Vec<Waiting> = Vec::new();
    let uid = effective_uid();
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        let next = waiting.iter().map(|w| w.accepted + REQUEST_DEADLINE).min();
        let timeout = next.map_or(1000, |at| at.saturating_duration_since(now).as_millis().clamp(1, 1000) as i32);
        let mut fds = vec![
            libc::pollfd { fd: wake.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        fds.extend(waiting.iter().map(|w| libc::pollfd { fd: w.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 }));
        // SAFETY: `fds` is a live array of the length passed.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if ready < 0 {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        if fds[0].revents != 0 {
            let mut drained = [0u8; 8];
            // SAFETY: reads at most 8 bytes into a live local from the non-blocking eventfd.
            unsafe { libc::read(wake.as_raw_fd(), drained.as_mut_ptr().cast(), drained.len()) };
            continue;
        }
        // Read the waiting connections that are ready (in reverse, so removal keeps the poll indices valid).
        let readable: Vec<bool> = fds[2..].iter().map(|fd| fd.revents != 0).collect();
        for index in (0..waiting.len()).rev() {
            if !readable[index] {
                continue;
            }
            let connection = &mut waiting[index];
            match connection.stream.read(&mut connection.request[connection.got..]) {
                Ok(0) => {
                    waiting.swap_remove(index);
                }
                Ok(read) => {
                    connection.got += read;
                    if connection.got == REQUEST_LEN {
                        let connection = waiting.swap_remove(index);
                        answer(&connection);
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    waiting.swap_remove(index);
                }
            }
        }
        // Deadlines.
        let now = Instant::now();
        let mut index = 0;
        while index < waiting.len() {
            if now.duration_since(waiting[index].accepted) >= REQUEST_DEADLINE {
                let late = waiting.swap_remove(index);
                send_reply(&late.stream, Status::Timeout, (0, 0), None);
            } else {
                index += 1;
            }
        }
        // New connections.
        if fds[1].revents != 0 {
            for _ in 0..ACCEPT_BURST {
                match listener.accept() {
                    Ok((stream, _)) => admit(&mut waiting, stream, uid),
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        // Out of descriptors, say: do not spin on a listener that stays readable.
                        std::thread::sleep(Duration::from_millis(10));
                        break;
                    }
                }
            }
        }
    }
}

fn admit(waiting: &mut Vec<Waiting>, stream: UnixStream, uid: u32) {
    let Some((pid, peer_uid)) = peer_credentials(stream.as_raw_fd()) else { return };
    if peer_uid != uid || stream.set_nonblocking(true).is_err() {
        return;
    }
    if waiting.iter().filter(|w| w.pid == pid).count() >= MAX_PER_PID {
        send_reply(&stream, Status::Busy, (0, 0), None);
        return;
    }
    if waiting.len() >= MAX_CONNECTIONS {
        if let Some(oldest) = (0..waiting.len()).min_by_key(|&i| waiting[i].accepted) {
            let evicted = waiting.swap_remove(oldest);
            send_reply(&evicted.stream, Status::Busy, (0, 0), None);
        }
    }
    waiting.push(Waiting { stream, pid, accepted: Instant::now(), request: [0; REQUEST_LEN], got: 0 });
}

fn answer(connection: &Waiting) {
    let request = &connection.request;
    let op = u32::from_le_bytes([request[4], request[5], request[6], request[7]]);
    if request[..4] != REQUEST_MAGIC || !matches!(op, OP_IMPORT | OP_IPC_IMPORT | OP_RANGE_IMPORT) {
        send_reply(&connection.stream, Status::BadRequest, (0, 0), None);
        return;
    }
    let mut handle = [0u8; 8];
    handle.copy_from_slice(&request[8..16]);
    let handle = u64::from_le_bytes(handle);
    let found = with_exports(|exports| {
        if op == OP_IMPORT && is_withheld(handle) {
            None
        } else if op == OP_IMPORT {
            exports.live.get(&handle).map(|export| (Arc::clone(&export.fd), export.size, 0, export.check_pid))
        } else if op == OP_RANGE_IMPORT {
            // Range exports admit every process of this uid (HiXL exports with
            // `ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION`).
            exports.ranges.get(&handle).map(|export| (Arc::clone(&export.fd), export.size, export.offset, false))
        } else {
            exports
                .ipc
                .get(&handle)
                .map(|export| (Arc::clone(&export.fd), export.size, export.offset, export.check_pid))
        }
    });
    match found {
        None => send_reply(&connection.stream, Status::Unknown, (0, 0), None),
        // The whitelists (`aclrtMemSetPidToShareableHandle`, `aclrtIpcMemSetImportPid`) are not declared: only
        // the exporter itself passes them.
        Some((_, _, _, true)) if connection.pid != own_pid() as i32 => {
            send_reply(&connection.stream, Status::NoPermission, (0, 0), None)
        }
        Some((fd, size, offset, _)) => {
            send_reply(&connection.stream, Status::Ok, (size as u64, offset as u64), Some(&fd))
        }
    }
}

/// Sends one reply without blocking (dropped if the peer's buffer is full) and without SIGPIPE.
fn send_reply(stream: &UnixStream, status: Status, (size, offset): (u64, u64), fd: Option<&OwnedFd>) {
    let mut reply = [0u8; REPLY_LEN];
    reply[..4].copy_from_slice(&REPLY_MAGIC);
    reply[4..8].copy_from_slice(&(status as u32).to_le_bytes());
    reply[8..16].copy_from_slice(&size.to_le_bytes());
    reply[16..24].copy_from_slice(&offset.to_le_bytes());
    let mut iov = libc::iovec { iov_base: reply.as_mut_ptr().cast(), iov_len: reply.len() };
    // Room for one descriptor's control message, aligned for cmsghdr.
    let mut control = [0u64; 4];
    // SAFETY: a zeroed msghdr is a valid empty message.
    let mut message: libc::msghdr = unsafe { core::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(core::mem::size_of::<libc::c_int>() as u32) } as usize;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space;
        // SAFETY: the control buffer (32 bytes) holds one cmsghdr with one int (CMSG_SPACE(4) = 24 on Linux);
        // CMSG_FIRSTHDR of a message with a non-empty control buffer is non-null and inside it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(core::mem::size_of::<libc::c_int>() as u32) as usize;
            core::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), fd.as_raw_fd());
        }
    }
    // SAFETY: `message` points at live locals (reply, control) for the duration of the call.
    unsafe { libc::sendmsg(stream.as_raw_fd(), &message, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
}

// ---------------------------------------------------------------------------------------------------------------
// The client.

fn left(deadline: Instant) -> Result<Duration, aclError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(ACL_ERROR_RT_TIMEOUT)
    } else {
        Ok(left)
    }
}

fn set_timeout(fd: libc::c_int, option: libc::c_int, left: Duration) -> Result<(), aclError> {
    let value = libc::timeval {
        tv_sec: left.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(left.subsec_micros().max(1)),
    };
    // SAFETY: `value` is a live timeval of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&value as *const libc::timeval).cast(),
            core::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(ACL_ERROR_RT_INTERNAL_ERROR)
    }
}

/// What one attempt ended with.
enum Attempt {
    /// The memfd, the size and the offset of the shared range in it.
    Done(OwnedFd, usize, usize),
    Retry,
}

/// Connects to `pid`'s service, blocking at most until `deadline`.
fn connect(pid: u32, deadline: Instant) -> Result<Option<OwnedFd>, aclError> {
    // SAFETY: plain socket creation.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL);
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    set_timeout(fd.as_raw_fd(), libc::SO_SNDTIMEO, left(deadline)?)?;
    // SAFETY: a zeroed sockaddr_un is valid; the name is written inside sun_path below.
    let mut address: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = socket_name(pid);
    for (slot, &byte) in address.sun_path[1..].iter_mut().zip(&name) {
        *slot = byte as libc::c_char;
    }
    let len = core::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    // SAFETY: `address` is a live sockaddr_un and `len` lies inside it (the name is at most ~25 bytes).
    let rc =
        unsafe { libc::connect(fd.as_raw_fd(), (&address as *const libc::sockaddr_un).cast(), len as libc::socklen_t) };
    if rc == 0 {
        return Ok(Some(fd));
    }
    match std::io::Error::last_os_error().raw_os_error() {
        // Nobody listens on the name: the exporter exports nothing any more (or is gone: `fetch` tells).
        Some(libc::ECONNREFUSED) | Some(libc::ENOENT) => Err(ACL_ERROR_RT_INVALID_HANDLE),
        // A full backlog (the send timeout ran out) or an interruption: try again while time is left.
        Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ETIMEDOUT) => Ok(None),
        _ => Err(ACL_ERROR_RT_INTERNAL_ERROR),
    }
}

/// Whether `pid` names a live process (a zombie, exited but not yet reaped, is gone).
fn process_alive(pid: u32) -> bool {
    let Ok(raw) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists.
    let exists =
        unsafe { libc::kill(raw, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    // The state is the field after the parenthesised command name: `Z` zombie, `X` dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            !matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), Some('Z' | 'X'))
        }
        Err(_) => true,
    }
}

fn attempt(pid: u32, op: u32, shareable: u64, deadline: Instant) -> Result<Attempt, aclError> {
    let Some(fd) = connect(pid, deadline)? else { return Ok(Attempt::Retry) };
    // The listener must be the process the handle names (another process of this uid could have bound the name).
    match peer_credentials(fd.as_raw_fd()) {
        Some((peer, _)) if peer == pid as i32 => {}
        _ => return Err(ACL_ERROR_RT_INTERNAL_ERROR),
    }
    let mut request = [0u8; REQUEST_LEN];
    request[..4].copy_from_slice(&REQUEST_MAGIC);
    request[4..8].copy_from_slice(&op.to_le_bytes());
    request[8..].copy_from_slice(&shareable.to_le_bytes());
    set_timeout(fd.as_raw_fd(), libc::SO_SNDTIMEO, left(deadline)?)?;
    // SAFETY: sends from a live local of the length passed.
    let sent = unsafe { libc::send(fd.as_raw_fd(), request.as_ptr().cast(), request.len(), libc::MSG_NOSIGNAL) };
    if sent != REQUEST_LEN as isize {
        // The service closed the connection (it stops, or refused this uid), unless time ran out.
        return Err(if Instant::now() >= deadline { ACL_ERROR_RT_TIMEOUT } else { ACL_ERROR_RT_INVALID_HANDLE });
    }
    let mut reply = [0u8; REPLY_LEN];
    let mut got = 0;
    let mut received: Option<OwnedFd> = None;
    while got < REPLY_LEN {
        set_timeout(fd.as_raw_fd(), libc::SO_RCVTIMEO, left(deadline)?)?;
        let mut iov = libc::iovec { iov_base: reply[got..].as_mut_ptr().cast(), iov_len: REPLY_LEN - got };
        let mut control = [0u64; 16];
        // SAFETY: a zeroed msghdr is a valid empty message.
        let mut message: libc::msghdr = unsafe { core::mem::zeroed() };
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = core::mem::size_of_val(&control);
        // SAFETY: `message` points at live locals; received descriptors are close-on-exec.
        let read = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) };
        if read < 0 {
            let error = std::io::Error::last_os_error().raw_os_error();
            if error == Some(libc::EINTR) {
                continue;
            }
            return Err(if matches!(error, Some(libc::EAGAIN)) {
                ACL_ERROR_RT_TIMEOUT
            } else {
                ACL_ERROR_RT_INVALID_HANDLE
            });
        }
        // Take ownership of every descriptor that arrived, so none leaks; keep the first.
        // SAFETY: the kernel filled `message`; the CMSG macros walk only inside `msg_controllen`.
        unsafe {
            let mut header = libc::CMSG_FIRSTHDR(&message);
            while !header.is_null() {
                if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(header);
                    let bytes = (*header).cmsg_len as usize - (data as usize - header as usize);
                    for index in 0..bytes / core::mem::size_of::<libc::c_int>() {
                        let raw = core::ptr::read_unaligned(data.cast::<libc::c_int>().add(index));
                        let owned = OwnedFd::from_raw_fd(raw);
                        if received.is_none() {
                            received = Some(owned);
                        }
                    }
                }
                header = libc::CMSG_NXTHDR(&message, header);
            }
        }
        if read == 0 {
            // Closed before a whole reply: the service refused the connection (other uid) or stopped.
            return Err(ACL_ERROR_RT_INVALID_HANDLE);
        }
        got += read as usize;
    }
    if reply[..4] != REPLY_MAGIC {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    let status = Status::from_u32(u32::from_le_bytes([reply[4], reply[5], reply[6], reply[7]]));
    let mut size = [0u8; 8];
    size.copy_from_slice(&reply[8..16]);
    let size = u64::from_le_bytes(size);
    let mut offset = [0u8; 8];
    offset.copy_from_slice(&reply[16..24]);
    let offset = u64::from_le_bytes(offset);
    match status {
        Some(Status::Ok) => {}
        Some(Status::Unknown) => return Err(ACL_ERROR_RT_INVALID_HANDLE),
        Some(Status::NoPermission) => return Err(ACL_ERROR_RT_NO_PERMISSION),
        Some(Status::Busy) => return Ok(Attempt::Retry),
        Some(Status::Timeout) => return Err(ACL_ERROR_RT_TIMEOUT),
        Some(Status::BadRequest) | None => return Err(ACL_ERROR_RT_INTERNAL_ERROR),
    }
    let memfd = received.ok_or(ACL_ERROR_RT_INTERNAL_ERROR)?;
    let size = usize::try_from(size).map_err(|_| ACL_ERROR_RT_INTERNAL_ERROR)?;
    let offset = usize::try_from(offset).map_err(|_| ACL_ERROR_RT_INTERNAL_ERROR)?;
    // SAFETY: a zeroed stat is valid; fstat fills it for a descriptor we own.
    let mut stat: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `stat` is a live local.
    let rc = unsafe { libc::fstat(memfd.as_raw_fd(), &mut stat) };
    let file_len = u64::try_from(stat.st_size).ok().and_then(|len| usize::try_from(len).ok());
    let fits = match op {
        // A VMM export is a whole physical allocation: its own memfd, granularity-sized.
        OP_IMPORT => offset == 0 && size % GRANULARITY == 0 && file_len == Some(size),
        // An IPC export is a range of the exporter's heap memfd; a range export, of a memfd.
        _ => offset.checked_add(size).is_some_and(|end| file_len.is_some_and(|len| end <= len)),
    };
    if rc != 0 || size == 0 || !fits {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    // SAFETY: F_GET_SEALS takes no argument; it fails (EINVAL) unless the descriptor is a memfd.
    if unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_GET_SEALS) } < 0 {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    Ok(Attempt::Done(memfd, size, offset))
}

/// Fetches the memfd, size and offset of `shareable` (`op`: VMM or IPC) from `pid`'s service within
/// [`IMPORT_TIMEOUT`].
fn fetch(pid: u32, op: u32, shareable: u64) -> Result<(OwnedFd, usize, usize), aclError> {
    // Whatever failed, an exporter that is gone is reported as such: the peer-loss code, and only for that.
    fetch_from(pid, op, shareable).map_err(|code| if process_alive(pid) { code } else { ACL_ERROR_RT_IPC_ERROR })
}

fn fetch_from(pid: u32, op: u32, shareable: u64) -> Result<(OwnedFd, usize, usize), aclError> {
    let deadline = Instant::now() + IMPORT_TIMEOUT;
    loop {
        match attempt(pid, op, shareable, deadline)? {
            Attempt::Done(fd, size, offset) => return Ok((fd, size, offset)),
            Attempt::Retry => {
                std::thread::sleep(RETRY_PAUSE.min(left(deadline)?));
                left(deadline)?;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Twin-internal range exports: how the twin's HiXL server shares the memory behind a registration (and its registry
// page) with its clients, as the vendor's shares it through VMM export and import. Not ACL calls.

/// Shares `size` bytes at `offset` of `fd` (a memfd: the heap or a physical allocation behind device memory, or a
/// page of the exporter's own) on this process's export service, with every process of this uid; returns the token
/// that names it (laid out as a shareable handle: this pid, random bits). Withdrawn by [`withdraw_range`].
pub(crate) fn export_range(fd: Arc<OwnedFd>, offset: usize, size: usize) -> Result<u64, aclError> {
    if size == 0 {
        return Err(ACL_ERROR_INVALID_PARAM);
    }
    let pid = u64::from(own_pid());
    if pid >> PID_BITS != 0 {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    let mut service = lock(&SERVICE);
    forget_inherited(&mut service);
    let token = with_exports(|exports| -> Result<u64, aclError> {
        let token = loop {
            let random = random_token()?;
            let candidate = (pid << TOKEN_BITS) | random;
            if random != 0 && !exports.ranges.contains_key(&candidate) {
                break candidate;
            }
        };
        exports.ranges.insert(token, RangeExport { fd, offset, size });
        Ok(token)
    })?;
    if service.is_none() {
        match Service::start() {
            Ok(started) => *service = Some(started),
            Err(code) => {
                with_exports(|exports| exports.ranges.remove(&token));
                return Err(code);
            }
        }
    }
    Ok(token)
}

/// Withdraws a range export (later imports fail; mappings already made stay). Stops the service with the last export.
pub(crate) fn withdraw_range(token: u64) {
    let mut service = lock(&SERVICE);
    let now_empty = with_exports(|exports| exports.ranges.remove(&token).is_some() && exports.is_empty());
    if now_empty {
        if let Some(running) = service.take() {
            running.stop();
        }
    }
}

/// The memfd and offset behind device range `[address, address + size)` of this process, if it lies in one heap
/// allocation or one mapping of a physical allocation: what [`export_range`] shares for it.
pub(crate) fn backing_of(address: u64, size: u64) -> Result<(Arc<OwnedFd>, usize), aclError> {
    let (address, size) = (
        usize::try_from(address).map_err(|_| ACL_ERROR_INVALID_PARAM)?,
        usize::try_from(size).map_err(|_| ACL_ERROR_INVALID_PARAM)?,
    );
    // Lock order: the runtime, then the space.
    let runtime = runtime();
    let guard = crate::runtime::space();
    let space = guard.as_ref().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
    if let Ok((fd, offset, _)) = space.heap_range(address, size) {
        return Ok((Arc::new(dup(fd)?), offset));
    }
    let (handle, offset) = space.mapped_range(address, size)?;
    let physical = runtime.physical.get(&handle).ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
    Ok((Arc::new(dup(physical.fd())?), offset))
}

/// A range another process (or this one) exported with [`export_range`], mapped into this process: `size` bytes at
/// `host`, in a shared mapping unmapped on drop.
#[derive(Debug)]
pub(crate) struct RangeMapping {
    view: usize,
    map_len: usize,
    /// The range's first byte in this process.
    pub host: usize,
    pub size: usize,
}

impl Drop for RangeMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map_range`, owned by this value; whoever gave the range a device window
        // removed it first (the space's write lock), so no translation to it is live.
        unsafe { libc::munmap(self.view as *mut libc::c_void, self.map_len) };
    }
}

/// Maps the range `token` names, from this process's exports or through the exporter's service (within
/// [`IMPORT_TIMEOUT`]; `ACL_ERROR_RT_IPC_ERROR` when the exporter is gone).
pub(crate) fn import_range(token: u64) -> Result<RangeMapping, aclError> {
    let pid = handle_pid(token);
    if pid == 0 || token & TOKEN_MASK == 0 {
        return Err(ACL_ERROR_RT_INVALID_HANDLE);
    }
    let (fd, size, offset) = if pid == own_pid() {
        with_exports(|exports| -> Result<(OwnedFd, usize, usize), aclError> {
            let export = exports.ranges.get(&token).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
            Ok((dup(&export.fd)?, export.size, export.offset))
        })?
    } else {
        fetch(pid, OP_RANGE_IMPORT, token)?
    };
    map_range(&fd, offset, size)
}

/// Maps `size` bytes at `offset` of the memfd `fd` (an export's, checked by `fetch` or this process's own) shared,
/// readable and writable, at an address the kernel picks.
fn map_range(fd: &OwnedFd, offset: usize, size: usize) -> Result<RangeMapping, aclError> {
    let page = crate::memory::page();
    let first = offset / page * page;
    let in_page = offset - first;
    let map_len = (in_page + size).div_ceil(page) * page;
    let file_offset = libc::off_t::try_from(first).map_err(|_| ACL_ERROR_RT_INTERNAL_ERROR)?;
    // SAFETY: a new shared mapping of a range the memfd holds, at an address the kernel picks.
    let view = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            fd.as_raw_fd(),
            file_offset,
        )
    };
    if view == libc::MAP_FAILED {
        return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
    }
    let view = view as usize;
    Ok(RangeMapping { view, map_len, host: view + in_page, size })
}

// ---------------------------------------------------------------------------------------------------------------
// The C entry points (re-exported by `acl`, so the crate's `exports!` list resolves them).

use crate::acl::not_null;

/// Exports a physical allocation of this process as a `u64` shareable handle (layout in the module docs).
/// `handle_type` must be `ACL_MEM_HANDLE_TYPE_NONE`; `flags` 0 (pid whitelist: cross-process imports refused, the
/// whitelist call not being declared) or `ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION`. One export per handle.
///
/// # Safety
///
/// `shareable_handle` is null or writable (C contract).
#[no_mangle]
pub unsafe extern "C" fn aclrtMemExportToShareableHandle(
    handle: aclrtDrvMemHandle,
    handle_type: aclrtMemHandleType,
    flags: u64,
    shareable_handle: *mut u64,
) -> aclError {
    crate::acl::guard("aclrtMemExportToShareableHandle", move || {
        not_null(handle)?;
        if handle_type != ACL_MEM_HANDLE_TYPE_NONE {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        not_null(shareable_handle)?;
        let shareable = export(handle as usize, flags)?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { shareable_handle.write(shareable) };
        Ok(())
    })
}

/// The V2 export: `ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT` writes the `u64` handle, `ACL_MEM_SHARE_HANDLE_TYPE_FABRIC`
/// the 128-byte `aclrtMemFabricHandle` (layout in the module docs). Flags as for the first export.
///
/// # Safety
///
/// `shareable_handle` is null or writable for the size its type implies (C contract).
#[no_mangle]
pub unsafe extern "C" fn aclrtMemExportToShareableHandleV2(
    handle: aclrtDrvMemHandle,
    flags: u64,
    share_type: aclrtMemSharedHandleType,
    shareable_handle: *mut core::ffi::c_void,
) -> aclError {
    crate::acl::guard("aclrtMemExportToShareableHandleV2", move || {
        not_null(handle)?;
        not_null(shareable_handle)?;
        if share_type != ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT && share_type != ACL_MEM_SHARE_HANDLE_TYPE_FABRIC {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let shareable = export(handle as usize, flags)?;
        if share_type == ACL_MEM_SHARE_HANDLE_TYPE_FABRIC {
            // SAFETY: checked non-null; writable for a fabric handle by the C contract (unaligned: `void *`).
            unsafe { shareable_handle.cast::<aclrtMemFabricHandle>().write_unaligned(fabric_handle(shareable)) };
        } else {
            // SAFETY: checked non-null; writable for a u64 by the C contract (unaligned: `void *`).
            unsafe { shareable_handle.cast::<u64>().write_unaligned(shareable) };
        }
        Ok(())
    })
}

fn import_on(shareable: u64, device: i32, handle: *mut aclrtDrvMemHandle) -> Result<(), aclError> {
    {
        let runtime = runtime();
        runtime.ready()?;
        runtime.check_device_id(device)?;
    }
    let imported = import(shareable)?;
    // SAFETY: checked non-null by the callers; writable by the C contract.
    unsafe { handle.write(imported as aclrtDrvMemHandle) };
    Ok(())
}

/// Imports a shareable handle (of this or another process) as a physical handle for `device_id`, backed by the
/// exporter's pages. Fails with `ACL_ERROR_RT_INVALID_HANDLE` for a handle no live export has (forged, freed),
/// `ACL_ERROR_RT_NO_PERMISSION` for a flags-0 export from another process, `ACL_ERROR_RT_IPC_ERROR` at once when
/// the exporting process is gone, `ACL_ERROR_RT_TIMEOUT` when its service does not answer within 2 s.
///
/// # Safety
///
/// `handle` is null or writable (C contract).
#[no_mangle]
pub unsafe extern "C" fn aclrtMemImportFromShareableHandle(
    shareable_handle: u64,
    device_id: i32,
    handle: *mut aclrtDrvMemHandle,
) -> aclError {
    crate::acl::guard("aclrtMemImportFromShareableHandle", move || {
        not_null(handle)?;
        import_on(shareable_handle, device_id, handle)
    })
}

/// The V2 import, on the calling thread's current device; `flags` must be 0.
///
/// # Safety
///
/// `shareable_handle` is null or readable for the size its type implies; `handle` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemImportFromShareableHandleV2(
    shareable_handle: *mut core::ffi::c_void,
    share_type: aclrtMemSharedHandleType,
    flags: u64,
    handle: *mut aclrtDrvMemHandle,
) -> aclError {
    crate::acl::guard("aclrtMemImportFromShareableHandleV2", move || {
        not_null(shareable_handle)?;
        not_null(handle)?;
        if flags != 0 {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let device = runtime().current_device()?;
        let shareable = match share_type {
            ACL_MEM_SHARE_HANDLE_TYPE_FABRIC => {
                // SAFETY: checked non-null; readable for a fabric handle by the C contract (unaligned: `void *`).
                let fabric = unsafe { shareable_handle.cast::<aclrtMemFabricHandle>().read_unaligned() };
                from_fabric(&fabric)?
            }
            // SAFETY: checked non-null; readable for a u64 by the C contract (unaligned: `void *`).
            ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT => unsafe { shareable_handle.cast::<u64>().read_unaligned() },
            _ => return Err(ACL_ERROR_INVALID_PARAM),
        };
        import_on(shareable, device, handle)
    })
}

// ---------------------------------------------------------------------------------------------------------------
// IPC keys: a range of `aclrtMalloc` memory shared on the same mechanism. The key is the text
// `cann-twin-ipc-<16 hex digits>`, the digits a value laid out as a shareable handle (pid and token); the service
// passes the exporter's heap memfd with the range's offset and size, and the importer maps that range and gives it
// a device address of its own (a device window, as for registered Host memory).

fn ipc_key(value: u64) -> String {
    format!("{IPC_KEY_PREFIX}{value:016x}")
}

fn parse_ipc_key(key: &[u8]) -> Result<u64, aclError> {
    let digits = key.strip_prefix(IPC_KEY_PREFIX.as_bytes()).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
    if digits.len() != 16 || !digits.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) {
        return Err(ACL_ERROR_RT_INVALID_HANDLE);
    }
    let text = core::str::from_utf8(digits).map_err(|_| ACL_ERROR_RT_INVALID_HANDLE)?;
    u64::from_str_radix(text, 16).map_err(|_| ACL_ERROR_RT_INVALID_HANDLE)
}

/// The `aclrtMalloc` allocation at `allocation` is being freed (under the space's write lock): its IPC keys are
/// withdrawn. Mappings importers made keep the memfd range, whose pages the free punches out (they read zero, and
/// a later allocation may reuse them: the vendor calls use after the exporter's free undefined).
pub(crate) fn heap_released(allocation: usize) {
    let mut service = lock(&SERVICE);
    let now_empty = with_exports(|exports| {
        let before = exports.ipc.len();
        exports.ipc.retain(|_, export| export.allocation != allocation);
        before != exports.ipc.len() && exports.is_empty()
    });
    if now_empty {
        if let Some(running) = service.take() {
            running.stop();
        }
    }
}

fn ipc_export(address: usize, size: usize, flags: u64) -> Result<String, aclError> {
    let check_pid = check_export_flags(flags)?;
    let runtime = runtime();
    runtime.current_device()?;
    let (fd, offset, allocation) = {
        let space = crate::runtime::space();
        let space = space.as_ref().filter(|space| space.contains(address)).ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        match space.heap_range(address, size) {
            Ok((fd, offset, allocation)) => (Arc::new(dup(fd)?), offset, allocation),
            // A Host window (`aclrtHostRegister`) onto `aclrtMallocHost` memory: the allocation's own memfd.
            Err(code) => {
                let host = space.registered_host(address, size).ok_or(code)?;
                let (&start, allocation) = runtime
                    .host
                    .iter()
                    .find(|(&start, allocation)| host >= start && host + size <= start + allocation.length)
                    .ok_or(code)?;
                (allocation.fd.clone(), host - start, start)
            }
        }
    };
    let pid = u64::from(own_pid());
    if pid >> PID_BITS != 0 {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    let mut service = lock(&SERVICE);
    forget_inherited(&mut service);
    let value = with_exports(|exports| -> Result<u64, aclError> {
        let value = loop {
            let token = random_token()?;
            let candidate = (pid << TOKEN_BITS) | token;
            if token != 0 && !exports.ipc.contains_key(&candidate) {
                break candidate;
            }
        };
        exports.ipc.insert(value, IpcExport { fd, offset, size, check_pid, allocation });
        Ok(value)
    })?;
    if service.is_none() {
        match Service::start() {
            Ok(started) => *service = Some(started),
            Err(code) => {
                with_exports(|exports| exports.ipc.remove(&value));
                return Err(code);
            }
        }
    }
    Ok(ipc_key(value))
}

fn ipc_import(value: u64) -> Result<usize, aclError> {
    let pid = handle_pid(value);
    if pid == 0 || value & TOKEN_MASK == 0 {
        return Err(ACL_ERROR_RT_INVALID_HANDLE);
    }
    runtime().current_device()?;
    // One import of a key per process, checked once the exporter has answered (as for VMM imports).
    let (fd, size, offset) = if pid == own_pid() {
        with_exports(|exports| -> Result<(OwnedFd, usize, usize), aclError> {
            let export = exports.ipc.get(&value).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
            Ok((dup(&export.fd)?, export.size, export.offset))
        })?
    } else {
        fetch(pid, OP_IPC_IMPORT, value)?
    };
    if with_exports(|exports| exports.ipc_imported.contains_key(&value)) {
        return Err(ACL_ERROR_RT_PARAM_INVALID);
    }
    // Unmapped when dropped, until the import is recorded.
    let mapping = map_range(&fd, offset, size)?;
    let host = mapping.host;
    let address = crate::runtime::with_space_mut(|space| space.register(host, size, false))?;
    let recorded = with_exports(|exports| {
        if exports.ipc_imported.contains_key(&value) {
            return false;
        }
        exports.ipc_imported.insert(value, IpcImport { view: mapping.view, map_len: mapping.map_len, host });
        true
    });
    if !recorded {
        let _ = crate::runtime::with_space_mut(|space| space.unregister(host));
        return Err(ACL_ERROR_RT_PARAM_INVALID);
    }
    // The import owns the mapping now (`ipc_close` unmaps it).
    std::mem::forget(mapping);
    Ok(address)
}

fn ipc_close(value: u64) -> Result<(), aclError> {
    runtime().ready()?;
    if let Some(import) = with_exports(|exports| exports.ipc_imported.remove(&value)) {
        crate::runtime::with_space_mut(|space| space.unregister(import.host))?;
        // SAFETY: the import's mapping, no longer registered: nothing translates to it any more (unregistering
        // took the space's write lock).
        unsafe { libc::munmap(import.view as *mut libc::c_void, import.map_len) };
        return Ok(());
    }
    let mut service = lock(&SERVICE);
    let (found, now_empty) = with_exports(|exports| {
        let found = exports.ipc.remove(&value).is_some();
        (found, found && exports.is_empty())
    });
    if now_empty {
        if let Some(running) = service.take() {
            running.stop();
        }
    }
    if found {
        Ok(())
    } else {
        Err(ACL_ERROR_RT_INVALID_HANDLE)
    }
}

fn key_bytes<'a>(key: *const core::ffi::c_char) -> &'a [u8] {
    // SAFETY: a non-null key is a NUL-terminated string (C contract); the callers checked non-null.
    unsafe { core::ffi::CStr::from_ptr(key) }.to_bytes()
}

/// Shares `[dev_ptr, dev_ptr + size)`, inside one `aclrtMalloc` allocation or inside one Host window
/// (`aclrtHostRegister`) onto `aclrtMallocHost` memory, under a key written to `key` (the
/// text `cann-twin-ipc-` and 16 hex digits, NUL-terminated; `len` must hold it: the vendor's is 65). `flags` as
/// for VMM exports (`ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION` admits other processes; the default
/// whitelist call is not declared, so 0 refuses them). Freeing the allocation or `aclrtIpcMemClose` withdraws it.
/// The Host window case is a guess: CANN documents the key for `aclrtMalloc` memory; the twin lets the importer map
/// the Host pages as a device window of its own, as it does device memory.
///
/// # Safety
///
/// `key` is null or writable for `len` bytes (C contract).
#[no_mangle]
pub unsafe extern "C" fn aclrtIpcMemGetExportKey(
    dev_ptr: *mut core::ffi::c_void,
    size: usize,
    key: *mut core::ffi::c_char,
    len: usize,
    flags: u64,
) -> aclError {
    crate::acl::guard("aclrtIpcMemGetExportKey", move || {
        not_null(dev_ptr)?;
        not_null(key)?;
        if size == 0 || len <= IPC_KEY_LEN {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let text = ipc_export(dev_ptr as usize, size, flags)?;
        // SAFETY: `key` is writable for `len > IPC_KEY_LEN` bytes; the text and its NUL fit.
        unsafe {
            core::ptr::copy_nonoverlapping(text.as_ptr().cast::<core::ffi::c_char>(), key, text.len());
            key.add(text.len()).write(0);
        }
        Ok(())
    })
}

/// Maps the memory an IPC key names (of this or another process) at a new device address of the current
/// device, written to `dev_ptr`. `flags` 0 or `ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS` (accepted, not
/// modelled). Codes as for VMM imports; one import of a key per process until `aclrtIpcMemClose`.
///
/// # Safety
///
/// `dev_ptr` is null or writable; `key` is null or a NUL-terminated string (C contract).
#[no_mangle]
pub unsafe extern "C" fn aclrtIpcMemImportByKey(
    dev_ptr: *mut *mut core::ffi::c_void,
    key: *const core::ffi::c_char,
    flags: u64,
) -> aclError {
    crate::acl::guard("aclrtIpcMemImportByKey", move || {
        not_null(dev_ptr)?;
        not_null(key)?;
        if flags != ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT && flags != ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let address = ipc_import(parse_ipc_key(key_bytes(key))?)?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { dev_ptr.write(address as *mut core::ffi::c_void) };
        Ok(())
    })
}

/// Closes a key: in an importer, unmaps its device window; in the exporter, withdraws the key (mappings already
/// made stay valid while the allocation lives).
///
/// # Safety
///
/// `key` is null or a NUL-terminated string (C contract).
#[no_mangle]
pub unsafe extern "C" fn aclrtIpcMemClose(key: *const core::ffi::c_char) -> aclError {
    crate::acl::guard("aclrtIpcMemClose", move || {
        not_null(key)?;
        ipc_close(parse_ipc_key(key_bytes(key))?)
    })
}
