//! `aiv audit --cross-host` end to end: the binary makes two network namespaces and a veth pair, runs an
//! `aiv bench` target in one and initiators in the other, and reports the section (docs/multihost.md). Needs root
//! and `ip`; skipped otherwise (a `SKIPPED` line, tests/common/skip.rs), failing instead under `CI=true`. The kernel
//! drives the RDMA route: aiv's run must complete on it (its figures are the twin NIC's, so only their presence is
//! checked, not the bar's verdicts).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aiv_transport::audit::cross_host::{CrossHostOptions, TWIN_LABEL};
use aiv_transport::audit::{self, AuditOptions, AuditReport, Silent, Workload};
use aiv_transport::{EngineConfig, Protocol};

#[path = "common/skip.rs"]
mod skip;

/// Why the cross-host section cannot run here, if it cannot.
fn cannot_run() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces need root)".into());
    }
    match Command::new("ip").args(["netns", "list"]).stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(status) if status.success() => None,
        Ok(status) => Some(format!("`ip netns list` failed ({status})")),
        Err(e) => Some(format!("no `ip` (iproute2): {e}")),
    }
}

/// The namespaces whose names the audit process `pid` would have made.
fn namespaces_of(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().map(|o| o.stdout).unwrap_or_default();
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| name.starts_with(&format!("aivx{pid}-")))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_cross_host_section_reports_tcp_and_aiv_on_the_rdma_route_and_cleans_up() {
    if let Some(reason) = cannot_run() {
        skip::skip(&reason);
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("report");
    let mut child = Command::new(env!("CARGO_BIN_EXE_aiv"))
        .args(["audit", "--paths", "tcp", "--sizes", "64k", "--rounds", "1", "--cell-seconds", "0.2"])
        .args(["--no-faults", "--no-alloc", "--cross-host", "--out"])
        .arg(&out)
        .env_remove("MOONCAKE_CONFIG_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("aiv runs");
    let pid = child.id();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("aiv audit --cross-host did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut stderr).expect("stderr");
    assert!(status.success(), "aiv audit --cross-host failed ({status}): {stderr}");
    assert!(namespaces_of(pid).is_empty(), "left behind: {:?}", namespaces_of(pid));

    let report = AuditReport::read(&out.join("report.json")).expect("report.json reads");
    let cross = report.cross_host.as_ref().expect("a cross_host section");
    assert!(cross.ran, "not run: {:?}", cross.not_run_reason);
    assert_eq!(cross.label, TWIN_LABEL);
    assert_eq!((cross.rounds, cross.operations.clone()), (1, vec!["write".to_owned(), "read".to_owned()]));
    assert_eq!(cross.sizes.len(), 2, "WRITE and READ at 64 KiB");
    for (size, operation) in cross.sizes.iter().zip(["write", "read"]) {
        assert_eq!((size.block_size, size.operation.as_str()), (64 << 10, operation));
        assert_eq!(size.protocols.iter().map(|p| p.protocol.as_str()).collect::<Vec<_>>(), ["tcp", "aiv"]);
        let tcp = size.protocol("tcp").expect("tcp");
        assert_eq!((tcp.runs.len(), tcp.clean_runs), (1, 1), "{operation}: tcp failed: {:?}", tcp.failures);
        assert!(tcp.median_bytes_per_second.is_some_and(|b| b > 0.0), "{tcp:?}");
        assert!(tcp.median_process_cpu_ns_per_transfer.is_some_and(|c| c > 0.0), "{tcp:?}");
        let aiv = size.protocol("aiv").expect("aiv");
        assert_eq!((aiv.runs.len(), aiv.clean_runs), (1, 1), "{operation}: aiv failed: {:?}", aiv.failures);
        assert_eq!(aiv.route.as_deref(), Some("rdma"), "{aiv:?}");
        // Across the namespaces the twin NIC's QP log shows the kernel wrote, rang and saw completion; tcp is a Host
        // path.
        assert_eq!(aiv.aiv_direct.as_deref(), Some("yes"), "{operation}: {aiv:?}");
        assert_eq!(tcp.aiv_direct.as_deref(), Some("no"), "{operation}: {tcp:?}");
        assert!(aiv.median_bytes_per_second.is_some_and(|b| b > 0.0), "{aiv:?}");
        // At 64 KiB only the Host CPU bar is set; its verdict is one of the three.
        assert_eq!(size.targets.len(), 1);
        assert_eq!(size.targets[0].target, "host_cpu");
        assert!(["yes", "no"].contains(&size.targets[0].met.as_str()), "{:?}", size.targets);
    }
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(md.contains("## Cross-host: aiv vs tcp between two hosts (twin runtime, unverified on hardware)"), "{md}");
    assert!(md.contains("| 64 KiB | WRITE | tcp | 1/1 |") && md.contains("| 64 KiB | READ | aiv | 1/1 |"), "{md}");
    // --compare shows the cross-host medians side by side.
    let compared = Command::new(env!("CARGO_BIN_EXE_aiv"))
        .args(["audit", "--compare"])
        .args([out.join("report.json"), out.join("report.json")])
        .output()
        .expect("aiv audit --compare runs");
    let text = String::from_utf8_lossy(&compared.stdout);
    assert!(text.contains("## Cross-host (twin runtime, unverified on hardware)"), "{text}");
    assert!(text.contains("| 64 KiB | READ | tcp |") && text.contains("| 1.00 |"), "{text}");
}

#[test]
fn without_a_program_the_section_says_not_run_and_the_audit_succeeds() {
    let config = EngineConfig::new("127.0.0.1");
    let options = AuditOptions {
        paths: vec![Protocol::Tcp],
        workloads: vec![Workload::bench(4096, 1, 1)],
        rounds: 1,
        cell: Duration::from_millis(20),
        reference: Duration::from_millis(5),
        faults: false,
        allocation: false,
        cross_host: Some(CrossHostOptions::new(None, 1, Duration::from_millis(100))),
        ..AuditOptions::quick()
    };
    let report = audit::run(&config, &options, &Silent).expect("the audit runs");
    let cross = report.cross_host.as_ref().expect("a cross_host section");
    assert!(!cross.ran);
    assert!(cross.not_run_reason.as_deref().is_some_and(|r| r.contains("no aiv program")), "{cross:?}");
    assert!(report.markdown().contains("Not run: no aiv program"));
}
