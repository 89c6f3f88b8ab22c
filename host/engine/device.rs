//! The device facade an engine hands out: one device backend with the `aiv` transport and the baselines `adxl`,
//! `adxl-fabric` and `ubshmem` started on it, sharing one import cache and peer state.
//!
//! Owns: the start order of the four paths on a device. It must not move bytes: the transports do.

use std::sync::Arc;

use crate::config::AivOptions;
use crate::device::{DeviceAdvertisement, DeviceBackend, DeviceBuffer, DeviceError};
use crate::transport::adxl::{AdxlFabricTransport, AdxlTransport};
use crate::transport::aiv::AivTransport;
use crate::transport::ubshmem::UbshmemTransport;
use crate::transport::window::PeerWindows;

/// A device with the aiv transport running on it: what [`super::TransferEngine::device`] hands out.
#[derive(Debug)]
pub struct AivDevice {
    backend: Arc<dyn DeviceBackend>,
    transport: Arc<AivTransport>,
    adxl: Arc<AdxlTransport>,
    adxl_fabric: Arc<AdxlFabricTransport>,
    ubshmem: Arc<UbshmemTransport>,
}

impl AivDevice {
    /// Opens the device the options name and starts the aiv transport on it.
    pub fn open(options: &AivOptions) -> Result<AivDevice, DeviceError> {
        Self::open_with_exchange(options, None)
    }

    /// As [`AivDevice::open`], with the exchange that carries SHMEM's unique id between PEs (CANN backend).
    pub fn open_with_exchange(
        options: &AivOptions,
        exchange: Option<&dyn crate::device::UniqueIdExchange>,
    ) -> Result<AivDevice, DeviceError> {
        let backend = crate::device::open_with_exchange(options, exchange)?;
        // One import cache and peer state for the three paths: a loss the aiv probe finds is seen by the baselines.
        let identity = options.host_identity.clone().unwrap_or_else(|| crate::device::HostIdentity::current().0);
        let windows = Arc::new(PeerWindows::with_identity(backend.clone().sharing(), identity));
        let transport = Arc::new(AivTransport::start(
            backend.clone().kernel(),
            backend.clone().sharing(),
            backend.clone().observation(),
            backend.rdma(),
            windows.clone(),
            options,
        )?);
        // The baselines on the same device and memory (HiXL's, UBShmem's copy streams); both start their threads on
        // first use.
        let adxl = Arc::new(AdxlTransport::new(backend.clone().sharing(), backend.hixl(), windows.clone(), options));
        // HiXL's FabricMem engine (twin runtime only): created now, its connections on first use.
        let adxl_fabric =
            Arc::new(AdxlFabricTransport::new(backend.clone().sharing(), backend.hixl(), windows.clone(), options));
        let ubshmem = Arc::new(UbshmemTransport::new(backend.clone().streams(), windows, options));
        Ok(AivDevice { backend, transport, adxl, adxl_fabric, ubshmem })
    }

    /// Allocates `length` bytes of device memory (HBM). Register it with
    /// `engine.register_memory(buffer.addr(), buffer.len(), &device.location())`.
    pub fn allocate(&self, length: u64) -> Result<DeviceBuffer, DeviceError> {
        self.backend.allocate(length)
    }

    /// Copies `data` into this device's memory (or an imported window) at `addr`: the Host's only way to write
    /// device memory.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.backend.copy_to_device(addr, data)
    }

    /// Copies `out.len()` bytes of device memory at `addr` into `out`.
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        self.backend.copy_from_device(addr, out)
    }

    /// Mooncake's location string of this device's memory (`"npu:<id>"`).
    pub fn location(&self) -> String {
        format!("npu:{}", self.backend.device_id())
    }

    /// The device backend.
    pub fn backend(&self) -> &Arc<dyn DeviceBackend> {
        &self.backend
    }

    /// The aiv transport running on the device.
    pub fn transport(&self) -> &Arc<AivTransport> {
        &self.transport
    }

    /// The `adxl` baseline transport on the device.
    pub fn adxl(&self) -> &Arc<AdxlTransport> {
        &self.adxl
    }

    /// The `adxl-fabric` baseline transport on the device (twin runtime only).
    pub fn adxl_fabric(&self) -> &Arc<AdxlFabricTransport> {
        &self.adxl_fabric
    }

    /// The `ubshmem` baseline transport on the device.
    pub fn ubshmem(&self) -> &Arc<UbshmemTransport> {
        &self.ubshmem
    }

    /// What the device advertises in the segment descriptor's `aiv` object.
    pub fn advertisement(&self) -> DeviceAdvertisement {
        let mut advertisement = self.backend.advertisement();
        advertisement.hixl_server = self.adxl.hixl_server();
        advertisement.fabric_mem_server = self.adxl_fabric.server_address();
        advertisement.rdma = self.transport.rdma_advertisement();
        advertisement.host = Some(self.transport.host_identity().0);
        advertisement
    }
}
