//! Mooncake Store (the KV pool) of the unmodified Ascend wheel over aiv, set up as vLLM-Ascend's KV-pool Mooncake
//! backend sets it up: a real `mooncake_master` from the wheel (loopback, free ports) and two store clients in two
//! Python processes (`tests/support/mooncake_store_over_aiv.py`), each with one Mooncake `TransferEngine`
//! (`initialize(ip, "P2PHANDSHAKE", "ascend", "")`) handed to `MooncakeDistributedStore.setup(..., "ascend", "",
//! master, engine.get_engine())`, the directory `tests/support/mooncake_over_aiv.sh` prints on `LD_LIBRARY_PATH` (so
//! the engine's `adxl::AdxlEngine` is `libllm_datadist.so` over aiv and `libascendcl.so` the twin runtime), and a KV
//! cache of `aclrtMalloc`'d K and V blocks with random contents registered with the engine.
//!
//! What it shows, each block and value checked by hash:
//! - each client's `batch_put_from_multi_buffers` of device KV blocks into the other client's segment
//!   (`ReplicateConfig.preferred_segment`), and `batch_get_into_multi_buffers` on both sides of the keys in its own
//!   and in the other client's segment; while a put or get reaches the other process, the twin's counts of the
//!   client making it (`cannTwinEvidence` version 2 of its `libascendcl.so`) show every SQE written and every
//!   doorbell rung by the AIV kernel and no Host runtime copy, and the other process's runtime copies nothing;
//! - `batch_is_exist` of both clients' keys through the master; `put` / `get` / `remove` of a value;
//! - a client killed with SIGKILL leaves the master and the other client serving: the survivor's later put and get
//!   on its own segment work at once, and the master drops the keys of the killed client's segment within its
//!   client TTL.
//!
//! The Store's segment is Host memory (`aclrtMallocHost`, Mooncake's allocator for protocol `ascend` without fabric
//! memory); the engine's `cann` backend exports it to peers' devices by IPC key of its Host window, which the twin
//! runtime serves (docs/mooncake.md section 9).
//!
//! Needs g++ and the wheel's virtualenv (`AIV_TEST_MOONCAKE_NPU_VENV`, from tests/support/mooncake_npu.sh); without
//! them the test is skipped with a `SKIPPED` line (a failure under `CI=true`).

#[path = "common/skip.rs"]
mod skip;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The transfer timeout of both clients' engines (ASCEND_TRANSFER_TIMEOUT, read by Mooncake and by the library).
const TRANSFER_TIMEOUT_MS: u64 = 3000;
/// The master's client TTL (seconds): how long a killed client's segment stays mounted.
const CLIENT_TTL_S: u64 = 2;
/// The master's lease on an object read (milliseconds): a remove waits for it.
const LEASE_TTL_MS: u64 = 500;
/// The KV cache: blocks per region (K and V) and the bytes of one block.
const BLOCKS: usize = 16;
const BLOCK: usize = 64 << 10;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The wheel's virtualenv and the library directory, or `None` (skipped).
fn inputs() -> Option<(PathBuf, PathBuf)> {
    let Some(venv) = std::env::var_os("AIV_TEST_MOONCAKE_NPU_VENV").map(PathBuf::from) else {
        skip::skip(
            "set AIV_TEST_MOONCAKE_NPU_VENV=\"$(tests/support/mooncake_npu.sh)\" to run Mooncake Store over aiv \
             (tests/run.sh does)",
        );
        return None;
    };
    if let Some(libs) = std::env::var_os("AIV_TEST_MOONCAKE_OVER_AIV_LIBS").map(PathBuf::from) {
        return Some((venv, libs));
    }
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if Command::new(&cxx).arg("--version").output().map_or(true, |output| !output.status.success()) {
        skip::skip(&format!("no {cxx} to build libllm_datadist.so over aiv (tests/support/mooncake_over_aiv.sh)"));
        return None;
    }
    let output = Command::new("bash")
        .arg(repo().join("tests/support/mooncake_over_aiv.sh"))
        .output()
        .expect("run tests/support/mooncake_over_aiv.sh");
    assert!(
        output.status.success(),
        "tests/support/mooncake_over_aiv.sh failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    Some((venv, PathBuf::from(stdout.lines().last().unwrap_or_default().trim())))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port()
}

/// The wheel's `mooncake_master` executable (inside the package, next to `store.so`).
fn master_binary(venv: &Path) -> PathBuf {
    let lib = venv.join("lib");
    let found = std::fs::read_dir(&lib)
        .expect("the virtualenv's lib directory")
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("site-packages/mooncake/mooncake_master"))
        .find(|path| path.is_file());
    found.unwrap_or_else(|| panic!("no mooncake/mooncake_master under {}", lib.display()))
}

/// A child process, killed when dropped, its stdout lines on a channel and its stderr kept.
struct Process {
    child: Child,
    lines: Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Process {
    fn spawn(mut command: Command) -> Process {
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("start the process");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Process { child, lines, stderr: Some(stderr) }
    }

    /// Kills the process (if running) and returns what it wrote on stderr.
    fn kill_and_report(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr.take().map(|handle| handle.join().unwrap_or_default()).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The wheel's master on loopback, RPC and metrics ports free, started within 30 s.
fn start_master(venv: &Path) -> (Process, SocketAddr) {
    let rpc = free_port();
    let mut command = Command::new(master_binary(venv));
    command.args([
        "--rpc_address=127.0.0.1".to_owned(),
        format!("--rpc_port={rpc}"),
        "--metrics_host=127.0.0.1".to_owned(),
        format!("--metrics_port={}", free_port()),
        "--enable_metric_reporting=false".to_owned(),
        format!("--client_ttl={CLIENT_TTL_S}"),
        format!("--default_kv_lease_ttl={LEASE_TTL_MS}"),
        "--enable_http_metadata_server=false".to_owned(),
    ]);
    let mut master = Process::spawn(command);
    let address = SocketAddr::from(([127, 0, 0, 1], rpc));
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
        if let Ok(Some(status)) = master.child.try_wait() {
            panic!("mooncake_master exited ({status}):\n{}", master.kill_and_report());
        }
        assert!(Instant::now() < deadline, "mooncake_master not listening within 30 s:\n{}", master.kill_and_report());
        std::thread::sleep(Duration::from_millis(100));
    }
    (master, address)
}

/// One store client (the Python driver), asked one command at a time.
struct Client {
    process: Process,
    segment: String,
    name: &'static str,
}

impl Client {
    fn start(name: &'static str, venv: &Path, libs: &Path, master: SocketAddr) -> Client {
        let mut command = Command::new(venv.join("bin/python"));
        command
            .arg(repo().join("tests/support/mooncake_store_over_aiv.py"))
            .args(["client", &master.to_string(), &BLOCKS.to_string(), &BLOCK.to_string()])
            .env("LD_LIBRARY_PATH", libs)
            .env("ASCEND_TRANSFER_TIMEOUT", TRANSFER_TIMEOUT_MS.to_string())
            .env("GLOG_minloglevel", "1")
            .env_remove("MC_FORCE_TCP")
            .env_remove("ASCEND_ENABLE_USE_FABRIC_MEM");
        let mut client = Client { process: Process::spawn(command), segment: String::new(), name };
        let ready = client.line(Duration::from_secs(60));
        let Some(segment) = ready.as_deref().and_then(|line| line.strip_prefix("READY ")) else {
            panic!("client {name} not ready ({ready:?}):\n{}", client.process.kill_and_report());
        };
        client.segment = segment.to_owned();
        client
    }

    fn line(&mut self, limit: Duration) -> Option<String> {
        self.process.lines.recv_timeout(limit).ok()
    }

    /// Sends `command` and returns the answer's word and JSON value (within 30 s, or the test fails).
    fn ask(&mut self, command: &str) -> (String, serde_json::Value) {
        let stdin = self.process.child.stdin.as_mut().expect("stdin");
        let _ = writeln!(stdin, "{command}");
        let _ = stdin.flush();
        let Some(line) = self.line(Duration::from_secs(30)) else {
            panic!("client {} gave no answer to {command:?}:\n{}", self.name, self.process.kill_and_report());
        };
        let (word, rest) = line.split_once(' ').unwrap_or((&line, "null"));
        let value = serde_json::from_str(rest).unwrap_or(serde_json::Value::Null);
        assert_ne!(word, "ERROR", "client {}: {command:?}: {rest}", self.name);
        (word.to_owned(), value)
    }

    fn ok(&mut self, command: &str, expect: &str) {
        let (word, _) = self.ask(command);
        assert_eq!(word, expect, "client {}: {command:?}", self.name);
    }

    /// PUT or GET: the per-key results, the blocks' hashes, the twin's evidence delta and the call's milliseconds.
    fn blocks(&mut self, command: &str) -> (Vec<i64>, Vec<String>, serde_json::Value, f64) {
        let (_, value) = self.ask(command);
        let results = value["results"].as_array().expect("results").iter().map(|v| v.as_i64().expect("int")).collect();
        let hashes =
            value["hashes"].as_array().expect("hashes").iter().map(|v| v.as_str().expect("str").into()).collect();
        (results, hashes, value["evidence"].clone(), value["ms"].as_f64().expect("ms"))
    }

    fn exist(&mut self, keys: &[&str]) -> Vec<i64> {
        let (_, value) = self.ask(&format!("EXIST {}", keys.join(" ")));
        value.as_array().expect("EXIST list").iter().map(|v| v.as_i64().expect("int")).collect()
    }

    fn counts(&mut self) -> serde_json::Value {
        self.ask("SNAPSHOT").1
    }
}

fn count(evidence: &serde_json::Value, name: &str) -> u64 {
    evidence[name].as_u64().unwrap_or_else(|| panic!("no count {name} in {evidence}"))
}

/// The twin's counts of the client that made a cross-process put or get, while only the store's call ran: every SQE
/// written and every doorbell rung by the AIV kernel, none by the Host, an AI CPU or nobody known, and no Host
/// runtime copy.
fn assert_aiv_direct(what: &str, evidence: &serde_json::Value) {
    assert_eq!(count(evidence, "provenance_recorded"), 1, "{what}: {evidence}");
    let sqes = count(evidence, "sqes_executed");
    let doorbells = count(evidence, "doorbells_rung");
    assert!(sqes >= 1 && doorbells >= 1, "{what}: no SQE executed or no doorbell rung: {evidence}");
    assert_eq!(count(evidence, "sqes_by_kernel"), sqes, "{what}: {evidence}");
    assert_eq!(count(evidence, "doorbells_by_kernel"), doorbells, "{what}: {evidence}");
    for name in [
        "sqes_by_host",
        "sqes_unknown",
        "sqes_by_aicpu",
        "doorbells_by_host",
        "doorbells_unknown",
        "doorbells_by_aicpu",
        "host_sync_copies",
        "host_stream_copies",
        "aicpu_kernels_launched",
    ] {
        assert_eq!(count(evidence, name), 0, "{what}: {name}: {evidence}");
    }
}

/// The target's runtime between two snapshots: no Host copy, nothing submitted by the Host.
fn assert_untouched(what: &str, before: &serde_json::Value, after: &serde_json::Value) {
    for name in ["host_sync_copies", "host_stream_copies", "sqes_by_host", "doorbells_by_host"] {
        assert_eq!(count(after, name), count(before, name), "{what}: target {name}: before {before}, after {after}");
    }
}

#[test]
fn mooncake_store_moves_kv_blocks_between_two_clients_over_aiv_and_survives_a_killed_client() {
    let Some((venv, libs)) = inputs() else { return };
    let started = Instant::now();
    let (mut master, address) = start_master(&venv);
    let mut a = Client::start("a", &venv, &libs, address);
    let mut b = Client::start("b", &venv, &libs, address);
    eprintln!("master and two clients ready after {:.1} s", started.elapsed().as_secs_f64());
    let (segment_a, segment_b) = (a.segment.clone(), b.segment.clone());
    let value = (2 * BLOCK) as i64;
    let bound = (TRANSFER_TIMEOUT_MS + 3000) as f64;

    // Each client puts device KV blocks with random contents into the other client's segment (vLLM-Ascend's
    // batch_put_from_multi_buffers, two buffers per key): the AIV kernel of the putting client writes the other
    // process's Host segment; that process's runtime does nothing.
    let mut put_hashes = Vec::new();
    for a_first in [true, false] {
        let (from, to, prefix, segment) =
            if a_first { (&mut a, &mut b, "kv-a", &segment_b) } else { (&mut b, &mut a, "kv-b", &segment_a) };
        from.ok("FILL 0 4", "FILLED");
        let before = to.counts();
        let (put, hashes, evidence, ms) = from.blocks(&format!("PUT {prefix} 0 4 {segment}"));
        let after = to.counts();
        assert_eq!(put, vec![0; 4], "client {}: batch_put_from_multi_buffers into {segment}", from.name);
        assert!(ms <= bound, "client {}: the put took {ms} ms", from.name);
        assert_aiv_direct(&format!("client {}'s put into the other segment", from.name), &evidence);
        assert_untouched(&format!("client {}'s put", from.name), &before, &after);
        put_hashes.push(hashes);
    }
    // Both clients see both clients' keys through the master.
    for client in [&mut a, &mut b] {
        assert_eq!(client.exist(&["kv-a-0", "kv-a-3", "kv-b-0", "kv-b-3", "none-0"]), vec![1, 1, 1, 1, 0]);
    }
    // Each client reads both key sets back into zeroed device blocks: the keys in its own segment (Mooncake copies
    // those itself) and the keys in the other client's segment (its AIV kernel reads the other process's memory).
    for a_first in [true, false] {
        let (client, other, own, remote, own_hashes, remote_hashes) = if a_first {
            (&mut a, &mut b, "kv-b", "kv-a", &put_hashes[1], &put_hashes[0])
        } else {
            (&mut b, &mut a, "kv-a", "kv-b", &put_hashes[0], &put_hashes[1])
        };
        client.ok("ZERO 4 8", "ZEROED");
        let (got, hashes, _, _) = client.blocks(&format!("GET {own} 4 4"));
        assert_eq!(got, vec![value; 4], "client {}: batch_get_into_multi_buffers of {own}", client.name);
        assert_eq!(&hashes, own_hashes, "client {}: {own} read back differs from what was put", client.name);
        let before = other.counts();
        let (got, hashes, evidence, ms) = client.blocks(&format!("GET {remote} 8 4"));
        let after = other.counts();
        assert_eq!(got, vec![value; 4], "client {}: batch_get_into_multi_buffers of {remote}", client.name);
        assert_eq!(&hashes, remote_hashes, "client {}: {remote} read back differs from what was put", client.name);
        assert!(ms <= bound, "client {}: the get took {ms} ms", client.name);
        assert_aiv_direct(&format!("client {}'s get from the other segment", client.name), &evidence);
        assert_untouched(&format!("client {}'s get", client.name), &before, &after);
    }

    // put / get / remove of a value (through the Store's local buffer, Host memory) in the other client's segment.
    let (_, put) = a.ask(&format!("PUTBYTES bytes-a 100000 {segment_b}"));
    assert_eq!(put["code"].as_i64(), Some(0), "put: {put}");
    for client in [&mut a, &mut b] {
        let (_, got) = client.ask("GETBYTES bytes-a");
        assert_eq!(
            (got["size"].as_u64(), got["hash"].as_str()),
            (Some(100000), put["hash"].as_str()),
            "client {}: get: {got}",
            client.name
        );
    }
    // The gets took leases on the object (the master's default_kv_lease_ttl): remove succeeds once they passed.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, removed) = a.ask("REMOVE bytes-a");
        if removed["code"].as_i64() == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "remove did not succeed once the lease passed: {removed}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(b.exist(&["bytes-a"]), vec![0]);

    // A client killed: the master and the survivor go on serving.
    b.process.child.kill().expect("SIGKILL client b");
    let _ = b.process.child.wait();
    let killed = Instant::now();
    let (_, put) = a.ask(&format!("PUTBYTES after-kill 4096 {segment_a}"));
    assert_eq!(put["code"].as_i64(), Some(0), "put after the kill: {put}");
    let (_, got) = a.ask("GETBYTES after-kill");
    assert_eq!(got["hash"], put["hash"], "get after the kill: {got}");
    a.ok("FILL 12 2", "FILLED");
    let (put, hashes, _, _) = a.blocks(&format!("PUT after-kill-kv 12 2 {segment_a}"));
    assert_eq!(put, vec![0, 0], "batch put after the kill");
    a.ok("ZERO 14 2", "ZEROED");
    let (got, got_hashes, _, _) = a.blocks("GET after-kill-kv 14 2");
    assert_eq!((got, got_hashes), (vec![value; 2], hashes), "batch get after the kill");
    let served = killed.elapsed();
    assert!(served < Duration::from_secs(10), "the survivor's put and get took {served:?} after the kill");
    assert_eq!(a.exist(&["kv-b-0"]), vec![1], "keys in the survivor's segment are gone");
    // The master unmounts the killed client's segment once its TTL has passed, and the keys in it with it.
    let deadline = Instant::now() + Duration::from_secs(CLIENT_TTL_S * 5 + 5);
    while a.exist(&["kv-a-0"]) != vec![0] {
        assert!(
            Instant::now() < deadline,
            "keys of the killed client's segment still listed {:?} after",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let dropped = killed.elapsed();

    let stdin = a.process.child.stdin.as_mut().expect("stdin");
    let _ = writeln!(stdin, "QUIT");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Ok(Some(status)) = a.process.child.try_wait() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = a.process.kill_and_report();
    assert!(status.is_some_and(|s| s.success()), "client a did not close cleanly ({status:?}):\n{log}");
    assert!(master.child.try_wait().expect("master status").is_none(), "mooncake_master exited");
    let _ = master.kill_and_report();
    eprintln!(
        "store over aiv: {:.1} s in all; the survivor served {:.2} s after the kill; the master dropped the killed \
         client's keys {:.1} s after it",
        started.elapsed().as_secs_f64(),
        served.as_secs_f64(),
        dropped.as_secs_f64()
    );
}
