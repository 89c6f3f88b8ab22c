//! A STARS-like SDMA engine: one thread per channel that executes 64-byte SQEs strictly in order.
//!
//! The engine wakes on a doorbell (the kernel's 4-byte DMA write of the new tail into the channel's register page,
//! [`SdmaChannel::write_register`], which bumps [`SdmaChannel::doorbell`]; any other write there stops the channel), reads SQEs from `sq_base + head * SQE_BYTES`, checks each one (type,
//! opcode, length, source and destination inside the device's mapped windows) and copies. A bad SQE stops the channel
//! and records a [`ChannelException`] with the queue context and the raw SQE; the channel stays stopped until the
//! Host resets it. After each SQE the engine publishes `sq_head` in the channel record (Release); when it catches up
//! with the tail it bumps [`SdmaChannel::progress`] so a kernel sleeping on its completion flag re-checks.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use zerocopy::FromBytes;

use super::wake::Waiter;
use crate::device::{ChannelException, DeviceError, SdmaSyndrome};
use crate::kernel_abi::{
    ChannelRecord, SdmaSqe, SqIndex, SDMA_DOORBELL_OFFSET, SDMA_MAX_SQE_BYTES, SQE_BYTES, SQE_TYPE_SDMA,
};

/// How long an idle engine keeps yielding before it sleeps on the doorbell.
const ENGINE_YIELD_WINDOW: Duration = Duration::from_micros(50);

/// The channel's doorbell register page (device-owned memory; `sq_reg_base` points here).
#[derive(Debug)]
#[repr(C, align(4096))]
pub struct RegisterPage {
    words: [AtomicU32; 1024],
}

impl RegisterPage {
    fn new() -> Box<RegisterPage> {
        Box::new(RegisterPage { words: std::array::from_fn(|_| AtomicU32::new(0)) })
    }
    /// The doorbell word the kernel writes the tail into.
    fn tail(&self) -> &AtomicU32 {
        &self.words[SDMA_DOORBELL_OFFSET as usize / 4]
    }
}

/// Address windows the engine accepts (own HBM, the workspace, imported peer windows).
pub type Windows = Arc<RwLock<Vec<(u64, u64)>>>;

/// The window holding `[addr, addr + length)`, as (base, end).
fn window_of(windows: &[(u64, u64)], addr: u64, length: u64) -> Option<(u64, u64)> {
    let end = addr.checked_add(length)?;
    windows.iter().find(|&&(base, len)| addr >= base && end <= base + len).map(|&(base, len)| (base, base + len))
}

/// The last two windows the engine found an SQE's ranges in. Windows only grow during the device's lifetime (an
/// import stays mapped until the device drops), so a range inside a remembered window is inside the device's windows
/// without taking their lock (which the emulated cores' translations also take).
#[derive(Default)]
struct WindowHits {
    hits: [(u64, u64); 2],
    next: usize,
}

impl WindowHits {
    fn holds(&self, addr: u64, length: u64) -> bool {
        addr.checked_add(length).is_some_and(|end| self.hits.iter().any(|&(base, limit)| addr >= base && end <= limit))
    }
    fn remember(&mut self, window: (u64, u64)) {
        if !self.hits.contains(&window) {
            self.hits[self.next] = window;
            self.next ^= 1;
        }
    }
}

/// One SDMA channel of the twin.
#[derive(Debug)]
pub struct SdmaChannel {
    index: u32,
    sq_id: u32,
    record: *mut ChannelRecord,
    sq_base: u64,
    sq: SqIndex,
    registers: Box<RegisterPage>,
    windows: Windows,
    /// Bumped by the doorbell hook; the engine sleeps on it.
    pub doorbell: Waiter,
    /// Bumped when the engine catches up with the tail; a kernel waiting for its flag sleeps on it.
    pub progress: Waiter,
    stalled: AtomicBool,
    faulted: AtomicBool,
    exception: Mutex<Option<ChannelException>>,
    reset_requested: AtomicU32,
    reset_done: AtomicU32,
    shutdown: AtomicBool,
    executed: AtomicU64,
    doorbells: AtomicU64,
}

// SAFETY: `record` points into the device workspace, which outlives the channel (the device owns both and joins
// the engine thread before unmapping); the record's words are accessed atomically (see `record_word`).
unsafe impl Send for SdmaChannel {}
// SAFETY: as above.
unsafe impl Sync for SdmaChannel {}

impl SdmaChannel {
    /// A channel whose record lives at `record` and SQ ring at `sq_base` (both in the device workspace).
    ///
    /// # Safety
    /// `record` must point to a zeroed `ChannelRecord` and `sq_base` to `depth` SQEs (`depth * SQE_BYTES` bytes), both valid until the
    /// channel's engine thread has been joined.
    pub unsafe fn new(
        index: u32,
        device_id: u32,
        record: *mut ChannelRecord,
        sq_base: u64,
        depth: u32,
        windows: Windows,
    ) -> Result<Arc<SdmaChannel>, DeviceError> {
        let sq = SqIndex::new(depth).ok_or_else(|| DeviceError::Invalid {
            device: device_id,
            operation: "open channel",
            reason: format!("sq_depth {depth} is below 2"),
        })?;
        let registers = RegisterPage::new();
        let init = ChannelRecord {
            sq_base: sq_base.into(),
            sq_reg_base: (&*registers as *const RegisterPage as u64).into(),
            sq_depth: depth.into(),
            sq_id: index.into(),
            cq_id: index.into(),
            logic_cq_id: index.into(),
            stream_id: index.into(),
            dev_id: device_id.into(),
            ..ChannelRecord::default()
        };
        // SAFETY: the caller guarantees `record` is valid; no kernel runs on this channel yet.
        unsafe { record.write(init) };
        Ok(Arc::new(SdmaChannel {
            index,
            sq_id: index,
            record,
            sq_base,
            sq,
            registers,
            windows,
            doorbell: Waiter::default(),
            progress: Waiter::default(),
            stalled: AtomicBool::new(false),
            faulted: AtomicBool::new(false),
            exception: Mutex::new(None),
            reset_requested: AtomicU32::new(0),
            reset_done: AtomicU32::new(0),
            shutdown: AtomicBool::new(false),
            executed: AtomicU64::new(0),
            doorbells: AtomicU64::new(0),
        }))
    }

    /// The doorbell register base written into the channel record.
    pub fn register_base(&self) -> u64 {
        &*self.registers as *const RegisterPage as u64
    }

    /// Whether `addr` lies in this channel's register page.
    pub fn owns_register(&self, addr: u64) -> bool {
        addr.wrapping_sub(self.register_base()) < std::mem::size_of::<RegisterPage>() as u64
    }

    /// A device write (a UB -> GM DMA of the kernel) into this channel's register page. The doorbell is a u32 at
    /// offset 0x8: exactly a 4-byte write there sets the tail and rings; any other width or offset writes nothing,
    /// stops the channel with [`SdmaSyndrome::BAD_REGISTER_WRITE`] naming offset and width, and returns false.
    pub fn write_register(&self, addr: u64, data: &[u8]) -> bool {
        let offset = addr.wrapping_sub(self.register_base());
        if offset == SDMA_DOORBELL_OFFSET && data.len() == 4 {
            let tail = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            // Release: the SQEs the kernel wrote (and cleaned) before this doorbell are what the engine reads after
            // it acquires the tail.
            self.registers.tail().store(tail, Ordering::Release);
            self.doorbells.fetch_add(1, Ordering::Relaxed);
            self.doorbell.notify();
            return true;
        }
        let head = self.record_sq_head().load(Ordering::Acquire);
        let tail = self.registers.tail().load(Ordering::Acquire);
        let mut raw = [0u8; 64];
        let shown = data.len().min(raw.len());
        raw[..shown].copy_from_slice(&data[..shown]);
        let detail = format!(
            "a {}-byte write at offset {offset:#x} of the register page (the doorbell is 4 bytes at offset {:#x});              the written bytes are shown as the raw SQE",
            data.len(),
            SDMA_DOORBELL_OFFSET
        );
        self.stop_with(SdmaSyndrome::BAD_REGISTER_WRITE, head, tail, raw, Some(detail));
        false
    }

    /// A fault of the AIV core that drives this channel: stops the channel so the Host finds the reason.
    pub fn core_fault(&self, detail: String) {
        let head = self.record_sq_head().load(Ordering::Acquire);
        let tail = self.registers.tail().load(Ordering::Acquire);
        self.stop_with(SdmaSyndrome::KERNEL_FAULT, head, tail, [0; 64], Some(detail));
    }

    /// Doorbells accepted so far.
    pub fn doorbells(&self) -> u64 {
        self.doorbells.load(Ordering::Relaxed)
    }

    fn record_sq_head(&self) -> &AtomicU32 {
        // SAFETY: `record` is valid (constructor contract) and 4-byte aligned (workspace allocations are page aligned,
        // sq_head is at offset 0); the kernel reads this word only atomically.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.record).sq_head).cast()) }
    }

    /// The recorded exception, if the channel is stopped.
    pub fn exception(&self) -> Option<ChannelException> {
        self.exception.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// SQEs executed so far.
    pub fn executed(&self) -> u64 {
        self.executed.load(Ordering::Relaxed)
    }

    /// Fault injection: while stalled the engine executes nothing (it still honours resets and shutdown).
    pub fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::Release);
        self.doorbell.notify();
    }

    /// Drops pending SQEs and clears the exception; waits (bounded) until the engine thread has done it.
    pub fn reset(&self, device_id: u32) -> Result<(), DeviceError> {
        let wanted = self.reset_requested.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        self.doorbell.notify();
        let started = Instant::now();
        let limit = Duration::from_secs(2);
        // Acquire pairs with the engine's Release of reset_done: the cleared state is visible afterwards.
        while self.reset_done.load(Ordering::Acquire) != wanted {
            if started.elapsed() > limit {
                return Err(DeviceError::Timeout { device: device_id, operation: "reset SDMA channel", waited: limit });
            }
            std::thread::sleep(Duration::from_micros(50));
            self.doorbell.notify();
        }
        Ok(())
    }

    /// Asks the engine thread to exit.
    pub fn shut_down(&self) {
        self.shutdown.store(true, Ordering::Release);
        self.doorbell.notify();
    }

    /// The engine thread's body.
    pub fn run(self: Arc<Self>) {
        // SAFETY: constructor contract; sq_head is only written by this thread (and read atomically by others).
        let mut head = self.record_sq_head().load(Ordering::Acquire);
        let mut spins = 0u32;
        let mut caught_up_reported = true;
        let mut idle_since: Option<Instant> = None;
        let mut hits = WindowHits::default();
        while !self.shutdown.load(Ordering::Acquire) {
            let requested = self.reset_requested.load(Ordering::Acquire);
            let token = self.doorbell.token();
            if requested != self.reset_done.load(Ordering::Relaxed) {
                head = self.registers.tail().load(Ordering::Acquire) % self.sq.depth();
                self.record_sq_head().store(head, Ordering::Release);
                *self.exception.lock().unwrap_or_else(|p| p.into_inner()) = None;
                self.faulted.store(false, Ordering::Release);
                // Release: the Host that acquires reset_done sees the cleared exception and head.
                self.reset_done.store(requested, Ordering::Release);
                continue;
            }
            if self.stalled.load(Ordering::Acquire) || self.faulted.load(Ordering::Acquire) {
                self.doorbell.sleep(token, Duration::from_millis(5));
                continue;
            }
            // Acquire pairs with the kernel's Release store of the tail: SQEs up to it are fully written.
            let tail = self.registers.tail().load(Ordering::Acquire);
            if tail >= self.sq.depth() {
                self.stop(SdmaSyndrome::BAD_TAIL, head, tail, [0; 64]);
                continue;
            }
            if tail == head {
                if !caught_up_reported {
                    self.progress.notify();
                    caught_up_reported = true;
                }
                // Back-off: spin, then yield for up to ENGINE_YIELD_WINDOW after the last SQE, then sleep. A doorbell
                // costs the kernel a system call only while the engine sleeps, so the engine stays reachable through
                // the short gaps between doorbells but does not hold a core once the channel has gone quiet.
                let idle_for = idle_since.get_or_insert_with(Instant::now).elapsed();
                if spins < 16 {
                    std::hint::spin_loop();
                } else if idle_for < ENGINE_YIELD_WINDOW {
                    std::thread::yield_now();
                } else {
                    self.doorbell.sleep(token, Duration::from_millis(20));
                }
                spins = spins.saturating_add(1);
                continue;
            }
            spins = 0;
            idle_since = None;
            let address = self.sq_base + self.sq.offset(head);
            let mut raw = [0u8; SQE_BYTES as usize];
            // SAFETY: `address` is slot `head` of the SQ ring (constructor contract: depth SQEs of valid bytes),
            // written by the kernel before its Release store of a tail past it, which we acquired above.
            unsafe { std::ptr::copy_nonoverlapping(address as *const u8, raw.as_mut_ptr(), raw.len()) };
            let Ok(sqe) = SdmaSqe::read_from_bytes(&raw) else { continue };
            if let Err(syndrome) = self.execute(&sqe, &mut hits) {
                self.stop(syndrome, head, tail, raw);
                continue;
            }
            self.executed.fetch_add(1, Ordering::Relaxed);
            head = self.sq.next(head);
            // Release: a reader of sq_head sees the copies of every SQE before it.
            self.record_sq_head().store(head, Ordering::Release);
            if head == tail {
                self.progress.notify();
                caught_up_reported = true;
            } else {
                caught_up_reported = false;
            }
        }
    }

    fn stop(&self, syndrome: SdmaSyndrome, head: u32, tail: u32, sqe: [u8; 64]) {
        self.stop_with(syndrome, head, tail, sqe, None);
    }

    fn stop_with(&self, syndrome: SdmaSyndrome, head: u32, tail: u32, sqe: [u8; 64], detail: Option<String>) {
        let exception = ChannelException { channel: self.index, sq_id: self.sq_id, head, tail, syndrome, sqe, detail };
        tracing::warn!(channel = self.index, head, tail, syndrome = syndrome.0, "SDMA channel stopped by a bad SQE");
        *self.exception.lock().unwrap_or_else(|p| p.into_inner()) = Some(exception);
        self.faulted.store(true, Ordering::Release);
        // A kernel waiting for its flag re-checks (it will time out or be aborted; the Host reads the exception).
        self.progress.notify();
    }

    fn execute(&self, sqe: &SdmaSqe, hits: &mut WindowHits) -> Result<(), SdmaSyndrome> {
        if sqe.sqe_type() != SQE_TYPE_SDMA {
            return Err(SdmaSyndrome::BAD_TYPE);
        }
        if sqe.opcode() != 0 {
            return Err(SdmaSyndrome::BAD_OPCODE);
        }
        let length = sqe.length.get();
        if length == 0 || length > SDMA_MAX_SQE_BYTES {
            return Err(SdmaSyndrome::BAD_LENGTH);
        }
        let (src, dst, len) = (sqe.src(), sqe.dst(), u64::from(length));
        if !(hits.holds(src, len) && hits.holds(dst, len)) {
            let windows = self.windows.read().unwrap_or_else(|p| p.into_inner());
            let Some(src_window) = window_of(&windows, src, len) else {
                return Err(SdmaSyndrome::SRC_OUT_OF_WINDOW);
            };
            let Some(dst_window) = window_of(&windows, dst, len) else {
                return Err(SdmaSyndrome::DST_OUT_OF_WINDOW);
            };
            hits.remember(src_window);
            hits.remember(dst_window);
        }
        if len == 8 && src % 8 == 0 && dst % 8 == 0 {
            // An aligned 8-byte copy is how completion flags are written: store it atomically with Release so a
            // kernel that acquires the flag also sees every earlier copy of this in-order channel.
            // SAFETY: both ranges lie inside mapped windows (checked above) and are 8-byte aligned; the flag words
            // are only accessed atomically by the kernel.
            unsafe {
                let value = AtomicU64::from_ptr(src as *mut u64).load(Ordering::Acquire);
                AtomicU64::from_ptr(dst as *mut u64).store(value, Ordering::Release);
            }
        } else {
            // SAFETY: both ranges lie inside windows mapped by this device for its lifetime (checked above), and the
            // transfer contract (registered memory stays valid and unaliased by conflicting users until completion)
            // covers the bytes. `copy` tolerates overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, length as usize) };
        }
        Ok(())
    }
}
