//! HiXL's plain C client/server API (`libcann_hixl.so`), runtime-loaded: the second function table of this crate.
//!
//! HiXL is the successor of ADXL (`adxl::AdxlEngine` in `libllm_datadist.so`, deprecated in its favour). Its
//! client/server ("CS") API is plain C, so it is bound here like ACL, with the same three layers in one module:
//! raw types and [`HixlApi`] (exact C names), [`result`] (one function per call, `Result` naming the C function and
//! its [`HixlError`] code) and [`safe`] (a client and a server destroyed on drop).
//!
//! **Source of the facts.** No header package for HiXL exists to compile against (the torch-npu wheel the ABI step
//! uses ships ACL and HCCL headers only), so the prototypes, types and status codes were read from the public HiXL
//! repository `hicann/hixl` at commit `9ed283b27309463ed0faa490b79c0dc9ddef6377`: `include/cs/hixl_cs.h` (the CS API),
//! `src/hixl/proxy/hcomm/hcomm_res_defs.h` (the copy of hcomm's `EndpointDesc` and `CommMem` that header includes),
//! `include/hixl/hixl_types.h` (`RESOURCE_EXHAUSTED`) and the HIXL_CS interface chapter of its API documentation (call order and
//! constraints). The layouts are pinned by compile-time assertions below, computed from those definitions for
//! LP64 (x86_64 and aarch64 Linux); nothing here was checked against a compiled HiXL.
//!
//! **Layout notes.** `EndpointDesc` is 160 bytes (protocol 4, `CommAddr` 40 = type 4 + a 36-byte union, `EndpointLoc`
//! 64 = type 4 + a 60-byte union, 52 raw bytes), 4-aligned; the C unions are mirrored as their byte arrays with
//! typed helpers. `CommMem` is 24 bytes (type at 0, `addr` at 8, `size` at 16). `HixlClientDesc`, `HixlServerDesc`,
//! `HixlClientConfig` and `HixlServerConfig` are 128 bytes each (their reserved tails keep them so; the C++ default
//! member initialisers zero them, which the constructors here reproduce). `HixlOneSideOpDesc` is 24 bytes with the
//! *remote* buffer first. C enums are 4 bytes: `int` for the hcomm enums (they have -1 enumerators), `unsigned int`
//! for `HixlCompleteStatus`.
//!
//! **Call order** (from the CS documentation): the server registers its memory (`HixlCSServerRegMem`) and listens
//! before any client connects; a client registers all its local memory (`HixlCSClientRegMem`) before
//! `HixlCSClientConnect`; `HixlCSClientBatchPutAsync`/`GetAsync` return a `CompleteHandle` that
//! `HixlCSClientQueryCompleteStatus` polls (at most 4096 unqueried transfers per client); calls with a local device
//! endpoint need `aclrtSetDevice` on the calling thread first.
//!
//! Loading: [`api()`] tries `AIV_HIXL_LIB` (a full path, the only candidate when set), then the library directories
//! under `ASCEND_HOME_PATH`, then `libcann_hixl.so` through the dynamic loader; a failure lists every path tried.

#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::{c_char, c_void};
use core::mem::{align_of, offset_of, size_of};
use std::sync::OnceLock;

use crate::calls::act::{READS_COMPLETION, SUBMITS, WRITES_DEVICE};
use crate::loader::{LibrarySpec, LoadError, ASCEND_HOME_LIBRARY_DIRS};

/// `typedef uint32_t HixlStatus`.
pub type HixlStatus = u32;
/// Opaque server handle.
pub type HixlServerHandle = *mut c_void;
/// Opaque client handle.
pub type HixlClientHandle = *mut c_void;
/// Opaque handle of one submitted batch.
pub type CompleteHandle = *mut c_void;
/// Opaque handle of a memory registration.
pub type MemHandle = *mut c_void;

crate::c_consts! {
    /// HiXL's status codes (`hixl_cs.h`; `HIXL_RESOURCE_EXHAUSTED` is named by the CS documentation, its value is
    /// `RESOURCE_EXHAUSTED` of `hixl_types.h`). The first four are ADXL's codes too (docs/hardware.md section 7).
    pub table HIXL_STATUS_CODES: HixlStatus;
    HIXL_SUCCESS = 0;
    HIXL_PARAM_INVALID = 103_900;
    HIXL_TIMEOUT = 103_901;
    HIXL_RESOURCE_EXHAUSTED = 203_900;
    HIXL_FAILED = 503_900;
}

crate::c_enum! {
    /// Completion state of a batch (`enum HixlCompleteStatus`).
    pub enum HixlCompleteStatus: u32 {
        HIXL_COMPLETE_STATUS_WAITING = 0,
        HIXL_COMPLETE_STATUS_COMPLETED = 1,
        HIXL_COMPLETE_STATUS_TIMEOUT = 2,
        HIXL_COMPLETE_STATUS_FAILED = 3,
    }
}

crate::c_enum! {
    /// hcomm's transport protocol of an endpoint (`CommProtocol`).
    pub enum CommProtocol: i32 {
        COMM_PROTOCOL_RESERVED = -1,
        COMM_PROTOCOL_HCCS = 0,
        COMM_PROTOCOL_ROCE = 1,
        COMM_PROTOCOL_PCIE = 2,
        COMM_PROTOCOL_SIO = 3,
        COMM_PROTOCOL_UBC_CTP = 4,
        COMM_PROTOCOL_UBC_TP = 5,
        COMM_PROTOCOL_UB_MEM = 6,
        COMM_PROTOCOL_UBOE = 7,
        COMM_PROTOCOL_HCCS_ONLY = 8,
        COMM_PROTOCOL_UBG = 9,
    }
}

crate::c_enum! {
    /// Kind of a `CommAddr` (`CommAddrType`).
    pub enum CommAddrType: i32 {
        COMM_ADDR_TYPE_RESERVED = -1,
        COMM_ADDR_TYPE_IP_V4 = 0,
        COMM_ADDR_TYPE_IP_V6 = 1,
        COMM_ADDR_TYPE_ID = 2,
        COMM_ADDR_TYPE_EID = 3,
    }
}

crate::c_enum! {
    /// Where an endpoint is (`EndpointLocType`).
    pub enum EndpointLocType: i32 {
        ENDPOINT_LOC_TYPE_RESERVED = -1,
        ENDPOINT_LOC_TYPE_DEVICE = 0,
        ENDPOINT_LOC_TYPE_HOST = 1,
    }
}

crate::c_enum! {
    /// Where registered memory is (`CommMemType`).
    pub enum CommMemType: i32 {
        COMM_MEM_TYPE_INVALID = -1,
        COMM_MEM_TYPE_DEVICE = 0,
        COMM_MEM_TYPE_HOST = 1,
    }
}

crate::c_struct! {
    /// `CommAddr`: the type, then a 36-byte union (raw bytes, `in_addr`, `in6_addr`, a `uint32_t` id, a 16-byte EID).
    pub struct CommAddr {
        pub r#type: CommAddrType,
        pub raws: [u8; 36],
    }
}

crate::c_struct! {
    /// `EndpointLoc`: the type, then a 60-byte union (for a device: `devPhyId`, `superDevId`, `serverIdx`,
    /// `superPodIdx`, four `uint32_t`; for the host: one `uint32_t` id).
    pub struct EndpointLoc {
        pub locType: EndpointLocType,
        pub raws: [u8; 60],
    }
}

crate::c_struct! {
    /// `EndpointDesc` (160 bytes): one network endpoint of a device or the host.
    pub struct EndpointDesc {
        pub protocol: CommProtocol,
        pub commAddr: CommAddr,
        pub loc: EndpointLoc,
        pub raws: [u8; 52],
    }
}

crate::c_struct! {
    /// `CommMem` (24 bytes): a memory range to register.
    pub struct CommMem {
        pub r#type: CommMemType,
        pub addr: *mut c_void,
        pub size: u64,
    }
}

crate::c_struct! {
    /// `HixlClientConfig` (128 bytes).
    pub struct HixlClientConfig {
        pub global_resource_config: *const c_char,
        pub reserved: [u8; 120],
    }
}

crate::c_struct! {
    /// `HixlServerConfig` (128 bytes).
    pub struct HixlServerConfig {
        pub global_resource_config: *const c_char,
        pub reserved: [u8; 120],
    }
}

crate::c_struct! {
    /// `HixlClientDesc` (128 bytes): the client's and the server's endpoints and the server's listening address.
    pub struct HixlClientDesc {
        pub local_endpoint: *const EndpointDesc,
        pub remote_endpoint: *const EndpointDesc,
        pub server_ip: *const c_char,
        pub server_port: u32,
        /// RDMA traffic class.
        pub tc: u8,
        /// RDMA service level.
        pub sl: u8,
        pub reserved: [u8; 98],
    }
}

crate::c_struct! {
    /// `HixlServerDesc` (128 bytes).
    pub struct HixlServerDesc {
        pub endpoint_list: *const EndpointDesc,
        pub server_ip: *const c_char,
        pub server_port: u32,
        pub endpoint_list_num: u32,
        pub reserved: [u8; 104],
    }
}

crate::c_struct! {
    /// `HixlOneSideOpDesc` (24 bytes): one copy of a batch. Put: `local_buf` -> `remote_buf`; get: the reverse.
    pub struct HixlOneSideOpDesc {
        pub remote_buf: *mut c_void,
        pub local_buf: *mut c_void,
        pub len: u64,
    }
}

crate::c_struct! {
    /// **Twin-only, not a HiXL type**: what `cannTwinHixlClientEvidence` writes about one client of the twin
    /// runtime's HiXL (`cann-twin`), version [`TWIN_HIXL_EVIDENCE_VERSION`]: counts since the client was created,
    /// each made where the act happened. The vendor's HiXL has no such function (the table's symbol is optional).
    ///
    /// A caller sets `version` and `size` (at least this structure's bytes). Batches run by the AI CPU (`device_*`)
    /// count, from the consumption log of the AI CPU's SDMA channel, the SQEs their AI-CPU ops had executed (by who
    /// wrote each), the doorbells that exposed them (one per doorbell the engine took, by each ringer) and the flag
    /// SQEs (by who read each flag first); batches the twin moved over its TCP wire path (`wire_*`) count the runtime
    /// copies the client's Host thread made for their data.
    pub struct CannTwinHixlEvidence {
        pub version: u32,
        pub size: u32,
        /// Batches submitted (accepted) and their entries.
        pub batches: u64,
        pub entries: u64,
        /// Batches run by AI-CPU ops, and the AI-CPU kernel launches the client made for them (one per 128 entries).
        pub device_batches: u64,
        pub launches: u64,
        /// Launches whose ops ran while the provenance records were off (their acts are not recorded).
        pub unrecorded_launches: u64,
        /// Consumption-log entries the ops could not read (the log had dropped them).
        pub log_entries_lost: u64,
        pub sqes_by_aicpu: u64,
        pub sqes_by_host: u64,
        pub sqes_by_aiv: u64,
        pub sqes_unattributed: u64,
        pub doorbells_by_aicpu: u64,
        pub doorbells_by_host: u64,
        pub doorbells_by_aiv: u64,
        pub doorbells_unattributed: u64,
        pub flags_by_aicpu: u64,
        pub flags_by_host: u64,
        pub flags_by_aiv: u64,
        pub flags_unread: u64,
        /// Batches moved over the twin's TCP wire path, and the client-side runtime copies (`aclrtMemcpy`, each
        /// written, submitted and seen complete by the Host) of their data, with the bytes.
        pub wire_batches: u64,
        pub host_copies: u64,
        pub host_copy_bytes: u64,
    }
}

/// The layout version of [`CannTwinHixlEvidence`].
pub const TWIN_HIXL_EVIDENCE_VERSION: u32 = 1;

impl CannTwinHixlEvidence {
    /// An empty structure with `version` and `size` set, ready for `cannTwinHixlClientEvidence`.
    pub fn new() -> Self {
        CannTwinHixlEvidence {
            version: TWIN_HIXL_EVIDENCE_VERSION,
            size: size_of::<CannTwinHixlEvidence>() as u32,
            batches: 0,
            entries: 0,
            device_batches: 0,
            launches: 0,
            unrecorded_launches: 0,
            log_entries_lost: 0,
            sqes_by_aicpu: 0,
            sqes_by_host: 0,
            sqes_by_aiv: 0,
            sqes_unattributed: 0,
            doorbells_by_aicpu: 0,
            doorbells_by_host: 0,
            doorbells_by_aiv: 0,
            doorbells_unattributed: 0,
            flags_by_aicpu: 0,
            flags_by_host: 0,
            flags_by_aiv: 0,
            flags_unread: 0,
            wire_batches: 0,
            host_copies: 0,
            host_copy_bytes: 0,
        }
    }
}

impl Default for CannTwinHixlEvidence {
    fn default() -> Self {
        Self::new()
    }
}

// The layouts of the definitions named in the module documentation (LP64), pinned at compile time.
const _: () = {
    assert!(size_of::<CannTwinHixlEvidence>() == 8 + 21 * 8 && align_of::<CannTwinHixlEvidence>() == 8);
    assert!(size_of::<CommAddr>() == 40 && align_of::<CommAddr>() == 4);
    assert!(size_of::<EndpointLoc>() == 64 && align_of::<EndpointLoc>() == 4);
    assert!(size_of::<EndpointDesc>() == 160 && align_of::<EndpointDesc>() == 4);
    assert!(offset_of!(EndpointDesc, commAddr) == 4);
    assert!(offset_of!(EndpointDesc, loc) == 44);
    assert!(offset_of!(EndpointDesc, raws) == 108);
    assert!(size_of::<CommMem>() == 24);
    assert!(offset_of!(CommMem, addr) == 8 && offset_of!(CommMem, size) == 16);
    assert!(size_of::<HixlClientConfig>() == 128 && size_of::<HixlServerConfig>() == 128);
    assert!(size_of::<HixlClientDesc>() == 128 && align_of::<HixlClientDesc>() == 8);
    assert!(offset_of!(HixlClientDesc, server_ip) == 16);
    assert!(offset_of!(HixlClientDesc, server_port) == 24);
    assert!(offset_of!(HixlClientDesc, tc) == 28 && offset_of!(HixlClientDesc, sl) == 29);
    assert!(offset_of!(HixlClientDesc, reserved) == 30);
    assert!(size_of::<HixlServerDesc>() == 128);
    assert!(offset_of!(HixlServerDesc, server_port) == 16 && offset_of!(HixlServerDesc, endpoint_list_num) == 20);
    assert!(size_of::<HixlOneSideOpDesc>() == 24);
    assert!(offset_of!(HixlOneSideOpDesc, remote_buf) == 0 && offset_of!(HixlOneSideOpDesc, local_buf) == 8);
    assert!(size_of::<HixlCompleteStatus>() == 4);
};

impl EndpointDesc {
    /// An endpoint of NPU `device` (location DEVICE with `devPhyId = device`, address of type ID carrying the same
    /// number) over `protocol`. Which address an NPU's endpoint really has is *unverified on hardware*: HiXL's
    /// documentation points to hcomm for it; the ID form is the one that needs no network configuration.
    pub fn device(protocol: CommProtocol, device: u32) -> Self {
        let mut addr = [0u8; 36];
        addr[..4].copy_from_slice(&device.to_ne_bytes());
        let mut loc = [0u8; 60];
        loc[..4].copy_from_slice(&device.to_ne_bytes());
        EndpointDesc {
            protocol,
            commAddr: CommAddr { r#type: COMM_ADDR_TYPE_ID, raws: addr },
            loc: EndpointLoc { locType: ENDPOINT_LOC_TYPE_DEVICE, raws: loc },
            raws: [0; 52],
        }
    }

    /// `loc.device.devPhyId` (the first `uint32_t` of the location union).
    pub fn device_phy_id(&self) -> u32 {
        u32::from_ne_bytes([self.loc.raws[0], self.loc.raws[1], self.loc.raws[2], self.loc.raws[3]])
    }
}

impl HixlClientConfig {
    /// No global resource configuration, reserved bytes zero (the header's defaults).
    pub fn new() -> Self {
        HixlClientConfig { global_resource_config: core::ptr::null(), reserved: [0; 120] }
    }
}

impl Default for HixlClientConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl HixlServerConfig {
    /// No global resource configuration, reserved bytes zero (the header's defaults).
    pub fn new() -> Self {
        HixlServerConfig { global_resource_config: core::ptr::null(), reserved: [0; 120] }
    }
}

impl Default for HixlServerConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Where `libcann_hixl.so` is looked for: `AIV_HIXL_LIB` (a full path), else the library directories under
/// `ASCEND_HOME_PATH` (HiXL installs into the CANN toolkit's `lib64`), else the loader's search path.
pub const HIXL_LIBRARY: LibrarySpec = LibrarySpec {
    file_name: "libcann_hixl.so",
    override_var: "AIV_HIXL_LIB",
    roots: &[("ASCEND_HOME_PATH", ASCEND_HOME_LIBRARY_DIRS)],
};

crate::dynamic_library! {
    /// The HiXL CS entry points, resolved from one `libcann_hixl.so`.
    pub struct HixlApi;
    required {
        fn HixlCSServerCreate(
            server_desc: *const HixlServerDesc,
            config: *const HixlServerConfig,
            server_handle: *mut HixlServerHandle,
        ) -> HixlStatus;
        fn HixlCSServerRegMem(
            server_handle: HixlServerHandle,
            mem_tag: *const c_char,
            mem: *const CommMem,
            mem_handle: *mut MemHandle,
        ) -> HixlStatus;
        fn HixlCSServerListen(server_handle: HixlServerHandle, backlog: u32) -> HixlStatus;
        fn HixlCSServerUnregMem(server_handle: HixlServerHandle, mem_handle: MemHandle) -> HixlStatus;
        fn HixlCSServerDestroy(server_handle: HixlServerHandle) -> HixlStatus;
        fn HixlCSClientCreate(
            client_desc: *const HixlClientDesc,
            config: *const HixlClientConfig,
            client_handle: *mut HixlClientHandle,
        ) -> HixlStatus;
        fn HixlCSClientConnect(client_handle: HixlClientHandle, timeout_ms: u32) -> HixlStatus;
        fn HixlCSClientRegMem(
            client_handle: HixlClientHandle,
            mem_tag: *const c_char,
            mem: *const CommMem,
            mem_handle: *mut MemHandle,
        ) -> HixlStatus;
        fn HixlCSClientUnregMem(client_handle: HixlClientHandle, mem_handle: MemHandle) -> HixlStatus;
        fn HixlCSClientBatchPutAsync(
            client_handle: HixlClientHandle,
            list_num: u32,
            desc_list: *const HixlOneSideOpDesc,
            complete_handle: *mut CompleteHandle,
        ) -> HixlStatus;
        fn HixlCSClientBatchGetAsync(
            client_handle: HixlClientHandle,
            list_num: u32,
            desc_list: *const HixlOneSideOpDesc,
            complete_handle: *mut CompleteHandle,
        ) -> HixlStatus;
        fn HixlCSClientQueryCompleteStatus(
            client_handle: HixlClientHandle,
            complete_handle: CompleteHandle,
            complete_status: *mut HixlCompleteStatus,
        ) -> HixlStatus;
        fn HixlCSClientDestroy(client_handle: HixlClientHandle) -> HixlStatus;
    }
    optional {
        fn HixlCSClientBatchPutSync(
            client_handle: HixlClientHandle,
            list_num: u32,
            desc_list: *const HixlOneSideOpDesc,
            timeout_ms: u32,
        ) -> HixlStatus;
        fn HixlCSClientBatchGetSync(
            client_handle: HixlClientHandle,
            list_num: u32,
            desc_list: *const HixlOneSideOpDesc,
            timeout_ms: u32,
        ) -> HixlStatus;
        /// **Twin-only, not a HiXL API** (`cann-twin` exports it; the vendor's library does not): the client's
        /// counts ([`CannTwinHixlEvidence`]). `HIXL_PARAM_INVALID` for an unknown client, a null pointer, another
        /// version or a smaller size (nothing written).
        fn cannTwinHixlClientEvidence(
            client_handle: HixlClientHandle,
            evidence: *mut CannTwinHixlEvidence,
        ) -> HixlStatus;
    }
    // What a call can do to device work in flight (`calls::HostActs`): a batch is device work the library submits
    // (its AI-CPU kernel or its copies write device memory); a status query reads a completion.
    acts {
        HixlCSClientBatchPutAsync: WRITES_DEVICE | SUBMITS;
        HixlCSClientBatchGetAsync: WRITES_DEVICE | SUBMITS;
        HixlCSClientQueryCompleteStatus: READS_COMPLETION;
        HixlCSClientBatchPutSync: WRITES_DEVICE | SUBMITS | READS_COMPLETION;
        HixlCSClientBatchGetSync: WRITES_DEVICE | SUBMITS | READS_COMPLETION;
    }
}

crate::dynamic_library! {
    /// **Twin-only, not a CANN API**: the CPU twin runtime's C functions of HiXL's FabricMem engine (`cann-twin`,
    /// module `hixl::fabric_mem`). The vendor's FabricMem engine has no C API: it is reached only through ADXL's C++
    /// engine (`adxl::AdxlEngine` with the option `EnableUseFabricMem`, `hicann/hixl` `include/adxl/`), so no vendor
    /// library exports these names. Status codes are `adxl::Status` values (`PARAM_INVALID` 103900, `TIMEOUT` 103901,
    /// `NOT_CONNECTED` 103902, `ALREADY_CONNECTED` 103903, `FAILED` 503900); a query's status is an
    /// `adxl::TransferStatus` (0 waiting, 1 completed, 2 timeout, 3 failed). Engines are named by "ip:port" (a
    /// literal address).
    pub struct FabricMemApi;
    required {
        /// An engine on the calling thread's current device whose control server listens at `local_engine` (port 0:
        /// none listens), with AI-CPU unfold (`aicpu_unfold` nonzero) or Host unfold over `task_stream_num` (1..=8)
        /// streams.
        fn cannTwinFabricMemCreate(
            local_engine: *const c_char,
            aicpu_unfold: u32,
            task_stream_num: u32,
            engine: *mut u64,
        ) -> u32;
        /// Registers `[addr, addr + len)`, `mem_type` 0 device, 1 Host; writes the registration's handle.
        fn cannTwinFabricMemRegister(engine: u64, addr: u64, len: u64, mem_type: i32, handle: *mut u64) -> u32;
        fn cannTwinFabricMemDeregister(engine: u64, handle: u64) -> u32;
        /// Fetches and imports the peer `remote`'s registrations within `timeout_ms`.
        fn cannTwinFabricMemConnect(engine: u64, remote: *const c_char, timeout_ms: u32) -> u32;
        fn cannTwinFabricMemDisconnect(engine: u64, remote: *const c_char) -> u32;
        /// `count` operations of three words (local address, remote address, length); `op` 1 writes, 0 reads. With
        /// `request` null the call waits; otherwise it writes the request's id for `cannTwinFabricMemQuery`.
        fn cannTwinFabricMemTransfer(
            engine: u64,
            remote: *const c_char,
            op: i32,
            ops: *const u64,
            count: u64,
            timeout_ms: i32,
            request: *mut u64,
        ) -> u32;
        /// An Async transfer's `adxl::TransferStatus`; a final one releases the request.
        fn cannTwinFabricMemQuery(engine: u64, request: u64, status: *mut i32) -> u32;
        fn cannTwinFabricMemDestroy(engine: u64) -> u32;
    }
    optional {
        /// The engine's counts, in the structure of `cannTwinHixlClientEvidence` ([`CannTwinHixlEvidence`]).
        fn cannTwinFabricMemEvidence(engine: u64, evidence: *mut CannTwinHixlEvidence) -> u32;
    }
    // A transfer is device work the engine submits (its AI-CPU launches or its stream copies); a query reads a
    // completion.
    acts {
        cannTwinFabricMemTransfer: WRITES_DEVICE | SUBMITS;
        cannTwinFabricMemQuery: READS_COMPLETION;
    }
}

crate::error_code!(
    /// A HiXL status other than success. `Debug` and `Display` name documented codes, e.g.
    /// `HixlError(503900 HIXL_FAILED)`.
    HixlError(HixlStatus),
    HIXL_STATUS_CODES
);

/// A HiXL operation failed: the crate's [`Error`](crate::Error) over [`HixlError`].
pub type Error = crate::Error<HixlError>;

fn check(function: &'static str, status: HixlStatus) -> Result<(), Error> {
    if status == HIXL_SUCCESS {
        Ok(())
    } else {
        Err(Error::Call { function, code: HixlError(status) })
    }
}

/// The process-wide HiXL table, loaded on first use from [`HIXL_LIBRARY`]'s candidates; a failure is remembered.
pub fn api() -> Result<&'static HixlApi, Error> {
    static API: OnceLock<Result<HixlApi, LoadError>> = OnceLock::new();
    API.get_or_init(|| HixlApi::load(&HIXL_LIBRARY, &HIXL_LIBRARY.candidates_from_process_env()))
        .as_ref()
        .map_err(|error| Error::Load(error.clone()))
}

/// **Twin-only**: the FabricMem table resolved from the twin runtime loaded as the ACL library at `path` (the file the
/// ACL table was loaded from), loaded once per process: the first path asked is the one kept.
pub fn fabric_mem_api_in(path: &std::path::Path) -> Result<&'static FabricMemApi, Error> {
    static API: OnceLock<Result<FabricMemApi, LoadError>> = OnceLock::new();
    const SPEC: LibrarySpec = LibrarySpec { file_name: "libascendcl.so", override_var: "AIV_ASCENDCL_LIB", roots: &[] };
    let candidate = crate::loader::Candidate { path: path.to_owned(), origin: "the loaded ACL library".into() };
    API.get_or_init(|| FabricMemApi::load(&SPEC, &[candidate])).as_ref().map_err(|error| Error::Load(error.clone()))
}

/// Result layer: one function per CS call. Handles are raw; the caller keeps them live (or uses [`safe`]).
pub mod result {
    use core::ffi::CStr;

    use super::*;

    /// `HixlCSServerCreate`.
    pub fn server_create(
        api: &HixlApi,
        desc: &HixlServerDesc,
        config: &HixlServerConfig,
    ) -> Result<HixlServerHandle, Error> {
        let mut handle = core::ptr::null_mut();
        // SAFETY: both inputs are live references (the pointers they hold are the caller's to keep valid for the
        // call); the out-pointer is a live local.
        check("HixlCSServerCreate", unsafe { api.HixlCSServerCreate(desc, config, &mut handle) })?;
        Ok(handle)
    }

    /// `HixlCSServerRegMem`.
    ///
    /// # Safety
    /// `server` must be live; `mem` must describe memory that stays allocated until it is unregistered.
    pub unsafe fn server_reg_mem(
        api: &HixlApi,
        server: HixlServerHandle,
        tag: &CStr,
        mem: &CommMem,
    ) -> Result<MemHandle, Error> {
        let mut handle = core::ptr::null_mut();
        // SAFETY: the caller guarantees the handle and the memory; `tag` is NUL-terminated.
        check("HixlCSServerRegMem", unsafe { api.HixlCSServerRegMem(server, tag.as_ptr(), mem, &mut handle) })?;
        Ok(handle)
    }

    /// `HixlCSServerListen`.
    ///
    /// # Safety
    /// `server` must be live.
    pub unsafe fn server_listen(api: &HixlApi, server: HixlServerHandle, backlog: u32) -> Result<(), Error> {
        // SAFETY: the caller guarantees the handle.
        check("HixlCSServerListen", unsafe { api.HixlCSServerListen(server, backlog) })
    }

    /// `HixlCSServerUnregMem`.
    ///
    /// # Safety
    /// Both handles must be live; the registration is not used afterwards.
    pub unsafe fn server_unreg_mem(api: &HixlApi, server: HixlServerHandle, mem: MemHandle) -> Result<(), Error> {
        // SAFETY: the caller guarantees the handles.
        check("HixlCSServerUnregMem", unsafe { api.HixlCSServerUnregMem(server, mem) })
    }

    /// `HixlCSServerDestroy`.
    ///
    /// # Safety
    /// `server` must be live and is not used afterwards.
    pub unsafe fn server_destroy(api: &HixlApi, server: HixlServerHandle) -> Result<(), Error> {
        // SAFETY: the caller guarantees the handle.
        check("HixlCSServerDestroy", unsafe { api.HixlCSServerDestroy(server) })
    }

    /// `HixlCSClientCreate`.
    pub fn client_create(
        api: &HixlApi,
        desc: &HixlClientDesc,
        config: &HixlClientConfig,
    ) -> Result<HixlClientHandle, Error> {
        let mut handle = core::ptr::null_mut();
        // SAFETY: both inputs are live references whose pointers the caller keeps valid for the call; the
        // out-pointer is a live local.
        check("HixlCSClientCreate", unsafe { api.HixlCSClientCreate(desc, config, &mut handle) })?;
        Ok(handle)
    }

    /// `HixlCSClientConnect` (blocks up to `timeout_ms`).
    ///
    /// # Safety
    /// `client` must be live.
    pub unsafe fn client_connect(api: &HixlApi, client: HixlClientHandle, timeout_ms: u32) -> Result<(), Error> {
        // SAFETY: the caller guarantees the handle.
        check("HixlCSClientConnect", unsafe { api.HixlCSClientConnect(client, timeout_ms) })
    }

    /// `HixlCSClientRegMem`.
    ///
    /// # Safety
    /// `client` must be live; `mem` must describe memory that stays allocated until it is unregistered.
    pub unsafe fn client_reg_mem(
        api: &HixlApi,
        client: HixlClientHandle,
        tag: &CStr,
        mem: &CommMem,
    ) -> Result<MemHandle, Error> {
        let mut handle = core::ptr::null_mut();
        // SAFETY: the caller guarantees the handle and the memory; `tag` is NUL-terminated.
        check("HixlCSClientRegMem", unsafe { api.HixlCSClientRegMem(client, tag.as_ptr(), mem, &mut handle) })?;
        Ok(handle)
    }

    /// `HixlCSClientUnregMem`.
    ///
    /// # Safety
    /// Both handles must be live; the registration is not used afterwards.
    pub unsafe fn client_unreg_mem(api: &HixlApi, client: HixlClientHandle, mem: MemHandle) -> Result<(), Error> {
        // SAFETY: the caller guarantees the handles.
        check("HixlCSClientUnregMem", unsafe { api.HixlCSClientUnregMem(client, mem) })
    }

    fn list_len(function: &'static str, descs: &[HixlOneSideOpDesc]) -> Result<u32, Error> {
        match u32::try_from(descs.len()) {
            Ok(0) | Err(_) => Err(Error::InvalidArgument {
                function,
                reason: format!("{} copies in one batch; 1 to {} are allowed", descs.len(), u32::MAX),
            }),
            Ok(n) => Ok(n),
        }
    }

    /// `HixlCSClientBatchPutAsync`: `local_buf` -> `remote_buf` for every entry.
    ///
    /// # Safety
    /// `client` must be live and connected; every range must be registered memory that stays allocated until the
    /// batch's status is final.
    pub unsafe fn client_batch_put_async(
        api: &HixlApi,
        client: HixlClientHandle,
        descs: &[HixlOneSideOpDesc],
    ) -> Result<CompleteHandle, Error> {
        let n = list_len("HixlCSClientBatchPutAsync", descs)?;
        let mut handle = core::ptr::null_mut();
        // SAFETY: the caller guarantees the handle and the ranges; the list is live for the call.
        check("HixlCSClientBatchPutAsync", unsafe {
            api.HixlCSClientBatchPutAsync(client, n, descs.as_ptr(), &mut handle)
        })?;
        Ok(handle)
    }

    /// `HixlCSClientBatchGetAsync`: `remote_buf` -> `local_buf` for every entry.
    ///
    /// # Safety
    /// As [`client_batch_put_async`].
    pub unsafe fn client_batch_get_async(
        api: &HixlApi,
        client: HixlClientHandle,
        descs: &[HixlOneSideOpDesc],
    ) -> Result<CompleteHandle, Error> {
        let n = list_len("HixlCSClientBatchGetAsync", descs)?;
        let mut handle = core::ptr::null_mut();
        // SAFETY: the caller guarantees the handle and the ranges; the list is live for the call.
        check("HixlCSClientBatchGetAsync", unsafe {
            api.HixlCSClientBatchGetAsync(client, n, descs.as_ptr(), &mut handle)
        })?;
        Ok(handle)
    }

    /// `HixlCSClientBatchPutSync` (optional symbol; blocks up to `timeout_ms`).
    ///
    /// # Safety
    /// As [`client_batch_put_async`].
    pub unsafe fn client_batch_put_sync(
        api: &HixlApi,
        client: HixlClientHandle,
        descs: &[HixlOneSideOpDesc],
        timeout_ms: u32,
    ) -> Result<(), Error> {
        api.require("HixlCSClientBatchPutSync")?;
        let n = list_len("HixlCSClientBatchPutSync", descs)?;
        // SAFETY: the caller guarantees the handle and the ranges; the list is live for the call.
        check("HixlCSClientBatchPutSync", unsafe {
            api.HixlCSClientBatchPutSync(client, n, descs.as_ptr(), timeout_ms)?
        })
    }

    /// `HixlCSClientBatchGetSync` (optional symbol; blocks up to `timeout_ms`).
    ///
    /// # Safety
    /// As [`client_batch_put_async`].
    pub unsafe fn client_batch_get_sync(
        api: &HixlApi,
        client: HixlClientHandle,
        descs: &[HixlOneSideOpDesc],
        timeout_ms: u32,
    ) -> Result<(), Error> {
        api.require("HixlCSClientBatchGetSync")?;
        let n = list_len("HixlCSClientBatchGetSync", descs)?;
        // SAFETY: the caller guarantees the handle and the ranges; the list is live for the call.
        check("HixlCSClientBatchGetSync", unsafe {
            api.HixlCSClientBatchGetSync(client, n, descs.as_ptr(), timeout_ms)?
        })
    }

    /// `HixlCSClientQueryCompleteStatus`: the state of a submitted batch (a final state releases the handle).
    ///
    /// # Safety
    /// `client` must be live and `batch` one of its batches not yet seen in a final state.
    pub unsafe fn client_query_complete_status(
        api: &HixlApi,
        client: HixlClientHandle,
        batch: CompleteHandle,
    ) -> Result<HixlCompleteStatus, Error> {
        let mut status = HIXL_COMPLETE_STATUS_WAITING;
        // SAFETY: the caller guarantees the handles; the out-pointer is a live local.
        check("HixlCSClientQueryCompleteStatus", unsafe {
            api.HixlCSClientQueryCompleteStatus(client, batch, &mut status)
        })?;
        Ok(status)
    }

    /// `HixlCSClientDestroy`.
    ///
    /// # Safety
    /// `client` must be live and is not used afterwards.
    pub unsafe fn client_destroy(api: &HixlApi, client: HixlClientHandle) -> Result<(), Error> {
        // SAFETY: the caller guarantees the handle.
        check("HixlCSClientDestroy", unsafe { api.HixlCSClientDestroy(client) })
    }
}

/// Safe owners: a server and a client destroyed on drop (registrations are undone first).
pub mod safe {
    use core::ffi::CStr;

    use super::*;

    /// A HiXL server: memory registered, listening; unregistered and destroyed on drop.
    #[derive(Debug)]
    pub struct Server<'api> {
        api: &'api HixlApi,
        raw: HixlServerHandle,
        registrations: Vec<MemHandle>,
    }

    // SAFETY: the handle is an opaque pointer into the library, which the CS documentation lets any thread use
    // (with the device bound); this owner serialises nothing itself, and drop runs on one thread.
    unsafe impl Send for Server<'_> {}
    // SAFETY: as above; `&Server` exposes no call.
    unsafe impl Sync for Server<'_> {}

    impl<'api> Server<'api> {
        /// `HixlCSServerCreate` for `endpoints` at `ip:port`, then `HixlCSServerRegMem` of each `(tag, mem)`, then
        /// `HixlCSServerListen(backlog)`; a failed step destroys what was made.
        ///
        /// # Safety
        /// Every `mem` must stay allocated until the server drops.
        pub unsafe fn start(
            api: &'api HixlApi,
            endpoints: &[EndpointDesc],
            ip: &CStr,
            port: u32,
            memory: &[(&CStr, CommMem)],
            backlog: u32,
        ) -> Result<Self, Error> {
            let desc = HixlServerDesc {
                endpoint_list: endpoints.as_ptr(),
                server_ip: ip.as_ptr(),
                server_port: port,
                endpoint_list_num: endpoints.len() as u32,
                reserved: [0; 104],
            };
            let raw = result::server_create(api, &desc, &HixlServerConfig::new())?;
            let mut server = Server { api, raw, registrations: Vec::new() };
            for (tag, mem) in memory {
                // SAFETY: the server is live; the caller guarantees the memory.
                server.registrations.push(unsafe { result::server_reg_mem(api, raw, tag, mem) }?);
            }
            // SAFETY: the server is live.
            unsafe { result::server_listen(api, raw, backlog) }?;
            Ok(server)
        }
    }

    impl Drop for Server<'_> {
        fn drop(&mut self) {
            for registration in self.registrations.drain(..) {
                // SAFETY: the server and the registration are live; this is the registration's last use.
                let _ = unsafe { result::server_unreg_mem(self.api, self.raw, registration) };
            }
            // SAFETY: the server is live and this is its last use.
            let _ = unsafe { result::server_destroy(self.api, self.raw) };
        }
    }

    /// A HiXL client: created, local memory registered, connected; unregistered and destroyed on drop.
    #[derive(Debug)]
    pub struct Client<'api> {
        api: &'api HixlApi,
        raw: HixlClientHandle,
        registrations: Vec<MemHandle>,
    }

    // SAFETY: as for `Server`: an opaque library handle; the owner's users serialise batch calls themselves.
    unsafe impl Send for Client<'_> {}
    // SAFETY: as above.
    unsafe impl Sync for Client<'_> {}

    impl<'api> Client<'api> {
        /// `HixlCSClientCreate(local -> remote at ip:port)`, `HixlCSClientRegMem` of each `(tag, mem)`, then
        /// `HixlCSClientConnect(timeout_ms)`; a failed step destroys what was made.
        ///
        /// # Safety
        /// Every `mem` must stay allocated until the client drops.
        pub unsafe fn connect(
            api: &'api HixlApi,
            local: &EndpointDesc,
            remote: &EndpointDesc,
            ip: &CStr,
            port: u32,
            memory: &[(&CStr, CommMem)],
            timeout_ms: u32,
        ) -> Result<Self, Error> {
            let desc = HixlClientDesc {
                local_endpoint: local,
                remote_endpoint: remote,
                server_ip: ip.as_ptr(),
                server_port: port,
                tc: 0,
                sl: 0,
                reserved: [0; 98],
            };
            let raw = result::client_create(api, &desc, &HixlClientConfig::new())?;
            let mut client = Client { api, raw, registrations: Vec::new() };
            for (tag, mem) in memory {
                // SAFETY: the client is live; the caller guarantees the memory.
                client.registrations.push(unsafe { result::client_reg_mem(api, raw, tag, mem) }?);
            }
            // SAFETY: the client is live.
            unsafe { result::client_connect(api, raw, timeout_ms) }?;
            Ok(client)
        }

        /// The raw handle, for the batch calls of [`result`].
        pub fn as_raw(&self) -> HixlClientHandle {
            self.raw
        }

        /// The table the client was made with.
        pub fn api(&self) -> &'api HixlApi {
            self.api
        }
    }

    impl Drop for Client<'_> {
        fn drop(&mut self) {
            for registration in self.registrations.drain(..) {
                // SAFETY: the client and the registration are live; this is the registration's last use.
                let _ = unsafe { result::client_unreg_mem(self.api, self.raw, registration) };
            }
            // SAFETY: the client is live and this is its last use.
            let _ = unsafe { result::client_destroy(self.api, self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_endpoint_carries_the_device_number_in_address_and_location() {
        let endpoint = EndpointDesc::device(COMM_PROTOCOL_HCCS, 5);
        assert_eq!(endpoint.device_phy_id(), 5);
        assert_eq!(endpoint.commAddr.r#type, COMM_ADDR_TYPE_ID);
        assert_eq!(&endpoint.commAddr.raws[..4], &5u32.to_ne_bytes());
        assert_eq!(endpoint.loc.locType, ENDPOINT_LOC_TYPE_DEVICE);
        assert!(endpoint.raws.iter().all(|&b| b == 0));
    }

    #[test]
    fn status_codes_are_named_and_the_manifest_matches_the_layout_notes() {
        assert_eq!(format!("{:?}", HixlError(HIXL_FAILED)), "HixlError(503900 HIXL_FAILED)");
        assert_eq!(format!("{:?}", HixlError(42)), "HixlError(42 undocumented)");
        assert_eq!(HixlCompleteStatus(3).name(), Some("HIXL_COMPLETE_STATUS_FAILED"));
        let desc = HixlClientDesc::abi_decl();
        let offsets: Vec<(&str, usize)> = desc.fields.iter().map(|f| (f.name, f.offset)).collect();
        assert_eq!(
            offsets,
            [
                ("local_endpoint", 0),
                ("remote_endpoint", 8),
                ("server_ip", 16),
                ("server_port", 24),
                ("tc", 28),
                ("sl", 29),
                ("reserved", 30)
            ]
        );
        assert_eq!(HixlApi::function_decls().len(), 16);
        assert_eq!(HixlApi::function_decls().iter().filter(|f| f.optional).count(), 3);
        assert_eq!(FabricMemApi::function_decls().len(), 9);
        assert_eq!(FabricMemApi::act_class("cannTwinFabricMemQuery"), Some(READS_COMPLETION));
    }

    #[test]
    fn candidates_are_the_override_alone_or_the_install_root_then_the_loader() {
        let only = HIXL_LIBRARY.candidates(&|name| (name == "AIV_HIXL_LIB").then(|| "/x/libcann_hixl.so".into()));
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].origin, "AIV_HIXL_LIB");
        let rooted = HIXL_LIBRARY.candidates(&|name| (name == "ASCEND_HOME_PATH").then(|| "/cann".into()));
        assert_eq!(rooted.first().map(|c| c.path.display().to_string()), Some("/cann/lib64/libcann_hixl.so".into()));
        assert_eq!(rooted.last().map(|c| c.origin.as_str()), Some("dynamic loader search path"));
    }
}
