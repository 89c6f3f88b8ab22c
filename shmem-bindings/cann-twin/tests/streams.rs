//! Streams through the table: asynchronous copies run in order and are complete after synchronisation.

mod common;

use core::ffi::c_void;

use ascendcl_sys::sys::*;
use common::{api, download, malloc, pattern};

#[test]
fn async_copies_are_ordered_on_a_stream_and_complete_after_sync() {
    let api = api();
    let len = 8 << 20;
    let dev = malloc(api, len);
    let mut stream: aclrtStream = core::ptr::null_mut();
    // SAFETY: Host buffers outlive the synchronisation; device addresses are checked by the twin.
    unsafe {
        assert_eq!(api.aclrtCreateStreamWithConfig(&mut stream, 0, 0x4000_0000), ACL_ERROR_INVALID_PARAM);
        assert_eq!(api.aclrtCreateStreamWithConfig(&mut stream, 0, ACL_STREAM_FAST_LAUNCH as u32), ACL_SUCCESS);
        // Many writes of the same range, then a read: only the last write may be seen, and only after sync.
        let versions: Vec<Vec<u8>> = (0..16).map(|seed| pattern(len, seed)).collect();
        for version in &versions {
            let code = api.aclrtMemcpyAsync(dev, len, version.as_ptr().cast(), len, ACL_MEMCPY_HOST_TO_DEVICE, stream);
            assert_eq!(code, ACL_SUCCESS);
        }
        let mut out = vec![0u8; len];
        let code = api.aclrtMemcpyAsync(out.as_mut_ptr().cast(), len, dev, len, ACL_MEMCPY_DEVICE_TO_HOST, stream);
        assert_eq!(code, ACL_SUCCESS);
        assert_eq!(api.aclrtSynchronizeStream(stream), ACL_SUCCESS);
        assert!(out == versions[15], "the read ran after every write, in order");

        // Bad arguments are refused at submission.
        let h = out.as_mut_ptr().cast::<c_void>();
        assert_eq!(
            api.aclrtMemcpyAsync(h, len, dev, len, ACL_MEMCPY_HOST_TO_DEVICE, stream),
            ACL_ERROR_RT_INVALID_MEMORY_TYPE
        );
        let other = malloc(api, 4096);
        let odd = (dev as usize + 1) as *mut c_void;
        assert_eq!(
            api.aclrtMemcpyAsync(odd, 64, other, 64, ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
            ACL_ERROR_RT_ADDR_UNALIGNED
        );
        assert_eq!(api.aclrtMemcpyAsync(dev, 64, other, 64, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), ACL_SUCCESS);

        // A copy whose memory is freed before it runs fails at synchronisation, not silently.
        let mut slow: aclrtStream = core::ptr::null_mut();
        assert_eq!(api.aclrtCreateStream(&mut slow), ACL_SUCCESS);
        let victim = malloc(api, len);
        let big = pattern(len, 99);
        // Held, so the copies are still queued when their destination is freed (not left to timing).
        cann_twin::control::hold_streams(true);
        for _ in 0..4 {
            api.aclrtMemcpyAsync(victim, len, big.as_ptr().cast(), len, ACL_MEMCPY_HOST_TO_DEVICE, slow);
        }
        assert_eq!(api.aclrtFree(victim), ACL_SUCCESS);
        cann_twin::control::hold_streams(false);
        let code = api.aclrtSynchronizeStream(slow);
        assert_eq!(code, ACL_ERROR_RT_PARAM_INVALID, "copies queued before the free run after it and fail");
        assert_eq!(api.aclrtSynchronizeStream(slow), ACL_SUCCESS, "the failure is reported once");

        // Timeouts: 0 only checks; -1 waits; below -1 is invalid.
        for _ in 0..32 {
            api.aclrtMemcpyAsync(dev, len, big.as_ptr().cast(), len, ACL_MEMCPY_HOST_TO_DEVICE, slow);
        }
        let code = api.aclrtSynchronizeStreamWithTimeout(slow, 0);
        assert!(code == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT || code == ACL_SUCCESS, "{code}");
        assert_eq!(api.aclrtSynchronizeStreamWithTimeout(slow, -1), ACL_SUCCESS);
        assert_eq!(download(api, dev, len), big);
        assert_eq!(api.aclrtSynchronizeStreamWithTimeout(slow, -2), ACL_ERROR_INVALID_PARAM);

        // The default (null) stream.
        let small = pattern(4096, 5);
        assert_eq!(
            api.aclrtMemcpyAsync(
                other,
                4096,
                small.as_ptr().cast(),
                4096,
                ACL_MEMCPY_HOST_TO_DEVICE,
                core::ptr::null_mut()
            ),
            ACL_SUCCESS
        );
        assert_eq!(api.aclrtSynchronizeStream(core::ptr::null_mut()), ACL_SUCCESS);
        assert_eq!(download(api, other, 4096), small);

        assert_eq!(api.aclrtDestroyStream(slow), ACL_SUCCESS);
        assert_eq!(api.aclrtDestroyStream(stream), ACL_SUCCESS);
        assert_eq!(api.aclrtDestroyStream(stream), ACL_ERROR_RT_INVALID_HANDLE);
        assert_eq!(api.aclrtSynchronizeStream(stream), ACL_ERROR_RT_INVALID_HANDLE);
        assert_eq!(api.aclrtFree(dev), ACL_SUCCESS);
        assert_eq!(api.aclrtFree(other), ACL_SUCCESS);
    }
}
