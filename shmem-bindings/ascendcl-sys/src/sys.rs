//! Raw layer: the ACL types, constants and entry points this project uses, with their exact C names, and the
//! function table resolved from `libascendcl.so`.
//!
//! Every declaration here comes from the ACL headers shipped in the `torch-npu` wheel
//! (`torch_npu/include/third_party/acl/inc/acl/acl_rt.h`, `acl_base_rt.h`, `error_codes/rt_error_codes.h`) and is
//! checked against them by the ABI test (`tests/abi.rs`, run by `tests/run.sh`). Nothing here calls the library.

#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::{c_char, c_void};

use crate::abi::AbiManifest;
use crate::calls::act::{READS_COMPLETION, SUBMITS, WRITES_DEVICE};
use crate::loader::{LibrarySpec, ASCEND_HOME_LIBRARY_DIRS};

/// Every ACL call returns this: 0 on success, else an error code (see [`ACL_ERROR_CODES`]).
pub type aclError = i32;
/// A stream (`void *`).
pub type aclrtStream = *mut c_void;
/// A context (`void *`).
pub type aclrtContext = *mut c_void;
/// A notify (`void *`).
pub type aclrtNotify = *mut c_void;
/// A physical memory handle of the VMM API (`void *`).
pub type aclrtDrvMemHandle = *mut c_void;
/// A loaded device binary (`void *`).
pub type aclrtBinHandle = *mut c_void;
/// A kernel function inside a loaded binary (`void *`).
pub type aclrtFuncHandle = *mut c_void;

/// Success.
pub const ACL_SUCCESS: aclError = 0;

crate::c_consts! {
    /// Every documented ACL error code with its C name (`acl_base_rt.h`, `error_codes/rt_error_codes.h`).
    pub table ACL_ERROR_CODES: aclError;
    ACL_ERROR_INVALID_PARAM = 100000;
    ACL_ERROR_UNINITIALIZE = 100001;
    ACL_ERROR_REPEAT_INITIALIZE = 100002;
    ACL_ERROR_INVALID_FILE = 100003;
    ACL_ERROR_WRITE_FILE = 100004;
    ACL_ERROR_INVALID_FILE_SIZE = 100005;
    ACL_ERROR_PARSE_FILE = 100006;
    ACL_ERROR_FILE_MISSING_ATTR = 100007;
    ACL_ERROR_FILE_ATTR_INVALID = 100008;
    ACL_ERROR_INVALID_DUMP_CONFIG = 100009;
    ACL_ERROR_INVALID_PROFILING_CONFIG = 100010;
    ACL_ERROR_INVALID_MODEL_ID = 100011;
    ACL_ERROR_DESERIALIZE_MODEL = 100012;
    ACL_ERROR_PARSE_MODEL = 100013;
    ACL_ERROR_READ_MODEL_FAILURE = 100014;
    ACL_ERROR_MODEL_SIZE_INVALID = 100015;
    ACL_ERROR_MODEL_MISSING_ATTR = 100016;
    ACL_ERROR_MODEL_INPUT_NOT_MATCH = 100017;
    ACL_ERROR_MODEL_OUTPUT_NOT_MATCH = 100018;
    ACL_ERROR_MODEL_NOT_DYNAMIC = 100019;
    ACL_ERROR_OP_TYPE_NOT_MATCH = 100020;
    ACL_ERROR_OP_INPUT_NOT_MATCH = 100021;
    ACL_ERROR_OP_OUTPUT_NOT_MATCH = 100022;
    ACL_ERROR_OP_ATTR_NOT_MATCH = 100023;
    ACL_ERROR_OP_NOT_FOUND = 100024;
    ACL_ERROR_OP_LOAD_FAILED = 100025;
    ACL_ERROR_UNSUPPORTED_DATA_TYPE = 100026;
    ACL_ERROR_FORMAT_NOT_MATCH = 100027;
    ACL_ERROR_BIN_SELECTOR_NOT_REGISTERED = 100028;
    ACL_ERROR_KERNEL_NOT_FOUND = 100029;
    ACL_ERROR_BIN_SELECTOR_ALREADY_REGISTERED = 100030;
    ACL_ERROR_KERNEL_ALREADY_REGISTERED = 100031;
    ACL_ERROR_INVALID_QUEUE_ID = 100032;
    ACL_ERROR_REPEAT_SUBSCRIBE = 100033;
    ACL_ERROR_STREAM_NOT_SUBSCRIBE = 100034;
    ACL_ERROR_THREAD_NOT_SUBSCRIBE = 100035;
    ACL_ERROR_WAIT_CALLBACK_TIMEOUT = 100036;
    ACL_ERROR_REPEAT_FINALIZE = 100037;
    ACL_ERROR_NOT_STATIC_AIPP = 100038;
    ACL_ERROR_COMPILING_STUB_MODE = 100039;
    ACL_ERROR_GROUP_NOT_SET = 100040;
    ACL_ERROR_GROUP_NOT_CREATE = 100041;
    ACL_ERROR_PROF_ALREADY_RUN = 100042;
    ACL_ERROR_PROF_NOT_RUN = 100043;
    ACL_ERROR_DUMP_ALREADY_RUN = 100044;
    ACL_ERROR_DUMP_NOT_RUN = 100045;
    ACL_ERROR_PROF_REPEAT_SUBSCRIBE = 148046;
    ACL_ERROR_PROF_API_CONFLICT = 148047;
    ACL_ERROR_INVALID_MAX_OPQUEUE_NUM_CONFIG = 148048;
    ACL_ERROR_INVALID_OPP_PATH = 148049;
    ACL_ERROR_OP_UNSUPPORTED_DYNAMIC = 148050;
    ACL_ERROR_RELATIVE_RESOURCE_NOT_CLEARED = 148051;
    ACL_ERROR_UNSUPPORTED_JPEG = 148052;
    ACL_ERROR_INVALID_BUNDLE_MODEL_ID = 148053;
    ACL_ERROR_BAD_ALLOC = 200000;
    ACL_ERROR_API_NOT_SUPPORT = 200001;
    ACL_ERROR_INVALID_DEVICE = 200002;
    ACL_ERROR_MEMORY_ADDRESS_UNALIGNED = 200003;
    ACL_ERROR_RESOURCE_NOT_MATCH = 200004;
    ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005;
    ACL_ERROR_FEATURE_UNSUPPORTED = 200006;
    ACL_ERROR_PROF_MODULES_UNSUPPORTED = 200007;
    ACL_ERROR_STORAGE_OVER_LIMIT = 300000;
    ACL_ERROR_INTERNAL_ERROR = 500000;
    ACL_ERROR_FAILURE = 500001;
    ACL_ERROR_GE_FAILURE = 500002;
    ACL_ERROR_RT_FAILURE = 500003;
    ACL_ERROR_DRV_FAILURE = 500004;
    ACL_ERROR_PROFILING_FAILURE = 500005;
    ACL_ERROR_RT_PARAM_INVALID = 107000;
    ACL_ERROR_RT_INVALID_DEVICEID = 107001;
    ACL_ERROR_RT_CONTEXT_NULL = 107002;
    ACL_ERROR_RT_STREAM_CONTEXT = 107003;
    ACL_ERROR_RT_MODEL_CONTEXT = 107004;
    ACL_ERROR_RT_STREAM_MODEL = 107005;
    ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID = 107006;
    ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL = 107007;
    ACL_ERROR_RT_ADDR_UNALIGNED = 107008;
    ACL_ERROR_RT_FILE_OPEN = 107009;
    ACL_ERROR_RT_FILE_WRITE = 107010;
    ACL_ERROR_RT_STREAM_SUBSCRIBE = 107011;
    ACL_ERROR_RT_THREAD_SUBSCRIBE = 107012;
    ACL_ERROR_RT_GROUP_NOT_SET = 107013;
    ACL_ERROR_RT_GROUP_NOT_CREATE = 107014;
    ACL_ERROR_RT_STREAM_NO_CB_REG = 107015;
    ACL_ERROR_RT_INVALID_MEMORY_TYPE = 107016;
    ACL_ERROR_RT_INVALID_HANDLE = 107017;
    ACL_ERROR_RT_INVALID_MALLOC_TYPE = 107018;
    ACL_ERROR_RT_WAIT_TIMEOUT = 107019;
    ACL_ERROR_RT_TASK_TIMEOUT = 107020;
    ACL_ERROR_RT_SYSPARAMOPT_NOT_SET = 107021;
    ACL_ERROR_RT_DEVICE_TASK_ABORT = 107022;
    ACL_ERROR_RT_STREAM_ABORT = 107023;
    ACL_ERROR_RT_CAPTURE_DEPENDENCY = 107024;
    ACL_ERROR_RT_STREAM_UNJOINED = 107025;
    ACL_ERROR_RT_MODEL_CAPTURED = 107026;
    ACL_ERROR_RT_STREAM_CAPTURED = 107027;
    ACL_ERROR_RT_EVENT_CAPTURED = 107028;
    ACL_ERROR_RT_STREAM_NOT_CAPTURED = 107029;
    ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT = 107030;
    ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT = 107031;
    ACL_ERROR_STREAM_CAPTURE_CONFLICT = 107032;
    ACL_ERROR_STREAM_TASK_GROUP_STATUS = 107033;
    ACL_ERROR_STREAM_TASK_GROUP_INTR = 107034;
    ACL_ERROR_RT_TASK_ABORT_STOP = 107035;
    ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED = 107036;
    ACL_ERROR_RT_MODEL_RUNNING = 107037;
    ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD = 107038;
    ACL_ERROR_RT_INSUFFICIENT_INPUT_ARRAY = 107039;
    ACL_ERROR_RT_MODEL_UPDATE_FAILED = 107040;
    ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC = 107041;
    ACL_ERROR_RT_SYMBOL_NOT_FOUND = 107042;
    ACL_ERROR_RT_INVALID_SYMBOL = 107043;
    ACL_ERROR_RT_INVALID_DEVICE_FUNCTION = 107044;
    ACL_ERROR_RT_STREAM_NOT_SUPPORT_OPERA = 107045;
    ACL_ERROR_RT_SUB_ACLGRAPH_IS_CAPTURING = 107046;
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000;
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001;
    ACL_ERROR_RT_MEMORY_FREE = 207002;
    ACL_ERROR_RT_AICORE_OVER_FLOW = 207003;
    ACL_ERROR_RT_NO_DEVICE = 207004;
    ACL_ERROR_RT_RESOURCE_ALLOC_FAIL = 207005;
    ACL_ERROR_RT_NO_PERMISSION = 207006;
    ACL_ERROR_RT_NO_EVENT_RESOURCE = 207007;
    ACL_ERROR_RT_NO_STREAM_RESOURCE = 207008;
    ACL_ERROR_RT_NO_NOTIFY_RESOURCE = 207009;
    ACL_ERROR_RT_NO_MODEL_RESOURCE = 207010;
    ACL_ERROR_RT_NO_CDQ_RESOURCE = 207011;
    ACL_ERROR_RT_OVER_LIMIT = 207012;
    ACL_ERROR_RT_QUEUE_EMPTY = 207013;
    ACL_ERROR_RT_QUEUE_FULL = 207014;
    ACL_ERROR_RT_REPEATED_INIT = 207015;
    ACL_ERROR_RT_AIVEC_OVER_FLOW = 207016;
    ACL_ERROR_RT_OVER_FLOW = 207017;
    ACL_ERROR_RT_DEVICE_OOM = 207018;
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT_UPDATE_OP = 207019;
    ACL_ERROR_RT_TIMEOUT = 207020;
    ACL_ERROR_RT_INTERNAL_ERROR = 507000;
    ACL_ERROR_RT_TS_ERROR = 507001;
    ACL_ERROR_RT_STREAM_TASK_FULL = 507002;
    ACL_ERROR_RT_STREAM_TASK_EMPTY = 507003;
    ACL_ERROR_RT_STREAM_NOT_COMPLETE = 507004;
    ACL_ERROR_RT_END_OF_SEQUENCE = 507005;
    ACL_ERROR_RT_EVENT_NOT_COMPLETE = 507006;
    ACL_ERROR_RT_CONTEXT_RELEASE_ERROR = 507007;
    ACL_ERROR_RT_SOC_VERSION = 507008;
    ACL_ERROR_RT_TASK_TYPE_NOT_SUPPORT = 507009;
    ACL_ERROR_RT_LOST_HEARTBEAT = 507010;
    ACL_ERROR_RT_MODEL_EXECUTE = 507011;
    ACL_ERROR_RT_REPORT_TIMEOUT = 507012;
    ACL_ERROR_RT_SYS_DMA = 507013;
    ACL_ERROR_RT_AICORE_TIMEOUT = 507014;
    ACL_ERROR_RT_AICORE_EXCEPTION = 507015;
    ACL_ERROR_RT_AICORE_TRAP_EXCEPTION = 507016;
    ACL_ERROR_RT_AICPU_TIMEOUT = 507017;
    ACL_ERROR_RT_AICPU_EXCEPTION = 507018;
    ACL_ERROR_RT_AICPU_DATADUMP_RSP_ERR = 507019;
    ACL_ERROR_RT_AICPU_MODEL_RSP_ERR = 507020;
    ACL_ERROR_RT_PROFILING_ERROR = 507021;
    ACL_ERROR_RT_IPC_ERROR = 507022;
    ACL_ERROR_RT_MODEL_ABORT_NORMAL = 507023;
    ACL_ERROR_RT_KERNEL_UNREGISTERING = 507024;
    ACL_ERROR_RT_RINGBUFFER_NOT_INIT = 507025;
    ACL_ERROR_RT_RINGBUFFER_NO_DATA = 507026;
    ACL_ERROR_RT_KERNEL_LOOKUP = 507027;
    ACL_ERROR_RT_KERNEL_DUPLICATE = 507028;
    ACL_ERROR_RT_DEBUG_REGISTER_FAIL = 507029;
    ACL_ERROR_RT_DEBUG_UNREGISTER_FAIL = 507030;
    ACL_ERROR_RT_LABEL_CONTEXT = 507031;
    ACL_ERROR_RT_PROGRAM_USE_OUT = 507032;
    ACL_ERROR_RT_DEV_SETUP_ERROR = 507033;
    ACL_ERROR_RT_VECTOR_CORE_TIMEOUT = 507034;
    ACL_ERROR_RT_VECTOR_CORE_EXCEPTION = 507035;
    ACL_ERROR_RT_VECTOR_CORE_TRAP_EXCEPTION = 507036;
    ACL_ERROR_RT_CDQ_BATCH_ABNORMAL = 507037;
    ACL_ERROR_RT_DIE_MODE_CHANGE_ERROR = 507038;
    ACL_ERROR_RT_DIE_SET_ERROR = 507039;
    ACL_ERROR_RT_INVALID_DIEID = 507040;
    ACL_ERROR_RT_DIE_MODE_NOT_SET = 507041;
    ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW = 507042;
    ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW = 507043;
    ACL_ERROR_RT_VECTOR_CORE_TRAP_READ_OVERFLOW = 507044;
    ACL_ERROR_RT_VECTOR_CORE_TRAP_WRITE_OVERFLOW = 507045;
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046;
    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047;
    ACL_ERROR_RT_FFTS_PLUS_TIMEOUT = 507048;
    ACL_ERROR_RT_FFTS_PLUS_EXCEPTION = 507049;
    ACL_ERROR_RT_FFTS_PLUS_TRAP_EXCEPTION = 507050;
    ACL_ERROR_RT_SEND_MSG = 507051;
    ACL_ERROR_RT_COPY_DATA = 507052;
    ACL_ERROR_RT_DEVICE_MEM_ERROR = 507053;
    ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR = 507054;
    ACL_ERROR_RT_SUSPECT_DEVICE_MEM_ERROR = 507055;
    ACL_ERROR_RT_LINK_ERROR = 507056;
    ACL_ERROR_RT_SUSPECT_REMOTE_ERROR = 507057;
    ACL_ERROR_RT_DRV_INTERNAL_ERROR = 507899;
    ACL_ERROR_RT_AICPU_INTERNAL_ERROR = 507900;
    ACL_ERROR_RT_SOCKET_CLOSE = 507901;
    ACL_ERROR_RT_AICPU_INFO_LOAD_RSP_ERR = 507902;
    ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED = 507903;
    ACL_ERROR_RT_COMM_OP_RETRY_FAIL = 507904;
    ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT = 507905;
    ACL_ERROR_SNAPSHOT_LOCK_FAILED = 507906;
    ACL_ERROR_SNAPSHOT_UNLOCK_FAILED = 507907;
    ACL_ERROR_SNAPSHOT_BACKUP_FAILED = 507908;
    ACL_ERROR_SNAPSHOT_RESTORE_FAILED = 507909;
    ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 507910;
    ACL_ERROR_HOST_MEMORY_NOT_REGISTERED = 507911;
    ACL_ERROR_SNAPSHOT_CALLBACK_FAILED = 507912;
    ACL_ERROR_SNAPSHOT_REGISTER_CALLBACK_FAILED = 507913;
    ACL_ERROR_RT_L3_PORT_ERROR = 507914;
    ACL_ERROR_RT_CCU_TIMEOUT = 507915;
    ACL_ERROR_RT_CCU_EXCEPTION = 507916;
}

crate::c_consts! {
    /// Flag constants (`#define`s of `acl_rt.h`) the project passes.
    pub table ACL_FLAGS: u64;
    ACL_STREAM_FAST_LAUNCH = 0x1;
    ACL_STREAM_FAST_SYNC = 0x2;
    ACL_STREAM_PERSISTENT = 0x4;
    ACL_STREAM_HUGE = 0x8;
    ACL_STREAM_CPU_SCHEDULE = 0x10;
    ACL_STREAM_DEVICE_USE_ONLY = 0x20;
    ACL_NOTIFY_DEFAULT = 0x0;
    ACL_NOTIFY_DEVICE_USE_ONLY = 0x1;
    ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT = 0x0;
    ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION = 0x1;
    ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT = 0x0;
    ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS = 0x1;
    ACL_RT_VMM_EXPORT_FLAG_DEFAULT = 0x0;
    ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION = 0x1;
    ACL_RT_BINARY_MAGIC_ELF_AICORE = 0x4355_4245;
    ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE = 0x4141_5246;
    ACL_RT_BINARY_MAGIC_ELF_CUBE_CORE = 0x4149_4343;
    ACL_PKG_VERSION_MAX_SIZE = 128;
    ACL_PKG_VERSION_PARTS_MAX_SIZE = 64;
}

crate::c_enum! {
    /// Direction of a copy.
    pub enum aclrtMemcpyKind: u32 {
        ACL_MEMCPY_HOST_TO_HOST = 0,
        ACL_MEMCPY_HOST_TO_DEVICE = 1,
        ACL_MEMCPY_DEVICE_TO_HOST = 2,
        ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
        ACL_MEMCPY_DEFAULT = 4,
        ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE = 5,
        ACL_MEMCPY_INNER_DEVICE_TO_DEVICE = 6,
        ACL_MEMCPY_INTER_DEVICE_TO_DEVICE = 7,
    }
}

crate::c_enum! {
    /// Page policy of `aclrtMalloc` (low values) combined with memory-type bits.
    pub enum aclrtMemMallocPolicy: u32 {
        ACL_MEM_MALLOC_HUGE_FIRST = 0,
        ACL_MEM_MALLOC_HUGE_ONLY = 1,
        ACL_MEM_MALLOC_NORMAL_ONLY = 2,
        ACL_MEM_MALLOC_HUGE_FIRST_P2P = 3,
        ACL_MEM_MALLOC_HUGE_ONLY_P2P = 4,
        ACL_MEM_MALLOC_NORMAL_ONLY_P2P = 5,
        ACL_MEM_MALLOC_HUGE1G_ONLY = 6,
        ACL_MEM_MALLOC_HUGE1G_ONLY_P2P = 7,
        ACL_MEM_TYPE_LOW_BAND_WIDTH = 0x0100,
        ACL_MEM_TYPE_HIGH_BAND_WIDTH = 0x1000,
        ACL_MEM_ACCESS_USER_SPACE_READONLY = 0x10_0000,
    }
}

crate::c_enum! {
    /// How `aclrtHostRegister` maps host memory.
    pub enum aclrtHostRegisterType: u32 {
        ACL_HOST_REGISTER_MAPPED = 0,
        ACL_HOST_REGISTER_IOMEMORY = 0x04,
        ACL_HOST_REGISTER_READONLY = 0x08,
    }
}

crate::c_enum! {
    /// Shareable handle kind of the first-generation VMM export.
    pub enum aclrtMemHandleType: u32 {
        ACL_MEM_HANDLE_TYPE_NONE = 0,
        ACL_MEM_HANDLE_TYPE_POSIX = 2,
    }
}

crate::c_enum! {
    /// Shareable handle kind of the V2 VMM export (the fabric handle is [`aclrtMemFabricHandle`]).
    pub enum aclrtMemSharedHandleType: u32 {
        ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT = 0x1,
        ACL_MEM_SHARE_HANDLE_TYPE_FABRIC = 0x2,
    }
}

crate::c_enum! {
    /// Allocation type of physical memory.
    pub enum aclrtMemAllocationType: u32 {
        ACL_MEM_ALLOCATION_TYPE_PINNED = 0,
    }
}

crate::c_enum! {
    /// Memory kind and page size of physical memory.
    pub enum aclrtMemAttr: u32 {
        ACL_DDR_MEM = 0,
        ACL_HBM_MEM = 1,
        ACL_DDR_MEM_HUGE = 2,
        ACL_DDR_MEM_NORMAL = 3,
        ACL_HBM_MEM_HUGE = 4,
        ACL_HBM_MEM_NORMAL = 5,
        ACL_DDR_MEM_P2P_HUGE = 6,
        ACL_DDR_MEM_P2P_NORMAL = 7,
        ACL_HBM_MEM_P2P_HUGE = 8,
        ACL_HBM_MEM_P2P_NORMAL = 9,
        ACL_HBM_MEM_HUGE1G = 10,
        ACL_HBM_MEM_P2P_HUGE1G = 11,
        ACL_MEM_NORMAL = 12,
        ACL_MEM_HUGE = 13,
        ACL_MEM_HUGE1G = 14,
        ACL_MEM_P2P_NORMAL = 15,
        ACL_MEM_P2P_HUGE = 16,
        ACL_MEM_P2P_HUGE1G = 17,
    }
}

crate::c_enum! {
    /// Where memory lives.
    pub enum aclrtMemLocationType: u32 {
        ACL_MEM_LOCATION_TYPE_HOST = 0,
        ACL_MEM_LOCATION_TYPE_DEVICE = 1,
        ACL_MEM_LOCATION_TYPE_UNREGISTERED = 2,
        ACL_MEM_LOCATION_TYPE_HOST_NUMA = 4,
    }
}

crate::c_enum! {
    /// Access granted by `aclrtMemSetAccess`.
    pub enum aclrtMemAccessFlags: u32 {
        ACL_RT_MEM_ACCESS_FLAGS_NONE = 0x0,
        ACL_RT_MEM_ACCESS_FLAGS_READ = 0x1,
        ACL_RT_MEM_ACCESS_FLAGS_READWRITE = 0x3,
    }
}

crate::c_enum! {
    /// Which granularity `aclrtMemGetAllocationGranularity` reports.
    pub enum aclrtMemGranularityOptions: u32 {
        ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
        ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
        ACL_RT_MEM_ALLOC_GRANULARITY_UNDEF = 0xFFFF,
    }
}

crate::c_enum! {
    /// Option kinds of `aclrtBinaryLoadFromData` (`LAZY_MAGIC` and `MAGIC` share a value in the header).
    pub enum aclrtBinaryLoadOptionType: u32 {
        ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD = 1,
        ACL_RT_BINARY_LOAD_OPT_LAZY_MAGIC = 2,
        ACL_RT_BINARY_LOAD_OPT_MAGIC = 2,
        ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE = 3,
    }
}

crate::c_enum! {
    /// The core type a kernel launch targets.
    pub enum aclrtEngineType: u32 {
        ACL_RT_ENGINE_TYPE_AIC = 0,
        ACL_RT_ENGINE_TYPE_AIV = 1,
    }
}

crate::c_enum! {
    /// Attribute ids of `aclrtLaunchKernelCfg` (`LOCAL_MEMORY_SIZE`, deprecated, equals `DYN_UBUF_SIZE`).
    pub enum aclrtLaunchKernelAttrId: u32 {
        ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE = 1,
        ACL_RT_LAUNCH_KERNEL_ATTR_DYN_UBUF_SIZE = 2,
        ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE = 3,
        ACL_RT_LAUNCH_KERNEL_ATTR_BLOCKDIM_OFFSET = 4,
        ACL_RT_LAUNCH_KERNEL_ATTR_BLOCK_TASK_PREFETCH = 5,
        ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP = 6,
        ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT = 7,
        ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US = 8,
    }
}

crate::c_enum! {
    /// Package whose version `aclsysGetCANNVersion` reports.
    pub enum aclCANNPackageName: u32 {
        ACL_PKG_NAME_CANN = 0,
        ACL_PKG_NAME_RUNTIME = 1,
        ACL_PKG_NAME_COMPILER = 2,
        ACL_PKG_NAME_HCCL = 3,
        ACL_PKG_NAME_TOOLKIT = 4,
        ACL_PKG_NAME_OPP = 5,
        ACL_PKG_NAME_OPP_KERNEL = 6,
        ACL_PKG_NAME_DRIVER = 7,
    }
}

crate::c_struct! {
    /// A memory location: device id (or NUMA node) and kind.
    pub struct aclrtMemLocation {
        pub id: u32,
        pub r#type: aclrtMemLocationType,
    }
}

crate::c_struct! {
    /// Properties of physical memory for `aclrtMallocPhysical`.
    pub struct aclrtPhysicalMemProp {
        pub handleType: aclrtMemHandleType,
        pub allocationType: aclrtMemAllocationType,
        pub memAttr: aclrtMemAttr,
        pub location: aclrtMemLocation,
        pub reserve: u64,
    }
}

crate::c_struct! {
    /// One access grant for `aclrtMemSetAccess`.
    pub struct aclrtMemAccessDesc {
        pub flags: aclrtMemAccessFlags,
        pub location: aclrtMemLocation,
        pub rsv: [u8; 12],
    }
}

crate::c_struct! {
    /// Where a pointer lives, as `aclrtPointerGetAttributes` reports it.
    pub struct aclrtPtrAttributes {
        pub location: aclrtMemLocation,
        pub pageSize: u32,
        pub rsv: [u32; 4],
    }
}

crate::c_struct! {
    /// The locations of one group of copies of `aclrtMemcpyBatch`.
    pub struct aclrtMemcpyBatchAttr {
        pub dstLoc: aclrtMemLocation,
        pub srcLoc: aclrtMemLocation,
        pub rsv: [u8; 16],
    }
}

crate::c_struct! {
    /// The 128-byte fabric handle of the V2 VMM export.
    pub struct aclrtMemFabricHandle {
        pub data: [u8; 128],
    }
}

crate::c_struct! {
    /// The value of one binary-load option.
    pub union aclrtBinaryLoadOptionValue {
        pub isLazyLoad: u32,
        pub magic: u32,
        pub cpuKernelMode: i32,
        pub rsv: [u32; 4],
    }
}

crate::c_struct! {
    /// One binary-load option.
    pub struct aclrtBinaryLoadOption {
        pub r#type: aclrtBinaryLoadOptionType,
        pub value: aclrtBinaryLoadOptionValue,
    }
}

crate::c_struct! {
    /// The options of `aclrtBinaryLoadFromData`.
    pub struct aclrtBinaryLoadOptions {
        pub options: *mut aclrtBinaryLoadOption,
        pub numOpt: usize,
    }
}

crate::c_struct! {
    /// A 64-bit timeout in microseconds split in two words.
    pub struct aclrtTimeoutUs {
        pub timeoutLow: u32,
        pub timeoutHigh: u32,
    }
}

crate::c_struct! {
    /// The value of one launch attribute (the deprecated `localMemorySize` member aliases `dynUBufSize`).
    pub union aclrtLaunchKernelAttrValue {
        pub schemMode: u8,
        pub dynUBufSize: u32,
        pub engineType: aclrtEngineType,
        pub blockDimOffset: u32,
        pub isBlockTaskPrefetch: u8,
        pub isDataDump: u8,
        pub timeout: u16,
        pub timeoutUs: aclrtTimeoutUs,
        pub rsv: [u32; 4],
    }
}

crate::c_struct! {
    /// One launch attribute.
    pub struct aclrtLaunchKernelAttr {
        pub id: aclrtLaunchKernelAttrId,
        pub value: aclrtLaunchKernelAttrValue,
    }
}

crate::c_struct! {
    /// The attributes of `aclrtLaunchKernelWithHostArgs`.
    pub struct aclrtLaunchKernelCfg {
        pub attrs: *mut aclrtLaunchKernelAttr,
        pub numAttrs: usize,
    }
}

crate::c_struct! {
    /// Where a device address is patched into host-provided kernel arguments.
    pub struct aclrtPlaceHolderInfo {
        pub addrOffset: u32,
        pub dataOffset: u32,
    }
}

crate::c_struct! {
    /// Version strings of one CANN package (NUL-terminated).
    pub struct aclCANNPackageVersion {
        pub version: [c_char; 128],
        pub majorVersion: [c_char; 64],
        pub minorVersion: [c_char; 64],
        pub releaseVersion: [c_char; 64],
        pub patchVersion: [c_char; 64],
        pub reserved: [c_char; 128],
    }
}

/// Where `libascendcl.so` is looked for: `AIV_ASCENDCL_LIB` (a full path), else the library directories of
/// `ASCEND_HOME_PATH`, else the loader's search path.
pub const ASCENDCL_LIBRARY: LibrarySpec = LibrarySpec {
    file_name: "libascendcl.so",
    override_var: "AIV_ASCENDCL_LIB",
    roots: &[("ASCEND_HOME_PATH", ASCEND_HOME_LIBRARY_DIRS)],
};

crate::dynamic_library! {
    /// The ACL entry points this project calls, resolved from one `libascendcl.so`.
    ///
    /// Required: what the copy path needs and every CANN release the project targets exports. Optional: notify,
    /// VMM, IPC, kernel loading and launch, version and host-registration calls, which older runtimes lack.
    pub struct AclApi;
    required {
        fn aclInit(config_path: *const c_char) -> aclError;
        fn aclFinalize() -> aclError;
        fn aclrtSetDevice(device_id: i32) -> aclError;
        fn aclrtResetDevice(device_id: i32) -> aclError;
        fn aclrtGetDevice(device_id: *mut i32) -> aclError;
        fn aclrtGetDeviceCount(count: *mut u32) -> aclError;
        fn aclrtCreateStream(stream: *mut aclrtStream) -> aclError;
        fn aclrtCreateStreamWithConfig(stream: *mut aclrtStream, priority: u32, flag: u32) -> aclError;
        fn aclrtSynchronizeStream(stream: aclrtStream) -> aclError;
        fn aclrtSynchronizeStreamWithTimeout(stream: aclrtStream, timeout: i32) -> aclError;
        fn aclrtDestroyStream(stream: aclrtStream) -> aclError;
        fn aclrtMalloc(dev_ptr: *mut *mut c_void, size: usize, policy: aclrtMemMallocPolicy) -> aclError;
        fn aclrtFree(dev_ptr: *mut c_void) -> aclError;
        fn aclrtMallocHost(host_ptr: *mut *mut c_void, size: usize) -> aclError;
        fn aclrtFreeHost(host_ptr: *mut c_void) -> aclError;
        fn aclrtMemset(dev_ptr: *mut c_void, max_count: usize, value: i32, count: usize) -> aclError;
        fn aclrtMemcpy(
            dst: *mut c_void,
            dest_max: usize,
            src: *const c_void,
            count: usize,
            kind: aclrtMemcpyKind,
        ) -> aclError;
        fn aclrtMemcpyAsync(
            dst: *mut c_void,
            dest_max: usize,
            src: *const c_void,
            count: usize,
            kind: aclrtMemcpyKind,
            stream: aclrtStream,
        ) -> aclError;
        fn aclrtGetVersion(major: *mut i32, minor: *mut i32, patch: *mut i32) -> aclError;
    }
    optional {
        fn aclrtCreateNotify(notify: *mut aclrtNotify, flag: u64) -> aclError;
        fn aclrtDestroyNotify(notify: aclrtNotify) -> aclError;
        fn aclrtRecordNotify(notify: aclrtNotify, stream: aclrtStream) -> aclError;
        fn aclrtWaitAndResetNotify(notify: aclrtNotify, stream: aclrtStream, timeout: u32) -> aclError;
        fn aclrtGetNotifyId(notify: aclrtNotify, notify_id: *mut u32) -> aclError;
        fn aclrtMallocPhysical(
            handle: *mut aclrtDrvMemHandle,
            size: usize,
            prop: *const aclrtPhysicalMemProp,
            flags: u64,
        ) -> aclError;
        fn aclrtFreePhysical(handle: aclrtDrvMemHandle) -> aclError;
        fn aclrtReserveMemAddress(
            vir_ptr: *mut *mut c_void,
            size: usize,
            alignment: usize,
            expect_ptr: *mut c_void,
            flags: u64,
        ) -> aclError;
        fn aclrtReleaseMemAddress(vir_ptr: *mut c_void) -> aclError;
        fn aclrtMapMem(
            vir_ptr: *mut c_void,
            size: usize,
            offset: usize,
            handle: aclrtDrvMemHandle,
            flags: u64,
        ) -> aclError;
        fn aclrtUnmapMem(vir_ptr: *mut c_void) -> aclError;
        fn aclrtMemSetAccess(
            vir_ptr: *mut c_void,
            size: usize,
            desc: *mut aclrtMemAccessDesc,
            count: usize,
        ) -> aclError;
        fn aclrtMemGetAllocationGranularity(
            prop: *mut aclrtPhysicalMemProp,
            option: aclrtMemGranularityOptions,
            granularity: *mut usize,
        ) -> aclError;
        fn aclrtMemExportToShareableHandle(
            handle: aclrtDrvMemHandle,
            handle_type: aclrtMemHandleType,
            flags: u64,
            shareable_handle: *mut u64,
        ) -> aclError;
        fn aclrtMemExportToShareableHandleV2(
            handle: aclrtDrvMemHandle,
            flags: u64,
            share_type: aclrtMemSharedHandleType,
            shareable_handle: *mut c_void,
        ) -> aclError;
        fn aclrtMemImportFromShareableHandle(
            shareable_handle: u64,
            device_id: i32,
            handle: *mut aclrtDrvMemHandle,
        ) -> aclError;
        fn aclrtMemImportFromShareableHandleV2(
            shareable_handle: *mut c_void,
            share_type: aclrtMemSharedHandleType,
            flags: u64,
            handle: *mut aclrtDrvMemHandle,
        ) -> aclError;
        fn aclrtIpcMemGetExportKey(
            dev_ptr: *mut c_void,
            size: usize,
            key: *mut c_char,
            len: usize,
            flags: u64,
        ) -> aclError;
        fn aclrtIpcMemImportByKey(dev_ptr: *mut *mut c_void, key: *const c_char, flags: u64) -> aclError;
        fn aclrtIpcMemClose(key: *const c_char) -> aclError;
        fn aclrtBinaryLoadFromData(
            data: *const c_void,
            length: usize,
            options: *const aclrtBinaryLoadOptions,
            bin_handle: *mut aclrtBinHandle,
        ) -> aclError;
        fn aclrtBinaryGetFunction(
            bin_handle: aclrtBinHandle,
            kernel_name: *const c_char,
            func_handle: *mut aclrtFuncHandle,
        ) -> aclError;
        fn aclrtLaunchKernel(
            func_handle: aclrtFuncHandle,
            num_blocks: u32,
            args_data: *const c_void,
            args_size: usize,
            stream: aclrtStream,
        ) -> aclError;
        fn aclrtLaunchKernelWithHostArgs(
            func_handle: aclrtFuncHandle,
            num_blocks: u32,
            stream: aclrtStream,
            cfg: *mut aclrtLaunchKernelCfg,
            host_args: *mut c_void,
            args_size: usize,
            place_holder_array: *mut aclrtPlaceHolderInfo,
            place_holder_num: usize,
        ) -> aclError;
        fn aclrtBinaryUnLoad(bin_handle: aclrtBinHandle) -> aclError;
        fn aclsysGetCANNVersion(name: aclCANNPackageName, version: *mut aclCANNPackageVersion) -> aclError;
        fn aclrtHostRegister(
            ptr: *mut c_void,
            size: u64,
            kind: aclrtHostRegisterType,
            dev_ptr: *mut *mut c_void,
        ) -> aclError;
        fn aclrtHostUnregister(ptr: *mut c_void) -> aclError;
        fn aclGetRecentErrMsg() -> *const c_char;
        fn aclrtGetSocName() -> *const c_char;
        fn aclrtGetPhyDevIdByLogicDevId(logic_dev_id: i32, phy_dev_id: *mut i32) -> aclError;
        fn aclrtGetLogicDevIdByUserDevId(user_dev_id: i32, logic_dev_id: *mut i32) -> aclError;
        fn aclrtGetCurrentContext(context: *mut aclrtContext) -> aclError;
        fn aclrtSetCurrentContext(context: aclrtContext) -> aclError;
        fn aclrtStreamAbort(stream: aclrtStream) -> aclError;
        fn aclrtPointerGetAttributes(ptr: *const c_void, attributes: *mut aclrtPtrAttributes) -> aclError;
        fn aclrtMemcpyBatch(
            dsts: *mut *mut c_void,
            dest_maxs: *mut usize,
            srcs: *mut *mut c_void,
            sizes: *mut usize,
            num_batches: usize,
            attrs: *mut aclrtMemcpyBatchAttr,
            attrs_indexes: *mut usize,
            num_attrs: usize,
            fail_index: *mut usize,
        ) -> aclError;
        fn aclrtReserveMemAddressNoUCMemory(
            vir_ptr: *mut *mut c_void,
            size: usize,
            alignment: usize,
            expect_ptr: *mut c_void,
            flags: u64,
        ) -> aclError;
    }
    // What a call can do to device work in flight (`calls::HostActs`; docs/evidence.md, "Host calls counted").
    acts {
        aclrtSynchronizeStream: READS_COMPLETION;
        aclrtSynchronizeStreamWithTimeout: READS_COMPLETION;
        // A synchronous memset or copy: the runtime writes a task, rings its stream and waits for its completion.
        aclrtMemset: WRITES_DEVICE | SUBMITS | READS_COMPLETION;
        aclrtMemcpy: WRITES_DEVICE | SUBMITS | READS_COMPLETION;
        aclrtMemcpyAsync: WRITES_DEVICE | SUBMITS;
        aclrtMemcpyBatch: WRITES_DEVICE | SUBMITS | READS_COMPLETION;
        aclrtRecordNotify: SUBMITS;
        aclrtWaitAndResetNotify: SUBMITS;
        aclrtLaunchKernel: SUBMITS;
        aclrtLaunchKernelWithHostArgs: SUBMITS;
        aclrtStreamAbort: SUBMITS;
        // Loads device code into device memory.
        aclrtBinaryLoadFromData: WRITES_DEVICE;
    }
}

/// The enums declared here, for the ABI manifest and tests.
pub fn enum_decls() -> Vec<crate::abi::EnumDecl> {
    vec![
        aclrtMemcpyKind::abi_decl(),
        aclrtMemMallocPolicy::abi_decl(),
        aclrtHostRegisterType::abi_decl(),
        aclrtMemHandleType::abi_decl(),
        aclrtMemSharedHandleType::abi_decl(),
        aclrtMemAllocationType::abi_decl(),
        aclrtMemAttr::abi_decl(),
        aclrtMemLocationType::abi_decl(),
        aclrtMemAccessFlags::abi_decl(),
        aclrtMemGranularityOptions::abi_decl(),
        aclrtBinaryLoadOptionType::abi_decl(),
        aclrtEngineType::abi_decl(),
        aclrtLaunchKernelAttrId::abi_decl(),
        aclCANNPackageName::abi_decl(),
    ]
}

/// The structs and unions declared here.
pub fn struct_decls() -> Vec<crate::abi::StructDecl> {
    vec![
        aclrtMemLocation::abi_decl(),
        aclrtPhysicalMemProp::abi_decl(),
        aclrtMemAccessDesc::abi_decl(),
        aclrtMemFabricHandle::abi_decl(),
        aclrtPtrAttributes::abi_decl(),
        aclrtMemcpyBatchAttr::abi_decl(),
        aclrtBinaryLoadOptionValue::abi_decl(),
        aclrtBinaryLoadOption::abi_decl(),
        aclrtBinaryLoadOptions::abi_decl(),
        aclrtTimeoutUs::abi_decl(),
        aclrtLaunchKernelAttrValue::abi_decl(),
        aclrtLaunchKernelAttr::abi_decl(),
        aclrtLaunchKernelCfg::abi_decl(),
        aclrtPlaceHolderInfo::abi_decl(),
        aclCANNPackageVersion::abi_decl(),
    ]
}

/// Everything this crate declares, to compile against `acl/acl.h`.
pub fn abi_manifest() -> AbiManifest {
    let consts = ACL_ERROR_CODES
        .iter()
        .map(|(name, value)| crate::abi::ConstDecl { name, value: i128::from(*value) })
        .chain(ACL_FLAGS.iter().map(|(name, value)| crate::abi::ConstDecl { name, value: i128::from(*value) }))
        .collect();
    AbiManifest {
        headers: vec!["acl/acl.h"],
        functions: AclApi::function_decls(),
        structs: struct_decls(),
        enums: enum_decls(),
        consts,
    }
}
