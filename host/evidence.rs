//! What every transfer records about how it was carried out.
//!
//! The comparative audit decides which paths are AIV-direct from these records (HARDWARE.md section 1: a kernel on
//! the AI Vector cores builds the descriptors, rings the doorbell and observes completion on the Device). No path
//! asserts that by name: each transport fills in what actually happened, counted where it happened.

use serde::Serialize;

/// Who performed one step of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Actor {
    /// Nobody: the step does not exist on this path (a plain memcpy builds no descriptor).
    Nobody,
    /// A kernel running on the AI Vector cores (on the twin: an emulated AIV core running the same kernel source).
    AivKernel,
    /// A Host thread of this process (an engine worker, or the thread that called `submit`).
    HostThread,
    /// A Host-side runtime library on the caller's behalf (ACL streams, the ADXL engine, the OS socket layer).
    HostRuntime,
}

impl Actor {
    /// Whether this actor runs on the Device.
    pub fn is_device(self) -> bool {
        matches!(self, Actor::AivKernel)
    }
}

/// The record one transfer leaves behind, whichever transport carried it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TransferEvidence {
    /// The transport that carried the transfer (`"local"`, `"aiv"`, `"tcp"`, ...).
    pub path: &'static str,
    /// Who wrote the work descriptors (SQEs, WQEs, request headers).
    pub descriptor_builder: Actor,
    /// Who told the engine that executes them to start (doorbell write, stream submit, socket send).
    pub doorbell_ringer: Actor,
    /// Who first observed that the data had landed.
    pub completion_observer: Actor,
    /// Calls the Host made into the device runtime for this transfer (launches, copies, synchronisations).
    pub host_device_api_calls: u64,
    /// Work descriptors written for this transfer, its completion descriptors included.
    pub descriptors: u64,
    /// Doorbells rung for this transfer (a doorbell shared by k transfers counts 1/k, rounded up per transfer).
    pub doorbells: u64,
    /// Host CPU time spent on this transfer by the engine's own threads, in nanoseconds (emulated device threads of
    /// the CPU twin excluded).
    pub host_cpu_ns: u64,
}

impl TransferEvidence {
    /// The four AIV-direct checks (HARDWARE.md section 1), derived from what was recorded.
    pub fn aiv_direct_checks(&self) -> [bool; 4] {
        [
            self.descriptor_builder == Actor::AivKernel || self.doorbell_ringer == Actor::AivKernel,
            self.descriptor_builder == Actor::AivKernel,
            self.doorbell_ringer == Actor::AivKernel,
            self.completion_observer.is_device(),
        ]
    }

    /// Whether all four AIV-direct checks hold.
    pub fn is_aiv_direct(&self) -> bool {
        self.aiv_direct_checks().iter().all(|&check| check)
    }
}

/// Host CPU time a path spent on its transfers but has not charged to any yet: the tail of a submit after the
/// per-transfer shares were fixed (the hand-off to the path's thread or to the device), idle checks. The next
/// transfers the path finishes take it, so every nanosecond is charged once, if not always to the transfer it was
/// spent for.
#[derive(Debug, Default)]
pub struct CpuCarry(std::sync::atomic::AtomicU64);

impl CpuCarry {
    /// Adds the calling thread's CPU time since `mark`, a [`thread_cpu_time_ns`] reading.
    pub fn add_since(&self, mark: u64) {
        self.0.fetch_add(thread_cpu_time_ns().saturating_sub(mark), std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds `ns`.
    pub fn add(&self, ns: u64) {
        self.0.fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
    }

    /// Takes everything carried so far.
    pub fn take(&self) -> u64 {
        self.0.swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Readings of [`thread_cpu_time_ns`] made by this process so far (the accounting's own cost is reported with it).
static CLOCK_READINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times this process has read the thread CPU clock for Host time accounting.
pub fn clock_readings() -> u64 {
    CLOCK_READINGS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Mean cost of one [`thread_cpu_time_ns`] reading on this machine now, in nanoseconds (times 20,000 readings).
/// The readings are part of the Host time they measure; `aiv bench` reports how much.
pub fn clock_reading_cost_ns() -> f64 {
    const SAMPLES: u32 = 20_000;
    let started = std::time::Instant::now();
    let mut sink = 0u64;
    for _ in 0..SAMPLES {
        sink = sink.wrapping_add(thread_cpu_time_ns());
    }
    std::hint::black_box(sink);
    CLOCK_READINGS.fetch_sub(u64::from(SAMPLES), std::sync::atomic::Ordering::Relaxed);
    started.elapsed().as_nanos() as f64 / f64::from(SAMPLES)
}

/// CPU time consumed so far by the calling thread, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
///
/// Evidence reports Host CPU time as the difference of two readings on the thread that did the work, so time the
/// thread spent blocked or descheduled is not counted, and neither is any other thread's (the twin's emulated
/// device threads included).
pub fn thread_cpu_time_ns() -> u64 {
    CLOCK_READINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is supported on every Linux we build for.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return 0;
    }
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}
