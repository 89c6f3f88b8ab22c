//! Safe owners over the SHMEM heap.

use core::ffi::c_void;

use crate::error::Error;
use crate::result::heap;
use crate::sys::ShmemApi;

/// A symmetric-heap allocation freed on drop. Drop order must match on every PE, as allocation order does.
#[derive(Debug)]
pub struct SymmetricAllocation<'api> {
    api: &'api ShmemApi,
    ptr: *mut c_void,
    len: usize,
}

impl<'api> SymmetricAllocation<'api> {
    /// `aclshmem_align` (collective).
    pub fn allocate(api: &'api ShmemApi, alignment: usize, len: usize) -> Result<Self, Error> {
        Ok(Self { api, ptr: heap::align(api, alignment, len)?, len })
    }

    /// This PE's address of the allocation.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation has zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `aclshmem_ptr`: the address of the same allocation on `pe`, if reachable by load/store.
    pub fn peer_ptr(&self, pe: i32) -> Option<*mut c_void> {
        // SAFETY: `ptr` is a live address inside the symmetric heap.
        unsafe { heap::ptr(self.api, self.ptr, pe) }
    }
}

impl Drop for SymmetricAllocation<'_> {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from the heap and this is its last use.
        unsafe { heap::free(self.api, self.ptr) }
    }
}
