//! Device memory through the table: round trips with data checked, memset, Host memory and registration, and
//! the codes for bad pointers, sizes and kinds.

mod common;

use core::ffi::c_void;

use ascendcl_sys::sys::*;
use common::{api, download, malloc, memcpy, pattern, upload};

#[test]
fn h2d_d2h_d2d_round_trips_keep_the_data() {
    let api = api();
    let len = 3 * 1024 * 1024 + 17;
    let data = pattern(len, 7);
    let a = malloc(api, len);
    let b = malloc(api, len);
    upload(api, a, &data);
    assert_eq!(memcpy(api, b, len, a, len, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
    assert_eq!(download(api, b, len), data);
    // At an offset, with the default kind inferred from the pointers.
    let tail = &data[1000..2000];
    let at = (b as usize + 5) as *mut c_void;
    assert_eq!(memcpy(api, at, 1000, tail.as_ptr().cast(), 1000, ACL_MEMCPY_DEFAULT), ACL_SUCCESS);
    assert_eq!(download(api, at, 1000), tail);
    // Host to Host.
    let mut copy = vec![0u8; 100];
    assert_eq!(
        memcpy(api, copy.as_mut_ptr().cast(), 100, data.as_ptr().cast(), 100, ACL_MEMCPY_HOST_TO_HOST),
        ACL_SUCCESS
    );
    assert_eq!(copy, data[..100]);
    // SAFETY: addresses from aclrtMalloc.
    unsafe {
        assert_eq!(api.aclrtFree(a), ACL_SUCCESS);
        assert_eq!(api.aclrtFree(b), ACL_SUCCESS);
    }
}

#[test]
fn memset_sets_exactly_the_bytes_asked() {
    let api = api();
    let dev = malloc(api, 4096);
    upload(api, dev, &[0xEEu8; 4096]);
    let at = (dev as usize + 100) as *mut c_void;
    // SAFETY: device addresses are checked by the twin.
    unsafe {
        assert_eq!(api.aclrtMemset(at, 200, 0x1AB, 200), ACL_SUCCESS);
        assert_eq!(api.aclrtMemset(at, 10, 0, 200), ACL_ERROR_RT_PARAM_INVALID, "maxCount below count");
        assert_eq!(api.aclrtMemset(core::ptr::null_mut(), 1, 0, 0), ACL_SUCCESS, "count 0 is done first");
        assert_eq!(api.aclrtMemset(core::ptr::null_mut(), 1, 0, 1), ACL_ERROR_INVALID_PARAM);
        assert_eq!(api.aclrtMemset(at, 4096, 0, 4096), ACL_ERROR_RT_PARAM_INVALID, "past the allocation");
        let mut host = [0u8; 8];
        assert_eq!(api.aclrtMemset(host.as_mut_ptr().cast(), 8, 0, 8), ACL_ERROR_RT_INVALID_MEMORY_TYPE);
    }
    let back = download(api, dev, 4096);
    assert!(back[..100].iter().all(|&b| b == 0xEE));
    assert!(back[100..300].iter().all(|&b| b == 0xAB));
    assert!(back[300..].iter().all(|&b| b == 0xEE));
}

#[test]
fn bad_pointers_sizes_and_kinds_return_their_codes() {
    let api = api();
    let dev = malloc(api, 256);
    let other = malloc(api, 256);
    let mut host = vec![0u8; 512];
    let h = host.as_mut_ptr().cast::<c_void>();
    // Kinds that do not match the pointers.
    assert_eq!(memcpy(api, h, 256, dev, 256, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_RT_INVALID_MEMORY_TYPE);
    assert_eq!(memcpy(api, dev, 256, h, 256, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_RT_INVALID_MEMORY_TYPE);
    assert_eq!(memcpy(api, dev, 256, h, 256, ACL_MEMCPY_HOST_TO_HOST), ACL_ERROR_RT_INVALID_MEMORY_TYPE);
    assert_eq!(memcpy(api, dev, 256, h, 256, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_RT_INVALID_MEMORY_TYPE);
    assert_eq!(memcpy(api, dev, 256, other, 256, ACL_MEMCPY_INNER_DEVICE_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    assert_eq!(memcpy(api, dev, 256, other, 256, aclrtMemcpyKind(99)), ACL_ERROR_INVALID_PARAM);
    // Null pointers, zero count, destMax.
    assert_eq!(memcpy(api, core::ptr::null_mut(), 0, h, 0, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    assert_eq!(memcpy(api, core::ptr::null_mut(), 8, h, 8, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    assert_eq!(memcpy(api, dev, 8, core::ptr::null(), 8, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    assert_eq!(memcpy(api, dev, 8, h, 16, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_RT_PARAM_INVALID);
    // Past the end of an allocation, from inside it.
    let near_end = (dev as usize + 200) as *mut c_void;
    assert_eq!(memcpy(api, h, 512, near_end, 57, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_RT_PARAM_INVALID);
    assert_eq!(memcpy(api, h, 512, near_end, 56, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    // An unallocated device address (just past an allocation's guard) never crashes.
    let unallocated = (dev as usize + 4096) as *mut c_void;
    assert_eq!(memcpy(api, h, 8, unallocated, 8, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_RT_PARAM_INVALID);
    assert_eq!(memcpy(api, unallocated, 8, h, 8, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_RT_PARAM_INVALID);
    let mut ptr = core::ptr::null_mut();
    // SAFETY: every pointer is a live local or a device address the twin checks.
    unsafe {
        assert_eq!(api.aclrtMalloc(&mut ptr, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
        assert_eq!(api.aclrtMalloc(core::ptr::null_mut(), 8, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
        assert_eq!(
            api.aclrtMalloc(&mut ptr, usize::MAX / 2, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_ERROR_RT_MEMORY_ALLOCATION
        );
        assert_eq!(api.aclrtFree(core::ptr::null_mut()), ACL_ERROR_INVALID_PARAM);
        assert_eq!(api.aclrtFree(near_end), ACL_ERROR_RT_PARAM_INVALID, "not an allocation's start");
        assert_eq!(api.aclrtFree(h), ACL_ERROR_RT_PARAM_INVALID, "a Host address");
        assert_eq!(api.aclrtFree(dev), ACL_SUCCESS);
        assert_eq!(api.aclrtFree(dev), ACL_ERROR_RT_PARAM_INVALID, "double free");
        assert_eq!(memcpy(api, h, 8, dev, 8, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_RT_PARAM_INVALID, "use after free");
        assert_eq!(api.aclrtFree(other), ACL_SUCCESS);
    }
}

#[test]
fn malloc_host_and_host_registration() {
    let api = api();
    let mut host = core::ptr::null_mut();
    // SAFETY: live locals; the Host memory is used within its size.
    unsafe {
        assert_eq!(api.aclrtMallocHost(&mut host, 0), ACL_ERROR_INVALID_PARAM);
        assert_eq!(api.aclrtMallocHost(&mut host, 10_000), ACL_SUCCESS);
        core::ptr::write_bytes(host.cast::<u8>(), 0x5C, 10_000);
        let dev = malloc(api, 10_000);
        assert_eq!(memcpy(api, dev, 10_000, host, 10_000, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
        assert!(download(api, dev, 10_000).iter().all(|&b| b == 0x5C));
        assert_eq!(api.aclrtFreeHost(dev), ACL_ERROR_RT_PARAM_INVALID);
        assert_eq!(api.aclrtFreeHost(host), ACL_SUCCESS);
        assert_eq!(api.aclrtFreeHost(host), ACL_ERROR_RT_PARAM_INVALID);

        // Registration: a distinct device address onto the same pages.
        let mut buffer = pattern(8192, 3);
        let base = buffer.as_mut_ptr().add(10).cast::<c_void>();
        let mut mapped = core::ptr::null_mut();
        assert_eq!(
            api.aclrtHostRegister(base, 0, ACL_HOST_REGISTER_MAPPED, &mut mapped).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtHostRegister(base, 4000, ACL_HOST_REGISTER_MAPPED, core::ptr::null_mut()).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtHostRegister(base, 4000, ACL_HOST_REGISTER_IOMEMORY, &mut mapped).expect("resolved"),
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        );
        assert_eq!(
            api.aclrtHostRegister(base, 4000, ACL_HOST_REGISTER_MAPPED, &mut mapped).expect("resolved"),
            ACL_SUCCESS
        );
        assert_ne!(mapped, base, "the device address is not the Host pointer");
        let inside = base.cast::<u8>().add(100).cast::<c_void>();
        let mut again = core::ptr::null_mut();
        assert_eq!(
            api.aclrtHostRegister(inside, 10, ACL_HOST_REGISTER_MAPPED, &mut again).expect("resolved"),
            ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        );
        // The device writes through its address; the Host sees it at its own pointer.
        assert_eq!(memcpy(api, mapped, 4000, dev, 4000, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
        assert!(buffer[10..4010].iter().all(|&b| b == 0x5C));
        assert_eq!(buffer[4010], pattern(8192, 3)[4010], "nothing past the window");
        // The device reads through it too; past the window is refused.
        buffer[10] = 0x77;
        assert_eq!(download(api, mapped, 1), [0x77]);
        let mut out = [0u8; 8];
        assert_eq!(
            memcpy(api, out.as_mut_ptr().cast(), 8, mapped.cast::<u8>().add(3996).cast(), 8, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_RT_PARAM_INVALID
        );
        assert_eq!(api.aclrtHostUnregister(inside).expect("resolved"), ACL_ERROR_HOST_MEMORY_NOT_REGISTERED);
        assert_eq!(api.aclrtHostUnregister(base).expect("resolved"), ACL_SUCCESS);
        assert_eq!(
            memcpy(api, out.as_mut_ptr().cast(), 1, mapped, 1, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_RT_PARAM_INVALID
        );
        // Read-only registration: device writes are refused.
        assert_eq!(
            api.aclrtHostRegister(base, 64, ACL_HOST_REGISTER_READONLY, &mut mapped).expect("resolved"),
            ACL_SUCCESS
        );
        assert_eq!(memcpy(api, mapped, 64, dev, 64, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_RT_PARAM_INVALID);
        assert_eq!(download(api, mapped, 1), [0x77]);
        assert_eq!(api.aclrtHostUnregister(base).expect("resolved"), ACL_SUCCESS);
        assert_eq!(api.aclrtFree(dev), ACL_SUCCESS);
    }
}
