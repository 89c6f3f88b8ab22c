//! Device backends: the seam between the Host runtime and an NPU (or its CPU twin).
//!
//! Owns: the backend behind [`DeviceBackend`] ([`cann`], on the vendor's CANN libraries with feature `cann` or on
//! the twin runtime, `shmem-bindings/cann-twin`) and the choice among them
//! ([`open`], [`open_with_exchange`]); the seam itself is re-exported here: the types that cross it in `backend.rs`,
//! the capability traits and [`DeviceBackend`] in `capability.rs`, the NIC and its queue pairs in `rdma.rs`. It must not touch engine state
//! (batches, segments, task slots): the aiv transport ([`crate::transport::aiv`]) does that.
//!
//! The shape follows what the CANN backend will do (docs/hardware.md sections 3-4, 6): HBM from the SHMEM heap or
//! `aclrtMalloc`, export/import like VMM or IPC handles, channel records read from SHMEM's SDMA workspace, the kernel
//! loaded with `aclrtBinaryLoadFromData` and launched with `aclrtLaunchKernel`, the DCQ in Host-registered memory.

mod backend;
pub mod cann;
mod capability;
pub mod kernel_image;
mod rdma;

use std::sync::Arc;

pub(crate) use backend::map_anonymous_pages;

/// Name prefixes of the threads the device side runs in this process (the twin runtime's emulated cores, SDMA
/// engines, stream workers and services: `cann_twin::THREAD_PREFIX`): device time, which Host CPU figures leave out
/// by these names.
pub const DEVICE_THREAD_PREFIXES: [&str; 1] = [cann_twin::THREAD_PREFIX];
pub use backend::{
    ChannelException, ChannelInfo, ChannelLog, CopyStream, DeviceAdvertisement, DeviceBuffer, DeviceError,
    ExportedRegion, HostIdentity, ImportedWindow, Launch, RdmaAdvertisement, RdmaRegion, SdmaSyndrome, SharedMemory,
    UniqueIdExchange,
};
pub use capability::{
    CopyStreams, Device, DeviceBackend, DeviceMemory, HixlAccess, KernelChannels, MemorySharing, Observation,
};
pub use rdma::{ConnectedQp, CreatedQp, QpHandle, QpSpec, QpState, Rdma, RdmaKeys, RdmaNic};

use crate::config::{AivOptions, DeviceBackendKind};

/// Opens the device the options name. The CANN backend takes its SHMEM bootstrap settings from the environment
/// (`cann::CannSettings::from_env`) and, for more than one PE, needs the unique-id exchange that
/// [`crate::TransferEngine::device`] provides: use that, or [`open_with_exchange`].
pub fn open(options: &AivOptions) -> Result<Arc<dyn DeviceBackend>, DeviceError> {
    open_with_exchange(options, None)
}

/// Opens the device the options name; `exchange` carries SHMEM's unique id between PEs (CANN backend only).
pub fn open_with_exchange(
    options: &AivOptions,
    exchange: Option<&dyn UniqueIdExchange>,
) -> Result<Arc<dyn DeviceBackend>, DeviceError> {
    match options.device_backend {
        DeviceBackendKind::Twin => Ok(cann::CannDevice::open_on_twin(options, exchange)?),
        #[cfg(feature = "cann")]
        DeviceBackendKind::Cann => {
            let settings = cann::CannSettings::from_env(options.device_id)?;
            Ok(cann::CannDevice::open(options, settings, exchange)?)
        }
        #[cfg(not(feature = "cann"))]
        DeviceBackendKind::Cann => {
            let _ = exchange;
            Err(DeviceError::Unavailable {
                backend: "cann",
                reason: "this binary was built without the cargo feature `cann`; rebuild with `cargo build --features \
                         cann` (or use \"device_backend\": \"twin\")"
                    .into(),
            })
        }
    }
}

#[cfg(all(test, not(feature = "cann")))]
mod tests {
    use super::*;

    #[test]
    fn choosing_cann_without_the_feature_names_the_feature() {
        let options = AivOptions { device_backend: DeviceBackendKind::Cann, ..AivOptions::default() };
        let error = open(&options).expect_err("not built");
        let message = error.to_string();
        assert!(
            message.contains("without the cargo feature `cann`") && message.contains("--features cann"),
            "{message}"
        );
    }
}
