//! The raw socket and epoll calls of the server: descriptors from the kernel, epoll registrations, a reset on
//! close, a peek for pending input and a bounded wait for readiness.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

pub(super) fn os_fd(result: libc::c_int) -> io::Result<OwnedFd> {
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative result of epoll_create1/eventfd is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(result) })
}

pub(super) fn epoll_control(epoll: &OwnedFd, operation: libc::c_int, fd: RawFd, token: u64) -> io::Result<()> {
    epoll_watch(epoll, operation, fd, token, (libc::EPOLLIN | libc::EPOLLRDHUP) as u32)
}

pub(super) fn epoll_watch(
    epoll: &OwnedFd,
    operation: libc::c_int,
    fd: RawFd,
    token: u64,
    events: u32,
) -> io::Result<()> {
    let mut event = libc::epoll_event { events, u64: token };
    // SAFETY: `event` is a live epoll_event; the kernel copies it (and ignores it for EPOLL_CTL_DEL).
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), operation, fd, &mut event) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes closing `stream` reset the connection and drop whatever it still had to send (`SO_LINGER` with a zero
/// timeout): a connection closed mid-request at its deadline leaves no reply queued in the kernel for a peer that
/// takes it a few bytes at a time, and the peer learns at once that it was closed.
pub(super) fn reset_on_close(stream: &TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a live linger value of the right size, on a live socket.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

/// Whether bytes are waiting to be read on `fd` (checked without blocking or consuming them).
pub(super) fn has_pending_input(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv(2) with MSG_PEEK writes at most one byte into `byte`.
    unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) > 0 }
}

/// Whether `fd` is ready for `events` (or has an error or hang-up) within `wait`.
pub(super) fn ready_within(fd: RawFd, events: libc::c_short, wait: Duration) -> io::Result<bool> {
    let mut poll = libc::pollfd { fd, events, revents: 0 };
    let timeout = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    loop {
        // SAFETY: one live pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, timeout) };
        if ready >= 0 {
            return Ok(ready > 0);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}
