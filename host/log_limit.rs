//! Rate-limited, aggregated warnings: at most `burst` events per window are logged; the rest are counted and the
//! count is reported with the next event that is logged ("N more like this in the last window").
//!
//! Owns: [`LogLimiter`], a per-call-site budget of log lines. It must not log by itself, decide what is logged, or
//! depend on any other module of the crate.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A budget of `burst` log lines per `window` for one kind of event; share one (often a `static`) per call site.
#[derive(Debug)]
pub struct LogLimiter {
    burst: u32,
    window: Duration,
    state: Mutex<Option<Window>>,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    logged: u32,
    suppressed: u64,
}

impl LogLimiter {
    /// At most `burst` (at least 1) lines per `window`.
    pub const fn new(burst: u32, window: Duration) -> Self {
        LogLimiter { burst: if burst == 0 { 1 } else { burst }, window, state: Mutex::new(None) }
    }

    /// At most `burst` lines per second.
    pub const fn per_second(burst: u32) -> Self {
        LogLimiter::new(burst, Duration::from_secs(1))
    }

    /// Whether this event may be logged: `Some(n)` to log it, `n` being how many events were suppressed in the
    /// window that just ended (report it, e.g. as a `suppressed` field); `None` to drop it (it is counted).
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match state.as_mut() {
            Some(window) if now.saturating_duration_since(window.started) < self.window => {
                if window.logged < self.burst {
                    window.logged += 1;
                    Some(0)
                } else {
                    window.suppressed += 1;
                    None
                }
            }
            _ => {
                let suppressed = state.as_ref().map_or(0, |window| window.suppressed);
                *state = Some(Window { started: now, logged: 1, suppressed: 0 });
                Some(suppressed)
            }
        }
    }

    /// The window's length, for messages ("N more like this in the last ...").
    pub fn window(&self) -> Duration {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_logged_then_the_rest_is_counted_and_reported_with_the_next_window() {
        let limiter = LogLimiter::new(3, Duration::from_secs(1));
        let start = Instant::now();
        let verdicts: Vec<Option<u64>> = (0..10).map(|i| limiter.admit_at(start + Duration::from_millis(i))).collect();
        assert_eq!(verdicts[..3], [Some(0), Some(0), Some(0)]);
        assert!(verdicts[3..].iter().all(Option::is_none), "{verdicts:?}");
        assert_eq!(limiter.admit_at(start + Duration::from_millis(1500)), Some(7), "the 7 suppressed are reported");
        assert_eq!(limiter.admit_at(start + Duration::from_millis(1501)), Some(0));
    }

    #[test]
    fn a_zero_burst_still_logs_one_line_per_window() {
        let limiter = LogLimiter::new(0, Duration::from_secs(1));
        let start = Instant::now();
        assert_eq!(limiter.admit_at(start), Some(0));
        assert_eq!(limiter.admit_at(start + Duration::from_millis(1)), None);
        assert_eq!(limiter.admit_at(start + Duration::from_secs(2)), Some(1));
    }
}
