//! `report.md`: method, environment, the verdicts with their evidence, a table per workload, the error-recovery
//! rounds, warnings, allocation success, traces, registration, the Mooncake paths and the cross-host section, the
//! caveats; every number read from the report's document.

use std::fmt::Write as _;

use super::{size_name, AuditReport, FaultRound, MooncakeRecord, PathVerdict, Stats};
use crate::audit::warnings;

impl AuditReport {
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
            "Machine: {} logical CPUs ({}), {} of memory, {}{}.\n",
            self.environment.cpus,
            self.environment.cpu_model.as_deref().unwrap_or("model unknown"),
            self.environment
                .memory_bytes
                .map_or("unknown".into(), |m| format!("{:.1} GiB", m as f64 / (1u64 << 30) as f64)),
            self.environment.os,
            self.environment.load_average.map_or(String::new(), |[one, five, fifteen]| format!(
                "; load average {one:.2}, {five:.2}, {fifteen:.2} at the start"
            )),
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
        md.push_str(&verdict_table(&self.verdicts));
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
                    warnings::summary(&f.expected_warnings, "expected"),
                    warnings::summary(&f.unexpected_warnings, "unexpected"),
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

/// Transfer states in order, runs of one state counted: `completed, failed, completed x 2`.
/// The verdicts as a Markdown table, one row per path: who submitted, the four AIV-direct checks and the counts
/// (report.md and the results pages).
pub(crate) fn verdict_table(verdicts: &[PathVerdict]) -> String {
    let mut md = String::from(
        "| path | submitted by | AIV-direct | kernel on AIV | writes descriptors | rings doorbell | completion on Device \
         | Host launches/transfer | transfers |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for v in verdicts {
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
    md
}

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
}
