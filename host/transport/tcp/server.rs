//! The TCP data server: serves Mooncake READ/WRITE requests against the engine's registered memory.
//!
//! Owns the listener, one thread per connection, and the per-request bounds check. It reads the engine's
//! [`BufferSet`] under its lock at the start of every request, so it serves exactly the memory registered at that
//! moment; it never registers or changes anything.
//!
//! Framing (docs/mooncake.md section 4): connections are persistent; a request whose range is not inside one
//! registered buffer (zero size and overflow included) is answered with `REJECTED` in v2 and the connection closed,
//! in v1 just closed; memory is not touched. Replies are coalesced: the statuses and READ payloads of requests that
//! arrived together leave in one `writev`, flushed before the server waits for more input.
//!
//! Bounded waits: a connection idle between requests is closed after `idle_timeout`; one that stalls inside a
//! request (half a header, half a payload, a reader that stops reading) after `io_timeout`. Each connection has its
//! own thread, so a slow or dead client holds only that thread.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::io::{iovec, write_all_vectored, Inbound, Patience, MAX_IOVECS};
use super::wire::{RequestHeader, Status, WireOpcode, WireVersion, HEADER_LEN, STATUS_LEN};
use crate::transfer::BufferSet;

/// The engine's registered memory, shared with the server.
pub type SharedMemory = Arc<RwLock<BufferSet>>;

static OK_FRAME: [u8; STATUS_LEN] = Status::OK.encode();
static REJECTED_FRAME: [u8; STATUS_LEN] = Status::REJECTED.encode();

/// Limits of the data server.
#[derive(Clone, Debug)]
pub struct ServerLimits {
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// A request that makes no progress for this long closes its connection.
    pub io_timeout: Duration,
    /// Connections served at once; more are accepted and closed at once.
    pub max_connections: usize,
    /// Socket timeout between checks of the stop flag.
    pub tick: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            idle_timeout: Duration::from_secs(300),
            io_timeout: Duration::from_secs(30),
            max_connections: 1024,
            tick: Duration::from_millis(500),
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
    /// Clones of the live connections, so a stop can shut them down.
    connections: Mutex<HashMap<u64, TcpStream>>,
    drained: Condvar,
    next_connection: AtomicU64,
    /// Requests served per framing (v1, v2) and rejected, for tests and logs.
    served: [AtomicU64; 2],
    rejected: AtomicU64,
}

/// A running data server; dropping it stops the listener and every connection.
#[derive(Debug)]
pub struct TcpDataServer {
    address: SocketAddr,
    shared: Arc<Shared>,
    listener_fd: i32,
    acceptor: Option<JoinHandle<()>>,
}

impl TcpDataServer {
    /// Binds `address` (port 0 picks a free port) and starts serving `memory`.
    pub fn start(address: SocketAddr, memory: SharedMemory, limits: ServerLimits) -> Result<Self, ServerError> {
        let listener = TcpListener::bind(address).map_err(|source| ServerError::Bind { address, source })?;
        let address = listener.local_addr().map_err(|source| ServerError::Setup { operation: "local_addr", source })?;
        let shared = Arc::new(Shared {
            memory,
            limits,
            stopping: AtomicBool::new(false),
            connections: Mutex::new(HashMap::new()),
            drained: Condvar::new(),
            next_connection: AtomicU64::new(1),
            served: [AtomicU64::new(0), AtomicU64::new(0)],
            rejected: AtomicU64::new(0),
        });
        let listener_fd = listener.as_raw_fd();
        let acceptor = std::thread::Builder::new()
            .name("tcp-accept".into())
            .spawn({
                let shared = shared.clone();
                move || accept_loop(listener, shared)
            })
            .map_err(|source| ServerError::Setup { operation: "spawn acceptor", source })?;
        tracing::info!(%address, "tcp data server listening");
        Ok(TcpDataServer { address, shared, listener_fd, acceptor: Some(acceptor) })
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

    /// Connections being served now.
    pub fn connections(&self) -> usize {
        lock(&self.shared.connections).len()
    }
}

impl Drop for TcpDataServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // SAFETY: `listener_fd` is the listener owned by the acceptor thread, still open (the thread closes it only
        // after returning, which it does once this shutdown wakes its accept). shutdown(2) on a listening socket
        // makes a blocked accept(2) return with an error on Linux.
        unsafe {
            libc::shutdown(self.listener_fd, libc::SHUT_RDWR);
        }
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let mut connections = lock(&self.shared.connections);
        for stream in connections.values() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        // The connection threads notice within one tick; wait for them so no request touches memory after the
        // engine that owns it is gone. Bounded: a thread blocked in a copy finishes it in microseconds.
        let deadline = Instant::now() + self.shared.limits.tick * 4 + Duration::from_secs(1);
        while !connections.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(connections = connections.len(), "tcp data server stopped with connections still open");
                break;
            }
            connections = self.shared.drained.wait_timeout(connections, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                tracing::warn!(%error, "tcp data server: accept failed");
                // Out of descriptors and the like: back off instead of spinning.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let id = shared.next_connection.fetch_add(1, Ordering::Relaxed);
        {
            let mut connections = lock(&shared.connections);
            if connections.len() >= shared.limits.max_connections {
                tracing::warn!(%peer, limit = shared.limits.max_connections, "tcp data server: connection limit reached");
                continue;
            }
            match stream.try_clone() {
                Ok(clone) => connections.insert(id, clone),
                Err(error) => {
                    tracing::warn!(%peer, %error, "tcp data server: cannot track connection");
                    continue;
                }
            };
        }
        let spawned = std::thread::Builder::new().name("tcp-serve".into()).spawn({
            let shared = shared.clone();
            move || {
                match serve_connection(&stream, &shared) {
                    Ok(()) => tracing::trace!(%peer, "tcp connection closed by peer"),
                    Err(error) => tracing::debug!(%peer, %error, "tcp connection ended"),
                }
                let _ = stream.shutdown(std::net::Shutdown::Both);
                let mut connections = lock(&shared.connections);
                connections.remove(&id);
                shared.drained.notify_all();
            }
        });
        if let Err(error) = spawned {
            tracing::warn!(%peer, %error, "tcp data server: cannot start a connection thread");
            lock(&shared.connections).remove(&id);
        }
    }
}

/// Replies waiting to be written: statuses (static frames) and READ payloads (registered memory).
struct Outbound {
    iovecs: Vec<libc::iovec>,
    bytes: usize,
    /// Whether a queued reply reads registered memory (a READ payload): a later WRITE on the same connection must
    /// not change that memory before the reply has left.
    holds_memory: bool,
}

/// Flush when this much is queued even if more requests are buffered.
const OUTBOUND_FLUSH_BYTES: usize = 8 << 20;

impl Outbound {
    fn push_status(&mut self, frame: &'static [u8; STATUS_LEN]) {
        self.iovecs.push(iovec(frame.as_ptr(), STATUS_LEN));
        self.bytes += STATUS_LEN;
    }

    fn push_memory(&mut self, addr: *const u8, len: usize) {
        self.iovecs.push(iovec(addr, len));
        self.bytes += len;
        self.holds_memory = true;
    }

    fn is_full(&self) -> bool {
        self.iovecs.len() + 2 > MAX_IOVECS || self.bytes >= OUTBOUND_FLUSH_BYTES
    }

    fn flush(&mut self, fd: i32, patience: &mut Patience<'_>) -> io::Result<()> {
        if self.iovecs.is_empty() {
            return Ok(());
        }
        // SAFETY: the iovecs point at the static status frames or at READ ranges that were inside a registered
        // buffer when their request was checked (the `register_memory` contract keeps them valid until
        // unregistered; a range unmapped since is reported by the kernel as EFAULT, not a crash).
        let result = unsafe { write_all_vectored(fd, &mut self.iovecs, patience) };
        self.iovecs.clear();
        self.bytes = 0;
        self.holds_memory = false;
        result
    }
}

fn serve_connection(stream: &TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(shared.limits.tick))?;
    stream.set_write_timeout(Some(shared.limits.tick))?;
    let fd = stream.as_raw_fd();
    let mut inbound = Inbound::new(fd, 256 * 1024);
    let mut outbound = Outbound { iovecs: Vec::with_capacity(MAX_IOVECS), bytes: 0, holds_memory: false };
    let mut patience = Patience::new("idle", shared.limits.idle_timeout, Some(&shared.stopping));
    loop {
        if inbound.buffered() < HEADER_LEN || outbound.is_full() {
            // About to wait for input (or holding a lot): the peer must see every reply queued so far first.
            patience.restart("write replies", shared.limits.io_timeout);
            outbound.flush(fd, &mut patience)?;
        }
        if inbound.buffered() == 0 {
            patience.restart_idle("read request header", shared.limits.idle_timeout, shared.limits.io_timeout);
        } else {
            patience.restart("read request header", shared.limits.io_timeout);
        }
        let Some(bytes) = inbound.frame::<HEADER_LEN>(&mut patience)? else {
            return Ok(());
        };
        let header = RequestHeader::decode(&bytes);
        let checked = {
            let memory = shared.memory.read().unwrap_or_else(|p| p.into_inner());
            memory.find_containing(header.addr, header.size).map(|_| ())
        };
        let length = match (checked, usize::try_from(header.size)) {
            (Ok(()), Ok(length)) => length,
            (checked, _) => {
                shared.rejected.fetch_add(1, Ordering::Relaxed);
                let reason = checked.err().map(|e| e.to_string()).unwrap_or_else(|| "size exceeds usize".into());
                tracing::warn!(addr = header.addr, size = header.size, opcode = ?header.opcode,
                    version = ?header.version, %reason, "tcp data server: request rejected");
                if header.version == WireVersion::V2 {
                    outbound.push_status(&REJECTED_FRAME);
                    patience.restart("write rejection", shared.limits.io_timeout);
                    outbound.flush(fd, &mut patience)?;
                }
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("rejected request: {reason}")));
            }
        };
        let addr = header.addr as *mut u8;
        match header.opcode {
            WireOpcode::Write => {
                patience.restart("read write payload", shared.limits.io_timeout);
                if inbound.buffered() < length || outbound.holds_memory {
                    // We may block on the socket: let the peer have the replies queued so far. And a READ reply
                    // still queued must leave before this WRITE changes memory it may cover (requests on one
                    // connection take effect in order).
                    outbound.flush(fd, &mut patience)?;
                }
                // SAFETY: `[addr, addr + length)` lies inside one buffer registered with the engine (checked just
                // above under the registry lock); `register_memory`'s contract makes it writable process memory.
                unsafe { inbound.payload(addr, length, &mut patience)? };
                if header.version == WireVersion::V2 {
                    // The OK frame leaves only after the last byte is in memory (the copy above has returned).
                    outbound.push_status(&OK_FRAME);
                }
            }
            WireOpcode::Read => {
                if header.version == WireVersion::V2 {
                    outbound.push_status(&OK_FRAME);
                }
                outbound.push_memory(addr, length);
            }
        }
        shared.served[version_index(header.version)].fetch_add(1, Ordering::Relaxed);
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
