//! `aiv audit --trace`: one extra traced cell per workload and path, after that workload's measured rounds (which
//! stay untraced), exported as a Chrome trace event file per cell (docs/trace.md).
//!
//! Owns: running the traced cell (tracing switched on for it alone), the file name, the document's metadata and the
//! report's [`TraceRecord`]. It must not change a measured round: those run before the switch goes on.

use std::collections::BTreeMap;

use serde_json::json;

use super::options::AuditOptions;
use super::report::{TraceRecord, Workload, WorkloadReport};
use super::{measure, Rig};
use crate::error::Result;
use crate::transfer::Protocol;

/// A file-name slug of a workload: `4KiB-x1-t1`, `kv-request`, `kv-layerwise`, `store`.
pub fn workload_slug(workload: &Workload) -> String {
    match &workload.shape {
        None => format!(
            "{}-x{}-t{}",
            super::report::size_name(workload.block_size).replace(' ', ""),
            workload.batch_size,
            workload.threads
        ),
        Some(super::report::Shape::KvRequest(_)) => "kv-request".into(),
        Some(super::report::Shape::KvLayerwise { .. }) => "kv-layerwise".into(),
        Some(super::report::Shape::Store { .. }) => "store".into(),
    }
}

/// Runs `workload` on `path` once more with tracing on, and returns the report's record and the document to write.
pub(super) fn traced_cell(
    rig: &Rig,
    options: &AuditOptions,
    workload: &Workload,
    path: Protocol,
    measured: &WorkloadReport,
) -> Result<(TraceRecord, serde_json::Value)> {
    let engine = &rig.initiator;
    // Whatever an earlier cell left is not this cell's. set_trace returns once the persistent kernels took the switch.
    engine.set_trace(true)?;
    let _ = engine.take_trace();
    let outcome = measure(rig, options, workload, path);
    let switched_off = engine.set_trace(false);
    let log = engine.take_trace();
    let outcome = outcome?;
    switched_off?;
    let file = format!("trace-{}-{}.json", workload_slug(workload), path.as_str());
    let mut metadata = BTreeMap::new();
    metadata.insert("workload".to_owned(), json!(workload.name()));
    metadata.insert("path".to_owned(), json!(path.as_str()));
    metadata.insert("cell_s".to_owned(), json!(options.cell.as_secs_f64()));
    metadata.insert(
        "device_timestamps".to_owned(),
        json!(
            "the kernel's system counter (AscendC GetSystemCycle) as the twin runtime models it: unverified on \
               hardware"
        ),
    );
    let document = crate::trace::chrome_trace(&log, path.as_str(), &metadata);
    let untraced = measured
        .paths
        .iter()
        .find(|cell| cell.path == path.as_str())
        .and_then(|cell| cell.bytes_per_second.as_ref())
        .map(|stats| stats.median);
    let traced = outcome.bytes_per_second();
    let record = TraceRecord {
        file,
        workload: workload.name(),
        path: path.as_str().to_owned(),
        events: log.events(),
        host_events: log.host.len(),
        device_events: log.device.len(),
        engine_runs: log.engine.len(),
        dropped: log.device_dropped + log.host_dropped,
        traced_bytes_per_second: traced,
        untraced_median_bytes_per_second: untraced,
        traced_over_untraced: untraced.filter(|u| *u > 0.0).map(|u| traced / u),
        clock_error_ns: crate::trace::align_clocks(&log).iter().filter_map(|a| a.error_ns).collect(),
    };
    Ok((record, document))
}
