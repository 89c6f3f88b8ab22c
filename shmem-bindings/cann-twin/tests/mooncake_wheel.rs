//! Mooncake's real Ascend build (`mooncake-transfer-engine-npu`, unmodified) on the twin runtime, two processes.
//!
//! Runs when both variables are set (tests/run.sh sets them; without them the tests are skipped with a `SKIPPED` line,
//! tests/common/skip.rs, and fail under `CI=true`):
//!
//!     export AIV_TEST_MOONCAKE_NPU_VENV="$(tests/support/mooncake_npu.sh)"
//!     export AIV_TEST_TWIN_CANN_LIBS="$(tests/support/twin_cann_libs.sh)"
//!     cargo test -p cann-twin --test mooncake_wheel
//!
//! Each process runs `tests/support/mooncake_npu_twin.py` with the twin's `libascendcl.so`, `libllm_datadist.so`
//! and `libmetadef.so` on `LD_LIBRARY_PATH`: `aclInit` and `aclrtSetDevice(0)` as torch_npu would, device memory
//! from `aclrtMalloc`, `TransferEngine.initialize(.., "P2PHANDSHAKE", "ascend", "")`, `register_memory`, then the
//! initiator's reads, writes and batches against the target's memory, each verified, and out-of-bounds transfers
//! that must be refused. At the end the target compares its memory (read back through its runtime) with the
//! initiator's model of it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

#[path = "../../../tests/common/skip.rs"]
mod skip;

const TARGET_SIZE: usize = 8 << 20;

fn inputs() -> Option<(PathBuf, PathBuf)> {
    let venv = std::env::var_os("AIV_TEST_MOONCAKE_NPU_VENV").map(PathBuf::from);
    let libs = std::env::var_os("AIV_TEST_TWIN_CANN_LIBS").map(PathBuf::from);
    match (venv, libs) {
        (Some(venv), Some(libs)) => {
            assert!(venv.join("bin/python").exists(), "AIV_TEST_MOONCAKE_NPU_VENV={venv:?} has no bin/python");
            for file in ["libascendcl.so", "libllm_datadist.so", "libmetadef.so"] {
                assert!(libs.join(file).exists(), "AIV_TEST_TWIN_CANN_LIBS={libs:?} has no {file}");
            }
            Some((venv, libs))
        }
        _ => {
            skip::skip(
                "set AIV_TEST_MOONCAKE_NPU_VENV=\"$(tests/support/mooncake_npu.sh)\" and \
                 AIV_TEST_TWIN_CANN_LIBS=\"$(tests/support/twin_cann_libs.sh)\" to run Mooncake's Ascend wheel on \
                 the twin runtime (tests/run.sh does)",
            );
            None
        }
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/support/mooncake_npu_twin.py")
}

/// A child process killed when dropped, with its stdout lines on a channel and its stderr collected.
struct Peer {
    name: &'static str,
    child: Child,
    lines: Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

impl Peer {
    fn spawn(name: &'static str, venv: &Path, libs: &Path, args: &[String], env: &[(&str, &str)]) -> Peer {
        let library_path = match std::env::var_os("LD_LIBRARY_PATH") {
            Some(old) if !old.is_empty() => {
                let mut path = libs.as_os_str().to_owned();
                path.push(":");
                path.push(old);
                path
            }
            _ => libs.as_os_str().to_owned(),
        };
        let mut child = Command::new(venv.join("bin/python"))
            .arg(script())
            .args(args)
            .env("LD_LIBRARY_PATH", library_path)
            // Any value of MC_FORCE_TCP makes the wheel skip the Ascend transport.
            .env_remove("MC_FORCE_TCP")
            .env("PYTHONUNBUFFERED", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn python");
        let stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let (sender, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Peer { name, child, lines, stderr }
    }

    /// The next stdout line starting with `prefix`, within `limit`; `None` on timeout or end of output.
    fn line(&self, prefix: &str, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Some(line),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }

    fn send(&mut self, line: &str) {
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    /// Waits for exit within `limit` (killing the process after it) and returns success and its stderr.
    fn finish(mut self, limit: Duration) -> (bool, String) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                _ => break None,
            }
        };
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let stderr = std::mem::replace(&mut self.stderr, std::thread::spawn(String::new));
        let text = stderr.join().unwrap_or_default();
        (status.is_some_and(|status| status.success()), text)
    }

    fn fail(self, what: &str) -> ! {
        let name = self.name;
        let (_, stderr) = self.finish(Duration::from_secs(5));
        panic!("{what}\n--- {name} stderr ---\n{stderr}");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The wheel's Ascend transport picks its ADXL port at random in 20000-20099 by binding and closing a socket; pairs
/// run one at a time so that they do not race each other for one.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the target and the initiator with `env` (the wheel's `ASCEND_*` switches) and checks everything, including
/// that the initiator's log has `mode_log` (the wheel's own line saying it took the mode `env` asks for) and that its
/// ADXL selected `engine` (the twin's `libllm_datadist.so` logs the choice as the vendor's `LogSelectedEngine`).
fn run_pair(env: &[(&str, &str)], mode_log: &str, engine: &str) {
    let Some((venv, libs)) = inputs() else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let seed = std::process::id() % 100_000;
    let target_args = ["target".to_owned(), seed.to_string(), TARGET_SIZE.to_string()];
    let mut target = Peer::spawn("target", &venv, &libs, &target_args, env);
    let Some(ready) = target.line("READY ", Duration::from_secs(60)) else {
        target.fail("the target did not report READY within 60 s");
    };
    let words: Vec<&str> = ready.split_whitespace().collect();
    assert_eq!(words.len(), 4, "bad READY line {ready:?}");
    let mut args = ["initiator", words[1], words[2], words[3]].map(String::from).to_vec();
    args.push(seed.to_string());
    let initiator = Peer::spawn("initiator", &venv, &libs, &args, env);
    let expect = initiator.line("EXPECT ", Duration::from_secs(240));
    let (ok, initiator_stderr) = initiator.finish(Duration::from_secs(30));
    let Some(expect) = expect.filter(|_| ok) else {
        target.fail(&format!("the initiator failed\n--- initiator stderr ---\n{initiator_stderr}"));
    };
    let digest = expect.split_whitespace().nth(1).unwrap_or_default().to_owned();
    target.send(&format!("CHECK {digest}"));
    let checked = target.line("CHECKED ", Duration::from_secs(30));
    if checked.as_deref() != Some("CHECKED ok") {
        target.fail(&format!("the target's memory is not what the initiator wrote: {checked:?}"));
    }
    target.send("QUIT");
    let (ok, stderr) = target.finish(Duration::from_secs(30));
    assert!(ok, "the target did not exit cleanly\n--- target stderr ---\n{stderr}");
    for (side, text) in [("initiator", &initiator_stderr), ("target", &stderr)] {
        assert!(!text.contains("Traceback"), "{side} raised\n{text}");
    }
    assert!(initiator_stderr.contains(mode_log), "the initiator's log lacks {mode_log:?}\n{initiator_stderr}");
    if engine == "hixl_cs" {
        assert!(
            initiator_stderr.contains(CLIENT_SERVER),
            "the wheel did not ask for client-server\n{initiator_stderr}"
        );
    }
    let selected = format!("adxl-twin: selected engine:{engine},");
    assert!(initiator_stderr.contains(&selected), "the initiator's ADXL did not select {engine}\n{initiator_stderr}");
    // Refused by the engine's check of the registrations (the client-server engine's HiXL client holds the server's
    // list from its connect, FabricMem its imports), not by a bound of the twin's memory.
    assert!(
        initiator_stderr.contains("a range outside the registered memory"),
        "the out-of-bounds transfers were not refused by the engine's check\n{initiator_stderr}"
    );
}

/// The wheel's log line when `CLIENT_SERVER_COMM` is reported (the twin's `GetCapability` answers 1, as the vendor's).
const CLIENT_SERVER: &str = "Client-Server mode enabled, set LocalCommRes to {\"version\":\"1.3\"}";

/// The default: synchronous transfers, auto-connect on (what vLLM-Ascend gets); the capability reported, so the
/// wheel passes `LocalCommRes` 1.3 and ADXL runs the client-server engine (HiXL's, on the twin's AI CPU).
#[test]
fn two_processes_move_verified_data_through_adxl_on_the_twin() {
    run_pair(&[], "Set AutoConnect to: 1", "hixl_cs");
}

/// `ASCEND_USE_ASYNC_TRANSFER`: `TransferAsync` and `GetTransferStatus` polled by Mooncake's query thread.
#[test]
fn async_transfers_move_verified_data_on_the_twin() {
    run_pair(&[("ASCEND_USE_ASYNC_TRANSFER", "1")], "Use async transfer", "hixl_cs");
}

/// `ASCEND_AUTO_CONNECT=0`: Mooncake calls `Connect` once per peer before transferring.
#[test]
fn explicit_connect_moves_verified_data_on_the_twin() {
    run_pair(&[("ASCEND_AUTO_CONNECT", "0")], "Set AutoConnect to: 0", "hixl_cs");
}

/// `ASCEND_GLOBAL_RESOURCE_CONFIG` with a `fabric_memory` key: the wheel passes `EnableUseFabricMem=1`, which wins
/// over `LocalCommRes`: FabricMem, AI-CPU unfold (the default).
#[test]
fn fabric_mem_moves_verified_data_on_the_twin() {
    let config = r#"{"fabric_memory":{"enable_aicpu_unfold":true}}"#;
    run_pair(
        &[("ASCEND_GLOBAL_RESOURCE_CONFIG", config)],
        "fabric mem enabled via ASCEND_GLOBAL_RESOURCE_CONFIG",
        "fabric_mem",
    );
}
