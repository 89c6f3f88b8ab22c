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
//! | binaries, launch | `aclrtBinaryLoadFromData`, `aclrtBinaryGetFunction`, `aclrtBinaryUnLoad`, `aclrtLaunchKernel`, `aclrtLaunchKernelWithHostArgs` (module [`kernel`]: the binary is a host shared object built for the CPU model; emulated AIV cores) |
//! | VMM | `aclrtMallocPhysical`, `aclrtFreePhysical`, `aclrtReserveMemAddress`, `aclrtReleaseMemAddress`, `aclrtMapMem`, `aclrtUnmapMem`, `aclrtMemSetAccess`, `aclrtMemGetAllocationGranularity` |
//! | VMM sharing ([`vmm_share`]) | `aclrtMemExportToShareableHandle`, `aclrtMemExportToShareableHandleV2`, `aclrtMemImportFromShareableHandle`, `aclrtMemImportFromShareableHandleV2` |
//! | IPC keys ([`vmm_share`]) | `aclrtIpcMemGetExportKey`, `aclrtIpcMemImportByKey`, `aclrtIpcMemClose` |
//! | for Mooncake's Ascend wheel (`acl_compat`) | `aclrtGetCurrentContext`, `aclrtSetCurrentContext` (one context per device; setting it makes the device current on the thread), `aclrtGetPhyDevIdByLogicDevId`, `aclrtGetLogicDevIdByUserDevId` (identity), `aclrtPointerGetAttributes`, `aclrtStreamAbort`, `aclGetRecentErrMsg` (per thread), `aclrtGetSocName` (`"cann-twin"`); `aclrtMemcpyBatch` and `aclrtReserveMemAddressNoUCMemory` return `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` |
//! | HiXL client/server ([`hixl`]) | every `HixlCS*` function of `ascendcl_sys::hixl::HixlApi` and `HixlCSClientGetRemoteMem`, and the twin-only `cannTwinHixlClientEvidence`, in-process table [`hixl_api`] (resolver [`resolve_hixl`]), exported under the C names; the twin-only FabricMem functions `cannTwinFabricMem*` ([`hixl::fabric_mem`]), in-process table [`fabric_mem_api`] |
//! | profiler ([`prof`]) | every function of `ascendcl_sys::prof::ProfApi` (`aclprofInit`, `aclprofCreateConfig`, `aclprofStart`, `aclprofStop`, `aclprofDestroyConfig`, `aclprofFinalize`): a model recording the twin's copies and kernel launches as task records, in-process table [`prof_api`] (resolver [`resolve_prof`]), exported under the C names |
//!
//! # Not yet implemented
//!
//! These optional symbols are **not resolved**: the table's method returns `MissingSymbol`, reporting the
//! function as not provided by this runtime. Nothing silently succeeds.
//! Notifies (`aclrtCreateNotify`, `aclrtDestroyNotify`, `aclrtRecordNotify`, `aclrtWaitAndResetNotify`,
//! `aclrtGetNotifyId`). Within implemented functions,
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
//! `aclrtMalloc` memory reads zero on the twin; the NPU gives no such promise. The runtime's state sits behind one
//! mutex; the device address space has a read-write lock of its own: translations and the copies through them
//! (the Host's and the SDMA engines') run under its read lock, allocation, free, map and unmap under its write
//! lock, so an engine's 1 MiB copy never holds the runtime mutex. Stream tasks run in order on one worker thread
//! per stream.
//!
//! # VMM export and import
//!
//! [`vmm_share`]: an exported physical allocation is imported, in this process or another, as a physical handle on
//! the *same memfd pages*. The `u64` shareable handle is the exporter's pid (bits 63..42) and 42 random bits (the
//! capability); the V2 fabric handle carries it in bytes 0..8 with the magic `cann-twin-fabric` in bytes 8..24. A
//! process with live exports runs one service thread on the abstract socket `cann-twin-vmm-<pid>`, which passes
//! the memfd by `SCM_RIGHTS` to same-uid peers (`SO_PEERCRED`), with bounded waits and connection limits; it stops
//! with the last export. Flags 0 (pid whitelist; `aclrtMemSetPidToShareableHandle` is not declared) refuse other
//! processes; `DISABLE_PID_VALIDATION` admits them. Freeing the exporter's memory withdraws the export; mappings
//! already made stay valid. Codes: null arguments and a handle type other than NONE `ACL_ERROR_INVALID_PARAM`
//! (vendor source); unknown, forged or freed handles `ACL_ERROR_RT_INVALID_HANDLE`; a second export or import
//! `ACL_ERROR_RT_PARAM_INVALID`; flags 0 from another process `ACL_ERROR_RT_NO_PERMISSION`; **the exporting process
//! gone `ACL_ERROR_RT_IPC_ERROR`, at once** (the peer-loss signal; ACL has no probe); no answer within 2 s
//! `ACL_ERROR_RT_TIMEOUT` (guesses; docs/twin-runtime.md has the table). Not strict: the vendor documents import and
//! export in one process as unsupported; the twin allows it (for a second device).
//!
//! IPC keys use the same service: the key `cann-twin-ipc-<16 hex digits>` names a range of one `aclrtMalloc`
//! allocation; the importer maps the exporter's heap memfd range as a device window of its own. `aclrtIpcMemClose`
//! unmaps (importer) or withdraws (exporter); `aclrtFree` withdraws the allocation's keys.
//!
//! # HiXL and the AI CPU
//!
//! [`hixl`]: HiXL's C client/server API. The server listens on its description's `server_ip:server_port`, a client
//! connects there. A batch between device memory runs as HiXL's client-server mode with a device endpoint does: the
//! server's DEVICE registrations are exported and imported into the client's device address space at connect, and each
//! batch is launched as AI-CPU tasks (one per 128 entries) on the client's stream; the emulated AI CPU (module
//! `aicpu`: per device a pool of threads, and SDMA channels of its own, indices 64 and up) writes the SQEs, rings the
//! doorbells and reads the completion flags, and the records say so. What cannot be imported (remote Host memory) moves
//! over the TCP connection with each side's own `aclrtMemcpy`. Local ranges must lie in the client's registrations and
//! remote ranges in the server's (sent at connect), else the call is `HIXL_PARAM_INVALID`; at most 4096 unqueried
//! entries per client (`HIXL_RESOURCE_EXHAUSTED`); Connect and Sync calls bounded by their `timeout_ms`, Async batches
//! by 10 s; a vanished server fails pending batches at once. Codes are `hixl_cs.h`'s; which case gets which is
//! documented in docs/twin-runtime.md (mostly guesses). The twin-only `cannTwinHixlClientEvidence` (not a HiXL API)
//! reports a client's records.
//!
//! # The device side: SHMEM, SDMA engines, register pages
//!
//! [`shmem`] implements the SHMEM host C ABI (`cann_shmem_sys::ShmemApi`, resolved by [`resolve_shmem`], table
//! [`shmem_api`]). `aclshmemx_init_attr` with the SDMA engine creates, on the calling thread's current device, the
//! SDMA workspace as SHMEM lays it out (16 KiB of device memory: `{u32 flag; u32 total_queue_num}`, then 48
//! channel records of 64 bytes at offset 64) and, per channel, an SQ ring of [`sdma::SQ_DEPTH`] SQEs in device
//! memory, a doorbell register page at a device address and an engine thread ([`sdma`]). The workspace address is
//! in the data symbol `g_state`, laid out as `cann_shmem_sys::device_state` reads SHMEM's state.
//!
//! Engines wake on a doorbell, execute SQEs strictly in order (validating type, opcode, length and both address
//! ranges through the translation), copy through the device view, write 8-byte aligned flag copies atomically
//! with release ordering, publish `sq_head` in the record, and stop on a bad SQE with a
//! [`control::ChannelException`] (channel, sq id, head, tail, syndrome, raw SQE) until reset.
//!
//! The doorbell is rung by [`register_write`] (C: [`aiv_twin_register_write`]), the entry point a CPU AscendC layer
//! calls from `copy_ubuf_to_gm` when the destination is a register page. Only a 4-byte write at offset 0x8 is
//! accepted; any other width or offset writes nothing, returns [`RegisterFault::Refused`] and raises a
//! [`control::Syndrome::REGISTER_ACCESS`] exception naming offset and width. C return values: 0 accepted, -1 not a
//! register page, -2 refused, -3 null source.
//!
//! Syndromes (the twin's own values; no public source gives STARS syndromes; 0x10-0x16 and 0x18 equal the root
//! crate's `SdmaSyndrome`): 0x10 type not SDMA, 0x11 opcode not copy, 0x12 length 0 or above 1 MiB, 0x13 source does
//! not translate for reading, 0x14 destination does not translate for writing, 0x15 doorbell tail `>= sq_depth`, 0x16
//! register access of the wrong width or offset, 0x17 SQ slot or record no longer translates, 0x18 a copy SQE's
//! opcode word, kernel credit, pointer mode or link type is not SHMEM's for a copy.
//!
//! [`nic`] is a twin RoCE NIC per device for the device-initiated RDMA path (docs/rdma.md, "The twin NIC"): memory
//! registration with lkey/rkey, reliable-connected QPs whose SQ and CQ live in device memory and whose doorbells
//! (8 bytes at 0x0 and 0x8 of a register page, reached through [`register_write`] when the page is no SDMA
//! channel's) start an engine per QP; RDMA WRITE and READ travel to the peer twin NIC over TCP with
//! acknowledgements, timeouts and retransmissions; the target validates every remote access; CQEs carry the owner
//! bit and the status, and after the first error every WQE is flushed.
//!
//! [`control`] is the fault-injection API for tests: a channel's exception, stall/release, reset (head := tail,
//! exception cleared, bounded wait), SQEs executed, doorbells rung; and [`control::occupancy`], the device model's
//! occupancy (per block, ns executing vs polling on its emulated core; per SDMA channel, ns busy), cumulative
//! snapshots a caller diffs.
//!
//! SHMEM return codes (`aclshmem_error_code_t` from `hicann/shmem` `include/host/shmem_host_def.h`, later
//! `aclshmem_host_def.h`, which adds `ACLSHMEM_NOT_SUPPORTED`; *source*: the
//! case is handled so in `hicann/shmem` `src/host/init/shmem_init.cpp`; *guess*: the twin's choice):
//!
//! | case | code | source |
//! |---|---|---|
//! | `init_attr` with null attributes | `ACLSHMEM_INVALID_PARAM` -1 | source |
//! | `init_attr` while initialised | `ACLSHMEM_INNER_ERROR` -4 | source |
//! | `my_pe < 0`, `n_pes <= 0` or above 16384, `local_mem_size` 0 or above 40 GiB, a zero timeout, engine type 0 or unknown bits | `ACLSHMEM_INVALID_VALUE` -2 | source (`check_attr`) |
//! | `my_pe >= n_pes` | `ACLSHMEM_INVALID_PARAM` | source |
//! | `set_attr_uniqueid_args`: size above 40 GiB, `n_pes` above 16384, `my_pe >= 16384` | `ACLSHMEM_INVALID_VALUE` | source |
//! | `set_attr_uniqueid_args` or `get_uniqueid` with a null pointer | `ACLSHMEM_INVALID_PARAM` | guess (SHMEM dereferences) |
//! | bootstrap flags other than `INIT_WITH_UNIQUEID` | `ACLSHMEM_NOT_SUPPORTED` -100 | guess (not modelled) |
//! | unique id not made by this twin (version or magic) | `ACLSHMEM_BOOTSTRAP_ERROR` -6 | guess |
//! | no `aclInit` or no current device on the thread | `ACLSHMEM_NOT_INITED` -5 | guess |
//! | SDMA resources could not be created | `ACLSHMEM_INNER_ERROR` | guess |
//! | `aclshmem_finalize` when not initialised | success | source |
//! | `aclshmemx_init_status` | 0 not initialised, 2 initialised (`aclshmemx_init_status_t`) | header |
//! | `aclshmem_my_pe`/`n_pes` before the first init | -1 (`g_state` initializer) | source |
//! | `aclshmem_info_get_version` | 1, 1 (`ACLSHMEM_MAJOR_VERSION`/`MINOR`: the interface, not a release); null pointers: nothing written | header, source |
//! | heap calls when not initialised, size 0, past `local_mem_size`, bad alignment | null | guess |
//!
//! Not modelled: cross-process bootstrap (with `n_pes > 1` each process sets up its own PE, with no exchange or
//! barrier), a symmetric heap (`aclshmem_ptr` is the identity for the own PE, null for others), the notify ids at
//! workspace offset 14 KiB, SHMEM's device copy of its state at a fixed device address, the 48 ACL streams SHMEM
//! creates (the records' stream, SQ and CQ ids are the channel index), and the values the AICPU operator writes
//! (`sq_depth` 2048 and `flag` 1 are guesses).
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
mod acl_compat;
mod activity;
pub mod adxl_options;
mod aicpu;
pub mod control;
mod entry;
pub mod evidence;
pub mod hixl;
pub mod kernel;
mod memory;
pub mod nic;
mod occupancy;
pub mod prof;
mod provenance;
mod runtime;
pub mod sdma;
pub mod shmem;
mod space;
mod stream;
pub mod vmm_share;

pub use hixl::{fabric_mem_api, hixl_api, resolve_hixl};
pub use prof::{prof_api, resolve as resolve_prof};
pub use runtime::DEFAULT_DEVICE_COUNT;
pub use sdma::{aiv_twin_register_write, register_write, RegisterFault};
pub use shmem::{resolve_shmem, resolve_shmem_instance, shmem_api, shmem_api_instance, SHMEM_INSTANCES};

/// The version `aclrtGetVersion` reports: this crate's.
pub const TWIN_VERSION: (i32, i32, i32) = (0, 1, 0);
/// The name this runtime gives itself: the first word of [`TWIN_VERSION_STRING`].
pub const RUNTIME_NAME: &str = "cann-twin";
/// The string `aclsysGetCANNVersion` reports in `version` for the CANN and runtime packages: [`RUNTIME_NAME`], a
/// space, this runtime's version. A program that loads an ACL library tells the twin runtime by this answer.
pub const TWIN_VERSION_STRING: &str = "cann-twin 0.1.0";

/// The prefix of the name of every thread this runtime starts (emulated cores, SDMA engines, stream workers): device
/// time, which Host CPU figures leave out.
pub const THREAD_PREFIX: &str = "cann-twin-";

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
    aclrtBinaryLoadFromData,
    aclrtBinaryGetFunction,
    aclrtBinaryUnLoad,
    aclrtLaunchKernel,
    aclrtLaunchKernelWithHostArgs,
    aclrtMemExportToShareableHandle,
    aclrtMemExportToShareableHandleV2,
    aclrtMemImportFromShareableHandle,
    aclrtMemImportFromShareableHandleV2,
    aclrtIpcMemGetExportKey,
    aclrtIpcMemImportByKey,
    aclrtIpcMemClose,
    // acl_compat: what Mooncake's Ascend wheel imports besides the above (docs/mooncake-npu-wheel.md section 4).
    aclGetRecentErrMsg,
    aclrtGetSocName,
    aclrtGetPhyDevIdByLogicDevId,
    aclrtGetLogicDevIdByUserDevId,
    aclrtGetCurrentContext,
    aclrtSetCurrentContext,
    aclrtStreamAbort,
    aclrtPointerGetAttributes,
    aclrtMemcpyBatch,
    aclrtReserveMemAddressNoUCMemory,
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
