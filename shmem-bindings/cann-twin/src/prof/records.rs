//! The profiler's task records: what a running session keeps of each task the twin ran. The stream workers and the
//! synchronous copy path record ([`ran`]); the `aclprof*` functions of the parent module start and stop sessions.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Tasks one session keeps; past this it counts the rest as dropped and `aclprofStop` says so.
pub const MAX_RECORDS: usize = 1 << 20;

/// The kinds of task the twin records, named as the runtime registers them for profiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskType {
    /// A copy: a stream's `aclrtMemcpyAsync`, or a synchronous `aclrtMemcpy` reaching device memory.
    Memcpy,
    /// A kernel launched on the AI Vector cores.
    KernelAivec,
    /// A task of the AI CPU.
    KernelAicpu,
}

impl TaskType {
    /// The task type's name in msprof's export.
    pub fn name(self) -> &'static str {
        match self {
            TaskType::Memcpy => "MEMCPY_ASYNC",
            TaskType::KernelAivec => "KERNEL_AIVEC",
            TaskType::KernelAicpu => "KERNEL_AICPU",
        }
    }
}

#[derive(Debug)]
pub(super) struct Record {
    pub(super) device: i32,
    pub(super) kind: TaskType,
    pub(super) stream: u32,
    pub(super) task: u32,
    pub(super) start_ns: u64,
    pub(super) end_ns: u64,
}

#[derive(Debug)]
pub(super) struct Config {
    pub(super) devices: Vec<u32>,
    pub(super) data_types: u64,
    pub(super) started: bool,
}

#[derive(Debug, Default)]
pub(super) struct State {
    /// Set by `aclprofInit`, cleared by `aclprofFinalize`.
    pub(super) path: Option<PathBuf>,
    /// Every live config, by its address (boxed: the address is the handle and must not move as the list grows).
    #[allow(clippy::vec_box)]
    pub(super) configs: Vec<Box<Config>>,
    /// Running sessions: the config's address and what it recorded.
    pub(super) sessions: Vec<Session>,
    /// Sessions written so far (the `<n>` of the file names).
    pub(super) written: u32,
}

#[derive(Debug)]
pub(super) struct Session {
    pub(super) config: usize,
    pub(super) devices: Vec<u32>,
    pub(super) records: Vec<Record>,
    pub(super) dropped: u64,
}

/// Sessions running (a relaxed load on every task: nothing else when none runs).
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// A session started (`aclprofStart`): tasks are recorded from now on.
pub(super) fn session_started() {
    RUNNING.fetch_add(1, Ordering::Relaxed);
}

/// A session stopped (`aclprofStop`).
pub(super) fn session_stopped() {
    RUNNING.fetch_sub(1, Ordering::Relaxed);
}
static NEXT_TASK: AtomicU32 = AtomicU32::new(0);

pub(super) fn state() -> MutexGuard<'static, State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(Default::default).lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(super) fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as u64)
}

/// A task is about to run: its start time if a session is running, else `None` (one relaxed load).
#[inline]
pub(crate) fn started() -> Option<u64> {
    (RUNNING.load(Ordering::Relaxed) > 0).then(unix_ns)
}

/// A task of `kind` on `device`'s stream `stream` has ended; `started` is what [`started`] returned before it ran.
/// Recorded into every running session that profiles `device`. The hook of every task kind.
#[inline]
pub(crate) fn ran(device: i32, stream: u32, kind: TaskType, started: Option<u64>) {
    if started.is_none() && RUNNING.load(Ordering::Relaxed) == 0 {
        return;
    }
    record(device, stream, kind, started);
}

#[cold]
fn record(device: i32, stream: u32, kind: TaskType, started: Option<u64>) {
    let end_ns = unix_ns();
    let start_ns = started.unwrap_or(end_ns);
    let task = NEXT_TASK.fetch_add(1, Ordering::Relaxed);
    let mut state = state();
    for session in state.sessions.iter_mut().filter(|session| session.devices.contains(&(device as u32))) {
        if session.records.len() >= MAX_RECORDS {
            session.dropped += 1;
        } else {
            session.records.push(Record { device, kind, stream, task, start_ns, end_ns });
        }
    }
}
