//! What one run measured ([`BenchOutcome`]): throughput, the batch-latency histogram, the evidence summed over its
//! transfers, and `transfer_engine_bench`'s result line.

use std::time::Duration;

use hdrhistogram::Histogram;

use super::params::BenchParams;
use crate::evidence::{EvidenceTally, TransferEvidence};

/// Longest batch latency a histogram tells apart (longer ones count as this): one hour, in nanoseconds.
const LATENCY_MAX_NS: u64 = 3_600_000_000_000;

/// An empty batch-latency histogram: nanoseconds from 1 to one hour, 3 significant digits (about 250 KiB, fixed).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("constant bounds are valid")
}

/// Per-transfer averages of the recorded evidence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EvidenceSummary {
    /// Transfers that recorded evidence.
    pub transfers: u64,
    /// A representative record (the first one seen).
    pub sample: Option<TransferEvidence>,
    /// Every record's acts summed and checks counted: the run's verdict (`EvidenceTally::checks`).
    pub tally: EvidenceTally,
    /// Mean Host device-API calls per transfer.
    pub host_device_api_calls: f64,
    /// Mean descriptors per transfer.
    pub descriptors: f64,
    /// Mean doorbells per transfer.
    pub doorbells: f64,
    /// Mean Host CPU nanoseconds per transfer of the path's own threads and sections.
    pub host_cpu_ns: f64,
    /// Mean Host CPU nanoseconds per transfer of the threads that waited for it (charged to the path too).
    pub waiting_cpu_ns: f64,
    /// Thread-CPU clock readings made in the process during the run, per transfer (the accounting's own share).
    pub clock_readings: f64,
    /// Cost of one such reading, measured just before the run (ns).
    pub clock_reading_ns: f64,
    /// Monotonic-clock readings of never-sleeping sections during the run, per transfer (`SectionClock::Monotonic`).
    pub monotonic_readings: f64,
    /// Cost of one such reading, measured just before the run (ns).
    pub monotonic_reading_ns: f64,
    /// On-CPU time of every Host thread of the process during the run, per transfer (the benchmark loop, the engine
    /// and the paths' own threads; the twin's device-emulation threads left out), from the kernel's per-thread
    /// accounting: the figure no attribution can move work out of. `None` where /proc could not be read.
    pub process_host_cpu_ns: Option<f64>,
    /// Transfers per route, for a path with more than one (aiv: `sdma`, `rdma`; [`TransferEvidence::route`]); empty
    /// for the others.
    pub routes: std::collections::BTreeMap<&'static str, u64>,
}

#[derive(Debug, Default)]
pub(super) struct EvidenceTotals {
    pub(super) transfers: u64,
    pub(super) routes: std::collections::BTreeMap<&'static str, u64>,
    pub(super) sample: Option<TransferEvidence>,
    pub(super) tally: EvidenceTally,
    pub(super) host_device_api_calls: u64,
    pub(super) descriptors: u64,
    pub(super) doorbells: u64,
    pub(super) host_cpu_ns: u64,
    pub(super) waiting_cpu_ns: u64,
}

impl EvidenceTotals {
    pub(super) fn add(&mut self, evidence: TransferEvidence) {
        self.transfers += 1;
        self.host_device_api_calls += evidence.host_device_api_calls;
        self.descriptors += evidence.descriptors;
        self.doorbells += evidence.doorbells;
        self.host_cpu_ns += evidence.host_cpu_ns;
        self.waiting_cpu_ns += evidence.waiting_cpu_ns;
        if let Some(route) = evidence.route {
            *self.routes.entry(route).or_default() += 1;
        }
        self.tally.add(&evidence);
        self.sample.get_or_insert(evidence);
    }

    pub(super) fn summary(&self) -> EvidenceSummary {
        let n = self.transfers.max(1) as f64;
        EvidenceSummary {
            transfers: self.transfers,
            sample: self.sample.clone(),
            tally: self.tally.clone(),
            host_device_api_calls: self.host_device_api_calls as f64 / n,
            descriptors: self.descriptors as f64 / n,
            doorbells: self.doorbells as f64 / n,
            host_cpu_ns: self.host_cpu_ns as f64 / n,
            waiting_cpu_ns: self.waiting_cpu_ns as f64 / n,
            clock_readings: 0.0,
            clock_reading_ns: 0.0,
            monotonic_readings: 0.0,
            monotonic_reading_ns: 0.0,
            process_host_cpu_ns: None,
            routes: self.routes.clone(),
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct BenchOutcome {
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Batches whose every task completed.
    pub completed_batches: u64,
    /// Batches with a failed or timed-out task.
    pub failed_batches: u64,
    /// The first failure reason seen, if any.
    pub first_failure: Option<String>,
    /// The evidence the transfers recorded.
    pub evidence: EvidenceSummary,
    /// Bytes per completed batch.
    pub bytes_per_batch: u64,
    /// Wall time of each batch from submit to the end of its wait, in nanoseconds (batch size 1: per-transfer
    /// latency); a histogram of fixed size, so a long run does not grow memory per batch.
    pub batch_latencies: Histogram<u64>,
    /// What the run kept busy: the twin's AIV cores (executing vs polling) and SDMA engines, Host CPU by thread role
    /// (docs/occupancy.md). On the vendor's runtime the device part says it is not exposed.
    pub occupancy: crate::occupancy::Occupancy,
    /// When the run began and ended, in the profiler's time (Unix microseconds): the window whose tasks the run's
    /// device-side observer counts ([`observe_run`]).
    pub window: crate::device::cann::profiler::Window,
}

impl BenchOutcome {
    /// Throughput in bytes per second, as `transfer_engine_bench` computes it.
    pub fn bytes_per_second(&self) -> f64 {
        self.completed_batches as f64 * self.bytes_per_batch as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q`-quantile (0..=1) of the batch latencies (within 0.1%); zero when nothing ran.
    pub fn latency_quantile(&self, q: f64) -> Duration {
        if self.batch_latencies.is_empty() {
            return Duration::ZERO;
        }
        let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        Duration::from_nanos(self.batch_latencies.value_at_quantile(q))
    }

    /// `transfer_engine_bench`'s result line, to the letter.
    pub fn result_line(&self, params: &BenchParams) -> String {
        format!(
            "Test completed: duration {:.2}, batch count {}, throughput {:.*} {}/s",
            self.elapsed.as_secs_f64(),
            self.completed_batches,
            params.report_precision,
            self.bytes_per_second() / params.report_unit.bytes,
            params.report_unit.name,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::ReportUnit;
    use crate::transfer::{Opcode, Protocol};

    #[test]
    fn latencies_take_fixed_memory_however_many_batches_run() {
        let mut histogram = latency_histogram();
        let before = histogram.distinct_values();
        for i in 0..1_000_000u64 {
            histogram.saturating_record(1 + i % 5_000_000);
        }
        // Out-of-range values saturate instead of failing or growing the histogram.
        histogram.saturating_record(u64::MAX);
        assert_eq!(histogram.len(), 1_000_001);
        assert_eq!(histogram.distinct_values(), before, "the counts array never grows");
        assert!(histogram.max() >= LATENCY_MAX_NS * 999 / 1000);
    }

    #[test]
    fn result_line_matches_transfer_engine_bench() {
        let params = BenchParams {
            operation: Opcode::Write,
            protocol: Protocol::Tcp,
            buffer_size: 1 << 30,
            batch_size: 128,
            block_size: 65536,
            duration: Duration::from_secs(3),
            threads: 12,
            report_unit: "GB".parse().expect("GB is a unit"),
            report_precision: 2,
        };
        let outcome = BenchOutcome {
            elapsed: Duration::from_millis(3000),
            completed_batches: 2429,
            failed_batches: 0,
            first_failure: None,
            evidence: EvidenceSummary::default(),
            bytes_per_batch: 128 * 65536,
            window: crate::device::cann::profiler::Window { start_us: 0.0, end_us: 0.0 },
            occupancy: {
                let before = crate::occupancy::OccupancySnapshot::take(&[], false);
                crate::occupancy::OccupancySnapshot::take(&[], false).since(&before)
            },
            batch_latencies: {
                let mut histogram = latency_histogram();
                for micros in 1..=100 {
                    histogram.record(micros * 1000).expect("in range");
                }
                histogram
            },
        };
        // Within the histogram's 3 significant digits of the nearest-rank values 50 us and 99 us.
        let near = |got: Duration, micros: f64| (got.as_secs_f64() * 1e6 - micros).abs() <= micros * 1e-3;
        assert!(near(outcome.latency_quantile(0.5), 50.0), "{:?}", outcome.latency_quantile(0.5));
        assert!(near(outcome.latency_quantile(0.99), 99.0), "{:?}", outcome.latency_quantile(0.99));
        // 2429 * 128 * 65536 / 3 s = 6.79 GB/s
        assert_eq!(
            outcome.result_line(&params),
            "Test completed: duration 3.00, batch count 2429, throughput 6.79 GB/s"
        );
        assert!("GiB".parse::<ReportUnit>().is_ok());
        assert!("gb".parse::<ReportUnit>().is_err());
        let too_big = BenchParams { buffer_size: 1 << 20, ..params };
        assert!(too_big.validate().expect_err("does not fit").to_string().contains("does not fit"));
    }
}
