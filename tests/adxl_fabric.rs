//! Twin end-to-end tests of the `adxl-fabric` baseline (HiXL's FabricMem engine of the twin runtime): random data
//! both ways, the verdict from the engine's records (AI-CPU-submitted with AI-CPU unfold, Host-submitted with Host
//! unfold or with the test-only Host-copy mis-wiring of an AI-CPU-unfold engine), ranges outside the registrations,
//! a peer that went away, and the advertisement. Runs on the CPU twin only.

#[path = "common/aiv.rs"]
mod common;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use aiv_transport::config::{AivOptions, FabricMemoryOptions, LaunchMode};
use aiv_transport::evidence::{Act, Source, Submitter, TransferEvidence};
use aiv_transport::{Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState};
use common::{node, Node};
use rand::{Rng, RngCore, SeedableRng};

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn options(device_id: u32, aicpu_unfold: bool) -> AivOptions {
    AivOptions {
        baseline_timeout: Duration::from_millis(500),
        fabric_memory: FabricMemoryOptions {
            enable_aicpu_unfold: aicpu_unfold,
            task_stream_num: if aicpu_unfold { 1 } else { 2 },
        },
        ..common::options(device_id, LaunchMode::Persistent, 8)
    }
}

/// Two nodes (the initiator with AI-CPU unfold or Host unfold) with random bytes.
fn pair(size: u64, seed: u64, aicpu_unfold: bool) -> (Node, Node, SegmentId) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut a = node(options(0, aicpu_unfold), size);
    let mut b = node(options(1, true), size);
    a.modify(|bytes| rng.fill_bytes(bytes));
    b.modify(|bytes| rng.fill_bytes(bytes));
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    (a, b, peer)
}

struct Outcome {
    states: Vec<TransferState>,
    reasons: Vec<Option<String>>,
    evidence: Vec<Option<TransferEvidence>>,
}

impl Outcome {
    fn evidence(&self) -> Vec<&TransferEvidence> {
        self.evidence.iter().map(|e| e.as_ref().expect("evidence")).collect()
    }
}

fn run(engine: &TransferEngine, requests: &[TransferRequest]) -> Outcome {
    let batch = engine.allocate_batch(requests.len()).expect("batch");
    engine.submit_transfer(batch, requests).expect("submit");
    engine.wait_batch(batch).expect("wait");
    let n = requests.len();
    let outcome = Outcome {
        states: (0..n).map(|t| engine.transfer_status(batch, t).expect("status").state).collect(),
        reasons: (0..n).map(|t| engine.task_reason(batch, t).expect("reason")).collect(),
        evidence: (0..n).map(|t| engine.task_evidence(batch, t).expect("evidence")).collect(),
    };
    engine.free_batch(batch).expect("free");
    outcome
}

/// Three disjoint random requests (1 B to 1 MiB, random offsets, multiples of `align`; all READs or all WRITEs: one
/// batch).
fn random_requests(
    rng: &mut impl Rng,
    a: &Node,
    b: &Node,
    peer: SegmentId,
    opcode: Opcode,
    align: u64,
) -> Vec<TransferRequest> {
    let count = 3u64;
    let offset = |rng: &mut dyn RngCore, max: u64| (rng.gen_range(0..max) / align) * align;
    let span = a.buffer.len() / count / 64 * 64;
    (0..count)
        .map(|i| {
            let length = rng.gen_range(1..=(span / 2).min(1 << 20));
            TransferRequest {
                opcode,
                source: a.buffer.addr() + i * span + offset(rng, span - length),
                target_id: peer,
                target_offset: b.buffer.addr() + i * span + offset(rng, span - length),
                length,
                protocol: Some(Protocol::AdxlFabric),
            }
        })
        .collect()
}

/// Runs the requests and checks every byte landed.
fn run_and_check(a: &Node, b: &Node, requests: &[TransferRequest]) -> Outcome {
    let source = |r: &TransferRequest| match r.opcode {
        Opcode::Read => b.read(
            (r.target_offset - b.buffer.addr()) as usize..(r.target_offset - b.buffer.addr() + r.length) as usize,
        ),
        Opcode::Write => {
            a.read((r.source - a.buffer.addr()) as usize..(r.source - a.buffer.addr() + r.length) as usize)
        }
    };
    let expected: Vec<Vec<u8>> = requests.iter().map(source).collect();
    let outcome = run(&a.engine, requests);
    for (task, r) in requests.iter().enumerate() {
        assert_eq!(outcome.states[task], TransferState::Completed, "task {task}: {:?}", outcome.reasons[task]);
        let (node, to) = match r.opcode {
            Opcode::Read => (a, r.source - a.buffer.addr()),
            Opcode::Write => (b, r.target_offset - b.buffer.addr()),
        };
        assert!(node.read(to as usize..(to + r.length) as usize) == expected[task][..], "task {task}: data differs");
    }
    outcome
}

fn device_of(node: &Node) -> i32 {
    node.device.backend().device_id() as i32
}

/// AI-CPU unfold: random data both ways; each batch is AI-CPU launches whose SQEs the AI CPU wrote, shared by its
/// transfers (window 3, a third of the launches each); the advertisement names the engine. The Host-copy mis-wiring
/// (test-only) of the same engine turns the same batch's verdict to Host-submitted: the verdict is the counts'.
#[test]
fn ai_cpu_unfold_moves_random_data_both_ways_ai_cpu_submitted_and_the_mis_wiring_shows() {
    let _serial = serial();
    cann_twin::control::record_provenance(true);
    let (a, b, peer) = pair(8 << 20, 301, true);
    let aiv = b.engine.local_descriptor().aiv.expect("aiv object");
    let server = aiv["fabric_mem_server"].as_str().expect("the twin device advertises its FabricMem engine");
    assert!(server.starts_with("127.0.0.1:"), "{server}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(302);
    for opcode in [Opcode::Write, Opcode::Read, Opcode::Write] {
        let requests = random_requests(&mut rng, &a, &b, peer, opcode, 1);
        let outcome = run_and_check(&a, &b, &requests);
        for e in outcome.evidence() {
            assert_eq!((e.path, e.window), ("adxl-fabric", 3), "{e:?}");
            assert!(e.descriptors_written.by_aicpu >= 1, "{e:?}");
            assert_eq!(e.descriptors_written.total(), e.descriptors_written.by_aicpu, "{e:?}");
            assert_eq!(e.descriptors_written.source, Source::TwinModel, "{e:?}");
            assert!(e.doorbells_rung.by_aicpu >= 1 && e.doorbells_rung.by_host == 0, "{e:?}");
            // Three operations: one launch (one per 128 descriptors), a third per transfer.
            assert!((e.host_launches - 1.0 / 3.0).abs() < 1e-9, "{e:?}");
            assert_eq!(e.submitter(), Submitter::AiCpuSubmitted, "{e:?}");
        }
    }

    cann_twin::control::fabric_mem_host_copies(device_of(&a), true);
    let requests = random_requests(&mut rng, &a, &b, peer, Opcode::Write, 1);
    let wired = run_and_check(&a, &b, &requests);
    cann_twin::control::fabric_mem_host_copies(device_of(&a), false);
    for e in wired.evidence() {
        assert_eq!(e.descriptors_written, Act::host(Source::TwinModel, 3), "three Host copies: {e:?}");
        assert_eq!((e.host_launches, e.submitter()), (0.0, Submitter::HostSubmitted), "{e:?}");
    }
}

/// Host unfold (`fabric_memory.enable_aicpu_unfold` false, two streams): one Host `aclrtMemcpyAsync` per operation,
/// no launch: Host-submitted, data checked both ways (offsets 64-byte aligned, as the runtime's device-to-device
/// stream copy needs; an unaligned one fails saying so).
#[test]
fn host_unfold_is_host_submitted() {
    let _serial = serial();
    let (a, b, peer) = pair(4 << 20, 311, false);
    let mut rng = rand::rngs::StdRng::seed_from_u64(312);
    for opcode in [Opcode::Read, Opcode::Write] {
        let outcome = run_and_check(&a, &b, &random_requests(&mut rng, &a, &b, peer, opcode, 64));
        for e in outcome.evidence() {
            assert_eq!(e.descriptors_written, Act::host(Source::TwinModel, 3), "{e:?}");
            assert_eq!(e.completion_seen, Act::host(Source::TwinModel, 3), "{e:?}");
            assert_eq!((e.host_launches, e.submitter()), (0.0, Submitter::HostSubmitted), "{e:?}");
        }
    }
    let mut unaligned = random_requests(&mut rng, &a, &b, peer, Opcode::Write, 64);
    unaligned[0].source += 1;
    let outcome = run(&a.engine, &unaligned);
    assert_eq!(outcome.states, [TransferState::Failed; 3]);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(reason.starts_with("adxl-fabric: FAILED (503900)") && reason.contains("64-byte"), "{reason}");
}

/// A local range outside the registered memory is PARAM_INVALID naming it; a peer whose engine went away fails within
/// the baseline timeout, not the watchdog's.
#[test]
fn ranges_outside_the_registrations_and_a_peer_gone_fail_in_bounded_time() {
    let _serial = serial();
    let (a, b, peer) = pair(1 << 20, 321, true);
    let write = |source: u64, target: u64, length: u64| TransferRequest {
        opcode: Opcode::Write,
        source,
        target_id: peer,
        target_offset: target,
        length,
        protocol: Some(Protocol::AdxlFabric),
    };
    assert_eq!(run(&a.engine, &[write(a.buffer.addr(), b.buffer.addr(), 4096)]).states, [TransferState::Completed]);
    let host = vec![0u8; 4096];
    let outside = run(&a.engine, &[write(host.as_ptr() as u64, b.buffer.addr(), 4096)]);
    assert_eq!(outside.states, [TransferState::Failed]);
    let reason = outside.reasons[0].clone().expect("reason");
    assert!(reason.contains(&format!("{:#x}", host.as_ptr() as u64)), "{reason}");

    let (name, target) = (b.engine.name().to_owned(), b.buffer.addr());
    drop(b);
    let started = Instant::now();
    let gone = run(&a.engine, &[write(a.buffer.addr(), target, 4096)]);
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by baseline_timeout: {:?}", started.elapsed());
    assert_ne!(gone.states[0], TransferState::Completed, "{name}: {:?}", gone.reasons);
    let reason = gone.reasons[0].clone().expect("reason");
    assert!(reason.starts_with("adxl-fabric: ") || reason.contains("lost"), "{reason}");
}
