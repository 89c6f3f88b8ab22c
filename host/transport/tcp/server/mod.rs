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
//!
//! The files: this one holds the limits, the errors and [`TcpDataServer`] (start, counters, stop); `conn` a
//! connection's state and the registry of live and parked connections; `replies` the replies queued on a
//! connection; `poller` the `tcp-accept` thread (accepting, admission and eviction, parked connections, handing
//! whole headers to serving threads); `serve` the `tcp-serve` threads and one connection's requests; `socket` the
//! raw socket and epoll calls.

mod conn;
mod poller;
mod replies;
mod serve;
mod socket;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use self::conn::{Conn, Pool, Registry};
use self::poller::{poll_loop, LISTENER_TOKEN, WAKE_TOKEN};
use self::socket::{epoll_control, os_fd};
use super::wire::WireVersion;
use crate::transfer::BufferSet;

/// The engine's registered memory, shared with the server.
pub type SharedMemory = Arc<RwLock<BufferSet>>;

/// The listen backlog asked for (capped by the kernel's somaxconn).
const LISTEN_BACKLOG: libc::c_int = 4096;

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
}
