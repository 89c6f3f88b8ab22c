//! The `adxl` baseline: Host-submitted one-sided transfers with ADXL's shape (docs/hardware.md section 7).
//!
//! Data path on the twin: the engine's validated [`Transfer`] -> the submitting thread translates both addresses
//! through the same imported windows as `aiv` ([`PeerWindows`]) and queues a job -> the adxl Host thread takes the
//! queued jobs, writes real 64-byte SDMA SQEs into the SQ of a Host-owned channel
//! ([`DeviceBackend::open_host_channel`]), appends a flag SQE, stores the new tail into the doorbell register itself,
//! then polls the flag itself (bounded by `baseline_timeout`) and finishes the tasks. Nothing runs on the AIV cores.
//!
//! ADXL's behaviour made visible: the first transfer to a peer engine "connects" (imports its memory; a failure is
//! NOT_CONNECTED), transfers shorter than `adxl_pool_threshold` are staged through an internal device buffer pool
//! (one extra SDMA copy each, counted in [`AdxlCounters::pooled_transfers`] and in the transfer's descriptors), and
//! every outcome carries an ADXL status code ([`AdxlStatus`]) in its reason.
//!
//! On the `cann` device backend (feature `cann`) the same transport submits through the real HiXL library instead
//! (`hixl` submodule: a HiXL server per device, a client per remote engine, batch put/get, status polling); the
//! channel, pool and SQEs below are the twin's path.
//!
//! Owns: its Host channel, the pool buffer and the Host thread. Touches no engine state beyond the task slots of the
//! transfers it accepted. Every wait is bounded: the flag poll by `baseline_timeout`, queue waits by 20 ms.

mod hixl;

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zerocopy::IntoBytes;

use super::window::{Peer, PeerWindows, ResolveError, Resolved};
use super::Transport;
use crate::config::{AivOptions, Environment};
use crate::cpu_time::{thread_cpu_time_ns, CpuCarry, Section};
use crate::device::{DeviceBackend, DeviceBuffer, HostChannel};
use crate::evidence::{Actor, TransferEvidence};
use crate::kernel_abi::{
    piece_count, pieces, ChannelRecord, FlagArea, SdmaSqe, SqIndex, SDMA_DOORBELL_OFFSET, SDMA_MAX_SQE_BYTES, SQE_BYTES,
};
use crate::transfer::{
    CodeFamily, FailureKind, Segment, SegmentId, TaskSlot, Transfer, TransferFailure, TransferState,
};

/// An ADXL status code (`adxl::Status`), decoded totally.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct AdxlStatus(pub i32);

impl AdxlStatus {
    /// The transfer completed.
    pub const SUCCESS: AdxlStatus = AdxlStatus(0);
    /// An argument was refused.
    pub const PARAM_INVALID: AdxlStatus = AdxlStatus(103_900);
    /// The transfer did not complete in time.
    pub const TIMEOUT: AdxlStatus = AdxlStatus(103_901);
    /// The remote engine is not connected (its memory could not be imported).
    pub const NOT_CONNECTED: AdxlStatus = AdxlStatus(103_902);
    /// The device reported an error.
    pub const FAILED: AdxlStatus = AdxlStatus(503_900);

    /// The constant's name.
    pub fn name(self) -> String {
        match self {
            AdxlStatus::SUCCESS => "SUCCESS".into(),
            AdxlStatus::PARAM_INVALID => "PARAM_INVALID".into(),
            AdxlStatus::TIMEOUT => "TIMEOUT".into(),
            AdxlStatus::NOT_CONNECTED => "NOT_CONNECTED".into(),
            AdxlStatus::FAILED => "FAILED".into(),
            AdxlStatus(other) => format!("status {other}"),
        }
    }

    /// The engine's task state for this status.
    pub fn task_state(self) -> TransferState {
        match self {
            AdxlStatus::SUCCESS => TransferState::Completed,
            AdxlStatus::TIMEOUT => TransferState::Timeout,
            _ => TransferState::Failed,
        }
    }

    /// The task failure of a transfer that ended with this status; renders as `adxl: <NAME> (<code>): <detail>`.
    pub fn failure(self, detail: impl Into<String>) -> TransferFailure {
        let kind = match self {
            AdxlStatus::TIMEOUT => FailureKind::Timeout,
            AdxlStatus::PARAM_INVALID => FailureKind::InvalidRequest,
            AdxlStatus::NOT_CONNECTED => FailureKind::Unreachable,
            _ => FailureKind::Device,
        };
        self.failure_of(kind, detail)
    }

    /// As [`AdxlStatus::failure`], of a kind the status alone does not tell (a shutdown, a lost peer).
    pub fn failure_of(self, kind: FailureKind, detail: impl Into<String>) -> TransferFailure {
        TransferFailure::new("adxl", kind, detail).with_code(CodeFamily::Adxl, i64::from(self.0), self.name())
    }

    /// The status a task failure of this transport carries; FAILED for a failure without an ADXL code.
    pub fn of_failure(failure: &TransferFailure) -> AdxlStatus {
        failure
            .code_of(CodeFamily::Adxl)
            .and_then(|code| i32::try_from(code).ok())
            .map_or(AdxlStatus::FAILED, AdxlStatus)
    }
}

/// Counters of the adxl transport as a whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdxlCounters {
    /// Peer engines connected (memory imported).
    pub connects: u64,
    /// Groups submitted: one doorbell and one flag poll each.
    pub groups: u64,
    /// Transfers staged through the buffer pool.
    pub pooled_transfers: u64,
    /// Bytes copied into or out of the pool (the extra copy).
    pub staged_bytes: u64,
    /// Groups whose flag did not appear in time.
    pub timeouts: u64,
    /// Groups stopped by an SDMA exception.
    pub failures: u64,
}

/// Pool slots: each holds one staged transfer of at most `adxl_pool_threshold` bytes.
const POOL_SLOTS: u64 = 16;

#[derive(Debug)]
struct Job {
    slot: Arc<TaskSlot>,
    src: u64,
    dst: u64,
    length: u64,
    pooled: bool,
    submit_cpu_ns: u64,
    api_calls: u64,
}

impl Job {
    fn sqes(&self) -> u64 {
        if self.pooled {
            2
        } else {
            piece_count(self.length, SDMA_MAX_SQE_BYTES)
        }
    }
}

#[derive(Debug, Default)]
struct Queue {
    jobs: VecDeque<Job>,
    stop: bool,
}

#[derive(Debug, Default)]
struct Counters {
    connects: AtomicU64,
    groups: AtomicU64,
    pooled_transfers: AtomicU64,
    staged_bytes: AtomicU64,
    timeouts: AtomicU64,
    failures: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    device: Arc<dyn DeviceBackend>,
    windows: Arc<PeerWindows>,
    pool_threshold: u64,
    timeout: Duration,
    sq_depth: u32,
    queue: Mutex<Queue>,
    queued: Condvar,
    connected: Mutex<HashSet<String>>,
    counters: Counters,
    /// Submit hand-offs not charged yet (see [`CpuCarry`]).
    carry: CpuCarry,
    /// Where the HiXL server listens (cann backend; `aiv.hixl_host` / `aiv.hixl_port`).
    hixl_host: Option<String>,
    hixl_port: u16,
}

/// The adxl transport of one device.
#[derive(Debug)]
pub struct AdxlTransport {
    shared: Arc<Shared>,
    /// On the `cann` backend: the HiXL library submits instead of a Host-owned channel.
    hixl: Option<hixl::HixlPath>,
    /// The Host thread, started on the first submit (so engines that never use adxl pay nothing).
    worker: Mutex<Option<Result<JoinHandle<()>, String>>>,
}

/// What the Host thread owns.
#[derive(Debug)]
struct Worker {
    shared: Arc<Shared>,
    channel: Arc<dyn HostChannel>,
    pool: Option<DeviceBuffer>,
    sq: SqIndex,
    sequence: u64,
    /// Thread CPU time already charged to transfers: all of this thread's time (waits for work included) is charged
    /// to the next group it carries.
    cpu_mark: u64,
}

impl AdxlTransport {
    /// The transport for `device`, relocating through the device's `windows` (shared with its other paths, so a peer
    /// found lost fails here at once); its channel, pool and thread start with the first transfer.
    pub fn new(device: Arc<dyn DeviceBackend>, windows: Arc<PeerWindows>, options: &AivOptions) -> Self {
        let shared = Arc::new(Shared {
            windows,
            device,
            pool_threshold: options.adxl_pool_threshold,
            timeout: options.baseline_timeout,
            sq_depth: options.sq_depth,
            queue: Mutex::new(Queue::default()),
            queued: Condvar::new(),
            connected: Mutex::new(HashSet::new()),
            counters: Counters::default(),
            carry: CpuCarry::default(),
            hixl_host: options.hixl_host.clone(),
            hixl_port: options.hixl_port,
        });
        // The submission backend: the device's HiXL library where it has one (the cann backend, on the vendor's
        // runtime or the twin's), else a Host-owned SDMA channel (the legacy twin).
        let hixl = shared.device.hixl().map(|api| hixl::HixlPath::new(shared.clone(), api));
        AdxlTransport { shared, hixl, worker: Mutex::new(None) }
    }

    /// Where this device's HiXL server listens (`"ip:port"`), advertised to peers; `None` on the twin or when the
    /// server could not start.
    pub fn hixl_server(&self) -> Option<String> {
        if let Some(hixl) = &self.hixl {
            return hixl.server_address();
        }
        None
    }

    /// Transport-wide counters.
    pub fn counters(&self) -> AdxlCounters {
        let c = &self.shared.counters;
        AdxlCounters {
            connects: c.connects.load(Ordering::Relaxed),
            groups: c.groups.load(Ordering::Relaxed),
            pooled_transfers: c.pooled_transfers.load(Ordering::Relaxed),
            staged_bytes: c.staged_bytes.load(Ordering::Relaxed),
            timeouts: c.timeouts.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
        }
    }

    /// Starts the Host thread if needed; the error says why it cannot run.
    fn ensure_worker(&self) -> Result<(), String> {
        let mut worker = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        if worker.is_none() {
            // Once: opens a channel and starts a thread (may block; see cpu_time::may_sleep).
            *worker = Some(crate::cpu_time::may_sleep(|| self.start_worker()));
        }
        match worker.as_ref() {
            Some(Ok(_)) => Ok(()),
            Some(Err(reason)) => Err(reason.clone()),
            None => Err("adxl worker not started".into()),
        }
    }

    fn start_worker(&self) -> Result<JoinHandle<()>, String> {
        let shared = &self.shared;
        let channel = shared.device.open_host_channel(shared.sq_depth).map_err(|e| e.to_string())?;
        let pool = match shared.pool_threshold {
            0 => None,
            threshold => Some(shared.device.allocate(threshold * POOL_SLOTS).map_err(|e| e.to_string())?),
        };
        let sq = SqIndex::new(shared.sq_depth).ok_or_else(|| format!("sq_depth {} is below 2", shared.sq_depth))?;
        let mut worker = Worker { shared: shared.clone(), channel, pool, sq, sequence: 0, cpu_mark: 0 };
        std::thread::Builder::new()
            .name(format!("adxl-host-{}", shared.device.device_id()))
            .spawn(move || worker.run())
            .map_err(|e| format!("start adxl Host thread: {e}"))
    }

    /// Resolves one transfer into a job, or finishes it with the ADXL status that refuses it.
    fn job(&self, transfer: Transfer, last_peer: &mut Option<(Arc<Segment>, Arc<Peer>)>) -> Option<Job> {
        let shared = &self.shared;
        match shared.windows.resolve_with(&transfer, last_peer) {
            Ok(Resolved { src, dst, .. }) => {
                let mut api_calls = 0;
                if transfer.target.id != SegmentId::LOCAL {
                    let mut connected = shared.connected.lock().unwrap_or_else(|p| p.into_inner());
                    if connected.insert(transfer.target.name.clone()) {
                        // The first transfer to a peer pays for Connect (the import of its memory).
                        shared.counters.connects.fetch_add(1, Ordering::Relaxed);
                        api_calls += 1;
                    }
                }
                let capacity = u64::from(shared.sq_depth.saturating_sub(2));
                let job = Job {
                    slot: transfer.slot,
                    src,
                    dst,
                    length: transfer.length,
                    pooled: transfer.length < shared.pool_threshold,
                    submit_cpu_ns: 0,
                    api_calls,
                };
                if job.sqes() > capacity {
                    let detail = format!(
                        "{} bytes need {} SQEs, more than one group of the {}-entry SQ holds",
                        job.length,
                        job.sqes(),
                        shared.sq_depth
                    );
                    job.slot.fail(AdxlStatus::PARAM_INVALID.failure(detail));
                    return None;
                }
                Some(job)
            }
            Err(error) => {
                let failure = match error {
                    ResolveError::Range(_) => AdxlStatus::PARAM_INVALID.failure(error.reason()),
                    ResolveError::Import(_) => AdxlStatus::NOT_CONNECTED.failure(error.reason()),
                    ResolveError::Lost(_) => {
                        AdxlStatus::NOT_CONNECTED.failure_of(FailureKind::PeerLost, error.reason())
                    }
                };
                transfer.slot.fail(failure);
                None
            }
        }
    }
}

impl Transport for AdxlTransport {
    fn name(&self) -> &'static str {
        "adxl"
    }

    /// `TransferAsync`: queue the list; the Host thread submits it and polls its completion.
    fn submit(&self, transfers: Vec<Transfer>) {
        if let Some(hixl) = &self.hixl {
            hixl.submit(transfers);
            return;
        }
        // A section that never sleeps (see cpu_time::Section): SQ-list checks, a queue write and a wake-up.
        let section = Section::start();
        if let Err(reason) = self.ensure_worker() {
            for transfer in transfers {
                transfer.slot.fail(AdxlStatus::FAILED.failure(reason.clone()));
            }
            return;
        }
        let mut last_peer = None;
        let mut jobs: Vec<Job> =
            transfers.into_iter().filter_map(|transfer| self.job(transfer, &mut last_peer)).collect();
        let share_mark = section.elapsed_ns();
        let share = share_mark / jobs.len().max(1) as u64;
        for job in &mut jobs {
            job.submit_cpu_ns = share;
        }
        let mut queue = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.jobs.extend(jobs);
        drop(queue);
        self.shared.queued.notify_one();
        // The hand-off to the Host thread (queue and wake-up) is charged too.
        self.shared.carry.add(section.elapsed_ns().saturating_sub(share_mark));
    }
}

impl Drop for AdxlTransport {
    fn drop(&mut self) {
        drop(self.hixl.take());
        self.shared.queue.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        self.shared.queued.notify_all();
        if let Some(Ok(thread)) = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // Bounded: the thread's longest wait is one flag poll of `baseline_timeout`.
            let _ = thread.join();
        }
        for job in self.shared.queue.lock().unwrap_or_else(|p| p.into_inner()).jobs.drain(..) {
            job.slot.fail(AdxlStatus::FAILED.failure_of(FailureKind::Shutdown, "transport shut down"));
        }
    }
}

impl Worker {
    fn run(&mut self) {
        self.cpu_mark = thread_cpu_time_ns();
        loop {
            let jobs: Vec<Job> = {
                let mut queue = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
                while queue.jobs.is_empty() && !queue.stop {
                    queue = self
                        .shared
                        .queued
                        .wait_timeout(queue, Duration::from_millis(20))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                if queue.stop {
                    return;
                }
                queue.jobs.drain(..).collect()
            };
            self.submit_groups(jobs);
        }
    }

    /// Splits the jobs into groups that fit the SQ (and the pool) and runs each.
    fn submit_groups(&mut self, jobs: Vec<Job>) {
        // One slot of the SQ stays empty (wrapped indices) and one holds the flag SQE.
        let capacity = u64::from(self.sq.depth().saturating_sub(2));
        let pool_slots = if self.pool.is_some() { POOL_SLOTS } else { 0 };
        let mut group: Vec<Job> = Vec::new();
        let (mut sqes, mut pooled) = (0u64, 0u64);
        for job in jobs {
            let fits = sqes + job.sqes() <= capacity && (!job.pooled || pooled < pool_slots);
            if !fits && !group.is_empty() {
                self.run_group(std::mem::take(&mut group));
                (sqes, pooled) = (0, 0);
            }
            sqes += job.sqes();
            pooled += u64::from(job.pooled);
            group.push(job);
        }
        if !group.is_empty() {
            self.run_group(group);
        }
    }

    fn record(&self) -> *mut ChannelRecord {
        self.channel.info().record_addr as *mut ChannelRecord
    }

    fn flag_word(&self, offset: usize) -> &AtomicU64 {
        let word = (self.channel.info().flag_area_addr as usize + offset) as *mut u64;
        // SAFETY: the flag area is a live, 64-byte aligned `FlagArea` of the device workspace (valid as long as the
        // device, which this worker keeps alive); the SDMA engine writes the receive word atomically.
        unsafe { AtomicU64::from_ptr(word) }
    }

    /// Builds the group's SQEs, rings the doorbell once, polls the flag, finishes every task.
    fn run_group(&mut self, group: Vec<Job>) {
        let counters = &self.shared.counters;
        counters.groups.fetch_add(1, Ordering::Relaxed);
        let record = self.record();
        // SAFETY: the record is this channel's live `ChannelRecord`; only this thread writes its tail, the engine
        // writes sq_head (read atomically elsewhere). Plain reads of the Host-owned fields are not racy.
        let (mut tail, sq_base, doorbell) = unsafe {
            ((*record).sq_tail.get(), (*record).sq_base.get(), (*record).sq_reg_base.get() + SDMA_DOORBELL_OFFSET)
        };
        let stream_id = self.channel.info().index as u16;
        let mut written = 0u64;
        let mut push = |src: u64, dst: u64, length: u64| {
            // task_id: the SQE's position in its group (docs/hardware.md section 4 writes sq_tail - sq_head).
            let sqe = SdmaSqe::copy(src, dst, length as u32, stream_id, written as u16);
            let slot = sq_base + u64::from(tail) * SQE_BYTES;
            // SAFETY: `tail` < depth, so the slot lies inside the channel's SQ ring (depth * 64 bytes of workspace);
            // the engine reads it only after the doorbell store below publishes a tail past it.
            unsafe { std::ptr::copy_nonoverlapping(sqe.as_bytes().as_ptr(), slot as *mut u8, 64) };
            tail = self.sq.next(tail);
            written += 1;
        };
        let pool_base = self.pool.as_ref().map_or(0, DeviceBuffer::addr);
        let mut pool_slot = 0u64;
        for job in &group {
            if job.pooled {
                // ADXL's small-transfer path: through a pre-registered pool buffer, one extra copy.
                let staging = pool_base + pool_slot * self.shared.pool_threshold;
                pool_slot += 1;
                push(job.src, staging, job.length);
                push(staging, job.dst, job.length);
                counters.pooled_transfers.fetch_add(1, Ordering::Relaxed);
                counters.staged_bytes.fetch_add(job.length, Ordering::Relaxed);
            } else {
                for piece in pieces(job.length, SDMA_MAX_SQE_BYTES) {
                    push(job.src + piece.offset, job.dst + piece.offset, u64::from(piece.length));
                }
            }
        }
        self.sequence += 1;
        let sequence = self.sequence;
        let source = std::mem::offset_of!(FlagArea, source);
        let receive = std::mem::offset_of!(FlagArea, receive);
        self.flag_word(source).store(sequence, Ordering::Release);
        let flag_base = self.channel.info().flag_area_addr;
        push(flag_base + source as u64, flag_base + receive as u64, 8);
        // SAFETY: the doorbell word is in the channel's register page (valid as long as the device); the engine
        // reads it atomically. Release: the SQEs written above are visible to an engine that acquires this tail.
        unsafe { AtomicU32::from_ptr(doorbell as *mut u32).store(tail, Ordering::Release) };
        self.channel.doorbell_rung();
        // SAFETY: as above; the software copy of the tail belongs to the submitter (this thread).
        unsafe { (*record).sq_tail.set(tail) };

        let outcome = self.poll_flag(sequence);
        // Read the exception before the reset clears it.
        let exception = match outcome {
            AdxlStatus::SUCCESS => None,
            _ => self.shared.device.channel_exception(self.channel.info().index),
        };
        let outcome = match (outcome, &exception) {
            (AdxlStatus::TIMEOUT, Some(_)) => AdxlStatus::FAILED,
            (outcome, _) => outcome,
        };
        if outcome != AdxlStatus::SUCCESS {
            self.recover(exception.is_some());
        }
        let now = thread_cpu_time_ns();
        let share = (now.saturating_sub(self.cpu_mark) + self.shared.carry.take()) / group.len() as u64;
        self.cpu_mark = now;
        for job in group {
            let evidence = TransferEvidence {
                path: "adxl",
                descriptor_builder: Actor::HostThread,
                doorbell_ringer: Actor::HostThread,
                completion_observer: Actor::HostThread,
                // The submission (doorbell) and the completion reap of its group, plus Connect for the first
                // transfer to a peer.
                host_device_api_calls: 2 + job.api_calls,
                descriptors: job.sqes() + 1,
                doorbells: 1,
                host_cpu_ns: job.submit_cpu_ns + share,
            };
            match outcome {
                AdxlStatus::SUCCESS => {
                    job.slot.complete(job.length, evidence);
                }
                status => {
                    let detail = match (&exception, status) {
                        (Some(exception), _) => exception.to_string(),
                        (None, AdxlStatus::FAILED) => "the SDMA channel stopped".to_owned(),
                        _ => format!("completion flag not seen within {:?}", self.shared.timeout),
                    };
                    job.slot.fail_with_evidence(status.failure(detail), evidence);
                }
            }
        }
    }

    /// Polls the completion flag: SUCCESS, TIMEOUT, or FAILED when the channel reports an exception.
    fn poll_flag(&self, sequence: u64) -> AdxlStatus {
        let deadline = Instant::now() + self.shared.timeout;
        let receive = std::mem::offset_of!(FlagArea, receive);
        let mut spins = 0u32;
        loop {
            let token = self.channel.progress_token();
            // Acquire pairs with the engine's Release store of the flag: every earlier SQE of the queue is done.
            if self.flag_word(receive).load(Ordering::Acquire) == sequence {
                return AdxlStatus::SUCCESS;
            }
            if self.shared.device.channel_exception(self.channel.info().index).is_some() {
                return AdxlStatus::FAILED;
            }
            if Instant::now() >= deadline {
                return AdxlStatus::TIMEOUT;
            }
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                self.channel.wait_progress(token, Duration::from_millis(1));
            }
        }
    }

    /// Drops what the channel still holds and clears its exception, so the next group starts clean.
    fn recover(&self, faulted: bool) {
        let counters = &self.shared.counters;
        let index = self.channel.info().index;
        if faulted {
            counters.failures.fetch_add(1, Ordering::Relaxed);
        } else {
            counters.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(error) = self.shared.device.reset_channel(index) {
            tracing::error!(channel = index, %error, "adxl: channel reset failed");
        }
    }
}

/// Where the adxl baseline's HiXL server (cann backend) listens when `aiv.hixl_host` is not set: `AIV_HIXL_HOST`
/// if set, else the host part of the engine's `local_hostname`, so that peers reach it where they reach the engine.
pub fn default_hixl_host(environment: &dyn Environment, local_hostname: &str) -> String {
    match environment.var("AIV_HIXL_HOST") {
        Some(host) if !host.trim().is_empty() => host.trim().to_owned(),
        _ => super::tcp::host_of_segment_name(local_hostname).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_round_trip_through_task_failures() {
        for status in [AdxlStatus::PARAM_INVALID, AdxlStatus::TIMEOUT, AdxlStatus::NOT_CONNECTED, AdxlStatus::FAILED] {
            let failure = status.failure("detail (with parentheses)");
            assert_eq!(AdxlStatus::of_failure(&failure), status);
            assert_eq!(failure.state(), status.task_state());
            assert_eq!(
                failure.to_string(),
                format!("adxl: {} ({}): detail (with parentheses)", status.name(), status.0)
            );
        }
        let tcp = crate::transfer::TransferFailure::new("tcp", crate::transfer::FailureKind::Network, "refused");
        assert_eq!(AdxlStatus::of_failure(&tcp), AdxlStatus::FAILED, "a failure without an ADXL code is FAILED");
        assert_eq!(AdxlStatus::TIMEOUT.task_state(), TransferState::Timeout);
        assert_eq!(AdxlStatus::NOT_CONNECTED.task_state(), TransferState::Failed);
        assert_eq!(AdxlStatus(7).name(), "status 7");
    }
}
