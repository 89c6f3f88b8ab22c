//! The command lines that compile the transfer kernel into the device object `aclrtBinaryLoadFromData` loads, one
//! recipe per compiler generation (docs/hardware.md section 3 lists every flag with its public source).
//!
//! - `bisheng`, mode chosen as `hicann/shmem` `CMakeLists.txt` chooses it: run `bisheng -v`, take the first
//!   `YYYY-MM-DD` of its standard output and error together; a date on or after 2026-03-27 selects `-xasc`, an older
//!   date, no date or no output (it could not run) selects `-xcce`. Either mode compiles for the AI core only and
//!   links the result with `ld.lld -m aicorelinux -Ttext=0 ... -static`, as `mirror-cann/asc-devkit`'s
//!   `ascendc_fatbin_library` (the target that makes a kernel binary for the load-and-execute interfaces) does.
//! - `ccec`: `hicann/hccl` `examples/05_custom_ops_allgather/op_kernel/CMakeLists.txt`'s compile and link lines.
//!
//! Every branch also turns off the compiler's own data-cache maintenance for scalar accesses
//! (`-cce-aicore-dcci-insert-for-scalar=false`): the kernel cleans and invalidates its lines itself.
//!
//! The plan is computed without running anything ([`plan`]), so its command lines can be checked as data.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::toolkit::{CompilerKind, Toolkit};

/// `hicann/shmem` `CMakeLists.txt` `TARGET_TIMESTAMP`: `bisheng` builds from this date on take `-xasc`.
pub const XASC_FROM: u32 = 20260327;

/// The recipe a build follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Branch {
    /// New `bisheng` driver, `-xasc` device-only compilation, then `ld.lld`.
    BishengAsc,
    /// `bisheng` before 2026-03-27 (or of unknown date), `-xcce` device-only compilation, then `ld.lld`.
    BishengCce,
    /// `ccec` + `ld.lld` as HCCL's custom-op example.
    Ccec,
}

impl Branch {
    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Branch::BishengAsc => "bisheng -xasc",
            Branch::BishengCce => "bisheng -xcce",
            Branch::Ccec => "ccec",
        }
    }
}

/// The recipes a compiler driver can run: `bisheng` either mode (the date of `bisheng -v` picks one, [`choose`]),
/// `ccec` its own.
pub fn branches(kind: CompilerKind) -> &'static [Branch] {
    match kind {
        CompilerKind::Bisheng => &[Branch::BishengAsc, Branch::BishengCce],
        CompilerKind::Ccec => &[Branch::Ccec],
    }
}

/// The choice [`plan`] takes when the caller names the branch itself instead of asking [`choose`] (a test running
/// every recipe a toolkit can run). The branch must be one of [`branches`] of the toolkit's compiler.
pub fn forced(branch: Branch) -> (Branch, String) {
    (branch, format!("{} named by the caller, not chosen by the build's rule", branch.name()))
}

/// What `bisheng -v` gave.
#[derive(Clone, Debug)]
pub enum VersionProbe {
    /// Its standard output and standard error, joined by a space as SHMEM joins them (whatever its exit status).
    Output(String),
    /// It could not be started.
    NotRun(String),
}

/// Runs `<compiler> -v` and keeps what it printed.
pub fn probe_version(compiler: &Path) -> VersionProbe {
    match Command::new(compiler).arg("-v").output() {
        Ok(output) => VersionProbe::Output(format!(
            "{} {}",
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(error) => VersionProbe::NotRun(format!("{} -v: {error}", compiler.display())),
    }
}

/// The first `YYYY-MM-DD` (four, two and two ASCII digits joined by `-`) in `text`, as `(text, YYYYMMDD)`: SHMEM's
/// `string(REGEX MATCH "([0-9][0-9][0-9][0-9])-([0-9][0-9])-([0-9][0-9])" ...)`, which checks no calendar.
pub fn first_date(text: &str) -> Option<(String, u32)> {
    let bytes = text.as_bytes();
    let shape = b"dddd-dd-dd";
    (0..bytes.len().saturating_sub(shape.len() - 1)).find_map(|start| {
        let window = &bytes[start..start + shape.len()];
        let matches = window.iter().zip(shape).all(|(byte, want)| match want {
            b'd' => byte.is_ascii_digit(),
            _ => byte == want,
        });
        if !matches {
            return None;
        }
        let date = std::str::from_utf8(window).ok()?.to_owned();
        let number = date.replace('-', "").parse().ok()?;
        Some((date, number))
    })
}

/// The branch for `toolkit` and why it was chosen (for the build's printed outcome).
pub fn choose(toolkit: &Toolkit, probe: Option<&VersionProbe>) -> (Branch, String) {
    if toolkit.kind == CompilerKind::Ccec {
        return (Branch::Ccec, "ccec found (no bisheng in the toolkit): HCCL's ccec + ld.lld recipe".to_owned());
    }
    let threshold = "2026-03-27";
    match probe {
        Some(VersionProbe::Output(text)) => match first_date(text) {
            Some((date, number)) if number >= XASC_FROM => {
                (Branch::BishengAsc, format!("bisheng -v date {date} ≥ {threshold}: -xasc"))
            }
            Some((date, _)) => (Branch::BishengCce, format!("bisheng -v date {date} < {threshold}: -xcce")),
            None if text.trim().is_empty() => (
                Branch::BishengCce,
                "bisheng -v printed nothing: -xcce (SHMEM's choice for an unknown date)".to_owned(),
            ),
            None => (
                Branch::BishengCce,
                "bisheng -v printed no YYYY-MM-DD date: -xcce (SHMEM's choice for an unknown date)".to_owned(),
            ),
        },
        Some(VersionProbe::NotRun(error)) => (
            Branch::BishengCce,
            format!("bisheng -v could not run ({error}): -xcce (SHMEM's choice for an unknown date)"),
        ),
        None => (Branch::BishengCce, "bisheng -v not run: -xcce (SHMEM's choice for an unknown date)".to_owned()),
    }
}

/// One command: the program and its arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments, in order.
    pub args: Vec<OsString>,
}

impl Step {
    /// A [`Command`] that runs this step.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        command
    }
}

/// What a build runs and produces.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The recipe.
    pub branch: Branch,
    /// Why that recipe (printed with the outcome).
    pub reason: String,
    /// Compile, then link.
    pub steps: Vec<Step>,
    /// The device object the link writes: what is embedded.
    pub object: PathBuf,
}

/// The intermediate (compiled, not linked) object's file name in the output directory.
pub const DEVICE_OBJECT: &str = "aiv_transfer_kernel.device.o";
/// The linked device object's file name in the output directory.
pub const KERNEL_OBJECT: &str = "aiv_transfer_kernel.o";

/// `-mllvm <option>` pairs.
fn mllvm(options: &[&str]) -> Vec<String> {
    options.iter().flat_map(|option| ["-mllvm".to_owned(), (*option).to_owned()]).collect()
}

/// The command lines of `branch` for the kernel source `kernels/npu/entry.cpp`, the toolkit include directories
/// `toolkit_includes` (from [`crate::toolkit::include_dirs`]) and the output directory `out_dir`.
pub fn plan(
    toolkit: &Toolkit,
    (branch, reason): (Branch, String),
    toolkit_includes: &[PathBuf],
    kernels: &Path,
    out_dir: &Path,
) -> Plan {
    let source = kernels.join("npu/entry.cpp").into_os_string();
    let device_object = out_dir.join(DEVICE_OBJECT).into_os_string();
    let object = out_dir.join(KERNEL_OBJECT);
    let mut includes: Vec<OsString> = Vec::new();
    for dir in toolkit_includes.iter().chain([&kernels.join("include"), &kernels.to_path_buf()]) {
        let mut flag = OsString::from("-I");
        flag.push(dir);
        includes.push(flag);
    }
    let strings = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
    let owned = |list: Vec<String>| list.into_iter().map(OsString::from).collect::<Vec<_>>();
    let mut args: Vec<OsString> = Vec::new();
    match branch {
        Branch::BishengAsc => {
            // asc-devkit's compile rule: <INCLUDES> -std=c++17 <FLAGS> -o <OBJECT> -c --asc-aicore-lang <SOURCE>.
            args.extend(includes);
            args.extend(strings(&["-std=c++17", "-O2"]));
            // SHMEM's -xasc options for A2/A3, unchanged.
            args.extend(strings(&[
                "-xasc",
                "-Xhost-start",
                "-ftrapv",
                "-Xhost-end",
                "--npu-arch=dav-2201",
                "--cce-auto-infer-kernel-type=false",
                "--cce-auto-set-ffts=false",
            ]));
            // ascendc_fatbin_library's device-only switch, and the kernel-side option through
            // ascendc_compile_options' wrapper (inferred: the wrapper carrying an -mllvm pair).
            args.push("--aicore-only".into());
            args.push("-Xaicore-start".into());
            args.extend(owned(mllvm(&["-cce-aicore-dcci-insert-for-scalar=false"])));
            args.push("-Xaicore-end".into());
            args.extend(["-o".into(), device_object.clone(), "-c".into(), "--asc-aicore-lang".into(), source]);
        }
        Branch::BishengCce => {
            args.extend(includes);
            args.extend(strings(&["-std=c++17", "-O2"]));
            // SHMEM's -xcce options, unchanged.
            args.extend(strings(&["-xcce", "-Xhost-start", "-ftrapv", "-Xhost-end"]));
            args.extend(owned(mllvm(&[
                "-cce-aicore-stack-size=0x8000",
                "-cce-aicore-function-stack-size=0x8000",
                "-cce-aicore-record-overflow=true",
                "-cce-aicore-addr-transform",
                "-cce-aicore-dcci-insert-for-scalar=false",
            ])));
            // The vector-core architecture (SHMEM's CCE_AICORE_ARCH_VEC) and the device-only switch of asc-devkit's
            // legacy c220_aiv_intf_pub.
            args.extend(strings(&["--cce-aicore-arch=dav-c220-vec", "--cce-aicore-only"]));
            args.extend(["-o".into(), device_object.clone(), "-c".into(), source]);
        }
        Branch::Ccec => {
            // HCCL's line, in its order, with dav-c220-vec (its value for A3), then this kernel's one addition.
            args.extend(strings(&["-c", "-x", "cce", "-O2"]));
            args.extend([source, "-o".into(), device_object.clone()]);
            args.extend(strings(&[
                "--cce-aicore-arch=dav-c220-vec",
                "-D__CCE_AICORE__=220",
                "-D__DAV_C220__",
                "--cce-aicore-only",
            ]));
            args.extend(owned(mllvm(&[
                "-cce-aicore-function-stack-size=0x8000",
                "-cce-aicore-stack-size=0x8000",
                "-cce-aicore-record-overflow=false",
                "-cce-aicore-addr-transform",
                "-cce-aicore-jump-expand=true",
            ])));
            args.extend(strings(&["-std=c++17", "-fstack-protector-all"]));
            args.extend(includes);
            args.extend(owned(mllvm(&["-cce-aicore-dcci-insert-for-scalar=false"])));
        }
    }
    let compile = Step { program: toolkit.compiler.clone(), args };
    let link = Step {
        program: toolkit.linker(),
        args: vec![
            "-m".into(),
            "aicorelinux".into(),
            "-Ttext=0".into(),
            device_object,
            "-static".into(),
            "-o".into(),
            object.clone().into_os_string(),
        ],
    };
    Plan { branch, reason, steps: vec![compile, link], object }
}

/// Runs the plan's steps in order after removing earlier outputs, and checks that the linked object was written.
pub fn run(plan: &Plan) -> Result<(), String> {
    let device_object = plan.object.with_file_name(DEVICE_OBJECT);
    for stale in [&device_object, &plan.object] {
        match std::fs::remove_file(stale) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(format!("cannot remove the earlier {}: {error}", stale.display())),
        }
    }
    for step in &plan.steps {
        let mut command = step.command();
        let output = command.output().map_err(|error| format!("could not run {command:?}: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "{command:?} failed with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
    }
    if !plan.object.is_file() {
        return Err(format!("the link step succeeded but wrote no {}", plan.object.display()));
    }
    Ok(())
}
