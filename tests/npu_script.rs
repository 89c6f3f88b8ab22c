//! `tests/npu/run.sh`, the first run on an Ascend machine: on this machine (no NPU) it stops in its pre-check with
//! status 2 within seconds, naming each missing item and its fix, and leaves no report directory; with a fake tree (device
//! nodes as plain files under a redirected root, a fake `npu-smi` on PATH, a toolkit directory) the pre-check
//! passes and the script goes on to the build step (`--check-only` stops it there); a hanging `npu-smi` is bounded;
//! a failing build skips only the steps that need it and the exit status is 1. None of this is an NPU run: the
//! script's steps after the pre-check are unverified on hardware.
#[path = "common/skip.rs"]
mod skip;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/npu/run.sh")
}

/// `bash tests/npu/run.sh ARGS` in `cwd`, with no CANN variables from this process, PATH = `extra_path` first.
fn run(cwd: &Path, args: &[&str], extra_path: Option<&Path>, env: &[(&str, &OsStr)]) -> (Output, Duration) {
    let mut command = Command::new("bash");
    command.arg(script()).args(args).current_dir(cwd);
    for variable in ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "AIV_NPU_ROOT", "AIV_NPU_SMI_TIMEOUT"] {
        command.env_remove(variable);
    }
    if let Some(dir) = extra_path {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let joined =
            std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path))).expect("PATH");
        command.env("PATH", joined);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let started = Instant::now();
    let output = command.output().expect("run bash");
    (output, started.elapsed())
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A fake Ascend tree: `root/dev/davinci<N>` for each of `devices` and `davinci_manager` as plain files, `bin/npu-smi`
/// running `smi_body`, and a toolkit directory.
fn fake_tree(dir: &Path, devices: usize, smi_body: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (root, bin, toolkit) = (dir.join("root"), dir.join("bin"), dir.join("toolkit"));
    for made in [root.join("dev"), bin.clone(), toolkit.clone()] {
        std::fs::create_dir_all(made).expect("mkdir");
    }
    for n in 0..devices {
        std::fs::write(root.join(format!("dev/davinci{n}")), "").expect("node");
    }
    std::fs::write(root.join("dev/davinci_manager"), "").expect("node");
    let smi = bin.join("npu-smi");
    std::fs::write(&smi, format!("#!/bin/sh\n{smi_body}\n")).expect("npu-smi");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (root, bin, toolkit)
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).expect("read dir").map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect()
}

#[test]
fn without_an_npu_the_script_exits_2_in_seconds_naming_each_missing_item_and_writes_nothing() {
    if Path::new("/dev/davinci_manager").exists() {
        skip::skip("this machine has an Ascend driver; the no-NPU case needs a machine without one");
        return;
    }
    let cwd = tempfile::tempdir().expect("temp dir");
    let (output, took) = run(cwd.path(), &[], None, &[]);
    let said = text(&output);
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(took < Duration::from_secs(10), "the pre-check took {took:?}");
    for named in [
        "/dev/davinci<N>: none found",
        "/dev/davinci_manager: not found",
        "npu-smi: not on PATH",
        "neither ASCEND_HOME_PATH nor ASCEND_TOOLKIT_HOME is set",
        "set_env.sh",
        "nothing was built",
    ] {
        assert!(said.contains(named), "missing {named:?} in:\n{said}");
    }
    assert_eq!(said.matches("Fix: ").count(), 4, "one fix per missing item:\n{said}");
    assert!(entries(cwd.path()).is_empty(), "left behind: {:?}", entries(cwd.path()));
}

#[test]
fn with_a_fake_ascend_tree_the_pre_check_passes_and_the_script_reaches_the_build_step() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (root, bin, toolkit) = fake_tree(dir.path(), 2, "echo 'fake npu-smi'");
    let report = dir.path().join("report");
    let report_arg = report.to_str().expect("utf-8");
    let (output, took) = run(
        dir.path(),
        &["--check-only", "--out", report_arg],
        Some(&bin),
        &[("AIV_NPU_ROOT", root.as_os_str()), ("ASCEND_TOOLKIT_HOME", toolkit.as_os_str())],
    );
    let said = text(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(said.contains("found 2 device node(s)") && said.contains("pre-check passed"), "{said}");
    assert!(said.contains("exported as"), "ASCEND_TOOLKIT_HOME becomes ASCEND_HOME_PATH:\n{said}");
    assert!(
        said.contains("stopping before the build step, which would run: env AIV_REQUIRE_NPU_KERNEL=1 cargo build --release --features cann"),
        "{said}"
    );
    let summary = std::fs::read_to_string(report.join("SUMMARY.txt")).expect("SUMMARY.txt");
    assert!(
        summary.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["precheck", "ok", "0", "0"]),
        "{summary}"
    );
    assert!(
        summary.lines().any(|l| l.starts_with("build ") && l.contains("skipped") && l.contains("(--check-only)")),
        "{summary}"
    );

    // One device node: still passes, saying which tests it will leave out.
    let one = tempfile::tempdir().expect("temp dir");
    let (root, bin, toolkit) = fake_tree(one.path(), 1, "echo 'fake npu-smi'");
    let out = one.path().join("r");
    let (output, _) = run(
        one.path(),
        &["--check-only", "--out", out.to_str().expect("utf-8")],
        Some(&bin),
        &[("AIV_NPU_ROOT", root.as_os_str()), ("ASCEND_HOME_PATH", toolkit.as_os_str())],
    );
    let said = text(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(said.contains("ONE DEVICE") && said.contains("two_npus"), "{said}");
}

#[test]
fn a_hanging_npu_smi_is_bounded_and_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (root, bin, toolkit) = fake_tree(dir.path(), 2, "exec sleep 30");
    let env = [
        ("AIV_NPU_ROOT", root.as_os_str()),
        ("ASCEND_HOME_PATH", toolkit.as_os_str()),
        ("AIV_NPU_SMI_TIMEOUT", OsStr::new("1")),
    ];
    let (output, took) = run(dir.path(), &["--check-only"], Some(&bin), &env);
    let said = text(&output);
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(said.contains("npu-smi info: did not answer within 1 s"), "{said}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(!entries(dir.path()).iter().any(|e| e.starts_with("npu-report-")), "{:?}", entries(dir.path()));
}

#[test]
fn a_failed_build_skips_what_needs_it_runs_the_rest_and_exits_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (root, bin, toolkit) = fake_tree(dir.path(), 2, "echo 'fake npu-smi'");
    // A cargo that fails: the build step fails at once; doctor, tests and audit depend on it, versions does not.
    let cargo = bin.join("cargo");
    std::fs::write(&cargo, "#!/bin/sh\necho \"fake cargo $*\"\nexit 101\n").expect("cargo");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let report = dir.path().join("report");
    let (output, took) = run(
        dir.path(),
        &["--out", report.to_str().expect("utf-8")],
        Some(&bin),
        &[("AIV_NPU_ROOT", root.as_os_str()), ("ASCEND_HOME_PATH", toolkit.as_os_str())],
    );
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let summary = std::fs::read_to_string(report.join("SUMMARY.txt")).expect("SUMMARY.txt");
    let row = |step: &str| {
        summary.lines().find(|l| l.starts_with(&format!("{step} "))).map(|l| l.split_whitespace().take(3).collect())
    };
    assert_eq!(row("build"), Some(vec!["build", "failed", "101"]), "{summary}");
    for step in ["doctor", "tests", "audit"] {
        assert_eq!(row(step), Some(vec![step, "skipped", "-"]), "{summary}");
    }
    assert_eq!(row("versions"), Some(vec!["versions", "ok", "0"]), "{summary}");
    let build_log = std::fs::read_to_string(report.join("build.log")).expect("build.log");
    assert!(build_log.contains("fake cargo build --release --features cann"), "{build_log}");
    let versions = std::fs::read_to_string(report.join("versions.txt")).expect("versions.txt");
    assert!(versions.contains("fake npu-smi") && versions.contains("uname -a"), "{versions}");
    assert!(said.contains(&format!("Report: {}", report.display())), "{said}");
}
