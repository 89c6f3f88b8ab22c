//! The kernel's code as the host C++ compiler (`$CXX`, else `c++`) builds it against the CPU model of AscendC
//! (`kernels/cpu/`): properties of the one source that the NPU object shares, checked without an NPU.
//!
//! - `platform_byte_copies_are_exact`: `aiv_platform::read_bytes` / `write_bytes` (`kernels/platform/npu.h`) copy
//!   every length 0 to 67 at every GM alignment 0 to 7 and local alignment 0 to 3 exactly, guard bytes untouched
//!   (`tests/cpp/platform_bytes_test.cpp`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// The host compiler with the twin's include paths for the kernel tree at `kernels`.
fn kernel_compile(kernels: &Path) -> Command {
    let mut command = Command::new(compiler());
    command
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror"])
        // GCC cannot see that read_bytes fills the structs it reads (a word loop through GlobalTensor::GetValue).
        .arg("-Wno-maybe-uninitialized")
        .arg(format!("-I{}", kernels.join("cpu").display()))
        .arg(format!("-I{}", kernels.join("include").display()))
        .arg(format!("-I{}", kernels.display()));
    command
}

fn run_checked(command: &mut Command, what: &str) -> String {
    let output = command.output().unwrap_or_else(|error| panic!("cannot run {what}: {error}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn platform_byte_copies_are_exact() {
    let kernels = root().join("kernels");
    let dir = tempfile::tempdir().expect("temp dir");
    let program = dir.path().join("platform_bytes_test");
    run_checked(
        kernel_compile(&kernels)
            .arg("-O1")
            .arg(root().join("tests/cpp/platform_bytes_test.cpp"))
            .arg(kernels.join("cpu/aiv_cpu_model.cpp"))
            .arg("-o")
            .arg(&program),
        "compiling tests/cpp/platform_bytes_test.cpp",
    );
    let out = run_checked(&mut Command::new(&program), "platform_bytes_test");
    assert!(out.contains("4352 copies exact"), "unexpected output: {out}");
}
