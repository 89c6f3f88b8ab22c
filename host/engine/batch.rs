//! Batches: a capacity, the task slots submitted so far, and a signal that wakes waiters.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::request::{TransferState, TransferStatus};
use super::task::TaskSlot;

/// One allocated batch.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) capacity: usize,
    tasks: Mutex<Vec<Arc<TaskSlot>>>,
    /// Counts terminal transitions so that waiters sleep instead of spinning.
    pub(crate) signal: Arc<CompletionSignal>,
}

/// Wakes threads waiting for tasks of one batch to finish.
#[derive(Debug, Default)]
pub struct CompletionSignal {
    finished: AtomicUsize,
    /// Threads inside `wait_for`; a notification with no waiter skips the lock and the wake-up system call.
    waiters: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl CompletionSignal {
    /// Called once per task that reaches a terminal state.
    pub fn notify(&self) {
        // SeqCst pairs with `wait_for`: the waiter publishes itself and then reads `finished`, the notifier publishes
        // `finished` and then reads `waiters`; in a single total order at least one of them sees the other.
        self.finished.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return;
        }
        // Taking the lock orders this wake-up after a waiter's check-then-wait.
        let _guard = self.lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.wake.notify_all();
    }

    /// Sleeps until `notify` has been called `target` times in all, or `until` passes.
    pub fn wait_for(&self, target: usize, until: Instant) {
        let mut guard = self.lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.waiters.fetch_add(1, Ordering::SeqCst);
        while self.finished.load(Ordering::SeqCst) < target {
            let now = Instant::now();
            if now >= until {
                break;
            }
            guard = match self.wake.wait_timeout(guard, until - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Batch {
    pub(crate) fn new(capacity: usize) -> Self {
        Batch {
            capacity,
            tasks: Mutex::new(Vec::with_capacity(capacity)),
            signal: Arc::new(CompletionSignal::default()),
        }
    }

    pub(crate) fn tasks(&self) -> std::sync::MutexGuard<'_, Vec<Arc<TaskSlot>>> {
        self.tasks.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Mooncake's batch status: COMPLETED if every task completed, FAILED if any failed or timed out, else PENDING.
    pub(crate) fn status(&self) -> TransferStatus {
        let tasks = self.tasks().clone();
        let mut transferred_bytes = 0;
        let mut all_completed = true;
        let mut any_failed = false;
        for task in &tasks {
            let state = task.state();
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
        self.tasks().iter().filter(|task| !task.state().is_terminal()).count()
    }

    /// Waits until every submitted task is terminal; bounded by the latest task deadline (the watchdog turns
    /// overdue tasks to TIMEOUT when their state is read).
    pub(crate) fn wait(&self) -> TransferStatus {
        loop {
            let tasks = self.tasks().clone();
            let Some(latest_deadline) = tasks.iter().filter(|t| !t.state().is_terminal()).map(|t| t.deadline()).max()
            else {
                return self.status();
            };
            let finished_needed = tasks.len();
            self.signal.wait_for(finished_needed, latest_deadline);
        }
    }
}
