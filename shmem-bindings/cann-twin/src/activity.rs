//! The device's progress signals: per `(device, channel)`, what an engine bumps when something a core may be polling
//! for lands, and what a napping emulated core waits on. The engines (`sdma`, `nic`) signal, the cores (`kernel`)
//! nap on it; neither reaches the other through it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Device-internal progress of one SDMA channel of a device: bumped by its engine when a completion flag lands and
/// when a run stops, so that the emulated core of the block that drives the channel (block k posts to channel k),
/// napping in a poll, resumes polling at once, as an NPU core that never stops polling would see the flag at once.
/// It is the device's own signal (engine to core); nothing here wakes a Host thread, the core still learns of the
/// flag only by reading memory, and a core whose channel is another one simply naps its nap out.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    seq: std::sync::atomic::AtomicU64,
    sleepers: AtomicU32,
    lock: Mutex<()>,
    wake: std::sync::Condvar,
}

impl Activity {
    /// The activity record of channel `index` of `device` (one per pair, for the process's lifetime).
    pub(crate) fn of(device: i32, index: u32) -> Arc<Activity> {
        type ByChannel = HashMap<(i32, u32), Arc<Activity>>;
        static ALL: LazyLock<Mutex<ByChannel>> = LazyLock::new(|| Mutex::new(HashMap::new()));
        Arc::clone(lock(&ALL).entry((device, index)).or_default())
    }

    /// Something a core may be polling for has happened on the device.
    pub(crate) fn progressed(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = lock(&self.lock);
            self.wake.notify_all();
        }
    }

    /// The progress count: how many times the device progressed.
    pub(crate) fn progress(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Naps at most `nap`, less if the device progresses after `seen`; returns the progress count at the end.
    pub(crate) fn nap(&self, seen: u64, nap: Duration) -> u64 {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let deadline = Instant::now() + nap;
        let mut guard = lock(&self.lock);
        while self.seq.load(Ordering::SeqCst) == seen {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            guard = self.wake.wait_timeout(guard, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        drop(guard);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        self.seq.load(Ordering::SeqCst)
    }
}
