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
//! - `the_kernel_stack_is_bounded`: the kernel compiled as the twin builds it (`-O3`) with `-fstack-usage` (GCC and
//!   Clang): the entry's frame (`transfer_block`, or `aiv_transfer_kernel` when it is inlined there) stays within
//!   [`ENTRY_FRAME_BUDGET`], and the sum of every kernel function's frame (a bound on any call chain: the kernel does
//!   not recurse) within [`ALL_FRAMES_BUDGET`]; the figures are printed. The NPU compiler's frames are unverified on
//!   hardware; its stack flags give 0x8000 bytes (docs/hardware.md section 3).

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

/// The entry function's frame in the host build, at most (measured: 832 bytes with GCC 12 at `-O3`, 9280 before the
/// block's groups and QP states moved to the UB state area).
const ENTRY_FRAME_BUDGET: u64 = 1536;
/// Every kernel function's frame together, at most (measured: 3024 bytes, 11696 before).
const ALL_FRAMES_BUDGET: u64 = 6144;

#[test]
fn the_kernel_stack_is_bounded() {
    let kernels = root().join("kernels");
    let dir = tempfile::tempdir().expect("temp dir");
    let object = dir.path().join("entry.o");
    run_checked(
        kernel_compile(&kernels)
            .args(["-O3", "-fno-exceptions", "-fno-rtti", "-fstack-usage", "-c"])
            .arg(kernels.join("npu/entry.cpp"))
            .arg("-o")
            .arg(&object),
        "compiling kernels/npu/entry.cpp with -fstack-usage",
    );
    let usage = match std::fs::read_to_string(dir.path().join("entry.su")) {
        Ok(usage) => usage,
        Err(error) => {
            skip::skip(&format!("the C++ compiler {} wrote no -fstack-usage file: {error}", compiler()));
            return;
        }
    };
    // Lines: "file:line:column:function<TAB>bytes<TAB>qualifiers".
    let frames: Vec<(String, u64)> = usage
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let function = fields.next()?.to_owned();
            let bytes = fields.next()?.trim().parse().ok()?;
            Some((function, bytes))
        })
        .collect();
    assert!(!frames.is_empty(), "no frame in the -fstack-usage output:\n{usage}");
    let entry = frames
        .iter()
        .filter(|(function, _)| function.contains("transfer_block") || function.contains("aiv_transfer_kernel"))
        .map(|&(_, bytes)| bytes)
        .max()
        .unwrap_or_else(|| panic!("neither transfer_block nor aiv_transfer_kernel in:\n{usage}"));
    let all: u64 = frames.iter().map(|&(_, bytes)| bytes).sum();
    let report = format!(
        "kernel frames (host build, -O3): entry {entry} bytes (budget {ENTRY_FRAME_BUDGET}), all functions {all} \
         bytes (budget {ALL_FRAMES_BUDGET})"
    );
    println!("{report}");
    assert!(
        entry <= ENTRY_FRAME_BUDGET && all <= ALL_FRAMES_BUDGET,
        "{report}: large per-block state belongs in the UB state area (aiv_platform::state_area), not on the stack\n{usage}"
    );
}
