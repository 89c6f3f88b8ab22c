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
