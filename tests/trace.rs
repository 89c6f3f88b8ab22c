//! Per-stage traces on the twin runtime (docs/trace.md): a traced aiv batch yields every kernel stage per group, in
//! order, inside the Host's submit-to-woken window, a DCQ-published event covering each transfer, SDMA engine runs
//! and the Host's events; a trace ring that overflows counts its drops while the transfers complete with their data;
//! the exported Chrome trace parses and names its tracks.

#[path = "common/aiv.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};

use aiv_transport::config::LaunchMode;
use aiv_transport::kernel_abi::{
    TRACE_STAGE_COMPLETION_OBSERVED, TRACE_STAGE_DCQ_PUBLISHED, TRACE_STAGE_DOORBELL, TRACE_STAGE_REQUEST_SEEN,
    TRACE_STAGE_SQES_POSTED,
};
use aiv_transport::trace::{align_clocks, chrome_trace, DeviceEvent, HostStage, TraceLog};
use aiv_transport::{Opcode, TransferRequest, TransferState};
use common::{node, options, Node};
use rand::{Rng, RngCore, SeedableRng};

/// Random WRITEs and READs between `a` and `b` (disjoint ranges), `batches` batches of `per_batch`; every transfer's
/// bytes checked. Returns the transfer ids of each batch (aiv reserves them in submit order from 1).
fn run_batches(a: &Node, b: &Node, batches: usize, per_batch: u64, max_len: u64, seed: u64) -> Vec<(u64, u64)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let size = a.buffer.len();
    let span = size / per_batch;
    let mut next_id = 1;
    let mut ids = Vec::new();
    for batch_index in 0..batches {
        let requests: Vec<TransferRequest> = (0..per_batch)
            .map(|i| {
                let length = rng.gen_range(1..=max_len.min(span));
                TransferRequest {
                    opcode: if rng.gen_bool(0.5) { Opcode::Read } else { Opcode::Write },
                    source: a.buffer.addr() + i * span + rng.gen_range(0..=span - length),
                    target_id: peer,
                    target_offset: b.buffer.addr() + i * span + rng.gen_range(0..=span - length),
                    length,
                    protocol: None,
                }
            })
            .collect();
        let expected: Vec<Vec<u8>> = requests
            .iter()
            .map(|r| match r.opcode {
                Opcode::Read => span_of(b, r.target_offset, r.length),
                Opcode::Write => span_of(a, r.source, r.length),
            })
            .collect();
        let batch = a.engine.allocate_batch(requests.len()).expect("batch");
        a.engine.submit_transfer(batch, &requests).expect("submit");
        a.engine.wait_batch(batch).expect("wait");
        for (task, request) in requests.iter().enumerate() {
            let status = a.engine.transfer_status(batch, task).expect("status");
            let reason = a.engine.task_reason(batch, task).expect("task");
            assert_eq!(status.state, TransferState::Completed, "batch {batch_index} task {task}: {reason:?}");
            let landed = match request.opcode {
                Opcode::Read => span_of(a, request.source, request.length),
                Opcode::Write => span_of(b, request.target_offset, request.length),
            };
            assert!(landed == expected[task], "batch {batch_index} task {task}: data");
        }
        a.engine.free_batch(batch).expect("free");
        ids.push((next_id, next_id + per_batch - 1));
        next_id += per_batch;
    }
    ids
}

/// The `length` bytes of `node`'s buffer at device address `addr`.
fn span_of(node: &Node, addr: u64, length: u64) -> Vec<u8> {
    let start = (addr - node.buffer.addr()) as usize;
    node.read(start..start + length as usize)
}

fn fill(node: &mut Node, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    node.modify(|bytes| rng.fill_bytes(bytes));
}

/// The device events of `device`, grouped by (block, first transfer id), in ring order.
fn groups(log: &TraceLog, device: i32) -> BTreeMap<(u32, u64), Vec<DeviceEvent>> {
    let mut out: BTreeMap<(u32, u64), Vec<DeviceEvent>> = BTreeMap::new();
    for event in log.device.iter().filter(|e| e.device == device) {
        out.entry((event.block, event.transfer_id())).or_default().push(*event);
    }
    out
}

#[test]
fn a_traced_aiv_batch_records_every_stage_in_order_inside_the_host_window() {
    traced_batches(LaunchMode::Persistent);
}

#[test]
fn per_batch_launches_read_the_trace_switch_at_each_launch() {
    traced_batches(LaunchMode::PerBatch);
}

fn traced_batches(mode: LaunchMode) {
    let size = 8u64 << 20;
    let mut a = node(options(0, mode, 2), size);
    let mut b = node(options(1, mode, 2), size);
    fill(&mut a, 1);
    fill(&mut b, 2);
    let device = a.device.backend().device_id() as i32;
    // Returns once each persistent kernel acknowledged the switch (it reads it when idle): no sleep before the first
    // batch, whose transfers must all be traced.
    a.engine.set_trace(true).expect("trace on");
    let ids = run_batches(&a, &b, 3, 8, 5 << 19, 3);
    let log = a.engine.take_trace();
    a.engine.set_trace(false).expect("trace off");

    assert!(log.device.iter().all(|e| (1..=5).contains(&e.stage())), "every entry has a stage the kernel writes");
    assert_eq!(log.device_dropped, 0);
    let alignment = align_clocks(&log).into_iter().find(|a| a.device == device).expect("an alignment for the device");
    let error = alignment.error_ns.expect("pairs on both sides");
    let (lower, upper) = alignment.bounds_ns.expect("bounds");
    assert!(lower <= upper + 1.0, "consistent bounds: {alignment:?}");
    // On the twin the counter is the twin's clock / 20 ns: the pair of clock readings gives the true offset, which
    // the bounds must contain.
    let host = aiv_transport::trace::now_ns() as f64;
    let twin = cann_twin::control::clock_ns() as f64;
    let truth = host - twin;
    eprintln!(
        "{} device events in {} groups, {} host events, {} engine runs; {alignment:?}; true offset {truth}",
        log.device.len(),
        groups(&log, device).len(),
        log.host.len(),
        log.engine.len()
    );
    assert!(lower - 1000.0 <= truth && truth <= upper + 1000.0, "true offset {truth} outside {alignment:?}");

    // Host events per batch: submit, completion seen, wait, woken.
    let host_of = |stage: HostStage| -> Vec<_> { log.host.iter().filter(|e| e.stage == stage).collect() };
    for stage in [HostStage::Submit, HostStage::CompletionSeen, HostStage::Wait, HostStage::Woken] {
        assert_eq!(host_of(stage).len(), 3, "{stage:?} once per batch: {:?}", log.host);
    }
    assert!(!host_of(HostStage::Drain).is_empty(), "drain passes recorded");
    let submits = host_of(HostStage::Submit);
    let wokens = host_of(HostStage::Woken);

    let groups = groups(&log, device);
    assert!(!groups.is_empty(), "device events recorded");
    let mut covered = BTreeSet::new();
    for ((block, first), events) in &groups {
        let stages: Vec<u32> = events.iter().map(|e| e.stage()).collect();
        assert_eq!(stages.first(), Some(&TRACE_STAGE_REQUEST_SEEN), "group {block}/{first}: {stages:?}");
        assert_eq!(stages.last(), Some(&TRACE_STAGE_DCQ_PUBLISHED), "group {block}/{first}: {stages:?}");
        let position = |stage| stages.iter().position(|&s| s == stage).expect("stage present");
        let posted = position(TRACE_STAGE_SQES_POSTED);
        let observed = position(TRACE_STAGE_COMPLETION_OBSERVED);
        let last_doorbell = stages.iter().rposition(|&s| s == TRACE_STAGE_DOORBELL).expect("a doorbell");
        assert!(posted < last_doorbell && last_doorbell < observed, "group {block}/{first}: {stages:?}");
        assert_eq!(stages.iter().filter(|&&s| s == TRACE_STAGE_SQES_POSTED).count(), 1);
        let cycles: Vec<u64> = events.iter().map(|e| e.cycles()).collect();
        assert!(cycles.windows(2).all(|w| w[0] <= w[1]), "group {block}/{first}: cycles in order {cycles:?}");
        let published = events.last().expect("events");
        let count = published.entry.count.get();
        covered.extend(*first..*first + u64::from(count));
        // Inside the Host window of its batch, within the alignment's error.
        let batch = ids.iter().position(|&(lo, hi)| (lo..=hi).contains(first)).expect("a batch of ours");
        let (start, end) = (submits[batch].start_ns as f64, wokens[batch].end_ns as f64);
        for event in events {
            let at = alignment.host_ns(event.cycles());
            assert!(
                at >= start - error - 1.0 && at <= end + error + 1.0,
                "group {block}/{first} stage {} at {at} outside [{start}, {end}] +- {error}",
                event.stage()
            );
        }
    }
    let all: BTreeSet<u64> = ids.iter().flat_map(|&(lo, hi)| lo..=hi).collect();
    assert_eq!(covered, all, "a DCQ-published event for each transfer id");
    let runs: Vec<_> = log.engine.iter().filter(|r| r.device == device).collect();
    assert!(runs.iter().any(|r| r.sqes > 0), "SDMA engine runs recorded");

    // The export: parses, one process per path, the block, engine and Host thread tracks named.
    let text = serde_json::to_string(&chrome_trace(&log, "aiv", &BTreeMap::new())).expect("serialises");
    let json: serde_json::Value = serde_json::from_str(&text).expect("parses");
    assert_eq!(json["displayTimeUnit"], "ns");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let names: BTreeSet<String> = events
        .iter()
        .filter(|e| e["ph"] == "M")
        .filter_map(|e| e["args"]["name"].as_str().map(str::to_owned))
        .collect();
    assert!(names.contains("aiv"), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("aiv block ") && n.ends_with(&format!("(device {device})"))));
    assert!(names.iter().any(|n| n.starts_with("sdma channel ")), "{names:?}");
    let me = std::thread::current().name().expect("test threads are named").to_owned();
    assert!(names.contains(&me), "the test thread's track: {names:?}");
    for event in events.iter().filter(|e| e["ph"] == "X" || e["ph"] == "i") {
        assert!(event["ts"].as_f64().is_some_and(|ts| ts >= 0.0), "{event}");
    }
    assert!(json["metadata"]["clock_alignment"].as_array().is_some_and(|a| !a.is_empty()));
    let engine_track = json["metadata"]["engine_track"].as_str().expect("the engine track's note");
    assert!(engine_track.starts_with("twin runtime: ") && !engine_track.contains("  "), "{engine_track}");
}

#[test]
fn an_overflowing_trace_ring_counts_its_drops_and_the_transfers_complete() {
    let size = 8u64 << 20;
    let mut a = node(options(0, LaunchMode::Persistent, 1), size);
    let mut b = node(options(1, LaunchMode::Persistent, 1), size);
    fill(&mut a, 4);
    fill(&mut b, 5);
    a.engine.set_trace_ring_depth(8);
    // set_trace returns once each persistent kernel acknowledged the switch.
    a.engine.set_trace(true).expect("trace on");
    // 32 transfers a batch with a doorbell per SQE: far more than 8 entries before the kernel publishes.
    run_batches(&a, &b, 2, 32, 64 << 10, 6);
    let log = a.engine.take_trace();
    eprintln!("depth 8: {} entries kept, {} dropped", log.device.len(), log.device_dropped);
    assert!(log.device_dropped > 0, "drops counted: {} entries, {} dropped", log.device.len(), log.device_dropped);
    assert!(!log.device.is_empty(), "what fitted was kept");
    assert!(log.device.iter().all(|e| (1..=5).contains(&e.stage())));
    // Tracing off again: later batches record nothing on the device and still complete.
    a.engine.set_trace(false).expect("trace off");
    let _ = a.engine.take_trace();
    run_batches(&a, &b, 1, 4, 64 << 10, 7);
    let after = a.engine.take_trace();
    assert!(after.device.is_empty() && after.host.is_empty(), "nothing recorded while off: {after:?}");
}

/// Tracing off costs the kernel nothing per SQE or per doorbell: every trace entry is written under a guard that is
/// a compile-time `Trace` (the posting path's copy, picked once per group) or the per-block `b.trace` test, and the
/// per-SQE function has no trace code of its own. Read from the source the twin and the NPU build.
#[test]
fn the_kernel_writes_trace_entries_only_under_a_guard_and_never_per_sqe() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(root.join("kernels/include/aiv/transfer_kernel.h")).expect("kernel source");
    let lines: Vec<&str> = source.lines().collect();
    let mut calls = 0;
    for (i, line) in lines.iter().enumerate() {
        if !line.contains("trace_record(") || line.contains("AIV_DEVICE_FN") {
            continue;
        }
        calls += 1;
        let guarded = lines[i.saturating_sub(5)..=i].iter().any(|l| {
            l.contains("if (Trace)")
                || l.contains("if (b.trace != nullptr)")
                || l.contains("if (b.trace == nullptr) return")
        });
        assert!(guarded, "line {}: a trace entry written without a guard: {line}", i + 1);
    }
    assert_eq!(calls, 7, "the five stages (the doorbell on both routes; DCQ published twice: one or two groups)");
    // The per-SQE function: from its signature to the next function, no trace code but the doorbell's copy.
    let start = source.find("AIV_DEVICE_FN void post_copy(").expect("post_copy");
    let body = &source[start..start + source[start..].find("\n}\n").expect("its end")];
    assert!(!body.contains("trace"), "post_copy has trace code: {body}");
    assert!(body.contains("ring<Trace>(b)"), "post_copy rings through the copy picked per group");
}
