//! The TCP data server: serves Mooncake READ/WRITE requests against the engine's registered memory.
//!
//! Owns the listener, the poller thread, the pool of serving threads and the per-request bounds check. It reads the
//! engine's [`BufferSet`] under its lock at the start of every request, so it serves exactly the memory registered
//! at that moment; it never registers or changes anything.
//!
//! Framing (docs/mooncake.md section 4): connections are persistent; a request whose range is not inside one
//! registered buffer (zero size and overflow included) is answered with `REJECTED` in v2 and the connection closed
//! once the replies before it are out, in v1 just closed; memory is not touched. Rejections are logged through a
//! [`LogLimiter`] (5 lines a second, each with the count left out). Replies are coalesced: the statuses and READ
//! payloads of requests that arrived together leave in one `sendmsg`, flushed before the server waits for more
//! input. A WRITE into registered
//! memory that is not mapped (unmapped since registration) has its payload read and dropped, then is answered like a
//! range outside the buffers; a READ of such memory ends its connection (`sendmsg` reports EFAULT). Neither crashes
//! the process (docs/tcp.md, "Memory that is not mapped").
//!
//! Connections and threads (docs/tcp.md, "Connections"): a connection holds a thread only while it is moving. The
//! poller (`tcp-accept`, epoll) accepts, and holds every connection that has no thread ("parked": a descriptor and
//! the request state, no thread). A connection waiting for a request is parked for input; the poller reads its
//! next request header itself and hands it to a serving thread (`tcp-serve`, at most [`ServerLimits::max_serving`],
//! started on demand, ended after a few idle seconds, taking connections first-in first-out) only once the whole
//! header is in. A serving thread never blocks on a connection that does not move: sockets are only read once
//! poll(2) says they are readable, replies are sent with `MSG_DONTWAIT`, and when a connection has nothing to read
//! (its next header, more of a WRITE payload) or no room for its replies within [`ServerLimits::linger`] (at once,
//! while other connections wait for a thread), the thread parks it mid-request and takes the next one. A parked
//! request keeps its state with its connection: how much of a WRITE payload has landed (`PendingWrite`), the
//! replies not written yet (`Replies`: status frames and READ ranges as addresses and lengths), the bytes read
//! ahead. The poller watches it for `EPOLLIN` (payload) or `EPOLLOUT` (replies) and queues it for a thread when
//! ready; the thread first checks again that every range it will touch is still inside one registered buffer
//! (memory may have been unregistered meanwhile) and closes the connection if not. So idle or slow clients hold
//! descriptors (and at most the request bytes they sent ahead, 256 KiB, the receive buffer's size), never threads.
//!
//! Whole-request deadline: every request must be done (its WRITE payload in memory, or its reply handed to the
//! kernel) by [`ServerLimits::request_deadline`]: `request_timeout` plus its size at `request_min_rate`, counted
//! from when its header was taken, however steadily its bytes move. A connection past it is closed with a reset
//! (`SO_LINGER` 0), dropping any reply still queued for it.
//!
//! Admission: a new connection must deliver its first whole request header within
//! [`ServerLimits::first_request_timeout`] of being accepted (slow bytes do not extend it). One source (an IPv4
//! address, an IPv6 /64) holds at most [`ServerLimits::max_connections_per_source`] connections and all of them at
//! most [`ServerLimits::max_connections`]; a connection over a limit evicts a parked one of the same source (over
//! the per-source limit) or of the source holding the most (over the total): one that never sent a request first,
//! the oldest, else the one idle longest between requests, and only if there is none of those the one parked
//! mid-request longest; never one whose input has arrived unread; with none to evict the new one is closed. A
//! legitimate peer sends its request as it connects and keeps it moving, so it is rarely the one evicted (and its
//! client sends a request cut off this way once more on a fresh connection); a flood of idle connections only
//! evicts itself.
//!
//! Bounded waits: a parked connection with no request for `idle_timeout` is closed; one that stalls inside a request
//! (half a header after its first request, half a payload, a reader that stops reading) after `io_timeout`, and
//! any request at its whole-request deadline.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::io::{iovec, is_unmapped_destination, read_some, Inbound, Patience, DIRECT_READ_MIN, MAX_IOVECS};
use super::wire::{RequestHeader, Status, WireOpcode, WireVersion, HEADER_LEN, STATUS_LEN};
use crate::log_limit::LogLimiter;
use crate::transfer::BufferSet;

/// The engine's registered memory, shared with the server.
pub type SharedMemory = Arc<RwLock<BufferSet>>;

static OK_FRAME: [u8; STATUS_LEN] = Status::OK.encode();
static REJECTED_FRAME: [u8; STATUS_LEN] = Status::REJECTED.encode();

/// Warnings a flood could repeat without end.
static LIMIT_REFUSED: LogLimiter = LogLimiter::per_second(5);
static ACCEPT_FAILED: LogLimiter = LogLimiter::per_second(5);
static UNMAPPED_WRITE: LogLimiter = LogLimiter::per_second(5);
static REQUEST_REJECTED: LogLimiter = LogLimiter::per_second(5);
static SPAWN_FAILED: LogLimiter = LogLimiter::per_second(5);
/// Receive buffer of a connection being served: small frames are read many at a time.
const INBOUND_CAPACITY: usize = 256 * 1024;
/// Connections accepted per poller turn, so parked connections are read between bursts of accepts.
const ACCEPT_BURST: usize = 64;
/// The listen backlog asked for (capped by the kernel's somaxconn).
const LISTEN_BACKLOG: libc::c_int = 4096;
/// Candidates an eviction considers before giving up (each one skipped has input waiting).
const VICTIM_TRIES: usize = 8;
/// A serving thread with nothing to do for this long ends.
const WORKER_KEEPALIVE: Duration = Duration::from_secs(5);
/// epoll tokens of the listener and of the wake-up eventfd (connection ids start at 1 and never reach these).
const LISTENER_TOKEN: u64 = u64::MAX;
const WAKE_TOKEN: u64 = u64::MAX - 1;

/// Limits of the data server.
#[derive(Clone, Debug)]
pub struct ServerLimits {
    /// A connection with no request for this long is closed (it waits parked, holding no thread).
    pub idle_timeout: Duration,
    /// A request that makes no progress for this long closes its connection.
    pub io_timeout: Duration,
    /// Connections held at once (parked or served); see the module docs for what a new one over it does.
    pub max_connections: usize,
    /// Socket timeout between checks of the stop flag.
    pub tick: Duration,
    /// A new connection must deliver its first whole request header within this of being accepted (`aiv` option
    /// `tcp_first_request_ms`, default 1 s).
    pub first_request_timeout: Duration,
    /// Connections one source (an IPv4 address, an IPv6 /64) holds at once (`tcp_max_connections_per_source`,
    /// default 128).
    pub max_connections_per_source: usize,
    /// Threads serving requests at once (default 64); connections waiting for a request hold none.
    pub max_serving: usize,
    /// How long a serving thread waits for a connection to move (its next request, more of a WRITE payload, room
    /// for its replies) before parking it; it waits not at all while other connections wait for a thread
    /// (default 20 ms).
    pub linger: Duration,
    /// Every request must be done (its WRITE payload in, or its reply out) within `request_timeout` plus its size
    /// at `request_min_rate` of its header having arrived, however steadily its bytes move
    /// (`tcp_request_timeout_ms`, default 10 s).
    pub request_timeout: Duration,
    /// Bytes per second a request is granted beyond `request_timeout` (`tcp_request_min_kib_per_s`, default
    /// 1 MiB/s).
    pub request_min_rate: u64,
}

impl ServerLimits {
    /// When a request of `size` bytes whose header arrived at `start` must be done.
    pub fn request_deadline(&self, start: Instant, size: u64) -> Instant {
        let millis = u128::from(size) * 1000 / u128::from(self.request_min_rate.max(1));
        let extra = Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX));
        // Far beyond any real deadline when the sum does not fit an Instant.
        start.checked_add(self.request_timeout.saturating_add(extra)).unwrap_or(start + Duration::from_secs(1 << 32))
    }
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            idle_timeout: Duration::from_secs(300),
            io_timeout: Duration::from_secs(30),
            max_connections: 1024,
            tick: Duration::from_millis(500),
            first_request_timeout: Duration::from_secs(1),
            max_connections_per_source: 128,
            max_serving: 64,
            linger: Duration::from_millis(20),
            request_timeout: Duration::from_secs(10),
            request_min_rate: 1 << 20,
        }
    }
}

/// Why the data server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// `bind(2)` or `listen(2)` failed.
    #[error("tcp data server: bind {address}: {source}")]
    Bind { address: SocketAddr, source: io::Error },
    /// The listener could not be prepared or its thread started.
    #[error("tcp data server: {operation}: {source}")]
    Setup { operation: &'static str, source: io::Error },
}

/// What the per-source limit counts by: an IPv4 address (IPv4-mapped IPv6 included) or an IPv6 /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Source {
    V4(u32),
    V6(u64),
}

impl Source {
    fn of(address: &SocketAddr) -> Source {
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
struct Conn {
    id: u64,
    stream: TcpStream,
    peer: SocketAddr,
    source: Source,
    /// Whether it has delivered a whole request header before (a first request is held to a stricter deadline).
    requested: bool,
    /// The next request header, as far as it has arrived.
    header: [u8; HEADER_LEN],
    have: usize,
    /// Bytes read ahead of the request in hand (later requests), kept while it is parked mid-request.
    ahead: Vec<u8>,
    /// A WRITE whose payload is partly in.
    write: Option<PendingWrite>,
    /// Replies not written yet.
    replies: Replies,
    /// Why the connection closes once its replies are out (a rejected request).
    closing: Option<String>,
}

impl Conn {
    fn new(id: u64, stream: TcpStream, peer: SocketAddr) -> Conn {
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
struct PendingWrite {
    addr: u64,
    length: usize,
    done: usize,
    version: WireVersion,
    deadline: Instant,
    /// A page of the destination is not mapped (it was unmapped after registration): the rest of the payload is
    /// read and dropped, so the stream stays in step, and the request is answered like a range outside the buffers.
    unmapped: Option<String>,
}

/// What a parked connection waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiting {
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
    fn events(self) -> u32 {
        match self {
            Waiting::Request | Waiting::Input => (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            Waiting::Output => libc::EPOLLOUT as u32,
        }
    }
}

/// A connection without a thread, held by the poller: waiting for a request, or parked mid-request.
#[derive(Debug)]
struct Parked {
    conn: Conn,
    waiting: Waiting,
    /// When it was accepted or last parked (what "oldest" and "idle longest" compare).
    since: Instant,
    /// When it is closed unless it has moved on by then.
    deadline: Instant,
}

/// Every live connection: its source, and its descriptor while a serving thread has it (for a stop to shut down).
/// The owner of a connection's stream removes its entry before closing it, so a registered descriptor is open.
#[derive(Debug, Default)]
struct Registry {
    live: HashMap<u64, (Source, RawFd)>,
    per_source: HashMap<Source, usize>,
    parked: HashMap<u64, Parked>,
}

impl Registry {
    fn forget(&mut self, id: u64) {
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
    fn victim(&self, source: Option<Source>) -> Option<u64> {
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
    fn largest_source(&self) -> Option<Source> {
        self.per_source.iter().max_by_key(|(_, count)| **count).map(|(source, _)| *source)
    }
}

/// Connections with a whole request header in hand, waiting for a serving thread, and the threads.
#[derive(Debug, Default)]
struct Pool {
    queue: VecDeque<Conn>,
    workers: usize,
    idle: usize,
}

#[derive(Debug)]
struct Shared {
    memory: SharedMemory,
    limits: ServerLimits,
    stopping: AtomicBool,
    registry: Mutex<Registry>,
    drained: Condvar,
    pool: Mutex<Pool>,
    work: Condvar,
    /// `pool.queue.len()`, read by serving threads without the lock.
    queued: AtomicUsize,
    epoll: OwnedFd,
    wake: OwnedFd,
    next_connection: AtomicU64,
    /// Requests served per framing (v1, v2) and rejected, for tests and logs.
    served: [AtomicU64; 2],
    rejected: AtomicU64,
    /// Parked connections evicted for a newer one, new ones refused for want of a connection to evict, and
    /// connections closed at their first-request or idle deadline.
    evicted: AtomicU64,
    refused: AtomicU64,
    expired: AtomicU64,
}

/// A running data server; dropping it stops the listener and every connection.
#[derive(Debug)]
pub struct TcpDataServer {
    address: SocketAddr,
    shared: Arc<Shared>,
    poller: Option<JoinHandle<()>>,
}

fn os_fd(result: libc::c_int) -> io::Result<OwnedFd> {
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative result of epoll_create1/eventfd is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(result) })
}

fn epoll_control(epoll: &OwnedFd, operation: libc::c_int, fd: RawFd, token: u64) -> io::Result<()> {
    epoll_watch(epoll, operation, fd, token, (libc::EPOLLIN | libc::EPOLLRDHUP) as u32)
}

fn epoll_watch(epoll: &OwnedFd, operation: libc::c_int, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
    let mut event = libc::epoll_event { events, u64: token };
    // SAFETY: `event` is a live epoll_event; the kernel copies it (and ignores it for EPOLL_CTL_DEL).
    if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), operation, fd, &mut event) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl TcpDataServer {
    /// Binds `address` (port 0 picks a free port) and starts serving `memory`.
    pub fn start(address: SocketAddr, memory: SharedMemory, limits: ServerLimits) -> Result<Self, ServerError> {
        let setup = |operation: &'static str| move |source| ServerError::Setup { operation, source };
        let listener = TcpListener::bind(address).map_err(|source| ServerError::Bind { address, source })?;
        let address = listener.local_addr().map_err(setup("local_addr"))?;
        listener.set_nonblocking(true).map_err(setup("non-blocking listener"))?;
        // A deep accept queue (the kernel caps it at net.core.somaxconn): under a burst of connections the poller
        // drains it in turns, and a full queue would drop legitimate SYNs (a retry costs the client a second).
        // SAFETY: listen(2) again on our own listening socket only changes its backlog.
        if unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
            return Err(setup("listen")(io::Error::last_os_error()));
        }
        // SAFETY: epoll_create1 and eventfd have no memory preconditions.
        let epoll = os_fd(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) }).map_err(setup("epoll_create1"))?;
        // SAFETY: as above.
        let wake =
            os_fd(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) }).map_err(setup("eventfd"))?;
        epoll_control(&epoll, libc::EPOLL_CTL_ADD, listener.as_raw_fd(), LISTENER_TOKEN).map_err(setup("epoll add"))?;
        epoll_control(&epoll, libc::EPOLL_CTL_ADD, wake.as_raw_fd(), WAKE_TOKEN).map_err(setup("epoll add"))?;
        let shared = Arc::new(Shared {
            memory,
            limits,
            stopping: AtomicBool::new(false),
            registry: Mutex::new(Registry::default()),
            drained: Condvar::new(),
            pool: Mutex::new(Pool::default()),
            work: Condvar::new(),
            queued: AtomicUsize::new(0),
            epoll,
            wake,
            next_connection: AtomicU64::new(1),
            served: [AtomicU64::new(0), AtomicU64::new(0)],
            rejected: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        });
        let poller = std::thread::Builder::new()
            .name("tcp-accept".into())
            .spawn({
                let shared = shared.clone();
                move || poll_loop(listener, shared)
            })
            .map_err(setup("spawn acceptor"))?;
        tracing::info!(%address, "tcp data server listening");
        Ok(TcpDataServer { address, shared, poller: Some(poller) })
    }

    /// The address the listener is bound to (with the actual port).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Requests served so far.
    pub fn served(&self) -> u64 {
        self.shared.served.iter().map(|count| count.load(Ordering::Relaxed)).sum()
    }

    /// Requests served so far that used the framing `version`.
    pub fn served_with(&self, version: WireVersion) -> u64 {
        self.shared.served[version_index(version)].load(Ordering::Relaxed)
    }

    /// Requests rejected so far (bounds), each of which closed its connection.
    pub fn rejected(&self) -> u64 {
        self.shared.rejected.load(Ordering::Relaxed)
    }

    /// Connections held now (parked or being served).
    pub fn connections(&self) -> usize {
        lock(&self.shared.registry).live.len()
    }

    /// Serving threads running now (busy or waiting for work).
    pub fn serving_threads(&self) -> usize {
        lock(&self.shared.pool).workers
    }

    /// Parked connections evicted so far to make room for newer ones (see the module docs).
    pub fn evicted(&self) -> u64 {
        self.shared.evicted.load(Ordering::Relaxed)
    }

    /// New connections closed at once so far because a limit was reached and nothing could be evicted.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Connections closed so far at their first-request or idle deadline.
    pub fn expired(&self) -> u64 {
        self.shared.expired.load(Ordering::Relaxed)
    }
}

impl Drop for TcpDataServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.wake();
        // The poller closes the listener and every parked connection as it returns.
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
        let queued: Vec<Conn> = {
            let mut pool = lock(&self.shared.pool);
            self.shared.queued.store(0, Ordering::Relaxed);
            self.shared.work.notify_all();
            pool.queue.drain(..).collect()
        };
        for conn in queued {
            self.shared.close(conn);
        }
        let mut registry = lock(&self.shared.registry);
        for (_, fd) in registry.live.values().filter(|(_, fd)| *fd >= 0) {
            // SAFETY: a registered descriptor belongs to a connection a serving thread still owns (it deregisters
            // under this lock before closing), so `fd` is open and is that connection's socket.
            unsafe { libc::shutdown(*fd, libc::SHUT_RDWR) };
        }
        // The serving threads notice within one tick; wait for them so no request touches memory after the engine
        // that owns it is gone. Bounded: a thread blocked in a copy finishes it in microseconds.
        let deadline = Instant::now() + self.shared.limits.tick * 4 + Duration::from_secs(1);
        while !registry.live.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    connections = registry.live.len(),
                    "tcp data server stopped with connections still open"
                );
                break;
            }
            registry = self.shared.drained.wait_timeout(registry, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Shared {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 into the eventfd this struct owns.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), std::ptr::addr_of!(one).cast(), 8) };
    }

    /// Closes a connection this thread owns (parked ones are closed through [`Shared::evict`] or the poller).
    fn close(&self, conn: Conn) {
        let mut registry = lock(&self.registry);
        registry.forget(conn.id);
        self.drained.notify_all();
        drop(registry);
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Removes a parked connection and closes it. Poller only (it holds `registry`).
    fn evict(&self, registry: &mut Registry, id: u64) -> Option<Conn> {
        let parked = registry.parked.remove(&id)?;
        let _ = epoll_control(&self.epoll, libc::EPOLL_CTL_DEL, parked.conn.stream.as_raw_fd(), 0);
        registry.forget(id);
        self.drained.notify_all();
        Some(parked.conn)
    }

    /// Hands a connection back to the poller: it waits for its next request, or for its peer to move the request
    /// in hand on, holding no thread.
    fn park(&self, conn: Conn, waiting: Waiting) {
        let now = Instant::now();
        let stalled = now + self.limits.io_timeout;
        let deadline = match waiting {
            // Half a header already in: the rest must come within the in-request bound.
            Waiting::Request if conn.have > 0 => stalled,
            Waiting::Request => now + self.limits.idle_timeout,
            Waiting::Input => conn.write.as_ref().map_or(stalled, |write| write.deadline.min(stalled)),
            Waiting::Output => conn.replies.deadline.map_or(stalled, |deadline| deadline.min(stalled)),
        };
        let mut registry = lock(&self.registry);
        // Checked under the lock: the stopping poller closes what is parked under it too, so nothing parks after.
        if self.stopping.load(Ordering::SeqCst)
            || conn.stream.set_nonblocking(true).is_err()
            || epoll_watch(&self.epoll, libc::EPOLL_CTL_ADD, conn.stream.as_raw_fd(), conn.id, waiting.events())
                .is_err()
        {
            registry.forget(conn.id);
            self.drained.notify_all();
            drop(registry);
            let _ = conn.stream.shutdown(std::net::Shutdown::Both);
            return;
        }
        if let Some(entry) = registry.live.get_mut(&conn.id) {
            entry.1 = -1;
        }
        registry.parked.insert(conn.id, Parked { conn, waiting, since: now, deadline });
    }

    /// Queues a connection whose request header is complete for a serving thread, starting one if none is free.
    fn dispatch(self: &Arc<Self>, conn: Conn) {
        {
            let mut registry = lock(&self.registry);
            if let Some(entry) = registry.live.get_mut(&conn.id) {
                entry.1 = conn.stream.as_raw_fd();
            }
        }
        let mut pool = lock(&self.pool);
        pool.queue.push_back(conn);
        self.queued.store(pool.queue.len(), Ordering::Relaxed);
        if pool.idle == 0 && pool.workers < self.limits.max_serving.max(1) {
            pool.workers += 1;
            let shared = self.clone();
            let spawned = std::thread::Builder::new().name("tcp-serve".into()).spawn(move || shared.serve_loop());
            if let Err(error) = spawned {
                pool.workers -= 1;
                if let Some(suppressed) = SPAWN_FAILED.admit() {
                    tracing::warn!(%error, workers = pool.workers, suppressed,
                        "tcp data server: cannot start a serving thread ({suppressed} more like this in the last \
                         second)");
                }
            }
        }
        self.work.notify_one();
    }

    /// A serving thread: takes connections with a request in hand and serves them until they go quiet.
    fn serve_loop(self: Arc<Self>) {
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

    /// Admits a new connection within the limits, evicting a parked one if it must; false if refused.
    fn admit(&self, registry: &mut Registry, conn: &Conn) -> bool {
        let limits = &self.limits;
        let per_source = registry.per_source.get(&conn.source).copied().unwrap_or(0);
        if per_source >= limits.max_connections_per_source.max(1) {
            let Some(victim) = registry.victim(Some(conn.source)) else { return false };
            self.evicted.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(peer = %conn.peer, "tcp data server: per-source limit; evicting a parked connection");
            drop(self.evict(registry, victim));
        }
        if registry.live.len() >= limits.max_connections.max(1) {
            let victim = registry
                .victim(None)
                .filter(|id| !registry.parked[id].conn.requested)
                .or_else(|| registry.largest_source().and_then(|source| registry.victim(Some(source))));
            let Some(victim) = victim else { return false };
            self.evicted.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(peer = %conn.peer, "tcp data server: connection limit; evicting a parked connection");
            drop(self.evict(registry, victim));
        }
        true
    }
}

fn poll_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    loop {
        let now = Instant::now();
        let next_deadline = lock(&shared.registry).parked.values().map(|parked| parked.deadline).min();
        // Capped at a tick: serving threads park connections (with later deadlines) without waking the poller.
        let wait =
            next_deadline.map_or(shared.limits.tick, |d| d.saturating_duration_since(now)).min(shared.limits.tick);
        let timeout = wait.as_micros().div_ceil(1000) as libc::c_int;
        // SAFETY: `events` is a live array of `events.len()` epoll_event records the kernel may fill.
        let ready = unsafe {
            libc::epoll_wait(shared.epoll.as_raw_fd(), events.as_mut_ptr(), events.len() as libc::c_int, timeout)
        };
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let ready = if ready < 0 { 0 } else { ready as usize };
        let mut accept_now = false;
        for event in &events[..ready] {
            match event.u64 {
                LISTENER_TOKEN => accept_now = true,
                WAKE_TOKEN => {
                    let mut value: u64 = 0;
                    // SAFETY: reads at most 8 bytes into a live u64 from the non-blocking eventfd.
                    let _ = unsafe { libc::read(shared.wake.as_raw_fd(), std::ptr::addr_of_mut!(value).cast(), 8) };
                }
                id => read_parked(&shared, id),
            }
        }
        expire_parked(&shared);
        if !accept_now {
            continue;
        }
        // The listener is level-triggered: a backlog left after this burst fires again at once.
        for _ in 0..ACCEPT_BURST {
            let (stream, peer) = match listener.accept() {
                Ok(pair) => pair,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    if let Some(suppressed) = ACCEPT_FAILED.admit() {
                        tracing::warn!(%error, suppressed, "tcp data server: accept failed");
                    }
                    // Out of descriptors and the like: back off instead of spinning.
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            };
            let conn = Conn::new(shared.next_connection.fetch_add(1, Ordering::Relaxed), stream, peer);
            let _ = conn.stream.set_nodelay(true);
            if conn.stream.set_nonblocking(true).is_err() {
                continue;
            }
            let mut registry = lock(&shared.registry);
            if !shared.admit(&mut registry, &conn) {
                shared.refused.fetch_add(1, Ordering::Relaxed);
                if let Some(suppressed) = LIMIT_REFUSED.admit() {
                    tracing::warn!(%peer, connections = registry.live.len(), suppressed,
                        refused = shared.refused.load(Ordering::Relaxed),
                        "tcp data server: connection limits reached and nothing to evict; connection refused \
                         ({suppressed} more like this in the last second)");
                }
                continue;
            }
            if epoll_control(&shared.epoll, libc::EPOLL_CTL_ADD, conn.stream.as_raw_fd(), conn.id).is_err() {
                continue;
            }
            registry.live.insert(conn.id, (conn.source, -1));
            *registry.per_source.entry(conn.source).or_insert(0) += 1;
            let now = Instant::now();
            let deadline = now + shared.limits.first_request_timeout;
            registry.parked.insert(conn.id, Parked { conn, waiting: Waiting::Request, since: now, deadline });
        }
    }
    // Stopping: close every parked connection (serving threads close theirs; `Drop` waits for them).
    let mut registry = lock(&shared.registry);
    let ids: Vec<u64> = registry.parked.keys().copied().collect();
    for id in ids {
        if let Some(conn) = shared.evict(&mut registry, id) {
            let _ = conn.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Reads what a parked connection has sent of its next request header; hands it to a serving thread once whole,
/// closes it at EOF or on error. A connection parked mid-request goes back to a serving thread as soon as it is
/// ready (the thread finds out what it can do).
fn read_parked(shared: &Arc<Shared>, id: u64) {
    let mut registry = lock(&shared.registry);
    let Some(parked) = registry.parked.get_mut(&id) else { return };
    if parked.waiting != Waiting::Request {
        if let Some(parked) = registry.parked.remove(&id) {
            let _ = epoll_control(&shared.epoll, libc::EPOLL_CTL_DEL, parked.conn.stream.as_raw_fd(), 0);
            drop(registry);
            shared.dispatch(parked.conn);
        }
        return;
    }
    let conn = &mut parked.conn;
    let outcome = loop {
        // SAFETY: reads at most `HEADER_LEN - have` bytes into the rest of the connection's header array.
        let got = unsafe {
            libc::recv(
                conn.stream.as_raw_fd(),
                conn.header.as_mut_ptr().add(conn.have).cast(),
                HEADER_LEN - conn.have,
                libc::MSG_DONTWAIT,
            )
        };
        if got > 0 {
            conn.have += got as usize;
            if conn.have < HEADER_LEN {
                continue;
            }
            break Some(true);
        }
        if got == 0 {
            break None;
        }
        match io::Error::last_os_error().kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => break Some(false),
            _ => break None,
        }
    };
    match outcome {
        // Whole header: off to a serving thread.
        Some(true) => {
            if let Some(parked) = registry.parked.remove(&id) {
                let _ = epoll_control(&shared.epoll, libc::EPOLL_CTL_DEL, parked.conn.stream.as_raw_fd(), 0);
                drop(registry);
                let mut conn = parked.conn;
                conn.requested = true;
                shared.dispatch(conn);
            }
        }
        // Part of a header: a first request keeps its deadline from accept; a later one must keep moving.
        Some(false) => {
            if parked.conn.requested && parked.conn.have > 0 {
                parked.deadline = Instant::now() + shared.limits.io_timeout;
            }
        }
        None => {
            if let Some(conn) = shared.evict(&mut registry, id) {
                if conn.have > 0 {
                    tracing::debug!(peer = %conn.peer, have = conn.have, "tcp connection closed inside a request header");
                }
            }
        }
    }
}

/// Closes parked connections past their deadline (first request, idle, or a stalled header).
fn expire_parked(shared: &Shared) {
    let now = Instant::now();
    let mut registry = lock(&shared.registry);
    let expired: Vec<(u64, Waiting)> =
        registry.parked.values().filter(|parked| parked.deadline <= now).map(|p| (p.conn.id, p.waiting)).collect();
    for (id, waiting) in expired {
        if let Some(conn) = shared.evict(&mut registry, id) {
            shared.expired.fetch_add(1, Ordering::Relaxed);
            if waiting != Waiting::Request {
                reset_on_close(&conn.stream);
            }
            let what = match waiting {
                Waiting::Request if !conn.requested => "no first request in time",
                Waiting::Request if conn.have > 0 => "stalled inside a request header",
                Waiting::Request => "idle",
                Waiting::Input => "a WRITE payload stalled or past its request deadline",
                Waiting::Output => "replies stalled or past their request deadline",
            };
            tracing::debug!(peer = %conn.peer, what, "tcp connection closed at its deadline");
        }
    }
}

/// One part of the replies queued on a connection.
#[derive(Clone, Copy, Debug)]
enum Part {
    /// A status frame.
    Status(&'static [u8; STATUS_LEN]),
    /// A READ payload: `[addr, addr + len)` was inside one registered buffer when its request was checked (and is
    /// checked again before a parked connection resumes sending it).
    Memory { addr: u64, len: usize },
}

impl Part {
    fn len(&self) -> usize {
        match self {
            Part::Status(_) => STATUS_LEN,
            Part::Memory { len, .. } => *len,
        }
    }
}

/// Replies waiting to be written, in order, kept with the connection while it is parked waiting for room.
#[derive(Debug, Default)]
struct Replies {
    parts: VecDeque<Part>,
    /// Bytes of the first part already written.
    sent: usize,
    /// Bytes not written yet.
    bytes: usize,
    /// READ payloads among the parts: a later WRITE on the same connection must not change that memory before
    /// they have left.
    memory_parts: usize,
    /// The earliest deadline of the requests these replies answer.
    deadline: Option<Instant>,
}

/// Flush when this much is queued even if more requests are buffered.
const OUTBOUND_FLUSH_BYTES: usize = 8 << 20;

impl Replies {
    fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    fn push(&mut self, part: Part, deadline: Instant) {
        self.bytes += part.len();
        if matches!(part, Part::Memory { .. }) {
            self.memory_parts += 1;
        }
        self.parts.push_back(part);
        self.deadline = Some(self.deadline.map_or(deadline, |earliest| earliest.min(deadline)));
    }

    fn holds_memory(&self) -> bool {
        self.memory_parts > 0
    }

    fn is_full(&self) -> bool {
        self.parts.len() + 2 > MAX_IOVECS || self.bytes >= OUTBOUND_FLUSH_BYTES
    }

    /// The iovecs of what is left to write (at most [`MAX_IOVECS`]).
    fn iovecs(&self, into: &mut Vec<libc::iovec>) {
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
    fn advance(&mut self, mut wrote: usize) {
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

/// Makes closing `stream` reset the connection and drop whatever it still had to send (`SO_LINGER` with a zero
/// timeout): a connection closed mid-request at its deadline leaves no reply queued in the kernel for a peer that
/// takes it a few bytes at a time, and the peer learns at once that it was closed.
fn reset_on_close(stream: &TcpStream) {
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
fn has_pending_input(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv(2) with MSG_PEEK writes at most one byte into `byte`.
    unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) > 0 }
}

/// Whether `fd` is ready for `events` (or has an error or hang-up) within `wait`.
fn ready_within(fd: RawFd, events: libc::c_short, wait: Duration) -> io::Result<bool> {
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

fn version_index(version: WireVersion) -> usize {
    match version {
        WireVersion::V1 => 0,
        WireVersion::V2 => 1,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The deadline is the base plus the size at the minimum rate; any size, the largest included, gives a
    /// deadline (far away) rather than an overflow.
    #[test]
    fn a_request_deadline_is_the_base_plus_its_size_at_the_minimum_rate() {
        let limits =
            ServerLimits { request_timeout: Duration::from_secs(2), request_min_rate: 1 << 20, ..Default::default() };
        let start = Instant::now();
        assert_eq!(limits.request_deadline(start, 0), start + Duration::from_secs(2));
        assert_eq!(limits.request_deadline(start, 3 << 20), start + Duration::from_secs(5));
        assert!(limits.request_deadline(start, u64::MAX) > start + Duration::from_secs(1 << 30));
        let zero_rate = ServerLimits { request_min_rate: 0, ..limits };
        assert!(zero_rate.request_deadline(start, 1) >= start + Duration::from_secs(2));
    }

    /// Replies written in pieces: the first part's offset moves, whole parts leave the queue, and the deadline and
    /// the count of READ payloads follow.
    #[test]
    fn replies_advance_through_partial_writes() {
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
