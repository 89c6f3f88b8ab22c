//! `aiv doctor`'s readiness checklist against fake trees: a complete one (fake `npu-smi` and `bisheng` scripts,
//! version files, device nodes as plain files, `/etc/hccn.conf`, the toolkit's include directories, and the fake
//! CANN libraries of `shmem-bindings/*/tests/fake` found through the loaders' override variables) is ready; each
//! item taken away turns that item to missing (or warn, for optional ones) with its fix, and `--npu` exits 2; a hung
//! `npu-smi` is killed at the bound. A fake tree proves only the doctor's logic: nothing here says a real driver,
//! compiler or runtime is accepted.

#[path = "common/skip.rs"]
mod skip;

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The fake CANN libraries, built once per test process.
struct Fakes {
    acl: PathBuf,
    shmem: PathBuf,
    hixl: PathBuf,
}

/// A fresh directory `doctor-<pid>-<name>` in the target's scratch directory; the first call also removes the
/// directories of earlier runs whose process is gone.
fn scratch(name: &str) -> PathBuf {
    static SWEPT: OnceLock<()> = OnceLock::new();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    SWEPT.get_or_init(|| {
        for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let pid =
                name.to_str().and_then(|name| name.strip_prefix("doctor-")?.split('-').next()?.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
    let dir = root.join(format!("doctor-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

fn fakes() -> &'static Fakes {
    static FAKES: OnceLock<Fakes> = OnceLock::new();
    FAKES.get_or_init(|| {
        let dir = scratch("fakes");
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let build = |source: &str, name: &str, defines: &[&str]| {
            let output = dir.join(name);
            ascendcl_sys::abi::compile_shared_library(&root.join(source), &output, defines)
                .unwrap_or_else(|failure| panic!("{failure}"));
            output
        };
        Fakes {
            acl: build("shmem-bindings/ascendcl-sys/tests/fake/fake_acl.c", "libascendcl.so", &["FAKE_BACKEND"]),
            shmem: build("shmem-bindings/cann-shmem-sys/tests/fake/fake_shmem.c", "libshmem.so", &[]),
            hixl: build("shmem-bindings/ascendcl-sys/tests/fake/fake_hixl.c", "libcann_hixl.so", &[]),
        }
    })
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("parent directory");
    std::fs::write(path, text).expect("write");
}

fn script(path: &Path, body: &str) {
    write(path, &format!("#!/bin/sh\n{body}\n"));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A complete fake machine: `sys` is the system root, `toolkit` the CANN root (8 NPUs, as the fake ACL reports).
struct Tree {
    dir: PathBuf,
    sys: PathBuf,
    toolkit: PathBuf,
    /// Directories put first on `PATH`.
    path: Vec<PathBuf>,
    env: Vec<(&'static str, PathBuf)>,
    /// Set the child's soft memlock limit to this many bytes.
    memlock: Option<u64>,
}

impl Tree {
    fn new(name: &str) -> Tree {
        let dir = scratch(name);
        let (sys, toolkit) = (dir.join("sys"), dir.join("cann/8.0.0"));
        write(&sys.join("etc/ascend_install.info"), "UserName=HwHiAiUser\nDriver_Install_Path_Param=/opt/Ascend\n");
        write(&sys.join("opt/Ascend/driver/version.info"), "Version=24.1.rc2.fake\n");
        for node in
            (0..8).map(|n| format!("davinci{n}")).chain(["davinci_manager", "devmm_svm", "hisi_hdc"].map(String::from))
        {
            write(&sys.join("dev").join(node), "");
        }
        script(
            &sys.join("usr/local/bin/npu-smi"),
            "[ \"$1\" = info ] || exit 1\necho '| npu-smi 24.1.rc2.fake   Version: 24.1.rc2.fake |'\necho '| NPU Name | Health |'",
        );
        write(
            &sys.join("etc/hccn.conf"),
            "address_0=192.168.100.10\nnetmask_0=255.255.255.0\naddress_1=192.168.100.11\nnetmask_1=255.255.255.0\n",
        );
        write(
            &toolkit.join("aarch64-linux/ascend_toolkit_install.info"),
            "package_name=Ascend-cann-toolkit\nversion=8.0.0.fake\n",
        );
        script(&toolkit.join("compiler/ccec_compiler/bin/bisheng"), "echo 'bisheng (fake) 1.0'");
        for dir in ["compiler/tikcpp", "compiler/tikcpp/tikcfw/impl", "compiler/tikcpp/tikcfw/interface"] {
            std::fs::create_dir_all(toolkit.join(dir)).expect("include directory");
        }
        write(&toolkit.join("compiler/tikcpp/tikcfw/kernel_operator.h"), "// fake\n");
        let fakes = fakes();
        let env = vec![
            ("AIV_ASCENDCL_LIB", fakes.acl.clone()),
            ("AIV_SHMEM_LIB", fakes.shmem.clone()),
            ("AIV_HIXL_LIB", fakes.hixl.clone()),
            ("AIV_LLM_DATADIST_LIB", dir.join("absent/libllm_datadist.so")),
            ("ASCEND_HOME_PATH", toolkit.clone()),
        ];
        Tree { dir, sys, toolkit, path: Vec::new(), env, memlock: None }
    }

    fn set(&mut self, name: &'static str, value: PathBuf) {
        self.env.retain(|(key, _)| *key != name);
        self.env.push((name, value));
    }

    fn unset(&mut self, name: &'static str) {
        self.env.retain(|(key, _)| *key != name);
    }

    /// Runs `aiv doctor ARGS` on this tree: its exit code and stdout.
    fn doctor(&self, args: &[&str], extra: &[(&str, &str)]) -> (i32, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_aiv"));
        let mut path: Vec<PathBuf> = self.path.clone();
        path.extend(["/usr/bin", "/bin"].map(PathBuf::from));
        command
            .arg("doctor")
            .args(args)
            .env_clear()
            .env("PATH", std::env::join_paths(path).expect("PATH"))
            .env("AIV_DOCTOR_SYSROOT", &self.sys)
            .envs(self.env.iter().map(|(key, value)| (*key, value.as_os_str())))
            .envs(extra.iter().copied());
        let memlock = self.memlock;
        // SAFETY: setrlimit only, which is async-signal-safe, between fork and exec.
        unsafe {
            command.pre_exec(move || {
                let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit);
                // Lowering the soft limit is always allowed; otherwise raise it as far as the hard limit lets.
                limit.rlim_cur = memlock.unwrap_or(limit.rlim_max);
                libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit);
                Ok(())
            });
        }
        let output = command.output().expect("aiv runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        (
            output.status.code().unwrap_or(-1),
            format!("{stdout}{}", if stderr.is_empty() { String::new() } else { format!("\nstderr: {stderr}") }),
        )
    }

    /// `aiv doctor --npu --json`: the exit code and the document.
    fn checklist(&self, extra: &[(&str, &str)]) -> (i32, Value) {
        let (code, stdout) = self.doctor(&["--npu", "--json"], extra);
        let json = serde_json::from_str(stdout.split("\nstderr: ").next().unwrap_or_default())
            .unwrap_or_else(|error| panic!("not JSON ({error}):\n{stdout}"));
        (code, json)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn item<'a>(json: &'a Value, name: &str) -> &'a Value {
    json["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|item| item["item"] == name)
        .unwrap_or_else(|| panic!("no {name}: {json:#}"))
}

/// Whether the machine's hard memlock limit lets the complete tree's memlock item be ok.
fn memlock_can_be_ok(json: &Value) -> bool {
    item(json, "memlock limit")["status"] == "ok"
}

#[test]
fn a_complete_fake_tree_is_ready_and_says_it_proves_only_the_logic() {
    let tree = Tree::new("complete");
    let (code, json) = tree.checklist(&[]);
    let expect = [
        ("NPU driver", "24.1.rc2.fake"),
        ("device nodes", "davinci0..davinci7 (8 nodes)"),
        ("npu-smi", "npu-smi 24.1.rc2.fake"),
        ("CANN toolkit", "8.0.0.fake"),
        ("AscendC compiler", "bisheng (fake) 1.0"),
        ("AscendC headers", "tikcfw/kernel_operator.h"),
        ("libascendcl.so", "ACL 1.17.0, CANN 8.5.0-fake"),
        ("libshmem.so", "libshmem.so"),
        ("libcann_hixl.so", "version unknown"),
        ("device count", "8 NPUs"),
        ("RoCE link config", "0: 192.168.100.10/255.255.255.0, 1: 192.168.100.11/255.255.255.0"),
    ];
    // Warnings: the build (this test binary's `aiv` may lack feature `cann`) and what only Mooncake's wheel needs.
    let warned = ["this aiv binary", "libllm_datadist.so"];
    for (name, found) in expect {
        let entry = item(&json, name);
        assert_eq!(entry["status"], "ok", "{name}: {json:#}");
        assert!(entry["found"].as_str().is_some_and(|text| text.contains(found)), "{name} lacks {found:?}: {json:#}");
        assert_eq!(entry["fix"], Value::Null, "{name}");
    }
    // Found and named, but with the CANN version the runtime reported beside the file's.
    assert!(item(&json, "CANN toolkit")["found"]
        .as_str()
        .is_some_and(|text| text.contains("the loaded runtime says 8.5.0-fake")));
    assert_eq!(item(&json, "libllm_datadist.so")["status"], "warn", "optional: only Mooncake's wheel needs it");
    // Every other item is ok (memlock depends on this machine's hard limit: checked below).
    for entry in json["items"].as_array().expect("items") {
        let name = entry["item"].as_str().unwrap_or_default();
        let allowed: &[&str] = if warned.contains(&name) { &["ok", "warn"] } else { &["ok"] };
        let status = entry["status"].as_str().unwrap_or_default();
        assert!(name == "memlock limit" || allowed.contains(&status), "{name}: {json:#}");
    }
    assert!(json["note"].as_str().is_some_and(|note| note.contains("proves only the doctor's logic")), "{json:#}");
    if !memlock_can_be_ok(&json) {
        skip::skip("this machine's hard RLIMIT_MEMLOCK is below the doctor's minimum, so no tree can be ready here");
        return;
    }
    assert_eq!((code, json["ready"].clone()), (0, Value::Bool(true)), "{json:#}");
    let (code, text) = tree.doctor(&["--npu"], &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("proves only the doctor's logic") && text.contains("ready: yes"), "{text}");
    assert!(!text.contains("device backends:"), "--npu prints only the checklist:\n{text}");
    let (code, text) = tree.doctor(&[], &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ready: yes") && text.contains("device backends:"), "{text}");
}

/// Asserts that `name` has `status` with a fix, and the exit code that status implies.
fn assert_item(tree: &Tree, name: &str, status: &str, found: Option<&str>) -> Value {
    let (code, json) = tree.checklist(&[]);
    let entry = item(&json, name);
    assert_eq!(entry["status"], status, "{name}: {json:#}");
    assert!(entry["fix"].as_str().is_some_and(|fix| !fix.is_empty()), "{name} has no fix: {json:#}");
    if let Some(found) = found {
        let text = format!("{} {}", entry["found"].as_str().unwrap_or_default(), entry["looked_for"]);
        assert!(text.contains(found), "{name} lacks {found:?}: {json:#}");
    }
    if status == "missing" {
        assert_eq!((code, json["ready"].clone()), (2, Value::Bool(false)), "{json:#}");
        let (code, text) = tree.doctor(&["--npu"], &[]);
        assert_eq!(code, 2, "{text}");
        assert!(text.lines().any(|line| line.trim_start().starts_with("missing") && line.contains(name)), "{text}");
        assert!(text.contains(&format!("missing: {name}")) || text.contains(&format!(", {name}")), "{text}");
    } else if memlock_can_be_ok(&json) {
        assert_eq!(
            (code, json["ready"].clone()),
            (0, Value::Bool(true)),
            "a warning does not make it unready: {json:#}"
        );
    }
    json
}

#[test]
fn no_driver_version_file_is_a_missing_driver() {
    let tree = Tree::new("driver");
    std::fs::remove_file(tree.sys.join("opt/Ascend/driver/version.info")).expect("remove");
    assert_item(&tree, "NPU driver", "missing", Some("opt/Ascend/driver/version.info"));
}

#[test]
fn a_missing_control_node_or_no_davinci_node_is_missing_device_nodes() {
    let tree = Tree::new("nodes");
    std::fs::remove_file(tree.sys.join("dev/devmm_svm")).expect("remove");
    assert_item(&tree, "device nodes", "missing", Some("absent: devmm_svm"));
    for n in 0..8 {
        std::fs::remove_file(tree.sys.join(format!("dev/davinci{n}"))).expect("remove");
    }
    let json = assert_item(&tree, "device nodes", "missing", Some("absent: davinci<N>, devmm_svm"));
    // The runtime still reports 8: the two counts differ, and the doctor says so.
    assert!(item(&json, "device count")["found"].as_str().is_some_and(|text| text.contains("they differ")), "{json:#}");
}

#[test]
fn no_npu_smi_or_a_failing_one_is_missing() {
    let tree = Tree::new("npu-smi");
    script(&tree.sys.join("usr/local/bin/npu-smi"), "echo 'dcmi module initialize failed. ret is -8005' >&2; exit 1");
    assert_item(&tree, "npu-smi", "missing", Some("exited with 1: dcmi module initialize failed"));
    std::fs::remove_file(tree.sys.join("usr/local/bin/npu-smi")).expect("remove");
    assert_item(&tree, "npu-smi", "missing", Some("usr/local/sbin/npu-smi"));
}

#[test]
fn a_hanging_npu_smi_is_killed_at_the_bound() {
    let tree = Tree::new("hang");
    script(&tree.sys.join("usr/local/bin/npu-smi"), "echo starting\nsleep 60");
    let started = Instant::now();
    let (code, json) = tree.checklist(&[("AIV_DOCTOR_COMMAND_TIMEOUT_MS", "500")]);
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(10), "the doctor took {elapsed:?}");
    let entry = item(&json, "npu-smi");
    assert_eq!((code, entry["status"].as_str()), (2, Some("missing")), "{json:#}");
    assert!(
        entry["found"]
            .as_str()
            .is_some_and(|text| text.contains("did not finish within 500 ms and was killed (starting)")),
        "{json:#}"
    );
}

#[test]
fn no_toolkit_version_file_is_a_missing_cann_toolkit() {
    let tree = Tree::new("toolkit");
    std::fs::remove_file(tree.toolkit.join("aarch64-linux/ascend_toolkit_install.info")).expect("remove");
    assert_item(&tree, "CANN toolkit", "missing", Some("without a version file"));
}

#[test]
fn no_compiler_is_a_missing_compiler() {
    let tree = Tree::new("compiler");
    std::fs::remove_file(tree.toolkit.join("compiler/ccec_compiler/bin/bisheng")).expect("remove");
    assert_item(&tree, "AscendC compiler", "missing", Some("compiler/ccec_compiler/bin/bisheng"));
}

#[test]
fn missing_include_directories_are_missing_headers() {
    // The build's rule: the include directories of its list that exist are passed; none at all, or no
    // kernel_operator.h in any of them, stops it.
    let tree = Tree::new("headers");
    std::fs::remove_file(tree.toolkit.join("compiler/tikcpp/tikcfw/kernel_operator.h")).expect("remove");
    assert_item(&tree, "AscendC headers", "missing", Some("kernel_operator.h (AscendC) is in none"));
    std::fs::remove_dir_all(tree.toolkit.join("compiler/tikcpp")).expect("remove");
    assert_item(&tree, "AscendC headers", "missing", Some("has none of the AscendC include directories"));
}

#[test]
fn the_compiler_on_path_gives_the_toolkit_root() {
    let mut tree = Tree::new("on-path");
    tree.unset("ASCEND_HOME_PATH");
    tree.path.push(tree.toolkit.join("compiler/ccec_compiler/bin"));
    let (_, json) = tree.checklist(&[]);
    for name in ["CANN toolkit", "AscendC compiler", "AscendC headers"] {
        assert_eq!(item(&json, name)["status"], "ok", "{name}: {json:#}");
    }
    assert!(item(&json, "CANN toolkit")["looked_for"]
        .as_str()
        .is_some_and(|text| text.contains("the bisheng on PATH")));
}

#[test]
fn no_acl_or_shmem_library_is_missing_and_no_hixl_only_warns() {
    let mut tree = Tree::new("libraries");
    let absent = tree.sys.join("absent");
    tree.set("AIV_HIXL_LIB", absent.join("libcann_hixl.so"));
    assert_item(&tree, "libcann_hixl.so", "warn", Some("AIV_HIXL_LIB"));
    tree.set("AIV_SHMEM_LIB", absent.join("libshmem.so"));
    assert_item(&tree, "libshmem.so", "missing", Some("absent/libshmem.so"));
    tree.set("AIV_ASCENDCL_LIB", absent.join("libascendcl.so"));
    let json = assert_item(&tree, "libascendcl.so", "missing", Some("absent/libascendcl.so"));
    assert_eq!(item(&json, "device count")["status"], "missing", "no runtime, no count: {json:#}");
}

#[test]
fn no_hccn_conf_only_warns() {
    let tree = Tree::new("hccn");
    write(&tree.sys.join("etc/hccn.conf"), "address_0=192.168.100.10\n");
    assert_item(&tree, "RoCE link config", "warn", Some("no address_<N>/netmask_<N> pair"));
    std::fs::remove_file(tree.sys.join("etc/hccn.conf")).expect("remove");
    assert_item(&tree, "RoCE link config", "warn", Some("etc/hccn.conf"));
}

#[test]
fn a_low_memlock_limit_is_missing() {
    let mut tree = Tree::new("memlock");
    tree.memlock = Some(64 << 10);
    assert_item(&tree, "memlock limit", "missing", Some("soft 64 KiB"));
}

#[test]
fn a_bad_command_timeout_is_refused_with_its_range() {
    let tree = Tree::new("timeout");
    let (code, text) = tree.doctor(&["--npu"], &[("AIV_DOCTOR_COMMAND_TIMEOUT_MS", "99")]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("AIV_DOCTOR_COMMAND_TIMEOUT_MS") && text.contains("100 to 120000"), "{text}");
}

#[test]
fn this_machine_without_an_npu_is_not_ready() {
    if Path::new("/dev/davinci_manager").exists() {
        skip::skip("this machine has an NPU driver; the test is for machines without one");
        return;
    }
    let output = Command::new(env!("CARGO_BIN_EXE_aiv"))
        .args(["doctor", "--npu"])
        .env_remove("AIV_DOCTOR_SYSROOT")
        .output()
        .expect("aiv runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{text}");
    for name in ["NPU driver", "device nodes", "npu-smi"] {
        assert!(
            text.lines().any(|line| line.trim_start().starts_with("missing") && line.contains(name)),
            "{name}:\n{text}"
        );
    }
    assert!(!text.contains("proves only the doctor's logic"), "no fake tree here:\n{text}");
}

#[test]
fn help_documents_the_flags_and_the_fake_tree_knob() {
    let output = Command::new(env!("CARGO_BIN_EXE_aiv")).args(["doctor", "--help"]).output().expect("aiv runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    for word in [
        "--npu",
        "--json",
        "exit 0",
        "AIV_DOCTOR_SYSROOT",
        "proves only the doctor's logic",
        "AIV_DOCTOR_COMMAND_TIMEOUT_MS",
    ] {
        assert!(text.contains(word), "--help lacks {word}:\n{text}");
    }
}
