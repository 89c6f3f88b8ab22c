//! The pace the aiv transport's batch waits learn: time per byte, for the expected length of the next wait.
//!
//! Owns: [`WaitPace`]. It must not read the rings or the in-flight table (the waits give it bytes and times).

use std::sync::atomic::Ordering;
use std::time::Duration;

/// What the waits of one aiv transport learned of its pace: the time per byte of the waits that covered at least
/// [`WaitPace::MIN_BYTES`] (an average weighted 1/4 towards the newest). A wait of `n` bytes then expects to take `n`
/// times that (`transfer::poll_until_paced_expecting`): it naps through the first part of it (three quarters for a
/// wait of few entries, half for one of many) instead of looking from 50 µs up (on a slow route, such as the twin NIC
/// across hosts, that saves most of its looks), and closes in on the expected end.
#[derive(Debug, Default)]
pub(crate) struct WaitPace {
    /// Picoseconds per byte (0: nothing learned yet).
    ps_per_byte: std::sync::atomic::AtomicU64,
}

impl WaitPace {
    /// Waits smaller than this teach nothing (their time is mostly fixed latency, not bytes).
    pub(crate) const MIN_BYTES: u64 = 64 << 10;

    /// How long a wait for `bytes` is expected to take.
    pub(crate) fn expected(&self, bytes: u64) -> Option<Duration> {
        let rate = self.ps_per_byte.load(Ordering::Relaxed);
        (rate > 0 && bytes >= Self::MIN_BYTES).then(|| {
            Duration::from_nanos((u128::from(bytes) * u128::from(rate) / 1000).min(u128::from(u64::MAX)) as u64)
        })
    }

    /// A wait for `bytes` ended after `took`.
    pub(crate) fn learn(&self, bytes: u64, took: Duration) {
        if bytes < Self::MIN_BYTES {
            return;
        }
        let measured = (took.as_nanos() * 1000 / u128::from(bytes)).min(u128::from(u64::MAX / 4)) as u64;
        let _ = self.ps_per_byte.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            Some(if old == 0 { measured } else { (old * 3 + measured) / 4 })
        });
    }
}
