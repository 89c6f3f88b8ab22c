//! Hardware tier: one test per assumption of docs/hardware.md and docs/HARDWARE_TESTING.md that the tests of
//! `tests/npu_hardware.rs` do not already answer (the table "Assumptions and the hardware tests" in
//! docs/HARDWARE_TESTING.md maps every mark to its test). None of these has run on an NPU: every assumption here is
//! unverified on hardware until a run of `bash tests/npu/run.sh` on one says otherwise.
//!
//! Each test observes on the device, then judges the observation with a pure function (`judge_*`), and prints one
//! line `CONFIRMED: <assumption>: <observed values>` or `REFUTED: <assumption>: <observed values>` (or
//! `INCONCLUSIVE: ...` when the observation cannot decide), so a hardware run answers the question even when the
//! test fails. On an Ascend machine, `#[ignore]`d and selected by `AIV_NPU_TESTS=1` like npu_hardware:
//! `AIV_NPU_TESTS=1 cargo test --release --features cann --test npu_assumptions -- --ignored --nocapture --test-threads=1`.
//! Tests whose names end in `two_npus` need two devices (`AIV_NPU_DEVICE_A`, `AIV_NPU_DEVICE_B`, default 0 and 1).
//!
//! Everywhere, in the suite: the same observations on the twin runtime, which models these assumptions (so each
//! must come out CONFIRMED there), and each judge fed an observation that breaks its assumption (so each can come
//! out REFUTED). That the twin confirms an assumption says only that the test's logic works: the twin was written
//! from the same assumptions.
#[path = "common/npu_rig.rs"]
mod npu_rig;
#[path = "common/peer_engine.rs"]
mod peer_engine;
#[path = "common/skip.rs"]
mod skip;
#[path = "common/verdict.rs"]
mod verdict;

use std::time::{Duration, Instant};

use aiv_transport::config::DeviceBackendKind;
use aiv_transport::device::cann::CannRuntime;
use aiv_transport::doctor::RuntimeReport;
use aiv_transport::kernel_abi::TRACE_STAGE_REQUEST_SEEN;
use aiv_transport::{Opcode, Protocol, TransferState};
use npu_rig::{pattern, Rig, PEER_SEED};
use verdict::{report, selected, Outcome};

/// The peer half of every two-process test here: a no-op unless started by a rig with `AIV_NPU_ROLE=peer`.
#[test]
#[ignore = "hardware: run by the two-process tests of npu_assumptions as their peer process"]
fn assumptions_peer_process() {
    if std::env::var("AIV_NPU_ROLE").as_deref() == Ok("peer") {
        npu_rig::serve_as_peer();
    } else {
        println!("nothing to do: the peer half of the two-process tests, run by them with AIV_NPU_ROLE=peer");
    }
}

// ---- the AIV system counter runs at 50 MHz ----------------------------------------------------------------------

const COUNTER_HZ: f64 = 50e6;

/// Device cycles between the kernel seeing two traced requests, and the Host window that bounds the same interval
/// (the later request's publication minus the earlier one's completion, to the later's completion minus the
/// earlier's publication).
#[derive(Debug)]
struct CounterObservation {
    cycles: u64,
    min_ns: f64,
    max_ns: f64,
}

fn judge_counter_rate(o: &CounterObservation) -> Outcome {
    if o.cycles == 0 || o.min_ns <= 0.0 || o.max_ns < o.min_ns {
        return Outcome::Inconclusive(format!("no usable interval: {o:?}"));
    }
    let (low, high) = (o.cycles as f64 * 1e9 / o.max_ns, o.cycles as f64 * 1e9 / o.min_ns);
    let seen = format!("{} cycles in {:.0} to {:.0} ns: {low:.0} to {high:.0} Hz", o.cycles, o.min_ns, o.max_ns);
    if high / low > 1.10 {
        Outcome::Inconclusive(format!("{seen} (window too wide to decide)"))
    } else if low <= COUNTER_HZ * 1.01 && high >= COUNTER_HZ * 0.99 {
        Outcome::Confirmed(format!("{seen}; 50 MHz is inside"))
    } else {
        Outcome::Refuted(format!("{seen}; 50 MHz is outside (AIV_NPU_COUNTER_HZ sets the rate the backend uses)"))
    }
}

/// Two traced aiv READs 500 ms apart; their request-seen stamps against the Host's publication and completion times.
fn observe_counter_rate(rig: &Rig) -> CounterObservation {
    rig.engine.set_trace(true).expect("trace on");
    let _ = rig.engine.take_trace();
    rig.run(&[rig.request(Opcode::Read, 0, 0, 4096, None)]).expect("first traced READ");
    std::thread::sleep(Duration::from_millis(500));
    rig.run(&[rig.request(Opcode::Read, 0, 0, 4096, None)]).expect("second traced READ");
    let log = rig.engine.take_trace();
    rig.engine.set_trace(false).expect("trace off");
    let mut seen: Vec<(u64, u64, u64)> = log
        .device
        .iter()
        .filter(|event| event.stage() == TRACE_STAGE_REQUEST_SEEN)
        .filter_map(|event| {
            let key = (event.device, event.transfer_id());
            Some((event.cycles(), *log.request_published_ns.get(&key)?, *log.completion_seen_ns.get(&key)?))
        })
        .collect();
    seen.sort_unstable();
    match (seen.first(), seen.last()) {
        (Some(&(c0, published0, done0)), Some(&(c1, published1, done1))) if c1 > c0 => CounterObservation {
            cycles: c1 - c0,
            min_ns: published1 as f64 - done0 as f64,
            max_ns: done1 as f64 - published0 as f64,
        },
        _ => CounterObservation { cycles: 0, min_ns: 0.0, max_ns: 0.0 },
    }
}

#[test]
#[ignore = "hardware: needs two Ascend NPUs, CANN and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn aiv_counter_rate_is_50_mhz_two_npus() {
    if !selected() {
        return;
    }
    let rig = Rig::start(DeviceBackendKind::Cann, "assumptions_peer_process");
    let outcome = judge_counter_rate(&observe_counter_rate(&rig));
    rig.finish();
    report("AIV system counter at 50 MHz", outcome);
}

// ---- the SQ ring: UB-staged SQEs, depth - 1 outstanding, in-order completion, wraps -----------------------------

/// READs of 64 bytes per batch, and batches: 12288 SQEs over 2 blocks wrap a 2048-deep SQ three times per channel.
const RING_BATCH: u64 = 128;
const RING_BATCHES: u64 = 96;
const RING_SQ_DEPTH: u64 = 2048;

#[derive(Debug)]
struct RingObservation {
    transfers: u64,
    per_channel_wraps: u64,
    first_failure: Option<String>,
}

fn judge_ring(o: &RingObservation) -> Outcome {
    let seen = format!("{} small READs, about {} SQ wraps per channel", o.transfers, o.per_channel_wraps);
    match &o.first_failure {
        Some(failure) => Outcome::Refuted(format!("{seen}; first failure: {failure}")),
        None if o.per_channel_wraps < 2 => Outcome::Inconclusive(format!("{seen}: too few to wrap the ring")),
        None => Outcome::Confirmed(format!("{seen}; every transfer completed and every byte matched at once")),
    }
}

/// Batches of small READs at fresh remote offsets into a zeroed local area, each batch's bytes checked as soon as
/// it completed: a stale SQE line, a ring that holds fewer entries, or a completion flag that passes an unfinished
/// copy shows as a failed task or a byte that differs.
fn observe_ring(rig: &Rig) -> RingObservation {
    let area = RING_BATCH * 64;
    let mut transfers = 0;
    let mut first_failure = None;
    for batch in 0..RING_BATCHES {
        rig.write_local(0, &vec![0u8; area as usize]);
        let remote = (batch * area) % (npu_rig::BUFFER - area);
        let requests: Vec<_> =
            (0..RING_BATCH).map(|i| rig.request(Opcode::Read, i * 64, remote + i * 64, 64, None)).collect();
        if let Err(failure) = rig.run(&requests) {
            first_failure = Some(format!("batch {batch}: {failure}"));
            break;
        }
        transfers += RING_BATCH;
        if rig.read_local(0, area) != pattern(PEER_SEED, remote, area) {
            first_failure = Some(format!("batch {batch}: completed, but the bytes differ from the peer's"));
            break;
        }
    }
    RingObservation { transfers, per_channel_wraps: transfers / 2 / RING_SQ_DEPTH, first_failure }
}

#[test]
#[ignore = "hardware: needs two Ascend NPUs, CANN and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn sq_ring_wraps_with_ub_staged_sqes_and_in_order_completion_two_npus() {
    if !selected() {
        return;
    }
    let rig = Rig::start(DeviceBackendKind::Cann, "assumptions_peer_process");
    let outcome = judge_ring(&observe_ring(&rig));
    rig.finish();
    report("UB-staged SQEs, depth-1 ring, in-order completion within one SQ", outcome);
}

// ---- ubshmem: a fixed cost of several microseconds per Host submission ------------------------------------------

#[derive(Debug)]
struct SubmissionObservation {
    /// (bytes, median microseconds of one READ batch of one request).
    medians: Vec<(u64, f64)>,
}

const FIXED_COST_US: f64 = 2.0;

fn judge_fixed_cost(o: &SubmissionObservation) -> Outcome {
    let (Some(&(small, t_small)), Some(&(large, t_large))) = (o.medians.first(), o.medians.last()) else {
        return Outcome::Inconclusive("no timings".into());
    };
    if large <= small {
        return Outcome::Inconclusive(format!("sizes {:?}", o.medians));
    }
    let per_byte = (t_large - t_small) / (large - small) as f64;
    let fixed = t_small - per_byte * small as f64;
    let seen = format!("medians {:?} µs; fixed cost {fixed:.2} µs per submission", o.medians);
    if fixed >= FIXED_COST_US {
        Outcome::Confirmed(seen)
    } else {
        Outcome::Refuted(format!("{seen}, under {FIXED_COST_US} µs"))
    }
}

fn observe_fixed_cost(rig: &Rig) -> SubmissionObservation {
    let medians = [4096u64, 65536, 1 << 20]
        .into_iter()
        .map(|size| {
            let mut times: Vec<f64> = (0..25)
                .map(|_| {
                    let started = Instant::now();
                    rig.run(&[rig.request(Opcode::Read, 0, 0, size, Some(Protocol::Ubshmem))]).expect("ubshmem READ");
                    started.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            times.sort_by(f64::total_cmp);
            (size, times[times.len() / 2])
        })
        .collect();
    SubmissionObservation { medians }
}

#[test]
#[ignore = "hardware: needs two Ascend NPUs, CANN and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn ubshmem_has_a_fixed_cost_per_host_submission_two_npus() {
    if !selected() {
        return;
    }
    let rig = Rig::start(DeviceBackendKind::Cann, "assumptions_peer_process");
    let outcome = judge_fixed_cost(&observe_fixed_cost(&rig));
    rig.finish();
    report("ubshmem: several µs of fixed cost per Host submission", outcome);
}

// ---- peer loss: a re-import of the vanished peer's heap handle fails --------------------------------------------

#[derive(Debug)]
struct PeerLossObservation {
    found_after: Option<Duration>,
    reason: String,
}

fn judge_peer_loss(o: &PeerLossObservation) -> Outcome {
    match o.found_after {
        None => Outcome::Refuted(format!("transfers to the killed peer still completed after 10 s ({})", o.reason)),
        Some(after) if o.reason.contains("no longer grants its heap") => {
            Outcome::Confirmed(format!("found after {after:?} by the probe: {}", o.reason))
        }
        Some(after) => Outcome::Refuted(format!("the transfer failed after {after:?}, not by the probe: {}", o.reason)),
    }
}

/// Kills the peer and sends 4 KiB aiv READs to it until one fails (at most 10 s).
fn observe_peer_loss(rig: &mut Rig) -> PeerLossObservation {
    rig.kill_peer();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if let Err(reason) = rig.run(&[rig.request(Opcode::Read, 0, 0, 4096, None)]) {
            return PeerLossObservation { found_after: Some(started.elapsed()), reason };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    PeerLossObservation { found_after: None, reason: "every transfer completed".into() }
}

#[test]
#[ignore = "hardware: needs two Ascend NPUs, CANN and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn peer_loss_is_found_by_reimporting_the_heap_two_npus() {
    if !selected() {
        return;
    }
    let mut rig = Rig::start(DeviceBackendKind::Cann, "assumptions_peer_process");
    let outcome = judge_peer_loss(&observe_peer_loss(&mut rig));
    drop(rig);
    report("peer loss found by a failing re-import of the peer's heap handle", outcome);
}

// ---- aiv doctor's runtime lines ---------------------------------------------------------------------------------

/// The packages whose versions the vendor's `aclsysGetCANNVersion` must answer; the twin answers the first two.
const VENDOR_PACKAGES: [&str; 4] = ["CANN", "runtime", "toolkit", "driver"];
const TWIN_PACKAGES: [&str; 2] = ["CANN", "runtime"];

fn judge_runtime_lines(report: &RuntimeReport, expected: CannRuntime, packages: &[&str]) -> Outcome {
    let mut wrong = Vec::new();
    if report.identity != Ok(expected) {
        wrong.push(format!("identified as {:?}, expected {expected:?}", report.identity));
    }
    if let Err(e) = &report.acl_interface {
        wrong.push(format!("aclrtGetVersion: {e}"));
    }
    for package in packages {
        match report.packages.iter().find(|(name, _)| name == package) {
            Some((_, Ok(_))) => {}
            Some((_, Err(e))) => wrong.push(format!("version of {package}: {e}")),
            None => wrong.push(format!("version of {package}: not asked")),
        }
    }
    match &report.devices {
        Ok(n) if *n >= 1 => {}
        other => wrong.push(format!("device count: {other:?}")),
    }
    match &report.shmem_version {
        Some(Ok(_)) => {}
        other => wrong.push(format!("SHMEM version: {other:?}")),
    }
    let seen = format!(
        "from {}: ACL {:?}, packages {:?}, devices {:?}, SHMEM {:?}",
        report.loaded_from, report.acl_interface, report.packages, report.devices, report.shmem_version
    );
    if wrong.is_empty() {
        Outcome::Confirmed(seen)
    } else {
        Outcome::Refuted(format!("{}; {seen}", wrong.join("; ")))
    }
}

#[test]
#[ignore = "hardware: needs an Ascend NPU, CANN and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn doctor_runtime_lines_answer_on_the_vendor_runtime() {
    if !selected() {
        return;
    }
    let diagnosis = aiv_transport::doctor::diagnose();
    let outcome = match &diagnosis.runtime {
        Some(runtime) => judge_runtime_lines(runtime, CannRuntime::Vendor, &VENDOR_PACKAGES),
        None => Outcome::Refuted(format!("no runtime loaded:\n{}", diagnosis.render())),
    };
    report("aiv doctor's runtime lines (versions, device count, SHMEM) from the vendor's runtime", outcome);
}

// ---- the new bisheng driver comes with CANN >= 8 ---------------------------------------------------------------

/// The first date `YYYY-MM-DD` or `YYYYMMDD` (from 2000 on) in `text`, as `YYYYMMDD`.
fn first_date(text: &str) -> Option<u32> {
    let digits: Vec<char> = text.chars().collect();
    (0..digits.len()).find_map(|at| {
        let take = |n: usize| digits.get(at..at + n).map(|s| s.iter().collect::<String>());
        let dashed =
            take(10).filter(|s| s.as_bytes()[4] == b'-' && s.as_bytes()[7] == b'-').map(|s| s.replace('-', ""));
        let plain = take(8);
        [dashed, plain].into_iter().flatten().find_map(|s| {
            let value: u32 = s.parse().ok().filter(|_| s.len() == 8 && s.starts_with("20"))?;
            (value % 10000 / 100 >= 1 && value % 10000 / 100 <= 12).then_some(value)
        })
    })
}

/// SHMEM picks the new `-xasc` driver for a `bisheng` built on 2026-03-27 or later (docs/hardware.md section 3).
const NEW_DRIVER_FROM: u32 = 20260327;

fn judge_new_driver(bisheng_v: &str, cann_major: Option<u32>) -> Outcome {
    let date = first_date(bisheng_v);
    let seen = format!("bisheng -v build date {date:?}, CANN major {cann_major:?}");
    match (date, cann_major) {
        (Some(date), Some(major)) if major >= 8 => {
            if date >= NEW_DRIVER_FROM {
                Outcome::Confirmed(format!("{seen}: CANN >= 8 with the new driver"))
            } else {
                Outcome::Refuted(format!("{seen}: CANN >= 8 with the old (-xcce) driver"))
            }
        }
        (Some(_), Some(_)) => Outcome::Inconclusive(format!("{seen}: CANN before 8 says nothing about CANN >= 8")),
        _ => Outcome::Inconclusive(format!("{seen}: not both found in: {bisheng_v:?}")),
    }
}

#[test]
#[ignore = "hardware: needs the CANN toolkit of an Ascend machine and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn new_bisheng_driver_comes_with_cann_8() {
    if !selected() {
        return;
    }
    let home = std::env::var("ASCEND_HOME_PATH").unwrap_or_default();
    let bisheng = ["compiler/ccec_compiler/bin/bisheng", "tools/ccec_compiler/bin/bisheng"]
        .iter()
        .map(|tail| std::path::Path::new(&home).join(tail))
        .find(|path| path.exists())
        .unwrap_or_else(|| "bisheng".into());
    let text = match std::process::Command::new(&bisheng).arg("-v").output() {
        Ok(out) => format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        Err(e) => format!("{}: {e}", bisheng.display()),
    };
    let cann = aiv_transport::doctor::diagnose().runtime.and_then(|runtime| {
        let version = runtime.packages.iter().find(|(name, _)| name.eq_ignore_ascii_case("CANN"))?.1.clone().ok()?;
        version.split('.').next()?.trim().parse::<u32>().ok()
    });
    report("the new bisheng driver (-xasc) comes with CANN >= 8", judge_new_driver(&text, cann));
}

// ---- a device fault surfaces as a task exception of the stream; reset_channel after it ------------------------

/// Candidate codes of a kernel's or an SDMA engine's fault found by stream synchronisation (docs/hardware.md
/// section 4: `ACL_ERROR_RT_AICORE_EXCEPTION` 507015, `ACL_ERROR_RT_VECTOR_CORE_EXCEPTION` 507035).
const FAULT_CODES: [u32; 2] = [507015, 507035];

/// How far past the end of the local buffer the faulting WRITE's destination lies: no allocation, mapping or
/// registration of this process reaches that far (the twin runtime's whole device space is 256 GiB).
const FAULT_DISTANCE: u64 = 1 << 40;

#[derive(Debug)]
struct FaultObservation {
    /// The faulting request's state and reason once it ended.
    ended: (TransferState, String),
    /// Channel resets the transport's recovery made meanwhile.
    resets: u64,
    /// What `reset_channel` returned: `Ok` when the transport's recovery reset the channel, else the test's own call.
    reset: Result<(), String>,
    /// A valid WRITE on the same block afterwards: its state and reason.
    after: (TransferState, String),
}

/// The first code of six digits starting with 50 in `text` (an ACL runtime error code).
fn acl_code(text: &str) -> Option<u32> {
    text.split(|c: char| !c.is_ascii_digit())
        .find(|word| word.len() == 6 && word.starts_with("50"))
        .and_then(|word| word.parse().ok())
}

fn judge_fault_exception(o: &FaultObservation) -> Outcome {
    let (state, reason) = &o.ended;
    let seen = format!("the WRITE to an unmapped device address ended {state:?}: {reason}");
    match state {
        TransferState::Completed => Outcome::Refuted(format!("{seen} (no fault surfaced)")),
        TransferState::Failed if reason.contains("SDMA exception") => {
            match (reason.contains("stream error"), acl_code(reason)) {
                (true, Some(code)) if FAULT_CODES.contains(&code) => {
                    Outcome::Confirmed(format!("{seen}; stream code {code} is a candidate"))
                }
                (true, Some(code)) => {
                    Outcome::Refuted(format!("{seen}; stream code {code} is not among the candidates {FAULT_CODES:?}"))
                }
                (true, None) => Outcome::Inconclusive(format!("{seen}; the stream error names no code")),
                (false, _) => Outcome::Confirmed(format!("{seen}; found in the runtime's channel record")),
            }
        }
        _ => Outcome::Refuted(format!("{seen} (no exception was found on the stream)")),
    }
}

/// `reset_channel` is expected to succeed on the twin runtime (and the block to serve again) and to fail on the
/// vendor's runtime, where no call for it is known.
fn judge_fault_reset(o: &FaultObservation, reset_expected: bool) -> Outcome {
    let seen = format!(
        "{} channel reset(s) by the recovery; reset_channel: {:?}; a valid WRITE on the block afterwards: {:?}",
        o.resets, o.reset, o.after
    );
    if o.ended.0 == TransferState::Completed {
        return Outcome::Inconclusive(format!("{seen}: no fault, nothing to recover"));
    }
    match (&o.reset, reset_expected) {
        (Ok(()), true) if o.after.0 == TransferState::Completed => Outcome::Confirmed(seen),
        (Ok(()), true) => Outcome::Refuted(format!("{seen}: reset, yet the block does not serve")),
        (Err(_), true) => Outcome::Refuted(format!("{seen}: the reset failed")),
        (Err(_), false) => Outcome::Confirmed(format!("{seen}: no recovery on the vendor's runtime")),
        (Ok(()), false) => Outcome::Refuted(format!("{seen}: a reset succeeded on the vendor's runtime")),
    }
}

/// Polls `slot` until it ends (its watchdog deadline bounds it): its state and reason.
fn ended(slot: &aiv_transport::transfer::TaskSlot) -> (TransferState, String) {
    let started = Instant::now();
    while !slot.state().is_terminal() && started.elapsed() < FAULT_WAIT + Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    (slot.state(), slot.reason().unwrap_or_default())
}

const FAULT_WAIT: Duration = Duration::from_secs(20);

/// On block 0 of a one-PE engine: a 4 KiB WRITE from the local buffer to an address [`FAULT_DISTANCE`] past it,
/// posted past every check of the engine; then what the recovery did and a valid WRITE on the same block.
fn observe_fault(backend: DeviceBackendKind) -> FaultObservation {
    let _one = npu_rig::one_pe();
    let engine = peer_engine::engine(backend, npu_rig::device_env("AIV_NPU_DEVICE_A", 0));
    let device = engine.device().expect("device");
    let buffer = device.allocate(1 << 20).expect("HBM");
    let transport = device.transport();
    let before = transport.counters().channel_resets;
    let unmapped = (buffer.addr() + buffer.len() + FAULT_DISTANCE) & !0xffff;
    let post = |dst: u64| {
        transport
            .post_unchecked_write_for_fault_tests(0, buffer.addr(), dst, 4096, FAULT_WAIT)
            .map(|slot| ended(&slot))
            .unwrap_or_else(|error| (TransferState::Failed, format!("not posted: {error}")))
    };
    let ended = post(unmapped);
    // The recovery runs in the drain pass that finished the request, before it did.
    let resets = transport.counters().channel_resets - before;
    let reset = if resets > 0 { Ok(()) } else { device.backend().reset_channel(0).map_err(|e| e.to_string()) };
    let after = post(buffer.addr() + (512 << 10));
    drop((buffer, device, engine));
    FaultObservation { ended, resets, reset, after }
}

/// One run answers both rows: the fault's exception and code, and what `reset_channel` returns after it.
#[test]
#[ignore = "hardware: needs an Ascend NPU, CANN and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn a_device_fault_surfaces_as_a_stream_exception_and_reset_channel_answers() {
    if !selected() {
        return;
    }
    let observation = observe_fault(DeviceBackendKind::Cann);
    let outcomes = [
        (
            "a device fault surfaces as a task exception of the stream (507015 / 507035)",
            judge_fault_exception(&observation),
        ),
        ("reset_channel after a device fault fails on the vendor's runtime", judge_fault_reset(&observation, false)),
    ];
    let lines: Vec<String> = outcomes.iter().map(|(assumption, outcome)| verdict::line(assumption, outcome)).collect();
    println!("{}", lines.join("\n"));
    assert!(outcomes.iter().all(|(_, outcome)| matches!(outcome, Outcome::Confirmed(_))), "{}", lines.join("\n"));
}

// ---- the same observations on the twin runtime, in the suite ----------------------------------------------------

/// The rig's assumptions on the twin runtime, in one rig (peer loss last: it kills the peer): each must come out
/// CONFIRMED, as the twin models them.
#[test]
fn the_rig_assumptions_are_confirmed_on_the_twin_runtime() {
    let mut rig = Rig::start(DeviceBackendKind::Twin, "assumptions_peer_process");
    report("AIV system counter at 50 MHz (twin runtime)", judge_counter_rate(&observe_counter_rate(&rig)));
    report("UB-staged SQEs, depth-1 ring, in-order completion (twin runtime)", judge_ring(&observe_ring(&rig)));
    report("ubshmem fixed cost per Host submission (twin runtime)", judge_fixed_cost(&observe_fixed_cost(&rig)));
    report("peer loss found by the re-import probe (twin runtime)", judge_peer_loss(&observe_peer_loss(&mut rig)));
}

/// The fault test on the twin runtime: its SDMA engine refuses the copy to an unmapped destination with a
/// destination fault, and its control API resets the channel.
#[test]
fn a_device_fault_and_its_reset_are_confirmed_on_the_twin_runtime() {
    let observation = observe_fault(DeviceBackendKind::Twin);
    assert!(observation.ended.1.contains("destination range is outside every mapped window"), "{observation:?}");
    report("a device fault surfaces as an exception (twin runtime)", judge_fault_exception(&observation));
    report("reset_channel after a device fault (twin runtime)", judge_fault_reset(&observation, true));
}

#[test]
fn doctor_runtime_lines_are_confirmed_on_the_twin_runtime() {
    let diagnosis = aiv_transport::doctor::diagnose();
    report(
        "aiv doctor's runtime lines (twin runtime)",
        judge_runtime_lines(&diagnosis.twin_runtime, CannRuntime::Twin, &TWIN_PACKAGES),
    );
}

/// Every judge comes out REFUTED on an observation that breaks its assumption, and CONFIRMED on one that keeps it.
#[test]
fn each_judge_can_come_out_refuted() {
    let refuted = |outcome: Outcome| assert!(matches!(outcome, Outcome::Refuted(_)), "{outcome:?}");
    let confirmed = |outcome: Outcome| assert!(matches!(outcome, Outcome::Confirmed(_)), "{outcome:?}");
    // A 25 MHz counter: 7.5 M cycles in 300 ms.
    refuted(judge_counter_rate(&CounterObservation { cycles: 7_500_000, min_ns: 299.9e6, max_ns: 300.1e6 }));
    confirmed(judge_counter_rate(&CounterObservation { cycles: 15_000_000, min_ns: 299.9e6, max_ns: 300.1e6 }));
    assert!(matches!(
        judge_counter_rate(&CounterObservation { cycles: 15_000_000, min_ns: 200e6, max_ns: 400e6 }),
        Outcome::Inconclusive(_)
    ));
    refuted(judge_ring(&RingObservation {
        transfers: 4096,
        per_channel_wraps: 1,
        first_failure: Some("batch 32: completed, but the bytes differ".into()),
    }));
    confirmed(judge_ring(&RingObservation { transfers: 12288, per_channel_wraps: 3, first_failure: None }));
    refuted(judge_fixed_cost(&SubmissionObservation { medians: vec![(4096, 1.1), (65536, 1.5), (1 << 20, 8.0)] }));
    confirmed(judge_fixed_cost(&SubmissionObservation { medians: vec![(4096, 9.0), (65536, 9.5), (1 << 20, 17.0)] }));
    refuted(judge_peer_loss(&PeerLossObservation { found_after: None, reason: "every transfer completed".into() }));
    refuted(judge_peer_loss(&PeerLossObservation {
        found_after: Some(Duration::from_millis(3)),
        reason: "SDMA exception on channel 0".into(),
    }));
    let mut twin = aiv_transport::doctor::diagnose().twin_runtime;
    refuted(judge_runtime_lines(&twin, CannRuntime::Vendor, &TWIN_PACKAGES));
    refuted(judge_runtime_lines(&twin, CannRuntime::Twin, &VENDOR_PACKAGES));
    twin.devices = Err("aclrtGetDeviceCount: 507033".into());
    refuted(judge_runtime_lines(&twin, CannRuntime::Twin, &TWIN_PACKAGES));
    refuted(judge_new_driver("bisheng version 1.0 (built 2025-11-02)", Some(8)));
    confirmed(judge_new_driver("bisheng version 1.0 (built 2026-04-01)", Some(8)));
    assert_eq!(first_date("x 20260327 y"), Some(20260327));
    let fault = |state, reason: &str, reset: Result<(), String>, after| FaultObservation {
        ended: (state, reason.into()),
        resets: 0,
        reset,
        after: (after, String::new()),
    };
    let stream = "SDMA exception on channel 0 (sq_id 0, head 0, tail 2): syndrome 0x2 (stream); stream error: ";
    refuted(judge_fault_exception(&fault(TransferState::Completed, "", Ok(()), TransferState::Completed)));
    refuted(judge_fault_exception(&fault(
        TransferState::Timeout,
        "block 0: wait budget (no SDMA exception recorded on the channel)",
        Err("not implemented".into()),
        TransferState::Timeout,
    )));
    refuted(judge_fault_exception(&fault(
        TransferState::Failed,
        &format!("{stream}aclrtSynchronizeStreamWithTimeout: 507899"),
        Err("x".into()),
        TransferState::Timeout,
    )));
    confirmed(judge_fault_exception(&fault(
        TransferState::Failed,
        &format!("{stream}aclrtSynchronizeStreamWithTimeout failed: ACL error 507015"),
        Err("x".into()),
        TransferState::Timeout,
    )));
    let failed = |reset, after| fault(TransferState::Failed, "SDMA exception", reset, after);
    refuted(judge_fault_reset(&failed(Ok(()), TransferState::Completed), false));
    refuted(judge_fault_reset(&failed(Err("no call".into()), TransferState::Timeout), true));
    refuted(judge_fault_reset(&failed(Ok(()), TransferState::Timeout), true));
    confirmed(judge_fault_reset(&failed(Err("not implemented".into()), TransferState::Timeout), false));
    confirmed(judge_fault_reset(&failed(Ok(()), TransferState::Completed), true));
}
