//! The results pages (docs/RESULTS.md, docs/BASELINES.md), rendered from recorded reports: `aiv audit
//! --results-pages DIR` and `tests/results_pages.rs`.
//!
//! `DIR` holds the recorded reports (`<name>.json`, each an audit's `report.json` or the kernel microbenchmark's
//! report, [`super::kernel_bench`]) and one template per page
//! (`<PAGE>.template.md`). A template is Markdown; a line that is only `{{generator report [argument]}}` is replaced by
//! what the generator renders from the report `<report>.json` ([`GENERATORS`]), each table of figures preceded by the
//! line that says where they come from: the command, the commit, when, the machine and its load, and the twin
//! runtime's caveat where it holds. The pages are written beside `DIR` as `<PAGE>.md`. Nothing is read but `DIR`, and nothing
//! depends on the time of rendering, so the same reports give the same pages.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::cross_host::CrossHostReport;
use super::kernel_bench::{self, KernelReport, KERNEL_SCHEMA};
use super::report::{size_name, verdict_table, AuditReport, CellStats, Environment, Shape, Stats, WorkloadReport};

/// The generators a template line can name, with what they render.
pub const GENERATORS: [(&str, &str); 17] = [
    ("runs", "every recorded report: its command, commit, when, machine and load"),
    ("source", "the line that says where a report's figures come from"),
    ("skipped", "the paths a report did not run, and why"),
    ("verdicts", "who submitted on each path, and the AIV-direct verdict, from the transfers' evidence"),
    ("evidence", "each path's verdict lines: every check with its counts and source"),
    ("latency", "one workload's batch latency per path (argument: the workload, e.g. 4k)"),
    ("bandwidth", "bandwidth per path at the workloads named (argument: e.g. 64k,1m)"),
    ("kv", "the KV request workload per path"),
    ("host-cpu", "Host CPU per transfer per path and workload, and aiv's over each path's"),
    ("workloads", "every workload's full table: median (min-max) over the rounds"),
    ("faults", "the error-recovery rounds"),
    ("allocation", "allocation success per memory kind"),
    ("cross-host", "aiv's RDMA route against tcp between two network namespaces, and the bar aiv is held to"),
    ("kernel-post", "a kernel report's CPU of the emulated AIV core per posted SQE, per doorbell batch"),
    ("kernel-request", "a kernel report's request-to-completion latency through the kernel"),
    ("kernel-throughput", "a kernel report's aiv and memcpy bandwidth per block size, criterion's and paired"),
    ("idle", "a kernel report's CPU of two idle twin devices with persistent kernels"),
];

/// The recorded reports of a directory, by name (the file name without `.json`).
#[derive(Clone, Debug, Default)]
pub struct Reports {
    pub audits: BTreeMap<String, AuditReport>,
    pub kernels: BTreeMap<String, KernelReport>,
}

impl Reports {
    /// Reads `<name>.json` of `dir` as the kind its `schema` names.
    fn read(&mut self, dir: &Path, name: &str) -> Result<(), String> {
        let path = dir.join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let schema: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        if schema.get("schema").and_then(|s| s.as_str()) == Some(KERNEL_SCHEMA) {
            self.kernels
                .insert(name.into(), KernelReport::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?);
        } else {
            self.audits.insert(name.into(), AuditReport::read(&path)?);
        }
        Ok(())
    }

    /// Every report's provenance, by name.
    fn provenances(&self) -> BTreeMap<&str, Provenance<'_>> {
        let audits = self.audits.iter().map(|(key, r)| (key.as_str(), Provenance::of_audit(r)));
        audits.chain(self.kernels.iter().map(|(key, r)| (key.as_str(), Provenance::of_kernel(r)))).collect()
    }
}

/// What a source line states of a report.
struct Provenance<'a> {
    command: &'a [String],
    started_utc: &'a str,
    elapsed_s: f64,
    environment: &'a Environment,
    twin: bool,
}

impl Provenance<'_> {
    fn of_audit(report: &AuditReport) -> Provenance<'_> {
        Provenance {
            command: &report.command,
            started_utc: &report.started_utc,
            elapsed_s: report.elapsed_s,
            environment: &report.environment,
            twin: on_twin(report),
        }
    }

    fn of_kernel(report: &KernelReport) -> Provenance<'_> {
        Provenance {
            command: &report.command,
            started_utc: &report.started_utc,
            elapsed_s: report.elapsed_s,
            environment: &report.environment,
            twin: report.environment.device_backend == "twin",
        }
    }
}

/// The caveat beside a twin runtime's figures.
pub const TWIN_CAVEAT: &str = "twin runtime: a model's figures, unverified on hardware";

/// One rendered page: its file name (beside the reports' directory) and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub file: String,
    pub text: String,
}

/// Renders every `*.template.md` of `dir` from the reports beside it.
pub fn render(dir: &Path) -> Result<Vec<Page>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| entry.file_name().to_str().map(str::to_owned))
        .collect();
    names.sort();
    let mut reports = Reports::default();
    for name in names.iter().filter_map(|name| name.strip_suffix(".json")) {
        reports.read(dir, name)?;
    }
    let mut pages = Vec::new();
    for page in names.iter().filter_map(|name| name.strip_suffix(".template.md")) {
        let path = dir.join(format!("{page}.template.md"));
        let template = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let text = render_template(&template, &reports).map_err(|e| format!("{}: {e}", path.display()))?;
        pages.push(Page { file: format!("{page}.md"), text });
    }
    if pages.is_empty() {
        return Err(format!("{}: no *.template.md to render", dir.display()));
    }
    Ok(pages)
}

/// Renders `dir`'s pages and writes them beside it; returns the files written.
pub fn write(dir: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let out = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut written = Vec::new();
    for page in render(dir)? {
        let path = out.join(&page.file);
        std::fs::write(&path, &page.text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// A template with every generator line replaced.
pub fn render_template(template: &str, reports: &Reports) -> Result<String, String> {
    let mut out = String::new();
    for (number, line) in template.lines().enumerate() {
        let Some(call) = line.trim().strip_prefix("{{").and_then(|rest| rest.strip_suffix("}}")) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let words: Vec<&str> = call.split_whitespace().collect();
        let rendered = generate(&words, reports).map_err(|e| format!("line {}: {{{{{call}}}}}: {e}", number + 1))?;
        out.push_str(rendered.trim_end());
        out.push('\n');
    }
    Ok(out)
}

fn generate(words: &[&str], reports: &Reports) -> Result<String, String> {
    let (name, rest) = words.split_first().ok_or("an empty generator line")?;
    if *name == "runs" {
        return Ok(runs(reports));
    }
    let key = rest.first().ok_or("no report named")?;
    if let Some(kernel) = reports.kernels.get(*key) {
        let body = match *name {
            "source" => return Ok(source(key, &Provenance::of_kernel(kernel))),
            "kernel-post" => kernel_bench::post_cost(kernel),
            "kernel-request" => kernel_bench::request_latency(kernel),
            "kernel-throughput" => kernel_bench::throughput(kernel),
            "idle" => kernel_bench::idle(kernel),
            other => return Err(format!("{key}.json is a kernel report: no generator {other:?} of it")),
        };
        return Ok(format!("{}\n\n{body}", source(key, &Provenance::of_kernel(kernel))));
    }
    let report = reports.audits.get(*key).ok_or_else(|| format!("no report {key}.json"))?;
    let argument = rest.get(1).copied();
    let body = match *name {
        "source" => return Ok(source(key, &Provenance::of_audit(report))),
        // Not figures: the table or list stands without the source line.
        "skipped" => return Ok(skipped(report)),
        "evidence" => return Ok(evidence(report)),
        "verdicts" => verdict_table(&report.verdicts),
        "latency" => latency(workload(report, argument.ok_or("no workload named")?)?),
        "bandwidth" => bandwidth(report, argument.ok_or("no workloads named")?)?,
        "kv" => kv(workload(report, "kv")?),
        "host-cpu" => host_cpu(report),
        "workloads" => workloads(report),
        "faults" => faults(report),
        "allocation" => allocation(report),
        "cross-host" => cross_host(report.cross_host.as_ref().ok_or("the report did not run --cross-host")?),
        "kernel-post" | "kernel-request" | "kernel-throughput" | "idle" => {
            return Err(format!("{key}.json is an audit's report: {name} renders a kernel report"))
        }
        other => {
            let known: Vec<&str> = GENERATORS.iter().map(|(name, _)| *name).collect();
            return Err(format!("no generator {other:?} (known: {})", known.join(", ")));
        }
    };
    Ok(format!("{}\n\n{body}", source(key, &Provenance::of_audit(report))))
}

fn on_twin(report: &AuditReport) -> bool {
    report.environment.device_backend == "twin" || report.runtime().is_some_and(|r| r.contains("twin"))
}

fn machine(e: &Environment) -> String {
    let mut text = format!("{} CPUs ({})", e.cpus, e.cpu_model.as_deref().unwrap_or("model unknown"));
    if let Some(bytes) = e.memory_bytes {
        let _ = write!(text, ", {:.1} GiB", bytes as f64 / (1u64 << 30) as f64);
    }
    let _ = write!(text, ", {}", e.os);
    text
}

fn load(e: &Environment) -> String {
    e.load_average.map_or("not recorded".into(), |[one, five, fifteen]| {
        format!("{one:.2} / {five:.2} / {fifteen:.2} (1 / 5 / 15 min)")
    })
}

fn commit(e: &Environment) -> String {
    e.source_commit.as_deref().map_or("unknown".into(), |c| format!("`{c}`"))
}

/// `recorded on` is the one place a page names a date: the report's own start.
fn source(key: &str, report: &Provenance<'_>) -> String {
    let mut line = format!(
        "From `docs/results/{key}.json`: `{}`, commit {}, recorded on {}, {} s; {}; load average at the start {}",
        report.command.join(" "),
        commit(report.environment),
        report.started_utc,
        report.elapsed_s.round(),
        machine(report.environment),
        load(report.environment),
    );
    if report.twin {
        let _ = write!(line, "; {TWIN_CAVEAT}");
    }
    line.push('.');
    line
}

fn runs(reports: &Reports) -> String {
    let mut out = String::from("| report | command | commit | recorded on | machine | load average at the start |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for (key, report) in reports.provenances() {
        let _ = writeln!(
            out,
            "| `docs/results/{key}.json` | `{}` | {} | {} | {} | {} |",
            report.command.join(" "),
            commit(report.environment),
            report.started_utc,
            machine(report.environment),
            load(report.environment)
        );
    }
    out
}

fn skipped(report: &AuditReport) -> String {
    if report.skipped.is_empty() {
        return "Every path ran.".into();
    }
    let mut out = String::from("| path not run | why |\n|---|---|\n");
    for skipped in &report.skipped {
        let _ = writeln!(out, "| {} | {} |", skipped.path, cell_text(&skipped.reason));
    }
    out
}

/// Text safe inside a table cell.
fn cell_text(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn evidence(report: &AuditReport) -> String {
    let mut out = String::new();
    for v in &report.verdicts {
        let _ = writeln!(out, "- `{}`:", v.path);
        for line in &v.lines {
            let _ = writeln!(out, "  - {}", line.trim());
        }
    }
    out
}

/// The workload `key` names: `kv` (the KV request), or a block size (`4k`, `64k`, `1m`) of a single-thread
/// `transfer_engine_bench` workload.
fn workload<'a>(report: &'a AuditReport, key: &str) -> Result<&'a WorkloadReport, String> {
    let found = if key == "kv" {
        report.workloads.iter().find(|w| matches!(w.workload.shape, Some(Shape::KvRequest(_))))
    } else {
        let block = parse_size(key)?;
        report
            .workloads
            .iter()
            .find(|w| w.workload.shape.is_none() && w.workload.threads == 1 && w.workload.block_size == block)
    };
    found.ok_or_else(|| format!("the report has no workload {key}"))
}

fn parse_size(key: &str) -> Result<u64, String> {
    let (digits, shift) = match key.to_ascii_lowercase() {
        k if k.ends_with('k') => (k.trim_end_matches('k').to_owned(), 10),
        k if k.ends_with('m') => (k.trim_end_matches('m').to_owned(), 20),
        k => (k, 0),
    };
    digits.parse::<u64>().map(|n| n << shift).map_err(|_| format!("{key:?} is not a size such as 4k or 1m"))
}

fn gbps(stats: Option<&Stats>) -> String {
    stats.map_or("-".into(), |s| format!("{:.2}", s.median / 1e9))
}

fn micros(stats: Option<&Stats>, decimals: usize) -> String {
    stats.map_or("-".into(), |s| format!("{:.*}", decimals, s.median / 1e3))
}

fn ratio(stats: Option<&Stats>) -> String {
    stats.map_or("-".into(), |s| format!("{:.2}", s.median))
}

/// `median (min-max)`, scaled.
fn spread(stats: Option<&Stats>, scale: f64, decimals: usize) -> String {
    stats.map_or("-".into(), |s| {
        format!("{:.*} ({:.*}-{:.*})", decimals, s.median / scale, decimals, s.min / scale, decimals, s.max / scale)
    })
}

fn memcpy_line(w: &WorkloadReport) -> String {
    format!("{}: memcpy reference {} GB/s.", w.name, spread(w.memcpy_bytes_per_second.as_ref(), 1e9, 2))
}

fn latency(w: &WorkloadReport) -> String {
    let mut out = format!(
        "{}\n\n| path | p50 µs | p99 µs | p99.9 µs | Host CPU µs / transfer, whole process |\n|---|---|---|---|---|\n",
        w.name
    );
    for c in &w.paths {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            c.path,
            micros(c.latency_p50_ns.as_ref(), 1),
            micros(c.latency_p99_ns.as_ref(), 0),
            micros(c.latency_p999_ns.as_ref(), 0),
            micros(c.process_cpu_ns_per_transfer.as_ref(), 2)
        );
    }
    out
}

fn bandwidth(report: &AuditReport, keys: &str) -> Result<String, String> {
    let chosen: Vec<&WorkloadReport> = keys.split(',').map(|key| workload(report, key)).collect::<Result<_, _>>()?;
    let mut out = String::from("| path |");
    let mut rule = String::from("|---|");
    for w in &chosen {
        let size = size_name(w.workload.block_size);
        let _ = write!(out, " GB/s, {size} x {} | ÷ memcpy, {size} |", w.workload.batch_size);
        rule.push_str("---|---|");
    }
    let _ = writeln!(out, "\n{rule}");
    for path in &report.paths {
        let _ = write!(out, "| {path} |");
        for w in &chosen {
            let cell = w.paths.iter().find(|c| &c.path == path);
            let _ = write!(
                out,
                " {} | {} |",
                gbps(cell.and_then(|c| c.bytes_per_second.as_ref())),
                ratio(cell.and_then(|c| c.vs_memcpy.as_ref()))
            );
        }
        out.push('\n');
    }
    let _ = write!(out, "| memcpy reference |");
    for w in &chosen {
        let _ = write!(out, " {} | 1.00 |", gbps(w.memcpy_bytes_per_second.as_ref()));
    }
    out.push('\n');
    Ok(out)
}

fn kv(w: &WorkloadReport) -> String {
    let mut out = format!(
        "{}\n\n| path | GB/s | ÷ memcpy | p50 µs per request | p99 µs | Host CPU µs / transfer, whole process | \
         path's own |\n|---|---|---|---|---|---|---|\n",
        w.name
    );
    for c in &w.paths {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            c.path,
            gbps(c.bytes_per_second.as_ref()),
            ratio(c.vs_memcpy.as_ref()),
            micros(c.latency_p50_ns.as_ref(), 1),
            micros(c.latency_p99_ns.as_ref(), 0),
            micros(c.process_cpu_ns_per_transfer.as_ref(), 2),
            micros(c.path_cpu_ns_per_transfer.as_ref(), 2)
        );
    }
    let _ = writeln!(out, "\n{}", memcpy_line(w));
    out
}

/// aiv's median whole-process Host CPU per transfer over `cell`'s.
fn aiv_over(w: &WorkloadReport, cell: &CellStats) -> String {
    let aiv = w.paths.iter().find(|c| c.path == "aiv").and_then(|c| c.process_cpu_ns_per_transfer.as_ref());
    match (aiv, cell.process_cpu_ns_per_transfer.as_ref()) {
        _ if cell.path == "aiv" => "-".into(),
        (Some(a), Some(b)) if b.median > 0.0 => format!("{:.2}", a.median / b.median),
        _ => "-".into(),
    }
}

fn host_cpu(report: &AuditReport) -> String {
    let mut out = String::from("| path |");
    let mut rule = String::from("|---|");
    for w in &report.workloads {
        let _ = write!(out, " {} | aiv ÷ path |", short_name(w));
        rule.push_str("---|---|");
    }
    let _ = writeln!(out, "\n{rule}");
    for path in &report.paths {
        let _ = write!(out, "| {path} |");
        for w in &report.workloads {
            match w.paths.iter().find(|c| &c.path == path) {
                Some(c) => {
                    let _ =
                        write!(out, " {} | {} |", micros(c.process_cpu_ns_per_transfer.as_ref(), 2), aiv_over(w, c));
                }
                None => out.push_str(" - | - |"),
            }
        }
        out.push('\n');
    }
    out.push_str("\nµs of Host CPU per transfer, whole process (median over the rounds).\n");
    out
}

/// `4 KiB x 1`, `KV request`.
fn short_name(w: &WorkloadReport) -> String {
    match &w.workload.shape {
        None if w.workload.threads == 1 => format!("{} x {}", size_name(w.workload.block_size), w.workload.batch_size),
        None => {
            format!("{} x {} x {} threads", size_name(w.workload.block_size), w.workload.batch_size, w.workload.threads)
        }
        Some(Shape::KvRequest(_)) => "KV request".into(),
        Some(Shape::KvLayerwise { .. }) => "KV layerwise".into(),
        Some(Shape::Store { .. }) => "store put/get".into(),
    }
}

fn workloads(report: &AuditReport) -> String {
    let mut out = String::new();
    for w in &report.workloads {
        let _ = writeln!(out, "### {}\n", w.name);
        let _ = writeln!(out, "memcpy reference {} GB/s.\n", spread(w.memcpy_bytes_per_second.as_ref(), 1e9, 2));
        out.push_str(
            "| path | GB/s | p50 µs | p99 µs | Host CPU µs / transfer, whole process | path's own | aiv ÷ this path, \
             whole process |\n|---|---|---|---|---|---|---|\n",
        );
        for c in &w.paths {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                c.path,
                spread(c.bytes_per_second.as_ref(), 1e9, 2),
                spread(c.latency_p50_ns.as_ref(), 1e3, 1),
                spread(c.latency_p99_ns.as_ref(), 1e3, 0),
                spread(c.process_cpu_ns_per_transfer.as_ref(), 1e3, 2),
                spread(c.path_cpu_ns_per_transfer.as_ref(), 1e3, 2),
                aiv_over(w, c)
            );
        }
        out.push('\n');
    }
    out
}

fn states(states: &[String]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for state in states {
        *counts.entry(state.as_str()).or_default() += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(state, n)| format!("{n} {state}")).collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

fn faults(report: &AuditReport) -> String {
    if report.faults.is_empty() {
        return "No error-recovery rounds in this report.".into();
    }
    let mut out = String::from(
        "| path | fault | batch ended after ms | the batch's transfers | next batch served (ms) | note |\n\
         |---|---|---|---|---|---|\n",
    );
    for f in &report.faults {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        let next = match f.next_batch_served {
            Some(served) => format!("{} ({})", if served { "yes" } else { "**no**" }, ms(f.next_batch_ms)),
            None => "-".into(),
        };
        let note = if !f.injected {
            format!("not injected: {}", f.not_injected_reason.as_deref().unwrap_or("no reason recorded"))
        } else if let Some(pending) = f.pending_at_fault {
            let mut note = format!("{pending} pending at the kill");
            if let Some(state) = &f.dead_peer_state {
                let _ = write!(note, "; a new transfer to the dead peer: {state} after {} ms", ms(f.dead_peer_ms));
            }
            note
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            f.path,
            f.fault,
            ms(f.ended_after_ms),
            states(&f.states),
            next,
            cell_text(&note)
        );
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

fn allocation(report: &AuditReport) -> String {
    if report.allocation.is_empty() {
        return "No allocation rounds in this report.".into();
    }
    let mut out = String::from(
        "| memory | paths | requested | obtained | chunks | ended | registration, s per GiB |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for a in &report.allocation {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            a.memory,
            a.paths.join(", "),
            mib(a.requested_bytes),
            mib(a.obtained_bytes),
            a.chunks,
            cell_text(&a.ended),
            a.registration_s_per_gib.map_or("-".into(), |s| format!("{s:.3}"))
        );
    }
    out
}

fn cross_host(x: &CrossHostReport) -> String {
    if !x.ran {
        return format!("Not run: {}.", x.not_run_reason.as_deref().unwrap_or("no reason recorded"));
    }
    let mut out = format!(
        "{}; batches of {} from {} threads, {} rounds of {} s per protocol, operation and size ({}).\n\n",
        x.label, x.batch_size, x.threads, x.rounds, x.seconds_per_run, x.setup
    );
    out.push_str(
        "| operation | block | protocol | clean runs | GB/s | Host CPU µs / transfer, whole process | p50 µs | route | \
         submitted by | AIV-direct |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for size in &x.sizes {
        for p in &size.protocols {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} of {} | {} | {} | {} | {} | {} | {} |",
                size.operation,
                size_name(size.block_size),
                p.protocol,
                p.clean_runs,
                p.runs.len(),
                p.median_bytes_per_second.map_or("-".into(), |b| format!("{:.3}", b / 1e9)),
                p.median_process_cpu_ns_per_transfer.map_or("-".into(), |ns| format!("{:.1}", ns / 1e3)),
                p.median_latency_p50_ns.map_or("-".into(), |ns| format!("{:.0}", ns / 1e3)),
                p.route.as_deref().unwrap_or("-"),
                p.submitted_by.as_deref().unwrap_or("-"),
                p.aiv_direct.as_deref().unwrap_or("-")
            );
        }
    }
    out.push_str(
        "\n| operation | block | aiv ÷ tcp, bandwidth | aiv ÷ tcp, Host CPU | the bar |\n|---|---|---|---|---|\n",
    );
    for size in &x.sizes {
        let bars: Vec<String> = size
            .targets
            .iter()
            .map(|t| {
                let (word, relation) = if t.target == "bandwidth" { ("bandwidth", ">=") } else { ("Host CPU", "<=") };
                format!("{word} {relation} {}: **{}**", t.limit, t.met)
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            size.operation,
            size_name(size.block_size),
            size.bandwidth_ratio.map_or("-".into(), |r| format!("{r:.3}")),
            size.cpu_ratio.map_or("-".into(), |r| format!("{r:.3}")),
            if bars.is_empty() { "-".into() } else { bars.join("; ") }
        );
    }
    let failures: Vec<String> = x
        .sizes
        .iter()
        .flat_map(|size| size.protocols.iter().flat_map(move |p| p.failures.iter().map(move |f| (size, p, f))))
        .map(|(size, p, f)| {
            format!("- {} {} {}: {}", size.operation, size_name(size.block_size), p.protocol, cell_text(f))
        })
        .collect();
    if !failures.is_empty() {
        let _ = write!(out, "\nFailures:\n\n{}\n", failures.join("\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_the_audit_names_them() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("kv").is_err());
    }

    #[test]
    fn a_template_without_generators_is_unchanged_and_an_unknown_generator_is_refused() {
        let reports = Reports::default();
        assert_eq!(render_template("# Title\n\nText.\n", &reports), Ok("# Title\n\nText.\n".into()));
        let error = render_template("{{verdicts none}}\n", &reports).expect_err("no such report");
        assert!(error.contains("no report none.json"), "{error}");
        assert!(render_template("{{runs}}\n", &reports).is_ok());
    }
}
