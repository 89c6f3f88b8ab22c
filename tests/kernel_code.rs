//! The kernel's code as the host C++ compiler (`$CXX`, else `c++`) builds it against the CPU model of AscendC
//! (`kernels/cpu/`): properties of the one source that the NPU object shares, checked without an NPU.
//!
//! - `platform_byte_copies_are_exact`: `aiv_platform::read_bytes` / `write_bytes` (`kernels/platform/npu.h`) copy
//!   every length 0 to 67 at every GM alignment 0 to 7 and local alignment 0 to 3 exactly, guard bytes untouched
//!   (`tests/cpp/platform_bytes_test.cpp`).
//! - `the_kernel_divides_nowhere`: the kernel (`kernels/npu/entry.cpp`, all of `transfer_kernel.h` and the platform
//!   layer inlined into it) compiled at `-O2` contains no division instruction and no call to a division helper: the
//!   AIV scalar unit has no divider, so a division by a variable would be a library call on the NPU. A division by a
//!   constant becomes shifts or a multiplication on the host and is not flagged. The detector is first shown to
//!   find the division of a one-line function, so the check cannot pass by not recognising the instructions.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "common/skip.rs"]
mod skip;

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

/// The division instructions (x86-64: `div`/`idiv` of any width; AArch64: `udiv`/`sdiv`) and calls to the compiler's
/// division helpers in the assembly `asm`, each with the function it is in.
fn divisions(asm: &str) -> Vec<String> {
    let mut function = String::from("(before any function)");
    let mut found = Vec::new();
    for line in asm.lines() {
        if !line.starts_with(['\t', ' ', '.']) && line.ends_with(':') {
            function = line.trim_end_matches(':').to_owned();
            continue;
        }
        let mut words = line.split_whitespace();
        let Some(mnemonic) = words.next() else { continue };
        let divide = matches!(mnemonic, "div" | "idiv" | "udiv" | "sdiv")
            || (mnemonic.len() == 4 && mnemonic.starts_with("div") && "bwlq".contains(&mnemonic[3..]))
            || (mnemonic.len() == 5 && mnemonic.starts_with("idiv") && "bwlq".contains(&mnemonic[4..]));
        let helper = matches!(mnemonic, "call" | "bl" | "jmp" | "b")
            && words.next().is_some_and(|target| {
                let target = target.trim_start_matches('_');
                ["udivti3", "divti3", "umodti3", "modti3", "udivdi3", "divdi3", "umoddi3", "moddi3"]
                    .iter()
                    .any(|name| target.starts_with(name))
            });
        if divide || helper {
            found.push(format!("{function}: {}", line.trim()));
        }
    }
    found
}

/// `source` compiled at `-O2` to assembly, for the kernel tree at `kernels`.
fn assembly(kernels: &Path, source: &Path, dir: &Path) -> String {
    let out = dir.join("out.s");
    run_checked(
        kernel_compile(kernels).args(["-O2", "-S", "-fno-exceptions", "-fno-rtti"]).arg(source).arg("-o").arg(&out),
        &format!("compiling {} to assembly", source.display()),
    );
    std::fs::read_to_string(&out).expect("the assembly")
}

#[test]
fn the_kernel_divides_nowhere() {
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        skip::skip("the division detector knows the instructions of x86-64 and AArch64 only");
        return;
    }
    let kernels = root().join("kernels");
    let dir = tempfile::tempdir().expect("temp dir");
    // The detector finds a 64-bit division by a variable, and a 32-bit one.
    let probe = dir.path().join("divide.cpp");
    std::fs::write(
        &probe,
        "#include <stdint.h>\nuint64_t wide(uint64_t a, uint32_t b) { return a / b; }\n\
         uint32_t narrow(uint32_t a, uint32_t b) { return a % b; }\n",
    )
    .expect("write probe");
    let found = divisions(&assembly(&kernels, &probe, dir.path()));
    assert!(
        found.iter().any(|line| line.contains("wide")) && found.iter().any(|line| line.contains("narrow")),
        "the detector does not recognise this compiler's divisions: {found:?}"
    );
    let found = divisions(&assembly(&kernels, &kernels.join("npu/entry.cpp"), dir.path()));
    assert!(
        found.is_empty(),
        "the kernel divides by a variable ({} places; the AIV scalar unit has no divider: use a power of two and a \
         shift, or precompute once per launch outside the kernel object):\n{}",
        found.len(),
        found.join("\n")
    );
}
