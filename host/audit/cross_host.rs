//! `aiv audit --cross-host`: aiv against tcp between two hosts, as `benches/rdma_vs_tcp.sh` measures it. Two network
//! namespaces joined by one veth pair stand for two hosts (a host identity is the boot id and the network namespace,
//! docs/rdma.md section 7); per run an `aiv bench --mode target` (this binary) serves in the second and an
//! `aiv bench --json` initiator runs to its end in the first, rounds alternating the protocols' order. Per block
//! size and protocol the section reports the medians of bandwidth and of Host CPU per transfer (the initiator's
//! whole process), the ratios aiv/tcp against the bar ([`bar`]) with a verdict each, the route aiv took (the
//! bench's `evidence.routes`) and every failure's message.
//!
//! Nothing here fails the audit: a path that fails is reported failed with its error, and where the namespaces cannot
//! be made (not root, no `ip`) the section says "not run" and why. The namespaces and the veth pair are deleted on
//! every return and on a panic ([`Namespaces`]' `Drop`); every child is killed and reaped on drop and dies with
//! this process; every wait is bounded.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::child;
use crate::bounded::{self, Keep, Output};
use crate::transfer::Opcode;

/// The label of every figure of the section on the twin runtime.
pub const TWIN_LABEL: &str = "twin runtime, unverified on hardware";
/// The bandwidth bar: aiv at least this fraction of tcp's bandwidth, at [`BANDWIDTH_BAR_BLOCK`].
pub const BANDWIDTH_BAR: f64 = 0.8;
/// The block size the bandwidth bar is set at.
pub const BANDWIDTH_BAR_BLOCK: u64 = 1 << 20;
/// The Host CPU bar: aiv's Host CPU per transfer (whole process) at most this fraction of tcp's.
pub const CPU_BAR: f64 = 0.1;

/// The bar aiv is held to between two hosts, and why, in words: its kernel, not the Host, builds and submits the
/// transfers, so it must cost the Host far less CPU than tcp (whose Host threads move every byte) without giving up
/// bandwidth where both are bandwidth-bound.
pub fn bar() -> String {
    format!(
        "aiv bandwidth >= {BANDWIDTH_BAR}x tcp's at {} (where both are bandwidth-bound), aiv Host CPU per transfer \
         <= {CPU_BAR}x tcp's at every size (aiv's kernel, not the Host, builds and submits the transfers, so the Host \
         should do a small fraction of tcp's work)",
        block_name(BANDWIDTH_BAR_BLOCK)
    )
}
/// The block sizes without `--sizes`.
pub const DEFAULT_SIZES: [u64; 2] = [1 << 20, 64 << 10];
/// The operations without `--cross-operations`.
pub const DEFAULT_OPERATIONS: [Opcode; 2] = [Opcode::Write, Opcode::Read];
/// The protocols, in the first round's order.
const PROTOCOLS: [&str; 2] = ["tcp", "aiv"];
/// The addresses of the two ends of the veth pair (a /24 of their own, inside the namespaces only).
const ADDR_A: &str = "10.234.18.1";
const ADDR_B: &str = "10.234.18.2";
/// How long one `ip` command may take.
const IP_WITHIN: Duration = Duration::from_secs(10);
/// How long an initiator may run past its duration (start-up, connection, the memcpy reference, exit).
const INITIATOR_SLACK: Duration = Duration::from_secs(60);

/// What the cross-host section runs.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossHostOptions {
    /// The `aiv` binary run as target and initiator (`None`: not run, and the section says so).
    pub program: Option<PathBuf>,
    /// Block sizes, in order.
    pub sizes: Vec<u64>,
    /// Rounds per size: each runs tcp and aiv once, the order alternating from round to round.
    pub rounds: usize,
    /// How long each initiator run measures.
    pub seconds: Duration,
    /// Requests per batch.
    pub batch_size: usize,
    /// Initiator threads.
    pub threads: usize,
    /// The operations, in order: each is measured at every block size (WRITE pushes the initiator's bytes to the
    /// target, READ pulls the target's).
    pub operations: Vec<Opcode>,
}

impl CrossHostOptions {
    /// The defaults of `benches/rdma_vs_tcp.sh` (1 MiB and 64 KiB, batches of 8 from 2 threads), WRITE then READ.
    pub fn new(program: Option<PathBuf>, rounds: usize, seconds: Duration) -> CrossHostOptions {
        CrossHostOptions {
            program,
            sizes: DEFAULT_SIZES.to_vec(),
            rounds,
            seconds,
            batch_size: 8,
            threads: 2,
            operations: DEFAULT_OPERATIONS.to_vec(),
        }
    }

    /// The operations as the report names them (`write`, `read`).
    fn operation_names(&self) -> Vec<String> {
        self.operations.iter().map(|op| op.as_str().to_owned()).collect()
    }

    /// Runs in all: operations x sizes x rounds x protocols.
    pub fn runs(&self) -> usize {
        self.operations.len() * self.sizes.len() * self.rounds * PROTOCOLS.len()
    }

    /// The buffer each side registers: the largest span, at least 1 MiB.
    fn buffer_size(&self) -> u64 {
        let largest = self.sizes.iter().copied().max().unwrap_or(0);
        (largest * self.batch_size as u64 * self.threads as u64).max(1 << 20)
    }
}

/// The section of the report (`cross_host` in report.json).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrossHostReport {
    /// What the figures are figures of: [`TWIN_LABEL`] unless every aiv record came from an NPU.
    pub label: String,
    /// Whether the runs were made; `false` with `not_run_reason`.
    pub ran: bool,
    pub not_run_reason: Option<String>,
    /// The namespaces, the veth pair and the addresses, as made.
    pub setup: String,
    /// The operations measured (`write`, `read`), in order; a report written before READ was measured has none
    /// recorded here and measured WRITE.
    #[serde(default = "write_only")]
    pub operations: Vec<String>,
    pub batch_size: usize,
    pub threads: usize,
    pub rounds: usize,
    pub seconds_per_run: f64,
    pub sizes: Vec<CrossHostSize>,
}

fn write_only() -> Vec<String> {
    vec!["write".into()]
}

fn write() -> String {
    "write".into()
}

/// One operation at one block size: per protocol its runs and medians, the ratios aiv/tcp and the bar's verdicts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrossHostSize {
    /// `write` or `read` (a report written before READ was measured: `write`).
    #[serde(default = "write")]
    pub operation: String,
    pub block_size: u64,
    pub protocols: Vec<CrossHostProtocol>,
    /// aiv's median bandwidth over tcp's (`None` if either has no clean run).
    pub bandwidth_ratio: Option<f64>,
    /// aiv's median Host CPU per transfer over tcp's (`None` if either has no clean run or no CPU figure).
    pub cpu_ratio: Option<f64>,
    pub targets: Vec<TargetVerdict>,
}

/// One protocol at one block size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrossHostProtocol {
    pub protocol: String,
    pub runs: Vec<CrossHostRun>,
    /// Runs with no failed batch: the medians are over these.
    pub clean_runs: usize,
    pub median_bytes_per_second: Option<f64>,
    /// Host CPU per transfer of the initiator's whole process (the twin's device threads left out), median.
    pub median_process_cpu_ns_per_transfer: Option<f64>,
    pub median_latency_p50_ns: Option<f64>,
    /// Transfers per route over every run (the bench's `evidence.routes`; empty for tcp).
    pub routes: BTreeMap<String, u64>,
    /// The route(s) the transfers took, from `routes` (`None`: none recorded).
    pub route: Option<String>,
    /// The evidence's runtime kind (`twin`, `npu`, `none`), as the bench reported it.
    pub runtime: Option<String>,
    /// The runs' AIV-direct verdict from their evidence (`evidence.checks.aiv_direct`): `no` if any run's is, `yes`
    /// if every run's is, else `unknown` (`None`: no run reported one).
    #[serde(default)]
    pub aiv_direct: Option<String>,
    /// Who submitted (`evidence.submitted_by`): the runs' word if every run reported the same one, `mixed` if runs
    /// named different submitters, else `unknown` (`None`: no run reported one).
    #[serde(default)]
    pub submitted_by: Option<String>,
    /// Each distinct failure message, in the order first seen.
    pub failures: Vec<String>,
}

/// One initiator run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CrossHostRun {
    pub round: usize,
    /// Its place in the round (0 or 1).
    pub slot: usize,
    pub bytes_per_second: f64,
    pub process_cpu_ns_per_transfer: Option<f64>,
    pub latency_p50_ns: Option<f64>,
    pub completed_batches: u64,
    pub failed_batches: u64,
    pub routes: BTreeMap<String, u64>,
    pub runtime: Option<String>,
    /// The run's AIV-direct verdict (`yes`, `no`, `unknown`), derived by the bench from the transfers' observed acts.
    #[serde(default)]
    pub aiv_direct: Option<String>,
    /// The run's "submitted by" verdict (`AIV-direct`, `AI-CPU-submitted`, `Host-submitted`, `mixed`, `unknown`).
    #[serde(default)]
    pub submitted_by: Option<String>,
    /// Why the run failed: the target did not start, the initiator failed, or its first failed transfer's reason.
    pub error: Option<String>,
}

impl CrossHostRun {
    /// A run that measured with no failed batch.
    pub fn clean(&self) -> bool {
        self.error.is_none() && self.failed_batches == 0 && self.completed_batches > 0
    }
}

/// One figure's bar at one block size (`targets` in report.json).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetVerdict {
    /// `bandwidth` (aiv/tcp at least `limit`) or `host_cpu` (aiv/tcp at most `limit`).
    pub target: String,
    pub limit: f64,
    pub ratio: Option<f64>,
    /// `yes`, `no`, or `unknown` (tcp, the reference, has no clean run).
    pub met: String,
    pub why: String,
}

/// The ratio of two medians.
fn ratio(aiv: Option<f64>, tcp: Option<f64>) -> Option<f64> {
    match (aiv, tcp) {
        (Some(a), Some(t)) if t > 0.0 => Some(a / t),
        _ => None,
    }
}

/// The verdicts of one block size from its two protocols' medians: bandwidth at [`BANDWIDTH_BAR_BLOCK`] only,
/// Host CPU at every size. aiv without a clean run does not meet a bar ("no", naming its failure); tcp without one
/// leaves it "unknown".
pub fn verdicts(block_size: u64, tcp: &CrossHostProtocol, aiv: &CrossHostProtocol) -> Vec<TargetVerdict> {
    let mut out = Vec::new();
    let failure = |p: &CrossHostProtocol| p.failures.first().cloned().unwrap_or_else(|| "no run measured".into());
    let mut judge = |target: &str, limit: f64, at_least: bool, a: Option<f64>, t: Option<f64>| {
        let (met, why) = match (a, t) {
            (_, None) => ("unknown", format!("tcp, the reference, has no clean run: {}", failure(tcp))),
            (None, Some(_)) if aiv.clean_runs == 0 => ("no", format!("aiv has no clean run: {}", failure(aiv))),
            (None, Some(_)) => ("unknown", "aiv recorded no figure".into()),
            (Some(a), Some(t)) => {
                let r = if t > 0.0 { a / t } else { f64::INFINITY };
                let met = if at_least { r >= limit } else { r <= limit };
                let sign = if at_least { ">=" } else { "<=" };
                (if met { "yes" } else { "no" }, format!("aiv/tcp {r:.3} (bar {sign} {limit})"))
            }
        };
        out.push(TargetVerdict { target: target.into(), limit, ratio: ratio(a, t), met: met.into(), why });
    };
    if block_size == BANDWIDTH_BAR_BLOCK {
        judge("bandwidth", BANDWIDTH_BAR, true, aiv.median_bytes_per_second, tcp.median_bytes_per_second);
    }
    judge("host_cpu", CPU_BAR, false, aiv.median_process_cpu_ns_per_transfer, tcp.median_process_cpu_ns_per_transfer);
    out
}

/// The median of `values` (`None` when empty).
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 })
}

impl CrossHostProtocol {
    /// The protocol's figures from its runs.
    pub fn from_runs(protocol: &str, runs: Vec<CrossHostRun>) -> CrossHostProtocol {
        let clean: Vec<&CrossHostRun> = runs.iter().filter(|r| r.clean()).collect();
        let mut routes = BTreeMap::new();
        let mut failures: Vec<String> = Vec::new();
        for run in &runs {
            for (route, n) in &run.routes {
                *routes.entry(route.clone()).or_default() += n;
            }
            if let Some(error) = &run.error {
                if !failures.contains(error) {
                    failures.push(error.clone());
                }
            }
        }
        let route = (!routes.is_empty()).then(|| routes.keys().cloned().collect::<Vec<_>>().join(", "));
        let verdicts: Vec<&str> = runs.iter().filter_map(|r| r.aiv_direct.as_deref()).collect();
        let aiv_direct = if verdicts.contains(&"no") {
            Some("no")
        } else if !verdicts.is_empty() && verdicts.len() == runs.len() && verdicts.iter().all(|v| *v == "yes") {
            Some("yes")
        } else {
            (!verdicts.is_empty()).then_some("unknown")
        };
        let words: Vec<&str> = runs.iter().filter_map(|r| r.submitted_by.as_deref()).collect();
        let mut named: Vec<&str> = words.iter().copied().filter(|word| *word != "unknown").collect();
        named.sort_unstable();
        named.dedup();
        let submitted_by = match named.as_slice() {
            _ if words.is_empty() => None,
            [one] if words.len() == runs.len() && words.iter().all(|word| word == one) => Some(*one),
            [_, _, ..] => Some("mixed"),
            _ => Some("unknown"),
        };
        CrossHostProtocol {
            aiv_direct: aiv_direct.map(str::to_owned),
            submitted_by: submitted_by.map(str::to_owned),
            protocol: protocol.into(),
            clean_runs: clean.len(),
            median_bytes_per_second: median(clean.iter().map(|r| r.bytes_per_second).collect()),
            median_process_cpu_ns_per_transfer: median(
                clean.iter().filter_map(|r| r.process_cpu_ns_per_transfer).collect(),
            ),
            median_latency_p50_ns: median(clean.iter().filter_map(|r| r.latency_p50_ns).collect()),
            runtime: runs.iter().find_map(|r| r.runtime.clone()),
            routes,
            route,
            failures,
            runs,
        }
    }
}

impl CrossHostSize {
    /// One operation's figures at one block size from its runs per protocol (tcp first, then aiv).
    pub fn new(operation: Opcode, block_size: u64, tcp: CrossHostProtocol, aiv: CrossHostProtocol) -> CrossHostSize {
        let targets = verdicts(block_size, &tcp, &aiv);
        CrossHostSize {
            operation: operation.as_str().into(),
            block_size,
            bandwidth_ratio: ratio(aiv.median_bytes_per_second, tcp.median_bytes_per_second),
            cpu_ratio: ratio(aiv.median_process_cpu_ns_per_transfer, tcp.median_process_cpu_ns_per_transfer),
            protocols: vec![tcp, aiv],
            targets,
        }
    }

    /// The figures of `protocol`.
    pub fn protocol(&self, protocol: &str) -> Option<&CrossHostProtocol> {
        self.protocols.iter().find(|p| p.protocol == protocol)
    }
}

/// A block size as `64 KiB`, `1 MiB`.
pub fn block_name(bytes: u64) -> String {
    for (name, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= size && bytes % size == 0 {
            return format!("{} {name}", bytes / size);
        }
    }
    format!("{bytes} B")
}

impl CrossHostReport {
    /// A section that was not run, and why.
    pub fn not_run(options: &CrossHostOptions, reason: String) -> CrossHostReport {
        CrossHostReport {
            label: TWIN_LABEL.into(),
            ran: false,
            not_run_reason: Some(reason),
            setup: String::new(),
            operations: options.operation_names(),
            batch_size: options.batch_size,
            threads: options.threads,
            rounds: options.rounds,
            seconds_per_run: options.seconds.as_secs_f64(),
            sizes: Vec::new(),
        }
    }

    /// The section as Markdown (report.md's "Cross-host" section).
    pub fn markdown(&self, md: &mut String) {
        let _ = writeln!(md, "## Cross-host: aiv vs tcp between two hosts ({})\n", self.label);
        if !self.ran {
            let _ = writeln!(md, "Not run: {}\n", self.not_run_reason.as_deref().unwrap_or("no reason recorded"));
            return;
        }
        let _ = writeln!(
            md,
            "{}. Per run a fresh `aiv bench --mode target` in the second namespace and an `aiv bench --json` \
             initiator in the first; {} rounds of {:.2} s per protocol, operation and block size, the protocols' \
             order alternating; {}, batches of {} from {} threads. Medians over the runs with no failed batch; Host CPU \
             per transfer is the initiator's whole process (the twin's device threads left out). The bar: {}.\n",
            self.setup,
            self.rounds,
            self.seconds_per_run,
            self.operations.iter().map(|op| op.to_uppercase()).collect::<Vec<_>>().join(" and "),
            self.batch_size,
            self.threads,
            bar(),
        );
        let _ = writeln!(
            md,
            "| block | operation | protocol | clean runs | GB/s | Host CPU µs/transfer (process) | p50 µs | route | \
             submitted by | AIV-direct |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
        let number =
            |v: Option<f64>, scale: f64, digits: usize| v.map_or("-".into(), |v| format!("{:.digits$}", v / scale));
        for size in &self.sizes {
            for p in &size.protocols {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} |",
                    block_name(size.block_size),
                    size.operation.to_uppercase(),
                    p.protocol,
                    p.clean_runs,
                    p.runs.len(),
                    number(p.median_bytes_per_second, 1e9, 3),
                    number(p.median_process_cpu_ns_per_transfer, 1e3, 1),
                    number(p.median_latency_p50_ns, 1e3, 1),
                    p.route.as_deref().unwrap_or(if p.protocol == "tcp" { "-" } else { "not recorded" }),
                    p.submitted_by.as_deref().unwrap_or("not recorded"),
                    p.aiv_direct.as_deref().unwrap_or("not recorded"),
                );
            }
        }
        let _ = writeln!(md);
        let _ = writeln!(md, "| block | operation | bar | aiv/tcp | met | why |");
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        for size in &self.sizes {
            for t in &size.targets {
                let sign = if t.target == "bandwidth" { ">=" } else { "<=" };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} {sign} {} | {} | **{}** | {} |",
                    block_name(size.block_size),
                    size.operation.to_uppercase(),
                    t.target,
                    t.limit,
                    number(t.ratio, 1.0, 3),
                    t.met,
                    t.why.replace('|', "/"),
                );
            }
        }
        let _ = writeln!(md);
        // The first failure of each protocol and size, and how many runs failed (every message is in report.json).
        let failures: Vec<String> = self
            .sizes
            .iter()
            .flat_map(|s| {
                s.protocols.iter().filter_map(move |p| {
                    let first = p.failures.first()?;
                    let failed = p.runs.iter().filter(|r| r.error.is_some()).count();
                    Some(format!(
                        "- {} {} {}, {failed} of {} runs failed; the first: {first}",
                        block_name(s.block_size),
                        s.operation.to_uppercase(),
                        p.protocol,
                        p.runs.len()
                    ))
                })
            })
            .collect();
        if !failures.is_empty() {
            let _ = writeln!(md, "Failures:\n");
            for line in failures {
                let _ = writeln!(md, "{}", line.replace('\n', " "));
            }
            let _ = writeln!(md);
        }
    }
}

/// A counter that makes the namespaces' names unique within the process.
static SECTIONS: AtomicU32 = AtomicU32::new(0);

/// Two network namespaces and the veth pair between them; deleted on drop (what was made of them).
struct Namespaces {
    a: String,
    b: String,
    veth_a: String,
    made: Vec<Made>,
}

#[derive(Clone, Copy, PartialEq)]
enum Made {
    NamespaceA,
    NamespaceB,
    /// The pair, while its end `a` is still in this namespace.
    Veth,
}

/// Runs `command` to its end, at most `within` (past that it is killed and the error says so): its exit status,
/// its whole stdout and the tail of its stderr.
fn run_bounded(command: Command, within: Duration) -> std::result::Result<(ExitStatus, Output), String> {
    bounded::run_to_end(command, within, Keep::All, Keep::Tail(child::STDERR_TAIL))
}

/// Runs `ip` with `args` (bounded); `Err` has its stderr.
fn ip(args: &[&str]) -> std::result::Result<(), String> {
    let mut command = Command::new("ip");
    command.args(args);
    let (status, output) = run_bounded(command, IP_WITHIN).map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("ip {} failed ({status}): {}", args.join(" "), output.stderr.trim()))
    }
}

impl Namespaces {
    /// Makes the namespaces `<tag>-a`, `<tag>-b` and the pair `<tag>va`/`<tag>vb`, addressed and up, `<tag>` being
    /// `aivx<pid>-<n>`; first deletes those of audits that died.
    fn create() -> std::result::Result<Namespaces, String> {
        sweep_dead_runs();
        // At most 15 bytes for the veth names: `aivx` + a pid of up to 7 digits + `-n` + `va`.
        let tag = format!("aivx{}-{}", std::process::id(), SECTIONS.fetch_add(1, Ordering::Relaxed) % 10);
        let mut ns =
            Namespaces { a: format!("{tag}-a"), b: format!("{tag}-b"), veth_a: format!("{tag}va"), made: Vec::new() };
        let veth_b = format!("{tag}vb");
        let (a, b, va) = (ns.a.clone(), ns.b.clone(), ns.veth_a.clone());
        ip(&["netns", "add", &a])?;
        ns.made.push(Made::NamespaceA);
        ip(&["netns", "add", &b])?;
        ns.made.push(Made::NamespaceB);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &veth_b])?;
        ns.made.push(Made::Veth);
        ip(&["link", "set", &veth_b, "netns", &b])?;
        ip(&["link", "set", &va, "netns", &a])?;
        // Both ends are in the namespaces now: deleting them deletes the pair.
        ns.made.retain(|m| *m != Made::Veth);
        ip(&["-n", &a, "addr", "add", &format!("{ADDR_A}/24"), "dev", &va])?;
        ip(&["-n", &b, "addr", "add", &format!("{ADDR_B}/24"), "dev", &veth_b])?;
        for (name, dev) in [(&a, &va), (&b, &veth_b)] {
            ip(&["-n", name, "link", "set", "lo", "up"])?;
            ip(&["-n", name, "link", "set", dev, "up"])?;
        }
        Ok(ns)
    }

    fn describe(&self) -> String {
        format!(
            "Two network namespaces, {} ({ADDR_A}, initiator) and {} ({ADDR_B}, target), joined by one veth pair",
            self.a, self.b
        )
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for made in self.made.iter().rev() {
            let _ = match made {
                Made::Veth => ip(&["link", "del", &self.veth_a]),
                Made::NamespaceA => ip(&["netns", "del", &self.a]),
                Made::NamespaceB => ip(&["netns", "del", &self.b]),
            };
        }
    }
}

/// Deletes the namespaces of earlier audits whose process is gone (killed before its drops ran; its children died
/// with it): `aivx<pid>-...` names whose pid is not alive.
fn sweep_dead_runs() {
    let mut list = Command::new("ip");
    list.args(["netns", "list"]);
    let Ok((_, output)) = run_bounded(list, IP_WITHIN) else { return };
    for name in output.stdout.lines().filter_map(|line| line.split_whitespace().next()) {
        let Some(pid) = name.strip_prefix("aivx").and_then(|rest| rest.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// Why the section cannot run here, if it cannot.
fn cannot_run(options: &CrossHostOptions) -> Option<String> {
    if options.program.is_none() {
        return Some("no aiv program to run as target and initiator (the audit's peer program is unset)".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root (ip netns add): rerun as root".into());
    }
    let mut probe = Command::new("ip");
    probe.args(["netns", "list"]);
    match run_bounded(probe, IP_WITHIN) {
        Ok((status, _)) if status.success() => None,
        Ok((status, output)) => Some(format!("`ip netns list` failed ({status}): {}", output.stderr.trim())),
        Err(e) => Some(format!("no usable `ip` (Debian package iproute2): {e}")),
    }
}

/// The common flags of target and initiator.
fn bench_command(program: &Path, namespace: &str, protocol: &str, address: &str, buffer: u64) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", namespace])
        .arg(program)
        .args(["bench", "--protocol", protocol, "--metadata_server", "P2PHANDSHAKE"])
        .args(["--local_server_name", address, "--buffer_size", &buffer.to_string()])
        .env_remove("MOONCAKE_CONFIG_PATH");
    command
}

/// One run: a target of `protocol` in namespace b, then the initiator in namespace a to its end.
fn run_once(
    ns: &Namespaces,
    options: &CrossHostOptions,
    program: &Path,
    protocol: &str,
    (operation, block_size): (Opcode, u64),
    (round, slot): (usize, usize),
) -> CrossHostRun {
    let mut run = CrossHostRun { round, slot, ..CrossHostRun::default() };
    let buffer = options.buffer_size();
    let serve = options.seconds + INITIATOR_SLACK;
    let mut target = bench_command(program, &ns.b, protocol, ADDR_B, buffer);
    target.args(["--mode", "target", "--duration", &format!("{:.3}", serve.as_secs_f64())]);
    let target = match child::spawn_target(target) {
        Ok(target) => target,
        Err(e) => {
            run.error = Some(format!("the {protocol} target did not start: {e}"));
            return run;
        }
    };
    let mut initiator = bench_command(program, &ns.a, protocol, ADDR_A, buffer);
    initiator
        .args(["--segment_id", &target.name, "--operation", operation.as_str()])
        .args(["--block_size", &block_size.to_string(), "--batch_size", &options.batch_size.to_string()])
        .args(["--threads", &options.threads.to_string()])
        .args(["--duration", &format!("{:.3}", options.seconds.as_secs_f64()), "--json"]);
    let finished = run_bounded(initiator, options.seconds + INITIATOR_SLACK);
    drop(target);
    let (status, output) = match finished {
        Ok(finished) => finished,
        Err(e) => {
            run.error = Some(format!("the {protocol} initiator: {e}"));
            return run;
        }
    };
    // A run whose batches failed exits 1 and still prints its document: read it (the route, the first failure).
    let tail = || {
        let lines: Vec<&str> = output.stderr.trim().lines().rev().take(3).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" / ")
    };
    match serde_json::from_str::<serde_json::Value>(output.stdout.trim()) {
        Ok(document) => {
            read_document(&mut run, &document);
            if !status.success() && run.error.is_none() {
                run.error = Some(format!("the {protocol} initiator failed ({status}): {}", tail()));
            }
        }
        Err(_) => run.error = Some(format!("the {protocol} initiator failed ({status}): {}", tail())),
    }
    run
}

/// The run's figures from its `aiv bench --json` document.
fn read_document(run: &mut CrossHostRun, document: &serde_json::Value) {
    let result = &document["result"];
    let evidence = &document["evidence"];
    run.bytes_per_second = result["bytes_per_second"].as_f64().unwrap_or(0.0);
    run.completed_batches = result["completed_batches"].as_u64().unwrap_or(0);
    run.failed_batches = result["failed_batches"].as_u64().unwrap_or(0);
    run.latency_p50_ns = document["batch_latency_ns"]["p50"].as_f64();
    run.process_cpu_ns_per_transfer = evidence["per_transfer"]["process_host_cpu_ns"].as_f64();
    run.runtime = evidence["runtime"]["kind"].as_str().map(str::to_owned);
    run.aiv_direct = evidence["checks"]["aiv_direct"].as_str().map(str::to_owned);
    run.submitted_by = evidence["submitted_by"].as_str().map(str::to_owned);
    if let Some(routes) = evidence["routes"].as_object() {
        run.routes = routes.iter().filter_map(|(k, v)| Some((k.clone(), v.as_u64()?))).collect();
    }
    if run.failed_batches > 0 || run.completed_batches == 0 {
        let reason = result["first_failure"].as_str().unwrap_or("no batch completed and no failure reason recorded");
        run.error =
            Some(format!("{} failed batches, {} completed: {reason}", run.failed_batches, run.completed_batches));
    }
}

/// Runs the section; `progress` is told of each finished run. Never fails: what could not run says why.
pub fn run(options: &CrossHostOptions, progress: &mut dyn FnMut(&str)) -> CrossHostReport {
    if let Some(reason) = cannot_run(options) {
        return CrossHostReport::not_run(options, reason);
    }
    let Some(program) = options.program.as_deref() else {
        return CrossHostReport::not_run(options, "no aiv program".into());
    };
    let ns = match Namespaces::create() {
        Ok(ns) => ns,
        Err(reason) => return CrossHostReport::not_run(options, format!("cannot make the namespaces: {reason}")),
    };
    let mut sizes = Vec::new();
    for &operation in &options.operations {
        for &block_size in &options.sizes {
            let mut runs: [Vec<CrossHostRun>; 2] = [Vec::new(), Vec::new()];
            for round in 0..options.rounds {
                for slot in 0..PROTOCOLS.len() {
                    // tcp first on even rounds, aiv first on odd ones.
                    let index = (slot + round) % PROTOCOLS.len();
                    let protocol = PROTOCOLS[index];
                    let run = run_once(&ns, options, program, protocol, (operation, block_size), (round, slot));
                    progress(&format!(
                        "cross-host {} {} round {}: {protocol} {}",
                        operation.as_str().to_uppercase(),
                        block_name(block_size),
                        round + 1,
                        if run.clean() { format!("{:.3} GB/s", run.bytes_per_second / 1e9) } else { "failed".into() }
                    ));
                    runs[index].push(run);
                }
            }
            let [tcp, aiv] = runs;
            sizes.push(CrossHostSize::new(
                operation,
                block_size,
                CrossHostProtocol::from_runs("tcp", tcp),
                CrossHostProtocol::from_runs("aiv", aiv),
            ));
        }
    }
    let on_npu = sizes
        .iter()
        .filter_map(|s| s.protocol("aiv"))
        .flat_map(|p| p.runs.iter())
        .all(|r| r.runtime.as_deref() == Some("npu"))
        && !sizes.is_empty();
    CrossHostReport {
        label: if on_npu { "NPU runtime".into() } else { TWIN_LABEL.into() },
        ran: true,
        not_run_reason: None,
        setup: ns.describe(),
        operations: options.operation_names(),
        batch_size: options.batch_size,
        threads: options.threads,
        rounds: options.rounds,
        seconds_per_run: options.seconds.as_secs_f64(),
        sizes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(bytes_per_second: f64, cpu: f64) -> CrossHostRun {
        CrossHostRun {
            bytes_per_second,
            process_cpu_ns_per_transfer: Some(cpu),
            latency_p50_ns: Some(1000.0),
            completed_batches: 10,
            ..CrossHostRun::default()
        }
    }

    fn failed(message: &str) -> CrossHostRun {
        CrossHostRun { error: Some(message.into()), routes: [("rdma".into(), 8)].into(), ..CrossHostRun::default() }
    }

    #[test]
    fn the_bars_are_met_or_not_by_the_medians_ratios() {
        let tcp = CrossHostProtocol::from_runs("tcp", vec![run(1e9, 10_000.0), run(3e9, 30_000.0), run(2e9, 20_000.0)]);
        // aiv: 0.9x the bandwidth, 0.05x the CPU: both met.
        let aiv = CrossHostProtocol::from_runs("aiv", vec![run(1.8e9, 1_000.0), run(1.8e9, 1_000.0)]);
        let size = CrossHostSize::new(Opcode::Write, 1 << 20, tcp.clone(), aiv);
        assert_eq!(size.bandwidth_ratio, Some(0.9));
        assert_eq!(size.cpu_ratio, Some(0.05));
        assert_eq!(size.targets.iter().map(|t| t.met.as_str()).collect::<Vec<_>>(), ["yes", "yes"]);
        // aiv: 0.5x the bandwidth, 0.2x the CPU: neither met.
        let slow = CrossHostProtocol::from_runs("aiv", vec![run(1e9, 4_000.0)]);
        let size = CrossHostSize::new(Opcode::Write, 1 << 20, tcp.clone(), slow.clone());
        assert_eq!(size.targets.iter().map(|t| t.met.as_str()).collect::<Vec<_>>(), ["no", "no"]);
        assert!(size.targets[0].why.contains("0.500"), "{}", size.targets[0].why);
        // At 64 KiB only the CPU bar is set.
        let size = CrossHostSize::new(Opcode::Write, 64 << 10, tcp.clone(), slow);
        assert_eq!(size.targets.len(), 1);
        assert_eq!(size.targets[0].target, "host_cpu");
        // aiv failing every run: "no", naming its failure; its route is still recorded.
        let dead = CrossHostProtocol::from_runs("aiv", vec![failed("route is not SDMA"), failed("route is not SDMA")]);
        assert_eq!(dead.failures, ["route is not SDMA"]);
        assert_eq!(dead.route.as_deref(), Some("rdma"));
        let size = CrossHostSize::new(Opcode::Write, 1 << 20, tcp, dead.clone());
        assert_eq!(size.bandwidth_ratio, None);
        assert!(size.targets.iter().all(|t| t.met == "no" && t.why.contains("route is not SDMA")));
        // tcp failing: the reference is missing, so "unknown".
        let size = CrossHostSize::new(
            Opcode::Write,
            1 << 20,
            CrossHostProtocol::from_runs("tcp", vec![failed("refused")]),
            dead,
        );
        assert!(size.targets.iter().all(|t| t.met == "unknown"));
    }

    #[test]
    fn medians_skip_runs_with_failed_batches() {
        let mut partial = run(9e9, 1.0);
        partial.failed_batches = 1;
        let p = CrossHostProtocol::from_runs("tcp", vec![run(1e9, 10.0), partial, run(3e9, 30.0)]);
        assert_eq!(p.clean_runs, 2);
        assert_eq!(p.median_bytes_per_second, Some(2e9));
        assert_eq!(p.median_process_cpu_ns_per_transfer, Some(20.0));
    }

    #[test]
    fn a_bench_document_is_read_with_its_route_and_failure() {
        let document = serde_json::json!({
            "result": {"bytes_per_second": 0.0, "completed_batches": 0, "failed_batches": 4,
                       "first_failure": "kernel rejected the request: route is not SDMA"},
            "batch_latency_ns": {"p50": 1500},
            "evidence": {"runtime": {"kind": "twin"}, "routes": {"rdma": 32},
                         "checks": {"aiv_direct": "yes"}, "submitted_by": "AIV-direct",
                         "per_transfer": {"process_host_cpu_ns": 2500.0}},
        });
        let mut r = CrossHostRun::default();
        read_document(&mut r, &document);
        assert_eq!(r.routes.get("rdma"), Some(&32));
        assert_eq!(r.aiv_direct.as_deref(), Some("yes"));
        // A protocol's verdict: no if any run's is no, yes only if every run's is yes.
        let with = |verdicts: &[Option<&str>]| {
            let runs =
                verdicts.iter().map(|v| CrossHostRun { aiv_direct: v.map(str::to_owned), ..r.clone() }).collect();
            CrossHostProtocol::from_runs("aiv", runs).aiv_direct
        };
        assert_eq!(with(&[Some("yes"), Some("yes")]).as_deref(), Some("yes"));
        assert_eq!(with(&[Some("yes"), Some("no")]).as_deref(), Some("no"));
        assert_eq!(with(&[Some("yes"), None]).as_deref(), Some("unknown"));
        assert_eq!(with(&[None]), None);
        // Who submitted: the runs' one word, mixed when they name different submitters, else unknown.
        assert_eq!(r.submitted_by.as_deref(), Some("AIV-direct"));
        let by = |words: &[Option<&str>]| {
            let runs = words.iter().map(|w| CrossHostRun { submitted_by: w.map(str::to_owned), ..r.clone() }).collect();
            CrossHostProtocol::from_runs("aiv", runs).submitted_by
        };
        assert_eq!(by(&[Some("AIV-direct"), Some("AIV-direct")]).as_deref(), Some("AIV-direct"));
        assert_eq!(by(&[Some("AIV-direct"), Some("Host-submitted")]).as_deref(), Some("mixed"));
        assert_eq!(by(&[Some("AIV-direct"), Some("unknown")]).as_deref(), Some("unknown"));
        assert_eq!(by(&[Some("AIV-direct"), None]).as_deref(), Some("unknown"));
        assert_eq!(by(&[None]), None);
        assert_eq!(r.runtime.as_deref(), Some("twin"));
        assert!(!r.clean());
        assert!(r.error.as_deref().is_some_and(|e| e.contains("route is not SDMA")), "{:?}", r.error);
    }

    #[test]
    fn the_section_renders_figures_verdicts_failures_and_not_run() {
        let tcp = CrossHostProtocol::from_runs("tcp", vec![run(2e9, 20_000.0)]);
        let aiv = CrossHostProtocol::from_runs("aiv", vec![failed("route is not SDMA")]);
        let options = CrossHostOptions::new(None, 1, Duration::from_secs(1));
        let mut report = CrossHostReport::not_run(&options, "needs root".into());
        let mut md = String::new();
        report.markdown(&mut md);
        assert!(md.contains("Not run: needs root"), "{md}");
        assert!(md.contains(TWIN_LABEL), "{md}");
        report.ran = true;
        report.not_run_reason = None;
        report.setup = "Two network namespaces".into();
        let read_tcp = CrossHostProtocol::from_runs("tcp", vec![run(1e9, 10_000.0)]);
        let read_aiv = CrossHostProtocol::from_runs("aiv", vec![run(0.9e9, 900.0)]);
        report.sizes = vec![
            CrossHostSize::new(Opcode::Write, 1 << 20, tcp, aiv),
            CrossHostSize::new(Opcode::Read, 1 << 20, read_tcp, read_aiv),
        ];
        let mut md = String::new();
        report.markdown(&mut md);
        assert!(md.contains("WRITE and READ, batches of 8 from 2 threads"), "{md}");
        // The bar in plain words, with the reason for it; nothing points elsewhere for it.
        assert!(md.contains("The bar: aiv bandwidth >= 0.8x tcp's at 1 MiB"), "{md}");
        assert!(md.contains("Host CPU per transfer <= 0.1x tcp's at every size"), "{md}");
        assert!(!md.to_lowercase().contains("issue") && !md.contains("Targets"), "{md}");
        assert!(md.contains("| block | operation | bar | aiv/tcp | met | why |"), "{md}");
        assert!(md.contains("aiv/tcp 0.900 (bar >= 0.8)"), "{md}");
        assert!(md.contains("| 1 MiB | WRITE | tcp | 1/1 | 2.000 | 20.0 | 1.0 | - |"), "{md}");
        assert!(md.contains("| 1 MiB | WRITE | aiv | 0/1 | - | - | - | rdma |"), "{md}");
        assert!(md.contains("| 1 MiB | WRITE | bandwidth >= 0.8 | - | **no** |"), "{md}");
        assert!(md.contains("| 1 MiB | READ | aiv | 1/1 | 0.900 | 0.9 |"), "{md}");
        assert!(md.contains("| 1 MiB | READ | bandwidth >= 0.8 | 0.900 | **yes** |"), "{md}");
        assert!(md.contains("| 1 MiB | READ | host_cpu <= 0.1 | 0.090 | **yes** |"), "{md}");
        assert!(md.contains("- 1 MiB WRITE aiv, 1 of 1 runs failed; the first: route is not SDMA"), "{md}");
        let json = serde_json::to_string(&report).expect("serializes");
        let back: CrossHostReport = serde_json::from_str(&json).expect("parses");
        assert_eq!(back, report);
    }

    /// A report written when the section measured WRITE only (no `operations`, no per-size `operation`) reads as
    /// WRITE.
    #[test]
    fn a_report_from_before_read_was_measured_reads_as_write() {
        let options = CrossHostOptions::new(None, 1, Duration::from_secs(1));
        let mut report = CrossHostReport::not_run(&options, "x".into());
        let tcp = CrossHostProtocol::from_runs("tcp", vec![run(2e9, 20_000.0)]);
        report.sizes = vec![CrossHostSize::new(Opcode::Read, 1 << 20, tcp.clone(), tcp)];
        let mut json = serde_json::to_value(&report).expect("serializes");
        json.as_object_mut().expect("object").remove("operations");
        json["sizes"][0].as_object_mut().expect("object").remove("operation");
        json.as_object_mut().expect("object").insert("operation".into(), "write".into());
        let back: CrossHostReport = serde_json::from_value(json).expect("parses");
        assert_eq!(back.operations, ["write"]);
        assert_eq!(back.sizes[0].operation, "write");
    }
}
