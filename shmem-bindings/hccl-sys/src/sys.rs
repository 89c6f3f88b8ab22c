//! Raw layer: the HCCL types and entry points this project uses (communicator bootstrap by root info), with their
//! exact C names, and the function table resolved from `libhccl.so`.
//!
//! Declarations follow `torch_npu/include/third_party/hccl/inc/hccl/hccl.h` and `hccl_types.h` from the
//! `torch-npu` wheel and are checked against them by `tests/abi.rs` (run by `tests/run.sh`).

#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::{c_char, c_void};

use ascendcl_sys::abi::{AbiManifest, ConstDecl};
use ascendcl_sys::loader::{LibrarySpec, ASCEND_HOME_LIBRARY_DIRS};

/// A communicator (`void *`).
pub type HcclComm = *mut c_void;

ascendcl_sys::c_consts! {
    /// Sizes the header defines as `const uint32_t`.
    pub table HCCL_SIZES: u32;
    HCCL_ROOT_INFO_BYTES = 4108;
    COMM_NAME_MAX_LENGTH = 128;
}

ascendcl_sys::c_enum! {
    /// Every HCCL call returns this.
    pub enum HcclResult: u32 {
        HCCL_SUCCESS = 0,
        HCCL_E_PARA = 1,
        HCCL_E_PTR = 2,
        HCCL_E_MEMORY = 3,
        HCCL_E_INTERNAL = 4,
        HCCL_E_NOT_SUPPORT = 5,
        HCCL_E_NOT_FOUND = 6,
        HCCL_E_UNAVAIL = 7,
        HCCL_E_SYSCALL = 8,
        HCCL_E_TIMEOUT = 9,
        HCCL_E_OPEN_FILE_FAILURE = 10,
        HCCL_E_TCP_CONNECT = 11,
        HCCL_E_ROCE_CONNECT = 12,
        HCCL_E_TCP_TRANSFER = 13,
        HCCL_E_ROCE_TRANSFER = 14,
        HCCL_E_RUNTIME = 15,
        HCCL_E_DRV = 16,
        HCCL_E_PROFILING = 17,
        HCCL_E_CCE = 18,
        HCCL_E_NETWORK = 19,
        HCCL_E_AGAIN = 20,
        HCCL_E_REMOTE = 21,
        HCCL_E_SUSPENDING = 22,
        HCCL_E_OPRETRY_FAIL = 23,
        HCCL_E_OOM = 24,
        HCCL_E_RESERVED = 25,
    }
}

ascendcl_sys::c_struct! {
    /// The opaque root information rank 0 creates and every rank receives out of band (4108 bytes).
    pub struct HcclRootInfo {
        pub internal: [c_char; HCCL_ROOT_INFO_BYTES as usize],
    }
}

impl Default for HcclRootInfo {
    fn default() -> Self {
        Self { internal: [0; HCCL_ROOT_INFO_BYTES as usize] }
    }
}

/// Where `libhccl.so` is looked for: `AIV_HCCL_LIB` (a full path), else the library directories of
/// `ASCEND_HOME_PATH`, else the loader's search path.
pub const HCCL_LIBRARY: LibrarySpec = LibrarySpec {
    file_name: "libhccl.so",
    override_var: "AIV_HCCL_LIB",
    roots: &[("ASCEND_HOME_PATH", ASCEND_HOME_LIBRARY_DIRS)],
};

ascendcl_sys::dynamic_library! {
    /// The HCCL entry points this project calls, resolved from one `libhccl.so`.
    pub struct HcclApi;
    required {
        fn HcclGetRootInfo(root_info: *mut HcclRootInfo) -> HcclResult;
        fn HcclCommInitRootInfo(
            n_ranks: u32,
            root_info: *const HcclRootInfo,
            rank: u32,
            comm: *mut HcclComm,
        ) -> HcclResult;
        fn HcclCommDestroy(comm: HcclComm) -> HcclResult;
        fn HcclGetRankId(comm: HcclComm, rank: *mut u32) -> HcclResult;
        fn HcclGetRankSize(comm: HcclComm, rank_size: *mut u32) -> HcclResult;
    }
    optional {
        fn HcclGetCommName(comm: HcclComm, comm_name: *mut c_char) -> HcclResult;
    }
}

/// Everything this crate declares, to compile against `hccl/hccl.h`.
pub fn abi_manifest() -> AbiManifest {
    AbiManifest {
        headers: vec!["hccl/hccl.h"],
        functions: HcclApi::function_decls(),
        structs: vec![HcclRootInfo::abi_decl()],
        enums: vec![HcclResult::abi_decl()],
        consts: HCCL_SIZES.iter().map(|(name, value)| ConstDecl { name, value: i128::from(*value) }).collect(),
    }
}
