//! Host CPU accounting: the clocks that time a path's Host work, and the carry that charges work not yet tied to a
//! transfer to the next transfers a path finishes.
//!
//! Owns: the section clocks ([`Section`], [`may_sleep`], [`SectionClock`]), the thread CPU clock
//! ([`thread_cpu_time_ns`]), the counts and costs of clock readings, and [`CpuCarry`]. It must not know about paths or
//! evidence records: transports read these clocks and write the results into their [`crate::evidence`] records.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use serde::Serialize;

/// Host CPU time a path spent on its transfers but has not charged to any yet: the tail of a submit after the
/// per-transfer shares were fixed (the hand-off to the path's thread or to the device), idle checks. The next
/// transfers the path finishes take it, so every nanosecond is charged once, if not always to the transfer it was
/// spent for.
#[derive(Debug, Default)]
pub struct CpuCarry(AtomicU64);

impl CpuCarry {
    /// Adds `ns`.
    pub fn add(&self, ns: u64) {
        self.0.fetch_add(ns, Ordering::Relaxed);
    }

    /// Takes everything carried so far.
    pub fn take(&self) -> u64 {
        self.0.swap(0, Ordering::Relaxed)
    }
}

/// How Host sections that never sleep are timed (every section that may sleep always uses the thread CPU clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SectionClock {
    /// The monotonic clock (`CLOCK_MONOTONIC`, read without a system call). Over a section that never sleeps, the
    /// elapsed time bounds the thread's CPU time from above: time the thread was preempted is counted too, so the
    /// figure can only be too high, never too low. The default.
    Monotonic,
    /// The thread CPU clock, as for sections that may sleep: exact, but each reading is a system call that costs
    /// several hundred nanoseconds on some machines, and part of that cost lands inside the section it measures.
    Thread,
}

impl SectionClock {
    /// The name used on the command line (`aiv bench --section_clock`).
    pub fn name(self) -> &'static str {
        match self {
            SectionClock::Monotonic => "monotonic",
            SectionClock::Thread => "thread",
        }
    }
}

impl std::str::FromStr for SectionClock {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "monotonic" => Ok(SectionClock::Monotonic),
            "thread" => Ok(SectionClock::Thread),
            other => Err(format!("unknown section clock {other:?}: expected \"monotonic\" or \"thread\"")),
        }
    }
}

/// The process-wide [`SectionClock`] (0 = monotonic, 1 = thread).
static SECTION_CLOCK: AtomicU8 = AtomicU8::new(0);

/// Chooses how sections that never sleep are timed, for the whole process (a benchmark sets it before it starts).
pub fn set_section_clock(clock: SectionClock) {
    SECTION_CLOCK.store(matches!(clock, SectionClock::Thread) as u8, Ordering::Relaxed);
}

/// The [`SectionClock`] in force.
pub fn section_clock() -> SectionClock {
    match SECTION_CLOCK.load(Ordering::Relaxed) {
        0 => SectionClock::Monotonic,
        _ => SectionClock::Thread,
    }
}

/// The Host CPU time of one section that never sleeps by design (a submit that only writes rings and queues, a
/// pass over completion queues): no blocking call, no wait. Timed with the [`SectionClock`] in force.
///
/// A section that may sleep (a worker loop, a stream synchronisation, a socket call) must use
/// [`thread_cpu_time_ns`] instead: wall time would charge the time it slept. A rare step inside a section that may
/// block (a lazy start of worker threads, the first import of a peer's memory) goes through [`may_sleep`], which
/// replaces its wall time in the section by its CPU time.
#[derive(Clone, Copy, Debug)]
pub struct Section {
    started: u64,
    clock: SectionClock,
    /// The calling thread's [`may_sleep`] excess at the start.
    excess_at_start: u64,
}

std::thread_local! {
    /// Wall time minus CPU time of the [`may_sleep`] steps this thread has run, in total (ns).
    static SLEEP_EXCESS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Runs `step`, a part of a [`Section`] that may block, so that the section counts its CPU time and not the time it
/// slept. Costs two thread-CPU and two monotonic clock readings; meant for rare steps, not the hot path.
pub fn may_sleep<T>(step: impl FnOnce() -> T) -> T {
    let (wall, cpu) = (monotonic_ns(), thread_cpu_time_ns());
    let value = step();
    let wall = monotonic_ns().saturating_sub(wall);
    let cpu = thread_cpu_time_ns().saturating_sub(cpu);
    SLEEP_EXCESS.with(|excess| excess.set(excess.get() + wall.saturating_sub(cpu)));
    value
}

impl Section {
    /// Starts timing the calling thread's section.
    pub fn start() -> Self {
        Self::start_with(section_clock())
    }

    fn start_with(clock: SectionClock) -> Self {
        Section { started: read_section_clock(clock), clock, excess_at_start: SLEEP_EXCESS.with(|excess| excess.get()) }
    }

    /// Nanoseconds since [`Section::start`] (wall or thread CPU, see [`SectionClock`]), less the time
    /// [`may_sleep`] steps slept meanwhile (on the thread clock there is none to take off).
    pub fn elapsed_ns(&self) -> u64 {
        let elapsed = read_section_clock(self.clock).saturating_sub(self.started);
        match self.clock {
            SectionClock::Monotonic => {
                let slept = SLEEP_EXCESS.with(|excess| excess.get()).saturating_sub(self.excess_at_start);
                elapsed.saturating_sub(slept)
            }
            SectionClock::Thread => elapsed,
        }
    }
}

fn read_section_clock(clock: SectionClock) -> u64 {
    match clock {
        SectionClock::Monotonic => monotonic_ns(),
        SectionClock::Thread => thread_cpu_time_ns(),
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC` (a vDSO read where the clock source allows it; no system call).
fn monotonic_ns() -> u64 {
    read_clock(libc::CLOCK_MONOTONIC, &MONOTONIC_READINGS)
}

/// Reads `clock` in nanoseconds (0 if it cannot be read) and counts the reading in `readings`.
fn read_clock(clock: libc::clockid_t, readings: &AtomicU64) -> u64 {
    readings.fetch_add(1, Ordering::Relaxed);
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec; both clocks used here (CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID)
    // are supported on every Linux we build for.
    let rc = unsafe { libc::clock_gettime(clock, &mut now) };
    if rc != 0 {
        return 0;
    }
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Readings of [`thread_cpu_time_ns`] made by this process so far (the accounting's own cost is reported with it).
static CLOCK_READINGS: AtomicU64 = AtomicU64::new(0);
/// Monotonic-clock readings made by [`Section`]s so far.
static MONOTONIC_READINGS: AtomicU64 = AtomicU64::new(0);

/// How many times this process has read the thread CPU clock for Host time accounting.
pub fn clock_readings() -> u64 {
    CLOCK_READINGS.load(Ordering::Relaxed)
}

/// How many times [`Section`]s of this process have read the monotonic clock.
pub fn monotonic_readings() -> u64 {
    MONOTONIC_READINGS.load(Ordering::Relaxed)
}

/// Mean cost of one [`thread_cpu_time_ns`] reading on this machine now, in nanoseconds (times 20,000 readings).
/// The readings are part of the Host time they measure; `aiv bench` reports how much.
pub fn clock_reading_cost_ns() -> f64 {
    reading_cost_ns(thread_cpu_time_ns, &CLOCK_READINGS)
}

/// Mean cost of one monotonic-clock reading of a [`Section`], in nanoseconds (times 20,000 readings).
pub fn monotonic_reading_cost_ns() -> f64 {
    reading_cost_ns(monotonic_ns, &MONOTONIC_READINGS)
}

fn reading_cost_ns(read: fn() -> u64, counter: &AtomicU64) -> f64 {
    const SAMPLES: u32 = 20_000;
    let started = std::time::Instant::now();
    let mut sink = 0u64;
    for _ in 0..SAMPLES {
        sink = sink.wrapping_add(read());
    }
    std::hint::black_box(sink);
    counter.fetch_sub(u64::from(SAMPLES), Ordering::Relaxed);
    started.elapsed().as_nanos() as f64 / f64::from(SAMPLES)
}

/// CPU time consumed so far by the calling thread, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
///
/// Evidence reports Host CPU time as the difference of two readings on the thread that did the work, so time the
/// thread spent blocked or descheduled is not counted, and neither is any other thread's (the twin's emulated
/// device threads included).
pub fn thread_cpu_time_ns() -> u64 {
    read_clock(libc::CLOCK_THREAD_CPUTIME_ID, &CLOCK_READINGS)
}

/// On-CPU nanoseconds so far of each thread of this process whose name starts with none of `exclude` (the device
/// model's threads), by thread id, from `/proc/self/task/*/schedstat`; `None` if the task list cannot be read. A
/// thread that exits while it is read is skipped.
pub fn process_thread_cpu(exclude: &[&str]) -> Option<std::collections::HashMap<u64, u64>> {
    Some(
        process_threads()?
            .into_iter()
            .filter(|thread| !exclude.iter().any(|prefix| thread.name.starts_with(prefix)))
            .map(|thread| (thread.tid, thread.on_cpu_ns))
            .collect(),
    )
}

/// One thread of this process, as [`process_threads`] read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadCpu {
    pub tid: u64,
    /// Its name (`/proc/self/task/<tid>/comm`: at most 15 bytes, so longer names are cut).
    pub name: String,
    /// On-CPU nanoseconds so far.
    pub on_cpu_ns: u64,
}

/// Every thread of this process with its name and on-CPU time so far, from `/proc/self/task/*/schedstat` (its first
/// field); `None` if the task list cannot be read. A thread that exits while it is read, or whose schedstat cannot
/// be read or parsed, is skipped.
pub fn process_threads() -> Option<Vec<ThreadCpu>> {
    let mut threads = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(entry) = entry else { continue };
        let Some(tid) = entry.file_name().to_str().and_then(|name| name.parse::<u64>().ok()) else { continue };
        let Ok(name) = std::fs::read_to_string(entry.path().join("comm")) else { continue };
        let Ok(schedstat) = std::fs::read_to_string(entry.path().join("schedstat")) else { continue };
        let Some(on_cpu) = schedstat.split_whitespace().next().and_then(|field| field.parse::<u64>().ok()) else {
            continue;
        };
        threads.push(ThreadCpu { tid, name: name.trim_end().to_string(), on_cpu_ns: on_cpu });
    }
    Some(threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(iterations: u64) -> u64 {
        (0..iterations).fold(0u64, |sum, i| std::hint::black_box(sum.wrapping_mul(31).wrapping_add(i)))
    }

    /// The monotonic section clock may only overstate a section's CPU time: over a section of pure computation it
    /// reads at least what the thread CPU clock reads around it.
    #[test]
    fn a_monotonic_section_bounds_the_thread_cpu_time_from_above() {
        // The thread clock brackets the section, so it includes one extra reading's cost: allow that much. On a
        // virtual machine under load the kernel can charge a thread CPU time its host stole (seen in CI: 1.90 ms of
        // CPU in a 1.77 ms section), so most runs must hold the bound and none may pass it by more than a quarter.
        let mut held = 0;
        for _ in 0..5 {
            let cpu_before = thread_cpu_time_ns();
            let section = Section::start_with(SectionClock::Monotonic);
            busy(200_000);
            let wall = section.elapsed_ns();
            let cpu = thread_cpu_time_ns() - cpu_before;
            assert!(wall > 0);
            assert!(wall + wall / 4 + 50_000 >= cpu, "wall {wall} ns < cpu {cpu} ns");
            held += usize::from(wall + 50_000 >= cpu);
        }
        assert!(held >= 3, "the monotonic section bounded the thread CPU time in only {held} of 5 runs");
    }

    /// A section that sleeps is charged its sleep by the monotonic clock and not by the thread clock: which is why
    /// sections that may sleep must use the thread clock.
    #[test]
    fn only_the_thread_clock_leaves_out_a_sleep() {
        let wall = Section::start_with(SectionClock::Monotonic);
        let cpu = Section::start_with(SectionClock::Thread);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(wall.elapsed_ns() >= 20_000_000);
        assert!(cpu.elapsed_ns() < 10_000_000, "a sleeping thread used {} ns of CPU", cpu.elapsed_ns());
    }

    /// A blocking step run through `may_sleep` is charged its CPU time, not its sleep, by a monotonic section.
    #[test]
    fn a_monotonic_section_leaves_out_what_may_sleep_slept() {
        let section = Section::start_with(SectionClock::Monotonic);
        busy(100_000);
        may_sleep(|| std::thread::sleep(std::time::Duration::from_millis(30)));
        let elapsed = section.elapsed_ns();
        assert!(elapsed < 20_000_000, "the 30 ms sleep was charged: {elapsed} ns");
        assert!(elapsed > 0);
        // And a section that started after the step is not reduced by it.
        let later = Section::start_with(SectionClock::Monotonic);
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(later.elapsed_ns() >= 5_000_000);
    }

    #[test]
    fn section_clock_names_round_trip_and_a_bad_name_is_refused_by_name() {
        for clock in [SectionClock::Monotonic, SectionClock::Thread] {
            assert_eq!(clock.name().parse::<SectionClock>(), Ok(clock));
        }
        let error = "wall".parse::<SectionClock>().expect_err("\"wall\" is no section clock");
        assert!(error.contains("\"wall\"") && error.contains("monotonic") && error.contains("thread"), "{error}");
    }

    #[test]
    fn a_carry_hands_out_everything_once() {
        let carry = CpuCarry::default();
        carry.add(300);
        carry.add(45);
        assert_eq!(carry.take(), 345);
        assert_eq!(carry.take(), 0);
    }
}
