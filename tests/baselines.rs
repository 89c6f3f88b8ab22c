//! Twin end-to-end tests of the baselines `adxl` (AI-CPU-submitted through the twin's HiXL) and `ubshmem`
//! (Host-submitted): random data both ways, one batch mixing all four protocols, the evidence each path records (only
//! `aiv` is AIV-direct), ADXL's buffer pool made visible, and failures and timeouts that end FAILED / TIMEOUT with
//! their reasons. Runs on the CPU twin only.
//!
//! ubshmem's acts are checked against the loader tables' process-wide counts of the same run
//! (`ascendcl_sys::calls::process()` before and after), adxl's against the provenance records of the AI CPU's SDMA
//! channels of the initiator's device: the tests of this binary take one lock, so what is counted between two
//! snapshots is the run's.

#[path = "common/aiv.rs"]
mod common;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use aiv_transport::evidence::{Act, Check, Source, Submitter, TransferEvidence};
use ascendcl_sys::calls::CallCounts;

use aiv_transport::config::{AivOptions, LaunchMode};
use aiv_transport::transport::adxl::AdxlStatus;
use aiv_transport::transport::ubshmem::{MIN_PIECE_BYTES, STREAMS_PER_TRANSFER};
use aiv_transport::{EngineConfig, Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState};
use common::{node, Node};
use rand::{Rng, RngCore, SeedableRng};

/// One test at a time: the loader tables' process-wide counts between two snapshots are then one run's calls.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The options of a node on the twin runtime, where `adxl` goes through HiXL.
fn baseline_options(device_id: u32) -> AivOptions {
    AivOptions {
        baseline_timeout: Duration::from_millis(300),
        ubshmem_workers: 2,
        ubshmem_streams: 8,
        ..common::options(device_id, LaunchMode::Persistent, 8)
    }
}

/// Two nodes on the twin runtime.
fn pair(size: u64, seed: u64) -> (Node, Node, SegmentId) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut a = node(baseline_options(0), size);
    let mut b = node(baseline_options(1), size);
    a.modify(|bytes| rng.fill_bytes(bytes));
    b.modify(|bytes| rng.fill_bytes(bytes));
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    (a, b, peer)
}

struct Outcome {
    states: Vec<TransferState>,
    reasons: Vec<Option<String>>,
    evidence: Vec<Option<TransferEvidence>>,
    /// The calls the loader tables counted, process-wide, from before the submission until every task finished.
    calls: CallCounts,
    /// SQEs the AI CPU wrote that the SDMA channels of device 0's AI CPU executed meanwhile (their provenance records).
    aicpu_sqes: u64,
}

/// SQEs written by the AI CPU that device 0's AI-CPU channels have executed (their provenance records, summed).
fn aicpu_sqes() -> u64 {
    cann_twin::control::aicpu_channels(0)
        .into_iter()
        .map(|channel| cann_twin::control::provenance(0, channel).expect("an AI-CPU channel").sqes_by_aicpu)
        .sum()
}

impl Outcome {
    fn evidence(&self) -> Vec<&TransferEvidence> {
        self.evidence.iter().map(|e| e.as_ref().expect("evidence")).collect()
    }

    /// Every counted call of `function` through the ACL table during the run.
    fn acl(&self, function: &str) -> u64 {
        self.calls.get("AclApi", function)
    }
}

fn run(engine: &TransferEngine, requests: &[TransferRequest]) -> Outcome {
    let (before, aicpu_before) = (ascendcl_sys::calls::process(), aicpu_sqes());
    let batch = engine.allocate_batch(requests.len()).expect("batch");
    engine.submit_transfer(batch, requests).expect("submit");
    engine.wait_batch(batch).expect("wait");
    let calls = ascendcl_sys::calls::process().since(&before);
    let aicpu_sqes = aicpu_sqes() - aicpu_before;
    let n = requests.len();
    let outcome = Outcome {
        states: (0..n).map(|t| engine.transfer_status(batch, t).expect("status").state).collect(),
        reasons: (0..n).map(|t| engine.task_reason(batch, t).expect("reason")).collect(),
        evidence: (0..n).map(|t| engine.task_evidence(batch, t).expect("evidence")).collect(),
        calls,
        aicpu_sqes,
    };
    engine.free_batch(batch).expect("free");
    outcome
}

/// Disjoint random requests (lengths 1 B to 2.5 MiB, random offsets and directions) of one protocol.
fn random_requests(
    rng: &mut impl Rng,
    a: &Node,
    b: &Node,
    peer: SegmentId,
    protocols: &[Protocol],
) -> Vec<TransferRequest> {
    let size = a.buffer.len();
    let span = size / protocols.len() as u64;
    protocols
        .iter()
        .enumerate()
        .map(|(i, &protocol)| {
            let i = i as u64;
            let length = rng.gen_range(1..=(span / 2).min(5 << 19));
            let local = i * span + rng.gen_range(0..span - length);
            let remote = i * span + rng.gen_range(0..span - length);
            TransferRequest {
                opcode: if rng.gen_bool(0.5) { Opcode::Read } else { Opcode::Write },
                source: a.buffer.addr() + local,
                target_id: peer,
                target_offset: b.buffer.addr() + remote,
                length,
                protocol: Some(protocol),
            }
        })
        .collect()
}

/// Runs the requests and checks every byte landed, returning the outcome for evidence checks.
fn run_and_check(a: &Node, b: &Node, requests: &[TransferRequest]) -> Outcome {
    run_and_check_around(a, b, requests, |run| run())
}

/// [`run_and_check`], with `around` wrapped around the transfers alone (not the reads that check them).
fn run_and_check_around(
    a: &Node,
    b: &Node,
    requests: &[TransferRequest],
    around: impl FnOnce(&dyn Fn() -> Outcome) -> Outcome,
) -> Outcome {
    let source_bytes = |r: &TransferRequest| {
        let (node, from) = match r.opcode {
            Opcode::Read => (b, r.target_offset - b.buffer.addr()),
            Opcode::Write => (a, r.source - a.buffer.addr()),
        };
        node.read(from as usize..(from + r.length) as usize)
    };
    let expected: Vec<Vec<u8>> = requests.iter().map(source_bytes).collect();
    let outcome = around(&|| run(&a.engine, requests));
    for (task, request) in requests.iter().enumerate() {
        assert_eq!(outcome.states[task], TransferState::Completed, "task {task}: {:?}", outcome.reasons[task]);
        let (node, to) = match request.opcode {
            Opcode::Read => (a, request.source - a.buffer.addr()),
            Opcode::Write => (b, request.target_offset - b.buffer.addr()),
        };
        assert!(
            node.read(to as usize..(to + request.length) as usize) == expected[task][..],
            "task {task} ({:?}, {} B): data differs",
            request.protocol,
            request.length
        );
    }
    outcome
}

/// The twin-only evidence reads of the adxl path (charged to no transfer).
const EVIDENCE_READ: &str = "cannTwinHixlClientEvidence";

/// HiXL calls the loader tables counted in a run, the twin-only evidence reads left out.
fn hixl_calls(calls: &CallCounts) -> u64 {
    calls
        .entries()
        .iter()
        .filter(|call| call.table == "HixlApi" && call.function != EVIDENCE_READ)
        .map(|c| c.count)
        .sum()
}

/// adxl on the twin runtime: the cann backend's HiXL path (a HiXL server per device, a client per peer, batch
/// put/get), every byte checked; the twin's HiXL runs each batch as HiXL's client-server mode does, on AI-CPU
/// tasks, and the records say so.
#[test]
fn adxl_through_hixl_on_the_twin_runtime_moves_random_data() {
    let _serial = serial();
    let (a, b, peer) = pair(8 << 20, 73);
    let mut rng = rand::rngs::StdRng::seed_from_u64(74);
    let mut tasks = 0u64;
    for _ in 0..3 {
        let mut requests = random_requests(&mut rng, &a, &b, peer, &[Protocol::Adxl; 4]);
        requests[0].length = 4096;
        requests[1].length = (3 << 20) / 2;
        // HiXL's AI-CPU tasks run on the emulated AI CPU of the client's device (a's, device 0): its occupancy
        // counts them. Only the transfers are measured, not the reads that check them.
        let outcome = run_and_check_around(&a, &b, &requests, |run| {
            let before = aiv_transport::occupancy::OccupancySnapshot::take(&[0, 1], true);
            let outcome = run();
            let occupancy = aiv_transport::occupancy::OccupancySnapshot::take(&[0, 1], true).since(&before);
            let aiv_transport::occupancy::DeviceReport::TwinModel { devices } = &occupancy.device else {
                panic!("the twin's figures: {occupancy:?}")
            };
            tasks += devices[0].aicpu.tasks_run;
            outcome
        });
        for evidence in outcome.evidence() {
            assert_eq!(evidence.path, "adxl");
            assert_eq!(evidence.runtime.kind, aiv_transport::evidence::RuntimeKind::Twin, "{evidence:?}");
            assert_eq!(evidence.checks().as_array(), [Check::No; 4], "{evidence:?}");
            assert_eq!(evidence.submitter(), Submitter::AiCpuSubmitted, "{evidence:?}");
        }
        assert_adxl_acts_are_the_ai_cpus(&outcome);
    }
    let counters = a.device.adxl().counters();
    assert_eq!((counters.timeouts, counters.failures), (0, 0), "{counters:?}");
    assert!(tasks >= 3, "HiXL's AI-CPU tasks ran on device 0's AI CPU: {tasks}");
}

/// A run's adxl records: each batch's acts (shared, `window` k) come from the twin HiXL's records of its AI-CPU
/// tasks: every SQE written and every doorbell rung by the AI CPU (at least one SQE per transfer, plus one flag SQE
/// per launch), one flag per launch read first by the AI CPU, nothing by the Host; one launch per 128 transfers, so
/// each transfer's share of the Host's launches lies between 1/k and 1. The SQEs sum to what the AI CPU's channels
/// executed by their own records, and the transfers' calls to the HiXL calls counted (less the evidence reads),
/// within the rounding up of a batch's share (at most k - 1 per batch of k).
fn assert_adxl_acts_are_the_ai_cpus(outcome: &Outcome) {
    let evidence = outcome.evidence();
    let (mut sqes, mut batches, mut charged, mut slack) = (0, 0, 0, 0);
    let mut index = 0;
    while index < evidence.len() {
        // The transfers of one batch are consecutive tasks sharing one set of acts.
        let first = evidence[index];
        let k = first.window as usize;
        assert!(k >= 1 && index + k <= evidence.len(), "{first:?}");
        let launches = k.div_ceil(128) as u64;
        for e in &evidence[index..index + k] {
            assert_eq!(e.window, first.window);
            assert_eq!(
                (e.descriptors_written, e.doorbells_rung, e.completion_seen),
                (first.descriptors_written, first.doorbells_rung, first.completion_seen)
            );
            for act in [e.descriptors_written, e.doorbells_rung, e.completion_seen] {
                assert_eq!(
                    (act.source, act.by_aiv, act.by_host, act.unattributed),
                    (Source::TwinModel, 0, 0, 0),
                    "{e:?}"
                );
            }
            assert!((e.host_launches - launches as f64 / k as f64).abs() < 1e-9, "{e:?}");
            assert!(e.host_launches >= 1.0 / k as f64 && e.host_launches <= 1.0, "{e:?}");
            charged += e.host_device_api_calls;
        }
        assert!(
            first.descriptors_written.by_aicpu >= k as u64 + launches,
            "an SQE per transfer, a flag per launch: {first:?}"
        );
        assert!(first.doorbells_rung.by_aicpu >= launches, "a doorbell per launch at least: {first:?}");
        assert_eq!(first.completion_seen.by_aicpu, launches, "a flag per launch, read first by the AI CPU: {first:?}");
        sqes += first.descriptors_written.by_aicpu;
        batches += 1;
        slack += k as u64 - 1;
        index += k;
    }
    assert_eq!(sqes, outcome.aicpu_sqes, "the AI CPU's channels' own records: {batches} batches");
    let counted = hixl_calls(&outcome.calls);
    assert!(
        counted <= charged && charged <= counted + slack,
        "{batches} batches: {charged} calls charged, {counted} counted (+{slack} rounding): {:?}",
        outcome.calls
    );
}

/// A run's ubshmem records against the loader tables' counts of the same run: the copies written and submitted,
/// the synchronisations and the calls charged are exactly the calls counted (nothing is shared: window 1).
fn assert_ubshmem_acts_are_the_counted_calls(outcome: &Outcome) {
    let evidence = outcome.evidence();
    let sum = |f: fn(&TransferEvidence) -> u64| evidence.iter().map(|e| f(e)).sum::<u64>();
    for e in &evidence {
        assert_eq!(e.window, 1);
        assert_eq!(e.doorbells_rung, e.descriptors_written, "each copy call wrote and submitted: {e:?}");
        for act in [e.descriptors_written, e.doorbells_rung, e.completion_seen] {
            assert_eq!((act.source, act.by_aiv, act.unattributed), (Source::HostCalls, 0, 0), "{e:?}");
        }
        assert_eq!(e.checks().as_array(), [Check::No; 4], "{e:?}");
    }
    let copies = outcome.acl("aclrtMemcpyAsync") + outcome.acl("aclrtMemcpy");
    assert_eq!(sum(|e| e.descriptors_written.by_host), copies, "{:?}", outcome.calls);
    assert_eq!(
        sum(|e| e.completion_seen.by_host),
        outcome.acl("aclrtSynchronizeStreamWithTimeout") + outcome.acl("aclrtMemcpy"),
        "{:?}",
        outcome.calls
    );
    // The process-wide counts also hold calls other threads made meanwhile (the aiv transport's probe, an import of
    // the peer's memory for another path): the transfers are charged at least their copies and synchronisations, and
    // no more than every call counted.
    let charged = sum(|e| e.host_device_api_calls);
    let own =
        outcome.acl("aclrtMemcpyAsync") + outcome.acl("aclrtSynchronizeStreamWithTimeout") + outcome.acl("aclrtMemcpy");
    assert!(own <= charged && charged <= outcome.calls.total(), "{charged} charged: {:?}", outcome.calls);
}

/// An aligned 1 MiB WRITE is 4 pieces: 4 aclrtMemcpyAsync and 4 synchronisations, and its record says exactly that.
#[test]
fn ubshmem_acts_of_a_four_piece_copy_are_its_counted_calls() {
    let _serial = serial();
    let (a, _b, peer) = pair(4 << 20, 151);
    let write = TransferRequest {
        opcode: Opcode::Write,
        source: a.buffer.addr(),
        target_id: peer,
        target_offset: _b.buffer.addr() + (1 << 20),
        length: 1 << 20,
        protocol: Some(Protocol::Ubshmem),
    };
    // Warm up: the stream pool is made on the first submit (its calls are the pool's, charged to no transfer).
    assert_eq!(run(&a.engine, std::slice::from_ref(&write)).states, [TransferState::Completed]);
    let outcome = run(&a.engine, std::slice::from_ref(&write));
    assert_eq!(outcome.states, [TransferState::Completed], "{:?}", outcome.reasons);
    assert_eq!(
        (outcome.acl("aclrtMemcpyAsync"), outcome.acl("aclrtSynchronizeStreamWithTimeout"), outcome.acl("aclrtMemcpy")),
        (4, 4, 0),
        "{:?}",
        outcome.calls
    );
    let evidence = outcome.evidence()[0];
    assert_eq!(evidence.descriptors_written, Act::host(Source::HostCalls, 4), "{evidence:?}");
    assert_eq!(evidence.doorbells_rung, Act::host(Source::HostCalls, 4), "{evidence:?}");
    assert_eq!(evidence.completion_seen, Act::host(Source::HostCalls, 4), "{evidence:?}");
    assert_eq!((evidence.descriptors, evidence.doorbells, evidence.window), (4, 4, 1));
    // 8, plus the worker's device binding if this was its first transfer; the process-wide counts may also hold
    // calls of other threads made meanwhile (the aiv transport's probe, an import for another path).
    assert!(
        (8..=8 + outcome.acl("aclrtSetDevice")).contains(&evidence.host_device_api_calls),
        "{evidence:?} {:?}",
        outcome.calls
    );
    assert!(evidence.host_device_api_calls <= outcome.calls.total(), "{:?}", outcome.calls);
    assert_ubshmem_acts_are_the_counted_calls(&outcome);
}

/// Two WRITEs submitted together to one connected peer are one HiXL batch: one AI-CPU launch of two entries (two data
/// SQEs and a flag SQE, written and rung by the AI CPU, the flag read first by it), shared by both (window 2): each
/// transfer's share of the Host's launches is 1/2. The test-only mis-wiring of the twin's HiXL (Host copies instead
/// of the AI CPU) turns the same batch's verdict to Host-submitted.
#[test]
fn adxl_acts_of_a_batch_of_two_are_shared_and_counted() {
    let _serial = serial();
    let (a, b, peer) = pair(4 << 20, 161);
    let write = |offset: u64| TransferRequest {
        opcode: Opcode::Write,
        source: a.buffer.addr() + offset,
        target_id: peer,
        target_offset: b.buffer.addr() + offset,
        length: 64 << 10,
        protocol: Some(Protocol::Adxl),
    };
    // Warm up: connects the client (its calls charged to that transfer).
    let warm = run(&a.engine, &[write(0)]);
    assert_eq!(warm.states, [TransferState::Completed]);
    let calls = hixl_calls(&warm.calls);
    assert_eq!(warm.evidence()[0].host_device_api_calls, calls, "connect, submit and queries: {:?}", warm.calls);
    assert_eq!(warm.calls.get("HixlApi", EVIDENCE_READ), 2, "the client's counts read before and after the batch");
    let outcome = run(&a.engine, &[write(0), write(1 << 20)]);
    assert_eq!(outcome.states, [TransferState::Completed; 2], "{:?}", outcome.reasons);
    let hixl = |function: &str| outcome.calls.get("HixlApi", function);
    assert_eq!(hixl("HixlCSClientBatchPutAsync"), 1, "{:?}", outcome.calls);
    let queries = hixl("HixlCSClientQueryCompleteStatus");
    for e in outcome.evidence() {
        assert_eq!(e.window, 2, "{e:?}");
        assert_eq!(e.descriptors_written, Act::aicpu(Source::TwinModel, 3), "two data SQEs and a flag SQE: {e:?}");
        assert!(e.doorbells_rung.by_aicpu >= 1 && e.doorbells_rung.total() == e.doorbells_rung.by_aicpu, "{e:?}");
        assert_eq!(e.completion_seen, Act::aicpu(Source::TwinModel, 1), "{e:?}");
        assert_eq!(e.host_launches, 0.5, "one launch for two transfers: {e:?}");
        assert_eq!(
            e.host_device_api_calls,
            (1 + queries).div_ceil(2),
            "its half of the submit and the {queries} queries"
        );
        assert_eq!(e.checks().as_array(), [Check::No; 4]);
        assert_eq!(e.submitter(), Submitter::AiCpuSubmitted);
    }
    assert_eq!(outcome.aicpu_sqes, 3, "the AI CPU's channels executed those three SQEs");
    assert_adxl_acts_are_the_ai_cpus(&outcome);

    // Mis-wired (test-only): the twin's HiXL clients on a's device move the batch with Host copies instead.
    cann_twin::control::hixl_host_copies(0, true);
    let wired = run(&a.engine, &[write(0), write(1 << 20)]);
    cann_twin::control::hixl_host_copies(0, false);
    assert_eq!(wired.states, [TransferState::Completed; 2], "{:?}", wired.reasons);
    assert_eq!(wired.aicpu_sqes, 0, "the AI CPU's channels ran nothing");
    for e in wired.evidence() {
        // The client read each 64 KiB WRITE's bytes with one runtime copy.
        assert_eq!(e.descriptors_written, Act::host(Source::TwinModel, 2), "{e:?}");
        assert_eq!(e.doorbells_rung, Act::host(Source::TwinModel, 2), "{e:?}");
        assert_eq!(e.completion_seen, Act::host(Source::TwinModel, 2), "{e:?}");
        assert_eq!((e.host_launches, e.submitter()), (0.0, Submitter::HostSubmitted), "{e:?}");
    }
}

#[test]
fn ubshmem_moves_random_data_over_the_stream_pool() {
    let _serial = serial();
    let (a, b, peer) = pair(8 << 20, 81);
    let mut rng = rand::rngs::StdRng::seed_from_u64(82);
    // Warm up: the stream pool is made on the first submit (its calls are the pool's, charged to no transfer).
    let warm = random_requests(&mut rng, &a, &b, peer, &[Protocol::Ubshmem]);
    run_and_check(&a, &b, &warm);
    let mut expected_copies =
        warm.iter().map(|r| r.length.div_ceil(MIN_PIECE_BYTES).clamp(1, STREAMS_PER_TRANSFER as u64)).sum::<u64>();
    for _ in 0..3 {
        let mut requests = random_requests(&mut rng, &a, &b, peer, &[Protocol::Ubshmem; 4]);
        requests[0].length = 100;
        let outcome = run_and_check(&a, &b, &requests);
        for (request, evidence) in requests.iter().zip(outcome.evidence()) {
            assert_eq!(evidence.path, "ubshmem");
            assert_eq!(evidence.runtime.kind, aiv_transport::evidence::RuntimeKind::Twin, "{evidence:?}");
            let pieces = request.length.div_ceil(MIN_PIECE_BYTES).clamp(1, STREAMS_PER_TRANSFER as u64);
            expected_copies += pieces;
            // A piece is one aclrtMemcpyAsync, or an aclrtMemcpy of its unaligned head (or of all of it) and
            // maybe an aclrtMemcpyAsync of the rest; each stream used is synchronised once.
            let copies = evidence.descriptors_written.by_host;
            assert!((pieces..=2 * pieces).contains(&copies), "{pieces} pieces: {evidence:?}");
            assert!(evidence.completion_seen.by_host >= pieces, "{evidence:?}");
            assert!(evidence.host_device_api_calls >= copies + pieces, "{evidence:?}");
        }
        assert_ubshmem_acts_are_the_counted_calls(&outcome);
    }
    let counters = a.device.ubshmem().counters();
    assert_eq!(counters.copies, expected_copies, "{counters:?}");
    assert_eq!(counters.synchronisations, expected_copies, "{counters:?}");
}

/// The engine that carries adxl's copies, the AI CPU's SDMA channels of a's device, stalled: the batch ends TIMEOUT
/// at `baseline_timeout`, and after the release the next one is served.
#[test]
fn adxl_stalled_ai_cpu_times_out_with_its_status_and_recovers() {
    let _serial = serial();
    let (a, b, peer) = pair(4 << 20, 101);
    let write = |length: u64| TransferRequest {
        opcode: Opcode::Write,
        source: a.buffer.addr(),
        target_id: peer,
        target_offset: b.buffer.addr(),
        length,
        protocol: Some(Protocol::Adxl),
    };
    // Warm up: the first transfer connects a's HiXL client to b's server.
    assert_eq!(run(&a.engine, &[write(4096)]).states, [TransferState::Completed]);
    cann_twin::control::set_aicpu_stalled(0, true).expect("a's AI CPU");
    let started = Instant::now();
    let outcome = run(&a.engine, &[write(4096), write(1 << 20)]);
    cann_twin::control::set_aicpu_stalled(0, false).expect("a's AI CPU");
    assert_eq!(outcome.states, [TransferState::Timeout, TransferState::Timeout], "{:?}", outcome.reasons);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(reason.contains(&AdxlStatus::TIMEOUT.0.to_string()) && reason.contains("TIMEOUT"), "{reason}");
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by baseline_timeout, not the watchdog");
    assert!(outcome.evidence[0].is_some(), "a timed-out transfer still records what happened");
    assert_eq!(a.device.adxl().counters().timeouts, 1);
    let outcome = run_and_check(&a, &b, &[write(300_000)]);
    assert_eq!(outcome.states, [TransferState::Completed]);
}

#[test]
fn adxl_refuses_a_peer_without_device_memory_as_not_connected() {
    let _serial = serial();
    let a = node(baseline_options(0), 1 << 20);
    // A peer engine with host memory only: nothing to import.
    let mut config = EngineConfig::new("127.0.0.1");
    config.protocol = Protocol::Aiv;
    let host_only = TransferEngine::new(config).expect("engine");
    let mut memory = vec![0u8; 1 << 16];
    // SAFETY: the vector outlives the registration, withdrawn below before it drops.
    unsafe { host_only.register_memory(memory.as_mut_ptr() as u64, 1 << 16, "cpu:0") }.expect("register");
    let peer = a.engine.open_segment(host_only.name()).expect("segment");
    let request = |protocol| TransferRequest {
        opcode: Opcode::Read,
        source: a.buffer.addr(),
        target_id: peer,
        target_offset: memory.as_ptr() as u64,
        length: 4096,
        protocol: Some(protocol),
    };
    let outcome = run(&a.engine, &[request(Protocol::Adxl), request(Protocol::Ubshmem)]);
    assert_eq!(outcome.states, [TransferState::Failed, TransferState::Failed]);
    let adxl = outcome.reasons[0].clone().expect("reason");
    assert!(adxl.contains("NOT_CONNECTED (103902)") && adxl.contains("advertises no HiXL server"), "{adxl}");
    let ubshmem = outcome.reasons[1].clone().expect("reason");
    assert!(ubshmem.starts_with("ubshmem:") && ubshmem.contains("advertises no aiv device"), "{ubshmem}");
    host_only.unregister_memory(memory.as_ptr() as u64).expect("unregister");
}

#[test]
fn ubshmem_stalled_streams_time_out_and_refused_copies_fail() {
    let _serial = serial();
    let (a, b, peer) = pair(4 << 20, 121);
    let write = TransferRequest {
        opcode: Opcode::Write,
        source: a.buffer.addr(),
        target_id: peer,
        target_offset: b.buffer.addr(),
        length: 1 << 20,
        protocol: Some(Protocol::Ubshmem),
    };
    let twin = a.twin();
    twin.stall_streams(true);
    let started = Instant::now();
    let outcome = run(&a.engine, std::slice::from_ref(&write));
    twin.stall_streams(false);
    assert_eq!(outcome.states, [TransferState::Timeout], "{:?}", outcome.reasons);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(reason.contains("synchronisation did not finish"), "{reason}");
    assert!(started.elapsed() < Duration::from_secs(5));
    twin.fail_next_destinations(1);
    let outcome = run(&a.engine, std::slice::from_ref(&write));
    assert_eq!(outcome.states, [TransferState::Failed], "{:?}", outcome.reasons);
    let reason = outcome.reasons[0].clone().expect("reason");
    // The runtime reports the refused copy as a task exception of the stream, at its synchronisation.
    assert!(reason.contains("task exception") && reason.contains("107000"), "{reason}");
    run_and_check(&a, &b, &[write]);
}

#[test]
fn adxl_client_has_adxls_shape_connect_sync_async_and_status_codes() {
    let _serial = serial();
    use aiv_transport::engine::{AdxlClient, AdxlTransferStatus, TransferOpDesc};
    let (a, b, _) = pair(4 << 20, 131);
    let client = AdxlClient::new(&a.engine);
    let op = |offset: u64, len: u64| TransferOpDesc {
        local_addr: a.buffer.addr() + offset,
        remote_addr: b.buffer.addr() + offset,
        len,
    };
    let remote = b.engine.name();
    assert_eq!(
        client.transfer_sync(remote, Opcode::Write, &[op(0, 4096)], Duration::from_secs(5)),
        AdxlStatus::NOT_CONNECTED
    );
    assert_eq!(client.connect(remote), AdxlStatus::SUCCESS);
    assert_eq!(
        client.transfer_sync(remote, Opcode::Write, &[op(0, 0)], Duration::from_secs(5)),
        AdxlStatus::PARAM_INVALID
    );
    let list = [op(0, 4096), op(1 << 20, 2 << 20)];
    assert_eq!(client.transfer_sync(remote, Opcode::Write, &list, Duration::from_secs(5)), AdxlStatus::SUCCESS);
    assert!(a.read(0..4096) == b.read(0..4096));
    assert!(a.read(1 << 20..3 << 20) == b.read(1 << 20..3 << 20));
    let request = client.transfer_async(remote, Opcode::Read, &[op(8192, 300_000)]).expect("started");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut status = client.get_transfer_status(&request);
    while status == AdxlTransferStatus::Waiting && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        status = client.get_transfer_status(&request);
    }
    assert_eq!(status, AdxlTransferStatus::Completed);
    assert!(client.release(&request));
    // A stalled AI CPU (the engine of adxl's copies): the status is the transport's TIMEOUT code, read back from the
    // task.
    cann_twin::control::set_aicpu_stalled(0, true).expect("a's AI CPU");
    let status = client.transfer_sync(remote, Opcode::Write, &[op(0, 4096)], Duration::from_secs(5));
    cann_twin::control::set_aicpu_stalled(0, false).expect("a's AI CPU");
    assert_eq!(status, AdxlStatus::TIMEOUT);
    assert_eq!(client.disconnect(remote), AdxlStatus::SUCCESS);
    assert_eq!(client.disconnect(remote), AdxlStatus::NOT_CONNECTED);
}

/// tcp moves memory with the Host's reads and writes: between device buffers of the twin runtime (as of an NPU) it
/// is refused at submission with the reason, instead of failing on the wire.
#[test]
fn tcp_between_device_buffers_of_the_twin_runtime_is_refused_with_the_reason() {
    let _serial = serial();
    let (a, b, peer) = pair(1 << 20, 141);
    a.engine.enable_tcp_transport().expect("tcp on a");
    b.engine.enable_tcp_transport().expect("tcp on b");
    let request = TransferRequest {
        opcode: Opcode::Write,
        source: a.buffer.addr(),
        target_id: peer,
        target_offset: b.buffer.addr(),
        length: 4096,
        protocol: Some(Protocol::Tcp),
    };
    let outcome = run(&a.engine, &[request]);
    assert_eq!(outcome.states, [TransferState::Failed]);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(reason.contains("protocol tcp") && reason.contains("device memory (npu:"), "{reason}");
}

/// On the twin runtime, one batch mixes the three device paths over device memory and tcp over Host memory
/// registered beside it; each request goes through its own path and every byte lands.
#[test]
fn one_batch_mixes_the_device_paths_and_tcp_on_host_memory() {
    let _serial = serial();
    let mut rng = rand::rngs::StdRng::seed_from_u64(93);
    let (a, b, peer) = pair(8 << 20, 92);
    a.engine.enable_tcp_transport().expect("tcp on a");
    b.engine.enable_tcp_transport().expect("tcp on b");
    let mut host_a = vec![0u8; 1 << 20];
    let mut host_b = vec![0u8; 1 << 20];
    rng.fill_bytes(&mut host_a);
    rng.fill_bytes(&mut host_b);
    // SAFETY: both vectors outlive their registrations, withdrawn below before they drop; every batch is waited for.
    unsafe {
        a.engine.register_memory(host_a.as_mut_ptr() as u64, 1 << 20, "cpu:0").expect("register a's Host memory");
        b.engine.register_memory(host_b.as_mut_ptr() as u64, 1 << 20, "cpu:0").expect("register b's Host memory");
    }
    // The segment again, now that b's descriptor lists its Host buffer.
    a.engine.refresh_segment(peer).expect("refresh");
    let protocols = [Protocol::Aiv, Protocol::Adxl, Protocol::Ubshmem];
    let mut mixed: Vec<Protocol> = protocols.iter().flat_map(|&p| [p, p]).collect();
    mixed.rotate_left(2);
    let mut requests = random_requests(&mut rng, &a, &b, peer, &mixed);
    let expected: Vec<Vec<u8>> = requests
        .iter()
        .map(|r| match r.opcode {
            Opcode::Read => b.read(
                (r.target_offset - b.buffer.addr()) as usize..(r.target_offset - b.buffer.addr() + r.length) as usize,
            ),
            Opcode::Write => {
                a.read((r.source - a.buffer.addr()) as usize..(r.source - a.buffer.addr() + r.length) as usize)
            }
        })
        .collect();
    let tcp_write = TransferRequest {
        opcode: Opcode::Write,
        source: host_a.as_ptr() as u64,
        target_id: peer,
        target_offset: host_b.as_ptr() as u64 + 4096,
        length: 300_000,
        protocol: Some(Protocol::Tcp),
    };
    let sent = host_a[..300_000].to_vec();
    requests.insert(3, tcp_write);
    let outcome = run(&a.engine, &requests);
    for (task, request) in requests.iter().enumerate() {
        assert_eq!(outcome.states[task], TransferState::Completed, "task {task}: {:?}", outcome.reasons[task]);
        let evidence = outcome.evidence[task].as_ref().expect("evidence");
        let protocol = request.protocol.expect("protocol named");
        assert_eq!(evidence.path, protocol.as_str(), "each request went through its own path");
        assert_eq!(evidence.is_aiv_direct(), protocol == Protocol::Aiv, "{evidence:?}");
        if protocol != Protocol::Aiv {
            assert_eq!(evidence.checks().as_array(), [Check::No; 4], "a Host path: {evidence:?}");
        }
    }
    assert!(host_b[4096..4096 + 300_000] == sent[..], "tcp's bytes landed in b's Host memory");
    let device_requests: Vec<&TransferRequest> =
        requests.iter().filter(|r| r.protocol != Some(Protocol::Tcp)).collect();
    for (request, bytes) in device_requests.into_iter().zip(&expected) {
        let (node, to) = match request.opcode {
            Opcode::Read => (&a, request.source - a.buffer.addr()),
            Opcode::Write => (&b, request.target_offset - b.buffer.addr()),
        };
        assert!(node.read(to as usize..(to + request.length) as usize) == bytes[..], "{:?} data", request.protocol);
    }
    a.engine.unregister_memory(host_a.as_ptr() as u64).expect("unregister");
    b.engine.unregister_memory(host_b.as_ptr() as u64).expect("unregister");
}
