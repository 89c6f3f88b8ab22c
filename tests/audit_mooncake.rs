//! `aiv audit`'s Mooncake paths: Mooncake's own Ascend wheel in two processes on the twin runtime, in the same
//! rounds as the engine paths, with the twin's HiXL model as its `libllm_datadist.so` (`mooncake-ascend`, when
//! `AIV_TEST_MOONCAKE_NPU_VENV` and `AIV_TEST_TWIN_CANN_LIBS` are set) and with `libllm_datadist.so` over aiv
//! (`mooncake-ascend+aiv`, when `AIV_TEST_MOONCAKE_OVER_AIV_LIBS` is set too), as tests/run.sh sets them; without them
//! those tests are skipped with a `SKIPPED` line, failing instead under `CI=true`. Also: the audit's own skip of a
//! missing virtualenv or library directory, with the reason; a driver that dies or hangs mid-run failing its cells
//! with a reason while the audit finishes and its processes are reaped (fake drivers, no wheel needed).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aiv_transport::audit::mooncake::{self, MooncakeSetup, Variant};
use aiv_transport::audit::report::KvCache;
use aiv_transport::audit::{self, AuditOptions, AuditReport, Silent, Workload};
use aiv_transport::config::DeviceBackendKind;
use aiv_transport::evidence::Submitter;
use aiv_transport::{EngineConfig, Opcode, Protocol};

#[path = "common/skip.rs"]
mod skip;

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

fn options(paths: Vec<Protocol>, workloads: Vec<Workload>, setup: Option<MooncakeSetup>) -> AuditOptions {
    let (mooncake, mooncake_over_aiv) = match setup {
        Some(setup) if setup.variant == Variant::OverAiv => (None, Some(setup)),
        setup => (setup, None),
    };
    AuditOptions {
        paths,
        workloads,
        rounds: 2,
        cell: Duration::from_millis(80),
        reference: Duration::from_millis(10),
        operation: Opcode::Write,
        command: vec!["aiv".into(), "audit".into(), "(test)".into()],
        faults: false,
        mooncake,
        mooncake_over_aiv,
        ..AuditOptions::quick()
    }
}

fn wheel_inputs() -> Option<(PathBuf, PathBuf)> {
    let venv = std::env::var_os("AIV_TEST_MOONCAKE_NPU_VENV").map(PathBuf::from);
    let libs = std::env::var_os("AIV_TEST_TWIN_CANN_LIBS").map(PathBuf::from);
    match (venv, libs) {
        (Some(venv), Some(libs)) => Some((venv, libs)),
        _ => {
            skip::skip(
                "set AIV_TEST_MOONCAKE_NPU_VENV (tests/support/mooncake_npu.sh) and AIV_TEST_TWIN_CANN_LIBS \
                 (tests/support/twin_cann_libs.sh) to run Mooncake's wheel in the audit",
            );
            None
        }
    }
}

/// The directory of tests/support/mooncake_over_aiv.sh (`AIV_TEST_MOONCAKE_OVER_AIV_LIBS`, which tests/run.sh sets),
/// with the wheel's virtualenv and the twin's libraries, or `None` (skipped).
fn over_aiv_inputs() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let (venv, twin) = wheel_inputs()?;
    let Some(over_aiv) = std::env::var_os("AIV_TEST_MOONCAKE_OVER_AIV_LIBS").map(PathBuf::from) else {
        skip::skip(
            "set AIV_TEST_MOONCAKE_OVER_AIV_LIBS=\"$(tests/support/mooncake_over_aiv.sh)\" to run the wheel over aiv \
             in the audit (tests/run.sh does)",
        );
        return None;
    };
    Some((venv, twin, over_aiv))
}

#[test]
fn the_wheel_runs_in_the_same_rounds_with_nonzero_figures_a_passed_data_check_and_a_verdict_from_counts() {
    let Some((venv, libs)) = wheel_inputs() else { return };
    let setup = mooncake::discover(Some(venv), Some(libs), DeviceBackendKind::Twin).expect("the wheel is found");
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.hbm_size = 64 << 20;
    let workloads = vec![
        Workload::bench(64 << 10, 4, 1),
        Workload::bench(4096, 2, 2),
        Workload::kv_request(small_kv()),
        Workload::store(8, 1024, 8192, 5),
        Workload::kv_layerwise(small_kv(), 200),
    ];
    let options = options(vec![Protocol::Aiv, Protocol::Tcp], workloads, Some(setup));
    let report = audit::run(&config, &options, &Silent).expect("the audit runs");
    assert_eq!(report.paths, ["aiv", "tcp", "mooncake-ascend"]);
    assert!(report.skipped.iter().all(|s| s.path != "mooncake-ascend"), "{:?}", report.skipped);
    let record = report.mooncake.as_ref().expect("a mooncake record");
    assert!(record.failed_cells.is_empty(), "{:?}", record.failed_cells);
    assert!(record.wheel.is_some() && record.runtime.as_deref() == Some("cann-twin 0.1.0"), "{record:?}");
    for workload in &report.workloads {
        let cell = workload.paths.iter().find(|c| c.path == "mooncake-ascend").expect("a mooncake-ascend cell");
        let bandwidth = cell.bytes_per_second.expect("measured");
        assert!(bandwidth.min > 0.0, "{}: {bandwidth:?}", workload.name);
        assert_eq!(cell.failed_batches, 0, "{}: {:?}", workload.name, report.verdicts);
        assert!(cell.process_cpu_ns_per_transfer.is_some_and(|s| s.min > 0.0), "{}", workload.name);
        assert!(cell.latency_p50_ns.is_some_and(|s| s.min > 0.0), "{}", workload.name);
        // Three paths and the reference per round: the Mooncake path's slot moves with the rotation.
        assert_eq!(cell.rounds.len(), 2);
        assert_eq!((cell.rounds[0].slot, cell.rounds[1].slot), (2, 2), "{}: 0,1,M,ref then ref,1,M,0", workload.name);
        let aiv = workload.paths.iter().find(|c| c.path == "aiv").expect("aiv");
        assert_eq!((aiv.rounds[0].slot, aiv.rounds[1].slot), (0, 3), "{}", workload.name);
        if workload.workload.compute_per_request().is_some() {
            assert!(cell.latency_p50_ns.expect("measured").min >= 400_000.0, "2 layers x 200 µs of compute");
        }
    }
    let check = record.data_check.as_ref().expect("a data check");
    assert!(check.passed, "{check:?}");
    // The wheel's defaults: the capability reported, LocalCommRes 1.3, ADXL's client-server engine, whose batches
    // the twin's HiXL runs on the emulated AI CPU: AI-CPU-submitted, from the runtime's counts.
    assert!(record.engine.as_deref().is_some_and(|e| e.starts_with("hixl_cs")), "{record:?}");
    assert!(record.global_resource_config.is_none());
    let verdict = report.verdicts.iter().find(|v| v.path == "mooncake-ascend").expect("a verdict");
    assert_eq!(verdict.submitted_by, Submitter::AiCpuSubmitted, "{:?}", verdict.lines);
    assert_eq!(verdict.aiv_direct, "no", "{:?}", verdict.lines);
    assert_eq!(verdict.kernel_writes_descriptors, "no", "{:?}", verdict.lines);
    assert!(verdict.transfers > 0);
    assert!(verdict.host_launches_per_transfer > 0.0, "{:?}", verdict.lines);
    assert!(
        verdict.lines[3].contains("by AI CPU") && verdict.lines[3].contains("recorded by the twin"),
        "{:?}",
        verdict.lines
    );
    let evidence = record.evidence.as_ref().expect("twin counts");
    assert_eq!(evidence["kernels_launched"], 0, "{evidence:?}");
    assert_eq!(evidence["provenance_recorded"], 1, "the driver turned the records on: {evidence:?}");
    assert!(evidence["aicpu_kernels_launched"] > 0 && evidence["sqes_by_aicpu"] > 0, "{evidence:?}");
    assert_eq!(evidence["sqes_by_aicpu"], evidence["sqes_executed"], "every SQE the AI CPU's: {evidence:?}");
    assert_eq!(evidence["doorbells_by_aicpu"], evidence["doorbells_rung"], "{evidence:?}");
    assert_eq!((evidence["host_sync_copies"], evidence["host_stream_copies"]), (0, 0), "{evidence:?}");
    // Every transfer the cells made reached the twin's ADXL as a descriptor of a Host thread's transfer call.
    assert!(evidence["adxl_descs"] >= verdict.transfers && evidence["adxl_transfers"] > 0, "{evidence:?}");
    assert_eq!(evidence["adxl_requests_served"], 0, "the TCP stand-in served nothing: {evidence:?}");
    let md = report.markdown();
    assert!(md.contains("## mooncake-ascend") && md.contains("Data check: **passed**"), "{md}");
    assert!(report.method.layout.contains("mooncake-ascend runs Mooncake's own wheel in two processes"));
    assert!(report.registration.iter().any(|r| r.memory == "mooncake-ascend device"), "{:?}", report.registration);
}

/// FabricMem (`--mooncake-global-resource-config` with a `fabric_memory` key, as `ASCEND_GLOBAL_RESOURCE_CONFIG`):
/// with its AI-CPU unfold (the default) the verdict is AI-CPU-submitted; forcing its Host unfold
/// (`fabric_memory.enable_aicpu_unfold: false`) turns the same audit Host-submitted: the verdict follows what the
/// runtime saw done, not the path's name. Data checked both times.
fn fabric_mem_audit(config: &str) -> (AuditReport, aiv_transport::audit::report::PathVerdict) {
    let (venv, libs) = wheel_inputs().expect("checked by the caller");
    let mut setup = mooncake::discover(Some(venv), Some(libs), DeviceBackendKind::Twin).expect("the wheel is found");
    setup.global_resource_config = Some(config.to_owned());
    let mut engine = EngineConfig::new("127.0.0.1");
    engine.aiv.hbm_size = 64 << 20;
    let workloads = vec![Workload::bench(64 << 10, 4, 1), Workload::kv_request(small_kv())];
    let report = audit::run(&engine, &options(vec![Protocol::Tcp], workloads, Some(setup)), &Silent).expect("runs");
    let record = report.mooncake.as_ref().expect("a mooncake record");
    assert!(record.failed_cells.is_empty(), "{:?}", record.failed_cells);
    assert!(record.data_check.as_ref().is_some_and(|c| c.passed), "{:?}", record.data_check);
    assert_eq!(record.global_resource_config.as_deref(), Some(config));
    assert!(record.engine.as_deref().is_some_and(|e| e.starts_with("fabric_mem")), "{record:?}");
    for workload in &report.workloads {
        let cell = workload.paths.iter().find(|c| c.path == "mooncake-ascend").expect("a mooncake-ascend cell");
        assert_eq!(cell.failed_batches, 0, "{}", workload.name);
        assert!(cell.bytes_per_second.is_some_and(|s| s.min > 0.0), "{}", workload.name);
    }
    let verdict = report.verdicts.iter().find(|v| v.path == "mooncake-ascend").cloned().expect("a verdict");
    (report, verdict)
}

#[test]
fn fabric_mem_with_ai_cpu_unfold_is_ai_cpu_submitted_and_forcing_host_unfold_turns_it_host_submitted() {
    if wheel_inputs().is_none() {
        return;
    }
    let (report, aicpu) = fabric_mem_audit(r#"{"fabric_memory":{"enable_aicpu_unfold":true}}"#);
    assert_eq!(aicpu.submitted_by, Submitter::AiCpuSubmitted, "{:?}", aicpu.lines);
    let evidence = report.mooncake.as_ref().and_then(|r| r.evidence.clone()).expect("counts");
    assert!(evidence["aicpu_kernels_launched"] > 0 && evidence["sqes_by_aicpu"] == evidence["sqes_executed"]);
    assert_eq!(evidence["host_stream_copies"], 0, "{evidence:?}");

    let (report, host) =
        fabric_mem_audit(r#"{"fabric_memory.enable_aicpu_unfold":false,"fabric_memory.task_stream_num":2}"#);
    assert_eq!(host.submitted_by, Submitter::HostSubmitted, "{:?}", host.lines);
    assert!(host.host_launches_per_transfer == 0.0, "{:?}", host.lines);
    let evidence = report.mooncake.as_ref().and_then(|r| r.evidence.clone()).expect("counts");
    assert_eq!((evidence["aicpu_kernels_launched"], evidence["sqes_executed"]), (0, 0), "{evidence:?}");
    // One aclrtMemcpyAsync per operation, round-robin over the streams, each synchronised.
    assert!(evidence["host_stream_copies"] >= host.transfers, "{evidence:?}");
    assert!(evidence["host_stream_syncs"] > 0, "{evidence:?}");
}

/// The wheel's error-recovery rounds: an out-of-bounds request fails its batch and the next batch is served; the
/// target killed mid-batch fails the batch and a new transfer to it; a stalled engine is not injected, with why.
fn check_error_recovery_rounds(setup: MooncakeSetup) {
    let path = setup.variant.path();
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.hbm_size = 64 << 20;
    let options = AuditOptions {
        faults: true,
        allocation: false,
        ..options(vec![Protocol::Tcp], vec![Workload::bench(64 << 10, 4, 1)], Some(setup))
    };
    let report = audit::run(&config, &options, &Silent).expect("the audit runs");
    let round = |fault: &str| report.faults.iter().find(|r| r.path == path && r.fault == fault).cloned().expect(fault);
    let oob = round("out_of_bounds");
    assert!(oob.injected, "{oob:?}");
    assert_eq!(oob.states, vec!["failed"; 4], "{oob:?}");
    assert!(oob.first_reason.as_deref().is_some_and(|r| r.contains("returned -")), "{oob:?}");
    assert_eq!(oob.next_batch_served, Some(true), "{oob:?}");
    let stalled = round("stalled_engine");
    assert!(!stalled.injected && stalled.not_injected_reason.as_deref().is_some_and(|r| r.contains("stall")));
    let killed = round("killed_peer");
    assert!(killed.injected, "{killed:?}");
    assert!(killed.states.iter().all(|s| s == "failed"), "the batch in flight at the kill fails: {killed:?}");
    assert!(
        !killed.first_reason.as_deref().unwrap_or("").contains("before the kill"),
        "pending at the kill: {killed:?}"
    );
    assert_eq!(killed.dead_peer_state.as_deref(), Some("failed"), "{killed:?}");
    assert!(killed.ended_after_ms.is_some_and(|ms| ms < 30_000.0), "{killed:?}");
    let md = report.markdown();
    assert!(md.contains(&format!("| {path} | out_of_bounds |")), "{md}");
}

#[test]
fn the_wheel_has_error_recovery_rounds() {
    let Some((venv, libs)) = wheel_inputs() else { return };
    check_error_recovery_rounds(mooncake::discover(Some(venv), Some(libs), DeviceBackendKind::Twin).expect("found"));
}

/// The same rounds over aiv: the same calls of the wheel, the same expectations.
#[test]
fn the_wheel_over_aiv_has_error_recovery_rounds() {
    let Some((venv, _, libs)) = over_aiv_inputs() else { return };
    let setup = mooncake::discover_over_aiv(Some(venv), Some(libs), DeviceBackendKind::Twin).expect("found");
    check_error_recovery_rounds(setup);
}

/// `mooncake-ascend+aiv` beside `aiv` and `mooncake-ascend`, in the same rounds on the same workloads: each takes a
/// slot of its own in every round; the wheel over aiv moves the data (checked by hash) and the twin's counts in its
/// processes show every SQE written and every doorbell rung by the AIV kernel, no Host runtime copy: AIV-direct, while
/// the same wheel on the twin's HiXL model comes out AI-CPU-submitted in the same run. The record and the verdict
/// survive report.json, and `--compare` reads them.
#[test]
fn the_wheel_over_aiv_runs_beside_aiv_and_mooncake_ascend_and_its_counts_make_it_aiv_direct() {
    let Some((venv, twin, over_aiv)) = over_aiv_inputs() else { return };
    let ascend = mooncake::discover(Some(venv.clone()), Some(twin), DeviceBackendKind::Twin).expect("found");
    let over = mooncake::discover_over_aiv(Some(venv), Some(over_aiv), DeviceBackendKind::Twin).expect("found");
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.hbm_size = 64 << 20;
    // Devices 2 and 3 of this process's twin runtime: the other test with an aiv path, which may run at the same
    // time, opens 0 and 1 (one SHMEM PE per device and process).
    config.aiv.device_id = 2;
    let workloads = vec![Workload::bench(64 << 10, 4, 1), Workload::kv_request(small_kv())];
    let options = AuditOptions {
        mooncake: Some(ascend),
        mooncake_over_aiv: Some(over),
        ..options(vec![Protocol::Aiv], workloads, None)
    };
    let report = audit::run(&config, &options, &Silent).expect("the audit runs");
    assert_eq!(report.paths, ["aiv", "mooncake-ascend", "mooncake-ascend+aiv"]);
    assert!(report.skipped.iter().all(|s| !s.path.starts_with("mooncake")), "{:?}", report.skipped);
    for workload in &report.workloads {
        let cell = |path: &str| workload.paths.iter().find(|c| c.path == path).cloned().expect(path);
        let over = cell("mooncake-ascend+aiv");
        assert!(over.bytes_per_second.is_some_and(|s| s.min > 0.0), "{}: {over:?}", workload.name);
        assert!(over.latency_p50_ns.is_some_and(|s| s.min > 0.0), "{}", workload.name);
        assert!(over.process_cpu_ns_per_transfer.is_some_and(|s| s.min > 0.0), "{}", workload.name);
        assert_eq!(over.failed_batches, 0, "{}: {:?}", workload.name, report.verdicts);
        // Round 1: aiv, mooncake-ascend, mooncake-ascend+aiv, memcpy; round 2: memcpy, then the order rotated by
        // one: mooncake-ascend, mooncake-ascend+aiv, aiv.
        let slots = |c: &aiv_transport::audit::report::CellStats| (c.rounds[0].slot, c.rounds[1].slot);
        assert_eq!(slots(&cell("aiv")), (0, 3), "{}", workload.name);
        assert_eq!(slots(&cell("mooncake-ascend")), (1, 1), "{}", workload.name);
        assert_eq!(slots(&over), (2, 2), "{}", workload.name);
    }
    let record = report.mooncake_over_aiv.as_ref().expect("a mooncake-ascend+aiv record");
    assert!(record.failed_cells.is_empty(), "{:?}", record.failed_cells);
    assert!(record.data_check.as_ref().is_some_and(|c| c.passed), "{:?}", record.data_check);
    assert_eq!(record.runtime.as_deref(), Some("cann-twin 0.1.0"), "{record:?}");
    let verdict = |path: &str| report.verdicts.iter().find(|v| v.path == path).cloned().expect(path);
    let over = verdict("mooncake-ascend+aiv");
    assert_eq!(over.submitted_by, Submitter::AivDirect, "{:?}", over.lines);
    assert_eq!((over.aiv_direct.as_str(), over.kernel_writes_descriptors.as_str()), ("yes", "yes"), "{:?}", over.lines);
    assert!(over.transfers > 0);
    let evidence = record.evidence.as_ref().expect("twin counts");
    assert_eq!(evidence["provenance_recorded"], 1, "{evidence:?}");
    assert!(evidence["sqes_by_kernel"] > 0 && evidence["sqes_by_kernel"] == evidence["sqes_executed"], "{evidence:?}");
    assert_eq!(evidence["doorbells_by_kernel"], evidence["doorbells_rung"], "{evidence:?}");
    assert_eq!((evidence["host_sync_copies"], evidence["host_stream_copies"]), (0, 0), "{evidence:?}");
    assert_eq!((evidence["sqes_by_aicpu"], evidence["aicpu_kernels_launched"]), (0, 0), "{evidence:?}");
    // The same wheel on the twin's HiXL model, in the same run: its counts say AI CPU.
    assert_eq!(verdict("mooncake-ascend").submitted_by, Submitter::AiCpuSubmitted);
    let md = report.markdown();
    assert!(md.contains("## mooncake-ascend+aiv") && md.contains("## mooncake-ascend\n"), "{md}");
    assert!(report.method.layout.contains("; mooncake-ascend+aiv runs Mooncake's own wheel"));
    assert!(report.registration.iter().any(|r| r.memory == "mooncake-ascend+aiv device"), "{:?}", report.registration);
    // report.json keeps both records, and --compare reads the path.
    let json = serde_json::to_string(&report).expect("serialises");
    let read: AuditReport = serde_json::from_str(&json).expect("reads back");
    assert_eq!(read.mooncake_over_aiv.as_ref(), Some(record));
    let compared = audit::compare::compare(&read, &report);
    assert!(compared.contains("| mooncake-ascend+aiv |"), "{compared}");
}

/// The command line: `--paths mooncake-ascend+aiv` alone runs it (no engine path), `--rerun` repeats that audit from
/// its report.json, and `--compare` puts the two side by side, the path's row and verdict in it.
#[test]
fn the_command_line_runs_reruns_and_compares_the_path() {
    let Some((venv, _, over_aiv)) = over_aiv_inputs() else { return };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let aiv = |args: &[&std::ffi::OsStr]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_aiv"))
            .arg("audit")
            .args(args)
            .env("AIV_MOONCAKE_NPU_VENV", &venv)
            .env("AIV_MOONCAKE_OVER_AIV_LIBS", &over_aiv)
            .output()
            .expect("aiv runs");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    let os = |text: &'static str| std::ffi::OsStr::new(text);
    aiv(&[
        os("--paths"),
        os("mooncake-ascend+aiv"),
        os("--sizes"),
        os("64k"),
        os("--rounds"),
        os("1"),
        os("--cell-seconds"),
        os("0.1"),
        os("--no-faults"),
        os("--no-alloc"),
        os("--out"),
        first.as_os_str(),
    ]);
    aiv(&[os("--rerun"), first.join("report.json").as_os_str(), os("--out"), second.as_os_str()]);
    for report in [&first, &second] {
        let report = AuditReport::read(&report.join("report.json")).expect("a report");
        assert_eq!(report.paths, ["mooncake-ascend+aiv"]);
        let verdict = report.verdicts.iter().find(|v| v.path == "mooncake-ascend+aiv").expect("a verdict");
        assert_eq!(verdict.submitted_by, Submitter::AivDirect, "{:?}", verdict.lines);
        assert!(report.mooncake_over_aiv.as_ref().is_some_and(|r| r.data_check.as_ref().is_some_and(|c| c.passed)));
    }
    let rerun = AuditReport::read(&second.join("report.json")).expect("a report");
    assert!(rerun.rerun_of.is_some(), "the rerun names the report it repeated");
    let compared =
        aiv(&[os("--compare"), first.join("report.json").as_os_str(), second.join("report.json").as_os_str()]);
    assert!(compared.contains("| mooncake-ascend+aiv |"), "{compared}");
}

/// The verdict comes from the counts, not the path's name: `mooncake-ascend+aiv` pointed at a mis-wired directory
/// (the twin's HiXL model as its libllm_datadist.so, the other files in place) runs, passes its data check, and comes
/// out AI-CPU-submitted, not AIV-direct.
#[test]
fn a_mis_wired_library_directory_turns_the_same_path_not_aiv_direct() {
    let Some((venv, twin, over_aiv)) = over_aiv_inputs() else { return };
    let dir = tempfile::tempdir().expect("a temporary directory");
    for name in ["libascendcl.so", "libllm_datadist.so", "libmetadef.so"] {
        std::os::unix::fs::symlink(twin.join(name), dir.path().join(name)).expect("symlink");
    }
    let engine = "libaiv_transport.so";
    std::os::unix::fs::symlink(over_aiv.join(engine), dir.path().join(engine)).expect("symlink");
    let setup = mooncake::discover_over_aiv(Some(venv), Some(dir.path().to_owned()), DeviceBackendKind::Twin)
        .expect("every file is there");
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.hbm_size = 64 << 20;
    let options = options(vec![Protocol::Tcp], vec![Workload::bench(64 << 10, 4, 1)], Some(setup));
    let report = audit::run(&config, &options, &Silent).expect("the audit runs");
    let record = report.mooncake_over_aiv.as_ref().expect("a mooncake-ascend+aiv record");
    assert!(record.failed_cells.is_empty(), "{:?}", record.failed_cells);
    assert!(record.data_check.as_ref().is_some_and(|c| c.passed), "{:?}", record.data_check);
    let verdict = report.verdicts.iter().find(|v| v.path == "mooncake-ascend+aiv").expect("a verdict");
    assert_eq!(verdict.submitted_by, Submitter::AiCpuSubmitted, "{:?}", verdict.lines);
    assert_eq!(verdict.aiv_direct, "no", "{:?}", verdict.lines);
    let evidence = record.evidence.as_ref().expect("twin counts");
    assert_eq!(evidence["sqes_by_kernel"], 0, "{evidence:?}");
    assert!(evidence["sqes_by_aicpu"] > 0, "{evidence:?}");
}

/// `--paths mooncake-ascend+aiv` without its library directory fails, naming the script that builds it; a default
/// run without it leaves the path out with a line saying why, and records the reason (with the script) under "Not
/// run".
#[test]
fn a_missing_over_aiv_directory_fails_when_asked_for_and_is_left_out_by_default() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let aiv = |args: &[&str], out: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_aiv"))
            .arg("audit")
            .args(args)
            .args(["--sizes", "4k", "--rounds", "1", "--cell-seconds", "0.05", "--no-faults", "--no-alloc"])
            .arg("--mooncake-npu-venv")
            .arg(dir.path().join("no-venv"))
            .arg("--mooncake-over-aiv-libs")
            .arg(dir.path().join("no-libs"))
            .arg("--out")
            .arg(out)
            .output()
            .expect("aiv runs")
    };
    let output = aiv(&["--paths", "tcp,mooncake-ascend+aiv"], &dir.path().join("asked"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("--paths mooncake-ascend+aiv") && stderr.contains("tests/support/mooncake_over_aiv.sh"));
    // Without --paths: every default path runs one 4 KiB cell, and the missing one is left out with a line.
    let out = dir.path().join("all");
    let output = aiv(&[], &out);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("mooncake-ascend+aiv left out: no virtualenv"), "{stderr}");
    let report = AuditReport::read(&out.join("report.json")).expect("a report");
    let skipped = report.skipped.iter().find(|s| s.path == "mooncake-ascend+aiv").expect("recorded under Not run");
    assert!(skipped.reason.contains("tests/support/mooncake_over_aiv.sh"), "{}", skipped.reason);
}

#[test]
fn a_missing_virtualenv_is_skipped_with_how_to_install_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("report");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_aiv"))
        .args(["audit", "--paths", "tcp,mooncake-ascend", "--sizes", "4k", "--rounds", "1", "--cell-seconds", "0.05"])
        .arg("--no-faults")
        .arg("--mooncake-npu-venv")
        .arg(dir.path().join("no-venv"))
        .arg("--twin-cann-libs")
        .arg(dir.path().join("no-libs"))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("aiv runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report = AuditReport::read(&out.join("report.json")).expect("a report");
    assert_eq!(report.paths, ["tcp"]);
    let skipped = report.skipped.iter().find(|s| s.path == "mooncake-ascend").expect("mooncake-ascend skipped");
    assert!(skipped.reason.contains("no virtualenv"), "{}", skipped.reason);
    assert!(skipped.reason.contains("tests/support/mooncake_npu.sh"), "{}", skipped.reason);
    assert!(skipped.reason.contains("tests/support/twin_cann_libs.sh"), "{}", skipped.reason);
    assert!(report.mooncake.is_none() && report.verdicts.iter().all(|v| v.path != "mooncake-ascend"));
}

/// A virtualenv whose `bin/python` is a shell script speaking the driver's protocol, doing `on_run` when asked to
/// run a cell, and recording its pid.
fn fake_venv(dir: &Path, on_run: &str) -> MooncakeSetup {
    let venv = dir.join("venv");
    let libs = dir.join("libs");
    std::fs::create_dir_all(venv.join("bin")).expect("mkdir");
    std::fs::create_dir_all(venv.join("lib/python3.11/site-packages/mooncake")).expect("mkdir");
    std::fs::write(venv.join("lib/python3.11/site-packages/mooncake/engine.so"), b"").expect("write");
    std::fs::create_dir_all(&libs).expect("mkdir");
    for name in ["libascendcl.so", "libllm_datadist.so", "libmetadef.so"] {
        std::fs::write(libs.join(name), b"").expect("write");
    }
    let pids = dir.join("pids");
    let script = format!(
        r#"#!/bin/bash
echo $$ >> '{pids}'
while IFS= read -r line; do
  case "$line" in
    *'"cmd":"init"'*) echo '{{"ok":true,"name":"127.0.0.1:9","addr":4096,"register_s":0.001,"runtime":"cann-twin 0.1.0","wheel":"fake","python":"fake"}}' ;;
    *'"cmd":"snapshot"'*) echo '{{"ok":true,"host_cpu_ns":1,"device_model_cpu_ns":0,"evidence":null}}' ;;
    *'"cmd":"run"'*) {on_run} ;;
    *'"cmd":"quit"'*) echo '{{"ok":true}}'; exit 0 ;;
    *) echo '{{"ok":true}}' ;;
  esac
done
"#,
        pids = pids.display()
    );
    let python = venv.join("bin/python");
    std::fs::write(&python, script).expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut setup = mooncake::discover(Some(venv), Some(libs), DeviceBackendKind::Twin).expect("the fake is found");
    setup.reply_margin = Duration::from_secs(1);
    setup
}

fn pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Runs a tcp-and-mooncake audit on `setup` and checks that the audit finished, tcp measured, every Mooncake cell
/// failed with a reason naming `how`, and both processes are gone.
fn check_failed_driver(dir: &Path, setup: MooncakeSetup, how: &str) {
    let config = EngineConfig::new("127.0.0.1");
    let workloads = vec![Workload::bench(4096, 1, 1), Workload::bench(8192, 1, 1)];
    let started = Instant::now();
    let report = audit::run(&config, &options(vec![Protocol::Tcp], workloads, Some(setup)), &Silent)
        .expect("the audit finishes");
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    let record = report.mooncake.as_ref().expect("a mooncake record");
    assert_eq!(record.failed_cells.len(), 4, "{:?}", record.failed_cells);
    assert!(record.failed_cells[0].reason.contains("initiator process during `run`"), "{:?}", record.failed_cells);
    assert!(record.failed_cells[0].reason.contains(how), "{:?}", record.failed_cells);
    assert!(record.failed_cells[1].reason.contains("ended earlier"), "{:?}", record.failed_cells);
    assert!(record.data_check.as_ref().is_some_and(|c| !c.passed));
    let verdict = report.verdicts.iter().find(|v| v.path == "mooncake-ascend").expect("a verdict");
    assert!(verdict.first_failure.as_deref().is_some_and(|f| f.contains(how)), "{verdict:?}");
    assert_eq!(verdict.transfers, 0);
    for workload in &report.workloads {
        let tcp = workload.paths.iter().find(|c| c.path == "tcp").expect("tcp");
        assert!(tcp.bytes_per_second.is_some_and(|s| s.min > 0.0), "tcp still measured");
        let moon = workload.paths.iter().find(|c| c.path == "mooncake-ascend").expect("a mooncake cell");
        assert!(moon.bytes_per_second.is_none() && moon.rounds.is_empty());
    }
    let pids = pids(dir);
    assert_eq!(pids.len(), 2, "target and initiator started once");
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "driver process {pid} left behind");
    }
}

#[test]
fn a_driver_that_dies_mid_run_fails_its_cells_with_the_reason_and_the_audit_finishes() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let setup = fake_venv(dir.path(), "echo 'fake driver: dying' >&2; exit 3");
    check_failed_driver(dir.path(), setup, "exited (exit status: 3)");
}

#[test]
fn a_driver_that_hangs_mid_run_is_killed_at_its_deadline_and_the_audit_finishes() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let setup = fake_venv(dir.path(), "exec sleep 600");
    check_failed_driver(dir.path(), setup, "no answer within 1.1 s; killed");
}
