//! The poller (`tcp-accept`): accepts within the admission limits (evicting a parked connection when it must),
//! holds every connection that has no thread, reads a parked connection's next request header, hands connections
//! that can move to the serving threads (starting one on demand), and closes the parked ones past their deadline.

use std::io;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{Conn, Parked, Registry, Waiting};
use super::socket::{epoll_control, epoll_watch, reset_on_close};
use super::{lock, Shared};
use crate::log_limit::LogLimiter;
use crate::transport::tcp::wire::HEADER_LEN;

/// Warnings a flood could repeat without end.
static LIMIT_REFUSED: LogLimiter = LogLimiter::per_second(5);
static ACCEPT_FAILED: LogLimiter = LogLimiter::per_second(5);
static SPAWN_FAILED: LogLimiter = LogLimiter::per_second(5);
/// Connections accepted per poller turn, so parked connections are read between bursts of accepts.
const ACCEPT_BURST: usize = 64;
/// epoll tokens of the listener and of the wake-up eventfd (connection ids start at 1 and never reach these).
pub(super) const LISTENER_TOKEN: u64 = u64::MAX;
pub(super) const WAKE_TOKEN: u64 = u64::MAX - 1;

impl Shared {
    pub(super) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 into the eventfd this struct owns.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), std::ptr::addr_of!(one).cast(), 8) };
    }

    /// Closes a connection this thread owns (parked ones are closed through [`Shared::evict`] or the poller).
    pub(super) fn close(&self, conn: Conn) {
        let mut registry = lock(&self.registry);
        registry.forget(conn.id);
        self.drained.notify_all();
        drop(registry);
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Removes a parked connection and closes it. Poller only (it holds `registry`).
    pub(super) fn evict(&self, registry: &mut Registry, id: u64) -> Option<Conn> {
        let parked = registry.parked.remove(&id)?;
        let _ = epoll_control(&self.epoll, libc::EPOLL_CTL_DEL, parked.conn.stream.as_raw_fd(), 0);
        registry.forget(id);
        self.drained.notify_all();
        Some(parked.conn)
    }

    /// Hands a connection back to the poller: it waits for its next request, or for its peer to move the request
    /// in hand on, holding no thread.
    pub(super) fn park(&self, conn: Conn, waiting: Waiting) {
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
    pub(super) fn dispatch(self: &Arc<Self>, conn: Conn) {
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

pub(super) fn poll_loop(listener: TcpListener, shared: Arc<Shared>) {
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
