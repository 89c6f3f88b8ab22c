//! Finding the CANN toolkit: its root, the AscendC compiler in it and the AscendC include directories.
//!
//! Discovery reads an [`Environment`] snapshot, never the process environment directly, so that it is a pure
//! function of its input (the build script takes the snapshot once; tests build their own).
//!
//! The root comes from the first of `AIV_CANN_HOME` (this project's explicit override), `ASCEND_HOME_PATH` (what
//! CANN's `set_env.sh` exports and what `hicann/shmem` `CMakeLists.txt` reads) and `ASCEND_TOOLKIT_HOME` that is set
//! and not empty; that variable decides, a wrong value is an error naming it (never a silent fall-back to another
//! toolkit). With none set, a `bisheng` or `ccec` on `PATH` gives the root from its own location.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// `AIV_CANN_HOME`: the CANN toolkit root, named explicitly (checked before `ASCEND_HOME_PATH`).
pub const CANN_HOME_ENV: &str = "AIV_CANN_HOME";
/// The root variables, in the order they are consulted.
pub const ROOT_VARIABLES: [&str; 3] = [CANN_HOME_ENV, "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"];

/// What discovery reads from the environment.
#[derive(Clone, Debug, Default)]
pub struct Environment {
    /// The values of [`ROOT_VARIABLES`], in that order (`None`: unset).
    pub roots: [Option<OsString>; 3],
    /// `PATH`.
    pub path: Option<OsString>,
    /// The machine's processor as CANN names its per-architecture directories (`x86_64`, `aarch64`):
    /// `<root>/<arch>-linux/...`.
    pub arch: String,
}

impl Environment {
    /// The build script's environment, each variable announced to cargo with `cargo:rerun-if-env-changed`. The
    /// architecture is the one this build script runs on, where the toolkit is installed.
    pub fn from_process() -> Self {
        Environment::from_lookup(|name| {
            println!("cargo:rerun-if-env-changed={name}");
            std::env::var_os(name)
        })
    }

    /// The variables as `lookup` answers them (no cargo directive printed), on this machine's processor: for
    /// callers outside a build script, such as `aiv doctor` and the hardware tests.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Self {
        Environment {
            roots: ROOT_VARIABLES.map(&lookup),
            path: lookup("PATH"),
            arch: std::env::consts::ARCH.to_owned(),
        }
    }
}

/// Which AscendC compiler driver was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompilerKind {
    /// `bisheng`: the driver whose mode (`-xasc` or `-xcce`) depends on its build date.
    Bisheng,
    /// `ccec`: the older driver, used as `hicann/hccl`'s custom-op example uses it.
    Ccec,
}

impl CompilerKind {
    /// The executable's file name.
    pub fn file_name(self) -> &'static str {
        match self {
            CompilerKind::Bisheng => "bisheng",
            CompilerKind::Ccec => "ccec",
        }
    }
}

/// A CANN toolkit found by [`find_toolkit`].
#[derive(Clone, Debug)]
pub struct Toolkit {
    /// The toolkit root (what `ASCEND_HOME_PATH` names).
    pub root: PathBuf,
    /// The compiler to run.
    pub compiler: PathBuf,
    /// Which driver it is.
    pub kind: CompilerKind,
    /// How the root was found: a variable's name, or `PATH` (the compiler found there).
    pub source: String,
}

impl Toolkit {
    /// `ld.lld`, which the vendor's recipes take from the compiler's own directory.
    pub fn linker(&self) -> PathBuf {
        self.compiler.with_file_name("ld.lld")
    }
}

/// The compiler directories under a root, relative to it, in the order they are searched:
/// `compiler/ccec_compiler/bin` (`mirror-cann/asc-devkit` `cmake/asc/aicpu_modules/CMakeDetermineAICPUCompiler.cmake`),
/// `<arch>-linux/ccec_compiler/bin` (the same file, and `cmake/asc/asc_modules/CMakeDetermineASCCompiler.cmake`),
/// `tools/ccec_compiler/bin` (`hicann/hccl` `examples/05_custom_ops_allgather/op_kernel/CMakeLists.txt`).
pub fn compiler_dirs(arch: &str) -> [String; 3] {
    [
        "compiler/ccec_compiler/bin".to_owned(),
        format!("{arch}-linux/ccec_compiler/bin"),
        "tools/ccec_compiler/bin".to_owned(),
    ]
}

/// Finds the toolkit as the module documentation describes. Errors name the variable or file that was wrong and
/// every place looked at.
pub fn find_toolkit(env: &Environment) -> Result<Toolkit, String> {
    for (name, value) in ROOT_VARIABLES.iter().zip(&env.roots) {
        let Some(value) = value.as_ref().filter(|value| !value.is_empty()) else { continue };
        let root = PathBuf::from(value);
        if !root.is_dir() {
            return Err(format!("${name}={}: no such directory (it must name the CANN toolkit root)", root.display()));
        }
        return compiler_under(&root, &env.arch)
            .map(|(compiler, kind)| Toolkit { root: root.clone(), compiler, kind, source: format!("${name}") })
            .map_err(|tried| {
                format!(
                    "${name}={}: no AscendC compiler in this toolkit root; looked for {}",
                    root.display(),
                    tried.join(", ")
                )
            });
    }
    let Some(path) = env.path.as_ref() else {
        return Err(no_toolkit_message("PATH is unset"));
    };
    for dir in std::env::split_paths(path) {
        for kind in [CompilerKind::Bisheng, CompilerKind::Ccec] {
            let candidate = dir.join(kind.file_name());
            if !candidate.is_file() {
                continue;
            }
            let Some(root) = root_of_compiler(&candidate, &env.arch) else {
                return Err(format!(
                    "{} (found on PATH) is not inside a CANN toolkit tree: expected it in {}; set \
                     ASCEND_HOME_PATH to the toolkit root (`source <CANN install root>/set_env.sh` sets it) or \
                     AIV_CANN_HOME",
                    candidate.display(),
                    compiler_dirs(&env.arch).map(|dir| format!("<root>/{dir}/")).join(", ")
                ));
            };
            return Ok(Toolkit { root, compiler: candidate, kind, source: "PATH".to_owned() });
        }
    }
    Err(no_toolkit_message("neither bisheng nor ccec is on PATH"))
}

fn no_toolkit_message(path: &str) -> String {
    format!(
        "no CANN toolkit: $AIV_CANN_HOME, $ASCEND_HOME_PATH and $ASCEND_TOOLKIT_HOME are unset and {path}; \
         `source <CANN install root>/set_env.sh` sets ASCEND_HOME_PATH"
    )
}

/// Every place a compiler is looked for under `root`, in the order of the search: `bisheng` in each compiler
/// directory, then `ccec` in each (HCCL's directory first for `ccec`).
fn compiler_candidates(root: &Path, arch: &str) -> Vec<(PathBuf, CompilerKind)> {
    let [compiler, per_arch, tools] = compiler_dirs(arch);
    [
        (&compiler, CompilerKind::Bisheng),
        (&per_arch, CompilerKind::Bisheng),
        (&tools, CompilerKind::Bisheng),
        (&tools, CompilerKind::Ccec),
        (&compiler, CompilerKind::Ccec),
        (&per_arch, CompilerKind::Ccec),
    ]
    .into_iter()
    .map(|(dir, kind)| (root.join(dir).join(kind.file_name()), kind))
    .collect()
}

/// Every compiler under `root`, in the order of the search: the first is the one [`find_toolkit`] takes for that
/// root, the others are what else the toolkit holds (e.g. a `ccec` next to a `bisheng`).
pub fn compilers_under(root: &Path, arch: &str) -> Vec<(PathBuf, CompilerKind)> {
    compiler_candidates(root, arch).into_iter().filter(|(candidate, _)| candidate.is_file()).collect()
}

/// The first compiler under `root`, in the order of [`compiler_candidates`]. On failure, every path tried.
fn compiler_under(root: &Path, arch: &str) -> Result<(PathBuf, CompilerKind), Vec<String>> {
    let candidates = compiler_candidates(root, arch);
    match candidates.iter().find(|(candidate, _)| candidate.is_file()) {
        Some(found) => Ok(found.clone()),
        None => Err(candidates.iter().map(|(candidate, _)| candidate.display().to_string()).collect()),
    }
}

/// The root a compiler at `<root>/{compiler,tools,<arch>-linux}/ccec_compiler/bin/<name>` belongs to: from the path as
/// found, else from the path with its symbolic links resolved.
pub fn root_of_compiler(compiler: &Path, arch: &str) -> Option<PathBuf> {
    let from = |path: &Path| {
        let bin = path.parent()?;
        let ccec_compiler = bin.parent()?;
        let holder = ccec_compiler.parent()?;
        let holder_name = holder.file_name()?.to_str()?;
        let recognised = bin.file_name()? == "bin"
            && ccec_compiler.file_name()? == "ccec_compiler"
            && (holder_name == "compiler" || holder_name == "tools" || holder_name == format!("{arch}-linux"));
        recognised.then(|| holder.parent().map(Path::to_path_buf)).flatten()
    };
    from(compiler).or_else(|| from(&compiler.canonicalize().ok()?))
}

/// The AscendC include directories under `root`, in the order passed to the compiler: `hicann/shmem`
/// `CMakeLists.txt`'s (`compiler/tikcpp` and its `tikcfw`, `tikcfw/impl`, `tikcfw/interface`, then the same under
/// `<arch>-linux/tikcpp`), then those of `hicann/hccl` `examples/05_custom_ops_allgather/op_kernel/CMakeLists.txt`
/// (`tools/tikcpp/tikcfw/lib`, `tools/tikcpp/tikcfw` and its `interface`, `impl`; `tikcpp/tikcfw` and its
/// `interface`, `impl`; its `kernel_operator.h` hints `include/tikcpp/tikcfw` and its `interface`), then
/// `<arch>-linux/asc/include`, where `mirror-cann/asc-devkit` installs `kernel_operator.h`
/// (`impl/basic_api/CMakeLists.txt`; its `tikcpp/tikcfw/kernel_operator.h` is a symbolic link to it) and which its
/// `cmake/asc/legacy_modules/bisheng_intf.cmake` puts on the include path.
pub fn include_candidates(root: &Path, arch: &str) -> Vec<PathBuf> {
    let arch_tikcpp = format!("{arch}-linux/tikcpp");
    let mut relative = vec![
        "compiler/tikcpp".to_owned(),
        "compiler/tikcpp/tikcfw".to_owned(),
        "compiler/tikcpp/tikcfw/impl".to_owned(),
        "compiler/tikcpp/tikcfw/interface".to_owned(),
        arch_tikcpp.clone(),
    ];
    for sub in ["tikcfw", "tikcfw/impl", "tikcfw/interface"] {
        relative.push(format!("{arch_tikcpp}/{sub}"));
    }
    for dir in [
        "tools/tikcpp/tikcfw/lib",
        "tools/tikcpp/tikcfw",
        "tools/tikcpp/tikcfw/interface",
        "tools/tikcpp/tikcfw/impl",
        "tikcpp/tikcfw",
        "tikcpp/tikcfw/interface",
        "tikcpp/tikcfw/impl",
        "include/tikcpp/tikcfw",
        "include/tikcpp/tikcfw/interface",
    ] {
        relative.push(dir.to_owned());
    }
    relative.push(format!("{arch}-linux/asc/include"));
    relative.iter().map(|dir| root.join(dir)).collect()
}

/// The include directories of [`include_candidates`] that exist. An error, naming every directory looked at, when
/// none exists or when none holds `kernel_operator.h` (checked before any compiler runs).
pub fn include_dirs(toolkit: &Toolkit, arch: &str) -> Result<Vec<PathBuf>, String> {
    let candidates = include_candidates(&toolkit.root, arch);
    let present: Vec<PathBuf> = candidates.iter().filter(|dir| dir.is_dir()).cloned().collect();
    let listed = || candidates.iter().map(|dir| dir.display().to_string()).collect::<Vec<_>>().join(", ");
    if present.is_empty() {
        return Err(format!(
            "the CANN toolkit at {} (from {}) has none of the AscendC include directories: {}",
            toolkit.root.display(),
            toolkit.source,
            listed()
        ));
    }
    if !present.iter().any(|dir| dir.join("kernel_operator.h").is_file()) {
        return Err(format!(
            "kernel_operator.h (AscendC) is in none of the include directories of the CANN toolkit at {} (from {}); \
             looked in: {}",
            toolkit.root.display(),
            toolkit.source,
            present.iter().map(|dir| dir.display().to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(present)
}
