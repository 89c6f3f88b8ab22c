//! `aiv audit` end to end on the twin runtime: a short audit of aiv, adxl, adxl-fabric and tcp whose report must say
//! what the evidence says (aiv AIV-direct, adxl and adxl-fabric AI-CPU-submitted, tcp Host-submitted), interleave the paths round by round,
//! round-trip through report.json, and compare; plus the option checks and the schema guard.

use std::time::Duration;

use aiv_transport::audit::report::KvCache;
use aiv_transport::audit::{self, compare::compare, AuditOptions, AuditReport, Silent, Workload, AUDIT_SCHEMA};
use aiv_transport::evidence::Submitter;
use aiv_transport::{EngineConfig, Opcode, Protocol};

fn small_kv() -> KvCache {
    KvCache {
        layers: 2,
        tokens_per_block: 16,
        kv_heads: 2,
        head_dim: 64,
        dtype_bytes: 2,
        cache_blocks: 16,
        request_blocks: 4,
        seed: 9,
    }
}

fn short_options() -> AuditOptions {
    AuditOptions {
        paths: vec![Protocol::Aiv, Protocol::Adxl, Protocol::AdxlFabric, Protocol::Tcp],
        workloads: vec![
            Workload::bench(4096, 1, 1),
            Workload::bench(64 << 10, 4, 1),
            Workload::kv_request(small_kv()),
            Workload::store(8, 1024, 8192, 5),
            Workload::kv_layerwise(small_kv(), 200),
        ],
        rounds: 2,
        cell: Duration::from_millis(60),
        reference: Duration::from_millis(10),
        operation: Opcode::Write,
        command: vec!["aiv".into(), "audit".into(), "(test)".into()],
        config_file: None,
        faults: true,
        trace: false,
        mooncake: None,
        mooncake_skipped: None,
        peer_program: Some(env!("CARGO_BIN_EXE_aiv").into()),
        allocation: true,
        alloc_request: Some(32 << 20),
        ..AuditOptions::quick()
    }
}

#[test]
fn a_short_audit_reports_what_the_evidence_says_interleaved_and_round_trips() {
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.hbm_size = 64 << 20;
    let options = short_options();
    let report = audit::run(&config, &options, &Silent).expect("the audit runs");
    assert_eq!(report.schema, AUDIT_SCHEMA);
    assert_eq!(report.paths, ["aiv", "adxl", "adxl-fabric", "tcp"]);
    assert_eq!(report.environment.device_backend, "twin");
    assert!(report.runtime().is_some_and(|r| r.starts_with("twin runtime")), "{:?}", report.runtime());

    // The verdicts come from the transfers' evidence: yes for aiv, no for the others; who submitted: aiv's kernel,
    // adxl's AI-CPU tasks (the twin's HiXL in client-server mode), adxl-fabric's AI-CPU launches (the twin's
    // FabricMem with AI-CPU unfold), tcp's Host.
    let verdict = |path: &str| report.verdicts.iter().find(|v| v.path == path).expect("a verdict per path");
    assert_eq!(verdict("aiv").aiv_direct, "yes", "{:?}", verdict("aiv").lines);
    assert_eq!(verdict("aiv").submitted_by, Submitter::AivDirect, "{:?}", verdict("aiv").lines);
    assert_eq!(verdict("aiv").per_transfer_submitted_by.aiv_direct, verdict("aiv").transfers);
    for path in ["adxl", "adxl-fabric", "tcp"] {
        let v = verdict(path);
        assert_eq!((v.aiv_direct.as_str(), v.kernel_writes_descriptors.as_str()), ("no", "no"), "{:?}", v.lines);
        assert!(v.transfers > 0);
    }
    assert_eq!(verdict("tcp").submitted_by, Submitter::HostSubmitted, "{:?}", verdict("tcp").lines);
    assert_eq!(verdict("adxl").submitted_by, Submitter::AiCpuSubmitted, "{:?}", verdict("adxl").lines);
    assert_eq!(verdict("adxl").per_transfer_submitted_by.ai_cpu_submitted, verdict("adxl").transfers);
    let fabric = verdict("adxl-fabric");
    assert_eq!(fabric.submitted_by, Submitter::AiCpuSubmitted, "{:?}", fabric.lines);
    assert_eq!(fabric.per_transfer_submitted_by.ai_cpu_submitted, fabric.transfers);

    // Every round visits every path once, in the first order rotated by the round, and the memcpy reference last in
    // round 0 and first in round 1.
    assert_eq!(report.workloads.len(), 5);
    // Layerwise: a request's latency holds its 2 layers x 200 µs of compute, and the report says by how much more.
    for cell in &report.workloads[4].paths {
        let over = cell.latency_p50_over_compute_ns.expect("a layerwise cell has it");
        assert!(over.min >= 0.0, "{}: a request took less than its compute: {over:?}", cell.path);
        assert!(cell.latency_p50_ns.expect("measured").min >= 400_000.0);
    }
    assert!(report.workloads[1].paths.iter().all(|c| c.latency_p50_over_compute_ns.is_none()));
    assert!(report.workloads[2].name.starts_with("KV request: 2 layers x K/V x 4 of 16 blocks of 4 KiB"));
    assert!(report.workloads[3].name.starts_with("store put/get: 8 objects of 1 KiB to 8 KiB"));
    for workload in &report.workloads {
        assert_eq!(workload.paths.len(), 4);
        let slot = |path: &str, round: usize| {
            let cell = workload.paths.iter().find(|c| c.path == path).expect("cell");
            assert_eq!(cell.rounds.len(), 2, "{}: {path}", workload.name);
            cell.rounds.iter().find(|r| r.round == round).expect("round").slot
        };
        let round0 = [slot("aiv", 0), slot("adxl", 0), slot("adxl-fabric", 0), slot("tcp", 0)];
        assert_eq!(round0, [0, 1, 2, 3], "{}", workload.name);
        let round1 = [slot("adxl", 1), slot("adxl-fabric", 1), slot("tcp", 1), slot("aiv", 1)];
        assert_eq!(round1, [1, 2, 3, 4], "{}", workload.name);
        let reference: Vec<(usize, usize)> = workload.memcpy_rounds.iter().map(|r| (r.round, r.slot)).collect();
        assert_eq!(reference, [(0, 4), (1, 0)]);
        for cell in &workload.paths {
            assert_eq!(cell.failed_batches, 0, "{}: {}: {:?}", workload.name, cell.path, cell.rounds);
            let bandwidth = cell.bytes_per_second.expect("measured");
            assert!(bandwidth.median > 0.0 && bandwidth.min <= bandwidth.median && bandwidth.median <= bandwidth.max);
            assert!(cell.latency_p50_ns.expect("measured").median > 0.0);
            assert!(cell.vs_memcpy.is_some());
        }
    }

    // Occupancy: on the 64 KiB workload aiv kept the SDMA engines busy; tcp (Host buffers) did not touch them.
    let cell = |path: &str| report.workloads[1].paths.iter().find(|c| c.path == path).expect("cell");
    let sdma = |path: &str| cell(path).sdma_busy_per_second.expect("the twin's counters").median;
    assert!(sdma("aiv") > 0.0 && sdma("tcp") == 0.0, "aiv {} tcp {}", sdma("aiv"), sdma("tcp"));
    assert!(cell("aiv").aiv_executing_share.expect("the twin's counters").median > 0.0);
    // The AI CPU ran adxl's batches (HiXL's client-server mode) and nothing of aiv's or tcp's.
    let aicpu = |path: &str| cell(path).aicpu_busy_per_second.expect("the twin's counters").median;
    assert!(aicpu("adxl") > 0.0 && aicpu("aiv") == 0.0 && aicpu("tcp") == 0.0, "{}", aicpu("adxl"));
    assert!(aicpu("adxl-fabric") > 0.0, "the AI CPU ran adxl-fabric's launches: {}", aicpu("adxl-fabric"));

    // Error recovery: an out-of-bounds request fails alone on every path; a stalled engine fails aiv's and adxl's
    // batch, which then serve the next; tcp has no engine to stall and says so.
    let fault = |path: &str, fault: &str| {
        report.faults.iter().find(|f| f.path == path && f.fault == fault).expect("a round per path and fault")
    };
    for path in ["aiv", "adxl", "adxl-fabric", "tcp"] {
        let oob = fault(path, "out_of_bounds");
        assert_eq!(oob.states, ["completed", "failed", "completed", "completed"], "{path}: {oob:?}");
        assert!(oob.first_reason.as_deref().is_some_and(|r| r.contains("target range")), "{path}: {oob:?}");
        assert_eq!(oob.next_batch_served, Some(true), "{path}: {oob:?}");
    }
    for path in ["aiv", "adxl", "adxl-fabric"] {
        let stalled = fault(path, "stalled_engine");
        assert!(stalled.injected && !stalled.states.iter().any(|s| s == "completed"), "{path}: {stalled:?}");
        assert!(stalled.ended_after_ms.is_some_and(|ms| ms < 20_000.0), "{path}: {stalled:?}");
        assert_eq!(stalled.next_batch_served, Some(true), "{path}: {stalled:?}");
    }
    let tcp = fault("tcp", "stalled_engine");
    assert!(!tcp.injected && tcp.not_injected_reason.as_deref().is_some_and(|r| r.contains("tcp")), "{tcp:?}");
    // A killed peer (a target in another process, SIGKILLed with the batch pending): every transfer was pending at
    // the kill and ends failed well inside the transfer timeout (30 s), a new transfer to the dead segment fails at
    // once, and the next batch to the in-process target is served.
    for path in ["aiv", "adxl", "adxl-fabric", "tcp"] {
        let killed = fault(path, "killed_peer");
        assert!(killed.injected, "{path}: {killed:?}");
        assert_eq!(killed.pending_at_fault, Some(4), "{path}: {killed:?}");
        assert!(killed.states.len() == 4 && killed.states.iter().all(|s| s != "completed"), "{path}: {killed:?}");
        assert!(killed.reasons.len() == 4 && killed.reasons.iter().all(|r| !r.is_empty()), "{path}: {killed:?}");
        assert!(killed.ended_after_ms.is_some_and(|ms| ms < 3000.0), "{path}: {killed:?}");
        assert_eq!(killed.dead_peer_state.as_deref(), Some("failed"), "{path}: {killed:?}");
        assert!(killed.dead_peer_ms.is_some_and(|ms| ms < 1000.0), "{path}: {killed:?}");
        assert_eq!(killed.next_batch_served, Some(true), "{path}: {killed:?}");
    }
    let aiv = fault("aiv", "killed_peer");
    let named_loss = |reason: &Option<String>| reason.as_deref().is_some_and(|r| r.contains("lost"));
    assert!(named_loss(&aiv.first_reason) && named_loss(&aiv.dead_peer_reason), "{aiv:?}");
    let tcp = fault("tcp", "killed_peer");
    assert!(tcp.first_reason.as_deref().is_some_and(|r| r.starts_with("tcp:")), "{tcp:?}");
    // Allocation success: 32 MiB of the 64 MiB device heap and of Host memory, obtained whole, registered, freed.
    assert_eq!(report.allocation.len(), 2, "{:?}", report.allocation);
    for (allocation, memory) in report.allocation.iter().zip(["device", "host"]) {
        assert_eq!(allocation.memory, memory);
        assert_eq!((allocation.requested_bytes, allocation.obtained_bytes), (32 << 20, 32 << 20), "{allocation:?}");
        assert_eq!(allocation.registered_bytes, 32 << 20, "{allocation:?}");
        assert!(allocation.first_refusal.is_none() && allocation.registration_s_per_gib.is_some(), "{allocation:?}");
    }
    assert_eq!(report.allocation[0].paths, ["aiv", "adxl", "adxl-fabric"]);

    // report.json holds it all and reads back the same; report.md is made from it.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut report = report;
    let [json, md] = report.write(dir.path()).expect("written");
    let back = AuditReport::read(&json).expect("reads back");
    assert_eq!(back, report, "writing recorded the plots in the report itself");
    // The plots: the three against block size (two sizes here) and the CDF, each named in both files.
    assert_eq!(
        back.plots,
        ["bandwidth_vs_size.svg", "latency_p50_vs_size.svg", "host_cpu_vs_size.svg", "latency_cdf.svg"]
    );
    for plot in &back.plots {
        let svg = std::fs::read_to_string(dir.path().join(plot)).expect("plot written");
        assert!(svg.starts_with("<svg") && svg.contains("aiv") && svg.contains("tcp"), "{plot}");
    }
    let text = std::fs::read_to_string(md).expect("report.md");
    assert!(text.contains("![bandwidth vs size](bandwidth_vs_size.svg)"), "{text}");
    assert!(text.contains("Twin runtime: a CPU model of an NPU, not an NPU"), "{text}");
    assert!(
        text.contains("| aiv | **AIV-direct** | yes |")
            && text.contains("| adxl | **AI-CPU-submitted** | no |")
            && text.contains("| adxl-fabric | **AI-CPU-submitted** | no |")
            && text.contains("| tcp | **Host-submitted** | no |"),
        "{text}"
    );
    assert!(text.contains("| aiv | killed_peer |") && text.contains("- tcp: 4 of 4 pending at the kill"), "{text}");
    let allocation = "| device | aiv, adxl, adxl-fabric | 32 MiB | 32 MiB | 1 | the request was reached |";
    assert!(text.contains(allocation), "{text}");
    let aiv_64k = report.workloads[1].paths.iter().find(|c| c.path == "aiv").expect("cell");
    let median = format!("{:.2}", aiv_64k.bytes_per_second.expect("measured").median * 1e-9);
    assert!(text.contains(&format!("| aiv | {median} [")), "report.md lacks report.json's median {median}:\n{text}");

    // A comparison with itself finds nothing changed; with a copy whose aiv verdict turned, it says so.
    let same = compare(&report, &back);
    assert!(same.contains("Same environment and method"), "{same}");
    assert!(same.contains("| aiv |") && same.contains("| 1.00 |"), "{same}");
    let mut turned = back.clone();
    turned.verdicts[0].aiv_direct = "no".into();
    turned.verdicts[0].submitted_by = Submitter::Mixed;
    turned.environment.cpus += 2;
    let diff = compare(&report, &turned);
    assert!(
        diff.contains(
            "**Verdict changed** for `aiv`: submitted by AIV-direct (AIV-direct yes) in A, mixed (AIV-direct no) in B"
        ),
        "{diff}"
    );
    assert!(diff.contains("Different machines") && diff.contains("logical CPUs"), "{diff}");
    // The error-recovery rounds and allocation success are compared too.
    assert!(same.contains("## Error recovery") && same.contains("| aiv | killed_peer |"), "{same}");
    assert!(same.contains("## Allocation success") && !same.contains("**changed**"), "{same}");
    let mut worse = back.clone();
    let round = worse.faults.iter_mut().find(|r| r.path == "tcp" && r.injected).expect("an injected tcp round");
    round.next_batch_served = Some(false);
    let fault = round.fault.clone();
    worse.allocation[0].obtained_bytes /= 2;
    let diff = compare(&report, &worse);
    let line = diff.lines().find(|l| l.starts_with(&format!("| tcp | {fault} |"))).expect("the tcp round");
    assert!(line.ends_with("| yes | no **changed** |"), "{line}");
    assert!(diff.contains("| 0.50 |"), "half the heap obtained: {diff}");
}

#[test]
fn a_traced_audit_writes_a_chrome_trace_per_path_and_states_the_overhead() {
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.hbm_size = 64 << 20;
    // Devices 6 and 7: the other audit test of this binary holds 0 and 1 while it runs.
    config.aiv.device_id = 6;
    let options = AuditOptions {
        paths: vec![Protocol::Aiv, Protocol::Adxl, Protocol::AdxlFabric, Protocol::Ubshmem, Protocol::Tcp],
        workloads: vec![Workload::bench(64 << 10, 4, 1)],
        rounds: 1,
        faults: false,
        trace: true,
        ..short_options()
    };
    let mut report = audit::run(&config, &options, &Silent).expect("the audit runs");
    assert_eq!(report.traces.len(), 5, "{:?}", report.traces);
    // The measured rounds stay what they were: one per path, untraced.
    assert!(report.workloads[0].paths.iter().all(|cell| cell.rounds.len() == 1));
    let dir = tempfile::tempdir().expect("temp dir");
    let [json, md] = report.write(dir.path()).expect("written");
    assert_eq!(AuditReport::read(&json).expect("reads back"), report);
    for record in &report.traces {
        eprintln!("{record:?}");
        assert_eq!(record.file, format!("trace-64KiB-x4-t1-{}.json", record.path));
        assert!(record.host_events > 0 && record.traced_bytes_per_second > 0.0, "{record:?}");
        assert!(record.traced_over_untraced.is_some_and(|r| r > 0.0), "{record:?}");
        let text = std::fs::read_to_string(dir.path().join(&record.file)).expect("trace file written");
        let trace: serde_json::Value = serde_json::from_str(&text).expect("the trace parses");
        let events = trace["traceEvents"].as_array().expect("traceEvents");
        let named = |name: &str| events.iter().any(|e| e["ph"] == "M" && e["args"]["name"] == name);
        assert!(named(&record.path), "{}: a process named after the path", record.path);
        for stage in ["submit", "completion seen", "wait_batch", "caller woken"] {
            assert!(events.iter().any(|e| e["name"] == stage), "{}: no {stage} event", record.path);
        }
        if record.path == "aiv" {
            assert!(record.device_events > 0 && record.engine_runs > 0, "{record:?}");
            assert!(events.iter().any(|e| e["args"]["name"].as_str().is_some_and(|n| n.starts_with("aiv block "))));
            assert!(events.iter().any(|e| e["name"] == "DCQ published"));
            assert_eq!(record.clock_error_ns.len(), 1, "{record:?}");
        } else {
            assert_eq!(record.device_events, 0, "{record:?}");
        }
    }
    let text = std::fs::read_to_string(md).expect("report.md");
    assert!(text.contains("## Traces") && text.contains("`trace-64KiB-x4-t1-aiv.json`"), "{text}");
}

#[test]
fn bad_options_and_other_schemas_are_refused_by_name() {
    let check = |options: AuditOptions, words: &str| {
        let error = options.validate().expect_err("refused").to_string();
        assert!(error.contains(words), "{error}");
    };
    check(AuditOptions { paths: Vec::new(), ..short_options() }, "no path to audit");
    check(AuditOptions { paths: vec![Protocol::Aiv, Protocol::Aiv], ..short_options() }, "aiv is listed twice");
    check(AuditOptions { rounds: 0, ..short_options() }, "--rounds 0");
    check(AuditOptions { cell: Duration::from_micros(10), ..short_options() }, "--cell-seconds");
    let empty_request = KvCache { request_blocks: 0, ..small_kv() };
    check(AuditOptions { workloads: vec![Workload::kv_request(empty_request)], ..short_options() }, "KV dimension");
    let inverted = Workload::store(4, 8192, 1024, 1);
    check(AuditOptions { workloads: vec![inverted], ..short_options() }, "the smallest at most the largest");
    let huge = Workload::bench(16 << 20, 32, 1);
    check(AuditOptions { workloads: vec![huge], ..short_options() }, "above the audit's 128 MiB");
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.hbm_size = 1 << 20;
    let big = Workload::bench(1 << 20, 4, 1);
    let error = audit::run(&config, &AuditOptions { workloads: vec![big], ..short_options() }, &Silent)
        .expect_err("does not fit the device")
        .to_string();
    assert!(error.contains("aiv.hbm_size"), "{error}");

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("report.json");
    for other in ["aiv-bench/3", "aiv-audit/1"] {
        std::fs::write(&path, format!(r#"{{"schema": "{other}"}}"#)).expect("written");
        let error = AuditReport::read(&path).expect_err("another schema");
        assert!(error.contains(other) && error.contains(AUDIT_SCHEMA), "{error}");
    }
    std::fs::write(&path, "{").expect("written");
    assert!(AuditReport::read(&path).expect_err("not JSON").contains("not JSON"));
    assert!(AuditReport::read(&dir.path().join("missing.json")).expect_err("missing").contains("missing.json"));
}

/// The killed-peer round with a peer program that cannot start says so, and the audit still finishes.
#[test]
fn a_peer_that_cannot_start_is_not_injected_with_the_reason() {
    let mut config = EngineConfig::new("127.0.0.1");
    // Devices 2 and 3: the short audit above holds 0 and 1 while the tests run in parallel.
    config.aiv.device_id = 2;
    config.aiv.hbm_size = 16 << 20;
    let options = AuditOptions {
        paths: vec![Protocol::Tcp],
        workloads: vec![Workload::bench(4096, 1, 1)],
        rounds: 1,
        cell: Duration::from_millis(20),
        peer_program: Some("/nonexistent/aiv".into()),
        allocation: false,
        ..short_options()
    };
    let report = audit::run(&config, &options, &Silent).expect("the audit finishes");
    let killed = report.faults.iter().find(|f| f.fault == "killed_peer").expect("the round");
    assert!(!killed.injected, "{killed:?}");
    let reason = killed.not_injected_reason.as_deref().unwrap_or_default();
    assert!(reason.contains("cannot start the peer") && reason.contains("/nonexistent/aiv"), "{reason}");
    assert!(report.allocation.is_empty());
    let oob = report.faults.iter().find(|f| f.fault == "out_of_bounds").expect("the other rounds ran");
    assert_eq!(oob.next_batch_served, Some(true), "{oob:?}");
}

/// Allocation success: a request above the device's heap obtains less, naming the refusal; one within it obtains
/// all of it.
#[test]
fn allocation_above_the_device_heap_is_refused_and_within_it_obtained() {
    let mut config = EngineConfig::new("127.0.0.1");
    // Device 4: the tests above hold 0 to 3 while the tests run in parallel.
    config.aiv.device_id = 4;
    config.aiv.hbm_size = 16 << 20;
    let above = audit::alloc::measure(&config, &[Protocol::Ubshmem], 24 << 20);
    assert_eq!(above.len(), 1, "{above:?}");
    let device = &above[0];
    assert_eq!((device.memory.as_str(), device.requested_bytes), ("device", 24 << 20));
    assert!(device.obtained_bytes < 24 << 20 && device.obtained_bytes >= 8 << 20, "{device:?}");
    let refusal = device.first_refusal.as_deref().unwrap_or_default();
    assert!(refusal.contains("refused") && refusal.contains("HBM heap"), "{refusal}");
    assert!(device.ended.contains("1 MiB was refused"), "{device:?}");
    assert_eq!(device.registered_bytes, device.obtained_bytes, "{device:?}");

    let within = audit::alloc::measure(&config, &[Protocol::Aiv, Protocol::Tcp], 8 << 20);
    let kinds: Vec<(&str, u64, u64)> =
        within.iter().map(|a| (a.memory.as_str(), a.requested_bytes, a.obtained_bytes)).collect();
    assert_eq!(kinds, [("device", 8 << 20, 8 << 20), ("host", 8 << 20, 8 << 20)], "{within:?}");
    assert!(within.iter().all(|a| a.first_refusal.is_none() && a.ended == "the request was reached"), "{within:?}");
    let error = AuditOptions { alloc_request: Some(1), ..short_options() }.validate().expect_err("too small");
    assert!(error.to_string().contains("--alloc-request 1"), "{error}");
}

/// `aiv audit` as a person runs it, on the quick configuration cut to one short round of aiv and tcp (and
/// `--no-alloc`): its stderr and its report directory. `inject` sets the test hook `AIV_AUDIT_INJECT_WARNING`.
fn audit_cli(paths: &str, inject: Option<&str>) -> (String, serde_json::Value, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("report");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_aiv"));
    command
        .args(["audit", "--quick", "--paths", paths, "--sizes", "4096", "--rounds", "1", "--cell-seconds", "0.02"])
        .arg("--no-alloc")
        .arg("--out")
        .arg(&out)
        .current_dir(dir.path())
        .env_remove("MOONCAKE_CONFIG_PATH")
        .env_remove("AIV_AUDIT_INJECT_WARNING")
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1");
    if let Some(fault) = inject {
        command.env("AIV_AUDIT_INJECT_WARNING", fault);
    }
    let output = command.output().expect("aiv audit runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "aiv audit failed: {stderr}");
    let json = std::fs::read_to_string(out.join("report.json")).expect("report.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("report.json parses");
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    (stderr, report, md)
}

/// A fault round's warnings of one list (`expected_warnings` or `unexpected_warnings`) as (target, message, count).
fn round_warnings(report: &serde_json::Value, path: &str, fault: &str, list: &str) -> Vec<(String, String, u64)> {
    let round = report["faults"]
        .as_array()
        .expect("faults")
        .iter()
        .find(|f| f["path"] == path && f["fault"] == fault)
        .unwrap_or_else(|| panic!("no {path} {fault} round"));
    let records = round[list].as_array().unwrap_or_else(|| panic!("{path} {fault}: no {list}: {round}"));
    records
        .iter()
        .map(|r| {
            let text = |key: &str| r[key].as_str().unwrap_or_default().to_owned();
            (text("target"), text("message"), r["count"].as_u64().unwrap_or(0))
        })
        .collect()
}

/// The warnings the error-recovery rounds provoke on purpose (an out-of-bounds request rejected, a killed peer
/// found lost, its refused connect) do not reach the terminal: stderr holds the progress lines only, and
/// report.json lists each round's warnings with their counts, report.md one line per round.
#[test]
fn the_warnings_a_fault_round_provokes_are_recorded_not_printed() {
    let (stderr, report, md) = audit_cli("aiv,tcp", None);
    for line in stderr.lines() {
        assert!(line.starts_with("audit: ") && !line.contains("WARN"), "a line besides the progress: {line}\n{stderr}");
    }
    let rejected = ("aiv_transport::engine".to_owned(), "request rejected".to_owned(), 1);
    for path in ["aiv", "tcp"] {
        assert_eq!(
            round_warnings(&report, path, "out_of_bounds", "expected_warnings"),
            std::slice::from_ref(&rejected)
        );
        for fault in ["out_of_bounds", "stalled_engine", "killed_peer"] {
            assert_eq!(round_warnings(&report, path, fault, "unexpected_warnings"), [], "{path} {fault}");
        }
    }
    let lost = round_warnings(&report, "aiv", "killed_peer", "expected_warnings");
    let probe = "aiv_transport::transport::aiv::probe";
    assert!(lost.iter().any(|(t, m, n)| t == probe && m == "aiv peer lost" && *n >= 1), "{lost:?}");
    assert_eq!(report["warnings"], serde_json::json!([]), "warnings outside the rounds");
    assert!(md.contains("- aiv out_of_bounds: 1 expected warning (out-of-bounds request rejected ×1): see report.json"));
    assert!(md.contains("- aiv killed_peer: ") && md.contains("peer found lost ×"), "{md}");
}

/// A warning inside a round that the round does not declare still prints (above the progress, never inside a
/// progress line), and is recorded as the round's unexpected warning; the round's expected ones stay off stderr.
#[test]
fn a_warning_a_round_does_not_declare_still_prints_and_is_recorded() {
    let (stderr, report, md) = audit_cli("tcp", Some("out_of_bounds"));
    let injected = "AIV_AUDIT_INJECT_WARNING: a warning the out_of_bounds round does not declare";
    let printed: Vec<&str> = stderr.lines().filter(|line| !line.starts_with("audit: ")).collect();
    assert_eq!(printed.len(), 1, "{stderr}");
    assert!(printed[0].contains(" WARN ") && printed[0].contains(injected), "{stderr}");
    assert!(!stderr.contains("request rejected"), "{stderr}");
    let unexpected = round_warnings(&report, "tcp", "out_of_bounds", "unexpected_warnings");
    assert_eq!(unexpected, [("aiv_transport::audit".to_owned(), injected.to_owned(), 1)]);
    let expected = round_warnings(&report, "tcp", "out_of_bounds", "expected_warnings");
    assert_eq!(expected, [("aiv_transport::engine".to_owned(), "request rejected".to_owned(), 1)]);
    assert!(md.contains("1 unexpected warning (WARN aiv_transport::audit: AIV_AUDIT_INJECT_WARNING"), "{md}");
}
