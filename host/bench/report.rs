//! A run's report: [`LoopbackReport`] (the outcome with its memcpy reference) and the JSON document of
//! `aiv bench --json` ([`report_json`]).

use super::outcome::BenchOutcome;
use super::params::BenchParams;

/// The version of [`report_json`]'s document; bumped when a field changes meaning or goes away.
pub const REPORT_SCHEMA: &str = "aiv-bench/3";

/// A run as one JSON document (`aiv bench --json`), for the audit and for scripts: the parameters, the results with
/// the same-run memcpy reference, batch latency quantiles, and the evidence: the records' runtime, the four
/// AIV-direct checks of the run (derived from every record's acts, summed) with the counts behind them, how each
/// transfer's own checks came out, the per-transfer means and a sample record.
pub fn report_json(params: &BenchParams, report: &LoopbackReport, target: &str) -> serde_json::Value {
    let outcome = &report.outcome;
    let evidence = &outcome.evidence;
    let quantile = |q: f64| outcome.latency_quantile(q).as_nanos() as u64;
    let tally = &evidence.tally;
    let checks = tally.checks();
    let checks = serde_json::json!({
        "kernel_on_aiv": checks.kernel_on_aiv,
        "kernel_writes_descriptors": checks.kernel_writes_descriptors,
        "kernel_rings_doorbell": checks.kernel_rings_doorbell,
        "device_observes_completion": checks.device_observes_completion,
        "aiv_direct": checks.aiv_direct(),
    });
    let per_check = |i: usize| tally.per_transfer[i];
    let per_transfer_checks = serde_json::json!({
        "kernel_on_aiv": per_check(0),
        "kernel_writes_descriptors": per_check(1),
        "kernel_rings_doorbell": per_check(2),
        "device_observes_completion": per_check(3),
        "aiv_direct": per_check(4),
    });
    serde_json::json!({
        "schema": REPORT_SCHEMA,
        "workload": {
            "protocol": params.protocol.as_str(),
            "operation": params.operation.as_str(),
            "batch_size": params.batch_size,
            "block_size": params.block_size,
            "threads": params.threads,
            "buffer_size": params.buffer_size,
            "duration_s": params.duration.as_secs_f64(),
            "target": target,
        },
        "result": {
            "elapsed_s": outcome.elapsed.as_secs_f64(),
            "completed_batches": outcome.completed_batches,
            "failed_batches": outcome.failed_batches,
            "first_failure": outcome.first_failure,
            "bytes_per_second": outcome.bytes_per_second(),
            "memcpy_bytes_per_second": report.memcpy_bytes_per_second,
        },
        "batch_latency_ns": {
            "batches": outcome.batch_latencies.len(),
            "p50": quantile(0.5),
            "p99": quantile(0.99),
            "p999": quantile(0.999),
            "max": outcome.batch_latencies.max(),
        },
        "evidence": {
            "transfers": evidence.transfers,
            "runtime": tally.runtime,
            "submitted_by": tally.submitter(),
            "observer": tally.observer,
            "checks": checks,
            "acts": {
                "descriptors_written": tally.descriptors_written,
                "doorbells_rung": tally.doorbells_rung,
                "completion_seen": tally.completion_seen,
            },
            "per_transfer_checks": per_transfer_checks,
            "per_transfer_submitted_by": tally.per_transfer_submitters,
            "routes": evidence.routes,
            "per_transfer": {
                "host_device_api_calls": evidence.host_device_api_calls,
                "host_launches": tally.host_launches_per_transfer(),
                "descriptors": evidence.descriptors,
                "doorbells": evidence.doorbells,
                "host_cpu_ns": evidence.host_cpu_ns,
                "waiting_cpu_ns": evidence.waiting_cpu_ns,
                "process_host_cpu_ns": evidence.process_host_cpu_ns,
                "clock_readings": evidence.clock_readings,
                "clock_reading_ns": evidence.clock_reading_ns,
                "monotonic_readings": evidence.monotonic_readings,
                "monotonic_reading_ns": evidence.monotonic_reading_ns,
            },
            "sample": evidence.sample,
        },
        "occupancy": outcome.occupancy,
    })
}

/// What an in-process run measured, with its same-run reference.
#[derive(Clone, Debug)]
pub struct LoopbackReport {
    /// The engine workload.
    pub outcome: BenchOutcome,
    /// Plain memcpy of the same block size over the same buffers, bytes per second.
    pub memcpy_bytes_per_second: f64,
}
