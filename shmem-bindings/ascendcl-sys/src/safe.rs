//! Safe owners: handles that release themselves on drop. Each borrows the function table it was created with, so it
//! cannot outlive the loaded library. Drops ignore release errors (there is no one to report them to); call the
//! explicit `destroy`/`free` methods to see them.

use core::ffi::c_void;

use crate::error::Error;
use crate::result;
use crate::sys::{aclrtMemMallocPolicy, aclrtStream, AclApi};

/// A stream destroyed on drop.
#[derive(Debug)]
pub struct Stream<'api> {
    api: &'api AclApi,
    raw: aclrtStream,
}

impl<'api> Stream<'api> {
    /// `aclrtCreateStreamWithConfig` (use flags 0 for a plain stream).
    pub fn create(api: &'api AclApi, priority: u32, flags: u32) -> Result<Self, Error> {
        Ok(Self { api, raw: result::stream::create_with_config(api, priority, flags)? })
    }

    /// The raw handle, for calls that queue work on this stream.
    pub fn as_raw(&self) -> aclrtStream {
        self.raw
    }

    /// Waits at most `timeout_ms` for all queued work.
    pub fn synchronize(&self, timeout_ms: i32) -> Result<(), Error> {
        // SAFETY: `raw` is live until `self` drops.
        unsafe { result::stream::synchronize_with_timeout(self.api, self.raw, timeout_ms) }
    }

    /// Destroys the stream, reporting a failure.
    pub fn destroy(self) -> Result<(), Error> {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `raw` is live and, `self` being consumed without running `Drop`, never used again.
        unsafe { result::stream::destroy(this.api, this.raw) }
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and this is its last use.
        let _ = unsafe { result::stream::destroy(self.api, self.raw) };
    }
}

/// Device memory from `aclrtMalloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceMemory<'api> {
    api: &'api AclApi,
    ptr: *mut c_void,
    len: usize,
}

impl<'api> DeviceMemory<'api> {
    /// `aclrtMalloc`.
    pub fn allocate(api: &'api AclApi, len: usize, policy: aclrtMemMallocPolicy) -> Result<Self, Error> {
        Ok(Self { api, ptr: result::memory::malloc(api, len, policy)?, len })
    }

    /// The device address.
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

    /// Copies `source` to the start of this memory (synchronous, host to device).
    pub fn copy_from_host(&mut self, source: &[u8]) -> Result<(), Error> {
        if source.len() > self.len {
            return Err(Error::InvalidArgument {
                function: "aclrtMemcpy",
                reason: format!("{} bytes into {}", source.len(), self.len),
            });
        }
        // SAFETY: the destination is this live allocation of `len` bytes, the source a live slice no longer than it.
        unsafe {
            result::memory::memcpy(
                self.api,
                self.ptr,
                self.len,
                source.as_ptr().cast(),
                source.len(),
                crate::sys::ACL_MEMCPY_HOST_TO_DEVICE,
            )
        }
    }

    /// Copies the start of this memory into `destination` (synchronous, device to host).
    pub fn copy_to_host(&self, destination: &mut [u8]) -> Result<(), Error> {
        if destination.len() > self.len {
            return Err(Error::InvalidArgument {
                function: "aclrtMemcpy",
                reason: format!("{} bytes from {}", destination.len(), self.len),
            });
        }
        // SAFETY: the source is this live allocation, the destination a live slice of the length passed.
        unsafe {
            result::memory::memcpy(
                self.api,
                destination.as_mut_ptr().cast(),
                destination.len(),
                self.ptr,
                destination.len(),
                crate::sys::ACL_MEMCPY_DEVICE_TO_HOST,
            )
        }
    }
}

impl Drop for DeviceMemory<'_> {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `aclrtMalloc` and this is its last use.
        let _ = unsafe { result::memory::free(self.api, self.ptr) };
    }
}

/// Page-locked host memory from `aclrtMallocHost`, freed on drop.
#[derive(Debug)]
pub struct HostMemory<'api> {
    api: &'api AclApi,
    ptr: *mut c_void,
    len: usize,
}

impl<'api> HostMemory<'api> {
    /// `aclrtMallocHost`.
    pub fn allocate(api: &'api AclApi, len: usize) -> Result<Self, Error> {
        Ok(Self { api, ptr: result::memory::malloc_host(api, len)?, len })
    }

    /// The host address.
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
}

impl Drop for HostMemory<'_> {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `aclrtMallocHost` and this is its last use.
        let _ = unsafe { result::memory::free_host(self.api, self.ptr) };
    }
}
