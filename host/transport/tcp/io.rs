//! Raw socket I/O shared by the data server and the client lanes.
//!
//! Bytes move between sockets and registered memory through `read(2)` and vectored `sendmsg(2)` on raw addresses, and
//! from the receive buffer into registered memory through the checked copy ([`crate::transfer::host_copy`]), never
//! through Rust references to that memory or a CPU copy: the memory belongs to the user (or to a peer's request),
//! other threads may touch it, and a range unmapped behind our back makes the kernel answer EFAULT instead of
//! crashing the process. Payloads already whole in the receive buffer may be deferred and copied many in one system
//! call ([`Inbound::defer_payload`], [`crate::transfer::host_copy::copy_many`]); the buffer makes those copies before
//! its bytes can be overwritten or another payload copied, and hands out each one's outcome in order.
//! Sockets carry a short receive/send timeout (the "tick"); each blocking call is retried tick by tick while a
//! [`Patience`] allows it, so every wait is bounded and a stop request is noticed within one tick.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::transfer::host_copy::{self, CopyEntry};

/// How long a blocked socket call may keep waiting for progress.
#[derive(Debug)]
pub(crate) struct Patience<'a> {
    limit: Duration,
    last_progress: Instant,
    /// An overall deadline that progress does not move (the deadline of the transfers being carried).
    until: Option<Instant>,
    stop: Option<&'a AtomicBool>,
    what: &'static str,
}

impl<'a> Patience<'a> {
    /// Gives up after `limit` without progress, or as soon as `stop` is set.
    pub(crate) fn new(what: &'static str, limit: Duration, stop: Option<&'a AtomicBool>) -> Self {
        Patience { limit, last_progress: Instant::now(), until: None, stop, what }
    }

    /// Also gives up at `until`, however much progress was made: a peer moving a byte at a time cannot hold the
    /// wait past it.
    pub(crate) fn until(mut self, until: Instant) -> Self {
        self.until = Some(until);
        self
    }

    /// Changes the limit, counting from now.
    pub(crate) fn restart(&mut self, what: &'static str, limit: Duration) {
        self.what = what;
        self.limit = limit;
        self.last_progress = Instant::now();
    }

    fn progressed(&mut self) {
        self.last_progress = Instant::now();
    }

    /// Called before each blocking call: the overall deadline ends the wait even while every call makes progress
    /// (a peer moving a byte per call never lets a tick pass without progress).
    fn before_call(&self) -> io::Result<()> {
        match self.until {
            Some(until) if Instant::now() >= until => {
                Err(io::Error::new(io::ErrorKind::TimedOut, format!("{}: the transfers' deadline passed", self.what)))
            }
            _ => Ok(()),
        }
    }

    /// Called after a tick without progress: Ok to keep waiting, or the error that ends the wait.
    fn tick(&self) -> io::Result<()> {
        if self.stop.is_some_and(|stop| stop.load(Ordering::Relaxed)) {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "stopping"));
        }
        if let Some(until) = self.until {
            if Instant::now() >= until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{}: the transfers' deadline passed", self.what),
                ));
            }
        }
        if self.last_progress.elapsed() >= self.limit {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{}: no progress for {:?}", self.what, self.limit),
            ));
        }
        Ok(())
    }
}

fn is_tick(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// One `read(2)` into raw memory, retried on EINTR and on ticks while `patience` allows. Returns 0 at EOF.
///
/// # Safety
/// `[dst, dst + len)` must be writable memory of this process for the duration of the call (or unmapped, which
/// the kernel reports as EFAULT).
pub(crate) unsafe fn read_some(fd: RawFd, dst: *mut u8, len: usize, patience: &mut Patience<'_>) -> io::Result<usize> {
    loop {
        patience.before_call()?;
        // SAFETY: the caller guarantees the destination range; read(2) writes at most `len` bytes there.
        let got = unsafe { libc::read(fd, dst.cast(), len) };
        if got >= 0 {
            if got > 0 {
                patience.progressed();
            }
            return Ok(got as usize);
        }
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if is_tick(&error) {
            patience.tick()?;
            continue;
        }
        return Err(error);
    }
}

/// The most iovecs handed to one `writev(2)` (Linux's IOV_MAX is 1024).
pub(crate) const MAX_IOVECS: usize = 1024;

/// What one `sendmsg(2)` of [`write_all_vectored_observed`] carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SendCall {
    /// The call's number within this write, from 1; failed and retried calls (EINTR, ticks) carry nothing and are
    /// not numbered.
    pub(crate) call: u32,
    /// The iovecs this call carried at least one byte of, by index into the caller's vector.
    pub(crate) touched: std::ops::Range<usize>,
    /// Every iovec before this index has been carried whole (by this call or earlier ones).
    pub(crate) complete_before: usize,
}

/// Writes every byte the iovecs describe (vectored `sendmsg`), retrying partial writes, EINTR and ticks while
/// `patience` allows, and tells `observe` after each `sendmsg(2)` that carried bytes which iovecs it carried. The
/// vector is consumed (left empty on success, in an unspecified state on error).
///
/// # Safety
/// Every iovec must describe memory readable for the duration of the call (or unmapped: EFAULT).
pub(crate) unsafe fn write_all_vectored_observed(
    fd: RawFd,
    iovecs: &mut Vec<libc::iovec>,
    patience: &mut Patience<'_>,
    observe: &mut dyn FnMut(SendCall),
) -> io::Result<()> {
    let mut calls = 0u32;
    let mut first = 0;
    while first < iovecs.len() {
        if iovecs[first].iov_len == 0 {
            first += 1;
            continue;
        }
        patience.before_call()?;
        let count = (iovecs.len() - first).min(MAX_IOVECS);
        // sendmsg(2) is writev(2) with flags: MSG_NOSIGNAL turns a peer's reset into EPIPE instead of SIGPIPE,
        // which would kill a host process that has not ignored the signal (Python, C++).
        // SAFETY: a zeroed msghdr is valid (no name, no control data); the iovec pointer and count describe
        // `iovecs[first..first + count]`, which stays alive and unchanged during the call.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        // SAFETY: `first < iovecs.len()`, so the pointer is inside the vector.
        message.msg_iov = unsafe { iovecs.as_mut_ptr().add(first) };
        message.msg_iovlen = count as _;
        // SAFETY: the caller guarantees every iovec's memory; sendmsg(2) only reads it.
        let wrote = unsafe { libc::sendmsg(fd, &message, libc::MSG_NOSIGNAL) };
        if wrote < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if is_tick(&error) {
                patience.tick()?;
                continue;
            }
            return Err(error);
        }
        if wrote == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes"));
        }
        patience.progressed();
        calls += 1;
        let touched_from = first;
        let mut left = wrote as usize;
        let mut touched_to = first;
        while left > 0 {
            touched_to = first + 1;
            let iovec = &mut iovecs[first];
            if left >= iovec.iov_len {
                left -= iovec.iov_len;
                iovec.iov_len = 0;
                first += 1;
            } else {
                // SAFETY: advancing within the iovec's own range (`left < iov_len`).
                iovec.iov_base = unsafe { iovec.iov_base.cast::<u8>().add(left) }.cast();
                iovec.iov_len -= left;
                left = 0;
            }
        }
        observe(SendCall { call: calls, touched: touched_from..touched_to, complete_before: first });
    }
    iovecs.clear();
    Ok(())
}

/// An iovec over `len` bytes at `addr` (memory the caller vouches for when the iovec is written).
pub(crate) fn iovec(addr: *const u8, len: usize) -> libc::iovec {
    libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len }
}

/// A receive buffer in front of a socket: small frames are read many at a time, large payloads bypass it.
#[derive(Debug)]
pub(crate) struct Inbound {
    fd: RawFd,
    buffer: Box<[u8]>,
    start: usize,
    end: usize,
    /// Copies of payloads taken from the buffer by [`Inbound::defer_payload`] and not made yet: (destination, source
    /// inside `buffer`, length). Made together by [`Inbound::flush_deferred`] before anything can overwrite the
    /// buffer's bytes or copy to a destination out of order.
    deferred: Vec<CopyEntry>,
    /// The outcomes of deferred copies already made, in the order they were deferred, until
    /// [`Inbound::take_settled`] hands them out.
    settled: Vec<io::Result<()>>,
}

/// Payloads at least this large (still to be read) go straight from the socket into their destination.
pub(crate) const DIRECT_READ_MIN: usize = 32 * 1024;

impl Inbound {
    pub(crate) fn new(fd: RawFd, capacity: usize) -> Self {
        Inbound {
            fd,
            buffer: vec![0u8; capacity].into_boxed_slice(),
            start: 0,
            end: 0,
            deferred: Vec::new(),
            settled: Vec::new(),
        }
    }

    /// Takes the next `len` payload bytes for `dst` out of the buffer and defers their copy, if they are all
    /// buffered (`false`, nothing consumed, otherwise). The copy is made by the next [`Inbound::flush_deferred`]
    /// (called by every method that reads into the buffer, moves it or copies a payload), together with the other
    /// deferred ones, in one `process_vm_readv(2)` ([`host_copy::copy_many`]); its outcome comes out of
    /// [`Inbound::take_settled`], in order: `Ok`, or an [`UnmappedDestination`] error for that payload alone (its
    /// bytes were consumed, so the stream stays in step).
    ///
    /// # Safety
    /// As for [`Inbound::payload`], until the copy is made.
    pub(crate) unsafe fn defer_payload(&mut self, dst: *mut u8, len: usize) -> bool {
        if len == 0 || len > self.buffered() {
            return false;
        }
        // SAFETY: `start` is inside our buffer, which stays in place (a boxed slice) and whose bytes
        // `[start, start + len)` are not overwritten before the deferred copy is flushed (see `deferred`).
        let source = unsafe { self.buffer.as_ptr().add(self.start) } as u64;
        self.deferred.push((dst as u64, source, len));
        self.start += len;
        if self.deferred.len() >= host_copy::MAX_COPY_ENTRIES {
            self.flush_deferred();
        }
        true
    }

    /// Makes every deferred copy (one call per [`host_copy::MAX_COPY_ENTRIES`]) and keeps their outcomes for
    /// [`Inbound::take_settled`].
    pub(crate) fn flush_deferred(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        let outcomes = host_copy::copy_many(&self.deferred);
        for (&(addr, _, len), outcome) in self.deferred.iter().zip(outcomes) {
            self.settled.push(outcome.map_err(|error| {
                io::Error::other(UnmappedDestination { addr, len, stored: error.done, cause: error.cause })
            }));
        }
        self.deferred.clear();
    }

    /// Makes the deferred copies and hands out the outcomes of every deferred copy, in the order they were deferred.
    pub(crate) fn take_settled(&mut self) -> std::vec::Drain<'_, io::Result<()>> {
        self.flush_deferred();
        self.settled.drain(..)
    }

    /// Bytes already received and not consumed.
    pub(crate) fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Puts `bytes` (already read from the socket elsewhere) in front of what comes next. Only into an empty buffer.
    pub(crate) fn preload(&mut self, bytes: &[u8]) {
        debug_assert_eq!(self.buffered(), 0);
        self.flush_deferred();
        self.start = 0;
        self.end = bytes.len().min(self.buffer.len());
        self.buffer[..self.end].copy_from_slice(&bytes[..self.end]);
    }

    /// Consumes and drops `n` buffered bytes (at most what is buffered).
    pub(crate) fn discard(&mut self, n: usize) {
        self.start += n.min(self.buffered());
    }

    /// The bytes received and not consumed, taken out of the buffer.
    pub(crate) fn take_buffered(&mut self) -> Vec<u8> {
        self.flush_deferred();
        let bytes = self.buffer[self.start..self.end].to_vec();
        self.start = 0;
        self.end = 0;
        bytes
    }

    /// Reads more from the socket (at least one byte unless EOF). Returns the bytes added; 0 at EOF.
    pub(crate) fn fill(&mut self, patience: &mut Patience<'_>) -> io::Result<usize> {
        self.flush_deferred();
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buffer.len() {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = self.buffer.len() - self.end;
        // SAFETY: `[end, len)` of our own buffer is writable.
        let got = unsafe { read_some(self.fd, self.buffer.as_mut_ptr().add(self.end), room, patience)? };
        self.end += got;
        Ok(got)
    }

    /// The next `N` bytes as an array. `Ok(None)` if the peer closed cleanly before the first of them.
    pub(crate) fn frame<const N: usize>(&mut self, patience: &mut Patience<'_>) -> io::Result<Option<[u8; N]>> {
        while self.buffered() < N {
            let had = self.buffered();
            if self.fill(patience)? == 0 {
                if had == 0 {
                    return Ok(None);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("peer closed the connection {had} bytes into a {N}-byte frame"),
                ));
            }
        }
        let mut frame = [0u8; N];
        frame.copy_from_slice(&self.buffer[self.start..self.start + N]);
        self.start += N;
        Ok(Some(frame))
    }

    /// Moves the next `len` payload bytes to raw memory at `dst`: what is buffered is copied by the checked copy
    /// ([`crate::transfer::host_copy`]), a large remainder is read directly into place by `read(2)`; both report a
    /// page of the destination that is not mapped as an error instead of crashing.
    ///
    /// When the destination is not mapped, the rest of the payload is still read (and dropped), so the stream stays
    /// in step with the peer, and the error is an [`UnmappedDestination`] (see [`is_unmapped_destination`]); any
    /// other error leaves the stream out of step.
    ///
    /// # Safety
    /// `[dst, dst + len)` must be memory of this process that nothing else relies on while the call runs (or
    /// unmapped, which is reported as above).
    pub(crate) unsafe fn payload(&mut self, dst: *mut u8, len: usize, patience: &mut Patience<'_>) -> io::Result<()> {
        // Earlier payloads land first: destinations may overlap, and the last write must stay the last.
        self.flush_deferred();
        let mut done = 0;
        while done < len {
            let take = self.buffered().min(len - done);
            if take > 0 {
                // SAFETY: source is inside our buffer's filled part; the destination is checked by the kernel.
                let source = unsafe { self.buffer.as_ptr().add(self.start) } as u64;
                let copied = crate::transfer::host_copy::copy(dst as u64 + done as u64, source, take);
                self.start += take;
                if let Err(error) = copied {
                    return Err(self.skip_rest(dst, len, done + error.done, done + take, error.cause, patience));
                }
                done += take;
                continue;
            }
            if len - done >= DIRECT_READ_MIN {
                // SAFETY: inside the caller's range; read(2) reports EFAULT for a page that is not mapped.
                let got = unsafe { read_some(self.fd, dst.add(done), len - done, patience) };
                match got {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("peer closed the connection {done} of {len} bytes into a transfer"),
                        ))
                    }
                    Ok(got) => done += got,
                    Err(error) if error.raw_os_error() == Some(libc::EFAULT) => {
                        return Err(self.skip_rest(dst, len, done, done, error, patience));
                    }
                    Err(error) => return Err(error),
                }
                continue;
            }
            if self.fill(patience)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("peer closed the connection {done} of {len} bytes into a transfer"),
                ));
            }
        }
        Ok(())
    }

    /// After a fault at byte `stored` of a `len`-byte payload for `dst`, with `consumed` bytes of it taken from the
    /// stream: reads and drops the rest. Returns the [`UnmappedDestination`] error, or the stream's own error if the
    /// rest could not be read.
    fn skip_rest(
        &mut self,
        dst: *mut u8,
        len: usize,
        stored: usize,
        consumed: usize,
        cause: io::Error,
        patience: &mut Patience<'_>,
    ) -> io::Error {
        let mut left = len - consumed;
        while left > 0 {
            let take = self.buffered().min(left);
            if take > 0 {
                self.start += take;
                left -= take;
                continue;
            }
            match self.fill(patience) {
                Ok(0) => {
                    return io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("peer closed the connection {} of {len} bytes into a transfer", len - left),
                    )
                }
                Ok(_) => {}
                Err(error) => return error,
            }
        }
        io::Error::other(UnmappedDestination { addr: dst as u64, len, stored, cause })
    }
}

/// A payload's destination is not mapped in this process: its bytes were read from the socket and dropped.
#[derive(Debug, thiserror::Error)]
#[error("destination [{addr:#x}, +{len}) is not mapped in this process (at byte {stored}: {cause}); payload dropped")]
pub(crate) struct UnmappedDestination {
    addr: u64,
    len: usize,
    /// Bytes stored before the fault.
    stored: usize,
    cause: io::Error,
}

/// Whether `error` is an [`UnmappedDestination`] (the stream is still in step with the peer).
pub(crate) fn is_unmapped_destination(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|inner| inner.is::<UnmappedDestination>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// Three payloads wholly buffered, the middle one for a page that is not mapped: their copies are deferred, and
    /// the next fill (which reuses the buffer) makes them first; only the middle one fails, as an
    /// `UnmappedDestination`, and the bytes after them are still read in step.
    #[test]
    fn deferred_copies_land_before_the_buffer_is_reused_and_fail_alone() {
        const PAGE: usize = 4096;
        // SAFETY: a fresh anonymous mapping of one page that allows no access: a copy into it faults. It stays
        // reserved for the test's life (an unmapped page could be mapped again by another test thread meanwhile).
        let hole = unsafe {
            let base =
                libc::mmap(std::ptr::null_mut(), PAGE, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            assert_ne!(base, libc::MAP_FAILED, "mmap");
            base.cast::<u8>()
        };
        let (mut writer, reader) = UnixStream::pair().expect("socket pair");
        let sent: Vec<u8> = (0..300u32).map(|i| (i % 251) as u8).collect();
        std::io::Write::write_all(&mut writer, &sent).expect("send");
        // A buffer exactly as large as the three payloads: the next fill must start over at its beginning.
        let mut inbound = Inbound::new(reader.as_raw_fd(), 300);
        let mut patience = Patience::new("test receive", Duration::from_secs(5), None);
        while inbound.buffered() < 300 {
            inbound.fill(&mut patience).expect("fill");
        }
        let mut first = vec![0u8; 100];
        let mut third = vec![0u8; 100];
        // SAFETY: our own vectors (alive until the copies are made below), and a page that allows no access.
        unsafe {
            assert!(inbound.defer_payload(first.as_mut_ptr(), 100));
            assert!(inbound.defer_payload(hole, 100));
            assert!(inbound.defer_payload(third.as_mut_ptr(), 100));
            assert!(!inbound.defer_payload(third.as_mut_ptr(), 1), "nothing left buffered");
        }
        std::io::Write::write_all(&mut writer, &[9u8; 8]).expect("send more");
        let frame = inbound.frame::<8>(&mut patience).expect("next frame").expect("not closed");
        assert_eq!(frame, [9u8; 8]);
        assert_eq!(first, sent[..100], "the first payload landed before the buffer was refilled");
        assert_eq!(third, sent[200..], "the third payload landed before the buffer was refilled");
        let outcomes: Vec<io::Result<()>> = inbound.take_settled().collect();
        assert_eq!(outcomes.len(), 3);
        assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
        let error = outcomes[1].as_ref().expect_err("the unmapped destination fails");
        assert!(is_unmapped_destination(error), "{error}");
        assert!(inbound.take_settled().next().is_none(), "each outcome is handed out once");
    }

    /// A slow reader behind a small socket buffer makes the send loop take many calls: each reported call carries
    /// bytes of a contiguous run of iovecs, starting where the previous one stopped, and the last reports every
    /// iovec carried whole.
    #[test]
    fn every_call_that_carried_bytes_is_reported_with_the_iovecs_it_carried() {
        let (writer, mut reader) = UnixStream::pair().expect("socket pair");
        let small: libc::c_int = 4096;
        // SAFETY: a live int option value of the right size, on a live socket.
        let set = unsafe {
            libc::setsockopt(
                writer.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&small as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "SO_SNDBUF");
        // Non-blocking: a full buffer ends a call with what fit (or EAGAIN, retried like a tick).
        writer.set_nonblocking(true).expect("non-blocking");
        let parts: Vec<Vec<u8>> = [24usize, 100_000, 24, 24, 50_000].iter().map(|&n| vec![7u8; n]).collect();
        let total: usize = parts.iter().map(Vec::len).sum();
        let drain = std::thread::spawn(move || {
            let mut got = 0;
            let mut chunk = vec![0u8; 3000];
            while got < total {
                std::thread::sleep(Duration::from_millis(1));
                match reader.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            got
        });
        let mut iovecs: Vec<libc::iovec> = parts.iter().map(|part| iovec(part.as_ptr(), part.len())).collect();
        let mut patience = Patience::new("test send", Duration::from_secs(10), None);
        let mut reported: Vec<SendCall> = Vec::new();
        // SAFETY: every iovec points into `parts`, alive and unchanged during the call.
        unsafe {
            write_all_vectored_observed(writer.as_raw_fd(), &mut iovecs, &mut patience, &mut |c| reported.push(c))
        }
        .expect("sent");
        assert_eq!(drain.join().expect("drained"), total);
        assert!(reported.len() > 2, "the small buffer forced partial sends: {reported:?}");
        let mut complete = 0;
        for (index, call) in reported.iter().enumerate() {
            assert_eq!(call.call as usize, index + 1, "numbered from 1 without gaps");
            assert!(call.touched.start == complete && !call.touched.is_empty(), "{call:?} after {complete}");
            assert!(call.complete_before >= complete && call.complete_before <= call.touched.end, "{call:?}");
            // A call that left an iovec part-sent is touched up to it; the next call starts there.
            assert!(call.touched.end - call.complete_before <= 1, "{call:?}");
            complete = call.complete_before;
        }
        assert_eq!(complete, parts.len(), "every iovec carried whole at the end");
    }
}
