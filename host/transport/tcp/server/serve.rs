//! The serving threads (`tcp-serve`): each takes connections with a whole request header in hand and serves their
//! requests while they keep coming and keep moving: the bounds check, WRITE payloads into memory, replies out
//! without blocking, and the connection parked (with its request state) once it stops moving.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{Conn, PendingWrite, Waiting};
use super::replies::{Part, OK_FRAME, REJECTED_FRAME};
use super::socket::{ready_within, reset_on_close};
use super::{lock, version_index, Shared};
use crate::log_limit::LogLimiter;
use crate::transport::tcp::io::{is_unmapped_destination, read_some, Inbound, Patience, DIRECT_READ_MIN, MAX_IOVECS};
use crate::transport::tcp::wire::{RequestHeader, WireOpcode, WireVersion, HEADER_LEN};

/// Warnings a flood could repeat without end.
static UNMAPPED_WRITE: LogLimiter = LogLimiter::per_second(5);
static REQUEST_REJECTED: LogLimiter = LogLimiter::per_second(5);
/// Receive buffer of a connection being served: small frames are read many at a time.
const INBOUND_CAPACITY: usize = 256 * 1024;
/// A serving thread with nothing to do for this long ends.
const WORKER_KEEPALIVE: Duration = Duration::from_secs(5);

impl Shared {
    /// A serving thread: takes connections with a request in hand and serves them until they go quiet.
    pub(super) fn serve_loop(self: Arc<Self>) {
        loop {
            let conn = {
                let mut pool = lock(&self.pool);
                loop {
                    if self.stopping.load(Ordering::SeqCst) {
                        pool.workers -= 1;
                        return;
                    }
                    if let Some(conn) = pool.queue.pop_front() {
                        self.queued.store(pool.queue.len(), Ordering::Relaxed);
                        break conn;
                    }
                    pool.idle += 1;
                    let (guard, waited) =
                        self.work.wait_timeout(pool, WORKER_KEEPALIVE).unwrap_or_else(|p| p.into_inner());
                    pool = guard;
                    pool.idle -= 1;
                    if waited.timed_out() && pool.queue.is_empty() {
                        pool.workers -= 1;
                        return;
                    }
                }
            };
            let mut conn = conn;
            match serve_connection(&mut conn, &self) {
                Ok(Some(waiting)) => self.park(conn, waiting),
                Ok(None) => {
                    tracing::trace!(peer = %conn.peer, "tcp connection closed by peer");
                    self.close(conn);
                }
                Err(error) => {
                    tracing::debug!(peer = %conn.peer, %error, "tcp connection ended");
                    if error.kind() == io::ErrorKind::TimedOut {
                        reset_on_close(&conn.stream);
                    }
                    self.close(conn);
                }
            }
        }
    }
}

/// Waits for a connection in the middle of a request to move: `Ok(true)` once `fd` is ready for `events`,
/// `Ok(false)` when it is not within the slice (`linger`, or none at all while other connections wait for a thread:
/// park it), an error once the request's `deadline` has passed or the server stops.
fn await_progress(
    fd: RawFd,
    events: libc::c_short,
    deadline: Instant,
    shared: &Shared,
    what: &str,
) -> io::Result<bool> {
    if shared.stopping.load(Ordering::Relaxed) {
        return Err(io::Error::new(io::ErrorKind::Interrupted, "stopping"));
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{what}: the request's deadline passed")));
    }
    let slice = if shared.queued.load(Ordering::Relaxed) > 0 { Duration::ZERO } else { shared.limits.linger };
    ready_within(fd, events, slice.min(left))
}

/// Writes the connection's queued replies without blocking: `Ok(true)` once all are out, `Ok(false)` if the peer
/// stopped taking them for a slice (park it waiting for room).
fn send_replies(conn: &mut Conn, shared: &Shared, iovecs: &mut Vec<libc::iovec>) -> io::Result<bool> {
    let fd = conn.stream.as_raw_fd();
    while !conn.replies.is_empty() {
        conn.replies.iovecs(iovecs);
        // SAFETY: a zeroed msghdr is valid (no name, no control data); the iovecs stay alive and unchanged during
        // the call.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = iovecs.as_mut_ptr();
        message.msg_iovlen = iovecs.len() as _;
        // SAFETY: the iovecs point at the static status frames or at READ ranges that were inside a registered
        // buffer when their request was checked (and again when this connection resumed from a park); the
        // `register_memory` contract keeps them valid until unregistered, and a range unmapped since is reported by
        // the kernel as EFAULT, not a crash. MSG_NOSIGNAL: a peer's reset is EPIPE, not SIGPIPE; MSG_DONTWAIT: a
        // full socket is the poll's business below.
        let wrote = unsafe { libc::sendmsg(fd, &message, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if wrote > 0 {
            conn.replies.advance(wrote as usize);
            continue;
        }
        if wrote == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes"));
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => {
                let deadline = conn.replies.deadline.unwrap_or_else(|| Instant::now() + shared.limits.io_timeout);
                if !await_progress(fd, libc::POLLOUT, deadline, shared, "write replies")? {
                    return Ok(false);
                }
            }
            _ => return Err(error),
        }
    }
    Ok(true)
}

/// Moves the rest of a WRITE payload into memory: `Ok(true)` once whole, `Ok(false)` if the peer sent nothing for a
/// slice (park it waiting for input; `write.done` says how far it got).
fn receive_payload(
    inbound: &mut Inbound,
    write: &mut PendingWrite,
    fd: RawFd,
    shared: &Shared,
    patience: &mut Patience<'_>,
) -> io::Result<bool> {
    while write.done < write.length {
        let left = write.length - write.done;
        let dst = (write.addr as *mut u8).wrapping_add(write.done);
        let buffered = inbound.buffered();
        if buffered > 0 {
            let take = buffered.min(left);
            if write.unmapped.is_some() {
                inbound.discard(take);
                write.done += take;
                continue;
            }
            // SAFETY: `[dst, dst + take)` lies inside the WRITE's range, inside one registered buffer (checked when
            // its header arrived, and again if the connection resumed from a park); a page of it unmapped since is
            // an error of the checked copy. `take` bytes are buffered, so this copies and never reads the socket.
            match unsafe { inbound.payload(dst, take, patience) } {
                Ok(()) => {}
                // The `take` bytes were consumed and dropped: drop the rest of the payload too.
                Err(error) if is_unmapped_destination(&error) => write.unmapped = Some(error.to_string()),
                Err(error) => return Err(error),
            }
            write.done += take;
            continue;
        }
        if !await_progress(fd, libc::POLLIN | libc::POLLRDHUP, write.deadline, shared, "read write payload")? {
            return Ok(false);
        }
        let got = if left >= DIRECT_READ_MIN && write.unmapped.is_none() {
            // Large: straight from the socket into place. The socket is ready, so this returns at once.
            // SAFETY: as above, `[dst, dst + left)` is the rest of the checked range; read(2) reports a page that
            // is not mapped as EFAULT (then nothing was consumed, and the rest is read and dropped).
            match unsafe { read_some(fd, dst, left, patience) } {
                Ok(got) => {
                    write.done += got;
                    got
                }
                Err(error) if error.raw_os_error() == Some(libc::EFAULT) => {
                    write.unmapped = Some(format!(
                        "destination [{:#x}, +{}) is not mapped in this process (at byte {}: {error}); payload dropped",
                        write.addr, write.length, write.done
                    ));
                    continue;
                }
                Err(error) => return Err(error),
            }
        } else {
            inbound.fill(patience)?
        };
        if got == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("peer closed the connection {} of {} bytes into a WRITE payload", write.done, write.length),
            ));
        }
    }
    Ok(true)
}

/// Checks that the memory a connection parked mid-request will touch is still registered: it may have been
/// unregistered while the connection waited.
fn still_registered(conn: &Conn, shared: &Shared) -> io::Result<()> {
    let memory = shared.memory.read().unwrap_or_else(|p| p.into_inner());
    let gone = |what: &str, error: crate::transfer::RangeError| {
        io::Error::other(format!("{what} is no longer registered memory: {error}"))
    };
    if let Some(write) = &conn.write {
        memory.find_containing(write.addr, write.length as u64).map_err(|e| gone("a parked WRITE's range", e))?;
    }
    for part in &conn.replies.parts {
        if let Part::Memory { addr, len } = part {
            memory.find_containing(*addr, *len as u64).map_err(|e| gone("a parked READ reply's range", e))?;
        }
    }
    Ok(())
}

/// Serves requests on `conn` while they keep coming and keep moving. `Ok(Some(waiting))`: park it, waiting for
/// that (any bytes read ahead are kept in `conn`: a partial header in `conn.header`, more in `conn.ahead`);
/// `Ok(None)`: the peer closed cleanly; `Err`: the connection ends.
fn serve_connection(conn: &mut Conn, shared: &Shared) -> io::Result<Option<Waiting>> {
    conn.stream.set_nonblocking(false)?;
    conn.stream.set_read_timeout(Some(shared.limits.tick))?;
    conn.stream.set_write_timeout(Some(shared.limits.tick))?;
    let fd = conn.stream.as_raw_fd();
    let mut inbound = Inbound::new(fd, INBOUND_CAPACITY);
    if conn.have > 0 {
        inbound.preload(&conn.header[..conn.have]);
        conn.have = 0;
    } else if !conn.ahead.is_empty() {
        inbound.preload(&std::mem::take(&mut conn.ahead));
    }
    if conn.write.is_some() || !conn.replies.is_empty() {
        still_registered(conn, shared)?;
    }
    let mut iovecs: Vec<libc::iovec> = Vec::with_capacity(MAX_IOVECS);
    // Reads happen only once the socket is ready, so this bounds nothing but a peer that vanishes mid-read.
    let mut patience = Patience::new("read request", shared.limits.io_timeout, Some(&shared.stopping));
    let park = |conn: &mut Conn, inbound: &mut Inbound, waiting: Waiting| {
        conn.ahead = inbound.take_buffered();
        Ok(Some(waiting))
    };
    loop {
        if let Some(mut write) = conn.write.take() {
            if !conn.replies.is_empty()
                && (inbound.buffered() < write.length - write.done || conn.replies.holds_memory())
                && !send_replies(conn, shared, &mut iovecs)?
            {
                // The peer must see the replies queued so far before this WRITE may wait on the socket; and a READ
                // reply still queued must leave before this WRITE changes memory it may cover (requests on one
                // connection take effect in order).
                conn.write = Some(write);
                return park(conn, &mut inbound, Waiting::Output);
            }
            patience.restart("read write payload", shared.limits.io_timeout);
            if !receive_payload(&mut inbound, &mut write, fd, shared, &mut patience)? {
                conn.write = Some(write);
                return park(conn, &mut inbound, Waiting::Input);
            }
            if let Some(reason) = write.unmapped.take() {
                // Answered like a range outside the registered buffers: REJECTED (v2), then the connection closes.
                shared.rejected.fetch_add(1, Ordering::Relaxed);
                if let Some(suppressed) = UNMAPPED_WRITE.admit() {
                    tracing::warn!(peer = %conn.peer, %reason, suppressed, "tcp data server: WRITE into registered \
                        memory that is not mapped; request rejected ({suppressed} more like this in the last second)");
                }
                if write.version == WireVersion::V2 {
                    conn.replies.push(Part::Status(&REJECTED_FRAME), write.deadline);
                }
                conn.closing = Some(format!("rejected request: {reason}"));
                continue;
            }
            if write.version == WireVersion::V2 {
                // The OK frame leaves only after the last byte is in memory (the copy above has returned).
                conn.replies.push(Part::Status(&OK_FRAME), write.deadline);
            }
            shared.served[version_index(write.version)].fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if !conn.replies.is_empty()
            && (inbound.buffered() < HEADER_LEN || conn.replies.is_full() || conn.closing.is_some())
            && !send_replies(conn, shared, &mut iovecs)?
        {
            // About to wait for input (or holding a lot, or closing): the peer must see every reply queued first.
            return park(conn, &mut inbound, Waiting::Output);
        }
        if let Some(reason) = conn.closing.take() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, reason));
        }
        while inbound.buffered() < HEADER_LEN {
            // Between requests: keep the thread only if the next one is coming now and no other connection waits.
            let waited = shared.queued.load(Ordering::Relaxed) == 0
                && ready_within(fd, libc::POLLIN | libc::POLLRDHUP, shared.limits.linger)?;
            if !waited || shared.stopping.load(Ordering::Relaxed) {
                let partial = inbound.take_buffered();
                conn.header[..partial.len()].copy_from_slice(&partial);
                conn.have = partial.len();
                return Ok(Some(Waiting::Request));
            }
            patience.restart("read request header", shared.limits.io_timeout);
            if inbound.fill(&mut patience)? == 0 {
                if inbound.buffered() == 0 {
                    return Ok(None);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("peer closed the connection {} bytes into a request header", inbound.buffered()),
                ));
            }
        }
        let Some(bytes) = inbound.frame::<HEADER_LEN>(&mut patience)? else {
            return Ok(None);
        };
        let header = RequestHeader::decode(&bytes);
        let deadline = shared.limits.request_deadline(Instant::now(), header.size);
        let checked = {
            let memory = shared.memory.read().unwrap_or_else(|p| p.into_inner());
            memory.find_containing(header.addr, header.size).map(|_| ())
        };
        let length = match (checked, usize::try_from(header.size)) {
            (Ok(()), Ok(length)) => length,
            (checked, _) => {
                let rejected = shared.rejected.fetch_add(1, Ordering::Relaxed) + 1;
                let reason = checked.err().map(|e| e.to_string()).unwrap_or_else(|| "size exceeds usize".into());
                if let Some(suppressed) = REQUEST_REJECTED.admit() {
                    tracing::warn!(peer = %conn.peer, addr = header.addr, size = header.size, opcode = ?header.opcode,
                        version = ?header.version, %reason, suppressed, rejected,
                        "tcp data server: request rejected ({suppressed} more like this in the last second)");
                }
                if header.version == WireVersion::V2 {
                    conn.replies.push(Part::Status(&REJECTED_FRAME), deadline);
                }
                conn.closing = Some(format!("rejected request: {reason}"));
                continue;
            }
        };
        match header.opcode {
            WireOpcode::Write => {
                conn.write = Some(PendingWrite {
                    addr: header.addr,
                    length,
                    done: 0,
                    version: header.version,
                    deadline,
                    unmapped: None,
                });
            }
            WireOpcode::Read => {
                if header.version == WireVersion::V2 {
                    conn.replies.push(Part::Status(&OK_FRAME), deadline);
                }
                if length > 0 {
                    conn.replies.push(Part::Memory { addr: header.addr, len: length }, deadline);
                }
                shared.served[version_index(header.version)].fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
