//! The machine's side of readiness: the NPU driver package, its device nodes, `npu-smi`, the RoCE link
//! configuration and the memlock limit. Every fixed path is read through [`Inputs::system`].
//!
//! What it reads (each fact, its public source and its grade are in docs/hardware.md section 8): the driver's install
//! root, `Driver_Install_Path_Param` of `/etc/ascend_install.info` (default `/usr/local/Ascend`), the driver below it
//! in `driver/` with its `version.info` (`Version=`); the character devices `davinci_manager`, `devmm_svm`,
//! `hisi_hdc` besides one `davinci<N>` per NPU; `npu-smi` in `/usr/local/bin` or `/usr/local/sbin`; `/etc/hccn.conf`
//! with an `address_<N>=` line per physical device, where HiXL reads a device's RoCE address and
//! `hccn_tool -i <N> -ip -s address <ip> netmask <mask>` writes it.

use std::path::PathBuf;

use crate::bounded::{Outcome, Output};

use super::inputs::{key_value, Inputs};
use super::item::Item;

/// The driver's default install root, when `/etc/ascend_install.info` names none.
const DEFAULT_INSTALL_ROOT: &str = "/usr/local/Ascend";
/// The device nodes every NPU process needs besides `davinci<N>`.
pub const CONTROL_NODES: [&str; 3] = ["davinci_manager", "devmm_svm", "hisi_hdc"];
/// Lines of `npu-smi info` kept.
const NPU_SMI_LINES: usize = 3;

/// The driver's root: `<Driver_Install_Path_Param>/driver`, and where that came from.
fn driver_root(inputs: &Inputs) -> (PathBuf, String) {
    let info = inputs.system("/etc/ascend_install.info");
    let param = std::fs::read_to_string(&info).ok().and_then(|text| key_value(&text, "Driver_Install_Path_Param"));
    match param {
        Some(root) => (
            inputs.system(&root).join("driver"),
            format!("its root from Driver_Install_Path_Param of {}", info.display()),
        ),
        None => (
            inputs.system(DEFAULT_INSTALL_ROOT).join("driver"),
            format!("the default root: {} names none", info.display()),
        ),
    }
}

/// `NPU driver`: the driver package's `version.info`.
pub fn driver(inputs: &Inputs) -> Item {
    let (root, origin) = driver_root(inputs);
    let file = root.join("version.info");
    let looked_for = format!("{} ({origin})", file.display());
    match std::fs::read_to_string(&file) {
        Ok(text) => match key_value(&text, "Version") {
            Some(version) => Item::ok("NPU driver", format!("{version} ({})", file.display()), looked_for),
            None => Item::missing(
                "NPU driver",
                Some(format!("{} has no Version= line", file.display())),
                looked_for,
                "reinstall the NPU driver (its .run package with --full)",
            ),
        },
        Err(error) => Item::missing(
            "NPU driver",
            None,
            format!("{looked_for}: {error}"),
            "install the NPU driver (its .run package with --full), then reboot",
        ),
    }
}

/// The NPU numbers of the `/dev/davinci<N>` nodes, sorted.
pub fn davinci_nodes(inputs: &Inputs) -> Vec<u32> {
    let mut found: Vec<u32> = std::fs::read_dir(inputs.system("/dev"))
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_prefix("davinci")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    found.sort_unstable();
    found
}

/// `device nodes`: `/dev/davinci<N>` (at least one) and the three control nodes.
pub fn device_nodes(inputs: &Inputs) -> Item {
    let dev = inputs.system("/dev");
    let numbers = davinci_nodes(inputs);
    let absent: Vec<&str> = CONTROL_NODES.iter().copied().filter(|node| !dev.join(node).exists()).collect();
    let looked_for = format!(
        "{}/davinci<N>, {}",
        dev.display(),
        CONTROL_NODES.map(|node| format!("{}/{node}", dev.display())).join(", ")
    );
    let npus = match numbers.as_slice() {
        [] => "no davinci<N>".to_string(),
        [one] => format!("davinci{one}"),
        [first, .., last] => format!("davinci{first}..davinci{last} ({} nodes)", numbers.len()),
    };
    if numbers.is_empty() || !absent.is_empty() {
        let mut missing: Vec<String> = absent.iter().map(|node| node.to_string()).collect();
        if numbers.is_empty() {
            missing.insert(0, "davinci<N>".into());
        }
        return Item::missing(
            "device nodes",
            Some(format!("{npus}; absent: {}", missing.join(", "))),
            looked_for,
            "load the driver (reboot after installing it); in a container pass --device=/dev/davinci<N> \
             --device=/dev/davinci_manager --device=/dev/devmm_svm --device=/dev/hisi_hdc",
        );
    }
    Item::ok("device nodes", format!("{npus}, {}", CONTROL_NODES.join(", ")), looked_for)
}

/// `npu-smi`: on `PATH`, else in the driver's install locations; `npu-smi info` must exit 0 within the bound.
pub fn npu_smi(inputs: &Inputs) -> Item {
    let usual = [inputs.system("/usr/local/bin/npu-smi"), inputs.system("/usr/local/sbin/npu-smi")];
    let looked_for = format!(
        "{}, {}",
        inputs.path_text("npu-smi"),
        usual.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(", ")
    );
    let found =
        inputs.on_path("npu-smi").or_else(|| usual.iter().find(|path| super::inputs::is_executable(path)).cloned());
    let Some(program) = found else {
        return Item::missing(
            "npu-smi",
            None,
            looked_for,
            "install the NPU driver package (it installs npu-smi in /usr/local/bin); in a container mount \
             /usr/local/bin/npu-smi",
        );
    };
    let bound = inputs.command_timeout;
    let shown = |output: &Output| {
        let lines = output.first_lines(NPU_SMI_LINES);
        if lines.is_empty() {
            "no output".to_string()
        } else {
            lines.join(" | ")
        }
    };
    match inputs.run(&program, &["info"]) {
        Outcome::Exited { status, output } if status.code() == Some(0) => {
            Item::ok("npu-smi", format!("{}: `npu-smi info`: {}", program.display(), shown(&output)), looked_for)
        }
        Outcome::Exited { status, output } => Item::missing(
            "npu-smi",
            Some(format!(
                "{}: `npu-smi info` exited with {}: {}",
                program.display(),
                status.code().map_or("a signal".to_string(), |code| code.to_string()),
                shown(&output)
            )),
            looked_for,
            "run `npu-smi info` as this user: check the driver is loaded and this user is in the driver's group \
             (HwHiAiUser by default)",
        ),
        Outcome::TimedOut { output } => Item::missing(
            "npu-smi",
            Some(format!(
                "{}: `npu-smi info` did not finish within {} ms and was killed ({})",
                program.display(),
                bound.as_millis(),
                shown(&output)
            )),
            looked_for,
            "check the driver and device health (dmesg); a hung npu-smi means the driver does not answer",
        ),
        Outcome::NotStarted(error) => Item::missing(
            "npu-smi",
            Some(format!("{}: could not start: {error}", program.display())),
            looked_for,
            "make npu-smi executable by this user",
        ),
    }
}

/// `RoCE link config`: `/etc/hccn.conf` with an `address_<N>` and `netmask_<N>` line per device. Optional: only the
/// RDMA route between hosts needs it.
pub fn hccn(inputs: &Inputs) -> Item {
    let file = inputs.system("/etc/hccn.conf");
    let looked_for = format!("{} (address_<N>= and netmask_<N>= per device)", file.display());
    let fix = "hccn_tool -i <N> -ip -s address <ip> netmask <mask> for each device (only the RDMA route between \
               hosts needs it)";
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(error) => return Item::warn("RoCE link config", None, format!("{looked_for}: {error}"), fix),
    };
    let mut devices: Vec<(u32, Option<String>, Option<String>)> = Vec::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else { continue };
        let (field, number) = match key.trim().split_once('_') {
            Some((field @ ("address" | "netmask"), number)) => (field, number),
            _ => continue,
        };
        let Ok(number) = number.parse::<u32>() else { continue };
        let index = match devices.iter().position(|(n, _, _)| *n == number) {
            Some(index) => index,
            None => {
                devices.push((number, None, None));
                devices.len() - 1
            }
        };
        let slot = if field == "address" { &mut devices[index].1 } else { &mut devices[index].2 };
        *slot = Some(value.trim().to_string());
    }
    devices.sort_by_key(|(number, _, _)| *number);
    let complete: Vec<String> = devices
        .iter()
        .filter_map(|(n, address, netmask)| Some(format!("{n}: {}/{}", address.as_ref()?, netmask.as_ref()?)))
        .collect();
    let partial: Vec<String> =
        devices.iter().filter(|(_, a, m)| a.is_none() || m.is_none()).map(|(n, _, _)| n.to_string()).collect();
    if complete.is_empty() {
        return Item::warn(
            "RoCE link config",
            Some(format!("{} has no address_<N>/netmask_<N> pair", file.display())),
            looked_for,
            fix,
        );
    }
    if !partial.is_empty() {
        return Item::warn(
            "RoCE link config",
            Some(format!("{}; devices {} lack an address or netmask", complete.join(", "), partial.join(", "))),
            looked_for,
            fix,
        );
    }
    Item::ok("RoCE link config", format!("{} ({})", complete.join(", "), file.display()), looked_for)
}

/// Host bytes the `aiv` transport registers for the device with `aclrtHostRegister` per engine at most AIV blocks
/// (48) and the default ring depth (1024): the kernel arguments and each block's request ring, DCQ and control
/// block, each its own page-rounded mapping (`host/transport/aiv/setup.rs`, `CannDevice::allocate_shared`).
pub fn registered_ring_bytes() -> u64 {
    use crate::kernel_abi::layout::{dcq_bytes, kernel_args_bytes, request_ring_bytes, ControlBlock};
    const BLOCKS: usize = 48;
    const DEPTH: u32 = 1024;
    // SAFETY: sysconf has no memory effects.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    let round = |bytes: usize| (bytes as u64).div_ceil(page) * page;
    round(kernel_args_bytes(BLOCKS))
        + BLOCKS as u64
            * (round(request_ring_bytes(DEPTH)) + round(dcq_bytes(DEPTH)) + round(std::mem::size_of::<ControlBlock>()))
}

/// `memlock limit`: the soft `RLIMIT_MEMLOCK` must be unlimited or at least [`registered_ring_bytes`].
pub fn memlock() -> Item {
    let minimum = registered_ring_bytes();
    let looked_for = format!(
        "soft RLIMIT_MEMLOCK unlimited or at least {} KiB: the Host rings, DCQs and control blocks the aiv \
         transport registers with aclrtHostRegister at 48 AIV blocks and ring depth 1024, more for deeper rings and \
         Host buffers registered for peers (whether the driver charges them to RLIMIT_MEMLOCK is unverified on \
         hardware)",
        minimum / 1024
    );
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a live out-pointer of the right type.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        let error = std::io::Error::last_os_error();
        return Item::missing(
            "memlock limit",
            Some(format!("getrlimit failed: {error}")),
            looked_for,
            "ulimit -l unlimited",
        );
    }
    let show = |value: libc::rlim_t| {
        if value == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            format!("{} KiB", value / 1024)
        }
    };
    let found = format!("soft {}, hard {} (needs {} KiB)", show(limit.rlim_cur), show(limit.rlim_max), minimum / 1024);
    if limit.rlim_cur == libc::RLIM_INFINITY || limit.rlim_cur >= minimum {
        Item::ok("memlock limit", found, looked_for)
    } else {
        Item::missing(
            "memlock limit",
            Some(found),
            looked_for,
            "ulimit -l unlimited (raise the hard limit with `* - memlock unlimited` in /etc/security/limits.conf, or \
             docker run --ulimit memlock=-1)",
        )
    }
}
