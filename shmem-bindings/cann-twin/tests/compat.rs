//! The ACL functions Mooncake's Ascend wheel imports besides the copy path (`acl_compat`): per-thread contexts,
//! device id mappings, pointer attributes, stream abort, the recent error message, the SoC name, and the two
//! functions answered with `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`.

mod common;

use core::ffi::{c_void, CStr};

use ascendcl_sys::sys::*;
use common::{api, download, malloc, pattern, upload};

#[test]
fn contexts_are_per_thread_and_setting_one_makes_its_device_current() {
    let api = api();
    let mut context: aclrtContext = core::ptr::null_mut();
    // SAFETY: `context` is writable; the other arguments are values.
    unsafe {
        assert_eq!(
            api.aclrtGetCurrentContext(core::ptr::null_mut()).expect("aclrtGetCurrentContext"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(api.aclrtGetCurrentContext(&mut context).expect("aclrtGetCurrentContext"), ACL_SUCCESS);
        assert!(!context.is_null());
        assert_eq!(
            api.aclrtSetCurrentContext(core::ptr::null_mut()).expect("aclrtSetCurrentContext"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtSetCurrentContext(0x1234 as aclrtContext).expect("aclrtSetCurrentContext"),
            ACL_ERROR_INVALID_PARAM
        );
    }
    let shared = context as usize;
    std::thread::spawn(move || {
        let mut device = -1;
        let mut context: aclrtContext = core::ptr::null_mut();
        // SAFETY: outputs are writable; the context is the one the other thread got.
        unsafe {
            assert_eq!(api.aclrtGetDevice(&mut device), ACL_ERROR_RT_CONTEXT_NULL, "a new thread has no device");
            assert_eq!(
                api.aclrtGetCurrentContext(&mut context).expect("aclrtGetCurrentContext"),
                ACL_ERROR_RT_CONTEXT_NULL
            );
            assert_eq!(
                api.aclrtSetCurrentContext(shared as aclrtContext).expect("aclrtSetCurrentContext"),
                ACL_SUCCESS
            );
            assert_eq!(api.aclrtGetDevice(&mut device), ACL_SUCCESS);
            assert_eq!(device, 0);
            assert_eq!(api.aclrtGetCurrentContext(&mut context).expect("aclrtGetCurrentContext"), ACL_SUCCESS);
            assert_eq!(context as usize, shared);
        }
        // Device memory is usable from this thread now.
        let dev = malloc(api, 4096);
        upload(api, dev, &pattern(4096, 3));
        assert_eq!(download(api, dev, 4096), pattern(4096, 3));
        // SAFETY: an address `aclrtMalloc` returned.
        assert_eq!(unsafe { api.aclrtFree(dev) }, ACL_SUCCESS);
    })
    .join()
    .expect("thread");
}

#[test]
fn a_context_of_a_device_no_thread_set_is_refused() {
    let api = api();
    let mut context: aclrtContext = core::ptr::null_mut();
    // SAFETY: `context` is writable.
    assert_eq!(unsafe { api.aclrtGetCurrentContext(&mut context).expect("aclrtGetCurrentContext") }, ACL_SUCCESS);
    // Device 7's context: the next handle of the twin's scheme, never set by any test of this binary.
    let seventh = context as usize + 7 * 16;
    std::thread::spawn(move || {
        // SAFETY: a value argument.
        let code = unsafe { api.aclrtSetCurrentContext(seventh as aclrtContext).expect("aclrtSetCurrentContext") };
        assert_eq!(code, ACL_ERROR_RT_CONTEXT_NULL);
    })
    .join()
    .expect("thread");
}

#[test]
fn device_ids_map_to_themselves_within_range() {
    let api = api();
    let mut out = -1;
    // SAFETY: `out` is writable.
    unsafe {
        assert_eq!(api.aclrtGetPhyDevIdByLogicDevId(3, &mut out).expect("aclrtGetPhyDevIdByLogicDevId"), ACL_SUCCESS);
        assert_eq!(out, 3);
        assert_eq!(api.aclrtGetLogicDevIdByUserDevId(5, &mut out).expect("aclrtGetLogicDevIdByUserDevId"), ACL_SUCCESS);
        assert_eq!(out, 5);
        assert_eq!(
            api.aclrtGetPhyDevIdByLogicDevId(-1, &mut out).expect("aclrtGetPhyDevIdByLogicDevId"),
            ACL_ERROR_RT_INVALID_DEVICEID
        );
        assert_eq!(
            api.aclrtGetLogicDevIdByUserDevId(100_000, &mut out).expect("aclrtGetLogicDevIdByUserDevId"),
            ACL_ERROR_RT_INVALID_DEVICEID
        );
        assert_eq!(
            api.aclrtGetPhyDevIdByLogicDevId(0, core::ptr::null_mut()).expect("aclrtGetPhyDevIdByLogicDevId"),
            ACL_ERROR_INVALID_PARAM
        );
    }
}

#[test]
fn pointer_attributes_tell_device_from_host() {
    let api = api();
    let dev = malloc(api, 4096);
    let host = [0u8; 64];
    let mut attributes = aclrtPtrAttributes {
        location: aclrtMemLocation { id: 99, r#type: ACL_MEM_LOCATION_TYPE_UNREGISTERED },
        pageSize: 0,
        rsv: [0; 4],
    };
    // SAFETY: `attributes` is writable; the pointers are only classified.
    unsafe {
        assert_eq!(
            api.aclrtPointerGetAttributes(dev, &mut attributes).expect("aclrtPointerGetAttributes"),
            ACL_SUCCESS
        );
        assert_eq!(attributes.location.r#type, ACL_MEM_LOCATION_TYPE_DEVICE);
        assert_eq!(attributes.location.id, 0);
        assert_eq!(
            api.aclrtPointerGetAttributes(host.as_ptr().cast(), &mut attributes).expect("aclrtPointerGetAttributes"),
            ACL_SUCCESS
        );
        assert_eq!(attributes.location.r#type, ACL_MEM_LOCATION_TYPE_HOST);
        assert!(attributes.pageSize > 0);
        assert_eq!(
            api.aclrtPointerGetAttributes(core::ptr::null(), &mut attributes).expect("aclrtPointerGetAttributes"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtPointerGetAttributes(dev, core::ptr::null_mut()).expect("aclrtPointerGetAttributes"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(api.aclrtFree(dev), ACL_SUCCESS);
    }
}

#[test]
fn a_failed_call_leaves_its_message_on_its_thread() {
    let api = api();
    std::thread::spawn(move || {
        // SAFETY: no arguments; the returned string is read before any further ACL call on this thread.
        unsafe {
            let none = api.aclGetRecentErrMsg().expect("aclGetRecentErrMsg");
            assert!(!none.is_null() && CStr::from_ptr(none).is_empty(), "nothing failed on this thread yet");
            let mut device = 0;
            assert_eq!(api.aclrtGetDevice(&mut device), ACL_ERROR_RT_CONTEXT_NULL);
            let message =
                CStr::from_ptr(api.aclGetRecentErrMsg().expect("aclGetRecentErrMsg")).to_string_lossy().into_owned();
            assert!(message.contains("aclrtGetDevice") && message.contains("107002"), "{message}");
        }
    })
    .join()
    .expect("thread");
}

#[test]
fn the_soc_name_is_the_twins() {
    let api = api();
    // SAFETY: a static NUL-terminated string.
    let code = unsafe { CStr::from_ptr(api.aclrtGetSocName().expect("aclrtGetSocName")) };
    assert_eq!(code, cann_twin::acl::TWIN_SOC_NAME);
}

#[test]
fn abort_drops_queued_copies_and_the_stream_stays_usable() {
    let api = api();
    let len = 1 << 20;
    let dev = malloc(api, len);
    let data = pattern(len, 9);
    let mut stream: aclrtStream = core::ptr::null_mut();
    // SAFETY: Host buffers outlive the synchronisations; device addresses are checked by the twin.
    unsafe {
        assert_eq!(api.aclrtCreateStreamWithConfig(&mut stream, 0, 3), ACL_SUCCESS);
        cann_twin::control::hold_streams(true);
        for _ in 0..8 {
            let code = api.aclrtMemcpyAsync(dev, len, data.as_ptr().cast(), len, ACL_MEMCPY_HOST_TO_DEVICE, stream);
            assert_eq!(code, ACL_SUCCESS);
        }
        assert_eq!(api.aclrtStreamAbort(stream).expect("aclrtStreamAbort"), ACL_SUCCESS);
        cann_twin::control::hold_streams(false);
        assert_eq!(api.aclrtSynchronizeStreamWithTimeout(stream, 5000), ACL_SUCCESS);
        assert_eq!(download(api, dev, len), vec![0u8; len], "no aborted copy ran");
        let code = api.aclrtMemcpyAsync(dev, len, data.as_ptr().cast(), len, ACL_MEMCPY_HOST_TO_DEVICE, stream);
        assert_eq!(code, ACL_SUCCESS);
        assert_eq!(api.aclrtSynchronizeStreamWithTimeout(stream, 5000), ACL_SUCCESS);
        assert_eq!(download(api, dev, len), data);
        assert_eq!(api.aclrtStreamAbort(0x10 as aclrtStream).expect("aclrtStreamAbort"), ACL_ERROR_RT_INVALID_HANDLE);
        assert_eq!(api.aclrtDestroyStream(stream), ACL_SUCCESS);
        assert_eq!(api.aclrtFree(dev), ACL_SUCCESS);
    }
}

#[test]
fn batch_copies_and_the_no_uc_reservation_are_not_supported() {
    let api = api();
    let mut fail_index = 0usize;
    let mut ptr: *mut c_void = core::ptr::null_mut();
    // SAFETY: the batch is empty; outputs are writable.
    unsafe {
        let (no_ptrs, no_sizes) = (core::ptr::null_mut(), core::ptr::null_mut());
        let code = api
            .aclrtMemcpyBatch(
                no_ptrs,
                no_sizes,
                no_ptrs,
                no_sizes,
                0,
                core::ptr::null_mut(),
                no_sizes,
                0,
                &mut fail_index,
            )
            .expect("aclrtMemcpyBatch");
        assert_eq!(code, ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
        assert_eq!(fail_index, usize::MAX);
        assert_eq!(
            api.aclrtReserveMemAddressNoUCMemory(&mut ptr, 2 << 20, 0, core::ptr::null_mut(), 0)
                .expect("aclrtReserveMemAddressNoUCMemory"),
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        );
    }
}
