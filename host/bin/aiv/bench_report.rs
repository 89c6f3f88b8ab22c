//! The printing of a bench run's report: the workload, the evidence and Host CPU, occupancy, latency, the memcpy
//! reference and transfer_engine_bench's result line; with `--json`, the JSON document on stdout.

use aiv_transport::bench::{self, BenchParams};

/// Prints what a bench run measured: the workload, the evidence, the memcpy reference, and the result line.
pub(crate) fn print_bench_report(
    params: &BenchParams,
    report: &bench::LoopbackReport,
    target: &str,
    json: bool,
) -> Result<(), String> {
    use std::io::Write as _;
    let outcome = &report.outcome;
    // With --json, stdout carries only the JSON document; the report for people goes to stderr.
    let mut out: Box<dyn std::io::Write> =
        if json { Box::new(std::io::stderr().lock()) } else { Box::new(std::io::stdout().lock()) };
    let _ = writeln!(
        out,
        "aiv bench: protocol {}, {} {} x {} B per batch, {} thread(s), {target}",
        params.protocol,
        params.operation.as_str(),
        params.batch_size,
        params.block_size,
        params.threads,
    );
    if let Some(sample) = &outcome.evidence.sample {
        let evidence = &outcome.evidence;
        let _ = writeln!(
            out,
            "evidence: path {}, {} transfers; per transfer: {:.2} host device-API calls (counted by the loader \
             tables), {:.2} descriptors, {:.2} doorbells",
            sample.path, evidence.transfers, evidence.host_device_api_calls, evidence.descriptors, evidence.doorbells,
        );
        // The verdict, derived from every record's observed acts, names the runtime they came from: on the twin
        // runtime it is the model's, not an NPU's.
        for line in evidence.tally.verdict_lines() {
            let _ = writeln!(out, "{line}");
        }
        // Host CPU: the whole process first (no attribution can move work out of it), then the path's share.
        match evidence.process_host_cpu_ns {
            Some(process) => {
                let _ = writeln!(
                    out,
                    "host CPU per transfer, whole process: {process:.0} ns on every Host thread (the waiting \
                     callers, the engine, the path's threads, the probe; the twin's device threads excluded); \
                     attributed to the path: {:.0} ns ({:.0}%: its own threads and sections {:.0} ns, the waiting \
                     callers {:.0} ns)",
                    evidence.host_cpu_ns + evidence.waiting_cpu_ns,
                    100.0 * (evidence.host_cpu_ns + evidence.waiting_cpu_ns) / process.max(1.0),
                    evidence.host_cpu_ns,
                    evidence.waiting_cpu_ns,
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "host CPU per transfer, whole process: not measured (/proc could not be read); attributed to \
                     the path: {:.0} ns (its own threads and sections {:.0} ns, the waiting callers {:.0} ns)",
                    evidence.host_cpu_ns + evidence.waiting_cpu_ns,
                    evidence.host_cpu_ns,
                    evidence.waiting_cpu_ns
                );
            }
        }
        // The accounting reads clocks, the thread CPU clock through a system call: say how much of the figure above
        // that is.
        let _ = writeln!(
            out,
            "host CPU accounting: sections that never sleep timed by the {} clock; per transfer {:.1} thread-CPU \
             clock readings at {:.0} ns each and {:.1} monotonic-clock readings at {:.0} ns each (up to {:.0} ns of \
             the host CPU above is the measurement itself)",
            aiv_transport::cpu_time::section_clock().name(),
            evidence.clock_readings,
            evidence.clock_reading_ns,
            evidence.monotonic_readings,
            evidence.monotonic_reading_ns,
            evidence.clock_readings * evidence.clock_reading_ns
                + evidence.monotonic_readings * evidence.monotonic_reading_ns,
        );
    }
    // What the run kept busy: the twin's cores and engines (a CPU model), Host CPU by thread role.
    let _ = write!(out, "{}", outcome.occupancy);
    let _ = writeln!(
        out,
        "latency per batch: p50 {:.1} us, p99 {:.1} us over {} batches",
        outcome.latency_quantile(0.5).as_secs_f64() * 1e6,
        outcome.latency_quantile(0.99).as_secs_f64() * 1e6,
        outcome.batch_latencies.len()
    );
    let throughput = outcome.bytes_per_second();
    let _ = writeln!(
        out,
        "reference: memcpy {:.2} GB/s in the same run; this path reached {:.3}x memcpy",
        report.memcpy_bytes_per_second / 1e9,
        throughput / report.memcpy_bytes_per_second.max(1.0)
    );
    if outcome.failed_batches > 0 {
        eprintln!(
            "aiv: {} batch(es) failed; first reason: {}",
            outcome.failed_batches,
            outcome.first_failure.as_deref().unwrap_or("none recorded")
        );
    }
    eprintln!("{}", outcome.result_line(params));
    if json {
        drop(out);
        let document = bench::report_json(params, report, target);
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{document}")
            .and_then(|()| stdout.flush())
            .map_err(|e| format!("write the JSON report: {e}"))?;
    }
    // transfer_engine_bench users script against the exit code: any failed batch is a failed run.
    if outcome.failed_batches > 0 {
        return Err(format!(
            "{} of {} batch(es) failed",
            outcome.failed_batches,
            outcome.failed_batches.saturating_add(outcome.completed_batches)
        ));
    }
    Ok(())
}
