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
use std::time::Duration;

use ascendcl_sys::sys::*;

use crate::space::space;

mod cores;

pub(crate) use cores::{hold_cores, parked_cores};
use cores::{CoreContext, CoreOps, OPS};
pub use cores::{MAX_NAP, MIN_NAP, NAP_RAMP, POLL_WINDOW};

/// AI Vector cores per device (Atlas A2/A3: 48, `ACLSHMEM_MAX_AIV_PER_NPU`, as `crate::sdma::MAX_CHANNELS`).
pub const AIV_CORES: u32 = 48;
/// Largest `numBlocks` accepted (the header's limit for a launch, 65535).
pub const MAX_BLOCKS: u32 = 65_535;
/// The rate of the cores' system counter (`GetSystemCycle`): 50 MHz, as AscendC documents for Atlas A2/A3
/// (docs/hardware.md section 8).
pub const SYSTEM_COUNTER_HZ: u64 = 50_000_000;
/// Prefix of the names of the emulated cores' threads.
pub const CORE_THREAD_PREFIX: &str = "cann-twin-aiv";

/// How long a device reset waits for the cores of an aborted launch to stop.
pub const ABORT_WAIT: Duration = Duration::from_secs(2);

/// What `aiv_twin_run_block` returns.
const BLOCK_RETURNED: i32 = 0;
const BLOCK_TRAPPED: i32 = 1;

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
    unsafe { crate::space::perform_copy(&host, &segments) };
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
