//! Shared by the integration tests: the twin's table, initialised once, with the calling thread's device set.
#![allow(dead_code)]

use core::ffi::c_void;
use std::sync::Once;

use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;

/// The table, with `aclInit` done and device 0 current on the calling thread.
pub fn api() -> &'static AclApi {
    static INIT: Once = Once::new();
    let api = cann_twin::acl_api();
    INIT.call_once(|| {
        // SAFETY: a null config path is allowed.
        assert_eq!(unsafe { api.aclInit(core::ptr::null()) }, ACL_SUCCESS);
    });
    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtSetDevice(0) }, ACL_SUCCESS);
    api
}

/// `aclrtMalloc` of `size` bytes, asserting success.
pub fn malloc(api: &AclApi, size: usize) -> *mut c_void {
    let mut ptr = core::ptr::null_mut();
    // SAFETY: `ptr` is writable.
    assert_eq!(unsafe { api.aclrtMalloc(&mut ptr, size, ACL_MEM_MALLOC_HUGE_FIRST) }, ACL_SUCCESS);
    assert!(!ptr.is_null());
    ptr
}

/// `aclrtMemcpy`, returning the code.
pub fn memcpy(
    api: &AclApi,
    dst: *mut c_void,
    dst_max: usize,
    src: *const c_void,
    count: usize,
    kind: aclrtMemcpyKind,
) -> aclError {
    // SAFETY: Host pointers passed by the tests are valid for `count` bytes; device ones are checked by the twin.
    unsafe { api.aclrtMemcpy(dst, dst_max, src, count, kind) }
}

/// Uploads `data` to `dev`.
pub fn upload(api: &AclApi, dev: *mut c_void, data: &[u8]) {
    assert_eq!(memcpy(api, dev, data.len(), data.as_ptr().cast(), data.len(), ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
}

/// Downloads `len` bytes from `dev`.
pub fn download(api: &AclApi, dev: *const c_void, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    assert_eq!(memcpy(api, out.as_mut_ptr().cast(), len, dev, len, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    out
}

/// `len` bytes of a deterministic pattern seeded by `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// The cdylib, built fresh (`cargo test` builds the library only as an rlib for its tests), into a target
/// directory of its own below this test's (the outer `cargo` holds the lock of its own). `None` when `cargo` is not
/// known to this process.
pub fn cdylib() -> Option<std::path::PathBuf> {
    static BUILT: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cargo = std::env::var_os("CARGO")?;
            // The test binary lives in <target>/<profile>/deps.
            let exe = std::env::current_exe().ok()?;
            let target = exe.parent()?.parent()?.parent()?.join("cann-twin-cdylib");
            let status = std::process::Command::new(cargo)
                .args(["build", "--quiet", "-p", "cann-twin", "--lib", "--target-dir"])
                .arg(&target)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("run cargo");
            assert!(status.success(), "building the cdylib failed: {status}");
            let library = target.join("debug/libcann_twin.so");
            assert!(library.exists(), "{} was not built", library.display());
            Some(library)
        })
        .clone()
}

/// SHMEM initialised with SDMA on device 0 (once, one PE); returns the SDMA workspace address from `g_state`.
pub fn sdma_workspace() -> u64 {
    use cann_shmem_sys::sys::*;
    static WORKSPACE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    api();
    *WORKSPACE.get_or_init(|| {
        let shmem = cann_twin::shmem_api();
        let mut uid = aclshmemx_uniqueid_t::default();
        let mut attr = aclshmemx_init_attr_t::new(0, 1, 256 << 20);
        // SAFETY: every pointer is a live local; `uid` outlives the initialisation that reads it.
        unsafe {
            assert_eq!(shmem.aclshmemx_get_uniqueid(&mut uid), ACLSHMEM_SUCCESS);
            assert_eq!(shmem.aclshmemx_set_attr_uniqueid_args(0, 1, 256 << 20, &mut uid, &mut attr), 0);
            attr.option_attr.data_op_engine_type = ACLSHMEM_DATA_OP_SDMA;
            assert_eq!(shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut attr), ACLSHMEM_SUCCESS);
        }
        let state = cann_shmem_sys::result::state::host_state(shmem).expect("g_state reads back");
        assert_eq!((state.header.mype, state.header.npes), (0, 1));
        assert_ne!(state.sdma_workspace_addr, 0);
        state.sdma_workspace_addr
    })
}

/// A 64-byte SDMA copy SQE of `length` bytes with SHMEM's control fields, built from docs/hardware.md section 4 (not
/// from the twin's constants or decoder): type 11, kernel credit 240, the opcode word of a copy (opcode 0, sssv, dssv,
/// sns and dns set, QoS 6), link type 255. The twin's engine refuses a copy SQE with other control fields.
pub fn copy_sqe(src: u64, dst: u64, length: u32) -> [u8; 64] {
    let mut raw = [0u8; 64];
    raw[0..2].copy_from_slice(&11u16.to_le_bytes());
    raw[14] = 240;
    let word = (1u32 << 9) | (1 << 10) | (1 << 11) | (1 << 12) | (6 << 13);
    raw[16..20].copy_from_slice(&word.to_le_bytes());
    raw[28..32].copy_from_slice(&length.to_le_bytes());
    raw[32..40].copy_from_slice(&src.to_le_bytes());
    raw[40..48].copy_from_slice(&dst.to_le_bytes());
    raw[48] = 255;
    raw
}
