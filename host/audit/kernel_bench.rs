//! The kernel microbenchmark's report (`cargo bench --bench kernel` with `AIV_BENCH_REPORT=FILE`, schema
//! [`KERNEL_SCHEMA`]): where it ran, as the audit records it, criterion's estimate of each benchmark that ran, the
//! paired same-window aiv/memcpy comparison and the idle cost of two twin devices; and the results pages' tables of
//! it ([`super::pages`]).

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::report::{size_name, Environment};

/// The version of the kernel report's layout: a reader refuses another.
pub const KERNEL_SCHEMA: &str = "aiv-kernel-bench/1";

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelReport {
    pub schema: String,
    /// The command that produced it.
    pub command: Vec<String>,
    /// When the bench started (RFC 3339, UTC) and how long it took.
    pub started_utc: String,
    pub elapsed_s: f64,
    /// The machine and build, the load average at the start included.
    pub environment: Environment,
    /// Criterion's estimate of each benchmark that ran, in the bench's order.
    pub benchmarks: Vec<BenchEstimate>,
    /// The paired same-window aiv/memcpy comparison per block size (empty when no throughput benchmark ran).
    pub paired: Vec<PairedBlock>,
    /// The CPU two idle twin devices with persistent kernels use (`None` when not measured).
    pub idle: Option<IdleCost>,
}

/// Criterion's estimate of one benchmark's time per iteration: the median's point estimate and confidence interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchEstimate {
    /// Criterion's id, e.g. `post_cost/doorbell_batch/32`.
    pub id: String,
    pub median_ns: f64,
    pub lower_ns: f64,
    pub upper_ns: f64,
    /// The interval's confidence level (criterion's default 0.95).
    pub confidence_level: f64,
    /// Bytes moved per iteration, for the benchmarks that move bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_iteration: Option<u64>,
}

impl BenchEstimate {
    /// The estimate of benchmark `id` from criterion's `<criterion dir>/<id>/new/estimates.json`.
    pub fn from_criterion(criterion: &Path, id: &str, bytes_per_iteration: Option<u64>) -> Result<Self, String> {
        let path = criterion.join(id).join("new").join("estimates.json");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        BenchEstimate::from_estimates(id, &text, bytes_per_iteration).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The estimate of benchmark `id` from the text of criterion's `estimates.json`.
    pub fn from_estimates(id: &str, text: &str, bytes_per_iteration: Option<u64>) -> Result<Self, String> {
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let median = &json["median"];
        let number = |value: &serde_json::Value, what: &str| {
            value.as_f64().ok_or_else(|| format!("no median {what} in criterion's estimates"))
        };
        let interval = &median["confidence_interval"];
        Ok(BenchEstimate {
            id: id.into(),
            median_ns: number(&median["point_estimate"], "point estimate")?,
            lower_ns: number(&interval["lower_bound"], "lower bound")?,
            upper_ns: number(&interval["upper_bound"], "upper bound")?,
            confidence_level: number(&interval["confidence_level"], "confidence level")?,
            bytes_per_iteration,
        })
    }
}

/// One block size of the paired comparison: `rounds` rounds, each one aiv batch and one memcpy of the same blocks
/// back to back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairedBlock {
    pub block: u64,
    pub rounds: usize,
    /// Bytes per second over all rounds.
    pub aiv_bytes_per_second: f64,
    pub memcpy_bytes_per_second: f64,
    /// The per-round ratios aiv/memcpy (memcpy's time over aiv's): median, least and most.
    pub ratio_median: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
}

/// The CPU of the process over a window in which two twin devices with persistent kernels have nothing to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdleCost {
    pub devices: u32,
    /// Idle time before the window, and the window.
    pub settle_s: f64,
    pub window_s: f64,
    /// CPU time of the whole process over the window (`getrusage`, user + system).
    pub cpu_ns: u64,
    /// `cpu_ns` over the window: the share of one core.
    pub share_of_core: f64,
    /// CPU per kind of thread over the window (`/proc` per thread), the kinds that used any.
    pub threads: Vec<ThreadKindCpu>,
}

/// The CPU of one kind of thread.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadKindCpu {
    pub kind: String,
    pub threads: u32,
    pub cpu_ns: u64,
}

impl KernelReport {
    /// Reads a kernel report; the error names the file and what is wrong (another schema included).
    pub fn read(path: &Path) -> Result<KernelReport, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        KernelReport::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A kernel report from its text.
    pub fn parse(text: &str) -> Result<KernelReport, String> {
        let report: KernelReport = serde_json::from_str(text).map_err(|e| format!("not a kernel report: {e}"))?;
        if report.schema != KERNEL_SCHEMA {
            return Err(format!("schema {:?}, not {KERNEL_SCHEMA:?}", report.schema));
        }
        Ok(report)
    }

    /// The estimates whose id starts with `prefix`.
    fn estimates<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a BenchEstimate> + 'a {
        self.benchmarks.iter().filter(move |b| b.id.starts_with(prefix))
    }
}

fn interval(b: &BenchEstimate, scale: f64, decimals: usize) -> String {
    format!(
        "{:.*}-{:.*} ({:.0}%)",
        decimals,
        b.lower_ns / scale,
        decimals,
        b.upper_ns / scale,
        b.confidence_level * 100.0
    )
}

/// `post_cost/doorbell_batch/N`: ns of the emulated core per SQE.
pub(crate) fn post_cost(report: &KernelReport) -> String {
    let mut out =
        String::from("| doorbell batch | ns per SQE, median | confidence interval of the median |\n|---|---|---|\n");
    let mut any = false;
    for b in report.estimates("post_cost/doorbell_batch/") {
        any = true;
        let batch = b.id.rsplit('/').next().unwrap_or_default();
        let _ = writeln!(out, "| {batch} | {:.1} | {} |", b.median_ns, interval(b, 1.0, 1));
    }
    if any {
        out
    } else {
        "The report has no post_cost benchmark.".into()
    }
}

/// `request_to_dcq/*`: µs per request.
pub(crate) fn request_latency(report: &KernelReport) -> String {
    let mut out = String::from("| benchmark | µs, median | confidence interval of the median |\n|---|---|---|\n");
    let mut any = false;
    for b in report.estimates("request_to_dcq/") {
        any = true;
        let _ = writeln!(out, "| `{}` | {:.1} | {} |", b.id, b.median_ns / 1e3, interval(b, 1e3, 1));
    }
    if any {
        out
    } else {
        "The report has no request_to_dcq benchmark.".into()
    }
}

/// GB/s from criterion's time per iteration of `b`.
fn gbps(b: Option<&BenchEstimate>) -> String {
    match b {
        Some(b) if b.median_ns > 0.0 => b.bytes_per_iteration.map_or("-".into(), |bytes| {
            // Faster is the lower time: the interval's upper bound of time is the lower bound of bandwidth.
            let rate = |ns: f64| bytes as f64 / ns;
            format!("{:.2} ({:.2}-{:.2})", rate(b.median_ns), rate(b.upper_ns), rate(b.lower_ns))
        }),
        _ => "-".into(),
    }
}

/// `throughput/{aiv,memcpy}/<block>` and the paired comparison, per block size.
pub(crate) fn throughput(report: &KernelReport) -> String {
    let mut blocks: Vec<u64> = report
        .estimates("throughput/")
        .filter_map(|b| b.id.rsplit('/').next().and_then(|block| block.parse().ok()))
        .chain(report.paired.iter().map(|p| p.block))
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    if blocks.is_empty() {
        return "The report has no throughput benchmark.".into();
    }
    let mut out = String::from(
        "| block | aiv GB/s, criterion (interval) | memcpy GB/s, criterion (interval) | paired: aiv GB/s | paired: \
         memcpy GB/s | paired: aiv ÷ memcpy, median of the rounds (min-max) |\n|---|---|---|---|---|---|\n",
    );
    for block in &blocks {
        let find = |kind: &str| report.benchmarks.iter().find(|b| b.id == format!("throughput/{kind}/{block}"));
        let paired = report.paired.iter().find(|p| p.block == *block);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            size_name(*block),
            gbps(find("aiv")),
            gbps(find("memcpy")),
            paired.map_or("-".into(), |p| format!("{:.2}", p.aiv_bytes_per_second / 1e9)),
            paired.map_or("-".into(), |p| format!("{:.2}", p.memcpy_bytes_per_second / 1e9)),
            paired.map_or("-".into(), |p| format!("**{:.3}** ({:.3}-{:.3})", p.ratio_median, p.ratio_min, p.ratio_max)),
        );
    }
    if let Some(rounds) = report.paired.first().map(|p| p.rounds) {
        let _ = writeln!(out, "\nThe paired columns: {rounds} rounds per block size.");
    }
    out
}

/// The idle cost: the whole process and its threads by kind.
pub(crate) fn idle(report: &KernelReport) -> String {
    let Some(idle) = &report.idle else {
        return "The report has no idle measurement.".into();
    };
    let ms = |ns: u64| format!("{:.1}", ns as f64 / 1e6);
    let mut out = format!(
        "{} twin devices with persistent kernels, idle: {} ms of CPU over a window of {:.0} s after {:.0} s of \
         settling, **{:.1}% of one core**.\n\n| threads | count | CPU ms over the window | share of one core |\n\
         |---|---|---|---|\n",
        idle.devices,
        ms(idle.cpu_ns),
        idle.window_s,
        idle.settle_s,
        idle.share_of_core * 100.0
    );
    for t in &idle.threads {
        let share = t.cpu_ns as f64 / 1e9 / idle.window_s * 100.0;
        let _ = writeln!(out, "| {} | {} | {} | {share:.2}% |", t.kind, t.threads, ms(t.cpu_ns));
    }
    let _ = writeln!(out, "| whole process | | {} | {:.2}% |", ms(idle.cpu_ns), idle.share_of_core * 100.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criterion_estimates_give_the_median_and_its_interval() {
        let text = r#"{"mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":3.0},
            "point_estimate":2.0,"standard_error":0.1},
            "median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":10.5,"upper_bound":11.5},
            "point_estimate":11.0,"standard_error":0.2}}"#;
        let b = BenchEstimate::from_estimates("post_cost/doorbell_batch/32", text, None).expect("estimates");
        assert_eq!((b.median_ns, b.lower_ns, b.upper_ns, b.confidence_level), (11.0, 10.5, 11.5, 0.95));
        assert!(BenchEstimate::from_estimates("x", r#"{"mean":{}}"#, None).is_err());
    }
}
