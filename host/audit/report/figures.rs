//! The measured figures: one cell's measurement per round, its device occupancy, the memcpy reference, and per
//! workload each path's statistics over the rounds ([`Stats`]: median, spread, percentiles) with the latency CDF.

use serde::{Deserialize, Serialize};

use super::Workload;
use crate::transfer::Protocol;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_give_the_median_and_nearest_rank_percentiles() {
        let s = Stats::of([5.0, 1.0, 3.0, 2.0, 4.0]).expect("values");
        assert_eq!((s.n, s.median, s.min, s.max, s.p10, s.p90), (5, 3.0, 1.0, 5.0, 1.0, 5.0));
        let s = Stats::of((1..=10).map(f64::from)).expect("values");
        assert_eq!((s.median, s.p10, s.p90), (5.5, 1.0, 9.0));
        assert!(Stats::of([f64::NAN]).is_none());
        assert!(Stats::of(Vec::<f64>::new()).is_none());
    }
}
