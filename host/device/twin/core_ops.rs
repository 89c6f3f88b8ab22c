//! The twin's side of the C ABI of `kernels/cpu/aiv_cpu_core.h`: what an emulated AIV core asks of the device while
//! the kernel (the NPU code, compiled against the CPU model of AscendC) runs on it.
//!
//! Owns: the ops table (device memory translation, register writes, the system counter, the idle hint, faults) and
//! [`on_core`], which installs a core on the calling thread around a closure. Must not run kernel logic.
//!
//! - `translate`: a device range lies in one of the device's windows (own HBM, the workspace, imported peer windows)
//!   or in Host-registered shared memory (rings, DCQ, control block, kernel arguments); on the twin those are mapped
//!   at their device address, so the pointer is the address itself. Anything else is refused (NULL) and the model
//!   raises a fault, recorded as a channel exception of the block.
//! - `register_write`: a DMA write the model could not place in memory: if it lands in the block's channel's
//!   register page, the channel decides (only the 4-byte doorbell at offset 0x8 is taken); else it is no register.
//! - `idle_hint`: the core has re-read unchanged memory many times (it is polling, as a resident NPU kernel does): it
//!   spins, then yields for [`KERNEL_POLL_WINDOW`], then sleeps on its block's wake word (bounded, 1 ms), which
//!   the Host's publishes and the SDMA engine's progress bump. The NPU kernel never sleeps; the twin does so that
//!   polling cores do not take the Host's CPUs, without any signal to the Host.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::sdma::{SdmaChannel, Windows};

/// What one block's emulated core works with (`core_ops`): its channel (whose register page takes its doorbells
/// and whose progress word wakes its idle core, as do the Host's publishes) and the memory the device can reach.
#[derive(Debug)]
pub struct BlockContext {
    pub(super) channel: Arc<SdmaChannel>,
    pub(super) memory: Arc<KernelMemory>,
}

/// The device ranges a kernel may touch: the device's windows (HBM, workspace, imported peers) and the Host memory
/// registered for device access (rings, DCQ, control blocks, kernel arguments).
#[derive(Debug)]
pub struct KernelMemory {
    pub(super) windows: Windows,
    pub(super) shared: RwLock<Vec<(u64, u64)>>,
}

impl KernelMemory {
    pub(super) fn contains(&self, addr: u64, length: u64) -> bool {
        let Some(end) = addr.checked_add(length) else { return false };
        // A window, once added, stays for the device's lifetime (windows only grow: imports are mapped until the
        // device drops), so a range found inside one stays inside it: the core remembers the last window it hit and
        // takes no lock for ranges inside it. Shared registrations can be withdrawn, so they are looked up each time.
        let this = self as *const KernelMemory as usize;
        let (memory, base, limit) = WINDOW_HIT.with(Cell::get);
        if memory == this && addr >= base && end <= limit {
            return true;
        }
        let inside =
            |ranges: &[(u64, u64)]| ranges.iter().copied().find(|&(base, len)| addr >= base && end <= base + len);
        // The window a core mostly uses (its channel's SQ in the workspace) is remembered above, so what is left is
        // mostly shared memory (rings, DCQ, control block): look there first, with one lock.
        if inside(&self.shared.read().unwrap_or_else(|p| p.into_inner())).is_some() {
            return true;
        }
        if let Some((base, len)) = inside(&self.windows.read().unwrap_or_else(|p| p.into_inner())) {
            WINDOW_HIT.with(|hit| hit.set((this, base, base + len)));
            return true;
        }
        false
    }
}

/// How long an emulated core whose kernel waits for requests keeps polling (spinning, then yielding) before it
/// sleeps. A resident NPU kernel polls its request ring all the time; the twin polls for this window after its last
/// work, so a Host that publishes requests within it needs no wake-up system call, and then sleeps so that an idle
/// engine does not hold one of the machine's cores. Device-side CPU, never charged to the Host.
pub const KERNEL_POLL_WINDOW: Duration = Duration::from_micros(200);

fn monotonic_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

/// `AIV_CPU_ABI_VERSION` of `kernels/cpu/aiv_cpu_core.h`.
const ABI_VERSION: u32 = 1;
/// `AIV_CPU_REG_*`.
const REG_ACCEPTED: i32 = 0;
const REG_REFUSED: i32 = 1;
const REG_NOT_REGISTER: i32 = 2;

/// `AivCpuCoreOps`, field for field.
#[repr(C)]
struct CoreOps {
    abi_version: u32,
    translate: Option<unsafe extern "C" fn(*mut c_void, u64, u64) -> *mut c_void>,
    register_write: Option<unsafe extern "C" fn(*mut c_void, u64, *const c_void, u32) -> i32>,
    system_counter: Option<unsafe extern "C" fn(*mut c_void) -> u64>,
    idle_hint: Option<unsafe extern "C" fn(*mut c_void, u32)>,
    fault: Option<unsafe extern "C" fn(*mut c_void, u32, u64, u64)>,
}

extern "C" {
    fn aiv_cpu_core_enter(ops: *const CoreOps, context: *mut c_void, block_idx: u32, block_num: u32) -> i32;
    fn aiv_cpu_core_leave() -> u32;
}

static OPS: CoreOps = CoreOps {
    abi_version: ABI_VERSION,
    translate: Some(translate),
    register_write: Some(register_write),
    system_counter: Some(system_counter),
    idle_hint: Some(idle_hint),
    fault: Some(fault),
};

thread_local! {
    /// The wake-word token read at the previous idle hint of this core, so a publish between two hints is not lost.
    static LAST_TOKEN: Cell<u32> = const { Cell::new(0) };
    /// When this core's current poll began (monotonic ns).
    static POLL_SINCE: Cell<u64> = const { Cell::new(0) };
    /// The window of the installed core's device that the last translation found (`KernelMemory` address, base,
    /// end); cleared whenever a core is installed or leaves, so it never outlives the device it names.
    static WINDOW_HIT: Cell<(usize, u64, u64)> = const { Cell::new((0, 0, 0)) };
}

/// # Safety
/// `context` is the `BlockContext` [`on_core`] installed, alive while the core runs.
unsafe fn block<'a>(context: *mut c_void) -> &'a BlockContext {
    // SAFETY: the caller's contract.
    unsafe { &*(context as *const BlockContext) }
}

unsafe extern "C" fn translate(context: *mut c_void, device_addr: u64, len: u64) -> *mut c_void {
    // SAFETY: the model passes back the context on_core installed.
    let block = unsafe { block(context) };
    // The channel's register page is device-owned memory outside every window and registration (a doorbell's DMA
    // is refused here and goes to register_write), so it is answered without looking the ranges up.
    if block.channel.owns_register(device_addr) {
        return std::ptr::null_mut();
    }
    if block.memory.contains(device_addr, len) {
        device_addr as *mut c_void
    } else {
        std::ptr::null_mut()
    }
}

unsafe extern "C" fn register_write(context: *mut c_void, device_addr: u64, data: *const c_void, len: u32) -> i32 {
    // SAFETY: as in `translate`.
    let block = unsafe { block(context) };
    if !block.channel.owns_register(device_addr) {
        return REG_NOT_REGISTER;
    }
    // SAFETY: the model passes `len` readable bytes of its unified buffer.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len as usize) };
    if block.channel.write_register(device_addr, bytes) {
        REG_ACCEPTED
    } else {
        REG_REFUSED
    }
}

unsafe extern "C" fn system_counter(_context: *mut c_void) -> u64 {
    monotonic_ns()
}

unsafe extern "C" fn idle_hint(context: *mut c_void, unchanged_fills: u32) {
    // SAFETY: as in `translate`.
    let block = unsafe { block(context) };
    let waker = &block.channel.progress;
    let previous = LAST_TOKEN.with(|token| token.replace(waker.token()));
    let now = monotonic_ns();
    // The model calls from its poll threshold (16 unchanged fills) on; the first call starts the poll.
    if unchanged_fills <= 16 {
        POLL_SINCE.with(|since| since.set(now));
    }
    let polled = now.saturating_sub(POLL_SINCE.with(Cell::get));
    if unchanged_fills < 64 {
        std::hint::spin_loop();
    } else if polled < KERNEL_POLL_WINDOW.as_nanos() as u64 {
        std::thread::yield_now();
    } else {
        waker.sleep(previous, Duration::from_millis(1));
    }
}

unsafe extern "C" fn fault(context: *mut c_void, kind: u32, device_addr: u64, len: u64) {
    // SAFETY: as in `translate`.
    let block = unsafe { block(context) };
    let what = match kind {
        1 => "an access outside device memory",
        2 => "an intrinsic argument out of range",
        3 => "a misaligned operand",
        4 => "a unified-buffer access out of range",
        5 => "an unsupported mode",
        6 => "unordered pipes (a missing SetFlag/WaitFlag or barrier)",
        _ => "an unknown fault",
    };
    block.channel.core_fault(format!("AIV core fault {kind} ({what}) at {device_addr:#x}, {len} bytes"));
}

/// Runs `work` with the calling thread installed as the emulated core of `block` (block `index` of `count`), and
/// returns what it returned with the number of dirty cache lines discarded when the core left (scalar stores the
/// kernel never cleaned: they never reached memory). `None` if the model refused the installation.
pub(crate) fn on_core<T>(block: &BlockContext, index: u32, count: u32, work: impl FnOnce() -> T) -> Option<(T, u32)> {
    let context = block as *const BlockContext as *mut c_void;
    WINDOW_HIT.with(|hit| hit.set((0, 0, 0)));
    // SAFETY: OPS is a static of the layout the model expects; `block` outlives this call, which uninstalls the core
    // before returning.
    if unsafe { aiv_cpu_core_enter(&OPS, context, index, count) } != 0 {
        return None;
    }
    let output = work();
    // SAFETY: the core installed above, on this thread.
    let discarded = unsafe { aiv_cpu_core_leave() };
    WINDOW_HIT.with(|hit| hit.set((0, 0, 0)));
    Some((output, discarded))
}
