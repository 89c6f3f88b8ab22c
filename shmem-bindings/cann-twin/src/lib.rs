//! `cann-twin`: a CPU model of the CANN runtime, implementing the ACL C ABI that `ascendcl-sys` declares, so that
//! one device backend runs on an NPU (the vendor's `libascendcl.so`) or on this model. It is a model written from
//! public headers and sources, **not verified on hardware**; where the vendor's behaviour is unknown it chooses the
//! stricter rule, so that code which works here is more likely to work on the NPU, not less.
//!
//! Use it in-process through [`acl_api`] (an [`ascendcl_sys::AclApi`] filled by [`resolve`] via
//! `AclApi::from_resolver`), or as a shared library: the crate also builds as a `cdylib` exporting every
//! implemented function under its C name with the prototype of `ascendcl_sys::sys`.
//!
//! # Implemented
//!
//! Every required symbol of `AclApi`, and the VMM and Host-registration subset of the optional ones:
//!
//! | area | functions |
//! |---|---|
//! | init, devices | `aclInit`, `aclFinalize`, `aclrtSetDevice`, `aclrtResetDevice`, `aclrtGetDevice`, `aclrtGetDeviceCount` (`AIV_TWIN_DEVICES`, default 8), `aclrtGetVersion`, `aclsysGetCANNVersion` |
//! | streams | `aclrtCreateStream`, `aclrtCreateStreamWithConfig`, `aclrtSynchronizeStream`, `aclrtSynchronizeStreamWithTimeout`, `aclrtDestroyStream`, `aclrtMemcpyAsync` |
//! | memory | `aclrtMalloc`, `aclrtFree`, `aclrtMallocHost`, `aclrtFreeHost`, `aclrtMemset`, `aclrtMemcpy`, `aclrtHostRegister`, `aclrtHostUnregister` |
//! | VMM | `aclrtMallocPhysical`, `aclrtFreePhysical`, `aclrtReserveMemAddress`, `aclrtReleaseMemAddress`, `aclrtMapMem`, `aclrtUnmapMem`, `aclrtMemSetAccess`, `aclrtMemGetAllocationGranularity` |
//!
//! # Not yet implemented
//!
//! These optional symbols are **not resolved**: the table's field is `None`, and `optional_symbol!` reports the
//! function as not provided by this runtime. Nothing silently succeeds.
//! Notifies (`aclrtCreateNotify`, `aclrtDestroyNotify`, `aclrtRecordNotify`, `aclrtWaitAndResetNotify`,
//! `aclrtGetNotifyId`); VMM export/import (`aclrtMemExportToShareableHandle`, `…V2`,
//! `aclrtMemImportFromShareableHandle`, `…V2`); IPC (`aclrtIpcMemGetExportKey`, `aclrtIpcMemImportByKey`,
//! `aclrtIpcMemClose`); binaries and launch (`aclrtBinaryLoadFromData`, `aclrtBinaryGetFunction`,
//! `aclrtLaunchKernel`, `aclrtLaunchKernelWithHostArgs`, `aclrtBinaryUnLoad`). Within implemented functions,
//! the paths the twin does not model return `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (207000): Host-located physical
//! memory, `ACL_HOST_REGISTER_IOMEMORY`, version queries of packages other than CANN and the runtime.
//!
//! # Memory model: device memory is not Host memory
//!
//! On the NPU a device address is not in the Host's page tables; Host code reaches device memory only through the
//! runtime's copies and maps. The twin keeps it so by construction (details in the `memory` module):
//! device addresses come from one `mmap(PROT_NONE, MAP_NORESERVE)` reservation that is never made accessible, so
//! a Host load or store through one dies of SIGSEGV, as a test shows. Physical memory lives in memfds; the device
//! model reaches it through separate private views, translating every device range and refusing (with an error
//! code, never a crash) ranges that run past their allocation, mapping or registered window or touch
//! unallocated addresses. Host-registered memory gets its own device address (never the Host pointer), which
//! translates to the same Host pages. Copies check that `kind` matches where each pointer lives.
//!
//! `aclrtMalloc` memory reads zero on the twin; the NPU gives no such promise. All state sits behind one mutex;
//! copies run under it (correct, not fast). Stream tasks run in order on one worker thread per stream.
//!
//! # Return codes and their sources
//!
//! *Vendor source* means the behaviour is read from `hicann/runtime`; *header* means the code's name and meaning
//! are from `hicann/runtime` `include/external/acl/error_codes/rt_error_codes.h` (or `acl_base_rt.h`) but its use
//! for this case is the twin's choice; *guess* means no public source was found.
//!
//! | case | code | source |
//! |---|---|---|
//! | null pointer argument, zero size (malloc, malloc host, host register, reserve, map) | `ACL_ERROR_INVALID_PARAM` 100000 | vendor source: `src/acl/common/log_inner.h` (`ACL_REQUIRES_NOT_NULL…`, `ACL_REQUIRES_POSITIVE…`), `src/acl/aclrt_impl/memory.cpp` |
//! | `aclrtMemcpy`/`Memset` with count 0 succeeds before any check | `ACL_SUCCESS` | vendor source: `src/acl/aclrt_impl/memory.cpp` |
//! | memcpy kind outside 0–5 (incl. `INNER`/`INTER_DEVICE_TO_DEVICE`) | `ACL_ERROR_INVALID_PARAM` | vendor source: `MemcpyKindTranslate` in `memory.cpp` |
//! | `aclInit` twice | `ACL_ERROR_REPEAT_INITIALIZE` 100002 | vendor source: `src/acl/aclrt_impl/acl.cpp` |
//! | `aclFinalize` twice; `aclInit` again after `aclFinalize` succeeds | `ACL_ERROR_REPEAT_FINALIZE` 100037 | vendor source: `acl.cpp` |
//! | `aclrtMallocPhysical`: flags ≠ 0, handle type ≠ NONE, allocation type ≠ PINNED, DDR attribute on a device location | `ACL_ERROR_INVALID_PARAM` | vendor source: `memory.cpp` |
//! | `aclrtReserveMemAddress` flags not 0 or 1; `aclrtMapMem` flags ≠ 0 | `ACL_ERROR_INVALID_PARAM` | vendor source: `memory.cpp` |
//! | `aclrtReserveMemAddress` with non-null `expectPtr` | `ACL_ERROR_INVALID_PARAM` | header `acl_rt.h` says it must be null; code is a guess |
//! | async device-to-device copy not 64-byte aligned | `ACL_ERROR_RT_ADDR_UNALIGNED` 107008 | restriction from `acl_rt.h` (`aclrtMemcpyAsync`); code is a guess |
//! | `aclrtGetDevice` with no device set on the thread; calls needing a device without one | `ACL_ERROR_RT_CONTEXT_NULL` 107002 | public caller code (PyTorch NPU adapters treat this code from `aclrtGetDevice` as "no device set"); its use for other calls is a guess |
//! | stream sync timeout | `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT` 507046 | header |
//! | Host range already / not registered | `ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED` 507910 / `…NOT_REGISTERED` 507911 | header |
//! | out of device address space or memory | `ACL_ERROR_RT_MEMORY_ALLOCATION` 207001 | header ("only used by out of memory") |
//! | unknown stream or physical handle | `ACL_ERROR_RT_INVALID_HANDLE` 107017 | header; guess |
//! | device id out of range | `ACL_ERROR_RT_INVALID_DEVICEID` 107001 | header; guess |
//! | copy kind does not match where the pointers are; memset of a Host address | `ACL_ERROR_RT_INVALID_MEMORY_TYPE` 107016 | header; guess |
//! | unallocated device address, range past its allocation, write to read-only, `destMax < count`, free of an unknown address | `ACL_ERROR_RT_PARAM_INVALID` 107000 | guess |
//! | free of physical memory still mapped, release of a reservation with mappings | `ACL_ERROR_RT_MEMORY_FREE` 207002 | guess |
//! | any call but `aclInit`, `aclFinalize`, the version queries before `aclInit` | `ACL_ERROR_UNINITIALIZE` 100001 | guess (stricter than the vendor's ACL layer, which does not check) |
//! | `aclrtResetDevice` of a device not set | `ACL_ERROR_RT_CONTEXT_NULL` | guess |
//! | sizes not multiples of the 2 MiB granularity (physical, reserve, map size/offset/address) | `ACL_ERROR_INVALID_PARAM` | guess; 2 MiB itself is a guess (1 GiB for the `HUGE1G` attributes) |
//! | a panic inside the twin | `ACL_ERROR_RT_INTERNAL_ERROR` 507000 | header |
//!
//! Versions: `aclrtGetVersion` reports this crate's version (0, 1, 0); `aclsysGetCANNVersion` reports
//! `"cann-twin 0.1.0"` for `ACL_PKG_NAME_CANN` and `ACL_PKG_NAME_RUNTIME`. Neither claims a CANN release.

use core::ffi::c_void;
use std::path::PathBuf;
use std::sync::OnceLock;

pub mod acl;
pub mod control;
mod memory;
mod runtime;
pub mod sdma;
pub mod shmem;
mod stream;

pub use acl::{TWIN_VERSION, TWIN_VERSION_STRING};
pub use runtime::DEFAULT_DEVICE_COUNT;
pub use sdma::{aiv_twin_register_write, register_write, RegisterFault};
pub use shmem::{resolve_shmem, shmem_api};

/// What [`ascendcl_sys::AclApi::path`] reports for [`acl_api`].
pub const IN_PROCESS_PATH: &str = "cann-twin (in-process)";

macro_rules! exports {
    ($($name:ident),* $(,)?) => {
        /// The C names of every function this runtime implements and exports.
        pub const EXPORTED: &[&str] = &[$(stringify!($name)),*];

        /// The address of the implemented function called `name`, or `None`: the resolver for
        /// [`ascendcl_sys::AclApi::from_resolver`]. Each address is a function of this crate with exactly the
        /// prototype `ascendcl_sys::sys` declares for that name.
        pub fn resolve(name: &str) -> Option<*const c_void> {
            match name {
                $(stringify!($name) => Some(acl::$name as *const c_void),)*
                _ => None,
            }
        }
    };
}

exports! {
    aclInit,
    aclFinalize,
    aclrtSetDevice,
    aclrtResetDevice,
    aclrtGetDevice,
    aclrtGetDeviceCount,
    aclrtGetVersion,
    aclsysGetCANNVersion,
    aclrtCreateStream,
    aclrtCreateStreamWithConfig,
    aclrtSynchronizeStream,
    aclrtSynchronizeStreamWithTimeout,
    aclrtDestroyStream,
    aclrtMalloc,
    aclrtFree,
    aclrtMallocHost,
    aclrtFreeHost,
    aclrtMemset,
    aclrtMemcpy,
    aclrtMemcpyAsync,
    aclrtHostRegister,
    aclrtHostUnregister,
    aclrtMallocPhysical,
    aclrtFreePhysical,
    aclrtReserveMemAddress,
    aclrtReleaseMemAddress,
    aclrtMapMem,
    aclrtUnmapMem,
    aclrtMemSetAccess,
    aclrtMemGetAllocationGranularity,
}

/// The process-wide ACL table resolved to this runtime, built once.
pub fn acl_api() -> &'static ascendcl_sys::AclApi {
    static API: OnceLock<ascendcl_sys::AclApi> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: `resolve` returns only functions of `acl`, each declared with the prototype of the table's field
        // of the same name (the `acl_entry!` declarations copy `ascendcl_sys::sys`), callable from any thread for
        // the life of the process.
        match unsafe { ascendcl_sys::AclApi::from_resolver(PathBuf::from(IN_PROCESS_PATH), &resolve) } {
            Ok(api) => api,
            // Every required symbol is in `EXPORTED` (a test checks it); this cannot happen.
            Err(error) => panic!("cann-twin does not implement a required ACL symbol: {error}"),
        }
    })
}
