//! The export service: the thread behind the abstract socket `cann-twin-vmm-<pid>` that admits same-uid peers,
//! reads their requests within the deadline and answers each with its memfd by `SCM_RIGHTS` (limits in the module
//! docs of `vmm_share`).

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;

use super::{
    close_listener_in_child, is_withheld, own_pid, socket_name, with_exports, Service, Status, ACCEPT_BURST,
    LISTENER_FD, MAX_CONNECTIONS, MAX_PER_PID, OP_IMPORT, OP_IPC_IMPORT, OP_RANGE_IMPORT, REPLY_LEN, REPLY_MAGIC,
    REQUEST_DEADLINE, REQUEST_LEN, REQUEST_MAGIC,
};

impl Service {
    pub(super) fn start() -> Result<Service, aclError> {
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

    pub(super) fn stop(self) {
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
pub(super) fn peer_credentials(fd: libc::c_int) -> Option<(i32, u32)> {
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
