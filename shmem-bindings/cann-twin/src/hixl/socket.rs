//! Bounded socket I/O of the HiXL wire: reads and writes that stop at a deadline, at a stop flag or when the peer
//! is gone, and the little-endian field readers of the hello answer.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::common::POLL;

/// Why a bounded read or write stopped.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Io {
    /// The deadline passed.
    Timeout,
    /// End of stream, reset, or another error: the peer is gone.
    Gone,
    /// The owner asked to stop.
    Stopped,
}

pub(super) fn read_full(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Option<Instant>,
    stop: &AtomicBool,
) -> Result<(), Io> {
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

pub(super) fn write_full(stream: &mut TcpStream, buf: &[u8], deadline: Instant, stop: &AtomicBool) -> Result<(), Io> {
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

pub(super) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}
