//! `aiv audit --compare A B`: what differs between two reports — where they ran, how, and per workload and path the
//! medians side by side with their ratio, and any verdict that changed.

use std::fmt::Write as _;

use super::report::{AuditReport, CellStats, Stats};

/// The comparison as text (Markdown). `B / A` ratios: above 1 means B's figure is larger.
pub fn compare(a: &AuditReport, b: &AuditReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# aiv audit: A vs B\n");
    let _ = writeln!(out, "A: {} ({})", a.started_utc, a.command.join(" "));
    let _ = writeln!(out, "B: {} ({})\n", b.started_utc, b.command.join(" "));
    let (ea, eb) = (&a.environment, &b.environment);
    let fields = [
        ("version", ea.version.clone(), eb.version.clone()),
        ("source commit", opt(&ea.source_commit), opt(&eb.source_commit)),
        ("device backend", ea.device_backend.clone(), eb.device_backend.clone()),
        ("runtime", a.runtime().unwrap_or("-").into(), b.runtime().unwrap_or("-").into()),
        ("logical CPUs", ea.cpus.to_string(), eb.cpus.to_string()),
        ("CPU model", opt(&ea.cpu_model), opt(&eb.cpu_model)),
        (
            "memory bytes",
            ea.memory_bytes.map_or("-".into(), |m| m.to_string()),
            eb.memory_bytes.map_or("-".into(), |m| m.to_string()),
        ),
        ("OS", ea.os.clone(), eb.os.clone()),
        ("rounds", a.method.rounds.to_string(), b.method.rounds.to_string()),
        ("seconds per cell", a.method.cell_s.to_string(), b.method.cell_s.to_string()),
        ("operation", a.method.operation.clone(), b.method.operation.clone()),
        ("section clock", a.method.section_clock.clone(), b.method.section_clock.clone()),
    ];
    let differing: Vec<_> = fields.iter().filter(|(_, x, y)| x != y).collect();
    if differing.is_empty() {
        let _ = writeln!(out, "Same environment and method (version, commit, runtime, machine, rounds, cell time).\n");
    } else {
        let same_machine = ea.cpus == eb.cpus && ea.cpu_model == eb.cpu_model && ea.memory_bytes == eb.memory_bytes;
        let _ = writeln!(
            out,
            "{}. What differs:\n",
            if same_machine {
                "The same machine"
            } else {
                "Different machines: ratios mix the machines' differences in"
            }
        );
        for (name, x, y) in differing {
            let _ = writeln!(out, "- {name}: A {x}, B {y}");
        }
        let _ = writeln!(out);
    }
    for verdict in &b.verdicts {
        match a.verdicts.iter().find(|v| v.path == verdict.path) {
            Some(before) if before.submitted_by != verdict.submitted_by || before.aiv_direct != verdict.aiv_direct => {
                let _ = writeln!(
                    out,
                    "**Verdict changed** for `{}`: submitted by {} (AIV-direct {}) in A, {} (AIV-direct {}) in B.\n",
                    verdict.path, before.submitted_by, before.aiv_direct, verdict.submitted_by, verdict.aiv_direct
                );
            }
            Some(_) => {}
            None => {
                let _ = writeln!(
                    out,
                    "`{}` is only in B (submitted by {}, AIV-direct {}).\n",
                    verdict.path, verdict.submitted_by, verdict.aiv_direct
                );
            }
        }
    }
    for verdict in a.verdicts.iter().filter(|v| !b.verdicts.iter().any(|w| w.path == v.path)) {
        let _ = writeln!(out, "`{}` is only in A.\n", verdict.path);
    }
    for wb in &b.workloads {
        let Some(wa) = a.workloads.iter().find(|w| w.workload == wb.workload) else {
            let _ = writeln!(out, "Workload {} is only in B.\n", wb.name);
            continue;
        };
        let _ = writeln!(out, "## {}\n", wb.name);
        let _ =
            writeln!(out, "| path | GB/s A | GB/s B | B/A | p50 µs A | p50 µs B | B/A | CPU/transfer µs A | B | B/A |");
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
        let memcpy = |w: &super::report::WorkloadReport| w.memcpy_bytes_per_second;
        let (ma, mb) = (memcpy(wa), memcpy(wb));
        row(&mut out, "memcpy", &[(ma.as_ref(), mb.as_ref(), 1e-9, 2), (None, None, 1.0, 0), (None, None, 1.0, 0)]);
        for cb in &wb.paths {
            match wa.paths.iter().find(|c| c.path == cb.path) {
                Some(ca) => cells(&mut out, ca, cb),
                None => {
                    let _ = writeln!(out, "| {} | only in B | | | | | | | | |", cb.path);
                }
            }
        }
        let _ = writeln!(out);
    }
    for wa in a.workloads.iter().filter(|w| !b.workloads.iter().any(|x| x.workload == w.workload)) {
        let _ = writeln!(out, "Workload {} is only in A.\n", wa.name);
    }
    faults(&mut out, a, b);
    allocation(&mut out, a, b);
    cross_host(&mut out, a, b);
    out
}

/// The cross-host sections, where both reports ran one: per block size and protocol the medians side by side.
fn cross_host(out: &mut String, a: &AuditReport, b: &AuditReport) {
    use super::cross_host::block_name;
    let (Some(x), Some(y)) = (a.cross_host.as_ref().filter(|c| c.ran), b.cross_host.as_ref().filter(|c| c.ran)) else {
        return;
    };
    let _ = writeln!(out, "## Cross-host ({})\n", y.label);
    let _ = writeln!(
        out,
        "| block | operation | protocol | GB/s A | GB/s B | B/A | CPU/transfer µs A | B | B/A | route A | B |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    let figure =
        |v: Option<f64>, scale: f64, digits: usize| v.map_or("-".into(), |v| format!("{:.digits$}", v / scale));
    let over = |p: Option<f64>, q: Option<f64>| match (p, q) {
        (Some(p), Some(q)) if p > 0.0 => format!("{:.2}", q / p),
        _ => "-".into(),
    };
    for sb in &y.sizes {
        let sa = x.sizes.iter().find(|s| s.block_size == sb.block_size && s.operation == sb.operation);
        for pb in &sb.protocols {
            let pa = sa.and_then(|s| s.protocol(&pb.protocol));
            let bw = (pa.and_then(|p| p.median_bytes_per_second), pb.median_bytes_per_second);
            let cpu = (pa.and_then(|p| p.median_process_cpu_ns_per_transfer), pb.median_process_cpu_ns_per_transfer);
            let route = |p: Option<&super::cross_host::CrossHostProtocol>| {
                p.and_then(|p| p.route.clone()).unwrap_or_else(|| "-".into())
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                block_name(sb.block_size),
                sb.operation.to_uppercase(),
                pb.protocol,
                figure(bw.0, 1e9, 3),
                figure(bw.1, 1e9, 3),
                over(bw.0, bw.1),
                figure(cpu.0, 1e3, 1),
                figure(cpu.1, 1e3, 1),
                over(cpu.0, cpu.1),
                route(pa),
                route(Some(pb)),
            );
        }
    }
    let _ = writeln!(out);
}

/// The error-recovery rounds of both reports, by path and fault: time to detect, how many transfers failed, whether
/// the next batch was served.
fn faults(out: &mut String, a: &AuditReport, b: &AuditReport) {
    if a.faults.is_empty() && b.faults.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Error recovery\n");
    let _ = writeln!(out, "| path | fault | ended after ms A | B | failed A | B | next batch served A | B |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for round in a.faults.iter().chain(&b.faults) {
        if !keys.contains(&(round.path.as_str(), round.fault.as_str())) {
            keys.push((round.path.as_str(), round.fault.as_str()));
        }
    }
    let find = |report: &'_ AuditReport, (path, fault): (&str, &str)| {
        report.faults.iter().find(|r| r.path == path && r.fault == fault).cloned()
    };
    for key in keys {
        let (x, y) = (find(a, key), find(b, key));
        let ended = |r: &Option<super::report::FaultRound>| match r {
            None => "absent".to_owned(),
            Some(r) if !r.injected => "not injected".to_owned(),
            Some(r) => r.ended_after_ms.map_or("-".into(), |ms| format!("{ms:.1}")),
        };
        let failed = |r: &Option<super::report::FaultRound>| {
            r.as_ref().filter(|r| r.injected).map_or("-".into(), |r| {
                format!("{}/{}", r.states.iter().filter(|s| s.as_str() != "completed").count(), r.states.len())
            })
        };
        let served = |r: &Option<super::report::FaultRound>| {
            r.as_ref().and_then(|r| r.next_batch_served).map_or("-", |s| if s { "yes" } else { "no" })
        };
        let changed = if served(&x) != served(&y) { " **changed**" } else { "" };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {}{changed} |",
            key.0,
            key.1,
            ended(&x),
            ended(&y),
            failed(&x),
            failed(&y),
            served(&x),
            served(&y)
        );
    }
    let _ = writeln!(out);
}

/// Allocation success of both reports, by memory kind.
fn allocation(out: &mut String, a: &AuditReport, b: &AuditReport) {
    if a.allocation.is_empty() && b.allocation.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Allocation success\n");
    let _ = writeln!(out, "| memory | requested A | obtained A | requested B | obtained B | obtained B/A |");
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    let mut kinds: Vec<&str> = Vec::new();
    for entry in a.allocation.iter().chain(&b.allocation) {
        if !kinds.contains(&entry.memory.as_str()) {
            kinds.push(entry.memory.as_str());
        }
    }
    for kind in kinds {
        let (x, y) = (a.allocation.iter().find(|e| e.memory == kind), b.allocation.iter().find(|e| e.memory == kind));
        let size = |bytes: Option<u64>| bytes.map_or("-".into(), super::report::size_name);
        let ratio = match (x, y) {
            (Some(x), Some(y)) if x.obtained_bytes > 0 => {
                format!("{:.2}", y.obtained_bytes as f64 / x.obtained_bytes as f64)
            }
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "| {kind} | {} | {} | {} | {} | {ratio} |",
            size(x.map(|e| e.requested_bytes)),
            size(x.map(|e| e.obtained_bytes)),
            size(y.map(|e| e.requested_bytes)),
            size(y.map(|e| e.obtained_bytes)),
        );
    }
    let _ = writeln!(out);
}

fn opt(value: &Option<String>) -> String {
    value.clone().unwrap_or_else(|| "-".into())
}

/// One figure of a row: A's and B's stats, the scale to print them in and the digits.
type Figure<'a> = (Option<&'a Stats>, Option<&'a Stats>, f64, usize);

fn cells(out: &mut String, a: &CellStats, b: &CellStats) {
    let figures = [
        (a.bytes_per_second.as_ref(), b.bytes_per_second.as_ref(), 1e-9, 2),
        (a.latency_p50_ns.as_ref(), b.latency_p50_ns.as_ref(), 1e-3, 1),
        (a.process_cpu_ns_per_transfer.as_ref(), b.process_cpu_ns_per_transfer.as_ref(), 1e-3, 2),
    ];
    row(out, &a.path, &figures);
}

/// `| path | A | B | B/A |` for each figure: medians scaled, the ratio of the unscaled medians, `-` where missing.
fn row(out: &mut String, path: &str, figures: &[Figure<'_>]) {
    let mut line = format!("| {path} |");
    for &(a, b, scale, digits) in figures {
        let median = |s: Option<&Stats>| s.map_or("-".into(), |s| format!("{:.*}", digits, s.median * scale));
        let ratio = match (a, b) {
            (Some(a), Some(b)) if a.median > 0.0 => format!("{:.2}", b.median / a.median),
            _ => "-".into(),
        };
        let _ = write!(line, " {} | {} | {ratio} |", median(a), median(b));
    }
    let _ = writeln!(out, "{line}");
}
