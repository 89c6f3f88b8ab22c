//! The `ubshmem` baseline: Mooncake's UBShmem shape (docs/hardware.md section 7) over the same imported windows as `aiv`.
//!
//! Data path: the engine's validated [`Transfer`] -> the submitting thread relocates both addresses through the
//! peer's imported windows ([`PeerWindows`]: export/import with offset relocation) and queues one job per transfer ->
//! a Host worker of the pool (`ubshmem_workers`, default 8) takes it, borrows up to [`STREAMS_PER_TRANSFER`] streams
//! from the stream pool (`ubshmem_streams`, default 32), splits the transfer across them, issues one asynchronous
//! copy per piece ([`CopyStream::memcpy_async`]; the runtime turns it into descriptors and submits them), then
//! synchronises every stream it used (bounded by `baseline_timeout`) and only then finishes the task. It is the `cann`
//! backend's `CannStream`: `aclrtMemcpyAsync` on an ACL stream (on the twin runtime an in-order queue run by a stream
//! worker thread; on an NPU unverified on hardware).
//!
//! Evidence (docs/evidence.md, "Host paths"): every count comes from the `-sys` loader tables' per-thread counters
//! ([`ascendcl_sys::calls`]), read on the thread that made the calls, before and after the work done for the
//! transfer: `descriptors_written` and `doorbells_rung` are the copy calls made for it (`aclrtMemcpyAsync`, and the
//! synchronous `aclrtMemcpy` of an unaligned head: each is the Host runtime writing a copy task and submitting it to
//! the stream's engine), `completion_seen` the synchronisation calls (`aclrtSynchronizeStream*`, plus each
//! synchronous `aclrtMemcpy`, which returns after its own completion), all `Source::HostCalls`, window 1.
//! `host_device_api_calls` is every counted call the worker made while carrying it plus those the submitting thread
//! made while resolving it (a window import). The transport's [`UbshmemCounters`] are kept for their readers; the
//! evidence does not come from them.
//!
//! Owns its streams and workers; touches no engine state beyond the task slots of the transfers it accepted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::window::{PeerWindows, Resolved};
use super::Transport;
use crate::config::AivOptions;
use crate::cpu_time::{thread_cpu_time_ns, CpuCarry, Section};
use crate::device::{CopyStream, CopyStreams, DeviceError};
use crate::evidence::{Act, Source, TransferEvidence};
use crate::kernel_abi::{even_piece_count, even_pieces};
use crate::transfer::{FailureKind, TaskSlot, Transfer, TransferFailure};

/// Streams one transfer is spread over (Mooncake's UBShmem uses 4).
pub const STREAMS_PER_TRANSFER: usize = 4;
/// Pieces are at least this long, so a small transfer uses fewer streams.
pub const MIN_PIECE_BYTES: u64 = 64 << 10;

/// Counters of the ubshmem transport as a whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UbshmemCounters {
    /// Transfers carried.
    pub transfers: u64,
    /// `memcpy_async` calls.
    pub copies: u64,
    /// Stream synchronisations.
    pub synchronisations: u64,
    /// Transfers that failed or timed out.
    pub failures: u64,
}

#[derive(Debug)]
struct Job {
    slot: Arc<TaskSlot>,
    src: u64,
    dst: u64,
    length: u64,
    submit_cpu_ns: u64,
    /// Counted device-API calls the submitting thread made while resolving this transfer.
    submit_calls: u64,
}

/// The loader-table counters the evidence reads (`None` only if `AclApi` stopped declaring a name: then 0).
#[derive(Clone, Copy, Debug)]
struct AclCounters {
    memcpy_async: Option<ascendcl_sys::calls::Counter>,
    memcpy: Option<ascendcl_sys::calls::Counter>,
    synchronize: Option<ascendcl_sys::calls::Counter>,
    synchronize_with_timeout: Option<ascendcl_sys::calls::Counter>,
}

/// The calling thread's counts of the calls the evidence distinguishes, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CallMark {
    total: u64,
    memcpy_async: u64,
    memcpy: u64,
    synchronize: u64,
}

impl AclCounters {
    fn new() -> Self {
        use ascendcl_sys::AclApi;
        AclCounters {
            memcpy_async: AclApi::counter("aclrtMemcpyAsync"),
            memcpy: AclApi::counter("aclrtMemcpy"),
            synchronize: AclApi::counter("aclrtSynchronizeStream"),
            synchronize_with_timeout: AclApi::counter("aclrtSynchronizeStreamWithTimeout"),
        }
    }

    /// This thread's counts now: thread-local loads only.
    fn mark(&self) -> CallMark {
        let read = |counter: Option<ascendcl_sys::calls::Counter>| counter.map_or(0, |counter| counter.thread());
        CallMark {
            total: ascendcl_sys::calls::thread_total(),
            memcpy_async: read(self.memcpy_async),
            memcpy: read(self.memcpy),
            synchronize: read(self.synchronize) + read(self.synchronize_with_timeout),
        }
    }
}

impl CallMark {
    /// The calls made between `earlier` and this mark (both on one thread).
    fn since(&self, earlier: &CallMark) -> CallMark {
        CallMark {
            total: self.total.saturating_sub(earlier.total),
            memcpy_async: self.memcpy_async.saturating_sub(earlier.memcpy_async),
            memcpy: self.memcpy.saturating_sub(earlier.memcpy),
            synchronize: self.synchronize.saturating_sub(earlier.synchronize),
        }
    }
}

#[derive(Debug, Default)]
struct Queue {
    jobs: VecDeque<Job>,
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    /// The runtime of the device, for the records.
    runtime: crate::evidence::RuntimeLabel,
    windows: Arc<PeerWindows>,
    timeout: Duration,
    queue: Mutex<Queue>,
    queued: Condvar,
    /// The stream pool: all streams, and the indices of those not lent to a worker.
    streams: Vec<Arc<dyn CopyStream>>,
    free_streams: Mutex<Vec<usize>>,
    stream_returned: Condvar,
    transfers: AtomicU64,
    copies: AtomicU64,
    synchronisations: AtomicU64,
    failures: AtomicU64,
    /// Submit hand-offs not charged yet (see [`CpuCarry`]).
    carry: CpuCarry,
    /// The loader-table counters the evidence is read from.
    acl_counters: AclCounters,
}

#[derive(Debug)]
struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

/// The ubshmem transport of one device.
#[derive(Debug)]
pub struct UbshmemTransport {
    device: Arc<dyn CopyStreams>,
    /// The device's import cache and peer state, shared with its other paths.
    windows: Arc<PeerWindows>,
    workers: u32,
    stream_count: u32,
    timeout: Duration,
    /// Streams and workers, started on the first submit (so engines that never use ubshmem pay nothing).
    pool: Mutex<Option<Result<Pool, String>>>,
}

impl UbshmemTransport {
    /// The transport for `device`, relocating through the device's `windows` (shared with its other paths, so a peer
    /// found lost fails here at once); its streams and workers start with the first transfer.
    pub fn new(device: Arc<dyn CopyStreams>, windows: Arc<PeerWindows>, options: &AivOptions) -> Self {
        UbshmemTransport {
            device,
            windows,
            workers: options.ubshmem_workers.max(1),
            stream_count: options.ubshmem_streams.max(STREAMS_PER_TRANSFER as u32),
            timeout: options.baseline_timeout,
            pool: Mutex::new(None),
        }
    }

    /// Transport-wide counters (zero before the first transfer).
    pub fn counters(&self) -> UbshmemCounters {
        let pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        match pool.as_ref() {
            Some(Ok(pool)) => {
                let s = &pool.shared;
                UbshmemCounters {
                    transfers: s.transfers.load(Ordering::Relaxed),
                    copies: s.copies.load(Ordering::Relaxed),
                    synchronisations: s.synchronisations.load(Ordering::Relaxed),
                    failures: s.failures.load(Ordering::Relaxed),
                }
            }
            _ => UbshmemCounters::default(),
        }
    }

    fn start_pool(&self) -> Result<Pool, String> {
        let streams = (0..self.stream_count)
            .map(|_| self.device.create_stream())
            .collect::<Result<Vec<_>, DeviceError>>()
            .map_err(|e| e.to_string())?;
        let shared = Arc::new(Shared {
            runtime: self.device.runtime_label(),
            windows: self.windows.clone(),
            timeout: self.timeout,
            queue: Mutex::new(Queue::default()),
            queued: Condvar::new(),
            free_streams: Mutex::new((0..streams.len()).collect()),
            streams,
            stream_returned: Condvar::new(),
            transfers: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            synchronisations: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            carry: CpuCarry::default(),
            acl_counters: AclCounters::new(),
        });
        let mut workers = Vec::new();
        for index in 0..self.workers {
            let worker = shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("ubshmem-{}.{index}", self.device.device_id()))
                .spawn(move || worker.run())
                .map_err(|e| format!("start ubshmem worker: {e}"))?;
            workers.push(thread);
        }
        Ok(Pool { shared, workers })
    }
}

impl Transport for UbshmemTransport {
    fn name(&self) -> &'static str {
        "ubshmem"
    }

    fn submit(&self, transfers: Vec<Transfer>) {
        // A section that never sleeps (see cpu_time::Section): queue writes and wake-ups only.
        let section = Section::start();
        let shared = {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            if pool.is_none() {
                // Once: starts the workers and the stream pool (may block; see cpu_time::may_sleep).
                *pool = Some(crate::cpu_time::may_sleep(|| self.start_pool()));
            }
            match pool.as_ref() {
                Some(Ok(pool)) => pool.shared.clone(),
                Some(Err(reason)) => {
                    for transfer in transfers {
                        transfer.slot.fail(TransferFailure::new("ubshmem", FailureKind::Device, reason.clone()));
                    }
                    return;
                }
                None => return,
            }
        };
        let mut jobs = Vec::with_capacity(transfers.len());
        let mut last_peer = None;
        for transfer in transfers {
            // A resolution may call the device (a window import): those calls are made for this transfer.
            let calls_before = ascendcl_sys::calls::thread_total();
            let resolved = shared.windows.resolve_with(&transfer, &mut last_peer);
            let submit_calls = ascendcl_sys::calls::thread_total().saturating_sub(calls_before);
            match resolved {
                Ok(Resolved { src, dst, .. }) => jobs.push(Job {
                    slot: transfer.slot,
                    src,
                    dst,
                    length: transfer.length,
                    submit_cpu_ns: 0,
                    submit_calls,
                }),
                Err(error) => {
                    transfer.slot.fail(error.failure("ubshmem"));
                }
            }
        }
        let share_mark = section.elapsed_ns();
        let share = share_mark / jobs.len().max(1) as u64;
        for job in &mut jobs {
            job.submit_cpu_ns = share;
        }
        let count = jobs.len();
        shared.queue.lock().unwrap_or_else(|p| p.into_inner()).jobs.extend(jobs);
        // One worker per job: waking the whole pool for one transfer would charge every worker a wake-up.
        for _ in 0..count.min(self.workers as usize) {
            shared.queued.notify_one();
        }
        // The hand-off to the workers (queue and wake-ups) is charged too.
        shared.carry.add(section.elapsed_ns().saturating_sub(share_mark));
    }
}

impl Drop for UbshmemTransport {
    fn drop(&mut self) {
        let Some(Ok(pool)) = self.pool.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        pool.shared.queue.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        pool.shared.queued.notify_all();
        for worker in pool.workers {
            // Bounded: a worker's longest wait is its stream synchronisations (`baseline_timeout` each).
            let _ = worker.join();
        }
        for job in pool.shared.queue.lock().unwrap_or_else(|p| p.into_inner()).jobs.drain(..) {
            job.slot.fail(TransferFailure::new("ubshmem", FailureKind::Shutdown, "transport shut down"));
        }
    }
}

impl Shared {
    fn run(&self) {
        // All of this worker's CPU time (waits for work included) is charged to the next transfer it carries.
        let mut cpu_mark = thread_cpu_time_ns();
        loop {
            let job = {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if queue.stop {
                        return;
                    }
                    if let Some(job) = queue.jobs.pop_front() {
                        break job;
                    }
                    queue =
                        self.queued.wait_timeout(queue, Duration::from_millis(20)).unwrap_or_else(|p| p.into_inner()).0;
                }
            };
            self.carry(job, &mut cpu_mark);
        }
    }

    /// Borrows `count` streams, waiting at most until `deadline`.
    fn borrow_streams(&self, count: usize, deadline: Instant) -> Option<Vec<usize>> {
        let mut free = self.free_streams.lock().unwrap_or_else(|p| p.into_inner());
        while free.len() < count {
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            free = self.stream_returned.wait_timeout(free, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        let keep = free.len() - count;
        Some(free.split_off(keep))
    }

    fn return_streams(&self, streams: Vec<usize>) {
        self.free_streams.lock().unwrap_or_else(|p| p.into_inner()).extend(streams);
        self.stream_returned.notify_all();
    }

    fn carry(&self, job: Job, cpu_mark: &mut u64) {
        let cpu_started = *cpu_mark;
        let pieces = even_piece_count(job.length, MIN_PIECE_BYTES, STREAMS_PER_TRANSFER);
        // Every act is read from this thread's loader-table counters across the work done for this job.
        let calls_before = self.acl_counters.mark();
        let evidence = |cpu: u64| {
            let made = self.acl_counters.mark().since(&calls_before);
            // A copy call is the Host runtime writing the copy's task and submitting it to the stream's engine; a
            // synchronous aclrtMemcpy also returns only after its completion.
            let copies = made.memcpy_async + made.memcpy;
            let mut evidence = TransferEvidence::new("ubshmem", self.runtime);
            evidence.descriptors_written = Act::host(Source::HostCalls, copies);
            evidence.doorbells_rung = Act::host(Source::HostCalls, copies);
            evidence.completion_seen = Act::host(Source::HostCalls, made.synchronize + made.memcpy);
            evidence.host_device_api_calls = made.total + job.submit_calls;
            evidence.descriptors = copies;
            evidence.doorbells = copies;
            evidence.host_cpu_ns = job.submit_cpu_ns + cpu;
            evidence
        };
        let carried = self.carry.take();
        let Some(streams) = self.borrow_streams(pieces, Instant::now() + self.timeout) else {
            self.failures.fetch_add(1, Ordering::Relaxed);
            *cpu_mark = thread_cpu_time_ns();
            let cpu = cpu_mark.saturating_sub(cpu_started) + carried;
            job.slot.fail_with_evidence(
                TransferFailure::new(
                    "ubshmem",
                    FailureKind::Resources,
                    format!("no {pieces} free streams in the pool within {:?}", self.timeout),
                ),
                evidence(cpu),
            );
            return;
        };
        let mut failure: Option<TransferFailure> = None;
        let mut used = 0;
        for (&stream, (offset, length)) in
            streams.iter().zip(even_pieces(job.length, MIN_PIECE_BYTES, STREAMS_PER_TRANSFER))
        {
            self.copies.fetch_add(1, Ordering::Relaxed);
            used += 1;
            if let Err(error) = self.streams[stream].memcpy_async(job.dst + offset, job.src + offset, length) {
                failure = Some(TransferFailure::new("ubshmem", FailureKind::Device, "memcpy_async").with_source(error));
                break;
            }
        }
        // Completion only after every stream used is synchronised (even after a failed issue: what was queued must
        // finish before the streams go back to the pool).
        for &stream in &streams[..used] {
            self.synchronisations.fetch_add(1, Ordering::Relaxed);
            match self.streams[stream].synchronize(self.timeout) {
                Ok(()) => {}
                Err(error @ DeviceError::Timeout { waited, .. }) => {
                    failure.get_or_insert(TransferFailure::new(
                        "ubshmem",
                        FailureKind::Timeout,
                        format!(
                            "stream {stream} of the pool: synchronisation did not finish within {waited:?} ({error})"
                        ),
                    ));
                }
                Err(error) => {
                    failure.get_or_insert(
                        TransferFailure::new("ubshmem", FailureKind::Device, format!("stream {stream} of the pool"))
                            .with_source(error),
                    );
                }
            }
        }
        // A stream that timed out still holds its copies; the next synchronisation on it waits for them too.
        self.return_streams(streams);
        self.transfers.fetch_add(1, Ordering::Relaxed);
        *cpu_mark = thread_cpu_time_ns();
        let cpu = cpu_mark.saturating_sub(cpu_started) + carried;
        match failure {
            None => {
                job.slot.complete(job.length, evidence(cpu));
            }
            Some(failure) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                job.slot.fail_with_evidence(failure, evidence(cpu));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_the_evidence_reads_is_declared_by_the_acl_table() {
        let counters = AclCounters::new();
        for (name, counter) in [
            ("aclrtMemcpyAsync", counters.memcpy_async),
            ("aclrtMemcpy", counters.memcpy),
            ("aclrtSynchronizeStream", counters.synchronize),
            ("aclrtSynchronizeStreamWithTimeout", counters.synchronize_with_timeout),
        ] {
            assert_eq!(counter.map(|counter| counter.function()), Some(name));
        }
    }
}
