//! Kernel launches of the CANN backend (step 6 of the `cann` module doc): the transfer kernel, or another kernel of
//! the loaded binary by name, on the device's kernel stream with `aclrtLaunchKernelWithHostArgs` (ENGINE_TYPE = AIV,
//! one 8-byte argument); [`CannLaunch`], waited for with a bounded stream synchronisation; and the stream error a
//! kernel that ended with an exception leaves.
//!
//! Keeps each launch's host argument until a synchronisation has passed the launch. Must not decide what a stream
//! error means for the transfers (the transport does, through `channel_exception`).

use std::ffi::CString;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ascendcl_sys::result as acl;
use ascendcl_sys::sys::*;

use super::errors::runtime;
use super::CannDevice;
use crate::device::{DeviceError, Launch};

/// A launch on the backend's stream, waited for with a bounded stream synchronisation.
struct CannLaunch {
    device: Arc<CannDevice>,
}

impl fmt::Debug for CannLaunch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CannLaunch").field("device", &self.device.id).finish()
    }
}

impl Launch for CannLaunch {
    fn wait(&self, timeout: Duration) -> bool {
        let device = &self.device;
        if device.bind().is_err() {
            return false;
        }
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX).max(1);
        // Launches queued before the synchronisation starts are the ones it proves passed.
        let queued = device.pending_host_args.lock().unwrap_or_else(|p| p.into_inner()).len();
        // SAFETY: the stream lives as long as the device, which this launch holds.
        match unsafe { acl::stream::synchronize_with_timeout(device.acl, device.stream as aclrtStream, timeout_ms) } {
            Ok(()) => {
                // The launches queued before the synchronisation have passed: their host arguments may go.
                let mut pending = device.pending_host_args.lock().unwrap_or_else(|p| p.into_inner());
                let passed = queued.min(pending.len()); // another wait may have released some already
                pending.drain(..passed);
                true
            }
            Err(error) if error.code() == Some(ascendcl_sys::AclError(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT)) => false,
            Err(error) => {
                // The kernel ended with an exception (docs/hardware.md section 4: errors surface as a stream/task
                // exception on the Host): remember it for channel_exception.
                tracing::warn!(device = device.id, error = %error, "kernel stream exception");
                *device.stream_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.to_string());
                true
            }
        }
    }
}

impl CannDevice {
    /// Launches another kernel of the loaded binary by name (`aclrtBinaryGetFunction` on each call) with one 8-byte
    /// argument on `block_dim` blocks of the kernel stream, after whatever the stream holds: for microbenchmarks and
    /// tests of the kernel object (on the twin runtime, e.g. `aiv_bench_post_kernel`). Not on the transfer path.
    pub(super) fn launch_by_name(
        self: &Arc<Self>,
        name: &str,
        argument: u64,
        block_dim: u32,
    ) -> Result<Arc<dyn Launch>, DeviceError> {
        self.bind()?;
        let entry = CString::new(name).map_err(|_| DeviceError::Invalid {
            device: self.id,
            operation: "launch a kernel by name",
            reason: format!("{name:?} has a NUL"),
        })?;
        // SAFETY: the binary is loaded for the device's lifetime.
        let function = unsafe { acl::kernel::get_function(self.acl, self.kernel.binary as aclrtBinHandle, &entry) }
            .map_err(runtime(self.id, "find a kernel of the loaded binary"))?;
        self.launch_on(function as usize, argument, block_dim)
    }

    pub(super) fn launch_arc(
        self: &Arc<Self>,
        kernel_args: u64,
        block_dim: u32,
    ) -> Result<Arc<dyn Launch>, DeviceError> {
        self.launch_on(self.kernel.function, kernel_args, block_dim)
    }

    fn launch_on(
        self: &Arc<Self>,
        function: usize,
        kernel_args: u64,
        block_dim: u32,
    ) -> Result<Arc<dyn Launch>, DeviceError> {
        self.bind()?;
        let mut engine = aclrtLaunchKernelAttr {
            id: ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE,
            value: aclrtLaunchKernelAttrValue { engineType: ACL_RT_ENGINE_TYPE_AIV },
        };
        let mut config = aclrtLaunchKernelCfg { attrs: &mut engine, numAttrs: 1 };
        // The header does not say when the runtime has finished reading host arguments, so the 8 bytes stay alive
        // (boxed, in `pending_host_args`) until a stream synchronisation has passed every launch queued so far.
        let mut args = Box::new(kernel_args.to_le_bytes());
        // SAFETY: the function and stream are live for the device's lifetime; the argument is the device address of
        // `KernelArgs`, which the transport keeps (with everything it names) until the launch is waited for; `args`
        // is kept unchanged until the stream has passed the launch (below and in `CannLaunch::wait`).
        unsafe {
            acl::kernel::launch_with_host_args(
                self.acl,
                function as aclrtFuncHandle,
                block_dim,
                self.stream as aclrtStream,
                Some(&mut config),
                &mut args[..],
            )
        }
        .map_err(runtime(self.id, "launch aiv_transfer_kernel"))?;
        self.pending_host_args.lock().unwrap_or_else(|p| p.into_inner()).push(args);
        Ok(Arc::new(CannLaunch { device: self.clone() }))
    }

    /// Checks the kernel stream for an exception without waiting for the kernel (at most 1 ms): a launch that ended
    /// with an error is recorded as the stream error; a kernel still running is not an error.
    pub(super) fn poll_stream(&self) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: the stream lives as long as the device.
        match unsafe { acl::stream::synchronize_with_timeout(self.acl, self.stream as aclrtStream, 1) } {
            Ok(()) => {}
            Err(error) if error.code() == Some(ascendcl_sys::AclError(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT)) => {}
            Err(error) => {
                tracing::warn!(device = self.id, error = %error, "kernel stream exception");
                *self.stream_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.to_string());
            }
        }
    }

    /// The stream error recorded by a launch wait, if any.
    pub fn stream_error(&self) -> Option<String> {
        self.stream_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
