//! The TCP data client: carries transfers to peers' data servers over persistent, pipelined lanes.
//!
//! Owns the per-peer lanes and their connections; it never touches memory other than the ranges of the transfers
//! it was handed. A peer is a data address (host, port) plus the wire version its descriptor asks for. Each peer
//! has `lanes` lanes; each lane has one persistent connection, a writer thread that sends every queued request in
//! one `writev` (headers and WRITE payloads straight from registered memory), and a reader thread per connection
//! that takes the replies in order (statuses, READ payloads straight into registered memory). Writer and reader
//! are separate so a lane never waits for a reply before sending the next request, and so mixed READ/WRITE
//! pipelines cannot deadlock on full socket buffers.
//!
//! Isolation: `submit` only queues; connecting, sending and receiving happen on the peer's own threads, so a slow
//! or dead peer delays only its own transfers, which fail with the reason after `io_timeout` without progress, and
//! at the latest at their deadline: sends and receives stop at the transfers' deadline however slowly the peer keeps
//! moving bytes, and one connect (all the addresses a host resolves to) is bounded by `connect_timeout` overall.
//!
//! Reconnects back off per peer: after a failed connect the peer's next attempt waits `reconnect_backoff`, doubling
//! on each further failure up to `reconnect_backoff_max`, and a success resets it. Transfers that reach a lane while
//! its peer is backing off fail at once (no connect is tried), with a reason naming the peer and the time to the
//! next attempt. Connect and send failures are logged through rate limiters ([`crate::log_limit`]), so a dead peer
//! costs a few lines per second, with the count of the lines left out.
//!
//! Evidence (docs/evidence.md, "Host paths"): each transfer's acts are its own (window 1), `Source::HostCode`,
//! counted where they happen: `descriptors_written` = the request headers encoded for it (in [`send_group`]),
//! `doorbells_rung` = the `sendmsg(2)` calls that carried at least one byte of its request (header or WRITE payload;
//! a call carrying several transfers' requests counts once for each of them), told by the send loop after each call
//! ([`super::io::write_all_vectored_observed`]), `completion_seen` = the replies read that completed it (the v2
//! status frame, or the v1 READ payload; for a v1 WRITE, which has no reply, the writer seeing the send that carried
//! its last byte return).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::io::{iovec, is_unmapped_destination, write_all_vectored_observed, Inbound, Patience, SendCall, MAX_IOVECS};
use super::wire::{RequestHeader, Status, WireOpcode, WireVersion, HEADER_LEN, STATUS_LEN};
use crate::cpu_time::thread_cpu_time_ns as thread_cpu_ns;
use crate::evidence::{Act, Source, TransferEvidence};
use crate::log_limit::LogLimiter;
use crate::transfer::{FailureKind, Opcode, TransferFailure};
use crate::transport::Transfer;

/// Tunables of the client.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Connections (lanes) per peer.
    pub lanes: usize,
    /// A transfer that makes no progress for this long fails (and its connection is closed).
    pub io_timeout: Duration,
    /// Budget for establishing a connection, over all the addresses the peer's host resolves to.
    pub connect_timeout: Duration,
    /// A lane idle this long closes its connection.
    pub idle_close: Duration,
    /// Socket timeout between checks of deadlines and the stop flag.
    pub tick: Duration,
    /// Wait before reconnecting to a peer after its first failed connect; doubles with each further failure.
    pub reconnect_backoff: Duration,
    /// The longest wait between reconnect attempts to one peer.
    pub reconnect_backoff_max: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            lanes: 2,
            io_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            idle_close: Duration::from_secs(60),
            tick: Duration::from_millis(200),
            reconnect_backoff: Duration::from_millis(10),
            reconnect_backoff_max: Duration::from_secs(1),
        }
    }
}

/// Where a peer's data server is, and how to talk to it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PeerKey {
    /// Host name or address (`tcp_data_host`, else the host of the segment name).
    pub host: String,
    /// `tcp_data_port`.
    pub port: u16,
    /// Framing: v2 iff the peer's descriptor says `tcp_proto_version >= 2` and this side allows v2.
    pub version: WireVersion,
}

/// One transfer on its way through a lane.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) transfer: Transfer,
    /// Request headers encoded for it.
    pub(crate) headers_written: u64,
    /// The `sendmsg(2)` calls that carried its request, published by the writer as soon as the call that carried
    /// its last byte returned (0: not yet; the reader waits for it, see [`Job::sends_published`]).
    pub(crate) sends: Arc<AtomicU64>,
    /// Whether it has been sent again already, after the server closed the connection with it in flight.
    pub(crate) retried: bool,
}

impl Job {
    /// A transfer not sent yet.
    pub(crate) fn new(transfer: Transfer) -> Self {
        Job { transfer, headers_written: 0, sends: Arc::new(AtomicU64::new(0)), retried: false }
    }

    /// The sends the writer published for this job. A reply can come only after the call that carried the
    /// request's last byte, and the writer publishes right after that call returns: the wait is that gap, bounded by
    /// the transfer's deadline (0 if it passed unpublished).
    fn sends_published(&self) -> u64 {
        let deadline = self.transfer.slot.deadline();
        loop {
            let sends = self.sends.load(Ordering::Acquire);
            if sends > 0 || Instant::now() >= deadline {
                return sends;
            }
            std::thread::yield_now();
        }
    }

    fn header(&self, version: WireVersion) -> RequestHeader {
        RequestHeader {
            size: self.transfer.length,
            addr: self.transfer.remote_addr,
            opcode: match self.transfer.opcode {
                Opcode::Read => WireOpcode::Read,
                Opcode::Write => WireOpcode::Write,
            },
            version,
        }
    }

    fn finished(&self) -> bool {
        self.transfer.slot.state().is_terminal()
    }

    /// Completes the transfer with its counted acts; `completions`: the replies read (or sends seen) that completed it.
    fn complete(self, cpu_ns: u64, completions: u64) {
        let sends = self.sends_published();
        let mut evidence = TransferEvidence::new("tcp", crate::evidence::RuntimeLabel::NONE);
        evidence.descriptors_written = Act::host(Source::HostCode, self.headers_written);
        evidence.doorbells_rung = Act::host(Source::HostCode, sends);
        evidence.completion_seen = Act::host(Source::HostCode, completions);
        evidence.descriptors = self.headers_written;
        evidence.doorbells = sends;
        evidence.host_cpu_ns = cpu_ns;
        self.transfer.slot.complete(self.transfer.length, evidence);
    }

    fn fail(self, failure: TransferFailure) {
        self.transfer.slot.fail(failure);
    }
}

/// Whether `error` says the server closed (or reset) the connection, as a server that evicts or drops a
/// connection does, rather than answering, rejecting or timing out.
fn closed_by_server(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

/// A job whose connection was lost: sent once more on a fresh connection of its lane if the server closed the
/// connection (`may_retry`), it was not retried before, its deadline has not passed and the client is not stopping;
/// else failed with `failure`, whose message then says why it was not retried.
///
/// Sending again is safe: a READ only reads the peer's memory again, and a WRITE sends the same bytes to the same
/// range, which leaves it as one successful WRITE would (unless something else wrote that range in between, which
/// the transfer's caller cannot tell apart from a WRITE that completed and was then overwritten either). A request
/// the server answered `REJECTED` is never retried (`may_retry` is false for it).
fn retry_or_fail(lane: &Lane, shared: &ClientShared, mut job: Job, may_retry: bool, failure: TransferFailure) {
    let retry = may_retry
        && !job.retried
        && Instant::now() < job.transfer.slot.deadline()
        && !shared.stopping.load(Ordering::SeqCst);
    if !retry {
        let message = if may_retry && job.retried {
            format!("{}; already sent a second time on a fresh connection", failure.message())
        } else {
            failure.message().to_owned()
        };
        job.fail(TransferFailure::new("tcp", failure.kind(), message).with_mooncake_code(MOONCAKE_ERR_SOCKET));
        return;
    }
    job.retried = true;
    // A fresh cell: the call that carried the first attempt may still publish into the old one.
    job.sends = Arc::new(AtomicU64::new(0));
    tracing::debug!(host = %lane.key.host, port = lane.key.port, "tcp: request cut by the server; sending it again");
    lock(&lane.queue).push_back(job);
    lane.ready.notify_one();
}

/// The task failure of a transfer lost to `error` on the wire: a timeout when the I/O timed out, a network failure
/// otherwise (Mooncake's `ERR_SOCKET`).
fn network_failure(error: &io::Error, message: String) -> TransferFailure {
    let kind = if error.kind() == io::ErrorKind::TimedOut { FailureKind::Timeout } else { FailureKind::Network };
    TransferFailure::new("tcp", kind, message).with_mooncake_code(MOONCAKE_ERR_SOCKET)
}

/// Mooncake's `ERR_SOCKET` (-102), as a magnitude like [`crate::EngineError::mooncake_code`].
const MOONCAKE_ERR_SOCKET: i32 = 102;

/// Budgets of the client's warnings (all peers together).
static CONNECT_FAILED: LogLimiter = LogLimiter::per_second(5);
static SEND_FAILED: LogLimiter = LogLimiter::per_second(5);

/// When one peer may be dialled again, shared by its lanes.
#[derive(Debug, Default)]
struct Backoff {
    /// The wait after the last failure (zero: the last connect succeeded, or none was tried).
    delay: Duration,
    next_attempt: Option<Instant>,
}

impl Backoff {
    /// How long until the next attempt is allowed, if one is not allowed now.
    fn wait_left(&self, now: Instant) -> Option<Duration> {
        self.next_attempt.map(|at| at.saturating_duration_since(now)).filter(|left| !left.is_zero())
    }

    fn failed(&mut self, now: Instant, options: &ClientOptions) -> Duration {
        self.delay = if self.delay.is_zero() { options.reconnect_backoff } else { self.delay.saturating_mul(2) }
            .min(options.reconnect_backoff_max);
        self.next_attempt = Some(now + self.delay);
        self.delay
    }

    fn succeeded(&mut self) {
        *self = Backoff::default();
    }
}

#[derive(Debug)]
struct ClientShared {
    options: ClientOptions,
    stopping: AtomicBool,
}

/// The client side of the tcp transport.
#[derive(Debug)]
pub struct TcpClient {
    shared: Arc<ClientShared>,
    peers: Mutex<HashMap<PeerKey, Arc<Peer>>>,
}

#[derive(Debug)]
struct Peer {
    lanes: Vec<Arc<Lane>>,
    next: AtomicUsize,
}

#[derive(Debug)]
struct Lane {
    key: PeerKey,
    index: usize,
    backoff: Arc<Mutex<Backoff>>,
    queue: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

impl TcpClient {
    /// A client with no peer yet.
    pub fn new(options: ClientOptions) -> Self {
        let options = ClientOptions { lanes: options.lanes.max(1), ..options };
        TcpClient {
            shared: Arc::new(ClientShared { options, stopping: AtomicBool::new(false) }),
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// The options in force.
    pub fn options(&self) -> &ClientOptions {
        &self.shared.options
    }

    /// Queues jobs for one peer, spread over its lanes. Never blocks on the network.
    pub(crate) fn submit(&self, key: PeerKey, jobs: Vec<Job>) {
        if jobs.is_empty() {
            return;
        }
        let peer = match self.peer(&key) {
            Ok(peer) => peer,
            Err(error) => {
                for job in jobs {
                    job.fail(
                        TransferFailure::new(
                            "tcp",
                            FailureKind::Network,
                            format!("cannot start lanes to {}:{}: {error}", key.host, key.port),
                        )
                        .with_mooncake_code(MOONCAKE_ERR_SOCKET),
                    );
                }
                return;
            }
        };
        let lanes = peer.lanes.len();
        let first = peer.next.fetch_add(1, Ordering::Relaxed);
        // Contiguous shares: lane k gets jobs [k*n/lanes, (k+1)*n/lanes), starting at a rotating lane so that
        // single-transfer submissions from several threads still spread.
        let count = jobs.len();
        let mut jobs = jobs.into_iter();
        for share in 0..lanes {
            let take = (share + 1) * count / lanes - share * count / lanes;
            if take == 0 {
                continue;
            }
            let lane = &peer.lanes[(first + share) % lanes];
            let mut queue = lock(&lane.queue);
            queue.extend(jobs.by_ref().take(take));
            drop(queue);
            lane.ready.notify_one();
        }
    }

    fn peer(&self, key: &PeerKey) -> io::Result<Arc<Peer>> {
        let mut peers = lock(&self.peers);
        if let Some(peer) = peers.get(key) {
            return Ok(peer.clone());
        }
        let mut lanes = Vec::with_capacity(self.shared.options.lanes);
        let backoff = Arc::new(Mutex::new(Backoff::default()));
        for index in 0..self.shared.options.lanes {
            let lane = Arc::new(Lane {
                key: key.clone(),
                index,
                backoff: backoff.clone(),
                queue: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
            });
            let shared = self.shared.clone();
            let worker = lane.clone();
            std::thread::Builder::new().name(format!("tcp-lane-{index}")).spawn(move || lane_writer(worker, shared))?;
            lanes.push(lane);
        }
        let peer = Arc::new(Peer { lanes, next: AtomicUsize::new(0) });
        peers.insert(key.clone(), peer.clone());
        tracing::debug!(host = %key.host, port = key.port, version = ?key.version, lanes = peer.lanes.len(), "tcp peer opened");
        Ok(peer)
    }
}

impl Drop for TcpClient {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for peer in lock(&self.peers).values() {
            for lane in &peer.lanes {
                // Take the queue lock so a writer between its check and its wait cannot miss the wake-up.
                let _queue = lock(&lane.queue);
                lane.ready.notify_all();
            }
        }
    }
}

/// A reply the reader must take, in order.
#[derive(Debug)]
struct Expected {
    job: Job,
    version: WireVersion,
    /// CPU nanoseconds the writer spent per job of the group this job was sent in (filled after the send).
    writer_cpu_share: Arc<AtomicU64>,
}

/// One connection of a lane, as the writer holds it.
#[derive(Debug)]
struct Connection {
    stream: TcpStream,
    address: SocketAddr,
    version: WireVersion,
    expect: mpsc::Sender<Expected>,
    broken: Arc<AtomicBool>,
    outstanding: Arc<AtomicUsize>,
    /// Why a send on this connection failed, for the reader to fail the transfers it holds with (set before the
    /// connection is shut down, so the reader, woken by the shutdown, finds it).
    send_failure: Arc<Mutex<Option<String>>>,
    last_used: Instant,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Wakes the reader if it is blocked on the socket; it then fails whatever it still expected.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

fn connect(lane: &Arc<Lane>, shared: &Arc<ClientShared>) -> io::Result<Connection> {
    let options = &shared.options;
    let key = &lane.key;
    let mut last_error = io::Error::new(io::ErrorKind::NotFound, "the host resolved to no address");
    let until = Instant::now() + options.connect_timeout;
    for address in (key.host.as_str(), key.port).to_socket_addrs()? {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            last_error = io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no connection within the connect timeout of {:?}", options.connect_timeout),
            );
            break;
        }
        match TcpStream::connect_timeout(&address, left) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(options.tick))?;
                stream.set_write_timeout(Some(options.tick))?;
                let reader_stream = stream.try_clone()?;
                let (expect, expectations) = mpsc::channel();
                let broken = Arc::new(AtomicBool::new(false));
                let outstanding = Arc::new(AtomicUsize::new(0));
                let send_failure = Arc::new(Mutex::new(None));
                let reader = Reader {
                    stream: reader_stream,
                    address,
                    expectations,
                    broken: broken.clone(),
                    outstanding: outstanding.clone(),
                    send_failure: send_failure.clone(),
                    io_timeout: options.io_timeout,
                    lane: lane.clone(),
                    shared: shared.clone(),
                };
                std::thread::Builder::new().name(format!("tcp-reply-{}", lane.index)).spawn(move || reader.run())?;
                tracing::debug!(%address, lane = lane.index, "tcp lane connected");
                return Ok(Connection {
                    stream,
                    address,
                    version: key.version,
                    expect,
                    broken,
                    outstanding,
                    send_failure,
                    last_used: Instant::now(),
                });
            }
            Err(error) => last_error = error,
        }
    }
    Err(last_error)
}

/// Whether an idle connection was closed by the peer (EOF or error pending), checked without blocking.
fn closed_while_idle(connection: &Connection) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv(2) with MSG_PEEK writes at most one byte into `byte`, which lives on this stack frame.
    let got = unsafe {
        libc::recv(connection.stream.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT)
    };
    if got == 0 {
        return true;
    }
    if got < 0 {
        return io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock;
    }
    // Bytes nobody asked for: the stream is out of step.
    true
}

fn lane_writer(lane: Arc<Lane>, shared: Arc<ClientShared>) {
    let options = &shared.options;
    let mut connection: Option<Connection> = None;
    let mut iovecs: Vec<libc::iovec> = Vec::with_capacity(MAX_IOVECS);
    let mut headers: Vec<[u8; HEADER_LEN]> = Vec::new();
    loop {
        let jobs: Vec<Job> = {
            let mut queue = lock(&lane.queue);
            let idle_since = Instant::now();
            while queue.is_empty() && !shared.stopping.load(Ordering::SeqCst) {
                let waited = idle_since.elapsed();
                if connection.is_some() && waited >= options.idle_close {
                    // Idle: give the peer its connection back.
                    connection = None;
                }
                let wait =
                    if connection.is_some() { options.idle_close.saturating_sub(waited) } else { options.idle_close };
                queue = lane
                    .ready
                    .wait_timeout(queue, wait.max(Duration::from_millis(1)))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            queue.drain(..).collect()
        };
        if shared.stopping.load(Ordering::SeqCst) {
            for job in jobs {
                job.fail(TransferFailure::new("tcp", FailureKind::Shutdown, "transport stopped"));
            }
            return;
        }
        let cpu_start = thread_cpu_ns();
        let jobs: Vec<Job> = jobs.into_iter().filter(|job| !job.finished()).collect();
        if jobs.is_empty() {
            continue;
        }
        if let Some(current) = &connection {
            let idle = current.outstanding.load(Ordering::Acquire) == 0
                && current.last_used.elapsed() > Duration::from_millis(500);
            if current.broken.load(Ordering::Acquire) || (idle && closed_while_idle(current)) {
                connection = None;
            }
        }
        if connection.is_none() {
            let waiting = lock(&lane.backoff).wait_left(Instant::now());
            if let Some(left) = waiting {
                let reason = format!(
                    "peer {}:{} is in reconnect backoff after a failed connect; next attempt in {left:?}",
                    lane.key.host, lane.key.port
                );
                for job in jobs {
                    job.fail(
                        TransferFailure::new("tcp", FailureKind::Network, reason.clone())
                            .with_mooncake_code(MOONCAKE_ERR_SOCKET),
                    );
                }
                continue;
            }
            match connect(&lane, &shared) {
                Ok(fresh) => {
                    lock(&lane.backoff).succeeded();
                    connection = Some(fresh);
                }
                Err(error) => {
                    let delay = lock(&lane.backoff).failed(Instant::now(), options);
                    if let Some(suppressed) = CONNECT_FAILED.admit() {
                        tracing::warn!(
                            host = %lane.key.host,
                            port = lane.key.port,
                            %error,
                            next_attempt_in = ?delay,
                            suppressed,
                            "tcp: connect failed ({suppressed} more like this in the last second)"
                        );
                    }
                    let reason = format!("connect to {}:{}: {error}", lane.key.host, lane.key.port);
                    for job in jobs {
                        job.fail(network_failure(&error, reason.clone()));
                    }
                    continue;
                }
            }
        }
        let Some(current) = connection.as_mut() else { continue };
        if let Err(error) = send_group(current, &lane, jobs, &mut iovecs, &mut headers, cpu_start, &shared) {
            if let Some(suppressed) = SEND_FAILED.admit() {
                tracing::warn!(
                    address = %current.address,
                    %error,
                    suppressed,
                    "tcp: send failed ({suppressed} more like this in the last second)"
                );
            }
            current.broken.store(true, Ordering::Release);
            connection = None;
        }
    }
}

/// Sends one group of jobs on `connection` (chunked to the iovec limit). On error the jobs already handed to the
/// reader are failed by it (the connection is then dropped); the others are failed here.
fn send_group(
    connection: &mut Connection,
    lane: &Lane,
    jobs: Vec<Job>,
    iovecs: &mut Vec<libc::iovec>,
    headers: &mut Vec<[u8; HEADER_LEN]>,
    cpu_start: u64,
    shared: &ClientShared,
) -> io::Result<()> {
    let version = connection.version;
    let fd = connection.stream.as_raw_fd();
    let mut jobs = jobs.into_iter().peekable();
    let mut completed_here: Vec<(Job, u64)> = Vec::new();
    let mut cpu_mark = cpu_start;
    while jobs.peek().is_some() {
        // Each job takes two iovecs at most (header, WRITE payload).
        let mut chunk: Vec<Job> = jobs.by_ref().take(MAX_IOVECS / 2).collect();
        headers.clear();
        let share = Arc::new(AtomicU64::new(0));
        let mut sent_without_reply: Vec<Job> = Vec::new();
        for job in &mut chunk {
            headers.push(job.header(version).encode());
            job.headers_written += 1;
        }
        iovecs.clear();
        // Per job: its first and last iovec, and its sends cell.
        let mut spans: Vec<SendSpan> = Vec::with_capacity(chunk.len());
        for (job, header) in chunk.iter().zip(headers.iter()) {
            let first = iovecs.len();
            iovecs.push(iovec(header.as_ptr(), HEADER_LEN));
            if job.transfer.opcode == Opcode::Write && job.transfer.length > 0 {
                iovecs.push(iovec(job.transfer.local_addr as *const u8, job.transfer.length as usize));
            }
            spans.push(SendSpan { first, last: iovecs.len() - 1, first_call: 0, sends: job.sends.clone() });
        }
        // Hand the replies to the reader before sending: it must be draining replies while we may block sending.
        let count = chunk.len();
        let chunk_deadline = chunk.iter().map(|job| job.transfer.slot.deadline()).max();
        for job in chunk {
            let needs_reply = version == WireVersion::V2 || job.transfer.opcode == Opcode::Read;
            if needs_reply {
                connection.outstanding.fetch_add(1, Ordering::AcqRel);
                let expected = Expected { job, version, writer_cpu_share: share.clone() };
                if let Err(mpsc::SendError(expected)) = connection.expect.send(expected) {
                    connection.outstanding.fetch_sub(1, Ordering::AcqRel);
                    expected.job.fail(TransferFailure::new(
                        "tcp",
                        FailureKind::Network,
                        "the connection's reply reader has stopped",
                    ));
                }
            } else {
                sent_without_reply.push(job);
            }
        }
        let mut patience = Patience::new("send requests", shared.options.io_timeout, Some(&shared.stopping));
        if let Some(deadline) = chunk_deadline {
            patience = patience.until(deadline);
        }
        let mut tally = SendTally { spans: &mut spans, started: 0, published: 0 };
        // SAFETY: header iovecs point into `headers`, alive and unchanged until this call returns; payload iovecs
        // are WRITE source ranges the engine checked to lie inside one registered local buffer (and this transport
        // checked again), kept valid by `register_memory`'s contract until the transfer completes.
        let sent = unsafe { write_all_vectored_observed(fd, iovecs, &mut patience, &mut |call| tally.sent(call)) };
        connection.last_used = Instant::now();
        let now = thread_cpu_ns();
        share.store(now.saturating_sub(cpu_mark) / count as u64, Ordering::Release);
        cpu_mark = now;
        if let Err(error) = sent {
            let cut = closed_by_server(&error);
            let reason = if error.raw_os_error() == Some(libc::EFAULT) {
                format!(
                    "send to {}: the source range of a WRITE in this send is not mapped in this process ({error})",
                    connection.address
                )
            } else if cut {
                format!("send to {}: the server closed the connection ({error})", connection.address)
            } else {
                format!("send to {}: {error}", connection.address)
            };
            *lock(&connection.send_failure) = Some(reason.clone());
            for job in sent_without_reply.into_iter().chain(jobs) {
                retry_or_fail(lane, shared, job, cut, network_failure(&error, reason.clone()));
            }
            for (job, cpu) in completed_here {
                // v1 WRITEs of earlier chunks did leave this host whole: they are complete (the writer saw it).
                job.complete(cpu, 1);
            }
            return Err(error);
        }
        let per_job = share.load(Ordering::Acquire);
        completed_here.extend(sent_without_reply.into_iter().map(|job| (job, per_job)));
    }
    // v1 WRITE has no reply: it is complete once its bytes are handed to the socket, as Mooncake's v1 client has it;
    // this thread saw the send that carried its last byte return.
    for (job, cpu) in completed_here {
        job.complete(cpu, 1);
    }
    Ok(())
}

/// One job's iovecs in a send, and where its count of carrying calls goes.
struct SendSpan {
    first: usize,
    last: usize,
    /// The call that carried its first byte (0: none yet).
    first_call: u32,
    sends: Arc<AtomicU64>,
}

/// Turns the send loop's report of each call into each job's number of carrying calls, published as soon as the
/// call carrying the job's last byte returned. Calls carry contiguous bytes in order, so a job's carrying calls are
/// those from the one that carried its first byte to the one that carried its last.
struct SendTally<'a> {
    spans: &'a mut [SendSpan],
    /// Jobs whose first byte has been carried.
    started: usize,
    /// Jobs whose count has been published.
    published: usize,
}

impl SendTally<'_> {
    fn sent(&mut self, call: SendCall) {
        while self.started < self.spans.len() && self.spans[self.started].first < call.touched.end {
            self.spans[self.started].first_call = call.call;
            self.started += 1;
        }
        while self.published < self.started && self.spans[self.published].last < call.complete_before {
            let span = &self.spans[self.published];
            span.sends.store(u64::from(call.call - span.first_call + 1), Ordering::Release);
            self.published += 1;
        }
    }
}

/// The reply side of one connection.
struct Reader {
    stream: TcpStream,
    address: SocketAddr,
    expectations: mpsc::Receiver<Expected>,
    broken: Arc<AtomicBool>,
    outstanding: Arc<AtomicUsize>,
    send_failure: Arc<Mutex<Option<String>>>,
    io_timeout: Duration,
    /// Where requests the server cut off go to be sent again.
    lane: Arc<Lane>,
    shared: Arc<ClientShared>,
}

impl Reader {
    /// Takes the replies in order. A reply that is wholly in the receive buffer is taken without waiting: its READ
    /// payload's copy is deferred ([`Inbound::defer_payload`]) and its job queued in `done`; the queue is settled
    /// (the deferred copies made in one call, then each job completed or failed, in order) before anything that
    /// could wait on the socket or the expectations, and before any other outcome is acted on, so the jobs finish
    /// in the order of their replies, each only after its bytes landed.
    fn run(self) {
        let fd = self.stream.as_raw_fd();
        let mut inbound = Inbound::new(fd, 256 * 1024);
        let mut cpu_mark = thread_cpu_ns();
        let mut done: VecDeque<Taken> = VecDeque::new();
        loop {
            let expected = match self.expectations.try_recv() {
                Ok(expected) => expected,
                Err(mpsc::TryRecvError::Empty) => {
                    self.settle(&mut inbound, &mut done, &mut cpu_mark);
                    match self.expectations.recv() {
                        Ok(expected) => expected,
                        Err(_) => break,
                    }
                }
                Err(mpsc::TryRecvError::Disconnected) => break,
            };
            let Expected { job, version, writer_cpu_share } = expected;
            // Wholly buffered: receive() neither reads the socket nor copies (its READ payload is deferred).
            let whole = inbound.buffered() as u64 >= reply_len(&job, version);
            if !whole {
                self.settle(&mut inbound, &mut done, &mut cpu_mark);
            }
            let mut patience =
                Patience::new("receive reply", self.io_timeout, None).until(job.transfer.slot.deadline());
            let received = receive(&mut inbound, &job, version, whole, &mut patience);
            if let Ok((replies, deferred)) = received {
                if deferred || !done.is_empty() {
                    done.push_back(Taken { job, replies, deferred, writer_cpu_share });
                    continue;
                }
            }
            self.settle(&mut inbound, &mut done, &mut cpu_mark);
            match received {
                Ok((replies, _)) => {
                    self.outstanding.fetch_sub(1, Ordering::AcqRel);
                    let now = thread_cpu_ns();
                    let cpu = now.saturating_sub(cpu_mark) + writer_cpu_share.load(Ordering::Acquire);
                    cpu_mark = now;
                    job.complete(cpu, replies);
                }
                Err(error) if is_unmapped_destination(&error) => {
                    // The reply's payload was read and dropped: the stream is in step, only this transfer fails.
                    self.unmapped(job, &error);
                }
                Err(error) => {
                    self.outstanding.fetch_sub(1, Ordering::AcqRel);
                    self.broken.store(true, Ordering::Release);
                    let _ = self.stream.shutdown(Shutdown::Both);
                    tracing::debug!(address = %self.address, %error, "tcp reply failed; closing the connection");
                    // A failed send (its reason recorded by the writer) explains a missing reply better than the
                    // closed stream does; then this side closed the stream, not the server.
                    let send_failure = lock(&self.send_failure).clone();
                    let cut = send_failure.is_none() && closed_by_server(&error);
                    let message = match send_failure {
                        Some(send) => format!("{send} (no reply: {error})"),
                        None if cut => format!(
                            "reply from {}: the server closed the connection with the request in flight ({error})",
                            self.address
                        ),
                        None => format!("reply from {}: {error}", self.address),
                    };
                    retry_or_fail(&self.lane, &self.shared, job, cut, network_failure(&error, message));
                    // Requests pipelined behind this one share its fate: the stream is out of step or closed. The
                    // server answered none of them, so they are sent again if it closed the connection or rejected
                    // the one before them (it closes the connection after a rejection).
                    let rejected = error.kind() == io::ErrorKind::PermissionDenied;
                    while let Ok(expected) = self.expectations.recv() {
                        self.outstanding.fetch_sub(1, Ordering::AcqRel);
                        let failure = TransferFailure::new(
                            "tcp",
                            FailureKind::Network,
                            format!("connection to {} closed after an earlier failure: {error}", self.address),
                        )
                        .with_mooncake_code(MOONCAKE_ERR_SOCKET);
                        retry_or_fail(&self.lane, &self.shared, expected.job, cut || rejected, failure);
                    }
                    return;
                }
            }
        }
        self.settle(&mut inbound, &mut done, &mut cpu_mark);
    }

    /// Makes the deferred copies and finishes the queued jobs in order: completed, or failed if their copy failed.
    /// The reader's CPU time since the last completion is shared evenly among the completed ones.
    fn settle(&self, inbound: &mut Inbound, done: &mut VecDeque<Taken>, cpu_mark: &mut u64) {
        if done.is_empty() {
            return;
        }
        let mut outcomes = inbound.take_settled();
        let now = thread_cpu_ns();
        let share = now.saturating_sub(*cpu_mark) / done.len() as u64;
        *cpu_mark = now;
        while let Some(taken) = done.pop_front() {
            let outcome = if taken.deferred {
                outcomes.next().unwrap_or_else(|| Err(io::Error::other("deferred copy without an outcome")))
            } else {
                Ok(())
            };
            match outcome {
                Ok(()) => {
                    self.outstanding.fetch_sub(1, Ordering::AcqRel);
                    taken.job.complete(share + taken.writer_cpu_share.load(Ordering::Acquire), taken.replies);
                }
                Err(error) => self.unmapped(taken.job, &error),
            }
        }
    }

    /// Fails a READ whose payload could not be stored (its local buffer is not mapped); the stream is in step.
    fn unmapped(&self, job: Job, error: &io::Error) {
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        job.fail(TransferFailure::new(
            "tcp",
            FailureKind::InvalidRequest,
            format!("reply from {}: local buffer of the READ: {error}", self.address),
        ));
    }
}

/// A job whose reply was taken from the receive buffer and that waits for [`Reader::settle`].
struct Taken {
    job: Job,
    replies: u64,
    /// Whether its READ payload's copy was deferred (its outcome comes from [`Inbound::take_settled`]).
    deferred: bool,
    writer_cpu_share: Arc<AtomicU64>,
}

/// The bytes of `job`'s reply on the wire: the v2 status frame, then a READ's payload.
fn reply_len(job: &Job, version: WireVersion) -> u64 {
    let status = if version == WireVersion::V2 { STATUS_LEN as u64 } else { 0 };
    let payload = if job.transfer.opcode == Opcode::Read { job.transfer.length } else { 0 };
    status.saturating_add(payload)
}

/// Reads `job`'s reply; returns the replies read that completed it (the v2 status frame, or the v1 READ payload),
/// and whether the READ payload's copy was deferred (only with `defer`, when it is wholly buffered: see
/// [`Inbound::defer_payload`]).
fn receive(
    inbound: &mut Inbound,
    job: &Job,
    version: WireVersion,
    defer: bool,
    patience: &mut Patience<'_>,
) -> io::Result<(u64, bool)> {
    let mut deferred = false;
    let mut replies = 0;
    if version == WireVersion::V2 {
        let frame = inbound.frame::<STATUS_LEN>(patience)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed the connection before the status")
        })?;
        match Status::decode(frame) {
            Status::OK => replies += 1,
            Status::REJECTED => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "target rejected [{:#x}, +{}) (not inside one registered buffer, or not mapped there)",
                        job.transfer.remote_addr, job.transfer.length
                    ),
                ))
            }
            other => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown status frame {other:?}"))),
        }
    }
    if job.transfer.opcode == Opcode::Read {
        // SAFETY: the engine checked that `[local_addr, local_addr + length)` lies inside one registered local
        // buffer (and the transport checked again before queuing); a page of it unmapped since is an error of the
        // checked copy (or of read(2)), not a crash.
        let (dst, len) = (job.transfer.local_addr as *mut u8, job.transfer.length as usize);
        // SAFETY: as above; the deferred copy is made before the job completes (Reader::settle).
        deferred = defer && unsafe { inbound.defer_payload(dst, len) };
        if !deferred {
            // SAFETY: as above.
            unsafe { inbound.payload(dst, len, patience)? };
        }
        if version == WireVersion::V1 {
            // v1 has no status frame: the payload is the reply.
            replies += 1;
        }
    }
    Ok((replies, deferred))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(first: usize, last: usize) -> SendSpan {
        SendSpan { first, last, first_call: 0, sends: Arc::new(AtomicU64::new(0)) }
    }

    /// Jobs of iovecs [0, 1], [2] and [3, 4]; call 1 carries iovec 0 and part of 1, call 2 the rest of 1, 2 and part
    /// of 3, call 3 the rest: the first job was carried by 2 calls, the second by 1, the third by 2, each published
    /// once the call carrying its last byte is reported.
    #[test]
    fn each_job_counts_the_calls_from_its_first_byte_to_its_last() {
        let mut spans = vec![span(0, 1), span(2, 2), span(3, 4)];
        let cells: Vec<Arc<AtomicU64>> = spans.iter().map(|span| span.sends.clone()).collect();
        let read = || cells.iter().map(|cell| cell.load(Ordering::Acquire)).collect::<Vec<_>>();
        let mut tally = SendTally { spans: &mut spans, started: 0, published: 0 };
        tally.sent(SendCall { call: 1, touched: 0..2, complete_before: 1 });
        assert_eq!(read(), [0, 0, 0], "nothing carried whole yet");
        tally.sent(SendCall { call: 2, touched: 1..4, complete_before: 3 });
        assert_eq!(read(), [2, 1, 0]);
        tally.sent(SendCall { call: 3, touched: 3..5, complete_before: 5 });
        assert_eq!(read(), [2, 1, 2]);
    }

    /// One call carrying several whole requests counts once for each of them.
    #[test]
    fn one_call_carrying_several_requests_counts_for_each() {
        let mut spans = vec![span(0, 0), span(1, 2), span(3, 3)];
        let cells: Vec<Arc<AtomicU64>> = spans.iter().map(|span| span.sends.clone()).collect();
        SendTally { spans: &mut spans, started: 0, published: 0 }.sent(SendCall {
            call: 1,
            touched: 0..4,
            complete_before: 4,
        });
        assert_eq!(cells.iter().map(|cell| cell.load(Ordering::Acquire)).collect::<Vec<_>>(), [1, 1, 1]);
    }
}
