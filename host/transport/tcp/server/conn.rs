//! A connection's state as it moves between the poller and the serving threads (`Conn`, the WRITE in progress,
//! what a parked connection waits for) and the registry of live and parked connections, with the choice of the one
//! to evict.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use super::replies::Replies;
use super::socket::has_pending_input;
use crate::transport::tcp::wire::{WireVersion, HEADER_LEN};

/// Candidates an eviction considers before giving up (each one skipped has input waiting).
const VICTIM_TRIES: usize = 8;

/// What the per-source limit counts by: an IPv4 address (IPv4-mapped IPv6 included) or an IPv6 /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Source {
    V4(u32),
    V6(u64),
}

impl Source {
    pub(super) fn of(address: &SocketAddr) -> Source {
        match address.ip() {
            IpAddr::V4(ip) => Source::V4(u32::from(ip)),
            IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
                Some(ip) => Source::V4(u32::from(ip)),
                None => Source::V6((u128::from(ip) >> 64) as u64),
            },
        }
    }
}

/// A connection as it moves between the poller and the serving threads.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) id: u64,
    pub(super) stream: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) source: Source,
    /// Whether it has delivered a whole request header before (a first request is held to a stricter deadline).
    pub(super) requested: bool,
    /// The next request header, as far as it has arrived.
    pub(super) header: [u8; HEADER_LEN],
    pub(super) have: usize,
    /// Bytes read ahead of the request in hand (later requests), kept while it is parked mid-request.
    pub(super) ahead: Vec<u8>,
    /// A WRITE whose payload is partly in.
    pub(super) write: Option<PendingWrite>,
    /// Replies not written yet.
    pub(super) replies: Replies,
    /// Why the connection closes once its replies are out (a rejected request).
    pub(super) closing: Option<String>,
}

impl Conn {
    pub(super) fn new(id: u64, stream: TcpStream, peer: SocketAddr) -> Conn {
        Conn {
            id,
            stream,
            peer,
            source: Source::of(&peer),
            requested: false,
            header: [0; HEADER_LEN],
            have: 0,
            ahead: Vec::new(),
            write: None,
            replies: Replies::default(),
            closing: None,
        }
    }
}

/// A WRITE whose payload is partly in: `done` of `length` bytes have reached `[addr, addr + length)`, or have been
/// read and dropped once `unmapped` says why the destination could not take them.
#[derive(Debug)]
pub(super) struct PendingWrite {
    pub(super) addr: u64,
    pub(super) length: usize,
    pub(super) done: usize,
    pub(super) version: WireVersion,
    pub(super) deadline: Instant,
    /// A page of the destination is not mapped (it was unmapped after registration): the rest of the payload is
    /// read and dropped, so the stream stays in step, and the request is answered like a range outside the buffers.
    pub(super) unmapped: Option<String>,
}

/// What a parked connection waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waiting {
    /// Its next request header (the poller reads it).
    Request,
    /// More of a WRITE payload.
    Input,
    /// Room in its socket for the replies queued.
    Output,
}

impl Waiting {
    /// The epoll events that make a connection waiting for this ready. Not `EPOLLRDHUP` for output: a peer that
    /// closed its sending side may still read its replies (errors and hang-ups are always reported).
    pub(super) fn events(self) -> u32 {
        match self {
            Waiting::Request | Waiting::Input => (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            Waiting::Output => libc::EPOLLOUT as u32,
        }
    }
}

/// A connection without a thread, held by the poller: waiting for a request, or parked mid-request.
#[derive(Debug)]
pub(super) struct Parked {
    pub(super) conn: Conn,
    pub(super) waiting: Waiting,
    /// When it was accepted or last parked (what "oldest" and "idle longest" compare).
    pub(super) since: Instant,
    /// When it is closed unless it has moved on by then.
    pub(super) deadline: Instant,
}

/// Every live connection: its source, and its descriptor while a serving thread has it (for a stop to shut down).
/// The owner of a connection's stream removes its entry before closing it, so a registered descriptor is open.
#[derive(Debug, Default)]
pub(super) struct Registry {
    pub(super) live: HashMap<u64, (Source, RawFd)>,
    pub(super) per_source: HashMap<Source, usize>,
    pub(super) parked: HashMap<u64, Parked>,
}

impl Registry {
    pub(super) fn forget(&mut self, id: u64) {
        if let Some((source, _)) = self.live.remove(&id) {
            if let Some(count) = self.per_source.get_mut(&source) {
                *count -= 1;
                if *count == 0 {
                    self.per_source.remove(&source);
                }
            }
        }
    }

    /// The parked connection to evict for room in `source` (or anywhere, with `None`): the oldest that never sent a
    /// request, else the one idle longest between requests, else (last) the one parked mid-request longest; never
    /// one whose input has already arrived (unread yet, because the poller accepts before it reads again).
    pub(super) fn victim(&self, source: Option<Source>) -> Option<u64> {
        let mut skipped: Vec<u64> = Vec::new();
        // A few tries: a candidate with input waiting is skipped and the next oldest considered.
        for _ in 0..VICTIM_TRIES {
            let mut never_requested = None::<&Parked>;
            let mut idle_longest = None::<&Parked>;
            let mut mid_request = None::<&Parked>;
            let candidates = self
                .parked
                .values()
                .filter(|parked| source.is_none_or(|s| parked.conn.source == s) && !skipped.contains(&parked.conn.id));
            for parked in candidates {
                let slot = match (parked.waiting, parked.conn.requested) {
                    (Waiting::Request, false) => &mut never_requested,
                    (Waiting::Request, true) => &mut idle_longest,
                    _ => &mut mid_request,
                };
                if slot.is_none_or(|best| parked.since < best.since) {
                    *slot = Some(parked);
                }
            }
            let candidate = never_requested.or(idle_longest).or(mid_request)?;
            if candidate.waiting == Waiting::Output || !has_pending_input(candidate.conn.stream.as_raw_fd()) {
                return Some(candidate.conn.id);
            }
            skipped.push(candidate.conn.id);
        }
        None
    }

    /// The source holding the most connections.
    pub(super) fn largest_source(&self) -> Option<Source> {
        self.per_source.iter().max_by_key(|(_, count)| **count).map(|(source, _)| *source)
    }
}

/// Connections with a whole request header in hand, waiting for a serving thread, and the threads.
#[derive(Debug, Default)]
pub(super) struct Pool {
    pub(super) queue: VecDeque<Conn>,
    pub(super) workers: usize,
    pub(super) idle: usize,
}
