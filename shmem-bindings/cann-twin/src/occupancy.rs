//! Occupancy of the device model: how long each emulated AIV core executed and polled, how long each SDMA channel
//! engine was busy, and how long the runtime's copies (stream copy tasks and synchronous copies) took, cumulative per
//! device since its counters were created, for
//! [`crate::control::occupancy`]. A CPU model's figures: they say what the model's threads did, not what an NPU would
//! do (docs/occupancy.md).
//!
//! # Definitions
//!
//! - A core's time runs from the entry of a block (just before the launch shim installs the core) to its exit (the
//!   kernel function returned or trapped), on the monotonic clock.
//! - **Polling**: a poll interval is one run of consecutive idle hints (the model calls the runtime's idle hint from
//!   the 16th consecutive refill of unchanged memory on, once per further unchanged refill; a changed refill, a scalar
//!   store or a DMA issue ends the run, and the next run's hints count from 16 again). It starts at the run's first
//!   hint and ends when its last hint returns (after any spin, yield or nap the hint made). The up to 15 unchanged
//!   refills before the first hint, and the one loop pass from the last hint to the refill that found new data, are
//!   counted as executing: the runtime cannot see them without a clock read on the model's fill path.
//! - **Executing**: the rest of the block's time (everything from entry to exit that is not polling).
//! - **Busy** (an SDMA channel): from the engine taking a tail to execute (after a doorbell) to the end of that run
//!   (caught up with the tail, interrupted or faulted), just before it publishes the head (the run's counters are
//!   updated before the head a caller waits for moves). The engine's brief poll for the next
//!   doorbell and its sleep are not busy.
//! - **Stream copy busy**: a stream task of kind Copy (`aclrtMemcpyAsync`), from its worker taking the task off the
//!   queue (after any hold) to the task's end (the copy done or refused), just before the worker publishes the
//!   completion a synchronisation waits for. A kernel-launch task is timed the same way but counted apart
//!   (`kernel_tasks`): it is AIV work (the cores' figures), not copy-engine time.
//! - **AI CPU** (the emulated AI CPU's threads, `crate::aicpu`): a thread is **executing** from taking an AI-CPU task
//!   to the task's end, less the time it spent **polling** device memory for progress (waiting for room in its
//!   channel's ring or for its completion word: each wait from its start to its end, spin, yield and naps included);
//!   **idle** is the rest of the thread's life (waiting for a task).
//! - **Synchronous copy busy**: an `aclrtMemcpy` with device memory on at least one side, from just after its
//!   arguments were checked and translated to the end of the copy, charged to the calling thread's current device. A
//!   Host-to-Host copy, or one from a thread with no current device, is not counted.
//!
//! # Cost
//!
//! Per block: two monotonic clock readings (entry, exit) and two acquisitions of the device's counters lock. Per idle
//! hint (only while the core polls): the reading the hint already made and one store; around a hint's yield or nap
//! (from the 64th unchanged refill on) one more reading and five stores, so that a snapshot taken during the nap
//! counts it as polling (a seqlock). Per SDMA run (not per SQE): two readings and two uncontended lock pairs.
//! Nothing on the model's fill, store or DMA paths, and no CoreOps ABI change.
//!
//! A snapshot of a running block is consistent to within one pass of the kernel's poll loop: the time between two
//! hints of a run is executing until the second hint counts it as polling.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Instant;

/// Nanoseconds on the twin's monotonic clock (its epoch: the first reading in the process).
pub(crate) fn monotonic_ns() -> u64 {
    static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
    EPOCH.elapsed().as_nanos() as u64
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The clock of one block running on one emulated core: written by that core's thread only.
#[derive(Debug)]
pub(crate) struct CoreClock {
    block: u32,
    entered_ns: u64,
    /// Polling so far, poll intervals still open included up to their last hint's end.
    polling_ns: AtomicU64,
    /// Poll intervals started.
    polls: AtomicU64,
    /// When the yield or nap of the hint the core is in now began (0: in none): polling a snapshot counts up to now.
    hint_since: AtomicU64,
    /// Odd while the core moves a hint's yield or nap into `polling_ns` (a snapshot reads the two consistently).
    version: AtomicU64,
}

impl CoreClock {
    /// Adds `ns` of polling (single writer: the core's thread).
    pub(crate) fn add_polling(&self, ns: u64) {
        self.polling_ns.store(self.polling_ns.load(Ordering::Relaxed).saturating_add(ns), Ordering::SeqCst);
    }

    /// Counts the start of a poll interval (single writer: the core's thread).
    pub(crate) fn poll_started(&self) {
        self.polls.store(self.polls.load(Ordering::Relaxed).saturating_add(1), Ordering::Relaxed);
    }

    /// The core starts a hint's yield or nap at `now` (monotonic ns).
    pub(crate) fn hint_waits(&self, now: u64) {
        self.hint_since.store(now.max(1), Ordering::SeqCst);
    }

    /// The yield or nap begun at `since` ended at `now`: its time is polling.
    pub(crate) fn hint_waited(&self, since: u64, now: u64) {
        let version = self.version.load(Ordering::Relaxed);
        self.version.store(version.wrapping_add(1), Ordering::SeqCst);
        self.add_polling(now.saturating_sub(since));
        self.hint_since.store(0, Ordering::SeqCst);
        self.version.store(version.wrapping_add(2), Ordering::SeqCst);
    }

    /// `(executing, polling)` at `now`: polling includes a yield or nap in progress. Consistent (a seqlock read,
    /// at most a few tries; should every try race the core, the wait in progress is left out).
    fn split(&self, now: u64) -> (u64, u64) {
        let total = now.saturating_sub(self.entered_ns);
        let mut polling = self.polling_ns.load(Ordering::SeqCst);
        for _ in 0..4 {
            let before = self.version.load(Ordering::SeqCst);
            let committed = self.polling_ns.load(Ordering::SeqCst);
            let since = self.hint_since.load(Ordering::SeqCst);
            if before % 2 == 0 && self.version.load(Ordering::SeqCst) == before {
                polling = committed + if since == 0 { 0 } else { now.saturating_sub(since) };
                break;
            }
            std::hint::spin_loop();
        }
        let polling = polling.min(total);
        (total - polling, polling)
    }
}

/// What finished runs of one block index added up to.
#[derive(Clone, Copy, Debug, Default)]
struct BlockTotals {
    executing_ns: u64,
    polling_ns: u64,
    polls: u64,
    runs: u64,
}

/// The busy time of one SDMA channel engine.
#[derive(Debug, Default)]
pub(crate) struct ChannelBusy(Mutex<BusyState>);

#[derive(Debug, Default)]
struct BusyState {
    busy_ns: u64,
    /// The start of the run in progress.
    run_started: Option<u64>,
    runs: u64,
    sqes: u64,
}

impl ChannelBusy {
    /// The engine took work: a run starts now.
    pub(crate) fn run_started(&self) {
        let now = monotonic_ns();
        lock(&self.0).run_started = Some(now);
    }

    /// The run ended after executing `sqes` SQEs.
    pub(crate) fn run_ended(&self, sqes: u64) {
        let now = monotonic_ns();
        let mut state = lock(&self.0);
        if let Some(started) = state.run_started.take() {
            state.busy_ns = state.busy_ns.saturating_add(now.saturating_sub(started));
            state.runs += 1;
        }
        state.sqes = state.sqes.saturating_add(sqes);
    }

    fn snapshot(&self, index: u32, now: u64) -> ChannelOccupancy {
        let state = lock(&self.0);
        let open = state.run_started.map_or(0, |started| now.saturating_sub(started));
        ChannelOccupancy {
            index,
            busy_ns: state.busy_ns.saturating_add(open),
            runs: state.runs,
            sqes: state.sqes,
            running: state.run_started.is_some(),
        }
    }
}

/// What a stream task or a runtime copy is, for its counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamWork {
    /// A stream's copy task (`aclrtMemcpyAsync`) of `bytes`.
    Copy { bytes: u64 },
    /// A stream's kernel-launch task.
    Kernel,
    /// A synchronous runtime copy (`aclrtMemcpy`) of `bytes` with device memory on at least one side.
    SyncCopy { bytes: u64 },
}

/// What finished work of one kind added up to.
#[derive(Clone, Copy, Debug, Default)]
struct WorkTotals {
    busy_ns: u64,
    count: u64,
    bytes: u64,
    failed: u64,
}

/// Work of a device's streams and synchronous copies: finished totals by kind, and the work in progress.
#[derive(Debug, Default)]
pub(crate) struct StreamCounters(Mutex<StreamState>);

#[derive(Debug, Default)]
struct StreamState {
    copies: WorkTotals,
    kernels: WorkTotals,
    sync_copies: WorkTotals,
    /// Work in progress: a few entries at most (one per stream worker, one per thread in a synchronous copy).
    open: Vec<OpenWork>,
    next_token: u64,
}

impl StreamState {
    fn totals_mut(&mut self, work: StreamWork) -> &mut WorkTotals {
        match work {
            StreamWork::Copy { .. } => &mut self.copies,
            StreamWork::Kernel => &mut self.kernels,
            StreamWork::SyncCopy { .. } => &mut self.sync_copies,
        }
    }
}

/// Work in progress, from [`StreamCounters::started`]; hand it back to [`StreamCounters::ended`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpenWork {
    token: u64,
    started: u64,
    work: StreamWork,
}

impl StreamCounters {
    /// `work` starts now.
    #[must_use]
    pub(crate) fn started(&self, work: StreamWork) -> OpenWork {
        let started = monotonic_ns();
        let mut state = lock(&self.0);
        state.next_token = state.next_token.wrapping_add(1);
        let open = OpenWork { token: state.next_token, started, work };
        state.open.push(open);
        open
    }

    /// The work `open` ended now; `succeeded`: its bytes count (else it counts as failed).
    pub(crate) fn ended(&self, open: OpenWork, succeeded: bool) {
        let now = monotonic_ns();
        let mut state = lock(&self.0);
        if let Some(at) = state.open.iter().position(|other| other.token == open.token) {
            state.open.swap_remove(at);
        }
        let bytes = match open.work {
            StreamWork::Copy { bytes } | StreamWork::SyncCopy { bytes } => bytes,
            StreamWork::Kernel => 0,
        };
        let totals = state.totals_mut(open.work);
        totals.busy_ns = totals.busy_ns.saturating_add(now.saturating_sub(open.started));
        totals.count = totals.count.saturating_add(1);
        if succeeded {
            totals.bytes = totals.bytes.saturating_add(bytes);
        } else {
            totals.failed = totals.failed.saturating_add(1);
        }
    }

    fn snapshot(&self, now: u64) -> StreamOccupancy {
        let state = lock(&self.0);
        let mut totals = [state.copies, state.kernels, state.sync_copies];
        let mut running = [0u32; 3];
        for open in &state.open {
            let index = match open.work {
                StreamWork::Copy { .. } => 0,
                StreamWork::Kernel => 1,
                StreamWork::SyncCopy { .. } => 2,
            };
            totals[index].busy_ns = totals[index].busy_ns.saturating_add(now.saturating_sub(open.started));
            running[index] = running[index].saturating_add(1);
        }
        let [copies, kernels, sync_copies] = totals;
        let [copies_running, kernel_tasks_running, sync_copies_running] = running;
        StreamOccupancy {
            copy_busy_ns: copies.busy_ns,
            copies: copies.count,
            copy_bytes: copies.bytes,
            failed_copies: copies.failed,
            sync_copy_busy_ns: sync_copies.busy_ns,
            sync_copies: sync_copies.count,
            sync_copy_bytes: sync_copies.bytes,
            kernel_task_ns: kernels.busy_ns,
            kernel_tasks: kernels.count,
            copies_running,
            sync_copies_running,
            kernel_tasks_running,
        }
    }
}

/// Times `copy`, a synchronous runtime copy of `bytes` (device memory on at least one side), as work of `device`'s
/// synchronous copies; `None` (no current device): runs it uncounted.
pub(crate) fn timed_sync_copy<R>(device: Option<i32>, bytes: usize, copy: impl FnOnce() -> R) -> R {
    let Some(device) = device else {
        return copy();
    };
    /// Ends the copy's entry even if the copy panics (the entry point catches the panic; the copy then counts).
    struct Ends(Arc<StreamCounters>, OpenWork);
    impl Drop for Ends {
        fn drop(&mut self) {
            self.0.ended(self.1, true);
        }
    }
    let counters = stream_counters(device);
    let open = counters.started(StreamWork::SyncCopy { bytes: bytes as u64 });
    let _ends = Ends(counters, open);
    copy()
}

/// The emulated AI CPU of one device: its threads' time (executing a task, polling device memory within one, idle)
/// and its tasks.
#[derive(Debug, Default)]
pub(crate) struct AiCpuCounters(Mutex<AiCpuState>);

#[derive(Debug, Default)]
struct AiCpuState {
    /// Per thread, in creation order.
    threads: Vec<AiCpuThread>,
    /// Finished tasks' totals.
    executing_ns: u64,
    polling_ns: u64,
    launched: u64,
    run: u64,
    failed: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct AiCpuThread {
    started_ns: u64,
    /// The start of the task it runs now.
    task_since: Option<u64>,
    /// Polling of that task so far.
    task_polling_ns: u64,
}

impl AiCpuCounters {
    /// A thread of the AI CPU starts now; its index for the other calls.
    pub(crate) fn thread_started(&self) -> usize {
        let mut state = lock(&self.0);
        state.threads.push(AiCpuThread { started_ns: monotonic_ns(), ..AiCpuThread::default() });
        state.threads.len() - 1
    }

    /// An AI-CPU task was launched (queued on a stream).
    pub(crate) fn launched(&self) {
        lock(&self.0).launched += 1;
    }

    /// Thread `thread` takes a task now.
    pub(crate) fn task_started(&self, thread: usize) {
        let now = monotonic_ns();
        if let Some(slot) = lock(&self.0).threads.get_mut(thread) {
            slot.task_since = Some(now);
            slot.task_polling_ns = 0;
        }
    }

    /// Thread `thread`'s task polled device memory for `ns`.
    pub(crate) fn polled(&self, thread: usize, ns: u64) {
        if let Some(slot) = lock(&self.0).threads.get_mut(thread) {
            slot.task_polling_ns = slot.task_polling_ns.saturating_add(ns);
        }
    }

    /// Thread `thread`'s task ended now (`succeeded`, or it failed).
    pub(crate) fn task_ended(&self, thread: usize, succeeded: bool) {
        let now = monotonic_ns();
        let mut state = lock(&self.0);
        let Some(slot) = state.threads.get_mut(thread) else { return };
        let Some(since) = slot.task_since.take() else { return };
        let total = now.saturating_sub(since);
        let polling = slot.task_polling_ns.min(total);
        slot.task_polling_ns = 0;
        state.executing_ns = state.executing_ns.saturating_add(total - polling);
        state.polling_ns = state.polling_ns.saturating_add(polling);
        state.run += 1;
        state.failed += u64::from(!succeeded);
    }

    fn snapshot(&self, now: u64) -> AiCpuOccupancy {
        let state = lock(&self.0);
        let mut out = AiCpuOccupancy {
            threads: state.threads.len() as u32,
            executing_ns: state.executing_ns,
            polling_ns: state.polling_ns,
            tasks_launched: state.launched,
            tasks_run: state.run,
            tasks_failed: state.failed,
            ..AiCpuOccupancy::default()
        };
        for thread in &state.threads {
            out.thread_ns = out.thread_ns.saturating_add(now.saturating_sub(thread.started_ns));
            if let Some(since) = thread.task_since {
                let total = now.saturating_sub(since);
                let polling = thread.task_polling_ns.min(total);
                out.executing_ns = out.executing_ns.saturating_add(total - polling);
                out.polling_ns = out.polling_ns.saturating_add(polling);
                out.running += 1;
            }
        }
        out.idle_ns = out.thread_ns.saturating_sub(out.executing_ns.saturating_add(out.polling_ns));
        out
    }
}

/// One device's counters.
#[derive(Debug)]
struct DeviceCounters {
    since_ns: u64,
    finished: BTreeMap<u32, BlockTotals>,
    live: Vec<Arc<CoreClock>>,
    channels: BTreeMap<u32, Arc<ChannelBusy>>,
    streams: Arc<StreamCounters>,
    aicpu: Arc<AiCpuCounters>,
}

impl DeviceCounters {
    fn new() -> Self {
        DeviceCounters {
            since_ns: monotonic_ns(),
            finished: BTreeMap::new(),
            live: Vec::new(),
            channels: BTreeMap::new(),
            streams: Arc::default(),
            aicpu: Arc::default(),
        }
    }
}

static DEVICES: LazyLock<Mutex<HashMap<i32, DeviceCounters>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// A block of `device` enters a core now; the clock the core keeps for it.
pub(crate) fn core_entered(device: i32, block: u32) -> Arc<CoreClock> {
    let mut devices = lock(&DEVICES);
    let counters = devices.entry(device).or_insert_with(DeviceCounters::new);
    let clock = Arc::new(CoreClock {
        block,
        entered_ns: monotonic_ns(),
        polling_ns: AtomicU64::new(0),
        polls: AtomicU64::new(0),
        hint_since: AtomicU64::new(0),
        version: AtomicU64::new(0),
    });
    counters.live.push(Arc::clone(&clock));
    clock
}

/// The block of `clock` left its core now: its time joins its block index's totals.
pub(crate) fn core_left(device: i32, clock: &Arc<CoreClock>) {
    let now = monotonic_ns();
    let mut devices = lock(&DEVICES);
    let counters = devices.entry(device).or_insert_with(DeviceCounters::new);
    counters.live.retain(|live| !Arc::ptr_eq(live, clock));
    let (executing, polling) = clock.split(now);
    let totals = counters.finished.entry(clock.block).or_default();
    totals.executing_ns = totals.executing_ns.saturating_add(executing);
    totals.polling_ns = totals.polling_ns.saturating_add(polling);
    totals.polls = totals.polls.saturating_add(clock.polls.load(Ordering::Relaxed));
    totals.runs += 1;
}

/// The busy counters of channel `index` of `device` (the same ones again for a channel created anew after a
/// SHMEM finalisation: the counts are the device's, cumulative).
pub(crate) fn channel_counters(device: i32, index: u32) -> Arc<ChannelBusy> {
    let mut devices = lock(&DEVICES);
    let counters = devices.entry(device).or_insert_with(DeviceCounters::new);
    Arc::clone(counters.channels.entry(index).or_default())
}

/// The AI-CPU counters of `device` (the same ones for the device's whole life in the process).
pub(crate) fn aicpu_counters(device: i32) -> Arc<AiCpuCounters> {
    let mut devices = lock(&DEVICES);
    let counters = devices.entry(device).or_insert_with(DeviceCounters::new);
    Arc::clone(&counters.aicpu)
}

/// The stream and synchronous-copy counters of `device` (the same ones for the device's whole life in the process).
pub(crate) fn stream_counters(device: i32) -> Arc<StreamCounters> {
    let mut devices = lock(&DEVICES);
    let counters = devices.entry(device).or_insert_with(DeviceCounters::new);
    Arc::clone(&counters.streams)
}

/// Occupancy of one device, cumulative since its counters were created: diff two snapshots for an interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceOccupancy {
    pub device: i32,
    /// When the snapshot was taken, on the twin's monotonic clock (ns since its own epoch, the first reading in the
    /// process): the difference of two snapshots' values is the wall time between them.
    pub taken_at_ns: u64,
    /// When the device's counters were created (its first block, SDMA engine, stream, counted copy or occupancy
    /// snapshot), same clock.
    pub since_ns: u64,
    /// Per block index (summed over every launch that ran that block), ascending.
    pub cores: Vec<CoreOccupancy>,
    /// Per SDMA channel that has existed on the device, by index, ascending.
    pub channels: Vec<ChannelOccupancy>,
    /// The runtime's copies (stream copy tasks, synchronous copies) and the streams' kernel-launch tasks.
    pub streams: StreamOccupancy,
    /// The emulated AI CPU's threads and tasks.
    pub aicpu: AiCpuOccupancy,
}

/// The emulated AI CPU of one device (module docs: what executing, polling and idle are), cumulative. A task in
/// progress counts up to the snapshot; the task counts are of finished tasks, except `tasks_launched`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AiCpuOccupancy {
    /// AI-CPU threads started on the device (they live as long as the process).
    pub threads: u32,
    /// The threads' lives so far, summed: `executing_ns + polling_ns + idle_ns`.
    pub thread_ns: u64,
    /// Running tasks, their polling left out.
    pub executing_ns: u64,
    /// Tasks polling device memory (room in their ring, their completion word).
    pub polling_ns: u64,
    /// Waiting for a task.
    pub idle_ns: u64,
    /// AI-CPU kernel launches queued on the device's streams.
    pub tasks_launched: u64,
    /// Tasks finished (succeeded or failed) and failed.
    pub tasks_run: u64,
    pub tasks_failed: u64,
    /// Threads running a task now.
    pub running: u32,
}

impl DeviceOccupancy {
    /// Wall time the counters cover: `taken_at_ns - since_ns`.
    pub fn wall_ns(&self) -> u64 {
        self.taken_at_ns.saturating_sub(self.since_ns)
    }
}

/// One block index's emulated-core time (module docs: what executing and polling are).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CoreOccupancy {
    pub block: u32,
    pub executing_ns: u64,
    pub polling_ns: u64,
    /// Poll intervals started (runs of idle hints).
    pub polls: u64,
    /// Times a core entered this block (finished and running).
    pub runs: u64,
    /// Cores running this block now (their time so far is included).
    pub running: u32,
}

/// One SDMA channel engine's busy time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChannelOccupancy {
    pub index: u32,
    pub busy_ns: u64,
    /// Runs of work the engine finished (a run: the SQEs up to the tail it took after a doorbell).
    pub runs: u64,
    /// SQEs executed in finished runs (unlike `control::sqes_executed`, cumulative over re-creations of the channel).
    pub sqes: u64,
    /// Whether a run is in progress (its time so far is in `busy_ns`).
    pub running: bool,
}

/// The runtime's copy work on one device, cumulative (module docs: what is timed). A copy's busy time is summed over
/// copies: copies of several streams (or threads) at once each count, so the sum can exceed the wall time. Work in
/// progress counts up to the snapshot in the `_ns` figures; the counts and bytes are of finished work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamOccupancy {
    /// Stream copy tasks (`aclrtMemcpyAsync`): from the worker taking the task to its end.
    pub copy_busy_ns: u64,
    /// Stream copy tasks finished (done or failed; a task dropped by `aclrtStreamAbort` never ran and is not counted).
    pub copies: u64,
    /// Bytes of the stream copy tasks that succeeded.
    pub copy_bytes: u64,
    /// Stream copy tasks that failed when they ran (their time is in `copy_busy_ns`).
    pub failed_copies: u64,
    /// Synchronous copies (`aclrtMemcpy`, device memory on at least one side, from a thread whose current device this
    /// is): the copy itself, after argument checks.
    pub sync_copy_busy_ns: u64,
    /// Synchronous copies finished.
    pub sync_copies: u64,
    /// Bytes of the synchronous copies.
    pub sync_copy_bytes: u64,
    /// Stream kernel-launch tasks: from the worker taking the task to its end (the launch's blocks all exited). Not
    /// copy-engine time; the blocks' own time is in the cores' figures.
    pub kernel_task_ns: u64,
    /// Stream kernel-launch tasks finished (done or failed).
    pub kernel_tasks: u64,
    /// Stream copy tasks in progress (their time so far is in `copy_busy_ns`).
    pub copies_running: u32,
    /// Synchronous copies in progress (their time so far is in `sync_copy_busy_ns`).
    pub sync_copies_running: u32,
    /// Stream kernel-launch tasks in progress, such as a persistent kernel's launch (their time so far is in
    /// `kernel_task_ns`).
    pub kernel_tasks_running: u32,
}

/// A snapshot of `device`'s counters (created, empty, if it had none).
pub(crate) fn snapshot(device: i32) -> DeviceOccupancy {
    let mut devices = lock(&DEVICES);
    let counters = devices.entry(device).or_insert_with(DeviceCounters::new);
    let now = monotonic_ns();
    let mut cores: BTreeMap<u32, CoreOccupancy> = counters
        .finished
        .iter()
        .map(|(&block, totals)| {
            let core = CoreOccupancy {
                block,
                executing_ns: totals.executing_ns,
                polling_ns: totals.polling_ns,
                polls: totals.polls,
                runs: totals.runs,
                running: 0,
            };
            (block, core)
        })
        .collect();
    for live in &counters.live {
        let (executing, polling) = live.split(now);
        let core = cores.entry(live.block).or_insert(CoreOccupancy { block: live.block, ..CoreOccupancy::default() });
        core.executing_ns = core.executing_ns.saturating_add(executing);
        core.polling_ns = core.polling_ns.saturating_add(polling);
        core.polls = core.polls.saturating_add(live.polls.load(Ordering::Relaxed));
        core.runs += 1;
        core.running += 1;
    }
    let channels = counters.channels.iter().map(|(&index, busy)| busy.snapshot(index, now)).collect();
    DeviceOccupancy {
        device,
        taken_at_ns: now,
        since_ns: counters.since_ns,
        cores: cores.into_values().collect(),
        channels,
        streams: counters.streams.snapshot(now),
        aicpu: counters.aicpu.snapshot(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_block_is_reported_until_it_leaves_and_then_in_its_totals() {
        let device = 9_001;
        let clock = core_entered(device, 3);
        clock.add_polling(1_000);
        clock.poll_started();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let live = snapshot(device);
        let core = live.cores.iter().find(|core| core.block == 3).copied().expect("block 3 is reported");
        assert_eq!((core.running, core.runs, core.polls, core.polling_ns), (1, 1, 1, 1_000));
        assert!(core.executing_ns >= 1_000_000, "{core:?}");
        core_left(device, &clock);
        let done = snapshot(device);
        let after = done.cores.iter().find(|core| core.block == 3).copied().expect("still reported");
        assert_eq!((after.running, after.runs, after.polling_ns), (0, 1, 1_000));
        assert!(after.executing_ns >= core.executing_ns);
        assert!(done.taken_at_ns >= live.taken_at_ns && done.since_ns <= live.taken_at_ns);
    }

    /// A snapshot taken while the core naps in a hint counts the nap so far as polling, so that neither figure
    /// goes backwards when the nap ends.
    #[test]
    fn a_nap_in_progress_is_polling_up_to_the_snapshot() {
        let device = 9_004;
        let clock = core_entered(device, 1);
        let started = monotonic_ns();
        clock.hint_waits(started);
        std::thread::sleep(std::time::Duration::from_millis(3));
        let during = snapshot(device).cores[0];
        clock.hint_waited(started, monotonic_ns());
        let after = snapshot(device).cores[0];
        assert!(during.polling_ns >= 3_000_000, "{during:?}");
        assert!(
            after.polling_ns >= during.polling_ns && after.executing_ns >= during.executing_ns,
            "{during:?} {after:?}"
        );
        assert!(during.executing_ns < 1_000_000, "the nap was counted as executing: {during:?}");
        core_left(device, &clock);
    }

    #[test]
    fn polling_never_exceeds_the_block_time() {
        let device = 9_002;
        let clock = core_entered(device, 0);
        clock.add_polling(u64::MAX / 2);
        let snapshot = snapshot(device);
        let core = snapshot.cores[0];
        assert_eq!(core.executing_ns, 0);
        assert!(core.polling_ns <= snapshot.wall_ns(), "{core:?} over {} ns", snapshot.wall_ns());
        core_left(device, &clock);
    }

    #[test]
    fn a_channel_is_busy_only_while_it_runs() {
        let device = 9_003;
        let busy = channel_counters(device, 5);
        busy.run_started();
        std::thread::sleep(std::time::Duration::from_millis(3));
        let during = snapshot(device).channels[0];
        assert!(during.running && during.busy_ns >= 3_000_000 && during.runs == 0, "{during:?}");
        busy.run_ended(7);
        let ended = snapshot(device).channels[0];
        std::thread::sleep(std::time::Duration::from_millis(3));
        let idle = snapshot(device).channels[0];
        assert_eq!((ended.index, ended.runs, ended.sqes, ended.running), (5, 1, 7, false));
        assert_eq!(idle.busy_ns, ended.busy_ns, "an idle channel's busy time does not grow");
        // The same counters for a channel created again.
        assert!(Arc::ptr_eq(&busy, &channel_counters(device, 5)));
    }

    #[test]
    fn stream_work_is_counted_by_kind_and_work_in_progress_up_to_now() {
        let device = 9_005;
        let counters = stream_counters(device);
        assert!(Arc::ptr_eq(&counters, &stream_counters(device)), "one set of counters per device");
        let copy = counters.started(StreamWork::Copy { bytes: 4096 });
        std::thread::sleep(std::time::Duration::from_millis(2));
        let during = snapshot(device).streams;
        assert_eq!(
            (during.copies, during.copy_bytes, during.copies_running, during.kernel_tasks_running),
            (0, 0, 1, 0)
        );
        assert!(during.copy_busy_ns >= 2_000_000, "{during:?}");
        counters.ended(copy, true);
        let failed = counters.started(StreamWork::Copy { bytes: 1 << 20 });
        counters.ended(failed, false);
        let kernel = counters.started(StreamWork::Kernel);
        std::thread::sleep(std::time::Duration::from_millis(1));
        counters.ended(kernel, true);
        let sync = counters.started(StreamWork::SyncCopy { bytes: 64 });
        counters.ended(sync, true);
        let done = snapshot(device).streams;
        assert_eq!(
            (
                done.copies,
                done.copy_bytes,
                done.failed_copies,
                done.kernel_tasks,
                done.sync_copies,
                done.sync_copy_bytes
            ),
            (2, 4096, 1, 1, 1, 64),
            "{done:?}"
        );
        assert_eq!((done.copies_running, done.sync_copies_running, done.kernel_tasks_running), (0, 0, 0));
        assert!(done.copy_busy_ns >= during.copy_busy_ns && done.kernel_task_ns >= 1_000_000, "{done:?}");
        // A kernel task adds no copy time.
        let idle = snapshot(device).streams;
        let kernel = counters.started(StreamWork::Kernel);
        std::thread::sleep(std::time::Duration::from_millis(1));
        let launching = snapshot(device).streams;
        assert_eq!((launching.kernel_tasks_running, launching.copies_running), (1, 0), "{launching:?}");
        assert!(launching.kernel_task_ns >= idle.kernel_task_ns + 1_000_000, "{launching:?}");
        counters.ended(kernel, true);
        let after = snapshot(device).streams;
        assert_eq!(
            (after.copy_busy_ns, after.copies, after.sync_copy_busy_ns),
            (idle.copy_busy_ns, idle.copies, idle.sync_copy_busy_ns)
        );
        assert_eq!(after.kernel_tasks, idle.kernel_tasks + 1);
    }

    #[test]
    fn a_sync_copy_without_a_device_is_run_but_not_counted() {
        let device = 9_006;
        let before = snapshot(device).streams;
        assert_eq!(timed_sync_copy(None, 4096, || 7), 7);
        assert_eq!(snapshot(device).streams, before);
        assert_eq!(timed_sync_copy(Some(device), 4096, || 8), 8);
        let after = snapshot(device).streams;
        assert_eq!((after.sync_copies, after.sync_copy_bytes, after.copies), (1, 4096, 0), "{after:?}");
    }
}

/// One run of an SDMA engine, recorded while [`record_engine_runs`] is on: from taking the doorbell's tail to the
/// stop of the run (caught up, interrupted or at a bad SQE), on the twin's clock ([`clock_ns`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineRun {
    pub device: i32,
    pub channel: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// SQEs executed in the run.
    pub sqes: u64,
}

/// Runs kept at most between two [`take_engine_runs`]; later runs are counted as dropped.
pub const ENGINE_RUN_CAPACITY: usize = 1 << 20;

/// Devices whose engines record their runs, and how many they are (the engines' fast path reads only the count).
static RECORDING: LazyLock<Mutex<std::collections::HashSet<i32>>> = LazyLock::new(Default::default);
static RECORDING_COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// The runs recorded, and the runs dropped per device (capacity reached).
type RunLog = (Vec<EngineRun>, HashMap<i32, u64>);
static ENGINE_RUNS: LazyLock<Mutex<RunLog>> = LazyLock::new(Default::default);

/// Turns the record of `device`'s engine runs on or off (off by default). Per device, so that engines of one process
/// trace independently.
pub(crate) fn record_engine_runs(device: i32, on: bool) {
    let mut recording = lock(&RECORDING);
    if on {
        recording.insert(device);
    } else {
        recording.remove(&device);
    }
    RECORDING_COUNT.store(recording.len(), Ordering::Release);
}

/// Whether `device`'s runs are recorded: one relaxed load per run while no device records.
pub(crate) fn engine_runs_recorded(device: i32) -> bool {
    RECORDING_COUNT.load(Ordering::Relaxed) != 0 && lock(&RECORDING).contains(&device)
}

/// Records one run.
pub(crate) fn push_engine_run(run: EngineRun) {
    let mut runs = lock(&ENGINE_RUNS);
    if runs.0.len() < ENGINE_RUN_CAPACITY {
        runs.0.push(run);
    } else {
        *runs.1.entry(run.device).or_default() += 1;
    }
}

/// `device`'s runs recorded since the last call for it, and how many of its runs were dropped (capacity reached).
/// Other devices' runs stay for their own calls.
pub(crate) fn take_engine_runs(device: i32) -> (Vec<EngineRun>, u64) {
    let mut runs = lock(&ENGINE_RUNS);
    let dropped = runs.1.remove(&device).unwrap_or(0);
    let (mine, others): (Vec<EngineRun>, Vec<EngineRun>) =
        std::mem::take(&mut runs.0).into_iter().partition(|run| run.device == device);
    runs.0 = others;
    (mine, dropped)
}
