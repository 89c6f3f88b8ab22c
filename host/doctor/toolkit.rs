//! The CANN toolkit's side of readiness: its root and version, the AscendC compiler and its include directories.
//!
//! The toolkit, its compiler and its include directories are found by the build's own rule,
//! `ascendc_build::toolkit` (`find_toolkit`, `include_dirs`): the root from the first of `AIV_CANN_HOME`,
//! `ASCEND_HOME_PATH`, `ASCEND_TOOLKIT_HOME` that is set, else from the location of a `bisheng` or `ccec` on `PATH`
//! (`<root>/{compiler,<arch>-linux,tools}/ccec_compiler/bin/`). The toolkit's version is the `version=` line of
//! `<root>/<arch>-linux/ascend_toolkit_install.info`, else `<root>/version.cfg` (an *inferred* fallback); the facts and
//! their public sources are in docs/hardware.md section 8.

use std::path::PathBuf;

use ascendc_build::toolkit::{self as rule, Environment, Toolkit};

use crate::bounded::Outcome;

use super::inputs::{key_value, Inputs};
use super::item::Item;

/// Architecture directories that may hold `ascend_toolkit_install.info`.
const ARCH_DIRS: [&str; 3] = ["aarch64-linux", "x86_64-linux", "arm64-linux"];

/// The build rule's view of the doctor's inputs (the same variables and `PATH`).
fn environment(inputs: &Inputs) -> Environment {
    let dir = |dir: &Option<PathBuf>| dir.as_ref().map(|dir| dir.clone().into_os_string());
    Environment::from_lookup(|name| match name {
        "AIV_CANN_HOME" => dir(&inputs.cann_home),
        "ASCEND_HOME_PATH" => dir(&inputs.ascend_home),
        "ASCEND_TOOLKIT_HOME" => dir(&inputs.toolkit_home),
        "PATH" => std::env::join_paths(&inputs.path).ok(),
        _ => None,
    })
}

/// Finds the toolkit and its compiler by the build's rule; `Err` is the rule's message (every place looked at).
pub fn find_compiler(inputs: &Inputs) -> Result<Toolkit, String> {
    rule::find_toolkit(&environment(inputs))
}

/// The toolkit root for its version: the build's rule when it finds a compiler, else `ASCEND_HOME_PATH` or
/// `ASCEND_TOOLKIT_HOME` alone (a runtime-only install has a version file and no compiler).
fn toolkit_root(inputs: &Inputs) -> Result<(PathBuf, String), Vec<String>> {
    if let Ok(toolkit) = find_compiler(inputs) {
        let origin = match toolkit.source.as_str() {
            "PATH" => format!("the {} on PATH", toolkit.kind.file_name()),
            variable => variable.to_owned(),
        };
        return Ok((toolkit.root, origin));
    }
    let mut tried = Vec::new();
    for (name, root) in [("ASCEND_HOME_PATH", &inputs.ascend_home), ("ASCEND_TOOLKIT_HOME", &inputs.toolkit_home)] {
        match root {
            Some(root) if root.is_dir() => return Ok((root.clone(), format!("${name}"))),
            Some(root) => tried.push(format!("{name}={} (not a directory)", root.display())),
            None => tried.push(format!("{name} (not set)")),
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
    let toolkit = match find_compiler(inputs) {
        Ok(toolkit) => toolkit,
        Err(error) => return Item::missing("AscendC compiler", None, error, fix),
    };
    let looked_for = format!("the build's rule: toolkit {} from {}", toolkit.root.display(), toolkit.source);
    let shown = toolkit.compiler.display();
    match inputs.run(&toolkit.compiler, &["--version"]) {
        Outcome::Exited { status, output } if status.code() == Some(0) => Item::ok(
            "AscendC compiler",
            format!("{shown}: {}", output.first_lines(1).first().map_or("--version printed nothing", String::as_str)),
            looked_for,
        ),
        Outcome::Exited { status, output } => Item::missing(
            "AscendC compiler",
            Some(format!("{shown}: --version exited with {:?}: {}", status.code(), output.first_lines(1).join(" | "))),
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

/// `AscendC headers`: the include directories the build passes (those of its list that exist below the compiler's
/// toolkit root), `kernel_operator.h` in one of them.
pub fn headers(inputs: &Inputs) -> Item {
    let fix = "install the CANN toolkit with its AscendC headers (compiler/tikcpp) and source its set_env.sh";
    let toolkit = match find_compiler(inputs) {
        Ok(toolkit) => toolkit,
        Err(error) => return Item::missing("AscendC headers", None, error, fix),
    };
    let arch = std::env::consts::ARCH;
    let looked_for = format!(
        "kernel_operator.h in the include directories the build passes, below {} ({} candidates)",
        toolkit.root.display(),
        rule::include_candidates(&toolkit.root, arch).len()
    );
    match rule::include_dirs(&toolkit, arch) {
        Ok(dirs) => {
            let header = dirs.iter().map(|dir| dir.join("kernel_operator.h")).find(|file| file.is_file());
            let shown = header.map_or_else(|| "kernel_operator.h".to_owned(), |file| file.display().to_string());
            Item::ok("AscendC headers", format!("{shown} ({} include directories)", dirs.len()), looked_for)
        }
        Err(error) => Item::missing("AscendC headers", Some(error), looked_for, fix),
    }
}
