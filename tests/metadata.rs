//! Metadata layer end to end, over real sockets on loopback only.
//!
//! Tiers here: the handshake server's answers, the HTTP metadata server's REST rules, and two engines in this process
//! finding each other through each backend (P2P handshake, HTTP, etcd). Hostile bytes and floods against these
//! servers: the hostile tier (`tests/hostile/`). The etcd tests need a running
//! etcd: `export AIV_TEST_ETCD="$(tests/support/etcd.sh start | tail -n 1)"`; without it they are skipped (a
//! `SKIPPED` line, tests/common/skip.rs), except under `CI=true`, where they fail. Likewise the IPv6 test without an
//! IPv6 loopback.

#[path = "common/http.rs"]
mod http_support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use aiv_transport::metadata::handshake::{Frame, FrameForm, FrameKind, HandshakeClient};
use aiv_transport::metadata::http_server::MetadataHttpServer;
use aiv_transport::metadata::{MetadataOptions, SegmentDescriptor};
use aiv_transport::{EngineConfig, EngineError, TransferEngine};

#[path = "common/flood.rs"]
mod flood;
#[path = "common/skip.rs"]
mod skip;

/// A registered buffer that outlives the engine using it.
struct Buffer(Vec<u8>);

impl Buffer {
    fn register(engine: &TransferEngine, length: usize) -> Buffer {
        let buffer = Buffer(vec![0u8; length]);
        // SAFETY: the Vec is neither moved nor freed before the engine is dropped (every test drops engines first)
        // and nothing transfers through it.
        unsafe { engine.register_memory(buffer.addr(), length as u64, "cpu:0") }.expect("register memory");
        buffer
    }

    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
}

fn engine(local_hostname: &str, metadata_server: &str) -> TransferEngine {
    let mut config = EngineConfig::new(local_hostname);
    config.metadata_server = metadata_server.to_owned();
    TransferEngine::with_metadata_options(config, &MetadataOptions::default()).expect("engine starts")
}

/// Two engines publish, open each other by name, see each other's buffers, and a dropped one cannot be opened.
fn two_engines_find_each_other(first: TransferEngine, second: TransferEngine) {
    let first_buffer = Buffer::register(&first, 4096);
    let second_buffer = Buffer::register(&second, 8192);

    let id = first.open_segment(second.name()).expect("first opens second by name");
    let seen = first.segment(id).expect("open segment");
    let buffers: Vec<(u64, u64)> = seen.descriptor.buffers.iter().map(|b| (b.addr, b.length)).collect();
    assert_eq!(buffers, vec![(second_buffer.addr(), 8192)]);
    assert_eq!(first.get_first_buffer_address(second.name()).expect("first buffer"), second_buffer.addr());
    assert_eq!(first.open_segment(second.name()).expect("cached"), id, "an open name keeps its id");

    first.metadata().send_notification(second.name(), "kv ready").expect("notify through rpc_meta");
    let received = second.metadata().take_notifications();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!((received[0].name.as_str(), received[0].message.as_str()), (first.name(), "kv ready"));

    let back = second.open_segment(first.name()).expect("second opens first by name");
    assert_eq!(second.segment(back).expect("segment").descriptor.buffers[0].addr, first_buffer.addr());

    // A registration after the open is seen after refresh.
    let more = Buffer::register(&second, 1024);
    assert_eq!(first.segment(id).expect("cached").descriptor.buffers.len(), 1, "the cache is not refetched by itself");
    first.refresh_segment(id).expect("refresh");
    let refreshed: Vec<u64> = first.segment(id).expect("refreshed").descriptor.buffers.iter().map(|b| b.addr).collect();
    assert!(refreshed.contains(&more.addr()) && refreshed.len() == 2, "{refreshed:?}");

    let second_name = second.name().to_owned();
    drop(second);
    first.close_segment(id).expect("close");
    let started = Instant::now();
    let error = first.open_segment(&second_name).expect_err("a dropped engine cannot be opened");
    assert!(started.elapsed() < Duration::from_secs(5), "bounded: {:?}", started.elapsed());
    assert!(matches!(error, EngineError::SegmentNotFound { .. }), "{error}");
    assert!(error.to_string().contains(&second_name), "{error}");
    drop(first);
    drop((first_buffer, second_buffer, more));
}

// ----- P2P handshake -----

#[test]
fn p2p_engines_are_named_by_their_rpc_port_and_find_each_other() {
    let first = engine("127.0.0.1:12345", "P2PHANDSHAKE");
    let second = engine("127.0.0.1", "P2PHANDSHAKE");
    for engine in [&first, &second] {
        let port = engine.rpc_port();
        assert!((15000..=17000).contains(&port), "rpc port {port} drawn from MC_MIN/MAX_RPC_PORT defaults");
        assert_eq!(engine.name(), format!("127.0.0.1:{port}"), "the port of local_hostname is ignored");
        HandshakeClient::default().probe("127.0.0.1", port).expect("probe answers");
    }
    let ascend_form = format!("{}:npu_3", second.name());
    let id = first.open_segment(&ascend_form).expect("Ascend's ip:port:npu_N form reaches the same handshake server");
    assert_eq!(first.segment(id).expect("segment").descriptor.name, second.name());
    first.close_segment(id).expect("close");
    let rpc = first.metadata().fetch_rpc_meta(second.name()).expect("rpc_meta of a P2P name");
    assert_eq!((rpc.ip_or_host_name.as_str(), rpc.rpc_port), ("127.0.0.1", second.rpc_port()));
    two_engines_find_each_other(first, second);
}

#[test]
fn p2p_works_over_ipv6_loopback_when_available() {
    if let Err(error) = std::net::TcpListener::bind("[::1]:0") {
        skip::skip(&format!("this machine has no IPv6 loopback (binding [::1]:0: {error})"));
        return;
    }
    let first = engine("::1", "P2PHANDSHAKE");
    let second = engine("[::1]:7", "P2PHANDSHAKE");
    assert_eq!(second.name(), format!("[::1]:{}", second.rpc_port()));
    two_engines_find_each_other(first, second);
}

#[test]
fn p2p_server_binds_the_configured_host_only() {
    let engine = engine("127.0.0.1", "P2PHANDSHAKE");
    let port = engine.rpc_port();
    assert_eq!(engine.metadata().rpc_address(), SocketAddr::from(([127, 0, 0, 1], port)), "bound to the host given");
    // 127.0.0.2 is loopback too on Linux, but the server bound 127.0.0.1 only.
    let other = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 2], port)), Duration::from_secs(1));
    assert!(other.is_err(), "the handshake server must not listen on all interfaces");
}

#[test]
fn p2p_open_of_a_name_nobody_serves_fails_fast_and_clearly() {
    let engine = engine("127.0.0.1", "P2PHANDSHAKE");
    // A port nobody listens on: bind, note, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let started = Instant::now();
    let error = engine.open_segment(&format!("127.0.0.1:{port}")).expect_err("nobody there");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    let message = error.to_string();
    assert!(matches!(error, EngineError::SegmentNotFound { .. }), "{message}");
    assert!(message.contains(&format!("127.0.0.1:{port}")) && message.contains("connect"), "{message}");
    let error = engine.open_segment("no-port-here").expect_err("a P2P name needs a port");
    assert!(error.to_string().contains("has no port"), "{error}");
}

/// Sends raw bytes, half-closes, and returns what the server sent back before closing.
fn send_raw(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(8))).expect("timeout");
    stream.write_all(bytes).expect("write");
    stream.shutdown(Shutdown::Write).expect("half close");
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).expect("the server closes the connection (no hang)");
    reply
}

fn exchange_raw(port: u16, frame: &Frame) -> Frame {
    let bytes = send_raw(port, &frame.encode());
    let (reply, used) = Frame::decode(&bytes).expect("a reply frame");
    assert_eq!(used, bytes.len(), "one frame, nothing after it");
    reply
}

#[test]
fn handshake_server_answers_each_kind_in_the_senders_form() {
    let engine = engine("127.0.0.1", "P2PHANDSHAKE");
    let _buffer = Buffer::register(&engine, 4096);
    let port = engine.rpc_port();

    let probe = exchange_raw(port, &Frame::typed(FrameKind::Probe, b"{}".to_vec()));
    assert_eq!(probe.form, FrameForm::Typed(FrameKind::Probe));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&probe.payload).expect("json"),
        serde_json::json!({"status": "success"})
    );

    let notify = Frame::typed(FrameKind::Notify, br#"{"name":"peer-9","notify_msg":"hello"}"#.to_vec());
    let reply = exchange_raw(port, &notify);
    assert_eq!(reply.form, FrameForm::Typed(FrameKind::Notify));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&reply.payload).expect("json"),
        serde_json::json!({"name": "", "notify_msg": "success"})
    );
    let notes = engine.metadata().take_notifications();
    assert_eq!((notes[0].name.as_str(), notes[0].message.as_str()), ("peer-9", "hello"));

    let connection = br#"{"local_nic_path":"x","local_lid":0,"local_gid":"","peer_nic_path":"y","qp_num":[],"payload":"","reply_msg":""}"#;
    for form in [FrameForm::Typed(FrameKind::Connection), FrameForm::Legacy] {
        let reply = exchange_raw(port, &Frame { form, payload: connection.to_vec() });
        assert_eq!(reply.form, form, "the reply keeps the request's form");
        let value: serde_json::Value = serde_json::from_slice(&reply.payload).expect("json");
        assert_eq!(value["reply_msg"], "", "a TCP-only peer accepts: {value}");
        assert_eq!(value["qp_num"], serde_json::json!([]));
    }

    let ours = SegmentDescriptor::new("127.0.0.1:1", vec!["tcp".into()]).to_json();
    let reply = exchange_raw(port, &Frame::typed(FrameKind::Metadata, ours));
    assert_eq!(reply.form, FrameForm::Typed(FrameKind::Metadata));
    let theirs = SegmentDescriptor::from_json(&reply.payload).expect("the server's descriptor");
    assert_eq!(theirs.name, engine.name());
    assert_eq!(theirs.buffers.len(), 1);
    assert!(!theirs.timestamp.is_empty(), "published descriptors carry a timestamp");
}

// ----- HTTP metadata server and backend -----

fn http_server() -> MetadataHttpServer {
    MetadataHttpServer::start(SocketAddr::from(([127, 0, 0, 1], 0))).expect("metadata server starts")
}

/// One raw HTTP/1.1 request; returns (status, body).
fn http(server: &MetadataHttpServer, method: &str, target: &str, body: &[u8]) -> (u16, String) {
    http_support::raw_http(server.local_addr(), method, target, body)
}

#[test]
fn http_metadata_server_follows_mooncakes_rest_rules() {
    let server = http_server();
    let key = "/metadata?key=mooncake%2Fram%2F127.0.0.1%3A15001";
    assert_eq!(http(&server, "GET", key, b"").0, 404, "absent key");
    let value = br#"{"name":"127.0.0.1:15001","protocol":"tcp","buffers":[]}"#;
    assert_eq!(http(&server, "PUT", key, value).0, 200);
    assert_eq!(http(&server, "GET", key, b""), (200, String::from_utf8_lossy(value).into_owned()), "raw body back");
    let replaced = br#"{"name":"127.0.0.1:15001","protocol":"tcp","buffers":[],"x":1}"#;
    assert_eq!(http(&server, "PUT", key, replaced).0, 200, "ram keys may be replaced");
    assert_eq!(http(&server, "GET", key, b"").1, String::from_utf8_lossy(replaced));
    // PUT stores the raw body, JSON or not.
    assert_eq!(http(&server, "PUT", "/metadata?key=raw", b"\x00not json").0, 200);
    assert_eq!(http(&server, "GET", "/metadata?key=raw", b"").1.as_bytes(), b"\x00not json");

    let rpc = "/metadata?key=mooncake%2Frpc_meta%2F127.0.0.1%3A15001";
    assert_eq!(http(&server, "PUT", rpc, br#"{"ip_or_host_name":"127.0.0.1","rpc_port":15001}"#).0, 200);
    let (status, body) = http(&server, "PUT", rpc, br#"{"ip_or_host_name":"127.0.0.1","rpc_port":15002}"#);
    assert_eq!((status, body.as_str()), (400, "Duplicate rpc_meta key not allowed"));
    assert!(http(&server, "GET", rpc, b"").1.contains("15001"), "the first rpc_meta stays");

    assert_eq!(http(&server, "DELETE", key, b"").0, 200);
    assert_eq!(http(&server, "DELETE", key, b"").0, 404, "already gone");
    assert_eq!(http(&server, "GET", key, b"").0, 404);
    assert_eq!(http(&server, "DELETE", rpc, b"").0, 200);
    assert_eq!(http(&server, "PUT", rpc, b"{}").0, 200, "an rpc_meta key may be written again once deleted");

    for target in ["/metadata", "/metadata?key=", "/metadata?key=%20%20", "/metadata?other=1"] {
        for method in ["GET", "PUT", "DELETE"] {
            assert_eq!(http(&server, method, target, b"").0, 400, "{method} {target}: missing or blank key");
        }
    }
    for method in ["POST", "PATCH", "HEAD", "OPTIONS"] {
        assert_eq!(http(&server, method, key, b"").0, 405, "{method}");
        assert_eq!(http(&server, method, "/metadata", b"").0, 400, "{method}: the key is checked first, as Mooncake");
    }
    // Keys are trimmed, as Mooncake's server does.
    assert_eq!(http(&server, "PUT", "/metadata?key=%20spaced%20", b"v").0, 200);
    assert_eq!(http(&server, "GET", "/metadata?key=spaced", b""), (200, "v".to_owned()));
    assert_eq!(http(&server, "GET", "/elsewhere?key=a", b"").0, 404);

    // Garbage instead of HTTP gets an error answer or a close, never a hang, and the server keeps serving.
    let mut garbage = TcpStream::connect(server.local_addr()).expect("connect");
    garbage.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    garbage.write_all(b"\x16\x03\x01\x00\xff garbage\r\n\r\n").expect("send");
    let mut answer = Vec::new();
    garbage.read_to_end(&mut answer).expect("closed, not hung");
    assert!(answer.is_empty() || answer.starts_with(b"HTTP/1.1 400"), "{:?}", String::from_utf8_lossy(&answer));
    assert_eq!(http(&server, "GET", "/metadata?key=raw", b"").0, 200, "still serving");
}

#[test]
fn http_backend_publishes_mooncake_keys_and_engines_find_each_other() {
    let server = http_server();
    let url = server.url();
    let first = engine("127.0.0.1:17101", &url);
    let second = engine("127.0.0.1:17102", &url);
    assert_eq!(second.name(), "127.0.0.1:17102", "with a store the name is local_hostname as given");

    let (status, descriptor) = http(&server, "GET", "/metadata?key=mooncake%2Fram%2F127.0.0.1%3A17102", b"");
    assert_eq!(status, 200, "descriptor written at init");
    assert_eq!(SegmentDescriptor::from_json(descriptor.as_bytes()).expect("descriptor").name, "127.0.0.1:17102");
    let (status, rpc) = http(&server, "GET", "/metadata?key=mooncake%2Frpc_meta%2F127.0.0.1%3A17102", b"");
    assert_eq!(status, 200, "rpc_meta written at init");
    let rpc: serde_json::Value = serde_json::from_str(&rpc).expect("rpc_meta json");
    assert_eq!(rpc, serde_json::json!({"ip_or_host_name": "127.0.0.1", "rpc_port": second.rpc_port()}));
    HandshakeClient::default().probe("127.0.0.1", second.rpc_port()).expect("handshake server runs with a store too");

    // A second engine under a taken name is refused by the server's rpc_meta rule.
    let mut config = EngineConfig::new("127.0.0.1:17102");
    config.metadata_server = url.clone();
    let error = TransferEngine::with_metadata_options(config, &MetadataOptions::default()).expect_err("duplicate");
    assert!(error.to_string().contains("Duplicate rpc_meta key not allowed"), "{error}");
    assert_eq!(http(&server, "GET", "/metadata?key=mooncake%2Fram%2F127.0.0.1%3A17102", b"").0, 200, "untouched");

    two_engines_find_each_other(first, second);
    for key in ["ram", "rpc_meta"] {
        for port in [17101, 17102] {
            let target = format!("/metadata?key=mooncake%2F{key}%2F127.0.0.1%3A{port}");
            assert_eq!(http(&server, "GET", &target, b"").0, 404, "{key} of {port} removed on drop");
        }
    }
}

/// A peer publishes its descriptor before it registers memory (Mooncake's transfer_engine_bench target does): an
/// engine that asked for the first buffer in between has the empty descriptor cached, and must still see the buffer
/// once it is registered, without an explicit refresh.
#[test]
fn the_first_buffer_address_of_a_peer_that_registers_after_the_open_is_found() {
    let server = http_server();
    let url = server.url();
    let first = engine("127.0.0.1:17111", &url);
    let second = engine("127.0.0.1:17112", &url);
    let error = first.get_first_buffer_address(second.name()).expect_err("no buffer yet");
    assert!(error.to_string().contains("exposes no buffer"), "{error}");
    let buffer = Buffer::register(&second, 4096);
    let deadline = Instant::now() + Duration::from_secs(5);
    let found = loop {
        match first.get_first_buffer_address(second.name()) {
            Ok(address) => break address,
            Err(error) => assert!(Instant::now() < deadline, "never found after registration: {error}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(found, buffer.addr());
    drop((first, second));
    drop(buffer);
}

#[test]
fn http_backend_uses_the_cluster_prefix_and_rejects_malformed_descriptors() {
    let server = http_server();
    let mut config = EngineConfig::new("127.0.0.1:17201");
    config.metadata_server = server.url();
    let options = MetadataOptions { cluster_id: Some("blue".into()), ..MetadataOptions::default() };
    let engine = TransferEngine::with_metadata_options(config, &options).expect("engine");
    assert_eq!(http(&server, "GET", "/metadata?key=mooncake%2Fblue%2Fram%2F127.0.0.1%3A17201", b"").0, 200);
    assert_eq!(http(&server, "GET", "/metadata?key=mooncake%2Fblue%2Frpc_meta%2F127.0.0.1%3A17201", b"").0, 200);

    let cases = [
        ("bad-json", &b"{\"name\": "[..], "parse segment descriptor"),
        (
            "bad-buffer",
            &br#"{"name":"bad-buffer","protocol":"tcp","buffers":[{"name":"","addr":1,"length":1}]}"#[..],
            "empty name",
        ),
    ];
    for (name, body, expected) in cases {
        assert_eq!(http(&server, "PUT", &format!("/metadata?key=mooncake%2Fblue%2Fram%2F{name}"), body).0, 200);
        let error = engine.open_segment(name).expect_err("malformed");
        assert!(matches!(error, EngineError::MalformedDescriptor { .. }), "{error}");
        assert_eq!(error.mooncake_code(), 103);
        assert!(error.to_string().contains(expected) && error.to_string().contains(name), "{error}");
    }
    let error = engine.open_segment("nobody").expect_err("absent");
    assert!(error.to_string().contains("mooncake/blue/ram/nobody"), "{error}");
}

#[test]
fn unreachable_or_unsupported_metadata_fails_fast_and_names_the_endpoint() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    for server in [format!("http://127.0.0.1:{port}/metadata"), format!("etcd://127.0.0.1:{port}")] {
        let mut config = EngineConfig::new("127.0.0.1:17301");
        config.metadata_server = server.clone();
        let started = Instant::now();
        let error = TransferEngine::with_metadata_options(config, &MetadataOptions::default()).expect_err("no server");
        assert!(started.elapsed() < Duration::from_secs(5), "{server}: {:?}", started.elapsed());
        assert!(matches!(error, EngineError::Metadata { .. }), "{error}");
        assert!(error.to_string().contains(&format!("127.0.0.1:{port}")), "{error}");
    }
    let mut config = EngineConfig::new("127.0.0.1");
    config.metadata_server = "redis://127.0.0.1:6379".into();
    let error = TransferEngine::new(config).expect_err("redis");
    assert!(error.to_string().contains("redis metadata servers are not supported"), "{error}");
}

/// A listener that accepts connections and never answers; keeps them open until the test ends.
fn stalled_listener() -> (u16, std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let mut held = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while finished.try_recv().is_err() && Instant::now() < deadline {
            if let Ok((stream, _)) = listener.accept() {
                held.push(stream);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    (port, holder, done)
}

#[test]
fn stalled_peers_and_stores_time_out_with_a_clear_error() {
    let (p2p_port, p2p_holder, p2p_done) = stalled_listener();
    let (http_port, http_holder, http_done) = stalled_listener();
    let engine = engine("127.0.0.1", "P2PHANDSHAKE");
    let http_attempt = std::thread::spawn(move || {
        let mut config = EngineConfig::new("127.0.0.1:17601");
        config.metadata_server = format!("http://127.0.0.1:{http_port}/metadata");
        let started = Instant::now();
        let result = TransferEngine::with_metadata_options(config, &MetadataOptions::default());
        (result.map(|_| ()), started.elapsed())
    });

    let started = Instant::now();
    let error = engine.open_segment(&format!("127.0.0.1:{p2p_port}")).expect_err("a peer that never answers");
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(6), "bounded by the client's read timeout: {waited:?}");
    assert!(matches!(error, EngineError::Handshake { .. }), "{error}");
    assert!(error.to_string().contains(&format!("127.0.0.1:{p2p_port}")), "{error}");
    assert!(error.to_string().contains("timed out"), "{error}");

    let (result, waited) = http_attempt.join().expect("thread");
    let error = result.expect_err("a store that never answers");
    assert!(waited < Duration::from_secs(6), "bounded by the 3 s request timeout: {waited:?}");
    assert!(matches!(error, EngineError::Metadata { .. }), "{error}");
    assert!(error.to_string().contains(&format!("127.0.0.1:{http_port}")), "{error}");
    assert!(error.to_string().contains("timed out"), "{error}");

    for (done, holder) in [(p2p_done, p2p_holder), (http_done, http_holder)] {
        let _ = done.send(());
        holder.join().expect("holder");
    }
}

#[test]
fn metadata_server_cli_serves_on_loopback() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_aiv"))
        .args(["metadata-server", "--port", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("aiv runs");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).map(|n| n == 1).unwrap_or(false) && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&line).into_owned();
    let result = std::panic::catch_unwind(|| {
        let url = line.split_whitespace().find(|word| word.starts_with("http://127.0.0.1:")).expect(&line);
        let first = engine("127.0.0.1:17401", url);
        let second = engine("127.0.0.1:17402", url);
        two_engines_find_each_other(first, second);
    });
    child.kill().expect("stop the server we started");
    child.wait().expect("reaped");
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

// ----- etcd -----

fn etcd_endpoint() -> Option<String> {
    match std::env::var("AIV_TEST_ETCD") {
        Ok(endpoint) if !endpoint.trim().is_empty() => Some(endpoint.trim().to_owned()),
        _ => {
            skip::skip(
                "AIV_TEST_ETCD is not set (run `export AIV_TEST_ETCD=\"$(tests/support/etcd.sh start | tail -n 1)\"` \
                 to test against a real etcd on loopback)",
            );
            None
        }
    }
}

/// A cluster id no other run uses, so tests never see each other's keys.
fn fresh_cluster() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos();
    format!("aiv-test-{}-{nanos}", std::process::id())
}

#[test]
fn etcd_backend_engines_find_each_other() {
    let Some(endpoint) = etcd_endpoint() else { return };
    let options = MetadataOptions { cluster_id: Some(fresh_cluster()), ..MetadataOptions::default() };
    let start = |name: &str, server: &str| {
        let mut config = EngineConfig::new(name);
        config.metadata_server = server.to_owned();
        TransferEngine::with_metadata_options(config, &options).expect("engine on etcd")
    };
    let first = start("127.0.0.1:17501", &format!("etcd://{endpoint}"));
    let second = start("127.0.0.1:17502", &endpoint); // no scheme means etcd
    let rpc = first.metadata().fetch_rpc_meta(second.name()).expect("rpc_meta in etcd");
    assert_eq!((rpc.ip_or_host_name.as_str(), rpc.rpc_port), ("127.0.0.1", second.rpc_port()));
    two_engines_find_each_other(first, second);
    let observer = start("127.0.0.1:17503", &endpoint);
    let error = observer.metadata().fetch_rpc_meta("127.0.0.1:17502").expect_err("rpc_meta removed on drop");
    assert!(error.to_string().contains("rpc_meta"), "{error}");
}
