//! `ascendc-build`: the build-script helper that compiles this project's AscendC transfer kernel.
//!
//! Three targets from one source tree (`kernels/`), one kernel and one platform layer (`platform/npu.h`):
//! - [`build_twin`]: the kernel compiled with the host C++ compiler against the CPU implementation of the AscendC
//!   subset (`kernels/cpu/`) into a static library linked into the root crate, for the Host's checks of the kernel's
//!   own functions (its chunking, `kernel_abi::chunk::kernel`). Always done.
//! - [`build_twin_object`]: the same kernel and CPU model, with the twin's launch shim (`kernels/cpu/twin_launch.cpp`),
//!   linked into a shared object: the kernel binary the twin runtime loads with `aclrtBinaryLoadFromData`, as the NPU
//!   runtime loads the NPU object. Always done.
//! - [`build_npu_kernel`]: the kernel compiled for the AI Vector cores into the device object
//!   `aclrtBinaryLoadFromData` loads, by the recipe of docs/hardware.md section 3 that fits the compiler found
//!   (`bisheng` in `-xasc` or `-xcce` mode, chosen from `bisheng -v` as SHMEM chooses; or `ccec`), always compiled for
//!   the AI core only and linked with `ld.lld`, written to `OUT_DIR` for embedding. Done only with feature `cann`;
//!   the toolkit is found by [`toolkit::find_toolkit`] (`AIV_CANN_HOME`, `ASCEND_HOME_PATH`, `ASCEND_TOOLKIT_HOME`,
//!   else from the location of a compiler on `PATH`). Unverified on hardware: no real compiler has run it.
//!
//! The kernel sources, the variables consulted and the toolkit's compiler, `ld.lld` and `kernel_operator.h` are
//! announced with `cargo:rerun-if-*`. Without CANN a build prints one
//! `cargo:warning` and goes on, unless `AIV_REQUIRE_NPU_KERNEL=1` asked for the NPU object (then it fails naming
//! what is missing). Nothing is decided silently from which files happen to exist: the outcome is printed.

use std::env;
use std::path::{Path, PathBuf};

pub mod recipe;
pub mod toolkit;

pub use toolkit::{CompilerKind, Environment, Toolkit, CANN_HOME_ENV};

/// Environment variable that turns a missing NPU toolchain into a build error.
pub const REQUIRE_NPU_ENV: &str = "AIV_REQUIRE_NPU_KERNEL";

/// Source files of the kernel tree, announced to cargo (every file under `kernels/`).
pub const KERNEL_FILES: &[&str] = &[
    "include/aiv/layouts.h",
    "include/aiv/layout_asserts.h",
    "include/aiv/roce.h",
    "include/aiv/roce_asserts.h",
    "include/aiv/platform.h",
    "include/aiv/transfer_kernel.h",
    "include/aiv/cache_probe.h",
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

/// The NPU kernel object a build produced.
#[derive(Clone, Debug)]
pub struct NpuKernel {
    /// The linked device object, in the output directory.
    pub object: PathBuf,
    /// Which recipe ran, why, with which compiler and toolkit: the build's printed outcome.
    pub summary: String,
}

/// Builds the NPU kernel object into `out_dir`: finds the toolkit in `env` ([`toolkit::find_toolkit`]) and its
/// include directories ([`toolkit::include_dirs`]), checks that `ld.lld` is next to the compiler, picks the recipe
/// ([`recipe::choose`], running `bisheng -v` for `bisheng`) and runs it ([`recipe::plan`], [`recipe::run`]). Every
/// error names what was missing or which command failed.
pub fn build_npu_kernel(kernels: &Path, out_dir: &Path, env: &Environment) -> Result<NpuKernel, String> {
    let toolkit = toolkit::find_toolkit(env)?;
    let includes = toolkit::include_dirs(&toolkit, &env.arch)?;
    let linker = toolkit.linker();
    if !linker.is_file() {
        return Err(format!(
            "no ld.lld next to {} (from {}): looked for {}",
            toolkit.compiler.display(),
            toolkit.source,
            linker.display()
        ));
    }
    let header = includes.iter().map(|dir| dir.join("kernel_operator.h")).find(|header| header.is_file());
    for file in [Some(&toolkit.compiler), Some(&linker), header.as_ref()].into_iter().flatten() {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let probe = (toolkit.kind == CompilerKind::Bisheng).then(|| recipe::probe_version(&toolkit.compiler));
    let (branch, reason) = recipe::choose(&toolkit, probe.as_ref());
    let plan = recipe::plan(&toolkit, (branch, reason.clone()), &includes, kernels, out_dir);
    let context =
        format!("{} (toolkit {} from {})", toolkit.compiler.display(), toolkit.root.display(), toolkit.source);
    recipe::run(&plan).map_err(|error| format!("{} recipe ({reason}) with {context}: {error}", branch.name()))?;
    Ok(NpuKernel { object: plan.object, summary: format!("{reason}; {} recipe with {context}", branch.name()) })
}

/// Whether the build asked for the NPU object to be mandatory.
pub fn npu_required() -> bool {
    println!("cargo:rerun-if-env-changed={REQUIRE_NPU_ENV}");
    env::var(REQUIRE_NPU_ENV).map(|value| value == "1").unwrap_or(false)
}

#[cfg(test)]
mod tests;
