//! Copy streams of the CANN backend: the `ubshmem` baseline's [`CopyStream`] over ACL streams.
//!
//! One [`CannStream`] is one `aclrtCreateStreamWithConfig(priority 0, flags 0)` stream. `memcpy_async` queues
//! `aclrtMemcpyAsync(dst, len, src, len, ACL_MEMCPY_DEVICE_TO_DEVICE, stream)` for the part of the copy whose
//! addresses are both 64-byte aligned, and copies the bytes before it (or the whole copy, when the two addresses
//! differ by other than a multiple of 64) with the synchronous `aclrtMemcpy` (the async call's alignment rule,
//! `acl_rt.h`; the twin runtime enforces it); `synchronize(timeout)` is
//! `aclrtSynchronizeStreamWithTimeout` (507046 = the bound passed: [`DeviceError::Timeout`]; any other code = a task
//! exception on the stream: [`DeviceError::Runtime`] naming the device, the stream and the ACL code). Dropping the
//! stream synchronises it for at most [`STREAM_DROP_SYNC`] and destroys it.
//!
//! ACL's current device is per thread and the ubshmem workers are threads of their own, so every call binds the
//! calling thread to the device first ([`CannDevice::bind`], once per thread). Both ranges of a copy are checked
//! against the device's own heap and imported windows before the call: a wrong address is refused here with its
//! range rather than handed to the runtime. Nothing here has run on an NPU (fake ACL only).

use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ascendcl_sys::result as acl;
use ascendcl_sys::sys::{aclrtStream, ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, ACL_MEMCPY_DEVICE_TO_DEVICE};

use super::{runtime, CannDevice};
use crate::device::{CopyStream, DeviceError, DeviceMemory};

/// The alignment `aclrtMemcpyAsync` requires of both device addresses of a device-to-device copy (`acl_rt.h`).
pub const ASYNC_ALIGN: u64 = 64;

/// How long dropping a stream waits for its queued copies before destroying it.
pub const STREAM_DROP_SYNC: Duration = Duration::from_millis(1000);

/// An ACL stream of one device, for Host-issued device-to-device copies.
pub struct CannStream {
    /// Keeps the device (and its ACL binding) alive until the stream is destroyed.
    device: Arc<CannDevice>,
    stream: usize,
    /// The stream's number on this device, for error messages.
    index: u32,
}

impl fmt::Debug for CannStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CannStream").field("device", &self.device.id).field("index", &self.index).finish()
    }
}

impl CannStream {
    /// Creates a stream on `device`, binding the calling thread to it.
    pub(super) fn create(device: Arc<CannDevice>) -> Result<CannStream, DeviceError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        device.bind()?;
        let stream = acl::stream::create_with_config(device.acl, 0, 0)
            .map_err(runtime(device.id, "create a copy stream (ubshmem)"))?;
        Ok(CannStream { device, stream: stream as usize, index: NEXT.fetch_add(1, Ordering::Relaxed) })
    }

    /// The stream's number (process-wide, in creation order).
    pub fn index(&self) -> u32 {
        self.index
    }

    fn check_range(&self, what: &str, addr: u64, length: u64) -> Result<(), DeviceError> {
        if self.device.is_mapped(addr, length) {
            return Ok(());
        }
        Err(DeviceError::Invalid {
            device: self.device.id,
            operation: "queue a copy on a stream (aclrtMemcpyAsync)",
            reason: format!(
                "copy stream {}: {what} range [{addr:#x}, +{length}) is neither this device's heap nor an imported \
                 window",
                self.index
            ),
        })
    }
}

impl CopyStream for CannStream {
    fn memcpy_async(&self, dst: u64, src: u64, length: u64) -> Result<(), DeviceError> {
        self.check_range("source", src, length)?;
        self.check_range("destination", dst, length)?;
        let count = usize::try_from(length).map_err(|_| DeviceError::Invalid {
            device: self.device.id,
            operation: "queue a copy on a stream (aclrtMemcpyAsync)",
            reason: format!("{length} bytes do not fit the address space"),
        })?;
        self.device.bind()?;
        let error = |error: ascendcl_sys::Error| DeviceError::Runtime {
            device: self.device.id,
            step: "queue a copy on a stream (ubshmem)",
            detail: format!("copy stream {}: {error}", self.index),
        };
        // aclrtMemcpyAsync takes device-to-device copies between 64-byte aligned addresses only (acl_rt.h). The
        // bytes before the first aligned pair, or the whole copy when the two addresses can never both be aligned,
        // go through the synchronous aclrtMemcpy, which has no such rule; the rest is queued.
        let head = match (dst.wrapping_sub(src) % ASYNC_ALIGN, dst % ASYNC_ALIGN) {
            (0, 0) => 0,
            (0, misaligned) => ((ASYNC_ALIGN - misaligned) as usize).min(count),
            _ => count,
        };
        if head > 0 {
            // SAFETY: as below; the copy is synchronous, so nothing of it outlives the call.
            unsafe {
                acl::memory::memcpy(
                    self.device.acl,
                    dst as *mut c_void,
                    head,
                    src as *const c_void,
                    head,
                    ACL_MEMCPY_DEVICE_TO_DEVICE,
                )
            }
            .map_err(error)?;
        }
        if head == count {
            return Ok(());
        }
        let (dst, src, count) = (dst + head as u64, src + head as u64, count - head);
        // SAFETY: both ranges were checked above to be device memory this device maps (own heap or an imported
        // window, both kept mapped while the device lives, which this stream holds); the stream is live until drop.
        unsafe {
            acl::memory::memcpy_async(
                self.device.acl,
                dst as *mut c_void,
                count,
                src as *const c_void,
                count,
                ACL_MEMCPY_DEVICE_TO_DEVICE,
                self.stream as aclrtStream,
            )
        }
        .map_err(error)
    }

    fn synchronize(&self, timeout: Duration) -> Result<(), DeviceError> {
        self.device.bind()?;
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX).max(1);
        // SAFETY: the stream is live until drop.
        match unsafe { acl::stream::synchronize_with_timeout(self.device.acl, self.stream as aclrtStream, timeout_ms) }
        {
            Ok(()) => Ok(()),
            Err(error) if error.code() == Some(ascendcl_sys::AclError(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT)) => {
                Err(DeviceError::Timeout {
                    device: self.device.id,
                    operation: "synchronize a copy stream (aclrtSynchronizeStreamWithTimeout)",
                    waited: Duration::from_millis(timeout_ms as u64),
                })
            }
            Err(error) => Err(DeviceError::Runtime {
                device: self.device.id,
                step: "synchronize a copy stream (ubshmem): task exception",
                detail: format!("copy stream {}: {error}", self.index),
            }),
        }
    }
}

impl Drop for CannStream {
    fn drop(&mut self) {
        let device = &self.device;
        let _ = device.bind();
        let stream = self.stream as aclrtStream;
        let bound = i32::try_from(STREAM_DROP_SYNC.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the stream is live; the wait is bounded so a stuck copy cannot hang teardown.
        if let Err(error) = unsafe { acl::stream::synchronize_with_timeout(device.acl, stream, bound) } {
            tracing::warn!(device = device.id, stream = self.index, %error, "copy stream not idle at drop");
        }
        // SAFETY: the stream is live and nothing uses it after this.
        if let Err(error) = unsafe { acl::stream::destroy(device.acl, stream) } {
            tracing::warn!(device = device.id, stream = self.index, %error, "destroy a copy stream");
        }
    }
}
