//! The replies queued on a connection: status frames and READ ranges (as addresses and lengths), written together
//! in one `sendmsg` and kept with the connection while it is parked waiting for room.

use std::collections::VecDeque;
use std::time::Instant;

use crate::transport::tcp::io::{iovec, MAX_IOVECS};
use crate::transport::tcp::wire::{Status, STATUS_LEN};

pub(super) static OK_FRAME: [u8; STATUS_LEN] = Status::OK.encode();
pub(super) static REJECTED_FRAME: [u8; STATUS_LEN] = Status::REJECTED.encode();

/// One part of the replies queued on a connection.
#[derive(Clone, Copy, Debug)]
pub(super) enum Part {
    /// A status frame.
    Status(&'static [u8; STATUS_LEN]),
    /// A READ payload: `[addr, addr + len)` was inside one registered buffer when its request was checked (and is
    /// checked again before a parked connection resumes sending it).
    Memory { addr: u64, len: usize },
}

impl Part {
    pub(super) fn len(&self) -> usize {
        match self {
            Part::Status(_) => STATUS_LEN,
            Part::Memory { len, .. } => *len,
        }
    }
}

/// Replies waiting to be written, in order, kept with the connection while it is parked waiting for room.
#[derive(Debug, Default)]
pub(super) struct Replies {
    pub(super) parts: VecDeque<Part>,
    /// Bytes of the first part already written.
    sent: usize,
    /// Bytes not written yet.
    bytes: usize,
    /// READ payloads among the parts: a later WRITE on the same connection must not change that memory before
    /// they have left.
    memory_parts: usize,
    /// The earliest deadline of the requests these replies answer.
    pub(super) deadline: Option<Instant>,
}

/// Flush when this much is queued even if more requests are buffered.
const OUTBOUND_FLUSH_BYTES: usize = 8 << 20;

impl Replies {
    pub(super) fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    pub(super) fn push(&mut self, part: Part, deadline: Instant) {
        self.bytes += part.len();
        if matches!(part, Part::Memory { .. }) {
            self.memory_parts += 1;
        }
        self.parts.push_back(part);
        self.deadline = Some(self.deadline.map_or(deadline, |earliest| earliest.min(deadline)));
    }

    pub(super) fn holds_memory(&self) -> bool {
        self.memory_parts > 0
    }

    pub(super) fn is_full(&self) -> bool {
        self.parts.len() + 2 > MAX_IOVECS || self.bytes >= OUTBOUND_FLUSH_BYTES
    }

    /// The iovecs of what is left to write (at most [`MAX_IOVECS`]).
    pub(super) fn iovecs(&self, into: &mut Vec<libc::iovec>) {
        into.clear();
        for (index, part) in self.parts.iter().take(MAX_IOVECS).enumerate() {
            let skip = if index == 0 { self.sent } else { 0 };
            let (addr, len) = match part {
                Part::Status(frame) => (frame.as_ptr(), STATUS_LEN),
                Part::Memory { addr, len } => (*addr as *const u8, *len),
            };
            // The first part's address is advanced within its own range (`skip < len`).
            into.push(iovec(addr.wrapping_add(skip), len - skip));
        }
    }

    /// Records that `wrote` more bytes have left.
    pub(super) fn advance(&mut self, mut wrote: usize) {
        self.bytes -= wrote;
        while wrote > 0 {
            let Some(first) = self.parts.front() else { break };
            let left = first.len() - self.sent;
            if wrote < left {
                self.sent += wrote;
                break;
            }
            wrote -= left;
            if matches!(first, Part::Memory { .. }) {
                self.memory_parts -= 1;
            }
            self.parts.pop_front();
            self.sent = 0;
        }
        if self.parts.is_empty() {
            self.deadline = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Replies written in pieces: the first part's offset moves, whole parts leave the queue, and the deadline and
    /// the count of READ payloads follow.
    #[test]
    pub(super) fn replies_advance_through_partial_writes() {
        let now = Instant::now();
        let mut replies = Replies::default();
        replies.push(Part::Status(&OK_FRAME), now);
        replies.push(Part::Memory { addr: 0x1000, len: 100 }, now + Duration::from_secs(1));
        assert_eq!((replies.bytes, replies.memory_parts, replies.deadline), (108, 1, Some(now)));
        replies.advance(5);
        let mut iovecs = Vec::new();
        replies.iovecs(&mut iovecs);
        assert_eq!((iovecs[0].iov_len, iovecs[1].iov_len), (3, 100));
        replies.advance(3 + 40);
        replies.iovecs(&mut iovecs);
        assert_eq!((iovecs.len(), iovecs[0].iov_base as u64, iovecs[0].iov_len), (1, 0x1000 + 40, 60));
        replies.advance(60);
        assert!(replies.is_empty() && !replies.holds_memory() && replies.deadline.is_none() && replies.bytes == 0);
    }
}
