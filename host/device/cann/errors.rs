//! How the CANN backend words a failed runtime call: an ACL or SHMEM error as [`DeviceError::Runtime`], naming the
//! device and the step that failed, with the library's own text (function and code) as the detail.
//!
//! Wording only; must not call the runtime or decide what a code means (the callers match codes they act on).

use crate::device::DeviceError;

pub(super) fn runtime(device: u32, step: &'static str) -> impl Fn(ascendcl_sys::Error) -> DeviceError {
    move |error| DeviceError::Runtime { device, step, detail: error.to_string() }
}

pub(super) fn shmem_error(device: u32, step: &'static str) -> impl Fn(cann_shmem_sys::Error) -> DeviceError {
    move |error| DeviceError::Runtime { device, step, detail: error.to_string() }
}
