//! Batches: a capacity, the task slots submitted so far, and a signal that wakes waiters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::transfer::{CompletionPoller, CompletionSignal, TaskSlot, TransferState, TransferStatus};

/// Longest sleep of a batch wait on one transport's completion events while tasks of other paths are also pending
/// (their completions arrive through the [`CompletionSignal`], which that sleep does not watch).
const MIXED_WAIT_SLICE: Duration = Duration::from_millis(1);
/// Longest sleep of a batch wait on its transport's completion events otherwise: a safety net for tasks finished
/// by a thread that does not wake the waiter (transports wake it for the ones they know of: a lost peer, shutdown).
const POLLER_WAIT_SLICE: Duration = Duration::from_millis(50);
/// Nap of a batch wait while another thread is collecting the same transport's completions.
const CONTENDED_WAIT_SLICE: Duration = Duration::from_micros(50);

/// One allocated batch.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) capacity: usize,
    tasks: Mutex<Vec<Arc<TaskSlot>>>,
    /// Counts terminal transitions so that waiters sleep instead of spinning.
    pub(crate) signal: Arc<CompletionSignal>,
    /// Transports of this batch's tasks whose completions a waiting thread can collect itself.
    pollers: Mutex<Vec<Arc<dyn CompletionPoller>>>,
    /// Whether some task went to a transport without a poller.
    other_paths: AtomicBool,
    /// The paths of its tasks, noted only while tracing (docs/trace.md).
    pub(crate) traced_paths: Mutex<Vec<&'static str>>,
}

impl Batch {
    pub(crate) fn new(capacity: usize) -> Self {
        Batch {
            capacity,
            tasks: Mutex::new(Vec::with_capacity(capacity)),
            signal: Arc::new(CompletionSignal::default()),
            pollers: Mutex::new(Vec::new()),
            other_paths: AtomicBool::new(false),
            traced_paths: Mutex::new(Vec::new()),
        }
    }

    /// Records which transport carries tasks of this batch (before they are submitted to it).
    pub(crate) fn note_transport(&self, poller: Option<Arc<dyn CompletionPoller>>) {
        match poller {
            Some(poller) => {
                let mut pollers = self.pollers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if !pollers.iter().any(|known| Arc::ptr_eq(known, &poller)) {
                    pollers.push(poller);
                }
            }
            None => self.other_paths.store(true, Ordering::Release),
        }
    }

    /// Notes (while tracing) that tasks of this batch go to `path`.
    pub(crate) fn note_traced_path(&self, path: &'static str) {
        self.signal.set_traced();
        let mut paths = self.traced_paths.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !paths.contains(&path) {
            paths.push(path);
        }
    }

    /// The path a traced batch's events belong to: its one path, or `mixed`; `None` when it was not traced.
    pub(crate) fn traced_path(&self) -> Option<&'static str> {
        let paths = self.traced_paths.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match paths.as_slice() {
            [] => None,
            [one] => Some(one),
            _ => Some("mixed"),
        }
    }

    fn pollers(&self) -> Vec<Arc<dyn CompletionPoller>> {
        self.pollers.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Lets the batch's pollers collect ready completions (status queries make progress without a drain thread).
    pub(crate) fn poll(&self) {
        for poller in self.pollers() {
            let _ = poller.poll();
        }
    }

    pub(crate) fn tasks(&self) -> std::sync::MutexGuard<'_, Vec<Arc<TaskSlot>>> {
        self.tasks.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Mooncake's batch status: COMPLETED if every task completed, FAILED if any failed or timed out, else PENDING.
    pub(crate) fn status(&self) -> TransferStatus {
        let tasks = self.tasks();
        let now = Instant::now();
        let mut transferred_bytes = 0;
        let mut all_completed = true;
        let mut any_failed = false;
        for task in tasks.iter() {
            let state = task.state_at(now);
            transferred_bytes += task.transferred_bytes();
            all_completed &= state == TransferState::Completed;
            any_failed |= matches!(state, TransferState::Failed | TransferState::Timeout | TransferState::Canceled);
        }
        let state = if any_failed {
            TransferState::Failed
        } else if all_completed && !tasks.is_empty() {
            TransferState::Completed
        } else if tasks.is_empty() {
            TransferState::Waiting
        } else {
            TransferState::Pending
        };
        TransferStatus { state, transferred_bytes }
    }

    /// Tasks not yet terminal.
    pub(crate) fn pending(&self) -> usize {
        let now = Instant::now();
        self.tasks().iter().filter(|task| !task.state_at(now).is_terminal()).count()
    }

    /// Waits until every submitted task is terminal, or until `until` (if given) has passed; bounded by the latest
    /// task deadline either way (the watchdog turns overdue tasks to TIMEOUT when their state is read). The status
    /// is PENDING only when `until` came first.
    ///
    /// With pollers (aiv), the waiting thread collects the completions itself and sleeps on the device's completion
    /// events; otherwise it sleeps on the [`CompletionSignal`] until the transports' threads finish the tasks.
    pub(crate) fn wait(&self, until: Option<Instant>) -> TransferStatus {
        let pollers = self.pollers();
        for poller in &pollers {
            poller.attach();
        }
        let mixed = pollers.len() > 1 || self.other_paths.load(Ordering::Acquire);
        // The completion tickets of the pending tasks, when all are known (one poller carries every task).
        let mut tickets: Vec<u64> = Vec::new();
        // This thread's CPU time spent waiting (polling, naps' wake-ups), charged to the tasks at the end.
        let mut waited_cpu = 0u64;
        loop {
            // One clock reading and no copy of the task list per pass (this loop runs once per wake-up).
            let (latest_deadline, finished_needed, all_ticketed) = {
                let tasks = self.tasks();
                let now = Instant::now();
                tickets.clear();
                let mut all_ticketed = !mixed;
                let mut latest = None;
                for task in tasks.iter().filter(|t| !t.state_at(now).is_terminal()) {
                    latest = latest.max(Some(task.deadline()));
                    if all_ticketed {
                        match task.ticket() {
                            0 => all_ticketed = false,
                            ticket => tickets.push(ticket),
                        }
                    }
                }
                (latest, tasks.len(), all_ticketed)
            };
            let Some(latest_deadline) = latest_deadline else {
                break;
            };
            // The caller's own limit: the tasks' deadlines still bound every sleep below.
            let latest_deadline = match until {
                Some(until) if Instant::now() >= until => break,
                Some(until) => latest_deadline.min(until),
                None => latest_deadline,
            };
            let Some(first) = pollers.first() else {
                // It sleeps until the paths' threads finish its tasks: its wake-ups are its only CPU here.
                let cpu = crate::cpu_time::thread_cpu_time_ns();
                self.signal.wait_for(finished_needed, latest_deadline);
                waited_cpu += crate::cpu_time::thread_cpu_time_ns().saturating_sub(cpu);
                continue;
            };
            let mut contended = false;
            for poller in &pollers {
                contended |= poller.poll();
            }
            if self.signal.finished() >= finished_needed {
                continue;
            }
            let now = Instant::now();
            if now >= latest_deadline {
                // Past every deadline: reading the states above turned the overdue tasks to TIMEOUT.
                continue;
            }
            let slice = if contended {
                CONTENDED_WAIT_SLICE
            } else if mixed {
                MIXED_WAIT_SLICE
            } else {
                POLLER_WAIT_SLICE
            };
            let slice = slice.min(latest_deadline - now);
            if all_ticketed && !contended {
                // Return only when this batch's own completions are out, not at every completion on the device. The
                // tickets were read before the poll above, so completions it collected only make the wait shorter.
                waited_cpu += first.wait_for(&tickets, slice);
            } else {
                waited_cpu += first.wait(slice);
            }
        }
        for poller in &pollers {
            poller.detach();
        }
        // The wait is the paths': each task carries its share, so a mixed batch charges each path for its tasks.
        let tasks = self.tasks();
        if waited_cpu > 0 && !tasks.is_empty() {
            let share = waited_cpu.div_ceil(tasks.len() as u64);
            for task in tasks.iter() {
                task.charge_waiting(share);
            }
        }
        drop(tasks);
        self.status()
    }
}
