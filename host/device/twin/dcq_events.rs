//! Targeted completion wake-ups: a Host thread that waits for particular DCQ entries sleeps until the kernel has
//! published them, instead of waking at every publish of the device.
//!
//! The kernel reports each publish with the block's new DCQ tail (`notify_host(context, dcq_tail)`). A waiter
//! registers what it needs (per block, the DCQ tail that covers its last pending transfer there) with its own futex
//! word; the kernel's hook wakes exactly the waiters whose needs are all met. Registration and the hook order their
//! accesses like [`super::wake::Waiter`]: the waiter publishes itself and then re-reads the tails, the hook stores the
//! tail and then looks for waiters, all sequentially consistent, so a publish between the waiter's check and its sleep
//! is never missed. Every sleep is bounded by the caller's timeout.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::wake::{futex_wait, futex_wake};

/// The published DCQ tails of one device's blocks and the threads waiting for them.
#[derive(Debug)]
pub struct DcqEvents {
    /// Per block, the DCQ tail the kernel last reported (free-running, as in the ring header).
    published: Vec<AtomicU32>,
    waiters: Mutex<Vec<Arc<DcqWaiter>>>,
    /// `waiters.len()`, read by the hook without the lock.
    registered: AtomicUsize,
    /// Threads woken by a publish that met their needs (for tests and diagnostics).
    targeted_wakeups: AtomicUsize,
}

#[derive(Debug)]
struct DcqWaiter {
    /// (block, DCQ tail to reach).
    needs: Vec<(u32, u32)>,
    /// 0 while registered, 1 once a waker has deregistered and woken it.
    word: AtomicU32,
}

impl DcqEvents {
    /// Tails of `blocks` blocks, all at 0 (the rings start empty).
    pub fn new(blocks: u32) -> Self {
        DcqEvents {
            published: (0..blocks).map(|_| AtomicU32::new(0)).collect(),
            waiters: Mutex::new(Vec::new()),
            registered: AtomicUsize::new(0),
            targeted_wakeups: AtomicUsize::new(0),
        }
    }

    /// Whether every (block, tail) of `needs` has been published (blocks out of range count as met, so a bad request
    /// never sleeps).
    fn met(&self, needs: &[(u32, u32)]) -> bool {
        needs.iter().all(|&(block, tail)| {
            self.published
                .get(block as usize)
                .is_none_or(|published| published.load(Ordering::SeqCst).wrapping_sub(tail) as i32 >= 0)
        })
    }

    /// The kernel of `block` published DCQ entries up to `tail` (called on the device's core thread).
    pub fn published(&self, block: u32, tail: u32) {
        let Some(published) = self.published.get(block as usize) else { return };
        published.store(tail, Ordering::SeqCst);
        if self.registered.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut woken = Vec::new();
        {
            let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            let mut i = 0;
            while i < waiters.len() {
                if self.met(&waiters[i].needs) {
                    // Deregistered here, so the woken thread need not take the lock again.
                    let waiter = waiters.swap_remove(i);
                    waiter.word.store(1, Ordering::SeqCst);
                    woken.push(waiter);
                } else {
                    i += 1;
                }
            }
            self.registered.store(waiters.len(), Ordering::SeqCst);
        }
        // The wake-up system calls after the lock: a thread registering meanwhile does not wait for them.
        for waiter in woken {
            self.targeted_wakeups.fetch_add(1, Ordering::Relaxed);
            futex_wake(&waiter.word);
        }
    }

    /// Sleeps until every (block, tail) of `needs` is published, [`DcqEvents::wake_all`] is called, or `timeout`.
    pub fn wait(&self, needs: &[(u32, u32)], timeout: Duration) {
        if self.met(needs) {
            return;
        }
        let waiter = Arc::new(DcqWaiter { needs: needs.to_vec(), word: AtomicU32::new(0) });
        {
            let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            waiters.push(waiter.clone());
            self.registered.store(waiters.len(), Ordering::SeqCst);
        }
        // Re-check after registering: a publish before the registration was seen here, one after it sees the waiter.
        if !self.met(needs) {
            futex_wait(&waiter.word, 0, timeout);
        }
        if waiter.word.load(Ordering::SeqCst) == 1 {
            // Woken by a publish or `wake_all`, which deregistered the waiter.
            return;
        }
        // Timed out, woken spuriously, or met at the re-check: deregister, unless a waker did meanwhile.
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(position) = waiters.iter().position(|known| Arc::ptr_eq(known, &waiter)) {
            waiters.swap_remove(position);
        }
        self.registered.store(waiters.len(), Ordering::SeqCst);
    }

    /// Wakes every registered waiter (Host-side failures: a lost peer, shutdown).
    pub fn wake_all(&self) {
        let woken: Vec<Arc<DcqWaiter>> = {
            let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            self.registered.store(0, Ordering::SeqCst);
            waiters.drain(..).inspect(|waiter| waiter.word.store(1, Ordering::SeqCst)).collect()
        };
        for waiter in woken {
            futex_wake(&waiter.word);
        }
    }

    /// Waiters woken because a publish met their needs, so far.
    pub fn targeted_wakeups(&self) -> usize {
        self.targeted_wakeups.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_waiter_sleeps_through_publishes_that_do_not_meet_its_needs_and_wakes_on_the_one_that_does() {
        let events = Arc::new(DcqEvents::new(2));
        let waiter = {
            let events = events.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                events.wait(&[(0, 3), (1, 2)], Duration::from_secs(10));
                started.elapsed()
            })
        };
        while events.registered.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        events.published(0, 3); // block 1 still short
        events.published(1, 1);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(events.targeted_wakeups(), 0, "woken before its needs were met");
        events.published(1, 2);
        let waited = waiter.join().expect("waiter");
        assert!(waited < Duration::from_secs(5), "slept through the publish that met its needs: {waited:?}");
        assert_eq!(events.targeted_wakeups(), 1);
        assert_eq!(events.registered.load(Ordering::SeqCst), 0, "the waiter deregistered");
    }

    #[test]
    fn needs_already_met_or_wrapped_do_not_sleep_and_wake_all_ends_a_wait() {
        let events = Arc::new(DcqEvents::new(1));
        events.published(0, 5);
        let started = Instant::now();
        events.wait(&[(0, 5)], Duration::from_secs(10));
        events.wait(&[(7, 1)], Duration::from_secs(10)); // no such block: never sleeps
        assert!(started.elapsed() < Duration::from_secs(1));
        // Free-running tails wrap: 2 is past u32::MAX - 1.
        events.published(0, 2);
        assert!(events.met(&[(0, u32::MAX - 1)]));
        assert!(!events.met(&[(0, 3)]));

        let waiter = {
            let events = events.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                events.wait(&[(0, 100)], Duration::from_secs(10));
                started.elapsed()
            })
        };
        while events.registered.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        events.wake_all();
        assert!(waiter.join().expect("waiter") < Duration::from_secs(5));
    }

    #[test]
    fn a_wait_is_bounded_by_its_timeout() {
        let events = DcqEvents::new(1);
        let started = Instant::now();
        events.wait(&[(0, 1)], Duration::from_millis(30));
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
