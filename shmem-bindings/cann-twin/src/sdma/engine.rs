//! One SDMA channel: its engine thread, which sleeps until a doorbell or a control request and then executes the
//! ring's SQEs in order (validate, copy through the device view, publish the head), its stop on a bad SQE, and the
//! reset and stall controls.

use crossbeam_utils::CachePadded;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::layout::SdmaSqe;
use super::{
    ChannelException, Syndrome, ENGINE_POLL_WINDOW, RESET_WAIT, SQE_BYTES, SQE_COPY_OPCODE_WORD,
    SQE_KERNEL_CREDIT_SDMA, SQE_LINK_TYPE_NONE, SQE_LINK_TYPE_ONCHIP, SQE_MAX_LENGTH, SQE_OPCODE_COPY, SQE_TYPE_SDMA,
};
use crate::memory::{Segment, Space};
use crate::provenance;
use crate::space::{perform_copy, space};

/// Injected destination faults still to raise, by device ([`crate::control::fail_next_destinations`]).
static INJECTED_DESTINATION_FAULTS: LazyLock<Mutex<HashMap<i32, u32>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// Whether any device has injected faults pending (the engines' fast path skips the map otherwise).
static ANY_INJECTED: AtomicBool = AtomicBool::new(false);

/// Makes the next `count` SQEs any engine of `device` executes (and stream copies its copy engines run) fail as if
/// their destination did not translate.
pub(crate) fn inject_destination_faults(device: i32, count: u32) {
    let mut faults = lock(&INJECTED_DESTINATION_FAULTS);
    faults.insert(device, count);
    ANY_INJECTED.store(faults.values().any(|&left| left > 0), Ordering::Release);
}

/// Consumes one injected destination fault of `device`, if one is pending.
pub(crate) fn take_injected_destination_fault(device: i32) -> bool {
    if !ANY_INJECTED.load(Ordering::Acquire) {
        return false;
    }
    let mut faults = lock(&INJECTED_DESTINATION_FAULTS);
    let taken = match faults.get_mut(&device) {
        Some(left) if *left > 0 => {
            *left -= 1;
            true
        }
        _ => false,
    };
    ANY_INJECTED.store(faults.values().any(|&left| left > 0), Ordering::Release);
    taken
}

#[derive(Debug, Default)]
pub(super) struct State {
    stalled: bool,
    exception: Option<ChannelException>,
    reset_requested: u64,
    reset_done: u64,
    shutdown: bool,
}

/// One channel of one device.
#[derive(Debug)]
pub(crate) struct Channel {
    pub device: i32,
    pub index: u32,
    pub sq_id: u32,
    /// Device address of the channel record.
    pub record: u64,
    pub sq_base: u64,
    pub depth: u32,
    pub reg_base: u64,
    pub(super) state: Mutex<State>,
    /// The engine sleeps on it.
    pub(super) wake: Condvar,
    /// Reset waiters sleep on it.
    pub(super) reset: Condvar,
    /// Set (under `state`) by every request the engine must see between two SQEs.
    pub(super) interrupt: AtomicBool,
    /// Set when the channel is shut down: a waiter on its progress (the AI CPU) stops waiting.
    pub(super) closed: AtomicBool,
    /// What the engine writes per SQE, on its own cache line (the ringing core's thread must not lose its line to
    /// them).
    pub progress: CachePadded<Progress>,
    /// What a doorbell writes, on its own cache line.
    pub doorbell: CachePadded<Doorbell>,
    /// The progress signal for the napping core of the block that drives this channel (a landed flag, a stopped
    /// run).
    pub(super) activity: Arc<crate::activity::Activity>,
    /// Who wrote each SQ slot, rang each doorbell and read each landed flag ([`provenance`]).
    pub provenance: Arc<provenance::ChannelProvenance>,
    /// The engine's busy time ([`crate::occupancy`]): the device's counters for this channel index.
    pub(super) busy: Arc<crate::occupancy::ChannelBusy>,
}

/// The engine's side of a [`Channel`].
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// The engine's head (a copy of what it publishes in the record), for exceptions raised outside the engine.
    pub head: AtomicU32,
    pub executed: AtomicU64,
}

/// The doorbell register of a [`Channel`].
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    /// Accepted doorbell writes. A doorbell joins the set of ringers and stores the tail, then counts itself with one
    /// SeqCst read-modify-write, which publishes both: whoever reads the new count reads that tail (or a later one).
    pub count: AtomicU64,
    /// The register's value (the tail the engine runs to). A doorbell stores it and counts itself without the state
    /// lock; it takes the lock to notify only when the engine sleeps.
    pub tail: AtomicU32,
    /// The engine waits on `wake` (set by it under the state lock before it sleeps, then the count checked again):
    /// with the doorbell's count before its look at this, one of the two sees the other (all four SeqCst).
    pub engine_asleep: AtomicBool,
    /// Test-only ([`crate::control::divert_core_doorbells`]): while set, a core's accepted doorbell write does not
    /// reach the register; its tail is parked in `diverted` for the test to forward.
    pub divert: AtomicBool,
    /// `(diverted writes << 32) | last diverted tail`.
    pub diverted: AtomicU64,
    /// Who rang since the engine last took the tail (a [`provenance::Ringers`] set of `WRITER_*` bits, joined by
    /// each ring while the records are on before it stores the tail with release): an engine that reads a tail
    /// finds its ringer in the set it swaps out after ([`provenance::RingerTake`]).
    pub ringers: AtomicU64,
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Copies device segments into a Host buffer.
fn read_segments(segments: &[Segment], out: &mut [u8]) {
    let host = [Segment { ptr: out.as_mut_ptr(), len: out.len() }];
    // SAFETY: `segments` were translated under the space's read lock, which the caller still holds; `out` is a
    // live buffer of the same total length.
    unsafe { perform_copy(&host, segments) };
}

/// Whether this CPU has `clwb` (`std::arch::is_x86_feature_detected!` does not know it): CPUID leaf 7, if the CPU
/// has that leaf, EBX bit 24.
#[cfg(target_arch = "x86_64")]
static HAS_CLWB: LazyLock<bool> = LazyLock::new(|| {
    core::arch::x86_64::__cpuid(0).eax >= 7 && core::arch::x86_64::__cpuid_count(7, 0).ebx & (1 << 24) != 0
});

/// Speed only: `clwb` on the cache lines of `[ptr, ptr + len)`, which this engine thread has just read. On the AMD
/// EPYC VM the twin is measured on, the next writer of those lines (the emulated core landing the next lap of SQEs)
/// then takes them faster: a toy ring of 2 KiB landings behind a reading thread cost the writer 230-420 cycles per
/// landing instead of about 820 (the post cost of `benches/kernel.rs`). No effect on memory contents; nothing on a
/// CPU without `clwb` (what it does with a clean line is the CPU's choice).
fn hand_back(ptr: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if *HAS_CLWB {
            let mut line = ptr as usize & !63;
            while line < ptr as usize + len {
                // SAFETY: `line` is within a line of memory this thread just read (translated, mapped); clwb changes
                // no memory contents.
                unsafe { core::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags)) };
                line += 64;
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, len);
}

/// An aligned u32 or u64 cell in device memory, or `None` when the range is not one aligned segment.
fn single_aligned(segments: &[Segment], align: usize) -> Option<*mut u8> {
    match segments {
        [one] if one.ptr as usize % align == 0 => Some(one.ptr),
        _ => None,
    }
}

impl Channel {
    /// Sets the state under the lock and makes the engine look at it.
    fn request(&self, change: impl FnOnce(&mut State)) -> u64 {
        let mut state = lock(&self.state);
        change(&mut state);
        self.interrupt.store(true, Ordering::Release);
        self.wake.notify_all();
        state.reset_requested
    }

    /// An accepted doorbell write by `origin` (a `provenance::WRITER_*` id).
    pub(crate) fn ring(&self, tail: u32, origin: u32) {
        if provenance::recording() {
            self.provenance.rung(origin);
            // Before the tail: an engine that reads this tail (acquire) takes a set holding this ringer.
            self.doorbell.ringers.fetch_or(provenance::Ringers::bit(origin), Ordering::Relaxed);
        }
        // Off, one read-modify-write per ring (the count); on, one more on this line (the set) and the tally's. The
        // tail's store needs release only (the count publishes it; the engine's read of it acquires the set's OR), and
        // a SeqCst store would be a second fenced write of the line the polling engine keeps reading.
        self.doorbell.tail.store(tail, Ordering::Release);
        self.doorbell.count.fetch_add(1, Ordering::SeqCst);
        if self.doorbell.engine_asleep.load(Ordering::SeqCst) {
            // The engine holds the lock from its look at the count until it waits: taking it here means it waits.
            let _state = lock(&self.state);
            self.wake.notify_all();
        }
    }

    /// Records the first exception of this stop.
    pub(super) fn raise(&self, exception: ChannelException) {
        let mut state = lock(&self.state);
        if state.exception.is_none() {
            state.exception = Some(exception);
        }
    }

    pub(crate) fn exception(&self) -> Option<ChannelException> {
        lock(&self.state).exception.clone()
    }

    pub(crate) fn set_stalled(&self, stalled: bool) {
        self.request(|state| state.stalled = stalled);
    }

    pub(crate) fn shut_down(&self) {
        self.closed.store(true, Ordering::Release);
        self.request(|state| state.shutdown = true);
    }

    /// Whether the channel was shut down (its engine executes nothing more).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The progress signal of the channel (bumped when a flag lands and when a run stops).
    pub(crate) fn activity(&self) -> &crate::activity::Activity {
        &self.activity
    }

    /// Drops the pending SQEs (head := tail) and clears the exception; waits at most [`RESET_WAIT`].
    pub(crate) fn reset(&self) -> Result<(), Duration> {
        let wanted = self.request(|state| state.reset_requested += 1);
        let deadline = Instant::now() + RESET_WAIT;
        let mut state = lock(&self.state);
        while state.reset_done < wanted {
            let now = Instant::now();
            if now >= deadline {
                return Err(RESET_WAIT);
            }
            state = self.reset.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        Ok(())
    }

    pub(super) fn exception_at(
        &self,
        head: u32,
        tail: u32,
        syndrome: Syndrome,
        sqe: [u8; SQE_BYTES],
    ) -> ChannelException {
        ChannelException {
            device: self.device,
            channel: self.index,
            sq_id: self.sq_id,
            head,
            tail,
            syndrome,
            sqe,
            register: None,
        }
    }

    /// Stores `head` into the record's `sq_head` (atomic, release), through the device view.
    fn publish_head(&self, space: &Space, head: u32) -> Result<(), Syndrome> {
        let segments = space.translate(self.record as usize, 4, true).map_err(|_| Syndrome::QUEUE_FAULT)?;
        let cell = single_aligned(&segments, 4).ok_or(Syndrome::QUEUE_FAULT)?;
        // SAFETY: a 4-byte aligned word of the channel record, translated under the read lock the caller holds
        // (the memory stays mapped until it is released); other users read it as plain or atomic bytes.
        unsafe { AtomicU32::from_ptr(cell.cast()) }.store(head, Ordering::Release);
        Ok(())
    }

    /// Executes the SQE at `head`, exposed by the doorbell `ringers` rang (the engine took it at doorbell count
    /// `doorbell`); on a fault returns the syndrome and the raw SQE.
    fn execute(
        &self,
        head: u32,
        ringers: provenance::Ringers,
        doorbell: u64,
    ) -> Result<(), (Syndrome, [u8; SQE_BYTES])> {
        let guard = space();
        let Some(space) = guard.as_ref() else { return Err((Syndrome::QUEUE_FAULT, [0; SQE_BYTES])) };
        let slot = self.sq_base + u64::from(head) * SQE_BYTES as u64;
        let mut raw = [0u8; SQE_BYTES];
        let segments = space.translate(slot as usize, SQE_BYTES, false).map_err(|_| (Syndrome::QUEUE_FAULT, raw))?;
        read_segments(&segments, &mut raw);
        for segment in segments.iter() {
            hand_back(segment.ptr, segment.len);
        }
        // Who wrote these bytes, read with them (the writer marked its slot before it rang).
        let recording = provenance::recording();
        let writer = if recording { self.provenance.writer_of(head) } else { provenance::WRITER_UNKNOWN };
        let sqe = SdmaSqe::from_bytes(&raw);
        if sqe.sqe_type() != SQE_TYPE_SDMA {
            return Err((Syndrome::BAD_TYPE, raw));
        }
        if sqe.opcode() != SQE_OPCODE_COPY {
            return Err((Syndrome::BAD_OPCODE, raw));
        }
        if sqe.opcode_word != SQE_COPY_OPCODE_WORD
            || sqe.kernel_credit != SQE_KERNEL_CREDIT_SDMA
            || sqe.ptr_mode != 0
            || !matches!(sqe.link_type, SQE_LINK_TYPE_NONE | SQE_LINK_TYPE_ONCHIP)
        {
            return Err((Syndrome::BAD_FIELDS, raw));
        }
        if sqe.length == 0 || sqe.length > SQE_MAX_LENGTH {
            return Err((Syndrome::BAD_LENGTH, raw));
        }
        let length = sqe.length as usize;
        let (src, dst) = (sqe.src() as usize, sqe.dst() as usize);
        let from = space.translate(src, length, false).map_err(|_| (Syndrome::SRC_FAULT, raw))?;
        if take_injected_destination_fault(self.device) {
            return Err((Syndrome::DST_FAULT, raw));
        }
        let to = space.translate(dst, length, true).map_err(|_| (Syndrome::DST_FAULT, raw))?;
        match (length, single_aligned(&from, 8), single_aligned(&to, 8)) {
            (8, Some(from), Some(to)) => {
                // SAFETY: two 8-byte aligned words of device memory, translated under the read lock held here.
                // The flag words are accessed atomically by their users; Acquire/Release orders this flag after
                // every earlier copy of this in-order channel for a reader that acquires it.
                let value = unsafe { AtomicU64::from_ptr(from.cast()) }.load(Ordering::Acquire);
                // Recorded before the store: a reader that returns the value finds the record, and whoever sees
                // the flag (the kernel, then the Host draining the completions it covers) finds this SQE tallied.
                if recording {
                    let landing = self.provenance.flag_landing(dst as u64, value);
                    self.provenance.consumed(writer, ringers, doorbell, Some(landing));
                }
                // Counted before the store too: whoever sees the flag finds this SQE among the executed ones.
                self.progress.executed.fetch_add(1, Ordering::Relaxed);
                // SAFETY: as above.
                unsafe { AtomicU64::from_ptr(to.cast()) }.store(value, Ordering::Release);
                self.activity.progressed();
            }
            _ => {
                // SAFETY: both sides were translated under the read lock held here, for `length` bytes each.
                unsafe { perform_copy(&to, &from) };
                if recording {
                    self.provenance.consumed(writer, ringers, doorbell, None);
                }
                self.progress.executed.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Waits up to [`ENGINE_POLL_WINDOW`] for a doorbell or a request after the last one the engine saw, spinning
    /// then yielding: a hardware engine reacts to its doorbell at once, and a kernel that rings again within the
    /// window (the next doorbell batch) must not pay a thread wake-up per ring.
    fn poll_briefly(&self, rung: u64) {
        let started = Instant::now();
        let mut spins = 0u32;
        while self.doorbell.count.load(Ordering::Acquire) == rung
            && !self.interrupt.load(Ordering::Acquire)
            && started.elapsed() < ENGINE_POLL_WINDOW
        {
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The engine thread's body.
    pub(super) fn run(self: Arc<Self>) {
        provenance::mark_device_thread();
        let mut head = 0u32;
        // Doorbells counted when the engine last took the tail: a later one is new work.
        let mut seen = 0u64;
        // Who rang the doorbells the engine took.
        let mut ringers = provenance::RingerTake::default();
        loop {
            self.poll_briefly(seen);
            // The tail, and who rang it.
            let (tail, rung_by) = {
                let mut state = lock(&self.state);
                loop {
                    self.interrupt.store(false, Ordering::Relaxed);
                    if state.shutdown {
                        return;
                    }
                    if state.reset_requested != state.reset_done {
                        let tail = self.doorbell.tail.load(Ordering::SeqCst) % self.depth;
                        self.doorbell.tail.store(tail, Ordering::SeqCst);
                        head = tail;
                        // The rings of the dropped SQEs are forgotten with them.
                        self.doorbell.ringers.store(0, Ordering::Relaxed);
                        ringers.forget();
                        self.progress.head.store(head, Ordering::Relaxed);
                        // A record that no longer translates (the workspace was freed) makes the next SQE fault.
                        let _ = space().as_ref().map(|space| self.publish_head(space, head));
                        state.exception = None;
                        state.reset_done = state.reset_requested;
                        self.reset.notify_all();
                        continue;
                    }
                    // A doorbell stores its tail before it counts itself: every ring counted in `seen` is covered by
                    // the tail read after it.
                    let rung = self.doorbell.count.load(Ordering::SeqCst);
                    let tail = self.doorbell.tail.load(Ordering::SeqCst);
                    if !state.stalled && state.exception.is_none() && tail != head {
                        // Who rang since the last take, swapped out after the tail was read.
                        let rung_by = ringers.take(&self.doorbell.ringers, provenance::recording_epoch());
                        seen = rung;
                        break (tail, rung_by);
                    }
                    self.doorbell.engine_asleep.store(true, Ordering::SeqCst);
                    if self.doorbell.count.load(Ordering::SeqCst) != rung {
                        // Rung between the look above and going to sleep.
                        self.doorbell.engine_asleep.store(false, Ordering::SeqCst);
                        continue;
                    }
                    state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner());
                    self.doorbell.engine_asleep.store(false, Ordering::SeqCst);
                }
            };
            if tail >= self.depth {
                self.raise(self.exception_at(head, tail, Syndrome::BAD_TAIL, [0; SQE_BYTES]));
                continue;
            }
            // The record's sq_head is published when the run stops (caught up with the tail, interrupted, or at a bad
            // SQE, before its exception is raised), not per SQE: the kernel stores its software tail into the same
            // record line at every doorbell, and a store per SQE from here would take that line from the ringing
            // core each time. Nobody reads the record's head during a run (the kernel at channel load, the Host at
            // an exception).
            // Busy from here to the end of the run: one clock reading at each end, none per SQE.
            self.busy.run_started();
            // The trace's engine track: one relaxed load per run when off.
            let traced_start = crate::occupancy::engine_runs_recorded(self.device).then(crate::occupancy::monotonic_ns);
            let mut executed = 0u64;
            let mut fault = None;
            while head != tail && !self.interrupt.load(Ordering::Acquire) {
                match self.execute(head, rung_by, seen) {
                    Ok(()) => {
                        head = (head + 1) % self.depth;
                        self.progress.head.store(head, Ordering::Relaxed);
                        executed += 1;
                    }
                    Err(failed) => {
                        fault = Some(failed);
                        break;
                    }
                }
            }
            // Before the head is published: whoever sees the head sees the run's counters final.
            self.busy.run_ended(executed);
            if let Some(start_ns) = traced_start {
                crate::occupancy::push_engine_run(crate::occupancy::EngineRun {
                    device: self.device,
                    channel: self.index,
                    start_ns,
                    end_ns: crate::occupancy::monotonic_ns(),
                    sqes: executed,
                });
            }
            let published = space().as_ref().map(|space| self.publish_head(space, head));
            self.activity.progressed();
            if let Some((syndrome, raw)) = fault {
                self.raise(self.exception_at(head, tail, syndrome, raw));
            } else if let Some(Err(syndrome)) = published {
                // The record no longer translates (its workspace was freed): as a fault of the SQE at the head.
                self.raise(self.exception_at(head, tail, syndrome, [0; SQE_BYTES]));
            }
        }
    }
}
