//! The P2P handshake port against random frames, hostile protocols, silence and a reconnecting flood; and the
//! handshake client against random replies.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use aiv_transport::metadata::handshake::{Frame, FrameForm, FrameKind, HandshakeClient};
use aiv_transport::metadata::{MetadataOptions, SegmentDescriptor};
use aiv_transport::{EngineConfig, TransferEngine};
use proptest::prelude::*;

use crate::flood;

/// A registered buffer that outlives the engine using it.
struct Buffer(Vec<u8>);

impl Buffer {
    fn register(engine: &TransferEngine, length: usize) -> Buffer {
        let buffer = Buffer(vec![0u8; length]);
        // SAFETY: the Vec is neither moved nor freed before the engine is dropped (every test drops engines first)
        // and nothing transfers through it.
        unsafe { engine.register_memory(buffer.0.as_ptr() as u64, length as u64, "cpu:0") }.expect("register memory");
        buffer
    }
}

fn engine(local_hostname: &str, metadata_server: &str) -> TransferEngine {
    let mut config = EngineConfig::new(local_hostname);
    config.metadata_server = metadata_server.to_owned();
    TransferEngine::with_metadata_options(config, &MetadataOptions::default()).expect("engine starts")
}

/// Sends `bytes`, half-closes and returns everything the server sends before it closes (bounded).
fn send_raw(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(8))).expect("timeout");
    // The server may refuse (and close) before everything is written.
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(Shutdown::Write);
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    reply
}

#[test]
fn handshake_server_closes_on_hostile_bytes_and_keeps_serving() {
    let engine = engine("127.0.0.1", "P2PHANDSHAKE");
    let port = engine.rpc_port();
    let mut oversize = ((1u64 << 20) + 1).to_le_bytes().to_vec();
    oversize.extend_from_slice(&[1, b'{', b'}']);
    let hostile: Vec<(&str, Vec<u8>)> = vec![
        ("HTTP request", b"GET /metadata?key=x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_vec()),
        ("TLS ClientHello", vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 0xaa, 0xbb]),
        ("zero length", vec![0; 8]),
        ("oversize length", oversize),
        ("truncated body", vec![50, 0, 0, 0, 0, 0, 0, 0, 1, b'{']),
        ("short garbage", b"\x01\x02\x03".to_vec()),
        ("typed frame, not JSON", Frame::typed(FrameKind::Metadata, b"not json at all".to_vec()).encode()),
        ("type byte only", vec![1, 0, 0, 0, 0, 0, 0, 0, 3]),
        ("notify without fields", Frame::typed(FrameKind::Notify, b"{\"x\":1}".to_vec()).encode()),
        ("legacy garbage", Frame { form: FrameForm::Legacy, payload: b"}{".to_vec() }.encode()),
    ];
    for (what, bytes) in hostile {
        let started = Instant::now();
        let reply = send_raw(port, &bytes);
        assert!(reply.is_empty(), "{what}: no reply expected, got {reply:?}");
        assert!(started.elapsed() < Duration::from_secs(6), "{what}: closed only after {:?}", started.elapsed());
        HandshakeClient::default().probe("127.0.0.1", port).unwrap_or_else(|error| panic!("after {what}: {error}"));
    }
    // A client that connects and says nothing is dropped by the server's read timeout, not kept forever; meanwhile
    // others are served.
    let mut silent = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    HandshakeClient::default().probe("127.0.0.1", port).expect("served while a silent client waits");
    silent.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut sink = Vec::new();
    let started = Instant::now();
    silent.read_to_end(&mut sink).expect("closed by the server");
    assert!(sink.is_empty() && started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
}

/// 300 connections to the handshake port that never send a frame and reconnect as soon as the server closes them:
/// 60 from 127.0.0.1 (the legitimate client's own address, over the per-source limit) and 30 from each of eight
/// other loopback addresses (together over the total). Every handshake of a legitimate client still succeeds,
/// promptly, and so does opening the segment from another engine.
#[test]
fn a_flood_of_reconnecting_idle_connections_keeps_no_handshake_out() {
    flood::raise_fd_limit();
    let target = engine("127.0.0.1", "P2PHANDSHAKE");
    let _buffer = Buffer::register(&target, 4096);
    let port = target.rpc_port();
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let own = flood::TcpFlood::start(address, &[flood::loopback_source(0)], 60);
    let others: Vec<_> = (1..9).map(flood::loopback_source).collect();
    let others = flood::TcpFlood::start(address, &others, 30);
    own.wait_for(32, Duration::from_secs(10));
    others.wait_for(200, Duration::from_secs(10));

    let client = HandshakeClient::default();
    let ours = SegmentDescriptor::new("127.0.0.1:1", vec!["tcp".into()]).to_json();
    let started = Instant::now();
    for round in 0..100 {
        client.probe("127.0.0.1", port).unwrap_or_else(|error| panic!("probe {round} under the flood: {error}"));
        let reply = client
            .exchange("127.0.0.1", port, &Frame::typed(FrameKind::Metadata, ours.clone()))
            .unwrap_or_else(|error| panic!("metadata {round} under the flood: {error}"));
        let theirs = SegmentDescriptor::from_json(&reply.payload).expect("the server's descriptor");
        assert_eq!(theirs.name, target.name());
    }
    let took = started.elapsed();
    let peer = engine("127.0.0.1", "P2PHANDSHAKE");
    peer.open_segment(target.name()).expect("another engine opens the target under the flood");
    let closed = own.closed_by_server.load(std::sync::atomic::Ordering::Relaxed)
        + others.closed_by_server.load(std::sync::atomic::Ordering::Relaxed);
    drop((own, others));
    eprintln!("handshake flood: 200 exchanges in {took:?}; the server closed {closed} flood connections");
    assert!(took < Duration::from_secs(10), "200 handshakes took {took:?}");
    assert!(closed > 0, "the flood met the server's limits");
}

/// A frame as a fuzzer builds it: a declared length (honest, short, long, zero, huge), a type byte (valid, legacy
/// form, unknown), and a payload (JSON the server knows, JSON it does not, garbage).
fn frame_bytes() -> impl Strategy<Value = Vec<u8>> {
    let payload = prop_oneof![
        Just(b"{}".to_vec()),
        Just(br#"{"name":"127.0.0.1:1","protocols":["tcp"],"buffers":[]}"#.to_vec()),
        Just(br#"{"local_segment_name":"a","message":"m"}"#.to_vec()),
        Just(br#"{"buffers":[{"name":"x","addr":18446744073709551615,"length":18446744073709551615}]}"#.to_vec()),
        Just(b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[".to_vec()),
        "[ -~]{0,200}".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..300),
    ];
    let declared = prop_oneof![
        3 => Just(None),
        1 => Just(Some(0u64)),
        1 => (1u64..64).prop_map(Some),
        1 => Just(Some((1 << 20) + 1)),
        1 => Just(Some(u64::MAX)),
    ];
    let type_byte = prop_oneof![(0u8..4).prop_map(Some), Just(None), any::<u8>().prop_map(Some)];
    let frame = (declared, type_byte, payload).prop_map(|(declared, type_byte, payload)| {
        let body_len = payload.len() + usize::from(type_byte.is_some());
        let mut out = declared.unwrap_or(body_len as u64).to_le_bytes().to_vec();
        out.extend(type_byte);
        out.extend_from_slice(&payload);
        out
    });
    prop_oneof![4 => frame, 1 => prop::collection::vec(any::<u8>(), 0..64)]
}

fn fuzzed_target() -> &'static (TransferEngine, Buffer) {
    static TARGET: std::sync::OnceLock<(TransferEngine, Buffer)> = std::sync::OnceLock::new();
    TARGET.get_or_init(|| {
        let engine = engine("127.0.0.1", "P2PHANDSHAKE");
        let buffer = Buffer::register(&engine, 4096);
        (engine, buffer)
    })
}

proptest! {
    #![proptest_config(crate::fuzz_config(200))]

    /// Whatever frame arrives, the server answers with one frame of the request's form or closes without a reply,
    /// promptly; after each case it still answers a probe and still describes the same segment.
    #[test]
    fn the_handshake_server_answers_every_frame_or_closes(bytes in frame_bytes()) {
        let (target, _buffer) = fuzzed_target();
        let port = target.rpc_port();
        let started = Instant::now();
        let reply = send_raw(port, &bytes);
        prop_assert!(started.elapsed() < Duration::from_secs(3), "closed after {:?}", started.elapsed());
        if !reply.is_empty() {
            let (frame, used) = Frame::decode(&reply).map_err(|error| TestCaseError::fail(format!("{error}: {reply:?}")))?;
            prop_assert_eq!(used, reply.len(), "one frame, nothing after it");
            prop_assert!(serde_json::from_slice::<serde_json::Value>(&frame.payload).is_ok(), "a JSON reply");
        }
        HandshakeClient::default().probe("127.0.0.1", port).map_err(|error| TestCaseError::fail(error.to_string()))?;
        let reply = HandshakeClient::default()
            .exchange("127.0.0.1", port, &Frame::typed(FrameKind::Metadata, b"{}".to_vec()))
            .map_err(|error| TestCaseError::fail(error.to_string()))?;
        let theirs = SegmentDescriptor::from_json(&reply.payload).map_err(|error| TestCaseError::fail(error.to_string()))?;
        prop_assert_eq!(theirs.name.as_str(), target.name());
        prop_assert_eq!(theirs.buffers.len(), 1, "the fuzz changed the published buffers");
    }
}

proptest! {
    #![proptest_config(crate::fuzz_config(64))]

    /// The handshake client, against a server replying anything: a probe and a metadata exchange each return within
    /// the client's one deadline (retries included), and a reply that is not one whole frame of the request's form
    /// is an error.
    #[test]
    fn the_handshake_client_survives_any_reply(answers in prop::collection::vec(frame_bytes(), 2)) {
        let fake = crate::FakeServer::start(answers.clone());
        let deadline = Duration::from_millis(400);
        let client = HandshakeClient { connect_timeout: deadline, deadline };
        let started = Instant::now();
        let probe = client.probe("127.0.0.1", fake.address.port());
        let metadata = client.exchange("127.0.0.1", fake.address.port(), &Frame::typed(FrameKind::Metadata, b"{}".to_vec()));
        prop_assert!(started.elapsed() < 2 * deadline + Duration::from_millis(700), "took {:?}", started.elapsed());
        if let Ok(reply) = metadata {
            prop_assert_eq!(reply.form, FrameForm::Typed(FrameKind::Metadata));
            // Retries (after a close without a reply) move later exchanges to later answers.
            let encoded = reply.encode();
            prop_assert!(answers.iter().any(|answer| answer.starts_with(&encoded)), "accepted a reply nobody sent");
        }
        drop(probe);
    }
}

/// A server that closes a connection before answering (what its admission does to an evicted connection) costs an
/// idempotent exchange a retry, not a failure; a Notify is never sent twice.
#[test]
fn a_connection_closed_unanswered_is_retried_only_when_the_request_is_idempotent() {
    let probe_reply = Frame::typed(FrameKind::Probe, br#"{"status":"success"}"#.to_vec()).encode();
    let fake = crate::FakeServer::start(vec![Vec::new(), Vec::new(), probe_reply]);
    HandshakeClient::default().probe("127.0.0.1", fake.address.port()).expect("a probe survives two unanswered closes");

    let notify_reply = Frame::typed(FrameKind::Notify, br#"{"status":"success"}"#.to_vec()).encode();
    let fake = crate::FakeServer::start(vec![Vec::new(), notify_reply]);
    let notify = Frame::typed(FrameKind::Notify, br#"{"local_segment_name":"a","message":"m"}"#.to_vec());
    let error =
        HandshakeClient::default().exchange("127.0.0.1", fake.address.port(), &notify).expect_err("not retried");
    assert!(error.to_string().contains("receive handshake reply"), "{error}");
}

/// A loopback listener the test owns: counts the connections it accepts and holds them open, silent (as a port that
/// answers nothing), until dropped.
struct Witness {
    address: SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Witness {
    fn start() -> Witness {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let address = listener.local_addr().expect("address");
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (counting, stopping) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stopping.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        counting.fetch_add(1, Ordering::SeqCst);
                        held.push(stream);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Witness { address, accepted, stop, thread: Some(thread) }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An engine on a twin device whose RDMA route is on (NIC on 127.0.0.1), with a short metadata deadline.
fn rdma_node() -> crate::aiv::Node {
    use aiv_transport::config::{LaunchMode, RouteMode};
    let options = aiv_transport::config::AivOptions {
        route: RouteMode::Rdma,
        rdma_host: Some("127.0.0.1".into()),
        rdma_sq_depth: 64,
        metadata_deadline: Some(Duration::from_millis(500)),
        metadata_connect_timeout: Some(Duration::from_millis(300)),
        ..crate::aiv::options(0, LaunchMode::Persistent, 8)
    };
    crate::aiv::node(options, 1 << 20)
}

/// A Connection request as an initiator sends it, naming `initiator_nic` as its NIC and `server` as itself.
fn connection_request(target: &crate::aiv::Node, initiator_nic: SocketAddr, server: Option<&str>) -> Frame {
    let nic = target.device.transport().rdma_advertisement().expect("the target's NIC is open").nic;
    let mut request = serde_json::json!({
        "local_nic_path": initiator_nic.to_string(), "local_lid": 0, "local_gid": "", "peer_nic_path": nic,
        "qp_num": [7], "payload": "", "reply_msg": ""
    });
    if let Some(server) = server {
        request["local_server_name"] = server.into();
    }
    Frame::typed(FrameKind::Connection, request.to_string())
}

/// The reply's `reply_msg` (empty: accepted).
fn reply_msg(reply: &Frame) -> String {
    let reply: serde_json::Value = serde_json::from_slice(&reply.payload).expect("a JSON reply");
    reply["reply_msg"].as_str().expect("a reply_msg").to_owned()
}

/// A Connection request whose `local_nic_path` names a listener the test owns, not the NIC of the peer it claims to
/// be, makes the target connect nowhere: each variant (no name, a name on another host, a registered peer whose
/// descriptor lists another NIC) is refused with a reply naming why, and the listener receives no connection. The
/// legitimate peer's RDMA transfer still works afterwards.
#[test]
fn a_connection_request_naming_a_foreign_nic_makes_the_target_connect_nowhere() {
    let target = rdma_node();
    let peer = rdma_node();
    let witness = Witness::start();
    let port = target.engine.rpc_port();
    let client = HandshakeClient::default();
    let other_host = format!("127.0.0.9:{}", peer.engine.rpc_port());
    let cases = [
        (None, "local_server_name"),
        (Some(other_host.as_str()), "another host"),
        (Some(peer.engine.name()), "is not the NIC segment"),
    ];
    let replies: Vec<_> = cases
        .iter()
        .map(|(server, _)| client.exchange("127.0.0.1", port, &connection_request(&target, witness.address, *server)))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(witness.accepted(), 0, "the target connected to the NIC a request named");
    for ((server, why), reply) in cases.iter().zip(replies) {
        let reply = reply.unwrap_or_else(|error| panic!("naming {server:?}: a reply expected, got {error}"));
        let refusal = reply_msg(&reply);
        assert!(refusal.contains(why), "naming {server:?}: refused for {why:?}, got {refusal:?}");
    }

    // The legitimate peer still sets its QP up with the target and moves bytes over RDMA.
    let segment = peer.engine.open_segment(target.engine.name()).expect("open the target");
    let request = aiv_transport::TransferRequest {
        opcode: aiv_transport::Opcode::Write,
        source: peer.buffer.addr(),
        target_id: segment,
        target_offset: target.buffer.addr(),
        length: 4096,
        protocol: None,
    };
    let batch = peer.engine.allocate_batch(1).expect("batch");
    peer.engine.submit_transfer(batch, &[request]).expect("submit");
    let state = peer.engine.wait_batch_for(batch, Duration::from_secs(10)).expect("wait").state;
    let reason = peer.engine.task_reason(batch, 0).expect("reason");
    assert_eq!(state, aiv_transport::TransferState::Completed, "{reason:?}");
}

/// Threads of this process a Connection handler can start: the metadata runtime's (its blocking pool included) and
/// the twin NICs' (one per QP).
fn handshake_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("aiv-metadata") || name.starts_with("cann-twin-nic"))
        .count()
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

/// 200 Connection requests at once, each naming a listener the test owns as its NIC and, as itself, a handshake
/// port on the sender's host that accepts and never answers (the lookup waits its whole deadline): the target holds
/// at most `handshake_max_connection_handlers` (4) handler calls, refuses the rest at once saying it is busy, and
/// its threads and descriptors stay within a small bound; the listener receives no connection.
#[test]
fn parallel_connection_requests_hold_a_bounded_number_of_threads() {
    crate::flood::raise_fd_limit();
    let target = rdma_node();
    let witness = Witness::start();
    let tarpit = Witness::start();
    let port = target.engine.rpc_port();
    let server = format!("127.0.0.1:{}", tarpit.address.port());
    let frame = connection_request(&target, witness.address, Some(&server)).encode();
    let (threads_before, descriptors_before) = (handshake_threads(), open_descriptors());
    let mut clients: Vec<TcpStream> = (0..200)
        .filter_map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
            stream.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
            stream.write_all(&frame).ok()?;
            Some(stream)
        })
        .collect();
    let sent = clients.len();
    let (mut threads_most, mut descriptors_most) = (0, 0);
    let sampling = Instant::now();
    while sampling.elapsed() < Duration::from_millis(1200) {
        threads_most = threads_most.max(handshake_threads());
        descriptors_most = descriptors_most.max(open_descriptors());
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut busy = 0;
    for client in &mut clients {
        client.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let Ok(reply) = Frame::read_from(client) else { continue };
        if reply_msg(&reply).contains("busy") {
            busy += 1;
        }
    }
    drop(clients);
    let thread_growth = threads_most.saturating_sub(threads_before);
    // The 200 client sockets are this test's own, not the target's.
    let descriptor_growth = descriptors_most.saturating_sub(descriptors_before + sent);
    eprintln!(
        "200 parallel Connection requests ({sent} sent): {busy} refused as busy; handshake threads +{thread_growth}, \
         descriptors +{descriptor_growth} (client sockets excluded); the tarpit saw {} lookups",
        tarpit.accepted()
    );
    assert_eq!(witness.accepted(), 0, "the target connected to the NIC a request named");
    assert!(busy > 0, "requests over the handler limit are refused as busy");
    assert!(thread_growth <= 12, "handshake threads grew by {thread_growth}");
    // Admission holds at most 32 connections of one source (two descriptors each, closed as their tasks end), and
    // each of the 4 handler calls at most one lookup (both of its ends are in this process, with the tarpit).
    assert!(descriptor_growth <= 2 * 32 + 48, "descriptors grew by {descriptor_growth}");
}
