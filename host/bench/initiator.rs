//! The initiator side: the batches each thread submits (plain, following a restarting target, prepared lists,
//! layerwise), and the measuring frame around the threads (evidence, latencies, occupancy, whole-process Host CPU).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::outcome::{latency_histogram, BenchOutcome, EvidenceTotals};
use super::params::BenchParams;
use crate::engine::TransferEngine;
use crate::error::{EngineError, Result};
use crate::transfer::{BatchId, SegmentId, TransferRequest, TransferState};

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
