//! The importing side of the export service: connecting to the exporter's socket within one deadline, checking
//! that the listener is the pid the handle names, retrying after `Busy`, and mapping every failure to its ACL code
//! (`ACL_ERROR_RT_IPC_ERROR` only when the exporting process is gone); and the import of a shareable handle as a
//! physical handle, with its C entry points (`aclrtMemImportFromShareableHandle`, `...V2`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;

use super::service::peer_credentials;
use super::{
    dup, from_fabric, handle_pid, is_withheld, own_pid, socket_name, with_exports, Status, IMPORT_TIMEOUT, OP_IMPORT,
    REPLY_LEN, REPLY_MAGIC, REQUEST_LEN, REQUEST_MAGIC, RETRY_PAUSE, TOKEN_MASK,
};
use crate::entry::not_null;
use crate::memory::{Physical, GRANULARITY};
use crate::runtime::runtime;

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
pub(super) fn fetch(pid: u32, op: u32, shareable: u64) -> Result<(OwnedFd, usize, usize), aclError> {
    // Whatever failed, an exporter that is gone is reported as such: the peer-loss code, and only for that.
    fetch_from(pid, op, shareable).map_err(|code| if process_alive(pid) { code } else { ACL_ERROR_RT_IPC_ERROR })
}

pub(super) fn fetch_from(pid: u32, op: u32, shareable: u64) -> Result<(OwnedFd, usize, usize), aclError> {
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
    crate::entry::guard("aclrtMemImportFromShareableHandle", move || {
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
    crate::entry::guard("aclrtMemImportFromShareableHandleV2", move || {
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
