//! Our clients against peers that misbehave on purpose.
//!
//! Every test is bounded in time and talks only to loopback. The peers here are fakes on 127.0.0.1: a "dribbler"
//! accepts a connection, sends an opening that promises a large answer, then one byte every 200 ms. Each client
//! operation (a handshake exchange, an HTTP metadata request, an etcd call, a tcp transfer) must end within its one
//! overall deadline plus a small margin, with an error that names the peer and the deadline.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aiv_transport::config::EngineConfig;
use aiv_transport::metadata::etcd::EtcdStore;
use aiv_transport::metadata::handshake::{Frame, FrameKind, HandshakeClient, HandshakeServer, HandshakeState};
use aiv_transport::metadata::http::HttpStore;
use aiv_transport::metadata::store::KeyValueStore;
use aiv_transport::metadata::{BufferDescriptor, SegmentDescriptor};
use aiv_transport::{Opcode, Protocol, TransferEngine, TransferRequest, TransferState};

use crate::captured_log;

/// How often the dribbler sends its next byte.
const DRIBBLE: Duration = Duration::from_millis(200);
/// Slack allowed past a deadline (thread wake-ups, one tick of a socket timeout).
const MARGIN: Duration = Duration::from_millis(700);

/// A fake peer on loopback: each connection gets `opening` at once, then one byte of `filler` every [`DRIBBLE`],
/// until the client closes or the fake is dropped. Records when each connection ended.
struct Dribbler {
    port: u16,
    stop: Arc<AtomicBool>,
    closed_after: Arc<std::sync::Mutex<Vec<Duration>>>,
    thread: Option<JoinHandle<()>>,
}

impl Dribbler {
    fn start(opening: Vec<u8>, filler: u8) -> Dribbler {
        Dribbler::start_every(opening, filler, DRIBBLE)
    }

    /// [`Dribbler::start`], one byte every `interval`.
    fn start_every(opening: Vec<u8>, filler: u8, interval: Duration) -> Dribbler {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind dribbler");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let closed_after = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (stopping, closed) = (stop.clone(), closed_after.clone());
        let thread = std::thread::spawn(move || {
            let mut workers = Vec::new();
            while !stopping.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (opening, stopping, closed) = (opening.clone(), stopping.clone(), closed.clone());
                        workers.push(std::thread::spawn(move || {
                            dribble(stream, &opening, filler, interval, &stopping, &closed)
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            for worker in workers {
                let _ = worker.join();
            }
        });
        Dribbler { port, stop, closed_after, thread: Some(thread) }
    }

    fn closed_after(&self) -> Vec<Duration> {
        self.closed_after.lock().expect("lock").clone()
    }
}

impl Drop for Dribbler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn dribble(
    mut stream: TcpStream,
    opening: &[u8],
    filler: u8,
    interval: Duration,
    stop: &AtomicBool,
    closed: &std::sync::Mutex<Vec<Duration>>,
) {
    let accepted = Instant::now();
    // Swallow whatever the client sends, without ever blocking for long.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(5)));
    let mut sink = [0u8; 4096];
    if stream.write_all(opening).is_ok() {
        // Bounded: a dribbler never runs longer than this, whatever the client does.
        while !stop.load(Ordering::SeqCst) && accepted.elapsed() < Duration::from_secs(15) {
            match stream.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                }
                Err(_) => break,
            }
            if stream.write_all(&[filler]).is_err() {
                break;
            }
            std::thread::sleep(interval);
        }
    }
    closed.lock().expect("lock").push(accepted.elapsed());
}

fn assert_within(started: Instant, deadline: Duration, what: &str) {
    let took = started.elapsed();
    assert!(took <= deadline + MARGIN, "{what}: took {took:?}, the deadline is {deadline:?} (+{MARGIN:?} margin)");
}

#[test]
fn a_dribbling_handshake_peer_cannot_outlast_the_exchange_deadline() {
    // A reply that announces 1 MiB (the largest frame) and then sends it a byte at a time.
    let peer = Dribbler::start((1u64 << 20).to_le_bytes().to_vec(), b' ');
    let client = HandshakeClient { connect_timeout: Duration::from_millis(500), deadline: Duration::from_millis(800) };
    let started = Instant::now();
    let error = client.exchange("127.0.0.1", peer.port, &Frame::typed(FrameKind::Probe, b"{}".to_vec()));
    assert_within(started, client.deadline, "handshake exchange");
    let text = error.expect_err("a dribbled reply never completes").to_string();
    assert!(text.contains(&format!("127.0.0.1:{}", peer.port)) && text.contains("800ms"), "{text}");
}

#[test]
fn a_dribbling_http_metadata_server_cannot_outlast_the_request_deadline() {
    let answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{".to_vec();
    let peer = Dribbler::start(answer, b' ');
    let url = format!("http://127.0.0.1:{}/metadata", peer.port);
    let deadline = Duration::from_millis(900);
    let store = HttpStore::with_timeouts(&url, Duration::from_millis(500), deadline);
    let started = Instant::now();
    let error = store.get("mooncake/ram/dribble");
    assert_within(started, deadline, "http metadata get");
    let text = error.expect_err("a dribbled answer never completes").to_string();
    assert!(text.contains(&url) && text.contains("900ms"), "{text}");
}

#[test]
fn dribbling_etcd_endpoints_share_one_call_deadline() {
    let answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{".to_vec();
    let first = Dribbler::start(answer.clone(), b' ');
    let second = Dribbler::start(answer, b' ');
    let endpoints = vec![format!("127.0.0.1:{}", first.port), format!("127.0.0.1:{}", second.port)];
    let deadline = Duration::from_millis(900);
    let store = EtcdStore::with_timeouts(endpoints.clone(), Duration::from_millis(500), deadline);
    let started = Instant::now();
    let error = store.get("mooncake/ram/dribble");
    // Two endpoints, one deadline: not one deadline each.
    assert_within(started, deadline, "etcd get over two endpoints");
    let text = error.expect_err("a dribbled answer never completes").to_string();
    assert!(text.contains(&endpoints[0]) && text.contains("900ms"), "{text}");
}

#[test]
fn a_dribbling_tcp_data_peer_cannot_hold_a_transfer_or_its_connection_past_the_deadline() {
    tcp_dribbler_against_the_deadline(DRIBBLE);
}

/// A byte every 20 ms, well inside the client's socket tick: each receive makes progress, and the transfers'
/// deadline must still end the wait.
#[test]
fn a_tcp_data_peer_dribbling_faster_than_the_tick_cannot_hold_the_connection_past_the_deadline() {
    tcp_dribbler_against_the_deadline(Duration::from_millis(20));
}

fn tcp_dribbler_against_the_deadline(interval: Duration) {
    let deadline = Duration::from_millis(800);
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.transfer_timeout = deadline;
    let engine = TransferEngine::new(config).expect("engine with tcp starts");
    // Answers a READ with an OK status frame, then the 1 MiB payload a byte at a time.
    let status_ok = [0u8, 0, 0, 0, 0x56, 0x54, 0x43, 0x4D].to_vec();
    let peer = Dribbler::start_every(status_ok, 0xAB, interval);
    let state = Arc::new(HandshakeState::default());
    let handshake = HandshakeServer::bind("127.0.0.1", 15000..=17000, state.clone()).expect("handshake");
    let name = format!("127.0.0.1:{}", handshake.local_addr().port());
    let mut descriptor = SegmentDescriptor::new(name.clone(), vec!["tcp".into()]);
    descriptor.tcp_data_port = Some(peer.port);
    descriptor.tcp_proto_version = Some(2);
    descriptor.buffers = vec![BufferDescriptor::new(name.clone(), 0x10_0000, 1 << 20)];
    state.set_descriptor(Some(descriptor));
    let mut local = vec![0u8; 1 << 20];
    let addr = local.as_mut_ptr() as u64;
    // SAFETY: `local` outlives the engine (dropped below, before `local`), and is read only after the wait.
    unsafe { engine.register_memory(addr, local.len() as u64, "cpu:0") }.expect("register");
    let segment = engine.open_segment(&name).expect("open the dribbler's segment");
    let request = TransferRequest {
        opcode: Opcode::Read,
        source: addr,
        target_id: segment,
        target_offset: 0x10_0000,
        length: 1 << 20,
        protocol: Some(Protocol::Tcp),
    };
    let batch = engine.allocate_batch(1).expect("batch");
    let started = Instant::now();
    engine.submit_transfer(batch, &[request]).expect("submit");
    let _ = engine.wait_batch(batch);
    assert_within(started, deadline, "tcp READ from a dribbling peer");
    let status = engine.transfer_status(batch, 0).expect("status");
    assert!(matches!(status.state, TransferState::Failed | TransferState::Timeout), "{status:?}");
    // The client gives the connection up at the deadline too, instead of reading on byte by byte.
    let waited = Instant::now();
    while peer.closed_after().is_empty() && waited.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let closed = peer.closed_after();
    assert!(
        closed.first().is_some_and(|after| *after <= deadline + MARGIN + interval),
        "the dribbler's connection ended after {closed:?}; the deadline is {deadline:?}"
    );
    let _ = engine.free_batch(batch);
    drop(engine);
    handshake.stop();
    drop(local);
}

#[test]
fn a_dead_tcp_peer_costs_a_bounded_number_of_warnings_and_every_transfer_fails_in_time() {
    let log = captured_log();
    let deadline = Duration::from_secs(1);
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.transfer_timeout = deadline;
    let initiator = TransferEngine::new(config.clone()).expect("initiator starts");
    let target = TransferEngine::new(config).expect("target starts");
    let mut local = vec![7u8; 4096];
    let addr = local.as_mut_ptr() as u64;
    // SAFETY: `local` outlives the initiator (dropped below, first) and nothing reads it during the test.
    unsafe { initiator.register_memory(addr, local.len() as u64, "cpu:0") }.expect("register local");
    let mut remote = vec![0u8; 4096];
    let remote_addr = remote.as_mut_ptr() as u64;
    // SAFETY: the target is dropped before `remote`; no transfer reaches it once it is gone.
    unsafe { target.register_memory(remote_addr, remote.len() as u64, "cpu:0") }.expect("register remote");
    let segment = initiator.open_segment(target.name()).expect("open target");
    let port = initiator.segment(segment).expect("segment").descriptor.tcp_data_port.expect("tcp data port");
    drop(target);
    let request = TransferRequest {
        opcode: Opcode::Write,
        source: addr,
        target_id: segment,
        target_offset: remote_addr,
        length: 4096,
        protocol: Some(Protocol::Tcp),
    };
    let started = Instant::now();
    let mut transfers = 0u32;
    // Transfers that failed at once because the peer was backing off, and those that tried a connect.
    let (mut backed_off, mut dialled) = (0u32, 0u32);
    while started.elapsed() < Duration::from_secs(2) {
        let batch = initiator.allocate_batch(1).expect("batch");
        let submitted = Instant::now();
        initiator.submit_transfer(batch, &[request]).expect("submit");
        let _ = initiator.wait_batch(batch);
        assert_within(submitted, deadline, "a transfer to the dead peer");
        let status = initiator.transfer_status(batch, 0).expect("status");
        assert_eq!(status.state, TransferState::Failed, "transfer {transfers} to the dead peer: {status:?}");
        let failure = initiator.task_failure(batch, 0).expect("task").expect("a failed task has its failure");
        if failure.message().contains("reconnect backoff") {
            backed_off += 1;
            if backed_off == 1 {
                let message = failure.message();
                assert!(
                    message.contains(&format!("127.0.0.1:{port}")) && message.contains("next attempt in"),
                    "{message}"
                );
            }
        } else {
            dialled += 1;
        }
        initiator.free_batch(batch).expect("free");
        transfers += 1;
    }
    drop(initiator);
    drop(remote);
    let text = String::from_utf8_lossy(&log.lock().expect("log")).into_owned();
    let peer = port.to_string();
    let warnings = text.lines().filter(|line| line.contains("WARN") && line.contains(&peer)).count();
    assert!(transfers > 10, "the loop ran {transfers} transfers");
    // 10 ms doubling to 1 s: about ten connects per lane in 2 s, not one per transfer.
    assert!(dialled < 50 && backed_off > 0, "{dialled} transfers dialled the dead peer, {backed_off} backed off");
    assert!(
        (1..50).contains(&warnings),
        "{warnings} warnings about port {port} for {transfers} failed transfers in 2 s:\n{}",
        text.lines().take(20).collect::<Vec<_>>().join("\n")
    );
}

/// What a [`FakeDataServer`] does with a connection's first request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FakeMode {
    /// Closes the first connection right after reading its first request header (as a server evicting it would),
    /// serves every later one.
    CutFirst,
    /// Closes every connection right after reading its first request header.
    CutAll,
    /// Answers every request REJECTED and closes the connection.
    Reject,
}

/// A fake tcp data server speaking Mooncake's v2 wire over [`FAKE_LEN`] bytes at the peer address [`FAKE_BASE`].
struct FakeDataServer {
    port: u16,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    memory: Arc<std::sync::Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

const FAKE_BASE: u64 = 0x10_0000;
const FAKE_LEN: usize = 64 << 10;

impl FakeDataServer {
    fn start(mode: FakeMode) -> FakeDataServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind fake data server");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let memory = Arc::new(std::sync::Mutex::new(vec![0u8; FAKE_LEN]));
        let (stopping, counted, shared) = (stop.clone(), connections.clone(), memory.clone());
        let thread = std::thread::spawn(move || {
            let mut workers = Vec::new();
            while !stopping.load(Ordering::SeqCst) {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let index = counted.fetch_add(1, Ordering::SeqCst);
                let cut = mode == FakeMode::CutAll || (mode == FakeMode::CutFirst && index == 0);
                let (memory, stopping) = (shared.clone(), stopping.clone());
                workers.push(std::thread::spawn(move || serve_fake(stream, cut, mode, &memory, &stopping)));
            }
            for worker in workers {
                let _ = worker.join();
            }
        });
        FakeDataServer { port, connections, memory, stop, thread: Some(thread) }
    }
}

impl Drop for FakeDataServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve_fake(
    mut stream: TcpStream,
    cut: bool,
    mode: FakeMode,
    memory: &std::sync::Mutex<Vec<u8>>,
    stopping: &AtomicBool,
) {
    use aiv_transport::transport::tcp::wire::{RequestHeader, Status, WireOpcode};
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    loop {
        let mut bytes = [0u8; 24];
        let mut have = 0;
        while have < 24 {
            match stream.read(&mut bytes[have..]) {
                Ok(0) => return,
                Ok(got) => have += got,
                Err(_) if !stopping.load(Ordering::SeqCst) => continue,
                Err(_) => return,
            }
        }
        if cut {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return;
        }
        let header = RequestHeader::decode(&bytes);
        if mode == FakeMode::Reject {
            let _ = stream.write_all(&Status::REJECTED.encode());
            return;
        }
        let offset = (header.addr - FAKE_BASE) as usize;
        let range = offset..offset + header.size as usize;
        if header.opcode == WireOpcode::Write {
            let mut payload = vec![0u8; header.size as usize];
            let mut have = 0;
            while have < payload.len() {
                match stream.read(&mut payload[have..]) {
                    Ok(0) => return,
                    Ok(got) => have += got,
                    Err(_) if !stopping.load(Ordering::SeqCst) => continue,
                    Err(_) => return,
                }
            }
            memory.lock().expect("memory")[range].copy_from_slice(&payload);
            let _ = stream.write_all(&Status::OK.encode());
        } else {
            let data = memory.lock().expect("memory")[range].to_vec();
            let _ = stream.write_all(&Status::OK.encode());
            let _ = stream.write_all(&data);
        }
    }
}

/// An engine whose segment `name` points at a fake tcp data server on `port` (v2), through a handshake server that
/// serves its descriptor.
fn engine_toward_fake(port: u16) -> (TransferEngine, aiv_transport::SegmentId, HandshakeServer, Vec<u8>) {
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.transfer_timeout = Duration::from_secs(3);
    let engine = TransferEngine::new(config).expect("engine with tcp starts");
    let state = Arc::new(HandshakeState::default());
    let handshake = HandshakeServer::bind("127.0.0.1", 15000..=17000, state.clone()).expect("handshake");
    let name = format!("127.0.0.1:{}", handshake.local_addr().port());
    let mut descriptor = SegmentDescriptor::new(name.clone(), vec!["tcp".into()]);
    descriptor.tcp_data_port = Some(port);
    descriptor.tcp_proto_version = Some(2);
    descriptor.buffers = vec![BufferDescriptor::new(name.clone(), FAKE_BASE, FAKE_LEN as u64)];
    state.set_descriptor(Some(descriptor));
    let mut local: Vec<u8> = (0..FAKE_LEN).map(|i| (i % 241) as u8).collect();
    // SAFETY: the caller drops the engine before `local` (returned alongside it).
    unsafe { engine.register_memory(local.as_mut_ptr() as u64, local.len() as u64, "cpu:0") }.expect("register");
    let segment = engine.open_segment(&name).expect("open the fake's segment");
    (engine, segment, handshake, local)
}

/// Runs one transfer of `length` bytes between `local` and the fake's base; its state and failure.
fn one_transfer(
    engine: &TransferEngine,
    segment: aiv_transport::SegmentId,
    local: &[u8],
    opcode: Opcode,
    length: usize,
) -> (TransferState, Option<String>) {
    let request = TransferRequest {
        opcode,
        source: local.as_ptr() as u64,
        target_id: segment,
        target_offset: FAKE_BASE,
        length: length as u64,
        protocol: Some(Protocol::Tcp),
    };
    let batch = engine.allocate_batch(1).expect("batch");
    engine.submit_transfer(batch, &[request]).expect("submit");
    let _ = engine.wait_batch(batch);
    let state = engine.transfer_status(batch, 0).expect("status").state;
    let failure = engine.task_failure(batch, 0).expect("task").map(|failure| failure.message().to_owned());
    engine.free_batch(batch).expect("free");
    (state, failure)
}

/// A request the server cuts off (it closes the connection after reading the header, as a server evicting a
/// connection may) is sent once more on a fresh connection and completes.
#[test]
fn a_request_the_server_cut_off_is_sent_again_on_a_fresh_connection() {
    let fake = FakeDataServer::start(FakeMode::CutFirst);
    let (engine, segment, handshake, local) = engine_toward_fake(fake.port);
    let (state, failure) = one_transfer(&engine, segment, &local, Opcode::Write, 8192);
    assert_eq!(state, TransferState::Completed, "WRITE: {failure:?}");
    assert_eq!(fake.connections.load(Ordering::SeqCst), 2, "the cut connection and a fresh one");
    assert_eq!(fake.memory.lock().expect("memory")[..8192], local[..8192], "the WRITE's bytes arrived whole");
    drop(engine);
    handshake.stop();
}

/// A server that cuts every connection: the request is sent twice, then fails with a reason naming the cause.
/// A request the server answered REJECTED is not sent again.
#[test]
fn a_request_cut_twice_or_rejected_fails_naming_the_cause() {
    let fake = FakeDataServer::start(FakeMode::CutAll);
    let (engine, segment, handshake, local) = engine_toward_fake(fake.port);
    let (state, failure) = one_transfer(&engine, segment, &local, Opcode::Read, 4096);
    assert_eq!(state, TransferState::Failed);
    let failure = failure.expect("a failed task has its failure");
    assert!(failure.contains("the server closed the connection") && failure.contains("second time"), "{failure}");
    assert_eq!(fake.connections.load(Ordering::SeqCst), 2, "sent once more, not again and again");
    drop(engine);
    handshake.stop();

    let fake = FakeDataServer::start(FakeMode::Reject);
    let (engine, segment, handshake, local) = engine_toward_fake(fake.port);
    let (state, failure) = one_transfer(&engine, segment, &local, Opcode::Write, 4096);
    assert_eq!(state, TransferState::Failed);
    assert!(failure.as_deref().is_some_and(|f| f.contains("rejected")), "{failure:?}");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(fake.connections.load(Ordering::SeqCst), 1, "a rejected request is not sent again");
    drop(engine);
    handshake.stop();
}

/// A peer whose descriptor names no tcp data port: every transfer to it is refused before sending, and a thousand
/// of them cost a few log lines, not one each.
#[test]
fn transfers_refused_before_sending_are_logged_a_few_times_a_second() {
    let log = captured_log();
    let count_lines = || {
        String::from_utf8_lossy(&log.lock().unwrap_or_else(|p| p.into_inner()))
            .lines()
            .filter(|line| line.contains("refused before sending"))
            .count()
    };
    let engine = TransferEngine::new(EngineConfig::new("127.0.0.1")).expect("engine with tcp starts");
    let state = Arc::new(HandshakeState::default());
    let handshake = HandshakeServer::bind("127.0.0.1", 15000..=17000, state.clone()).expect("handshake");
    let name = format!("127.0.0.1:{}", handshake.local_addr().port());
    let mut descriptor = SegmentDescriptor::new(name.clone(), vec!["tcp".into()]);
    descriptor.buffers = vec![BufferDescriptor::new(name.clone(), FAKE_BASE, FAKE_LEN as u64)];
    state.set_descriptor(Some(descriptor));
    let mut local = vec![0u8; 4096];
    // SAFETY: `local` outlives the engine (dropped below, first).
    unsafe { engine.register_memory(local.as_mut_ptr() as u64, local.len() as u64, "cpu:0") }.expect("register");
    let segment = engine.open_segment(&name).expect("open the segment without a data port");
    let before = count_lines();
    let started = Instant::now();
    let request = TransferRequest {
        opcode: Opcode::Write,
        source: local.as_ptr() as u64,
        target_id: segment,
        target_offset: FAKE_BASE,
        length: 4096,
        protocol: Some(Protocol::Tcp),
    };
    let batch = engine.allocate_batch(1000).expect("batch");
    engine.submit_transfer(batch, &vec![request; 1000]).expect("submit");
    let _ = engine.wait_batch(batch);
    for task in [0, 999] {
        assert_eq!(engine.transfer_status(batch, task).expect("status").state, TransferState::Failed);
    }
    let lines = count_lines() - before;
    let seconds = started.elapsed().as_secs() + 1;
    engine.free_batch(batch).expect("free");
    drop(engine);
    handshake.stop();
    drop(local);
    assert!(lines as u64 <= 5 * (seconds + 1), "{lines} lines for 1000 refused transfers");
}
