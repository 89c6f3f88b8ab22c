//! The report's sections beside the workloads' figures: allocation success, the Mooncake paths' records, the traced
//! cells and the error-recovery rounds.

use serde::{Deserialize, Serialize};

use crate::audit::warnings::WarningRecord;

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
