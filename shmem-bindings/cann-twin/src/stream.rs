//! Streams: each one a worker thread that runs its tasks in submission order. Submission returns at once; the Host
//! learns of completion only from a stream synchronisation, which waits for every task submitted before it and
//! reports the first failure among them.
//!
//! Each task is timed for the device's occupancy (`crate::occupancy::StreamCounters`): two clock readings per task,
//! taken by the worker around the task, and the counters updated before the task's completion is published.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;

/// Work a stream runs.
/// While set, no stream worker starts a task (`control::hold_streams`).
static HELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Devices whose stream workers are held (`control::hold_device_streams`).
static HELD_DEVICES: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn held(device: i32) -> bool {
    HELD.load(std::sync::atomic::Ordering::Acquire) || lock(&HELD_DEVICES).contains(&device)
}

/// Holds every stream's worker before its next task (`true`) or lets them go on.
pub(crate) fn hold_all(held: bool) {
    HELD.store(held, std::sync::atomic::Ordering::Release);
}

/// Holds or releases the stream workers of `device` only.
pub(crate) fn hold_device(device: i32, held: bool) {
    let mut devices = lock(&HELD_DEVICES);
    devices.retain(|&other| other != device);
    if held {
        devices.push(device);
    }
}

pub(crate) enum Task {
    /// A copy, re-validated when it runs (the memory may have been freed since submission); `by` is the provenance
    /// writer id of the thread that submitted it (a Host thread, or the AI CPU's), which the worker acts as.
    Copy { device: i32, dst: usize, dest_max: usize, src: usize, count: usize, kind: aclrtMemcpyKind, by: u32 },
    /// A kernel launch on the stream's device (`crate::kernel`).
    Kernel { device: i32, launch: Box<crate::kernel::Launch> },
    /// An AI-CPU kernel launch on the stream's device (`crate::aicpu`): the worker hands it to an AI-CPU thread and
    /// waits for it, at most the launch's timeout.
    AiCpu { device: i32, launch: std::sync::Arc<crate::aicpu::Launch> },
}

#[derive(Default)]
struct Queue {
    tasks: VecDeque<Task>,
    submitted: u64,
    completed: u64,
    /// The first failure since the last synchronisation.
    error: aclError,
    shutdown: bool,
}

/// One stream.
pub(crate) struct Stream {
    pub device: i32,
    /// The stream's number in the profiler's records (`crate::prof`).
    serial: u32,
    queue: Mutex<Queue>,
    changed: Condvar,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// The device's stream counters (occupancy).
    counters: Arc<crate::occupancy::StreamCounters>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("device", &self.device).finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Stream {
    /// A stream of `device` whose worker runs tasks with `run`.
    pub(crate) fn spawn(device: i32, run: fn(&Task) -> aclError) -> Result<Arc<Stream>, aclError> {
        static SERIAL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let stream = Arc::new(Stream {
            device,
            serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            worker: Mutex::new(None),
            counters: crate::occupancy::stream_counters(device),
        });
        let worker_stream = Arc::clone(&stream);
        let handle = std::thread::Builder::new()
            .name(format!("cann-twin-stream-d{device}"))
            .spawn(move || worker_stream.work(run))
            .map_err(|_| ACL_ERROR_RT_NO_STREAM_RESOURCE)?;
        *lock(&stream.worker) = Some(handle);
        Ok(stream)
    }

    fn work(&self, run: fn(&Task) -> aclError) {
        loop {
            let task = {
                let mut queue = lock(&self.queue);
                loop {
                    let held = held(self.device);
                    if !held {
                        if let Some(task) = queue.tasks.pop_front() {
                            break task;
                        }
                    }
                    if queue.shutdown {
                        return;
                    }
                    queue = if held {
                        // Fault injection (`control::hold_streams`): look again soon.
                        self.changed
                            .wait_timeout(queue, Duration::from_millis(1))
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .0
                    } else {
                        self.changed.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner())
                    };
                }
            };
            let work = match &task {
                Task::Copy { count, .. } => crate::occupancy::StreamWork::Copy { bytes: *count as u64 },
                Task::Kernel { .. } | Task::AiCpu { .. } => crate::occupancy::StreamWork::Kernel,
            };
            let open = self.counters.started(work);
            let profiled = crate::prof::started();
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&task)))
                .unwrap_or(ACL_ERROR_RT_INTERNAL_ERROR);
            // Counted (and recorded by the profiler, one hook per task kind) before a synchronisation can see the
            // task done.
            self.counters.ended(open, code == ACL_SUCCESS);
            match &task {
                Task::Copy { .. } => {
                    crate::prof::ran(self.device, self.serial, crate::prof::TaskType::Memcpy, profiled)
                }
                Task::Kernel { .. } => {
                    crate::prof::ran(self.device, self.serial, crate::prof::TaskType::KernelAivec, profiled)
                }
                Task::AiCpu { .. } => {
                    crate::prof::ran(self.device, self.serial, crate::prof::TaskType::KernelAicpu, profiled)
                }
            }
            // What the task holds (a launch holds its binary) is released before a synchronisation can see it done.
            drop(task);
            let mut queue = lock(&self.queue);
            queue.completed += 1;
            if code != ACL_SUCCESS && queue.error == ACL_SUCCESS {
                queue.error = code;
            }
            self.changed.notify_all();
        }
    }

    pub(crate) fn submit(&self, task: Task) {
        let mut queue = lock(&self.queue);
        queue.tasks.push_back(task);
        queue.submitted += 1;
        self.changed.notify_all();
    }

    /// Waits until every task submitted so far has run (`None`: without limit), then returns and clears the first
    /// failure; `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT` when the limit passes first.
    pub(crate) fn synchronize(&self, timeout: Option<Duration>) -> aclError {
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        let mut queue = lock(&self.queue);
        let target = queue.submitted;
        while queue.completed < target {
            match deadline {
                None => queue = self.changed.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner()),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
                    }
                    queue = self
                        .changed
                        .wait_timeout(queue, deadline - now)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0;
                }
            }
        }
        std::mem::replace(&mut queue.error, ACL_SUCCESS)
    }

    /// `aclrtStreamAbort`: drops every task not yet started (they count as done, without effect) and clears the
    /// recorded failure; a task already running finishes. Returns how many tasks were dropped.
    pub(crate) fn abort(&self) -> usize {
        let mut queue = lock(&self.queue);
        let dropped = queue.tasks.len();
        queue.tasks.clear();
        queue.completed += dropped as u64;
        queue.error = ACL_SUCCESS;
        self.changed.notify_all();
        dropped
    }

    /// Lets the worker finish every queued task, then joins it.
    pub(crate) fn shut_down(&self) {
        lock(&self.queue).shutdown = true;
        self.changed.notify_all();
        if let Some(handle) = lock(&self.worker).take() {
            let _ = handle.join();
        }
    }
}
