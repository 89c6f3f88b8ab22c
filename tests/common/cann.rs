//! Helpers of the `cann` tests (included with `#[path]` by `tests/cann_backend.rs`, `tests/cann_baselines.rs` and
//! `tests/cann_hixl_missing.rs`): the fake CANN libraries built once per test process and found by the real loaders
//! through `AIV_ASCENDCL_LIB`, `AIV_SHMEM_LIB` and `AIV_HIXL_LIB` (each binary says with `crate::WITH_FAKE_HIXL`
//! whether it has the HiXL fake, as the library tables are loaded once per process), their controls and call logs,
//! and for the baselines engines on fake devices and batch runs.
#![allow(dead_code)]

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use aiv_transport::config::{AivOptions, DeviceBackendKind, LaunchMode};
use aiv_transport::device::cann::CannDevice;
use aiv_transport::device::{DeviceBuffer, DeviceMemory};
use aiv_transport::engine::AivDevice;
use aiv_transport::{EngineConfig, Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState};
use ascendcl_sys::abi::compile_shared_library;

pub const BLOCKS: u32 = 2;
pub const SQ_DEPTH: u32 = 64;
pub const HBM: u64 = 4 << 20;
pub const BUFFER: u64 = 1 << 20;
pub const BASELINE_TIMEOUT: Duration = Duration::from_millis(300);
pub const KERNEL_OBJECT: &[u8] = b"not a real kernel object";

/// The fake libraries, loaded by the backend through the override variables and here for their controls.
pub struct Fakes {
    pub acl: libloading::Library,
    pub shmem: libloading::Library,
    pub hixl: Option<libloading::Library>,
    /// The SDMA workspace the fake SHMEM publishes in `g_state` when initialised with the SDMA engine, which is how
    /// the backend finds it (tests that change what is published set it back).
    pub workspace: u64,
}

/// Where this process builds the fakes: `cann-fakes-<pid>` under the target's scratch directory. The libraries stay
/// loaded (and `aiv doctor` reopens them by path) for the whole run, and a static is never dropped, so the directory
/// cannot be removed at the end; instead each run first removes the directories of earlier runs whose process is
/// gone, and at most the live runs' directories remain.
pub fn fake_directory() -> PathBuf {
    static DIRECTORY: OnceLock<PathBuf> = OnceLock::new();
    DIRECTORY
        .get_or_init(|| {
            let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
            if let Ok(entries) = std::fs::read_dir(scratch) {
                for entry in entries.flatten() {
                    let name = entry.file_name();
                    let pid = name
                        .to_str()
                        .and_then(|name| name.strip_prefix("cann-fakes-"))
                        .and_then(|pid| pid.parse().ok());
                    if let Some(pid) = pid.filter(|pid: &u32| !Path::new(&format!("/proc/{pid}")).exists()) {
                        let _ = std::fs::remove_dir_all(scratch.join(format!("cann-fakes-{pid}")));
                    }
                }
            }
            let dir = scratch.join(format!("cann-fakes-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("fake directory");
            dir
        })
        .clone()
}

/// Compiles the fake at `source` (relative to the repository root) into `name` in [`fake_directory`].
pub fn build(source: &str, name: &str, defines: &[&str]) -> PathBuf {
    let path = fake_directory().join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(source);
    if let Err(failure) = compile_shared_library(&source, &path, defines) {
        panic!("{failure}");
    }
    path
}

/// Builds the fakes once and points the backend's loaders at them (each binary says with `crate::WITH_FAKE_HIXL`
/// whether it has the HiXL fake: the library tables are loaded once per process).
pub fn fakes() -> &'static Fakes {
    static FAKES: OnceLock<Fakes> = OnceLock::new();
    FAKES.get_or_init(|| {
        let acl = build("shmem-bindings/ascendcl-sys/tests/fake/fake_acl.c", "libascendcl.so", &["FAKE_BACKEND"]);
        let shmem = build("shmem-bindings/cann-shmem-sys/tests/fake/fake_shmem.c", "libshmem.so", &[]);
        // Set once, before the backend's first `api()` call.
        std::env::set_var("AIV_ASCENDCL_LIB", &acl);
        std::env::set_var("AIV_SHMEM_LIB", &shmem);
        // SAFETY: the fakes' initialisers do nothing; loading the same paths again shares the loader's copy.
        let (acl, shmem) = unsafe { (libloading::Library::new(&acl), libloading::Library::new(&shmem)) };
        let (acl, shmem) = (acl.expect("load fake ACL"), shmem.expect("load fake SHMEM"));
        let workspace = new_workspace(&acl);
        let hixl = if crate::WITH_FAKE_HIXL {
            let path = build("shmem-bindings/ascendcl-sys/tests/fake/fake_hixl.c", "libcann_hixl.so", &[]);
            std::env::set_var("AIV_HIXL_LIB", &path);
            // SAFETY: as for the ACL fake.
            Some(unsafe { libloading::Library::new(&path) }.expect("load fake HiXL"))
        } else {
            std::env::set_var("AIV_HIXL_LIB", missing_hixl());
            None
        };
        let fakes = Fakes { acl, shmem, hixl, workspace };
        publish_workspace(&fakes, workspace);
        fakes
    })
}

/// A control function of a fake, typed by the caller.
///
/// # Safety
/// `T` must be the function pointer type of the fake's `name`.
pub unsafe fn control<T: Copy>(library: &libloading::Library, name: &str) -> T {
    let symbol = format!("{name}\0");
    // SAFETY: the caller guarantees the prototype.
    *unsafe { library.get::<T>(symbol.as_bytes()) }.unwrap_or_else(|error| panic!("{name}: {error}"))
}

/// A fresh synthetic SDMA workspace of `BLOCKS` records from the fake ACL (`fake_sdma_workspace`).
pub fn new_workspace(acl: &libloading::Library) -> u64 {
    // SAFETY: the fake's prototype is `void *fake_sdma_workspace(uint32_t, uint32_t)`; value arguments only (it
    // allocates the workspace and never frees it).
    unsafe {
        control::<unsafe extern "C" fn(u32, u32) -> *mut std::ffi::c_void>(acl, "fake_sdma_workspace")(BLOCKS, SQ_DEPTH)
            as u64
    }
}

fn publish_workspace(fakes: &Fakes, address: u64) {
    // SAFETY: the fake exports `void fake_set_sdma_workspace(uint64_t)`; a value argument only.
    unsafe { control::<unsafe extern "C" fn(u64)>(&fakes.shmem, "fake_set_sdma_workspace")(address) }
}

/// The workspace address the fake SHMEM's next initialisation (with the SDMA engine) stores in `g_state`.
pub fn set_published_workspace(address: u64) {
    publish_workspace(fakes(), address)
}

/// A fake NPU kernel object in [`fake_directory`], for devices opened with their settings from the environment
/// (`AIV_NPU_KERNEL_OBJECT`).
pub fn fake_kernel_object() -> PathBuf {
    let object = fake_directory().join("fake-kernel.o");
    std::fs::write(&object, KERNEL_OBJECT).expect("write the fake kernel object");
    object
}

/// Tests share the fakes' global state (and their unsynchronised call log): one at a time, log cleared first.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    acl_log();
    if fakes().hixl.is_some() {
        hixl_log();
    }
    guard
}

/// Where the binaries without the HiXL fake point `AIV_HIXL_LIB`: a file that does not exist.
pub fn missing_hixl() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir/libcann_hixl.so")
}

pub fn acl_log() -> Vec<String> {
    take_log(&fakes().acl)
}

pub fn shmem_log() -> Vec<String> {
    take_log(&fakes().shmem)
}

pub fn hixl_log() -> Vec<String> {
    take_log(fakes().hixl.as_ref().expect("this binary has the HiXL fake"))
}

/// The call log a fake kept since it was last taken, one call per line (`name arg=value ...`).
pub fn take_log(library: &libloading::Library) -> Vec<String> {
    // SAFETY: the fake exports `size_t fake_take_log(char *, size_t)`.
    let take = unsafe { library.get::<unsafe extern "C" fn(*mut c_char, usize) -> usize>(b"fake_take_log\0") }
        .expect("log control");
    let mut buffer = vec![0 as c_char; 1 << 16];
    // SAFETY: the buffer is live and as long as the capacity passed.
    unsafe { take(buffer.as_mut_ptr(), buffer.len()) };
    // SAFETY: the fake NUL-terminates what it copies.
    let text = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned();
    text.lines().map(str::to_owned).collect()
}

/// The function names of a log's lines.
pub fn calls(log: &[String]) -> Vec<&str> {
    log.iter().map(|line| line.split(' ').next().unwrap_or_default()).collect()
}

pub fn set_acl_result(function: &str, code: i32) {
    set_result(&fakes().acl, function, code)
}

pub fn set_hixl_result(function: &str, code: u32) {
    set_result(fakes().hixl.as_ref().expect("this binary has the HiXL fake"), function, code as i32)
}

/// Makes the fake HiXL's batches submitted from now on report `status` (1 COMPLETED, 0 WAITING forever, 3 FAILED).
pub fn set_hixl_completion(status: u32) {
    let library = fakes().hixl.as_ref().expect("this binary has the HiXL fake");
    // SAFETY: the fake exports `void fake_hixl_set_completion(uint32_t)`.
    let set = unsafe { library.get::<unsafe extern "C" fn(u32)>(b"fake_hixl_set_completion\0") }.expect("control");
    // SAFETY: value argument.
    unsafe { set(status) };
}

pub fn set_result(library: &libloading::Library, function: &str, code: i32) {
    let name = CString::new(function).expect("no NUL");
    // SAFETY: both fakes export `int fake_set_result(const char *, <32-bit code>)`.
    let set = unsafe { library.get::<unsafe extern "C" fn(*const c_char, i32) -> i32>(b"fake_set_result\0") }
        .expect("failure control");
    // SAFETY: `name` is NUL-terminated and outlives the call.
    assert_eq!(unsafe { set(name.as_ptr(), code) }, 0);
}

pub fn options(device_id: u32) -> AivOptions {
    AivOptions {
        device_backend: DeviceBackendKind::Cann,
        device_id,
        aiv_blocks: BLOCKS,
        sq_depth: SQ_DEPTH,
        hbm_size: HBM,
        // Per-batch: no kernel is launched unless an aiv transfer is submitted, so the log holds the baselines' calls.
        launch_mode: LaunchMode::PerBatch,
        baseline_timeout: BASELINE_TIMEOUT,
        transfer_timeout: Duration::from_secs(10),
        // One worker: the fake's call log is not thread-safe, and one worker makes the call order deterministic.
        ubshmem_workers: 1,
        ubshmem_streams: 4,
        ..AivOptions::default()
    }
}

/// An engine on a fake CANN device with one registered HBM buffer.
pub struct Node {
    pub engine: TransferEngine,
    pub device: Arc<AivDevice>,
    pub buffer: DeviceBuffer,
}

impl Node {
    pub fn cann(&self) -> Arc<CannDevice> {
        CannDevice::of(self.device.backend().as_ref()).expect("a cann device of this process")
    }
    pub fn write(&self, offset: u64, data: &[u8]) {
        self.cann().copy_to_device(self.buffer.addr() + offset, data).expect("H2D");
    }
    pub fn read(&self, offset: u64, length: usize) -> Vec<u8> {
        let mut out = vec![0u8; length];
        self.cann().copy_from_device(self.buffer.addr() + offset, &mut out).expect("D2H");
        out
    }
}

pub fn node(device_id: u32) -> Node {
    fakes();
    static KERNEL_OBJECT_ENV: OnceLock<()> = OnceLock::new();
    KERNEL_OBJECT_ENV.get_or_init(|| std::env::set_var("AIV_NPU_KERNEL_OBJECT", fake_kernel_object()));
    let mut config = EngineConfig::new("127.0.0.1");
    config.protocol = Protocol::Aiv;
    config.aiv = options(device_id);
    let engine = TransferEngine::new(config).expect("engine starts");
    let device = engine.device().expect("fake CANN device opens");
    let buffer = device.allocate(BUFFER).expect("HBM");
    // SAFETY: the buffer lives in the Node next to the engine; every batch is waited for before it drops.
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }
        .expect("registering device memory on cann exports it through the heap's VMM handle");
    Node { engine, device, buffer }
}

pub fn pattern(seed: u8, length: usize) -> Vec<u8> {
    (0..length).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

pub struct Outcome {
    pub states: Vec<TransferState>,
    pub reasons: Vec<Option<String>>,
    pub failures: Vec<Option<aiv_transport::transfer::TransferFailure>>,
    pub evidence: Vec<Option<aiv_transport::evidence::TransferEvidence>>,
    pub elapsed: Duration,
}

pub fn run(engine: &TransferEngine, requests: &[TransferRequest]) -> Outcome {
    let started = Instant::now();
    let batch = engine.allocate_batch(requests.len()).expect("batch");
    engine.submit_transfer(batch, requests).expect("submit");
    engine.wait_batch(batch).expect("wait");
    let elapsed = started.elapsed();
    let n = requests.len();
    let outcome = Outcome {
        states: (0..n).map(|t| engine.transfer_status(batch, t).expect("status").state).collect(),
        reasons: (0..n).map(|t| engine.task_reason(batch, t).expect("reason")).collect(),
        failures: (0..n).map(|t| engine.task_failure(batch, t).expect("failure")).collect(),
        evidence: (0..n).map(|t| engine.task_evidence(batch, t).expect("evidence")).collect(),
        elapsed,
    };
    engine.free_batch(batch).expect("free");
    outcome
}

pub fn request(
    protocol: Protocol,
    opcode: Opcode,
    source: u64,
    peer: SegmentId,
    target: u64,
    length: u64,
) -> TransferRequest {
    TransferRequest { opcode, source, target_id: peer, target_offset: target, length, protocol: Some(protocol) }
}
