//! `"device_backend": "cann"`, the vendor path, on the twin runtime's shared library: the loaders of the `-sys` crates
//! open the `cann-twin` cdylib as `libascendcl.so`, `libshmem.so` and `libcann_hixl.so` (the override variables
//! `AIV_ASCENDCL_LIB`, `AIV_SHMEM_LIB`, `AIV_HIXL_LIB` all naming one file), resolve every ACL, SHMEM and HiXL
//! symbol and SHMEM's `g_state` from it, identify it as the twin runtime by its answer to `aclsysGetCANNVersion`, and
//! load the twin kernel object through it. Nothing of the twin runtime linked into this binary is used.
//!
//! Runs with feature `cann` when `AIV_TEST_TWIN_CANN_LIBS` names the directory `tests/support/twin_cann_libs.sh`
//! prints (tests/run.sh sets it; without it the tests are skipped with a `SKIPPED` line, and fail under `CI=true`):
//!
//!     export AIV_TEST_TWIN_CANN_LIBS="$(tests/support/twin_cann_libs.sh | tail -n 1)"
//!     cargo test --features cann --test cann_vendor_path_on_twin
//!
//! The aiv transfers' device-side acts are self-reported there (no SQE log to read): each transfer's own verdict is
//! `unknown`, and the run's is `AIV-direct` only with the profiler's corroboration (the twin's model of CANN's
//! profiler, loaded as `libmsprofiler.so` from the same file), its line naming every source. A Host thread's copy
//! while transfers are in flight turns it (counted by the loader tables, and seen by the profiler even when the copy
//! bypasses the tables); without the profiler it is `unknown`, never `yes`.
//!
//! SHMEM is one PE per process, and the loaders' tables are process-wide, so every case runs in processes of its own:
//! this binary re-runs itself with `AIV_VENDOR_TWIN_CASE` naming the case. The data test is two processes, PE 0
//! (device 0) and PE 1 (device 1), SHMEM's unique id passed through PE 0's segment descriptor as on two NPUs.
#![cfg(feature = "cann")]

#[path = "common/peer_engine.rs"]
mod peer_engine;
#[path = "common/skip.rs"]
mod skip;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use aiv_transport::config::DeviceBackendKind;
use aiv_transport::device::cann::profiler::{self, ProfilerSession, Window};
use aiv_transport::device::cann::{CannDevice, CannRuntime};
use aiv_transport::evidence::{DeviceObserver, EvidenceTally, Source, Submitter, TransferEvidence};
use aiv_transport::{Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState};
use ascendcl_sys::result as acl;
use ascendcl_sys::sys::{aclError, aclrtMemcpyKind, ACL_MEMCPY_HOST_TO_DEVICE, ACL_SUCCESS};
use core::ffi::c_void;
use rand::{Rng, SeedableRng};

const CASE: &str = "AIV_VENDOR_TWIN_CASE";
/// The peer's registered buffer, and PE 0's.
const BUFFER: u64 = 16 << 20;
/// Requests of one batch use distinct slots of this size (requests of a batch run in no fixed order).
const SLOT: u64 = 2 << 20;
/// Bound on each process of a case.
const CASE_TIMEOUT: Duration = Duration::from_secs(240);

/// The directory of the twin's CANN libraries, or `None` (the test skipped; a failure under `CI=true`).
fn libraries() -> Option<PathBuf> {
    match std::env::var_os("AIV_TEST_TWIN_CANN_LIBS").map(PathBuf::from) {
        Some(dir) => {
            for file in ["libascendcl.so", "libmetadef.so"] {
                assert!(dir.join(file).exists(), "AIV_TEST_TWIN_CANN_LIBS={dir:?} has no {file}");
            }
            Some(dir)
        }
        None => {
            skip::skip(
                "set AIV_TEST_TWIN_CANN_LIBS=\"$(tests/support/twin_cann_libs.sh | tail -n 1)\" to run the vendor \
                 loader path on the twin runtime's library (tests/run.sh does)",
            );
            None
        }
    }
}

/// The loaders' override variables, each naming `library` (the twin is one library: ACL, SHMEM and HiXL must be
/// the one loaded copy, whose SHMEM workspace lives in that copy's device memory).
fn loader_env(library: &std::path::Path) -> Vec<(&'static str, std::ffi::OsString)> {
    ["AIV_ASCENDCL_LIB", "AIV_SHMEM_LIB", "AIV_HIXL_LIB", "AIV_MSPROFILER_LIB"]
        .into_iter()
        .map(|var| (var, library.into()))
        .collect()
}

/// A child process of this binary (or of `aiv`) killed when dropped, with its stdout lines on a channel.
struct Process {
    child: Child,
    lines: Receiver<String>,
    output: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Process {
    fn spawn(mut command: Command) -> Process {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a child process");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Process { child, lines, output: Vec::new(), stderr: Some(stderr) }
    }

    /// This binary, running `case`.
    fn case(case: &str, env: &[(&str, std::ffi::OsString)]) -> Process {
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command.args(["--exact", "child", "--ignored", "--nocapture", "--test-threads=1"]).env(CASE, case);
        for (name, value) in env {
            command.env(name, value);
        }
        Process::spawn(command)
    }

    /// The first line holding `marker`, from the marker on (the test harness may print before it on the same
    /// line), waiting until `deadline`.
    fn line_starting(&mut self, marker: &str, deadline: Instant) -> Option<String> {
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.output.push(line.clone());
                    if let Some(at) = line.find(marker) {
                        return Some(line[at..].to_string());
                    }
                }
                Err(_) => return None,
            }
        }
    }

    fn stdin(&mut self) -> &mut ChildStdin {
        self.child.stdin.as_mut().expect("stdin")
    }

    /// Waits (bounded) for the process to end; its exit status, all of its stdout and its stderr.
    fn finish(mut self, timeout: Duration) -> (Option<std::process::ExitStatus>, String, String) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        // The process is gone: its pipes close, so the readers end.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.output.push(line);
        }
        let stderr = self.stderr.take().and_then(|handle| handle.join().ok()).unwrap_or_default();
        (status, self.output.join("\n"), stderr)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `case` in a child process with the loaders pointed at the twin's library, and checks it passed.
fn in_child(case: &str, env: &[(&str, std::ffi::OsString)]) {
    let (status, stdout, stderr) = Process::case(case, env).finish(CASE_TIMEOUT);
    assert!(
        status.is_some_and(|status| status.success()) && stdout.contains(&format!("case {case} passed")),
        "case {case} failed ({status:?}):\n{stdout}\n{stderr}"
    );
}

/// The child's entry: runs the case `AIV_VENDOR_TWIN_CASE` names.
#[test]
#[ignore = "a case of the other tests of this file, run by them in a child process"]
fn child() {
    let Ok(case) = std::env::var(CASE) else {
        println!("nothing to do: the child half of this file's tests, run by them with {CASE} set");
        return;
    };
    match case.as_str() {
        "pe0" => pe0(),
        "pe1" => pe1(),
        "missing_symbol" => missing_symbol(),
        "two_copies" => two_copies(),
        "two_hixl_copies" => two_hixl_copies(),
        "host_acts" => host_acts(),
        "no_profiler" => no_profiler(),
        other => panic!("unknown case {other}"),
    }
    println!("case {case} passed");
}

#[test]
fn aiv_ubshmem_and_adxl_move_random_ranges_between_two_processes_on_the_twin_runtime_loaded_as_the_vendor_libraries() {
    let Some(dir) = libraries() else { return };
    let mut env = loader_env(&dir.join("libascendcl.so"));
    env.push(("AIV_SHMEM_PE", "0".into()));
    env.push(("AIV_SHMEM_N_PES", "2".into()));
    in_child("pe0", &env);
}

#[test]
fn a_host_copy_while_aiv_transfers_are_in_flight_turns_the_verdict_counted_by_the_tables_and_seen_by_the_profiler() {
    let Some(dir) = libraries() else { return };
    in_child("host_acts", &loader_env(&dir.join("libascendcl.so")));
}

#[test]
fn without_the_profiler_the_self_reported_aiv_verdict_is_unknown_not_yes() {
    let Some(dir) = libraries() else { return };
    // libmetadef.so has no aclprof* symbol: the profiling table does not load.
    let mut env = loader_env(&dir.join("libascendcl.so"));
    env.retain(|(name, _)| *name != "AIV_MSPROFILER_LIB");
    env.push(("AIV_MSPROFILER_LIB", dir.join("libmetadef.so").into()));
    in_child("no_profiler", &env);
}

#[test]
fn a_library_without_a_required_shmem_symbol_fails_the_device_naming_the_symbol_and_the_file() {
    let Some(dir) = libraries() else { return };
    // libmetadef.so (ge::AscendString only, from the same script) stands in for a libshmem.so without SHMEM.
    let mut env = loader_env(&dir.join("libascendcl.so"));
    env.retain(|(name, _)| *name != "AIV_SHMEM_LIB");
    env.push(("AIV_SHMEM_LIB", dir.join("libmetadef.so").into()));
    in_child("missing_symbol", &env);
}

/// Runs `case` with the loader variable `variable` pointing at a byte-for-byte copy of the twin's library (named
/// `file`), the others at the library itself: a second runtime in the process, sharing nothing with the first.
fn with_a_copy_as(variable: &str, file: &str, case: &str) {
    let Some(dir) = libraries() else { return };
    let copy_dir = std::env::temp_dir().join(format!("aiv-vendor-twin-copy-{case}-{}", std::process::id()));
    std::fs::create_dir_all(&copy_dir).expect("temporary directory");
    let copy = copy_dir.join(file);
    std::fs::copy(dir.join("libascendcl.so"), &copy).expect("copy the library");
    let mut env = loader_env(&dir.join("libascendcl.so"));
    env.retain(|(name, _)| *name != variable);
    env.push((variable, copy.clone().into()));
    let result = std::panic::catch_unwind(|| in_child(case, &env));
    let _ = std::fs::remove_dir_all(&copy_dir);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn a_shmem_library_that_is_another_copy_of_the_twin_runtime_is_refused_naming_both_files() {
    with_a_copy_as("AIV_SHMEM_LIB", "libshmem.so", "two_copies");
}

#[test]
fn a_hixl_library_that_is_another_copy_of_the_twin_runtime_is_refused_naming_both_files() {
    with_a_copy_as("AIV_HIXL_LIB", "libcann_hixl.so", "two_hixl_copies");
}

#[test]
fn doctor_names_the_loaded_library_and_identifies_the_twin_runtime() {
    let Some(dir) = libraries() else { return };
    let library = dir.join("libascendcl.so");
    let mut command = Command::new(env!("CARGO_BIN_EXE_aiv"));
    command.arg("doctor").envs(loader_env(&library));
    let (status, stdout, stderr) = Process::spawn(command).finish(Duration::from_secs(60));
    assert!(status.is_some_and(|status| status.success()), "aiv doctor failed ({status:?}):\n{stdout}\n{stderr}");
    let path = library.display().to_string();
    for line in [
        format!("found     libascendcl.so   {path}"),
        format!("found     libshmem.so      {path}"),
        format!("found     libcann_hixl.so  {path}"),
        format!("loaded runtime: {path}"),
        "CANN              cann-twin 0.1.0".to_string(),
        "runtime           cann-twin 0.1.0".to_string(),
        format!("identified as     the twin runtime ({})", cann_twin::TWIN_VERSION_STRING),
        "cann  usable".to_string(),
        "SHMEM             1.1".to_string(),
    ] {
        assert!(stdout.contains(&line), "{line:?} missing from aiv doctor's report:\n{stdout}");
    }
}

fn engine(device_id: u32) -> TransferEngine {
    peer_engine::engine(DeviceBackendKind::Cann, device_id)
}

/// The peer's initial bytes.
fn pattern(offset: u64, length: u64) -> Vec<u8> {
    (offset..offset + length).map(|i| (i.wrapping_mul(131) as u8) ^ 0x5a ^ ((i >> 12) as u8)).collect()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3))
}

/// The device is the `cann` backend on the loaded twin runtime, not on the one linked into this binary.
fn check_loaded_twin(device: &aiv_transport::engine::AivDevice) {
    let cann = CannDevice::of(device.backend().as_ref()).expect("a cann device of this process");
    assert_eq!(cann.runtime(), CannRuntime::LoadedTwin, "the loaded library was not identified as the twin");
    assert_eq!(device.backend().backend_name(), "cann");
    // Every table came from the one file the override variables name, SHMEM's state symbol included (the workspace
    // discovery reads it: the twin runtime has no device copy of SHMEM's state, so nothing else could have worked).
    let library = PathBuf::from(std::env::var_os("AIV_ASCENDCL_LIB").expect("AIV_ASCENDCL_LIB"));
    assert_eq!(ascendcl_sys::api().expect("ACL table").path(), library);
    let shmem = cann_shmem_sys::api().expect("SHMEM table");
    assert_eq!(shmem.path(), library);
    assert!(shmem.g_state.is_some(), "g_state not resolved from {}", library.display());
    assert_eq!(ascendcl_sys::hixl::api().expect("HiXL table").path(), library);
}

/// PE 1 (device 1): fills its buffer with [`pattern`], serves it, and when PE 0 sends `VERIFY <hash>` compares its
/// whole buffer, read through its own runtime, with PE 0's model of it.
fn pe1() {
    let engine = engine(1);
    let device = engine.device().expect("PE 1 device (SHMEM id fetched from PE 0's descriptor)");
    check_loaded_twin(&device);
    let buffer = device.allocate(BUFFER).expect("HBM");
    device.write(buffer.addr(), &pattern(0, BUFFER)).expect("H2D");
    // SAFETY: the buffer outlives the engine's use of it: this process waits for PE 0 before dropping it.
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }.expect("register");
    println!("PEER_READY {} {}", engine.name(), buffer.addr());
    std::io::stdout().flush().expect("flush");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("PE 0's verdict request");
    let expected = line.strip_prefix("VERIFY ").map(str::trim).expect("VERIFY <hash>");
    let mut memory = vec![0u8; BUFFER as usize];
    device.read(buffer.addr(), &mut memory).expect("D2H");
    assert_eq!(format!("{:016x}", fnv1a(&memory)), expected, "PE 1's memory is not what PE 0's transfers made it");
    println!("PEER_VERIFIED {expected}");
    drop((buffer, device, engine));
}

/// PE 0 (device 0): starts PE 1, then over each of aiv, ubshmem and adxl runs rounds of random READ and WRITE
/// batches against PE 1's buffer, every byte a READ brings checked through the runtime's D2H copy against the model
/// of PE 1's memory that every WRITE updates; at the end PE 1 checks its whole memory against the model.
fn pe0() {
    // Before the engine opens: its kernel launches inside the profiling session.
    let session = ProfilerSession::start_vendor(&[0]).expect("the twin's profiler, loaded as libmsprofiler.so");
    let engine = engine(0);
    let mut peer = Process::case(
        "pe1",
        &[
            ("AIV_SHMEM_PE", "1".into()),
            ("AIV_SHMEM_N_PES", "2".into()),
            ("AIV_SHMEM_ROOT_SEGMENT", engine.name().into()),
        ],
    );
    let device = engine.device().expect("PE 0 device on the loaded twin runtime");
    check_loaded_twin(&device);
    let buffer = device.allocate(BUFFER).expect("HBM");
    // SAFETY: the buffer outlives every batch below, each waited for.
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }.expect("register");
    let ready = peer.line_starting("PEER_READY", Instant::now() + Duration::from_secs(120));
    let Some(ready) = ready else {
        let (status, stdout, stderr) = peer.finish(Duration::from_secs(5));
        panic!("PE 1 was not ready within 120 s ({status:?}):\n{stdout}\n{stderr}");
    };
    let fields: Vec<&str> = ready.split_whitespace().collect();
    let peer_addr: u64 = fields[2].parse().expect("peer address");
    let segment = engine.open_segment(fields[1]).expect("PE 1's segment");

    let mut model = pattern(0, BUFFER);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7e57_c0de);
    let mut aiv = Observed::default();
    for protocol in [Protocol::Aiv, Protocol::Ubshmem, Protocol::Adxl] {
        let mut moved = 0u64;
        for _ in 0..4 {
            for opcode in [Opcode::Write, Opcode::Read] {
                let (bytes, evidence, window) =
                    batch(&engine, &device, &buffer, (segment, peer_addr), &mut model, (opcode, protocol), &mut rng);
                moved += bytes;
                if protocol == Protocol::Aiv {
                    aiv.windows.push(window);
                    evidence.iter().for_each(|evidence| aiv.tally.add(evidence));
                }
            }
        }
        println!("CHECK {}: {moved} bytes moved and checked", protocol.as_str());
    }
    // Nothing ran on the twin runtime linked into this binary: its device 0 was never opened.
    assert!(cann_twin::control::sqes_executed(0, 0).is_err(), "the in-process twin runtime executed SQEs");

    peer.stdin().write_all(format!("VERIFY {:016x}\n", fnv1a(&model)).as_bytes()).expect("to PE 1");
    peer.stdin().flush().expect("flush");
    let verified = peer.line_starting("PEER_VERIFIED", Instant::now() + Duration::from_secs(60));
    drop((buffer, device, engine));
    let (status, stdout, stderr) = peer.finish(Duration::from_secs(60));
    assert!(
        verified.is_some() && status.is_some_and(|status| status.success()),
        "PE 1 did not confirm its memory ({status:?}):\n{stdout}\n{stderr}"
    );
    // The engine is gone (its kernel returned): the profiler's records are complete.
    let tasks = session.stop().expect("the profiler's records");
    let lines = aiv.verdict(&tasks);
    assert!(
        lines[0].starts_with(&format!(
            "submitted by: AIV-direct (twin runtime, {}; device acts self-reported by the kernel; 0 Host \
             submissions counted; profiler: only the AIV kernel ran",
            cann_twin::TWIN_VERSION_STRING
        )),
        "{lines:#?}"
    );
    assert!(lines[1].starts_with("  AIV-direct: yes"), "{lines:#?}");
}

/// The aiv transfers of a run and the windows they were in flight in.
#[derive(Default)]
struct Observed {
    tally: EvidenceTally,
    windows: Vec<Window>,
}

impl Observed {
    /// The run's verdict lines with `tasks` (the profiler's records) as its observer; printed.
    fn verdict(&mut self, tasks: &profiler::ProfiledTasks) -> Vec<String> {
        self.tally.observer = Some(DeviceObserver::Profiler { tasks: tasks.observed(&self.windows) });
        let lines = self.tally.verdict_lines();
        for line in &lines {
            println!("{line}");
        }
        lines
    }
}

/// One batch of 1 to 8 requests of `opcode` over `protocol`, each in a slot of its own on both sides, of random
/// length (1 byte to a slot, across the 1 MiB SQE size) at random offsets. Returns the bytes moved, the tasks'
/// evidence and the window from submit to the end of the wait (the Host's own copies around it left out).
fn batch(
    engine: &TransferEngine,
    device: &aiv_transport::engine::AivDevice,
    buffer: &aiv_transport::device::DeviceBuffer,
    (segment, peer_addr): (SegmentId, u64),
    model: &mut [u8],
    (opcode, protocol): (Opcode, Protocol),
    rng: &mut impl Rng,
) -> (u64, Vec<TransferEvidence>, Window) {
    let slots = (BUFFER / SLOT) as usize;
    let count = rng.gen_range(1..=8usize);
    let mut local_slots: Vec<usize> = (0..slots).collect();
    let mut remote_slots: Vec<usize> = (0..slots).collect();
    use rand::seq::SliceRandom;
    local_slots.shuffle(rng);
    remote_slots.shuffle(rng);
    let mut cases = Vec::new();
    for index in 0..count {
        let length = if rng.gen_bool(0.25) { rng.gen_range(1..64u64) } else { rng.gen_range(1..SLOT) };
        let local = local_slots[index] as u64 * SLOT + rng.gen_range(0..=SLOT - length);
        let remote = remote_slots[index] as u64 * SLOT + rng.gen_range(0..=SLOT - length);
        cases.push((local, remote, length));
    }
    if opcode == Opcode::Write {
        // Fresh local bytes, so a transfer that moved nothing cannot pass on what is already there.
        for &(local, _, length) in &cases {
            let bytes: Vec<u8> = (0..length).map(|_| rng.gen()).collect();
            device.write(buffer.addr() + local, &bytes).expect("H2D");
        }
    } else {
        // Clear the destinations, for the same reason.
        for &(local, _, length) in &cases {
            device.write(buffer.addr() + local, &vec![0u8; length as usize]).expect("H2D");
        }
    }
    let requests: Vec<TransferRequest> = cases
        .iter()
        .map(|&(local, remote, length)| TransferRequest {
            opcode,
            source: buffer.addr() + local,
            target_id: segment,
            target_offset: peer_addr + remote,
            length,
            protocol: Some(protocol),
        })
        .collect();
    let id = engine.allocate_batch(requests.len()).expect("batch");
    let start = profiler::now_us();
    engine.submit_transfer(id, &requests).expect("submit");
    let status = engine.wait_batch(id).expect("wait");
    let window = Window::since(start);
    let name = protocol.as_str();
    let mut moved = 0;
    let mut evidences = Vec::new();
    for (task, &(local, remote, length)) in cases.iter().enumerate() {
        let state = engine.transfer_status(id, task).expect("status").state;
        let reason = engine.task_reason(id, task).expect("task");
        assert_eq!(state, TransferState::Completed, "{name} {opcode:?} task {task} ({length} bytes): {reason:?}");
        let evidence = engine.task_evidence(id, task).expect("task").expect("evidence");
        assert_eq!(evidence.path, name, "{evidence:?}");
        if protocol == Protocol::Aiv {
            // The kernel's word alone, with no Host act counted while it was in flight: neither yes nor no.
            let acts = [&evidence.descriptors_written, &evidence.doorbells_rung, &evidence.completion_seen];
            assert!(acts.iter().all(|act| act.source == Source::SelfReported && act.by_host == 0), "{evidence:?}");
            assert!(
                evidence.descriptors_written.by_aiv > 0,
                "aiv task {task}: the kernel reports no SQE: {evidence:?}"
            );
            assert_eq!(evidence.submitter(), Submitter::Unknown, "aiv task {task}: {evidence:?}");
        }
        evidences.push(evidence);
        let mut landed = vec![0u8; length as usize];
        device.read(buffer.addr() + local, &mut landed).expect("D2H");
        let (local, remote, length) = (local as usize, remote as usize, length as usize);
        match opcode {
            Opcode::Write => model[remote..remote + length].copy_from_slice(&landed),
            _ => assert!(
                landed == model[remote..remote + length],
                "{name} READ task {task}: {length} bytes from PE 1 at {remote:#x} into {local:#x} differ from the model"
            ),
        }
        moved += length as u64;
    }
    assert_eq!(status.state, TransferState::Completed, "{name} {opcode:?} batch");
    engine.free_batch(id).expect("free");
    (moved, evidences, window)
}

/// With a `libshmem.so` that lacks SHMEM's functions the device does not open, and the error names the first
/// required symbol and the file.
fn missing_symbol() {
    let engine = engine(0);
    let error = engine.device().expect_err("no SHMEM in the library").to_string();
    let path = std::env::var("AIV_SHMEM_LIB").expect("AIV_SHMEM_LIB");
    assert!(error.contains("has no symbol aclshmemx_get_uniqueid") && error.contains(&path), "{error}");
    println!("the device refused: {error}");
}

/// With HiXL loaded from a copy of the file ACL came from, the device opens (ACL and SHMEM are one copy) but its
/// HiXL table is refused, naming both files: adxl transfers would fail with that reason.
fn two_hixl_copies() {
    let engine = engine(0);
    let device = engine.device().expect("the device opens: ACL and SHMEM are one copy");
    let error = match device.backend().hixl().map(|access| access.hixl_api()) {
        Some(Err(error)) => error,
        Some(Ok(_)) => panic!("HiXL from another copy of the runtime was accepted"),
        None => panic!("the cann backend offers no HiXL table"),
    };
    let acl = std::env::var("AIV_ASCENDCL_LIB").expect("AIV_ASCENDCL_LIB");
    let hixl = std::env::var("AIV_HIXL_LIB").expect("AIV_HIXL_LIB");
    assert!(error.contains("another copy") && error.contains(&acl) && error.contains(&hixl), "{error}");
    println!("the HiXL table was refused: {error}");
}

/// With SHMEM loaded from a copy of the file ACL came from, the device does not open, and the error says why and
/// names both files.
fn two_copies() {
    let engine = engine(0);
    let error = engine.device().expect_err("SHMEM from another copy of the runtime").to_string();
    let acl = std::env::var("AIV_ASCENDCL_LIB").expect("AIV_ASCENDCL_LIB");
    let shmem = std::env::var("AIV_SHMEM_LIB").expect("AIV_SHMEM_LIB");
    assert!(error.contains("two copies") && error.contains(&acl) && error.contains(&shmem), "{error}");
    println!("the device refused: {error}");
}

/// Aiv batches of one process on its own device memory (`count` rounds of 4 transfers of 2 MiB from one half of
/// `buffer` to the other), into `observed`.
fn local_batches(
    engine: &TransferEngine,
    buffer: &aiv_transport::device::DeviceBuffer,
    count: usize,
    observed: &mut Observed,
) {
    let half = buffer.len() / 2;
    for round in 0..count {
        let requests: Vec<TransferRequest> = (0..4u64)
            .map(|i| TransferRequest {
                opcode: if round % 2 == 0 { Opcode::Write } else { Opcode::Read },
                source: buffer.addr() + i * SLOT,
                target_id: SegmentId::LOCAL,
                target_offset: buffer.addr() + half + i * SLOT,
                length: SLOT,
                protocol: Some(Protocol::Aiv),
            })
            .collect();
        let start = profiler::now_us();
        let id = engine.allocate_batch(requests.len()).expect("batch");
        engine.submit_transfer(id, &requests).expect("submit");
        let status = engine.wait_batch(id).expect("wait");
        observed.windows.push(Window::since(start));
        assert_eq!(status.state, TransferState::Completed, "local aiv batch {round}");
        for task in 0..requests.len() {
            let evidence = engine.task_evidence(id, task).expect("task").expect("evidence");
            assert_eq!(evidence.descriptors_written.source, Source::SelfReported, "{evidence:?}");
            observed.tally.add(&evidence);
        }
        engine.free_batch(id).expect("free");
    }
}

/// Runs `run` (aiv batches) while another thread calls `copy` (a Host copy into device memory) over and over, from
/// its first copy on until `run` returns; the copies made.
fn with_a_host_copier(copy: &(dyn Fn() + Sync), run: impl FnOnce()) -> u64 {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (stop, copies) = (AtomicBool::new(false), AtomicU64::new(0));
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                copy();
                copies.fetch_add(1, Ordering::Relaxed);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while copies.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        run();
        stop.store(true, Ordering::Relaxed);
    });
    copies.into_inner()
}

/// Three runs of aiv transfers on one device, under one profiling session: a clean one (AIV-direct with the
/// profiler's corroboration); one while a Host thread copies through the loader table (`aclrtMemcpy` H2D: the
/// transfers in flight count it, so they are mixed with or without the profiler, and the profiler sees the copy
/// tasks); one while the Host thread copies through the library's exported `aclrtMemcpy` directly, bypassing the
/// tables (counted nowhere, but the profiler sees the copy tasks: mixed).
fn host_acts() {
    let session = ProfilerSession::start_vendor(&[0]).expect("the twin's profiler, loaded as libmsprofiler.so");
    let engine = engine(0);
    let device = engine.device().expect("device 0 on the loaded twin runtime");
    check_loaded_twin(&device);
    let buffer = device.allocate(8 * SLOT).expect("HBM");
    let scratch = device.allocate(1 << 20).expect("HBM");
    // SAFETY: the buffer outlives every batch below, each waited for.
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }.expect("register");
    let bytes = vec![0x3cu8; 1 << 20];
    let acl = ascendcl_sys::api().expect("the loaded ACL table");

    let mut clean = Observed::default();
    local_batches(&engine, &buffer, 8, &mut clean);

    // Through the loader table: counted.
    let counted_copy = || {
        acl::device::set(acl, 0).expect("device 0 on the copier thread");
        // SAFETY: a live Host buffer and device memory of its length.
        unsafe {
            acl::memory::memcpy(
                acl,
                scratch.addr() as *mut c_void,
                bytes.len(),
                bytes.as_ptr().cast(),
                bytes.len(),
                ACL_MEMCPY_HOST_TO_DEVICE,
            )
        }
        .expect("H2D through the table");
    };
    let mut counted = Observed::default();
    let copies = with_a_host_copier(&counted_copy, || local_batches(&engine, &buffer, 24, &mut counted));
    assert!(copies > 0);

    // Around the tables: the library's own symbol, as a C caller in the process would call it.
    let library = std::env::var_os("AIV_ASCENDCL_LIB").expect("AIV_ASCENDCL_LIB");
    // SAFETY: the loaded twin library (the same file, so the same loaded object); only its aclrtMemcpy is used, with
    // the prototype ascendcl-sys declares.
    let raw = unsafe { libloading::Library::new(&library) }.expect("the library");
    type Memcpy = unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, aclrtMemcpyKind) -> aclError;
    // SAFETY: as above.
    let memcpy: libloading::Symbol<'_, Memcpy> = unsafe { raw.get(b"aclrtMemcpy\0") }.expect("aclrtMemcpy");
    let raw_copy = || {
        acl::device::set(acl, 0).expect("device 0 on the copier thread");
        // SAFETY: as above.
        let code = unsafe {
            memcpy(
                scratch.addr() as *mut c_void,
                bytes.len(),
                bytes.as_ptr().cast(),
                bytes.len(),
                ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        assert_eq!(code, ACL_SUCCESS);
    };
    let mut bypassed = Observed::default();
    let copies = with_a_host_copier(&raw_copy, || local_batches(&engine, &buffer, 24, &mut bypassed));
    assert!(copies > 0);

    engine.unregister_memory(buffer.addr()).expect("unregister");
    drop((buffer, scratch, device, engine));
    let tasks = session.stop().expect("the profiler's records");

    // Clean: AIV-direct, the line naming every source.
    let lines = clean.verdict(&tasks);
    assert!(lines[0].starts_with("submitted by: AIV-direct (twin runtime, "), "{lines:#?}");
    assert!(
        lines[0].contains(
            "; device acts self-reported by the kernel; 0 Host submissions counted; profiler: only the AIV kernel ran"
        ),
        "{lines:#?}"
    );
    // Counted: the transfers in flight during a copy count it; mixed with the profiler and without it.
    let host: f64 = counted.tally.descriptors_written.by_host;
    assert!(host > 0.0, "no Host copy was counted against a transfer in flight");
    let mut without = counted.tally.clone();
    without.observer = None;
    assert_eq!(without.submitter(), Submitter::Mixed, "{:#?}", without.verdict_lines());
    let lines = counted.verdict(&tasks);
    assert!(lines[0].starts_with("submitted by: mixed (twin runtime, "), "{lines:#?}");
    assert!(!lines[0].contains("; 0 Host submissions counted"), "{lines:#?}");
    let Some(DeviceObserver::Profiler { tasks: seen }) = &counted.tally.observer else { panic!("an observer") };
    assert!(seen.copy_tasks > 0, "the profiler saw no copy task: {seen:?}");
    // Bypassed: nothing counted, so the kernel's word alone would be unknown; the profiler's copy tasks make it mixed.
    assert_eq!(bypassed.tally.descriptors_written.by_host, 0.0, "a copy around the tables was counted");
    let mut without = bypassed.tally.clone();
    without.observer = None;
    assert_eq!(without.submitter(), Submitter::Unknown, "{:#?}", without.verdict_lines());
    let lines = bypassed.verdict(&tasks);
    assert!(lines[0].starts_with("submitted by: mixed (twin runtime, "), "{lines:#?}");
    assert!(
        lines[0].contains("; 0 Host submissions counted; profiler: ") && lines[0].contains(" copy task"),
        "{lines:#?}"
    );
    assert!(lines[1].starts_with("  AIV-direct: no"), "{lines:#?}");
}

/// The profiling library lacks the profiler: the transfers move, and the run's verdict is unknown, saying why.
fn no_profiler() {
    let session = ProfilerSession::start_vendor(&[0]);
    let reason = session.as_ref().expect_err("libmetadef.so has no profiler").clone();
    assert!(reason.contains("aclprofInit"), "{reason}");
    let engine = engine(0);
    let device = engine.device().expect("device 0 on the loaded twin runtime");
    let buffer = device.allocate(8 * SLOT).expect("HBM");
    // SAFETY: the buffer outlives every batch below, each waited for.
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }.expect("register");
    let mut run = Observed::default();
    local_batches(&engine, &buffer, 4, &mut run);
    engine.unregister_memory(buffer.addr()).expect("unregister");
    drop((buffer, device, engine));
    run.tally.observer = Some(profiler::observer(session, &run.windows));
    let lines = run.tally.verdict_lines();
    lines.iter().for_each(|line| println!("{line}"));
    assert_eq!(run.tally.submitter(), Submitter::Unknown);
    assert!(
        lines[0].starts_with("submitted by: unknown (twin runtime, ")
            && lines[0].contains("; device acts self-reported by the kernel; 0 Host submissions counted; no independent device-side observer: the profiler: "),
        "{lines:#?}"
    );
    assert!(lines[1].starts_with("  AIV-direct: unknown"), "{lines:#?}");
}
