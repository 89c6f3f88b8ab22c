//! The ACL functions Mooncake's Ascend wheel imports beyond the copy path of `acl` (docs/mooncake-npu-wheel.md
//! section 4): contexts, device id mappings, pointer attributes, stream abort, the recent error message, the SoC
//! name, and the two the wheel's transfer path never calls (`aclrtMemcpyBatch`, which Mooncake's local copy engine
//! treats as unsupported when it returns `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`, and
//! `aclrtReserveMemAddressNoUCMemory`, an A3-only variant). Prototypes are those of `hicann/runtime`
//! `include/external/acl/acl_rt.h` and `acl_base_rt.h`, as `ascendcl_sys::sys` declares them.
//!
//! Contexts: the twin has one context per device, the device's primary context, whose handle is an opaque
//! non-null value ([`context_handle`]) that encodes the device and is never dereferenced. `aclrtGetCurrentContext`
//! reports the context of the calling thread's current device; `aclrtSetCurrentContext` makes that device current
//! on the calling thread without counting an `aclrtSetDevice` reference (so Mooncake's worker threads, which only
//! set the context, reach the device the Python thread set). The device must have been set by some thread.

use core::ffi::{c_char, c_void, CStr};

use ascendcl_sys::sys::*;

use crate::entry::{acl_entry, not_null};
use crate::runtime::runtime;
use crate::space::is_device_address;

/// The SoC name `aclrtGetSocName` reports: the twin's own, matching no vendor SoC.
pub const TWIN_SOC_NAME: &CStr = c"cann-twin";

/// The first context handle; device `d`'s context is `CONTEXT_BASE + 16 * d`.
const CONTEXT_BASE: usize = 0x7c7c_0000_0000;

/// The opaque handle of `device`'s context.
pub fn context_handle(device: i32) -> aclrtContext {
    (CONTEXT_BASE + 16 * device as usize) as aclrtContext
}

fn device_of_context(context: aclrtContext) -> Option<i32> {
    let offset = (context as usize).checked_sub(CONTEXT_BASE)?;
    if offset % 16 != 0 {
        return None;
    }
    i32::try_from(offset / 16).ok()
}

/// The message of the calling thread's most recent failed ACL call, or the empty string when none failed on this
/// thread; never null (Mooncake's async executor builds a `std::string` from it unchecked: a null crashed it,
/// *observed*). The string stays valid until the thread's next failing ACL call.
#[no_mangle]
pub extern "C" fn aclGetRecentErrMsg() -> *const c_char {
    crate::entry::recent_error()
}

/// The SoC name, [`TWIN_SOC_NAME`] (static; valid for the life of the process, also before `aclInit`).
#[no_mangle]
pub extern "C" fn aclrtGetSocName() -> *const c_char {
    TWIN_SOC_NAME.as_ptr()
}

acl_entry! {
    /// The physical id of a logical device: the same number (the twin has no device remapping).
    fn aclrtGetPhyDevIdByLogicDevId(logic_dev_id: i32, phy_dev_id: *mut i32) {
        not_null(phy_dev_id)?;
        let runtime = runtime();
        runtime.ready()?;
        runtime.check_device_id(logic_dev_id)?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { phy_dev_id.write(logic_dev_id) };
        Ok(())
    }
}

acl_entry! {
    /// The logical id of a user device id: the same number (the twin models no `ASCEND_RT_VISIBLE_DEVICES`).
    fn aclrtGetLogicDevIdByUserDevId(user_dev_id: i32, logic_dev_id: *mut i32) {
        not_null(logic_dev_id)?;
        let runtime = runtime();
        runtime.ready()?;
        runtime.check_device_id(user_dev_id)?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { logic_dev_id.write(user_dev_id) };
        Ok(())
    }
}

acl_entry! {
    /// The context of the calling thread's current device; `ACL_ERROR_RT_CONTEXT_NULL` when none is current.
    fn aclrtGetCurrentContext(context: *mut aclrtContext) {
        not_null(context)?;
        let device = runtime().current_device()?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { context.write(context_handle(device)) };
        Ok(())
    }
}

acl_entry! {
    /// Makes the device of `context` (a handle `aclrtGetCurrentContext` gave) current on the calling thread.
    /// Null or a handle the twin did not make: `ACL_ERROR_INVALID_PARAM`; a device no thread has set:
    /// `ACL_ERROR_RT_CONTEXT_NULL`.
    fn aclrtSetCurrentContext(context: aclrtContext) {
        not_null(context)?;
        let device = device_of_context(context).ok_or(ACL_ERROR_INVALID_PARAM)?;
        let runtime = runtime();
        runtime.check_device_id(device).map_err(|_| ACL_ERROR_INVALID_PARAM)?;
        runtime.set_current_without_reference(device)
    }
}

acl_entry! {
    /// Drops every task of `stream` not yet started (a running copy finishes) and clears its recorded failure; a
    /// later synchronisation returns at once. Null means the current device's default stream.
    fn aclrtStreamAbort(stream: aclrtStream) {
        let target = runtime().stream(stream as usize)?;
        target.abort();
        Ok(())
    }
}

acl_entry! {
    /// Where `ptr` lives: a device address of the twin (allocated or not) is `ACL_MEM_LOCATION_TYPE_DEVICE` on the
    /// calling thread's current device (0 when none is current; the twin does not track which device a device
    /// address belongs to here), page size 2 MiB; any other address is `ACL_MEM_LOCATION_TYPE_HOST`, id 0, with the
    /// Host page size.
    fn aclrtPointerGetAttributes(ptr: *const c_void, attributes: *mut aclrtPtrAttributes) {
        not_null(ptr)?;
        not_null(attributes)?;
        let device = {
            let runtime = runtime();
            runtime.ready()?;
            runtime.current_device().unwrap_or(0)
        };
        let filled = if is_device_address(ptr as usize) {
            aclrtPtrAttributes {
                location: aclrtMemLocation { id: device as u32, r#type: ACL_MEM_LOCATION_TYPE_DEVICE },
                pageSize: crate::memory::GRANULARITY as u32,
                rsv: [0; 4],
            }
        } else {
            aclrtPtrAttributes {
                location: aclrtMemLocation { id: 0, r#type: ACL_MEM_LOCATION_TYPE_HOST },
                pageSize: crate::memory::page() as u32,
                rsv: [0; 4],
            }
        };
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { attributes.write(filled) };
        Ok(())
    }
}

acl_entry! {
    /// Not modelled: `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (Mooncake's local copy engine then copies slice by slice
    /// with `aclrtMemcpyAsync`). `*fail_index` is set to `SIZE_MAX` (no copy failed; the error is not a copy's).
    fn aclrtMemcpyBatch(
        dsts: *mut *mut c_void,
        dest_maxs: *mut usize,
        srcs: *mut *mut c_void,
        sizes: *mut usize,
        num_batches: usize,
        attrs: *mut aclrtMemcpyBatchAttr,
        attrs_indexes: *mut usize,
        num_attrs: usize,
        fail_index: *mut usize,
    ) {
        let _ = (dsts, dest_maxs, srcs, sizes, num_batches, attrs, attrs_indexes, num_attrs);
        if !fail_index.is_null() {
            // SAFETY: non-null; writable by the C contract.
            unsafe { fail_index.write(usize::MAX) };
        }
        Err(ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    }
}

acl_entry! {
    /// Not modelled (an A3-only variant of `aclrtReserveMemAddress`): `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`.
    fn aclrtReserveMemAddressNoUCMemory(
        vir_ptr: *mut *mut c_void,
        size: usize,
        alignment: usize,
        expect_ptr: *mut c_void,
        flags: u64,
    ) {
        let _ = (vir_ptr, size, alignment, expect_ptr, flags);
        Err(ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    }
}
