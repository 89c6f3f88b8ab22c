//! `aiv doctor`: which device backends are usable here, and for `cann` exactly what was looked for.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ascendcl_sys::loader::{LibrarySpec, LoadError};

/// One thing the doctor looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// What was looked for.
    pub what: String,
    /// Where it was found, or `None`.
    pub found: Option<String>,
    /// Every place that was tried.
    pub tried: Vec<String>,
}

/// What `aiv doctor` found.
#[derive(Clone, Debug)]
pub struct DoctorReport {
    /// The CPU twin is compiled into every build.
    pub twin_usable: bool,
    /// Whether this binary was built with feature `cann`.
    pub cann_feature: bool,
    /// The CANN probes, in order.
    pub cann_probes: Vec<Probe>,
}

impl DoctorReport {
    /// Whether everything the `cann` backend needs was found.
    pub fn cann_usable(&self) -> bool {
        self.cann_feature && self.cann_probes.iter().all(|probe| probe.found.is_some())
    }

    /// The report as text for the terminal.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "device backends:");
        let _ = writeln!(out, "  twin  usable   (CPU twin, built in)");
        let cann_state = if self.cann_usable() { "usable" } else { "NOT usable" };
        let _ = writeln!(
            out,
            "  cann  {cann_state}{}",
            if self.cann_feature { "" } else { " (this binary was built without feature `cann`)" }
        );
        for probe in &self.cann_probes {
            match &probe.found {
                Some(at) => {
                    let _ = writeln!(out, "    found     {:<16} {at}", probe.what);
                }
                None => {
                    let _ = writeln!(out, "    missing   {:<16} tried: {}", probe.what, probe.tried.join(", "));
                }
            }
        }
        out
    }
}

/// Looks for the CANN toolkit pieces the `cann` backend needs, reading the process environment.
pub fn diagnose() -> DoctorReport {
    let home = std::env::var_os("ASCEND_HOME_PATH").map(PathBuf::from);
    let mut probes = vec![Probe {
        what: "ASCEND_HOME_PATH".into(),
        found: home.as_ref().filter(|path| path.is_dir()).map(|path| path.display().to_string()),
        tried: vec![match &home {
            Some(path) => format!("{} (set, not a directory)", path.display()),
            None => "environment variable (not set)".into(),
        }],
    }];
    probes.push(find_library(&ascendcl_sys::sys::ASCENDCL_LIBRARY));
    probes.push(find_library(&cann_shmem_sys::sys::SHMEM_LIBRARY));
    probes.push(find_library(&hccl_sys::sys::HCCL_LIBRARY));
    probes.push(find_compiler(home.as_deref()));
    DoctorReport { twin_usable: true, cann_feature: cfg!(feature = "cann"), cann_probes: probes }
}

/// Looks for a vendor library exactly as its `-sys` crate's loader will at run time (override variable, install
/// roots, then the dynamic loader), by trying to open it.
fn find_library(spec: &LibrarySpec) -> Probe {
    let candidates = spec.candidates_from_process_env();
    match spec.open(&candidates) {
        Ok((_library, path)) => {
            Probe { what: spec.file_name.into(), found: Some(path.display().to_string()), tried: Vec::new() }
        }
        Err(LoadError::NotFound { attempts, .. }) => {
            let mut tried: Vec<String> = attempts
                .iter()
                .map(|attempt| {
                    format!(
                        "{} (from {}: {})",
                        attempt.candidate.path.display(),
                        attempt.candidate.origin,
                        attempt.reason
                    )
                })
                .collect();
            if std::env::var_os(spec.override_var).is_none() {
                tried.push(format!("{} not set (a full path there overrides the search)", spec.override_var));
            }
            Probe { what: spec.file_name.into(), found: None, tried }
        }
        Err(other) => Probe { what: spec.file_name.into(), found: None, tried: vec![other.to_string()] },
    }
}

fn find_compiler(home: Option<&Path>) -> Probe {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(home) = home {
        candidates.push(home.join("compiler/ccec_compiler/bin/bisheng"));
        candidates.push(home.join("tools/ccec_compiler/bin/bisheng"));
        candidates.push(home.join("tools/ccec_compiler/bin/ccec"));
    }
    let mut probe = probe_files("bisheng/ccec", candidates.into_iter());
    if probe.found.is_none() {
        if let Some(paths) = std::env::var_os("PATH") {
            let dirs: Vec<PathBuf> = std::env::split_paths(&paths).collect();
            let hit = dirs.iter().flat_map(|dir| [dir.join("bisheng"), dir.join("ccec")]).find(|path| path.is_file());
            match hit {
                Some(path) => probe.found = Some(path.display().to_string()),
                None => probe.tried.push(format!("bisheng and ccec in each of the {} PATH directories", dirs.len())),
            }
        }
    }
    probe
}

fn probe_files(what: &str, candidates: impl Iterator<Item = PathBuf>) -> Probe {
    let mut tried = Vec::new();
    for candidate in candidates {
        if candidate.is_file() {
            return Probe { what: what.into(), found: Some(candidate.display().to_string()), tried };
        }
        tried.push(candidate.display().to_string());
    }
    Probe { what: what.into(), found: None, tried }
}
