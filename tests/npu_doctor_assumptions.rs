//! Hardware tier: the assumptions behind `aiv doctor`'s readiness checklist (`host/doctor/`, docs/hardware.md
//! section 8), one test each, in the style of `tests/npu_assumptions.rs`: observe on the machine (through the
//! doctor's own functions where it has them), judge with a pure `judge_*` function, print `CONFIRMED:`, `REFUTED:`
//! or `INCONCLUSIVE:` with the observed values. None of these has run on an Ascend machine: each is unverified on
//! hardware until a run of `bash tests/npu/run.sh` on one says otherwise. `#[ignore]`d, selected by
//! `AIV_NPU_TESTS=1`: `AIV_NPU_TESTS=1 cargo test --release --features cann --test npu_doctor_assumptions --
//! --ignored --nocapture --test-threads=1`.
//!
//! Everywhere, in the suite: the same observations on fake trees (`Inputs::sysroot`, as `tests/doctor.rs` uses) and
//! the twin runtime, and each judge fed an observation that breaks its assumption. A fake tree proves the test's
//! logic only, never what a real machine holds.
#[path = "common/peer_engine.rs"]
mod peer_engine;
#[path = "common/skip.rs"]
mod skip;
#[path = "common/verdict.rs"]
mod verdict;

use std::path::{Path, PathBuf};

use aiv_transport::config::DeviceBackendKind;
use aiv_transport::doctor::inputs::{Inputs, DEFAULT_COMMAND_TIMEOUT};
use aiv_transport::doctor::item::Status;
use aiv_transport::doctor::{system, toolkit};
use ascendcl_sys::AclApi;
use verdict::{device_id, report, selected, Outcome};

/// The doctor's inputs with the fixed system paths read below `sysroot` and the toolkit root `home`.
fn fake_inputs(sysroot: Option<&Path>, home: Option<&Path>) -> Inputs {
    Inputs {
        sysroot: sysroot.map(Path::to_path_buf),
        cann_home: None,
        ascend_home: home.map(Path::to_path_buf),
        toolkit_home: None,
        path: Vec::new(),
        command_timeout: DEFAULT_COMMAND_TIMEOUT,
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aiv-doctor-assumptions-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
    std::fs::write(path, text).expect("write");
}

// ---- device nodes: a process needs davinci<N>, davinci_manager, devmm_svm and hisi_hdc ----------------------------

#[derive(Debug)]
struct NodesObservation {
    /// `system::davinci_nodes`: the numbers of the `davinci<N>` nodes.
    davinci: Vec<u32>,
    /// Each of `system::CONTROL_NODES` and whether it exists.
    control: Vec<(&'static str, bool)>,
    /// ACL's answer: `aclInit`, `aclrtGetDeviceCount`, `aclrtSetDevice` of the device (the count), or the failure.
    opened: Result<u32, String>,
    /// The doctor's `device nodes` item, as it would print it.
    item: String,
}

fn judge_nodes(o: &NodesObservation) -> Outcome {
    let mut absent: Vec<&str> = o.control.iter().filter(|(_, exists)| !exists).map(|(node, _)| *node).collect();
    if o.davinci.is_empty() {
        absent.insert(0, "davinci<N>");
    }
    let seen = format!("davinci {:?}, {:?}, device opened: {:?} (doctor: {})", o.davinci, o.control, o.opened, o.item);
    match (absent.is_empty(), &o.opened) {
        (true, Ok(_)) => Outcome::Confirmed(seen),
        (true, Err(_)) => Outcome::Inconclusive(format!("{seen}: all four kinds exist, the device did not open")),
        (false, Ok(_)) => Outcome::Refuted(format!("{seen}: {} absent, yet the device opened", absent.join(", "))),
        (false, Err(_)) => Outcome::Inconclusive(format!(
            "{seen}: {} absent and the device did not open (the failure may have another cause)",
            absent.join(", ")
        )),
    }
}

fn open_device(acl: &AclApi, device: u32) -> Result<u32, String> {
    use ascendcl_sys::result::{device as acl_device, runtime};
    match runtime::init(acl, None) {
        Ok(()) => {}
        Err(error) if error.code() == Some(ascendcl_sys::AclError(ascendcl_sys::sys::ACL_ERROR_REPEAT_INITIALIZE)) => {}
        Err(error) => return Err(format!("aclInit: {error}")),
    }
    let count = acl_device::count(acl).map_err(|error| format!("aclrtGetDeviceCount: {error}"))?;
    acl_device::set(acl, device as i32).map_err(|error| format!("aclrtSetDevice({device}): {error}"))?;
    Ok(count)
}

fn observe_nodes(inputs: &Inputs, acl: &AclApi, device: u32) -> NodesObservation {
    let dev = inputs.system("/dev");
    let item = system::device_nodes(inputs);
    NodesObservation {
        davinci: system::davinci_nodes(inputs),
        control: system::CONTROL_NODES.iter().map(|node| (*node, dev.join(node).exists())).collect(),
        opened: open_device(acl, device),
        item: format!("{} {}", item.status.word(), item.found.unwrap_or_default()),
    }
}

#[test]
#[ignore = "hardware: needs an Ascend NPU, CANN and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn device_node_kinds_are_the_four_a_process_needs() {
    if !selected() {
        return;
    }
    let inputs = Inputs::from_process_env().expect("doctor inputs");
    let observation = match ascendcl_sys::api() {
        Ok(acl) => observe_nodes(&inputs, acl, device_id()),
        Err(error) => NodesObservation {
            davinci: system::davinci_nodes(&inputs),
            control: Vec::new(),
            opened: Err(format!("libascendcl.so: {error}")),
            item: String::new(),
        },
    };
    report("a process needs davinci<N>, davinci_manager, devmm_svm and hisi_hdc", judge_nodes(&observation));
}

// ---- toolkit version files: ascend_toolkit_install.info's version=, version.cfg's format ---------------------------

/// One version file as the doctor reads it.
#[derive(Debug)]
enum FileVersion {
    Absent,
    /// The file, what `toolkit::cann_version` makes of it alone, and its first lines.
    Read {
        path: PathBuf,
        parsed: Option<String>,
        head: String,
    },
}

impl std::fmt::Display for FileVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileVersion::Absent => write!(f, "absent"),
            FileVersion::Read { path, parsed, head } => {
                write!(f, "{} read as {parsed:?} (first lines: {head:?})", path.display())
            }
        }
    }
}

#[derive(Debug)]
struct ToolkitObservation {
    install_info: FileVersion,
    version_cfg: FileVersion,
    /// `aclsysGetCANNVersion` for the toolkit package.
    runtime_toolkit: Result<String, String>,
}

/// Whether two version strings name the same version: equal without case, or one the other plus a `.` or `-`
/// suffix (`8.1.RC1` and `8.1.RC1.alpha001`).
fn agree(a: &str, b: &str) -> bool {
    let (a, b) = (a.to_ascii_lowercase(), b.to_ascii_lowercase());
    let extends = |long: &str, short: &str| {
        long.strip_prefix(short).is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
    };
    a == b || extends(&a, &b) || extends(&b, &a)
}

fn judge_toolkit(o: &ToolkitObservation) -> Outcome {
    let seen = format!(
        "aclsysGetCANNVersion(toolkit) {:?}; ascend_toolkit_install.info {}; version.cfg {}",
        o.runtime_toolkit, o.install_info, o.version_cfg
    );
    let Ok(runtime) = &o.runtime_toolkit else {
        return Outcome::Inconclusive(format!("{seen}: the runtime gave no toolkit version to compare with"));
    };
    let mut wrong = Vec::new();
    for (name, file) in [("ascend_toolkit_install.info", &o.install_info), ("version.cfg", &o.version_cfg)] {
        if let FileVersion::Read { parsed, .. } = file {
            match parsed {
                Some(parsed) if agree(parsed, runtime) => {}
                Some(parsed) => {
                    wrong.push(format!("the doctor reads {parsed:?} from {name}, the runtime says {runtime:?}"))
                }
                None => wrong.push(format!("the doctor finds no version in {name}")),
            }
        }
    }
    match (&o.install_info, &o.version_cfg) {
        _ if !wrong.is_empty() => Outcome::Refuted(format!("{}; {seen}", wrong.join("; "))),
        (FileVersion::Absent, FileVersion::Absent) => {
            Outcome::Refuted(format!("no version file the doctor reads; {seen}"))
        }
        (_, FileVersion::Absent) => {
            Outcome::Inconclusive(format!("{seen}: no version.cfg, so its place and format are not judged"))
        }
        _ => Outcome::Confirmed(seen),
    }
}

/// What the doctor's `CANN toolkit` item makes of `file` alone: a copy at `relative` below a fresh root.
fn doctor_reads(file: &Path, relative: &str, scratch: &Path) -> FileVersion {
    let Ok(text) = std::fs::read_to_string(file) else { return FileVersion::Absent };
    let root = scratch.join(relative.replace('/', "_"));
    let copy = root.join(relative);
    write(&copy, &text);
    let item = toolkit::cann_version(&fake_inputs(None, Some(&root)), None);
    let suffix = format!(" ({})", copy.display());
    let parsed = (item.status == Status::Ok)
        .then(|| item.found.as_deref().and_then(|found| found.strip_suffix(&suffix)).map(str::to_owned))
        .flatten();
    let head = text.lines().take(4).collect::<Vec<_>>().join(" | ");
    FileVersion::Read { path: file.to_path_buf(), parsed, head }
}

fn observe_toolkit(root: &Path, runtime_toolkit: Result<String, String>, scratch: &Path) -> ToolkitObservation {
    let install_info = ["aarch64-linux", "x86_64-linux", "arm64-linux"]
        .iter()
        .map(|arch| format!("{arch}/ascend_toolkit_install.info"))
        .find(|relative| root.join(relative).is_file())
        .map_or(FileVersion::Absent, |relative| doctor_reads(&root.join(&relative), &relative, scratch));
    let version_cfg = doctor_reads(&root.join("version.cfg"), "version.cfg", scratch);
    ToolkitObservation { install_info, version_cfg, runtime_toolkit }
}

#[test]
#[ignore = "hardware: needs the CANN toolkit of an Ascend machine and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn toolkit_version_files_agree_with_the_runtime() {
    if !selected() {
        return;
    }
    let root = PathBuf::from(std::env::var("ASCEND_HOME_PATH").unwrap_or_default());
    let runtime_toolkit = match aiv_transport::doctor::diagnose().runtime {
        Some(runtime) => runtime
            .packages
            .iter()
            .find(|(name, _)| *name == "toolkit")
            .map_or(Err("not asked".into()), |(_, version)| version.clone()),
        None => Err("libascendcl.so did not load".into()),
    };
    let scratch = temp_dir("toolkit");
    let observation = observe_toolkit(&root, runtime_toolkit, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    report(
        "toolkit version files as the doctor reads them name the runtime's toolkit version",
        judge_toolkit(&observation),
    );
}

// ---- hccn.conf: every address_<N> comes with a netmask_<N> -------------------------------------------------------

#[derive(Debug)]
struct HccnObservation {
    /// The file's text, or why it could not be read.
    text: Result<String, String>,
    /// The doctor's `RoCE link config` item, as it would print it.
    item: String,
}

/// The device numbers of the `<field>_<N>=` lines of `text`.
fn numbered(text: &str, field: &str) -> Vec<u32> {
    let mut out: Vec<u32> = text
        .lines()
        .filter_map(|line| line.split_once('=')?.0.trim().strip_prefix(field)?.strip_prefix('_')?.parse().ok())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn judge_hccn(o: &HccnObservation) -> Outcome {
    let text = match &o.text {
        Ok(text) => text,
        Err(error) => return Outcome::Inconclusive(format!("no file: {error} (doctor: {})", o.item)),
    };
    let (addresses, netmasks) = (numbered(text, "address"), numbered(text, "netmask"));
    let seen = format!("address_<N> for {addresses:?}, netmask_<N> for {netmasks:?} (doctor: {})", o.item);
    let lacking: Vec<u32> = addresses.iter().copied().filter(|n| !netmasks.contains(n)).collect();
    if addresses.is_empty() {
        Outcome::Inconclusive(format!("{seen}: no address set"))
    } else if lacking.is_empty() {
        Outcome::Confirmed(seen)
    } else {
        Outcome::Refuted(format!("{seen}: devices {lacking:?} have an address without a netmask"))
    }
}

fn observe_hccn(inputs: &Inputs) -> HccnObservation {
    let file = inputs.system("/etc/hccn.conf");
    let item = system::hccn(inputs);
    HccnObservation {
        text: std::fs::read_to_string(&file).map_err(|error| format!("{}: {error}", file.display())),
        item: format!("{} {}", item.status.word(), item.found.unwrap_or_default()),
    }
}

#[test]
#[ignore = "hardware: needs an Ascend machine with hccn_tool-configured RoCE and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn hccn_conf_has_a_netmask_for_every_address() {
    if !selected() {
        return;
    }
    let inputs = Inputs::from_process_env().expect("doctor inputs");
    report("hccn_tool records a netmask_<N> with every address_<N>", judge_hccn(&observe_hccn(&inputs)));
}

// ---- memlock: is aclrtHostRegister charged to RLIMIT_MEMLOCK? --------------------------------------------------

/// The low limit of the first child: well under what the aiv transport registers (`system::registered_ring_bytes`
/// at 48 blocks; at the test engine's 2 blocks still over 100 KiB).
const LOW_MEMLOCK: u64 = 64 << 10;
const MEMLOCK_ROLE: &str = "AIV_NPU_MEMLOCK_CHILD";

/// What one child process saw.
#[derive(Debug, PartialEq)]
struct MemlockChild {
    /// The soft and hard limit it ran under (bytes; `None`: unlimited).
    limit: Option<u64>,
    /// Whether the limit binds it: an `mlock` of four times the low limit failed (with `CAP_IPC_LOCK` dropped).
    limit_in_force: bool,
    /// Opening the aiv transport (its `aclrtHostRegister` of rings, DCQs, control blocks and kernel arguments).
    opened: Result<(), String>,
}

#[derive(Debug)]
struct MemlockObservation {
    low: MemlockChild,
    raised: MemlockChild,
}

fn judge_memlock(o: &MemlockObservation) -> Outcome {
    let seen = format!("under {:?}: {:?}; raised: {:?}", o.low.limit, o.low, o.raised);
    match (&o.low.opened, &o.raised.opened) {
        _ if !o.low.limit_in_force => {
            Outcome::Inconclusive(format!("{seen}: the low limit did not bind (an mlock past it succeeded)"))
        }
        (Ok(()), _) => Outcome::Refuted(format!(
            "{seen}: registered under the low limit, so not charged to RLIMIT_MEMLOCK: the doctor's memlock item \
             should be a warn"
        )),
        (Err(_), Ok(())) => {
            Outcome::Confirmed(format!("{seen}: charged; the doctor's memlock item is right to be required"))
        }
        (Err(_), Err(_)) => Outcome::Inconclusive(format!("{seen}: the device did not open with the limit raised")),
    }
}

/// Clears `CAP_IPC_LOCK` (bit 14) from this process's effective and permitted sets, so RLIMIT_MEMLOCK binds root too.
fn drop_ipc_lock() -> Result<(), String> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes the two data words of version 3 into `data`.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return Err(format!("capget: {}", std::io::Error::last_os_error()));
    }
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    data[0].permitted &= !(1 << CAP_IPC_LOCK);
    // SAFETY: as above; capset reads them.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } != 0 {
        return Err(format!("capset: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The child half: sets RLIMIT_MEMLOCK (soft and hard) to `AIV_NPU_MEMLOCK_CHILD` bytes (`raised`: the soft limit
/// to the hard one), drops `CAP_IPC_LOCK`, probes the limit with `mlock`, then opens the aiv transport; prints one
/// `MEMLOCK_CHILD <json>` line.
fn memlock_child(role: &str, backend: DeviceBackendKind) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a live out-pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    if role != "raised" {
        let bytes = role.parse::<u64>().expect("limit in bytes");
        limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
    } else {
        limit.rlim_cur = limit.rlim_max;
    }
    // SAFETY: a live in-pointer.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) }, 0, "setrlimit");
    let dropped = drop_ipc_lock();
    let probe = vec![1u8; 4 * LOW_MEMLOCK as usize];
    // SAFETY: `probe` is a live allocation of that length; unlocked below.
    let locked = unsafe { libc::mlock(probe.as_ptr().cast(), probe.len()) } == 0;
    if locked {
        // SAFETY: as above.
        unsafe { libc::munlock(probe.as_ptr().cast(), probe.len()) };
    }
    let engine = peer_engine::engine(backend, device_id());
    let opened = engine.device().map(drop).map_err(|error| format!("{error} (CAP_IPC_LOCK drop: {dropped:?})"));
    drop(engine);
    let shown = |value: libc::rlim_t| (value != libc::RLIM_INFINITY).then_some(value);
    let line = serde_json::json!({
        "limit": shown(limit.rlim_cur),
        "limit_in_force": !locked,
        "opened": opened.clone().err(),
    });
    println!("MEMLOCK_CHILD {line}");
}

/// Runs `memlock_child` in a copy of this test binary under `limit` ("raised" or bytes).
fn run_memlock_child(limit: &str, backend: DeviceBackendKind) -> MemlockChild {
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["memlock_child_process", "--exact", "--ignored", "--nocapture"])
        .env(MEMLOCK_ROLE, limit)
        .env("AIV_NPU_TEST_BACKEND", if backend == DeviceBackendKind::Cann { "cann" } else { "twin" })
        .env("AIV_SHMEM_PE", "0")
        .env("AIV_SHMEM_N_PES", "1")
        .output()
        .expect("start the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find_map(|line| line.strip_prefix("MEMLOCK_CHILD ")) else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return MemlockChild {
            limit: None,
            limit_in_force: true,
            opened: Err(format!("the child printed no result ({}): {stdout} {stderr}", output.status)),
        };
    };
    let value: serde_json::Value = serde_json::from_str(line).expect("the child's JSON");
    MemlockChild {
        limit: value["limit"].as_u64(),
        limit_in_force: value["limit_in_force"].as_bool().unwrap_or(false),
        opened: value["opened"].as_str().map_or(Ok(()), |error| Err(error.to_owned())),
    }
}

fn observe_memlock(backend: DeviceBackendKind) -> MemlockObservation {
    MemlockObservation {
        low: run_memlock_child(&LOW_MEMLOCK.to_string(), backend),
        raised: run_memlock_child("raised", backend),
    }
}

/// The child half of the memlock tests: a no-op unless started by them with `AIV_NPU_MEMLOCK_CHILD`.
#[test]
#[ignore = "hardware: run by the memlock tests as their child process"]
fn memlock_child_process() {
    match std::env::var(MEMLOCK_ROLE) {
        Ok(role) => memlock_child(
            &role,
            match std::env::var("AIV_NPU_TEST_BACKEND").as_deref() {
                Ok("cann") => DeviceBackendKind::Cann,
                _ => DeviceBackendKind::Twin,
            },
        ),
        Err(_) => println!("nothing to do: the child half of the memlock tests, run by them"),
    }
}

#[test]
#[ignore = "hardware: needs an Ascend NPU, CANN and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn host_register_is_charged_to_rlimit_memlock() {
    if !selected() {
        return;
    }
    report("aclrtHostRegister is charged to RLIMIT_MEMLOCK", judge_memlock(&observe_memlock(DeviceBackendKind::Cann)));
}

// ---- the same observations on fake trees and the twin runtime, in the suite --------------------------------------

#[test]
fn device_nodes_on_a_fake_tree_and_the_twin_runtime() {
    let root = temp_dir("nodes");
    for node in ["davinci0", "davinci1", "davinci_manager", "devmm_svm", "hisi_hdc"] {
        write(&root.join("dev").join(node), "");
    }
    let inputs = fake_inputs(Some(&root), None);
    report(
        "device node kinds (fake tree, twin runtime)",
        judge_nodes(&observe_nodes(&inputs, cann_twin::acl_api(), 0)),
    );
    // Without hisi_hdc the twin runtime still opens the device: what a machine that does not need it would show.
    std::fs::remove_file(root.join("dev/hisi_hdc")).expect("remove");
    let outcome = judge_nodes(&observe_nodes(&inputs, cann_twin::acl_api(), 0));
    let _ = std::fs::remove_dir_all(&root);
    assert!(matches!(&outcome, Outcome::Refuted(what) if what.contains("hisi_hdc absent")), "{outcome:?}");
}

#[test]
fn toolkit_version_files_on_a_fake_tree() {
    let root = temp_dir("toolkit-tree");
    write(
        &root.join("x86_64-linux/ascend_toolkit_install.info"),
        "package_name=Ascend-cann-toolkit\nversion=8.2.RC1\n",
    );
    write(&root.join("version.cfg"), "# version\ntoolkit_upgrade_version=[8.2.RC1]\n");
    let scratch = temp_dir("toolkit-scratch");
    let observation = observe_toolkit(&root, Ok("8.2.RC1".into()), &scratch);
    report("toolkit version files (fake tree)", judge_toolkit(&observation));
    // A version.cfg the doctor reads as something else than the runtime's version.
    write(&root.join("version.cfg"), "toolkit_installed_version=[8.1.RC1:8.2.RC1]\n");
    let outcome = judge_toolkit(&observe_toolkit(&root, Ok("8.2.RC1".into()), &scratch));
    let _ = (std::fs::remove_dir_all(&root), std::fs::remove_dir_all(&scratch));
    assert!(matches!(&outcome, Outcome::Refuted(what) if what.contains("from version.cfg")), "{outcome:?}");
}

#[test]
fn hccn_conf_on_a_fake_tree() {
    let root = temp_dir("hccn");
    write(
        &root.join("etc/hccn.conf"),
        "address_0=192.0.2.10\nnetmask_0=255.255.255.0\naddress_1=192.0.2.11\nnetmask_1=255.255.255.0\n",
    );
    let observation = observe_hccn(&fake_inputs(Some(&root), None));
    let _ = std::fs::remove_dir_all(&root);
    assert!(observation.item.starts_with("ok 0: 192.0.2.10/255.255.255.0"), "{observation:?}");
    report("hccn.conf pairs (fake tree)", judge_hccn(&observation));
}

/// The twin runtime registers Host memory without pinning it, so its observation comes out REFUTED; what this
/// proves is that the child's low limit binds (an mlock past it fails, `CAP_IPC_LOCK` dropped) and that the aiv
/// transport opens in a child with its limit changed.
#[test]
fn memlock_children_run_on_the_twin_runtime_which_does_not_pin() {
    let observation = observe_memlock(DeviceBackendKind::Twin);
    assert!(observation.low.limit_in_force, "the low limit does not bind: {observation:?}");
    assert_eq!(observation.low.limit, Some(LOW_MEMLOCK), "{observation:?}");
    assert_eq!(observation.raised.opened, Ok(()), "{observation:?}");
    let outcome = judge_memlock(&observation);
    println!("{}", verdict::line("aclrtHostRegister charged to RLIMIT_MEMLOCK (twin runtime)", &outcome));
    assert!(matches!(outcome, Outcome::Refuted(_)), "{outcome:?}");
}

/// Every judge comes out REFUTED on an observation that breaks its assumption, and CONFIRMED on one that keeps it.
#[test]
fn each_judge_can_come_out_refuted() {
    let refuted = |outcome: Outcome| assert!(matches!(outcome, Outcome::Refuted(_)), "{outcome:?}");
    let confirmed = |outcome: Outcome| assert!(matches!(outcome, Outcome::Confirmed(_)), "{outcome:?}");
    let nodes = |present: bool, opened: Result<u32, String>| NodesObservation {
        davinci: vec![0, 1],
        control: vec![("davinci_manager", true), ("devmm_svm", present), ("hisi_hdc", true)],
        opened,
        item: String::new(),
    };
    refuted(judge_nodes(&nodes(false, Ok(8))));
    confirmed(judge_nodes(&nodes(true, Ok(8))));
    assert!(matches!(judge_nodes(&nodes(false, Err("507033".into()))), Outcome::Inconclusive(_)));
    let file = |parsed: &str| FileVersion::Read { path: "f".into(), parsed: Some(parsed.into()), head: String::new() };
    let toolkit =
        |info, cfg| ToolkitObservation { install_info: info, version_cfg: cfg, runtime_toolkit: Ok("8.2.RC1".into()) };
    refuted(judge_toolkit(&toolkit(file("8.2.RC1"), file("8.1.RC1:8.2.RC1"))));
    refuted(judge_toolkit(&toolkit(file("7.0.0"), FileVersion::Absent)));
    refuted(judge_toolkit(&toolkit(FileVersion::Absent, FileVersion::Absent)));
    confirmed(judge_toolkit(&toolkit(file("8.2.RC1"), file("8.2.rc1.alpha001"))));
    assert!(matches!(judge_toolkit(&toolkit(file("8.2.RC1"), FileVersion::Absent)), Outcome::Inconclusive(_)));
    let hccn = |text: &str| HccnObservation { text: Ok(text.into()), item: String::new() };
    refuted(judge_hccn(&hccn("address_0=192.0.2.1\nnetmask_0=255.0.0.0\naddress_3=192.0.2.4\n")));
    confirmed(judge_hccn(&hccn("address_0=192.0.2.1\nnetmask_0=255.0.0.0\n")));
    assert!(matches!(judge_hccn(&hccn("")), Outcome::Inconclusive(_)));
    let child =
        |limit_in_force, opened: Result<(), String>| MemlockChild { limit: Some(LOW_MEMLOCK), limit_in_force, opened };
    let memlock = |low, raised| MemlockObservation { low, raised };
    refuted(judge_memlock(&memlock(child(true, Ok(())), child(false, Ok(())))));
    confirmed(judge_memlock(&memlock(child(true, Err("107003".into())), child(false, Ok(())))));
    assert!(matches!(judge_memlock(&memlock(child(false, Ok(())), child(false, Ok(())))), Outcome::Inconclusive(_)));
}
