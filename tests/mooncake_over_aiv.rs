//! Mooncake's unmodified Ascend wheel over aiv: its `TransferEngine` in two Python processes
//! (`tests/support/mooncake_over_aiv.py`) with the directory `tests/support/mooncake_over_aiv.sh` prints on
//! `LD_LIBRARY_PATH`, so that the wheel's `adxl::AdxlEngine` is `libllm_datadist.so` over aiv
//! (`host/capi/cxx/adxl_over_aiv.cpp`) and its `libascendcl.so` the twin runtime. Device buffers come from
//! `aclrtMalloc`; the data of every transfer is checked by hash on both sides, and the twin runtime's own counts
//! (`cannTwinEvidence` version 2, provenance records on) show the SQEs written and the doorbells rung by the AIV
//! kernel and no Host runtime copy while the transfers ran. A target killed mid-batch gives Mooncake a failed status
//! within the transfer timeout. Without the wheel, a C++ program (`host/capi/tests/cxx/adxl_over_aiv_test.cpp`) checks
//! the library's failure paths: ADXL's code and one log line for each, and `Initialize` failing with `FAILED` when the
//! loaded `libascendcl.so` is no usable runtime (a stub with a handful of functions).
//!
//! Needs g++ (the tests run tests/support/mooncake_over_aiv.sh, which builds the library, unless
//! `AIV_TEST_MOONCAKE_OVER_AIV_LIBS` names its output already) and, for the wheel's tests, its virtualenv
//! (`AIV_TEST_MOONCAKE_NPU_VENV`, from tests/support/mooncake_npu.sh); without them the tests are skipped with a
//! `SKIPPED` line (a failure under `CI=true`).

#[path = "common/skip.rs"]
mod skip;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The transfer timeout of both sides' engines (ASCEND_TRANSFER_TIMEOUT, read by Mooncake and by the library).
const TRANSFER_TIMEOUT_MS: u64 = 5000;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The wheel's virtualenv and the library directory, or `None` (skipped).
fn inputs() -> Option<(PathBuf, PathBuf)> {
    let Some(venv) = std::env::var_os("AIV_TEST_MOONCAKE_NPU_VENV").map(PathBuf::from) else {
        skip::skip(
            "set AIV_TEST_MOONCAKE_NPU_VENV=\"$(tests/support/mooncake_npu.sh)\" to run Mooncake's wheel over aiv \
             (tests/run.sh does)",
        );
        return None;
    };
    Some((venv, library_dir()?))
}

/// The directory of tests/support/mooncake_over_aiv.sh (built once per test binary), or `None` (skipped: no g++).
fn library_dir() -> Option<PathBuf> {
    if let Some(libs) = std::env::var_os("AIV_TEST_MOONCAKE_OVER_AIV_LIBS").map(PathBuf::from) {
        return Some(libs);
    }
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if Command::new(&cxx).arg("--version").output().map_or(true, |output| !output.status.success()) {
        skip::skip(&format!("no {cxx} to build libllm_datadist.so over aiv (tests/support/mooncake_over_aiv.sh)"));
        return None;
    }
    // Built once for the tests of this binary.
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let output = Command::new("bash")
            .arg(repo().join("tests/support/mooncake_over_aiv.sh"))
            .output()
            .map_err(|error| format!("run tests/support/mooncake_over_aiv.sh: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "tests/support/mooncake_over_aiv.sh failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        Ok(PathBuf::from(stdout.lines().last().unwrap_or_default().trim()))
    });
    match built {
        Ok(libs) => Some(libs.clone()),
        Err(message) => panic!("{message}"),
    }
}

/// A driver process, killed when dropped, its stdout lines on a channel and its stderr kept.
struct Driver {
    child: Child,
    lines: Receiver<String>,
    stdout: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Driver {
    fn spawn(venv: &Path, libs: &Path, args: &[&str], env: &[(&str, &str)]) -> Driver {
        let mut command = Command::new(venv.join("bin/python"));
        command
            .arg(repo().join("tests/support/mooncake_over_aiv.py"))
            .args(args)
            .env("LD_LIBRARY_PATH", libs)
            .env("ASCEND_TRANSFER_TIMEOUT", TRANSFER_TIMEOUT_MS.to_string())
            .env("GLOG_minloglevel", "1")
            .env_remove("MC_FORCE_TCP")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("start the driver");
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
        Driver { child, lines, stdout: Vec::new(), stderr: Some(stderr) }
    }

    /// The next stdout line starting with `prefix` before `deadline` (other lines are kept for the report).
    fn line(&mut self, prefix: &str, deadline: Instant) -> Option<String> {
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let line = self.lines.recv_timeout(left).ok()?;
            self.stdout.push(line.clone());
            if line.starts_with(prefix) {
                return Some(line);
            }
        }
    }

    fn send(&mut self, line: &str) {
        let stdin: &mut ChildStdin = self.child.stdin.as_mut().expect("stdin");
        let _ = writeln!(stdin, "{line}");
        let _ = stdin.flush();
    }

    /// Waits for the exit (killed past `limit`): the status (None if killed) and everything it printed.
    fn finish(&mut self, limit: Duration) -> (Option<ExitStatus>, String) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + limit;
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
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.stdout.push(line);
        }
        let stderr = self.stderr.take().map(|handle| handle.join().unwrap_or_default()).unwrap_or_default();
        (status, format!("stdout:\n{}\nstderr:\n{stderr}", self.stdout.join("\n")))
    }

    fn report(&mut self) -> String {
        self.finish(Duration::from_secs(5)).1
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn evidence(line: &str) -> serde_json::Value {
    serde_json::from_str(line.strip_prefix("EVIDENCE ").expect("EVIDENCE <json>")).expect("evidence JSON")
}

fn count(evidence: &serde_json::Value, name: &str) -> u64 {
    evidence[name].as_u64().unwrap_or_else(|| panic!("no count {name} in {evidence}"))
}

/// Starts a target with `size` bytes; its READY line's segment name and address.
fn start_target(venv: &Path, libs: &Path, size: u64) -> (Driver, String, String) {
    let mut target = Driver::spawn(venv, libs, &["target", "7", &size.to_string()], &[]);
    let Some(ready) = target.line("READY", Instant::now() + Duration::from_secs(120)) else {
        panic!("the target was not ready within 120 s:\n{}", target.report());
    };
    let fields: Vec<String> = ready.split_whitespace().map(str::to_owned).collect();
    (target, fields[1].clone(), fields[2].clone())
}

#[test]
fn the_wheels_transfer_engine_moves_random_ranges_between_aclrtmalloc_buffers_of_two_processes_over_aiv() {
    let Some((venv, libs)) = inputs() else { return };
    let size: u64 = 16 << 20;
    let (mut target, name, addr) = start_target(&venv, &libs, size);
    target.send("SNAPSHOT");
    let Some(before) = target.line("EVIDENCE", Instant::now() + Duration::from_secs(30)) else {
        panic!("no evidence from the target:\n{}", target.report());
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let evidence_file = dir.path().join("initiator-evidence.json");
    let started = Instant::now();
    let mut initiator = Driver::spawn(
        &venv,
        &libs,
        &["initiator", &name, &addr, &size.to_string(), "7"],
        &[("AIV_ADXL_EVIDENCE_FILE", evidence_file.to_str().expect("UTF-8 path"))],
    );
    let (status, output) = initiator.finish(Duration::from_secs(180));
    assert!(status.is_some_and(|status| status.success()), "the initiator failed ({status:?}):\n{output}");
    let line = |prefix: &str| {
        initiator.stdout.iter().find(|line| line.starts_with(prefix)).cloned().unwrap_or_else(|| {
            panic!("the initiator printed no {prefix} line:\n{output}");
        })
    };
    let ops: u64 = line("OPS ")["OPS ".len()..].parse().expect("OPS <n>");
    let expect = line("EXPECT ")["EXPECT ".len()..].to_owned();
    let delta = evidence(&line("EVIDENCE "));
    eprintln!(
        "initiator: {ops} transfers in {:.1} s; twin evidence while they ran: {delta}",
        started.elapsed().as_secs_f64()
    );

    // The target's memory is what the initiator's model says, by hash, read back through its own runtime.
    target.send("SNAPSHOT");
    let after = target.line("EVIDENCE", Instant::now() + Duration::from_secs(30));
    target.send(&format!("CHECK {expect}"));
    let checked = target.line("CHECKED", Instant::now() + Duration::from_secs(60));
    target.send("QUIT");
    let (target_status, target_output) = target.finish(Duration::from_secs(60));
    assert_eq!(checked.as_deref(), Some("CHECKED ok"), "the target's memory differs:\n{target_output}");
    assert!(target_status.is_some_and(|s| s.success()), "the target failed ({target_status:?}):\n{target_output}");

    // The initiator's twin runtime while the transfers ran: every SQE written and every doorbell rung by the AIV
    // kernel, none by the Host or the AI CPU, and no Host runtime copy (the driver makes none in that window).
    assert_eq!(count(&delta, "provenance_recorded"), 1, "{delta}");
    let sqes = count(&delta, "sqes_executed");
    let doorbells = count(&delta, "doorbells_rung");
    assert!(sqes >= 1 && doorbells >= 1, "no SQE executed or no doorbell rung: {delta}");
    assert_eq!(count(&delta, "sqes_by_kernel"), sqes, "{delta}");
    assert_eq!(count(&delta, "doorbells_by_kernel"), doorbells, "{delta}");
    for name in [
        "sqes_by_host",
        "sqes_unknown",
        "sqes_by_aicpu",
        "doorbells_by_host",
        "doorbells_unknown",
        "doorbells_by_aicpu",
        "host_sync_copies",
        "host_stream_copies",
        "aicpu_kernels_launched",
        "adxl_transfers",
    ] {
        assert_eq!(count(&delta, name), 0, "{name}: {delta}");
    }
    // The target's runtime made no Host copy and submitted nothing while the initiator's kernel moved its bytes.
    let (before, after) = (evidence(&before), evidence(&after.expect("the target's second snapshot")));
    for name in ["host_sync_copies", "host_stream_copies", "sqes_by_host", "doorbells_by_host", "adxl_requests_served"]
    {
        assert_eq!(count(&after, name), count(&before, name), "target {name}: before {before}, after {after}");
    }
    // The engine's own evidence (the library's AIV_ADXL_EVIDENCE_FILE): every transfer recorded, no act by the Host.
    let engine: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&evidence_file).expect("the evidence file")).expect("JSON");
    assert_eq!(engine["transfers"].as_u64(), Some(ops), "{engine}");
    for act in ["descriptors_written", "doorbells_rung", "completion_seen"] {
        assert_eq!(engine[act]["by_host"].as_u64(), Some(0), "{act}: {engine}");
        assert!(engine[act]["by_aiv"].as_u64().is_some_and(|n| n >= ops), "{act}: {engine}");
    }
}

#[test]
fn a_target_killed_mid_batch_gives_mooncake_a_failed_status_within_the_transfer_timeout() {
    let Some((venv, libs)) = inputs() else { return };
    let size: u64 = 64 << 20;
    let (mut target, name, addr) = start_target(&venv, &libs, size);
    let mut initiator = Driver::spawn(&venv, &libs, &["killed", &name, &addr, &size.to_string()], &[]);
    let Some(_) = initiator.line("BATCH 0", Instant::now() + Duration::from_secs(120)) else {
        panic!("the initiator did not start:\n{}", initiator.report());
    };
    target.child.kill().expect("kill the target");
    let killed_at = Instant::now();
    let _ = target.child.wait();
    let (status, output) = initiator.finish(Duration::from_secs(120));
    assert!(status.is_some_and(|s| s.success()), "the initiator did not finish ({status:?}):\n{output}");
    let results: Vec<(u32, i64, u64)> = initiator
        .stdout
        .iter()
        .filter_map(|line| {
            let fields: Vec<&str> = line.strip_prefix("RESULT ")?.split_whitespace().collect();
            Some((fields[0].parse().ok()?, fields[1].parse().ok()?, fields[2].parse().ok()?))
        })
        .collect();
    let failed: Vec<&(u32, i64, u64)> = results.iter().filter(|(_, code, _)| *code != 0).collect();
    assert!(!failed.is_empty(), "no batch failed after the target was killed:\n{output}");
    // Every batch, the one in flight at the kill included, returned within the transfer timeout plus Mooncake's own
    // slack (its retry after refreshing the peer's metadata, its polling).
    let bound = TRANSFER_TIMEOUT_MS + 3000;
    assert!(results.iter().all(|(_, _, ms)| *ms <= bound), "a batch took longer than {bound} ms:\n{output}");
    // After the first failure the peer stays lost: the batch after it fails too.
    let first = failed[0].0;
    assert!(
        results.iter().filter(|(i, _, _)| *i > first).all(|(_, code, _)| *code != 0),
        "a batch after the failure succeeded:\n{output}"
    );
    assert!(output.contains("adxl-over-aiv: TransferSync"), "no log line of the library:\n{output}");
    let causes: Vec<&str> = output.lines().filter(|line| line.starts_with("adxl-over-aiv: ")).collect();
    eprintln!(
        "failed batches {failed:?} of {results:?}; all done {:.1} s after the kill; the library said:\n{}",
        killed_at.elapsed().as_secs_f64(),
        causes.join("\n")
    );
}

/// A `libascendcl.so` that is no usable runtime: only the functions the test program and the library call.
const STUB_ACL: &str = r#"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
int aclInit(const char *config) { (void)config; return 0; }
int aclrtSetDevice(int32_t device) { (void)device; return 0; }
int aclrtGetDevice(int32_t *device) { *device = 0; return 0; }
int aclrtMalloc(void **ptr, size_t size, int policy) { (void)policy; *ptr = malloc(size); return *ptr ? 0 : 1; }
int aclrtFree(void *ptr) { free(ptr); return 0; }
int aclrtMallocHost(void **ptr, size_t size) { *ptr = malloc(size); return *ptr ? 0 : 1; }
int aclrtFreeHost(void *ptr) { free(ptr); return 0; }
int aclrtMemcpy(void *dst, size_t max, const void *src, size_t count, int kind) {
    (void)kind;
    if (count > max) return 1;
    memcpy(dst, src, count);
    return 0;
}
"#;

/// The test program (host/capi/tests/cxx/adxl_over_aiv_test.cpp) compiled into `out`, linked with `acl_dir`'s
/// libascendcl.so and the library directory's libllm_datadist.so and libmetadef.so.
fn error_program(libs: &Path, acl_dir: &Path, out: &Path) -> PathBuf {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let program = out.join("adxl_over_aiv_test");
    let output = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&program)
        .arg(repo().join("host/capi/tests/cxx/adxl_over_aiv_test.cpp"))
        .arg(format!("-I{}", repo().join("shmem-bindings/cann-twin/cxx").display()))
        .arg(format!("-L{}", acl_dir.display()))
        .arg("-lascendcl")
        .arg(format!("-L{}", libs.display()))
        .args(["-lllm_datadist", "-lmetadef"])
        .arg(format!("-Wl,-rpath,{}:{}", acl_dir.display(), libs.display()))
        .output()
        .expect("run the C++ compiler");
    assert!(output.status.success(), "compiling the test program failed:\n{}", String::from_utf8_lossy(&output.stderr));
    program
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port()
}

/// Runs the test program's `case` (bounded), and returns its stderr (the library's log lines).
fn run_case(program: &Path, case: &str) -> String {
    let mut child = Command::new(program)
        .args([case, &free_port().to_string()])
        // The program's run path names its libraries; cargo's LD_LIBRARY_PATH (its target directory, where another
        // test may have built libaiv_transport.so without feature cann) would take precedence over it.
        .env_remove("LD_LIBRARY_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the test program");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    let _ = child.stdout.take().expect("stdout").read_to_string(&mut stdout);
    let _ = child.stderr.take().expect("stderr").read_to_string(&mut stderr);
    assert!(
        status.is_some_and(|s| s.success()) && stdout.contains(&format!("case {case} passed")),
        "case {case} failed ({status:?}):\n{stdout}\n{stderr}"
    );
    stderr
}

#[test]
fn every_failure_returns_adxls_code_with_one_log_line_and_an_unusable_runtime_fails_initialize() {
    let Some(libs) = library_dir() else { return };
    let dir = tempfile::tempdir().expect("temporary directory");
    let stub_dir = dir.path().join("stub");
    std::fs::create_dir_all(&stub_dir).expect("mkdir");
    std::fs::write(stub_dir.join("stub_acl.c"), STUB_ACL).expect("write the stub");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(&cc)
        .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(stub_dir.join("libascendcl.so"))
        .arg(stub_dir.join("stub_acl.c"))
        .output()
        .expect("run the C compiler");
    assert!(output.status.success(), "compiling the stub failed:\n{}", String::from_utf8_lossy(&output.stderr));

    let unusable = error_program(&libs, &stub_dir, &stub_dir);
    let log = run_case(&unusable, "unusable");
    // The engine could not open the loaded library as a device runtime: one line naming it and the cause.
    let initialize: Vec<&str> = log.lines().filter(|line| line.starts_with("adxl-over-aiv: Initialize: ")).collect();
    assert!(
        initialize.iter().any(|line| line.contains("not created") && line.contains("libascendcl.so")),
        "no Initialize line naming the runtime:\n{log}"
    );
    assert!(log.contains("adxl-over-aiv: Initialize: option EnableUseFabricMem=1"), "{log}");
    assert!(log.contains("adxl-over-aiv: FreeMem: "), "{log}");
    assert!(log.contains("adxl-over-aiv: RegisterMem: the engine is not initialized"), "{log}");

    let twin_dir = dir.path().join("twin");
    std::fs::create_dir_all(&twin_dir).expect("mkdir");
    let twin = error_program(&libs, &libs, &twin_dir);
    let log = run_case(&twin, "twin");
    for expected in [
        "adxl-over-aiv: RegisterMem: device memory",
        "adxl-over-aiv: TransferSync: 127.0.0.1:",
        "is not connected",
        "a range outside registered memory",
        "adxl-over-aiv: Connect: 127.0.0.1:1: ",
        "adxl-over-aiv: DeregisterMem: ",
    ] {
        assert!(log.contains(expected), "no line with {expected:?}:\n{log}");
    }
    // Every line of the library is one line with its prefix and a member.
    for line in log.lines().filter(|line| line.contains("adxl-over-aiv")) {
        assert!(line.starts_with("adxl-over-aiv: "), "{line}");
    }
}
