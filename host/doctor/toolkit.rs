//! The CANN toolkit's side of readiness: its root and version, the AscendC compiler and its include directories.
//!
//! The compiler is found by the rule of `shmem-bindings/ascendc-build` (`find_cann`, which the build script runs and
//! which prints cargo directives, so it is mirrored here rather than called): the roots `AIV_CANN_HOME`,
//! `ASCEND_HOME_PATH`, `ASCEND_TOOLKIT_HOME` in turn, each with `compiler/ccec_compiler/bin/bisheng`,
//! `tools/ccec_compiler/bin/bisheng`, `tools/ccec_compiler/bin/ccec`, `compiler/ccec_compiler/bin/ccec`; then
//! `bisheng`, `ccec` on `PATH`, whose root is derived from `<root>/compiler/ccec_compiler/bin/<name>`. The include
//! directories are the ones `build_npu` passes. The toolkit's version is the `version=` line of
//! `<root>/<arch>-linux/ascend_toolkit_install.info` (`hicann/hccl` `docs/en/build/build.md`; `hicann/shmem`
//! `src/host/utils/under_api/dl_comm_def.cpp` reads the same file under `ASCEND_HOME_PATH`), else
//! `<root>/version.cfg` (*inferred* fallback, as `hicann/shmem` `scripts/preinstall_check.sh` does).

use std::path::{Path, PathBuf};

use super::bounded::{self, Outcome};
use super::inputs::{key_value, Inputs};
use super::item::Item;

/// Candidates below a toolkit root, in `find_cann`'s order.
const COMPILER_PATHS: [&str; 4] = [
    "compiler/ccec_compiler/bin/bisheng",
    "tools/ccec_compiler/bin/bisheng",
    "tools/ccec_compiler/bin/ccec",
    "compiler/ccec_compiler/bin/ccec",
];
/// The include directories `ascendc-build`'s `build_npu` passes, below the toolkit root.
pub const INCLUDE_DIRS: [&str; 4] =
    ["compiler/tikcpp", "compiler/tikcpp/tikcfw", "compiler/tikcpp/tikcfw/impl", "compiler/tikcpp/tikcfw/interface"];
/// Architecture directories that may hold `ascend_toolkit_install.info`.
const ARCH_DIRS: [&str; 3] = ["aarch64-linux", "x86_64-linux", "arm64-linux"];

/// A compiler found, with the toolkit root it implies.
#[derive(Clone, Debug)]
pub struct Compiler {
    /// The program.
    pub path: PathBuf,
    /// The toolkit root: the variable's directory, or derived from a `PATH` hit.
    pub root: Option<PathBuf>,
    /// Where it came from.
    pub origin: String,
}

fn roots(inputs: &Inputs) -> Vec<(&'static str, &PathBuf)> {
    [
        ("AIV_CANN_HOME", &inputs.cann_home),
        ("ASCEND_HOME_PATH", &inputs.ascend_home),
        ("ASCEND_TOOLKIT_HOME", &inputs.toolkit_home),
    ]
    .into_iter()
    .filter_map(|(name, root)| Some((name, root.as_ref()?)))
    .collect()
}

/// The toolkit root of a compiler at `<root>/compiler/ccec_compiler/bin/<name>` (or `tools/...`).
fn root_of(compiler: &Path) -> Option<PathBuf> {
    let bin = compiler.parent()?;
    let ccec = bin.parent()?;
    let parent = ccec.parent()?;
    let shape = bin.file_name()? == "bin"
        && ccec.file_name()? == "ccec_compiler"
        && matches!(parent.file_name()?.to_str()?, "compiler" | "tools");
    shape.then(|| parent.parent().map(Path::to_path_buf)).flatten()
}

/// Finds the AscendC compiler; `Err` lists every place tried.
pub fn find_compiler(inputs: &Inputs) -> Result<Compiler, Vec<String>> {
    let mut tried = Vec::new();
    for (name, root) in roots(inputs) {
        for relative in COMPILER_PATHS {
            let candidate = root.join(relative);
            if candidate.is_file() {
                return Ok(Compiler { path: candidate, root: Some(root.clone()), origin: name.to_string() });
            }
            tried.push(candidate.display().to_string());
        }
    }
    for name in ["bisheng", "ccec"] {
        if let Some(path) = inputs.on_path(name) {
            let root = root_of(&path);
            return Ok(Compiler { path, root, origin: "PATH".into() });
        }
    }
    tried.push(inputs.path_text("bisheng, ccec"));
    Err(tried)
}

/// The toolkit root: `ASCEND_HOME_PATH`, else `ASCEND_TOOLKIT_HOME`, else the root of a compiler on `PATH`.
fn toolkit_root(inputs: &Inputs) -> Result<(PathBuf, String), Vec<String>> {
    let mut tried = Vec::new();
    for (name, root) in [("ASCEND_HOME_PATH", &inputs.ascend_home), ("ASCEND_TOOLKIT_HOME", &inputs.toolkit_home)] {
        match root {
            Some(root) if root.is_dir() => return Ok((root.clone(), name.to_string())),
            Some(root) => tried.push(format!("{name}={} (not a directory)", root.display())),
            None => tried.push(format!("{name} (not set)")),
        }
    }
    for name in ["bisheng", "ccec"] {
        if let Some(root) = inputs.on_path(name).as_deref().and_then(root_of) {
            return Ok((root, format!("the {name} on PATH")));
        }
    }
    tried.push("the root of a bisheng or ccec on PATH (<root>/compiler/ccec_compiler/bin/)".into());
    Err(tried)
}

/// `CANN toolkit`: its root and version; `runtime_version` is what the loaded runtime's `aclsysGetCANNVersion` said.
pub fn cann_version(inputs: &Inputs, runtime_version: Option<&str>) -> Item {
    let runtime = runtime_version.map(|version| format!("; the loaded runtime says {version}")).unwrap_or_default();
    let fix = "source <CANN install root>/set_env.sh (sets ASCEND_HOME_PATH), or install the CANN toolkit (>= 8)";
    let (root, origin) = match toolkit_root(inputs) {
        Ok(found) => found,
        Err(tried) => {
            let found = runtime_version.map(|version| format!("no toolkit root; the loaded runtime says {version}"));
            return Item::missing("CANN toolkit", found, tried.join(", "), fix);
        }
    };
    let mut files: Vec<PathBuf> =
        ARCH_DIRS.iter().map(|arch| root.join(arch).join("ascend_toolkit_install.info")).collect();
    files.push(root.join("version.cfg"));
    let looked_for = format!(
        "root from {origin}; version in {}",
        files.iter().map(|file| file.display().to_string()).collect::<Vec<_>>().join(", ")
    );
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        let version = key_value(&text, "version").or_else(|| {
            text.lines().find(|line| line.to_ascii_lowercase().contains("version") && line.contains('=')).map(|line| {
                line.split_once('=')
                    .map_or("", |(_, value)| value)
                    .trim()
                    .trim_matches(|c| c == '[' || c == ']')
                    .to_string()
            })
        });
        if let Some(version) = version.filter(|version| !version.is_empty()) {
            return Item::ok("CANN toolkit", format!("{version} ({}){runtime}", file.display()), looked_for);
        }
    }
    Item::missing(
        "CANN toolkit",
        Some(format!("root {} without a version file{runtime}", root.display())),
        looked_for,
        "reinstall the CANN toolkit: its <arch>-linux/ascend_toolkit_install.info is missing",
    )
}

/// `AscendC compiler`: found by the build's rule, `--version` runnable within the bound.
pub fn compiler(inputs: &Inputs) -> Item {
    let fix = "install the CANN toolkit (>= 8, with bisheng) and source its set_env.sh, or set AIV_CANN_HOME";
    let compiler = match find_compiler(inputs) {
        Ok(compiler) => compiler,
        Err(tried) => return Item::missing("AscendC compiler", None, tried.join(", "), fix),
    };
    let looked_for = format!("found through {}", compiler.origin);
    let shown = compiler.path.display();
    match bounded::run(&compiler.path, &["--version"], inputs.command_timeout, 1) {
        Outcome::Exited { code: Some(0), lines } => Item::ok(
            "AscendC compiler",
            format!("{shown}: {}", lines.first().map_or("--version printed nothing", String::as_str)),
            looked_for,
        ),
        Outcome::Exited { code, lines } => Item::missing(
            "AscendC compiler",
            Some(format!("{shown}: --version exited with {code:?}: {}", lines.join(" | "))),
            looked_for,
            fix,
        ),
        Outcome::TimedOut { .. } => Item::missing(
            "AscendC compiler",
            Some(format!(
                "{shown}: --version did not finish within {} ms and was killed",
                inputs.command_timeout.as_millis()
            )),
            looked_for,
            fix,
        ),
        Outcome::NotStarted(error) => {
            Item::missing("AscendC compiler", Some(format!("{shown}: could not start: {error}")), looked_for, fix)
        }
    }
}

/// `AscendC headers`: the include directories below the compiler's toolkit root, and `kernel_operator.h` in one.
pub fn headers(inputs: &Inputs) -> Item {
    let fix = "install the CANN toolkit with its AscendC headers (compiler/tikcpp) and source its set_env.sh";
    let root = match (find_compiler(inputs).ok().and_then(|compiler| compiler.root), toolkit_root(inputs)) {
        (Some(root), _) | (None, Ok((root, _))) => root,
        (None, Err(tried)) => return Item::missing("AscendC headers", None, tried.join(", "), fix),
    };
    let dirs: Vec<PathBuf> = INCLUDE_DIRS.iter().map(|dir| root.join(dir)).collect();
    let looked_for = format!(
        "{} and kernel_operator.h in one of them",
        dirs.iter().map(|dir| dir.display().to_string()).collect::<Vec<_>>().join(", ")
    );
    let absent: Vec<String> = dirs.iter().filter(|dir| !dir.is_dir()).map(|dir| dir.display().to_string()).collect();
    let header = dirs.iter().map(|dir| dir.join("kernel_operator.h")).find(|file| file.is_file());
    match (absent.is_empty(), header) {
        (true, Some(header)) => Item::ok("AscendC headers", format!("{}", header.display()), looked_for),
        (_, header) => {
            let mut found = Vec::new();
            if !absent.is_empty() {
                found.push(format!("absent: {}", absent.join(", ")));
            }
            if header.is_none() {
                found.push("no kernel_operator.h".into());
            }
            Item::missing("AscendC headers", Some(found.join("; ")), looked_for, fix)
        }
    }
}
