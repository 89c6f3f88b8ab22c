//! A Mooncake path's verdict from the twin runtime's counts in its processes: [`TwinCounts`] (`cannTwinEvidence`
//! version 2, in its one definition), the layout the driver reads them by ([`evidence_spec`]), their deltas and sums
//! over cells and processes, and the acts and checks they amount to ([`tally_from_counts`], by the rules of
//! docs/evidence.md). The same rules for every Mooncake path, whichever `libllm_datadist.so` its processes load: the
//! verdict follows what the runtime saw done, not the path's name.

use std::collections::BTreeMap;

use cann_twin::evidence::CannTwinEvidenceV2;
use serde_json::Value;

use crate::evidence::{Act, ActTotals, EvidenceTally, RuntimeKind, RuntimeLabel, Source};

/// The twin runtime's counts (`cannTwinEvidence` version 2), in its one definition,
/// [`cann_twin::evidence::CannTwinEvidenceV2`]: the driver gets the names of its counts (in layout order), the version
/// and the size from [`evidence_spec`] and builds its ctypes structure from them, then sends the counts by name. A
/// count the driver does not send is 0. Every name is read through that definition
/// ([`CannTwinEvidenceV2::count_names`], or a field of the structure), none from a list here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TwinCounts(pub CannTwinEvidenceV2);

/// What the driver needs to read the counts: `{"version": 2, "size": <bytes>, "counts": [<name>, ...]}`, the very
/// layout the twin library exports as `cannTwinEvidenceLayout` ([`cann_twin::evidence::layout_json`]).
pub fn evidence_spec() -> Value {
    let text = cann_twin::evidence::layout_json().to_str().unwrap_or_default();
    serde_json::from_str(text).unwrap_or(Value::Null)
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

    pub(super) fn get(&self, name: &str) -> u64 {
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
    pub(super) fn delta(after: &TwinCounts, before: &TwinCounts) -> TwinCounts {
        let mut delta = TwinCounts::from_fn(|name| after.get(name).saturating_sub(before.get(name)));
        let (a, b) = (&after.0.base, &before.0.base);
        delta.0.base.provenance_recorded = a.provenance_recorded.min(b.provenance_recorded);
        delta.0.base.sdma_channels = a.sdma_channels.max(b.sdma_channels);
        delta
    }

    /// Adds `other` (another cell or the other process); state counts: recorded only if both were, channels summed.
    pub(super) fn add(&mut self, other: &TwinCounts) {
        let empty = self == &TwinCounts::default();
        let mut sum = TwinCounts::from_fn(|name| self.get(name).saturating_add(other.get(name)));
        let (mine, theirs) = (self.0.base.provenance_recorded, other.0.base.provenance_recorded);
        sum.0.base.provenance_recorded = if empty { theirs } else { mine.min(theirs) };
        *self = sum;
    }

    pub(super) fn as_map(&self) -> BTreeMap<String, u64> {
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
pub(super) struct Snapshot {
    pub(super) host_cpu_ns: u64,
    pub(super) device_model_cpu_ns: u64,
    pub(super) evidence: Option<TwinCounts>,
}

pub(super) fn snapshot_of(value: Option<&Value>) -> Snapshot {
    let Some(value) = value else { return Snapshot::default() };
    Snapshot {
        host_cpu_ns: value.get("host_cpu_ns").and_then(Value::as_u64).unwrap_or(0),
        device_model_cpu_ns: value.get("device_model_cpu_ns").and_then(Value::as_u64).unwrap_or(0),
        evidence: value.get("evidence").and_then(TwinCounts::from_json),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::{Check, Submitter};
    use serde_json::json;

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
        assert_eq!(names, CannTwinEvidenceV2::count_names().collect::<Vec<_>>());
        // The driver keeps no list of its own.
        assert!(
            !super::super::driver::DRIVER.contains("\"sqes_by_kernel\""),
            "the driver must not name the counts itself"
        );
    }
}
