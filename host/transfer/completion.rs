//! How finished tasks wake the threads that wait for them: the batch's completion signal, and the poller a
//! transport may offer so that a waiting thread collects its own completions.

use crate::cpu_time::{thread_cpu_time_ns, Section};
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
    /// Whether the batch is traced: each notification then records when and on which thread it happened
    /// (docs/trace.md; off, a notification pays one relaxed load).
    traced: std::sync::atomic::AtomicBool,
    /// The last notification while traced: its time ([`crate::trace::now_ns`]) and thread.
    last_notify: Mutex<Option<(u64, crate::trace::ThreadTag)>>,
}

impl Default for CompletionSignal {
    fn default() -> Self {
        CompletionSignal {
            finished: AtomicUsize::new(0),
            wake_at: AtomicUsize::new(usize::MAX),
            targets: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            traced: std::sync::atomic::AtomicBool::new(false),
            last_notify: Mutex::new(None),
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
        if self.traced.load(Ordering::Relaxed) {
            let at = crate::trace::now_ns();
            *self.last_notify.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                Some((at, crate::trace::ThreadTag::current()));
        }
        if finished < self.wake_at.load(Ordering::SeqCst) {
            return;
        }
        // Taking the lock orders this wake-up after a waiter's check-then-wait.
        let _targets = self.targets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.wake.notify_all();
    }

    /// Makes later notifications record their time and thread ([`Self::last_notify`]).
    pub fn set_traced(&self) {
        self.traced.store(true, Ordering::Relaxed);
    }

    /// The time and thread of the last notification since [`Self::set_traced`], if any.
    pub fn last_notify(&self) -> Option<(u64, crate::trace::ThreadTag)> {
        self.last_notify.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
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
/// The engine's batch wait calls [`CompletionPoller::attach`] once, then loops: `poll`, check the batch, `wait`;
/// then `detach`. While a thread is attached the transport's own background completion thread backs off, so a
/// completion is collected by the Host thread that wants it. Nothing wakes a waiter: it looks at Host-visible
/// memory, as it must on an NPU, with [`poll_until`].
pub trait CompletionPoller: Send + Sync + fmt::Debug {
    /// Finishes the task slots of every completion ready now; cheap when none is. Returns true when another thread
    /// was collecting completions at the same time (it may finish the caller's tasks without telling the caller, so
    /// the caller should only nap before looking again).
    fn poll(&self) -> bool;
    /// Returns when completions are ready to collect (or the transport finished tasks itself), or `timeout` passed.
    /// Returns the Host CPU time the calling thread spent in the wait (ns; `poll_until_charged`), which the batch
    /// charges to the transfers it waited for.
    fn wait(&self, timeout: Duration) -> u64;
    /// Returns when the completions of the tasks with these tickets (`TaskSlot::ticket`, all set by this poller's
    /// transport) are ready to collect (or the transport finished tasks itself), or `timeout` passed; other tasks'
    /// completions do not end the wait. Returns the CPU time spent as [`CompletionPoller::wait`] does. The default is
    /// [`CompletionPoller::wait`].
    fn wait_for(&self, tickets: &[u64], timeout: Duration) -> u64 {
        let _ = tickets;
        self.wait(timeout)
    }
    /// A thread starts waiting through this poller.
    fn attach(&self);
    /// That thread stopped waiting.
    fn detach(&self);
}

/// How long [`poll_until`] looks without sleeping: spin hints at first, then yields of the CPU.
pub const POLL_SPIN_WINDOW: Duration = Duration::from_micros(10);
/// The shortest nap of [`poll_until`] after its spin window; naps grow with the time already waited (a sixteenth of
/// it), up to [`POLL_NAP_MAX`], so a completion is seen at most about 6% (or 50 µs) after it landed.
pub const POLL_NAP_MIN: Duration = Duration::from_micros(50);
/// The longest nap of [`poll_until`]: a wait that has lasted a while is past its typical completion time, and on a
/// machine whose CPUs also run the twin's device threads each look costs them CPU.
pub const POLL_NAP_MAX: Duration = Duration::from_millis(1);

/// The one way a Host thread waits for something a device (or a peer) writes into Host-visible memory, on every
/// device runtime: look with `ready`; for [`POLL_SPIN_WINDOW`] spin and yield between looks, then nap from
/// [`POLL_NAP_MIN`] or a sixteenth of the time waited so far, whichever is longer, at most [`POLL_NAP_MAX`]. Returns whether `ready` held before `timeout` passed. Nothing
/// wakes the thread early: an NPU has no way to, so the twin runtime does not either, and latency figures measured
/// on the twin include the same polling the NPU path pays.
pub fn poll_until(ready: impl FnMut() -> bool, timeout: Duration) -> bool {
    poll_until_inner(ready, timeout, false).0
}

/// [`poll_until`], also returning the Host CPU time the calling thread spent in it (ns), for a path to charge its
/// waiting threads' polling and wake-ups to itself (docs/cpu-accounting.md). While it only spins (the first 64
/// looks) the wait never gives up its CPU, so it is a [`Section`] (the section clock); from its first yield or nap
/// on, the thread CPU clock is read there and at the end (two readings, only for a wait that got that far).
pub fn poll_until_charged(ready: impl FnMut() -> bool, timeout: Duration) -> (bool, u64) {
    poll_until_inner(ready, timeout, true)
}

/// [`poll_until_charged`] for a wait that can count what it still waits for: `left` returns how many units (e.g.
/// completion entries) are still missing, 0 when the wait is over. Once some have arrived, it closes in on when the
/// rate seen so far (from the first look to the last arrival) says the rest will be in, with naps of half the time
/// left to that moment: for a wait of many units at most a sixteenth of the time waited (its looks drain what
/// arrived, and its end is seen within about [`POLL_NAP_MIN`]), for one of at most [`FEW_UNITS`] at least a
/// thirty-second (each look wakes a thread, and on the twin a woken thread also pays for the device threads' network
/// work; its end is seen within about 3% of the wait, with a handful of looks). Once that moment has passed, a nap
/// lasts about as long as the wait is already late (at most a sixteenth of the time waited and [`POLL_NAP_MAX`]):
/// the end is seen within twice its lateness, with a few looks instead of one every [`POLL_NAP_MIN`].
pub fn poll_until_paced(left: impl FnMut() -> u64, timeout: Duration) -> (bool, u64) {
    poll_until_paced_expecting(left, timeout, None)
}

/// [`poll_until_paced`] for a wait that similar waits say takes about `expected`: it expects nothing in the first
/// part of that, its quiet time (until a unit arrives it naps towards the quiet time's end, at most
/// [`POLL_PACED_NAP_MAX`] at a time, instead of from [`POLL_NAP_MIN`] up): three quarters of `expected` for a wait of
/// at most [`FEW_UNITS`] units, half for one of more (its looks then drain what arrived while the rest is in
/// flight). It then closes in on the expected end (or on the end the arrivals say, if that is sooner) as
/// [`poll_until_paced`] closes in on the end the arrivals say, and once that end has passed backs off by its
/// lateness. A wait of few units that ends in its quiet time is seen at the quiet time's end.
pub fn poll_until_paced_expecting(
    mut left: impl FnMut() -> u64,
    timeout: Duration,
    expected: Option<Duration>,
) -> (bool, u64) {
    let started = Instant::now();
    let expected = expected.map(|expected| expected.min(timeout));
    let pace = std::cell::Cell::new(Pace::default());
    let expected_end = expected.and_then(|expected| started.checked_add(expected));
    let mut look = || {
        let missing = left();
        if missing == 0 {
            return true;
        }
        let mut seen = pace.get();
        let first_look = seen.first.is_none();
        seen.look(Instant::now(), missing);
        if first_look {
            // The quiet time, from what the first look found missing: a wait for a few units naps through three
            // quarters of the expected time; one for many through half, so that its looks drain what has arrived
            // while the rest is in flight rather than all of it at the end.
            let quiet = expected.map(|e| if seen.few() { e * 3 / 4 } else { e / 2 });
            seen.due = quiet.and_then(|quiet| started.checked_add(quiet));
        }
        pace.set(seen);
        false
    };
    poll_until_core(&mut look, timeout, true, || paced_eta(&pace.get(), expected_end, Instant::now()))
}

/// A paced wait's estimate of its end at `now`, from what its looks learned and the end similar waits expect.
fn paced_eta(seen: &Pace, expected_end: Option<Instant>, now: Instant) -> Option<Eta> {
    if !seen.measured {
        // Nothing arrived yet: through the quiet time in long naps.
        if let Some(ahead) = seen.due.and_then(|quiet_end| quiet_end.checked_duration_since(now)) {
            return Some(Eta::Quiet(ahead));
        }
    }
    let measured = seen.measured.then_some(seen.due).flatten();
    let end = match (measured, expected_end) {
        (Some(measured), Some(expected)) => measured.min(expected),
        (one, other) => one.or(other)?,
    };
    // Before the end: close in on it. After: back off by as long as it is already late, so a wait whose estimate was
    // early naps a few times at POLL_NAP_MIN and then longer, not every 50 µs until it ends.
    Some(match end.checked_duration_since(now) {
        Some(ahead) => Eta::Ahead { ahead, few: seen.few() },
        None => Eta::Late(now.duration_since(end)),
    })
}

/// What a paced wait learned from its looks: the first look, the last count seen, and when the rest is due at the
/// rate from the first look to the last arrival (before an arrival: the end of the wait's quiet time, if it has one).
#[derive(Clone, Copy, Debug, Default)]
struct Pace {
    first: Option<(Instant, u64)>,
    last_missing: u64,
    due: Option<Instant>,
    /// Whether `due` comes from arrivals (else it is the wait's quiet time, or unset).
    measured: bool,
}

impl Pace {
    /// Whether the wait is for at most [`FEW_UNITS`] units (what its first look found missing).
    fn few(&self) -> bool {
        self.first.is_some_and(|(_, units)| units <= FEW_UNITS)
    }

    /// A look at `now` found `missing` units still out (more than 0).
    fn look(&mut self, now: Instant, missing: u64) {
        let Some((at, before)) = self.first else {
            self.first = Some((now, missing));
            self.last_missing = missing;
            return;
        };
        if missing < self.last_missing {
            self.last_missing = missing;
            let per_unit = now.duration_since(at) / u32::try_from(before - missing).unwrap_or(u32::MAX);
            self.due = Some(now + per_unit.saturating_mul(u32::try_from(missing).unwrap_or(u32::MAX)));
            self.measured = true;
        }
    }
}

fn poll_until_inner(mut ready: impl FnMut() -> bool, timeout: Duration, charged: bool) -> (bool, u64) {
    poll_until_core(&mut ready, timeout, charged, || None)
}

/// A paced wait's estimate of its end.
#[derive(Clone, Copy, Debug)]
enum Eta {
    /// Nothing is expected for this much longer (the wait's quiet time; nothing has arrived yet).
    Quiet(Duration),
    /// The rest is due this much later (at the rate seen so far, or as similar waits took).
    Ahead {
        ahead: Duration,
        /// The wait is for at most [`FEW_UNITS`] units (what its first look found missing).
        few: bool,
    },
    /// The rest was due this long ago.
    Late(Duration),
}

/// A paced wait for at most this many units (what its first look found missing) naps through three quarters of its
/// expected time and closes in with naps of at least a thirty-second of the time waited; a wait for more naps
/// through half and closes in with naps of at most a sixteenth, so that its looks drain what arrived while the rest
/// is in flight and its end is seen within a few shortest naps (`poll_until_paced_expecting`).
pub const FEW_UNITS: u64 = 32;

/// The longest nap of a paced wait through its quiet time (`poll_until_paced_expecting`).
pub const POLL_PACED_NAP_MAX: Duration = Duration::from_millis(4);

/// The nap of a poll that has waited `elapsed`, after its spin window: towards the end of a quiet time; half the time
/// left to an expected end (so that the looks close in on it); as long as the wait is late; at most a sixteenth of the
/// time waited, from [`POLL_NAP_MIN`] to [`POLL_NAP_MAX`] (outside a quiet time).
fn nap(eta: Option<Eta>, elapsed: Duration) -> Duration {
    match eta {
        Some(Eta::Quiet(ahead)) => ahead.clamp(POLL_NAP_MIN, POLL_PACED_NAP_MAX),
        // Few units: little to drain at each look, so fewer, longer naps (at least a thirty-second of the wait).
        Some(Eta::Ahead { ahead, few: true }) => (ahead / 2).max(elapsed / 32).clamp(POLL_NAP_MIN, POLL_NAP_MAX),
        // Many: its looks drain what arrived, and the end is seen within a few shortest naps.
        Some(Eta::Ahead { ahead, few: false }) => (ahead / 2).min(elapsed / 16).clamp(POLL_NAP_MIN, POLL_NAP_MAX),
        Some(Eta::Late(late)) => late.min(elapsed / 16).clamp(POLL_NAP_MIN, POLL_NAP_MAX),
        None => (elapsed / 16).clamp(POLL_NAP_MIN, POLL_NAP_MAX),
    }
}

/// The loop of every poll: `eta` is the wait's own estimate of the time still needed, if it has one.
fn poll_until_core(
    ready: &mut dyn FnMut() -> bool,
    timeout: Duration,
    charged: bool,
    eta: impl Fn() -> Option<Eta>,
) -> (bool, u64) {
    let started = Instant::now();
    let section = charged.then(Section::start);
    // The section's time up to the first nap, and the thread CPU clock then.
    let mut napped: Option<(u64, u64)> = None;
    // (set at the first yield or nap)
    let charge = |napped: Option<(u64, u64)>| match (section, napped) {
        (None, _) => 0,
        (Some(section), None) => section.elapsed_ns(),
        (Some(_), Some((before, cpu))) => before + thread_cpu_time_ns().saturating_sub(cpu),
    };
    let mut spins = 0u32;
    loop {
        if ready() {
            return (true, charge(napped));
        }
        let elapsed = started.elapsed();
        if elapsed >= timeout {
            return (false, charge(napped));
        }
        let yields = elapsed >= POLL_SPIN_WINDOW || spins >= 64;
        if yields && napped.is_none() {
            // From here on the thread gives up its CPU (a yield lets other threads run, a nap sleeps): wall time would
            // charge their time, so the thread CPU clock takes over.
            if let Some(section) = section {
                napped = Some((section.elapsed_ns(), thread_cpu_time_ns()));
            }
        }
        if elapsed < POLL_SPIN_WINDOW {
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            spins += 1;
        } else {
            std::thread::sleep(nap(eta(), elapsed).min(timeout - elapsed));
        }
    }
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

    /// A paced wait that expects nothing for a while looks a few times, not from 50 µs up; one whose due time has
    /// passed backs off instead of looking every 50 µs; both still see the end. (Counts that load can only lower:
    /// a loaded machine oversleeps naps, so it looks less often.)
    #[test]
    fn a_quiet_or_late_paced_wait_looks_few_times() {
        let started = Instant::now();
        let early = std::cell::RefCell::new(Vec::new());
        let (done, _) = poll_until_paced_expecting(
            || {
                // The looks well after the spin window (whose spins and yields each look) and inside the quiet time.
                let at = started.elapsed();
                if at > Duration::from_millis(1) && at < Duration::from_millis(21) {
                    early.borrow_mut().push(at);
                }
                u64::from(at < Duration::from_millis(30))
            },
            Duration::from_secs(5),
            Some(Duration::from_millis(30)),
        );
        assert!(done && started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
        // Naps of up to 4 ms towards 22.5 ms (three quarters of the 30 ms expected): about 6 looks (from 50 µs up
        // it would be about 80).
        let early = early.into_inner();
        assert!(early.len() <= 8, "{} looks inside the quiet time: {early:?}", early.len());
        // Due at once (one unit arrived early, the rest "due" immediately) and then late for 30 ms.
        let started = Instant::now();
        let looks = std::cell::Cell::new(0u32);
        let (done, _) = poll_until_paced(
            || {
                if started.elapsed() > POLL_SPIN_WINDOW * 2 {
                    looks.set(looks.get() + 1);
                }
                match started.elapsed() {
                    e if e < Duration::from_micros(100) => 2,
                    e if e < Duration::from_millis(30) => 1,
                    _ => 0,
                }
            },
            Duration::from_secs(5),
        );
        assert!(done && started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
        // Every 50 µs for 30 ms would be about 600 looks.
        assert!(looks.get() < 150, "{} looks", looks.get());
    }

    #[test]
    fn a_charged_poll_counts_its_spinning_and_not_its_naps() {
        // A 20 ms wait that never ends: about 10 us of spinning, then naps (CPU only at their wake-ups).
        let started = Instant::now();
        let (done, cpu) = poll_until_charged(|| false, Duration::from_millis(20));
        let wall = started.elapsed();
        assert!(!done && wall >= Duration::from_millis(20));
        assert!(cpu > 0, "the spin window is charged");
        assert!(Duration::from_nanos(cpu) < wall / 2, "naps are not charged as CPU: {cpu} ns of {wall:?}");
        // A busy wait that ends inside the spin window is charged as a section (its wall time on the monotonic
        // section clock, its CPU time on the thread clock, which another test may have chosen): more than nothing,
        // no more than it lasted.
        let started = Instant::now();
        let until = started + Duration::from_micros(5);
        let (done, cpu) = poll_until_charged(|| Instant::now() >= until, Duration::from_secs(1));
        let wall = started.elapsed();
        assert!(done && cpu > 0 && Duration::from_nanos(cpu) <= wall, "{cpu} ns in {wall:?}");
    }

    #[test]
    fn a_pace_dues_the_rest_at_the_rate_seen_since_the_first_look() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut pace = Pace::default();
        pace.look(t0, 100);
        assert!(pace.due.is_none(), "no rate before an arrival");
        pace.look(t0 + ms(5), 100);
        assert!(pace.due.is_none(), "still none without an arrival");
        // 20 of 100 in 10 ms: the other 80 are due 40 ms later.
        pace.look(t0 + ms(10), 80);
        assert_eq!(pace.due, Some(t0 + ms(50)));
        // A look without an arrival keeps the estimate; the next arrival refines it (60 in 30 ms: 40 more in 20 ms).
        pace.look(t0 + ms(20), 80);
        assert_eq!(pace.due, Some(t0 + ms(50)));
        pace.look(t0 + ms(30), 40);
        assert_eq!(pace.due, Some(t0 + ms(50)));
        // Arrivals slowing down move the due time out: 90 in 90 ms leaves 10 due 10 ms later.
        pace.look(t0 + ms(90), 10);
        assert_eq!(pace.due, Some(t0 + ms(100)));
    }

    /// An expected wait: long naps through its first half; then looks that close in on the expected end (half the
    /// time left, so the last naps before it are short); after it, naps as long as it is late; arrivals that say the
    /// end is sooner win.
    #[test]
    fn an_expected_wait_closes_in_on_its_expected_end() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        // A wait for many units (its first look found 512 missing) and one for few (8).
        let many = Pace { first: Some((t0, 512)), last_missing: 512, due: Some(t0 + ms(40)), measured: false };
        let few = Pace { first: Some((t0, 8)), last_missing: 8, ..many };
        let end = Some(t0 + ms(80));
        let at = |seen: &Pace, now: Duration| nap(paced_eta(seen, end, t0 + now), now);
        assert_eq!(at(&many, ms(10)), ms(4), "through the quiet time in the longest paced naps");
        assert_eq!(at(&many, ms(39)), ms(1), "to the end of the quiet time");
        // Many units, after the quiet time, far from the end: a sixteenth of the time waited, at most the longest nap.
        assert_eq!(at(&many, ms(48)), ms(3).min(POLL_NAP_MAX));
        // Near the end: half the time left, not a sixteenth of the wait.
        assert_eq!(at(&many, ms(78)), ms(1));
        assert_eq!(at(&many, us(79_600)), us(200));
        assert_eq!(at(&many, us(79_990)), POLL_NAP_MIN);
        // Few units: half the time left but at least a thirty-second of the time waited (a long wait is seen within
        // about 3% of its end, with few looks).
        assert_eq!(at(&few, us(79_600)), POLL_NAP_MAX, "a thirty-second of 79.6 ms, at most the longest nap");
        let short = Some(t0 + ms(8));
        let few_short = Pace { due: Some(t0 + ms(5)), ..few };
        let near = |now: Duration| nap(paced_eta(&few_short, short, t0 + now), now);
        assert_eq!(near(ms(6)), ms(1));
        assert_eq!(near(us(7_400)), us(300));
        assert_eq!(near(us(7_900)), us(7_900) / 32);
        // Late, either way: as long as it is late (then capped by a sixteenth of the wait and the longest nap).
        for seen in [&many, &few] {
            assert_eq!(at(seen, us(80_020)), POLL_NAP_MIN);
            assert_eq!(at(seen, us(80_300)), us(300));
            assert_eq!(at(seen, ms(100)), POLL_NAP_MAX);
        }
        // Arrivals that put the end at 60 ms: closing in on 60 ms instead.
        let arrived = Pace { due: Some(t0 + ms(60)), measured: true, ..many };
        assert_eq!(at(&arrived, ms(59)), us(500));
        assert_eq!(at(&arrived, ms(61)), ms(1), "late from 60 ms on");
        let early = Pace { due: Some(t0 + us(6_400)), measured: true, ..few_short };
        assert_eq!(
            nap(paced_eta(&early, short, t0 + ms(6)), ms(6)),
            us(200),
            "the arrivals' end, not the expected one"
        );
        // Arrivals that put it later than expected: the expected end still counts.
        let slow = Pace { due: Some(t0 + ms(200)), measured: true, ..many };
        assert_eq!(at(&slow, ms(79)), us(500));
        // Without an expected end or arrivals: a sixteenth of the wait, as poll_until.
        assert_eq!(nap(paced_eta(&Pace::default(), None, t0 + ms(8)), ms(8)), us(500));
    }

    /// The quiet time comes from the first look: three quarters of the expected time for a few units, half for many.
    #[test]
    fn a_wait_for_many_units_ends_its_quiet_time_at_half_of_the_expected_time() {
        for (units, quiet_ms) in [(FEW_UNITS, 15u64), (FEW_UNITS + 1, 10)] {
            let started = Instant::now();
            let looks = std::cell::RefCell::new(Vec::new());
            let (done, _) = poll_until_paced_expecting(
                || {
                    let at = started.elapsed();
                    looks.borrow_mut().push(at);
                    u64::from(at < Duration::from_millis(20)) * units
                },
                Duration::from_secs(5),
                Some(Duration::from_millis(20)),
            );
            assert!(done);
            // The first look after the spin window that is not a quiet nap's: at the quiet time's end, not before.
            let looks = looks.into_inner();
            let first_close = looks.iter().find(|at| **at >= Duration::from_millis(quiet_ms));
            assert!(first_close.is_some(), "{units} units: {looks:?}");
            let between = looks
                .iter()
                .filter(|at| **at > Duration::from_millis(1) && **at < Duration::from_millis(quiet_ms))
                .count();
            // Naps of up to 4 ms towards the quiet time's end: at most ceil(quiet / 4) looks before it (plus one for
            // a nap that ends early).
            assert!(between <= (quiet_ms as usize).div_ceil(4) + 1, "{units} units: {looks:?}");
        }
    }

    #[test]
    fn a_paced_wait_ends_when_nothing_is_missing_or_at_its_timeout() {
        // 4 steps of 2 units every 3 ms: done after 12 ms, seen within a shortest nap or so of it.
        let started = Instant::now();
        let left = || 8u64.saturating_sub(2 * (started.elapsed().as_millis() / 3) as u64);
        let (done, cpu) = poll_until_paced(left, Duration::from_secs(5));
        let waited = started.elapsed();
        assert!(done && cpu > 0, "{done} {cpu}");
        assert!(waited >= Duration::from_millis(12) && waited < Duration::from_millis(100), "{waited:?}");
        let started = Instant::now();
        assert!(!poll_until_paced(|| 1, Duration::from_millis(3)).0);
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(3) && waited < Duration::from_millis(50), "{waited:?}");
    }

    #[test]
    fn a_waiter_gives_up_at_its_deadline() {
        let signal = CompletionSignal::default();
        let started = Instant::now();
        signal.wait_for(1, started + Duration::from_millis(30));
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert_eq!(signal.finished.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn poll_until_sees_a_write_of_another_thread_and_gives_up_at_its_timeout() {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let flag = flag.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                flag.store(true, Ordering::Release);
            })
        };
        let started = Instant::now();
        assert!(poll_until(|| flag.load(Ordering::Acquire), Duration::from_secs(5)));
        let waited = started.elapsed();
        writer.join().expect("writer");
        // Seen within one longest nap (plus scheduling) of the write.
        assert!(waited >= Duration::from_millis(5) && waited < Duration::from_millis(100), "{waited:?}");
        let started = Instant::now();
        assert!(!poll_until(|| false, Duration::from_millis(3)));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(3) && waited < Duration::from_millis(50), "{waited:?}");
    }
}
