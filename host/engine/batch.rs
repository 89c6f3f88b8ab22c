//! Batches: a capacity, the task slots submitted so far, and a signal that wakes waiters.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::request::{TransferState, TransferStatus};
use super::task::TaskSlot;
use crate::transport::CompletionPoller;

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
}

/// Wakes threads waiting for tasks of one batch to finish.
///
/// A waiter sleeps until the batch's count of finished tasks reaches its target, and is woken once, when it does:
/// not once per finished task. (Waking it per task cost a context switch per transfer, taken from the threads that
/// move the data.)
#[derive(Debug)]
pub struct CompletionSignal {
    finished: AtomicUsize,
    /// The smallest target of the threads inside `wait_for`, `usize::MAX` when none waits: a notification below it
    /// skips the lock and the wake-up system call.
    wake_at: AtomicUsize,
    /// Targets of the threads inside `wait_for`.
    targets: Mutex<Vec<usize>>,
    wake: Condvar,
}

impl Default for CompletionSignal {
    fn default() -> Self {
        CompletionSignal {
            finished: AtomicUsize::new(0),
            wake_at: AtomicUsize::new(usize::MAX),
            targets: Mutex::new(Vec::new()),
            wake: Condvar::new(),
        }
    }
}

impl CompletionSignal {
    /// Called once per task that reaches a terminal state.
    pub fn notify(&self) {
        // SeqCst pairs with `wait_for`: the waiter publishes its target and then reads `finished`, the notifier
        // publishes `finished` and then reads `wake_at`; in a single total order at least one of them sees the
        // other, so a waiter never sleeps through the notification that reaches its target.
        let finished = self.finished.fetch_add(1, Ordering::SeqCst) + 1;
        if finished < self.wake_at.load(Ordering::SeqCst) {
            return;
        }
        // Taking the lock orders this wake-up after a waiter's check-then-wait.
        let _targets = self.targets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.wake.notify_all();
    }

    /// Terminal transitions counted so far.
    pub fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }

    /// Sleeps until `notify` has been called `target` times in all, or `until` passes.
    pub fn wait_for(&self, target: usize, until: Instant) {
        let mut targets = self.targets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        targets.push(target);
        self.wake_at.store(targets.iter().copied().min().unwrap_or(usize::MAX), Ordering::SeqCst);
        while self.finished.load(Ordering::SeqCst) < target {
            let now = Instant::now();
            if now >= until {
                break;
            }
            targets = match self.wake.wait_timeout(targets, until - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        if let Some(position) = targets.iter().position(|&t| t == target) {
            targets.swap_remove(position);
        }
        self.wake_at.store(targets.iter().copied().min().unwrap_or(usize::MAX), Ordering::SeqCst);
    }
}

impl Batch {
    pub(crate) fn new(capacity: usize) -> Self {
        Batch {
            capacity,
            tasks: Mutex::new(Vec::with_capacity(capacity)),
            signal: Arc::new(CompletionSignal::default()),
            pollers: Mutex::new(Vec::new()),
            other_paths: AtomicBool::new(false),
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

    /// Waits until every submitted task is terminal; bounded by the latest task deadline (the watchdog turns
    /// overdue tasks to TIMEOUT when their state is read).
    ///
    /// With pollers (aiv), the waiting thread collects the completions itself and sleeps on the device's completion
    /// events; otherwise it sleeps on the [`CompletionSignal`] until the transports' threads finish the tasks.
    pub(crate) fn wait(&self) -> TransferStatus {
        let pollers = self.pollers();
        for poller in &pollers {
            poller.attach();
        }
        let mixed = pollers.len() > 1 || self.other_paths.load(Ordering::Acquire);
        // The completion tickets of the pending tasks, when all are known (one poller carries every task).
        let mut tickets: Vec<u64> = Vec::new();
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
            let Some(first) = pollers.first() else {
                self.signal.wait_for(finished_needed, latest_deadline);
                continue;
            };
            let token = first.token();
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
                // Wake only when this batch's own completions are out, not at every completion on the device. The
                // tickets were read before the poll above, so completions it collected only make the wait shorter.
                first.wait_for(&tickets, token, slice);
            } else {
                first.wait(token, slice);
            }
        }
        for poller in &pollers {
            poller.detach();
        }
        self.status()
    }
}

#[cfg(test)]
mod signal_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_waiter_wakes_when_its_target_is_reached_and_not_before() {
        let signal = Arc::new(CompletionSignal::default());
        let waiter = {
            let signal = signal.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                signal.wait_for(3, started + Duration::from_secs(10));
                (signal.finished.load(Ordering::SeqCst), started.elapsed())
            })
        };
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(20));
            signal.notify();
        }
        let (finished, waited) = waiter.join().expect("waiter thread");
        assert_eq!(finished, 3, "woke before its target");
        assert!(waited < Duration::from_secs(5), "slept through the notification that reached its target: {waited:?}");
        assert_eq!(signal.wake_at.load(Ordering::SeqCst), usize::MAX, "no waiter left registered");
    }

    #[test]
    fn a_waiter_gives_up_at_its_deadline() {
        let signal = CompletionSignal::default();
        let started = Instant::now();
        signal.wait_for(1, started + Duration::from_millis(30));
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert_eq!(signal.finished.load(Ordering::SeqCst), 0);
    }
}
