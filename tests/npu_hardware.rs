//! Hardware tier: the aiv path and the `ubshmem` and `adxl` baselines between two NPUs, with data checks, and the
//! same test on the twin runtime.
//!
//! On an Ascend machine (docs/HARDWARE_TESTING.md), against the vendor's CANN runtime, `#[ignore]`d and selected by
//! `AIV_NPU_TESTS=1`:
//! `AIV_NPU_TESTS=1 cargo test --features cann --test npu_hardware -- --ignored --nocapture`
//! (`AIV_SDMA_WORKSPACE_ADDR=<hex>` optionally overrides the SDMA workspace address each process otherwise finds in
//! SHMEM's state; that discovery is unverified on hardware, see docs/HARDWARE_TESTING.md).
//!
//! Everywhere, in the suite: the same two-process test with the same backend, its tables resolved to the twin runtime
//! (`"device_backend": "twin"`), over aiv, ubshmem and adxl (HiXL's client/server library of the twin runtime).
//!
//! SHMEM takes one PE per process, so the test runs two processes: this one (PE 0, NPU `AIV_NPU_DEVICE_A`, default 0)
//! and a copy of this test binary running `npu_peer_process` (PE 1, NPU `AIV_NPU_DEVICE_B`, default 1). SHMEM's unique
//! id goes from PE 0 to PE 1 through PE 0's segment descriptor (P2P handshake on loopback). PE 0 then moves data with
//! READ and WRITE requests and checks every byte. Selected on a machine without CANN, the vendor test fails with the
//! doctor's report. Nothing in this file has been run on an NPU yet.
//!
//! The aiv transfers' acts on the vendor's runtime are self-reported by the kernel: each transfer's own verdict must
//! be `unknown` with no Host act counted while it was in flight, and the run's `AIV-direct` only with CANN's profiler
//! corroborating it (a session around the run; its line names every source). On the twin runtime the device model's
//! records make each transfer's own verdict `AIV-direct`.
#[path = "common/peer_engine.rs"]
mod peer_engine;
#[path = "common/skip.rs"]
mod skip;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use aiv_transport::config::DeviceBackendKind;
use aiv_transport::device::cann::profiler::{ProfilerSession, Window};
use aiv_transport::evidence::{EvidenceTally, Source, Submitter};
use aiv_transport::{Protocol, TransferEngine};

const BUFFER: u64 = 16 << 20;

fn selected() -> bool {
    if std::env::var("AIV_NPU_TESTS").as_deref() == Ok("1") {
        return true;
    }
    skip::not_selected("hardware test; set AIV_NPU_TESTS=1 on an Ascend machine (docs/HARDWARE_TESTING.md)");
    false
}

fn device_env(name: &str, default: u32) -> u32 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// The backend the peer process runs (`AIV_NPU_TEST_BACKEND`: `cann`, else `cann-twin`).
fn backend_from_env() -> DeviceBackendKind {
    match std::env::var("AIV_NPU_TEST_BACKEND").as_deref() {
        Ok("cann") => DeviceBackendKind::Cann,
        _ => DeviceBackendKind::Twin,
    }
}

use peer_engine::engine;

/// Deterministic bytes of `seed` at `offset`.
fn pattern(seed: u8, offset: u64, length: u64) -> Vec<u8> {
    (offset..offset + length).map(|i| (i.wrapping_mul(131) as u8) ^ seed.wrapping_mul(29) ^ ((i >> 12) as u8)).collect()
}

/// Fails the selected test with the doctor's report when this machine cannot run the `cann` backend.
fn require_cann() {
    let report = aiv_transport::doctor::diagnose();
    let libraries =
        report.cann_probes.iter().filter(|probe| probe.what == "libascendcl.so" || probe.what == "libshmem.so");
    let missing_library = libraries.clone().any(|probe| probe.found.is_none());
    let kernel = report.npu_kernel_embedded || std::env::var_os("AIV_NPU_KERNEL_OBJECT").is_some();
    if !report.cann_feature || missing_library || !kernel || report.runtime.is_none() {
        panic!(
            "AIV_NPU_TESTS=1 but this machine or build cannot run the cann backend (feature cann: {}, kernel object: \
             {}):\n{}",
            report.cann_feature,
            if kernel { "yes" } else { "no" },
            report.render()
        );
    }
}

fn write_device(device: &aiv_transport::engine::AivDevice, addr: u64, data: &[u8]) {
    device.write(addr, data).expect("H2D copy");
}

fn read_device(device: &aiv_transport::engine::AivDevice, addr: u64, length: u64) -> Vec<u8> {
    let mut out = vec![0u8; length as usize];
    device.read(addr, &mut out).expect("D2H copy");
    out
}

/// PE 1: started by `aiv_read_and_write_between_two_npus` with `AIV_NPU_ROLE=peer`; a no-op otherwise.
#[test]
#[ignore = "hardware: run by npu_hardware's main test as its peer process"]
fn npu_peer_process() {
    if std::env::var("AIV_NPU_ROLE").as_deref() != Ok("peer") {
        println!("nothing to do: the peer half of the two-process tests, run by them with AIV_NPU_ROLE=peer");
    } else {
        serve_as_peer();
    }
}

fn serve_as_peer() {
    let engine = engine(backend_from_env(), device_env("AIV_NPU_DEVICE_B", 1));
    let device = engine.device().expect("PE 1 device");
    let buffer = device.allocate(BUFFER).expect("HBM");
    write_device(&device, buffer.addr(), &pattern(2, 0, BUFFER));
    // SAFETY: the buffer outlives the engine's use of it: this process waits for the parent before dropping.
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }.expect("register");
    println!("PEER_READY {} {} {}", engine.name(), buffer.addr(), buffer.len());
    std::io::stdout().flush().expect("flush");
    // Serve until the parent closes stdin.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop((buffer, device, engine));
}

#[test]
#[ignore = "hardware: needs two Ascend NPUs, CANN and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn aiv_read_and_write_between_two_npus() {
    if !selected() {
        return;
    }
    require_cann();
    two_processes(DeviceBackendKind::Cann);
}

/// The same test on the twin runtime: the `cann` backend in two processes, each its own SHMEM PE, VMM export and
/// import of the heaps between them, aiv, ubshmem and adxl with every byte checked; then the peer is killed and its loss
/// is found by the backend's probe.
#[test]
fn aiv_ubshmem_and_adxl_read_and_write_between_two_processes_on_the_twin_runtime() {
    two_processes(DeviceBackendKind::Twin);
}

fn two_processes(backend: DeviceBackendKind) {
    let on_twin = backend == DeviceBackendKind::Twin;
    // This process is PE 0 of 2: the variables are read when the device opens (set before any engine exists here; a
    // twin-runtime child of this test binary is a process of its own).
    std::env::set_var("AIV_SHMEM_PE", "0");
    std::env::set_var("AIV_SHMEM_N_PES", "2");
    // On the vendor's runtime CANN's profiler observes the run: started before the engine opens (its kernel launches
    // inside the session), stopped after it closed.
    let session = (!on_twin).then(|| ProfilerSession::start_vendor(&[device_env("AIV_NPU_DEVICE_A", 0)]));
    let mut aiv = (EvidenceTally::default(), Vec::new());
    let engine = engine(backend, device_env("AIV_NPU_DEVICE_A", 0));
    let mut peer = Command::new(std::env::current_exe().expect("test binary"))
        .args(["npu_peer_process", "--exact", "--ignored", "--nocapture"])
        .env("AIV_NPU_ROLE", "peer")
        .env("AIV_NPU_TEST_BACKEND", if on_twin { "twin" } else { "cann" })
        .env("AIV_SHMEM_PE", "1")
        .env("AIV_SHMEM_N_PES", "2")
        .env("AIV_SHMEM_ROOT_SEGMENT", engine.name())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the peer process");
    println!(
        "PE 0: engine {} on NPU {}; PE 1 started as pid {}",
        engine.name(),
        device_env("AIV_NPU_DEVICE_A", 0),
        peer.id()
    );
    let device = engine.device().expect("PE 0 device (SHMEM bootstrap with PE 1)");
    let buffer = device.allocate(BUFFER).expect("HBM");
    write_device(&device, buffer.addr(), &pattern(1, 0, BUFFER));
    // SAFETY: the buffer outlives every batch below, each waited for.
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }.expect("register");

    let mut ready = String::new();
    let mut stdout = BufReader::new(peer.stdout.take().expect("peer stdout"));
    while !ready.starts_with("PEER_READY") {
        ready.clear();
        assert_ne!(stdout.read_line(&mut ready).expect("peer output"), 0, "peer exited before it was ready");
    }
    let fields: Vec<&str> = ready.split_whitespace().collect();
    let (peer_name, peer_addr) = (fields[1].to_string(), fields[2].parse::<u64>().expect("peer address"));
    let segment = engine.open_segment(&peer_name).expect("peer segment");
    println!("PE 0: peer segment {peer_name}, its buffer at {peer_addr:#x}");

    // aiv, then the Host-submitted baselines over the same memory (ubshmem: ACL streams; adxl: HiXL). Every path
    // runs even if an earlier one failed, so one hardware run reports on all three.
    let mut failures = Vec::new();
    for (seed, protocol) in [(1u8, None), (3, Some(Protocol::Ubshmem)), (5, Some(Protocol::Adxl))] {
        if let Err(failure) = read_and_write(&engine, &device, &buffer, segment, peer_addr, protocol, seed, &mut aiv) {
            println!("FAILED {failure}");
            failures.push(failure);
        }
    }

    if on_twin {
        // Peer loss: the peer process is killed; the backend's probe (a re-import of the peer's heap handle) finds it
        // gone, and a new aiv transfer to it fails naming the loss, well before the transfer timeout.
        peer.kill().expect("kill the peer");
        let _ = peer.wait();
        let started = std::time::Instant::now();
        let lost = loop {
            use aiv_transport::{Opcode, TransferRequest, TransferState};
            let request = TransferRequest {
                opcode: Opcode::Read,
                source: buffer.addr(),
                target_id: segment,
                target_offset: peer_addr,
                length: 4096,
                protocol: None,
            };
            let batch = engine.allocate_batch(1).expect("batch");
            engine.submit_transfer(batch, &[request]).expect("submit");
            let state = engine.wait_batch(batch).expect("wait").state;
            let reason = engine.task_reason(batch, 0).expect("task");
            engine.free_batch(batch).expect("free");
            if state != TransferState::Completed {
                break reason.unwrap_or_default();
            }
            assert!(started.elapsed() < Duration::from_secs(10), "transfers to a killed peer still complete");
            std::thread::sleep(Duration::from_millis(20));
        };
        println!("CHECK peer loss: found after {:?}: {lost}", started.elapsed());
        assert!(lost.contains("no longer grants its heap"), "{lost}");
        drop((buffer, device, engine));
        assert!(failures.is_empty(), "paths that failed: {failures:#?}");
        println!(
            "TWIN RUNTIME TEST PASSED: aiv, ubshmem and adxl READ and WRITE between two processes; peer loss found"
        );
        return;
    }

    // Both PEs tear SHMEM down (aclshmem_finalize may wait for the other PE), so drop ours before waiting for the peer.
    drop(peer.stdin.take());
    drop((buffer, device, engine));
    // The run's verdict: AIV-direct only with the profiler's corroboration (only the AIV kernel ran, no copy or
    // AI-CPU task in the aiv batches' windows, no Host act counted).
    let (mut tally, windows) = aiv;
    tally.observer = Some(aiv_transport::device::cann::profiler::observer(
        session.unwrap_or_else(|| Err("not started".into())),
        &windows,
    ));
    let lines = tally.verdict_lines();
    lines.iter().for_each(|line| println!("VERDICT {line}"));
    if tally.submitter() != Submitter::AivDirect {
        failures.push(format!("aiv: the run's verdict is not AIV-direct with the profiler: {}", lines[0]));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let exit = loop {
        if let Some(exit) = peer.try_wait().expect("peer status") {
            break exit;
        }
        if std::time::Instant::now() > deadline {
            let _ = peer.kill();
            panic!("the peer process did not exit within 120 s of the end of the test");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exit.success(), "peer process failed: {exit}");
    assert!(failures.is_empty(), "paths that failed: {failures:#?}");
    println!(
        "NPU HARDWARE TEST PASSED: aiv, ubshmem and adxl READ and WRITE between NPU {} and NPU {}",
        device_env("AIV_NPU_DEVICE_A", 0),
        device_env("AIV_NPU_DEVICE_B", 1)
    );
}

/// READ and WRITE cases over one path (`None` = the configured `aiv`), local bytes of `seed`, every byte checked.
#[allow(clippy::too_many_arguments)]
fn read_and_write(
    engine: &TransferEngine,
    device: &aiv_transport::engine::AivDevice,
    buffer: &aiv_transport::device::DeviceBuffer,
    segment: aiv_transport::SegmentId,
    peer_addr: u64,
    protocol: Option<Protocol>,
    seed: u8,
    aiv: &mut (EvidenceTally, Vec<Window>),
) -> Result<(), String> {
    use aiv_transport::{Opcode, TransferRequest, TransferState};
    let name = protocol.map_or("aiv", |p| p.as_str());
    // (opcode, local offset, remote offset, length): sizes below, at and above one 1 MiB SQE, odd offsets.
    let cases = [
        (Opcode::Read, 0u64, 0u64, 1u64),
        (Opcode::Read, 4096, 8192, 4096),
        (Opcode::Read, (1 << 20) + 3, 5, (1 << 20) + 17),
        (Opcode::Read, 4 << 20, 6 << 20, 3 << 20),
        // WRITE targets stay clear of the READ sources above: the requests of one batch run in no fixed order.
        (Opcode::Write, 8 << 20, 10 << 20, 777),
        (Opcode::Write, 9 << 20, 12 << 20, (2 << 20) + 1),
    ];
    // Fresh local bytes for each path, so a path that moved nothing cannot pass on what an earlier one left.
    write_device(device, buffer.addr(), &pattern(seed, 0, BUFFER));
    let requests: Vec<TransferRequest> = cases
        .iter()
        .map(|&(opcode, local, remote, length)| TransferRequest {
            opcode,
            source: buffer.addr() + local,
            target_id: segment,
            target_offset: peer_addr + remote,
            length,
            protocol,
        })
        .collect();
    let batch = engine.allocate_batch(requests.len()).expect("batch");
    let start = aiv_transport::device::cann::profiler::now_us();
    engine.submit_transfer(batch, &requests).expect("submit");
    let status = engine.wait_batch(batch).expect("wait");
    if protocol.is_none() {
        aiv.1.push(Window::since(start));
    }
    for (task, &(opcode, local, remote, length)) in cases.iter().enumerate() {
        let state = engine.transfer_status(batch, task).expect("status").state;
        let reason = engine.task_reason(batch, task).expect("task");
        if state != TransferState::Completed {
            return Err(format!("{name} task {task} {opcode:?} ended {state:?}: {reason:?}"));
        }
        let evidence = engine.task_evidence(batch, task).expect("task").expect("evidence");
        println!("CHECK {name} task {task}: {opcode:?} {length} bytes completed; evidence {evidence:?}");
        let expected = protocol.map_or("aiv", |p| p.as_str());
        if evidence.path != expected {
            return Err(format!("{name} task {task}: unexpected evidence {evidence:?}"));
        }
        if protocol.is_none() {
            // The vendor's runtime: the kernel's word, with no Host act counted in flight, is unknown alone (the
            // run's verdict takes the profiler); the twin's device model: AIV-direct on its own records.
            let acts = [&evidence.descriptors_written, &evidence.doorbells_rung, &evidence.completion_seen];
            let good = if evidence.descriptors_written.source == Source::SelfReported {
                acts.iter().all(|act| act.source == Source::SelfReported && act.by_host == 0)
                    && evidence.descriptors_written.by_aiv > 0
                    && evidence.submitter() == Submitter::Unknown
            } else {
                evidence.is_aiv_direct()
            };
            if !good {
                return Err(format!("{name} task {task}: unexpected evidence {evidence:?}"));
            }
            aiv.0.add(&evidence);
        }
        if opcode == Opcode::Read {
            let landed = read_device(device, buffer.addr() + local, length);
            if landed != pattern(2, remote, length) {
                return Err(format!("{name} task {task}: READ data differs from NPU B's pattern"));
            }
            println!("CHECK {name} task {task}: READ of {length} bytes from NPU B matches byte for byte");
        }
    }
    engine.free_batch(batch).expect("free");
    if status.state != TransferState::Completed {
        return Err(format!("{name}: batch ended {:?}", status.state));
    }

    // WRITE results are checked by reading them back from NPU B into unused local space.
    let verify: Vec<TransferRequest> = cases
        .iter()
        .filter(|case| case.0 == Opcode::Write)
        .enumerate()
        .map(|(i, &(_, _, remote, length))| TransferRequest {
            opcode: Opcode::Read,
            source: buffer.addr() + (12 << 20) + (i as u64) * (3 << 20) / 2,
            target_id: segment,
            target_offset: peer_addr + remote,
            length,
            protocol,
        })
        .collect();
    let batch = engine.allocate_batch(verify.len()).expect("batch");
    engine.submit_transfer(batch, &verify).expect("submit");
    let state = engine.wait_batch(batch).expect("wait").state;
    if state != TransferState::Completed {
        let reason = engine.task_reason(batch, 0);
        engine.free_batch(batch).expect("free");
        return Err(format!("{name}: read-back batch ended {state:?}: {reason:?}"));
    }
    for (request, &(_, local, _, length)) in verify.iter().zip(cases.iter().filter(|case| case.0 == Opcode::Write)) {
        let back = read_device(device, request.source, length);
        if back != pattern(seed, local, length) {
            engine.free_batch(batch).expect("free");
            return Err(format!("{name}: WRITE of {length} bytes: NPU B does not hold what NPU A sent"));
        }
        println!("CHECK {name}: WRITE of {length} bytes to NPU B read back byte for byte");
    }
    engine.free_batch(batch).expect("free");
    Ok(())
}
