//! CANN's profiling interface, the subset this project uses as an independent device-side observer: which tasks the
//! device ran in a window, by task type (docs/evidence.md, "The profiler").
//!
//! Declarations from `acl/acl_prof.h` (`hicann/runtime` `include/external/acl/acl_prof.h`; the `torch-npu` wheel
//! ships the same header, and the ABI test checks these against it). The functions live in `libmsprofiler.so`, not
//! `libascendcl.so` (the runtime's profiling samples link both: `example/5_performance/profiling/0_create_config`),
//! so they are a table of their own, loaded by [`api()`] from `AIV_MSPROFILER_LIB`, the library directories under
//! `ASCEND_HOME_PATH`, then the loader's search path.
//!
//! The documented order (its source is cited in the root's docs/evidence.md): `aclInit`, `aclprofInit(path)`,
//! `aclprofCreateConfig(devices, metrics, events, data types)`, `aclprofStart(config)`, the work,
//! `aclprofStop(config)` with the same config, `aclprofDestroyConfig`, `aclprofFinalize`. A second `aclprofStart`
//! naming a device already profiled fails. The collected data lands under `path` for msprof's export.

#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::c_char;
use std::sync::OnceLock;

use crate::abi::{AbiManifest, CType, ConstDecl};
use crate::error::Error;
use crate::loader::{LibrarySpec, LoadError, ASCEND_HOME_LIBRARY_DIRS};
use crate::sys::aclError;

/// `typedef struct aclprofConfig aclprofConfig`: opaque, made by [`ProfApi::aclprofCreateConfig`].
#[repr(C)]
#[derive(Debug)]
pub struct aclprofConfig {
    _opaque: [u8; 0],
}

impl CType for aclprofConfig {
    fn c_type() -> String {
        "aclprofConfig".to_string()
    }
}

/// `typedef struct aclprofAicoreEvents aclprofAicoreEvents`: opaque; the header says only NULL is supported.
#[repr(C)]
#[derive(Debug)]
pub struct aclprofAicoreEvents {
    _opaque: [u8; 0],
}

impl CType for aclprofAicoreEvents {
    fn c_type() -> String {
        "aclprofAicoreEvents".to_string()
    }
}

crate::c_enum! {
    /// The AI Core metrics to sample; this project asks for none.
    pub enum aclprofAicoreMetrics: u32 {
        ACL_AICORE_ARITHMETIC_UTILIZATION = 0,
        ACL_AICORE_PIPE_UTILIZATION = 1,
        ACL_AICORE_MEMORY_BANDWIDTH = 2,
        ACL_AICORE_NONE = 0xFF,
    }
}

crate::c_consts! {
    /// The `dataTypeConfig` bits of `aclprofCreateConfig` this project uses (`ACL_PROF_*` macros).
    pub table ACL_PROF_DATA_TYPES: u64;
    /// Task time: every task the device ran, with its type, stream, start and end (msprof's `task_time`).
    ACL_PROF_TASK_TIME = 0x0002;
    /// AI-CPU task data.
    ACL_PROF_AICPU = 0x0008;
}

/// Where [`api()`] looks for `libmsprofiler.so`: `AIV_MSPROFILER_LIB` (a full path), else the library directories
/// under `ASCEND_HOME_PATH`, else the loader's search path.
pub const MSPROFILER_LIBRARY: LibrarySpec = LibrarySpec {
    file_name: "libmsprofiler.so",
    override_var: "AIV_MSPROFILER_LIB",
    roots: &[("ASCEND_HOME_PATH", ASCEND_HOME_LIBRARY_DIRS)],
};

crate::dynamic_library! {
    /// The profiling entry points this project calls, resolved from one `libmsprofiler.so`. Every one is in every
    /// CANN release the project targets; a library without them fails to load, and the caller reports the profiler
    /// as unavailable.
    pub struct ProfApi;
    required {
        fn aclprofInit(profiler_result_path: *const c_char, length: usize) -> aclError;
        fn aclprofFinalize() -> aclError;
        fn aclprofCreateConfig(
            device_id_list: *mut u32,
            device_nums: u32,
            aicore_metrics: aclprofAicoreMetrics,
            aicore_events: *const aclprofAicoreEvents,
            data_type_config: u64,
        ) -> *mut aclprofConfig;
        fn aclprofDestroyConfig(profiler_config: *const aclprofConfig) -> aclError;
        fn aclprofStart(profiler_config: *const aclprofConfig) -> aclError;
        fn aclprofStop(profiler_config: *const aclprofConfig) -> aclError;
    }
    optional {}
}

/// The process-wide profiling table, loaded on first use from [`MSPROFILER_LIBRARY`]'s candidates; a failure is
/// remembered.
pub fn api() -> Result<&'static ProfApi, Error> {
    static API: OnceLock<Result<ProfApi, LoadError>> = OnceLock::new();
    API.get_or_init(|| ProfApi::load(&MSPROFILER_LIBRARY, &MSPROFILER_LIBRARY.candidates_from_process_env()))
        .as_ref()
        .map_err(|error| Error::Load(error.clone()))
}

/// Everything this module declares, to compile against `acl/acl_prof.h`.
pub fn abi_manifest() -> AbiManifest {
    AbiManifest {
        headers: vec!["acl/acl.h", "acl/acl_prof.h"],
        functions: ProfApi::function_decls(),
        structs: Vec::new(),
        enums: vec![aclprofAicoreMetrics::abi_decl()],
        consts: ACL_PROF_DATA_TYPES.iter().map(|(name, value)| ConstDecl { name, value: i128::from(*value) }).collect(),
    }
}

/// Result layer: one function per call, naming the failed C function and its code.
pub mod result {
    use std::ffi::CString;

    use super::*;
    use crate::error::AclError;
    use crate::sys::ACL_SUCCESS;

    fn check(function: &'static str, code: aclError) -> Result<(), Error> {
        if code == ACL_SUCCESS {
            Ok(())
        } else {
            Err(Error::Call { function, code: AclError(code) })
        }
    }

    /// `aclprofInit(path, strlen(path))`.
    pub fn init(api: &ProfApi, path: &str) -> Result<(), Error> {
        let text = CString::new(path)
            .map_err(|_| Error::InvalidArgument { function: "aclprofInit", reason: format!("{path:?} has a NUL") })?;
        // SAFETY: a NUL-terminated string of `path.len()` bytes, read during the call.
        check("aclprofInit", unsafe { api.aclprofInit(text.as_ptr(), path.len()) })
    }

    /// `aclprofFinalize`.
    pub fn finalize(api: &ProfApi) -> Result<(), Error> {
        // SAFETY: no arguments.
        check("aclprofFinalize", unsafe { api.aclprofFinalize() })
    }

    /// `aclprofCreateConfig(devices, n, ACL_AICORE_NONE, NULL, data_types)`; `None` when it returns null.
    pub fn create_config(api: &ProfApi, devices: &[u32], data_types: u64) -> Option<*mut aclprofConfig> {
        let mut devices = devices.to_vec();
        let count = u32::try_from(devices.len()).ok()?;
        // SAFETY: `devices` is a live array of `count` ids; NULL events is what the header asks for.
        let config = unsafe {
            api.aclprofCreateConfig(devices.as_mut_ptr(), count, ACL_AICORE_NONE, core::ptr::null(), data_types)
        };
        (!config.is_null()).then_some(config)
    }

    /// `aclprofDestroyConfig`.
    ///
    /// # Safety
    ///
    /// `config` came from [`create_config`] on the same table and is not used afterwards.
    pub unsafe fn destroy_config(api: &ProfApi, config: *mut aclprofConfig) -> Result<(), Error> {
        // SAFETY: the caller's contract.
        check("aclprofDestroyConfig", unsafe { api.aclprofDestroyConfig(config) })
    }

    /// `aclprofStart`.
    ///
    /// # Safety
    ///
    /// `config` came from [`create_config`] on the same table and is live.
    pub unsafe fn start(api: &ProfApi, config: *mut aclprofConfig) -> Result<(), Error> {
        // SAFETY: the caller's contract.
        check("aclprofStart", unsafe { api.aclprofStart(config) })
    }

    /// `aclprofStop`, with the config `aclprofStart` was given.
    ///
    /// # Safety
    ///
    /// `config` came from [`create_config`] on the same table and is live.
    pub unsafe fn stop(api: &ProfApi, config: *mut aclprofConfig) -> Result<(), Error> {
        // SAFETY: the caller's contract.
        check("aclprofStop", unsafe { api.aclprofStop(config) })
    }
}
