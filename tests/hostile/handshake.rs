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
