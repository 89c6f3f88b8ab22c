//! Everything the readiness check reads from outside the process, in one place so tests can point it at a fake tree:
//! the system root under which the fixed system paths are read (`/usr/local/Ascend/driver`, `/dev`, `/etc`, the
//! usual `npu-smi` locations), the toolkit roots, `PATH`, and the bound on each program the doctor runs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::bounded::{self, Keep, Outcome};

/// Output bytes kept per stream of a diagnostic program.
pub const OUTPUT_KEPT: usize = 16 << 10;

/// A test and debug knob: the fixed system paths are read below this directory instead of `/`. A fake tree there
/// proves only the doctor's logic, never that a real machine is ready.
pub const SYSROOT_ENV: &str = "AIV_DOCTOR_SYSROOT";
/// The bound on each program the doctor runs (`npu-smi info`, the compiler's `--version`), in milliseconds.
pub const COMMAND_TIMEOUT_ENV: &str = "AIV_DOCTOR_COMMAND_TIMEOUT_MS";
/// Default of [`COMMAND_TIMEOUT_ENV`].
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Accepted range of [`COMMAND_TIMEOUT_ENV`], in milliseconds.
pub const COMMAND_TIMEOUT_RANGE_MS: (u64, u64) = (100, 120_000);

/// The readiness check's view of its surroundings.
#[derive(Clone, Debug)]
pub struct Inputs {
    /// `AIV_DOCTOR_SYSROOT`, when set.
    pub sysroot: Option<PathBuf>,
    /// `AIV_CANN_HOME`, `ASCEND_HOME_PATH`, `ASCEND_TOOLKIT_HOME` (each when set and not empty).
    pub cann_home: Option<PathBuf>,
    /// See above.
    pub ascend_home: Option<PathBuf>,
    /// See above.
    pub toolkit_home: Option<PathBuf>,
    /// The directories of `PATH`, in order.
    pub path: Vec<PathBuf>,
    /// The bound on each program run.
    pub command_timeout: Duration,
}

impl Inputs {
    /// From the process environment; a bad `AIV_DOCTOR_COMMAND_TIMEOUT_MS` is an error naming it and its range.
    pub fn from_process_env() -> Result<Inputs, String> {
        Inputs::from_env(&|name| std::env::var_os(name))
    }

    /// From the variables `env` returns.
    pub fn from_env(env: &dyn Fn(&str) -> Option<OsString>) -> Result<Inputs, String> {
        let dir = |name: &str| env(name).filter(|value| !value.is_empty()).map(PathBuf::from);
        let command_timeout = match env(COMMAND_TIMEOUT_ENV) {
            None => DEFAULT_COMMAND_TIMEOUT,
            Some(value) => {
                let (low, high) = COMMAND_TIMEOUT_RANGE_MS;
                let text = value.to_string_lossy();
                match text.trim().parse::<u64>() {
                    Ok(ms) if (low..=high).contains(&ms) => Duration::from_millis(ms),
                    _ => {
                        return Err(format!(
                            "{COMMAND_TIMEOUT_ENV}={text:?} is not a whole number of milliseconds from {low} to {high}"
                        ))
                    }
                }
            }
        };
        Ok(Inputs {
            sysroot: dir(SYSROOT_ENV),
            cann_home: dir("AIV_CANN_HOME"),
            ascend_home: dir("ASCEND_HOME_PATH"),
            toolkit_home: dir("ASCEND_TOOLKIT_HOME"),
            path: env("PATH").map(|path| std::env::split_paths(&path).collect()).unwrap_or_default(),
            command_timeout,
        })
    }

    /// Where the fixed system path `absolute` (e.g. `/etc/hccn.conf`) is read.
    pub fn system(&self, absolute: &str) -> PathBuf {
        match &self.sysroot {
            Some(root) => root.join(absolute.trim_start_matches('/')),
            None => PathBuf::from(absolute),
        }
    }

    /// The first `PATH` directory holding an executable file `name`.
    pub fn on_path(&self, name: &str) -> Option<PathBuf> {
        self.path.iter().map(|dir| dir.join(name)).find(|candidate| is_executable(candidate))
    }

    /// How `PATH` is described in a "looked for" text.
    pub fn path_text(&self, name: &str) -> String {
        format!("{name} in the {} PATH directories", self.path.len())
    }

    /// Runs the diagnostic program `program args` (`npu-smi info`, `bisheng --version`) with no input, bounded by
    /// [`Inputs::command_timeout`], its process group killed past it; the first [`OUTPUT_KEPT`] bytes of each stream
    /// are kept.
    pub fn run(&self, program: &Path, args: &[&str]) -> Outcome {
        let mut command = Command::new(program);
        command.args(args);
        bounded::run(command, self.command_timeout, Keep::Head(OUTPUT_KEPT), Keep::Head(OUTPUT_KEPT))
    }
}

/// A regular file with an execute bit.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The value of the first `key=value` line whose key is `key` (compared without case), trimmed, if not empty.
pub fn key_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once('=')?;
        (name.trim().eq_ignore_ascii_case(key) && !value.trim().is_empty()).then(|| value.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_is_range_checked_and_the_sysroot_prefixes_system_paths() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| OsString::from(value))
        };
        let error = Inputs::from_env(&env(&[(COMMAND_TIMEOUT_ENV, "5")])).expect_err("below the range");
        assert!(error.contains("AIV_DOCTOR_COMMAND_TIMEOUT_MS") && error.contains("100 to 120000"), "{error}");
        assert!(Inputs::from_env(&env(&[(COMMAND_TIMEOUT_ENV, "soon")])).is_err());
        let inputs =
            Inputs::from_env(&env(&[(SYSROOT_ENV, "/tmp/fake"), (COMMAND_TIMEOUT_ENV, "250")])).expect("valid");
        assert_eq!(inputs.system("/etc/hccn.conf"), PathBuf::from("/tmp/fake/etc/hccn.conf"));
        assert_eq!(inputs.command_timeout, Duration::from_millis(250));
        assert_eq!(key_value("a=1\nVersion = 24.1.rc2\n", "version"), Some("24.1.rc2".into()));
    }
}
