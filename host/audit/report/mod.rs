//! The audit's report: `report.json` (schema [`AUDIT_SCHEMA`], documented in docs/audit.md) and `report.md`, every
//! number of which is read from the JSON document.
//!
//! The parts: this file the document's root ([`AuditReport`]) and reading it back; [`environment`] where and how the
//! audit ran; [`workload`] what a workload is; [`figures`] the measured figures per round, cell and workload;
//! [`verdict`] each path's verdict from its evidence; [`sections`] the error-recovery rounds, allocation success,
//! the Mooncake paths' records and the traced cells; [`markdown`] `report.md`, rendered from the document.

mod environment;
mod figures;
mod markdown;
mod sections;
mod verdict;
mod workload;

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::warnings::WarningRecord;

pub use environment::{ConfigRecord, Environment, Method, Registration, Skipped};
pub use figures::{CellOccupancy, CellStats, ReferenceRound, RoundResult, Stats, WorkloadReport, CDF_QUANTILES};
pub(crate) use markdown::verdict_table;
pub use sections::{Allocation, DataCheck, FailedCell, FaultRound, MooncakeRecord, SkippedWorkload, TraceRecord};
pub use verdict::PathVerdict;
pub use workload::{size_name, KvCache, Shape, Workload};

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

/// Now, as RFC 3339 in UTC to the second.
pub fn utc_now() -> String {
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
}
