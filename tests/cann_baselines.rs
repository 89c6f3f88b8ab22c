//! The Host-submitted baselines on the `cann` device backend, against fake CANN libraries (feature `cann`).
//!
//! `ubshmem`: the backend's copy streams (`aclrtCreateStreamWithConfig`, `aclrtMemcpyAsync` D2D,
//! `aclrtSynchronizeStreamWithTimeout`, `aclrtDestroyStream`) over the fake ACL of
//! `shmem-bindings/ascendcl-sys/tests/fake/fake_acl.c` (built with `FAKE_BACKEND`), whose "device memory" is host
//! memory and whose VMM import really aliases the exporter's bytes, so the bytes a transfer moves can be checked.
//! The fake copies at once; a synchronisation timeout or a task exception is injected through its result overrides.
//!
//! Nothing here shows how either path behaves on an NPU: unverified on hardware.
#![cfg(feature = "cann")]

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use aiv_transport::config::{AivOptions, DeviceBackendKind, LaunchMode};
use aiv_transport::device::cann::CannDevice;
use aiv_transport::device::DeviceBuffer;
use aiv_transport::evidence::Actor;
use aiv_transport::transport::aiv::AivDevice;
use aiv_transport::{EngineConfig, Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState};
use ascendcl_sys::abi::compile_shared_library;

const BLOCKS: u32 = 2;
const SQ_DEPTH: u32 = 64;
const HBM: u64 = 4 << 20;
const BUFFER: u64 = 1 << 20;
const BASELINE_TIMEOUT: Duration = Duration::from_millis(300);
const KERNEL_OBJECT: &[u8] = b"not a real kernel object";

struct Fakes {
    acl: libloading::Library,
}

fn build(source: &str, name: &str, defines: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cann-baseline-fakes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("fake directory");
    let path = dir.join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(source);
    if let Err(failure) = compile_shared_library(&source, &path, defines) {
        panic!("{failure}");
    }
    path
}

/// Builds the fakes once and points the backend's loaders (and its bring-up settings) at them.
fn fakes() -> &'static Fakes {
    static FAKES: OnceLock<Fakes> = OnceLock::new();
    FAKES.get_or_init(|| {
        let acl = build("shmem-bindings/ascendcl-sys/tests/fake/fake_acl.c", "libascendcl.so", &["FAKE_BACKEND"]);
        let shmem = build("shmem-bindings/cann-shmem-sys/tests/fake/fake_shmem.c", "libshmem.so", &[]);
        std::env::set_var("AIV_ASCENDCL_LIB", &acl);
        std::env::set_var("AIV_SHMEM_LIB", &shmem);
        // SAFETY: the fake's initialisers do nothing; loading the same path again shares the loader's copy.
        let acl = unsafe { libloading::Library::new(&acl) }.expect("load fake ACL");
        // SAFETY: the fake exports `void *fake_sdma_workspace(uint32_t, uint32_t)`.
        let workspace = unsafe {
            let make = acl
                .get::<unsafe extern "C" fn(u32, u32) -> *mut std::ffi::c_void>(b"fake_sdma_workspace\0")
                .expect("workspace control");
            make(BLOCKS, SQ_DEPTH) as u64
        };
        let object = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-kernel-b-{}.o", std::process::id()));
        std::fs::write(&object, KERNEL_OBJECT).expect("write the fake kernel object");
        std::env::set_var("AIV_NPU_KERNEL_OBJECT", &object);
        std::env::set_var("AIV_SDMA_WORKSPACE_ADDR", format!("{workspace:#x}"));
        Fakes { acl }
    })
}

/// Tests share the fakes' global state (and their unsynchronised call log): one at a time, log cleared first.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    acl_log();
    guard
}

fn acl_log() -> Vec<String> {
    let library = &fakes().acl;
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

fn calls(log: &[String]) -> Vec<&str> {
    log.iter().map(|line| line.split(' ').next().unwrap_or_default()).collect()
}

fn set_acl_result(function: &str, code: i32) {
    let name = CString::new(function).expect("no NUL");
    // SAFETY: the fake exports `int fake_set_result(const char *, int)`.
    let set = unsafe { fakes().acl.get::<unsafe extern "C" fn(*const c_char, i32) -> i32>(b"fake_set_result\0") }
        .expect("failure control");
    // SAFETY: `name` is NUL-terminated and outlives the call.
    assert_eq!(unsafe { set(name.as_ptr(), code) }, 0);
}

fn options(device_id: u32) -> AivOptions {
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
struct Node {
    engine: TransferEngine,
    device: Arc<AivDevice>,
    buffer: DeviceBuffer,
}

impl Node {
    fn cann(&self) -> &CannDevice {
        self.device.backend().as_any().downcast_ref::<CannDevice>().expect("the cann backend")
    }
    fn write(&self, offset: u64, data: &[u8]) {
        self.cann().copy_to_device(self.buffer.addr() + offset, data).expect("H2D");
    }
    fn read(&self, offset: u64, length: usize) -> Vec<u8> {
        let mut out = vec![0u8; length];
        self.cann().copy_from_device(self.buffer.addr() + offset, &mut out).expect("D2H");
        out
    }
}

fn node(device_id: u32) -> Node {
    fakes();
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

fn pattern(seed: u8, length: usize) -> Vec<u8> {
    (0..length).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

struct Outcome {
    states: Vec<TransferState>,
    reasons: Vec<Option<String>>,
    evidence: Vec<Option<aiv_transport::evidence::TransferEvidence>>,
    elapsed: Duration,
}

fn run(engine: &TransferEngine, requests: &[TransferRequest]) -> Outcome {
    let started = Instant::now();
    let batch = engine.allocate_batch(requests.len()).expect("batch");
    engine.submit_transfer(batch, requests).expect("submit");
    engine.wait_batch(batch).expect("wait");
    let elapsed = started.elapsed();
    let n = requests.len();
    let outcome = Outcome {
        states: (0..n).map(|t| engine.transfer_status(batch, t).expect("status").state).collect(),
        reasons: (0..n).map(|t| engine.task_reason(batch, t).expect("reason")).collect(),
        evidence: (0..n).map(|t| engine.task_evidence(batch, t).expect("evidence")).collect(),
        elapsed,
    };
    engine.free_batch(batch).expect("free");
    outcome
}

fn request(
    protocol: Protocol,
    opcode: Opcode,
    source: u64,
    peer: SegmentId,
    target: u64,
    length: u64,
) -> TransferRequest {
    TransferRequest { opcode, source, target_id: peer, target_offset: target, length, protocol: Some(protocol) }
}

#[test]
fn ubshmem_on_cann_copies_through_acl_streams_into_the_peers_imported_heap() {
    let _serial = serial();
    let a = node(0);
    let b = node(1);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let sent = pattern(7, 200 << 10);
    a.write(4096, &sent);
    let theirs = pattern(91, 100 << 10);
    b.write(512 << 10, &theirs);
    acl_log();

    // WRITE of 200 KiB: 4 pieces (>= 64 KiB each) on 4 streams of the pool.
    let outcome = run(
        &a.engine,
        &[request(Protocol::Ubshmem, Opcode::Write, a.buffer.addr() + 4096, peer, b.buffer.addr() + 8192, 200 << 10)],
    );
    assert_eq!(outcome.states, [TransferState::Completed], "{:?}", outcome.reasons);
    assert_eq!(b.read(8192, sent.len()), sent, "the bytes landed in the peer's heap");
    let log = acl_log();
    let names = calls(&log);
    // The pool's 4 streams are created on the first transfer, on the submitting thread.
    assert_eq!(names.iter().filter(|c| **c == "aclrtCreateStreamWithConfig").count(), 4, "{log:?}");
    assert!(log.iter().any(|l| l == "aclrtCreateStreamWithConfig priority=0 flag=0"), "{log:?}");
    // The peer's heap was imported through VMM before the copies.
    let import = names.iter().position(|c| *c == "aclrtMemImportFromShareableHandle").expect("imported");
    let copies: Vec<&String> = log.iter().filter(|l| l.starts_with("aclrtMemcpyAsync")).collect();
    assert_eq!(
        copies, ["aclrtMemcpyAsync dest_max=51200 count=51200 kind=3"; 4],
        "four D2D pieces with destMax = count"
    );
    let syncs: Vec<&String> = log.iter().filter(|l| l.starts_with("aclrtSynchronizeStreamWithTimeout")).collect();
    assert_eq!(syncs, ["aclrtSynchronizeStreamWithTimeout timeout=300"; 4], "one bounded sync per stream used");
    // The worker is its own thread: it binds the device before its first copy (ACL's device is per thread), and
    // every copy is queued before the first synchronisation.
    let first_copy = names.iter().position(|c| *c == "aclrtMemcpyAsync").expect("copies");
    let first_sync = names.iter().position(|c| *c == "aclrtSynchronizeStreamWithTimeout").expect("syncs");
    let last_copy = names.iter().rposition(|c| *c == "aclrtMemcpyAsync").expect("copies");
    assert!(import < first_copy && last_copy < first_sync, "{log:?}");
    assert_eq!(log[first_copy - 1], "aclrtSetDevice device=0", "worker thread bound before copying: {log:?}");
    let evidence = outcome.evidence[0].clone().expect("evidence");
    assert_eq!(
        (evidence.path, evidence.descriptor_builder, evidence.doorbell_ringer, evidence.completion_observer),
        ("ubshmem", Actor::HostRuntime, Actor::HostRuntime, Actor::HostThread)
    );
    assert_eq!(evidence.host_device_api_calls, 8, "4 copies + 4 synchronisations");

    // READ of 100 KiB from the peer: 2 pieces; the pool's streams are reused, nothing created.
    let outcome = run(
        &a.engine,
        &[request(
            Protocol::Ubshmem,
            Opcode::Read,
            a.buffer.addr() + (300 << 10),
            peer,
            b.buffer.addr() + (512 << 10),
            100 << 10,
        )],
    );
    assert_eq!(outcome.states, [TransferState::Completed], "{:?}", outcome.reasons);
    let log = acl_log();
    assert_eq!(a.read(300 << 10, theirs.len()), theirs, "the peer's bytes were read");
    assert_eq!(
        calls(&log),
        [
            "aclrtMemcpyAsync",
            "aclrtMemcpyAsync",
            "aclrtSynchronizeStreamWithTimeout",
            "aclrtSynchronizeStreamWithTimeout"
        ],
        "{log:?}"
    );
    assert_eq!(a.device.ubshmem().counters().transfers, 2);

    // Dropping the engines destroys every stream (after a bounded synchronisation).
    drop(a);
    let log = acl_log();
    let destroyed = calls(&log).iter().filter(|c| **c == "aclrtDestroyStream").count();
    assert_eq!(destroyed, 4 + 1, "the pool's 4 streams, then the device's kernel stream: {log:?}");
    let first_destroy = calls(&log).iter().position(|c| *c == "aclrtDestroyStream").expect("destroyed");
    assert_eq!(log[first_destroy - 1], "aclrtSynchronizeStreamWithTimeout timeout=1000", "{log:?}");
    assert_eq!(calls(&log).last(), Some(&"aclrtResetDevice"), "streams go before the device: {log:?}");
    drop(b);
}

#[test]
fn ubshmem_on_cann_maps_a_sync_timeout_to_timeout_and_a_task_exception_to_failed() {
    let _serial = serial();
    let a = node(0);
    let b = node(1);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let write = request(Protocol::Ubshmem, Opcode::Write, a.buffer.addr(), peer, b.buffer.addr(), 4096);
    // Warm up: the pool and the import exist before the injection.
    assert_eq!(run(&a.engine, &[write]).states, [TransferState::Completed]);
    acl_log();

    // ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: the bound passed.
    set_acl_result("aclrtSynchronizeStreamWithTimeout", 507046);
    let outcome = run(&a.engine, &[write]);
    set_acl_result("aclrtSynchronizeStreamWithTimeout", 0);
    assert_eq!(outcome.states, [TransferState::Timeout], "{:?}", outcome.reasons);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(
        reason.contains("synchronisation did not finish within 300ms")
            && reason.contains("device 0: synchronize a copy stream (aclrtSynchronizeStreamWithTimeout)"),
        "{reason}"
    );
    assert!(outcome.elapsed < Duration::from_secs(5), "bounded: {:?}", outcome.elapsed);

    // ACL_ERROR_RT_AICORE_EXCEPTION from the synchronisation: the stream's task exception.
    set_acl_result("aclrtSynchronizeStreamWithTimeout", 507015);
    let outcome = run(&a.engine, &[write]);
    set_acl_result("aclrtSynchronizeStreamWithTimeout", 0);
    assert_eq!(outcome.states, [TransferState::Failed], "{:?}", outcome.reasons);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(
        reason.contains("device 0: synchronize a copy stream (ubshmem): task exception: copy stream")
            && reason.contains("aclrtSynchronizeStreamWithTimeout failed")
            && reason.contains("507015"),
        "{reason}"
    );

    // A refused copy: the runtime's error names the call and the stream.
    set_acl_result("aclrtMemcpyAsync", 507899);
    let outcome = run(&a.engine, &[write]);
    set_acl_result("aclrtMemcpyAsync", 0);
    assert_eq!(outcome.states, [TransferState::Failed], "{:?}", outcome.reasons);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(reason.contains("aclrtMemcpyAsync failed") && reason.contains("507899"), "{reason}");

    // After the injections the path works again.
    let data = pattern(3, 4096);
    a.write(0, &data);
    assert_eq!(run(&a.engine, &[write]).states, [TransferState::Completed]);
    assert_eq!(b.read(0, 4096), data);
    drop((a, b));
}
