//! Device memory mappings of the CANN backend through ACL's VMM calls: physical HBM mapped at a reserved device range
//! ([`map_physical`], undone by [`unmap_physical`]), the [`Mapping`] that records one (the heap's, or an imported peer
//! heap's), and [`Unwind`], the undo list of a bring-up or an import that fails half-way.
//!
//! Owns no mapping itself: the device holds its mappings and unmaps them at teardown. Must not export or import
//! shareable handles (bring-up and `import` do).

use std::ffi::c_void;

use ascendcl_sys::result as acl;
use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;

use super::errors::runtime;
use crate::device::DeviceError;

/// A physical allocation mapped at a reserved device range.
#[derive(Debug)]
pub(super) struct Mapping {
    pub(super) handle: usize,
    pub(super) address: u64,
    pub(super) length: u64,
}

/// Undoes the steps of a bring-up that failed half-way, in reverse order.
pub(super) struct Unwind {
    pub(super) steps: Vec<Box<dyn FnOnce()>>,
}

impl Unwind {
    pub(super) fn push(&mut self, step: impl FnOnce() + 'static) {
        self.steps.push(Box::new(step));
    }
    pub(super) fn disarm(mut self) {
        self.steps.clear();
    }
}

impl Drop for Unwind {
    fn drop(&mut self) {
        while let Some(step) = self.steps.pop() {
            step();
        }
    }
}

/// `aclrtMallocPhysical` -> `aclrtReserveMemAddress` -> `aclrtMapMem` -> `aclrtMemSetAccess` for `length` bytes of
/// HBM on device `id`; undo steps are pushed onto `unwind`.
pub(super) fn map_physical(
    acl: &'static AclApi,
    id: u32,
    length: u64,
    unwind: &mut Unwind,
) -> Result<Mapping, DeviceError> {
    let location = aclrtMemLocation { id, r#type: ACL_MEM_LOCATION_TYPE_DEVICE };
    let prop = aclrtPhysicalMemProp {
        handleType: ACL_MEM_HANDLE_TYPE_NONE,
        allocationType: ACL_MEM_ALLOCATION_TYPE_PINNED,
        memAttr: ACL_HBM_MEM_HUGE,
        location,
        reserve: 0,
    };
    let size = usize::try_from(length).map_err(|_| DeviceError::OutOfMemory {
        device: id,
        length,
        reason: "larger than the address space".into(),
    })?;
    let handle = acl::vmm::malloc_physical(acl, size, &prop, 0).map_err(runtime(id, "allocate physical HBM"))?;
    let handle_value = handle as usize;
    unwind.push(move || {
        // SAFETY: the handle is live and unmapped by the time this runs (steps undo in reverse).
        let _ = unsafe { acl::vmm::free_physical(acl, handle_value as aclrtDrvMemHandle) };
    });
    let address = acl::vmm::reserve_address(acl, size, 0, 0, 0).map_err(runtime(id, "reserve device addresses"))?;
    let address_value = address as usize;
    unwind.push(move || {
        // SAFETY: the range is reserved and unmapped by the time this runs.
        let _ = unsafe { acl::vmm::release_address(acl, address_value as *mut c_void) };
    });
    // SAFETY: `address` is the range reserved above, `handle` the live physical allocation of the same size.
    unsafe { acl::vmm::map(acl, address, size, 0, handle, 0) }.map_err(runtime(id, "map HBM"))?;
    unwind.push(move || {
        // SAFETY: mapped above, unused once bring-up failed.
        let _ = unsafe { acl::vmm::unmap(acl, address_value as *mut c_void) };
    });
    let access = aclrtMemAccessDesc { flags: ACL_RT_MEM_ACCESS_FLAGS_READWRITE, location, rsv: [0; 12] };
    // SAFETY: `[address, address + size)` was mapped above.
    unsafe { acl::vmm::set_access(acl, address, size, &[access]) }.map_err(runtime(id, "grant access to HBM"))?;
    Ok(Mapping { handle: handle_value, address: address as u64, length })
}

/// Undoes [`map_physical`].
pub(super) fn unmap_physical(acl: &AclApi, mapping: &Mapping) {
    // SAFETY: the mapping is live and, at teardown, no longer used by the Host or a kernel.
    unsafe {
        let _ = acl::vmm::unmap(acl, mapping.address as *mut c_void);
        let _ = acl::vmm::release_address(acl, mapping.address as *mut c_void);
        let _ = acl::vmm::free_physical(acl, mapping.handle as aclrtDrvMemHandle);
    }
}
