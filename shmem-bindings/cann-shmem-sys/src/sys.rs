//! Raw layer: the CANN SHMEM (ACLSHMEM) host types and entry points this project uses, with their exact C names,
//! and the function table resolved from `libshmem.so`.
//!
//! Source of the facts: the public SHMEM sources (`include/host/shmem_host_def.h`, `include/host/init/
//! shmem_host_init.h`, `include/host/mem/shmem_host_heap.h`, `include/host/data_plane/shmem_host_rma.h`,
//! `include/host/team/shmem_host_team.h`, `include/host_device/shmem_common_types.h`) and the project's
//! docs/hardware.md section 6. No header package exists to compile against, so the layouts are pinned by compile-time
//! assertions below, and the C++ default member initialisers are reproduced by [`aclshmemx_init_attr_t::new`].

#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::{c_char, c_void};
use core::mem::{align_of, offset_of, size_of};

use ascendcl_sys::calls::act::{SUBMITS, WRITES_DEVICE};
use ascendcl_sys::loader::{LibrarySpec, ASCEND_HOME_LIBRARY_DIRS};

/// Length of `aclshmemx_init_attr_t::ip_port`, NUL included.
pub const ACLSHMEM_MAX_IP_PORT_LEN: usize = 64;
/// Length of the opaque part of the unique id.
pub const ACLSHMEM_UNIQUE_ID_INNER_LEN: usize = 124;
/// Default of the three initialisation timeouts, in seconds (C name `DEFAULT_TIMEOUT`).
pub const DEFAULT_TIMEOUT: u32 = 120;

ascendcl_sys::c_consts! {
    /// The documented SHMEM return codes (`aclshmem_error_code_t`, underlying type `int`).
    pub table ACLSHMEM_ERROR_CODES: i32;
    ACLSHMEM_SUCCESS = 0;
    ACLSHMEM_INVALID_PARAM = -1;
    ACLSHMEM_INVALID_VALUE = -2;
    ACLSHMEM_SMEM_ERROR = -3;
    ACLSHMEM_INNER_ERROR = -4;
    ACLSHMEM_NOT_INITED = -5;
    ACLSHMEM_BOOTSTRAP_ERROR = -6;
    ACLSHMEM_TIMEOUT_ERROR = -7;
    ACLSHMEM_MALLOC_FAILED = -8;
    ACLSHMEM_DL_FUNC_FAILED = -9;
    ACLSHMEM_INNER_TIMEOUT = -10;
    ACLSHMEM_UNDER_API_UNLOAD = -11;
    ACLSHMEM_NOT_SUPPORTED = -100;
}

ascendcl_sys::c_enum! {
    /// Bootstrap mode of `aclshmemx_init_attr` (C++ enum with underlying type `unsigned int`).
    pub enum aclshmemx_bootstrap_t: u32 {
        ACLSHMEMX_INIT_WITH_DEFAULT = 1 << 0,
        ACLSHMEMX_INIT_WITH_MPI = 1 << 1,
        ACLSHMEMX_INIT_WITH_UNIQUEID = 1 << 3,
        ACLSHMEMX_INIT_MAX = 1 << 31,
    }
}

ascendcl_sys::c_enum! {
    /// The engine SHMEM's device data operations use (docs/hardware.md section 6: MTE 1, SDMA 2, ROCE 4, UDMA 8).
    pub enum data_op_engine_type_t: u32 {
        ACLSHMEM_DATA_OP_MTE = 0x01,
        ACLSHMEM_DATA_OP_SDMA = 0x02,
        ACLSHMEM_DATA_OP_ROCE = 0x04,
        ACLSHMEM_DATA_OP_UDMA = 0x08,
    }
}

ascendcl_sys::c_struct! {
    /// Optional initialisation attributes (24 bytes).
    pub struct aclshmem_init_optional_attr_t {
        pub version: i32,
        pub data_op_engine_type: data_op_engine_type_t,
        pub shm_init_timeout: u32,
        pub shm_create_timeout: u32,
        pub control_operation_timeout: u32,
        pub sockFd: i32,
    }
}

ascendcl_sys::c_struct! {
    /// Initialisation attributes (120 bytes). Build it with [`aclshmemx_init_attr_t::new`]: the C++ header gives
    /// several fields default member initialisers that a zeroed struct would not have.
    pub struct aclshmemx_init_attr_t {
        pub my_pe: i32,
        pub n_pes: i32,
        pub ip_port: [c_char; ACLSHMEM_MAX_IP_PORT_LEN],
        pub local_mem_size: u64,
        pub option_attr: aclshmem_init_optional_attr_t,
        pub comm_args: *mut c_void,
        pub instance_id: u64,
    }
}

ascendcl_sys::c_struct! {
    /// The unique id rank 0 creates and every PE receives out of band (136 bytes).
    pub struct aclshmemx_uniqueid_t {
        pub version: i32,
        pub my_pe: i32,
        pub n_pes: i32,
        pub internal: [c_char; ACLSHMEM_UNIQUE_ID_INNER_LEN],
    }
}

/// `(1 << 16) + sizeof(aclshmem_init_optional_attr_t)`, the version the header's default initialiser writes.
pub const ACLSHMEM_OPTIONAL_ATTR_VERSION: i32 = (1 << 16) + size_of::<aclshmem_init_optional_attr_t>() as i32;
/// `(1 << 16) + sizeof(aclshmemx_uniqueid_t)` (C name `ACLSHMEM_UNIQUEID_VERSION`).
pub const ACLSHMEM_UNIQUEID_VERSION: i32 = (1 << 16) + size_of::<aclshmemx_uniqueid_t>() as i32;

// The documented layouts (docs/hardware.md section 6, computed from the public header), pinned at compile time.
const _: () = {
    assert!(size_of::<aclshmem_init_optional_attr_t>() == 24);
    assert!(offset_of!(aclshmem_init_optional_attr_t, data_op_engine_type) == 4);
    assert!(offset_of!(aclshmem_init_optional_attr_t, shm_init_timeout) == 8);
    assert!(offset_of!(aclshmem_init_optional_attr_t, control_operation_timeout) == 16);
    assert!(offset_of!(aclshmem_init_optional_attr_t, sockFd) == 20);
    assert!(size_of::<aclshmemx_init_attr_t>() == 120);
    assert!(align_of::<aclshmemx_init_attr_t>() == 8);
    assert!(offset_of!(aclshmemx_init_attr_t, my_pe) == 0);
    assert!(offset_of!(aclshmemx_init_attr_t, n_pes) == 4);
    assert!(offset_of!(aclshmemx_init_attr_t, ip_port) == 8);
    assert!(offset_of!(aclshmemx_init_attr_t, local_mem_size) == 72);
    assert!(offset_of!(aclshmemx_init_attr_t, option_attr) == 80);
    assert!(offset_of!(aclshmemx_init_attr_t, comm_args) == 104);
    assert!(offset_of!(aclshmemx_init_attr_t, instance_id) == 112);
    assert!(size_of::<aclshmemx_uniqueid_t>() == 136);
    assert!(align_of::<aclshmemx_uniqueid_t>() == 4);
    assert!(offset_of!(aclshmemx_uniqueid_t, internal) == 12);
    assert!(ACLSHMEM_UNIQUEID_VERSION == 65_672);
};

impl aclshmemx_init_attr_t {
    /// The attributes as a C++ caller gets them from `aclshmemx_init_attr_t attr;` with the header's default member
    /// initialisers (`ip_port` zeroed, `option_attr = {version, MTE, 120, 120, 120}` with `sockFd` value-initialised
    /// to 0, `comm_args = nullptr`, `instance_id = 0`) and the three fields without one set from the arguments.
    pub fn new(my_pe: i32, n_pes: i32, local_mem_size: u64) -> Self {
        Self {
            my_pe,
            n_pes,
            ip_port: [0; ACLSHMEM_MAX_IP_PORT_LEN],
            local_mem_size,
            option_attr: aclshmem_init_optional_attr_t {
                version: ACLSHMEM_OPTIONAL_ATTR_VERSION,
                data_op_engine_type: ACLSHMEM_DATA_OP_MTE,
                shm_init_timeout: DEFAULT_TIMEOUT,
                shm_create_timeout: DEFAULT_TIMEOUT,
                control_operation_timeout: DEFAULT_TIMEOUT,
                sockFd: 0,
            },
            comm_args: core::ptr::null_mut(),
            instance_id: 0,
        }
    }
}

impl Default for aclshmemx_uniqueid_t {
    /// `ACLSHMEM_UNIQUEID_INITIALIZER`: the version set, everything else zero.
    fn default() -> Self {
        Self { version: ACLSHMEM_UNIQUEID_VERSION, my_pe: 0, n_pes: 0, internal: [0; ACLSHMEM_UNIQUE_ID_INNER_LEN] }
    }
}

impl aclshmemx_uniqueid_t {
    /// The 136 bytes to send to the other PEs.
    pub fn to_bytes(&self) -> [u8; 136] {
        let mut out = [0u8; 136];
        out[0..4].copy_from_slice(&self.version.to_ne_bytes());
        out[4..8].copy_from_slice(&self.my_pe.to_ne_bytes());
        out[8..12].copy_from_slice(&self.n_pes.to_ne_bytes());
        for (slot, byte) in out[12..].iter_mut().zip(self.internal.iter()) {
            *slot = *byte as u8;
        }
        out
    }

    /// The id received from rank 0 (all bit patterns are valid for this plain-data struct).
    pub fn from_bytes(bytes: &[u8; 136]) -> Self {
        let word = |at: usize| i32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let mut internal = [0 as c_char; ACLSHMEM_UNIQUE_ID_INNER_LEN];
        for (slot, byte) in internal.iter_mut().zip(bytes[12..].iter()) {
            *slot = *byte as c_char;
        }
        Self { version: word(0), my_pe: word(4), n_pes: word(8), internal }
    }
}

/// Where `libshmem.so` is looked for: `AIV_SHMEM_LIB` (a full path), else under `SHMEM_HOME_PATH` (set by SHMEM's
/// `set_env.sh`; the library is in its `shmem/lib`), else under `ASCEND_HOME_PATH` (its library directories,
/// `shmem/lib`, and the default SHMEM install beside the toolkit, `../../shmem/latest/shmem/lib` — inferred from
/// SHMEM's quick-start layout), else the loader's search path.
pub const SHMEM_LIBRARY: LibrarySpec = LibrarySpec {
    file_name: "libshmem.so",
    override_var: "AIV_SHMEM_LIB",
    roots: &[
        ("SHMEM_HOME_PATH", &["shmem/lib", "lib"]),
        ("ASCEND_HOME_PATH", &["shmem/lib", "../../shmem/latest/shmem/lib"]),
        ("ASCEND_HOME_PATH", ASCEND_HOME_LIBRARY_DIRS),
    ],
};

ascendcl_sys::dynamic_library! {
    /// The SHMEM host entry points this project calls, resolved from one `libshmem.so`.
    pub struct ShmemApi;
    required {
        fn aclshmemx_get_uniqueid(uid: *mut aclshmemx_uniqueid_t) -> i32;
        fn aclshmemx_set_attr_uniqueid_args(
            my_pe: i32,
            n_pes: i32,
            local_mem_size: i64,
            uid: *mut aclshmemx_uniqueid_t,
            attr: *mut aclshmemx_init_attr_t,
        ) -> i32;
        fn aclshmemx_init_attr(bootstrap_flags: aclshmemx_bootstrap_t, attributes: *mut aclshmemx_init_attr_t) -> i32;
        fn aclshmem_malloc(size: usize) -> *mut c_void;
        fn aclshmem_calloc(nmemb: usize, size: usize) -> *mut c_void;
        fn aclshmem_align(alignment: usize, size: usize) -> *mut c_void;
        fn aclshmem_free(ptr: *mut c_void);
        fn aclshmem_ptr(ptr: *mut c_void, pe: i32) -> *mut c_void;
        fn aclshmem_my_pe() -> i32;
        fn aclshmem_n_pes() -> i32;
        fn aclshmem_finalize() -> i32;
    }
    optional {
        fn aclshmemx_init_status() -> i32;
        fn aclshmem_info_get_version(major: *mut i32, minor: *mut i32);
    }
    optional_data {
        /// SHMEM's host copy of its state (`aclshmem_device_host_state_t g_state`, see [`crate::device_state`]):
        /// not public API, so a build that hides it (or renames it) simply leaves this `None`.
        static g_state;
    }
    // What a call can do to device work in flight (`ascendcl_sys::calls::HostActs`): initialisation builds the SDMA
    // workspace and its queues in device memory; `calloc` clears device memory.
    acts {
        aclshmemx_init_attr: WRITES_DEVICE | SUBMITS;
        aclshmem_calloc: WRITES_DEVICE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_attributes_carry_the_header_defaults() {
        let attr = aclshmemx_init_attr_t::new(3, 8, 1 << 30);
        assert_eq!((attr.my_pe, attr.n_pes, attr.local_mem_size), (3, 8, 1 << 30));
        assert!(attr.ip_port.iter().all(|&byte| byte == 0));
        assert_eq!(attr.option_attr.version, 65_560, "(1 << 16) + 24");
        assert_eq!(attr.option_attr.data_op_engine_type, ACLSHMEM_DATA_OP_MTE);
        assert_eq!(
            [
                attr.option_attr.shm_init_timeout,
                attr.option_attr.shm_create_timeout,
                attr.option_attr.control_operation_timeout
            ],
            [120; 3]
        );
        assert_eq!(attr.option_attr.sockFd, 0);
        assert!(attr.comm_args.is_null());
        assert_eq!(attr.instance_id, 0);
    }

    #[test]
    fn the_unique_id_initializer_sets_only_the_version() {
        let uid = aclshmemx_uniqueid_t::default();
        assert_eq!(uid.version, 65_672, "(1 << 16) + 136");
        let bytes = uid.to_bytes();
        assert_eq!(&bytes[0..4], &65_672i32.to_ne_bytes());
        assert!(bytes[4..].iter().all(|&byte| byte == 0));
    }

    #[test]
    fn the_unique_id_survives_a_byte_round_trip() {
        let mut bytes = [0u8; 136];
        for (index, byte) in bytes.iter_mut().enumerate() {
            *byte = (index * 7 + 3) as u8;
        }
        assert_eq!(aclshmemx_uniqueid_t::from_bytes(&bytes).to_bytes(), bytes);
    }

    #[test]
    fn the_manifest_entries_match_the_documented_layout() {
        let attr = aclshmemx_init_attr_t::abi_decl();
        let offsets: Vec<(&str, usize)> = attr.fields.iter().map(|field| (field.name, field.offset)).collect();
        assert_eq!(
            offsets,
            [
                ("my_pe", 0),
                ("n_pes", 4),
                ("ip_port", 8),
                ("local_mem_size", 72),
                ("option_attr", 80),
                ("comm_args", 104),
                ("instance_id", 112)
            ]
        );
        assert_eq!(attr.size, 120);
        assert_eq!(aclshmemx_uniqueid_t::abi_decl().size, 136);
        assert_eq!(ShmemApi::function_decls().len(), 13);
    }
}
