//! The audit's `mooncake-ascend` path: Mooncake's own Ascend Direct, the unmodified `mooncake-transfer-engine-npu`
//! wheel, in two processes of its own (target and initiator) on the twin runtime's CANN libraries, driven by the
//! Python script `mooncake_driver.py` (embedded, run with `python -c`) over line-oriented JSON on stdin and stdout.
//!
//! Owns: finding the wheel's virtualenv and the twin's libraries ([`discover`]), the two driver processes (started
//! once per audit, every answer awaited with a deadline, killed and reaped at the end or at the first failure), one
//! cell per workload and round with the same requests as the engine paths (built here: `bench::run_initiator`'s
//! layout, or [`super::kv`]'s lists), the data check, and the verdict from the twin runtime's counts in those
//! processes ([`tally_from_counts`]). docs/audit.md, "The mooncake-ascend path".

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cann_twin::evidence::CannTwinEvidenceV2;
use serde_json::{json, Value};

use super::kv;
use super::options::AuditOptions;
use super::report::{self, DataCheck, FailedCell, MooncakeRecord, RoundResult, Shape, SkippedWorkload, Workload};
use crate::config::DeviceBackendKind;
use crate::evidence::{Act, ActTotals, EvidenceTally, RuntimeKind, RuntimeLabel, Source};
use crate::transfer::{Opcode, Protocol, SegmentId};

/// The path's name in reports and in `--paths`.
pub const PATH: &str = "mooncake-ascend";

/// Requests of 1 MiB in the `killed_peer` fault round's batch.
const BIG_BATCH: u64 = 2048;

/// The driver, embedded so that `aiv audit` runs it from any directory.
const DRIVER: &str = include_str!("mooncake_driver.py");

/// Where the wheel and the twin's libraries are.
#[derive(Clone, Debug)]
pub struct MooncakeSetup {
    /// The virtualenv holding `mooncake-transfer-engine-npu` (its `bin/python` runs the driver).
    pub venv: PathBuf,
    /// The directory with the twin's `libascendcl.so`, `libllm_datadist.so` and `libmetadef.so`.
    pub libs: PathBuf,
    /// How long past a command's own duration an answer may take before the process counts as hung (45 s: the
    /// wheel's transfer timeout is 10 s per batch, its import and start a few seconds).
    pub reply_margin: Duration,
    /// `ASCEND_GLOBAL_RESOURCE_CONFIG` for both processes (`None`: removed from their environment, so the wheel runs
    /// with its defaults). A `fabric_memory` key in it makes the wheel pass `EnableUseFabricMem=1` and the JSON as
    /// `GlobalResourceConfig` (`kvcache-ai/Mooncake` `mooncake-transfer-engine/src/transport/ascend_transport/
    /// ascend_direct_transport/ascend_direct_transport.cpp`, `utils.cpp`), which selects FabricMem;
    /// `fabric_memory.enable_aicpu_unfold` false its Host unfold.
    pub global_resource_config: Option<String>,
}

/// How to install what the path needs, for skip reasons.
pub const INSTALL_HINT: &str = "install them with `AIV_MOONCAKE_NPU_VENV=$PWD/target/mooncake-npu-venv bash \
     tests/support/mooncake_npu.sh` and `AIV_MOONCAKE_NPU_VENV=$PWD/target/mooncake-npu-venv bash \
     tests/support/twin_cann_libs.sh` (the defaults --mooncake-npu-venv target/mooncake-npu-venv and \
     --twin-cann-libs target/twin-cann-libs), or name them with --mooncake-npu-venv and --twin-cann-libs";

/// The reason under "Not run" when nobody asked for the path (the library's default; `aiv audit` looks for it).
pub const NOT_CONFIGURED: &str = "Mooncake's own Ascend Direct (the mooncake-transfer-engine-npu wheel on the twin \
     runtime) was not configured: the audit needs its virtualenv and the twin's CANN libraries";

/// What the report's layout sentence adds when the path runs.
pub const LAYOUT: &str = "; mooncake-ascend runs Mooncake's own wheel in two processes of its own (Python, target and \
     initiator, each its own copy of the twin runtime, device 0), between two device buffers of the same size, with \
     the same request lists sent to its initiator, in the same rounds";

/// The three libraries the wheel links (docs/mooncake-npu-wheel.md section 2).
const CANN_LIBRARIES: [&str; 3] = ["libascendcl.so", "libllm_datadist.so", "libmetadef.so"];

/// Finds the wheel's virtualenv and the twin's libraries: the given directories, else `target/mooncake-npu-venv`
/// and `target/twin-cann-libs` under the current directory. The error is the reason the path is skipped.
pub fn discover(
    venv: Option<PathBuf>,
    libs: Option<PathBuf>,
    backend: DeviceBackendKind,
) -> std::result::Result<MooncakeSetup, String> {
    if backend != DeviceBackendKind::Twin {
        return Err("runs only on the twin device backend: on `cann` the other paths use the vendor's runtime, \
                    while the Mooncake processes would load the twin's libraries, so the two would not share a \
                    device model"
            .into());
    }
    let venv = venv.unwrap_or_else(|| PathBuf::from("target/mooncake-npu-venv"));
    let libs = libs.unwrap_or_else(|| PathBuf::from("target/twin-cann-libs"));
    let python = venv.join("bin/python");
    if !python.exists() {
        return Err(format!(
            "no virtualenv with Mooncake's Ascend wheel at {} (no bin/python): {INSTALL_HINT}",
            venv.display()
        ));
    }
    if !has_wheel(&venv) {
        return Err(format!(
            "the virtualenv {} has no mooncake/engine.so (mooncake-transfer-engine-npu is not installed): {INSTALL_HINT}",
            venv.display()
        ));
    }
    if let Some(missing) = CANN_LIBRARIES.iter().find(|name| !libs.join(name).exists()) {
        return Err(format!("no {missing} in {} (the twin runtime's CANN libraries): {INSTALL_HINT}", libs.display()));
    }
    let absolute = |path: PathBuf| std::path::absolute(&path).unwrap_or(path);
    Ok(MooncakeSetup {
        venv: absolute(venv),
        libs: absolute(libs),
        reply_margin: Duration::from_secs(45),
        global_resource_config: None,
    })
}

/// Whether `venv/lib/python*/site-packages/mooncake/engine.so` exists.
fn has_wheel(venv: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(venv.join("lib")) else { return false };
    entries.flatten().any(|entry| {
        entry.file_name().to_string_lossy().starts_with("python")
            && entry.path().join("site-packages/mooncake/engine.so").exists()
    })
}

/// The first round's order of the engine paths with the Mooncake path appended, rotated left by `round`: the
/// engine paths in their order and the Mooncake path's place among them (`None`: not audited).
pub fn round_order_with(paths: &[Protocol], mooncake: bool, round: usize) -> (Vec<Protocol>, Option<usize>) {
    if !mooncake {
        return (super::options::round_order(paths, round), None);
    }
    let mut all: Vec<Option<Protocol>> = paths.iter().copied().map(Some).chain([None]).collect();
    let by = round % all.len();
    all.rotate_left(by);
    let at = all.iter().position(Option::is_none);
    (all.into_iter().flatten().collect(), at)
}

/// The last lines a process wrote to stderr (its log), for failure reasons, and the ADXL engine its
/// `libllm_datadist.so` logged it selected.
type Tail = Arc<Mutex<(VecDeque<String>, Option<String>)>>;

/// How the twin's `libllm_datadist.so` logs the engine it selected (`cxx/adxl_engine.cpp`).
const SELECTED_ENGINE: &str = "adxl-twin: selected engine:";

/// One driver process: requests written by a thread of its own (a process that stops reading cannot block the
/// audit), answers read by another, each awaited with a deadline.
struct Driver {
    role: &'static str,
    child: Child,
    requests: Option<mpsc::Sender<String>>,
    answers: mpsc::Receiver<String>,
    tail: Tail,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Driver {
    fn spawn(setup: &MooncakeSetup, role: &'static str) -> std::result::Result<Driver, String> {
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
            .map_err(|e| format!("{PATH} {role}: cannot start {}: {e}", setup.venv.join("bin/python").display()))?;
        let (stdin, stdout, stderr) = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{PATH} {role}: the process has no pipes"));
            }
        };
        let (request_tx, request_rx) = mpsc::channel::<String>();
        let (answer_tx, answers) = mpsc::channel::<String>();
        let tail: Tail = Arc::new(Mutex::new((VecDeque::new(), None)));
        let mut threads = Vec::new();
        let spawn = |name: &str, body: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(body).map_err(|e| format!("{PATH}: thread: {e}"))
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
        Ok(Driver { role, child, requests: Some(request_tx), answers, tail, threads })
    }

    /// Sends `request` and waits at most `within` for its answer; an error (no answer, a closed pipe, an answer
    /// that is not JSON, `ok: false`) names the command and, for a dead or hung process, its last log lines.
    fn call(&mut self, request: Value, within: Duration) -> std::result::Result<Value, String> {
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
                    return Err(format!("{PATH} {}: `{command}` failed: {error}", self.role));
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
    fn selected_engine(&self) -> Option<String> {
        self.tail.lock().ok().and_then(|tail| tail.1.clone())
    }

    /// Kills the process and describes its end.
    fn lost(&mut self, command: &str, how: &str) -> String {
        self.kill();
        let tail = self.tail.lock().map(|t| t.0.iter().cloned().collect::<Vec<_>>().join(" | ")).unwrap_or_default();
        let log = if tail.is_empty() { String::new() } else { format!("; its last log lines: {tail}") };
        format!("{PATH} {} process during `{command}`: {how}{log}", self.role)
    }

    fn kill(&mut self) {
        self.requests = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asks the process to quit (2 s), then kills and reaps it and joins its pipe threads, which end with the
    /// pipes; a pipe still held open (by a process it started) leaves its thread detached after 1 s.
    fn stop(mut self) {
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

/// The twin runtime's counts (`cannTwinEvidence` version 2), in its one definition,
/// [`cann_twin::evidence::CannTwinEvidenceV2`]: the driver gets the names of its counts (in layout order), the version
/// and the size from [`evidence_spec`] and builds its ctypes structure from them, then sends the counts by name. A
/// count the driver does not send is 0.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TwinCounts(pub CannTwinEvidenceV2);

/// What the driver needs to read the counts: `{"version": 2, "size": <bytes>, "counts": [<name>, ...]}`.
pub fn evidence_spec() -> Value {
    json!({
        "version": cann_twin::evidence::EVIDENCE_VERSION,
        "size": std::mem::size_of::<CannTwinEvidenceV2>(),
        "counts": CannTwinEvidenceV2::count_names().collect::<Vec<_>>(),
    })
}

impl TwinCounts {
    /// The counts a JSON object names (others 0); `None` for anything but an object.
    pub fn from_json(value: &Value) -> Option<TwinCounts> {
        let object = value.as_object()?;
        let mut counts = CannTwinEvidenceV2::default();
        for name in CannTwinEvidenceV2::count_names() {
            if let (Some(slot), Some(count)) = (counts.count_mut(name), object.get(name).and_then(Value::as_u64)) {
                *slot = count;
            }
        }
        Some(TwinCounts(counts))
    }

    fn get(&self, name: &str) -> u64 {
        self.0.count(name).unwrap_or(0)
    }

    /// Sets every count from `value(name)`.
    fn from_fn(value: impl Fn(&'static str) -> u64) -> TwinCounts {
        let mut counts = CannTwinEvidenceV2::default();
        for name in CannTwinEvidenceV2::count_names() {
            if let Some(slot) = counts.count_mut(name) {
                *slot = value(name);
            }
        }
        TwinCounts(counts)
    }

    /// `after - before`, count by count (the state counts: recorded only if both were, the larger channel count).
    fn delta(after: &TwinCounts, before: &TwinCounts) -> TwinCounts {
        TwinCounts::from_fn(|name| match name {
            "provenance_recorded" => after.get(name).min(before.get(name)),
            "sdma_channels" => after.get(name).max(before.get(name)),
            _ => after.get(name).saturating_sub(before.get(name)),
        })
    }

    /// Adds `other` (another cell or the other process); state counts: recorded only if both were, channels summed.
    fn add(&mut self, other: &TwinCounts) {
        let empty = self == &TwinCounts::default();
        let sum = TwinCounts::from_fn(|name| match name {
            "provenance_recorded" if empty => other.get(name),
            "provenance_recorded" => self.get(name).min(other.get(name)),
            _ => self.get(name).saturating_add(other.get(name)),
        });
        *self = sum;
    }

    fn as_map(&self) -> BTreeMap<String, u64> {
        CannTwinEvidenceV2::count_names().map(|name| (name.to_owned(), self.get(name))).collect()
    }
}

/// The acts of `transfers` transfers from the twin runtime's counts in the Mooncake processes (`None`: the runtime
/// has no evidence function, so nothing is observable), by the rules of docs/evidence.md:
///
/// - descriptors: SQEs the SDMA engines executed, by their writer (kernel blocks, the AI CPU, the Host,
///   unattributed), plus every copy the Host submitted to the runtime (synchronous and stream copies, each the Host's
///   descriptor);
/// - doorbells: accepted doorbell writes by their ringer, plus each Host copy submission (its own start);
/// - completion: flags first seen by a kernel, the AI CPU or the Host, plus each synchronous copy's return and each
///   stream synchronisation (the Host learning of completion);
/// - Host launches: the kernels and AI-CPU kernels the Host launched (`host_launches`, not an act of submission).
///
/// The ADXL calls the twin's library counts (`adxl_transfers`, `adxl_descs`, `adxl_requests_served`) are context,
/// not acts: what a call leads to is what the runtime saw done for it (AI-CPU SQEs for the client-server engine, Host
/// copies for the TCP stand-in). The runtime counts the twin HiXL's upload of a batch's list and its Host-flag copy
/// with the AI-CPU launches they belong to, not among the Host's copies.
///
/// The SDMA attributions are observed when the provenance records were on, or when no engine executed anything
/// (then there is nothing to attribute: the counts are exactly zero); otherwise that act is not recorded and its
/// check is unknown.
pub fn tally_from_counts(counts: Option<&TwinCounts>, transfers: u64, runtime: Option<&str>) -> EvidenceTally {
    let mut tally = EvidenceTally { transfers, ..EvidenceTally::default() };
    tally.runtime = runtime.map(|version| RuntimeLabel::new(RuntimeKind::Twin, version));
    let totals = |act: Act| ActTotals {
        sources: vec![act.source],
        by_aiv: act.by_aiv as f64,
        aiv_blocks: None,
        by_aicpu: act.by_aicpu as f64,
        by_host: act.by_host as f64,
        unattributed: act.unattributed as f64,
    };
    let Some(TwinCounts(c)) = counts else {
        let hidden = totals(Act::unknown(Source::NotObservable));
        tally.descriptors_written = hidden.clone();
        tally.doorbells_rung = hidden.clone();
        tally.completion_seen = hidden;
        tally.per_transfer.iter_mut().for_each(|counts| counts.unknown = transfers);
        return tally;
    };
    let b = &c.base;
    let recorded = b.provenance_recorded > 0;
    let source = |engine_acts: u64| if recorded || engine_acts == 0 { Source::TwinModel } else { Source::NotRecorded };
    let host_copies = b.host_sync_copies.saturating_add(b.host_stream_copies);
    let act = |source: Source, by_aiv: u64, by_aicpu: u64, by_host: u64, unattributed: u64| {
        if source.is_observed() {
            Act { source, by_aiv, aiv_blocks: None, by_aicpu, by_host, unattributed }
        } else {
            Act::unknown(source)
        }
    };
    tally.descriptors_written = totals(act(
        source(b.sqes_executed),
        b.sqes_by_kernel,
        c.sqes_by_aicpu,
        b.sqes_by_host.saturating_add(host_copies),
        b.sqes_unknown,
    ));
    tally.doorbells_rung = totals(act(
        source(b.doorbells_rung),
        b.doorbells_by_kernel,
        c.doorbells_by_aicpu,
        b.doorbells_by_host.saturating_add(host_copies),
        b.doorbells_unknown,
    ));
    let landed = b.flags_landed;
    let seen = b.flags_seen_by_kernel.saturating_add(b.flags_seen_by_host).saturating_add(c.flags_seen_by_aicpu);
    tally.completion_seen = totals(act(
        source(landed),
        b.flags_seen_by_kernel,
        c.flags_seen_by_aicpu,
        b.flags_seen_by_host.saturating_add(b.host_sync_copies).saturating_add(b.host_stream_syncs),
        landed.saturating_sub(seen),
    ));
    tally.host_launches = b.kernels_launched.saturating_add(c.aicpu_kernels_launched) as f64;
    // No record per transfer: the counts are whole-process deltas, so every transfer's own checks are unknown.
    tally.per_transfer.iter_mut().for_each(|counts| counts.unknown = transfers);
    tally
}

/// One process's snapshot: its Host CPU, its device model's CPU, its twin counts.
#[derive(Clone, Debug, Default)]
struct Snapshot {
    host_cpu_ns: u64,
    device_model_cpu_ns: u64,
    evidence: Option<TwinCounts>,
}

fn snapshot_of(value: Option<&Value>) -> Snapshot {
    let Some(value) = value else { return Snapshot::default() };
    Snapshot {
        host_cpu_ns: value.get("host_cpu_ns").and_then(Value::as_u64).unwrap_or(0),
        device_model_cpu_ns: value.get("device_model_cpu_ns").and_then(Value::as_u64).unwrap_or(0),
        evidence: value.get("evidence").and_then(TwinCounts::from_json),
    }
}

/// What one cell measured.
pub(crate) struct Cell {
    pub result: RoundResult,
    pub latencies: Vec<u64>,
    pub first_failure: Option<String>,
}

/// The two processes and what they saw, for the whole audit.
pub(crate) struct Session {
    target: Option<Driver>,
    initiator: Option<Driver>,
    peer: String,
    remote: u64,
    size: u64,
    margin: Duration,
    /// The first failure that ended the processes: every later cell fails with it at once.
    failure: Option<String>,
    /// The first failure any cell saw (a failed batch's reason, or the cell's own failure), for the verdict.
    first_failure: Option<String>,
    counts: Option<TwinCounts>,
    counts_observable: bool,
    transfers: u64,
    pub record: MooncakeRecord,
    /// Time each side took to register its buffer with its engine.
    pub registration: Option<report::Registration>,
}

impl Session {
    /// Starts both processes with buffers of `size` bytes; a failure is kept, and every cell then fails with it.
    pub fn start(setup: &MooncakeSetup, size: u64) -> Session {
        let mut session = Session {
            target: None,
            initiator: None,
            peer: String::new(),
            remote: 0,
            size,
            margin: setup.reply_margin,
            failure: None,
            first_failure: None,
            counts: None,
            counts_observable: true,
            transfers: 0,
            record: MooncakeRecord {
                caveats: caveats(),
                global_resource_config: setup.global_resource_config.clone(),
                ..MooncakeRecord::default()
            },
            registration: None,
        };
        if let Err(reason) = session.open(setup) {
            session.fail(reason);
        }
        session
    }

    fn open(&mut self, setup: &MooncakeSetup) -> std::result::Result<(), String> {
        let start = self.margin.max(Duration::from_secs(10)) + bulk_time(self.size);
        let mut target = Driver::spawn(setup, "target")?;
        let evidence = evidence_spec();
        let init = |fill: u8| json!({"cmd": "init", "size": self.size, "fill": fill, "evidence": evidence});
        let answer = target.call(init(0x5A), start);
        self.target = Some(target);
        let target_init = answer?;
        let mut initiator = Driver::spawn(setup, "initiator")?;
        let answer = initiator.call(init(0xA5), start);
        self.initiator = Some(initiator);
        let initiator_init = answer?;
        self.peer = target_init.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
        self.remote = target_init.get("addr").and_then(Value::as_u64).unwrap_or(0);
        if self.peer.is_empty() || self.remote == 0 {
            return Err(format!("{PATH} target: its init answer has no name or address: {target_init}"));
        }
        // The wheel connects on the first transfer (auto-connect): before the first cell, as the engine paths open
        // their segment before theirs.
        let peer = json!({"cmd": "connect", "peer": self.peer, "remote": self.remote});
        self.initiator.as_mut().map_or(Ok(json!({})), |initiator| initiator.call(peer, self.margin))?;
        self.record.engine = self.initiator.as_ref().and_then(Driver::selected_engine);
        let text = |key: &str| initiator_init.get(key).and_then(Value::as_str).map(str::to_owned);
        self.record.wheel = text("wheel");
        self.record.python = text("python");
        self.record.runtime = text("runtime");
        let seconds = |v: &Value| v.get("register_s").and_then(Value::as_f64).unwrap_or(0.0);
        let took = Duration::from_secs_f64((seconds(&target_init) + seconds(&initiator_init)).max(0.0));
        self.registration = Some(report::Registration::new(&format!("{PATH} device"), 2 * self.size, took));
        Ok(())
    }

    fn fail(&mut self, reason: String) {
        if self.failure.is_none() {
            self.failure = Some(reason);
        }
        for driver in [self.target.take(), self.initiator.take()].into_iter().flatten() {
            driver.stop();
        }
    }

    fn drivers(&mut self) -> std::result::Result<(&mut Driver, &mut Driver), String> {
        if let Some(failure) = &self.failure {
            return Err(format!("not run: the Mooncake processes ended earlier ({failure})"));
        }
        match (self.target.as_mut(), self.initiator.as_mut()) {
            (Some(t), Some(i)) => Ok((t, i)),
            _ => Err(format!("{PATH}: the processes are not running")),
        }
    }

    /// Why `workload` does not run on this path, if it does not.
    pub fn unsupported(workload: &Workload) -> Option<String> {
        if workload.threads > 64 {
            return Some("more than 64 initiator threads".into());
        }
        None
    }

    /// One cell: `workload` for `options.cell`, the same requests the engine paths move. A failure of the cell
    /// (an error, not failed batches) is returned as its reason; a dead or hung process also ends the session.
    pub fn cell(
        &mut self,
        options: &AuditOptions,
        workload: &Workload,
        round: usize,
        slot: usize,
    ) -> std::result::Result<Cell, String> {
        let seconds = options.cell.as_secs_f64();
        let request = match &workload.shape {
            Some(Shape::KvLayerwise { cache, compute_us }) => {
                let requests: Vec<Vec<Value>> = kv::layerwise(cache, offsets_only())
                    .into_iter()
                    .map(|layers| layers.iter().map(|batch| batch_json(batch)).collect())
                    .collect();
                json!({"cmd": "layerwise", "peer": self.peer, "remote": self.remote, "requests": requests,
                       "compute_us": compute_us, "seconds": seconds})
            }
            shape => {
                let lists: Vec<Vec<Value>> = match shape {
                    None => bench_lists(options.operation, workload),
                    Some(shape) => {
                        vec![kv::batches(shape, options.operation, offsets_only())
                            .iter()
                            .map(|b| batch_json(b))
                            .collect()]
                    }
                };
                json!({"cmd": "run", "peer": self.peer, "remote": self.remote, "lists": lists, "seconds": seconds})
            }
        };
        let within = options.cell + self.margin;
        let margin = self.margin;
        let (target, initiator) = self.drivers()?;
        let outcome = (|| {
            let before = target.call(json!({"cmd": "snapshot"}), margin)?;
            let run = initiator.call(request, within)?;
            let after = target.call(json!({"cmd": "snapshot"}), margin)?;
            Ok::<_, String>((before, run, after))
        })();
        let (target_before, run, target_after) = match outcome {
            Ok(answers) => answers,
            Err(reason) => {
                self.fail(reason.clone());
                return Err(reason);
            }
        };
        let (t0, t1) = (snapshot_of(Some(&target_before)), snapshot_of(Some(&target_after)));
        let (i0, i1) = (snapshot_of(run.get("before")), snapshot_of(run.get("after")));
        let number = |key: &str| run.get(key).and_then(Value::as_u64).unwrap_or(0);
        let (wall_ns, batches, failed, transfers, bytes) =
            (number("wall_ns"), number("batches"), number("failed_batches"), number("transfers"), number("bytes"));
        let latencies: Vec<u64> = run
            .get("latencies_ns")
            .and_then(Value::as_array)
            .map(|values| values.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let host_cpu = i1.host_cpu_ns.saturating_sub(i0.host_cpu_ns) + t1.host_cpu_ns.saturating_sub(t0.host_cpu_ns);
        let model_cpu = i1.device_model_cpu_ns.saturating_sub(i0.device_model_cpu_ns)
            + t1.device_model_cpu_ns.saturating_sub(t0.device_model_cpu_ns);
        match (&i0.evidence, &i1.evidence, &t0.evidence, &t1.evidence) {
            (Some(a0), Some(a1), Some(b0), Some(b1)) => {
                let mut cell = TwinCounts::delta(a1, a0);
                cell.add(&TwinCounts::delta(b1, b0));
                self.counts.get_or_insert_with(TwinCounts::default).add(&cell);
            }
            _ => self.counts_observable = false,
        }
        self.transfers += transfers;
        let per_transfer = |ns: u64| (transfers > 0).then(|| ns as f64 / transfers as f64);
        let mut histogram = crate::bench::latency_histogram();
        for &ns in &latencies {
            let _ = histogram.record(ns.max(1));
        }
        let quantile = |q: f64| if histogram.is_empty() { 0 } else { histogram.value_at_quantile(q) };
        let result = RoundResult {
            round,
            slot,
            bytes_per_second: if wall_ns > 0 { bytes as f64 / (wall_ns as f64 / 1e9) } else { 0.0 },
            latency_p50_ns: quantile(0.5),
            latency_p99_ns: quantile(0.99),
            latency_p999_ns: quantile(0.999),
            batches,
            failed_batches: failed,
            transfers,
            process_cpu_ns_per_transfer: per_transfer(host_cpu),
            // The initiator process alone (the transfer engine's caller), for the "(path)" column.
            path_cpu_ns_per_transfer: per_transfer(i1.host_cpu_ns.saturating_sub(i0.host_cpu_ns)).unwrap_or(0.0),
            occupancy: report::CellOccupancy {
                wall_ns,
                device_model_cpu_ns: Some(model_cpu),
                not_exposed: Some(
                    "the Mooncake processes run their own copies of the twin runtime: their cores, engines and \
                     streams are not read; device-model CPU is their cann-twin threads' run time"
                        .into(),
                ),
                ..Default::default()
            },
        };
        let first_failure = run.get("first_failure").and_then(Value::as_str).map(str::to_owned);
        Ok(Cell { result, latencies, first_failure })
    }

    /// Runs one cell and files its figures (into `rounds` and `latencies`) or its failure (into the record).
    pub fn run_cell(
        &mut self,
        options: &AuditOptions,
        workload: &Workload,
        (round, slot): (usize, usize),
        rounds: &mut Vec<RoundResult>,
        latencies: &mut hdrhistogram::Histogram<u64>,
    ) {
        match self.cell(options, workload, round, slot) {
            Ok(cell) => {
                if cell.result.failed_batches > 0 && self.first_failure.is_none() {
                    self.first_failure = cell.first_failure.clone();
                }
                for &ns in &cell.latencies {
                    let _ = latencies.record(ns.max(1));
                }
                rounds.push(cell.result);
            }
            Err(reason) => {
                self.first_failure.get_or_insert_with(|| reason.clone());
                self.record.failed_cells.push(FailedCell { workload: workload.name(), round, reason });
            }
        }
    }

    /// The data check: a pattern written from the initiator into the target's memory, then another written into
    /// the target's and read back; each time both buffers' sha256 (read through aclrtMemcpy) must agree.
    pub fn verify(&mut self) {
        let bulk = self.margin + bulk_time(self.size);
        let (peer, remote, size) = (self.peer.clone(), self.remote, self.size);
        let check = match self.drivers() {
            Err(reason) => DataCheck { passed: false, detail: reason },
            Ok((target, initiator)) => {
                let outcome = (|| {
                    let digest = |d: &mut Driver| -> std::result::Result<String, String> {
                        let answer = d.call(json!({"cmd": "digest"}), bulk)?;
                        Ok(answer.get("sha256").and_then(Value::as_str).unwrap_or_default().to_owned())
                    };
                    // Each pattern's digest is taken where it was written, before it moves.
                    initiator.call(json!({"cmd": "fill", "seed": 11}), bulk)?;
                    let written = digest(initiator)?;
                    initiator.call(json!({"cmd": "copy_all", "peer": peer, "remote": remote, "op": "write"}), bulk)?;
                    let landed = digest(target)?;
                    target.call(json!({"cmd": "fill", "seed": 12}), bulk)?;
                    let source = digest(target)?;
                    initiator.call(json!({"cmd": "copy_all", "peer": peer, "remote": remote, "op": "read"}), bulk)?;
                    let read = digest(initiator)?;
                    Ok::<_, String>((written, landed, source, read))
                })();
                match outcome {
                    Ok((written, landed, source, read)) => {
                        let size = report::size_name(size);
                        let write_ok = !written.is_empty() && written == landed;
                        let read_ok = !source.is_empty() && source == read && source != written;
                        DataCheck {
                            passed: write_ok && read_ok,
                            detail: format!(
                                "{size} written from the initiator's device memory into the target's: {} (sha256 \
                                 {} there, {} here); {size} of another pattern read back: {} (sha256 {} there, {} \
                                 here)",
                                if write_ok { "same" } else { "DIFFERENT" },
                                short(&landed),
                                short(&written),
                                if read_ok { "same" } else { "DIFFERENT" },
                                short(&source),
                                short(&read)
                            ),
                        }
                    }
                    Err(reason) => {
                        self.fail(reason.clone());
                        DataCheck { passed: false, detail: reason }
                    }
                }
            }
        };
        self.record.data_check = Some(check);
    }

    /// The path's error-recovery rounds (run after the data check, as they end the target): `out_of_bounds` (4 x
    /// 64 KiB WRITEs, the second running 4 KiB past the target's buffer), `killed_peer` (the target process SIGKILLed
    /// 20 ms into a batch of [`BIG_BATCH`] WRITEs of 1 MiB, then a new transfer to it); `stalled_engine` is not injected. The
    /// wheel's batch calls return one code per batch, so each transfer's state is the batch's.
    pub fn fault_rounds(&mut self) -> Vec<report::FaultRound> {
        let not = |fault: &str, reason: String| report::FaultRound::not_injected(PATH, fault, reason);
        let stalled = not(
            "stalled_engine",
            "the wheel's copies run inside its own processes (the twin's adxl::AdxlEngine), which this \
             process cannot stall without stopping the peer, and a stopped peer holds the batch for the wheel's own \
             transfer timeout"
                .into(),
        );
        let (peer, remote, size, margin) = (self.peer.clone(), self.remote, self.size, self.margin);
        let Ok((target, initiator)) = self.drivers() else {
            let reason = self.failure.clone().unwrap_or_else(|| "the Mooncake processes are not running".into());
            return vec![not("out_of_bounds", reason.clone()), stalled, not("killed_peer", reason)];
        };
        let batch = |initiator: &mut Driver, requests: &[(u64, u64, u64)], within: Duration| {
            let column = |pick: fn(&(u64, u64, u64)) -> u64| requests.iter().map(pick).collect::<Vec<u64>>();
            let request = json!({"cmd": "batch", "peer": peer, "remote": remote, "op": "write",
                "locals": column(|r| r.0), "remotes": column(|r| r.1), "lengths": column(|r| r.2)});
            initiator.call(request, within).map(|answer| {
                let rc = answer.get("rc").and_then(Value::as_i64).unwrap_or(i64::MIN);
                (rc, answer.get("ms").and_then(Value::as_f64).unwrap_or(0.0))
            })
        };
        let length = 64u64 << 10;
        let good: Vec<(u64, u64, u64)> = (0..4).map(|i| (i * length, i * length, length)).collect();
        let fate = |rc: i64, n: usize| vec![if rc == 0 { "completed" } else { "failed" }.to_owned(); n];
        let reason =
            |rc: i64| (rc != 0).then(|| format!("batch_transfer_sync_write returned {rc} (one code per batch)"));
        // out_of_bounds.
        let mut faulty = good.clone();
        faulty[1].1 = size - 4096;
        let oob = match batch(initiator, &faulty, margin) {
            Err(error) => not("out_of_bounds", error),
            Ok((rc, ms)) => {
                let next = batch(initiator, &good, margin);
                report::FaultRound {
                    ended_after_ms: Some(ms),
                    states: fate(rc, faulty.len()),
                    first_reason: reason(rc),
                    next_batch_served: Some(matches!(next, Ok((0, _)))),
                    next_batch_ms: next.ok().map(|(_, ms)| ms),
                    ..report::FaultRound::injected(PATH, "out_of_bounds")
                }
            }
        };
        // killed_peer: the target dies 20 ms into a batch of 2 GiB. The client-server engine's AI CPU moves 256 MiB
        // in about 20 ms on the twin (SDMA copies into the imported memory), so a smaller batch could end before the
        // kill, or before the target's teardown closes its connection: this one takes several times the delay.
        let mib = 1u64 << 20;
        // 2048 requests of 1 MiB (within HiXL's 4096 unqueried entries per client), over the buffer again and again.
        let slots = (size / mib).max(1);
        let piece = mib.min(size);
        let big: Vec<(u64, u64, u64)> =
            (0..BIG_BATCH).map(|i| ((i % slots) * piece, (i % slots) * piece, piece)).collect();
        let pid = target.child.id() as libc::pid_t;
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            let killed_at = Instant::now();
            // SAFETY: kill(2) on the target's pid, which is not reaped before the killer is joined below.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed_at
        });
        let submitted = Instant::now();
        let outcome = batch(initiator, &big, margin + Duration::from_secs(30));
        let killed_at = killer.join().unwrap_or(submitted);
        let ended = Instant::now();
        let killed = match outcome {
            Err(error) => not("killed_peer", error),
            Ok((rc, _)) => {
                let dead = batch(initiator, &good[..1], margin + Duration::from_secs(30));
                let before_kill = ended < killed_at;
                report::FaultRound {
                    ended_after_ms: Some(ended.saturating_duration_since(killed_at).as_secs_f64() * 1e3),
                    states: fate(rc, big.len()),
                    first_reason: match (before_kill, reason(rc)) {
                        (true, why) => Some(format!(
                            "the batch ended before the kill{}",
                            why.map_or(String::new(), |why| format!(": {why}"))
                        )),
                        (false, why) => why,
                    },
                    next_batch_served: None,
                    dead_peer_state: Some(match &dead {
                        Ok((0, _)) => "completed".into(),
                        Ok(_) => "failed".into(),
                        Err(_) => "no answer".into(),
                    }),
                    dead_peer_ms: dead.as_ref().ok().map(|(_, ms)| *ms),
                    dead_peer_reason: Some(match &dead {
                        Ok((rc, _)) => format!("batch_transfer_sync_write returned {rc}"),
                        Err(error) => error.clone(),
                    }),
                    ..report::FaultRound::injected(PATH, "killed_peer")
                }
            }
        };
        // The target is gone: later calls to it must not wait on it.
        if let Some(target) = self.target.take() {
            target.stop();
        }
        vec![oob, stalled, killed]
    }

    /// Stops both processes and returns the record and the path's verdict tally.
    pub fn finish(mut self) -> (MooncakeRecord, EvidenceTally, Option<String>) {
        for driver in [self.target.take(), self.initiator.take()].into_iter().flatten() {
            driver.stop();
        }
        // Observed only if every snapshot of every cell had the counts, and some cell ran.
        let counts = if self.counts_observable { self.counts.clone() } else { None };
        let observed = counts.as_ref();
        let runtime = self.record.runtime.clone().filter(|_| observed.is_some());
        let tally = tally_from_counts(observed, self.transfers, runtime.as_deref());
        self.record.evidence = observed.map(TwinCounts::as_map);
        let failure = self.first_failure.clone().or_else(|| self.failure.clone());
        (std::mem::take(&mut self.record), tally, failure)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for driver in [self.target.take(), self.initiator.take()].into_iter().flatten() {
            driver.stop();
        }
    }
}

fn short(digest: &str) -> String {
    if digest.is_empty() {
        "-".into()
    } else {
        digest.chars().take(12).collect()
    }
}

/// Extra time a whole-buffer command may take: 1 s per 4 MiB.
fn bulk_time(size: u64) -> Duration {
    Duration::from_secs(size.div_ceil(4 << 20).max(1))
}

/// A request target whose bases are 0: the lists then hold offsets, which the driver adds to its buffers.
fn offsets_only() -> kv::Target {
    kv::Target { protocol: Protocol::Aiv, segment: SegmentId::LOCAL, local_base: 0, remote_base: 0 }
}

fn batch_json(batch: &[crate::transfer::TransferRequest]) -> Value {
    Value::Array(batch.iter().map(|r| json!([r.opcode.as_str(), r.source, r.target_offset, r.length])).collect())
}

/// `bench::run_initiator`'s requests: thread `t`'s request `i` at offset `block x (i x threads + t)` on both sides,
/// one batch per thread.
fn bench_lists(operation: Opcode, workload: &Workload) -> Vec<Vec<Value>> {
    (0..workload.threads)
        .map(|thread| {
            let batch: Vec<Value> = (0..workload.batch_size)
                .map(|i| {
                    let offset = workload.block_size * (i * workload.threads + thread) as u64;
                    json!([operation.as_str(), offset, offset, workload.block_size])
                })
                .collect();
            vec![Value::Array(batch)]
        })
        .collect()
}

/// What the path's figures count, for the report.
fn caveats() -> Vec<String> {
    vec![
        "Separate processes: the wheel runs in two Python processes of its own (target and initiator), each with its \
         own copy of the twin runtime, on its device 0; the engine paths run in this process. Same twin device \
         memory model (aclrtMalloc memory reached only through the runtime's copies), same buffer size, same \
         request lists (built here and sent to the initiator), same rounds, interleaved."
            .into(),
        "Host CPU per transfer (process) is the Host CPU of both Mooncake processes during the cell: \
         getrusage(RUSAGE_SELF) less the run time of their cann-twin-* threads (the device model), so the Python \
         loop and the interpreter are counted; (path) is the initiator process alone."
            .into(),
        "Latency is per batch as the driver times it around batch_transfer_sync_read/write (Python's \
         perf_counter_ns), at most 200,000 batches a cell."
            .into(),
        "The verdict comes from the twin runtime's counts in those processes (cannTwinEvidence, twin-only), summed \
         over the cells: whole-process deltas, not per-transfer records. Twin runtime, unverified on hardware."
            .into(),
    ]
}

/// The path's figures for one workload, by the same statistics as every engine path's
/// ([`report::WorkloadReport::new`], with the same round's memcpy reference for `vs_memcpy`).
pub(crate) fn cell_stats(
    workload: &report::WorkloadReport,
    rounds: Vec<RoundResult>,
    latencies: &hdrhistogram::Histogram<u64>,
) -> report::CellStats {
    let one = report::WorkloadReport::new(
        workload.workload.clone(),
        // A placeholder protocol: only the statistics are taken, and the name is replaced below.
        &[Protocol::Aiv],
        vec![rounds],
        std::slice::from_ref(latencies),
        workload.memcpy_rounds.clone(),
    );
    let mut cell = one.paths.into_iter().next().expect("one path in, one cell out");
    cell.path = PATH.into();
    cell
}

/// Files that the path does not run `workload`, with the reason.
pub(crate) fn skip_workload(record: &mut MooncakeRecord, workload: &Workload, reason: String) {
    record.skipped_workloads.push(SkippedWorkload { workload: workload.name(), reason });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::{Check, Submitter};

    /// Counts by name (the others 0), as the driver sends them.
    fn counts(list: &[(&str, u64)]) -> TwinCounts {
        let object: serde_json::Map<String, Value> = list.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
        TwinCounts::from_json(&Value::Object(object)).expect("an object")
    }

    #[test]
    fn the_verdict_follows_the_counts_not_the_name() {
        // Host copies only, no engine ran anything (the TCP stand-in): observed, every check no, Host-submitted.
        let host = counts(&[("host_sync_copies", 200), ("host_sync_copy_bytes", 200 << 20), ("adxl_descs", 100)]);
        let tally = tally_from_counts(Some(&host), 100, Some("cann-twin 0.1.0"));
        let checks = tally.checks();
        assert_eq!(checks.aiv_direct(), Check::No);
        assert_eq!(checks.kernel_writes_descriptors, Check::No);
        assert_eq!(checks.device_observes_completion, Check::No);
        assert_eq!(tally.submitter(), Submitter::HostSubmitted);
        let lines = tally.verdict_lines();
        assert!(lines[0].starts_with("submitted by: Host-submitted (twin runtime, cann-twin 0.1.0"), "{lines:?}");
        assert!(lines[1].starts_with("  AIV-direct: no"), "{lines:?}");

        // The client-server engine: the AI CPU wrote every SQE, rang every doorbell and read every flag, with the
        // records on; the Host launched the AI-CPU kernels: AI-CPU-submitted, its launches counted.
        let aicpu = counts(&[
            ("provenance_recorded", 1),
            ("sdma_channels", 4),
            ("sqes_executed", 300),
            ("sqes_by_aicpu", 300),
            ("doorbells_rung", 40),
            ("doorbells_by_aicpu", 40),
            ("flags_landed", 40),
            ("flags_seen_by_aicpu", 40),
            ("aicpu_kernels_launched", 40),
            ("aicpu_kernel_blocks_launched", 40),
            ("adxl_transfers", 40),
            ("adxl_descs", 260),
        ]);
        let tally = tally_from_counts(Some(&aicpu), 260, Some("cann-twin 0.1.0"));
        assert_eq!(tally.submitter(), Submitter::AiCpuSubmitted, "{:?}", tally.verdict_lines());
        assert_eq!(tally.checks().as_array(), [Check::No; 4]);
        assert_eq!(tally.descriptors_written.by_aicpu, 300.0);
        assert_eq!(tally.host_launches, 40.0);
        assert!(tally.verdict_lines()[0].contains("Host kernel launches per transfer"), "{:?}", tally.verdict_lines());
        // One Host stream copy of data among them (FabricMem's Host unfold would be all of them): mixed.
        let mixed = counts(&[
            ("host_stream_copies", 1),
            ("provenance_recorded", 1),
            ("sqes_executed", 3),
            ("sqes_by_aicpu", 3),
        ]);
        assert_eq!(tally_from_counts(Some(&mixed), 3, None).submitter(), Submitter::Mixed);
        // FabricMem's Host unfold: stream copies and synchronisations, no engine SQE: Host-submitted.
        let unfolded = counts(&[("host_stream_copies", 300), ("host_stream_syncs", 40), ("provenance_recorded", 1)]);
        assert_eq!(tally_from_counts(Some(&unfolded), 300, None).submitter(), Submitter::HostSubmitted);

        // Kernels that wrote every SQE, rang every doorbell and saw every flag, with the records on: yes.
        let kernel = [
            ("provenance_recorded", 1),
            ("kernels_launched", 1),
            ("sdma_channels", 2),
            ("sqes_executed", 64),
            ("sqes_by_kernel", 64),
            ("doorbells_rung", 8),
            ("doorbells_by_kernel", 8),
            ("flags_landed", 8),
            ("flags_seen_by_kernel", 8),
        ];
        let checks = tally_from_counts(Some(&counts(&kernel)), 64, Some("cann-twin 0.1.0")).checks();
        assert_eq!(checks.as_array(), [Check::Yes; 4]);
        assert_eq!(checks.aiv_direct(), Check::Yes);

        // The same engines with the records off: the engine acts are not recorded, so unknown, never yes or no.
        let mut off = kernel.to_vec();
        off[0].1 = 0;
        let tally = tally_from_counts(Some(&counts(&off)), 64, Some("cann-twin 0.1.0"));
        assert_eq!(tally.checks().aiv_direct(), Check::Unknown);
        assert_eq!(tally.checks().kernel_writes_descriptors, Check::Unknown);
        assert_eq!(tally.submitter(), Submitter::Unknown);

        // One Host copy among the kernel's work turns the descriptor check to no.
        let mut one_copy = kernel.to_vec();
        one_copy.push(("host_sync_copies", 1));
        let checks = tally_from_counts(Some(&counts(&one_copy)), 64, None).checks();
        assert_eq!(checks.kernel_writes_descriptors, Check::No);
        assert_eq!(checks.aiv_direct(), Check::No);

        // No evidence function (not the twin): every check unknown.
        let checks = tally_from_counts(None, 10, None).checks();
        assert_eq!(checks.as_array(), [Check::Unknown; 4]);
    }

    #[test]
    fn counts_subtract_and_add_by_name_with_the_state_counts_apart() {
        let before = counts(&[("host_sync_copies", 5), ("provenance_recorded", 1), ("sdma_channels", 2)]);
        let after =
            counts(&[("host_sync_copies", 9), ("provenance_recorded", 1), ("sdma_channels", 2), ("sqes_by_aicpu", 3)]);
        let delta = TwinCounts::delta(&after, &before);
        assert_eq!(
            (delta.get("host_sync_copies"), delta.get("provenance_recorded"), delta.get("sdma_channels")),
            (4, 1, 2)
        );
        assert_eq!(delta.get("sqes_by_aicpu"), 3);
        let mut sum = TwinCounts::default();
        sum.add(&delta);
        sum.add(&counts(&[("host_sync_copies", 1), ("provenance_recorded", 0)]));
        assert_eq!((sum.get("host_sync_copies"), sum.get("provenance_recorded")), (5, 0));
        assert_eq!(sum.as_map()["host_sync_copies"], 5);
        assert_eq!(sum.as_map().len(), CannTwinEvidenceV2::count_names().count());
        // Not an object: not observable.
        assert!(TwinCounts::from_json(&Value::Null).is_none());
    }

    #[test]
    fn the_driver_gets_the_layout_from_the_one_definition() {
        let spec = evidence_spec();
        let names: Vec<&str> = spec["counts"].as_array().expect("names").iter().filter_map(Value::as_str).collect();
        assert_eq!(spec["version"], 2);
        assert_eq!(spec["size"].as_u64(), Some(40 + 8 * names.len() as u64));
        assert_eq!(names.first(), Some(&"provenance_recorded"));
        assert!(names.contains(&"sqes_by_aicpu") && names.contains(&"aicpu_kernels_launched"));
        // The driver keeps no list of its own.
        assert!(!DRIVER.contains("\"sqes_by_kernel\""), "the driver must not name the counts itself");
    }

    #[test]
    fn the_mooncake_slot_rotates_with_the_engine_paths() {
        let paths = [Protocol::Aiv, Protocol::Tcp];
        assert_eq!(round_order_with(&paths, false, 1), (vec![Protocol::Tcp, Protocol::Aiv], None));
        assert_eq!(round_order_with(&paths, true, 0), (vec![Protocol::Aiv, Protocol::Tcp], Some(2)));
        assert_eq!(round_order_with(&paths, true, 1), (vec![Protocol::Tcp, Protocol::Aiv], Some(1)));
        assert_eq!(round_order_with(&paths, true, 2), (vec![Protocol::Aiv, Protocol::Tcp], Some(0)));
        assert_eq!(round_order_with(&paths, true, 4), (vec![Protocol::Tcp, Protocol::Aiv], Some(1)));
    }

    #[test]
    fn bench_lists_follow_run_initiator_s_layout() {
        let lists = bench_lists(Opcode::Write, &Workload::bench(4096, 2, 2));
        assert_eq!(lists.len(), 2);
        assert_eq!(lists[1][0], json!([["write", 4096, 4096, 4096], ["write", 12288, 12288, 4096]]));
    }

    #[test]
    fn a_missing_virtualenv_is_skipped_with_how_to_install() {
        let dir = std::env::temp_dir().join(format!("aiv-mooncake-none-{}", std::process::id()));
        let reason =
            discover(Some(dir.clone()), Some(dir.clone()), DeviceBackendKind::Twin).expect_err("nothing there");
        assert!(reason.contains("tests/support/mooncake_npu.sh") && reason.contains("twin_cann_libs.sh"), "{reason}");
        let reason = discover(Some(dir.clone()), Some(dir), DeviceBackendKind::Cann).expect_err("not the twin");
        assert!(reason.contains("twin device backend"), "{reason}");
    }
}
