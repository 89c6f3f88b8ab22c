//! The build script's NPU kernel build end to end: `cargo check --features cann` of this crate with
//! `AIV_CANN_HOME` naming a fake CANN toolkit and `AIV_REQUIRE_NPU_KERNEL=1`. The fake `bisheng` (its `-v` prints a
//! 2026-04-02 build date) and `ld.lld` are shell scripts recording their arguments and writing their `-o` outputs;
//! the build must pick the `-xasc` recipe, run `bisheng -v`, the compile and the link, set cfg `aiv_npu_kernel` and
//! embed the object (`host/device/kernel_image.rs` `include_bytes!`s it, which `cargo check` expands).
//!
//! A fake compiler accepting these command lines proves nothing about the real one; the exact lines are pinned by
//! `shmem-bindings/ascendc-build`'s unit tests. The fake object lives only in this test's own target directory
//! (`CARGO_TARGET_TMPDIR/fake-toolkit-build`), never in the one the project's binaries are built in.
//!
//! Compiled only without feature `cann`: its nested build sets the feature itself, so it runs once per test pass.
//! Cost: a cold nested target directory checks every dependency once; after that each run reruns the build script
//! (the fake root's path changes every run, so `AIV_CANN_HOME` changes) and checks this crate again.
#![cfg(not(feature = "cann"))]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn write_script(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("script directory");
    std::fs::write(path, format!("#!/bin/sh\n{body}")).expect("script written");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("script made executable");
}

/// A fake tool recording its arguments one per line in `<path>.argv` (`-v` alone: in `<path>.version.argv`, printing
/// `version`) and writing a marker into each `-o` output.
fn fake_tool(path: &Path, version: &str) {
    let log = path.display();
    write_script(
        path,
        &format!(
            "if [ \"$#\" = 1 ] && [ \"$1\" = -v ]; then printf '%s\\n' \"$@\" > '{log}.version.argv'; echo '{version}'; exit 0; fi\n\
             printf '%s\\n' \"$@\" > '{log}.argv'\n\
             previous=\n\
             for argument in \"$@\"; do\n\
               if [ \"$previous\" = -o ]; then echo 'fake toolkit output, not a kernel' > \"$argument\"; fi\n\
               previous=$argument\n\
             done\n"
        ),
    );
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("{} was not written (the tool did not run): {error}", path.display()))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The fake toolkit, at a path new to every run (the build script reruns when `AIV_CANN_HOME` changes). Earlier
/// runs' trees are removed.
fn fake_toolkit(tmp: &Path) -> PathBuf {
    if let Ok(entries) = std::fs::read_dir(tmp) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("fake-toolkit-root-") {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_nanos();
    let root = tmp.join(format!("fake-toolkit-root-{}-{stamp}", std::process::id()));
    let bin = root.join("compiler/ccec_compiler/bin");
    fake_tool(&bin.join("bisheng"), "BiSheng Compiler 1.0 (build 2026-04-02)");
    fake_tool(&bin.join("ld.lld"), "");
    let headers = root.join("compiler/tikcpp/tikcfw");
    for dir in ["impl", "interface"] {
        std::fs::create_dir_all(headers.join(dir)).expect("include directory");
    }
    std::fs::write(headers.join("kernel_operator.h"), "// fake\n").expect("fake header");
    root
}

#[test]
fn cargo_check_with_feature_cann_builds_and_embeds_the_npu_object_through_the_xasc_recipe_of_a_fake_toolkit() {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let target = tmp.join("fake-toolkit-build");
    let root = fake_toolkit(tmp);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["check", "--offline", "-p", "aiv-transport", "--lib", "--features", "cann"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", &target)
        .env("AIV_CANN_HOME", &root)
        .env("AIV_REQUIRE_NPU_KERNEL", "1")
        .env_remove("ASCEND_HOME_PATH")
        .env_remove("ASCEND_TOOLKIT_HOME")
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cargo check --features cann failed:\n{stderr}");
    assert!(
        stderr.contains("NPU kernel built (unverified on hardware): bisheng -v date 2026-04-02 ≥ 2026-03-27: -xasc;"),
        "the printed outcome does not name the recipe and why:\n{stderr}"
    );

    let bin = root.join("compiler/ccec_compiler/bin");
    assert_eq!(lines(&bin.join("bisheng.version.argv")), ["-v"]);
    let compile = lines(&bin.join("bisheng.argv"));
    let entry = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/npu/entry.cpp");
    assert_eq!(
        compile[compile.len() - 3..],
        ["-c".to_owned(), "--asc-aicore-lang".into(), entry.display().to_string()]
    );
    for flag in ["-xasc", "--npu-arch=dav-2201", "--cce-auto-set-ffts=false", "--aicore-only"] {
        assert!(compile.contains(&flag.to_owned()), "{flag} missing from the compile line {compile:?}");
    }
    let device_object = &compile[compile.iter().position(|arg| arg == "-o").expect("-o") + 1];
    let link = lines(&bin.join("ld.lld.argv"));
    assert_eq!(link[..5], ["-m", "aicorelinux", "-Ttext=0", device_object.as_str(), "-static"]);
    assert_eq!(link[5], "-o");
    let object = PathBuf::from(&link[6]);
    assert!(object.starts_with(&target), "the object {} is outside this test's target directory", object.display());
    assert_eq!(std::fs::read_to_string(&object).expect("linked object"), "fake toolkit output, not a kernel\n");

    // The build script's own record of what it told cargo: the cfg that embeds the object, and the object's path.
    let out_dir = object.parent().expect("OUT_DIR");
    let script_output = std::fs::read_to_string(out_dir.with_file_name("output")).expect("build script output");
    assert!(script_output.lines().any(|line| line == "cargo:rustc-cfg=aiv_npu_kernel"), "{script_output}");
    let env_line = format!("cargo:rustc-env=AIV_NPU_KERNEL_OBJECT={}", object.display());
    assert!(script_output.lines().any(|line| line == env_line), "{script_output}");
}
