//! Sleeping instead of spinning: the wake-up words of the twin (2-core machines cannot afford busy cores).
//!
//! A [`Waiter`] is a sequence word and a waiter count. A waker bumps the sequence and makes the futex system call only
//! when somebody sleeps (io-uring's `need_wakeup` idea); a sleeper reads a token, re-checks its condition, then sleeps
//! on the futex only while the sequence still equals the token, with a timeout, so every wait is bounded and a wake
//! between the check and the sleep is never lost.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A futex-backed wake-up word.
#[derive(Debug, Default)]
pub struct Waiter {
    sequence: AtomicU32,
    sleepers: AtomicU32,
}

impl Waiter {
    /// Read before checking the condition waited for.
    pub fn token(&self) -> u32 {
        // SeqCst pairs with `notify`: either the waker sees our sleeper count, or we see its new sequence.
        self.sequence.load(Ordering::SeqCst)
    }

    /// Wakes every sleeper (cheap when nobody sleeps).
    pub fn notify(&self) {
        // SeqCst: the increment is ordered before the sleeper check (Dekker pattern with `sleep`).
        self.sequence.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake(&self.sequence);
        }
    }

    /// Sleeps while the sequence equals `token`, at most `timeout`.
    pub fn sleep(&self, token: u32, timeout: Duration) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        futex_wait(&self.sequence, token, timeout);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// The back-off every twin idle loop uses: spin briefly, then yield, then sleep.
    pub fn idle(&self, token: u32, spins: u32, sleep: Duration) {
        if spins < 16 {
            std::hint::spin_loop();
        } else if spins < 48 {
            std::thread::yield_now();
        } else {
            self.sleep(token, sleep);
        }
    }
}

pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let timespec = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT_PRIVATE reads the aligned u32 behind `word` (valid for the call) and compares it with
    // `expected`; the timespec lives on this stack frame for the duration of the call. Errors (EAGAIN when the value
    // changed, EINTR, ETIMEDOUT) all mean "re-check the condition", which every caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &timespec as *const libc::timespec,
        );
    }
}

pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE_PRIVATE only uses the address of `word` as a key; it dereferences nothing else.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_notify_wakes_a_sleeper_and_a_stale_token_does_not_sleep() {
        let waiter = Arc::new(Waiter::default());
        let token = waiter.token();
        waiter.notify();
        let started = Instant::now();
        waiter.sleep(token, Duration::from_secs(5));
        assert!(started.elapsed() < Duration::from_secs(4), "a stale token must not sleep");

        let token = waiter.token();
        let waker = {
            let waiter = waiter.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                waiter.notify();
            })
        };
        let started = Instant::now();
        while waiter.token() == token && started.elapsed() < Duration::from_secs(5) {
            waiter.sleep(token, Duration::from_secs(5));
        }
        assert_ne!(waiter.token(), token);
        assert!(started.elapsed() < Duration::from_secs(4));
        waker.join().expect("waker thread");
    }
}
