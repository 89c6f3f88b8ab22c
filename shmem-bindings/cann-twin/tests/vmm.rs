//! The VMM calls through the table: physical memory, reservations, maps, access, with data checked.

mod common;

use core::ffi::c_void;

use ascendcl_sys::sys::*;
use common::{api, download, malloc, memcpy, pattern, upload};

const MIB2: usize = 2 << 20;

fn device_prop() -> aclrtPhysicalMemProp {
    aclrtPhysicalMemProp {
        handleType: ACL_MEM_HANDLE_TYPE_NONE,
        allocationType: ACL_MEM_ALLOCATION_TYPE_PINNED,
        memAttr: ACL_HBM_MEM_HUGE,
        location: aclrtMemLocation { id: 0, r#type: ACL_MEM_LOCATION_TYPE_DEVICE },
        reserve: 0,
    }
}

#[test]
fn reserve_map_access_unmap_with_data() {
    let api = api();
    let mut prop = device_prop();
    // SAFETY: every pointer is a live local or a device address the twin checks.
    unsafe {
        let mut granularity = 0usize;
        assert_eq!(
            api.aclrtMemGetAllocationGranularity(&mut prop, ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, &mut granularity)
                .expect("resolved"),
            ACL_SUCCESS
        );
        assert_eq!(granularity, MIB2);
        assert_eq!(
            api.aclrtMemGetAllocationGranularity(
                core::ptr::null_mut(),
                ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM,
                &mut granularity
            )
            .expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );

        // Physical memory: the property and flag rules.
        let mut handles = [core::ptr::null_mut(); 2];
        assert_eq!(
            api.aclrtMallocPhysical(&mut handles[0], MIB2, &prop, 1).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtMallocPhysical(&mut handles[0], MIB2 + 1, &prop, 0).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        let mut ddr = device_prop();
        ddr.memAttr = ACL_DDR_MEM_HUGE;
        assert_eq!(api.aclrtMallocPhysical(&mut handles[0], MIB2, &ddr, 0).expect("resolved"), ACL_ERROR_INVALID_PARAM);
        let mut posix = device_prop();
        posix.handleType = ACL_MEM_HANDLE_TYPE_POSIX;
        assert_eq!(
            api.aclrtMallocPhysical(&mut handles[0], MIB2, &posix, 0).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        for handle in &mut handles {
            assert_eq!(api.aclrtMallocPhysical(handle, 2 * MIB2, &prop, 0).expect("resolved"), ACL_SUCCESS);
        }

        // A reservation of three granules; two physical allocations mapped side by side.
        let mut va = core::ptr::null_mut();
        assert_eq!(
            api.aclrtReserveMemAddress(&mut va, 3 * MIB2, 0, core::ptr::null_mut(), 2).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtReserveMemAddress(&mut va, 3 * MIB2, 0, 0x1000 as *mut c_void, 0).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtReserveMemAddress(&mut va, 3 * MIB2, 0, core::ptr::null_mut(), 0).expect("resolved"),
            ACL_SUCCESS
        );
        assert_eq!(va as usize % MIB2, 0);
        let second = va.cast::<u8>().add(MIB2).cast::<c_void>();
        assert_eq!(api.aclrtMapMem(va, MIB2, 0, handles[0], 1).expect("resolved"), ACL_ERROR_INVALID_PARAM);
        assert_eq!(
            api.aclrtMapMem(va, 3 * MIB2, 0, handles[0], 0).expect("resolved"),
            ACL_ERROR_INVALID_PARAM,
            "longer than the physical memory"
        );
        assert_eq!(api.aclrtMapMem(va, MIB2, MIB2, handles[0], 0).expect("resolved"), ACL_SUCCESS);
        assert_eq!(
            api.aclrtMapMem(va, MIB2, 0, handles[1], 0).expect("resolved"),
            ACL_ERROR_RT_PARAM_INVALID,
            "overlaps a mapping"
        );
        assert_eq!(api.aclrtMapMem(second, 2 * MIB2, 0, handles[1], 0).expect("resolved"), ACL_SUCCESS);
        assert_eq!(
            api.aclrtMapMem(va, MIB2, 0, 0x1234 as aclrtDrvMemHandle, 0).expect("resolved"),
            ACL_ERROR_RT_INVALID_HANDLE
        );

        // Data across the boundary of the two mappings.
        let data = pattern(MIB2, 11);
        let across = va.cast::<u8>().add(MIB2 / 2).cast::<c_void>();
        upload(api, across, &data);
        assert_eq!(download(api, across, MIB2), data);
        // Into a second mapping of the same physical memory: the same bytes.
        let mut alias = core::ptr::null_mut();
        assert_eq!(
            api.aclrtReserveMemAddress(&mut alias, MIB2, 0, core::ptr::null_mut(), 0).expect("resolved"),
            ACL_SUCCESS
        );
        assert_eq!(api.aclrtMapMem(alias, MIB2, 0, handles[1], 0).expect("resolved"), ACL_SUCCESS);
        assert_eq!(download(api, alias, MIB2 / 2), data[MIB2 / 2..]);
        // Past the reservation's mapped part.
        let mut out = vec![0u8; 64];
        let end = va.cast::<u8>().add(3 * MIB2 - 32).cast::<c_void>();
        assert_eq!(
            memcpy(api, out.as_mut_ptr().cast(), 64, end, 64, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_RT_PARAM_INVALID
        );
        // D2D between heap memory and a mapping.
        let heap = malloc(api, 4096);
        assert_eq!(memcpy(api, heap, 4096, across, 4096, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
        assert_eq!(download(api, heap, 4096), data[..4096]);

        // Access: read-only refuses writes, none refuses reads, read-write restores.
        let mut desc = aclrtMemAccessDesc {
            flags: ACL_RT_MEM_ACCESS_FLAGS_READ,
            location: aclrtMemLocation { id: 0, r#type: ACL_MEM_LOCATION_TYPE_DEVICE },
            rsv: [0; 12],
        };
        assert_eq!(
            api.aclrtMemSetAccess(va, MIB2 / 2, &mut desc, 1).expect("resolved"),
            ACL_ERROR_RT_PARAM_INVALID,
            "not whole mappings"
        );
        assert_eq!(api.aclrtMemSetAccess(va, 3 * MIB2, &mut desc, 0).expect("resolved"), ACL_ERROR_INVALID_PARAM);
        assert_eq!(api.aclrtMemSetAccess(va, 3 * MIB2, &mut desc, 1).expect("resolved"), ACL_SUCCESS);
        assert_eq!(memcpy(api, across, 64, heap, 64, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_RT_PARAM_INVALID);
        assert_eq!(download(api, across, 64), data[..64]);
        desc.flags = ACL_RT_MEM_ACCESS_FLAGS_NONE;
        assert_eq!(api.aclrtMemSetAccess(va, MIB2, &mut desc, 1).expect("resolved"), ACL_SUCCESS);
        assert_eq!(
            memcpy(api, out.as_mut_ptr().cast(), 64, va, 64, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_RT_PARAM_INVALID
        );
        desc.flags = ACL_RT_MEM_ACCESS_FLAGS_READWRITE;
        assert_eq!(api.aclrtMemSetAccess(va, 3 * MIB2, &mut desc, 1).expect("resolved"), ACL_SUCCESS);
        assert_eq!(memcpy(api, across, 64, heap, 64, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);

        // Teardown order is enforced: unmap, release, free.
        assert_eq!(api.aclrtFreePhysical(handles[0]).expect("resolved"), ACL_ERROR_RT_MEMORY_FREE, "still mapped");
        assert_eq!(api.aclrtReleaseMemAddress(va).expect("resolved"), ACL_ERROR_RT_MEMORY_FREE, "mappings remain");
        assert_eq!(
            api.aclrtUnmapMem(second.cast::<u8>().add(4096).cast()).expect("resolved"),
            ACL_ERROR_RT_PARAM_INVALID,
            "not a mapping's start"
        );
        assert_eq!(api.aclrtUnmapMem(va).expect("resolved"), ACL_SUCCESS);
        assert_eq!(api.aclrtUnmapMem(second).expect("resolved"), ACL_SUCCESS);
        assert_eq!(api.aclrtUnmapMem(alias).expect("resolved"), ACL_SUCCESS);
        assert_eq!(
            memcpy(api, out.as_mut_ptr().cast(), 64, va, 64, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_RT_PARAM_INVALID
        );
        assert_eq!(api.aclrtReleaseMemAddress(va).expect("resolved"), ACL_SUCCESS);
        assert_eq!(api.aclrtReleaseMemAddress(alias).expect("resolved"), ACL_SUCCESS);
        assert_eq!(api.aclrtReleaseMemAddress(va).expect("resolved"), ACL_ERROR_RT_PARAM_INVALID);
        for handle in handles {
            assert_eq!(api.aclrtFreePhysical(handle).expect("resolved"), ACL_SUCCESS);
            assert_eq!(api.aclrtFreePhysical(handle).expect("resolved"), ACL_ERROR_RT_INVALID_HANDLE);
        }
        assert_eq!(api.aclrtFree(heap), ACL_SUCCESS);
    }
}

/// A reservation's alignment is of the device address itself, whatever alignment the Host gave the address space's
/// mapping (the kernel aligns a large anonymous mapping to 2 MiB at most, and only by its own choice): 2 MiB by
/// default, and any larger power of two asked for. Aligned memory allocations follow the same rule.
#[test]
fn reservations_and_large_allocations_are_aligned_as_device_addresses() {
    let api = api();
    // SAFETY: every pointer is a live local or a device address the twin checks.
    unsafe {
        for (alignment, expected) in [(0usize, MIB2), (MIB2, MIB2), (64 << 20, 64 << 20), (1 << 30, 1 << 30)] {
            let mut va = core::ptr::null_mut();
            assert_eq!(
                api.aclrtReserveMemAddress(&mut va, MIB2, alignment, core::ptr::null_mut(), 0).expect("resolved"),
                ACL_SUCCESS
            );
            assert_eq!(va as usize % expected, 0, "alignment {alignment:#x}: {va:?}");
            assert_eq!(api.aclrtReleaseMemAddress(va).expect("resolved"), ACL_SUCCESS);
        }
        let big = malloc(api, 3 * MIB2);
        assert_eq!(big as usize % MIB2, 0, "an allocation of 2 MiB or more starts on a 2 MiB boundary: {big:?}");
        assert_eq!(api.aclrtFree(big), ACL_SUCCESS);
    }
}
