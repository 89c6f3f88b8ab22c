//! Finding and opening a vendor shared library at run time, shared by the CANN `-sys` crates.
//!
//! Owns the search order (an explicit override variable, then install-root variables with their library
//! directories, then the plain file name through the dynamic loader's own path) and the error that lists every
//! candidate tried and why it failed. It must not resolve symbols: the generated function tables do that.

use std::ffi::{c_void, OsString};
use std::fmt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Mutex;

/// Where one vendor library may be found.
#[derive(Clone, Copy, Debug)]
pub struct LibrarySpec {
    /// The file name the dynamic loader knows, e.g. `libascendcl.so`.
    pub file_name: &'static str,
    /// An environment variable holding the full path of the library. When it is set, it is the only candidate:
    /// an explicit choice that fails is reported, never silently replaced by another copy.
    pub override_var: &'static str,
    /// Install-root environment variables, each with the directories below it that may hold the library.
    pub roots: &'static [(&'static str, &'static [&'static str])],
}

/// The library directories below `ASCEND_HOME_PATH` of a CANN toolkit or runtime install.
pub const ASCEND_HOME_LIBRARY_DIRS: &[&str] = &["lib64", "runtime/lib64", "aarch64-linux/lib64", "x86_64-linux/lib64"];

/// One place a library was looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// What is handed to the dynamic loader: a full path, or the bare file name for the loader's own search.
    pub path: PathBuf,
    /// Why this candidate was tried, e.g. `AIV_ASCENDCL_LIB` or `ASCEND_HOME_PATH/lib64`.
    pub origin: String,
}

impl LibrarySpec {
    /// The candidates in the order they are tried, reading variables through `env` (the process environment in
    /// [`LibrarySpec::candidates_from_process_env`]; tests pass their own).
    pub fn candidates(&self, env: &dyn Fn(&str) -> Option<OsString>) -> Vec<Candidate> {
        if let Some(path) = env(self.override_var).filter(|value| !value.is_empty()) {
            return vec![Candidate { path: PathBuf::from(path), origin: self.override_var.to_string() }];
        }
        let mut out = Vec::new();
        for (var, dirs) in self.roots {
            if let Some(root) = env(var).filter(|value| !value.is_empty()) {
                let root = PathBuf::from(root);
                for dir in *dirs {
                    out.push(Candidate { path: root.join(dir).join(self.file_name), origin: format!("{var}/{dir}") });
                }
            }
        }
        out.push(Candidate { path: PathBuf::from(self.file_name), origin: "dynamic loader search path".into() });
        out
    }

    /// [`LibrarySpec::candidates`] with the process environment, where a path the program chose with
    /// [`set_program_override`] for this library's override variable takes the variable's place.
    pub fn candidates_from_process_env(&self) -> Vec<Candidate> {
        if let Some(path) = program_override(self.override_var) {
            return vec![Candidate { path, origin: format!("{} (set by the program)", self.override_var) }];
        }
        self.candidates(&|name| std::env::var_os(name))
    }

    /// Opens the first candidate that loads.
    pub fn open(&self, candidates: &[Candidate]) -> Result<(libloading::Library, PathBuf), LoadError> {
        let mut attempts = Vec::new();
        for candidate in candidates {
            let is_bare_name = candidate.path.components().count() == 1 && !candidate.path.is_absolute();
            if !is_bare_name && !candidate.path.exists() {
                attempts.push(Attempt { candidate: candidate.clone(), reason: "no such file".into() });
                continue;
            }
            // SAFETY: loading a shared object runs its initialisers. The candidates are the vendor library named by
            // the user's override or install roots, or the loader's own resolution of its file name; nothing else
            // is opened, and the library stays loaded for as long as the returned handle lives.
            match unsafe { libloading::Library::new(&candidate.path) } {
                Ok(library) => return Ok((library, candidate.path.clone())),
                Err(error) => attempts.push(Attempt { candidate: candidate.clone(), reason: error.to_string() }),
            }
        }
        Err(LoadError::NotFound { library: self.file_name, attempts })
    }
}

/// Paths the program chose for libraries, by override variable name ([`set_program_override`]).
static PROGRAM_OVERRIDES: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());

/// Makes `path` the only candidate of the library whose override variable is `override_var` (e.g.
/// `AIV_ASCENDCL_LIB`), as if the variable were set to it, without touching the process environment (which other
/// threads of a host program may be reading). It takes effect for tables not loaded yet: a table is loaded once per
/// process, on first use, so a caller that needs a particular file checks the loaded table's path afterwards. A
/// later call for the same variable replaces the path.
pub fn set_program_override(override_var: &str, path: PathBuf) {
    let mut overrides = PROGRAM_OVERRIDES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    overrides.retain(|(var, _)| var != override_var);
    overrides.push((override_var.to_string(), path));
}

/// The path [`set_program_override`] chose for `override_var`, if any.
pub fn program_override(override_var: &str) -> Option<PathBuf> {
    let overrides = PROGRAM_OVERRIDES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    overrides.iter().find(|(var, _)| var == override_var).map(|(_, path)| path.clone())
}

/// One failed candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// What was tried.
    pub candidate: Candidate,
    /// Why it failed (the loader's message, or `no such file`).
    pub reason: String,
}

/// A vendor library could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No candidate loaded.
    #[error("{library} could not be loaded; tried {}", render_attempts(.attempts))]
    NotFound {
        /// The library's file name.
        library: &'static str,
        /// Every candidate, in order, with its failure.
        attempts: Vec<Attempt>,
    },
    /// The library loaded but lacks a symbol every supported version exports.
    #[error("{path} has no symbol {symbol}, which every supported CANN version exports: {reason}")]
    MissingRequiredSymbol {
        /// The file that was loaded.
        path: PathBuf,
        /// The missing C function.
        symbol: &'static str,
        /// The loader's message.
        reason: String,
    },
}

fn render_attempts(attempts: &[Attempt]) -> String {
    let mut out = String::new();
    for (index, attempt) in attempts.iter().enumerate() {
        if index > 0 {
            out.push_str("; ");
        }
        out.push_str(&format!(
            "{} (from {}): {}",
            attempt.candidate.path.display(),
            attempt.candidate.origin,
            attempt.reason
        ));
    }
    out
}

/// An optional symbol (one only some CANN versions export) was used but the loaded library lacks it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{symbol} is not exported by {path}: this CANN version does not provide it")]
pub struct MissingSymbol {
    /// The C function or variable.
    pub symbol: &'static str,
    /// The library that was loaded.
    pub path: PathBuf,
}

/// The address of a data symbol (a global variable, not a function) of a loaded library, as `dlsym` returns it.
///
/// Only an address: what lives there, and for how long, is the caller's knowledge. It stays valid while the table
/// that resolved it keeps the library loaded. Reading through it is `unsafe` and up to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataSymbol(NonNull<c_void>);

// SAFETY: a plain address; every access through it is an `unsafe` read the caller justifies.
unsafe impl Send for DataSymbol {}
// SAFETY: as above.
unsafe impl Sync for DataSymbol {}

impl DataSymbol {
    /// The symbol's address, or `None` for a null one.
    pub fn new(address: *mut c_void) -> Option<DataSymbol> {
        NonNull::new(address).map(DataSymbol)
    }

    /// The address of the variable.
    pub fn as_ptr(self) -> *const u8 {
        self.0.as_ptr().cast_const().cast()
    }
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (from {})", self.path.display(), self.origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: LibrarySpec = LibrarySpec {
        file_name: "libexample.so",
        override_var: "EXAMPLE_LIB",
        roots: &[("EXAMPLE_HOME", &["lib64", "runtime/lib64"]), ("OTHER_HOME", &["lib"])],
    };

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |name| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| OsString::from(value))
    }

    #[test]
    fn a_program_override_is_the_only_candidate_and_a_later_one_replaces_it() {
        const OWN: LibrarySpec =
            LibrarySpec { file_name: "libown.so", override_var: "OWN_TEST_LIB", roots: &[("OWN_TEST_HOME", &["lib"])] };
        assert_eq!(OWN.candidates_from_process_env().last().map(|c| c.path.clone()), Some("libown.so".into()));
        set_program_override("OWN_TEST_LIB", "/a/libown.so".into());
        set_program_override("OWN_TEST_LIB", "/b/libown.so".into());
        let found = OWN.candidates_from_process_env();
        assert_eq!(
            found,
            vec![Candidate { path: "/b/libown.so".into(), origin: "OWN_TEST_LIB (set by the program)".into() }]
        );
        assert_eq!(program_override("OTHER_TEST_LIB"), None);
    }

    #[test]
    fn override_is_the_only_candidate() {
        let found = SPEC.candidates(&env_of(&[("EXAMPLE_LIB", "/opt/x/libexample.so"), ("EXAMPLE_HOME", "/h")]));
        assert_eq!(found, vec![Candidate { path: "/opt/x/libexample.so".into(), origin: "EXAMPLE_LIB".into() }]);
    }

    #[test]
    fn roots_in_order_then_loader_path() {
        let found = SPEC.candidates(&env_of(&[("EXAMPLE_HOME", "/h"), ("OTHER_HOME", "/o"), ("EXAMPLE_LIB", "")]));
        let paths: Vec<_> = found.iter().map(|candidate| candidate.path.display().to_string()).collect();
        assert_eq!(
            paths,
            ["/h/lib64/libexample.so", "/h/runtime/lib64/libexample.so", "/o/lib/libexample.so", "libexample.so"]
        );
        assert_eq!(found[1].origin, "EXAMPLE_HOME/runtime/lib64");
        assert_eq!(found[3].origin, "dynamic loader search path");
    }

    #[test]
    fn failure_lists_every_candidate_and_reason() {
        let candidates = SPEC.candidates(&env_of(&[("EXAMPLE_HOME", "/nonexistent-root")]));
        let error = SPEC.open(&candidates).expect_err("nothing of that name exists");
        let LoadError::NotFound { attempts, .. } = &error else { panic!("unexpected {error:?}") };
        assert_eq!(attempts.len(), 3);
        assert_eq!(attempts[0].reason, "no such file");
        // The bare name went to the dynamic loader, whose own message is kept.
        assert!(attempts[2].reason.contains("libexample.so"), "{}", attempts[2].reason);
        let text = error.to_string();
        for candidate in &candidates {
            assert!(text.contains(&candidate.path.display().to_string()), "{text}");
        }
    }
}
