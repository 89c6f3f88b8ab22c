//! Interop of the tcp transport with the real Mooncake wheel (`mooncake-transfer-engine-non-cuda`).
//!
//! Runs only when `AIV_TEST_MOONCAKE_VENV` names a virtualenv made by `tests/support/mooncake.sh`:
//!
//!     export AIV_TEST_MOONCAKE_VENV="$(tests/support/mooncake.sh)"
//!     cargo test --test tcp_mooncake_interop -- --test-threads=1
//!
//! Without it every test is skipped (a `SKIPPED` line, tests/common/skip.rs), failing instead under `CI=true`.
//! Metadata: Mooncake's own `http_metadata_server.py` on 127.0.0.1, with this engine publishing through its HTTP
//! metadata backend (`metadata::http`). Every Mooncake process gets `MC_TCP_BIND_ADDRESS=127.0.0.1` so it listens on
//! and advertises loopback (by default it advertises the host's interface address). P2PHANDSHAKE variants run the
//! real handshake between the processes: Mooncake opens `127.0.0.1:<our rpc port>` and we open
//! `127.0.0.1:<its rpc port>`.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use aiv_transport::bench::{self, BenchParams};
use aiv_transport::config::EngineConfig;
use aiv_transport::metadata::http::HttpStore;
use aiv_transport::metadata::store::{KeyLayout, StoreBackend};
use aiv_transport::metadata::{BufferDescriptor, MetadataBackend, SegmentDescriptor};
use aiv_transport::transfer::{BufferSet, RegisteredBuffer};
use aiv_transport::transport::tcp::{ServerLimits, TcpDataServer, TcpOptions, WireVersion};
use aiv_transport::{Opcode, Protocol, TransferEngine, TransferRequest, TransferState};

#[path = "common/skip.rs"]
mod skip;

/// One Mooncake scenario at a time: they are heavy for a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn venv() -> Option<PathBuf> {
    match std::env::var_os("AIV_TEST_MOONCAKE_VENV") {
        Some(path) if Path::new(&path).join("bin/python").exists() => Some(PathBuf::from(path)),
        Some(path) => {
            skip::skip(&format!("AIV_TEST_MOONCAKE_VENV={path:?} has no bin/python (run tests/support/mooncake.sh)"));
            None
        }
        None => {
            skip::skip(
                "set AIV_TEST_MOONCAKE_VENV=\"$(tests/support/mooncake.sh)\" to run it against the real Mooncake wheel",
            );
            None
        }
    }
}

fn package_dir(venv: &Path) -> PathBuf {
    let lib = venv.join("lib");
    let python = std::fs::read_dir(&lib)
        .expect("venv lib")
        .filter_map(|entry| entry.ok())
        .find(|entry| entry.file_name().to_string_lossy().starts_with("python"))
        .expect("a python directory in the venv");
    python.path().join("site-packages/mooncake")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// A child process killed when dropped; its stdout lines arrive on a channel.
struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    name: &'static str,
}

impl Process {
    fn spawn(name: &'static str, mut command: Command) -> Process {
        command
            .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let (sender, lines) = mpsc::channel();
        for stream in [
            child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let sender = sender.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let stdin = child.stdin.take();
        Process { child, stdin, lines, name }
    }

    /// Waits (bounded) for a line containing `needle`; returns it. Other lines are echoed for the test log.
    fn wait_for(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    eprintln!("[{}] {line}", self.name);
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("{}: no line containing {needle:?} within {limit:?}", self.name),
            }
        }
    }

    /// Waits (bounded) for the process to exit; returns whether it succeeded, echoing its output. Once it exited, its
    /// output is read to its end (both pipes closed: the readers' senders dropped), within 10 s.
    fn finish(mut self, limit: Duration) -> (bool, Vec<String>) {
        drop(self.stdin.take());
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut lines: Vec<String> = Vec::new();
        if status.is_some() {
            let end = Instant::now() + Duration::from_secs(10);
            loop {
                match self.lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
                    Ok(line) => lines.push(line),
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        panic!("{}: exited, but its output did not end within 10 s: {lines:#?}", self.name)
                    }
                }
            }
        } else {
            lines.extend(self.lines.try_iter());
        }
        for line in &lines {
            eprintln!("[{}] {line}", self.name);
        }
        (status.is_some_and(|s| s.success()), lines)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Mooncake's HTTP metadata server on 127.0.0.1.
struct Metadata {
    _process: Process,
    url: String,
}

impl Metadata {
    fn start(venv: &Path) -> Metadata {
        let port = free_port();
        let mut command = Command::new(venv.join("bin/python"));
        command
            .arg(package_dir(venv).join("http_metadata_server.py"))
            .args(["--host", "127.0.0.1", "--port"])
            .arg(port.to_string());
        let process = Process::spawn("metadata", command);
        let deadline = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "metadata server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Metadata { _process: process, url: format!("http://127.0.0.1:{port}/metadata") }
    }
}

fn pattern(seed: u8, size: usize) -> Vec<u8> {
    (0..size).map(|i| ((i % 251) as u8).wrapping_add(seed)).collect()
}

fn engine(url: &str, version: WireVersion) -> TransferEngine {
    let mut config = EngineConfig::new(format!("127.0.0.1:{}", free_port()));
    config.metadata_server = url.to_owned();
    config.aiv.transfer_timeout = Duration::from_secs(10);
    if version == WireVersion::V2 {
        return TransferEngine::new(config).expect("engine with http metadata");
    }
    config.protocol = Protocol::Adxl;
    let engine = TransferEngine::new(config).expect("engine");
    let mut options = TcpOptions::from_config(engine.config()).expect("options");
    options.max_version = WireVersion::V1;
    // v1 WRITE completes once sent (no status frame): one lane keeps a later READ behind it on the same connection.
    options.client.lanes = 1;
    engine.enable_tcp_transport_with(options).expect("v1 tcp");
    engine
}

/// Moves `lengths[i]` bytes between `locals[i]` and `remotes[i]` of segment `name` over tcp and waits: the engine's
/// synchronous helpers, with the protocol named explicitly (a v1 test engine's default protocol is not tcp).
fn sync(engine: &TransferEngine, opcode: Opcode, name: &str, locals: &[u64], remotes: &[u64], lengths: &[u64]) {
    let target_id = engine.open_segment(name).expect("open segment");
    let requests: Vec<TransferRequest> = (0..locals.len())
        .map(|i| TransferRequest {
            opcode,
            source: locals[i],
            target_id,
            target_offset: remotes[i],
            length: lengths[i],
            protocol: Some(Protocol::Tcp),
        })
        .collect();
    let batch = engine.allocate_batch(requests.len()).expect("batch");
    engine.submit_transfer(batch, &requests).expect("submit");
    let status = engine.wait_batch(batch).expect("wait");
    let reasons: Vec<_> = (0..requests.len()).filter_map(|t| engine.task_reason(batch, t).ok().flatten()).collect();
    assert_eq!(status.state, TransferState::Completed, "{opcode:?} to {name}: {reasons:?}");
    engine.free_batch(batch).expect("free");
}

fn peer_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/mooncake_peer.py")
}

/// Mooncake's Python initiator reads, writes and reads back an aiv target's buffer; the target then checks it.
fn python_initiator_against_aiv_target(mooncake_v1: bool, p2p: bool) {
    let Some(venv) = venv() else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let metadata = (!p2p).then(|| Metadata::start(&venv));
    let url = metadata.as_ref().map_or("P2PHANDSHAKE".to_string(), |m| m.url.clone());
    let target = engine(&url, WireVersion::V2);
    let size = 1 << 20;
    let mut region = pattern(5, size);
    // SAFETY: `region` outlives the registration (unregistered below, after the peer has exited).
    unsafe { target.register_memory(region.as_mut_ptr() as u64, size as u64, "cpu:0").expect("register") };
    let mut command = Command::new(venv.join("bin/python"));
    command.arg(peer_script()).args(["initiator", "--metadata", &url, "--target", target.name()]);
    command.args([
        "--name",
        &format!("127.0.0.1:{}", free_port()),
        "--size",
        &size.to_string(),
        "--expect",
        "5",
        "--write",
        "11",
    ]);
    if mooncake_v1 {
        command.env("MC_TCP_PROTO", "1");
    }
    let (ok, lines) = Process::spawn("mooncake-py", command).finish(Duration::from_secs(60));
    assert!(ok && lines.iter().any(|l| l == "INITIATOR ok"), "Mooncake's initiator reported failure");
    target.unregister_memory(region.as_ptr() as u64).expect("unregister");
    let expected = pattern(11, size);
    let first_difference = region.iter().zip(&expected).position(|(a, b)| a != b);
    assert_eq!(first_difference, None, "the aiv target holds what Mooncake wrote");
}

#[test]
fn mooncake_python_initiator_against_aiv_target_http() {
    python_initiator_against_aiv_target(false, false);
}

#[test]
fn mooncake_python_initiator_against_aiv_target_p2p() {
    python_initiator_against_aiv_target(false, true);
}

#[test]
fn mooncake_python_initiator_v1_against_aiv_target_http() {
    python_initiator_against_aiv_target(true, false);
}

/// An aiv initiator reads, writes and reads back a Mooncake Python target's buffer; the target then checks it.
fn aiv_initiator_against_python_target(aiv_version: WireVersion, p2p: bool) {
    let Some(venv) = venv() else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let metadata = (!p2p).then(|| Metadata::start(&venv));
    let url = metadata.as_ref().map_or("P2PHANDSHAKE".to_string(), |m| m.url.clone());
    let size = 1usize << 20;
    let mut command = Command::new(venv.join("bin/python"));
    command.arg(peer_script()).args(["target", "--metadata", &url, "--name", &format!("127.0.0.1:{}", free_port())]);
    command.args(["--size", &size.to_string(), "--fill", "7", "--timeout", "60"]);
    let mut peer = Process::spawn("mooncake-py", command);
    let ready = peer.wait_for("READY", Duration::from_secs(30));
    // "READY <segment> <addr> <size>": under P2PHANDSHAKE the segment is host:<actual RPC port>.
    let name = ready.split_whitespace().nth(1).expect("READY names the segment").to_owned();
    let initiator = engine(&url, aiv_version);
    let remote = initiator.get_first_buffer_address(&name).expect("Mooncake's segment resolves");
    let mut local = vec![0u8; 2 * size];
    let base = local.as_mut_ptr() as u64;
    // SAFETY: `local` outlives the registration (unregistered below after the synchronous transfers).
    unsafe { initiator.register_memory(base, 2 * size as u64, "cpu:0").expect("register") };
    sync(&initiator, Opcode::Read, &name, &[base], &[remote], &[size as u64]);
    assert_eq!(local[..size], pattern(7, size)[..], "read Mooncake's bytes");
    local[size..].copy_from_slice(&pattern(13, size));
    sync(&initiator, Opcode::Write, &name, &[base + size as u64], &[remote], &[size as u64]);
    // A pipelined batch of 4 KiB requests, both directions.
    let blocks = 64u64;
    let sources: Vec<u64> = (0..blocks).map(|i| base + size as u64 + i * 4096).collect();
    let peers: Vec<u64> = (0..blocks).map(|i| remote + i * 4096).collect();
    sync(&initiator, Opcode::Write, &name, &sources, &peers, &vec![4096; blocks as usize]);
    local[..size].fill(0);
    let sinks: Vec<u64> = (0..blocks).map(|i| base + i * 4096).collect();
    sync(&initiator, Opcode::Read, &name, &sinks, &peers, &vec![4096; blocks as usize]);
    let rest = size as u64 - 4096 * blocks;
    sync(&initiator, Opcode::Read, &name, &[base + 4096 * blocks], &[remote + 4096 * blocks], &[rest]);
    assert_eq!(local[..size], pattern(13, size)[..], "read back what we wrote");
    initiator.unregister_memory(base).expect("unregister");
    let stdin = peer.stdin.as_mut().expect("stdin");
    writeln!(stdin, "verify 13").expect("ask the target to verify");
    let verdict = peer.wait_for("VERIFY", Duration::from_secs(20));
    assert_eq!(verdict, "VERIFY ok", "Mooncake's memory holds what aiv wrote");
}

#[test]
fn aiv_initiator_against_mooncake_python_target_http() {
    aiv_initiator_against_python_target(WireVersion::V2, false);
}

#[test]
fn aiv_initiator_against_mooncake_python_target_p2p() {
    aiv_initiator_against_python_target(WireVersion::V2, true);
}

#[test]
fn aiv_v1_initiator_against_mooncake_python_target_http() {
    aiv_initiator_against_python_target(WireVersion::V1, false);
}

/// Mooncake's Python initiator against a bare aiv data server whose descriptor is published by hand: the server's
/// per-framing counters show which framing Mooncake really spoke (v1 with `MC_TCP_PROTO=1`, else v2).
fn python_initiator_framing(mooncake_v1: bool) {
    let Some(venv) = venv() else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let metadata = Metadata::start(&venv);
    let size = 1usize << 20;
    let mut region = pattern(5, size);
    let addr = region.as_mut_ptr() as u64;
    let mut buffers = BufferSet::new();
    buffers.insert(RegisteredBuffer { addr, length: size as u64, location: "cpu:0".into() }).expect("insert");
    let memory = Arc::new(RwLock::new(buffers));
    let server =
        TcpDataServer::start("127.0.0.1:0".parse().expect("address"), memory, ServerLimits::default()).expect("server");
    let name = format!("127.0.0.1:{}", free_port());
    let mut descriptor = SegmentDescriptor::new(name.clone(), vec!["tcp".into()]);
    descriptor.tcp_data_port = Some(server.address().port());
    descriptor.tcp_proto_version = Some(2);
    descriptor.tcp_data_host = Some("127.0.0.1".into());
    descriptor.buffers = vec![BufferDescriptor::new(name.clone(), addr, size as u64)];
    let publisher = StoreBackend::new(HttpStore::new(&metadata.url), KeyLayout::new(None));
    publisher.publish(&descriptor).expect("publish");
    let mut command = Command::new(venv.join("bin/python"));
    command.arg(peer_script()).args(["initiator", "--metadata", &metadata.url, "--target", &name]);
    command.args([
        "--name",
        &format!("127.0.0.1:{}", free_port()),
        "--size",
        &size.to_string(),
        "--expect",
        "5",
        "--write",
        "11",
    ]);
    if mooncake_v1 {
        command.env("MC_TCP_PROTO", "1");
    }
    let (ok, lines) = Process::spawn("mooncake-py", command).finish(Duration::from_secs(60));
    assert!(ok && lines.iter().any(|l| l == "INITIATOR ok"), "Mooncake's initiator reported failure");
    let (v1, v2) = (server.served_with(WireVersion::V1), server.served_with(WireVersion::V2));
    eprintln!("{}: served {v1} v1 and {v2} v2 requests", skip::test_name());
    if mooncake_v1 {
        assert!(v1 > 0 && v2 == 0, "MC_TCP_PROTO=1: expected only v1 requests, got {v1} v1 / {v2} v2");
    } else {
        assert!(v2 > 0 && v1 == 0, "expected only v2 requests, got {v1} v1 / {v2} v2");
    }
    publisher.remove(&name).expect("withdraw");
    drop(server);
    assert_eq!(region, pattern(11, size), "the server's memory holds what Mooncake wrote");
}

#[test]
fn mooncake_python_initiator_speaks_v2_to_an_aiv_server() {
    python_initiator_framing(false);
}

#[test]
fn mooncake_python_initiator_speaks_v1_to_an_aiv_server_when_told() {
    python_initiator_framing(true);
}

fn bench_result(lines: &[String]) -> Option<(u64, f64)> {
    let line = lines.iter().find(|l| l.contains("Test completed:"))?;
    let count = line.split("batch count ").nth(1)?.split(',').next()?.trim().parse().ok()?;
    let throughput = line.split("throughput ").nth(1)?.split_whitespace().next()?.parse().ok()?;
    Some((count, throughput))
}

/// Mooncake's transfer_engine_bench as initiator against an aiv target, both directions, v2 and v1.
fn transfer_engine_bench_initiator_against_aiv_target(p2p: bool) {
    let Some(venv) = venv() else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let metadata = (!p2p).then(|| Metadata::start(&venv));
    let url = metadata.as_ref().map_or("P2PHANDSHAKE".to_string(), |m| m.url.clone());
    let target = engine(&url, WireVersion::V2);
    let size = 16u64 << 20;
    let mut region = vec![0u8; size as usize];
    // SAFETY: `region` outlives the registration, withdrawn below after the bench processes have exited.
    unsafe { target.register_memory(region.as_mut_ptr() as u64, size, "cpu:0").expect("register") };
    for (operation, v1) in [("write", false), ("read", false), ("write", true), ("read", true)] {
        let mut command = Command::new(package_dir(&venv).join("transfer_engine_bench"));
        command.args(["--mode", "initiator", "--protocol", "tcp", "--metadata_server", &url]);
        command.args(["--local_server_name", &format!("127.0.0.1:{}", free_port()), "--device_name", ""]);
        command.args(["--segment_id", target.name(), "--operation", operation, "--threads", "2", "--batch_size", "8"]);
        command.args(["--block_size", "65536", "--duration", "2", "--buffer_size", &size.to_string()]);
        if v1 {
            command.env("MC_TCP_PROTO", "1");
        }
        let (ok, lines) = Process::spawn("transfer_engine_bench", command).finish(Duration::from_secs(60));
        let (batches, throughput) = bench_result(&lines).expect("a result line");
        assert!(ok && batches > 0 && throughput > 0.0, "{operation} v1={v1}: {batches} batches");
    }
    target.unregister_memory(region.as_mut_ptr() as u64).expect("unregister");
}

#[test]
fn transfer_engine_bench_initiator_against_aiv_target_http() {
    transfer_engine_bench_initiator_against_aiv_target(false);
}

#[test]
fn transfer_engine_bench_initiator_against_aiv_target_p2p() {
    transfer_engine_bench_initiator_against_aiv_target(true);
}

/// The aiv bench workload as initiator against Mooncake's transfer_engine_bench target.
#[test]
fn aiv_initiator_against_transfer_engine_bench_target_http() {
    let Some(venv) = venv() else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let metadata = Metadata::start(&venv);
    let name = format!("127.0.0.1:{}", free_port());
    let size = 16u64 << 20;
    let mut command = Command::new(package_dir(&venv).join("transfer_engine_bench"));
    command.args(["--mode", "target", "--protocol", "tcp", "--metadata_server", &metadata.url]);
    command.args(["--local_server_name", &name, "--device_name", "", "--buffer_size", &size.to_string()]);
    let target = Process::spawn("transfer_engine_bench", command);
    target.wait_for("TcpTransport: listen on port", Duration::from_secs(30));
    let initiator = engine(&metadata.url, WireVersion::V2);
    let deadline = Instant::now() + Duration::from_secs(15);
    while initiator.get_first_buffer_address(&name).is_err() {
        assert!(Instant::now() < deadline, "the bench target never published a buffer");
        std::thread::sleep(Duration::from_millis(100));
    }
    for operation in [Opcode::Write, Opcode::Read] {
        let params = BenchParams {
            operation,
            protocol: Protocol::Tcp,
            buffer_size: size,
            batch_size: 16,
            block_size: 65536,
            duration: Duration::from_secs(1),
            threads: 2,
            report_unit: "GB".parse().expect("unit"),
            report_precision: 2,
        };
        let report = bench::run_against_segment(&initiator, &params, &name).expect("bench against Mooncake");
        assert!(report.outcome.completed_batches > 0, "{operation:?}: no batch completed");
        assert_eq!(report.outcome.failed_batches, 0, "{operation:?}: {:?}", report.outcome.first_failure);
    }
    drop(target);
}
