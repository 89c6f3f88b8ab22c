//! The embedded HTTP metadata server (`aiv metadata-server`), following Mooncake's REST rules exactly
//! (docs/mooncake.md section 2):
//!
//! - `GET /metadata?key=K`: 200 with the stored body, or 404;
//! - `PUT /metadata?key=K`: stores the raw body, 200; a PUT to an existing key containing `rpc_meta` is refused with
//!   400 "Duplicate rpc_meta key not allowed";
//! - `DELETE /metadata?key=K`: 200, or 404;
//! - a missing or blank key: 400 (checked first, whatever the method); any other method: 405; any other path: 404.
//!
//! Keys are trimmed of surrounding whitespace and every reply is labelled `application/json`, with the texts of
//! Mooncake's `http_metadata_server.py`. Values live in memory for the life of the process.
//!
//! The store is bounded ([`StoreLimits`]): a body above `max_body_bytes` is refused with 413, a PUT that would take
//! the store past `max_total_bytes` (keys and values together) or past `max_keys` keys with 507, each with a body
//! naming the limit; replacing a key counts only the difference.
//!
//! The server is bounded ([`MetadataServerLimits`]), so no client, slow, broken or hostile, can hold it:
//!
//! - connections: at most `max_connections` held at once; a connection over the cap evicts one that is waiting (never
//!   sent a request first, then idle between requests, then stalled inside a body; oldest first; see
//!   [`super::admission`]), else it is closed. When accepting fails for want of descriptors (`EMFILE`, `ENFILE`)
//!   up to 16 waiting connections are evicted the same way to free theirs; with none to evict, failed accepts back
//!   off (5 ms doubling to 500 ms). Failed accepts are logged through a rate limiter.
//! - time: each request, headers and body, must arrive within `request_timeout` of the moment its connection started
//!   waiting for it (the accept, or the previous reply); slow bytes do not extend it. A connection idle that long is
//!   closed, and so is one whose reply has not been taken (read by the client) by then.
//! - memory: request bodies being read draw on one budget of `max_buffered_bytes` shared by all connections. A PUT
//!   reserves its declared `Content-Length` before any byte of its body is read (a chunked body reserves as it
//!   arrives); a body that can never fit (above `max_body_bytes` or the whole budget) is refused with 413 at once, and
//!   one that does not fit now evicts a stalled body reader or is refused with 503 (`Retry-After: 1`). Bytes are held
//!   in buffers sized by what arrived, never by what was declared; hyper's read buffer of a connection is capped at
//!   64 KiB. After a large body is released the allocator is asked (within half a second) to return free memory to
//!   the system (`malloc_trim`), so a flood's memory does not stay with the process.
//!
//! Refusals are logged as warnings through rate limiters ([`crate::log_limit`]): a few lines per second, with the
//! count of the lines left out.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::admission::{Admission, Slot, ANSWERING, BODY, FRESH, IDLE};
pub use crate::config::MetadataServerLimits;
use crate::error::{EngineError, Result};
use crate::log_limit::LogLimiter;

/// Budgets of the warnings a flood could repeat without end.
static REFUSED: LogLimiter = LogLimiter::per_second(5);
static LIMIT_REFUSED: LogLimiter = LogLimiter::per_second(5);
static ACCEPT_FAILED: LogLimiter = LogLimiter::per_second(5);

/// Largest request body accepted by default.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Largest read buffer of one connection (hyper's; a request's headers must fit in it).
const READ_BUFFER_BYTES: usize = 64 << 10;
/// A released body at least this large asks the allocator to return free memory, at the next tick of
/// [`TRIM_INTERVAL`] (when the body's buffers, freed as its task ends, are all gone).
const TRIM_AFTER_BYTES: u64 = 1 << 20;
const TRIM_INTERVAL: Duration = Duration::from_millis(500);
/// Pause after a failed accept: doubles from the first to the second while accepts keep failing.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(500));
/// Waiting connections evicted at once when accepting fails for want of descriptors.
const EVICT_WHEN_OUT_OF_DESCRIPTORS: usize = 16;
/// How long a PUT that does not fit the budget waits for an evicted body reader to give its bytes back.
const BUDGET_WAIT: Duration = Duration::from_millis(100);
/// The listen backlog asked for (capped by the kernel's somaxconn).
const LISTEN_BACKLOG: libc::c_int = 4096;
/// Past a waiting connection's deadline, how long hyper's own header deadline gets to end it before the server does.
const OVERDUE_GRACE: Duration = Duration::from_millis(100);
/// Bound on waiting for the accept loop to stop.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Bounds of the server's in-memory store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// Largest body of one PUT (default 16 MiB); above it: 413.
    pub max_body_bytes: usize,
    /// Largest total of stored keys and values (default 256 MiB); a PUT past it: 507.
    pub max_total_bytes: u64,
    /// Most keys stored (default 65,536); a PUT of a new key past it: 507.
    pub max_keys: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits { max_body_bytes: MAX_BODY_BYTES, max_total_bytes: 256 << 20, max_keys: 65_536 }
    }
}

/// Accepted range of each store limit.
const LIMIT_RANGE: std::ops::RangeInclusive<u64> = 1..=(1 << 40);

impl StoreLimits {
    /// Checks every limit lies in 1..=2^40; the error names the limit, its value and the accepted range.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let limits = [
            ("max_body_bytes", self.max_body_bytes as u64),
            ("max_total_bytes", self.max_total_bytes),
            ("max_keys", self.max_keys as u64),
        ];
        for (name, value) in limits {
            if !LIMIT_RANGE.contains(&value) {
                return Err(format!(
                    "metadata store limit {name} = {value} is outside {}..={}",
                    LIMIT_RANGE.start(),
                    LIMIT_RANGE.end()
                ));
            }
        }
        Ok(())
    }
}

/// The stored values and their accounted size.
#[derive(Debug, Default)]
struct Values {
    map: HashMap<String, Bytes>,
    /// Sum of key and value lengths.
    total_bytes: u64,
}

fn entry_bytes(key: &str, value: &Bytes) -> u64 {
    (key.len() + value.len()) as u64
}

/// The request bytes all connections may hold at once.
#[derive(Debug)]
struct Budget {
    limit: u64,
    used: AtomicU64,
    /// A large body was released since the allocator was last asked to return free memory.
    released_large: AtomicBool,
}

impl Budget {
    /// Reserves `bytes` more for `reservation`; false (nothing reserved) if that would pass the limit.
    fn grow(&self, reservation: &mut Reservation, bytes: u64) -> bool {
        let reserved = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(bytes).filter(|total| *total <= self.limit)
        });
        if reserved.is_ok() {
            reservation.bytes += bytes;
        }
        reserved.is_ok()
    }
}

/// Bytes of the budget one request holds; given back when dropped (the request ends, or its task is aborted).
#[derive(Debug)]
struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        if self.bytes >= TRIM_AFTER_BYTES {
            self.budget.released_large.store(true, Ordering::Release);
        }
    }
}

/// Asks the C allocator to give free memory back to the system. glibc keeps freed blocks of its heaps (and raises
/// its mmap threshold after freeing a large mapped block, so later large bodies land in the heap too: the dynamic
/// `M_MMAP_THRESHOLD` of the mallopt(3) manual page); without this a flood of large bodies would leave its memory
/// with the process after the bodies are gone.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim(3) only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[derive(Debug)]
struct StoreState {
    values: Mutex<Values>,
    limits: StoreLimits,
    server: MetadataServerLimits,
    budget: Arc<Budget>,
    admission: Arc<Admission>,
}

type Store = Arc<StoreState>;

/// A running metadata server; stops when dropped.
#[derive(Debug)]
pub struct MetadataHttpServer {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    stopped: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    store: Store,
}

impl MetadataHttpServer {
    /// Binds `address` (port 0 picks a free port) and serves on the metadata service runtime, with the default
    /// [`StoreLimits`] and [`MetadataServerLimits`].
    pub fn start(address: SocketAddr) -> Result<MetadataHttpServer> {
        MetadataHttpServer::start_with_limits(address, StoreLimits::default())
    }

    /// As [`MetadataHttpServer::start`], with explicit store limits (checked by [`StoreLimits::validate`]).
    pub fn start_with_limits(address: SocketAddr, limits: StoreLimits) -> Result<MetadataHttpServer> {
        MetadataHttpServer::start_with(address, limits, MetadataServerLimits::default())
    }

    /// As [`MetadataHttpServer::start`], with explicit store and server limits (each checked against its range).
    pub fn start_with(
        address: SocketAddr,
        limits: StoreLimits,
        server: MetadataServerLimits,
    ) -> Result<MetadataHttpServer> {
        let start_error = |reason: String| EngineError::Metadata { operation: "start HTTP metadata server", reason };
        limits.validate().map_err(start_error)?;
        server.validate().map_err(start_error)?;
        let listener =
            std::net::TcpListener::bind(address).map_err(|error| start_error(format!("bind {address}: {error}")))?;
        // A deep accept queue (capped by the kernel's somaxconn), so a burst of connections does not drop
        // legitimate SYNs while the accept loop drains it.
        // SAFETY: listen(2) again on our own listening socket only changes its backlog.
        if unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), LISTEN_BACKLOG) } != 0 {
            return Err(start_error(format!("listen: {}", std::io::Error::last_os_error())));
        }
        listener.set_nonblocking(true).map_err(|error| start_error(error.to_string()))?;
        let local_addr = listener.local_addr().map_err(|error| start_error(error.to_string()))?;
        let runtime = super::runtime::shared()?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener).map_err(|error| start_error(error.to_string()))?
        };
        let (stop, stop_requested) = watch::channel(false);
        let (stopped_sender, stopped) = std::sync::mpsc::sync_channel(1);
        let store = Arc::new(StoreState {
            values: Mutex::new(Values::default()),
            limits,
            server: server.clone(),
            budget: Arc::new(Budget {
                limit: server.max_buffered_bytes,
                used: AtomicU64::new(0),
                released_large: AtomicBool::new(false),
            }),
            admission: Arc::new(Admission::new(server.max_connections)),
        });
        let serving = store.clone();
        runtime.spawn(async move {
            accept_loop(listener, serving, stop_requested).await;
            let _ = stopped_sender.send(());
        });
        tracing::info!(address = %local_addr, "HTTP metadata server listening");
        Ok(MetadataHttpServer { local_addr, stop, stopped: Mutex::new(Some(stopped)), store })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The connection string engines use to reach it.
    pub fn url(&self) -> String {
        format!("http://{}/metadata", self.local_addr)
    }

    /// Connections held now.
    pub fn connections(&self) -> usize {
        self.store.admission.held()
    }

    /// Connections evicted so far to make room (for a newer connection, a descriptor or buffered bytes).
    pub fn evicted(&self) -> u64 {
        self.store.admission.evicted()
    }

    /// New connections closed at once so far because the cap was reached and none could be evicted.
    pub fn refused(&self) -> u64 {
        self.store.admission.refused()
    }

    /// Request body bytes reserved now, of the `max_buffered_bytes` budget.
    pub fn buffered_bytes(&self) -> u64 {
        self.store.budget.used.load(Ordering::Acquire)
    }

    /// Blocks the calling thread until the server stops (for the CLI, which runs until killed).
    pub fn wait(&self) {
        let stopped = self.stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(stopped) = stopped {
            let _ = stopped.recv();
        }
    }

    /// Stops accepting and closes the listening socket; waits (bounded) until it is closed.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
        let stopped = self.stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(stopped) = stopped {
            if stopped.recv_timeout(STOP_WAIT).is_err() {
                tracing::warn!(address = %self.local_addr, "HTTP metadata server did not stop within {STOP_WAIT:?}");
            }
        }
    }
}

impl Drop for MetadataHttpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether a failed accept means the process (or the system) is out of descriptors or socket memory.
fn out_of_descriptors(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

async fn accept_loop(listener: TcpListener, store: Store, mut stop: watch::Receiver<bool>) {
    let mut backoff = ACCEPT_BACKOFF.0;
    let mut trim = tokio::time::interval(TRIM_INTERVAL);
    trim.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let accepted = tokio::select! {
            _ = stop.changed() => break,
            _ = trim.tick() => {
                if store.budget.released_large.swap(false, Ordering::AcqRel) {
                    trim_heap();
                }
                continue;
            }
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = ACCEPT_BACKOFF.0;
                serve(stream, peer, &store);
            }
            Err(error) => {
                // Out of descriptors: waiting connections give theirs back, a few at once since more connections
                // are likely queued behind this one (their tasks are aborted; each descriptor closes as its task
                // ends, which the yield lets happen before the next accept).
                let mut freed = 0;
                if out_of_descriptors(&error) {
                    while freed < EVICT_WHEN_OUT_OF_DESCRIPTORS && store.admission.evict_one(&[FRESH, IDLE, BODY]) {
                        freed += 1;
                    }
                }
                if let Some(suppressed) = ACCEPT_FAILED.admit() {
                    tracing::warn!(%error, evicted = freed, suppressed,
                        "HTTP metadata accept failed; {} ({suppressed} more like this in the last second)",
                        if freed > 0 { "evicted waiting connections for their descriptors" } else { "backing off" });
                }
                if freed > 0 {
                    tokio::task::yield_now().await;
                    continue;
                }
                let pause = backoff;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
                tokio::select! {
                    _ = stop.changed() => break,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// Admits a connection and serves it on its own task.
fn serve(stream: tokio::net::TcpStream, peer: SocketAddr, store: &Store) {
    let admission = store.admission.clone();
    let Ok((stream, id, slot)) = admission.admit(stream) else {
        if let Some(suppressed) = LIMIT_REFUSED.admit() {
            tracing::warn!(%peer, refused = admission.refused(), suppressed,
                "HTTP metadata connection refused: {} connections held (max_connections) and every one is \
                 answering ({suppressed} more like this in the last second)", store.server.max_connections);
        }
        return;
    };
    let store = store.clone();
    let task = tokio::spawn(async move {
        let timeout = store.server.request_timeout;
        let connection_slot = slot.clone();
        let service = hyper::service::service_fn(move |request| {
            let store = store.clone();
            let slot = slot.clone();
            async move { Ok::<_, Infallible>(answer(request, &store, &slot).await) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(timeout).max_buf_size(READ_BUFFER_BYTES);
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        tokio::select! {
            served = connection => {
                if let Err(error) = served {
                    tracing::debug!(%peer, %error, phase = connection_slot.phase(),
                        "HTTP metadata connection ended with an error");
                }
            }
            () = overdue(&connection_slot, timeout) => {
                tracing::debug!(%peer, "HTTP metadata connection closed: its reply was not taken, or its next request \
                    did not come, within the request deadline");
            }
        }
    });
    admission.started(id, task.abort_handle());
}

/// Completes when a connection waiting between requests (a reply being written, or the next request's headers
/// being read) is past its deadline: `timeout` from its last reply, and a moment of grace for hyper's own header
/// deadline to end it first. hyper has no deadline on writing a reply; this is it, so a client that never reads
/// cannot hold its connection. Body reads and answers have their own bounds: it only looks again after them.
async fn overdue(slot: &Slot, timeout: Duration) {
    loop {
        let deadline = slot.deadline(timeout) + OVERDUE_GRACE;
        if std::time::Instant::now() < deadline {
            tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await;
            continue;
        }
        if matches!(slot.phase(), FRESH | IDLE) {
            return;
        }
        tokio::time::sleep(timeout).await;
    }
}

/// One request, between the connection's phases: answering (or reading a body) while it is handled, idle after.
async fn answer(request: Request<Incoming>, store: &Store, slot: &Slot) -> Response<Full<Bytes>> {
    if !slot.begin(ANSWERING) {
        // Evicted as the request arrived: its task is being aborted.
        return closing(reply(StatusCode::SERVICE_UNAVAILABLE, "connection evicted: server busy"));
    }
    let response = handle(request, store, slot).await;
    slot.rest();
    response
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}

/// `response`, closing its connection after it (the request's body was not read to its end).
fn closing(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    response.headers_mut().insert(CONNECTION, hyper::header::HeaderValue::from_static("close"));
    response
}

/// A refusal of a PUT: logged (rate-limited) and answered with `status` and `body`.
fn refuse(status: StatusCode, key: &str, body: String) -> Response<Full<Bytes>> {
    if let Some(suppressed) = REFUSED.admit() {
        tracing::warn!(
            status = status.as_u16(),
            key,
            reason = %body,
            suppressed,
            "HTTP metadata PUT refused ({suppressed} more like this in the last second)"
        );
    }
    reply(status, body)
}

/// The `key` query parameter, percent-decoded (`+` is a space, as in form encoding); `None` when absent.
fn key_of(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (name == "key").then(|| {
            let spaced = value.replace('+', " ");
            percent_encoding::percent_decode_str(&spaced).decode_utf8_lossy().into_owned()
        })
    })
}

/// The declared body length: `Some(n)` from a valid `Content-Length`, `None` without one (a chunked body).
fn declared_length(request: &Request<Incoming>) -> Option<u64> {
    request.headers().get(CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// Reads a PUT's body under the store's and the server's limits, by `deadline`; the refusal to send otherwise.
async fn read_body(
    request: Request<Incoming>,
    key: &str,
    store: &Store,
    slot: &Slot,
) -> std::result::Result<Bytes, Response<Full<Bytes>>> {
    let max_body = store.limits.max_body_bytes as u64;
    let max_buffered = store.server.max_buffered_bytes;
    let too_large = |length: u64| {
        let limit = if length > max_body {
            format!("the limit of {max_body} bytes (max_body_bytes)")
        } else {
            format!("the server's budget of {max_buffered} buffered request bytes (max_buffered_bytes)")
        };
        closing(refuse(StatusCode::PAYLOAD_TOO_LARGE, key, format!("body of {length} bytes or more is above {limit}")))
    };
    let declared = declared_length(&request);
    if let Some(length) = declared.filter(|length| *length > max_body.min(max_buffered)) {
        return Err(too_large(length));
    }
    let mut reservation = Reservation { budget: store.budget.clone(), bytes: 0 };
    reserve(&mut reservation, declared.unwrap_or(0), key, store, slot).await?;
    let deadline = tokio::time::Instant::from_std(slot.deadline(store.server.request_timeout));
    let mut body = request.into_body();
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut received = 0u64;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            Ok(Some(Err(error))) => {
                return Err(closing(refuse(StatusCode::BAD_REQUEST, key, format!("could not read the body: {error}"))))
            }
            Err(_) => {
                let reason = format!(
                    "the request did not arrive within {} ms (request_timeout_ms)",
                    store.server.request_timeout.as_millis()
                );
                return Err(closing(refuse(StatusCode::REQUEST_TIMEOUT, key, reason)));
            }
        };
        let Ok(data) = frame.into_data() else { continue };
        received += data.len() as u64;
        if received > max_body.min(max_buffered) {
            return Err(too_large(received));
        }
        if received > reservation.bytes {
            let more = received - reservation.bytes;
            reserve(&mut reservation, more, key, store, slot).await?;
        }
        chunks.push(data);
    }
    // One buffer of exactly what arrived (a single chunk may share a larger read buffer of hyper's).
    let mut value = Vec::with_capacity(received as usize);
    for chunk in chunks {
        value.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(value))
}

/// Reserves `bytes` more of the budget; when it does not fit, evicts the connection stalled longest inside a body
/// and waits (bounded) for its bytes; the 503 to send if they still do not fit. The connection reads its body (is
/// evictable) only while it holds its reservation, never while it waits for one, so it cannot evict itself.
async fn reserve(
    reservation: &mut Reservation,
    bytes: u64,
    key: &str,
    store: &Store,
    slot: &Slot,
) -> std::result::Result<(), Response<Full<Bytes>>> {
    let evicted = || closing(reply(StatusCode::SERVICE_UNAVAILABLE, "connection evicted: server busy"));
    if slot.phase() == BODY && !slot.advance(BODY, ANSWERING) {
        return Err(evicted());
    }
    let mut reserved = store.budget.grow(reservation, bytes);
    let started = tokio::time::Instant::now();
    while !reserved && started.elapsed() < BUDGET_WAIT {
        store.admission.evict_one(&[BODY]);
        tokio::time::sleep(Duration::from_millis(2)).await;
        reserved = store.budget.grow(reservation, bytes);
    }
    if reserved {
        return if slot.advance(ANSWERING, BODY) { Ok(()) } else { Err(evicted()) };
    }
    let reason = format!(
        "server busy: request bodies being read hold {} of its {} bytes (max_buffered_bytes); retry later",
        store.budget.used.load(Ordering::Acquire),
        store.server.max_buffered_bytes
    );
    let mut response = closing(refuse(StatusCode::SERVICE_UNAVAILABLE, key, reason));
    response.headers_mut().insert(RETRY_AFTER, hyper::header::HeaderValue::from_static("1"));
    Err(response)
}

async fn handle(request: Request<Incoming>, store: &Store, slot: &Slot) -> Response<Full<Bytes>> {
    if request.uri().path() != "/metadata" {
        return reply(StatusCode::NOT_FOUND, "404: Not Found");
    }
    let key = match key_of(request.uri().query()) {
        Some(key) if !key.trim().is_empty() => key.trim().to_owned(),
        _ => return reply(StatusCode::BAD_REQUEST, "metadata key is required"),
    };
    let method = request.method().clone();
    if !matches!(method, Method::GET | Method::PUT | Method::DELETE) {
        let mut response = reply(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed");
        response.headers_mut().insert(ALLOW, hyper::header::HeaderValue::from_static("GET, PUT, DELETE"));
        return response;
    }
    let lock = || store.values.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let limits = store.limits;
    match method {
        Method::GET => match lock().map.get(&key).cloned() {
            Some(value) => reply(StatusCode::OK, value),
            None => reply(StatusCode::NOT_FOUND, "metadata not found"),
        },
        Method::PUT => {
            let body = match read_body(request, &key, store, slot).await {
                Ok(body) => body,
                Err(refusal) => return refusal,
            };
            if !slot.advance(BODY, ANSWERING) {
                return closing(reply(StatusCode::SERVICE_UNAVAILABLE, "connection evicted: server busy"));
            }
            let mut values = lock();
            let old = values.map.get(&key).map(|old| entry_bytes(&key, old));
            if key.contains("rpc_meta") && old.is_some() {
                return refuse(StatusCode::BAD_REQUEST, &key, "Duplicate rpc_meta key not allowed".to_owned());
            }
            if old.is_none() && values.map.len() >= limits.max_keys {
                let reason = format!("store full: it holds {} keys, the limit (max_keys)", limits.max_keys);
                return refuse(StatusCode::INSUFFICIENT_STORAGE, &key, reason);
            }
            let total = values.total_bytes - old.unwrap_or(0) + entry_bytes(&key, &body);
            if total > limits.max_total_bytes {
                let reason = format!(
                    "store full: this value would take it to {total} bytes, above the limit of {} bytes \
                     (max_total_bytes)",
                    limits.max_total_bytes
                );
                return refuse(StatusCode::INSUFFICIENT_STORAGE, &key, reason);
            }
            values.total_bytes = total;
            values.map.insert(key, body);
            reply(StatusCode::OK, "metadata updated")
        }
        _ => {
            let mut values = lock();
            match values.map.remove(&key) {
                Some(old) => {
                    values.total_bytes -= entry_bytes(&key, &old);
                    reply(StatusCode::OK, "metadata deleted")
                }
                None => reply(StatusCode::NOT_FOUND, "metadata not found"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::key_of;

    #[test]
    fn key_parameter_is_decoded() {
        assert_eq!(key_of(Some("key=mooncake%2Fram%2Fa%3A1")).as_deref(), Some("mooncake/ram/a:1"));
        assert_eq!(key_of(Some("x=1&key=a+b%20c")).as_deref(), Some("a b c"));
        assert_eq!(key_of(Some("key=")).as_deref(), Some(""));
        assert_eq!(key_of(Some("key")).as_deref(), Some(""));
        assert_eq!(key_of(Some("other=1")), None);
        assert_eq!(key_of(None), None);
    }
}
