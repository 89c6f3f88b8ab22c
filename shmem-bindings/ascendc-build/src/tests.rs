//! The NPU build against fake toolkit trees: stand-in `bisheng`, `ccec` and `ld.lld` shell scripts that record their
//! arguments one per line and write their `-o` outputs (`bisheng -v` prints a version line chosen by the test). They
//! pin the command lines of every recipe, the toolkit discovery order and each error. A fake compiler accepting these
//! lines proves nothing about the real one: these tests check what this crate runs, not that CANN accepts it.
//!
//! Discovery takes an [`Environment`] snapshot, so no test reads or changes the process environment. The tests are
//! serialised by [`LOCK`]: each writes executables and runs them, and an executable written by one thread can be
//! held open by a process another thread is starting ("text file busy").

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use super::*;
use crate::recipe::{first_date, Branch, VersionProbe};

static LOCK: Mutex<()> = Mutex::new(());

fn serialised() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

const ARCH: &str = "x86_64";

fn write_script(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().expect("script has a parent")).expect("script directory");
    std::fs::write(path, format!("#!/bin/sh\n{body}")).expect("script written");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("script made executable");
}

/// A fake tool at `path`: records its arguments in `<path>.argv` (a `-v` alone in `<path>.version.argv`, after running
/// `version`, shell code printing the version line) and writes a marker into the file after each `-o`.
fn fake_tool(path: &Path, version: &str) {
    let log = path.display();
    let name = path.file_name().expect("tool name").to_string_lossy();
    write_script(
        path,
        &format!(
            "if [ \"$#\" = 1 ] && [ \"$1\" = -v ]; then printf '%s\\n' \"$@\" > '{log}.version.argv'; {version}; exit 0; fi\n\
             printf '%s\\n' \"$@\" > '{log}.argv'\n\
             previous=\n\
             for argument in \"$@\"; do\n\
               if [ \"$previous\" = -o ]; then printf 'fake {name} output, not a kernel\\n' > \"$argument\"; fi\n\
               previous=$argument\n\
             done\n"
        ),
    );
}

/// A toolkit tree under `root`: `bisheng` (printing `version`) or `ccec`, and `ld.lld`, in `<root>/<bin_dir>`;
/// the include directories `include_dirs`, with `kernel_operator.h` in `header_dir`.
fn fake_toolkit(
    root: &Path,
    bin_dir: &str,
    kind: CompilerKind,
    version: &str,
    include_dirs: &[&str],
    header_dir: &str,
) {
    let bin = root.join(bin_dir);
    fake_tool(&bin.join(kind.file_name()), version);
    fake_tool(&bin.join("ld.lld"), ":");
    for dir in include_dirs {
        std::fs::create_dir_all(root.join(dir)).expect("include directory");
    }
    if !header_dir.is_empty() {
        std::fs::write(root.join(header_dir).join("kernel_operator.h"), "// fake\n").expect("fake header");
    }
}

/// SHMEM's layout: `compiler/ccec_compiler/bin`, `compiler/tikcpp/tikcfw/{impl,interface}`.
const SHMEM_INCLUDES: [&str; 4] =
    ["compiler/tikcpp", "compiler/tikcpp/tikcfw", "compiler/tikcpp/tikcfw/impl", "compiler/tikcpp/tikcfw/interface"];

fn shmem_layout_bisheng(root: &Path, version: &str) {
    fake_toolkit(
        root,
        "compiler/ccec_compiler/bin",
        CompilerKind::Bisheng,
        version,
        &SHMEM_INCLUDES,
        "compiler/tikcpp/tikcfw",
    );
}

fn environment(roots: [Option<&Path>; 3], path: Option<OsString>) -> Environment {
    Environment { roots: roots.map(|root| root.map(|root| root.as_os_str().to_owned())), path, arch: ARCH.to_owned() }
}

fn explicit(root: &Path) -> Environment {
    environment([Some(root), None, None], None)
}

fn kernels() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels")
}

fn recorded(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("{} not recorded: {error}", path.display()))
        .lines()
        .map(str::to_owned)
        .collect()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|item| (*item).to_owned()).collect()
}

fn includes(root: &Path, toolkit_dirs: &[&str]) -> Vec<String> {
    let kernels = kernels();
    toolkit_dirs
        .iter()
        .map(|dir| format!("-I{}", root.join(dir).display()))
        .chain([format!("-I{}", kernels.join("include").display()), format!("-I{}", kernels.display())])
        .collect()
}

fn link_line(out: &Path) -> Vec<String> {
    vec![
        "-m".into(),
        "aicorelinux".into(),
        "-Ttext=0".into(),
        out.join("aiv_transfer_kernel.device.o").display().to_string(),
        "-static".into(),
        "-o".into(),
        out.join("aiv_transfer_kernel.o").display().to_string(),
    ]
}

/// Builds with a fresh output directory; returns it with the outcome.
fn build(env: &Environment) -> (tempfile::TempDir, Result<NpuKernel, String>) {
    let out = tempfile::tempdir().expect("output directory");
    let outcome = build_npu_kernel(&kernels(), out.path(), env);
    (out, outcome)
}

#[test]
fn bisheng_dated_on_or_after_20260327_compiles_device_only_in_xasc_mode_and_links_with_ld_lld() {
    let _serial = serialised();
    let root = tempfile::tempdir().expect("fake toolkit");
    shmem_layout_bisheng(root.path(), "echo 'BiSheng Compiler version 1.0 (build 2026-04-02 10:00:00)'");
    let (out, outcome) = build(&explicit(root.path()));
    let kernel = outcome.expect("the fake toolkit builds");
    let bin = root.path().join("compiler/ccec_compiler/bin");
    assert_eq!(recorded(&bin.join("bisheng.version.argv")), ["-v"]);
    let mut want = includes(root.path(), &SHMEM_INCLUDES);
    want.extend(strings(&[
        "-std=c++17",
        "-O2",
        "-xasc",
        "-Xhost-start",
        "-ftrapv",
        "-Xhost-end",
        "--npu-arch=dav-2201",
        "--cce-auto-infer-kernel-type=false",
        "--cce-auto-set-ffts=false",
        "--aicore-only",
        "-Xaicore-start",
        "-mllvm",
        "-cce-aicore-dcci-insert-for-scalar=false",
        "-Xaicore-end",
        "-o",
    ]));
    want.push(out.path().join("aiv_transfer_kernel.device.o").display().to_string());
    want.extend(strings(&["-c", "--asc-aicore-lang"]));
    want.push(kernels().join("npu/entry.cpp").display().to_string());
    assert_eq!(recorded(&bin.join("bisheng.argv")), want);
    assert_eq!(recorded(&bin.join("ld.lld.argv")), link_line(out.path()));
    assert_eq!(kernel.object, out.path().join("aiv_transfer_kernel.o"));
    assert_eq!(std::fs::read_to_string(&kernel.object).expect("object"), "fake ld.lld output, not a kernel\n");
    assert!(
        kernel.summary.starts_with("bisheng -v date 2026-04-02 ≥ 2026-03-27: -xasc; bisheng -xasc recipe with "),
        "{}",
        kernel.summary
    );
    assert!(kernel.summary.contains("from $AIV_CANN_HOME"), "{}", kernel.summary);
}

/// SHMEM's -xcce line for an older `bisheng`, device-only for the vector core.
fn xcce_line(root: &Path, out: &Path) -> Vec<String> {
    let mut want = includes(root, &SHMEM_INCLUDES);
    want.extend(strings(&[
        "-std=c++17",
        "-O2",
        "-xcce",
        "-Xhost-start",
        "-ftrapv",
        "-Xhost-end",
        "-mllvm",
        "-cce-aicore-stack-size=0x8000",
        "-mllvm",
        "-cce-aicore-function-stack-size=0x8000",
        "-mllvm",
        "-cce-aicore-record-overflow=true",
        "-mllvm",
        "-cce-aicore-addr-transform",
        "-mllvm",
        "-cce-aicore-dcci-insert-for-scalar=false",
        "--cce-aicore-arch=dav-c220-vec",
        "--cce-aicore-only",
        "-o",
    ]));
    want.push(out.join("aiv_transfer_kernel.device.o").display().to_string());
    want.push("-c".into());
    want.push(kernels().join("npu/entry.cpp").display().to_string());
    want
}

#[test]
fn bisheng_dated_before_20260327_compiles_in_xcce_mode_with_shmems_flags() {
    let _serial = serialised();
    let root = tempfile::tempdir().expect("fake toolkit");
    // The date on standard error: SHMEM reads both streams.
    shmem_layout_bisheng(root.path(), "echo 'bisheng 1.0 built 2026-03-26' >&2");
    let (out, outcome) = build(&explicit(root.path()));
    let kernel = outcome.expect("the fake toolkit builds");
    let bin = root.path().join("compiler/ccec_compiler/bin");
    assert_eq!(recorded(&bin.join("bisheng.argv")), xcce_line(root.path(), out.path()));
    assert_eq!(recorded(&bin.join("ld.lld.argv")), link_line(out.path()));
    assert!(kernel.summary.starts_with("bisheng -v date 2026-03-26 < 2026-03-27: -xcce;"), "{}", kernel.summary);
}

#[test]
fn bisheng_without_a_date_or_without_output_is_treated_as_old_and_compiles_in_xcce_mode() {
    let _serial = serialised();
    for (version, reason) in [
        ("echo 'bisheng version 1.0'", "bisheng -v printed no YYYY-MM-DD date: -xcce"),
        (":", "bisheng -v printed nothing: -xcce"),
    ] {
        let root = tempfile::tempdir().expect("fake toolkit");
        shmem_layout_bisheng(root.path(), version);
        let (out, outcome) = build(&explicit(root.path()));
        let kernel = outcome.expect("the fake toolkit builds");
        let bin = root.path().join("compiler/ccec_compiler/bin");
        assert_eq!(recorded(&bin.join("bisheng.argv")), xcce_line(root.path(), out.path()), "{version}");
        assert_eq!(recorded(&bin.join("ld.lld.argv")), link_line(out.path()));
        assert!(kernel.summary.starts_with(reason), "{version}: {}", kernel.summary);
    }
}

#[test]
fn the_mode_switch_is_shmems_first_date_at_or_after_20260327() {
    assert_eq!(first_date("v1 2026-03-27 and 2020-01-01"), Some(("2026-03-27".to_owned(), 20260327)));
    assert_eq!(first_date("x12026-04-02"), Some(("2026-04-02".to_owned(), 20260402)));
    assert_eq!(first_date("2026-4-02 2026/04/02 20260402"), None);
    assert_eq!(first_date(""), None);
    // No calendar check, as SHMEM's regular expression.
    assert_eq!(first_date("9999-99-99"), Some(("9999-99-99".to_owned(), 99999999)));
    let toolkit = Toolkit {
        root: PathBuf::from("/r"),
        compiler: PathBuf::from("/r/compiler/ccec_compiler/bin/bisheng"),
        kind: CompilerKind::Bisheng,
        source: "$AIV_CANN_HOME".into(),
    };
    let choose = |probe: VersionProbe| recipe::choose(&toolkit, Some(&probe)).0;
    assert_eq!(choose(VersionProbe::Output("2026-03-27".into())), Branch::BishengAsc);
    assert_eq!(choose(VersionProbe::Output("2026-03-26".into())), Branch::BishengCce);
    assert_eq!(choose(VersionProbe::Output("2027-01-01".into())), Branch::BishengAsc);
    assert_eq!(choose(VersionProbe::NotRun("no such file".into())), Branch::BishengCce);
    let (branch, reason) = recipe::choose(&toolkit, Some(&VersionProbe::NotRun("boom".into())));
    assert_eq!(branch, Branch::BishengCce);
    assert!(reason.contains("could not run (boom)"), "{reason}");
}

#[test]
fn ccec_compiles_and_links_exactly_as_hccls_custom_op_example_plus_the_dcci_option() {
    let _serial = serialised();
    let root = tempfile::tempdir().expect("fake toolkit");
    let toolkit_dirs =
        ["tools/tikcpp/tikcfw/lib", "tools/tikcpp/tikcfw", "tools/tikcpp/tikcfw/interface", "tools/tikcpp/tikcfw/impl"];
    fake_toolkit(
        root.path(),
        "tools/ccec_compiler/bin",
        CompilerKind::Ccec,
        "exit 1",
        &toolkit_dirs,
        "tools/tikcpp/tikcfw/interface",
    );
    let (out, outcome) = build(&explicit(root.path()));
    let kernel = outcome.expect("the fake toolkit builds");
    let bin = root.path().join("tools/ccec_compiler/bin");
    assert!(!bin.join("ccec.version.argv").exists(), "ccec is never asked for its version");
    let mut want = strings(&["-c", "-x", "cce", "-O2"]);
    want.push(kernels().join("npu/entry.cpp").display().to_string());
    want.push("-o".into());
    want.push(out.path().join("aiv_transfer_kernel.device.o").display().to_string());
    want.extend(strings(&[
        "--cce-aicore-arch=dav-c220-vec",
        "-D__CCE_AICORE__=220",
        "-D__DAV_C220__",
        "--cce-aicore-only",
        "-mllvm",
        "-cce-aicore-function-stack-size=0x8000",
        "-mllvm",
        "-cce-aicore-stack-size=0x8000",
        "-mllvm",
        "-cce-aicore-record-overflow=false",
        "-mllvm",
        "-cce-aicore-addr-transform",
        "-mllvm",
        "-cce-aicore-jump-expand=true",
        "-std=c++17",
        "-fstack-protector-all",
    ]));
    // HCCL's hint order: tools/tikcpp/tikcfw/lib, tikcfw, interface, impl (as include_candidates lists them).
    want.extend(includes(root.path(), &toolkit_dirs));
    want.extend(strings(&["-mllvm", "-cce-aicore-dcci-insert-for-scalar=false"]));
    assert_eq!(recorded(&bin.join("ccec.argv")), want);
    assert_eq!(recorded(&bin.join("ld.lld.argv")), link_line(out.path()));
    assert!(kernel.summary.starts_with("ccec found (no bisheng in the toolkit)"), "{}", kernel.summary);
}

/// Three valid toolkits and one reachable only through `PATH`; the winner is told by its root.
#[test]
fn the_root_comes_from_aiv_cann_home_then_ascend_home_path_then_ascend_toolkit_home_then_a_compiler_on_path() {
    let _serial = serialised();
    let trees: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().expect("fake toolkit")).collect();
    for tree in &trees {
        shmem_layout_bisheng(tree.path(), "echo 2026-04-02");
    }
    let on_path = || Some(trees[3].path().join("compiler/ccec_compiler/bin").into_os_string());
    let [a, b, c, d] = [0, 1, 2, 3].map(|index| trees[index].path());
    let cases = [
        (environment([Some(a), Some(b), Some(c)], on_path()), a, "$AIV_CANN_HOME"),
        (environment([None, Some(b), Some(c)], on_path()), b, "$ASCEND_HOME_PATH"),
        (environment([None, None, Some(c)], on_path()), c, "$ASCEND_TOOLKIT_HOME"),
        (environment([None, None, None], on_path()), d, "PATH"),
    ];
    for (env, root, source) in cases {
        let found = toolkit::find_toolkit(&env).expect("found");
        assert_eq!((found.root.as_path(), found.source.as_str()), (root, source));
        assert_eq!(found.compiler, root.join("compiler/ccec_compiler/bin/bisheng"));
    }
    // An empty variable counts as unset.
    let empty = Environment { roots: [Some(OsString::new()), None, Some(c.into())], path: None, arch: ARCH.into() };
    assert_eq!(toolkit::find_toolkit(&empty).expect("found").root, c);
}

#[test]
fn a_compiler_on_path_gives_its_root_from_each_compiler_directory_and_through_a_symbolic_link() {
    let _serial = serialised();
    for (bin_dir, kind) in [
        ("compiler/ccec_compiler/bin", CompilerKind::Bisheng),
        ("x86_64-linux/ccec_compiler/bin", CompilerKind::Bisheng),
        ("tools/ccec_compiler/bin", CompilerKind::Ccec),
    ] {
        let root = tempfile::tempdir().expect("fake toolkit");
        fake_toolkit(root.path(), bin_dir, kind, ":", &SHMEM_INCLUDES, "compiler/tikcpp/tikcfw");
        let path = std::env::join_paths([Path::new("/nonexistent-dir"), &root.path().join(bin_dir)]).expect("PATH");
        let found = toolkit::find_toolkit(&environment([None, None, None], Some(path))).expect("found");
        assert_eq!((found.root.as_path(), found.kind), (root.path(), kind), "{bin_dir}");
    }
    // `<root>/bin/bisheng` -> `../compiler/ccec_compiler/bin/bisheng`, as a set_env.sh PATH entry might hold it.
    let root = tempfile::tempdir().expect("fake toolkit");
    let canonical_root = root.path().canonicalize().expect("canonical root");
    shmem_layout_bisheng(root.path(), ":");
    std::fs::create_dir_all(root.path().join("bin")).expect("bin");
    std::os::unix::fs::symlink("../compiler/ccec_compiler/bin/bisheng", root.path().join("bin/bisheng")).expect("link");
    let env = environment([None, None, None], Some(root.path().join("bin").into_os_string()));
    let found = toolkit::find_toolkit(&env).expect("found through the link");
    assert_eq!(found.root, canonical_root);
}

#[test]
fn the_include_list_is_shmems_then_the_per_arch_variants_then_hccls_as_far_as_they_exist() {
    let _serial = serialised();
    let root = tempfile::tempdir().expect("fake toolkit");
    let mut present = SHMEM_INCLUDES.to_vec();
    present.extend(["x86_64-linux/tikcpp", "x86_64-linux/tikcpp/tikcfw", "x86_64-linux/tikcpp/tikcfw/interface"]);
    present.extend(["tikcpp/tikcfw", "include/tikcpp/tikcfw", "x86_64-linux/asc/include"]);
    fake_toolkit(
        root.path(),
        "compiler/ccec_compiler/bin",
        CompilerKind::Bisheng,
        ":",
        &present,
        "x86_64-linux/tikcpp/tikcfw",
    );
    let found = toolkit::find_toolkit(&explicit(root.path())).expect("found");
    let dirs = toolkit::include_dirs(&found, ARCH).expect("include directories");
    assert_eq!(dirs, present.iter().map(|dir| root.path().join(dir)).collect::<Vec<_>>());
}

/// Runs a build that must fail before any tool ran; returns its error.
fn fails_before_running(env: &Environment, bins: &[PathBuf]) -> String {
    let (_out, outcome) = build(env);
    let error = outcome.expect_err("the build must fail");
    for bin in bins {
        for log in ["bisheng.version.argv", "bisheng.argv", "ccec.argv", "ld.lld.argv"] {
            assert!(!bin.join(log).exists(), "{log} ran although the build was to stop before: {error}");
        }
    }
    error
}

#[test]
fn a_root_variable_naming_no_directory_or_a_root_without_a_compiler_is_an_error_naming_it() {
    let _serial = serialised();
    let missing = tempfile::tempdir().expect("temp").path().join("not-there");
    let env = environment([None, Some(&missing), None], None);
    let error = fails_before_running(&env, &[]);
    assert!(error.contains(&format!("$ASCEND_HOME_PATH={}: no such directory", missing.display())), "{error}");
    // A wrong AIV_CANN_HOME does not fall back to a valid ASCEND_HOME_PATH.
    let valid = tempfile::tempdir().expect("fake toolkit");
    shmem_layout_bisheng(valid.path(), ":");
    let env = environment([Some(&missing), Some(valid.path()), None], None);
    let error = fails_before_running(&env, &[valid.path().join("compiler/ccec_compiler/bin")]);
    assert!(error.starts_with(&format!("$AIV_CANN_HOME={}", missing.display())), "{error}");
    let empty = tempfile::tempdir().expect("empty root");
    let error = fails_before_running(&explicit(empty.path()), &[]);
    assert!(error.contains("no AscendC compiler in this toolkit root"), "{error}");
    let expected = empty.path().join("compiler/ccec_compiler/bin/bisheng");
    assert!(error.contains(&expected.display().to_string()), "{error}");
    let expected = empty.path().join("tools/ccec_compiler/bin/ccec");
    assert!(error.contains(&expected.display().to_string()), "{error}");
}

#[test]
fn missing_include_directories_or_a_missing_kernel_operator_header_stop_the_build_before_the_compiler_runs() {
    let _serial = serialised();
    let root = tempfile::tempdir().expect("fake toolkit");
    fake_toolkit(root.path(), "compiler/ccec_compiler/bin", CompilerKind::Bisheng, ":", &[], "");
    let bin = root.path().join("compiler/ccec_compiler/bin");
    let error = fails_before_running(&explicit(root.path()), std::slice::from_ref(&bin));
    assert!(error.contains("has none of the AscendC include directories"), "{error}");
    for dir in [
        "compiler/tikcpp/tikcfw",
        "x86_64-linux/tikcpp/tikcfw/interface",
        "tools/tikcpp/tikcfw/lib",
        "x86_64-linux/asc/include",
    ] {
        assert!(error.contains(&root.path().join(dir).display().to_string()), "{dir} not named: {error}");
    }
    for dir in SHMEM_INCLUDES {
        std::fs::create_dir_all(root.path().join(dir)).expect("include directory");
    }
    let error = fails_before_running(&explicit(root.path()), std::slice::from_ref(&bin));
    assert!(error.starts_with("kernel_operator.h (AscendC) is in none of the include directories"), "{error}");
    assert!(error.contains(&root.path().join("compiler/tikcpp/tikcfw/interface").display().to_string()), "{error}");
    // With the header, but no ld.lld next to the compiler.
    std::fs::write(root.path().join("compiler/tikcpp/tikcfw/kernel_operator.h"), "").expect("header");
    std::fs::remove_file(bin.join("ld.lld")).expect("remove ld.lld");
    let error = fails_before_running(&explicit(root.path()), std::slice::from_ref(&bin));
    assert!(error.contains(&format!("looked for {}", bin.join("ld.lld").display())), "{error}");
}

#[test]
fn a_compiler_on_path_outside_a_toolkit_tree_is_an_error_naming_it_and_ascend_home_path() {
    let _serial = serialised();
    let dir = tempfile::tempdir().expect("temp");
    let bin = dir.path().join("opt/bin");
    fake_tool(&bin.join("bisheng"), ":");
    let error = fails_before_running(
        &environment([None, None, None], Some(bin.clone().into_os_string())),
        std::slice::from_ref(&bin),
    );
    assert!(
        error.starts_with(&format!(
            "{} (found on PATH) is not inside a CANN toolkit tree",
            bin.join("bisheng").display()
        )),
        "{error}"
    );
    assert!(error.contains("set ASCEND_HOME_PATH to the toolkit root"), "{error}");
    let error = fails_before_running(&environment([None, None, None], Some(OsString::from("/nonexistent-dir"))), &[]);
    assert!(error.contains("neither bisheng nor ccec is on PATH"), "{error}");
}

#[test]
fn a_failing_compile_step_is_an_error_naming_the_recipe_and_the_command() {
    let _serial = serialised();
    let root = tempfile::tempdir().expect("fake toolkit");
    shmem_layout_bisheng(root.path(), "echo 2026-04-02");
    let bisheng = root.path().join("compiler/ccec_compiler/bin/bisheng");
    write_script(&bisheng, "[ \"$1\" = -v ] && { echo 2026-04-02; exit 0; }\necho 'unknown option' >&2\nexit 3\n");
    let (out, outcome) = build(&explicit(root.path()));
    let error = outcome.expect_err("the compile fails");
    assert!(error.starts_with("bisheng -xasc recipe (bisheng -v date 2026-04-02"), "{error}");
    assert!(error.contains("unknown option"), "{error}");
    assert!(!out.path().join("aiv_transfer_kernel.o").exists());
}

#[test]
fn every_file_under_kernels_is_announced_to_cargo() {
    fn walk(dir: &Path, base: &Path, files: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("kernels directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, base, files);
            } else {
                files.push(path.strip_prefix(base).expect("under kernels").display().to_string());
            }
        }
    }
    let mut files = Vec::new();
    walk(&kernels(), &kernels(), &mut files);
    files.sort();
    let mut announced = strings(KERNEL_FILES);
    announced.sort();
    assert_eq!(announced, files, "KERNEL_FILES differs from the files under kernels/");
}

/// `compilers_under` lists every compiler of a root in the search order, its first being `find_toolkit`'s pick;
/// `branches` and `forced` give the recipes each driver can run, and `plan` runs a forced one as named.
#[test]
fn every_compiler_of_a_root_is_listed_in_the_search_order_and_each_drivers_recipes_can_be_forced() {
    let _serial = serialised();
    let root = tempfile::tempdir().expect("fake toolkit");
    fake_toolkit(root.path(), "tools/ccec_compiler/bin", CompilerKind::Ccec, "exit 1", &[], "");
    shmem_layout_bisheng(root.path(), "echo 'build 2026-04-02'");
    fake_tool(&root.path().join("x86_64-linux/ccec_compiler/bin/ccec"), "exit 1");
    let found = toolkit::compilers_under(root.path(), ARCH);
    let want = [
        ("compiler/ccec_compiler/bin/bisheng", CompilerKind::Bisheng),
        ("tools/ccec_compiler/bin/ccec", CompilerKind::Ccec),
        ("x86_64-linux/ccec_compiler/bin/ccec", CompilerKind::Ccec),
    ]
    .map(|(relative, kind)| (root.path().join(relative), kind));
    assert_eq!(found, want);
    let picked = toolkit::find_toolkit(&explicit(root.path())).expect("toolkit");
    assert_eq!((picked.compiler, picked.kind), want[0]);
    assert!(toolkit::compilers_under(&root.path().join("nothing here"), ARCH).is_empty());

    assert_eq!(recipe::branches(CompilerKind::Bisheng), [Branch::BishengAsc, Branch::BishengCce]);
    assert_eq!(recipe::branches(CompilerKind::Ccec), [Branch::Ccec]);
    // The date picks -xasc; the forced -xcce plan is the -xcce line all the same.
    let toolkit = toolkit::find_toolkit(&explicit(root.path())).expect("toolkit");
    let (branch, reason) = recipe::forced(Branch::BishengCce);
    assert_eq!(branch, Branch::BishengCce);
    assert!(reason.starts_with("bisheng -xcce named by the caller"), "{reason}");
    let out = tempfile::tempdir().expect("output directory");
    let dirs =
        toolkit::include_candidates(root.path(), ARCH).into_iter().filter(|dir| dir.is_dir()).collect::<Vec<_>>();
    let plan = recipe::plan(&toolkit, (branch, reason), &dirs, &kernels(), out.path());
    let compile: Vec<String> = plan.steps[0].args.iter().map(|arg| arg.to_string_lossy().into_owned()).collect();
    assert_eq!(compile, xcce_line(root.path(), out.path()));
}
