//! The emulated AI Vector core's side of the runtime: the ops table the CPU model of AscendC calls
//! (`AivCpuCoreOps` of `kernels/cpu/aiv_cpu_core.h`: translation, register writes, the system counter, idle hints,
//! faults, the provenance reports), each core's context, how a polling core naps (what ends a nap early is the
//! device's [`Activity`], module `activity`), and the test control that parks polling cores. Binaries and launches
//! are in the parent module.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use super::{lock, KernelFault, FAULTS, FAULTS_KEPT, SYSTEM_COUNTER_HZ};
use crate::activity::Activity;
use crate::space::space;

/// How long a core that polls unchanged memory keeps spinning and yielding before it naps (device-side CPU only).
pub const POLL_WINDOW: Duration = Duration::from_micros(200);
/// The longest nap of a polling core: the latency a Host publish can see when the kernel was idle (the NPU kernel
/// never naps; the twin does so that idle cores do not hold the machine's CPUs, with no signal from the Host).
pub const MAX_NAP: Duration = Duration::from_micros(250);
/// The shortest nap of a polling core.
pub const MIN_NAP: Duration = Duration::from_micros(50);
/// A polling core naps 1/NAP_RAMP of the time it has polled, from [`MIN_NAP`] to [`MAX_NAP`]: a core idle for the few
/// ms between a busy Host's batches naps [`MIN_NAP`] (nothing from the Host wakes it, so its nap is how late it takes
/// the next batch; the paired comparison of `benches/kernel.rs` measures it), and one idle for 32 ms or more wakes
/// only every [`MAX_NAP`].
pub const NAP_RAMP: u64 = 128;

/// `AIV_CPU_ABI_VERSION` of `kernels/cpu/aiv_cpu_core.h`.
const ABI_VERSION: u32 = 3;
const REG_ACCEPTED: i32 = 0;
const REG_REFUSED: i32 = 1;
const REG_NOT_REGISTER: i32 = 2;

/// `AivCpuCoreOps`, field for field.
#[repr(C)]
pub(super) struct CoreOps {
    abi_version: u32,
    translate: Option<unsafe extern "C" fn(*mut c_void, u64, u64) -> *mut c_void>,
    register_write: Option<unsafe extern "C" fn(*mut c_void, u64, *const c_void, u32) -> i32>,
    system_counter: Option<unsafe extern "C" fn(*mut c_void) -> u64>,
    idle_hint: Option<unsafe extern "C" fn(*mut c_void, u32)>,
    fault: Option<unsafe extern "C" fn(*mut c_void, u32, u64, u64)>,
    gm_written: Option<unsafe extern "C" fn(*mut c_void, u64, u64)>,
    gm_read: Option<unsafe extern "C" fn(*mut c_void, u64, *const c_void, u64)>,
    /// (ABI 3) The byte that says whether the provenance records are kept (the model skips `gm_written` and
    /// `gm_read` while it is 0).
    records_on: *const u8,
}

// SAFETY: the one `CoreOps` is a static table of function pointers and a pointer to a static atomic byte, which the
// model only reads (atomically); sharing it between the cores' threads is what it is for.
unsafe impl Sync for CoreOps {}

/// The nap of a core that has polled unchanged memory for `polled_ns` (past its [`POLL_WINDOW`]): [`NAP_RAMP`].
fn core_nap(polled_ns: u64) -> Duration {
    Duration::from_nanos(polled_ns / NAP_RAMP).clamp(MIN_NAP, MAX_NAP)
}

/// What one core works with.
pub(super) struct CoreContext {
    device: i32,
    block: u32,
    /// Where this core's poll began (monotonic ns; 0: not polling).
    poll_since: std::cell::Cell<u64>,
    /// The device objects this core reached last (first device address, length, Host pointer of that byte), valid
    /// for the space generation they were read in: most accesses of a kernel hit its rings, records and flags.
    windows: std::cell::Cell<[(usize, usize, usize); WINDOWS_REMEMBERED]>,
    windows_generation: std::cell::Cell<u64>,
    next_window: std::cell::Cell<usize>,
    /// The last range translate refused (address, length, space generation): a doorbell register, rung thousands of
    /// times, is answered without the space's lock.
    refused: std::cell::Cell<(usize, usize, u64)>,
    /// The register page this core rang last.
    registers: crate::sdma::RegisterCache,
    /// The progress of its block's channel, and the count this core saw at its last idle hint.
    activity: Arc<Activity>,
    activity_seen: std::cell::Cell<u64>,
    /// This block's occupancy clock ([`crate::occupancy`]), the `unchanged_fills` of the last idle hint (0: none
    /// yet) and when the polling it accounted ends (monotonic ns).
    pub(super) clock: Arc<crate::occupancy::CoreClock>,
    poll_fills: std::cell::Cell<u32>,
    polled_until: std::cell::Cell<u64>,
}

/// Device objects an emulated core remembers.
const WINDOWS_REMEMBERED: usize = 8;

impl CoreContext {
    pub(super) fn new(device: i32, block: u32) -> CoreContext {
        CoreContext {
            device,
            block,
            poll_since: std::cell::Cell::new(0),
            windows: std::cell::Cell::new([(0, 0, 0); WINDOWS_REMEMBERED]),
            windows_generation: std::cell::Cell::new(u64::MAX),
            next_window: std::cell::Cell::new(0),
            refused: std::cell::Cell::new((0, 0, u64::MAX)),
            registers: crate::sdma::RegisterCache::default(),
            activity: Activity::of(device, block),
            activity_seen: std::cell::Cell::new(0),
            clock: crate::occupancy::core_entered(device, block),
            poll_fills: std::cell::Cell::new(0),
            polled_until: std::cell::Cell::new(0),
        }
    }

    /// The Host pointer of `[address, address + len)` if a remembered object of the current space holds it.
    fn remembered(&self, address: usize, len: usize, generation: u64) -> Option<*mut c_void> {
        if self.windows_generation.get() != generation {
            return None;
        }
        let end = address.checked_add(len)?;
        // In place: a copy of the whole array per access (Cell::get) costs more than the search.
        // SAFETY: the array lives as long as `self`; a CoreContext is used by its own core's thread only (Cell makes
        // it !Sync), and nothing writes `windows` while this shared view is alive.
        let windows = unsafe { &*self.windows.as_ptr() };
        windows.iter().find_map(|&(start, length, host)| {
            (length > 0 && address >= start && end <= start + length).then(|| (host + (address - start)) as *mut c_void)
        })
    }

    fn remember(&self, window: (usize, usize, usize), generation: u64) {
        let mut windows = if self.windows_generation.get() == generation {
            self.windows.get()
        } else {
            [(0, 0, 0); WINDOWS_REMEMBERED]
        };
        let slot = self.next_window.get() % WINDOWS_REMEMBERED;
        windows[slot] = window;
        self.next_window.set(slot + 1);
        self.windows.set(windows);
        self.windows_generation.set(generation);
    }
}

fn monotonic_ns() -> u64 {
    crate::occupancy::monotonic_ns()
}

/// # Safety
/// `context` is the `CoreContext` [`run_core`] installed, alive while the core runs.
unsafe fn core<'a>(context: *mut c_void) -> &'a CoreContext {
    // SAFETY: the caller's contract.
    unsafe { &*(context as *const CoreContext) }
}

unsafe extern "C" fn op_translate(context: *mut c_void, device_addr: u64, len: u64) -> *mut c_void {
    // SAFETY: the context run_core installed.
    let core = unsafe { core(context) };
    let (Ok(address), Ok(len)) = (usize::try_from(device_addr), usize::try_from(len)) else {
        return std::ptr::null_mut();
    };
    // Read before the space: a change after this read moves the generation, so what is remembered below under it
    // is looked up again next time.
    let generation = crate::space::space_generation();
    // The refusal first: one compare answers a doorbell register, which no remembered object holds.
    if core.refused.get() == (address, len, generation) {
        return std::ptr::null_mut();
    }
    if let Some(host) = core.remembered(address, len, generation) {
        return host;
    }
    let refuse = || {
        core.refused.set((address, len, generation));
        std::ptr::null_mut()
    };
    let guard = space();
    let Some(space) = guard.as_ref() else { return std::ptr::null_mut() };
    if !space.contains(address) {
        return refuse();
    }
    match space.translate(address, len, false).as_deref() {
        // One segment: the model accesses it as one Host range. It stays mapped while the launch runs: memory a
        // running kernel uses must not be freed (on the NPU that is undefined behaviour too).
        Ok([one]) => {
            if let Some((start, length, host)) = space.window_of(address) {
                core.remember((start, length, host as usize), generation);
            }
            one.ptr.cast()
        }
        _ => refuse(),
    }
}

unsafe extern "C" fn op_register_write(context: *mut c_void, device_addr: u64, data: *const c_void, len: u32) -> i32 {
    if data.is_null() {
        return REG_NOT_REGISTER;
    }
    // SAFETY: the context run_core installed.
    let core = unsafe { core(context) };
    // SAFETY: the model passes `len` readable bytes of its unified buffer.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len as usize) };
    let origin = crate::provenance::block_writer(core.block);
    match crate::sdma::register_write_through(&core.registers, device_addr, bytes, origin) {
        Ok(()) => REG_ACCEPTED,
        Err(crate::sdma::RegisterFault::Refused { .. } | crate::sdma::RegisterFault::QpRefused { .. }) => REG_REFUSED,
        Err(crate::sdma::RegisterFault::NotARegister { .. }) => REG_NOT_REGISTER,
    }
}

unsafe extern "C" fn op_system_counter(_context: *mut c_void) -> u64 {
    monotonic_ns() / (1_000_000_000 / SYSTEM_COUNTER_HZ)
}

/// Devices whose cores park at their next idle hint ([`crate::control::hold_cores`]), and the blocks parked now.
static HELD_CORES: LazyLock<Mutex<HashMap<i32, Vec<u32>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// Whether any device's cores are held (the idle hint skips the map otherwise).
static ANY_HELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The longest a held core stays parked.
const HOLD_LIMIT: Duration = Duration::from_secs(10);

/// Holds (`true`) or releases the polling cores of `device`.
pub(crate) fn hold_cores(device: i32, held: bool) {
    let mut holds = lock(&HELD_CORES);
    if held {
        holds.entry(device).or_default();
    } else {
        holds.remove(&device);
    }
    ANY_HELD.store(!holds.is_empty(), Ordering::Release);
}

/// The blocks of `device` parked by [`hold_cores`] now.
pub(crate) fn parked_cores(device: i32) -> Vec<u32> {
    lock(&HELD_CORES).get(&device).cloned().unwrap_or_default()
}

/// Parks a polling core while its device is held (at most [`HOLD_LIMIT`]): it reads no memory meanwhile.
fn park_if_held(core: &CoreContext) {
    if !ANY_HELD.load(Ordering::Acquire) {
        return;
    }
    let started = Instant::now();
    let mut parked = false;
    loop {
        {
            let mut holds = lock(&HELD_CORES);
            let Some(blocks) = holds.get_mut(&core.device) else { return };
            if started.elapsed() > HOLD_LIMIT {
                blocks.retain(|&block| block != core.block);
                return;
            }
            if !parked {
                blocks.push(core.block);
                parked = true;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

unsafe extern "C" fn op_idle_hint(context: *mut c_void, unchanged_fills: u32) {
    // SAFETY: the context run_core installed.
    let core = unsafe { core(context) };
    park_if_held(core);
    let now = monotonic_ns();
    // The model calls from its poll threshold (16 unchanged fills) on; the first call starts the poll.
    if unchanged_fills <= 16 || core.poll_since.get() == 0 {
        core.poll_since.set(now);
    }
    // Occupancy: one run of hints (their count rising by one per unchanged refill) is one poll interval, from its
    // first hint to the end of its last; a count that did not rise starts a new run (crate::occupancy).
    if unchanged_fills <= core.poll_fills.get() || core.poll_fills.get() == 0 {
        core.clock.poll_started();
    } else {
        core.clock.add_polling(now.saturating_sub(core.polled_until.get()));
    }
    core.poll_fills.set(unchanged_fills);
    core.polled_until.set(now);
    let polled = now.saturating_sub(core.poll_since.get());
    if unchanged_fills < 64 {
        std::hint::spin_loop();
        return;
    } else if polled < POLL_WINDOW.as_nanos() as u64 {
        core.clock.hint_waits(now);
        std::thread::yield_now();
    } else {
        let nap = core_nap(polled);
        // Progress since the last hint (so possibly after the poll that just failed): poll again instead.
        let now_seen = core.activity.progress();
        if now_seen != core.activity_seen.get() {
            core.activity_seen.set(now_seen);
            return;
        }
        core.clock.hint_waits(now);
        core.activity_seen.set(core.activity.nap(now_seen, nap));
    }
    // After a yield or a nap: the time it took is polling too (a snapshot meanwhile counted it up to its own now).
    let after = monotonic_ns();
    core.clock.hint_waited(now, after);
    core.polled_until.set(after);
}

unsafe extern "C" fn op_fault(context: *mut c_void, kind: u32, device_addr: u64, len: u64) {
    // SAFETY: the context run_core installed.
    let core = unsafe { core(context) };
    let fault = KernelFault { device: core.device, block: core.block, kind, address: device_addr, length: len };
    eprintln!("cann-twin: {fault}");
    let mut faults = lock(&FAULTS);
    if faults.len() >= FAULTS_KEPT {
        faults.remove(0);
    }
    faults.push(fault);
}

/// The model wrote `[device_addr, device_addr + len)` of HBM (a UB -> GM burst landing, a cache line written
/// back): the SQ slots it covers are marked as this core's block's.
unsafe extern "C" fn op_gm_written(context: *mut c_void, device_addr: u64, len: u64) {
    // SAFETY: the context run_core installed.
    let core = unsafe { core(context) };
    crate::provenance::wrote(crate::provenance::block_writer(core.block), device_addr, len);
}

/// The model read `len` bytes of HBM at `device_addr` into `data` (a line fill, a GM -> UB burst): a landed flag
/// it returned is observed by this core.
unsafe extern "C" fn op_gm_read(context: *mut c_void, device_addr: u64, data: *const c_void, len: u64) {
    if data.is_null() {
        return;
    }
    // SAFETY: the context run_core installed.
    let core = unsafe { core(context) };
    // SAFETY: the model passes `len` readable bytes it just read.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len as usize) };
    crate::provenance::core_read(core.device, device_addr, bytes);
}

pub(super) static OPS: CoreOps = CoreOps {
    abi_version: ABI_VERSION,
    translate: Some(op_translate),
    register_write: Some(op_register_write),
    system_counter: Some(op_system_counter),
    idle_hint: Some(op_idle_hint),
    fault: Some(op_fault),
    gm_written: Some(op_gm_written),
    gm_read: Some(op_gm_read),
    records_on: crate::provenance::RECORDING_BYTE,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls the idle hint as the model does while a core polls: counts 16, 17, ... for `duration`.
    fn poll_for(context: &CoreContext, duration: Duration) -> u32 {
        let started = Instant::now();
        let mut fills = 16;
        while started.elapsed() < duration {
            // SAFETY: `context` is a live CoreContext, used by this thread only.
            unsafe { op_idle_hint(context as *const CoreContext as *mut c_void, fills) };
            fills += 1;
        }
        fills
    }

    fn block_of(device: i32, block: u32) -> crate::occupancy::CoreOccupancy {
        let snapshot = crate::control::occupancy(device);
        snapshot.cores.iter().find(|core| core.block == block).copied().expect("the block is reported")
    }

    /// Runs of idle hints are polling, from each run's first hint to the end of its last; the time between runs
    /// (the core working) is executing.
    #[test]
    fn runs_of_idle_hints_are_polling_and_the_rest_of_the_block_is_executing() {
        let device = 8_101;
        let context = CoreContext::new(device, 2);
        let fills = poll_for(&context, Duration::from_millis(20));
        assert!(fills > 64, "the poll reached the yield and nap branches ({fills} hints)");
        // Work: no hints for 10 ms.
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(10) {
            std::hint::black_box(started.elapsed());
        }
        let live = block_of(device, 2);
        // A second run starts at 16 again.
        poll_for(&context, Duration::from_millis(5));
        crate::occupancy::core_left(device, &context.clock);
        let done = block_of(device, 2);
        assert_eq!((live.running, live.polls, done.running, done.polls, done.runs), (1, 1, 0, 2, 1), "{done:?}");
        // The first run alone is ~20 ms of polling; the 10 ms of work between the runs is executing.
        assert!(live.polling_ns >= 15_000_000 && live.polling_ns <= 40_000_000, "{live:?}");
        assert!(live.executing_ns >= 9_000_000, "{live:?}");
        assert!(done.polling_ns >= live.polling_ns + 4_000_000, "{live:?} then {done:?}");
        assert!(done.executing_ns >= live.executing_ns && done.executing_ns < done.polling_ns, "{done:?}");
    }

    /// A core idle for the few ms between a busy Host's batches naps the shortest nap, so it takes the next batch
    /// within about 50 µs; one idle for longer naps up to the longest.
    #[test]
    fn naps_stay_short_through_a_gap_between_batches_and_reach_the_longest_after_32_ms() {
        let ms = |n: u64| n * 1_000_000;
        assert_eq!(core_nap(ms(0)), MIN_NAP);
        assert_eq!(core_nap(ms(5)), MIN_NAP, "a 5 ms gap between batches");
        assert_eq!(core_nap(ms(6)), MIN_NAP);
        assert_eq!(core_nap(ms(16)), Duration::from_nanos(ms(16) / NAP_RAMP));
        assert!(core_nap(ms(16)) > MIN_NAP && core_nap(ms(16)) < MAX_NAP);
        assert_eq!(core_nap(ms(32)), MAX_NAP);
        assert_eq!(core_nap(ms(10_000)), MAX_NAP, "a long-idle core wakes no more often than before");
    }

    /// A single hint, or hints whose count does not rise, add no polling: each starts a new interval.
    #[test]
    fn a_count_that_does_not_rise_starts_a_new_poll_interval() {
        let device = 8_102;
        let context = CoreContext::new(device, 0);
        for _ in 0..3 {
            // SAFETY: as in poll_for.
            unsafe { op_idle_hint(&context as *const CoreContext as *mut c_void, 16) };
            std::thread::sleep(Duration::from_millis(2));
        }
        crate::occupancy::core_left(device, &context.clock);
        let done = block_of(device, 0);
        assert_eq!(done.polls, 3, "{done:?}");
        assert!(done.polling_ns < 1_000_000 && done.executing_ns >= 6_000_000, "{done:?}");
    }
}
