//! VMM export and import across processes: `aclrtMemExportToShareableHandle[V2]` and
//! `aclrtMemImportFromShareableHandle[V2]`. The importer's physical handle is backed by the *same memfd pages* as
//! the exporter's `aclrtMallocPhysical` allocation, so what one process's device side writes the other's reads.
//! IPC keys (`aclrtIpcMemGetExportKey`, `aclrtIpcMemImportByKey`, `aclrtIpcMemClose`) share `aclrtMalloc` ranges
//! on the same service (module `ipc` and docs/twin-runtime.md), and so do the twin-internal range exports of the
//! twin's HiXL server (module `range`: `export_range`, `import_range`, request op 3).
//!
//! Files: this one holds the handle layout, the export table and the VMM export, import and their C entry points;
//! module `service` the export service's thread, `importer` the importing side of its wire, `ipc` the IPC keys,
//! `range` the range exports.
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
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use ascendcl_sys::sys::*;

use crate::entry::not_null;
use crate::runtime::runtime;
pub use importer::{aclrtMemImportFromShareableHandle, aclrtMemImportFromShareableHandleV2};

mod importer;
mod ipc;
mod range;
mod service;

pub(crate) use ipc::heap_released;
pub use ipc::{aclrtIpcMemClose, aclrtIpcMemGetExportKey, aclrtIpcMemImportByKey};
pub(crate) use range::{backing_of, export_range, import_range, withdraw_range, RangeMapping};

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
// The C entry points (re-exported by `acl`, so the crate's `exports!` list resolves them).

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
    crate::entry::guard("aclrtMemExportToShareableHandle", move || {
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
    crate::entry::guard("aclrtMemExportToShareableHandleV2", move || {
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
