//! A model of CANN's profiler: the subset of `acl/acl_prof.h` that `ascendcl_sys::prof::ProfApi` declares
//! (`aclprofInit`, `aclprofCreateConfig`, `aclprofStart`, `aclprofStop`, `aclprofDestroyConfig`, `aclprofFinalize`),
//! exported under the C names, and the task records it keeps (docs/twin-runtime.md, "The profiler").
//!
//! What it records is the twin's tasks, where they run: the stream worker records each copy and kernel launch it ran
//! ([`ran`], one call per task kind in `stream.rs`), the synchronous `aclrtMemcpy` path each copy that reaches device
//! memory. A task is recorded when it ends, into every running session that profiles its device with
//! `ACL_PROF_TASK_TIME`, with its start and end (Unix time). Nothing else is seen: the emulated cores' own SDMA SQEs,
//! register writes and memory accesses are no tasks, as a kernel's direct SQE writes are no runtime tasks on the NPU
//! (*guess*: the public sources describe the task types the runtime registers for profiling, not what a kernel's own
//! SDMA descriptors look like to the profiler).
//!
//! `aclprofStop` writes the session's records as msprof's export would summarise them (*guess*: the twin skips the
//! raw data and the export step): `<path>/PROF_<pid>_<n>/mindstudio_profiler_output/task_time_<n>.csv`, with the
//! columns of msprof's `task_time` summary (`Device_id,kernel_name,kernel_type,stream_id,task_id,task_time(us),
//! task_start(us),task_stop(us)`) and the task type names the runtime registers for profiling
//! (`hicann/runtime` `src/runtime/core/src/common/profiling_agent.cc`): `MEMCPY_ASYNC` for a copy, `KERNEL_AIVEC`
//! for a kernel on the AI Vector cores, `KERNEL_AICPU` for an AI-CPU task.
//!
//! Return codes (names from `acl_base.h`; which call returns which is the twin's choice, *guess*, except where the
//! documentation says a call fails: a second start naming a device already profiled, start/stop/finalize without
//! init, a path over 4096 bytes):
//!
//! | case | code |
//! |---|---|
//! | `aclprofInit` before `aclInit`, null path, length 0 or above 4096 | `ACL_ERROR_UNINITIALIZE` / `ACL_ERROR_INVALID_PARAM` |
//! | `aclprofInit` while a session runs | `ACL_ERROR_PROF_ALREADY_RUN` |
//! | `aclprofCreateConfig` with no device, an unknown one, or a null list | null |
//! | `aclprofStart`/`Stop`/`Finalize` without `aclprofInit` | `ACL_ERROR_PROF_NOT_RUN` |
//! | a config this runtime did not make (or destroyed) | `ACL_ERROR_INVALID_PARAM` |
//! | `aclprofStart` naming a device a running session profiles, or a config already started | `ACL_ERROR_PROF_ALREADY_RUN` |
//! | `aclprofStop` of a config not started | `ACL_ERROR_PROF_NOT_RUN` |
//! | `aclprofDestroyConfig` of a started config; `aclprofFinalize` with a session running | `ACL_ERROR_PROF_ALREADY_RUN` |
//! | the records could not be written | `ACL_ERROR_WRITE_FILE` |
//! | more than [`MAX_RECORDS`] tasks in one session (the rest dropped; the file holds the first ones) | `ACL_ERROR_STORAGE_OVER_LIMIT` from `aclprofStop` |

use core::ffi::{c_char, c_void};
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::OnceLock;

use ascendcl_sys::prof::{aclprofAicoreEvents, aclprofAicoreMetrics, aclprofConfig, ACL_PROF_TASK_TIME};
use ascendcl_sys::sys::*;

mod records;

pub(crate) use records::{ran, started};
use records::{session_started, session_stopped, state, Config, Session, State};
pub use records::{TaskType, MAX_RECORDS};

/// The longest result path `aclprofInit` accepts (the documentation's limit), in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// The header of the task file, msprof's `task_time` summary columns.
pub const TASK_TIME_HEADER: &str =
    "Device_id,kernel_name,kernel_type,stream_id,task_id,task_time(us),task_start(us),task_stop(us)";

/// Runs an entry point, turning a panic into `ACL_ERROR_RT_INTERNAL_ERROR`.
fn entry(body: impl FnOnce() -> Result<(), aclError>) -> aclError {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => ACL_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => ACL_ERROR_RT_INTERNAL_ERROR,
    }
}

fn config_index(state: &State, config: *const aclprofConfig) -> Result<usize, aclError> {
    let address = config as usize;
    state
        .configs
        .iter()
        .position(|known| std::ptr::from_ref::<Config>(known) as usize == address)
        .ok_or(ACL_ERROR_INVALID_PARAM)
}

/// `aclprofInit`: sets the directory sessions are written under (created at the first `aclprofStop`).
///
/// # Safety
///
/// `path` is null or points to `length` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn aclprofInit(path: *const c_char, length: usize) -> aclError {
    entry(|| {
        crate::runtime::runtime().ready().map_err(|_| ACL_ERROR_UNINITIALIZE)?;
        if path.is_null() || length == 0 || length > MAX_PATH_BYTES {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        // SAFETY: `length` readable bytes at `path` (C contract).
        let bytes = unsafe { std::slice::from_raw_parts(path.cast::<u8>(), length) };
        let bytes = bytes.split(|&byte| byte == 0).next().unwrap_or_default();
        if bytes.is_empty() {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        use std::os::unix::ffi::OsStrExt;
        let mut state = state();
        if !state.sessions.is_empty() {
            return Err(ACL_ERROR_PROF_ALREADY_RUN);
        }
        state.path = Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)));
        Ok(())
    })
}

/// `aclprofFinalize`: forgets the path (configs stay until destroyed).
#[no_mangle]
pub extern "C" fn aclprofFinalize() -> aclError {
    entry(|| {
        let mut state = state();
        if state.path.is_none() {
            return Err(ACL_ERROR_PROF_NOT_RUN);
        }
        if !state.sessions.is_empty() {
            return Err(ACL_ERROR_PROF_ALREADY_RUN);
        }
        state.path = None;
        Ok(())
    })
}

/// `aclprofCreateConfig`: a config for `device_nums` devices; metrics and events are accepted and ignored (the twin
/// samples no AI Core counters). Null for no device, an unknown device or a null list.
///
/// # Safety
///
/// `device_id_list` is null or points to `device_nums` ids.
#[no_mangle]
pub unsafe extern "C" fn aclprofCreateConfig(
    device_id_list: *mut u32,
    device_nums: u32,
    _aicore_metrics: aclprofAicoreMetrics,
    _aicore_events: *const aclprofAicoreEvents,
    data_type_config: u64,
) -> *mut aclprofConfig {
    let made = catch_unwind(AssertUnwindSafe(|| {
        if device_id_list.is_null() || device_nums == 0 || device_nums > 64 {
            return None;
        }
        // SAFETY: `device_nums` ids at `device_id_list` (C contract).
        let devices = unsafe { std::slice::from_raw_parts(device_id_list, device_nums as usize) }.to_vec();
        let count = crate::runtime::runtime().device_count;
        if devices.iter().any(|&device| device >= count) {
            return None;
        }
        let config = Box::new(Config { devices, data_types: data_type_config, started: false });
        let address = std::ptr::from_ref::<Config>(&config) as usize;
        state().configs.push(config);
        Some(address as *mut aclprofConfig)
    }));
    made.ok().flatten().unwrap_or(std::ptr::null_mut())
}

/// `aclprofDestroyConfig`.
#[no_mangle]
pub extern "C" fn aclprofDestroyConfig(config: *const aclprofConfig) -> aclError {
    entry(|| {
        let mut state = state();
        let index = config_index(&state, config)?;
        if state.configs[index].started {
            return Err(ACL_ERROR_PROF_ALREADY_RUN);
        }
        state.configs.remove(index);
        Ok(())
    })
}

/// `aclprofStart`: a session for the config's devices starts recording (with `ACL_PROF_TASK_TIME`; without it the
/// session records nothing).
#[no_mangle]
pub extern "C" fn aclprofStart(config: *const aclprofConfig) -> aclError {
    entry(|| {
        let mut state = state();
        if state.path.is_none() {
            return Err(ACL_ERROR_PROF_NOT_RUN);
        }
        let index = config_index(&state, config)?;
        let profiled = |device: &u32| state.sessions.iter().any(|session| session.devices.contains(device));
        if state.configs[index].started || state.configs[index].devices.iter().any(profiled) {
            return Err(ACL_ERROR_PROF_ALREADY_RUN);
        }
        let chosen = &mut state.configs[index];
        chosen.started = true;
        let devices = if chosen.data_types & ACL_PROF_TASK_TIME != 0 { chosen.devices.clone() } else { Vec::new() };
        state.sessions.push(Session { config: config as usize, devices, records: Vec::new(), dropped: 0 });
        session_started();
        Ok(())
    })
}

/// `aclprofStop`: ends the config's session and writes its records.
#[no_mangle]
pub extern "C" fn aclprofStop(config: *const aclprofConfig) -> aclError {
    entry(|| {
        let (session, directory, serial) = {
            let mut state = state();
            let path = state.path.clone().ok_or(ACL_ERROR_PROF_NOT_RUN)?;
            let index = config_index(&state, config)?;
            let at = state.sessions.iter().position(|session| session.config == config as usize);
            let Some(at) = at else { return Err(ACL_ERROR_PROF_NOT_RUN) };
            state.configs[index].started = false;
            let session = state.sessions.remove(at);
            session_stopped();
            state.written += 1;
            (session, path, state.written)
        };
        write_session(&session, &directory, serial).map_err(|_| ACL_ERROR_WRITE_FILE)?;
        if session.dropped > 0 {
            return Err(ACL_ERROR_STORAGE_OVER_LIMIT);
        }
        Ok(())
    })
}

fn write_session(session: &Session, directory: &std::path::Path, serial: u32) -> std::io::Result<()> {
    let output =
        directory.join(format!("PROF_{}_{serial:06}_twin", std::process::id())).join("mindstudio_profiler_output");
    std::fs::create_dir_all(&output)?;
    let file = std::fs::File::create(output.join(format!("task_time_{serial:06}.csv")))?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(out, "{TASK_TIME_HEADER}")?;
    let us = |ns: u64| format!("{}.{:03}", ns / 1000, ns % 1000);
    for record in &session.records {
        let name = match record.kind {
            TaskType::Memcpy => "N/A",
            TaskType::KernelAivec | TaskType::KernelAicpu => "kernel",
        };
        writeln!(
            out,
            "{},{name},{},{},{},{},{},{}",
            record.device,
            record.kind.name(),
            record.stream,
            record.task,
            us(record.end_ns.saturating_sub(record.start_ns)),
            us(record.start_ns),
            us(record.end_ns),
        )?;
    }
    out.flush()
}

macro_rules! exports {
    ($($name:ident),* $(,)?) => {
        /// The C names of the profiling functions this runtime exports.
        pub const EXPORTED: &[&str] = &[$(stringify!($name)),*];

        /// The address of the profiling function called `name`, or `None`: the resolver for
        /// [`ascendcl_sys::prof::ProfApi::from_resolver`].
        pub fn resolve(name: &str) -> Option<*const c_void> {
            match name {
                $(stringify!($name) => Some($name as *const c_void),)*
                _ => None,
            }
        }
    };
}

exports! {
    aclprofInit,
    aclprofFinalize,
    aclprofCreateConfig,
    aclprofDestroyConfig,
    aclprofStart,
    aclprofStop,
}

/// The process-wide profiling table resolved to this runtime, built once.
pub fn prof_api() -> &'static ascendcl_sys::prof::ProfApi {
    static API: OnceLock<ascendcl_sys::prof::ProfApi> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: `resolve` returns only the functions above, each with the prototype `ProfApi` declares, callable
        // from any thread for the life of the process.
        match unsafe { ascendcl_sys::prof::ProfApi::from_resolver(PathBuf::from(crate::IN_PROCESS_PATH), &resolve) } {
            Ok(api) => api,
            Err(error) => panic!("cann-twin does not implement a profiling symbol: {error}"),
        }
    })
}
