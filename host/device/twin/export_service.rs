//! Cross-process export of twin HBM: a Unix-domain socket per twin device that hands the memfd of an exported region
//! to an authenticated peer process (SCM_RIGHTS), and the client side that imports through it.
//!
//! Owns: the listening socket (abstract namespace, named in the device's advertisement as `export_endpoint`), its
//! serving thread, the per-device secret, the table of exports this device still offers. Must not touch the device's
//! windows or imports (the device maps what the client returns).
//!
//! Security model (twin): a request is served only if (1) the connecting process has this process's effective uid
//! (SO_PEERCRED; its pid is logged) and (2) it presents the device's secret: 256 bits from the kernel CSPRNG
//! (getrandom(2)), published in the segment descriptor's `aiv` object. The descriptor is therefore a capability:
//! whoever can read the metadata and connect as the same uid can import. A withdrawn export is refused to new
//! imports; mappings made before stay valid (the memfd keeps its pages alive). The memfd grants the whole exported
//! region; the uid check is the real boundary (a same-uid process could also ptrace this one).
//!
//! Admission (server): one thread serves every connection (poll(2); no thread per connection). Credentials come
//! first: a connection from another uid is closed as soon as it is accepted and never counts against a limit. An
//! admitted connection must deliver its whole request line within [`ExportLimits::first_request_timeout`] of being
//! accepted (default 500 ms), else it is answered with an error and closed. At most
//! [`ExportLimits::max_per_process`] connections of one pid, [`ExportLimits::max_per_uid`] of one uid and
//! [`ExportLimits::max_connections`] in all wait for their request at once; a connection over one of these evicts
//! the oldest waiting one of the same group, which is answered "busy" (a legitimate client sends its request as
//! soon as it is connected, so the oldest waiting connection is the one most likely idle). Clients retry "busy".
//!
//! Wire: one request line of JSON (at most [`MAX_REQUEST_BYTES`]): `{"op":"import","export_id":N,"secret":"hex"}` or
//! `{"op":"ping","secret":"hex"}`; one reply line of JSON `{"ok":true,"device":..,"length":N}` (the memfd attached to
//! it for an import) or `{"ok":false,"error":".."}` (`"busy: .."` when the service evicted the connection).
//!
//! Client ([`import`], [`ping`]): ONE deadline per operation, not per read: the connect (a full listen backlog is
//! waited for, bounded), every retry after a "busy" answer or a full backlog, the request and the whole reply all
//! happen within the `timeout` the caller passes (the twin device passes [`ExportLimits::client_timeout`], 2 s by
//! default). Past it the operation fails with `TimedOut` (or `ResourceBusy` when the service stayed busy); a refused
//! connection (nobody listens on the name: the exporter is gone) fails at once with `ConnectionRefused`.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::log_limit::LogLimiter;

/// Largest request line the server reads.
pub const MAX_REQUEST_BYTES: u64 = 1024;
/// Connections accepted per turn of the serving loop, so waiting connections are read between bursts of accepts.
const ACCEPT_BURST: usize = 32;
/// Bound of the server's reply write (a reply is one short line into an empty socket buffer).
const REPLY_TIMEOUT: Duration = Duration::from_millis(200);
/// Warnings of connections refused for their uid, and of requests refused: a flood must not flood the log.
static WRONG_UID: LogLimiter = LogLimiter::per_second(5);
static REQUEST_REFUSED: LogLimiter = LogLimiter::per_second(5);
/// First and longest pause between a client's retries after a "busy" answer.
const RETRY_PAUSE: (Duration, Duration) = (Duration::from_millis(2), Duration::from_millis(50));

pub use crate::config::ExportLimits;

/// What an export service has done so far (for tests and logs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Requests answered (successfully or with an error), evictions and deadline closes excluded.
    pub answered: u64,
    /// Connections closed at accept because SO_PEERCRED showed another uid (or failed); they counted nowhere.
    pub refused_credentials: u64,
    /// Waiting connections evicted by a newer one over a limit (answered "busy").
    pub evicted: u64,
    /// Connections closed because no whole request arrived within the first-request deadline.
    pub timed_out: u64,
}

/// One region a device offers: `length` bytes at `offset` of a memfd.
#[derive(Clone, Debug)]
pub struct Offer {
    /// The memfd (the device's whole heap).
    pub fd: Arc<OwnedFd>,
    /// Where the region starts in the memfd.
    pub offset: u64,
    /// Bytes.
    pub length: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    op: String,
    #[serde(default)]
    export_id: Option<u64>,
    #[serde(default)]
    secret: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    length: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl Reply {
    fn error(error: String) -> Reply {
        Reply { ok: false, device: None, offset: None, length: None, error: Some(error) }
    }
}

/// The export service of one twin device.
#[derive(Debug)]
pub struct ExportService {
    endpoint: String,
    secret: String,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    identity: String,
    endpoint: String,
    secret: String,
    limits: ExportLimits,
    offers: Mutex<HashMap<u64, Offer>>,
    stop: AtomicBool,
    /// Wakes the serving thread's poll (an eventfd).
    wake: OwnedFd,
    /// A pending change of whether the socket listens, and the outcome of the last one (fault injection).
    control: Mutex<Control>,
    controlled: Condvar,
    answered: AtomicU64,
    refused_credentials: AtomicU64,
    evicted: AtomicU64,
    timed_out: AtomicU64,
}

#[derive(Debug, Default)]
struct Control {
    /// Requested: listen (true) or close the listening socket (false).
    request: Option<bool>,
    /// Set by the serving thread once the request is carried out.
    outcome: Option<Result<(), String>>,
}

/// An admitted connection waiting for its whole request line.
#[derive(Debug)]
struct Waiting {
    stream: UnixStream,
    pid: i32,
    uid: u32,
    accepted: Instant,
    line: Vec<u8>,
}

/// Random bytes from the kernel CSPRNG, hex encoded.
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut buffer = vec![0u8; bytes];
    let mut filled = 0;
    while filled < bytes {
        // SAFETY: writes at most `bytes - filled` bytes into the live buffer at offset `filled`.
        let n = unsafe { libc::getrandom(buffer.as_mut_ptr().add(filled).cast(), bytes - filled, 0) };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        filled += n as usize;
    }
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}

fn abstract_name(endpoint: &str) -> std::io::Result<&[u8]> {
    let name = endpoint.strip_prefix('@').ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("export endpoint {endpoint:?} is not '@name'"))
    })?;
    Ok(name.as_bytes())
}

fn abstract_address(endpoint: &str) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(abstract_name(endpoint)?)
}

/// (pid, uid) of the process at the other end of `stream` (SO_PEERCRED).
fn peer_credentials(stream: &UnixStream) -> std::io::Result<(i32, u32)> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into `credentials`, a ucred of exactly that size.
    let result = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(credentials).cast(),
            &mut length,
        )
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((credentials.pid, credentials.uid))
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn bind_listener(endpoint: &str) -> std::io::Result<UnixListener> {
    let listener = UnixListener::bind_addr(&abstract_address(endpoint)?)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

impl ExportService {
    /// Binds a fresh abstract socket for device `identity` and starts serving with the default limits.
    pub fn start(identity: &str) -> std::io::Result<ExportService> {
        ExportService::start_with(identity, ExportLimits::default())
    }

    /// Binds a fresh abstract socket for device `identity` and starts serving under `limits`.
    pub fn start_with(identity: &str, limits: ExportLimits) -> std::io::Result<ExportService> {
        let secret = random_hex(32)?;
        let endpoint = format!("@aiv-twin-export-{identity}-{}", random_hex(8)?);
        let listener = bind_listener(&endpoint)?;
        // SAFETY: eventfd has no memory preconditions; a non-negative result is a descriptor nothing else owns.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `wake` was just created and is owned by nothing else.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let shared = Arc::new(Shared {
            identity: identity.to_owned(),
            endpoint: endpoint.clone(),
            secret: secret.clone(),
            limits,
            offers: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            wake,
            control: Mutex::new(Control::default()),
            controlled: Condvar::new(),
            answered: AtomicU64::new(0),
            refused_credentials: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
        });
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name(super::EXPORT_THREAD_PREFIX.into())
            .spawn(move || serving.serve_loop(listener))?;
        tracing::debug!(identity, endpoint = %endpoint, "twin export service listening");
        Ok(ExportService { endpoint, secret, shared, thread: Mutex::new(Some(thread)) })
    }

    /// The socket name peers connect to (`@` + abstract name).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The secret peers must present.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The limits in force.
    pub fn limits(&self) -> &ExportLimits {
        &self.shared.limits
    }

    /// What the service has done so far.
    pub fn stats(&self) -> ExportStats {
        let shared = &self.shared;
        ExportStats {
            answered: shared.answered.load(Ordering::Relaxed),
            refused_credentials: shared.refused_credentials.load(Ordering::Relaxed),
            evicted: shared.evicted.load(Ordering::Relaxed),
            timed_out: shared.timed_out.load(Ordering::Relaxed),
        }
    }

    /// Offers `offer` under `export_id` to authenticated peers.
    pub fn offer(&self, export_id: u64, offer: Offer) {
        self.shared.offers.lock().unwrap_or_else(|p| p.into_inner()).insert(export_id, offer);
    }

    /// Withdraws an export: new imports are refused; mappings peers already made stay valid.
    pub fn withdraw(&self, export_id: u64) -> bool {
        self.shared.offers.lock().unwrap_or_else(|p| p.into_inner()).remove(&export_id).is_some()
    }

    /// Fault injection (tests): closes the listening socket (`false`: connections are refused, as when the process
    /// is gone; waiting connections are dropped) or binds the same name again (`true`). Returns once done.
    pub fn set_listening(&self, listening: bool) -> std::io::Result<()> {
        let shared = &self.shared;
        let mut control = shared.control.lock().unwrap_or_else(|p| p.into_inner());
        control.request = Some(listening);
        control.outcome = None;
        shared.wake();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(outcome) = control.outcome.take() {
                return outcome.map_err(std::io::Error::other);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "export service did not answer"));
            }
            control = shared.controlled.wait_timeout(control, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for ExportService {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

/// Milliseconds until `deadline` for poll(2), rounded up so a wake-up is never early.
fn poll_timeout(deadline: Option<Instant>) -> libc::c_int {
    match deadline {
        None => -1,
        Some(deadline) => {
            let left = deadline.saturating_duration_since(Instant::now());
            left.as_micros().div_ceil(1000).min(60_000) as libc::c_int
        }
    }
}

impl Shared {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 into the eventfd this struct owns.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), std::ptr::addr_of!(one).cast(), 8) };
    }

    fn drain_wake(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64 from the (non-blocking) eventfd this struct owns.
        let _ = unsafe { libc::read(self.wake.as_raw_fd(), std::ptr::addr_of_mut!(value).cast(), 8) };
    }

    /// The serving thread: accepts, checks credentials, admits within the limits, reads requests and answers them.
    fn serve_loop(self: Arc<Self>, listener: UnixListener) {
        let mut listener = Some(listener);
        let mut waiting: Vec<Waiting> = Vec::new();
        let mut accept_errors_until: Option<Instant> = None;
        loop {
            let next_deadline = waiting.iter().map(|w| w.accepted + self.limits.first_request_timeout).min();
            let backoff = accept_errors_until.filter(|until| *until > Instant::now());
            let mut fds = Vec::with_capacity(waiting.len() + 2);
            fds.push(libc::pollfd { fd: self.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 });
            let listening = match (&listener, backoff) {
                (Some(listener), None) => {
                    fds.push(libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 });
                    true
                }
                _ => false,
            };
            let first_waiting = fds.len();
            fds.extend(waiting.iter().map(|w| libc::pollfd {
                fd: w.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            let timeout = poll_timeout([next_deadline, backoff].into_iter().flatten().min());
            // SAFETY: `fds` is a live array of `fds.len()` pollfd records.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if ready < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                std::thread::sleep(Duration::from_millis(10));
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if fds[0].revents != 0 {
                self.drain_wake();
                self.apply_control(&mut listener, &mut waiting);
            }

            // Requests first: a connection that sent its request is answered before newer ones are accepted.
            let readable: Vec<bool> = fds[first_waiting..].iter().map(|fd| fd.revents != 0).collect();
            let mut still = Vec::with_capacity(waiting.len());
            for (mut connection, readable) in waiting.drain(..).zip(readable) {
                if readable {
                    match read_request(&mut connection) {
                        ReadOutcome::Complete => {
                            self.answer_and_close(connection);
                            continue;
                        }
                        ReadOutcome::Closed => {
                            // The peer shut its side down without a whole line: tell it why, then close.
                            self.refuse(
                                connection,
                                format!("request is not one line of at most {MAX_REQUEST_BYTES} bytes"),
                            );
                            continue;
                        }
                        ReadOutcome::Failed => continue,
                        ReadOutcome::Partial => {}
                    }
                }
                if connection.accepted.elapsed() >= self.limits.first_request_timeout {
                    self.timed_out.fetch_add(1, Ordering::Relaxed);
                    let reason =
                        format!("no whole request within {:?} of connecting", self.limits.first_request_timeout);
                    tracing::debug!(identity = %self.identity, peer_pid = connection.pid, %reason, "export connection closed");
                    self.refuse(connection, reason);
                    continue;
                }
                still.push(connection);
            }
            waiting = still;

            if listening && fds[1].revents != 0 {
                let Some(listener) = &listener else { continue };
                for _ in 0..ACCEPT_BURST {
                    let stream = match listener.accept() {
                        Ok((stream, _)) => stream,
                        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(error) => {
                            // E.g. out of descriptors: do not spin on an error that persists.
                            tracing::warn!(identity = %self.identity, %error, "export service: accept failed");
                            accept_errors_until = Some(Instant::now() + Duration::from_millis(10));
                            break;
                        }
                    };
                    // Credentials before anything is counted: another uid holds nothing here.
                    let credentials = peer_credentials(&stream);
                    let (pid, uid) = match credentials {
                        Ok((pid, uid)) if uid == effective_uid() => (pid, uid),
                        other => {
                            self.refused_credentials.fetch_add(1, Ordering::Relaxed);
                            // A flood would flood the log too.
                            if let Some(suppressed) = WRONG_UID.admit() {
                                tracing::warn!(identity = %self.identity, credentials = ?other, suppressed,
                                    refused = self.refused_credentials.load(Ordering::Relaxed),
                                    "export connection refused: not this process's uid ({suppressed} more like \
                                     this in the last second)");
                            }
                            continue;
                        }
                    };
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    self.admit(&mut waiting, Waiting { stream, pid, uid, accepted: Instant::now(), line: Vec::new() });
                }
            }
        }
    }

    /// Adds `connection` to the waiting ones, evicting the oldest of its process, of its uid, or of all that wait,
    /// while one of the limits would be exceeded.
    fn admit(&self, waiting: &mut Vec<Waiting>, connection: Waiting) {
        let limits = &self.limits;
        let groups = [
            ("process", limits.max_per_process, Some(connection.pid), None),
            ("uid", limits.max_per_uid, None, Some(connection.uid)),
            ("service", limits.max_connections, None, None),
        ];
        for (group, limit, pid, uid) in groups {
            let limit = limit.max(1);
            let member = |w: &Waiting| pid.is_none_or(|pid| w.pid == pid) && uid.is_none_or(|uid| w.uid == uid);
            while waiting.iter().filter(|w| member(w)).count() >= limit {
                // Oldest first (`waiting` is in accept order), passing over one whose request has arrived since the
                // last poll: it is answered next turn, it is not idle.
                let index = waiting
                    .iter()
                    .position(|w| member(w) && !has_pending_input(&w.stream))
                    .or_else(|| waiting.iter().position(member));
                let Some(index) = index else { break };
                let evicted = waiting.remove(index);
                self.evicted.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(identity = %self.identity, peer_pid = evicted.pid, group, limit,
                    "export connection evicted by a newer one");
                self.refuse(evicted, format!("busy: {limit} connections of this {group} already wait"));
            }
        }
        waiting.push(connection);
    }

    /// Carries out a requested change of whether the socket listens.
    fn apply_control(&self, listener: &mut Option<UnixListener>, waiting: &mut Vec<Waiting>) {
        let mut control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        let Some(listen) = control.request.take() else { return };
        let outcome = if listen {
            if listener.is_none() {
                bind_listener(&self.endpoint).map(|bound| *listener = Some(bound)).map_err(|error| error.to_string())
            } else {
                Ok(())
            }
        } else {
            *listener = None;
            waiting.clear();
            Ok(())
        };
        tracing::warn!(identity = %self.identity, listen, ?outcome, "fault injection: export socket listening changed");
        control.outcome = Some(outcome);
        self.controlled.notify_all();
    }

    /// Sends `reason` as an error line (best effort) and closes.
    fn refuse(&self, connection: Waiting, reason: String) {
        let _ = prepare_reply(&connection.stream)
            .and_then(|()| send_reply(&connection.stream, &Reply::error(reason), None));
    }

    fn answer_and_close(&self, connection: Waiting) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        let (reply, fd) = match self.answer(&connection) {
            Ok((reply, fd)) => (reply, fd),
            Err(error) => {
                if let Some(suppressed) = REQUEST_REFUSED.admit() {
                    tracing::warn!(identity = %self.identity, peer_pid = connection.pid, %error, suppressed,
                        "export request refused ({suppressed} more like this in the last second)");
                }
                (Reply::error(error), None)
            }
        };
        let sent =
            prepare_reply(&connection.stream).and_then(|()| send_reply(&connection.stream, &reply, fd.as_deref()));
        if let Err(error) = sent {
            tracing::debug!(identity = %self.identity, %error, "export reply not delivered");
        }
    }

    fn answer(&self, connection: &Waiting) -> Result<(Reply, Option<Arc<OwnedFd>>), String> {
        let pid = connection.pid;
        let line = std::str::from_utf8(&connection.line).map_err(|_| "request is not UTF-8".to_owned())?;
        let request: Request =
            serde_json::from_str(line.trim_end()).map_err(|error| format!("malformed request: {error}"))?;
        // Compare in full (no early exit) so the time taken does not reveal a matching prefix.
        let presented = request.secret.as_deref().unwrap_or("").as_bytes();
        let expected = self.secret.as_bytes();
        let matches = presented.len() == expected.len()
            && presented.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        if !matches {
            return Err(format!("peer pid {pid}: wrong secret"));
        }
        let device = Some(self.identity.clone());
        match request.op.as_str() {
            "ping" => Ok((Reply { ok: true, device, offset: None, length: None, error: None }, None)),
            "import" => {
                let id = request.export_id.ok_or("import request without export_id")?;
                let offer = self
                    .offers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| format!("export {id} is not offered (never exported or withdrawn)"))?;
                tracing::info!(identity = %self.identity, peer_pid = pid, export_id = id, "export handed to peer");
                let reply =
                    Reply { ok: true, device, offset: Some(offer.offset), length: Some(offer.length), error: None };
                Ok((reply, Some(offer.fd)))
            }
            other => Err(format!("unknown op {other:?}")),
        }
    }
}

/// Whether bytes are waiting to be read on `stream` (checked without blocking or consuming them).
fn has_pending_input(stream: &UnixStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv(2) with MSG_PEEK writes at most one byte into `byte`.
    unsafe { libc::recv(stream.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) > 0 }
}

enum ReadOutcome {
    /// A whole line (or the size limit) is in `line`.
    Complete,
    /// More may come.
    Partial,
    /// The peer closed its side before a whole line.
    Closed,
    /// The connection failed; drop it.
    Failed,
}

/// Reads what the non-blocking `connection` has, up to the end of its request line or the size limit.
fn read_request(connection: &mut Waiting) -> ReadOutcome {
    let mut chunk = [0u8; 512];
    loop {
        let room = (MAX_REQUEST_BYTES as usize + 1).saturating_sub(connection.line.len()).min(chunk.len());
        // SAFETY: reads at most `room <= chunk.len()` bytes into the live stack buffer.
        let n = unsafe { libc::recv(connection.stream.as_raw_fd(), chunk.as_mut_ptr().cast(), room, 0) };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            return match error.kind() {
                std::io::ErrorKind::WouldBlock => ReadOutcome::Partial,
                std::io::ErrorKind::Interrupted => continue,
                _ => ReadOutcome::Failed,
            };
        }
        if n == 0 {
            return ReadOutcome::Closed;
        }
        let got = &chunk[..n as usize];
        if let Some(end) = got.iter().position(|&b| b == b'\n') {
            connection.line.extend_from_slice(&got[..=end]);
            return if connection.line.len() as u64 > MAX_REQUEST_BYTES {
                ReadOutcome::Closed
            } else {
                ReadOutcome::Complete
            };
        }
        connection.line.extend_from_slice(got);
        if connection.line.len() as u64 > MAX_REQUEST_BYTES {
            return ReadOutcome::Closed;
        }
    }
}

/// Makes a waiting (non-blocking) connection ready for its one reply: blocking again, with a short write bound.
fn prepare_reply(stream: &UnixStream) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(REPLY_TIMEOUT))
}

/// Writes all of `bytes` with send(2) and MSG_NOSIGNAL: a peer that closed first is an EPIPE error, never a SIGPIPE
/// (which would kill a host process that has not ignored it, such as Python). The socket's send timeout bounds it.
fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: send(2) reads at most `bytes.len()` bytes of the live slice.
        let sent = unsafe { libc::send(stream.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if sent < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if sent == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "socket accepted no bytes"));
        }
        bytes = &bytes[sent as usize..];
    }
    Ok(())
}

/// Sends one reply line, with `fd` attached (SCM_RIGHTS) when given.
fn send_reply(stream: &UnixStream, reply: &Reply, fd: Option<&OwnedFd>) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let Some(fd) = fd else {
        return send_all(stream, &line);
    };
    let raw = fd.as_raw_fd();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: line.as_mut_ptr().cast(), iov_len: line.len() };
    // SAFETY: msghdr is plain data; zero is a valid value of every field.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = space as _;
    // SAFETY: the control buffer holds `space` bytes, enough for one cmsghdr carrying one int, so CMSG_FIRSTHDR is
    // non-null and CMSG_DATA points inside the buffer; `line` and `control` outlive sendmsg.
    let sent = unsafe {
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), raw);
        libc::sendmsg(stream.as_raw_fd(), &message, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if (sent as usize) < line.len() {
        // The fd went with the first bytes; the rest of the line follows plainly.
        send_all(stream, &line[sent as usize..])?;
    }
    Ok(())
}

/// What an import through the export service returns.
#[derive(Debug)]
pub struct Imported {
    /// The exporter's memfd, now also open in this process.
    pub fd: OwnedFd,
    /// Where the offered region starts in the memfd.
    pub offset: u64,
    /// Bytes the exporter offers.
    pub length: u64,
    /// The exporting device's identity.
    pub device: String,
    /// The serving process as SO_PEERCRED shows it in this process's pid namespace.
    pub server_pid: i32,
}

/// The time left before `deadline`, or `TimedOut` naming `what` and the whole budget.
fn time_left(deadline: Instant, budget: Duration, what: &str) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what}: not done within {budget:?}")));
    }
    Ok(left.max(Duration::from_millis(1)))
}

/// A socket timeout (SO_RCVTIMEO / SO_SNDTIMEO) of `left`.
fn set_socket_timeout(fd: libc::c_int, option: libc::c_int, left: Duration) -> std::io::Result<()> {
    let value =
        libc::timeval { tv_sec: left.as_secs() as libc::time_t, tv_usec: left.subsec_micros() as libc::suseconds_t };
    // SAFETY: setsockopt reads exactly size_of::<timeval>() bytes from a live timeval.
    let result = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The sockaddr of the abstract socket `endpoint` (`@name`) and its length.
fn abstract_sockaddr(endpoint: &str) -> std::io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let name = abstract_name(endpoint)?;
    // SAFETY: sockaddr_un is plain data; zero is a valid value of every field.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if name.len() + 1 > address.sun_path.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("export endpoint {endpoint:?} is too long"),
        ));
    }
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // sun_path[0] stays 0: the abstract namespace.
    for (slot, byte) in address.sun_path[1..].iter_mut().zip(name) {
        *slot = *byte as libc::c_char;
    }
    let length = (std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len()) as libc::socklen_t;
    Ok((address, length))
}

/// Connects to the abstract socket `endpoint` before `deadline`: a full listen backlog is waited for (SO_SNDTIMEO)
/// and reported as `ResourceBusy`; nobody listening is `ConnectionRefused`. Checks the server's uid.
fn connect(endpoint: &str, deadline: Instant, budget: Duration) -> std::io::Result<(UnixStream, i32)> {
    let (address, length) = abstract_sockaddr(endpoint)?;
    // SAFETY: socket(2) has no memory preconditions; a non-negative result is a descriptor nothing else owns.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    loop {
        set_socket_timeout(fd.as_raw_fd(), libc::SO_SNDTIMEO, time_left(deadline, budget, "connect")?)?;
        // SAFETY: `address` is a live sockaddr_un and `length` does not exceed its size.
        let result = unsafe { libc::connect(fd.as_raw_fd(), std::ptr::addr_of!(address).cast(), length) };
        if result == 0 {
            break;
        }
        let error = std::io::Error::last_os_error();
        match error.kind() {
            std::io::ErrorKind::Interrupted => continue,
            // The listen backlog stayed full for the whole wait: the service is busy, not gone.
            std::io::ErrorKind::WouldBlock => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ResourceBusy,
                    format!("export endpoint {endpoint}: listen backlog full ({error})"),
                ))
            }
            _ => return Err(error),
        }
    }
    let stream = UnixStream::from(fd);
    let (pid, uid) = peer_credentials(&stream)?;
    if uid != effective_uid() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("export endpoint {endpoint} is served by pid {pid} as uid {uid}, not this process's uid"),
        ));
    }
    Ok((stream, pid))
}

/// A socket call that failed only because its timeout (set from the deadline) ran out reads as `TimedOut`.
fn timed_out_if_would_block(error: std::io::Error, what: &str, budget: Duration) -> std::io::Error {
    if error.kind() == std::io::ErrorKind::WouldBlock {
        return std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what}: not done within {budget:?}"));
    }
    error
}

/// Receives one reply line and at most one attached descriptor, all before `deadline`.
fn receive_reply(
    stream: &UnixStream,
    deadline: Instant,
    budget: Duration,
) -> std::io::Result<(Reply, Option<OwnedFd>)> {
    let mut received = Vec::new();
    let mut fd = None;
    let mut chunk = [0u8; 512];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    while !received.ends_with(b"\n") {
        if received.len() as u64 > 4 * MAX_REQUEST_BYTES {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "reply line too long"));
        }
        set_socket_timeout(stream.as_raw_fd(), libc::SO_RCVTIMEO, time_left(deadline, budget, "reply")?)?;
        let mut control = vec![0u64; space.div_ceil(8)];
        let mut iov = libc::iovec { iov_base: chunk.as_mut_ptr().cast(), iov_len: chunk.len() };
        // SAFETY: msghdr is plain data; zero is a valid value of every field.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        // SAFETY: the buffers named by `message` are live and sized as declared; MSG_CMSG_CLOEXEC marks any received
        // descriptor close-on-exec. The socket's receive timeout (what is left of the deadline) bounds the wait.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(timed_out_if_would_block(error, "reply", budget));
        }
        // SAFETY: walks the control messages recvmsg wrote into `control` (bounded by msg_controllen); a SCM_RIGHTS
        // message carries ints, each a descriptor now open in this process that nothing else owns.
        unsafe {
            let mut header = libc::CMSG_FIRSTHDR(&message);
            while !header.is_null() {
                if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(header).cast::<libc::c_int>();
                    let count =
                        ((*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<libc::c_int>();
                    for i in 0..count {
                        let owned = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                        // Keep the first; any other descriptor is closed when `owned` drops.
                        if fd.is_none() {
                            fd = Some(owned);
                        }
                    }
                }
                header = libc::CMSG_NXTHDR(&message, header);
            }
        }
        if n == 0 {
            let kind =
                if received.is_empty() { std::io::ErrorKind::ResourceBusy } else { std::io::ErrorKind::UnexpectedEof };
            return Err(std::io::Error::new(kind, "export service closed the connection without a whole reply"));
        }
        received.extend_from_slice(&chunk[..n as usize]);
    }
    let reply: Reply = serde_json::from_slice(&received).map_err(std::io::Error::other)?;
    Ok((reply, fd))
}

/// One connection: connect, send the request, take the reply, all before `deadline`.
fn attempt(
    endpoint: &str,
    line: &[u8],
    deadline: Instant,
    budget: Duration,
) -> std::io::Result<(Reply, Option<OwnedFd>, i32)> {
    let (stream, server_pid) = connect(endpoint, deadline, budget)?;
    set_socket_timeout(stream.as_raw_fd(), libc::SO_SNDTIMEO, time_left(deadline, budget, "request")?)?;
    send_all(&stream, line).map_err(|error| timed_out_if_would_block(error, "request", budget))?;
    let (reply, fd) = receive_reply(&stream, deadline, budget)?;
    if !reply.ok {
        let error = reply.error.unwrap_or_else(|| "no reason given".into());
        // An eviction by a newer connection: the service is busy, not refusing.
        let kind = if error.starts_with("busy") {
            std::io::ErrorKind::ResourceBusy
        } else {
            std::io::ErrorKind::PermissionDenied
        };
        return Err(std::io::Error::new(kind, format!("export service refused: {error}")));
    }
    Ok((reply, fd, server_pid))
}

/// The request/reply exchange with ONE deadline, `timeout` from now, for everything: connects, retries after a
/// busy service (a "busy" answer, a full backlog, a close before any reply byte) and each read and write.
fn exchange(endpoint: &str, request: &Request, timeout: Duration) -> std::io::Result<(Reply, Option<OwnedFd>, i32)> {
    let deadline = Instant::now() + timeout;
    let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut pause = RETRY_PAUSE.0;
    loop {
        match attempt(endpoint, &line, deadline, timeout) {
            Err(error) if error.kind() == std::io::ErrorKind::ResourceBusy => {
                if deadline.saturating_duration_since(Instant::now()) <= pause {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ResourceBusy,
                        format!("export service stayed busy for {timeout:?}: {error}"),
                    ));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(RETRY_PAUSE.1);
            }
            outcome => return outcome,
        }
    }
}

/// Imports `export_id` from the service at `endpoint`, presenting `secret`; the whole operation (connect, retries,
/// request, reply) has `timeout`.
pub fn import(endpoint: &str, secret: &str, export_id: u64, timeout: Duration) -> std::io::Result<Imported> {
    let request = Request { op: "import".into(), export_id: Some(export_id), secret: Some(secret.to_owned()) };
    let (reply, fd, server_pid) = exchange(endpoint, &request, timeout)?;
    let invalid = |reason: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, reason.to_owned());
    let fd = fd.ok_or_else(|| invalid("the import reply carried no descriptor"))?;
    let length = reply.length.ok_or_else(|| invalid("the import reply has no length"))?;
    let offset = reply.offset.ok_or_else(|| invalid("the import reply has no offset"))?;
    // SAFETY: fstat writes into a stat buffer we own, for a descriptor we own.
    let size = unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut stat) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        stat.st_size as u64
    };
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(invalid(&format!(
            "the received memfd holds {size} bytes, less than the {length} offered at {offset}"
        )));
    }
    Ok(Imported { fd, offset, length, device: reply.device.unwrap_or_default(), server_pid })
}

/// Asks the service at `endpoint` whether it still serves the device `device`, within `timeout` in all: `Ok` if it
/// answered with that identity, else why not (`ConnectionRefused`: nobody listens; `NotFound`: another device
/// answers; `TimedOut` / `ResourceBusy`: it did not answer in time, which does not mean it is gone).
pub fn ping(endpoint: &str, secret: &str, device: &str, timeout: Duration) -> std::io::Result<()> {
    let request = Request { op: "ping".into(), export_id: None, secret: Some(secret.to_owned()) };
    let (reply, _, _) = exchange(endpoint, &request, timeout)?;
    if reply.device.as_deref() != Some(device) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("endpoint {endpoint} now serves {:?}, not {device:?}", reply.device),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;
    use crate::device::twin::memory::MemfdRegion;

    const TIMEOUT: Duration = Duration::from_secs(2);

    fn raw_exchange(endpoint: &str, bytes: &[u8]) -> String {
        let mut stream = UnixStream::connect_addr(&abstract_address(endpoint).expect("name")).expect("connect");
        stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        let _ = stream.write_all(bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        reply
    }

    fn idle_connection(endpoint: &str) -> UnixStream {
        let stream = UnixStream::connect_addr(&abstract_address(endpoint).expect("name")).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        stream
    }

    #[test]
    fn imports_need_the_secret_and_withdrawn_exports_are_refused() {
        let region = MemfdRegion::create(0, "export-service-test", 1 << 16).expect("memfd");
        // SAFETY: the first 8 bytes of a live 64 KiB mapping.
        unsafe { (region.base() as *mut u64).write(0xC0FFEE) };
        let service = ExportService::start("unit-test-device").expect("service");
        assert!(service.endpoint().starts_with('@') && service.secret().len() == 64);
        service.offer(7, Offer { fd: region.fd(), offset: 0, length: region.len() });

        let wrong = import(service.endpoint(), &"0".repeat(64), 7, TIMEOUT).expect_err("wrong secret");
        assert!(wrong.to_string().contains("wrong secret"), "{wrong}");
        let unknown = import(service.endpoint(), service.secret(), 8, TIMEOUT).expect_err("unknown export");
        assert!(unknown.to_string().contains("not offered"), "{unknown}");

        let imported = import(service.endpoint(), service.secret(), 7, TIMEOUT).expect("import");
        assert_eq!((imported.offset, imported.length, imported.device.as_str()), (0, 1 << 16, "unit-test-device"));
        assert_eq!(imported.server_pid as u32, std::process::id());
        let mapping = MemfdRegion::map(0, Arc::new(imported.fd), imported.length).expect("map");
        // SAFETY: the first 8 bytes of a live mapping of the same memfd.
        assert_eq!(unsafe { (mapping.base() as *const u64).read() }, 0xC0FFEE);

        // Malformed and hostile requests get an error line and the server keeps serving.
        for bytes in [&b"not json\n"[..], b"{\"op\":\"import\"}\n", &[b'x'; 4096][..], b"", b"{\"op\":\"ping\""] {
            let reply = raw_exchange(service.endpoint(), bytes);
            assert!(reply.contains("\"ok\":false"), "{reply:?}");
        }
        ping(service.endpoint(), service.secret(), "unit-test-device", TIMEOUT).expect("still serving");
        assert!(ping(service.endpoint(), service.secret(), "another-device", TIMEOUT).is_err());

        assert!(service.withdraw(7));
        let revoked = import(service.endpoint(), service.secret(), 7, TIMEOUT).expect_err("withdrawn");
        assert!(revoked.to_string().contains("withdrawn"), "{revoked}");
        // The mapping made before the withdrawal stays valid.
        // SAFETY: as above.
        assert_eq!(unsafe { (mapping.base() as *const u64).read() }, 0xC0FFEE);

        let endpoint = service.endpoint().to_owned();
        drop(service);
        let gone = ping(&endpoint, "x", "unit-test-device", TIMEOUT).expect_err("service stopped");
        assert_eq!(gone.kind(), std::io::ErrorKind::ConnectionRefused, "{gone}");
    }

    #[test]
    fn a_connection_without_a_request_is_closed_at_the_first_request_deadline() {
        let limits = ExportLimits { first_request_timeout: Duration::from_millis(200), ..ExportLimits::default() };
        let service = ExportService::start_with("deadline-device", limits).expect("service");
        let started = Instant::now();
        let mut idle = idle_connection(service.endpoint());
        // Half a request does not extend the deadline.
        idle.write_all(b"{\"op\":").expect("partial request");
        let mut reply = String::new();
        idle.read_to_string(&mut reply).expect("closed");
        let waited = started.elapsed();
        assert!(reply.contains("no whole request within"), "{reply:?}");
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(2), "closed after {waited:?}");
        assert_eq!(service.stats().timed_out, 1);
        ping(service.endpoint(), service.secret(), "deadline-device", TIMEOUT).expect("still serving");
    }

    /// A process holding many idle connections (more than every limit) does not keep others out: each newer
    /// connection evicts the oldest waiting one, and imports succeed at once rather than after the deadline.
    #[test]
    fn idle_connections_do_not_hold_the_service() {
        let region = MemfdRegion::create(0, "export-service-idle", 1 << 16).expect("memfd");
        // A long first-request deadline: only eviction can make room here.
        let limits = ExportLimits { first_request_timeout: Duration::from_secs(30), ..ExportLimits::default() };
        let service = ExportService::start_with("idle-device", limits.clone()).expect("service");
        service.offer(1, Offer { fd: region.fd(), offset: 0, length: region.len() });
        let held: Vec<UnixStream> =
            (0..limits.max_connections + 20).map(|_| idle_connection(service.endpoint())).collect();
        let started = Instant::now();
        for _ in 0..20 {
            import(service.endpoint(), service.secret(), 1, TIMEOUT).expect("import despite idle connections");
            ping(service.endpoint(), service.secret(), "idle-device", TIMEOUT).expect("ping despite idle connections");
        }
        assert!(started.elapsed() < Duration::from_secs(2), "imports took {:?}", started.elapsed());
        let stats = service.stats();
        assert!(stats.evicted >= 20, "{stats:?}");
        // The oldest holders were answered "busy" and closed.
        let mut first = &held[0];
        let mut reply = String::new();
        first.read_to_string(&mut reply).expect("evicted");
        assert!(reply.contains("busy"), "{reply:?}");
    }

    /// A listening socket on `endpoint` that never accepts, with a listen backlog of `backlog`.
    fn listener_with_backlog(endpoint: &str, backlog: libc::c_int) -> OwnedFd {
        let (address, length) = abstract_sockaddr(endpoint).expect("name");
        // SAFETY: socket(2) has no memory preconditions; the result is checked and then owned.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: `address` is a live sockaddr_un of at least `length` bytes.
        let bound = unsafe { libc::bind(fd.as_raw_fd(), std::ptr::addr_of!(address).cast(), length) };
        assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
        // SAFETY: listen(2) on a descriptor we own.
        assert_eq!(unsafe { libc::listen(fd.as_raw_fd(), backlog) }, 0, "listen");
        fd
    }

    /// The client's deadline covers the whole operation: a server that accepts and then trickles a reply that never
    /// ends, or never accepts at all, costs the caller the timeout, not a timeout per read.
    #[test]
    fn a_client_operation_has_one_overall_deadline() {
        let endpoint = format!("@aiv-twin-export-test-trickle-{}", random_hex(8).expect("random"));
        let listener = UnixListener::bind_addr(&abstract_address(&endpoint).expect("name")).expect("bind");
        let trickler = std::thread::spawn(move || {
            let Ok((mut stream, _)) = listener.accept() else { return };
            // One byte every 50 ms, never a newline: a per-read timeout would wait forever.
            for _ in 0..100 {
                if stream.write_all(b" ").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let started = Instant::now();
        let error = ping(&endpoint, "secret", "device", Duration::from_millis(400)).expect_err("no whole reply");
        let waited = started.elapsed();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
        assert!(waited >= Duration::from_millis(400) && waited < Duration::from_millis(1500), "took {waited:?}");
        trickler.join().expect("trickler");

        // A listener that never accepts: once its backlog is full, connecting waits, bounded by the same deadline.
        let endpoint = format!("@aiv-twin-export-test-backlog-{}", random_hex(8).expect("random"));
        let _listener = listener_with_backlog(&endpoint, 2);
        let mut filling = Vec::new();
        let budget = Duration::from_millis(100);
        loop {
            match connect(&endpoint, Instant::now() + budget, budget) {
                Ok((stream, _)) => filling.push(stream),
                Err(error) => {
                    assert_eq!(error.kind(), std::io::ErrorKind::ResourceBusy, "{error}");
                    break;
                }
            }
            assert!(filling.len() < 100_000, "the backlog never filled");
        }
        let started = Instant::now();
        let error = ping(&endpoint, "secret", "device", Duration::from_millis(300)).expect_err("backlog full");
        let waited = started.elapsed();
        assert_eq!(error.kind(), std::io::ErrorKind::ResourceBusy, "{error}");
        assert!(waited >= Duration::from_millis(250) && waited < Duration::from_millis(1500), "took {waited:?}");
    }
}
