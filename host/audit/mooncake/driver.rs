//! One driver process of a Mooncake path: the wheel's Python running `driver.py` (embedded, run with `python -c`)
//! with the path's library directory first on `LD_LIBRARY_PATH`, spoken to in line-oriented JSON on stdin and stdout.
//! Owns the process's life (started with the path's environment, killed and reaped at the end or at the first
//! failure, never left behind), the threads that write its requests and read its answers and log (so that a process
//! that stops reading or writing cannot block the audit), and the deadline every answer is awaited with.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::MooncakeSetup;

/// The driver, embedded so that `aiv audit` runs it from any directory.
pub(super) const DRIVER: &str = include_str!("driver.py");

/// The last lines a process wrote to stderr (its log), for failure reasons, and the ADXL engine its
/// `libllm_datadist.so` logged it selected.
type Tail = Arc<Mutex<(VecDeque<String>, Option<String>)>>;

/// How the twin's `libllm_datadist.so` logs the engine it selected (`cxx/adxl_engine.cpp`).
const SELECTED_ENGINE: &str = "adxl-twin: selected engine:";

/// One driver process: requests written by a thread of its own (a process that stops reading cannot block the
/// audit), answers read by another, each awaited with a deadline.
pub(super) struct Driver {
    /// The path's name, for failure reasons.
    path: &'static str,
    role: &'static str,
    pub(super) child: Child,
    requests: Option<mpsc::Sender<String>>,
    answers: mpsc::Receiver<String>,
    tail: Tail,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Driver {
    pub(super) fn spawn(setup: &MooncakeSetup, role: &'static str) -> std::result::Result<Driver, String> {
        let path = setup.variant.path();
        let library_path = match std::env::var_os("LD_LIBRARY_PATH") {
            Some(old) if !old.is_empty() => {
                let mut path = setup.libs.clone().into_os_string();
                path.push(":");
                path.push(old);
                path
            }
            _ => setup.libs.clone().into_os_string(),
        };
        let mut command = Command::new(setup.venv.join("bin/python"));
        command
            .arg("-c")
            .arg(DRIVER)
            .arg(role)
            .env("LD_LIBRARY_PATH", library_path)
            // Any value of MC_FORCE_TCP makes the wheel skip the Ascend transport (docs/mooncake-npu-wheel.md 8).
            .env_remove("MC_FORCE_TCP")
            // FabricMem only as the audit asks (ASCEND_ENABLE_USE_FABRIC_MEM is read for a Store's engine only).
            .env_remove("ASCEND_ENABLE_USE_FABRIC_MEM")
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1");
        match &setup.global_resource_config {
            Some(config) => command.env("ASCEND_GLOBAL_RESOURCE_CONFIG", config),
            None => command.env_remove("ASCEND_GLOBAL_RESOURCE_CONFIG"),
        };
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{path} {role}: cannot start {}: {e}", setup.venv.join("bin/python").display()))?;
        let (stdin, stdout, stderr) = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{path} {role}: the process has no pipes"));
            }
        };
        let (request_tx, request_rx) = mpsc::channel::<String>();
        let (answer_tx, answers) = mpsc::channel::<String>();
        let tail: Tail = Arc::new(Mutex::new((VecDeque::new(), None)));
        let mut threads = Vec::new();
        let spawn = |name: &str, body: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(body).map_err(|e| format!("{path}: thread: {e}"))
        };
        threads.push(spawn("aiv-mooncake-in", Box::new(move || write_requests(stdin, request_rx)))?);
        threads.push(spawn(
            "aiv-mooncake-out",
            Box::new(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if answer_tx.send(line).is_err() {
                        break;
                    }
                }
            }),
        )?);
        let log = Arc::clone(&tail);
        threads.push(spawn("aiv-mooncake-err", Box::new(move || keep_tail(stderr, &log)))?);
        Ok(Driver { path, role, child, requests: Some(request_tx), answers, tail, threads })
    }

    /// Sends `request` and waits at most `within` for its answer; an error (no answer, a closed pipe, an answer
    /// that is not JSON, `ok: false`) names the command and, for a dead or hung process, its last log lines.
    pub(super) fn call(&mut self, request: Value, within: Duration) -> std::result::Result<Value, String> {
        let command = request.get("cmd").and_then(Value::as_str).unwrap_or("?").to_owned();
        let sent = self.requests.as_ref().is_some_and(|tx| tx.send(request.to_string()).is_ok());
        if !sent {
            return Err(self.lost(&command, "its input is closed"));
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.answers.recv_timeout(left) {
                Ok(line) => {
                    // The wheel or Python may print other lines on stdout: only a JSON object is an answer.
                    let Ok(answer) = serde_json::from_str::<Value>(&line) else { continue };
                    if !answer.is_object() {
                        continue;
                    }
                    if answer.get("ok").and_then(Value::as_bool) == Some(true) {
                        return Ok(answer);
                    }
                    let error = answer.get("error").and_then(Value::as_str).unwrap_or("no reason given");
                    return Err(format!("{} {}: `{command}` failed: {error}", self.path, self.role));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(self.lost(&command, &format!("no answer within {:.1} s; killed", within.as_secs_f64())));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Its stdout closed: give it a moment to exit, so that the status can be named.
                    let mut status = None;
                    for _ in 0..50 {
                        if let Ok(Some(s)) = self.child.try_wait() {
                            status = Some(s);
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let how = status.map_or("closed its output".to_owned(), |s| format!("exited ({s})"));
                    return Err(self.lost(&command, &how));
                }
            }
        }
    }

    /// The engine its ADXL logged it selected, if it did.
    pub(super) fn selected_engine(&self) -> Option<String> {
        self.tail.lock().ok().and_then(|tail| tail.1.clone())
    }

    /// Kills the process and describes its end.
    fn lost(&mut self, command: &str, how: &str) -> String {
        self.kill();
        let tail = self.tail.lock().map(|t| t.0.iter().cloned().collect::<Vec<_>>().join(" | ")).unwrap_or_default();
        let log = if tail.is_empty() { String::new() } else { format!("; its last log lines: {tail}") };
        format!("{} {} process during `{command}`: {how}{log}", self.path, self.role)
    }

    fn kill(&mut self) {
        self.requests = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asks the process to quit (2 s), then kills and reaps it and joins its pipe threads, which end with the
    /// pipes; a pipe still held open (by a process it started) leaves its thread detached after 1 s.
    pub(super) fn stop(mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.call(json!({"cmd": "quit"}), Duration::from_secs(2));
        }
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        for thread in self.threads.drain(..).filter(|t| t.is_finished()) {
            let _ = thread.join();
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Never left behind, whatever path the audit took.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_requests(mut stdin: ChildStdin, requests: mpsc::Receiver<String>) {
    for mut line in requests {
        line.push('\n');
        if stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush()).is_err() {
            break;
        }
    }
}

fn keep_tail(stderr: impl Read, tail: &Tail) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        if let Ok(mut tail) = tail.lock() {
            let (lines, engine) = &mut *tail;
            if let Some(at) = line.find(SELECTED_ENGINE) {
                let selected = line[at + SELECTED_ENGINE.len()..].split(", local_engine:").next().unwrap_or_default();
                *engine = Some(selected.chars().take(200).collect());
            }
            if lines.len() == 6 {
                lines.pop_front();
            }
            lines.push_back(line.chars().take(300).collect());
        }
    }
}
