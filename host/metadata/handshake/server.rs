//! The handshake server on the RPC port.
//!
//! It accepts connections on the service runtime, reads one frame per connection (bounded), answers it with the
//! same form and type, shuts its write side (`SHUT_WR`) and waits, bounded, for the client to close. Anything that is
//! not a frame with a JSON payload (an HTTP request, a TLS ClientHello, garbage, an oversize length) is logged with
//! the reason and the connection is closed without a reply, as Mooncake does; the server keeps serving.
//!
//! Admission ([`HandshakeLimits`]): the whole request frame must arrive within `request_timeout` (1 s) of the
//! accept, slow bytes or not. One source (an IPv4 address, an IPv6 /64) holds at most `max_per_source` (32)
//! connections and all of them at most `max_connections` (256). A connection over a limit evicts the oldest
//! connection of its source (over the per-source limit) or of all (over the total) that is not being answered:
//! still waiting for its request, or answered and waiting for the client's close. A legitimate client sends its
//! frame as it connects, so it is not the oldest for long; a flood of idle or reconnecting connections evicts its
//! own. With nothing to evict, the new connection is closed. Each connection is a task, never a thread.
//!
//! A Connection request answered by a handler (the aiv transport's RDMA route) runs on a blocking thread: at most
//! `max_connection_handlers` (4) such calls run at once; a request over that is refused at once, with a reply whose
//! `reply_msg` says the server is busy, and never queued. A handler's refusal, failure or timeout is a reply with the
//! reason in `reply_msg` too (Mooncake's way of refusing a handshake), so the initiator can say why.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, TcpListener as StdTcpListener, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::{Frame, FrameKind};
pub use crate::config::HandshakeLimits;
use crate::error::{EngineError, Result};
use crate::log_limit::LogLimiter;
use crate::metadata::SegmentDescriptor;

/// Warnings a flood of connections or of hostile bytes could repeat without end.
static LIMIT_REFUSED: LogLimiter = LogLimiter::per_second(5);
static REQUEST_REFUSED: LogLimiter = LogLimiter::per_second(5);
/// Candidates an eviction considers before giving up (each one skipped has its request waiting).
const VICTIM_TRIES: usize = 8;
/// Bound on writing a reply.
const IO_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on waiting for the client to close after the reply.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// The listen backlog asked for (capped by the kernel's somaxconn), so a burst does not drop legitimate SYNs.
const LISTEN_BACKLOG: libc::c_int = 4096;
/// Notifications kept until taken; older ones are dropped first.
const MAX_NOTIFICATIONS: usize = 1024;
/// Bound on waiting for the accept loop to stop.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// A Notify message a peer sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The sender's `name` field.
    pub name: String,
    /// The sender's `notify_msg` field.
    pub message: String,
}

/// Answers a Connection request's JSON payload (Mooncake's `HandShakeDesc`), sent from the socket address given
/// (the handshake connection's source, which the handler may check the request against), with the reply payload, or
/// says why it refuses (then the reply carries the reason in `reply_msg`). Runs on a blocking thread, within
/// [`CONNECTION_HANDLER_WAIT`]; at most `handshake_max_connection_handlers` calls run at once.
pub type ConnectionHandler = dyn Fn(&Value, SocketAddr) -> std::result::Result<Value, String> + Send + Sync;

/// Bound on one Connection handler call (it may create and connect a QP).
pub const CONNECTION_HANDLER_WAIT: Duration = Duration::from_secs(5);

/// What the server answers with: the descriptor it serves and the notifications it received.
#[derive(Default)]
pub struct HandshakeState {
    descriptor: RwLock<Option<SegmentDescriptor>>,
    notifications: Mutex<VecDeque<Notification>>,
    /// The transport that answers Connection requests (the aiv transport's RDMA route), if any.
    connection_handler: RwLock<Option<Arc<ConnectionHandler>>>,
}

impl std::fmt::Debug for HandshakeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeState")
            .field("has_connection_handler", &self.connection_handler().is_some())
            .finish_non_exhaustive()
    }
}

impl HandshakeState {
    /// Sets (or clears) the descriptor Metadata requests are answered with.
    pub fn set_descriptor(&self, descriptor: Option<SegmentDescriptor>) {
        *self.descriptor.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = descriptor;
    }

    /// The descriptor Metadata requests are answered with.
    pub fn descriptor(&self) -> Option<SegmentDescriptor> {
        self.descriptor.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Sets (or clears) what answers Connection requests; without one they are answered as a TCP-only Mooncake peer
    /// does (every field empty).
    pub fn set_connection_handler(&self, handler: Option<Arc<ConnectionHandler>>) {
        *self.connection_handler.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = handler;
    }

    fn connection_handler(&self) -> Option<Arc<ConnectionHandler>> {
        self.connection_handler.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Takes the notifications received so far, oldest first.
    pub fn take_notifications(&self) -> Vec<Notification> {
        self.notifications.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).drain(..).collect()
    }

    fn push_notification(&self, notification: Notification) {
        let mut queue = self.notifications.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if queue.len() == MAX_NOTIFICATIONS {
            queue.pop_front();
        }
        queue.push_back(notification);
    }

    /// The reply payload to a request, or why the request is refused (then the connection closes with no reply).
    fn answer(&self, kind: FrameKind, request: &Value) -> std::result::Result<Value, String> {
        match kind {
            FrameKind::Metadata => {
                if let Some(peer) = request.get("name").and_then(Value::as_str) {
                    tracing::debug!(peer, "metadata handshake from peer");
                }
                // With nothing published (engine shutting down) the reply is `{}`, which no reader takes for a
                // descriptor.
                Ok(self.descriptor().map_or_else(|| json!({}), |descriptor| json!(descriptor)))
            }
            FrameKind::Probe => Ok(json!({"status": "success"})),
            FrameKind::Notify => {
                let field = |key: &str| request.get(key).and_then(Value::as_str).map(str::to_owned);
                let (Some(name), Some(message)) = (field("name"), field("notify_msg")) else {
                    return Err("a Notify payload needs string fields \"name\" and \"notify_msg\"".into());
                };
                self.push_notification(Notification { name, message });
                Ok(json!({"name": "", "notify_msg": "success"}))
            }
            // This engine has no transport that needs a connection handshake (no RDMA queue pairs): it answers as
            // a TCP-only Mooncake peer does, every field empty, which is acceptance (`reply_msg` empty).
            FrameKind::Connection => Ok(json!({
                "local_nic_path": "", "local_lid": 0, "local_gid": "", "peer_nic_path": "",
                "qp_num": [], "payload": "", "reply_msg": ""
            })),
        }
    }
}

/// A running handshake server; stops when dropped.
#[derive(Debug)]
pub struct HandshakeServer {
    local_addr: SocketAddr,
    state: Arc<HandshakeState>,
    stop: watch::Sender<bool>,
    stopped: Mutex<std::sync::mpsc::Receiver<()>>,
    is_stopped: AtomicBool,
    admission: Arc<Admission>,
}

impl HandshakeServer {
    /// Binds `host` on a random free port of `ports` (retrying on bind failure) and starts serving `state` under the
    /// default limits.
    pub fn bind(host: &str, ports: RangeInclusive<u16>, state: Arc<HandshakeState>) -> Result<HandshakeServer> {
        HandshakeServer::bind_with(host, ports, state, HandshakeLimits::default())
    }

    /// As [`HandshakeServer::bind`], under `limits`.
    pub fn bind_with(
        host: &str,
        ports: RangeInclusive<u16>,
        state: Arc<HandshakeState>,
        limits: HandshakeLimits,
    ) -> Result<HandshakeServer> {
        let start_error = |reason: String| EngineError::Metadata { operation: "start handshake server", reason };
        let ip = (host, 0)
            .to_socket_addrs()
            .map_err(|error| start_error(format!("resolve local host {host:?}: {error}")))?
            .next()
            .ok_or_else(|| start_error(format!("local host {host:?} resolves to no address")))?
            .ip();
        let listener = bind_in_range(ip, &ports).map_err(start_error)?;
        // SAFETY: listen(2) again on our own listening socket only changes its backlog.
        if unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
            return Err(start_error(format!("listen: {}", std::io::Error::last_os_error())));
        }
        listener
            .set_nonblocking(true)
            .map_err(|error| start_error(format!("make the listener non-blocking: {error}")))?;
        let local_addr = listener.local_addr().map_err(|error| start_error(error.to_string()))?;
        let runtime = crate::metadata::runtime::shared()?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener).map_err(|error| start_error(error.to_string()))?
        };
        let (stop, stop_requested) = watch::channel(false);
        let (stopped_sender, stopped) = std::sync::mpsc::sync_channel(1);
        let served = state.clone();
        let admission = Arc::new(Admission::new(limits));
        let admitting = admission.clone();
        runtime.spawn(async move {
            accept_loop(listener, served, admitting, stop_requested).await;
            let _ = stopped_sender.send(());
        });
        tracing::info!(address = %local_addr, "handshake server listening");
        Ok(HandshakeServer {
            local_addr,
            state,
            stop,
            stopped: Mutex::new(stopped),
            is_stopped: AtomicBool::new(false),
            admission,
        })
    }

    /// Connections held now.
    pub fn connections(&self) -> usize {
        self.admission.lock().connections.len()
    }

    /// Connections evicted so far to make room for newer ones.
    pub fn evicted(&self) -> u64 {
        self.admission.evicted.load(Ordering::Relaxed)
    }

    /// New connections closed at once so far because a limit was reached and nothing could be evicted.
    pub fn refused(&self) -> u64 {
        self.admission.refused.load(Ordering::Relaxed)
    }

    /// Connection requests refused so far because `max_connection_handlers` handler calls were running.
    pub fn connection_handlers_busy(&self) -> u64 {
        self.admission.handlers_busy.load(Ordering::Relaxed)
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The state it serves.
    pub fn state(&self) -> &Arc<HandshakeState> {
        &self.state
    }

    /// Stops accepting and closes the listening socket; waits (bounded) until it is closed.
    pub fn stop(&self) {
        if self.is_stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.stop.send(true);
        let stopped = self.stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if stopped.recv_timeout(STOP_WAIT).is_err() {
            tracing::warn!(address = %self.local_addr, "handshake server did not stop within {STOP_WAIT:?}");
        }
    }
}

impl Drop for HandshakeServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn bind_in_range(ip: std::net::IpAddr, ports: &RangeInclusive<u16>) -> std::result::Result<StdTcpListener, String> {
    let (low, high) = (*ports.start(), *ports.end());
    if low > high {
        return Err(format!("the RPC port range {low}..={high} is empty"));
    }
    let span = u32::from(high - low) + 1;
    let attempts = span.min(64);
    let mut last_error = String::new();
    for _ in 0..attempts {
        let port = low + (random_u32() % span) as u16;
        match StdTcpListener::bind((ip, port)) {
            Ok(listener) => return Ok(listener),
            Err(error) => last_error = format!("{ip}:{port}: {error}"),
        }
    }
    Err(format!("no free port in {low}..={high} on {ip} after {attempts} random tries (last: {last_error})"))
}

/// A random number from the standard library's per-process hash keys and the clock (no extra dependency; ports need
/// spreading, not cryptographic quality).
fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish() as u32
}

/// Where a connection is: evictable while it waits for its request or for the client's close. A connection leaves
/// `WAITING` by one compare-and-swap, either its task's (to `ANSWERING`, once the whole request has been read) or an
/// evictor's (to `EVICTED`): a request read just before an eviction is answered, never aborted half-way.
const WAITING: u8 = 0;
const ANSWERING: u8 = 1;
const CLOSING: u8 = 2;
const EVICTED: u8 = 3;

/// What the per-source limit counts by: an IPv4 address (IPv4-mapped IPv6 included) or an IPv6 /64.
fn source_of(address: &SocketAddr) -> u128 {
    match address.ip() {
        IpAddr::V4(ip) => u128::from(u32::from(ip)),
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(ip) => u128::from(u32::from(ip)),
            None => (u128::from(ip) >> 64) | (1 << 64),
        },
    }
}

#[derive(Debug)]
struct Connection {
    source: u128,
    accepted: Instant,
    phase: Arc<AtomicU8>,
    abort: Option<AbortHandle>,
    /// A duplicate of the connection's descriptor, to look (without reading) whether its request has arrived; it
    /// lives as long as this entry, so it never names another socket.
    probe: OwnedFd,
}

#[derive(Debug, Default)]
struct Table {
    connections: HashMap<u64, Connection>,
    per_source: HashMap<u128, usize>,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Connection> {
        let connection = self.connections.remove(&id)?;
        if let Some(count) = self.per_source.get_mut(&connection.source) {
            *count -= 1;
            if *count == 0 {
                self.per_source.remove(&connection.source);
            }
        }
        Some(connection)
    }

    /// The oldest connection not being answered, of `source` or of all, skipping one still waiting whose request
    /// has arrived (its task has not read it yet: it is about to be answered, not idle).
    fn victim(&self, source: Option<u128>) -> Option<u64> {
        let mut skipped: Vec<u64> = Vec::new();
        for _ in 0..VICTIM_TRIES {
            let (id, connection) = self
                .connections
                .iter()
                .filter(|(id, c)| {
                    source.is_none_or(|s| c.source == s)
                        && c.phase.load(Ordering::Acquire) != ANSWERING
                        && !skipped.contains(id)
                })
                .min_by_key(|(_, c)| c.accepted)?;
            let phase = &connection.phase;
            let evictable = phase.load(Ordering::Acquire) == CLOSING
                || (!has_pending_input(connection.probe.as_raw_fd())
                    && phase.compare_exchange(WAITING, EVICTED, Ordering::AcqRel, Ordering::Acquire).is_ok());
            if evictable {
                return Some(*id);
            }
            skipped.push(*id);
        }
        None
    }
}

/// Whether bytes are waiting to be read on `fd` (checked without blocking or consuming them).
fn has_pending_input(fd: std::os::fd::RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv(2) with MSG_PEEK writes at most one byte into `byte`.
    unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) > 0 }
}

/// The connections held, by id, and what admission has done.
#[derive(Debug)]
struct Admission {
    limits: HandshakeLimits,
    /// Connection handler calls running now, at most `limits.max_connection_handlers`.
    handlers: Arc<tokio::sync::Semaphore>,
    /// Connection requests refused because every handler permit was taken.
    handlers_busy: AtomicU64,
    table: Mutex<Table>,
    next: AtomicU64,
    evicted: AtomicU64,
    refused: AtomicU64,
}

impl Admission {
    fn new(limits: HandshakeLimits) -> Self {
        Admission {
            handlers: Arc::new(tokio::sync::Semaphore::new(limits.max_connection_handlers.max(1))),
            handlers_busy: AtomicU64::new(0),
            limits,
            table: Mutex::new(Table::default()),
            next: AtomicU64::new(1),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Admits a connection from `peer` (evicting one if a limit requires); its id and phase, or `None` if refused.
    fn admit(&self, peer: &SocketAddr, stream: &TcpStream) -> Option<(u64, Arc<AtomicU8>)> {
        let source = source_of(peer);
        // SAFETY: F_DUPFD_CLOEXEC duplicates our own open socket; a non-negative result is a descriptor nothing
        // else owns.
        let probe = unsafe { libc::fcntl(stream.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if probe < 0 {
            return None;
        }
        // SAFETY: as above.
        let probe = unsafe { OwnedFd::from_raw_fd(probe) };
        let mut evicted = Vec::new();
        let admitted = {
            let mut table = self.lock();
            let mut admitted = true;
            for scope in [Some(source), None] {
                let (held, limit) = match scope {
                    Some(source) => (table.per_source.get(&source).copied().unwrap_or(0), self.limits.max_per_source),
                    None => (table.connections.len(), self.limits.max_connections),
                };
                if held < limit.max(1) {
                    continue;
                }
                match table.victim(scope).and_then(|victim| table.remove(victim)) {
                    Some(connection) => evicted.push(connection),
                    None => {
                        admitted = false;
                        break;
                    }
                }
            }
            admitted.then(|| {
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                let phase = Arc::new(AtomicU8::new(WAITING));
                let connection =
                    Connection { source, accepted: Instant::now(), phase: phase.clone(), abort: None, probe };
                table.connections.insert(id, connection);
                *table.per_source.entry(source).or_insert(0) += 1;
                (id, phase)
            })
        };
        // Outside the lock: an aborted task's guard takes it as the task ends.
        self.evicted.fetch_add(evicted.len() as u64, Ordering::Relaxed);
        for abort in evicted.into_iter().filter_map(|connection| connection.abort) {
            abort.abort();
        }
        admitted
    }

    fn started(&self, id: u64, abort: AbortHandle) {
        let registered = match self.lock().connections.get_mut(&id) {
            Some(connection) => {
                connection.abort = Some(abort.clone());
                true
            }
            None => false,
        };
        if !registered {
            // Evicted before its task was registered.
            abort.abort();
        }
    }

    fn finished(&self, id: u64) {
        self.lock().remove(id);
    }
}

/// Removes its connection from the table when the connection's task ends, aborted or not.
struct Admitted {
    admission: Arc<Admission>,
    id: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission.finished(self.id);
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<HandshakeState>,
    admission: Arc<Admission>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Some((id, phase)) = admission.admit(&peer, &stream) else {
                        admission.refused.fetch_add(1, Ordering::Relaxed);
                        if let Some(suppressed) = LIMIT_REFUSED.admit() {
                            tracing::warn!(%peer, refused = admission.refused.load(Ordering::Relaxed), suppressed,
                                "handshake connection refused: limits reached and every connection is being \
                                 answered ({suppressed} more like this in the last second)");
                        }
                        continue;
                    };
                    let state = state.clone();
                    let guard = Admitted { admission: admission.clone(), id };
                    let serving = admission.clone();
                    let task = tokio::spawn(async move {
                        let _guard = guard;
                        serve_connection(stream, peer, &state, &phase, &serving).await;
                    });
                    admission.started(id, task.abort_handle());
                }
                Err(error) => {
                    // Out of descriptors and the like: pause instead of spinning.
                    tracing::warn!(%error, "handshake accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    tracing::debug!("handshake server stopped");
}

async fn serve_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    state: &HandshakeState,
    phase: &AtomicU8,
    admission: &Admission,
) {
    let reply = reply_to_request(&mut stream, peer, state, phase, admission).await;
    if let Some(reply) = reply {
        match tokio::time::timeout(IO_TIMEOUT, stream.write_all(&reply.encode())).await {
            Ok(Ok(())) => tracing::trace!(%peer, kind = ?reply.kind(), "handshake served"),
            Ok(Err(error)) => tracing::warn!(%peer, %error, "handshake reply not sent"),
            Err(_) => tracing::warn!(%peer, "handshake reply not sent in time"),
        }
    }
    phase.store(CLOSING, Ordering::Release);
    // Half-close, then let the client close first (bounded), as Mooncake's server does. Draining what a refused
    // client still sends makes the close a FIN rather than a reset.
    if let Err(error) = stream.shutdown().await {
        tracing::debug!(%peer, %error, "handshake shutdown(SHUT_WR) failed");
        return;
    }
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        let mut drained = 0usize;
        // Stop at EOF, on error, or after a bounded amount of extra bytes.
        while drained < 64 * 1024 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// A Connection reply that refuses, saying why: no NIC, no QP, the reason in `reply_msg`.
fn connection_refusal(reason: &str) -> Value {
    json!({
        "local_nic_path": "", "local_lid": 0, "local_gid": "", "peer_nic_path": "",
        "qp_num": [], "payload": "", "reply_msg": reason
    })
}

/// Reads one request (all of it within `request_timeout`) and builds its reply; `None` (after logging why) when the
/// request is refused.
async fn reply_to_request(
    stream: &mut TcpStream,
    peer: SocketAddr,
    state: &HandshakeState,
    phase: &AtomicU8,
    admission: &Admission,
) -> Option<Frame> {
    let request_timeout = admission.limits.request_timeout;
    let frame = match tokio::time::timeout(request_timeout, Frame::read_from_async(stream)).await {
        Ok(Ok(frame)) => frame,
        Ok(Err(error)) => {
            if let Some(suppressed) = REQUEST_REFUSED.admit() {
                tracing::warn!(%peer, %error, suppressed, "handshake request refused");
            }
            return None;
        }
        Err(_) => {
            tracing::debug!(%peer, timeout = ?request_timeout, "handshake request refused: no complete frame in time");
            return None;
        }
    };
    if phase.compare_exchange(WAITING, ANSWERING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        // Evicted as the last byte arrived: the abort is on its way; answer nothing.
        return None;
    }
    let kind = frame.kind();
    let request: Value = match serde_json::from_slice(&frame.payload) {
        Ok(value) => value,
        Err(error) => {
            if let Some(suppressed) = REQUEST_REFUSED.admit() {
                tracing::warn!(%peer, ?kind, %error, suppressed, "handshake request refused: payload is not JSON");
            }
            return None;
        }
    };
    let answer = match (kind, state.connection_handler()) {
        (FrameKind::Connection, Some(handler)) => {
            let answer = match admission.handlers.clone().try_acquire_owned() {
                Err(_) => {
                    let busy = admission.handlers_busy.fetch_add(1, Ordering::Relaxed) + 1;
                    Err(format!(
                        "busy: {} connection handshakes are being answered (aiv.handshake_max_connection_handlers); \
                         try again later ({busy} refused so far)",
                        admission.limits.max_connection_handlers
                    ))
                }
                Ok(permit) => {
                    // The permit lives as long as the call, even one that outlives the wait below.
                    let call = tokio::task::spawn_blocking(move || {
                        let _permit = permit;
                        handler(&request, peer)
                    });
                    match tokio::time::timeout(CONNECTION_HANDLER_WAIT, call).await {
                        Ok(Ok(answer)) => answer,
                        Ok(Err(error)) => Err(format!("the connection handler failed: {error}")),
                        Err(_) => {
                            Err(format!("the connection handler did not answer within {CONNECTION_HANDLER_WAIT:?}"))
                        }
                    }
                }
            };
            // A refusal is a reply naming why (Mooncake's `reply_msg`), so the initiator can report it.
            Ok(answer.unwrap_or_else(|reason| {
                if let Some(suppressed) = REQUEST_REFUSED.admit() {
                    tracing::warn!(%peer, %reason, suppressed, "connection handshake refused");
                }
                connection_refusal(&reason)
            }))
        }
        _ => state.answer(kind, &request),
    };
    match answer {
        Ok(payload) => Some(frame.reply(payload.to_string().into_bytes())),
        Err(reason) => {
            if let Some(suppressed) = REQUEST_REFUSED.admit() {
                tracing::warn!(%peer, ?kind, %reason, suppressed, "handshake request refused");
            }
            None
        }
    }
}
