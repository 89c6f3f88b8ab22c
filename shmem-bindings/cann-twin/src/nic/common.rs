//! What the NIC's files share: the engine's idle tick, the device memory a NIC reads and writes (with its checks),
//! CQE writes, thread spawning and joining, PSN order, the connection handshake, what a reader thread hands its
//! engine ([`Event`]) and a target's per-initiator state ([`Responder`]).

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;

use super::wire::{Conn, Frame};
use super::{NicError, CQE_BYTES};
use crate::memory::Segment;
use crate::space::{perform_copy, space};

/// The longest an idle engine sleeps between two looks at its state (doorbells and shutdown wake it at once).
pub(super) const IDLE_TICK: Duration = Duration::from_millis(200);

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reads `len` device bytes at `address` through the device view.
pub(super) fn read_device(address: u64, len: usize) -> Result<Vec<u8>, aclError> {
    let guard = space();
    let space = guard.as_ref().ok_or(ACL_ERROR_RT_INTERNAL_ERROR)?;
    let from = space.translate(address as usize, len, false)?;
    let covered: usize = from.iter().map(|segment| segment.len).sum();
    let mut out = if covered == len { Vec::with_capacity(len) } else { vec![0u8; len] };
    let to = [Segment { ptr: out.as_mut_ptr(), len }];
    // SAFETY: `from` was translated under the read lock held here; `to` is a live allocation of `len` bytes.
    unsafe { perform_copy(&to, &from) };
    if covered == len {
        // SAFETY: the copy wrote all `len` bytes (the source segments cover exactly `len`).
        unsafe { out.set_len(len) };
    }
    Ok(out)
}

/// Whether `len` bytes of device memory at `address` translate for reading.
pub(super) fn device_readable(address: u64, len: usize) -> bool {
    let guard = space();
    guard.as_ref().is_some_and(|space| space.translate(address as usize, len, false).is_ok())
}

/// Lends `len` bytes of device memory at `address` to `send` (as [`wire::Lend`] asks), translated under the space's
/// read lock, held only for the one call.
pub(super) fn lend_device(
    address: u64,
    len: usize,
    send: &mut dyn FnMut(&[std::io::IoSlice<'_>]) -> std::io::Result<usize>,
) -> Option<std::io::Result<usize>> {
    let guard = space();
    let segments = guard.as_ref()?.translate(address as usize, len, false).ok()?;
    // SAFETY: each segment was translated under the read lock held for this call, so it stays mapped while the
    // slices live; they are only read (by the socket's write), never through Rust code.
    let slices: Vec<std::io::IoSlice<'_>> = segments
        .iter()
        .map(|segment| std::io::IoSlice::new(unsafe { std::slice::from_raw_parts(segment.ptr, segment.len) }))
        .collect();
    Some(send(&slices))
}

/// Lends the device memory of `len` bytes at `address` to `fill` to be written (as [`wire::Land`] asks): its first
/// contiguous piece, translated for writing under the space's read lock, held only for the one call.
pub(super) fn land_device(
    address: u64,
    len: usize,
    fill: &mut dyn FnMut(&mut [u8]) -> std::io::Result<usize>,
) -> Option<std::io::Result<usize>> {
    let guard = space();
    let segments = guard.as_ref()?.translate(address as usize, len, true).ok()?;
    let first = segments.first()?;
    // SAFETY: translated for writing under the read lock held for this call; the socket's read writes into it.
    let piece = unsafe { std::slice::from_raw_parts_mut(first.ptr, first.len) };
    Some(fill(piece))
}

/// Writes a CQE: bytes 4..32 first, then its first word (with the owner bit) with release ordering, so that a
/// consumer that sees the owner bit sees the rest.
pub(super) fn write_cqe(address: u64, cqe: &[u8; CQE_BYTES as usize]) -> Result<(), aclError> {
    let guard = space();
    let space = guard.as_ref().ok_or(ACL_ERROR_RT_INTERNAL_ERROR)?;
    let rest = space.translate(address as usize + 4, cqe.len() - 4, true)?;
    let first = space.translate(address as usize, 4, true)?;
    let from = [Segment { ptr: cqe[4..].as_ptr().cast_mut(), len: cqe.len() - 4 }];
    // SAFETY: translated under the read lock held here; `from` is live and only read.
    unsafe { perform_copy(&rest, &from) };
    let word = u32::from_le_bytes([cqe[0], cqe[1], cqe[2], cqe[3]]);
    match &*first {
        [one] if one.ptr as usize % 4 == 0 => {
            // SAFETY: a 4-byte aligned word of device memory translated under the read lock held here.
            unsafe { AtomicU32::from_ptr(one.ptr.cast()) }.store(word, Ordering::Release);
        }
        _ => {
            let from = [Segment { ptr: cqe.as_ptr().cast_mut(), len: 4 }];
            // SAFETY: as above.
            unsafe { perform_copy(&first, &from) };
        }
    }
    Ok(())
}

pub(super) fn spawn(name: String, body: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, NicError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            crate::provenance::mark_device_thread();
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        })
        .map_err(|error| NicError::Io(format!("spawning a NIC thread: {error}")))
}

/// Joins `handles`, waiting for all of them together at most until `deadline`; returns how many were left.
pub(super) fn join_until(handles: Vec<JoinHandle<()>>, deadline: Instant) -> usize {
    let mut left = 0;
    for handle in handles {
        while !handle.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if handle.is_finished() {
            let _ = handle.join();
        } else {
            left += 1;
        }
    }
    left
}

/// PSN order, modulo 2^32.
pub(super) fn psn_before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// A connection to `peer` on which QP `remote_qpn` answered the handshake.
pub(super) fn handshake(
    peer: SocketAddr,
    remote_qpn: u32,
    from: u32,
    deadline: Instant,
    stop: &dyn Fn() -> bool,
) -> Result<Conn, String> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return Err("no time left".into());
    }
    let stream = TcpStream::connect_timeout(&peer, remaining.min(Duration::from_millis(500)))
        .map_err(|error| format!("connect: {error}"))?;
    let mut conn = Conn::new(stream);
    conn.send(&Frame::Hello { qpn: remote_qpn, from }, remaining).map_err(|error| format!("{error:?}"))?;
    match conn.receive(deadline, stop) {
        Ok(Some(Frame::HelloAck { status: 0 })) => Ok(conn),
        Ok(Some(Frame::HelloAck { .. })) => Err("the peer has no such QP".into()),
        Ok(Some(_)) => Err("an unexpected frame".into()),
        Ok(None) => Err("no answer in time".into()),
        Err(error) => Err(format!("{error:?}")),
    }
}

/// What a reader thread hands its engine.
#[derive(Debug)]
pub(super) enum Event {
    Frame(Frame),
    /// The connection ended (closed, failed, or a malformed frame).
    Lost,
}

/// A target QP's view of one initiator QP's requests: requests execute strictly in PSN order, each at most once.
#[derive(Clone, Copy, Debug)]
pub(super) struct Responder {
    pub(super) initiator: u32,
    /// The PSN expected next (an initiator's first request has PSN 1).
    pub(super) next: u32,
    /// The request refused (PSN, status): every later one of this initiator is dropped.
    pub(super) refused: Option<(u32, u8)>,
}
