//! The HTTP metadata server against random and oversized requests, and the HTTP store client against random
//! answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use aiv_transport::metadata::http::HttpStore;
use aiv_transport::metadata::http_server::{MetadataHttpServer, MetadataServerLimits, StoreLimits};
use aiv_transport::metadata::store::KeyValueStore;
use proptest::prelude::*;

use crate::{captured_log, http_support};

/// One raw HTTP/1.1 request to `address`; returns (status, body).
fn http(address: std::net::SocketAddr, method: &str, target: &str, body: &[u8]) -> (u16, String) {
    http_support::raw_http(address, method, target, body)
}

#[test]
fn the_http_metadata_store_is_bounded_in_bytes_and_keys_and_says_which_limit() {
    let log = captured_log();
    let limits = StoreLimits { max_body_bytes: 1024, max_total_bytes: 2500, max_keys: 3 };
    let server =
        MetadataHttpServer::start_with_limits("127.0.0.1:0".parse().expect("address"), limits).expect("server starts");
    let address = server.local_addr();
    let put = |key: &str, len: usize| http(address, "PUT", &format!("/metadata?key={key}"), &vec![b'x'; len]);
    let (status, body) = put("hostile-k0", 1025);
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("1024") && body.contains("max_body_bytes"), "{body}");
    // Each entry counts key (10 bytes) and value: 3 x 810 = 2430 of 2500.
    for key in ["hostile-k0", "hostile-k1", "hostile-k2"] {
        assert_eq!(put(key, 800).0, 200, "{key}");
    }
    let (status, body) = put("hostile-k3", 1);
    assert_eq!(status, 507, "a fourth key: {body}");
    assert!(body.contains("3 keys") && body.contains("max_keys"), "{body}");
    // Replacing a key counts the difference: 2430 - 810 + 860 = 2480 fits (adding 860 to 2430 would not).
    assert_eq!(put("hostile-k0", 850).0, 200, "a replacement within the total");
    let (status, body) = put("hostile-k0", 1000);
    assert_eq!(status, 507, "a replacement past the total: {body}");
    assert!(body.contains("2500") && body.contains("max_total_bytes"), "{body}");
    assert_eq!(http(address, "GET", "/metadata?key=hostile-k0", b"").1.len(), 850, "the refused PUT changed nothing");
    // A delete gives its bytes and its key back.
    assert_eq!(http(address, "DELETE", "/metadata?key=hostile-k2", b"").0, 200);
    assert_eq!(put("hostile-k3", 800).0, 200, "room again after a delete");
    // A flood of refusals costs a bounded number of warnings.
    let started = Instant::now();
    for _ in 0..200 {
        assert_eq!(put("hostile-k4", 1).0, 507);
    }
    let text = String::from_utf8_lossy(&log.lock().expect("log")).into_owned();
    let warnings = text.lines().filter(|line| line.contains("WARN") && line.contains("hostile-k")).count();
    let seconds = started.elapsed().as_secs() + 2;
    assert!(
        (1..=5 * seconds as usize + 5).contains(&warnings),
        "{warnings} refusal warnings for 204 refusals in {:?}",
        started.elapsed()
    );
    server.stop();
}

/// Runs `aiv <args>`, which must exit (within 10 s) with a failure; its stderr.
fn refused_start(args: &[&str]) -> String {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_aiv"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("aiv runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("aiv {args:?} kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
    assert!(!status.success(), "aiv {args:?}: {status:?}");
    stderr
}

#[test]
fn aiv_metadata_server_refuses_a_limit_outside_its_range_by_name() {
    for (flag, named) in [
        ("--max-keys", "max_keys = 0"),
        ("--max-connections", "metadata_server_max_connections = 0"),
        ("--max-buffered-bytes", "metadata_server_max_buffered_bytes = 0"),
        ("--request-timeout-ms", "metadata_server_request_timeout_ms = 0"),
    ] {
        let stderr = refused_start(&["metadata-server", "--port", "0", flag, "0"]);
        assert!(stderr.contains(named) && stderr.contains("1..="), "{flag} 0: {stderr}");
    }
    // The same limits from mooncake.json's "aiv" object, read when --config names a file.
    let config = std::env::temp_dir().join(format!("aiv-hostile-metadata-server-{}.json", std::process::id()));
    std::fs::write(&config, r#"{"local_hostname": "h", "aiv": {"metadata_server_max_connections": 0}}"#)
        .expect("write");
    let stderr = refused_start(&["--config", config.to_str().expect("utf-8 path"), "metadata-server", "--port", "0"]);
    let _ = std::fs::remove_file(&config);
    assert!(stderr.contains("aiv.metadata_server_max_connections") && stderr.contains("from 1 to 65536"), "{stderr}");
}

/// One request as a fuzzer builds it: a method, a target, a version, headers and a body, any of them malformed; or
/// raw bytes.
#[derive(Clone, Debug)]
enum HttpInput {
    Request { method: String, target: String, version: String, headers: Vec<(String, String)>, body: Vec<u8> },
    Raw(Vec<u8>),
}

impl HttpInput {
    fn bytes(&self) -> Vec<u8> {
        match self {
            HttpInput::Raw(bytes) => bytes.clone(),
            HttpInput::Request { method, target, version, headers, body } => {
                let mut out = format!("{method} {target} {version}\r\n").into_bytes();
                for (name, value) in headers {
                    out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(body);
                out
            }
        }
    }
}

/// Keys a fuzzed request may name: never [`GUARD_KEY`] (upper case), so what is stored under it must survive.
fn fuzz_key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9]{0,12}",
        Just(String::new()),
        Just("%20%20".to_owned()),
        Just("k%00ey".to_owned()),
        Just("%zz".to_owned()),
        "[a-z]{1,4}".prop_map(|key| format!("  {key}  ")),
        Just("x".repeat(9000)),
    ]
}

fn http_input() -> impl Strategy<Value = HttpInput> {
    let method =
        prop_oneof![Just("GET"), Just("PUT"), Just("DELETE"), Just("POST"), Just("HEAD"), Just("get"), Just("BREW")];
    let target = prop_oneof![
        fuzz_key().prop_map(|key| format!("/metadata?key={key}")),
        fuzz_key().prop_map(|key| format!("/metadata?other=1&key={key}&key=second")),
        Just("/metadata".to_owned()),
        Just("/".to_owned()),
        Just("*".to_owned()),
        "[ -~]{0,40}",
    ];
    let version = prop_oneof![Just("HTTP/1.1"), Just("HTTP/1.0"), Just("HTTP/2.0"), Just("HTTP/9"), Just("")];
    let header = prop_oneof![
        (0u64..5000).prop_map(|n| ("Content-Length".to_owned(), n.to_string())),
        Just(("Content-Length".to_owned(), "18446744073709551616".to_owned())),
        Just(("Content-Length".to_owned(), "-1".to_owned())),
        Just(("Transfer-Encoding".to_owned(), "chunked".to_owned())),
        Just(("Expect".to_owned(), "100-continue".to_owned())),
        Just(("Host".to_owned(), "127.0.0.1".to_owned())),
        ("[A-Za-z-]{1,12}", "[ -~]{0,30}"),
    ];
    let request =
        (method, target, version, prop::collection::vec(header, 0..5), prop::collection::vec(any::<u8>(), 0..1500))
            .prop_map(|(method, target, version, headers, body)| HttpInput::Request {
                method: method.to_owned(),
                target,
                version: version.to_owned(),
                headers,
                body,
            });
    prop_oneof![4 => request, 1 => prop::collection::vec(any::<u8>(), 0..600).prop_map(HttpInput::Raw)]
}

/// Stored before the fuzz and never named by it.
const GUARD_KEY: &str = "GUARD-KEY";

/// Sends `bytes` on a fresh connection, half-closes, and returns whatever comes back before the server closes.
fn exchange(address: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    // The server may close before it has read everything (a refused header): writing then fails, which is fine.
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut reply = Vec::new();
    let started = Instant::now();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the server kept the connection open past 5 s");
    }
    reply
}

fn fuzzed_server() -> &'static MetadataHttpServer {
    static SERVER: std::sync::OnceLock<MetadataHttpServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(|| {
        let limits = StoreLimits { max_body_bytes: 4096, max_total_bytes: 64 << 10, max_keys: 64 };
        let server = MetadataHttpServer::start_with_limits("127.0.0.1:0".parse().expect("address"), limits)
            .expect("server starts");
        let (status, _) =
            http_support::raw_http(server.local_addr(), "PUT", &format!("/metadata?key={GUARD_KEY}"), b"kept");
        assert_eq!(status, 200);
        server
    })
}

proptest! {
    #![proptest_config(crate::fuzz_config(300))]

    /// Whatever arrives, the server answers with an HTTP status line or closes, within a bounded time; what it stores
    /// stays within its limits and the guard key keeps its value (checked after every case).
    #[test]
    fn the_http_metadata_server_answers_every_input_or_closes(input in http_input()) {
        let server = fuzzed_server();
        let reply = exchange(server.local_addr(), &input.bytes());
        if !reply.is_empty() {
            let text = String::from_utf8_lossy(&reply);
            let status: Option<u16> = text.strip_prefix("HTTP/1.").and_then(|rest| rest.get(2..5)).and_then(|code| code.parse().ok());
            prop_assert!(status.is_some_and(|code| (100..600).contains(&code)), "not an HTTP answer: {:?}", &text[..text.len().min(120)]);
        }
        let (status, body) = http_support::raw_http(server.local_addr(), "GET", &format!("/metadata?key={GUARD_KEY}"), b"");
        prop_assert_eq!((status, body.as_str()), (200, "kept"));
    }
}

fn http_answer() -> impl Strategy<Value = Vec<u8>> {
    let status = prop_oneof![Just(200u16), Just(404), Just(400), Just(500), 0u16..1000];
    let length = prop_oneof![Just(None), (0u64..10_000).prop_map(Some), Just(Some(u64::MAX))];
    let structured = (status, length, any::<bool>(), prop::collection::vec(any::<u8>(), 0..300)).prop_map(
        |(status, length, chunked, body)| {
            let mut out = format!("HTTP/1.1 {status} Whatever\r\n").into_bytes();
            if let Some(length) = length {
                out.extend_from_slice(format!("Content-Length: {length}\r\n").as_bytes());
            }
            if chunked {
                out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&body);
            out
        },
    );
    prop_oneof![3 => structured, 1 => prop::collection::vec(any::<u8>(), 0..300)]
}

proptest! {
    #![proptest_config(crate::fuzz_config(48))]

    /// The HTTP store client, against a server answering anything: each of get, put and delete returns (a value or
    /// an error) within its one deadline, and never panics.
    #[test]
    fn the_http_store_client_survives_any_answer(answers in prop::collection::vec(http_answer(), 3)) {
        let fake = crate::FakeServer::start(answers);
        let deadline = Duration::from_millis(400);
        let store = HttpStore::with_timeouts(&format!("http://{}/metadata", fake.address), deadline, deadline);
        let started = Instant::now();
        let _ = store.get("k");
        let _ = store.put("k", b"value");
        let _ = store.delete("k");
        prop_assert!(started.elapsed() < 3 * deadline + Duration::from_millis(900), "three calls took {:?}", started.elapsed());
    }
}

/// KiB in a MiB, for the memory figures.
const MIB_IN_KIB: u64 = 1024;

/// Opens `count` connections to `address`, each sending a PUT head declaring `declared` body bytes and then all but
/// the last of them (a write the server stops reading gives up after a bounded wait); returns the open connections.
fn withheld_puts(address: SocketAddr, count: usize, declared: usize) -> Vec<TcpStream> {
    let threads: Vec<_> = (0..6)
        .map(|thread| {
            std::thread::spawn(move || {
                let body = vec![b'w'; declared - 1];
                let mut held = Vec::new();
                for n in (thread..count).step_by(6) {
                    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_secs(2)) else { continue };
                    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
                    let head = format!(
                        "PUT /metadata?key=withheld-{n} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {declared}\r\n\r\n"
                    );
                    let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body));
                    held.push(stream);
                }
                held
            })
        })
        .collect();
    threads.into_iter().flat_map(|thread| thread.join().expect("flood thread")).collect()
}

/// 150 PUTs declaring 4 MiB each and withholding their last byte (600 MiB declared) cost the server a bounded amount
/// of memory (its shared budget of buffered request bytes, 64 MiB by default, plus per-connection buffers), a
/// legitimate PUT and GET are served meanwhile, and the memory is given back once the connections close.
#[test]
fn withheld_request_bodies_cost_the_http_metadata_server_a_bounded_amount_of_memory() {
    let server = http_support::ChildServer::start(
        env!("CARGO_BIN_EXE_aiv"),
        &["--max-body-bytes", &(4 << 20).to_string()],
        None,
    );
    let baseline = server.status_kib("VmRSS");
    let flood = withheld_puts(server.address, 150, 4 << 20);
    let deadline = Duration::from_secs(3);
    let put = http_support::bounded_http(server.address, "PUT", "/metadata?key=legit", &[b'v'; 1000], deadline);
    assert_eq!(put.as_ref().map(|reply| reply.0), Ok(200), "a PUT during the flood: {put:?}");
    let get = http_support::bounded_http(server.address, "GET", "/metadata?key=legit", b"", deadline);
    assert_eq!(get.as_ref().map(|reply| reply.1.len()), Ok(1000), "a GET during the flood: {get:?}");
    let peak = server.status_kib("VmHWM").saturating_sub(baseline);
    drop(flood);
    let started = Instant::now();
    let mut after = server.status_kib("VmRSS").saturating_sub(baseline);
    while after > 16 * MIB_IN_KIB && started.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
        after = server.status_kib("VmRSS").saturating_sub(baseline);
    }
    eprintln!(
        "withheld bodies: baseline {} MiB, peak +{} MiB, after +{} MiB",
        baseline / MIB_IN_KIB,
        peak / MIB_IN_KIB,
        after / MIB_IN_KIB
    );
    assert!(peak < 128 * MIB_IN_KIB, "600 MiB declared and withheld took the server's RSS up by {} MiB", peak / 1024);
    assert!(after <= 16 * MIB_IN_KIB, "{} MiB above the baseline stayed after the connections closed", after / 1024);
}

/// Up to `count` connections to `address` that send nothing, opened from a few threads (a connect the server's
/// full backlog leaves unanswered gives up after 50 ms).
fn idle_connections(address: SocketAddr, count: usize) -> Vec<TcpStream> {
    let threads: Vec<_> = (0..8)
        .map(|thread| {
            std::thread::spawn(move || {
                (thread..count)
                    .step_by(8)
                    .filter_map(|_| TcpStream::connect_timeout(&address, Duration::from_millis(50)).ok())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads.into_iter().flat_map(|thread| thread.join().expect("connecting thread")).collect()
}

/// 3,000 idle connections, past the server's descriptor limit (512, set in the child), neither starve legitimate requests
/// (idle ones are evicted to make room) nor flood the log with failed accepts.
#[test]
fn idle_connections_past_the_descriptor_limit_leave_the_http_metadata_server_serving() {
    let server = http_support::ChildServer::start(env!("CARGO_BIN_EXE_aiv"), &[], Some(512));
    let started = Instant::now();
    let idle = idle_connections(server.address, 3000);
    std::thread::sleep(Duration::from_millis(300));
    let legit = Instant::now();
    eprintln!("{} idle connections opened in {:?}", idle.len(), started.elapsed());
    for n in 0..3 {
        let key = format!("/metadata?key=legit-{n}");
        let put = http_support::bounded_http(server.address, "PUT", &key, b"value", Duration::from_secs(2));
        assert_eq!(
            put.as_ref().map(|reply| reply.0),
            Ok(200),
            "PUT {n} under {} idle connections: {put:?}",
            idle.len()
        );
        let get = http_support::bounded_http(server.address, "GET", &key, b"", Duration::from_secs(2));
        assert_eq!(get, Ok((200, "value".to_owned())), "GET {n} under {} idle connections", idle.len());
    }
    assert!(legit.elapsed() < Duration::from_secs(3), "three PUTs and GETs took {:?}", legit.elapsed());
    let seconds = started.elapsed().as_secs_f64();
    let log = server.log();
    let accept_failures = log.lines().filter(|line| line.contains("accept failed")).count();
    eprintln!("{} idle connections, {accept_failures} accept-failure lines in {seconds:.1} s", idle.len());
    assert!(
        accept_failures as f64 <= 5.0 * (seconds + 1.0) + 5.0,
        "{accept_failures} accept-failure lines in {seconds:.1} s:\n{}",
        &log[..log.len().min(2000)]
    );
    drop(idle);
}

/// A server on loopback with the store limits of the fuzz and `server` as its server limits.
fn bounded_server(server: MetadataServerLimits) -> MetadataHttpServer {
    let limits = StoreLimits { max_body_bytes: 4096, max_total_bytes: 64 << 10, max_keys: 64 };
    MetadataHttpServer::start_with("127.0.0.1:0".parse().expect("address"), limits, server).expect("server starts")
}

/// Waits (bounded) until `done` holds; whether it did.
fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Over `max_connections`, a new connection evicts an idle one: 400 idle connections leave the server holding at
/// most its cap, and legitimate requests are served at once.
#[test]
fn the_http_metadata_server_holds_at_most_its_connection_cap_and_evicts_idle_ones() {
    let server = bounded_server(MetadataServerLimits { max_connections: 64, ..MetadataServerLimits::default() });
    let idle = idle_connections(server.local_addr(), 400);
    assert!(idle.len() >= 300, "{} of 400 connects accepted", idle.len());
    let over = idle.len() as u64 - 64;
    assert!(eventually(Duration::from_secs(3), || server.evicted() >= over), "evicted {} of {over}", server.evicted());
    assert!(server.connections() <= 64, "{} connections held", server.connections());
    let started = Instant::now();
    for n in 0..5 {
        let key = format!("/metadata?key=capped-{n}");
        let put = http_support::bounded_http(server.local_addr(), "PUT", &key, b"value", Duration::from_secs(2));
        assert_eq!(put.map(|reply| reply.0), Ok(200), "PUT {n}");
        let get = http_support::bounded_http(server.local_addr(), "GET", &key, b"", Duration::from_secs(2));
        assert_eq!(get, Ok((200, "value".to_owned())), "GET {n}");
    }
    assert!(started.elapsed() < Duration::from_secs(2), "five PUTs and GETs took {:?}", started.elapsed());
    assert!(server.connections() <= 64, "{} connections held", server.connections());
    drop(idle);
}

/// A request must arrive whole within `request_timeout` of its connection starting to wait for it: dribbling one
/// byte every 50 ms, of the headers or of the body, does not extend it.
#[test]
fn a_dribbled_request_is_cut_at_the_http_metadata_servers_request_deadline() {
    let timeout = Duration::from_millis(400);
    let server = bounded_server(MetadataServerLimits { request_timeout: timeout, ..MetadataServerLimits::default() });
    let head = "PUT /metadata?key=dribbled HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n";
    for (what, sent_at_once, dribbled) in
        [("headers", &head[..10], &head[10..]), ("body", head, "x".repeat(100).leak() as &str)]
    {
        let mut stream = TcpStream::connect(server.local_addr()).expect("connect");
        stream.set_read_timeout(Some(Duration::from_millis(10))).expect("timeout");
        let started = Instant::now();
        stream.write_all(sent_at_once.as_bytes()).expect("send");
        let mut answer = Vec::new();
        let mut closed = false;
        for byte in dribbled.bytes() {
            if stream.write_all(&[byte]).is_err() {
                closed = true;
                break;
            }
            let mut chunk = [0u8; 512];
            match stream.read(&mut chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
                Err(_) => {}
            }
            if started.elapsed() > Duration::from_secs(3) {
                break;
            }
            std::thread::sleep(Duration::from_millis(40));
        }
        let elapsed = started.elapsed();
        let answer = String::from_utf8_lossy(&answer);
        assert!(closed || !answer.is_empty(), "{what}: still open after {elapsed:?} of dribbling");
        assert!(
            elapsed < timeout + Duration::from_millis(600),
            "{what}: cut after {elapsed:?}, the deadline being {timeout:?}"
        );
        if what == "body" {
            assert!(answer.starts_with("HTTP/1.1 408"), "{what}: {answer:?}");
        }
    }
    let put =
        http_support::bounded_http(server.local_addr(), "PUT", "/metadata?key=prompt", b"v", Duration::from_secs(2));
    assert_eq!(put.map(|reply| reply.0), Ok(200), "a prompt request is served");
}

/// Request bodies draw on one budget: a body that can never fit is refused with 413 before it is read, and a body
/// that does not fit now evicts one stalled inside its body.
#[test]
fn request_bodies_draw_on_the_http_metadata_servers_buffered_bytes_budget() {
    let server = bounded_server(MetadataServerLimits { max_buffered_bytes: 1000, ..MetadataServerLimits::default() });
    let address = server.local_addr();
    let (status, body) =
        http_support::bounded_http(address, "PUT", "/metadata?key=big", &[b'b'; 2000], Duration::from_secs(2))
            .expect("an answer");
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("1000") && body.contains("max_buffered_bytes"), "{body}");
    let stalled = withheld_puts(address, 1, 900);
    assert!(
        eventually(Duration::from_secs(2), || server.buffered_bytes() == 900),
        "{} reserved",
        server.buffered_bytes()
    );
    let evicted = server.evicted();
    let put = http_support::bounded_http(address, "PUT", "/metadata?key=fits", &[b'f'; 500], Duration::from_secs(2));
    assert_eq!(put.map(|reply| reply.0), Ok(200), "a body that fits once the stalled one is evicted");
    assert_eq!(server.evicted(), evicted + 1, "the stalled body's connection was evicted");
    assert!(
        eventually(Duration::from_secs(2), || server.buffered_bytes() == 0),
        "{} still reserved",
        server.buffered_bytes()
    );
    drop(stalled);
}

/// A client that asks for a large value and never reads the reply does not hold its connection past the request
/// deadline: the reply must be taken, and the next request must arrive, within `request_timeout` of the answer.
#[test]
fn a_reply_never_read_does_not_hold_an_http_metadata_connection() {
    let timeout = Duration::from_millis(400);
    let limits = StoreLimits { max_body_bytes: 8 << 20, ..StoreLimits::default() };
    let server_limits = MetadataServerLimits { request_timeout: timeout, ..MetadataServerLimits::default() };
    let server = MetadataHttpServer::start_with("127.0.0.1:0".parse().expect("address"), limits, server_limits)
        .expect("server starts");
    let put = http_support::bounded_http(
        server.local_addr(),
        "PUT",
        "/metadata?key=large",
        &vec![b'l'; 8 << 20],
        Duration::from_secs(3),
    );
    assert_eq!(put.map(|reply| reply.0), Ok(200));
    let mut stream = TcpStream::connect(server.local_addr()).expect("connect");
    // A small receive buffer, so the reply stalls in the server's writes.
    let size: libc::c_int = 4096;
    // SAFETY: setsockopt(2) reads one c_int from a live local.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&stream),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    stream.write_all(b"GET /metadata?key=large HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").expect("send");
    assert!(eventually(Duration::from_secs(1), || server.connections() == 1), "the GET's connection is held");
    let started = Instant::now();
    let closed = eventually(Duration::from_secs(3), || server.connections() == 0);
    eprintln!("a reply never read: connection closed {closed} after {:?}", started.elapsed());
    assert!(closed, "the connection of a reply never read is still held after {:?}", started.elapsed());
    drop(stream);
}
