//! `ascendc-build`: the build-script helper that compiles this project's AscendC transfer kernel.
//!
//! Three targets from one source tree (`kernels/`), one kernel and one platform layer (`platform/npu.h`):
//! - [`build_twin`]: the kernel compiled with the host C++ compiler against the CPU implementation of the AscendC
//!   subset (`kernels/cpu/`) into a static library linked into the root crate, for the Host's checks of the kernel's
//!   own functions (its chunking, `kernel_abi::chunk::kernel`). Always done.
//! - [`build_twin_object`]: the same kernel and CPU model, with the twin's launch shim (`kernels/cpu/twin_launch.cpp`),
//!   linked into a shared object: the kernel binary the twin runtime loads with `aclrtBinaryLoadFromData`, as the NPU
//!   runtime loads the NPU object. Always done.
//! - [`build_npu`]: the kernel compiled for the AI Vector cores with `bisheng` (or the older `ccec` + `ld.lld`) and
//!   the flags of docs/hardware.md section 3, written to `OUT_DIR` for embedding. Done only with feature `cann` and a
//!   toolkit found by [`find_cann`] (explicit `AIV_CANN_HOME`, then `ASCEND_HOME_PATH`, then `PATH`).
//!
//! Every file and variable read is announced with `cargo:rerun-if-*`. Without CANN a build prints one
//! `cargo:warning` and goes on, unless `AIV_REQUIRE_NPU_KERNEL=1` asked for the NPU object (then it fails naming
//! what is missing). Nothing is decided silently from which files happen to exist: the outcome is printed.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable naming the CANN toolkit root explicitly (checked before `ASCEND_HOME_PATH`).
pub const CANN_HOME_ENV: &str = "AIV_CANN_HOME";
/// Environment variable that turns a missing NPU toolchain into a build error.
pub const REQUIRE_NPU_ENV: &str = "AIV_REQUIRE_NPU_KERNEL";

/// Source files of the kernel tree, announced to cargo.
const KERNEL_FILES: &[&str] = &[
    "include/aiv/layouts.h",
    "include/aiv/layout_asserts.h",
    "include/aiv/roce.h",
    "include/aiv/roce_asserts.h",
    "include/aiv/platform.h",
    "include/aiv/transfer_kernel.h",
    "platform/npu.h",
    "npu/entry.cpp",
    "cpu/kernel_operator.h",
    "cpu/aiv_cpu_core.h",
    "cpu/aiv_cpu_model.cpp",
    "cpu/host_hooks.cpp",
    "cpu/twin_launch.cpp",
];

/// Set to `1` while `tests/layout_probe.rs` regenerates `kernels/include/aiv/layout_asserts.h` and `roce_asserts.h`
/// from the Rust mirror: the twin build then leaves those asserts out (`AIV_LAYOUT_ASSERTS_OFF`), so that a layout
/// changed on both sides can be built to regenerate them. Never read by the NPU build.
pub const BLESS_ENV: &str = "AIV_BLESS";

/// Announces every kernel source to cargo.
pub fn rerun_on_kernel_sources(kernels: &Path) {
    for file in KERNEL_FILES {
        println!("cargo:rerun-if-changed={}", kernels.join(file).display());
    }
}

/// Compiles the transfer kernel for the CPU twin: the NPU entry (`kernels/npu/entry.cpp`, the NPU platform layer and
/// `transfer_kernel.h`, unchanged) against this project's CPU implementation of the AscendC subset
/// (`kernels/cpu/`: `kernel_operator.h` and the per-core model), plus the Host-side hooks of `kernels/cpu/host_hooks.cpp`,
/// with the host C++ compiler, into the static library `aiv_kernel_twin`, and tells cargo to link it (and the C++
/// runtime): what the Host calls of the kernel directly (the chunking mirror). Transfers run the kernel object of
/// [`build_twin_object`] on the twin runtime instead.
pub fn build_twin(kernels: &Path) {
    twin_build(kernels).compile("aiv_kernel_twin");
}

/// The host C++ build of the kernel against the CPU model that both twin targets share: `entry.cpp`, the model and
/// the hooks, C++17 at `-O3` (the model's speed; the NPU code is the same), exceptions and RTTI off.
fn twin_build(kernels: &Path) -> cc::Build {
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .file(kernels.join("npu/entry.cpp"))
        .file(kernels.join("cpu/aiv_cpu_model.cpp"))
        .file(kernels.join("cpu/host_hooks.cpp"))
        .include(kernels.join("cpu"))
        .include(kernels.join("include"))
        .include(kernels)
        .opt_level(3)
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-fno-exceptions")
        .flag_if_supported("-fno-rtti")
        // GCC cannot see that read_bytes' word loop fills the structs it reads (docs/ascendc-cpu.md).
        .flag_if_supported("-Wno-maybe-uninitialized");
    println!("cargo:rerun-if-env-changed={BLESS_ENV}");
    if env::var(BLESS_ENV).as_deref() == Ok("1") {
        build.define("AIV_LAYOUT_ASSERTS_OFF", None);
    }
    build
}

/// Compiles the kernel binary of the twin runtime: `kernels/npu/entry.cpp` against the CPU model of AscendC
/// (`kernels/cpu/kernel_operator.h`, `aiv_cpu_model.cpp`), the test and benchmark hooks of
/// `kernels/cpu/host_hooks.cpp` (the kernel `aiv_bench_post_kernel` among them) and the launch shim
/// `kernels/cpu/twin_launch.cpp`, as
/// position-independent code linked into one shared object, `OUT_DIR/aiv_transfer_kernel.twin.so`. The twin runtime
/// receives its bytes through `aclrtBinaryLoadFromData` and finds the kernel entry with `aclrtBinaryGetFunction`;
/// `-Bsymbolic` binds the object's references to its own definitions, so it never uses another copy of the model
/// that the loading process may hold. Returns the object's path.
pub fn build_twin_object(kernels: &Path, out_dir: &Path) -> PathBuf {
    let objects = twin_build(kernels)
        .pic(true)
        .file(kernels.join("cpu/twin_launch.cpp"))
        .out_dir(out_dir.join("twin-object"))
        .compile_intermediates();
    let object = out_dir.join("aiv_transfer_kernel.twin.so");
    let compiler = cc::Build::new().cpp(true).get_compiler();
    let mut command = compiler.to_command();
    command.args(["-shared", "-Wl,-Bsymbolic", "-Wl,-z,defs", "-o"]).arg(&object).args(&objects);
    let status = command.status().unwrap_or_else(|error| panic!("cannot run the C++ linker {command:?}: {error}"));
    assert!(status.success(), "linking the twin kernel object failed: {command:?} exited with {status}");
    object
}

/// A CANN toolkit compiler, and how it was found.
#[derive(Clone, Debug)]
pub struct CannCompiler {
    /// `bisheng` (CANN >= 8) or `ccec`.
    pub compiler: PathBuf,
    /// Whether it is the new `bisheng` driver.
    pub is_bisheng: bool,
    /// The toolkit root, when known.
    pub root: Option<PathBuf>,
    /// Where it came from (`AIV_CANN_HOME`, `ASCEND_HOME_PATH`, `PATH`).
    pub source: &'static str,
}

/// Finds the AscendC compiler: explicit `AIV_CANN_HOME`, then `ASCEND_HOME_PATH`, then `PATH`. The error lists every
/// place that was tried.
pub fn find_cann() -> Result<CannCompiler, String> {
    println!("cargo:rerun-if-env-changed={CANN_HOME_ENV}");
    println!("cargo:rerun-if-env-changed=ASCEND_HOME_PATH");
    println!("cargo:rerun-if-env-changed=PATH");
    let mut tried = Vec::new();
    for (variable, source) in [(CANN_HOME_ENV, "AIV_CANN_HOME"), ("ASCEND_HOME_PATH", "ASCEND_HOME_PATH")] {
        let Some(root) = env::var_os(variable).map(PathBuf::from) else {
            tried.push(format!("${variable} (unset)"));
            continue;
        };
        for (relative, is_bisheng) in [
            ("compiler/ccec_compiler/bin/bisheng", true),
            ("tools/ccec_compiler/bin/bisheng", true),
            ("tools/ccec_compiler/bin/ccec", false),
            ("compiler/ccec_compiler/bin/ccec", false),
        ] {
            let candidate = root.join(relative);
            if candidate.is_file() {
                return Ok(CannCompiler { compiler: candidate, is_bisheng, root: Some(root), source });
            }
            tried.push(candidate.display().to_string());
        }
    }
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            for (name, is_bisheng) in [("bisheng", true), ("ccec", false)] {
                let candidate = dir.join(name);
                if candidate.is_file() {
                    return Ok(CannCompiler { compiler: candidate, is_bisheng, root: None, source: "PATH" });
                }
            }
        }
        tried.push("bisheng / ccec on $PATH".into());
    }
    Err(format!("no AscendC compiler found; tried: {}", tried.join(", ")))
}

/// Compiles the NPU kernel object into `out_dir/aiv_transfer_kernel.o` with the flags of docs/hardware.md section 3.
pub fn build_npu(kernels: &Path, out_dir: &Path, cann: &CannCompiler) -> Result<PathBuf, String> {
    let source = kernels.join("npu/entry.cpp");
    let object = out_dir.join("aiv_transfer_kernel.o");
    let mut includes = vec![kernels.join("include"), kernels.to_path_buf()];
    if let Some(root) = &cann.root {
        for relative in ["compiler/tikcpp/tikcfw", "compiler/tikcpp/tikcfw/impl", "compiler/tikcpp/tikcfw/interface"] {
            includes.push(root.join(relative));
        }
    }
    let mut command = Command::new(&cann.compiler);
    if cann.is_bisheng {
        command.args(["-xasc", "--npu-arch=dav-2201", "--cce-auto-infer-kernel-type=false", "-O2", "-std=c++17", "-c"]);
    } else {
        command.args([
            "-c",
            "-x",
            "cce",
            "-O2",
            "--cce-aicore-arch=dav-c220-vec",
            "--cce-aicore-only",
            "-std=c++17",
            "-mllvm",
            "-cce-aicore-stack-size=0x8000",
            "-mllvm",
            "-cce-aicore-function-stack-size=0x8000",
            "-mllvm",
            "-cce-aicore-addr-transform",
            "-mllvm",
            "-cce-aicore-dcci-insert-for-scalar=false",
        ]);
    }
    for include in &includes {
        command.arg(format!("-I{}", include.display()));
    }
    let compiled = if cann.is_bisheng { object.clone() } else { out_dir.join("aiv_transfer_kernel.raw.o") };
    command.arg(&source).arg("-o").arg(&compiled);
    run(&mut command)?;
    if !cann.is_bisheng {
        let linker = cann.compiler.with_file_name("ld.lld");
        let mut link = Command::new(&linker);
        link.args(["-m", "aicorelinux", "-Ttext=0", "-static"]).arg(&compiled).arg("-o").arg(&object);
        run(&mut link)?;
    }
    Ok(object)
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|error| format!("could not run {command:?}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} failed with {}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim()))
    }
}

/// Whether the build asked for the NPU object to be mandatory.
pub fn npu_required() -> bool {
    println!("cargo:rerun-if-env-changed={REQUIRE_NPU_ENV}");
    env::var(REQUIRE_NPU_ENV).map(|value| value == "1").unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fake `bisheng` under `$AIV_CANN_HOME` records its arguments and writes the object: discovery order and the
    /// docs/hardware.md section 3 flags are checked without a real toolkit.
    #[test]
    fn finds_bisheng_under_the_explicit_root_and_passes_the_documented_flags() {
        let root = env::temp_dir().join(format!("ascendc-build-test-{}", std::process::id()));
        let bin = root.join("compiler/ccec_compiler/bin");
        std::fs::create_dir_all(&bin).expect("temp toolkit");
        let log = root.join("args.txt");
        let script = format!(
            "#!/bin/sh\necho \"$@\" > '{}'\nwhile [ $# -gt 1 ]; do if [ \"$1\" = -o ]; then touch \"$2\"; fi; shift; done\n",
            log.display()
        );
        let compiler = bin.join("bisheng");
        std::fs::write(&compiler, script).expect("fake compiler");
        std::fs::set_permissions(&compiler, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        // The only test in this crate that touches the environment.
        env::set_var(CANN_HOME_ENV, &root);
        let found = find_cann().expect("found under AIV_CANN_HOME");
        env::remove_var(CANN_HOME_ENV);
        assert_eq!((found.source, found.is_bisheng), ("AIV_CANN_HOME", true));
        let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let object = build_npu(&kernels, &root, &found).expect("fake build succeeds");
        assert!(object.is_file());
        let args = std::fs::read_to_string(&log).expect("arguments recorded");
        for flag in ["-xasc", "--npu-arch=dav-2201", "--cce-auto-infer-kernel-type=false", "npu/entry.cpp"] {
            assert!(args.contains(flag), "{flag} missing from {args}");
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
