//! Kernel binaries and launches: `aclrtBinaryLoadFromData`, `aclrtBinaryGetFunction`, `aclrtLaunchKernel`,
//! `aclrtLaunchKernelWithHostArgs`, `aclrtBinaryUnLoad`, and the emulated AI Vector cores that run a launch.
//!
//! # The twin's kernel binary
//!
//! On an NPU the object is device code. The twin runs the same kernel source compiled for the host against the CPU
//! model of AscendC, so its "binary" is a shared object for this host (ELF, `ET_DYN`, this machine's `e_machine`)
//! that also contains the model and the launch shim `aiv_twin_run_block` (`kernels/cpu/twin_launch.cpp`). Anything
//! else, an NPU object included, is refused with `ACL_ERROR_INVALID_PARAM` (*guess*: the vendor's code for a binary
//! of the wrong kind is not public). The bytes are written to a sealed memfd and loaded from it with
//! `dlopen(RTLD_NOW | RTLD_LOCAL)`; kernel names are looked up with `dlsym` (unknown: `ACL_ERROR_RT_SYMBOL_NOT_FOUND`,
//! a *guess* from the header's name for it).
//!
//! # Launches
//!
//! A launch is a task of its stream: it starts when the tasks before it have run and ends when every block has
//! returned; the stream's synchronisation reports it. Blocks run on at most [`AIV_CORES`] emulated cores at a time
//! (one Host thread each), in waves when `numBlocks` is larger, as blocks beyond the core count wait on an NPU.
//! Kernel parameters are 64-bit words (GM addresses): 1 to 4 of them, taken from the Host arguments at launch time
//! (`aclrtLaunchKernelWithHostArgs`) or read from device memory when the launch starts (`aclrtLaunchKernel`).
//! Placeholders and engine types other than AIV are `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`.
//!
//! What a core may reach: device memory through the address space's translation (allocations, mappings and
//! Host-registered windows; never a raw Host address), and the SDMA doorbell registers through
//! [`crate::sdma::register_write`]. Its system counter runs at [`SYSTEM_COUNTER_HZ`].
//!
//! A core fault (an access outside device memory, a broken AscendC rule: see docs/ascendc-cpu.md) stops that core
//! and aborts the launch: every other core of it stops at its next access, and the stream's synchronisation reports
//! `ACL_ERROR_RT_VECTOR_CORE_EXCEPTION` (507035, *header*; that an AIV exception ends the whole kernel is the
//! documented behaviour of AscendC kernels, the code for the twin's model faults is a *guess*). The faults are kept
//! for tests ([`crate::control::kernel_faults`]). [`abort_device`] (device reset) aborts running launches the same
//! way, with `ACL_ERROR_RT_DEVICE_TASK_ABORT`.

use core::ffi::{c_char, c_void, CStr};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;

use crate::runtime::space;

/// AI Vector cores per device (Atlas A2/A3: 48, `ACLSHMEM_MAX_AIV_PER_NPU`, as `crate::sdma::MAX_CHANNELS`).
pub const AIV_CORES: u32 = 48;
/// Largest `numBlocks` accepted (the header's limit for a launch, 65535).
pub const MAX_BLOCKS: u32 = 65_535;
/// The rate of the cores' system counter (`GetSystemCycle`): 50 MHz, as AscendC documents for Atlas A2/A3
/// (docs/hardware.md section 8).
pub const SYSTEM_COUNTER_HZ: u64 = 50_000_000;
/// Prefix of the names of the emulated cores' threads.
pub const CORE_THREAD_PREFIX: &str = "cann-twin-aiv";
/// How long a core that polls unchanged memory keeps spinning and yielding before it naps (device-side CPU only).
pub const POLL_WINDOW: Duration = Duration::from_micros(200);
/// The longest nap of a polling core: the latency a Host publish can see when the kernel was idle (the NPU kernel
/// never naps; the twin does so that idle cores do not hold the machine's CPUs, with no signal from the Host).
pub const MAX_NAP: Duration = Duration::from_micros(250);
/// The shortest nap of a polling core.
pub const MIN_NAP: Duration = Duration::from_micros(50);
/// A polling core naps 1/NAP_RAMP of the time it has polled, from [`MIN_NAP`] to [`MAX_NAP`]: naps reach
/// [`MAX_NAP`] after 32 ms, so a core idle between the batches of a busy Host (a few ms) still naps [`MIN_NAP`] and
/// takes the next batch within about that (at a sixteenth, the ramp until this change, a 4 ms gap meant 250 µs naps:
/// the paired 64 KiB and 256 KiB aiv/memcpy ratios gained about 0.05-0.09 from the slower ramp, docs/RESULTS.md), while
/// a core idle for longer still wakes only every [`MAX_NAP`].
pub const NAP_RAMP: u64 = 128;

/// How long a device reset waits for the cores of an aborted launch to stop.
pub const ABORT_WAIT: Duration = Duration::from_secs(2);

/// `AIV_CPU_ABI_VERSION` of `kernels/cpu/aiv_cpu_core.h`.
const ABI_VERSION: u32 = 3;
const REG_ACCEPTED: i32 = 0;
const REG_REFUSED: i32 = 1;
const REG_NOT_REGISTER: i32 = 2;
/// What `aiv_twin_run_block` returns.
const BLOCK_RETURNED: i32 = 0;
const BLOCK_TRAPPED: i32 = 1;

/// `AivCpuCoreOps`, field for field.
#[repr(C)]
struct CoreOps {
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

/// `aiv_twin_run_block` of the loaded object.
type RunBlock = unsafe extern "C" fn(
    ops: *const CoreOps,
    context: *mut c_void,
    block_idx: u32,
    block_num: u32,
    abort: *const AtomicU32,
    entry: *mut c_void,
    args: *const u64,
    nargs: u32,
    dirty: *mut u32,
) -> i32;

/// A fault an emulated core raised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFault {
    pub device: i32,
    pub block: u32,
    /// `AIV_CPU_FAULT_*` of `kernels/cpu/aiv_cpu_core.h`.
    pub kind: u32,
    pub address: u64,
    pub length: u64,
}

impl KernelFault {
    /// What the kind means.
    pub fn describe(&self) -> &'static str {
        match self.kind {
            1 => "an access outside device memory",
            2 => "an intrinsic argument out of range",
            3 => "a misaligned operand",
            4 => "a unified-buffer access out of range",
            5 => "an unsupported mode",
            6 => "unordered pipes (a missing SetFlag/WaitFlag or barrier)",
            _ => "an unknown fault",
        }
    }
}

impl std::fmt::Display for KernelFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device {} block {}: AIV core fault {} ({}) at {:#x}, {} bytes",
            self.device,
            self.block,
            self.kind,
            self.describe(),
            self.address,
            self.length
        )
    }
}

/// A loaded object.
struct Binary {
    library: usize,
    run_block: RunBlock,
    /// The memfd the object was loaded from (kept open while loaded).
    _file: OwnedFd,
}

/// A kernel function of a loaded object.
#[derive(Clone)]
struct Function {
    binary: usize,
    entry: usize,
    run_block: RunBlock,
}

#[derive(Default)]
struct Tables {
    binaries: HashMap<usize, Binary>,
    functions: HashMap<usize, Function>,
    next: usize,
}

static TABLES: LazyLock<Mutex<Tables>> =
    LazyLock::new(|| Mutex::new(Tables { next: 0x6b00_0000, ..Tables::default() }));
/// Launches running now, by device, so a device reset can abort them.
static RUNNING: LazyLock<Mutex<Vec<Running>>> = LazyLock::new(|| Mutex::new(Vec::new()));
/// A running launch: its device and its abort flag.
type Running = (i32, Arc<AtomicU32>);
/// Every fault of every launch, for tests (bounded: the oldest are dropped past [`FAULTS_KEPT`]).
static FAULTS: LazyLock<Mutex<Vec<KernelFault>>> = LazyLock::new(|| Mutex::new(Vec::new()));
const FAULTS_KEPT: usize = 1024;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `e_machine` of this host.
const HOST_MACHINE: u16 = if cfg!(target_arch = "x86_64") {
    62
} else if cfg!(target_arch = "aarch64") {
    183
} else {
    0
};

/// Whether `data` is a 64-bit little-endian shared object for this host.
fn is_host_shared_object(data: &[u8]) -> bool {
    data.len() >= 64
        && data[..4] == *b"\x7fELF"
        && data[4] == 2
        && data[5] == 1
        && u16::from_le_bytes([data[16], data[17]]) == 3
        && u16::from_le_bytes([data[18], data[19]]) == HOST_MACHINE
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call on this thread.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        "unknown dynamic-loader error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned()
    }
}

/// Loads `data` as the twin's kernel binary; returns its handle.
pub(crate) fn load(data: &[u8]) -> Result<usize, aclError> {
    if !is_host_shared_object(data) {
        eprintln!(
            "cann-twin: aclrtBinaryLoadFromData: the {} bytes are not a shared object for this host (the twin runs \
             kernels built for the CPU model, not NPU objects)",
            data.len()
        );
        return Err(ACL_ERROR_INVALID_PARAM);
    }
    // SAFETY: a fresh anonymous file; the name is a NUL-terminated literal.
    let fd = unsafe { libc::memfd_create(c"cann-twin-kernel".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL);
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut written = 0;
    while written < data.len() {
        // SAFETY: `data[written..]` is a live buffer of the length passed.
        let n = unsafe { libc::write(file.as_raw_fd(), data[written..].as_ptr().cast(), data.len() - written) };
        if n <= 0 {
            return Err(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL);
        }
        written += n as usize;
    }
    // SAFETY: seals an fd we own; failure only means the file stays writable.
    unsafe {
        libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)
    };
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|_| ACL_ERROR_RT_INTERNAL_ERROR)?;
    // SAFETY: loads the object; its initialisers are the kernel object's (C++ static initialisation of the model).
    let library = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if library.is_null() {
        eprintln!("cann-twin: aclrtBinaryLoadFromData: cannot load the object: {}", dl_error());
        return Err(ACL_ERROR_INVALID_PARAM);
    }
    // SAFETY: `library` is a live handle; the name is NUL-terminated.
    let run_block = unsafe { libc::dlsym(library, c"aiv_twin_run_block".as_ptr()) };
    if run_block.is_null() {
        eprintln!("cann-twin: aclrtBinaryLoadFromData: the object has no aiv_twin_run_block (not built for the twin)");
        // SAFETY: loaded above, nothing of it is in use.
        unsafe { libc::dlclose(library) };
        return Err(ACL_ERROR_INVALID_PARAM);
    }
    // SAFETY: `aiv_twin_run_block` is defined by kernels/cpu/twin_launch.cpp with exactly `RunBlock`'s prototype.
    let run_block = unsafe { std::mem::transmute::<*mut c_void, RunBlock>(run_block) };
    let mut tables = lock(&TABLES);
    tables.next += 1;
    let handle = tables.next;
    tables.binaries.insert(handle, Binary { library: library as usize, run_block, _file: file });
    Ok(handle)
}

/// The kernel called `name` in binary `binary`; returns its function handle.
pub(crate) fn get_function(binary: usize, name: &CStr) -> Result<usize, aclError> {
    let mut tables = lock(&TABLES);
    let loaded = tables.binaries.get(&binary).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
    // SAFETY: the library is loaded while it is in the table (the lock is held); `name` is NUL-terminated.
    let entry = unsafe { libc::dlsym(loaded.library as *mut c_void, name.as_ptr()) };
    if entry.is_null() {
        return Err(ACL_ERROR_RT_SYMBOL_NOT_FOUND);
    }
    let function = Function { binary, entry: entry as usize, run_block: loaded.run_block };
    tables.next += 1;
    let handle = tables.next;
    tables.functions.insert(handle, function);
    Ok(handle)
}

/// Unloads a binary; its functions become invalid. Refused while one of its launches runs.
pub(crate) fn unload(binary: usize) -> Result<(), aclError> {
    let mut tables = lock(&TABLES);
    if !tables.binaries.contains_key(&binary) {
        return Err(ACL_ERROR_RT_INVALID_HANDLE);
    }
    if LAUNCHED.with_binary(binary) > 0 {
        return Err(ACL_ERROR_RT_KERNEL_UNREGISTERING);
    }
    tables.functions.retain(|_, function| function.binary != binary);
    if let Some(loaded) = tables.binaries.remove(&binary) {
        // SAFETY: no launch of the binary is queued or running (checked above, under the tables' lock, which
        // launches take to find their function).
        unsafe { libc::dlclose(loaded.library as *mut c_void) };
    }
    Ok(())
}

/// Launches queued or running, by binary.
struct Launched(Mutex<HashMap<usize, usize>>);

impl Launched {
    fn with_binary(&self, binary: usize) -> usize {
        lock(&self.0).get(&binary).copied().unwrap_or(0)
    }
    fn add(&self, binary: usize) {
        *lock(&self.0).entry(binary).or_default() += 1;
    }
    fn remove(&self, binary: usize) {
        if let Some(count) = lock(&self.0).get_mut(&binary) {
            *count = count.saturating_sub(1);
        }
    }
}

static LAUNCHED: LazyLock<Launched> = LazyLock::new(|| Launched(Mutex::new(HashMap::new())));

/// Where a launch takes its parameters from.
#[derive(Debug)]
pub(crate) enum Args {
    /// Copied from the Host at launch time.
    Host(Vec<u64>),
    /// `count` words at a device address, read when the launch starts.
    Device { address: usize, count: usize },
}

/// A launch, as its stream runs it.
pub(crate) struct Launch {
    function: Function,
    blocks: u32,
    args: Args,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch").field("blocks", &self.blocks).field("args", &self.args).finish_non_exhaustive()
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        LAUNCHED.remove(self.function.binary);
    }
}

/// Checks a launch and prepares it for its stream.
pub(crate) fn prepare(
    function: usize,
    blocks: u32,
    cfg: *const aclrtLaunchKernelCfg,
    args: Args,
) -> Result<Launch, aclError> {
    if blocks == 0 || blocks > MAX_BLOCKS {
        return Err(ACL_ERROR_INVALID_PARAM);
    }
    let words = match &args {
        Args::Host(words) => words.len(),
        Args::Device { count, .. } => *count,
    };
    if !(1..=4).contains(&words) {
        return Err(ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    }
    if !cfg.is_null() {
        // SAFETY: non-null; the C contract makes it a readable config whose `attrs` holds `numAttrs` entries.
        let cfg = unsafe { &*cfg };
        if cfg.numAttrs > 0 && cfg.attrs.is_null() {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        for index in 0..cfg.numAttrs {
            // SAFETY: within the `numAttrs` entries the caller promised.
            let attr = unsafe { &*cfg.attrs.add(index) };
            if attr.id == ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE {
                // SAFETY: the union member named by `id` is the one the caller set.
                let engine = unsafe { attr.value.engineType };
                if engine != ACL_RT_ENGINE_TYPE_AIV {
                    // The twin models AI Vector cores only.
                    return Err(ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
                }
            }
        }
    }
    let function = lock(&TABLES).functions.get(&function).cloned().ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
    LAUNCHED.add(function.binary);
    Ok(Launch { function, blocks, args })
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
    fn nap(&self, seen: u64, nap: Duration) -> u64 {
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

/// The nap of a core that has polled unchanged memory for `polled_ns` (past its [`POLL_WINDOW`]): [`NAP_RAMP`].
fn core_nap(polled_ns: u64) -> Duration {
    Duration::from_nanos(polled_ns / NAP_RAMP).clamp(MIN_NAP, MAX_NAP)
}

/// What one core works with.
struct CoreContext {
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
    clock: Arc<crate::occupancy::CoreClock>,
    poll_fills: std::cell::Cell<u32>,
    polled_until: std::cell::Cell<u64>,
}

/// Device objects an emulated core remembers.
const WINDOWS_REMEMBERED: usize = 8;

impl CoreContext {
    fn new(device: i32, block: u32) -> CoreContext {
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
    let generation = crate::runtime::space_generation();
    if let Some(host) = core.remembered(address, len, generation) {
        return host;
    }
    if core.refused.get() == (address, len, generation) {
        return std::ptr::null_mut();
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
    let origin = crate::sdma::provenance::block_writer(core.block);
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
        let now_seen = core.activity.seq.load(Ordering::SeqCst);
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
    crate::sdma::provenance::wrote(crate::sdma::provenance::block_writer(core.block), device_addr, len);
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
    crate::sdma::provenance::core_read(core.device, device_addr, bytes);
}

static OPS: CoreOps = CoreOps {
    abi_version: ABI_VERSION,
    translate: Some(op_translate),
    register_write: Some(op_register_write),
    system_counter: Some(op_system_counter),
    idle_hint: Some(op_idle_hint),
    fault: Some(op_fault),
    gm_written: Some(op_gm_written),
    gm_read: Some(op_gm_read),
    records_on: crate::sdma::provenance::RECORDING_BYTE,
};

/// What a launch's cores share.
struct Run {
    device: i32,
    function: Function,
    blocks: u32,
    args: Vec<u64>,
    next_block: AtomicU32,
    abort: Arc<AtomicU32>,
    trapped: AtomicU32,
    refused: AtomicU32,
    dirty: AtomicUsize,
}

/// `abort` values.
const ABORT_FAULT: u32 = 1;
const ABORT_RESET: u32 = 2;

fn run_core(run: &Run) {
    loop {
        let block = run.next_block.fetch_add(1, Ordering::AcqRel);
        if block >= run.blocks || run.abort.load(Ordering::Acquire) != 0 {
            return;
        }
        let context = CoreContext::new(run.device, block);
        let mut dirty = 0u32;
        // SAFETY: `run_block` and `entry` come from a binary that stays loaded while this launch exists (unload is
        // refused meanwhile); OPS and `context` outlive the call; `args` holds `args.len()` words (1 to 4, checked).
        let outcome = unsafe {
            (run.function.run_block)(
                &OPS,
                &context as *const CoreContext as *mut c_void,
                block,
                run.blocks,
                Arc::as_ptr(&run.abort),
                run.function.entry as *mut c_void,
                run.args.as_ptr(),
                run.args.len() as u32,
                &mut dirty,
            )
        };
        crate::occupancy::core_left(run.device, &context.clock);
        run.dirty.fetch_add(dirty as usize, Ordering::Relaxed);
        match outcome {
            BLOCK_RETURNED => {}
            BLOCK_TRAPPED => {
                run.trapped.fetch_add(1, Ordering::Relaxed);
                // The first fault ends the launch (a reset may have set the flag already).
                let _ = run.abort.compare_exchange(0, ABORT_FAULT, Ordering::AcqRel, Ordering::Acquire);
            }
            _ => {
                run.refused.fetch_add(1, Ordering::Relaxed);
                let _ = run.abort.compare_exchange(0, ABORT_FAULT, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }
}

/// Reads `count` words of device memory at `address` (the launch's parameters).
fn read_device_words(address: usize, count: usize) -> Result<Vec<u64>, aclError> {
    let guard = space();
    let space = guard.as_ref().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
    if !space.contains(address) {
        return Err(ACL_ERROR_RT_INVALID_MEMORY_TYPE);
    }
    let segments = space.translate(address, count * 8, false)?;
    let mut bytes = vec![0u8; count * 8];
    let host = [crate::memory::Segment { ptr: bytes.as_mut_ptr(), len: bytes.len() }];
    // SAFETY: the segments were translated under the read lock still held; `bytes` is live and of the same length.
    unsafe { crate::runtime::perform_copy(&host, &segments) };
    Ok(bytes.chunks_exact(8).map(|word| u64::from_le_bytes(word.try_into().unwrap_or([0; 8]))).collect())
}

/// Runs a launch to its end on `device` (the stream's task).
pub(crate) fn run(device: i32, launch: &Launch) -> aclError {
    let args = match &launch.args {
        Args::Host(words) => words.clone(),
        Args::Device { address, count } => match read_device_words(*address, *count) {
            Ok(words) => words,
            Err(code) => return code,
        },
    };
    let abort = Arc::new(AtomicU32::new(0));
    lock(&RUNNING).push((device, abort.clone()));
    let run = Arc::new(Run {
        device,
        function: launch.function.clone(),
        blocks: launch.blocks,
        args,
        next_block: AtomicU32::new(0),
        abort: abort.clone(),
        trapped: AtomicU32::new(0),
        refused: AtomicU32::new(0),
        dirty: AtomicUsize::new(0),
    });
    let cores = launch.blocks.min(AIV_CORES);
    let mut threads = Vec::new();
    for core in 0..cores {
        let run = run.clone();
        match std::thread::Builder::new()
            .name(format!("{CORE_THREAD_PREFIX}-d{device}.{core}"))
            .spawn(move || run_core(&run))
        {
            Ok(thread) => threads.push(thread),
            Err(_) => {
                abort.store(ABORT_FAULT, Ordering::Release);
                break;
            }
        }
    }
    let started = threads.len();
    for thread in threads {
        let _ = thread.join();
    }
    lock(&RUNNING).retain(|(_, flag)| !Arc::ptr_eq(flag, &abort));
    let dirty = run.dirty.load(Ordering::Relaxed);
    if dirty > 0 {
        eprintln!(
            "cann-twin: device {device}: a kernel returned with {dirty} dirty cache lines never cleaned to memory"
        );
    }
    if started == 0 {
        return ACL_ERROR_RT_RESOURCE_ALLOC_FAIL;
    }
    match abort.load(Ordering::Acquire) {
        0 => ACL_SUCCESS,
        ABORT_RESET => ACL_ERROR_RT_DEVICE_TASK_ABORT,
        _ => ACL_ERROR_RT_VECTOR_CORE_EXCEPTION,
    }
}

/// Aborts the launches running on `device` (its reset): their cores stop at their next access.
pub(crate) fn abort_device(device: i32) {
    for (_, flag) in lock(&RUNNING).iter().filter(|(running, _)| *running == device) {
        let _ = flag.compare_exchange(0, ABORT_RESET, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Whether a launch is running on `device`.
pub(crate) fn running_on(device: i32) -> bool {
    lock(&RUNNING).iter().any(|(running, _)| *running == device)
}

/// Every recorded fault, oldest first (the last [`FAULTS_KEPT`]).
pub(crate) fn faults() -> Vec<KernelFault> {
    lock(&FAULTS).clone()
}

/// The name a C caller passed, checked.
///
/// # Safety
/// `name` is null or NUL-terminated.
pub(crate) unsafe fn kernel_name<'a>(name: *const c_char) -> Result<&'a CStr, aclError> {
    if name.is_null() {
        return Err(ACL_ERROR_INVALID_PARAM);
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    Ok(unsafe { CStr::from_ptr(name) })
}

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
