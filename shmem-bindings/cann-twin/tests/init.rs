//! Initialisation and device rules, in one test (they change process-wide state, so nothing may run beside them).

use ascendcl_sys::sys::*;

#[test]
fn init_device_and_finalize_rules_and_codes() {
    let api = cann_twin::acl_api();
    assert_eq!(api.path(), std::path::Path::new(cann_twin::IN_PROCESS_PATH));
    let mut device = -1;
    let mut count = 0u32;
    let mut stream: aclrtStream = core::ptr::null_mut();
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // SAFETY: for the whole test, every pointer passed is a live local; device addresses are never dereferenced here.
    unsafe {
        // Version queries need no initialisation.
        assert_eq!(api.aclrtGetVersion(&mut major, &mut minor, &mut patch), ACL_SUCCESS);
        assert_eq!((major, minor, patch), cann_twin::TWIN_VERSION);
        assert_eq!(api.aclrtGetVersion(core::ptr::null_mut(), &mut minor, &mut patch), ACL_ERROR_INVALID_PARAM);
        let mut version: aclCANNPackageVersion = core::mem::zeroed();
        assert_eq!(api.aclsysGetCANNVersion(ACL_PKG_NAME_CANN, &mut version).expect("resolved"), ACL_SUCCESS);
        let text = core::ffi::CStr::from_ptr(version.version.as_ptr()).to_str().expect("utf-8");
        assert_eq!(text, cann_twin::TWIN_VERSION_STRING);
        assert_eq!(
            api.aclsysGetCANNVersion(ACL_PKG_NAME_HCCL, &mut version).expect("resolved"),
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        );

        // Before aclInit.
        assert_eq!(api.aclrtSetDevice(0), ACL_ERROR_UNINITIALIZE);
        assert_eq!(api.aclrtGetDeviceCount(&mut count), ACL_ERROR_UNINITIALIZE);
        assert_eq!(api.aclFinalize(), ACL_ERROR_UNINITIALIZE);

        // A config path that does not exist.
        assert_eq!(api.aclInit(c"/nonexistent/cann-twin-config.json".as_ptr()), ACL_ERROR_INVALID_FILE);
        assert_eq!(api.aclInit(core::ptr::null()), ACL_SUCCESS);
        assert_eq!(api.aclInit(core::ptr::null()), ACL_ERROR_REPEAT_INITIALIZE);

        assert_eq!(api.aclrtGetDeviceCount(core::ptr::null_mut()), ACL_ERROR_INVALID_PARAM);
        assert_eq!(api.aclrtGetDeviceCount(&mut count), ACL_SUCCESS);
        let expected = std::env::var("AIV_TWIN_DEVICES").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
        assert_eq!(count, expected);

        // No device set on this thread yet.
        assert_eq!(api.aclrtGetDevice(&mut device), ACL_ERROR_RT_CONTEXT_NULL);
        assert_eq!(api.aclrtGetDevice(core::ptr::null_mut()), ACL_ERROR_INVALID_PARAM);
        assert_eq!(api.aclrtCreateStream(&mut stream), ACL_ERROR_RT_CONTEXT_NULL);
        let mut dev = core::ptr::null_mut();
        assert_eq!(api.aclrtMalloc(&mut dev, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_CONTEXT_NULL);
        assert_eq!(api.aclrtSetDevice(-1), ACL_ERROR_RT_INVALID_DEVICEID);
        assert_eq!(api.aclrtSetDevice(count as i32), ACL_ERROR_RT_INVALID_DEVICEID);
        assert_eq!(api.aclrtResetDevice(1), ACL_ERROR_RT_CONTEXT_NULL);

        // Set, get, and the current device is per thread.
        assert_eq!(api.aclrtSetDevice(1), ACL_SUCCESS);
        assert_eq!(api.aclrtGetDevice(&mut device), ACL_SUCCESS);
        assert_eq!(device, 1);
        let other = std::thread::spawn(move || {
            let mut device = -1;
            let api = cann_twin::acl_api();
            api.aclrtGetDevice(&mut device)
        })
        .join()
        .expect("thread");
        assert_eq!(other, ACL_ERROR_RT_CONTEXT_NULL);

        // Resetting releases the device's memory: a copy from it fails afterwards.
        assert_eq!(api.aclrtMalloc(&mut dev, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
        assert_eq!(api.aclrtCreateStream(&mut stream), ACL_SUCCESS);
        assert_eq!(api.aclrtResetDevice(1), ACL_SUCCESS);
        assert_eq!(api.aclrtGetDevice(&mut device), ACL_ERROR_RT_CONTEXT_NULL);
        let mut host = [0u8; 64];
        assert_eq!(
            api.aclrtMemcpy(host.as_mut_ptr().cast(), 64, dev, 64, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_RT_PARAM_INVALID
        );
        assert_eq!(api.aclrtDestroyStream(stream), ACL_ERROR_RT_INVALID_HANDLE);

        // Set twice needs two resets.
        assert_eq!(api.aclrtSetDevice(2), ACL_SUCCESS);
        assert_eq!(api.aclrtSetDevice(2), ACL_SUCCESS);
        assert_eq!(api.aclrtResetDevice(2), ACL_SUCCESS);
        assert_eq!(api.aclrtGetDevice(&mut device), ACL_SUCCESS);
        assert_eq!(device, 2);
        assert_eq!(api.aclrtResetDevice(2), ACL_SUCCESS);
        assert_eq!(api.aclrtResetDevice(2), ACL_ERROR_RT_CONTEXT_NULL);

        // Finalize, finalize again, and initialise again.
        assert_eq!(api.aclrtSetDevice(0), ACL_SUCCESS);
        assert_eq!(api.aclFinalize(), ACL_SUCCESS);
        assert_eq!(api.aclFinalize(), ACL_ERROR_REPEAT_FINALIZE);
        assert_eq!(api.aclrtGetDevice(&mut device), ACL_ERROR_UNINITIALIZE);
        assert_eq!(api.aclInit(core::ptr::null()), ACL_SUCCESS);
        assert_eq!(api.aclrtGetDevice(&mut device), ACL_ERROR_RT_CONTEXT_NULL, "finalize reset every device");
        assert_eq!(api.aclFinalize(), ACL_SUCCESS);
    }
}
