//! Where and how the audit ran: the machine and the build ([`Environment`]), the configuration the engines started
//! with, the method, the paths not run, and the time to register the audit's buffers.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::EngineConfig;

/// Where the audit ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// aiv-transport's version.
    pub version: String,
    /// The commit of the source tree the binary was built from, read when the audit ran (`git rev-parse HEAD`
    /// there), with `-dirty` if it had uncommitted changes; `None` where the tree or git is not there.
    pub source_commit: Option<String>,
    /// `twin` (the CPU model of an NPU) or `cann` (the vendor's libraries).
    pub device_backend: String,
    /// The runtime the transfers' evidence names (kind and version), from the first path that recorded one.
    pub runtime: Option<String>,
    /// The machine: logical CPUs, CPU model, memory, operating system.
    pub cpus: usize,
    pub cpu_model: Option<String>,
    pub memory_bytes: Option<u64>,
    pub os: String,
    /// The load average over 1, 5 and 15 minutes when the audit started (`/proc/loadavg`; `None` where unreadable,
    /// and in reports written before it was recorded).
    #[serde(default)]
    pub load_average: Option<[f64; 3]>,
}

impl Environment {
    pub(crate) fn probe(config: &EngineConfig) -> Environment {
        Environment::of_this_machine(&format!("{:?}", config.aiv.device_backend).to_lowercase())
    }

    /// This machine and build as the audit records them, for a run on `device_backend` (`twin` or `cann`): what
    /// another recorded report (the kernel microbenchmark's) states of where it ran.
    pub fn of_this_machine(device_backend: &str) -> Environment {
        Environment {
            version: env!("CARGO_PKG_VERSION").into(),
            source_commit: source_commit(),
            device_backend: device_backend.into(),
            runtime: None,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| {
                info.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            }),
            memory_bytes: crate::bench::physical_memory(),
            os: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|release| format!("{} {}", std::env::consts::OS, release.trim()))
                .unwrap_or_else(|_| std::env::consts::OS.into()),
            load_average: load_average(),
        }
    }
}

/// The first three fields of `/proc/loadavg`.
fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(|field| field.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
}

/// `git rev-parse HEAD` in the source tree the binary was built from (its path is compiled in, never written out).
fn source_commit() -> Option<String> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "HEAD"]).filter(|c| !c.is_empty())?;
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{commit}-dirty") } else { commit })
}

/// The configuration of a run: the mooncake.json text it was read from (if any; the MOONCAKE_* variables may have
/// filled the rest) and the effective configuration as the engine holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigRecord {
    pub file: Option<String>,
    pub effective: String,
    /// The environment variables the configuration read that were set (MOONCAKE_*, MC_TRANSFER_TIMEOUT, ...), by
    /// name: with `file` and `command`, what `aiv audit --rerun` replays.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// How the audit measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Method {
    pub rounds: usize,
    pub cell_s: f64,
    pub reference_s: f64,
    pub operation: String,
    /// How sections that never sleep were timed for the Host CPU figures (`monotonic` or `thread`).
    #[serde(default)]
    pub section_clock: String,
    /// How rounds order the paths.
    pub order: String,
    /// What every path shares.
    pub layout: String,
}

/// A path the audit did not run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// Time to register buffers of one kind with the two engines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    /// `device` or `host`.
    pub memory: String,
    pub bytes: u64,
    pub seconds: f64,
    /// Seconds per GiB registered.
    pub seconds_per_gib: f64,
}

impl Registration {
    pub(crate) fn new(memory: &str, bytes: u64, took: Duration) -> Registration {
        let seconds = took.as_secs_f64();
        Registration {
            memory: memory.into(),
            bytes,
            seconds,
            seconds_per_gib: seconds / (bytes.max(1) as f64 / (1u64 << 30) as f64),
        }
    }
}
