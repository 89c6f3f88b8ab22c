//! How finished tasks wake the threads that wait for them: the batch's completion signal, and the poller a
//! transport may offer so that a waiting thread collects its own completions.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

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

/// Completions a waiting thread can collect itself (see [`Transport::completion_poller`]).
///
/// The engine's batch wait calls [`CompletionPoller::attach`] once, then loops: `token`, `poll`, check the batch,
/// `wait(token, ..)`; then `detach`. While a thread is attached the transport's own background completion thread
/// backs off, so a completion wakes one Host thread, the one that wants it.
pub trait CompletionPoller: Send + Sync + fmt::Debug {
    /// Finishes the task slots of every completion ready now; cheap when none is. Returns true when another thread
    /// was collecting completions at the same time (it may finish the caller's tasks without waking the caller, so
    /// the caller should only nap before looking again).
    fn poll(&self) -> bool;
    /// A token for [`CompletionPoller::wait`], read before `poll`.
    fn token(&self) -> u32;
    /// Sleeps until the device reported progress after `token` was read, or `timeout` passes.
    fn wait(&self, token: u32, timeout: Duration);
    /// Sleeps until the completions of the tasks with these tickets (`TaskSlot::ticket`, all set by this poller's
    /// transport) are ready to collect, or `timeout` passes; progress on other tasks wakes nobody. The default waits
    /// for any progress, as [`CompletionPoller::wait`].
    fn wait_for(&self, tickets: &[u64], token: u32, timeout: Duration) {
        let _ = tickets;
        self.wait(token, timeout);
    }
    /// A thread starts waiting through this poller.
    fn attach(&self);
    /// That thread stopped waiting.
    fn detach(&self);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
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
