//! `aiv bench`: Mooncake's `transfer_engine_bench` workload (docs/mooncake.md section 6).
//!
//! Thread `t`, request `i` of every batch moves `block_size` bytes from `local_base + block_size * (i * threads + t)`
//! to `target_base + block_size * (i * threads + t)`; each thread submits a batch, waits for it, frees it, and
//! repeats until the duration ends. Throughput = completed batches x batch_size x block_size / wall seconds.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::engine::{AivDevice, TransferEngine};
use crate::error::{EngineError, Result};
use crate::evidence::{EvidenceTally, TransferEvidence};
use crate::transfer::{BatchId, Opcode, Protocol, SegmentId, TransferRequest, TransferState};

/// Units `--report_unit` accepts, with their size in bytes (b suffix = bits).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReportUnit {
    name: &'static str,
    bytes: f64,
}

impl ReportUnit {
    const ALL: [ReportUnit; 9] = [
        ReportUnit { name: "GB", bytes: 1e9 },
        ReportUnit { name: "GiB", bytes: 1_073_741_824.0 },
        ReportUnit { name: "Gb", bytes: 1e9 / 8.0 },
        ReportUnit { name: "MB", bytes: 1e6 },
        ReportUnit { name: "MiB", bytes: 1_048_576.0 },
        ReportUnit { name: "Mb", bytes: 1e6 / 8.0 },
        ReportUnit { name: "KB", bytes: 1e3 },
        ReportUnit { name: "KiB", bytes: 1024.0 },
        ReportUnit { name: "Kb", bytes: 1e3 / 8.0 },
    ];

    /// The unit's name as printed.
    pub fn name(self) -> &'static str {
        self.name
    }
}

impl FromStr for ReportUnit {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        ReportUnit::ALL
            .into_iter()
            .find(|unit| unit.name == text)
            .ok_or_else(|| format!("unknown report unit {text:?} (one of GB GiB Gb MB MiB Mb KB KiB Kb)"))
    }
}

/// Longest `--duration`: one year (a target started without `--duration` serves until signalled instead).
pub const MAX_DURATION_SECS: f64 = 31_536_000.0;
/// Most `--threads`.
pub const MAX_THREADS: usize = 1024;
/// Most `--batch_size`.
pub const MAX_BATCH_SIZE: usize = 1 << 16;
/// Most `--report_precision` digits (an f64 carries about 16 significant digits).
pub const MAX_REPORT_PRECISION: usize = 16;

fn out_of_range(flag: &str, text: &str, accepted: &str) -> String {
    format!("{flag} {text:?}: expected {accepted}")
}

/// Shortest `--duration`: one microsecond (anything shorter would round to no run at all).
pub const MIN_DURATION_SECS: f64 = 1e-6;

/// `--duration`: seconds, from [`MIN_DURATION_SECS`] to [`MAX_DURATION_SECS`].
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let accepted = format!("a number of seconds from {MIN_DURATION_SECS:.6} to {MAX_DURATION_SECS}");
    match text.trim().parse::<f64>() {
        Ok(seconds) if (MIN_DURATION_SECS..=MAX_DURATION_SECS).contains(&seconds) => {
            Ok(Duration::from_secs_f64(seconds))
        }
        _ => Err(out_of_range("--duration", text, &accepted)),
    }
}

fn parse_count(flag: &str, text: &str, min: usize, max: usize) -> std::result::Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(out_of_range(flag, text, &format!("an integer from {min} to {max}"))),
    }
}

/// `--threads`: 1 to [`MAX_THREADS`].
pub fn parse_threads(text: &str) -> std::result::Result<usize, String> {
    parse_count("--threads", text, 1, MAX_THREADS)
}

/// `--batch_size`: 1 to [`MAX_BATCH_SIZE`].
pub fn parse_batch_size(text: &str) -> std::result::Result<usize, String> {
    parse_count("--batch_size", text, 1, MAX_BATCH_SIZE)
}

/// `--report_precision`: 0 to [`MAX_REPORT_PRECISION`].
pub fn parse_report_precision(text: &str) -> std::result::Result<usize, String> {
    parse_count("--report_precision", text, 0, MAX_REPORT_PRECISION)
}

/// Bytes of physical memory on this machine, if the system says.
pub fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf reads a system constant and has no preconditions.
    let (pages, page_size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let (pages, page_size) = (u64::try_from(pages).ok()?, u64::try_from(page_size).ok()?);
    pages.checked_mul(page_size)
}

/// `--buffer_size` (and `--block_size`, with their own flag name): a size with an optional suffix, at least 1 byte
/// and at most half this machine's physical memory (a run holds two buffers of this size).
pub fn parse_buffer_size(flag: &str, text: &str) -> std::result::Result<u64, String> {
    let max = physical_memory().map_or(1 << 40, |bytes| bytes / 2);
    let accepted = format!("a size from 1 byte to {max} bytes (half this machine's memory), e.g. 64kb or 1gb");
    match crate::config::parse_size(text) {
        Ok(bytes) if (1..=max).contains(&bytes) => Ok(bytes),
        Ok(_) => Err(out_of_range(flag, text, &accepted)),
        Err(reason) => Err(format!("{} ({reason})", out_of_range(flag, text, &accepted))),
    }
}

/// A host buffer of `size` bytes filled with `fill`, or an error (not an abort) where the allocation fails.
fn host_buffer(size: usize, fill: u8) -> Result<Vec<u8>> {
    filled_buffer(size, fill).map_err(|error| EngineError::InvalidArgument {
        operation: "bench",
        reason: format!("cannot allocate a host buffer of {size} bytes ({error}): lower --buffer_size"),
    })
}

/// `size` bytes of `fill` in Host memory, or the allocator's refusal (not an abort).
pub(crate) fn filled_buffer(size: usize, fill: u8) -> std::result::Result<Vec<u8>, std::collections::TryReserveError> {
    let mut buffer = Vec::new();
    buffer.try_reserve_exact(size)?;
    buffer.resize(size, fill);
    Ok(buffer)
}

/// Longest batch latency a histogram tells apart (longer ones count as this): one hour, in nanoseconds.
const LATENCY_MAX_NS: u64 = 3_600_000_000_000;

/// An empty batch-latency histogram: nanoseconds from 1 to one hour, 3 significant digits (about 250 KiB, fixed).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("constant bounds are valid")
}

/// The workload's parameters, named as `transfer_engine_bench` names them.
#[derive(Clone, Debug)]
pub struct BenchParams {
    /// READ or WRITE.
    pub operation: Opcode,
    /// Protocol of every request.
    pub protocol: Protocol,
    /// Bytes of each side's buffer.
    pub buffer_size: u64,
    /// Requests per batch.
    pub batch_size: usize,
    /// Bytes per request.
    pub block_size: u64,
    /// How long to run.
    pub duration: Duration,
    /// Initiator threads.
    pub threads: usize,
    /// Unit of the throughput figure.
    pub report_unit: ReportUnit,
    /// Digits after the decimal point.
    pub report_precision: usize,
}

impl BenchParams {
    /// Checks that the workload fits the buffers.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| EngineError::InvalidArgument { operation: "bench", reason };
        if self.batch_size == 0 || self.threads == 0 || self.block_size == 0 {
            return Err(invalid("batch_size, threads and block_size must be positive".into()));
        }
        let needed = (self.batch_size as u64)
            .checked_mul(self.threads as u64)
            .and_then(|n| n.checked_mul(self.block_size))
            .ok_or_else(|| invalid("batch_size x threads x block_size overflows".into()))?;
        if needed > self.buffer_size {
            return Err(invalid(format!(
                "batch_size x threads x block_size = {needed} bytes does not fit buffer_size {}",
                self.buffer_size
            )));
        }
        Ok(())
    }
}

/// Per-transfer averages of the recorded evidence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EvidenceSummary {
    /// Transfers that recorded evidence.
    pub transfers: u64,
    /// A representative record (the first one seen).
    pub sample: Option<TransferEvidence>,
    /// Every record's acts summed and checks counted: the run's verdict (`EvidenceTally::checks`).
    pub tally: EvidenceTally,
    /// Mean Host device-API calls per transfer.
    pub host_device_api_calls: f64,
    /// Mean descriptors per transfer.
    pub descriptors: f64,
    /// Mean doorbells per transfer.
    pub doorbells: f64,
    /// Mean Host CPU nanoseconds per transfer of the path's own threads and sections.
    pub host_cpu_ns: f64,
    /// Mean Host CPU nanoseconds per transfer of the threads that waited for it (charged to the path too).
    pub waiting_cpu_ns: f64,
    /// Thread-CPU clock readings made in the process during the run, per transfer (the accounting's own share).
    pub clock_readings: f64,
    /// Cost of one such reading, measured just before the run (ns).
    pub clock_reading_ns: f64,
    /// Monotonic-clock readings of never-sleeping sections during the run, per transfer (`SectionClock::Monotonic`).
    pub monotonic_readings: f64,
    /// Cost of one such reading, measured just before the run (ns).
    pub monotonic_reading_ns: f64,
    /// On-CPU time of every Host thread of the process during the run, per transfer (the benchmark loop, the engine
    /// and the paths' own threads; the twin's device-emulation threads left out), from the kernel's per-thread
    /// accounting: the figure no attribution can move work out of. `None` where /proc could not be read.
    pub process_host_cpu_ns: Option<f64>,
    /// Transfers per route, for a path with more than one (aiv: `sdma`, `rdma`; [`TransferEvidence::route`]); empty
    /// for the others.
    pub routes: std::collections::BTreeMap<&'static str, u64>,
}

#[derive(Debug, Default)]
struct EvidenceTotals {
    transfers: u64,
    routes: std::collections::BTreeMap<&'static str, u64>,
    sample: Option<TransferEvidence>,
    tally: EvidenceTally,
    host_device_api_calls: u64,
    descriptors: u64,
    doorbells: u64,
    host_cpu_ns: u64,
    waiting_cpu_ns: u64,
}

impl EvidenceTotals {
    fn add(&mut self, evidence: TransferEvidence) {
        self.transfers += 1;
        self.host_device_api_calls += evidence.host_device_api_calls;
        self.descriptors += evidence.descriptors;
        self.doorbells += evidence.doorbells;
        self.host_cpu_ns += evidence.host_cpu_ns;
        self.waiting_cpu_ns += evidence.waiting_cpu_ns;
        if let Some(route) = evidence.route {
            *self.routes.entry(route).or_default() += 1;
        }
        self.tally.add(&evidence);
        self.sample.get_or_insert(evidence);
    }

    fn summary(&self) -> EvidenceSummary {
        let n = self.transfers.max(1) as f64;
        EvidenceSummary {
            transfers: self.transfers,
            sample: self.sample.clone(),
            tally: self.tally.clone(),
            host_device_api_calls: self.host_device_api_calls as f64 / n,
            descriptors: self.descriptors as f64 / n,
            doorbells: self.doorbells as f64 / n,
            host_cpu_ns: self.host_cpu_ns as f64 / n,
            waiting_cpu_ns: self.waiting_cpu_ns as f64 / n,
            clock_readings: 0.0,
            clock_reading_ns: 0.0,
            monotonic_readings: 0.0,
            monotonic_reading_ns: 0.0,
            process_host_cpu_ns: None,
            routes: self.routes.clone(),
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct BenchOutcome {
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Batches whose every task completed.
    pub completed_batches: u64,
    /// Batches with a failed or timed-out task.
    pub failed_batches: u64,
    /// The first failure reason seen, if any.
    pub first_failure: Option<String>,
    /// The evidence the transfers recorded.
    pub evidence: EvidenceSummary,
    /// Bytes per completed batch.
    pub bytes_per_batch: u64,
    /// Wall time of each batch from submit to the end of its wait, in nanoseconds (batch size 1: per-transfer
    /// latency); a histogram of fixed size, so a long run does not grow memory per batch.
    pub batch_latencies: Histogram<u64>,
    /// What the run kept busy: the twin's AIV cores (executing vs polling) and SDMA engines, Host CPU by thread role
    /// (docs/occupancy.md). On the vendor's runtime the device part says it is not exposed.
    pub occupancy: crate::occupancy::Occupancy,
    /// When the run began and ended, in the profiler's time (Unix microseconds): the window whose tasks the run's
    /// device-side observer counts ([`observe_run`]).
    pub window: crate::device::cann::profiler::Window,
}

impl BenchOutcome {
    /// Throughput in bytes per second, as `transfer_engine_bench` computes it.
    pub fn bytes_per_second(&self) -> f64 {
        self.completed_batches as f64 * self.bytes_per_batch as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q`-quantile (0..=1) of the batch latencies (within 0.1%); zero when nothing ran.
    pub fn latency_quantile(&self, q: f64) -> Duration {
        if self.batch_latencies.is_empty() {
            return Duration::ZERO;
        }
        let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        Duration::from_nanos(self.batch_latencies.value_at_quantile(q))
    }

    /// `transfer_engine_bench`'s result line, to the letter.
    pub fn result_line(&self, params: &BenchParams) -> String {
        format!(
            "Test completed: duration {:.2}, batch count {}, throughput {:.*} {}/s",
            self.elapsed.as_secs_f64(),
            self.completed_batches,
            params.report_precision,
            self.bytes_per_second() / params.report_unit.bytes,
            params.report_unit.name,
        )
    }
}

/// The requests of initiator thread `thread`'s batch: `batch_size` blocks of `block_size` bytes, interleaved with the
/// other threads', at the same offsets of the local buffer (at `local_base`) and the target's (at `target_base`).
fn thread_batch(
    params: &BenchParams,
    thread: usize,
    target: SegmentId,
    local_base: u64,
    target_base: u64,
) -> Vec<TransferRequest> {
    (0..params.batch_size)
        .map(|i| {
            let offset = params.block_size * (i * params.threads + thread) as u64;
            TransferRequest {
                opcode: params.operation,
                source: local_base + offset,
                target_id: target,
                target_offset: target_base + offset,
                length: params.block_size,
                protocol: Some(params.protocol),
            }
        })
        .collect()
}

/// Runs the initiator side against `target` (an open segment of `engine`) whose buffer starts at `target_base`;
/// `local_base` must be a buffer of `buffer_size` bytes registered with `engine`.
pub fn run_initiator(
    engine: &TransferEngine,
    params: &BenchParams,
    target: SegmentId,
    local_base: u64,
    target_base: u64,
) -> Result<BenchOutcome> {
    params.validate()?;
    let lists: Vec<Vec<Vec<TransferRequest>>> =
        (0..params.threads).map(|thread| vec![thread_batch(params, thread, target, local_base, target_base)]).collect();
    run_request_lists(engine, params.duration, &lists)
}

/// Runs the initiator side against the segment named `segment` of another process, as [`run_initiator`], following
/// a target that restarts under the same name (the same RPC port in P2P mode): after a batch that did not complete
/// the segment is marked ([`TransferEngine::suspect_segment`]); before the next batch its descriptor is fetched again
/// ([`TransferEngine::refresh_if_suspect`], the Python binding's recovery), and when the target's first buffer moved
/// every thread rebuilds its requests at the new address. While the target is gone each batch fails (and counts as
/// failed) and the next one tries the fetch again.
pub fn run_following(
    engine: &TransferEngine,
    params: &BenchParams,
    segment: &str,
    local_base: u64,
    target_base: u64,
) -> Result<BenchOutcome> {
    params.validate()?;
    let target = engine.open_segment(segment)?;
    // The target's first buffer, and how many times it moved (each thread rebuilds its batch when it did).
    let base = AtomicU64::new(target_base);
    let moves = AtomicU64::new(0);
    let batches: Vec<Mutex<(u64, Vec<TransferRequest>)>> = (0..params.threads)
        .map(|thread| Mutex::new((0, thread_batch(params, thread, target, local_base, target_base))))
        .collect();
    let step = |thread: usize, _iteration: usize, counters: &Counters, totals: &mut EvidenceTotals| {
        if engine.refresh_if_suspect(segment) {
            if let Ok(moved_to) = engine.get_first_buffer_address(segment) {
                if base.swap(moved_to, Ordering::AcqRel) != moved_to {
                    moves.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
        let mut batch = batches[thread].lock().unwrap_or_else(|p| p.into_inner());
        let current = moves.load(Ordering::Acquire);
        if batch.0 != current {
            *batch = (current, thread_batch(params, thread, target, local_base, base.load(Ordering::Acquire)));
        }
        let (latency, state) = run_one_batch(engine, &batch.1, counters, totals, Some(segment))?;
        if state != TransferState::Completed {
            engine.suspect_segment(segment);
        }
        Ok(latency)
    };
    let bytes_per_batch = params.block_size * params.batch_size as u64;
    run_threads(engine, params.duration, params.threads, bytes_per_batch, &step)
}

/// Runs `lists.len()` initiator threads for `duration`: thread `t` submits the batches of `lists[t]` in turn, one at
/// a time, waiting for each (the requests are built before the clock starts). The outcome's bytes per batch is the
/// mean over every list's batches.
pub fn run_request_lists(
    engine: &TransferEngine,
    duration: Duration,
    lists: &[Vec<Vec<TransferRequest>>],
) -> Result<BenchOutcome> {
    let batches: Vec<&Vec<TransferRequest>> = lists.iter().flatten().collect();
    if batches.is_empty() || batches.iter().any(|batch| batch.is_empty()) {
        return Err(EngineError::InvalidArgument {
            operation: "bench",
            reason: "a thread without batches, or an empty batch".into(),
        });
    }
    let bytes_per_batch =
        batches.iter().map(|batch| batch.iter().map(|r| r.length).sum::<u64>()).sum::<u64>() / batches.len() as u64;
    let step = |thread: usize, iteration: usize, counters: &Counters, totals: &mut EvidenceTotals| {
        let list = &lists[thread];
        run_one_batch(engine, &list[iteration % list.len()], counters, totals, None).map(|(latency, _)| latency)
    };
    run_threads(engine, duration, lists.len(), bytes_per_batch, &step)
}

/// Runs `layers.len()` initiator threads for `duration`, each moving requests layer by layer as a layerwise KV
/// connector does: thread `t` takes the requests of `requests[t]` in turn; for each, per layer, it waits `compute`
/// (the device computing the layer, the Host thread waiting) and then submits the layer's transfers as one batch
/// without waiting, so each layer's transfer overlaps the next layers' compute; then it waits for every layer's
/// batch. A request is one "batch" of the outcome: its latency is from its first compute step to its last batch's
/// end, and its bytes are every layer's.
pub fn run_layerwise(
    engine: &TransferEngine,
    duration: Duration,
    requests: &[Vec<Vec<Vec<TransferRequest>>>],
    compute: Duration,
) -> Result<BenchOutcome> {
    let all: Vec<&Vec<Vec<TransferRequest>>> = requests.iter().flatten().collect();
    if all.is_empty() || all.iter().any(|layers| layers.is_empty() || layers.iter().any(|layer| layer.is_empty())) {
        return Err(EngineError::InvalidArgument {
            operation: "bench",
            reason: "a thread without requests, a request without layers, or a layer without transfers".into(),
        });
    }
    let bytes_per_batch =
        all.iter().map(|layers| layers.iter().flatten().map(|r| r.length).sum::<u64>()).sum::<u64>() / all.len() as u64;
    let step = |thread: usize, iteration: usize, counters: &Counters, totals: &mut EvidenceTotals| {
        let list = &requests[thread];
        run_one_layerwise(engine, &list[iteration % list.len()], compute, counters, totals)
    };
    run_threads(engine, duration, requests.len(), bytes_per_batch, &step)
}

/// The run's shared outcome counters.
struct Counters {
    completed: AtomicU64,
    failed: AtomicU64,
    first_failure: Mutex<Option<String>>,
}

impl Counters {
    /// One unit (a batch, or a layerwise request) finished: `reason` is the first failed task's, if any failed.
    fn finished(&self, ok: bool, reason: impl FnOnce() -> Option<String>) {
        if ok {
            self.completed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
            let mut first = self.first_failure.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_none() {
                *first = reason();
            }
        }
    }
}

/// One step of a thread's loop: its thread index, its iteration, the run's counters, the thread's evidence; returns
/// the step's latency.
type Step<'a> = dyn Fn(usize, usize, &Counters, &mut EvidenceTotals) -> Result<Duration> + Sync + 'a;

/// The measuring frame of every run: `threads` threads call `step` until `duration` has passed, with the evidence,
/// latencies, occupancy and whole-process Host CPU around them.
fn run_threads(
    engine: &TransferEngine,
    duration: Duration,
    threads: usize,
    bytes_per_batch: u64,
    step: &Step<'_>,
) -> Result<BenchOutcome> {
    let stop = AtomicBool::new(false);
    let counters =
        Counters { completed: AtomicU64::new(0), failed: AtomicU64::new(0), first_failure: Mutex::new(None) };
    let totals = Mutex::new(EvidenceTotals::default());
    let clock_reading_ns = crate::cpu_time::clock_reading_cost_ns();
    let monotonic_reading_ns = crate::cpu_time::monotonic_reading_cost_ns();
    let readings_before = crate::cpu_time::clock_readings();
    let monotonic_before = crate::cpu_time::monotonic_readings();
    let occupancy_before = occupancy_snapshot(engine);
    let host_threads_before = crate::cpu_time::process_thread_cpu(&crate::device::DEVICE_THREAD_PREFIXES);
    let bench_threads_cpu = AtomicU64::new(0);
    let window_start = crate::device::cann::profiler::now_us();
    let started = Instant::now();
    let error: Mutex<Option<EngineError>> = Mutex::new(None);
    let latencies = Mutex::new(latency_histogram());
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let (stop, counters, totals, error, latencies) = (&stop, &counters, &totals, &error, &latencies);
            let bench_threads_cpu = &bench_threads_cpu;
            scope.spawn(move || {
                let cpu_started = crate::cpu_time::thread_cpu_time_ns();
                let mut local_totals = EvidenceTotals::default();
                let mut local_latencies = latency_histogram();
                let mut iteration = 0;
                while !stop.load(Ordering::Relaxed) {
                    match step(thread, iteration, counters, &mut local_totals) {
                        Ok(latency) => {
                            let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
                            local_latencies.saturating_record(nanos.max(1));
                        }
                        Err(e) => {
                            *error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    iteration += 1;
                }
                // Same bounds on both sides, so adding cannot fail.
                let _ = latencies.lock().unwrap_or_else(|p| p.into_inner()).add(&local_latencies);
                let cpu = crate::cpu_time::thread_cpu_time_ns().saturating_sub(cpu_started);
                bench_threads_cpu.fetch_add(cpu, Ordering::Relaxed);
                let mut shared = totals.lock().unwrap_or_else(|p| p.into_inner());
                shared.transfers += local_totals.transfers;
                shared.host_device_api_calls += local_totals.host_device_api_calls;
                shared.descriptors += local_totals.descriptors;
                shared.doorbells += local_totals.doorbells;
                shared.host_cpu_ns += local_totals.host_cpu_ns;
                shared.waiting_cpu_ns += local_totals.waiting_cpu_ns;
                shared.tally.merge(&local_totals.tally);
                for (route, n) in &local_totals.routes {
                    *shared.routes.entry(route).or_default() += n;
                }
                if shared.sample.is_none() {
                    shared.sample = local_totals.sample;
                }
            });
        }
        while started.elapsed() < duration && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5).min(duration));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = started.elapsed();
    let window = crate::device::cann::profiler::Window::since(window_start);
    let host_threads_after = crate::cpu_time::process_thread_cpu(&crate::device::DEVICE_THREAD_PREFIXES);
    let mut occupancy = occupancy_snapshot(engine).since(&occupancy_before);
    if let Some(error) = error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(error);
    }
    let readings = crate::cpu_time::clock_readings().saturating_sub(readings_before);
    let monotonic = crate::cpu_time::monotonic_readings().saturating_sub(monotonic_before);
    let batch_latencies = latencies.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut evidence = totals.into_inner().unwrap_or_else(|p| p.into_inner()).summary();
    evidence.clock_readings = readings as f64 / evidence.transfers.max(1) as f64;
    evidence.clock_reading_ns = clock_reading_ns;
    evidence.monotonic_readings = monotonic as f64 / evidence.transfers.max(1) as f64;
    evidence.monotonic_reading_ns = monotonic_reading_ns;
    if let (Some(before), Some(after)) = (host_threads_before, host_threads_after) {
        // Threads that started during the run (a path's workers) count from zero; the benchmark threads, gone by now,
        // reported their own time.
        let others: u64 = after.iter().map(|(tid, ns)| ns.saturating_sub(before.get(tid).copied().unwrap_or(0))).sum();
        let bench_threads_cpu = bench_threads_cpu.into_inner();
        // The benchmark's caller threads came and went between the snapshots: they report their own time.
        let threads = u32::try_from(threads).unwrap_or(u32::MAX);
        occupancy.add_unseen_threads(crate::occupancy::ThreadRole::Caller, threads, bench_threads_cpu);
        let total = others + bench_threads_cpu;
        evidence.process_host_cpu_ns = Some(total as f64 / evidence.transfers.max(1) as f64);
    }
    Ok(BenchOutcome {
        batch_latencies,
        elapsed,
        completed_batches: counters.completed.into_inner(),
        failed_batches: counters.failed.into_inner(),
        first_failure: counters.first_failure.into_inner().unwrap_or_else(|p| p.into_inner()),
        evidence,
        bytes_per_batch,
        occupancy,
        window,
    })
}

/// The occupancy counters of the engine's device and the next one (an in-process aiv target), on the twin runtime
/// embedded in this process; the vendor's runtime exposes none.
fn occupancy_snapshot(engine: &TransferEngine) -> crate::occupancy::OccupancySnapshot {
    let aiv = &engine.config().aiv;
    let first = i32::try_from(aiv.device_id).unwrap_or(i32::MAX);
    let twin = aiv.device_backend == crate::config::DeviceBackendKind::Twin;
    crate::occupancy::OccupancySnapshot::take(&[first, first.saturating_add(1)], twin)
}

/// Runs one batch; returns its latency from submit to the end of the wait (batch allocation excluded) and its state.
/// A batch to the segment named `segment` that timed out is reported with the segment and the timeout that ended it.
fn run_one_batch(
    engine: &TransferEngine,
    requests: &[TransferRequest],
    counters: &Counters,
    totals: &mut EvidenceTotals,
    segment: Option<&str>,
) -> Result<(Duration, TransferState)> {
    let batch = engine.allocate_batch(requests.len())?;
    let submitted = Instant::now();
    engine.submit_transfer(batch, requests)?;
    let status = engine.wait_batch(batch)?;
    let latency = submitted.elapsed();
    collect(engine, batch, requests.len(), totals)?;
    counters.finished(status.state == TransferState::Completed, || {
        let reason = first_reason(engine, batch, requests.len());
        // The batch's state says failed when any task did; a task's own state says whether it timed out.
        let timed_out = || {
            (0..requests.len())
                .any(|task| engine.transfer_status(batch, task).is_ok_and(|task| task.state == TransferState::Timeout))
        };
        match segment {
            Some(segment) if timed_out() => Some(format!(
                "batch to segment {segment:?} timed out: no completion within aiv.transfer_timeout_ms ({} ms), the \
                 target stalled or became unreachable with the batch in flight: {}",
                engine.config().aiv.transfer_timeout.as_millis(),
                reason.as_deref().unwrap_or("no task reason recorded")
            )),
            _ => reason,
        }
    });
    engine.free_batch(batch)?;
    Ok((latency, status.state))
}

/// One layerwise request ([`run_layerwise`]): per layer, compute then submit; then wait for every layer.
fn run_one_layerwise(
    engine: &TransferEngine,
    layers: &[Vec<TransferRequest>],
    compute: Duration,
    counters: &Counters,
    totals: &mut EvidenceTotals,
) -> Result<Duration> {
    let started = Instant::now();
    let mut batches = Vec::with_capacity(layers.len());
    let mut submitted = || -> Result<()> {
        for layer in layers {
            std::thread::sleep(compute);
            let batch = engine.allocate_batch(layer.len())?;
            batches.push((batch, layer.len()));
            engine.submit_transfer(batch, layer)?;
        }
        Ok(())
    };
    let submitted = submitted();
    let mut ok = submitted.is_ok();
    let mut reason = None;
    for &(batch, tasks) in &batches {
        // Every batch submitted is waited for and freed, also after a failed submit.
        let status = engine.wait_batch(batch)?;
        collect(engine, batch, tasks, totals)?;
        if status.state != TransferState::Completed {
            ok = false;
            reason = reason.or_else(|| first_reason(engine, batch, tasks));
        }
        engine.free_batch(batch)?;
    }
    submitted?;
    let latency = started.elapsed();
    counters.finished(ok, || reason);
    Ok(latency)
}

/// Adds the evidence of a finished batch's tasks to `totals`.
fn collect(engine: &TransferEngine, batch: BatchId, tasks: usize, totals: &mut EvidenceTotals) -> Result<()> {
    for task in 0..tasks {
        if let Some(evidence) = engine.task_evidence(batch, task)? {
            totals.add(evidence);
        }
    }
    Ok(())
}

/// The first failed task's reason.
fn first_reason(engine: &TransferEngine, batch: BatchId, tasks: usize) -> Option<String> {
    (0..tasks).find_map(|task| engine.task_reason(batch, task).ok().flatten())
}

/// Copies the workload's own blocks with plain `memcpy` on `threads` threads for `duration`: thread `t` copies the
/// blocks at `block_size * (i * threads + t)` for every `i` below `batch_size`, exactly the addresses the engine
/// workload moves, so the ratio compares paths and not cache footprints. Returns bytes per second.
pub fn memcpy_reference(src: &[u8], dst: &mut [u8], params: &BenchParams, duration: Duration) -> f64 {
    let block = params.block_size as usize;
    let threads = params.threads;
    let blocks = params.batch_size * threads;
    let span = (blocks * block).min(src.len()).min(dst.len());
    let started = Instant::now();
    let moved = AtomicU64::new(0);
    let src_addr = src.as_ptr() as usize;
    let dst_addr = dst.as_mut_ptr() as usize;
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let moved = &moved;
            scope.spawn(move || {
                let mut bytes = 0u64;
                while started.elapsed() < duration {
                    for i in 0..params.batch_size {
                        let offset = block * (i * threads + thread);
                        if offset + block > span {
                            break;
                        }
                        // SAFETY: `offset + block <= span`, which lies inside both buffers; threads copy disjoint
                        // blocks (block index i * threads + t is unique per thread), and the buffers outlive the scope.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                (src_addr + offset) as *const u8,
                                (dst_addr + offset) as *mut u8,
                                block,
                            );
                        }
                        bytes += block as u64;
                    }
                }
                moved.fetch_add(bytes, Ordering::Relaxed);
            });
        }
    });
    std::hint::black_box(&mut *dst);
    moved.into_inner() as f64 / started.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_take_fixed_memory_however_many_batches_run() {
        let mut histogram = latency_histogram();
        let before = histogram.distinct_values();
        for i in 0..1_000_000u64 {
            histogram.saturating_record(1 + i % 5_000_000);
        }
        // Out-of-range values saturate instead of failing or growing the histogram.
        histogram.saturating_record(u64::MAX);
        assert_eq!(histogram.len(), 1_000_001);
        assert_eq!(histogram.distinct_values(), before, "the counts array never grows");
        assert!(histogram.max() >= LATENCY_MAX_NS * 999 / 1000);
    }

    #[test]
    fn result_line_matches_transfer_engine_bench() {
        let params = BenchParams {
            operation: Opcode::Write,
            protocol: Protocol::Tcp,
            buffer_size: 1 << 30,
            batch_size: 128,
            block_size: 65536,
            duration: Duration::from_secs(3),
            threads: 12,
            report_unit: "GB".parse().expect("GB is a unit"),
            report_precision: 2,
        };
        let outcome = BenchOutcome {
            elapsed: Duration::from_millis(3000),
            completed_batches: 2429,
            failed_batches: 0,
            first_failure: None,
            evidence: EvidenceSummary::default(),
            bytes_per_batch: 128 * 65536,
            window: crate::device::cann::profiler::Window { start_us: 0.0, end_us: 0.0 },
            occupancy: {
                let before = crate::occupancy::OccupancySnapshot::take(&[], false);
                crate::occupancy::OccupancySnapshot::take(&[], false).since(&before)
            },
            batch_latencies: {
                let mut histogram = latency_histogram();
                for micros in 1..=100 {
                    histogram.record(micros * 1000).expect("in range");
                }
                histogram
            },
        };
        // Within the histogram's 3 significant digits of the nearest-rank values 50 us and 99 us.
        let near = |got: Duration, micros: f64| (got.as_secs_f64() * 1e6 - micros).abs() <= micros * 1e-3;
        assert!(near(outcome.latency_quantile(0.5), 50.0), "{:?}", outcome.latency_quantile(0.5));
        assert!(near(outcome.latency_quantile(0.99), 99.0), "{:?}", outcome.latency_quantile(0.99));
        // 2429 * 128 * 65536 / 3 s = 6.79 GB/s
        assert_eq!(
            outcome.result_line(&params),
            "Test completed: duration 3.00, batch count 2429, throughput 6.79 GB/s"
        );
        assert!("GiB".parse::<ReportUnit>().is_ok());
        assert!("gb".parse::<ReportUnit>().is_err());
        let too_big = BenchParams { buffer_size: 1 << 20, ..params };
        assert!(too_big.validate().expect_err("does not fit").to_string().contains("does not fit"));
    }
}

/// The version of [`report_json`]'s document; bumped when a field changes meaning or goes away.
pub const REPORT_SCHEMA: &str = "aiv-bench/3";

/// A run as one JSON document (`aiv bench --json`), for the audit and for scripts: the parameters, the results with
/// the same-run memcpy reference, batch latency quantiles, and the evidence: the records' runtime, the four
/// AIV-direct checks of the run (derived from every record's acts, summed) with the counts behind them, how each
/// transfer's own checks came out, the per-transfer means and a sample record.
pub fn report_json(params: &BenchParams, report: &LoopbackReport, target: &str) -> serde_json::Value {
    let outcome = &report.outcome;
    let evidence = &outcome.evidence;
    let quantile = |q: f64| outcome.latency_quantile(q).as_nanos() as u64;
    let tally = &evidence.tally;
    let checks = tally.checks();
    let checks = serde_json::json!({
        "kernel_on_aiv": checks.kernel_on_aiv,
        "kernel_writes_descriptors": checks.kernel_writes_descriptors,
        "kernel_rings_doorbell": checks.kernel_rings_doorbell,
        "device_observes_completion": checks.device_observes_completion,
        "aiv_direct": checks.aiv_direct(),
    });
    let per_check = |i: usize| tally.per_transfer[i];
    let per_transfer_checks = serde_json::json!({
        "kernel_on_aiv": per_check(0),
        "kernel_writes_descriptors": per_check(1),
        "kernel_rings_doorbell": per_check(2),
        "device_observes_completion": per_check(3),
        "aiv_direct": per_check(4),
    });
    serde_json::json!({
        "schema": REPORT_SCHEMA,
        "workload": {
            "protocol": params.protocol.as_str(),
            "operation": params.operation.as_str(),
            "batch_size": params.batch_size,
            "block_size": params.block_size,
            "threads": params.threads,
            "buffer_size": params.buffer_size,
            "duration_s": params.duration.as_secs_f64(),
            "target": target,
        },
        "result": {
            "elapsed_s": outcome.elapsed.as_secs_f64(),
            "completed_batches": outcome.completed_batches,
            "failed_batches": outcome.failed_batches,
            "first_failure": outcome.first_failure,
            "bytes_per_second": outcome.bytes_per_second(),
            "memcpy_bytes_per_second": report.memcpy_bytes_per_second,
        },
        "batch_latency_ns": {
            "batches": outcome.batch_latencies.len(),
            "p50": quantile(0.5),
            "p99": quantile(0.99),
            "p999": quantile(0.999),
            "max": outcome.batch_latencies.max(),
        },
        "evidence": {
            "transfers": evidence.transfers,
            "runtime": tally.runtime,
            "submitted_by": tally.submitter(),
            "observer": tally.observer,
            "checks": checks,
            "acts": {
                "descriptors_written": tally.descriptors_written,
                "doorbells_rung": tally.doorbells_rung,
                "completion_seen": tally.completion_seen,
            },
            "per_transfer_checks": per_transfer_checks,
            "per_transfer_submitted_by": tally.per_transfer_submitters,
            "routes": evidence.routes,
            "per_transfer": {
                "host_device_api_calls": evidence.host_device_api_calls,
                "host_launches": tally.host_launches_per_transfer(),
                "descriptors": evidence.descriptors,
                "doorbells": evidence.doorbells,
                "host_cpu_ns": evidence.host_cpu_ns,
                "waiting_cpu_ns": evidence.waiting_cpu_ns,
                "process_host_cpu_ns": evidence.process_host_cpu_ns,
                "clock_readings": evidence.clock_readings,
                "clock_reading_ns": evidence.clock_reading_ns,
                "monotonic_readings": evidence.monotonic_readings,
                "monotonic_reading_ns": evidence.monotonic_reading_ns,
            },
            "sample": evidence.sample,
        },
        "occupancy": outcome.occupancy,
    })
}

/// What an in-process run measured, with its same-run reference.
#[derive(Clone, Debug)]
pub struct LoopbackReport {
    /// The engine workload.
    pub outcome: BenchOutcome,
    /// Plain memcpy of the same block size over the same buffers, bytes per second.
    pub memcpy_bytes_per_second: f64,
}

/// Runs initiator and target in this process: one engine whose own segment is the target, two buffers of
/// `buffer_size` bytes registered with it, then the memcpy reference over the same buffers.
pub fn run_loopback(engine: &TransferEngine, params: &BenchParams) -> Result<LoopbackReport> {
    params.validate()?;
    let size = usize::try_from(params.buffer_size)
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    // Filled (not merely zeroed) so that first-touch page faults are not part of the measurement.
    let mut local = host_buffer(size, 0xA5)?;
    let mut target = host_buffer(size, 0x5A)?;
    let local_addr = local.as_mut_ptr() as u64;
    let target_addr = target.as_mut_ptr() as u64;
    // SAFETY: both vectors live until the end of this function, after every batch has finished (run_initiator
    // waits for each batch) and after both registrations are withdrawn below.
    unsafe {
        engine.register_memory(local_addr, params.buffer_size, "cpu:0")?;
        engine.register_memory(target_addr, params.buffer_size, "cpu:0")?;
    }
    let outcome = run_initiator(engine, params, SegmentId::LOCAL, local_addr, target_addr);
    engine.unregister_memory(local_addr)?;
    engine.unregister_memory(target_addr)?;
    let outcome = outcome?;
    let reference_time = params.duration.min(Duration::from_secs(2));
    let memcpy_bytes_per_second = memcpy_reference(&local, &mut target, params, reference_time);
    Ok(LoopbackReport { outcome, memcpy_bytes_per_second })
}

/// Runs initiator and target as two engines of this process: `target` serves a buffer of `buffer_size` bytes,
/// `initiator` opens `target`'s segment by name and moves the workload to it through its transport for
/// `params.protocol` (for `tcp`: over loopback sockets, every byte through the wire). Then the memcpy reference
/// over the same two buffers.
pub fn run_two_engines(
    initiator: &TransferEngine,
    target: &TransferEngine,
    params: &BenchParams,
) -> Result<LoopbackReport> {
    params.validate()?;
    let size = usize::try_from(params.buffer_size)
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    let mut local = host_buffer(size, 0xA5)?;
    let mut remote = host_buffer(size, 0x5A)?;
    let local_addr = local.as_mut_ptr() as u64;
    let remote_addr = remote.as_mut_ptr() as u64;
    // SAFETY: both vectors live until the end of this function, after every batch has finished (run_initiator
    // waits for each batch) and after both registrations are withdrawn below.
    unsafe {
        initiator.register_memory(local_addr, params.buffer_size, "cpu:0")?;
        target.register_memory(remote_addr, params.buffer_size, "cpu:0")?;
    }
    let outcome = initiator
        .open_segment(target.name())
        .and_then(|segment| run_initiator(initiator, params, segment, local_addr, remote_addr));
    initiator.unregister_memory(local_addr)?;
    target.unregister_memory(remote_addr)?;
    let outcome = outcome?;
    let reference_time = params.duration.min(Duration::from_secs(2));
    let memcpy_bytes_per_second = memcpy_reference(&local, &mut remote, params, reference_time);
    Ok(LoopbackReport { outcome, memcpy_bytes_per_second })
}

/// Runs the initiator against `segment`, a segment of another process found through `engine`'s metadata: a local
/// buffer of `buffer_size` bytes is registered, the workload targets the segment's first buffer. Then the memcpy
/// reference over the local buffer and a scratch buffer of the same size.
pub fn run_against_segment(engine: &TransferEngine, params: &BenchParams, segment: &str) -> Result<LoopbackReport> {
    params.validate()?;
    let size = usize::try_from(params.buffer_size)
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    let target_base = engine.get_first_buffer_address(segment)?;
    let mut local = host_buffer(size, 0xA5)?;
    let local_addr = local.as_mut_ptr() as u64;
    // SAFETY: the vector lives until the end of this function, after every batch has finished (run_initiator waits
    // for each batch) and after the registration is withdrawn below.
    unsafe { engine.register_memory(local_addr, params.buffer_size, "cpu:0")? };
    let outcome = run_following(engine, params, segment, local_addr, target_base);
    engine.unregister_memory(local_addr)?;
    let outcome = outcome?;
    let mut scratch = host_buffer(size, 0x5A)?;
    let reference_time = params.duration.min(Duration::from_secs(2));
    let memcpy_bytes_per_second = memcpy_reference(&local, &mut scratch, params, reference_time);
    Ok(LoopbackReport { outcome, memcpy_bytes_per_second })
}

/// Serves until `stop` is set or `params.duration` has passed, checking `stop` every 20 ms.
fn serve_until(params: &BenchParams, stop: &AtomicBool) {
    let started = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let Some(left) = params.duration.checked_sub(started.elapsed()).filter(|left| !left.is_zero()) else {
            break;
        };
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

/// The target side for another process's initiator: registers a buffer of `buffer_size` bytes with `engine`
/// (published through its metadata), calls `ready` with its address, serves until `stop` is set or
/// `params.duration` has passed, then withdraws it.
pub fn serve_target(
    engine: &TransferEngine,
    params: &BenchParams,
    stop: &AtomicBool,
    ready: impl FnOnce(u64),
) -> Result<()> {
    let size = usize::try_from(params.buffer_size)
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    let mut buffer = host_buffer(size, 0x5A)?;
    let addr = buffer.as_mut_ptr() as u64;
    // SAFETY: the vector outlives the registration, withdrawn below before it is dropped; peers only reach it
    // through the engine's transports while it is registered.
    unsafe { engine.register_memory(addr, params.buffer_size, "cpu:0")? };
    ready(addr);
    serve_until(params, stop);
    engine.unregister_memory(addr)?;
    drop(buffer);
    Ok(())
}

/// Runs the workload over a device path (`aiv`, `adxl`, `adxl-fabric`, `ubshmem`: `params.protocol`) between two devices of this process: the initiator engine (named
/// `config.local_hostname`, device `config.aiv.device_id`) and a target engine on the next device id, each with
/// `buffer_size` bytes of device memory registered; then the memcpy reference over the same two buffers.
/// CANN's profiler for a run of `protocol` on `devices` under `config`: started for aiv on `device_backend: "cann"`
/// (the vendor's runtime, or the twin's library loaded in its place), where the aiv transfers' device-side acts are
/// self-reported and the profiler is the run's independent device-side observer (docs/evidence.md, "The profiler");
/// `None` otherwise. Start it before the engines open (their kernels launch inside the session) and hand it to
/// [`observe_run`] after they closed. A profiler that cannot start is `Some(Err(why))`: the run goes on.
pub fn start_observer(
    config: &crate::config::EngineConfig,
    protocol: Protocol,
    devices: &[u32],
) -> Option<std::result::Result<crate::device::cann::profiler::ProfilerSession, String>> {
    (config.aiv.device_backend == crate::config::DeviceBackendKind::Cann && protocol == Protocol::Aiv)
        .then(|| crate::device::cann::profiler::ProfilerSession::start_vendor(devices))
}

/// Stops `session` (from [`start_observer`]) and sets what it saw in the run's window as the run's observer.
pub fn observe_run(
    report: &mut LoopbackReport,
    session: Option<std::result::Result<crate::device::cann::profiler::ProfilerSession, String>>,
) {
    if let Some(session) = session {
        let window = report.outcome.window;
        report.outcome.evidence.tally.observer = Some(crate::device::cann::profiler::observer(session, &[window]));
    }
}

pub fn run_aiv_pair(config: &crate::config::EngineConfig, params: &BenchParams) -> Result<LoopbackReport> {
    params.validate()?;
    let hbm = config.aiv.hbm_size;
    if params.buffer_size > hbm {
        return Err(EngineError::InvalidArgument {
            operation: "bench",
            reason: format!(
                "buffer_size {} does not fit the device memory of {hbm} bytes (aiv.hbm_size): lower --buffer_size or \
                 raise \"aiv\": {{\"hbm_size\": ...}} in mooncake.json",
                params.buffer_size
            ),
        });
    }
    // Before the engines open: their kernels launch inside the profiling session.
    let session = start_observer(config, params.protocol, &[config.aiv.device_id, config.aiv.device_id + 1]);
    let initiator = TransferEngine::new(config.clone())?;
    let target = TransferEngine::new(target_config(config))?;
    let (initiator_device, target_device) = (initiator.device()?, target.device()?);
    let allocation_error = |error: crate::device::DeviceError| EngineError::InvalidArgument {
        operation: "bench",
        reason: error.to_string(),
    };
    let local = initiator_device.allocate(params.buffer_size).map_err(allocation_error)?;
    let remote = target_device.allocate(params.buffer_size).map_err(allocation_error)?;
    // Touch the blocks the workload uses so that first-touch page faults are not part of the measurement. Device
    // memory is written through the device's copy path: the Host never dereferences a device address.
    let span = (params.batch_size as u64 * params.threads as u64 * params.block_size).min(params.buffer_size) as usize;
    let device_error = |error: crate::device::DeviceError| EngineError::InvalidArgument {
        operation: "bench: fill device memory",
        reason: error.to_string(),
    };
    fill_device(&initiator_device, local.addr(), span, |_| 0xA5).map_err(device_error)?;
    fill_device(&target_device, remote.addr(), span, |_| 0x5A).map_err(device_error)?;
    // SAFETY: the buffers outlive every batch (run_initiator waits for each) and both registrations are withdrawn
    // before they drop.
    unsafe {
        initiator.register_memory(local.addr(), local.len(), &initiator_device.location())?;
        target.register_memory(remote.addr(), remote.len(), &target_device.location())?;
    }
    let outcome = target_segment_run(&initiator, target.name(), params, local.addr(), remote.addr());
    initiator.unregister_memory(local.addr())?;
    target.unregister_memory(remote.addr())?;
    // The initiator goes first, so that its peer probe never finds the target's device gone (a false "peer lost").
    drop(local);
    drop(initiator_device);
    drop(initiator);
    // The target too, before the profiler stops: its kernels have ended by then.
    drop((remote, target_device, target));
    let outcome = outcome?;
    let memcpy_bytes_per_second = memcpy_reference_on_host(span, params)?;
    let mut report = LoopbackReport { outcome, memcpy_bytes_per_second };
    observe_run(&mut report, session);
    Ok(report)
}

/// The configuration of an in-process target engine for `config`'s initiator: the next device id. With P2P
/// handshake both engines are named after their own RPC port; with a metadata store the name is taken as given, so
/// the target gets Ascend's per-device form `host:port:npu_N`.
pub(crate) fn target_config(config: &crate::config::EngineConfig) -> crate::config::EngineConfig {
    let mut target = config.clone();
    if !config.metadata_server.eq_ignore_ascii_case("P2PHANDSHAKE") {
        target.local_hostname = format!("{}:npu_{}", config.local_hostname, config.aiv.device_id + 1);
    }
    target.aiv.device_id = config.aiv.device_id + 1;
    target
}

fn target_segment_run(
    initiator: &TransferEngine,
    target_name: &str,
    params: &BenchParams,
    local_base: u64,
    target_base: u64,
) -> Result<BenchOutcome> {
    let segment = initiator.open_segment(target_name)?;
    run_initiator(initiator, params, segment, local_base, target_base)
}

/// Writes `length` bytes of `byte(offset)` to device memory at `addr`, 4 MiB at a time, through the device's
/// copy path (H2D).
pub(crate) fn fill_device(
    device: &AivDevice,
    addr: u64,
    length: usize,
    byte: impl Fn(usize) -> u8,
) -> std::result::Result<(), crate::device::DeviceError> {
    const CHUNK: usize = 4 << 20;
    let mut chunk = Vec::with_capacity(CHUNK.min(length));
    let mut offset = 0;
    while offset < length {
        let n = CHUNK.min(length - offset);
        chunk.clear();
        chunk.extend((offset..offset + n).map(&byte));
        device.write(addr + offset as u64, &chunk)?;
        offset += n;
    }
    Ok(())
}

/// The memcpy reference of a run: the same blocks copied between two Host buffers of `span` bytes (device memory is
/// not the Host's to copy with memcpy), for at most two seconds.
fn memcpy_reference_on_host(span: usize, params: &BenchParams) -> Result<f64> {
    let source = host_buffer(span, 0xA5)?;
    let mut destination = host_buffer(span, 0x5A)?;
    let reference_time = params.duration.min(Duration::from_secs(2));
    Ok(memcpy_reference(&source, &mut destination, params, reference_time))
}

/// The byte a served aiv target holds at `offset` before any peer writes: lets a peer process check that what it
/// reads came from the target's device memory.
pub fn target_pattern(offset: u64) -> u8 {
    (offset.wrapping_mul(7).wrapping_add(13) % 251) as u8
}

/// The `aiv` target side for another process's initiator: allocates `buffer_size` bytes of device memory on this
/// engine's device, fills it with [`target_pattern`], registers it (the descriptor then advertises the device's
/// export endpoint), calls `ready` with its address, serves until `stop` is set or `params.duration` has passed,
/// then withdraws it.
pub fn serve_aiv_target(
    engine: &TransferEngine,
    params: &BenchParams,
    stop: &AtomicBool,
    ready: impl FnOnce(u64),
) -> Result<()> {
    let device = engine.device()?;
    let buffer = device.allocate(params.buffer_size).map_err(|error| EngineError::InvalidArgument {
        operation: "bench",
        reason: format!("{error} (lower --buffer_size or raise \"aiv\": {{\"hbm_size\": ...}})"),
    })?;
    let size = usize::try_from(buffer.len())
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    fill_device(&device, buffer.addr(), size, |offset| target_pattern(offset as u64)).map_err(|error| {
        EngineError::InvalidArgument { operation: "bench: fill device memory", reason: error.to_string() }
    })?;
    // SAFETY: the buffer outlives the registration, withdrawn below before it drops.
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location())? };
    ready(buffer.addr());
    serve_until(params, stop);
    engine.unregister_memory(buffer.addr())?;
    Ok(())
}

/// Runs the `aiv` initiator against `segment`, an aiv target of another process: `buffer_size` bytes of this
/// engine's device memory are registered, the workload targets the segment's first buffer, then the memcpy reference
/// over the local buffer and a host scratch buffer of the same size.
pub fn run_aiv_against_segment(engine: &TransferEngine, params: &BenchParams, segment: &str) -> Result<LoopbackReport> {
    params.validate()?;
    let device = engine.device()?;
    let local = device.allocate(params.buffer_size).map_err(|error| EngineError::InvalidArgument {
        operation: "bench",
        reason: format!("{error} (lower --buffer_size or raise \"aiv\": {{\"hbm_size\": ...}})"),
    })?;
    let size = usize::try_from(local.len())
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    let span = (params.batch_size as u64 * params.threads as u64 * params.block_size).min(params.buffer_size) as usize;
    fill_device(&device, local.addr(), span, |_| 0xA5).map_err(|error| EngineError::InvalidArgument {
        operation: "bench: fill device memory",
        reason: error.to_string(),
    })?;
    let target_base = engine.get_first_buffer_address(segment)?;
    // SAFETY: the buffer outlives every batch (run_following waits for each) and the registration is withdrawn before
    // it drops.
    unsafe { engine.register_memory(local.addr(), local.len(), &device.location())? };
    let outcome = run_following(engine, params, segment, local.addr(), target_base);
    engine.unregister_memory(local.addr())?;
    let outcome = outcome?;
    let memcpy_bytes_per_second = memcpy_reference_on_host(span.min(size), params)?;
    Ok(LoopbackReport { outcome, memcpy_bytes_per_second })
}
