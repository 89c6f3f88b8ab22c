//! Result layer: one function per SHMEM call, grouped by domain, each returning `Result` with the C function's
//! name in the error. Calls take the function table explicitly (tests pass one loaded from a fake library).
//!
//! Order matters and is the caller's job: ACL initialised and the device set first (`ascendcl_sys`), then
//! `bootstrap`, then `heap` calls in the same order and sizes on every PE, then `bootstrap::finalize`.

use core::ffi::c_void;

use crate::error::{check, Error};
use crate::sys::*;

/// Bootstrap by unique id, and teardown.
pub mod bootstrap {
    use super::*;

    /// `aclshmemx_get_uniqueid`: on rank 0, the id to share with every PE out of band.
    pub fn get_uniqueid(api: &ShmemApi) -> Result<aclshmemx_uniqueid_t, Error> {
        let mut uid = aclshmemx_uniqueid_t::default();
        // SAFETY: a live out-pointer to a struct of the documented layout.
        check("aclshmemx_get_uniqueid", unsafe { api.aclshmemx_get_uniqueid(&mut uid) })?;
        Ok(uid)
    }

    /// `aclshmemx_set_attr_uniqueid_args`: the attributes for [`init_attr`], starting from the header's defaults.
    ///
    /// The library stores the address of `uid` in the attributes (`comm_args`), and [`init_attr`] reads the unique id
    /// through it: keep `uid` alive, in place, until `init_attr` has returned.
    pub fn set_attr_uniqueid_args(
        api: &ShmemApi,
        my_pe: i32,
        n_pes: i32,
        local_mem_size: u64,
        uid: &mut aclshmemx_uniqueid_t,
    ) -> Result<aclshmemx_init_attr_t, Error> {
        let size = i64::try_from(local_mem_size).map_err(|_| Error::Call {
            function: "aclshmemx_set_attr_uniqueid_args",
            code: crate::error::ShmemError(ACLSHMEM_INVALID_VALUE),
        })?;
        let mut attr = aclshmemx_init_attr_t::new(my_pe, n_pes, local_mem_size);
        // SAFETY: both pointers are live, of the documented layouts; `uid` is the caller's, which outlives the
        // `init_attr` that reads it through `comm_args` (the contract above).
        check("aclshmemx_set_attr_uniqueid_args", unsafe {
            api.aclshmemx_set_attr_uniqueid_args(my_pe, n_pes, size, uid, &mut attr)
        })?;
        Ok(attr)
    }

    /// `aclshmemx_init_attr`, e.g. with `ACLSHMEMX_INIT_WITH_UNIQUEID`.
    pub fn init_attr(
        api: &ShmemApi,
        flags: aclshmemx_bootstrap_t,
        attr: &mut aclshmemx_init_attr_t,
    ) -> Result<(), Error> {
        // SAFETY: a live pointer to attributes of the documented layout; `comm_args` is whatever the library itself
        // stored there (null by default).
        check("aclshmemx_init_attr", unsafe { api.aclshmemx_init_attr(flags, attr) })
    }

    /// `aclshmem_finalize`.
    pub fn finalize(api: &ShmemApi) -> Result<(), Error> {
        // SAFETY: no arguments.
        check("aclshmem_finalize", unsafe { api.aclshmem_finalize() })
    }

    /// `aclshmemx_init_status` (optional symbol): `ACLSHMEM_STATUS_*` value.
    pub fn init_status(api: &ShmemApi) -> Result<i32, Error> {
        // SAFETY: no arguments.
        Ok(unsafe { api.aclshmemx_init_status()? })
    }
}

/// The symmetric heap.
pub mod heap {
    use super::*;

    fn non_null(function: &'static str, size: usize, ptr: *mut c_void) -> Result<*mut c_void, Error> {
        if ptr.is_null() {
            Err(Error::AllocationFailed { function, size })
        } else {
            Ok(ptr)
        }
    }

    /// `aclshmem_malloc`: collective; every PE must allocate the same sizes in the same order.
    pub fn malloc(api: &ShmemApi, size: usize) -> Result<*mut c_void, Error> {
        // SAFETY: value argument only.
        non_null("aclshmem_malloc", size, unsafe { api.aclshmem_malloc(size) })
    }

    /// `aclshmem_calloc`.
    pub fn calloc(api: &ShmemApi, count: usize, size: usize) -> Result<*mut c_void, Error> {
        // SAFETY: value arguments only.
        non_null("aclshmem_calloc", count.saturating_mul(size), unsafe { api.aclshmem_calloc(count, size) })
    }

    /// `aclshmem_align`: `alignment` must be a power of two.
    pub fn align(api: &ShmemApi, alignment: usize, size: usize) -> Result<*mut c_void, Error> {
        // SAFETY: value arguments only.
        non_null("aclshmem_align", size, unsafe { api.aclshmem_align(alignment, size) })
    }

    /// `aclshmem_free`.
    ///
    /// # Safety
    /// `ptr` must come from this heap, be freed collectively, and not be used afterwards.
    pub unsafe fn free(api: &ShmemApi, ptr: *mut c_void) {
        // SAFETY: the caller guarantees the allocation.
        unsafe { api.aclshmem_free(ptr) }
    }

    /// `aclshmem_ptr`: the address through which this PE reaches `ptr`'s counterpart on `pe`, or `None` when it
    /// cannot be reached by load/store.
    ///
    /// # Safety
    /// `ptr` must be an address inside the symmetric heap.
    pub unsafe fn ptr(api: &ShmemApi, ptr: *mut c_void, pe: i32) -> Option<*mut c_void> {
        // SAFETY: the caller guarantees the address; the library only computes another address from it.
        let peer = unsafe { api.aclshmem_ptr(ptr, pe) };
        (!peer.is_null()).then_some(peer)
    }

    /// `aclshmem_my_pe`.
    pub fn my_pe(api: &ShmemApi) -> i32 {
        // SAFETY: no arguments.
        unsafe { api.aclshmem_my_pe() }
    }

    /// `aclshmem_n_pes`.
    pub fn n_pes(api: &ShmemApi) -> i32 {
        // SAFETY: no arguments.
        unsafe { api.aclshmem_n_pes() }
    }
}

/// SHMEM's internal state (not public API; see [`crate::device_state`]).
pub mod state {
    use super::*;
    use crate::device_state::{self, StateHeader, StateSnapshot, HEADER_BYTES, SDMA_WORKSPACE_ADDR_OFFSET};

    /// Reads the host copy of the state through the optional data symbol `g_state`: the version word first, and
    /// the rest only if it names the mirrored layout. Fails with [`Error::MissingSymbol`] when the library does not
    /// export it and [`Error::StateLayout`] when the version differs. Call after `aclshmemx_init_attr` on the thread
    /// that called it (SHMEM writes the struct without a lock). *Unverified on hardware.*
    pub fn host_state(api: &ShmemApi) -> Result<StateSnapshot, Error> {
        let state = ascendcl_sys::optional_symbol!(api, g_state)?;
        let base = state.as_ptr();
        let mut version = [0u8; 4];
        // SAFETY: `g_state` is a global of at least `int version` (every layout starts with it), readable for the
        // life of the library, which `api` keeps loaded; copied as plain bytes, so alignment does not matter.
        unsafe { core::ptr::copy_nonoverlapping(base, version.as_mut_ptr(), 4) };
        device_state::check_version(i32::from_ne_bytes(version))
            .map_err(|detail| Error::StateLayout { symbol: device_state::HOST_STATE_SYMBOL, detail })?;
        let mut header = [0u8; HEADER_BYTES];
        let mut workspace = [0u8; 8];
        // SAFETY: the version word says the struct is the mirrored one, STATE_SIZE bytes, so both ranges are inside it.
        unsafe {
            core::ptr::copy_nonoverlapping(base, header.as_mut_ptr(), HEADER_BYTES);
            core::ptr::copy_nonoverlapping(base.add(SDMA_WORKSPACE_ADDR_OFFSET), workspace.as_mut_ptr(), 8);
        }
        Ok(StateSnapshot {
            header: StateHeader::from_bytes(&header),
            sdma_workspace_addr: u64::from_ne_bytes(workspace),
        })
    }
}
