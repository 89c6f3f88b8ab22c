//! The `aiv` command line as a user meets it: help, doctor, bench, and config errors.

use std::process::Command;

fn aiv() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_aiv"));
    command.env_remove("MOONCAKE_CONFIG_PATH").env_remove("RUST_LOG");
    for name in ["MOONCAKE_LOCAL_HOSTNAME", "MOONCAKE_TE_META_DATA_SERVER", "MOONCAKE_PROTOCOL", "MOONCAKE_DEVICE"] {
        command.env_remove(name);
    }
    command.env_remove("MC_TRANSFER_TIMEOUT");
    command
}

#[test]
fn help_lists_the_commands() {
    let output = aiv().arg("--help").output().expect("runs");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    for word in ["doctor", "bench", "--config", "RUST_LOG"] {
        assert!(text.contains(word), "--help lacks {word}:\n{text}");
    }
}

#[test]
fn doctor_reports_the_twin_and_what_cann_lacks() {
    let output = aiv().arg("doctor").env_remove("ASCEND_HOME_PATH").output().expect("runs");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("twin  usable"), "{text}");
    for missing in ["ASCEND_HOME_PATH", "libascendcl.so", "libshmem.so", "bisheng/ccec"] {
        assert!(text.lines().any(|l| l.contains("missing") && l.contains(missing)), "{missing} not reported:\n{text}");
    }
    assert!(text.contains("loaded runtime: not queried (libascendcl.so did not load)"), "{text}");
    // The twin runtime is always there, and says which it is and its version (never a CANN release).
    for line in
        ["twin runtime: loaded from cann-twin (in-process)", "CANN              cann-twin 0.1.0", "devices           8"]
    {
        assert!(text.contains(line), "{line:?} missing:\n{text}");
    }
}

#[test]
fn bench_prints_transfer_engine_benchs_result_line() {
    let output = aiv()
        .args(["bench", "--duration", "0.3", "--buffer_size", "8mb", "--threads", "2", "--batch_size", "8"])
        .args(["--block_size", "4096", "--operation", "write"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let line = stderr.lines().find(|l| l.starts_with("Test completed: duration ")).expect("result line on stderr");
    let parts: Vec<&str> = line.split(", ").collect();
    assert_eq!(parts.len(), 3, "{line}");
    assert!(parts[1].starts_with("batch count "), "{line}");
    let count: u64 = parts[1]["batch count ".len()..].parse().expect("integer batch count");
    assert!(count > 0, "{line}");
    assert!(parts[2].starts_with("throughput ") && parts[2].ends_with(" GB/s"), "{line}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("x memcpy"), "{stdout}");
}

#[test]
fn config_errors_exit_non_zero_with_the_path_and_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("mooncake.json");
    std::fs::write(&path, r#"{"local_hostname": "127.0.0.1", "protocol": "rdma"}"#).expect("write");
    let output = aiv().arg("--config").arg(&path).args(["bench", "--duration", "0.1"]).output().expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("mooncake.json") && stderr.contains("\"protocol\""), "{stderr}");

    std::fs::write(&path, "{ not json").expect("write");
    let output = aiv().env("MOONCAKE_CONFIG_PATH", &path).args(["bench", "--duration", "0.1"]).output().expect("runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("line 1"), "{}", String::from_utf8_lossy(&output.stderr));

    let output = aiv().args(["bench", "--protocol", "nvlink", "--duration", "0.1"]).output().expect("runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("does not provide"));
}

#[test]
fn bench_over_aiv_reports_aiv_direct_evidence() {
    let output = aiv()
        .args(["bench", "--protocol", "aiv", "--duration", "0.3", "--buffer_size", "16mb", "--threads", "2"])
        .args(["--batch_size", "4", "--block_size", "1mb", "--operation", "write"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.lines().any(|l| l.starts_with("Test completed: duration ")), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The verdict comes from what the twin's device model recorded, with the counts behind each check.
    assert!(
        stdout.contains("submitted by: AIV-direct (twin runtime, cann-twin "),
        "the verdict names its runtime:\n{stdout}"
    );
    assert!(stdout.contains("  AIV-direct: yes (transfers: "), "{stdout}");
    assert!(stdout.contains("  kernel on the AIV cores: yes"), "{stdout}");
    for check in ["kernel writes the descriptors", "kernel rings the doorbell", "completion observed on the Device"] {
        let line = stdout.lines().find(|l| l.trim_start().starts_with(check)).unwrap_or_else(|| panic!("{stdout}"));
        assert!(line.contains(": yes: ") && line.contains("; 0 by Host"), "{line}");
        assert!(line.contains("recorded by the twin's device model"), "{line}");
    }
    // Persistent mode makes no device call per transfer: the calls counted are the first import of the target's
    // memory, shared by the first transfers.
    let calls: f64 = stdout
        .split(" host device-API calls")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(calls < 0.05, "persistent mode makes no device call per transfer:\n{stdout}");
    assert!(stdout.contains("host CPU accounting: sections that never sleep timed by the monotonic clock"), "{stdout}");
}

/// `--json`: stdout is one JSON document (the report for people goes to stderr) that names the records' runtime and
/// carries the run's checks with their counts: the twin's for aiv and adxl, none for tcp; adxl's and tcp's checks
/// are all "no", and adxl's descriptors were written by the twin HiXL's AI-CPU tasks, adxl-fabric's by the twin
/// FabricMem's AI-CPU launches, or by the Host with `--fabric-host-unfold`.
#[test]
fn bench_json_is_one_document_naming_the_runtime_and_the_checks() {
    for (protocol, extra, runtime, direct, submitter) in [
        ("aiv", None, Some("twin"), true, "AIV-direct"),
        ("adxl", None, Some("twin"), false, "AI-CPU-submitted"),
        ("adxl-fabric", None, Some("twin"), false, "AI-CPU-submitted"),
        ("adxl-fabric", Some("--fabric-host-unfold"), Some("twin"), false, "Host-submitted"),
        ("tcp", None, Some("none"), false, "Host-submitted"),
    ] {
        let aicpu = submitter == "AI-CPU-submitted";
        let output = aiv()
            .args(["bench", "--protocol", protocol, "--duration", "0.2", "--buffer_size", "8mb", "--threads", "1"])
            .args(["--batch_size", "4", "--block_size", "4096", "--json"])
            .args(extra)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert!(stderr.contains("Test completed: duration ") && stderr.contains("latency per batch"), "{stderr}");
        let stdout = String::from_utf8(output.stdout).expect("UTF-8");
        assert_eq!(stdout.lines().count(), 1, "one document, nothing else:\n{stdout}");
        let document: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
        assert_eq!(document["schema"], "aiv-bench/3", "{document}");
        assert_eq!(document["workload"]["protocol"], protocol, "{document}");
        assert!(document["result"]["completed_batches"].as_u64().is_some_and(|n| n > 0), "{document}");
        assert!(document["batch_latency_ns"]["p50"].as_u64().is_some_and(|ns| ns > 0), "{document}");
        let evidence = &document["evidence"];
        assert_eq!(evidence["runtime"]["kind"].as_str(), runtime, "{document}");
        assert_eq!(evidence["sample"]["path"], protocol, "{document}");
        let verdict = if direct { "yes" } else { "no" };
        assert_eq!(evidence["checks"]["aiv_direct"], verdict, "{document}");
        assert_eq!(evidence["checks"]["kernel_rings_doorbell"], verdict, "{document}");
        // The counts behind the checks: on aiv every descriptor by an AIV block, none by the Host; on tcp, none by a
        // core.
        let written = &evidence["acts"]["descriptors_written"];
        assert_eq!(written["by_aiv"].as_f64().is_some_and(|n| n >= 1.0), direct, "{document}");
        assert_eq!(written["by_host"].as_f64().is_some_and(|n| n >= 1.0), !direct && !aicpu, "{document}");
        assert_eq!(written["by_aicpu"].as_f64().is_some_and(|n| n >= 1.0), aicpu, "{document}");
        let transfers = evidence["transfers"].as_u64().expect("transfers");
        assert_eq!(evidence["per_transfer_checks"]["aiv_direct"][verdict], transfers, "{document}");
        assert_eq!(evidence["submitted_by"], submitter, "{document}");
        assert_eq!(evidence["per_transfer_submitted_by"][submitter], transfers, "{document}");
        let launches = evidence["per_transfer"]["host_launches"].as_f64().expect("host_launches");
        if aicpu {
            // One AI-CPU launch per batch of 4: a quarter of a launch per transfer.
            assert!((launches - 0.25).abs() < 1e-9, "{document}");
        } else {
            assert_eq!(written["by_aicpu"], 0.0, "{document}");
            assert_eq!(launches, 0.0, "persistent kernel, or no kernel: {document}");
        }
    }
}

#[test]
fn bench_times_sections_with_the_thread_clock_on_request_and_refuses_an_unknown_clock() {
    let output = aiv()
        .args(["bench", "--protocol", "aiv", "--duration", "0.2", "--buffer_size", "16mb", "--threads", "1"])
        .args(["--batch_size", "4", "--block_size", "64kb", "--operation", "write", "--section_clock", "thread"])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let accounting = stdout.lines().find(|l| l.starts_with("host CPU accounting:")).expect("accounting line");
    assert!(accounting.contains("timed by the thread clock"), "{accounting}");
    assert!(accounting.contains("0.0 monotonic-clock readings"), "no section read the monotonic clock: {accounting}");

    let output = aiv().args(["bench", "--protocol", "aiv", "--section_clock", "wall"]).output().expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown section clock \"wall\""), "{stderr}");
}

#[test]
fn bench_refuses_a_buffer_larger_than_twin_hbm() {
    let output = aiv()
        .args(["bench", "--protocol", "aiv", "--duration", "0.1", "--buffer_size", "4gb", "--threads", "1"])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("hbm_size"), "{stderr}");
}

#[test]
fn out_of_range_flags_and_environment_are_refused_naming_value_and_range() {
    let cases: [(&[&str], &str, &str); 5] = [
        (&["--duration", "1e300"], "1e300", "from 0.000001 to 31536000"),
        (&["--report_precision", "100000"], "100000", "from 0 to 16"),
        (&["--buffer_size", "1000000tb"], "1000000tb", "half this machine's memory"),
        (&["--threads", "100000"], "100000", "from 1 to 1024"),
        (&["--duration", "0"], "\"0\"", "from 0.000001 to 31536000"),
    ];
    for (flags, value, range) in cases {
        let output = aiv().arg("bench").args(flags).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(value) && stderr.contains(range), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    for timeout in ["18446744073709551615", "0"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("mooncake.json");
        std::fs::write(&path, r#"{"local_hostname": "127.0.0.1:12345"}"#).expect("write");
        let output = aiv()
            .arg("--config")
            .arg(&path)
            .env("MC_TRANSFER_TIMEOUT", timeout)
            .args(["bench", "--duration", "0.1", "--buffer_size", "1mb", "--threads", "1", "--batch_size", "1"])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("MC_TRANSFER_TIMEOUT") && stderr.contains("from 1 to 3600"), "{stderr}");
        assert!(stderr.contains(timeout) && !stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn without_a_file_the_mooncake_environment_is_honoured() {
    let small = ["bench", "--duration", "0.2", "--buffer_size", "16mb", "--threads", "1", "--batch_size", "2"];
    let output = aiv().env("MOONCAKE_PROTOCOL", "aiv").args(small).output().expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.starts_with("aiv bench: protocol aiv,"), "MOONCAKE_PROTOCOL=aiv was not used:\n{stdout}");

    let output = aiv().env("MOONCAKE_PROTOCOL", "rdma").args(small).output().expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "rdma must be refused, not run as tcp: {stderr}");
    assert!(stderr.contains("MOONCAKE_PROTOCOL") && stderr.contains("\"rdma\""), "{stderr}");
    assert!(!stderr.contains("Test completed"), "{stderr}");

    let output = aiv().env("MC_TRANSFER_TIMEOUT", "0").args(small).output().expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("MC_TRANSFER_TIMEOUT") && stderr.contains("from 1 to 3600"), "{stderr}");
}

/// A child process killed and reaped on drop, so that a failing test leaves nothing running.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first line of `child`'s stdout, waited for at most `timeout`.
fn first_line(child: &mut Child, timeout: std::time::Duration) -> String {
    use std::io::BufRead as _;
    let stdout = child.0.stdout.take().expect("piped stdout");
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = send.send(line);
    });
    receive.recv_timeout(timeout).unwrap_or_default()
}

/// Waits at most `timeout` for `child` to exit.
fn exit_within(child: &mut Child, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.0.try_wait().expect("try_wait") {
            return Some(status);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `aiv metadata-server` on a free loopback port, and its URL (the server stops when the handle drops).
fn metadata_server() -> (Child, String) {
    let mut server = Child(
        aiv()
            .args(["metadata-server", "--port", "0"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("runs"),
    );
    let line = first_line(&mut server, std::time::Duration::from_secs(10));
    let url = line.split_whitespace().find(|w| w.starts_with("http://127.0.0.1:")).expect(&line).to_owned();
    (server, url)
}

#[test]
fn a_target_serves_until_signalled_then_withdraws_so_a_restart_under_its_name_works() {
    use std::process::Stdio;
    use std::time::Duration;
    let (_server, url) = metadata_server();
    // Not a bound port: under a metadata store the name is taken as given.
    let name = format!("127.0.0.1:{}", 30_000 + std::process::id() % 20_000);
    let dir = tempfile::tempdir().expect("temp dir");
    // The second round starts under the same name: the store accepts it only if the first target withdrew its keys.
    for (round, signal) in [libc::SIGTERM, libc::SIGINT].into_iter().enumerate() {
        let log = dir.path().join(format!("target-{round}.log"));
        // No config file: the metadata server and the name come from Mooncake's environment variables.
        let mut child = Child(
            aiv()
                .env("MOONCAKE_TE_META_DATA_SERVER", &url)
                .env("MOONCAKE_LOCAL_HOSTNAME", &name)
                .args(["bench", "--mode", "target", "--buffer_size", "1mb"])
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&log).expect("log file"))
                .spawn()
                .expect("runs"),
        );
        let line = first_line(&mut child, Duration::from_secs(15));
        let stderr = || std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            line.contains(&format!("segment {name} serving")) && line.contains("until SIGINT or SIGTERM"),
            "round {round}: {line:?}\n{}",
            stderr()
        );
        std::thread::sleep(Duration::from_millis(300));
        assert!(child.0.try_wait().expect("try_wait").is_none(), "target exited before any signal: {}", stderr());
        let pid = libc::pid_t::try_from(child.0.id()).expect("pid");
        // SAFETY: plain kill(2) on the child this test started and still holds (not yet reaped).
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let status = exit_within(&mut child, Duration::from_secs(5));
        let status = status.unwrap_or_else(|| panic!("target still running 5 s after signal {signal}"));
        assert_eq!(status.code(), Some(0), "signal {signal}: {}", stderr());
    }
}

#[test]
fn an_initiator_with_failed_batches_exits_non_zero() {
    use std::process::Stdio;
    use std::time::Duration;
    let (_server, url) = metadata_server();
    let name = format!("127.0.0.1:{}", 30_000 + (std::process::id() + 7) % 20_000);
    let mut target = Child(
        aiv()
            .args(["bench", "--mode", "target", "--buffer_size", "1mb", "--duration", "20"])
            .args(["--metadata_server", &url, "--local_server_name", &name])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("runs"),
    );
    let line = first_line(&mut target, Duration::from_secs(15));
    assert!(line.contains("serving"), "{line:?}");
    // Two threads, one 1 MiB block each: thread 0's block is the target's whole buffer, thread 1's lies past its end,
    // so about half the batches complete and half fail.
    let output = aiv()
        .args(["bench", "--segment_id", &name, "--metadata_server", &url, "--local_server_name", "127.0.0.1:0"])
        .args(["--buffer_size", "2mb", "--block_size", "1mb", "--batch_size", "1", "--threads", "2"])
        .args(["--duration", "0.3"])
        .env("RUST_LOG", "error")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let result = stderr.lines().find(|l| l.starts_with("Test completed: ")).expect("result line");
    assert!(!result.contains("batch count 0,"), "some batches completed: {result}");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("batch(es) failed"), "{stderr}");
}

#[test]
fn gflags_spellings_and_mooncake_only_flags_run() {
    let small = ["--buffer_size", "1mb", "--threads", "1", "--batch_size", "1", "--block_size", "4kb"];
    for duration in [&["-duration=0.1"][..], &["--duration=0.1"], &["--duration", "0.1"], &["-duration", "0.1"]] {
        let output = aiv().arg("bench").args(duration).args(small).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{duration:?}: {stderr}");
        let line = stderr.lines().find(|l| l.starts_with("Test completed: duration ")).expect(&stderr);
        // The flag took effect: about 0.1 s, not the default 10 s (a loaded machine may overshoot by a batch or two).
        let seconds: f64 = line["Test completed: duration ".len()..]
            .split(',')
            .next()
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no duration in {line:?}"));
        assert!((0.1..3.0).contains(&seconds), "{duration:?}: {line}");
        assert!(!line.contains("batch count 0,"), "{line}");
    }
    let output = aiv()
        .args(["bench", "-duration=0.1", "--logtostderr", "--auto_discovery", "--nic_priority_matrix", "m.json"])
        .args(["--use_vram=false", "--gpu_id", "0", "-init_mem", "--backend=classic"])
        .args(small)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    for flag in ["--logtostderr", "--auto_discovery", "--nic_priority_matrix m.json", "--use_vram=false", "--gpu_id 0"]
    {
        let notices = stderr.lines().filter(|l| l.contains(&format!("notice: {flag}:")) && l.contains("no effect"));
        assert_eq!(notices.count(), 1, "one notice for {flag}:\n{stderr}");
    }
    let output = aiv().args(["bench", "--duration=0.1", "--no_such_flag"]).output().expect("runs");
    assert_eq!(output.status.code(), Some(2), "an unknown flag is still an error");
    assert!(String::from_utf8_lossy(&output.stderr).contains("--no_such_flag"));
}

/// `--fabric-host-unfold` runs adxl-fabric with FabricMem's Host unfold: its verdict, from the counts, turns
/// Host-submitted (AI-CPU-submitted without the flag, bench_json_is_one_document_naming_the_runtime_and_the_checks).
#[test]
fn audit_with_the_fabric_host_unfold_finds_adxl_fabric_host_submitted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("run");
    let output = aiv()
        .args(["audit", "--paths", "adxl-fabric", "--fabric-host-unfold", "--sizes", "4k", "--batch-size", "2"])
        .args(["--rounds", "1", "--cell-seconds", "0.05", "--no-faults", "--no-alloc"])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("adxl-fabric submitted by: Host-submitted"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("json")).expect("JSON");
    assert_eq!(report["paths"], serde_json::json!(["adxl-fabric"]), "{report}");
    let command: Vec<&str> = report["command"].as_array().expect("command").iter().filter_map(|w| w.as_str()).collect();
    assert!(command.contains(&"--fabric-host-unfold"), "recorded for a rerun: {command:?}");
}

#[test]
fn audit_writes_a_report_directory_and_compares_two_reports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("run");
    let output = aiv()
        .args([
            "audit",
            "--paths",
            "aiv,tcp",
            "--sizes",
            "4k",
            "--batch-size",
            "1",
            "--rounds",
            "1",
            "--cell-seconds",
            "0.05",
            "--no-faults",
            "--no-alloc",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("aiv      submitted by: AIV-direct (twin runtime"), "{stdout}");
    assert!(stdout.contains("tcp      submitted by: Host-submitted"), "{stdout}");
    assert!(stderr.contains("audit: 3/3 4 KiB x 1 x 1 thread round 1"), "plain progress when not a terminal: {stderr}");
    let json = out.join("report.json");
    assert!(json.is_file() && out.join("report.md").is_file(), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("JSON");
    assert_eq!(report["schema"], "aiv-audit/2");
    assert_eq!(report["command"][0], "aiv", "the program is recorded by name, not by where it lies");
    assert_eq!(report["faults"], serde_json::json!([]), "--no-faults leaves the error-recovery rounds out");
    assert_eq!(report["allocation"], serde_json::json!([]), "--no-alloc leaves allocation success out");

    let output = aiv().args(["audit", "--compare"]).arg(&json).arg(&json).output().expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && stdout.contains("Same environment and method"), "{stdout}");

    let missing = dir.path().join("missing.json");
    let output = aiv().args(["audit", "--compare"]).arg(&missing).arg(&json).output().expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("missing.json"), "{stderr}");
    let output = aiv().args(["audit", "--paths", "aiv,rdma"]).output().expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--paths") && stderr.contains("rdma"), "{stderr}");
    assert!(stderr.contains("adxl, adxl-fabric, ubshmem"), "the paths it provides: {stderr}");
}

/// `--rerun` repeats a report's command on its recorded configuration file and variables, not on the process's.
#[test]
fn audit_rerun_repeats_the_recorded_command_and_configuration() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("mooncake.json");
    let text = r#"{"local_hostname": "127.0.0.1:12345", "aiv": {"baseline_timeout_ms": 4321}}"#;
    std::fs::write(&config, text).expect("write");
    let first = dir.path().join("first");
    let output = aiv()
        .env("MOONCAKE_CONFIG_PATH", &config)
        .env("MC_TRANSFER_TIMEOUT", "7")
        .args(["audit", "--paths", "tcp", "--sizes", "4k", "--batch-size", "1", "--rounds", "1"])
        .args(["--cell-seconds", "0.05", "--no-faults", "--out"])
        .arg(&first)
        .output()
        .expect("runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let read = |dir: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).expect("report")).expect("JSON")
    };
    let original = read(&first);
    assert_eq!(original["config"]["file"], text);
    assert_eq!(original["config"]["env"], serde_json::json!({"MC_TRANSFER_TIMEOUT": "7"}), "the path is not kept");

    // Another configuration in this process's environment: the rerun ignores it.
    let other = dir.path().join("other.json");
    std::fs::write(&other, r#"{"local_hostname": "127.0.0.1:12345", "aiv": {"baseline_timeout_ms": 99}}"#)
        .expect("write");
    let second = dir.path().join("second");
    let output = aiv()
        .env("MOONCAKE_CONFIG_PATH", &other)
        .env("MC_TRANSFER_TIMEOUT", "9")
        .args(["audit", "--rerun"])
        .arg(first.join("report.json"))
        .arg("--out")
        .arg(&second)
        .output()
        .expect("runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rerun = read(&second);
    assert_eq!(rerun["command"], original["command"], "the recorded command, so that a rerun can be rerun");
    assert_eq!(rerun["config"]["file"], text);
    assert_eq!(rerun["config"]["env"], original["config"]["env"]);
    let effective = |report: &serde_json::Value| -> String {
        let text = report["config"]["effective"].as_str().expect("recorded").to_owned();
        assert!(!text.contains(dir.path().to_str().expect("UTF-8")), "no directory of the machine: {text}");
        text.lines().filter(|line| !line.contains("origin:")).collect::<Vec<_>>().join("\n")
    };
    assert_eq!(effective(&rerun), effective(&original), "the same configuration");
    assert!(rerun["config"]["effective"].as_str().is_some_and(|e| e.contains("4.321s")), "{}", rerun["config"]);
    assert_eq!(rerun["rerun_of"]["started_utc"], original["started_utc"]);
    assert_eq!(rerun["workloads"][0]["name"], original["workloads"][0]["name"]);
    assert!(second.join("rerun-config.json").is_file() && second.join("report.md").is_file());
    let md = std::fs::read_to_string(second.join("report.md")).expect("report.md");
    assert!(md.contains("A rerun (`aiv audit --rerun`)") && md.contains("`MC_TRANSFER_TIMEOUT=7`"), "{md}");

    // What cannot be rerun says why.
    let output = aiv().args(["audit", "--rerun"]).arg(&config).output().expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("not an aiv audit report"), "{stderr}");
    let mut broken = original.clone();
    broken["command"] = serde_json::json!(["aiv", "audit", "--rounds", "many"]);
    let path = dir.path().join("broken.json");
    std::fs::write(&path, broken.to_string()).expect("write");
    let output = aiv().args(["audit", "--rerun"]).arg(&path).output().expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("does not parse") && stderr.contains("many"), "{stderr}");
    let output = aiv().args(["audit", "--rerun"]).arg(&path).args(["--rounds", "2"]).output().expect("runs");
    assert!(!output.status.success(), "--rerun takes the recorded flags, not new ones");
}

#[test]
fn audit_inspect_reads_the_kernels_and_names_a_missing_path() {
    let kernels = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
    let output = aiv().args(["audit", "--inspect", kernels]).output().expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("AIV-direct"), "{stdout}");
    assert!(stdout.contains(aiv_transport::audit::inspect::CAVEAT), "the caveat: {stdout}");

    let output = aiv().args(["audit", "--inspect", kernels, "--json"]).output().expect("runs");
    assert!(output.status.success());
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["schema"], "aiv-inspect/2");

    let output = aiv().args(["audit", "--inspect", "/nonexistent"]).output().expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent") && stderr.contains("does not exist"), "{stderr}");

    let output = aiv().args(["audit", "--inspect", kernels, "--quick"]).output().expect("runs");
    assert!(!output.status.success(), "--inspect does not run the audit");
}

/// The CLI runs itself as the killed-peer round's target in another process, and requests the allocation heap
/// `--alloc-request` names.
#[test]
fn audit_kills_a_peer_of_its_own_binary_and_requests_the_named_heap() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("run");
    let output = aiv()
        .args(["audit", "--paths", "tcp", "--sizes", "4k", "--batch-size", "1", "--rounds", "1"])
        .args(["--cell-seconds", "0.05", "--alloc-request", "8m", "--out"])
        .arg(&out)
        .output()
        .expect("runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let text = std::fs::read_to_string(out.join("report.json")).expect("report.json");
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let faults = report["faults"].as_array().expect("faults");
    let killed = faults.iter().find(|f| f["fault"] == "killed_peer").expect("a killed_peer round");
    assert_eq!((&killed["injected"], &killed["pending_at_fault"]), (&true.into(), &4.into()), "{killed}");
    assert_eq!(killed["next_batch_served"], true, "{killed}");
    let allocation = &report["allocation"][0];
    assert_eq!((&allocation["memory"], &allocation["requested_bytes"]), (&"host".into(), &(8u64 << 20).into()));
    assert_eq!(allocation["obtained_bytes"], 8u64 << 20, "{allocation}");

    let output = aiv().args(["audit", "--no-alloc", "--alloc-request", "8m"]).output().expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--alloc-request"), "{stderr}");
}
