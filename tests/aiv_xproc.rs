//! Twin end-to-end tests of aiv transfers between processes: the target is the `aiv` binary (`aiv bench --mode target
//! --protocol aiv`) in a child process, which fills its device memory with `bench::target_pattern` and exports it
//! through its twin device's export service; this process imports it (memfd over a Unix socket, authenticated by uid
//! and the descriptor's secret) and moves data with its own twin device's SDMA engine. Under P2P handshake, the HTTP
//! metadata server, and etcd (`AIV_TEST_ETCD`, set by tests/run.sh; skipped with a `SKIPPED` line when unset, failing
//! instead under `CI=true`). Then peer loss: SIGKILL of a target with transfers pending; what is not loss (a stopped
//! target whose probes time out); and recovery of a peer that answers again. Floods of the export socket: the hostile
//! tier (`tests/hostile/export.rs`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use aiv_transport::bench::target_pattern;
use aiv_transport::config::AivOptions;
use aiv_transport::device::DeviceBuffer;
use aiv_transport::engine::AivDevice;
use aiv_transport::metadata::MetadataOptions;
use aiv_transport::{EngineConfig, Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState};
use rand::RngCore;
use std::sync::Arc;

#[path = "common/flood.rs"]
mod flood;
#[path = "common/lease.rs"]
mod lease;
#[path = "common/skip.rs"]
mod skip;

const TARGET_BYTES: u64 = 4 << 20;

/// A target process; killed and reaped on drop.
struct Target {
    child: Child,
    name: String,
    addr: u64,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `aiv bench --mode target --protocol aiv` and reads its segment name and buffer address (bounded wait).
fn spawn_target(metadata_server: &str, name: &str, cluster: Option<&str>) -> Target {
    let mut command = Command::new(env!("CARGO_BIN_EXE_aiv"));
    command
        .args(["bench", "--mode", "target", "--protocol", "aiv", "--duration", "60"])
        .args(["--buffer_size", &TARGET_BYTES.to_string(), "--metadata_server", metadata_server])
        .args(["--local_server_name", name])
        .env_remove("MOONCAKE_CONFIG_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(cluster) = cluster {
        command.env("MC_METADATA_CLUSTER_ID", cluster);
    }
    let mut child = command.spawn().expect("aiv runs");
    let stdout = child.stdout.take().expect("stdout");
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = send.send(line);
    });
    let line = receive.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
    let mut target = Target { child, name: String::new(), addr: 0 };
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| words.iter().position(|w| *w == key).and_then(|i| words.get(i + 1)).copied();
    target.name = after("segment").unwrap_or_else(|| panic!("no segment name in {line:?}")).to_owned();
    let addr = after("at").unwrap_or_else(|| panic!("no address in {line:?}"));
    target.addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16).expect("hex address");
    target
}

fn aiv_options() -> AivOptions {
    AivOptions {
        transfer_timeout: Duration::from_secs(20),
        kernel_wait_budget: Duration::from_secs(15),
        request_ring_depth: 128,
        sq_depth: 256,
        hbm_size: 32 << 20,
        ..AivOptions::default()
    }
}

/// The initiator: an engine of this process with a twin device and `length` bytes of registered HBM. Fields drop in
/// order: the engine and device before the lease on the device id.
struct Initiator {
    engine: TransferEngine,
    device: Arc<AivDevice>,
    buffer: DeviceBuffer,
    lease: lease::DeviceLease,
}

impl Initiator {
    fn start(name: &str, metadata_server: &str, cluster: Option<&str>, length: u64) -> Initiator {
        Initiator::start_with(name, metadata_server, cluster, length, aiv_options())
    }

    fn start_with(name: &str, metadata_server: &str, cluster: Option<&str>, length: u64, aiv: AivOptions) -> Initiator {
        let lease = lease::DeviceLease::acquire();
        let mut config = EngineConfig::new(name);
        config.metadata_server = metadata_server.to_owned();
        config.protocol = Protocol::Aiv;
        config.aiv = AivOptions { device_id: lease.0, ..aiv };
        let options = MetadataOptions { cluster_id: cluster.map(str::to_owned), ..MetadataOptions::default() };
        let engine = TransferEngine::with_metadata_options(config, &options).expect("engine starts");
        let device = engine.device().expect("twin device");
        let buffer = device.allocate(length).expect("HBM");
        // SAFETY: the buffer lives next to the engine in this struct; every batch is waited for before it drops.
        unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }.expect("register");
        Initiator { engine, device, buffer, lease }
    }

    /// Stalls (or releases) SDMA channel `channel` of the initiator's device.
    fn stall_channel(&self, channel: u32, stalled: bool) {
        cann_twin::control::set_stalled(self.lease.0 as i32, channel, stalled).expect("the channel");
    }

    /// A copy of `range` of the local buffer.
    fn read(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        assert!(range.end as u64 <= self.buffer.len());
        let mut out = vec![0u8; range.len()];
        self.device.read(self.buffer.addr() + range.start as u64, &mut out).expect("D2H copy");
        out
    }

    /// Writes `data` at `offset` of the local buffer.
    fn write(&self, offset: usize, data: &[u8]) {
        assert!((offset + data.len()) as u64 <= self.buffer.len());
        self.device.write(self.buffer.addr() + offset as u64, data).expect("H2D copy");
    }

    /// Runs one batch of (opcode, local offset, remote address, length) and returns each task's state and reason.
    fn run(&self, segment: SegmentId, requests: &[(Opcode, u64, u64, u64)]) -> Vec<(TransferState, Option<String>)> {
        self.run_on(None, segment, requests)
    }

    /// As [`Initiator::run`], on `protocol` (the engine's default when `None`).
    fn run_on(
        &self,
        protocol: Option<Protocol>,
        segment: SegmentId,
        requests: &[(Opcode, u64, u64, u64)],
    ) -> Vec<(TransferState, Option<String>)> {
        let requests: Vec<TransferRequest> = requests
            .iter()
            .map(|&(opcode, local, remote, length)| TransferRequest {
                opcode,
                source: self.buffer.addr() + local,
                target_id: segment,
                target_offset: remote,
                length,
                protocol,
            })
            .collect();
        let batch = self.engine.allocate_batch(requests.len()).expect("batch");
        self.engine.submit_transfer(batch, &requests).expect("submit");
        self.engine.wait_batch(batch).expect("wait");
        let states = (0..requests.len())
            .map(|task| {
                (
                    self.engine.transfer_status(batch, task).expect("status").state,
                    self.engine.task_reason(batch, task).expect("reason"),
                )
            })
            .collect();
        self.engine.free_batch(batch).expect("free");
        states
    }
}

/// The first buffer of an open segment.
fn initiator_target(initiator: &Initiator, segment: SegmentId) -> u64 {
    let name = initiator.engine.segment(segment).expect("segment").name.clone();
    initiator.engine.get_first_buffer_address(&name).expect("a buffer")
}

fn assert_completed(states: &[(TransferState, Option<String>)]) {
    for (task, (state, reason)) in states.iter().enumerate() {
        assert_eq!(*state, TransferState::Completed, "task {task}: {reason:?}");
    }
}

/// READ the target's pattern (proves the bytes come from the other process's device memory), WRITE random bytes at
/// unaligned offsets, READ them back into another range and compare.
fn exchange_and_verify(initiator: &Initiator, target: &Target) {
    let segment = initiator.engine.open_segment(&target.name).expect("open the target's segment");
    let aiv = initiator.engine.segment(segment).expect("segment").descriptor.aiv.clone().expect("aiv object");
    assert_eq!(aiv["process_id"].as_u64(), Some(u64::from(target.child.id())), "{aiv}");
    // The target's heap is one VMM export; its shareable handle is the capability, imported through the twin
    // runtime (which asks the exporting process).
    assert_eq!(aiv["backend"], "cann", "{aiv}");
    assert!(aiv["regions"][0]["export_id"].as_u64().is_some_and(|id| id != 0), "{aiv}");
    let length = 1_500_001u64;
    let remote = target.addr + 12_345;
    assert_completed(&initiator.run(segment, &[(Opcode::Read, 0, remote, length)]));
    let read = initiator.read(0..length as usize);
    assert!(
        read.iter().enumerate().all(|(i, &b)| b == target_pattern(12_345 + i as u64)),
        "READ saw the target's pattern"
    );

    let mut random = vec![0u8; length as usize];
    rand::thread_rng().fill_bytes(&mut random);
    let written_at = 4 << 20;
    initiator.write(written_at, &random);
    let remote = target.addr + 777_777;
    let readback_at = 8 << 20;
    assert_completed(&initiator.run(segment, &[(Opcode::Write, written_at as u64, remote, length)]));
    assert_completed(&initiator.run(segment, &[(Opcode::Read, readback_at as u64, remote, length)]));
    assert!(initiator.read(readback_at..readback_at + length as usize) == random, "WRITE then READ round trip");
    let evidence = {
        let batch = initiator.engine.allocate_batch(1).expect("batch");
        let request = TransferRequest {
            opcode: Opcode::Read,
            source: initiator.buffer.addr(),
            target_id: segment,
            target_offset: target.addr,
            length: 4096,
            protocol: None,
        };
        initiator.engine.submit_transfer(batch, &[request]).expect("submit");
        initiator.engine.wait_batch(batch).expect("wait");
        initiator.engine.task_evidence(batch, 0).expect("task").expect("evidence")
    };
    assert_eq!(evidence.path, "aiv");
    assert!(evidence.descriptors >= 1 && evidence.doorbells >= 1, "{evidence:?}");
}

#[test]
fn aiv_between_processes_under_p2p_handshake() {
    let target = spawn_target("P2PHANDSHAKE", "127.0.0.1", None);
    assert!(target.name.starts_with("127.0.0.1:"), "P2P name is host:<rpc port>: {}", target.name);
    let initiator = Initiator::start("127.0.0.1", "P2PHANDSHAKE", None, 16 << 20);
    exchange_and_verify(&initiator, &target);
}

#[test]
fn aiv_between_processes_under_the_http_metadata_server() {
    let server =
        aiv_transport::metadata::http_server::MetadataHttpServer::start("127.0.0.1:0".parse().expect("address"))
            .expect("metadata server");
    let url = format!("http://{}/metadata", server.local_addr());
    let target = spawn_target(&url, "127.0.0.1:17611", None);
    assert_eq!(target.name, "127.0.0.1:17611");
    let initiator = Initiator::start("127.0.0.1:17612", &url, None, 16 << 20);
    exchange_and_verify(&initiator, &target);

    // The target dies; its stale descriptor stays in the store (SIGKILL publishes nothing), so a refresh now finds
    // the dead device: transfers fail, nothing hangs. (A restart under the same name is refused by the store, as by
    // Mooncake's: "Duplicate rpc_meta key"; the restarted target takes a new name.)
    drop(target);
    let segment = initiator.engine.open_segment("127.0.0.1:17611").expect("still open");
    initiator.engine.refresh_segment(segment).expect("refresh finds the stale descriptor");
    let remote = initiator_target(&initiator, segment);
    let states = initiator.run(segment, &[(Opcode::Read, 0, remote, 4096)]);
    assert_eq!(states[0].0, TransferState::Failed, "{:?}", states[0].1);
    let restarted = spawn_target(&url, "127.0.0.1:17613", None);
    exchange_and_verify(&initiator, &restarted);
}

#[test]
fn aiv_between_processes_under_etcd() {
    let Some(endpoint) = std::env::var("AIV_TEST_ETCD").ok().map(|e| e.trim().to_owned()).filter(|e| !e.is_empty())
    else {
        skip::skip(
            "AIV_TEST_ETCD is not set (tests/run.sh starts etcd on loopback and sets it; by hand: `export \
             AIV_TEST_ETCD=\"$(tests/support/etcd.sh start | tail -n 1)\"`)",
        );
        return;
    };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos();
    let cluster = format!("aiv-xproc-{}-{nanos}", std::process::id());
    let url = format!("etcd://{endpoint}");
    let target = spawn_target(&url, "127.0.0.1:17621", Some(&cluster));
    let initiator = Initiator::start("127.0.0.1:17622", &url, Some(&cluster), 16 << 20);
    exchange_and_verify(&initiator, &target);
}

/// SIGKILL of a target with transfers pending: every pending transfer to it ends FAILED or TIMEOUT well inside the
/// budget (found by the peer probe, not by the watchdog), new transfers to it fail at once, transfers pending to
/// another live target complete, and a restarted target is reached after reopening.
#[test]
fn killing_a_target_fails_its_pending_transfers_and_spares_the_others() {
    let mut doomed = spawn_target("P2PHANDSHAKE", "127.0.0.1", None);
    let survivor = spawn_target("P2PHANDSHAKE", "127.0.0.1", None);
    let initiator = Initiator::start("127.0.0.1", "P2PHANDSHAKE", None, 16 << 20);
    let doomed_segment = initiator.engine.open_segment(&doomed.name).expect("open doomed");
    let survivor_segment = initiator.engine.open_segment(&survivor.name).expect("open survivor");
    // Imports happen on first use: one small transfer to each.
    assert_completed(&initiator.run(doomed_segment, &[(Opcode::Read, 0, doomed.addr, 4096)]));
    assert_completed(&initiator.run(survivor_segment, &[(Opcode::Read, 0, survivor.addr, 4096)]));

    // Hold every SDMA channel of the initiator so the batches stay pending when the target dies.
    initiator.stall_channel(0, true);
    initiator.stall_channel(1, true);
    let submit = |segment: SegmentId, remote: u64, local: u64, count: u64| {
        let requests: Vec<TransferRequest> = (0..count)
            .map(|i| TransferRequest {
                opcode: Opcode::Write,
                source: initiator.buffer.addr() + local + i * (256 << 10),
                target_id: segment,
                target_offset: remote + i * (256 << 10),
                length: 256 << 10,
                protocol: None,
            })
            .collect();
        let batch = initiator.engine.allocate_batch(requests.len()).expect("batch");
        initiator.engine.submit_transfer(batch, &requests).expect("submit");
        batch
    };
    let mut random = vec![0u8; 2 << 20];
    rand::thread_rng().fill_bytes(&mut random);
    initiator.write(8 << 20, &random);
    let doomed_batch = submit(doomed_segment, doomed.addr, 0, 8);
    let survivor_batch = submit(survivor_segment, survivor.addr, 8 << 20, 8);
    std::thread::sleep(Duration::from_millis(50));
    for task in 0..8 {
        let state = initiator.engine.transfer_status(doomed_batch, task).expect("status").state;
        assert_eq!(state, TransferState::Pending, "task {task} is pending before the kill");
    }

    let killed_at = Instant::now();
    doomed.child.kill().expect("SIGKILL the target");
    doomed.child.wait().expect("reaped");
    let status = initiator.engine.wait_batch(doomed_batch).expect("wait doomed");
    let detected_in = killed_at.elapsed();
    assert_eq!(status.state, TransferState::Failed);
    assert!(detected_in < Duration::from_secs(3), "peer loss found in {detected_in:?} (transfer timeout is 20 s)");
    for task in 0..8 {
        let state = initiator.engine.transfer_status(doomed_batch, task).expect("status").state;
        let reason = initiator.engine.task_reason(doomed_batch, task).expect("reason").unwrap_or_default();
        assert!(matches!(state, TransferState::Failed | TransferState::Timeout), "task {task}: {state:?}");
        assert!(reason.contains("lost"), "task {task}: {reason}");
    }
    // New transfers to the dead target fail at once.
    let states = initiator.run(doomed_segment, &[(Opcode::Read, 0, doomed.addr, 4096)]);
    assert_eq!(states[0].0, TransferState::Failed, "{:?}", states[0].1);

    // The survivor's pending batch completes once the channels run again, with its data.
    initiator.stall_channel(0, false);
    initiator.stall_channel(1, false);
    let status = initiator.engine.wait_batch(survivor_batch).expect("wait survivor");
    assert_eq!(status.state, TransferState::Completed);
    assert_completed(&initiator.run(survivor_segment, &[(Opcode::Read, 12 << 20, survivor.addr, 2 << 20)]));
    assert!(initiator.read(12 << 20..14 << 20) == random, "survivor data");

    // A restarted target (a new process; P2P names it after its new rpc port) is reached after opening it.
    let restarted = spawn_target("P2PHANDSHAKE", "127.0.0.1", None);
    exchange_and_verify(&initiator, &restarted);
    drop(doomed);
}

/// The baselines share the device's peer state with `aiv`: a target reached only over `adxl` and `ubshmem` is
/// SIGKILLed, the aiv probe thread finds it lost, and new baseline transfers to it fail at once naming the loss
/// (adxl as NOT_CONNECTED) instead of completing into the dead process's orphaned pages.
#[test]
fn baseline_transfers_to_a_peer_found_lost_fail_naming_the_loss() {
    let mut target = spawn_target("P2PHANDSHAKE", "127.0.0.1", None);
    let initiator = Initiator::start("127.0.0.1", "P2PHANDSHAKE", None, 16 << 20);
    let segment = initiator.engine.open_segment(&target.name).expect("open the target's segment");
    let read = [(Opcode::Read, 0, target.addr, 4096)];
    // Imports happen on first use, here by the baselines only.
    assert_completed(&initiator.run_on(Some(Protocol::Adxl), segment, &read));
    assert_completed(&initiator.run_on(Some(Protocol::Ubshmem), segment, &read));

    let killed_at = Instant::now();
    target.child.kill().expect("SIGKILL the target");
    target.child.wait().expect("reaped");
    // Until the probe (every 50 ms) finds the loss, a transfer may still complete into the orphaned pages, or (on
    // the twin runtime, whose adxl goes through HiXL over a connection to the dead process) fail as HiXL reports it.
    let adxl = loop {
        let states = initiator.run_on(Some(Protocol::Adxl), segment, &read);
        let named_loss = states[0].1.as_deref().is_some_and(|reason| reason.contains("lost"));
        if named_loss || killed_at.elapsed() > Duration::from_secs(3) {
            break states[0].clone();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let detected_in = killed_at.elapsed();
    assert_eq!(adxl.0, TransferState::Failed, "adxl to the killed target after {detected_in:?}: {:?}", adxl.1);
    let reason = adxl.1.unwrap_or_default();
    assert!(reason.contains("NOT_CONNECTED (103902)") && reason.contains("lost"), "{reason}");
    let ubshmem = initiator.run_on(Some(Protocol::Ubshmem), segment, &read);
    assert_eq!(ubshmem[0].0, TransferState::Failed, "{:?}", ubshmem[0].1);
    let reason = ubshmem[0].1.clone().unwrap_or_default();
    assert!(reason.starts_with("ubshmem:") && reason.contains("lost"), "{reason}");
}

/// A WRITE of `length` random bytes to `remote` and a READ of them back: `Ok` if both completed with the data.
fn round_trip(initiator: &Initiator, segment: SegmentId, remote: u64, length: u64) -> Result<(), String> {
    let mut random = vec![0u8; length as usize];
    rand::thread_rng().fill_bytes(&mut random);
    initiator.write(0, &random);
    for (opcode, local) in [(Opcode::Write, 0), (Opcode::Read, 1 << 19)] {
        let (state, reason) = initiator.run(segment, &[(opcode, local, remote, length)]).remove(0);
        if state != TransferState::Completed {
            return Err(format!("{opcode:?}: {state:?} {}", reason.unwrap_or_default()));
        }
    }
    if initiator.read(1 << 19..(1 << 19) + length as usize) != random {
        return Err("the data read back differs".into());
    }
    Ok(())
}

/// Runs `round_trip` until `until` says stop or `within` passes; the last outcome.
fn round_trip_until(
    initiator: &Initiator,
    segment: SegmentId,
    remote: u64,
    within: Duration,
    until: impl Fn(&Result<(), String>) -> bool,
) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let outcome = round_trip(initiator, segment, remote, 4096);
        if until(&outcome) || started.elapsed() > within {
            return outcome;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A peer whose runtime stops granting its heap (imports answered as of an unknown handle: what a freed heap looks
/// like) is marked lost; once it grants it again the probe finds it answering and recovers it: transfers through the
/// same open segment, neither refreshed nor reopened, complete again with their data.
#[test]
fn a_lost_peer_that_answers_again_is_recovered_without_reopening() {
    let exporter = Initiator::start("127.0.0.1", "P2PHANDSHAKE", None, 1 << 20);
    let importer = Initiator::start("127.0.0.1", "P2PHANDSHAKE", None, 1 << 20);
    let segment = importer.engine.open_segment(exporter.engine.name()).expect("open");
    let remote = exporter.buffer.addr();
    round_trip(&importer, segment, remote, 64 << 10).expect("before the loss");

    // The exporter's runtime answers imports of its heap as of an unknown handle (what a freed heap looks like).
    let export_id = exporter.device.advertisement().regions[0].export_id;
    cann_twin::control::withhold_export(export_id, true);
    let lost = round_trip_until(&importer, segment, remote, Duration::from_secs(3), |outcome| outcome.is_err());
    let reason = lost.expect_err("transfers fail once the peer is found lost");
    assert!(reason.contains("lost"), "{reason}");

    cann_twin::control::withhold_export(export_id, false);
    let recovered = round_trip_until(&importer, segment, remote, Duration::from_secs(3), |outcome| outcome.is_ok());
    recovered.expect("transfers complete again once the peer answers");
    round_trip(&importer, segment, remote, 256 << 10).expect("and keep completing");
}

/// A stopped target (SIGSTOP) does not answer its probes, which time out (the twin runtime gives an import 2 s): that
/// is no evidence that it is gone, so it is not marked lost, transfers to its mapped memory keep completing, and
/// after SIGCONT nothing needs reopening.
#[test]
fn a_target_whose_probes_time_out_is_not_lost() {
    let target = spawn_target("P2PHANDSHAKE", "127.0.0.1", None);
    let initiator = Initiator::start("127.0.0.1", "P2PHANDSHAKE", None, 2 << 20);
    let segment = initiator.engine.open_segment(&target.name).expect("open the target");
    round_trip(&initiator, segment, target.addr, 64 << 10).expect("before the stop");
    let pid = target.child.id() as libc::pid_t;
    // SAFETY: signals our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let stopped_at = Instant::now();
    // Longer than one import deadline (2 s), so at least one probe has timed out meanwhile.
    while stopped_at.elapsed() < Duration::from_millis(2600) {
        let outcome = round_trip(&initiator, segment, target.addr, 4096);
        if let Err(reason) = outcome {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
            panic!("a stopped target was treated as lost after {:?}: {reason}", stopped_at.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    round_trip(&initiator, segment, target.addr, 256 << 10).expect("after SIGCONT");
}
