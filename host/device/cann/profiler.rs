//! CANN's profiler as the run's independent device-side observer (docs/evidence.md, "The profiler"): a session
//! around a run ([`ProfilerSession::start`], [`ProfilerSession::stop`]), its task records read back from msprof's
//! `task_time` summary, and the tasks whose execution overlapped the run's windows counted by type
//! ([`ProfiledTasks::observed`]).
//!
//! The session: `aclInit` (a repeated initialisation is accepted), `aclprofInit(directory)`,
//! `aclprofCreateConfig(devices, ACL_AICORE_NONE, NULL, ACL_PROF_TASK_TIME | ACL_PROF_AICPU)`, `aclprofStart`; at
//! the end `aclprofStop`, `aclprofDestroyConfig`, `aclprofFinalize` (`acl/acl_prof.h`; the documented order, with its
//! source, is in docs/evidence.md). The records: every
//! `mindstudio_profiler_output/task_time_*.csv` under the directory (msprof's export; its columns are those of
//! msprof's `task_time` summary: `Device_id`, `kernel_type`, `task_start(us)`, `task_stop(us)`, ...). The twin
//! runtime writes that summary itself at `aclprofStop`; on an NPU the raw data is exported by running
//! `msprof --export=on --output=<PROF directory>` (`AIV_MSPROF`, else `$ASCEND_HOME_PATH/tools/profiler/bin/msprof`,
//! else `msprof` on `PATH`), bounded by [`EXPORT_TIMEOUT`]. *Unverified on hardware*: that the export's
//! `task_start(us)` is Unix time (the windows are), and that a kernel launched before `aclprofStart` is recorded.
//!
//! Nothing here fails a run: every failure becomes the reason of [`DeviceObserver::Unavailable`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ascendcl_sys::prof::{self, aclprofConfig, ProfApi, ACL_PROF_AICPU, ACL_PROF_TASK_TIME};
use ascendcl_sys::AclApi;

use crate::evidence::{DeviceObserver, ObservedTasks};

/// The longest an msprof export may take.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(300);
/// The most task records read back (past this the observation is refused: too much to trust a partial count).
pub const MAX_TASK_RECORDS: usize = 4 << 20;

/// The current time as the profiler's records give it: Unix time in microseconds.
pub fn now_us() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |elapsed| elapsed.as_secs_f64() * 1e6)
}

/// A stretch of a run, in the records' time (Unix microseconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// When it began.
    pub start_us: f64,
    /// When it ended.
    pub end_us: f64,
}

impl Window {
    /// A window from `start_us` until now.
    pub fn since(start_us: f64) -> Window {
        Window { start_us, end_us: now_us() }
    }
}

/// A running profiling session.
#[derive(Debug)]
pub struct ProfilerSession {
    api: &'static ProfApi,
    config: usize,
    directory: PathBuf,
    keep: bool,
    devices: Vec<u32>,
}

/// One task record read back.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRecord {
    /// The device it ran on.
    pub device: u32,
    /// Its task type, as msprof names it (`KERNEL_AIVEC`, `MEMCPY_ASYNC`, ...).
    pub kind: String,
    /// When it started and ended (Unix microseconds); `None` when the record has no usable time (such a task counts
    /// in every window).
    pub span: Option<(f64, f64)>,
}

/// The task records of a session.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfiledTasks {
    /// The devices profiled.
    pub devices: Vec<u32>,
    /// Every record, in file order.
    pub records: Vec<TaskRecord>,
}

fn directory_for_session() -> (PathBuf, bool) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let serial = NEXT.fetch_add(1, Ordering::Relaxed);
    match std::env::var_os("AIV_PROFILE_DIR") {
        Some(root) => (PathBuf::from(root).join(format!("aiv-{}-{serial}", std::process::id())), true),
        None => (std::env::temp_dir().join(format!("aiv-profile-{}-{serial}", std::process::id())), false),
    }
}

impl ProfilerSession {
    /// Starts the profiler of the vendor's runtime (the loaded ACL table and `libmsprofiler.so`, `AIV_MSPROFILER_LIB`)
    /// on `devices`.
    pub fn start_vendor(devices: &[u32]) -> Result<ProfilerSession, String> {
        let acl = ascendcl_sys::api().map_err(|error| format!("the ACL library: {error}"))?;
        let api = prof::api().map_err(|error| format!("the profiling library: {error}"))?;
        Self::start(acl, api, devices)
    }

    /// Starts a session on `devices` through `api`, after `aclInit` through `acl`. The directory is a fresh one
    /// under the temporary directory (removed by [`ProfilerSession::stop`]), or under `AIV_PROFILE_DIR` (kept).
    pub fn start(acl: &'static AclApi, api: &'static ProfApi, devices: &[u32]) -> Result<ProfilerSession, String> {
        match ascendcl_sys::result::runtime::init(acl, None) {
            Ok(()) => {}
            Err(error)
                if error.code() == Some(ascendcl_sys::AclError(ascendcl_sys::sys::ACL_ERROR_REPEAT_INITIALIZE)) => {}
            Err(error) => return Err(format!("aclInit: {error}")),
        }
        let (directory, keep) = directory_for_session();
        std::fs::create_dir_all(&directory)
            .map_err(|error| format!("cannot create the profiling directory {}: {error}", directory.display()))?;
        let text = directory.to_str().ok_or_else(|| format!("{} is not UTF-8", directory.display()))?;
        let cleanup = |reason: String| {
            if !keep {
                let _ = std::fs::remove_dir_all(&directory);
            }
            reason
        };
        prof::result::init(api, text).map_err(|error| cleanup(error.to_string()))?;
        let Some(config) = prof::result::create_config(api, devices, ACL_PROF_TASK_TIME | ACL_PROF_AICPU) else {
            let _ = prof::result::finalize(api);
            return Err(cleanup(format!("aclprofCreateConfig returned null for devices {devices:?}")));
        };
        // SAFETY: made just now by this table.
        if let Err(error) = unsafe { prof::result::start(api, config) } {
            // SAFETY: as above; not started, never used again.
            let _ = unsafe { prof::result::destroy_config(api, config) };
            let _ = prof::result::finalize(api);
            return Err(cleanup(error.to_string()));
        }
        Ok(ProfilerSession { api, config: config as usize, directory, keep, devices: devices.to_vec() })
    }

    /// Stops the session and reads its task records back (the msprof export runs first where the summary is
    /// missing). The directory is removed unless it is under `AIV_PROFILE_DIR`.
    pub fn stop(self) -> Result<ProfiledTasks, String> {
        let config = self.config as *mut aclprofConfig;
        // SAFETY: the config this session started; used by nothing else.
        let stopped = unsafe { prof::result::stop(self.api, config) };
        // SAFETY: stopped (or failing to), never used again.
        let _ = unsafe { prof::result::destroy_config(self.api, config) };
        let _ = prof::result::finalize(self.api);
        let read = stopped.map_err(|error| error.to_string()).and_then(|()| read_back(&self.directory));
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.directory);
        }
        Ok(ProfiledTasks { devices: self.devices.clone(), records: read? })
    }

    /// Where the session writes.
    pub fn directory(&self) -> &Path {
        &self.directory
    }
}

/// The records under `directory`: the `task_time` summaries already there, else the export's.
fn read_back(directory: &Path) -> Result<Vec<TaskRecord>, String> {
    let mut files = summaries(directory);
    if files.is_empty() {
        export(directory)?;
        files = summaries(directory);
    }
    if files.is_empty() {
        return Err(format!("no task_time summary under {} (msprof's export wrote none)", directory.display()));
    }
    let mut records = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|error| format!("{}: {error}", file.display()))?;
        parse_task_time(&text, &mut records).map_err(|error| format!("{}: {error}", file.display()))?;
    }
    Ok(records)
}

/// Every `task_time_*.csv` in a `mindstudio_profiler_output` directory at most four levels under `root`.
fn summaries(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![(root.to_path_buf(), 0)];
    while let Some((directory, depth)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&directory) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && depth < 4 {
                pending.push((path, depth + 1));
            } else if path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("task_time_") && name.ends_with(".csv"))
                && directory.file_name().is_some_and(|name| name == "mindstudio_profiler_output")
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Runs msprof's export on every `PROF_*` directory under `directory`, each bounded by [`EXPORT_TIMEOUT`].
fn export(directory: &Path) -> Result<(), String> {
    let msprof = std::env::var_os("AIV_MSPROF")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("ASCEND_HOME_PATH")
                .map(|home| PathBuf::from(home).join("tools/profiler/bin/msprof"))
                .filter(|path| path.is_file())
        })
        .unwrap_or_else(|| PathBuf::from("msprof"));
    let runs: Vec<PathBuf> = std::fs::read_dir(directory)
        .map_err(|error| format!("{}: {error}", directory.display()))?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.is_dir() && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("PROF_"))
        })
        .collect();
    if runs.is_empty() {
        return Err(format!("the profiler wrote no PROF_* directory under {}", directory.display()));
    }
    for run in runs {
        let mut child = std::process::Command::new(&msprof)
            .arg("--export=on")
            .arg(format!("--output={}", run.display()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|error| format!("cannot run {} for the export: {error}", msprof.display()))?;
        let deadline = Instant::now() + EXPORT_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => break,
                Ok(Some(status)) => return Err(format!("{} --export=on failed: {status}", msprof.display())),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{} --export=on did not finish within {EXPORT_TIMEOUT:?}", msprof.display()));
                }
            }
        }
    }
    Ok(())
}

/// Splits one CSV line (fields may be double-quoted, with `""` for a quote).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields.into_iter().map(|field| field.trim().to_string()).collect()
}

/// Parses one `task_time` summary into `records`.
pub fn parse_task_time(text: &str, records: &mut Vec<TaskRecord>) -> Result<(), String> {
    let mut lines = text.lines().filter(|line| !line.trim().is_empty());
    let header = csv_fields(lines.next().ok_or("empty file")?.trim_start_matches('\u{feff}'));
    let column = |name: &str| header.iter().position(|field| field.eq_ignore_ascii_case(name));
    let kind = column("kernel_type").ok_or("no kernel_type column")?;
    let device = column("Device_id");
    let (start, stop) = (column("task_start(us)"), column("task_stop(us)"));
    for line in lines {
        if records.len() >= MAX_TASK_RECORDS {
            return Err(format!("more than {MAX_TASK_RECORDS} task records"));
        }
        let fields = csv_fields(line);
        let at = |index: Option<usize>| index.and_then(|index| fields.get(index));
        let time = |index: Option<usize>| at(index).and_then(|text| text.parse::<f64>().ok()).filter(|t| t.is_finite());
        let Some(kind) = fields.get(kind).filter(|kind| !kind.is_empty()) else { continue };
        records.push(TaskRecord {
            device: at(device).and_then(|text| text.parse().ok()).unwrap_or(u32::MAX),
            kind: kind.clone(),
            span: time(start).zip(time(stop)),
        });
    }
    Ok(())
}

impl ProfiledTasks {
    /// The tasks of the profiled devices whose execution overlapped any of `windows` (a record without a usable
    /// time counts), by type.
    pub fn observed(&self, windows: &[Window]) -> ObservedTasks {
        let mut tasks = ObservedTasks::default();
        for record in &self.records {
            if record.device != u32::MAX && !self.devices.contains(&record.device) {
                continue;
            }
            let overlaps = match record.span {
                None => true,
                Some((start, stop)) => windows.iter().any(|w| start <= w.end_us && stop >= w.start_us),
            };
            if !overlaps {
                continue;
            }
            let kind = record.kind.to_ascii_uppercase();
            match kind.as_str() {
                "KERNEL_AIVEC" | "KERNEL_MIX_AIV" | "AI_VECTOR_CORE" | "MIX_AIV" => tasks.aiv_kernels += 1,
                "KERNEL_AICPU" | "AI_CPU" => tasks.aicpu_tasks += 1,
                other
                    if other.starts_with("MEMCPY")
                        || other.starts_with("MEMSET")
                        || other.starts_with("REDUCE_ASYNC") =>
                {
                    tasks.copy_tasks += 1
                }
                _ => *tasks.other_tasks.entry(record.kind.clone()).or_default() += 1,
            }
        }
        tasks
    }
}

/// The observer of a run: what a session (or the reason it could not start) saw in `windows`.
pub fn observer(session: Result<ProfilerSession, String>, windows: &[Window]) -> DeviceObserver {
    match session.and_then(ProfilerSession::stop) {
        Ok(tasks) => DeviceObserver::Profiler { tasks: tasks.observed(windows) },
        Err(reason) => DeviceObserver::Unavailable { reason: format!("the profiler: {reason}") },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_parsed_and_counted_by_type_in_the_windows() {
        let text =
            "\u{feff}Device_id,kernel_name,kernel_type,stream_id,task_id,task_time(us),task_start(us),task_stop(us)\n\
                    0,kernel,KERNEL_AIVEC,1,1,100.000,1000.000,1100.000\n\
                    0,N/A,MEMCPY_ASYNC,0,2,1.000,50.000,51.000\n\
                    0,N/A,MEMCPY_ASYNC,0,3,1.000,1050.000,1051.000\n\
                    1,\"a, b\",KERNEL_AICPU,2,4,1.000,1060.000,1061.000\n\
                    0,N/A,EVENT_RECORD,2,5,N/A,N/A,N/A\n\
                    3,kernel,KERNEL_AIVEC,1,6,1.000,1000.000,1001.000\n";
        let mut records = Vec::new();
        parse_task_time(text, &mut records).expect("parses");
        assert_eq!(records.len(), 6);
        assert_eq!(records[3].kind, "KERNEL_AICPU");
        let tasks = ProfiledTasks { devices: vec![0, 1], records };
        let seen = tasks.observed(&[Window { start_us: 900.0, end_us: 1200.0 }]);
        assert_eq!((seen.aiv_kernels, seen.copy_tasks, seen.aicpu_tasks), (1, 1, 1), "{seen:?}");
        assert_eq!(seen.other_tasks.get("EVENT_RECORD"), Some(&1), "a record without times counts");
        let before = tasks.observed(&[Window { start_us: 0.0, end_us: 60.0 }]);
        assert_eq!((before.aiv_kernels, before.copy_tasks), (0, 1));
        assert!(parse_task_time("Device_id,task_id\n0,1\n", &mut Vec::new()).is_err());
    }
}
