//! Hardware tier: whether a GM line, once in the AIV core's scalar data cache, stays there until invalidated
//! (docs/hardware.md section 9, "stays until invalidated"), in the style of `tests/npu_assumptions.rs`: observe on the
//! device, judge with a pure `judge_*` function, print `CONFIRMED:`, `REFUTED:` or `INCONCLUSIVE:` with the observed
//! values. Not yet run on an NPU: unverified on hardware until a run of `bash tests/npu/run.sh` on one says
//! otherwise. `#[ignore]`d, selected by `AIV_NPU_TESTS=1`: `AIV_NPU_TESTS=1 cargo test --release --features cann
//! --test npu_cache_assumptions -- --ignored --nocapture --test-threads=1` (device `AIV_NPU_DEVICE_A`, default 0).
//!
//! The observation runs the test-only kernel entry `aiv_cache_probe_kernel` of the kernel object
//! (`kernels/include/aiv/cache_probe.h`, reached from `kernels/npu/entry.cpp`) through the cann backend's
//! `launch_function`, and plays the Host's half here: the probe word and the scratch lines in device memory, the
//! parameters and flags in Host memory registered for the device (as the transport's control blocks), the rewrite of
//! the probe word with the backend's synchronous copy (`aclrtMemcpy` H2D, a DMA that does not go through the AIV
//! core's data cache). Nothing of the engine's transfer API or of the network reaches it.
//!
//! Everywhere, in the suite: the same observation on the twin runtime, whose CPU model keeps every line until
//! invalidated (docs/ascendc-cpu.md), so it comes out CONFIRMED at every K; that says only that the probe and its
//! Host half work, the model was written from the same assumption. `each_judge_can_come_out_refuted` feeds the judge
//! an eviction.
#[path = "common/skip.rs"]
mod skip;
#[path = "common/verdict.rs"]
mod verdict;

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aiv_transport::config::{AivOptions, DeviceBackendKind, LaunchMode};
use aiv_transport::device::cann::CannDevice;
use aiv_transport::device::SharedMemory;
use aiv_transport::engine::AivDevice;
use verdict::{device_id, report, selected, Outcome};

const ASSUMPTION: &str = "a cached GM line stays in the AIV data cache until invalidated";

// ---- the probe's Host half ------------------------------------------------------------------------------------

/// `AivCacheProbeParams` of `kernels/include/aiv/cache_probe.h`: its offsets, which a `static_assert` there fixes.
mod params {
    pub const PROBE: usize = 0;
    pub const SCRATCH: usize = 8;
    pub const WAIT_BUDGET: usize = 16;
    pub const SCRATCH_LINES: usize = 24;
    pub const CACHED: usize = 64;
    pub const REWRITTEN: usize = 128;
    pub const DONE: usize = 192;
    pub const STATUS: usize = 196;
    pub const FIRST: usize = 200;
    pub const ROUNDS: usize = 204;
    pub const WAIT_CYCLES: usize = 208;
    pub const SEEN: usize = 256;
    pub const BYTES: usize = 384;
    /// `AIV_CACHE_PROBE_ROUNDS`, `AIV_CACHE_PROBE_MAX_LINES`.
    pub const ROUNDS_MAX: usize = 18;
    pub const MAX_LINES: u32 = 65536;
    /// `AIV_CACHE_PROBE_*` statuses.
    pub const FINISHED: u32 = 1;
    pub const NO_REWRITE: u32 = 2;
    pub const BAD_PARAMS: u32 = 3;
}

/// `AIV_CACHE_LINE`: 64 bytes (`CACHE_LINE_SIZE` for dav-2201, `mirror-cann/asc-devkit`
/// `impl/basic_api/utils/kernel_utils_constants.h`).
const LINE: u64 = 64;
/// The probe word before the launch and after the Host's rewrite.
const OLD: u32 = 0x4f4c_4421;
const NEW: u32 = 0x4e45_5721;

/// K of round `round`: 0, then 1, 2, 4, ...
fn k_of(round: usize) -> u32 {
    if round == 0 {
        0
    } else {
        1 << (round - 1)
    }
}

/// One run of the probe: the kernel's status and what it read.
#[derive(Debug, PartialEq)]
struct CacheObservation {
    /// The value the Host wrote before the launch and the one its DMA wrote while the kernel waited.
    old: u32,
    new: u32,
    /// `Ok(status)` once the kernel set `done`; `Err` with what went wrong on the Host side.
    finished: Result<u32, String>,
    /// The probe word at the caching load.
    first: u32,
    /// (K, the probe word read without invalidation after K loads of other lines), K ascending.
    seen: Vec<(u32, u32)>,
    /// Device cycles the kernel waited for the rewrite.
    wait_cycles: u64,
}

fn judge_cached_line(o: &CacheObservation) -> Outcome {
    let shown: Vec<String> = o.seen.iter().map(|(k, value)| format!("K={k}: {value:#x}")).collect();
    let seen = format!(
        "old {:#x}, new {:#x}, first load {:#x}, waited {} cycles; {}",
        o.old,
        o.new,
        o.first,
        o.wait_cycles,
        shown.join(", ")
    );
    match &o.finished {
        Err(error) => return Outcome::Inconclusive(format!("the probe did not finish: {error}")),
        Ok(params::NO_REWRITE) => {
            return Outcome::Inconclusive(format!("{seen}: the kernel saw no rewrite flag within its budget"))
        }
        Ok(params::FINISHED) => {}
        Ok(status) => return Outcome::Inconclusive(format!("{seen}: the kernel ended with status {status}")),
    }
    if o.first != o.old {
        return Outcome::Inconclusive(format!("{seen}: the caching load did not read the old value"));
    }
    let Some(&(_, at_zero)) = o.seen.first() else {
        return Outcome::Inconclusive(format!("{seen}: no round ran"));
    };
    if at_zero != o.old {
        return Outcome::Inconclusive(format!(
            "{seen}: already at K=0 the re-read did not return the old value: the line was not cached, or the DMA \
             updated the core's cache"
        ));
    }
    if let Some(&(k, value)) = o.seen.iter().find(|(_, value)| *value != o.old && *value != o.new) {
        return Outcome::Inconclusive(format!("{seen}: K={k} read {value:#x}, neither the old nor the new value"));
    }
    match o.seen.iter().find(|(_, value)| *value == o.new) {
        Some(&(k, _)) => Outcome::Refuted(format!(
            "{seen}: the new value from K={k} on: the line was evicted after {k} loads of other lines. The kernel's \
             discipline (invalidate before every read of GM others write) still holds; the CPU model, which never \
             evicts, is stricter than the NPU here"
        )),
        None => {
            let largest = o.seen.last().map_or(0, |&(k, _)| k);
            Outcome::Confirmed(format!(
                "{seen}: the old value at every K up to {largest} lines ({} KiB of other lines)",
                u64::from(largest) * LINE / 1024
            ))
        }
    }
}

fn options(backend: DeviceBackendKind) -> AivOptions {
    AivOptions {
        device_backend: backend,
        device_id: device_id(),
        // One block, launched per batch: no resident transfer kernel holds the kernel stream.
        aiv_blocks: 1,
        launch_mode: LaunchMode::PerBatch,
        hbm_size: 64 << 20,
        ..AivOptions::default()
    }
}

fn word_at(shared: &SharedMemory, offset: usize) -> &AtomicU32 {
    assert!(offset + 4 <= shared.len() && offset % 4 == 0);
    // SAFETY: in bounds and 4-byte aligned (the mapping is page aligned); the kernel accesses these words through
    // the device's view only, and the Host through atomics only.
    unsafe { &*shared.host_ptr().add(offset).cast::<AtomicU32>() }
}

fn read_u64(shared: &SharedMemory, offset: usize) -> u64 {
    u64::from(word_at(shared, offset).load(Ordering::Acquire))
        | u64::from(word_at(shared, offset + 4).load(Ordering::Acquire)) << 32
}

fn write_u64(shared: &SharedMemory, offset: usize, value: u64) {
    word_at(shared, offset).store(value as u32, Ordering::Relaxed);
    word_at(shared, offset + 4).store((value >> 32) as u32, Ordering::Relaxed);
}

/// Runs `aiv_cache_probe_kernel` once on `device` with `scratch_lines` other lines (a power of two, 1 to 65536) and
/// plays the Host's half; `timeout` bounds every wait (the kernel's own wait for the rewrite included).
fn observe_cached_line(device: &AivDevice, scratch_lines: u32, timeout: Duration) -> CacheObservation {
    let mut observation = CacheObservation {
        old: OLD,
        new: NEW,
        finished: Err(String::new()),
        first: 0,
        seen: Vec::new(),
        wait_cycles: 0,
    };
    if !scratch_lines.is_power_of_two() || scratch_lines > params::MAX_LINES {
        observation.finished =
            Err(format!("scratch_lines {scratch_lines} is not a power of two from 1 to {}", params::MAX_LINES));
        return observation;
    }
    observation.finished = run_probe(device, scratch_lines, timeout, &mut observation);
    observation
}

fn run_probe(
    device: &AivDevice,
    scratch_lines: u32,
    timeout: Duration,
    observation: &mut CacheObservation,
) -> Result<u32, String> {
    let backend = device.backend();
    let cann = CannDevice::of(backend.as_ref()).ok_or("the device is not a cann device of this process")?;
    // The probe word's line, then the scratch lines, all 64-byte aligned.
    let bytes = (u64::from(scratch_lines) + 2) * LINE;
    let buffer = device.allocate(bytes).map_err(|error| format!("allocate {bytes} bytes of HBM: {error}"))?;
    let probe = buffer.addr().next_multiple_of(LINE);
    let scratch = probe + LINE;
    device.write(probe, &OLD.to_le_bytes()).map_err(|error| format!("write the old value: {error}"))?;
    let shared = backend.allocate_shared(params::BYTES).map_err(|error| format!("allocate the parameters: {error}"))?;
    let budget_cycles =
        u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX).saturating_mul(backend.cycles_per_second()) / 1_000_000;
    write_u64(&shared, params::PROBE, probe);
    write_u64(&shared, params::SCRATCH, scratch);
    write_u64(&shared, params::WAIT_BUDGET, budget_cycles);
    word_at(&shared, params::SCRATCH_LINES).store(scratch_lines, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    let launch = backend
        .launch_function("aiv_cache_probe_kernel", shared.device_addr(), 1)
        .map_err(|error| format!("launch aiv_cache_probe_kernel: {error}"))?;
    let deadline = Instant::now() + timeout;
    // The kernel has cached the probe word's line: rewrite the word by DMA, then raise the flag.
    let mut cached = false;
    while Instant::now() < deadline {
        if word_at(&shared, params::CACHED).load(Ordering::Acquire) != 0 {
            cached = true;
            break;
        }
        if word_at(&shared, params::DONE).load(Ordering::Acquire) != 0 {
            break; // refused its parameters
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    if cached {
        device.write(probe, &NEW.to_le_bytes()).map_err(|error| format!("rewrite the probe word: {error}"))?;
        word_at(&shared, params::REWRITTEN).store(1, Ordering::Release);
    }
    // The kernel's rounds after the rewrite (4 MiB of scalar loads at most) and its own wait are bounded.
    if !launch.wait(timeout + Duration::from_secs(60)) {
        return Err("the probe kernel did not return".into());
    }
    if let Some(error) = cann.stream_error() {
        return Err(format!("the kernel's stream reported {error}"));
    }
    if word_at(&shared, params::DONE).load(Ordering::Acquire) == 0 {
        return Err(format!("the kernel returned without setting done (cached flag seen: {cached})"));
    }
    let status = word_at(&shared, params::STATUS).load(Ordering::Acquire);
    observation.first = word_at(&shared, params::FIRST).load(Ordering::Acquire);
    observation.wait_cycles = read_u64(&shared, params::WAIT_CYCLES);
    let rounds = (word_at(&shared, params::ROUNDS).load(Ordering::Acquire) as usize).min(params::ROUNDS_MAX);
    observation.seen = (0..rounds)
        .map(|round| (k_of(round), word_at(&shared, params::SEEN + 4 * round).load(Ordering::Acquire)))
        .collect();
    Ok(status)
}

#[test]
#[ignore = "hardware: needs an Ascend NPU, CANN and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn a_cached_line_stays_until_invalidated() {
    if !selected() {
        return;
    }
    let device = AivDevice::open(&options(DeviceBackendKind::Cann)).expect("open the NPU device");
    let observation = observe_cached_line(&device, params::MAX_LINES, Duration::from_secs(30));
    report(ASSUMPTION, judge_cached_line(&observation));
}

// ---- the same observation on the twin runtime, in the suite ---------------------------------------------------

/// One twin device 0 of this process at a time (SHMEM initialises once per device and process).
static TWIN: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_cached_line_stays_until_invalidated_on_the_twin_runtime() {
    let _one = TWIN.lock().unwrap_or_else(|p| p.into_inner());
    let device = AivDevice::open(&options(DeviceBackendKind::Twin)).expect("open a twin device");
    let observation = observe_cached_line(&device, params::MAX_LINES, Duration::from_secs(30));
    assert_eq!(observation.seen.len(), params::ROUNDS_MAX, "{observation:?}");
    assert_eq!(observation.seen.last().map(|&(k, _)| k), Some(params::MAX_LINES), "{observation:?}");
    report(&format!("{ASSUMPTION} (twin runtime)"), judge_cached_line(&observation));
}

/// The kernel refuses parameters it cannot use (a scratch length that is no power of two) with its status, reading
/// nothing, and the Host half refuses them before a launch.
#[test]
fn the_probe_refuses_bad_parameters() {
    let _one = TWIN.lock().unwrap_or_else(|p| p.into_inner());
    let device = AivDevice::open(&options(DeviceBackendKind::Twin)).expect("open a twin device");
    let refused = observe_cached_line(&device, 3, Duration::from_secs(5));
    assert!(matches!(&refused.finished, Err(error) if error.contains("not a power of two")), "{refused:?}");
    let backend = device.backend();
    let shared = backend.allocate_shared(params::BYTES).expect("parameters");
    let buffer = device.allocate(4 * LINE).expect("hbm");
    let probe = buffer.addr().next_multiple_of(LINE);
    write_u64(&shared, params::PROBE, probe);
    write_u64(&shared, params::SCRATCH, probe + LINE);
    write_u64(&shared, params::WAIT_BUDGET, 1);
    word_at(&shared, params::SCRATCH_LINES).store(3, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    let launch = backend.launch_function("aiv_cache_probe_kernel", shared.device_addr(), 1).expect("launch");
    assert!(launch.wait(Duration::from_secs(30)), "the probe kernel did not return");
    assert_eq!(word_at(&shared, params::DONE).load(Ordering::Acquire), 1);
    assert_eq!(word_at(&shared, params::STATUS).load(Ordering::Acquire), params::BAD_PARAMS);
    assert_eq!(word_at(&shared, params::CACHED).load(Ordering::Acquire), 0, "it read nothing");
}

/// The judge comes out REFUTED on an eviction, CONFIRMED on none, INCONCLUSIVE when the probe could not decide.
#[test]
fn each_judge_can_come_out_refuted() {
    let observe = |finished: Result<u32, String>, first: u32, values: &[u32]| CacheObservation {
        old: OLD,
        new: NEW,
        finished,
        first,
        seen: values.iter().enumerate().map(|(round, &value)| (k_of(round), value)).collect(),
        wait_cycles: 10,
    };
    let ok = || Ok(params::FINISHED);
    match judge_cached_line(&observe(ok(), OLD, &[OLD, OLD, OLD, OLD, NEW, NEW])) {
        Outcome::Refuted(what) => assert!(what.contains("from K=8 on"), "{what}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(judge_cached_line(&observe(ok(), OLD, &[OLD; 18])), Outcome::Confirmed(_)));
    for inconclusive in [
        observe(ok(), OLD, &[NEW, NEW]),
        observe(ok(), NEW, &[OLD, OLD]),
        observe(ok(), OLD, &[]),
        observe(ok(), OLD, &[OLD, 7]),
        observe(Ok(params::NO_REWRITE), OLD, &[]),
        observe(Ok(params::BAD_PARAMS), 0, &[]),
        observe(Err("the probe kernel did not return".into()), 0, &[]),
    ] {
        let outcome = judge_cached_line(&inconclusive);
        assert!(matches!(outcome, Outcome::Inconclusive(_)), "{inconclusive:?}: {outcome:?}");
    }
}
