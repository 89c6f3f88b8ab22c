//! Hardware tier: the assumptions of the NPU kernel's build recipe (docs/hardware.md section 3,
//! `shmem-bindings/ascendc-build`), in the style of `tests/npu_assumptions.rs`: observe with the build's own
//! functions (`ascendc_build::toolkit`, `ascendc_build::recipe`), judge with a pure `judge_*` function, print
//! `CONFIRMED:`, `REFUTED:` or `INCONCLUSIVE:` with what happened. None of these has run on an Ascend machine: each is
//! unverified on hardware until a run of `bash tests/npu/run.sh` on one says otherwise. `#[ignore]`d, selected by
//! `AIV_NPU_TESTS=1`: `AIV_NPU_TESTS=1 cargo test --release --features cann --test npu_build_assumptions --
//! --ignored --nocapture --test-threads=1`.
//!
//! Everywhere, in the suite: the same observations on a fake toolkit whose stand-in `bisheng`, `ccec` and `ld.lld`
//! write, as the "object", a copy of the twin runtime's kernel object (loaded on the twin runtime's ACL, so every
//! recipe comes out CONFIRMED there) or garbage (so every recipe comes out REFUTED, naming the ACL error), and each
//! judge fed an observation that breaks its assumption. A stand-in accepting a command line proves only the test's
//! logic, never that the real compiler or runtime accepts anything. Every object a stand-in writes stays in the
//! test's own temporary directory (the stand-ins refuse any other output path).
#[path = "common/skip.rs"]
mod skip;
#[path = "common/verdict.rs"]
mod verdict;

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use ascendc_build::recipe::{self, Branch};
use ascendc_build::toolkit::{self, CompilerKind, Environment, Toolkit};
use ascendcl_sys::AclApi;
use verdict::{device_id, line, report, selected, Outcome};

/// What the build script's `Environment::from_process` reads, read here without announcing anything to cargo.
fn process_environment() -> Environment {
    Environment::from_lookup(|name| std::env::var_os(name))
}

fn kernels() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels")
}

/// The first `lines` lines of a command's output, joined by ` | `.
fn head(output: &[u8], lines: usize) -> String {
    String::from_utf8_lossy(output).lines().take(lines).collect::<Vec<_>>().join(" | ")
}

// ---- every recipe the toolkit can run builds a kernel the runtime loads -------------------------------------------

/// How far one recipe got.
#[derive(Debug)]
enum BranchRun {
    /// The toolkit has no compiler for this recipe (why).
    NoCompiler(String),
    /// A step failed: `compile` or `link`, its exit status (or why it did not start), its standard error's first lines.
    StepFailed { step: &'static str, status: String, stderr: String },
    /// Both steps succeeded but no object was written at this path.
    NoObject(PathBuf),
    /// Built: the object, its size and what the runtime made of it (`aclrtBinaryLoadFromData`, then
    /// `aclrtBinaryGetFunction("aiv_transfer_kernel")`; the error names the call and its ACL code).
    Built { object: PathBuf, bytes: usize, load: Result<(), String> },
}

#[derive(Debug)]
struct BranchObservation {
    branch: Branch,
    /// The compiler the recipe ran with.
    compiler: Option<PathBuf>,
    run: BranchRun,
}

#[derive(Debug)]
struct RecipesObservation {
    /// The toolkit `find_toolkit` found: its compiler, root and where the root came from.
    toolkit: String,
    /// What the build's own rule (`recipe::choose`, after `bisheng -v` for `bisheng`) picks, and why.
    chosen: (Branch, String),
    /// Every recipe, in the order of `Branch`'s variants.
    branches: Vec<BranchObservation>,
}

fn judge_branch(o: &BranchObservation) -> Outcome {
    let compiler = o.compiler.as_ref().map_or_else(|| "no compiler".to_owned(), |path| path.display().to_string());
    match &o.run {
        BranchRun::NoCompiler(why) => Outcome::Inconclusive(format!("not run: {why}")),
        BranchRun::StepFailed { step, status, stderr } => {
            Outcome::Refuted(format!("the {step} step with {compiler} failed ({status}): {stderr}"))
        }
        BranchRun::NoObject(object) => {
            Outcome::Refuted(format!("compile and link with {compiler} succeeded but wrote no {}", object.display()))
        }
        BranchRun::Built { object, bytes, load: Ok(()) } => Outcome::Confirmed(format!(
            "{compiler} built {} ({bytes} bytes); the runtime loaded it and found aiv_transfer_kernel",
            object.display()
        )),
        BranchRun::Built { object, bytes, load: Err(error) } => Outcome::Refuted(format!(
            "{compiler} built {} ({bytes} bytes), which the runtime refused: {error}",
            object.display()
        )),
    }
}

/// The line of the recipe the build's rule picks: CONFIRMED when that recipe's own line is.
fn judge_pick(o: &RecipesObservation) -> Outcome {
    let (picked, why) = &o.chosen;
    let others: Vec<&str> = o
        .branches
        .iter()
        .filter(|other| other.branch != *picked && matches!(judge_branch(other), Outcome::Confirmed(_)))
        .map(|other| other.branch.name())
        .collect();
    let seen = format!("toolkit {}; the build's rule picks {} ({why})", o.toolkit, picked.name());
    match o.branches.iter().find(|run| run.branch == *picked).map(judge_branch) {
        Some(Outcome::Confirmed(what)) => Outcome::Confirmed(format!("{seen}, which built a loadable kernel: {what}")),
        Some(Outcome::Refuted(what)) => Outcome::Refuted(format!(
            "{seen}, which did not build a loadable kernel: {what}; recipes that did: {}",
            if others.is_empty() { "none".to_owned() } else { others.join(", ") }
        )),
        Some(Outcome::Inconclusive(what)) => Outcome::Inconclusive(format!("{seen}: {what}")),
        None => Outcome::Inconclusive(format!("{seen}, which was not run")),
    }
}

/// Runs `branch`'s plan with `toolkit`'s compiler into `out` (a fresh directory), one step at a time, then hands
/// the object's bytes to `load`.
fn build_and_load(
    toolkit: &Toolkit,
    branch: Branch,
    includes: &[PathBuf],
    out: &Path,
    load: &dyn Fn(&[u8]) -> Result<(), String>,
) -> BranchRun {
    if let Err(error) = std::fs::create_dir_all(out) {
        return BranchRun::StepFailed {
            step: "compile",
            status: format!("no output directory: {error}"),
            stderr: "".into(),
        };
    }
    let plan = recipe::plan(toolkit, recipe::forced(branch), includes, &kernels(), out);
    for (step, name) in plan.steps.iter().zip(["compile", "link"]) {
        match step.command().output() {
            Err(error) => {
                let status = format!("{} did not start: {error}", step.program.display());
                return BranchRun::StepFailed { step: name, status, stderr: String::new() };
            }
            Ok(output) if !output.status.success() => {
                return BranchRun::StepFailed {
                    step: name,
                    status: output.status.to_string(),
                    stderr: head(&output.stderr, 6),
                }
            }
            Ok(_) => {}
        }
    }
    match std::fs::read(&plan.object) {
        Ok(bytes) => BranchRun::Built { object: plan.object, bytes: bytes.len(), load: load(&bytes) },
        Err(_) => BranchRun::NoObject(plan.object),
    }
}

/// Finds the toolkit in `env` as the build does, then runs every recipe its compilers can run (each into its own
/// directory under `scratch`) and loads each object with `load`. An error when there is no toolkit to build with.
fn observe_recipes(
    env: &Environment,
    scratch: &Path,
    load: &dyn Fn(&[u8]) -> Result<(), String>,
) -> Result<RecipesObservation, String> {
    let found = toolkit::find_toolkit(env)?;
    let includes = toolkit::include_dirs(&found, &env.arch)?;
    let probe = (found.kind == CompilerKind::Bisheng).then(|| recipe::probe_version(&found.compiler));
    let chosen = recipe::choose(&found, probe.as_ref());
    let compilers = toolkit::compilers_under(&found.root, &env.arch);
    // The found compiler for its own kind; the first of the other kind under the same root for the other.
    let toolkit_for = |kind: CompilerKind| -> Option<Toolkit> {
        if found.kind == kind {
            return Some(found.clone());
        }
        let (compiler, _) = compilers.iter().find(|(_, other)| *other == kind)?;
        Some(Toolkit { compiler: compiler.clone(), kind, ..found.clone() })
    };
    let mut branches = Vec::new();
    for kind in [CompilerKind::Bisheng, CompilerKind::Ccec] {
        for &branch in recipe::branches(kind) {
            let Some(toolkit) = toolkit_for(kind) else {
                let why = format!("no {} under {}", kind.file_name(), found.root.display());
                branches.push(BranchObservation { branch, compiler: None, run: BranchRun::NoCompiler(why) });
                continue;
            };
            let out = scratch.join(branch.name().replace([' ', '-'], ""));
            let run = build_and_load(&toolkit, branch, &includes, &out, load);
            branches.push(BranchObservation { branch, compiler: Some(toolkit.compiler), run });
        }
    }
    let toolkit = format!("{} (root {} from {})", found.compiler.display(), found.root.display(), found.source);
    Ok(RecipesObservation { toolkit, chosen, branches })
}

/// `aclInit` (a repeated one accepted) and `aclrtSetDevice`, then `aclrtBinaryLoadFromData` of `object`,
/// `aclrtBinaryGetFunction(binary, "aiv_transfer_kernel")` and `aclrtBinaryUnLoad`, as the `cann` backend's bring-up
/// does (`host/device/cann/open.rs`). The error names the call and its ACL code.
fn load_kernel(acl: &AclApi, device: u32, object: &[u8]) -> Result<(), String> {
    use ascendcl_sys::result::{device as acl_device, kernel, runtime};
    match runtime::init(acl, None) {
        Ok(()) => {}
        Err(error) if error.code() == Some(ascendcl_sys::AclError(ascendcl_sys::sys::ACL_ERROR_REPEAT_INITIALIZE)) => {}
        Err(error) => return Err(format!("aclInit: {error}")),
    }
    acl_device::set(acl, device as i32).map_err(|error| format!("aclrtSetDevice({device}): {error}"))?;
    // SAFETY: `object` outlives the binary, which is unloaded below; no options are passed.
    let binary = unsafe { kernel::load_from_data(acl, object, None) }.map_err(|error| error.to_string())?;
    let entry = CString::new(aiv_transport::device::kernel_image::NPU_KERNEL_ENTRY).expect("no NUL in the entry name");
    // SAFETY: the binary was loaded above.
    let function = unsafe { kernel::get_function(acl, binary, &entry) };
    // SAFETY: loaded above; nothing of it was launched.
    let unloaded = unsafe { kernel::unload(acl, binary) };
    function.map_err(|error| error.to_string())?;
    unloaded.map_err(|error| error.to_string())
}

/// Prints one line per recipe; returns the pick's outcome.
fn print_recipes(observation: &RecipesObservation, label: &str) -> Outcome {
    for run in &observation.branches {
        let assumption = format!("the {} recipe builds a kernel the runtime loads{label}", run.branch.name());
        println!("{}", line(&assumption, &judge_branch(run)));
    }
    judge_pick(observation)
}

const PICK: &str = "the recipe the build's rule picks builds a kernel the runtime loads";

#[test]
#[ignore = "hardware: needs the CANN toolkit, an Ascend NPU and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn every_recipe_the_toolkit_can_run_builds_a_loadable_kernel() {
    if !selected() {
        return;
    }
    let acl = match ascendcl_sys::api() {
        Ok(acl) => acl,
        Err(error) => return report(PICK, Outcome::Inconclusive(format!("libascendcl.so: {error}"))),
    };
    let scratch = tempfile::tempdir().expect("scratch directory");
    let device = device_id();
    match observe_recipes(&process_environment(), scratch.path(), &|object| load_kernel(acl, device, object)) {
        Ok(observation) => report(PICK, print_recipes(&observation, "")),
        Err(error) => report(PICK, Outcome::Inconclusive(format!("no toolkit to build with: {error}"))),
    }
}

// ---- where the compilers are: what each compiler directory of the real toolkit holds ------------------------------

/// The files of a compiler directory the build's rule looks for.
const COMPILER_FILES: [&str; 3] = ["bisheng", "ccec", "ld.lld"];
/// The directory whose holding a compiler is inferred (HCCL keeps `ccec` there; the rule looks for `bisheng` there
/// too).
const TOOLS_DIR: &str = "tools/ccec_compiler/bin";

#[derive(Debug)]
struct CompilerDir {
    /// Relative to the root, as `toolkit::compiler_dirs` names it.
    relative: String,
    /// `None`: absent; else which of [`COMPILER_FILES`] it holds.
    holds: Option<Vec<&'static str>>,
}

#[derive(Debug)]
struct LocationsObservation {
    root: PathBuf,
    dirs: Vec<CompilerDir>,
    /// What `find_toolkit` takes: the compiler, or its error.
    found: Result<PathBuf, String>,
}

fn judge_locations(o: &LocationsObservation) -> Outcome {
    let dirs: Vec<String> = o
        .dirs
        .iter()
        .map(|dir| match &dir.holds {
            None => format!("{} absent", dir.relative),
            Some(holds) => format!("{} holds {holds:?}", dir.relative),
        })
        .collect();
    let found = match &o.found {
        Ok(compiler) => format!("find_toolkit takes {}", compiler.display()),
        Err(error) => format!("find_toolkit: {error}"),
    };
    let seen = format!("root {}: {}; {found}", o.root.display(), dirs.join(", "));
    match o.dirs.iter().find(|dir| dir.relative == TOOLS_DIR).and_then(|dir| dir.holds.as_ref()) {
        None => Outcome::Inconclusive(format!("{seen}: no {TOOLS_DIR} to judge")),
        Some(holds) => {
            let compiler = holds.iter().any(|file| *file == "bisheng" || *file == "ccec");
            if compiler && holds.contains(&"ld.lld") {
                Outcome::Confirmed(seen)
            } else {
                Outcome::Refuted(format!(
                    "{seen}: {TOOLS_DIR} exists but holds no compiler with ld.lld next to it, which the rule looks \
                     for there"
                ))
            }
        }
    }
}

fn observe_locations(root: &Path, env: &Environment) -> LocationsObservation {
    let dirs = toolkit::compiler_dirs(&env.arch)
        .into_iter()
        .map(|relative| {
            let dir = root.join(&relative);
            let holds = dir
                .is_dir()
                .then(|| COMPILER_FILES.into_iter().filter(|file| dir.join(file).is_file()).collect::<Vec<_>>());
            CompilerDir { relative, holds }
        })
        .collect();
    let found = toolkit::find_toolkit(env).map(|toolkit| toolkit.compiler);
    LocationsObservation { root: root.to_path_buf(), dirs, found }
}

#[test]
#[ignore = "hardware: needs the CANN toolkit of an Ascend machine and AIV_NPU_TESTS=1 (docs/HARDWARE_TESTING.md)"]
fn compiler_locations_match_the_build_rule() {
    if !selected() {
        return;
    }
    let env = process_environment();
    // The root the build takes: the first root variable set, else the root of a compiler on PATH.
    let named = env.roots.iter().flatten().find(|root| !root.is_empty()).map(PathBuf::from);
    let Some(root) = named.or_else(|| toolkit::find_toolkit(&env).ok().map(|toolkit| toolkit.root)) else {
        return report(
            "tools/ccec_compiler/bin holds a compiler and ld.lld",
            Outcome::Inconclusive("no toolkit root: none of the root variables is set and no compiler on PATH".into()),
        );
    };
    report("tools/ccec_compiler/bin holds a compiler and ld.lld", judge_locations(&observe_locations(&root, &env)));
}

// ---- the same observations on a fake toolkit and the twin runtime, in the suite --------------------------------

/// What the stand-in compilers write as their output.
#[derive(Clone, Copy)]
enum StandIn {
    /// A copy of the twin runtime's kernel object (built by this crate's build script).
    TwinObject,
    /// Bytes no runtime loads.
    Garbage,
}

fn write_script(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("script directory");
    std::fs::write(path, format!("#!/bin/sh\n{body}")).expect("script written");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("script made executable");
}

/// Shell code setting `out` to the argument after `-o`, refusing (exit 3) an output outside `scratch`.
fn output_within(scratch: &Path) -> String {
    format!(
        "out=\nprevious=\nfor argument in \"$@\"; do\n  if [ \"$previous\" = -o ]; then out=$argument; fi\n  \
         previous=$argument\ndone\ncase \"$out\" in\n  '{}'/*) ;;\n  *) echo \"stand-in: -o '$out' is outside \
         the test's directory\" >&2; exit 3 ;;\nesac\n",
        scratch.display()
    )
}

/// A fake toolkit under `root`: `bisheng` (its `-v` dated 2026-04-02, so the rule picks `-xasc`) with `ld.lld` in
/// `compiler/ccec_compiler/bin`, `ccec` with `ld.lld` in `tools/ccec_compiler/bin`, and a `kernel_operator.h`. The
/// compilers write `what` to their `-o` output, the linkers copy their input object there; every output must lie
/// under `scratch`.
fn fake_toolkit(root: &Path, scratch: &Path, what: StandIn) {
    let twin = env!("AIV_TWIN_KERNEL_OBJECT");
    let write = match what {
        StandIn::TwinObject => format!("cp '{twin}' \"$out\"\n"),
        StandIn::Garbage => "printf 'stand-in output, not a kernel object\\n' > \"$out\"\n".to_owned(),
    };
    let compiler = format!(
        "if [ \"$#\" = 1 ] && [ \"$1\" = -v ]; then echo 'BiSheng stand-in (build 2026-04-02)'; exit 0; fi\n{}{write}",
        output_within(scratch)
    );
    let linker = format!(
        "{}input=\nfor argument in \"$@\"; do case \"$argument\" in *.device.o) input=$argument ;; esac; done\n\
         cp \"$input\" \"$out\"\n",
        output_within(scratch)
    );
    for (dir, name) in [("compiler/ccec_compiler/bin", "bisheng"), ("tools/ccec_compiler/bin", "ccec")] {
        write_script(&root.join(dir).join(name), &compiler);
        write_script(&root.join(dir).join("ld.lld"), &linker);
    }
    let headers = root.join("compiler/tikcpp/tikcfw");
    std::fs::create_dir_all(&headers).expect("include directory");
    std::fs::write(headers.join("kernel_operator.h"), "// stand-in\n").expect("stand-in header");
}

fn fake_environment(root: &Path) -> Environment {
    Environment {
        roots: [Some(root.as_os_str().to_owned()), None, None],
        path: None,
        arch: std::env::consts::ARCH.to_owned(),
    }
}

/// Serialises the tests that write stand-in scripts: a script one thread is writing can be held open by a process
/// another thread is starting, which makes running it fail ("text file busy").
static SCRIPTS: Mutex<()> = Mutex::new(());

fn scripts() -> MutexGuard<'static, ()> {
    SCRIPTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The fake toolkit's recipes, each object loaded on the in-process twin runtime's ACL; checks that every object
/// was written under `out` only.
fn observe_fake(what: StandIn) -> (tempfile::TempDir, RecipesObservation) {
    let _serial = scripts();
    let scratch = tempfile::tempdir().expect("scratch directory");
    let (root, out) = (scratch.path().join("root"), scratch.path().join("out"));
    fake_toolkit(&root, &out, what);
    let observation =
        observe_recipes(&fake_environment(&root), &out, &|object| load_kernel(cann_twin::acl_api(), 0, object))
            .expect("the fake toolkit is found");
    for run in &observation.branches {
        if let BranchRun::Built { object, .. } = &run.run {
            assert!(object.starts_with(&out), "{} is outside the test's directory", object.display());
        }
    }
    (scratch, observation)
}

#[test]
fn every_recipe_of_a_fake_toolkit_builds_a_kernel_the_twin_runtime_loads() {
    let (_scratch, observation) = observe_fake(StandIn::TwinObject);
    let names: Vec<Branch> = observation.branches.iter().map(|run| run.branch).collect();
    assert_eq!(names, [Branch::BishengAsc, Branch::BishengCce, Branch::Ccec]);
    for run in &observation.branches {
        let outcome = judge_branch(run);
        println!("{}", line(&format!("{} (fake toolkit, twin runtime)", run.branch.name()), &outcome));
        assert!(matches!(outcome, Outcome::Confirmed(_)), "{outcome:?}");
    }
    assert_eq!(observation.chosen.0, Branch::BishengAsc, "{:?}", observation.chosen);
    report("the picked recipe (fake toolkit, twin runtime)", judge_pick(&observation));
}

#[test]
fn a_stand_in_writing_garbage_comes_out_refuted_naming_the_acl_error() {
    let (_scratch, observation) = observe_fake(StandIn::Garbage);
    for run in &observation.branches {
        let outcome = judge_branch(run);
        println!("{}", line(&format!("{} (garbage object, twin runtime)", run.branch.name()), &outcome));
        assert!(
            matches!(&outcome, Outcome::Refuted(what)
                if what.contains("aclrtBinaryLoadFromData failed") && what.contains("ACL_ERROR_INVALID_PARAM")),
            "{outcome:?}"
        );
    }
    let pick = judge_pick(&observation);
    assert!(matches!(&pick, Outcome::Refuted(what) if what.contains("recipes that did: none")), "{pick:?}");
}

#[test]
fn compiler_locations_of_a_fake_toolkit() {
    let _serial = scripts();
    let scratch = tempfile::tempdir().expect("scratch directory");
    let root = scratch.path().join("root");
    fake_toolkit(&root, &scratch.path().join("out"), StandIn::Garbage);
    let env = fake_environment(&root);
    let observation = observe_locations(&root, &env);
    assert_eq!(observation.found.as_ref().ok(), Some(&root.join("compiler/ccec_compiler/bin/bisheng")));
    report("tools/ccec_compiler/bin holds a compiler and ld.lld (fake toolkit)", judge_locations(&observation));
    std::fs::remove_file(root.join("tools/ccec_compiler/bin/ccec")).expect("remove the stand-in ccec");
    let outcome = judge_locations(&observe_locations(&root, &env));
    assert!(matches!(&outcome, Outcome::Refuted(what) if what.contains("holds [\"ld.lld\"]")), "{outcome:?}");
    std::fs::remove_dir_all(root.join("tools")).expect("remove tools/");
    let outcome = judge_locations(&observe_locations(&root, &env));
    assert!(matches!(&outcome, Outcome::Inconclusive(_)), "{outcome:?}");
}

/// Every judge comes out REFUTED on an observation that breaks its assumption, and CONFIRMED on one that keeps it.
#[test]
fn each_judge_can_come_out_refuted() {
    let refuted = |outcome: Outcome| assert!(matches!(outcome, Outcome::Refuted(_)), "{outcome:?}");
    let confirmed = |outcome: Outcome| assert!(matches!(outcome, Outcome::Confirmed(_)), "{outcome:?}");
    let branch = |branch, run| BranchObservation { branch, compiler: Some("/t/bisheng".into()), run };
    let built = |load| BranchRun::Built { object: "/o/aiv_transfer_kernel.o".into(), bytes: 4096, load };
    let failed = || BranchRun::StepFailed { step: "compile", status: "exit status: 1".into(), stderr: "error".into() };
    refuted(judge_branch(&branch(Branch::BishengAsc, failed())));
    refuted(judge_branch(&branch(Branch::BishengAsc, BranchRun::NoObject("/o/x.o".into()))));
    refuted(judge_branch(&branch(Branch::BishengAsc, built(Err("aclrtBinaryLoadFromData failed: 100000".into())))));
    confirmed(judge_branch(&branch(Branch::BishengAsc, built(Ok(())))));
    assert!(matches!(
        judge_branch(&branch(Branch::Ccec, BranchRun::NoCompiler("no ccec".into()))),
        Outcome::Inconclusive(_)
    ));
    let recipes = |picked, asc, cce| RecipesObservation {
        toolkit: "t".into(),
        chosen: (picked, "why".into()),
        branches: vec![branch(Branch::BishengAsc, asc), branch(Branch::BishengCce, cce)],
    };
    refuted(judge_pick(&recipes(Branch::BishengAsc, failed(), built(Ok(())))));
    confirmed(judge_pick(&recipes(Branch::BishengCce, failed(), built(Ok(())))));
    assert!(matches!(judge_pick(&recipes(Branch::Ccec, failed(), failed())), Outcome::Inconclusive(_)));
    let dirs = |tools: Option<Vec<&'static str>>| LocationsObservation {
        root: "/r".into(),
        dirs: vec![
            CompilerDir { relative: "compiler/ccec_compiler/bin".into(), holds: Some(vec!["bisheng", "ld.lld"]) },
            CompilerDir { relative: TOOLS_DIR.into(), holds: tools },
        ],
        found: Ok("/r/compiler/ccec_compiler/bin/bisheng".into()),
    };
    refuted(judge_locations(&dirs(Some(vec!["ld.lld"]))));
    refuted(judge_locations(&dirs(Some(vec!["ccec"]))));
    confirmed(judge_locations(&dirs(Some(vec!["ccec", "ld.lld"]))));
    assert!(matches!(judge_locations(&dirs(None)), Outcome::Inconclusive(_)));
}
