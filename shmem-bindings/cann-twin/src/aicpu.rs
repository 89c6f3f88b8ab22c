//! The emulated AI CPU: the NPU's control CPU cores, which run AI-CPU kernels (HiXL's batch transfer among them).
//! An actor of its own for the provenance records: never an AIV core, never the Host.
//!
//! - Per device a pool of [`POOL_THREADS`] threads (`cann-twin-aicpu-d<device>.<n>`), started with the device's first
//!   AI-CPU task and kept for the process's life. Each one is marked as the AI CPU's
//!   (`provenance::mark_aicpu_thread`): its writes and reads through the device address space are the AI CPU's
//!   in the records, and so are the doorbells it rings through the AI CPU's register path.
//! - Thread `n` owns SDMA channel `n` of the AI CPU on the device (`sdma::aicpu_channels`: channel index
//!   `AICPU_CHANNEL_BASE + n`, an RTSQ apart from SHMEM's), so a task has its channel to itself from its first SQE to
//!   its completion word: the entries of the channel's consumption log in between are its own.
//! - An AI-CPU kernel launch is a **stream task** ([`crate::stream::Task::AiCpu`]): stream-ordered; the stream worker
//!   hands it to a free thread of the device and waits for it, at most the launch's timeout
//!   (`ACL_ERROR_RT_AICPU_TIMEOUT` past it: the task is told to stop, and the kernel is told it was abandoned).
//! - A task drives its channel as HiXL's AI-CPU kernels drive an RTSQ (`hicann/hixl`
//!   `src/hixl/fabric_mem/fabric_mem_stars_sdma.cc`): SQEs written into the ring through the device address space in
//!   batches of at most [`MAX_BATCH_SQES`], the tail committed after each batch (the twin's register path with the
//!   AI CPU as origin, where the vendor calls `halSqCqConfig(SQ_TAIL)`), the head read from the channel's record before
//!   reusing ring slots; then one 8-byte flag SQE onto the channel's completion word, which the task polls (reads
//!   through the device address space, so the first read that returns the landed value is the AI CPU's) until it
//!   lands. The vendor's kernels signal completion with a notify record instead (an SQE of type 6, or
//!   `HcommAclrtNotifyRecordOnThread`); the twin's engines execute SDMA copies only, so the twin uses a flag copy.
//!   A channel exception (a bad address) fails the task; the channel is reset so the next task runs.
//! - While a task waits (for room in the ring, for its completion word) it spins and yields for
//!   [`POLL_WINDOW`], then naps until its channel's engine progresses (the device-internal signal the AIV cores use),
//!   at most [`MAX_NAP`] at a time; every wait is bounded by the kernel's own check (its deadline) and stops when the
//!   channel is shut down (the device's reset).
//!
//! Counted per device ([`crate::occupancy::AiCpuCounters`], [`crate::evidence`]): tasks launched, tasks run and
//! failed, the threads' time executing, polling and idle.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;

use crate::occupancy::AiCpuCounters;
use crate::provenance::{self, Doer, FlagReader, LoggedSqe};
use crate::sdma::{Channel, SdmaSqe, DOORBELL_OFFSET, SQE_BYTES};
use crate::space::{perform_copy, space};

/// AI-CPU threads per device: one per AI-CPU SDMA channel (`sdma::AICPU_CHANNELS`, where the count is chosen).
pub const POOL_THREADS: u32 = crate::sdma::AICPU_CHANNELS;
/// The AI-CPU threads' names start so (`cann-twin-aicpu-d<device>.<n>`; the system keeps 15 bytes of it).
pub const THREAD_PREFIX: &str = "cann-twin-aicpu";
/// SQEs a task writes before it commits the tail (`kMaxRtsqEntriesPerPublish`, 128, in `hicann/hixl`
/// `src/hixl/fabric_mem/fabric_mem_aicpu_types.h`).
pub const MAX_BATCH_SQES: usize = 128;
/// How long a waiting task spins and yields before it naps.
pub const POLL_WINDOW: Duration = Duration::from_micros(50);
/// The longest nap of a waiting task (it ends early when the channel's engine progresses).
pub const MAX_NAP: Duration = Duration::from_micros(200);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An AI-CPU kernel: what one launch runs on one AI-CPU thread (block dim 1).
pub(crate) trait Kernel: Send + Sync {
    /// Runs the kernel on `cpu`; an error is the launch's failure (the stream records it).
    fn run(&self, cpu: &mut Cpu<'_>) -> Result<(), aclError>;
    /// The launch ended without the kernel finishing it (its timeout passed, its stream gave up): `code`.
    fn abandoned(&self, code: aclError);
}

#[derive(Debug, Default)]
struct Outcome {
    code: Option<aclError>,
}

/// One AI-CPU kernel launch, shared by its stream task and the thread that runs it.
pub(crate) struct Launch {
    kernel: Box<dyn Kernel>,
    timeout: Duration,
    /// Set when the launch is given up: the task stops at its next check.
    abort: AtomicBool,
    outcome: Mutex<Outcome>,
    done: Condvar,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl Launch {
    /// A launch of `kernel` on `device`, to be submitted to a stream of that device as [`crate::stream::Task::AiCpu`];
    /// counted as launched now.
    pub(crate) fn new(device: i32, kernel: Box<dyn Kernel>, timeout: Duration) -> Arc<Launch> {
        crate::evidence::note_aicpu_launch(1);
        crate::occupancy::aicpu_counters(device).launched();
        Arc::new(Launch {
            kernel,
            timeout,
            abort: AtomicBool::new(false),
            outcome: Mutex::new(Outcome::default()),
            done: Condvar::new(),
        })
    }

    /// Whether the launch was given up.
    pub(crate) fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    fn finish(&self, code: aclError) {
        let mut outcome = lock(&self.outcome);
        if outcome.code.is_none() {
            outcome.code = Some(code);
        }
        self.done.notify_all();
    }
}

/// The AI CPU of one device.
struct Pool {
    device: i32,
    queue: Mutex<VecDeque<Arc<Launch>>>,
    ready: Condvar,
    counters: Arc<AiCpuCounters>,
}

static POOLS: LazyLock<Mutex<HashMap<i32, Arc<Pool>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The AI CPU of `device`, its threads started on first use.
fn pool(device: i32) -> Result<Arc<Pool>, aclError> {
    let mut pools = lock(&POOLS);
    if let Some(pool) = pools.get(&device) {
        return Ok(Arc::clone(pool));
    }
    let pool = Arc::new(Pool {
        device,
        queue: Mutex::new(VecDeque::new()),
        ready: Condvar::new(),
        counters: crate::occupancy::aicpu_counters(device),
    });
    let mut started = 0;
    for n in 0..POOL_THREADS {
        let serving = Arc::clone(&pool);
        let spawned = std::thread::Builder::new()
            .name(format!("{THREAD_PREFIX}-d{device}.{n}"))
            .spawn(move || serve(&serving, n));
        if spawned.is_ok() {
            started += 1;
        }
    }
    if started == 0 {
        return Err(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL);
    }
    pools.insert(device, Arc::clone(&pool));
    Ok(pool)
}

/// The body of AI-CPU thread `n` of `pool`'s device: takes launches off the queue and runs them, for the process's
/// life (idle threads wait on the queue).
fn serve(pool: &Pool, n: u32) {
    provenance::mark_aicpu_thread();
    let index = pool.counters.thread_started();
    loop {
        let launch = {
            let mut queue = lock(&pool.queue);
            loop {
                if let Some(launch) = queue.pop_front() {
                    break launch;
                }
                queue = pool.ready.wait_timeout(queue, Duration::from_secs(1)).unwrap_or_else(|p| p.into_inner()).0;
            }
        };
        if launch.aborted() {
            launch.finish(ACL_ERROR_RT_AICPU_TIMEOUT);
            continue;
        }
        pool.counters.task_started(index);
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let channel = crate::sdma::aicpu_channels(pool.device)?
                .into_iter()
                .nth(n as usize)
                .ok_or(ACL_ERROR_RT_AICPU_INTERNAL_ERROR)?;
            let mut cpu = Cpu::new(pool, index, &launch, channel)?;
            let ran = launch.kernel.run(&mut cpu);
            cpu.settle();
            ran
        }))
        .unwrap_or(Err(ACL_ERROR_RT_AICPU_EXCEPTION));
        let code = match code {
            Ok(()) => ACL_SUCCESS,
            Err(code) => code,
        };
        pool.counters.task_ended(index, code == ACL_SUCCESS);
        launch.finish(code);
    }
}

/// The stream task of an AI-CPU launch: hands `launch` to a thread of `device`'s AI CPU and waits for its end, at
/// most the launch's timeout (`ACL_ERROR_RT_AICPU_TIMEOUT`: the task is told to stop, the kernel that it was
/// abandoned).
pub(crate) fn run(device: i32, launch: &Arc<Launch>) -> aclError {
    let pool = match pool(device) {
        Ok(pool) => pool,
        Err(code) => {
            launch.kernel.abandoned(code);
            return code;
        }
    };
    lock(&pool.queue).push_back(Arc::clone(launch));
    pool.ready.notify_one();
    let deadline = Instant::now() + launch.timeout;
    let mut outcome = lock(&launch.outcome);
    loop {
        if let Some(code) = outcome.code {
            return code;
        }
        let now = Instant::now();
        if now >= deadline {
            launch.abort.store(true, Ordering::Release);
            launch.kernel.abandoned(ACL_ERROR_RT_AICPU_TIMEOUT);
            return ACL_ERROR_RT_AICPU_TIMEOUT;
        }
        outcome = launch.done.wait_timeout(outcome, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
    }
}

/// What a task's entries of its channel's consumption log say: its SQEs by writer, the doorbells that exposed them by
/// ringer, its flag SQEs by first reader. Counted from the log, never from what the task meant to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Acts {
    pub sqes_by_aicpu: u64,
    pub sqes_by_host: u64,
    pub sqes_by_aiv: u64,
    pub sqes_unattributed: u64,
    pub doorbells_by_aicpu: u64,
    pub doorbells_by_host: u64,
    pub doorbells_by_aiv: u64,
    pub doorbells_unattributed: u64,
    pub flags_by_aicpu: u64,
    pub flags_by_host: u64,
    pub flags_by_aiv: u64,
    pub flags_unread: u64,
    /// Log entries the task could not read (the log had dropped them).
    pub lost: u64,
    /// Whether the provenance records were off at some point of the task (then the log holds nothing of it).
    pub unrecorded: bool,
}

impl Acts {
    fn add(&mut self, entry: &LoggedSqe, last_doorbell: &mut Option<u64>) {
        match entry.writer {
            Doer::AiCpu => self.sqes_by_aicpu += 1,
            Doer::Host => self.sqes_by_host += 1,
            Doer::Block(_) => self.sqes_by_aiv += 1,
            Doer::Unattributed => self.sqes_unattributed += 1,
        }
        // One per distinct doorbell the engine took, by each of its ringers.
        if *last_doorbell != Some(entry.doorbell) {
            *last_doorbell = Some(entry.doorbell);
            for doer in entry.ringers.iter() {
                match doer {
                    Doer::AiCpu => self.doorbells_by_aicpu += 1,
                    Doer::Host => self.doorbells_by_host += 1,
                    Doer::Block(_) => self.doorbells_by_aiv += 1,
                    Doer::Unattributed => self.doorbells_unattributed += 1,
                }
            }
        }
        match entry.flag {
            Some(FlagReader::AiCpu) => self.flags_by_aicpu += 1,
            Some(FlagReader::Host) => self.flags_by_host += 1,
            Some(FlagReader::Core) => self.flags_by_aiv += 1,
            Some(FlagReader::Unread) => self.flags_unread += 1,
            None => {}
        }
    }
}

/// An AI-CPU thread running one task: its channel, the tail it committed, the SQEs not committed yet, and its walk of
/// the channel's consumption log.
pub(crate) struct Cpu<'a> {
    launch: &'a Launch,
    counters: &'a AiCpuCounters,
    thread: usize,
    channel: Arc<Channel>,
    tail: u32,
    pending: Vec<[u8; SQE_BYTES]>,
    task_id: u16,
    /// The next entry of the channel's log to read, and the doorbell count of the last entry read.
    log_from: u64,
    last_doorbell: Option<u64>,
    acts: Acts,
}

/// Why a wait ended early.
type Check<'c> = &'c mut dyn FnMut() -> Result<(), aclError>;

impl<'a> Cpu<'a> {
    fn new(pool: &'a Pool, thread: usize, launch: &'a Launch, channel: Arc<Channel>) -> Result<Cpu<'a>, aclError> {
        if channel.exception().is_some() {
            // Left stopped by an earlier task that could not reset it.
            channel.reset().map_err(|_| ACL_ERROR_RT_AICPU_EXCEPTION)?;
        }
        // The ring's tail as the driver reports it (the vendor queries SQ_TAIL with `halSqCqQuery`).
        let tail = channel.doorbell.tail.load(Ordering::Acquire) % channel.depth;
        let unrecorded = !provenance::recording();
        Ok(Cpu {
            launch,
            counters: &pool.counters,
            thread,
            log_from: channel.provenance.log_position(),
            channel,
            tail,
            pending: Vec::with_capacity(MAX_BATCH_SQES),
            task_id: 0,
            last_doorbell: None,
            acts: Acts { unrecorded, ..Acts::default() },
        })
    }

    /// Whether the launch was given up or the channel shut down: the task must stop.
    fn stopped(&self) -> Result<(), aclError> {
        if self.launch.aborted() {
            return Err(ACL_ERROR_RT_AICPU_TIMEOUT);
        }
        if self.channel.is_closed() {
            return Err(ACL_ERROR_RT_DEVICE_TASK_ABORT);
        }
        Ok(())
    }

    /// Reads `out.len()` bytes of device memory at `address` through the device address space, as the AI CPU: a
    /// landed completion flag among them is recorded as seen by the AI CPU.
    pub(crate) fn read(&self, address: u64, out: &mut [u8]) -> Result<(), aclError> {
        if out.is_empty() {
            return Ok(());
        }
        {
            let guard = space();
            let space = guard.as_ref().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
            let from = space.translate(address as usize, out.len(), false)?;
            let to = [crate::memory::Segment { ptr: out.as_mut_ptr(), len: out.len() }];
            // SAFETY: `from` was translated under the read lock held here; `out` is a live buffer of the same length.
            unsafe { perform_copy(&to, &from) };
        }
        provenance::read(address, out);
        Ok(())
    }

    /// Reads the 8-byte word at `address` (8-byte aligned) atomically with acquire ordering, as the AI CPU: a landed
    /// completion flag is recorded as seen by the AI CPU.
    fn read_word(&self, address: u64) -> Result<u64, aclError> {
        let value = {
            let guard = space();
            let space = guard.as_ref().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
            let from = space.translate(address as usize, 8, false)?;
            match &*from {
                [one] if one.ptr as usize % 8 == 0 => {
                    // SAFETY: an 8-byte aligned word of device memory, translated under the read lock held here; the
                    // engine stores flags into it atomically.
                    unsafe { AtomicU64::from_ptr(one.ptr.cast()) }.load(Ordering::Acquire)
                }
                _ => return Err(ACL_ERROR_RT_PARAM_INVALID),
            }
        };
        provenance::read(address, &value.to_le_bytes());
        Ok(value)
    }

    /// Writes `bytes` at device address `address` through the device address space, as the AI CPU (a write into an
    /// SQ ring marks its slots as the AI CPU's).
    pub(crate) fn write(&self, address: u64, bytes: &[u8]) -> Result<(), aclError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let guard = space();
        let space = guard.as_ref().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        let to = space.translate(address as usize, bytes.len(), true)?;
        let from = [crate::memory::Segment { ptr: bytes.as_ptr().cast_mut(), len: bytes.len() }];
        // SAFETY: `to` was translated under the read lock held here; `from` is a live buffer only read.
        unsafe { perform_copy(&to, &from) };
        Ok(())
    }

    /// An on-chip copy SQE of `length` bytes (at most 1 MiB, the twin engine's limit) from `src` to `dst`, with this
    /// channel's stream id and the next task id.
    pub(crate) fn copy_sqe(&mut self, src: u64, dst: u64, length: u32) -> [u8; SQE_BYTES] {
        self.task_id = self.task_id.wrapping_add(1);
        SdmaSqe::onchip_copy(src, dst, length, self.channel.index as u16, self.task_id).to_bytes()
    }

    /// Queues `sqe`; a full batch ([`MAX_BATCH_SQES`]) is committed.
    pub(crate) fn push(&mut self, sqe: [u8; SQE_BYTES], check: Check<'_>) -> Result<(), aclError> {
        self.pending.push(sqe);
        if self.pending.len() >= MAX_BATCH_SQES {
            self.commit(check)?;
        }
        Ok(())
    }

    /// The head the engine published in the channel's record.
    fn head(&self) -> Result<u32, aclError> {
        let mut word = [0u8; 4];
        self.read(self.channel.record, &mut word)?;
        Ok(u32::from_le_bytes(word) % self.channel.depth)
    }

    /// Writes the queued SQEs into the ring (waiting, bounded by `check`, for room: the head read from the record)
    /// and commits the tail with one doorbell write through the AI CPU's register path.
    pub(crate) fn commit(&mut self, check: Check<'_>) -> Result<(), aclError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let depth = self.channel.depth;
        let needed = self.pending.len() as u32;
        let free = |cpu: &Cpu<'_>| -> Result<bool, aclError> {
            let head = cpu.head()?;
            let used = (cpu.tail + depth - head) % depth;
            Ok(depth - 1 - used >= needed)
        };
        self.wait(check, |cpu| free(cpu))?;
        let mut bytes = Vec::with_capacity(self.pending.len() * SQE_BYTES);
        self.pending.iter().for_each(|sqe| bytes.extend_from_slice(sqe));
        // Up to the ring's end, then from slot 0.
        let first = ((depth - self.tail) as usize).min(self.pending.len());
        let slot = |index: u32| self.channel.sq_base + u64::from(index) * SQE_BYTES as u64;
        self.write(slot(self.tail), &bytes[..first * SQE_BYTES])?;
        self.write(slot(0), &bytes[first * SQE_BYTES..])?;
        self.tail = (self.tail + needed) % depth;
        self.pending.clear();
        std::sync::atomic::fence(Ordering::Release);
        crate::sdma::aicpu_register_write(self.channel.reg_base + DOORBELL_OFFSET, &self.tail.to_le_bytes())
            .map_err(|_| ACL_ERROR_RT_AICPU_EXCEPTION)?;
        self.walk();
        Ok(())
    }

    /// Ends the task's SQEs with a flag SQE onto the channel's completion word, commits, and polls the word until the
    /// flag lands (bounded by `check`). A channel exception fails it (the channel is reset).
    pub(crate) fn complete(&mut self, check: Check<'_>) -> Result<(), aclError> {
        let completion = self.channel.record + crate::sdma::AICPU_COMPLETION_OFFSET;
        let source = self.channel.record + crate::sdma::AICPU_FLAG_SOURCE_OFFSET;
        // A value the word never held: the previous one plus one.
        let value = self.read_word(completion)?.wrapping_add(1).max(1);
        self.write(source, &value.to_le_bytes())?;
        let flag = self.copy_sqe(source, completion, 8);
        self.push(flag, check)?;
        self.commit(check)?;
        self.wait(check, |cpu| Ok(cpu.read_word(completion)? == value))?;
        self.walk();
        Ok(())
    }

    /// Drops what the task left in its channel: resets it (pending SQEs dropped, an exception cleared), bounded.
    pub(crate) fn abandon(&mut self) {
        self.pending.clear();
        // A channel shut down (the device's reset) has no engine to reset it.
        if !self.channel.is_closed() && self.channel.reset().is_ok() {
            self.tail = self.channel.doorbell.tail.load(Ordering::Acquire) % self.channel.depth;
        }
        self.walk();
    }

    /// Waits until `done` holds: spins and yields for [`POLL_WINDOW`], then naps on the channel's progress; stops at
    /// a failed `check`, a channel exception (the channel is reset), the launch's abort or the channel's shutdown.
    fn wait(
        &mut self,
        check: Check<'_>,
        mut done: impl FnMut(&Cpu<'a>) -> Result<bool, aclError>,
    ) -> Result<(), aclError> {
        let started = Instant::now();
        let result = loop {
            match done(self) {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(code) => break Err(code),
            }
            if let Err(code) = check().and_then(|()| self.stopped()) {
                break Err(code);
            }
            if self.channel.exception().is_some() {
                break Err(ACL_ERROR_RT_AICPU_EXCEPTION);
            }
            let seen = self.channel.activity().progress();
            if started.elapsed() < POLL_WINDOW {
                std::thread::yield_now();
            } else {
                self.walk();
                self.channel.activity().nap(seen, MAX_NAP);
            }
        };
        self.counters.polled(self.thread, started.elapsed().as_nanos() as u64);
        if result.is_err() {
            self.abandon();
        }
        result
    }

    /// Reads the channel's log from where the task last read it into the task's acts: up to its end, or (`settled`
    /// false) up to a landed flag nobody has read yet, whose first reader may still come (the task's own poll).
    fn walk_log(&mut self, settled: bool) {
        let mut entries = Vec::new();
        let (first, _) = self.channel.provenance.read_log(self.log_from, &mut entries);
        self.acts.lost += first.saturating_sub(self.log_from);
        self.log_from = first;
        for entry in &entries {
            if !settled && entry.flag == Some(FlagReader::Unread) {
                break;
            }
            self.acts.add(entry, &mut self.last_doorbell);
            self.log_from += 1;
        }
    }

    /// [`Cpu::walk_log`] while the task runs: a flag not read yet is left for a later walk.
    fn walk(&mut self) {
        self.walk_log(false);
    }

    /// The task's acts so far (its log entries read up to now; a flag nobody read is counted unread).
    pub(crate) fn acts(&mut self) -> Acts {
        self.walk_log(true);
        let mut acts = self.acts;
        acts.unrecorded |= !provenance::recording();
        acts
    }

    /// After the kernel: what it left uncommitted is dropped, and a channel it left stopped is reset.
    fn settle(&mut self) {
        if !self.pending.is_empty() || self.channel.exception().is_some() {
            self.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provenance::Ringers;

    #[test]
    fn acts_count_each_doorbell_once_by_each_ringer_and_each_flag_by_its_reader() {
        let mut acts = Acts::default();
        let mut last = None;
        let both = Ringers::of(&[Doer::AiCpu, Doer::Host]);
        let entries = [
            LoggedSqe::new_for_tests(Doer::AiCpu, Ringers::from(Doer::AiCpu), 1, None),
            LoggedSqe::new_for_tests(Doer::AiCpu, Ringers::from(Doer::AiCpu), 1, None),
            LoggedSqe::new_for_tests(Doer::Host, both, 2, None),
            LoggedSqe::new_for_tests(Doer::AiCpu, Ringers::from(Doer::AiCpu), 3, Some(FlagReader::AiCpu)),
            LoggedSqe::new_for_tests(Doer::Unattributed, Ringers::from(Doer::AiCpu), 3, Some(FlagReader::Unread)),
        ];
        for entry in &entries {
            acts.add(entry, &mut last);
        }
        assert_eq!((acts.sqes_by_aicpu, acts.sqes_by_host, acts.sqes_unattributed), (3, 1, 1));
        assert_eq!((acts.doorbells_by_aicpu, acts.doorbells_by_host), (3, 1), "doorbells 1, 2 (two ringers), 3");
        assert_eq!((acts.flags_by_aicpu, acts.flags_unread), (1, 1));
    }
}
