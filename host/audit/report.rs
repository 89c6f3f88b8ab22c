//! The audit's report: `report.json` (schema [`AUDIT_SCHEMA`], documented in docs/audit.md) and `report.md`, every
//! number of which is read from the JSON document.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::warnings::WarningRecord;
use crate::config::EngineConfig;
use crate::evidence::{Check, EvidenceTally, Submitter, SubmitterCounts};
use crate::transfer::Protocol;

/// The version of `report.json`'s layout: a reader refuses another.
pub const AUDIT_SCHEMA: &str = "aiv-audit/2";

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditReport {
    pub schema: String,
    /// The command line that produced it.
    pub command: Vec<String>,
    /// When the audit started (RFC 3339, UTC) and how long it took.
    pub started_utc: String,
    pub elapsed_s: f64,
    pub environment: Environment,
    /// The configuration the engines started with.
    pub config: ConfigRecord,
    pub method: Method,
    /// The audited paths, in the first round's order.
    pub paths: Vec<String>,
    /// Paths not run, and why.
    pub skipped: Vec<Skipped>,
    /// Time to register the audit's buffers.
    pub registration: Vec<Registration>,
    pub workloads: Vec<WorkloadReport>,
    /// Per path, the AIV-direct verdict from every transfer's evidence.
    pub verdicts: Vec<PathVerdict>,
    /// The SVG plots written next to the report (file names), drawn from the figures above.
    pub plots: Vec<String>,
    /// The error-recovery rounds, per path and fault (empty with `--no-faults`).
    #[serde(default)]
    pub faults: Vec<FaultRound>,
    /// The report this run repeated (`aiv audit --rerun`), if it did.
    #[serde(default)]
    pub rerun_of: Option<RerunOf>,
    /// Allocation success per memory kind: how much of a requested heap could be had (empty with `--no-alloc`).
    #[serde(default)]
    pub allocation: Vec<Allocation>,
    /// The mooncake-ascend path (Mooncake's own Ascend wheel in two processes of its own), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mooncake: Option<MooncakeRecord>,
    /// The mooncake-ascend+aiv path (the same wheel with libllm_datadist.so over aiv), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mooncake_over_aiv: Option<MooncakeRecord>,
    /// The traced cells (`--trace`; empty without): one per workload and path, after the measured rounds.
    #[serde(default)]
    pub traces: Vec<TraceRecord>,
    /// The trace documents to write next to the report, by file name (not part of `report.json`).
    #[serde(skip)]
    pub trace_documents: Vec<(String, serde_json::Value)>,
    /// The cross-host section (`--cross-host`): aiv against tcp between two network namespaces, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_host: Option<super::cross_host::CrossHostReport>,
    /// Warnings and errors logged during the audit outside the error-recovery rounds (printed, and recorded here).
    #[serde(default)]
    pub warnings: Vec<WarningRecord>,
}

/// The run an `aiv audit --rerun` repeated: its report as named on the command line, when it started and the commit
/// it was built from (compare with this report's `environment.source_commit`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RerunOf {
    pub report: String,
    pub started_utc: String,
    pub source_commit: Option<String>,
}

/// Allocation success of one memory kind: a heap of `requested_bytes` asked for in chunks, what was obtained, and
/// the time to register it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    /// `device` (the HBM heap the device paths share) or `host`.
    pub memory: String,
    /// The audited paths that use this memory.
    pub paths: Vec<String>,
    pub requested_bytes: u64,
    pub obtained_bytes: u64,
    /// How many chunks the obtained bytes came in.
    pub chunks: usize,
    /// The first refused chunk and the allocator's error.
    pub first_refusal: Option<String>,
    /// Why the allocation stopped: the request reached, a smallest chunk refused, or the time cap.
    pub ended: String,
    pub allocation_s: f64,
    /// Bytes registered with one engine (all obtained, unless registration failed), in how long, and per GiB.
    pub registered_bytes: u64,
    pub registration_s: f64,
    pub registration_s_per_gib: Option<f64>,
    pub registration_error: Option<String>,
}

impl Allocation {
    /// Nothing obtained yet.
    pub(crate) fn empty(memory: &str, paths: Vec<String>, requested_bytes: u64) -> Allocation {
        Allocation {
            memory: memory.into(),
            paths,
            requested_bytes,
            obtained_bytes: 0,
            chunks: 0,
            first_refusal: None,
            ended: String::new(),
            allocation_s: 0.0,
            registered_bytes: 0,
            registration_s: 0.0,
            registration_s_per_gib: None,
            registration_error: None,
        }
    }
}

/// What a Mooncake path (mooncake-ascend, mooncake-ascend+aiv) ran on and what it saw besides its cells' figures
/// (docs/audit.md, "The Mooncake paths").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MooncakeRecord {
    /// The wheel's version, the Python that ran it, and the runtime its processes loaded (`cann-twin 0.1.0`, or
    /// `None` when that runtime has no twin evidence function).
    pub wheel: Option<String>,
    pub python: Option<String>,
    pub runtime: Option<String>,
    /// The ADXL engine the initiator's `libllm_datadist.so` selected, as it logged it (`hixl_cs, reason:LocalCommRes
    /// version is 1.3`; `None`: no such line).
    pub engine: Option<String>,
    /// `ASCEND_GLOBAL_RESOURCE_CONFIG` as the audit set it for both processes (`--mooncake-global-resource-config`;
    /// `None`: unset, the wheel's defaults).
    pub global_resource_config: Option<String>,
    /// What the two processes' figures count, and how they differ from the other paths' layout.
    pub caveats: Vec<String>,
    /// The data check after the rounds: a known pattern written to the target and read back, compared.
    pub data_check: Option<DataCheck>,
    /// The twin runtime's evidence counts, summed over every cell of both processes (`None`: not observable).
    pub evidence: Option<std::collections::BTreeMap<String, u64>>,
    /// Workloads the path did not run, with the reason.
    pub skipped_workloads: Vec<SkippedWorkload>,
    /// Cells that failed without figures (a process that died, hung or refused), with the reason.
    pub failed_cells: Vec<FailedCell>,
}

/// A Mooncake path's data check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataCheck {
    pub passed: bool,
    pub detail: String,
}

/// A workload a path did not run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SkippedWorkload {
    pub workload: String,
    pub reason: String,
}

/// A cell that produced no figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailedCell {
    pub workload: String,
    pub round: usize,
    pub reason: String,
}

/// One traced cell (`--trace`): the trace file written next to the report, what it holds, and the cell's bandwidth
/// against the same workload and path untraced (the overhead of tracing when on).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// The Chrome trace event file (open it in Perfetto's UI or `chrome://tracing`).
    pub file: String,
    pub workload: String,
    pub path: String,
    /// Trace events: Host events, kernel stage entries, SDMA engine runs.
    pub events: usize,
    pub host_events: usize,
    pub device_events: usize,
    pub engine_runs: usize,
    /// Kernel entries dropped (a full trace ring) and Host events dropped (capacity).
    pub dropped: u64,
    /// The traced cell's bandwidth, and the median of the measured (untraced) rounds.
    pub traced_bytes_per_second: f64,
    pub untraced_median_bytes_per_second: Option<f64>,
    /// traced / untraced median: the stated overhead of tracing when on (1 = none).
    pub traced_over_untraced: Option<f64>,
    /// The device clock's alignment error (half the bounds' width), per device with kernel entries.
    pub clock_error_ns: Vec<f64>,
}

/// One error-recovery round: a fault injected while one batch of 4 x 64 KiB WRITEs ran, and what followed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultRound {
    pub path: String,
    /// `out_of_bounds`, `stalled_engine` or `killed_peer`.
    pub fault: String,
    /// Whether the fault could be injected on this path and runtime; if not, why.
    pub injected: bool,
    pub not_injected_reason: Option<String>,
    /// From submit to the end of the faulty batch's wait: the time to detect.
    pub ended_after_ms: Option<f64>,
    /// Each transfer's final state (`completed`, `failed`, `timeout`).
    pub states: Vec<String>,
    /// The first failed transfer's reason.
    pub first_reason: Option<String>,
    /// Each transfer's reason, in order (empty for a completed one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// Whether the next, fault-free batch completed (after the fault was lifted), and how long it took.
    pub next_batch_served: Option<bool>,
    pub next_batch_ms: Option<f64>,
    /// `killed_peer`: how many of the batch's transfers were still pending when the peer was killed (the batch's
    /// `ended_after_ms` then counts from the kill, not from the submit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_at_fault: Option<usize>,
    /// `killed_peer`: a new transfer to the dead peer's segment after the batch ended: its state, how long it took
    /// and its reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_peer_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_peer_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_peer_reason: Option<String>,
    /// The warnings the round provoked on purpose (recorded here, not printed; docs/audit.md, "Warnings").
    #[serde(default)]
    pub expected_warnings: Vec<WarningRecord>,
    /// Warnings during the round that it did not declare (printed, and recorded here).
    #[serde(default)]
    pub unexpected_warnings: Vec<WarningRecord>,
}

impl FaultRound {
    /// An injected round with nothing recorded yet.
    pub(crate) fn injected(path: &str, fault: &str) -> FaultRound {
        FaultRound { injected: true, not_injected_reason: None, ..FaultRound::not_injected(path, fault, String::new()) }
    }

    pub(crate) fn not_injected(path: &str, fault: &str, reason: String) -> FaultRound {
        FaultRound {
            path: path.into(),
            fault: fault.into(),
            injected: false,
            not_injected_reason: Some(reason),
            ended_after_ms: None,
            states: Vec::new(),
            first_reason: None,
            reasons: Vec::new(),
            next_batch_served: None,
            next_batch_ms: None,
            pending_at_fault: None,
            dead_peer_state: None,
            dead_peer_ms: None,
            dead_peer_reason: None,
            expected_warnings: Vec::new(),
            unexpected_warnings: Vec::new(),
        }
    }
}

/// Transfer states in order, runs of one state counted: `completed, failed, completed x 2`.
fn state_counts(states: &[String]) -> String {
    let mut runs: Vec<(&str, usize)> = Vec::new();
    for state in states {
        match runs.last_mut() {
            Some((last, count)) if *last == state.as_str() => *count += 1,
            _ => runs.push((state.as_str(), 1)),
        }
    }
    let parts: Vec<String> =
        runs.iter().map(|(state, n)| if *n == 1 { (*state).to_owned() } else { format!("{state} x {n}") }).collect();
    parts.join(", ")
}

/// Where the audit ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// aiv-transport's version.
    pub version: String,
    /// The commit of the source tree the binary was built from, read when the audit ran (`git rev-parse HEAD`
    /// there), with `-dirty` if it had uncommitted changes; `None` where the tree or git is not there.
    pub source_commit: Option<String>,
    /// `twin` (the CPU model of an NPU) or `cann` (the vendor's libraries).
    pub device_backend: String,
    /// The runtime the transfers' evidence names (kind and version), from the first path that recorded one.
    pub runtime: Option<String>,
    /// The machine: logical CPUs, CPU model, memory, operating system.
    pub cpus: usize,
    pub cpu_model: Option<String>,
    pub memory_bytes: Option<u64>,
    pub os: String,
}

impl Environment {
    pub(crate) fn probe(config: &EngineConfig) -> Environment {
        Environment {
            version: env!("CARGO_PKG_VERSION").into(),
            source_commit: source_commit(),
            device_backend: format!("{:?}", config.aiv.device_backend).to_lowercase(),
            runtime: None,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| {
                info.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            }),
            memory_bytes: crate::bench::physical_memory(),
            os: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|release| format!("{} {}", std::env::consts::OS, release.trim()))
                .unwrap_or_else(|_| std::env::consts::OS.into()),
        }
    }
}

/// `git rev-parse HEAD` in the source tree the binary was built from (its path is compiled in, never written out).
fn source_commit() -> Option<String> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "HEAD"]).filter(|c| !c.is_empty())?;
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{commit}-dirty") } else { commit })
}

/// The configuration of a run: the mooncake.json text it was read from (if any; the MOONCAKE_* variables may have
/// filled the rest) and the effective configuration as the engine holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigRecord {
    pub file: Option<String>,
    pub effective: String,
    /// The environment variables the configuration read that were set (MOONCAKE_*, MC_TRANSFER_TIMEOUT, ...), by
    /// name: with `file` and `command`, what `aiv audit --rerun` replays.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// How the audit measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Method {
    pub rounds: usize,
    pub cell_s: f64,
    pub reference_s: f64,
    pub operation: String,
    /// How sections that never sleep were timed for the Host CPU figures (`monotonic` or `thread`).
    #[serde(default)]
    pub section_clock: String,
    /// How rounds order the paths.
    pub order: String,
    /// What every path shares.
    pub layout: String,
}

/// A path the audit did not run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// Time to register buffers of one kind with the two engines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    /// `device` or `host`.
    pub memory: String,
    pub bytes: u64,
    pub seconds: f64,
    /// Seconds per GiB registered.
    pub seconds_per_gib: f64,
}

impl Registration {
    pub(crate) fn new(memory: &str, bytes: u64, took: Duration) -> Registration {
        let seconds = took.as_secs_f64();
        Registration {
            memory: memory.into(),
            bytes,
            seconds,
            seconds_per_gib: seconds / (bytes.max(1) as f64 / (1u64 << 30) as f64),
        }
    }
}

/// The median of a figure over the rounds, with its spread.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// The 10th and 90th percentiles (nearest rank).
    pub p10: f64,
    pub p90: f64,
}

impl Stats {
    /// `None` without values.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Stats> {
        let mut values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let rank = |q: f64| values[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        let median = if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 };
        Some(Stats { n, median, min: values[0], max: values[n - 1], p10: rank(0.1), p90: rank(0.9) })
    }
}

/// One workload of the matrix: `transfer_engine_bench`'s shape (block size x batch size x threads), or one from
/// the use ([`Shape`]), for which `block_size` and `batch_size` say what one batch holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    /// Bytes per request (a shape: its largest).
    pub block_size: u64,
    /// Requests per batch.
    pub batch_size: usize,
    /// Initiator threads.
    pub threads: usize,
    /// A workload from the use, laid out by its own rule; none: `transfer_engine_bench`'s layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Shape>,
}

impl Workload {
    /// `transfer_engine_bench`'s shape.
    pub fn bench(block_size: u64, batch_size: usize, threads: usize) -> Workload {
        Workload { block_size, batch_size, threads, shape: None }
    }

    /// One request's paged KV blocks per batch (see [`KvCache`]).
    pub fn kv_request(cache: KvCache) -> Workload {
        Workload {
            block_size: cache.block_bytes(),
            batch_size: cache.transfers_per_request(),
            threads: 1,
            shape: Some(Shape::KvRequest(cache)),
        }
    }

    /// One request's paged KV blocks layer by layer, `compute_us` of compute before each layer (see
    /// [`Shape::KvLayerwise`]).
    pub fn kv_layerwise(cache: KvCache, compute_us: u32) -> Workload {
        Workload {
            block_size: cache.block_bytes(),
            batch_size: 2 * cache.request_blocks as usize,
            threads: 1,
            shape: Some(Shape::KvLayerwise { cache, compute_us }),
        }
    }

    /// The compute a request of the workload waits for in all (layerwise workloads).
    pub fn compute_per_request(&self) -> Option<Duration> {
        match &self.shape {
            Some(Shape::KvLayerwise { cache, compute_us }) => {
                Some(Duration::from_micros(u64::from(*compute_us)) * cache.layers)
            }
            _ => None,
        }
    }

    /// Store-style put and get of `objects` objects (see [`Shape::Store`]).
    pub fn store(objects: usize, min_bytes: u64, max_bytes: u64, seed: u64) -> Workload {
        Workload {
            block_size: max_bytes,
            batch_size: objects,
            threads: 1,
            shape: Some(Shape::Store { objects, min_bytes, max_bytes, seed }),
        }
    }

    /// `4 KiB x 1 x 1 thread`, or the shape's description.
    pub fn name(&self) -> String {
        match &self.shape {
            None => format!(
                "{} x {} x {} thread{}",
                size_name(self.block_size),
                self.batch_size,
                self.threads,
                if self.threads == 1 { "" } else { "s" }
            ),
            Some(Shape::KvRequest(kv)) => format!(
                "KV request: {} layers x K/V x {} of {} blocks of {} ({} tokens x {} KV heads x {} x {} B), seed {}",
                kv.layers,
                kv.request_blocks,
                kv.cache_blocks,
                size_name(kv.block_bytes()),
                kv.tokens_per_block,
                kv.kv_heads,
                kv.head_dim,
                kv.dtype_bytes,
                kv.seed
            ),
            Some(Shape::KvLayerwise { cache: kv, compute_us }) => format!(
                "KV layerwise: {} layers of K/V x {} of {} blocks of {}, {compute_us} µs compute per layer, seed {}",
                kv.layers,
                kv.request_blocks,
                kv.cache_blocks,
                size_name(kv.block_bytes()),
                kv.seed
            ),
            Some(Shape::Store { objects, min_bytes, max_bytes, seed }) => format!(
                "store put/get: {objects} objects of {} to {}, seed {seed}",
                size_name(*min_bytes),
                size_name(*max_bytes)
            ),
        }
    }

    /// Bytes each buffer must hold for the workload.
    pub fn span(&self) -> u64 {
        match &self.shape {
            None => self.block_size.saturating_mul(self.batch_size as u64).saturating_mul(self.threads as u64),
            Some(Shape::KvRequest(kv)) | Some(Shape::KvLayerwise { cache: kv, .. }) => kv.cache_bytes(),
            Some(Shape::Store { objects, max_bytes, .. }) => max_bytes.saturating_mul(*objects as u64),
        }
    }
}

/// A workload from the use.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Shape {
    /// A vLLM-style paged KV cache on both sides; each batch moves one request's blocks (every layer's K and V
    /// block of each) from non-contiguous block ids of one cache to non-contiguous ids of the other, as one batched
    /// transfer: the P2P connector's shape.
    KvRequest(KvCache),
    /// The same cache and requests moved layer by layer, as the layerwise connector saves them during prefill: per
    /// layer `compute_us` of compute (the Host thread waits, as for the device), then that layer's K and V blocks as
    /// one batch of WRITEs, not waited for, so that it overlaps the next layers' compute; the request ends when every
    /// layer's batch has. The audit's operation does not apply.
    KvLayerwise { cache: KvCache, compute_us: u32 },
    /// Store-style put (WRITE) then get (READ) of many small objects of sizes drawn from the powers of two between
    /// `min_bytes` and `max_bytes`, one batch each way; the audit's operation does not apply.
    Store { objects: usize, min_bytes: u64, max_bytes: u64, seed: u64 },
}

/// A paged KV cache: `layers` x {K, V} x `cache_blocks` blocks of `tokens_per_block x kv_heads x head_dim x
/// dtype_bytes` bytes, laid out layer-major (`((layer x 2 + kv) x cache_blocks + block) x block_bytes`); a request
/// holds `request_blocks` blocks, their ids drawn without repeats from a seeded generator (ChaCha8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KvCache {
    pub layers: u32,
    pub tokens_per_block: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub dtype_bytes: u32,
    pub cache_blocks: u32,
    pub request_blocks: u32,
    pub seed: u64,
}

impl KvCache {
    /// Bytes of one K or V block of one layer.
    pub fn block_bytes(&self) -> u64 {
        u64::from(self.tokens_per_block)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }

    /// Bytes of the whole cache.
    pub fn cache_bytes(&self) -> u64 {
        u64::from(self.layers) * 2 * u64::from(self.cache_blocks) * self.block_bytes()
    }

    /// Transfers of one request: every layer's K and V block of each of its blocks.
    pub fn transfers_per_request(&self) -> usize {
        self.layers as usize * 2 * self.request_blocks as usize
    }
}

/// One cell's measurement in one round.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RoundResult {
    /// The round (from 0) and the cell's place in it (from 0).
    pub round: usize,
    pub slot: usize,
    pub bytes_per_second: f64,
    pub latency_p50_ns: u64,
    pub latency_p99_ns: u64,
    pub latency_p999_ns: u64,
    pub batches: u64,
    pub failed_batches: u64,
    pub transfers: u64,
    /// Every Host thread of the process, per transfer (None: /proc unreadable).
    pub process_cpu_ns_per_transfer: Option<f64>,
    /// The path's attribution (its threads and sections, and its waiters), per transfer.
    pub path_cpu_ns_per_transfer: f64,
    /// What the cell kept busy on both devices: the twin runtime's counters, or why there are none.
    pub occupancy: CellOccupancy,
}

/// A cell's device occupancy, summed over the initiator's and the target's device (docs/occupancy.md): the twin
/// runtime's model figures, unverified on hardware; on another runtime all `None` with the reason.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CellOccupancy {
    pub wall_ns: u64,
    /// Emulated AIV cores: time executing and time polling, over every block that ran.
    pub aiv_executing_ns: Option<u64>,
    pub aiv_polling_ns: Option<u64>,
    /// SDMA channel engines: busy time summed over channels (two busy engines for 1 s count 2 s).
    pub sdma_busy_ns: Option<u64>,
    /// The runtime's copy work (stream copy tasks and synchronous copies), summed.
    pub runtime_copy_busy_ns: Option<u64>,
    /// The emulated AI CPU's threads running tasks (executing and polling), summed over its threads.
    #[serde(default)]
    pub aicpu_busy_ns: Option<u64>,
    /// CPU of the twin's device-model threads (its cost as a CPU model, never a Host figure).
    pub device_model_cpu_ns: Option<u64>,
    /// Why the device figures are missing, when they are.
    pub not_exposed: Option<String>,
}

impl CellOccupancy {
    /// `executing / (executing + polling)` of the AIV cores.
    pub fn aiv_executing_share(&self) -> Option<f64> {
        let (e, p) = (self.aiv_executing_ns?, self.aiv_polling_ns?);
        (e + p > 0).then(|| e as f64 / (e + p) as f64)
    }

    /// Engine-seconds of SDMA work per second of the cell.
    pub fn sdma_busy_per_second(&self) -> Option<f64> {
        (self.wall_ns > 0).then(|| self.sdma_busy_ns.map(|b| b as f64 / self.wall_ns as f64)).flatten()
    }

    /// Seconds of runtime copy work per second of the cell.
    pub fn runtime_copy_busy_per_second(&self) -> Option<f64> {
        (self.wall_ns > 0).then(|| self.runtime_copy_busy_ns.map(|b| b as f64 / self.wall_ns as f64)).flatten()
    }

    /// Thread-seconds of AI-CPU tasks per second of the cell.
    pub fn aicpu_busy_per_second(&self) -> Option<f64> {
        (self.wall_ns > 0).then(|| self.aicpu_busy_ns.map(|b| b as f64 / self.wall_ns as f64)).flatten()
    }
}

/// One memcpy reference run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReferenceRound {
    pub round: usize,
    pub slot: usize,
    pub bytes_per_second: f64,
}

/// One path's figures for one workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CellStats {
    pub path: String,
    pub bytes_per_second: Option<Stats>,
    /// Per round: the path's bandwidth over the same round's memcpy reference.
    pub vs_memcpy: Option<Stats>,
    pub latency_p50_ns: Option<Stats>,
    pub latency_p99_ns: Option<Stats>,
    pub latency_p999_ns: Option<Stats>,
    /// Layerwise workloads: the p50 request latency over the compute alone (what the transfers add).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p50_over_compute_ns: Option<Stats>,
    /// Every Host thread of the process, per transfer.
    pub process_cpu_ns_per_transfer: Option<Stats>,
    /// The path's own attribution, per transfer.
    pub path_cpu_ns_per_transfer: Option<Stats>,
    /// Occupancy over the rounds: the AIV cores' executing share, SDMA engine-seconds per second, runtime copy
    /// seconds per second, device-model CPU per transfer (ns).
    pub aiv_executing_share: Option<Stats>,
    pub sdma_busy_per_second: Option<Stats>,
    pub runtime_copy_busy_per_second: Option<Stats>,
    /// AI-CPU thread-seconds running tasks per second of the cell.
    #[serde(default)]
    pub aicpu_busy_per_second: Option<Stats>,
    pub device_model_cpu_ns_per_transfer: Option<Stats>,
    /// The batch latencies of every round together, as `[quantile, ns]` points from 0 to 1 (empty: none measured).
    pub latency_cdf: Vec<[f64; 2]>,
    pub transfers: u64,
    pub failed_batches: u64,
    /// Every round as measured.
    pub rounds: Vec<RoundResult>,
}

/// The quantiles [`CellStats::latency_cdf`] holds.
pub const CDF_QUANTILES: [f64; 17] =
    [0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.995, 0.999, 1.0];

fn cdf(latencies: &hdrhistogram::Histogram<u64>) -> Vec<[f64; 2]> {
    if latencies.is_empty() {
        return Vec::new();
    }
    CDF_QUANTILES.iter().map(|&q| [q, latencies.value_at_quantile(q) as f64]).collect()
}

/// One workload: its paths and the reference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadReport {
    pub name: String,
    pub workload: Workload,
    pub memcpy_bytes_per_second: Option<Stats>,
    pub memcpy_rounds: Vec<ReferenceRound>,
    pub paths: Vec<CellStats>,
}

impl WorkloadReport {
    pub(crate) fn new(
        workload: Workload,
        paths: &[Protocol],
        per_path: Vec<Vec<RoundResult>>,
        latencies: &[hdrhistogram::Histogram<u64>],
        memcpy_rounds: Vec<ReferenceRound>,
    ) -> WorkloadReport {
        let reference = |round: usize| memcpy_rounds.iter().find(|r| r.round == round).map(|r| r.bytes_per_second);
        let compute = workload.compute_per_request();
        let cells = paths
            .iter()
            .zip(per_path)
            .zip(latencies)
            .map(|((path, rounds), latencies)| {
                let of = |f: &dyn Fn(&RoundResult) -> Option<f64>| Stats::of(rounds.iter().filter_map(f));
                CellStats {
                    path: path.as_str().into(),
                    bytes_per_second: of(&|r| Some(r.bytes_per_second)),
                    vs_memcpy: of(&|r| reference(r.round).filter(|m| *m > 0.0).map(|m| r.bytes_per_second / m)),
                    latency_p50_ns: of(&|r| (r.batches > 0).then_some(r.latency_p50_ns as f64)),
                    latency_p99_ns: of(&|r| (r.batches > 0).then_some(r.latency_p99_ns as f64)),
                    latency_p999_ns: of(&|r| (r.batches > 0).then_some(r.latency_p999_ns as f64)),
                    latency_p50_over_compute_ns: compute.and_then(|compute| {
                        of(&|r| (r.batches > 0).then_some(r.latency_p50_ns as f64 - compute.as_nanos() as f64))
                    }),
                    process_cpu_ns_per_transfer: of(&|r| r.process_cpu_ns_per_transfer.filter(|_| r.transfers > 0)),
                    path_cpu_ns_per_transfer: of(&|r| (r.transfers > 0).then_some(r.path_cpu_ns_per_transfer)),
                    aiv_executing_share: of(&|r| r.occupancy.aiv_executing_share()),
                    sdma_busy_per_second: of(&|r| r.occupancy.sdma_busy_per_second()),
                    runtime_copy_busy_per_second: of(&|r| r.occupancy.runtime_copy_busy_per_second()),
                    aicpu_busy_per_second: of(&|r| r.occupancy.aicpu_busy_per_second()),
                    device_model_cpu_ns_per_transfer: of(&|r| {
                        r.occupancy
                            .device_model_cpu_ns
                            .filter(|_| r.transfers > 0)
                            .map(|ns| ns as f64 / r.transfers as f64)
                    }),
                    latency_cdf: cdf(latencies),
                    transfers: rounds.iter().map(|r| r.transfers).sum(),
                    failed_batches: rounds.iter().map(|r| r.failed_batches).sum(),
                    rounds,
                }
            })
            .collect();
        WorkloadReport {
            name: workload.name(),
            memcpy_bytes_per_second: Stats::of(memcpy_rounds.iter().map(|r| r.bytes_per_second)),
            workload,
            memcpy_rounds,
            paths: cells,
        }
    }
}

/// A path's verdict over the whole audit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PathVerdict {
    pub path: String,
    /// Who submitted the path's work: `AIV-direct`, `AI-CPU-submitted`, `Host-submitted`, `mixed` or `unknown`
    /// ([`Submitter`]), derived from the summed acts.
    pub submitted_by: Submitter,
    /// How many transfers' own verdicts came out as each word.
    pub per_transfer_submitted_by: SubmitterCounts,
    /// Host kernel launches per transfer (AIV or AI-CPU kernels the Host launched for the path's transfers).
    pub host_launches_per_transfer: f64,
    /// `yes`, `no` or `unknown`, and the four checks.
    pub aiv_direct: String,
    pub kernel_on_aiv: String,
    pub kernel_writes_descriptors: String,
    pub kernel_rings_doorbell: String,
    pub device_observes_completion: String,
    /// The runtime the records came from ("twin runtime, cann-twin 0.1.0"), if any recorded it.
    pub runtime: Option<String>,
    pub transfers: u64,
    /// The verdict and each check with its counts and source, as `aiv bench` prints them.
    pub lines: Vec<String>,
    /// The run's independent device-side observer where the path's device-side acts are self-reported (aiv on the
    /// vendor's runtime: CANN's profiler over the path's cells), else `None`.
    #[serde(default)]
    pub observer: Option<crate::evidence::DeviceObserver>,
    /// The first failure a batch of this path reported, if any.
    pub first_failure: Option<String>,
}

impl PathVerdict {
    pub(crate) fn new(path: Protocol, tally: &EvidenceTally, first_failure: Option<String>) -> PathVerdict {
        PathVerdict::from_tally(path.as_str(), tally, first_failure)
    }

    /// The verdict of `path` (one of this engine's protocols, or a path it does not carry itself, such as
    /// mooncake-ascend) from a tally of the acts its transfers or its runtime counted.
    pub fn from_tally(path: &str, tally: &EvidenceTally, first_failure: Option<String>) -> PathVerdict {
        let checks = tally.checks();
        let s = |check: Check| check.as_str().to_owned();
        PathVerdict {
            path: path.into(),
            submitted_by: tally.submitter(),
            per_transfer_submitted_by: tally.per_transfer_submitters,
            host_launches_per_transfer: tally.host_launches_per_transfer(),
            aiv_direct: s(checks.aiv_direct()),
            kernel_on_aiv: s(checks.kernel_on_aiv),
            kernel_writes_descriptors: s(checks.kernel_writes_descriptors),
            kernel_rings_doorbell: s(checks.kernel_rings_doorbell),
            device_observes_completion: s(checks.device_observes_completion),
            runtime: tally.runtime.map(|runtime| runtime.to_string()),
            transfers: tally.transfers,
            lines: tally.verdict_lines(),
            observer: tally.observer.clone(),
            first_failure,
        }
    }
}

/// `4 KiB`, `16 MiB`, `1000 B`.
pub fn size_name(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size && bytes % size == 0 {
            return format!("{} {name}", bytes / size);
        }
    }
    format!("{bytes} B")
}

/// Now, as RFC 3339 in UTC to the second.
pub(crate) fn utc_now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

impl AuditReport {
    /// Reads a `report.json`; the error names the file and what is wrong (another schema included).
    pub fn read(path: &Path) -> std::result::Result<AuditReport, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        match value.get("schema").and_then(|s| s.as_str()) {
            Some(AUDIT_SCHEMA) => {}
            Some(other) => {
                return Err(format!("{}: schema {other:?}, this aiv reads {AUDIT_SCHEMA:?}", path.display()));
            }
            None => return Err(format!("{}: no \"schema\": not an aiv audit report", path.display())),
        }
        serde_json::from_value(value).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The runtime label of the records (the first verdict that has one).
    pub fn runtime(&self) -> Option<&str> {
        self.environment.runtime.as_deref().or_else(|| self.verdicts.iter().find_map(|v| v.runtime.as_deref()))
    }

    /// `report.md`: method, environment, a table per workload, the verdicts with their evidence, the caveats.
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let runtime = self.runtime().unwrap_or("no runtime recorded");
        let on_twin = self.environment.device_backend == "twin";
        let _ = writeln!(md, "# aiv audit\n");
        let _ = writeln!(md, "`{}`\n", self.command.join(" "));
        let _ = writeln!(
            md,
            "Started {} UTC, {:.0} s. aiv-transport {} ({}), device backend `{}`, runtime: {runtime}.\n",
            self.started_utc.trim_end_matches('Z').replace('T', " "),
            self.elapsed_s,
            self.environment.version,
            self.environment.source_commit.as_deref().unwrap_or("commit unknown"),
            self.environment.device_backend,
        );
        let _ = writeln!(
            md,
            "Machine: {} logical CPUs ({}), {} of memory, {}.\n",
            self.environment.cpus,
            self.environment.cpu_model.as_deref().unwrap_or("model unknown"),
            self.environment
                .memory_bytes
                .map_or("unknown".into(), |m| format!("{:.1} GiB", m as f64 / (1u64 << 30) as f64)),
            self.environment.os
        );
        if let Some(of) = &self.rerun_of {
            let _ = writeln!(
                md,
                "A rerun (`aiv audit --rerun`) of `{}`, started {} UTC at {}: the same command, configuration file and \
                 configuration variables. `aiv audit --compare` of the two reports says what else differs.\n",
                of.report,
                of.started_utc.trim_end_matches('Z').replace('T', " "),
                of.source_commit.as_deref().unwrap_or("commit unknown"),
            );
        }
        if !self.config.env.is_empty() {
            let vars: Vec<String> = self.config.env.iter().map(|(k, v)| format!("`{k}={v}`")).collect();
            let _ = writeln!(md, "Configuration variables read: {}.\n", vars.join(", "));
        }
        if on_twin {
            let _ = writeln!(
                md,
                "> **Twin runtime: a CPU model of an NPU, not an NPU.** Its cores, copy engines and the Host share this \
                 machine's CPUs, so every figure below is the model's, unverified on hardware.\n"
            );
        }
        let _ = writeln!(md, "## Method\n");
        let _ = writeln!(
            md,
            "{} rounds per workload, {:.2} s per path and round ({} of each request), memcpy reference {:.2} s per \
             round. {}. {}. Host sections that never sleep are timed with the {} clock. Figures are the median \
             over the rounds, with [min - max].\n",
            self.method.rounds,
            self.method.cell_s,
            self.method.operation,
            self.method.reference_s,
            capitalize(&self.method.order),
            capitalize(&self.method.layout),
            self.method.section_clock
        );
        if !self.skipped.is_empty() {
            let _ = writeln!(md, "Not run:\n");
            for skipped in &self.skipped {
                let _ = writeln!(md, "- `{}`: {}", skipped.path, skipped.reason);
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md, "## Verdicts (from every transfer's evidence)\n");
        let _ = writeln!(md, "| path | submitted by | AIV-direct | kernel on AIV | writes descriptors | rings doorbell | completion on Device | Host launches/transfer | transfers |");
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
        for v in &self.verdicts {
            let _ = writeln!(
                md,
                "| {} | **{}** | {} | {} | {} | {} | {} | {:.3} | {} |",
                v.path,
                v.submitted_by,
                v.aiv_direct,
                v.kernel_on_aiv,
                v.kernel_writes_descriptors,
                v.kernel_rings_doorbell,
                v.device_observes_completion,
                v.host_launches_per_transfer,
                v.transfers
            );
        }
        let _ = writeln!(md);
        for v in &self.verdicts {
            let _ = writeln!(md, "`{}`:\n", v.path);
            let _ = writeln!(md, "```text");
            for line in &v.lines {
                let _ = writeln!(md, "{line}");
            }
            let _ = writeln!(md, "```\n");
            if let Some(failure) = &v.first_failure {
                let _ = writeln!(md, "First failure: {failure}\n");
            }
        }
        if !self.plots.is_empty() {
            let _ = writeln!(md, "## Plots\n");
            for plot in &self.plots {
                let _ = writeln!(md, "![{}]({plot})\n", plot.trim_end_matches(".svg").replace('_', " "));
            }
        }
        for workload in &self.workloads {
            let _ = writeln!(md, "## {}\n", workload.name);
            let _ =
                writeln!(md, "memcpy reference: {} GB/s\n", stat(workload.memcpy_bytes_per_second.as_ref(), 1e-9, 2));
            if let Some(compute) = workload.workload.compute_per_request() {
                let over: Vec<String> = workload
                    .paths
                    .iter()
                    .map(|c| format!("{} {} µs", c.path, stat(c.latency_p50_over_compute_ns.as_ref(), 1e-3, 1)))
                    .collect();
                let _ = writeln!(
                    md,
                    "Latency is per request (every layer, compute included); the compute alone takes {:.1} µs. p50 \
                     over the compute: {}.\n",
                    compute.as_secs_f64() * 1e6,
                    over.join(", ")
                );
            }
            let _ = writeln!(
                md,
                "| path | GB/s | vs memcpy | latency p50 µs | p99 µs | p999 µs | Host CPU/transfer µs (process) | (path) | transfers | failed batches |"
            );
            let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
            for cell in &workload.paths {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    cell.path,
                    stat(cell.bytes_per_second.as_ref(), 1e-9, 2),
                    stat(cell.vs_memcpy.as_ref(), 1.0, 2),
                    stat(cell.latency_p50_ns.as_ref(), 1e-3, 1),
                    stat(cell.latency_p99_ns.as_ref(), 1e-3, 1),
                    stat(cell.latency_p999_ns.as_ref(), 1e-3, 1),
                    stat(cell.process_cpu_ns_per_transfer.as_ref(), 1e-3, 2),
                    stat(cell.path_cpu_ns_per_transfer.as_ref(), 1e-3, 2),
                    cell.transfers,
                    cell.failed_batches
                );
            }
            let _ = writeln!(md);
            if workload.paths.iter().any(|c| c.sdma_busy_per_second.is_some() || c.aiv_executing_share.is_some()) {
                let _ = writeln!(md, "Occupancy (both devices; the twin runtime's model figures):\n");
                let _ = writeln!(
                    md,
                    "| path | AIV cores executing share | AI CPU busy s per s | SDMA engine-s per s | runtime copy s per s | device-model CPU/transfer µs |"
                );
                let _ = writeln!(md, "|---|---|---|---|---|---|");
                for cell in &workload.paths {
                    let _ = writeln!(
                        md,
                        "| {} | {} | {} | {} | {} | {} |",
                        cell.path,
                        stat(cell.aiv_executing_share.as_ref(), 1.0, 2),
                        stat(cell.aicpu_busy_per_second.as_ref(), 1.0, 2),
                        stat(cell.sdma_busy_per_second.as_ref(), 1.0, 2),
                        stat(cell.runtime_copy_busy_per_second.as_ref(), 1.0, 2),
                        stat(cell.device_model_cpu_ns_per_transfer.as_ref(), 1e-3, 2)
                    );
                }
                let _ = writeln!(md);
            }
        }
        if !self.faults.is_empty() {
            let _ = writeln!(md, "## Error recovery\n");
            let _ = writeln!(
                md,
                "A batch of 4 x 64 KiB WRITEs with the fault injected, then a fault-free batch after it was lifted.\n"
            );
            let _ = writeln!(
                md,
                "| path | fault | batch ended after ms | transfers | first reason | next batch served (ms) |"
            );
            let _ = writeln!(md, "|---|---|---|---|---|---|");
            for f in &self.faults {
                if !f.injected {
                    let reason = f.not_injected_reason.as_deref().unwrap_or("-");
                    let _ = writeln!(md, "| {} | {} | not injected: {reason} | | | |", f.path, f.fault);
                    continue;
                }
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} |",
                    f.path,
                    f.fault,
                    f.ended_after_ms.map_or("-".into(), |ms| format!("{ms:.1}")),
                    state_counts(&f.states),
                    f.first_reason.as_deref().unwrap_or("-").replace('|', "/"),
                    match (f.next_batch_served, f.next_batch_ms) {
                        (Some(served), Some(ms)) => format!("{} ({ms:.1})", if served { "yes" } else { "no" }),
                        _ => "-".into(),
                    }
                );
            }
            let _ = writeln!(md);
        }
        let killed: Vec<&FaultRound> =
            self.faults.iter().filter(|f| f.injected && f.pending_at_fault.is_some()).collect();
        if !killed.is_empty() {
            let _ = writeln!(
                md,
                "killed_peer: a target in another process SIGKILLed with the batch pending; the batch's end is timed \
                 from the kill, then a new transfer to the dead segment, then the next batch to the in-process target.\n"
            );
            for f in killed {
                let _ = writeln!(
                    md,
                    "- {}: {} of {} pending at the kill; a new transfer to the dead peer: {} in {} ms ({})",
                    f.path,
                    f.pending_at_fault.unwrap_or(0),
                    f.states.len(),
                    f.dead_peer_state.as_deref().unwrap_or("-"),
                    f.dead_peer_ms.map_or("-".into(), |ms| format!("{ms:.1}")),
                    f.dead_peer_reason.as_deref().unwrap_or("-")
                );
            }
            let _ = writeln!(md);
        }
        let warned: Vec<&FaultRound> = self
            .faults
            .iter()
            .filter(|f| !f.expected_warnings.is_empty() || !f.unexpected_warnings.is_empty())
            .collect();
        if !warned.is_empty() {
            let _ = writeln!(
                md,
                "Warnings: those a round provokes on purpose are recorded, not printed; any other was printed too.\n"
            );
            for f in warned {
                let phrases = [
                    super::warnings::summary(&f.expected_warnings, "expected"),
                    super::warnings::summary(&f.unexpected_warnings, "unexpected"),
                ];
                let phrases: Vec<&str> = phrases.iter().map(String::as_str).filter(|p| !p.is_empty()).collect();
                let _ = writeln!(md, "- {} {}: {}: see report.json", f.path, f.fault, phrases.join("; "));
            }
            let _ = writeln!(md);
        }
        if !self.warnings.is_empty() {
            let _ = writeln!(md, "## Warnings\n");
            let _ = writeln!(md, "Logged outside the error-recovery rounds (printed, and recorded in report.json):\n");
            for w in &self.warnings {
                let _ = writeln!(md, "- {} `{}`: {} ×{}", w.level, w.target, w.message.replace('|', "/"), w.count);
            }
            let _ = writeln!(md);
        }
        if !self.allocation.is_empty() {
            let _ = writeln!(md, "## Allocation success\n");
            let _ = writeln!(
                md,
                "A heap requested in chunks (64 MiB, a refused chunk halved down to 1 MiB), registered with one engine, \
                 then freed; pages are granted, not touched.\n"
            );
            let _ = writeln!(
                md,
                "| memory | paths | requested | obtained | chunks | ended | first refusal | registration s per GiB |"
            );
            let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
            for a in &self.allocation {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    a.memory,
                    a.paths.join(", "),
                    size_name(a.requested_bytes),
                    size_name(a.obtained_bytes),
                    a.chunks,
                    a.ended,
                    a.first_refusal.as_deref().unwrap_or("-").replace('|', "/"),
                    match (a.registration_s_per_gib, &a.registration_error) {
                        (_, Some(error)) => format!("failed: {}", error.replace('|', "/")),
                        (Some(per_gib), None) => format!("{per_gib:.4}"),
                        (None, None) => "-".into(),
                    }
                );
            }
            let _ = writeln!(md);
        }
        if !self.traces.is_empty() {
            let _ = writeln!(md, "## Traces\n");
            let _ = writeln!(
                md,
                "One extra traced cell per workload and path after the measured rounds (which ran untraced): a Chrome \
                 trace event file each, for Perfetto's UI or `chrome://tracing` (docs/trace.md). Device timestamps \
                 come from the twin runtime's model of the system counter, unverified on hardware.\n"
            );
            let _ = writeln!(md, "| workload | path | file | events (host / device / engine) | dropped | traced / untraced bandwidth | clock error |");
            let _ = writeln!(md, "|---|---|---|---|---|---|---|");
            for t in &self.traces {
                let _ = writeln!(
                    md,
                    "| {} | {} | `{}` | {} ({} / {} / {}) | {} | {} | {} |",
                    t.workload,
                    t.path,
                    t.file,
                    t.events,
                    t.host_events,
                    t.device_events,
                    t.engine_runs,
                    t.dropped,
                    t.traced_over_untraced.map_or("-".into(), |r| format!("{r:.3}")),
                    if t.clock_error_ns.is_empty() {
                        "-".into()
                    } else {
                        t.clock_error_ns.iter().map(|e| format!("{:.1} µs", e / 1e3)).collect::<Vec<_>>().join(", ")
                    }
                );
            }
            let _ = writeln!(md);
        }
        if !self.registration.is_empty() {
            let _ = writeln!(md, "## Registration\n");
            for r in &self.registration {
                let _ = writeln!(
                    md,
                    "- {} memory: {} in {:.3} ms ({:.3} s per GiB)",
                    r.memory,
                    size_name(r.bytes),
                    r.seconds * 1e3,
                    r.seconds_per_gib
                );
            }
            let _ = writeln!(md);
        }
        if let Some(mooncake) = &self.mooncake {
            mooncake.markdown(&mut md, "mooncake-ascend", "Mooncake's own Ascend Direct");
        }
        if let Some(mooncake) = &self.mooncake_over_aiv {
            mooncake.markdown(
                &mut md,
                "mooncake-ascend+aiv",
                "Mooncake's own Ascend Direct over aiv (its libllm_datadist.so this project's engine, protocol aiv)",
            );
        }
        if let Some(cross) = &self.cross_host {
            cross.markdown(&mut md);
        }
        let _ = writeln!(md, "## Caveats\n");
        if on_twin {
            let _ = writeln!(
                md,
                "- Twin runtime: the device is a CPU model. Its AIV cores and SDMA engines are threads on the same CPUs \
                 as the Host's threads, so device-side work slows the Host and the reference, which an NPU's would not."
            );
        }
        let _ = writeln!(
            md,
            "- Host CPU per transfer (process) counts every Host thread of the process, the device model's threads left \
             out; (path) is the path's own attribution (docs/cpu-accounting.md)."
        );
        let _ = writeln!(
            md,
            "- Latency is per batch, submit to the end of its wait; with batches of 1 it is per transfer."
        );
        let _ = writeln!(
            md,
            "- The memcpy reference copies the workload's blocks with the workload's threads between two Host buffers: \
             a path that spreads a batch over more engines (aiv: its blocks' SDMA channels) can exceed it."
        );
        let _ =
            writeln!(md, "- Every number above is in report.json next to this file, with every round's raw figures.");
        md
    }
}

impl MooncakeRecord {
    fn markdown(&self, md: &mut String, path: &str, what: &str) {
        let _ = writeln!(md, "## {path}\n");
        let _ = writeln!(
            md,
            "{what}: mooncake-transfer-engine-npu {} on Python {}, runtime {}.\n",
            self.wheel.as_deref().unwrap_or("(version unknown)"),
            self.python.as_deref().unwrap_or("(unknown)"),
            self.runtime.as_deref().unwrap_or("without twin evidence (not observable)")
        );
        let _ = writeln!(
            md,
            "ADXL engine selected: {}; ASCEND_GLOBAL_RESOURCE_CONFIG: {}.\n",
            self.engine.as_deref().unwrap_or("(not logged)"),
            self.global_resource_config.as_deref().map_or("unset".to_owned(), |c| format!("`{c}`"))
        );
        for caveat in &self.caveats {
            let _ = writeln!(md, "- {caveat}");
        }
        let _ = writeln!(md);
        match &self.data_check {
            Some(check) => {
                let _ = writeln!(
                    md,
                    "Data check: **{}**: {}\n",
                    if check.passed { "passed" } else { "failed" },
                    check.detail.replace('|', "/")
                );
            }
            None => {
                let _ = writeln!(md, "Data check: not run.\n");
            }
        }
        if let Some(evidence) = &self.evidence {
            let counts: Vec<String> = evidence.iter().map(|(name, count)| format!("{name} {count}")).collect();
            let _ = writeln!(md, "Twin evidence counts over the cells, both processes: {}.\n", counts.join(", "));
        }
        for skipped in &self.skipped_workloads {
            let _ = writeln!(md, "- Not run for workload {}: {}", skipped.workload, skipped.reason);
        }
        for failed in &self.failed_cells {
            let _ = writeln!(md, "- Failed: {} round {}: {}", failed.workload, failed.round + 1, failed.reason);
        }
        if !self.skipped_workloads.is_empty() || !self.failed_cells.is_empty() {
            let _ = writeln!(md);
        }
    }
}

fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| first.to_uppercase().chain(chars).collect())
}

/// `median [min - max]` of `stats` scaled by `scale`, or `-`.
fn stat(stats: Option<&Stats>, scale: f64, digits: usize) -> String {
    match stats {
        None => "-".into(),
        Some(s) if s.n == 1 => format!("{:.*}", digits, s.median * scale),
        Some(s) => {
            format!("{:.*} [{:.*} - {:.*}]", digits, s.median * scale, digits, s.min * scale, digits, s.max * scale)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_states_are_counted_by_run() {
        let states = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            state_counts(&states(&["completed", "failed", "completed", "completed"])),
            "completed, failed, completed x 2"
        );
        assert_eq!(state_counts(&states(&["failed"; 64])), "failed x 64");
        assert_eq!(state_counts(&[]), "");
    }

    #[test]
    fn stats_give_the_median_and_nearest_rank_percentiles() {
        let s = Stats::of([5.0, 1.0, 3.0, 2.0, 4.0]).expect("values");
        assert_eq!((s.n, s.median, s.min, s.max, s.p10, s.p90), (5, 3.0, 1.0, 5.0, 1.0, 5.0));
        let s = Stats::of((1..=10).map(f64::from)).expect("values");
        assert_eq!((s.median, s.p10, s.p90), (5.5, 1.0, 9.0));
        assert!(Stats::of([f64::NAN]).is_none());
        assert!(Stats::of(Vec::<f64>::new()).is_none());
    }

    #[test]
    fn sizes_are_named_in_the_largest_whole_unit() {
        assert_eq!(size_name(4096), "4 KiB");
        assert_eq!(size_name(16 << 20), "16 MiB");
        assert_eq!(size_name(1000), "1000 B");
        assert_eq!(size_name(3 << 29), "1536 MiB");
    }
}
