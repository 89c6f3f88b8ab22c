//! The device seam's capabilities: one trait per thing a device offers the Host runtime, and [`DeviceBackend`], the
//! one device an engine holds, which hands each capability out.
//!
//! Owns: [`Device`] (identity), [`DeviceMemory`] (allocation, own-memory checks, the Host's copies, memory shared
//! with the Host), [`MemorySharing`] (export, import, translation, withdrawal, peer probes), [`CopyStreams`],
//! [`KernelChannels`] (kernel launch and SDMA channels), [`Observation`] (the runtime's per-SQE and per-WQE logs),
//! [`HixlAccess`] (the HiXL and FabricMem tables of the baselines) and [`DeviceBackend`]. The RDMA capability is
//! `rdma.rs`. A capability a device lacks is absent from its accessor (`None` or the error saying why), never a
//! method that fails. Every wait is bounded. Must not name a backend or touch engine state.

use std::fmt;
use std::sync::Arc;

use super::backend::{
    ChannelException, ChannelInfo, ChannelLog, CopyStream, DeviceAdvertisement, DeviceBuffer, DeviceError,
    ExportedRegion, ImportedWindow, Launch, SharedMemory,
};
use super::rdma::Rdma;

/// Which device this is.
pub trait Device: Send + Sync + fmt::Debug {
    /// `"cann"` (on either runtime).
    fn backend_name(&self) -> &'static str;
    /// The configured device id.
    fn device_id(&self) -> u32;
    /// The runtime the device runs on (twin or NPU, with the version it reports), for every record drawn from it.
    fn runtime_label(&self) -> crate::evidence::RuntimeLabel;
    /// Makes the calling thread able to call the device's runtime (ACL's current device is per thread, and vendor
    /// libraries such as HiXL need it set).
    fn bind_thread(&self) -> Result<(), DeviceError>;
}

/// Device memory and the Host's access to it.
pub trait DeviceMemory: Device {
    /// Allocates device memory (HBM); freed when the buffer drops.
    fn allocate(&self, length: u64) -> Result<DeviceBuffer, DeviceError>;
    /// Whether `[addr, addr + length)` is device memory this device can reach (own memory or an imported window).
    fn is_mapped(&self, addr: u64, length: u64) -> bool;
    /// Whether `[addr, addr + length)` is this device's own memory.
    fn is_own_memory(&self, addr: u64, length: u64) -> bool;
    /// Copies `data` into device memory at `addr` (H2D, synchronous): the only way Host code writes device memory
    /// (a Host store through a device address is not allowed; on an NPU it faults). `[addr, +len)` must be mapped
    /// ([`Self::is_mapped`]), else `Invalid` before anything is copied.
    fn copy_to_device(&self, addr: u64, data: &[u8]) -> Result<(), DeviceError>;
    /// Copies device memory at `addr` into `out` (D2H, synchronous); the same rules.
    fn copy_from_device(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError>;
    /// Memory the Host and the kernel share (request rings, DCQs, control blocks, kernel arguments).
    fn allocate_shared(&self, length: usize) -> Result<SharedMemory, DeviceError>;
}

/// Memory shared between devices: what this device exports, and peers' exports mapped into it.
pub trait MemorySharing: DeviceMemory {
    /// What the device advertises to peers (its exported regions).
    fn advertisement(&self) -> DeviceAdvertisement;
    /// Maps a peer's exported region into this device's view (idempotent per exporter and region).
    fn import(&self, exporter: &DeviceAdvertisement, region: &ExportedRegion) -> Result<ImportedWindow, DeviceError>;
    /// Offers `[addr, addr + length)` of this device's memory to peers (done by the engine when device memory is
    /// registered); the advertisement lists it from now on.
    fn export_range(&self, addr: u64, length: u64) -> Result<ExportedRegion, DeviceError>;
    /// Offers `[addr, addr + length)` of this process's Host memory to peers' devices (done by the engine when Host
    /// memory is registered): the advertisement lists it, at its Host address, from now on.
    fn export_host_range(&self, addr: u64, length: u64) -> Result<ExportedRegion, DeviceError>;
    /// The device address of `[addr, addr + length)` when it lies in Host memory this device exported
    /// ([`Self::export_host_range`]), through the device window it registered for it: how a transfer reaches a
    /// registered Host range of its own engine.
    fn host_window(&self, addr: u64, length: u64) -> Option<u64>;
    /// Withdraws the export of the range starting at `addr` (done when it is unregistered): new imports are refused,
    /// mappings made before stay valid. False if nothing was exported there.
    fn withdraw_range(&self, addr: u64) -> bool;
    /// Whether the exporter still serves its memory: `None` if the runtime has no way to tell, else the outcome of
    /// one bounded probe (the `cann` backend re-imports the exporter's heap handle).
    fn probe_peer(&self, exporter: &DeviceAdvertisement) -> Option<std::io::Result<()>>;
    /// Relocates a peer address through an imported window.
    fn translate(&self, window: &ImportedWindow, remote: u64, length: u64) -> Option<u64> {
        window.translate(remote, length)
    }
}

/// In-order copy streams (the `ubshmem` baseline, docs/hardware.md section 7).
pub trait CopyStreams: Device {
    /// Creates an in-order copy stream (ACL `aclrtCreateStream` + `aclrtMemcpyAsync` D2D).
    fn create_stream(&self) -> Result<Arc<dyn CopyStream>, DeviceError>;
}

/// The transfer kernel's launches and the SDMA channels its blocks drive.
pub trait KernelChannels: Device {
    /// Sets up one SDMA channel per block with `sq_depth` SQEs each (on CANN: read SHMEM's SDMA workspace).
    fn open_channels(&self, count: u32, sq_depth: u32) -> Result<Vec<ChannelInfo>, DeviceError>;
    /// The exception that stopped a channel, if any.
    fn channel_exception(&self, channel: u32) -> Option<ChannelException>;
    /// Drops a channel's pending SQEs and clears its exception, so it can serve again (bounded wait).
    fn reset_channel(&self, channel: u32) -> Result<(), DeviceError>;
    /// Launches the transfer kernel on `block_dim` blocks with `kernel_args` (device address of `KernelArgs`).
    fn launch(&self, kernel_args: u64, block_dim: u32) -> Result<Arc<dyn Launch>, DeviceError>;
    /// Launches another kernel of the loaded binary by name with one 8-byte argument on `block_dim` blocks, after
    /// whatever the kernel stream holds: for microbenchmarks and tests of the kernel object (on the twin runtime,
    /// e.g. `aiv_bench_post_kernel`). Not on the transfer path.
    fn launch_function(&self, name: &str, argument: u64, block_dim: u32) -> Result<Arc<dyn Launch>, DeviceError>;
    /// Platform cycles per second (the unit of `BlockArgs::wait_budget`).
    fn cycles_per_second(&self) -> u64;
}

/// The runtime's logs of what its SDMA engines and NICs executed, with who did each act (the twin runtime linked
/// into this process keeps them; other runtimes have no [`Observation`]).
pub trait Observation: Send + Sync + fmt::Debug {
    /// Where the log of the SQEs `channel`'s engine executes stands (`None`: not readable now).
    fn channel_log_position(&self, channel: u32) -> Option<u64>;
    /// Appends to `out` the log of the SQEs `channel`'s engine executed from position `from` on: who wrote each, who
    /// rang the doorbell that exposed it, who first read a flag SQE's flag (the twin's
    /// `cann_twin::control::sqe_log`).
    fn read_channel_log(&self, channel: u32, from: u64, out: &mut Vec<cann_twin::control::LoggedSqe>) -> ChannelLog;
    /// Appends to `out` the log of the WQEs the NIC completed on QP `qpn` from position `from` on, in WQE order: who
    /// wrote each, who rang the SQ doorbell before the NIC took it, who first read its CQE (the twin's
    /// `cann_twin::nic::qp_log`; an entry's `flag` is the CQE's reader, `None` for a WQE without a CQE). By QP
    /// number: a transfer's QP may be destroyed before its log is read.
    fn read_qp_log(&self, qpn: u32, from: u64, out: &mut Vec<cann_twin::control::LoggedSqe>) -> ChannelLog;
}

/// The vendor libraries the `adxl` and `adxl-fabric` baselines submit through (docs/hardware.md section 7).
pub trait HixlAccess: Send + Sync + fmt::Debug {
    /// The HiXL library the `adxl` baseline submits through on this device; `Err` when it did not load.
    fn hixl_api(&self) -> Result<&'static ascendcl_sys::hixl::HixlApi, String>;
    /// The twin runtime's FabricMem engine functions the `adxl-fabric` baseline submits through (**twin-only**, not a
    /// CANN API: [`ascendcl_sys::hixl::FabricMemApi`]); `Err` says why not (the vendor's FabricMem is reachable only
    /// through ADXL's C++ engine).
    fn fabric_mem_api(&self) -> Result<&'static ascendcl_sys::hixl::FabricMemApi, String>;
}

/// One device as an engine holds it: the capabilities every device has, and accessors for each capability as a
/// value of its own (for a transport to keep only what it uses) and for those a device may lack.
pub trait DeviceBackend: MemorySharing + CopyStreams + KernelChannels {
    /// Its memory.
    fn memory(self: Arc<Self>) -> Arc<dyn DeviceMemory>;
    /// Its memory sharing.
    fn sharing(self: Arc<Self>) -> Arc<dyn MemorySharing>;
    /// Its copy streams.
    fn streams(self: Arc<Self>) -> Arc<dyn CopyStreams>;
    /// Its kernel launches and SDMA channels.
    fn kernel(self: Arc<Self>) -> Arc<dyn KernelChannels>;
    /// Its runtime's provenance logs; `None` when the runtime keeps none this process can read (the vendor's
    /// runtime on an NPU; the twin loaded as a separate library, whose logs are that copy's).
    fn observation(self: Arc<Self>) -> Option<Arc<dyn Observation>>;
    /// Its NIC for the RDMA route; `Err` says why the device has none.
    fn rdma(&self) -> Result<&dyn Rdma, DeviceError>;
    /// Its HiXL and FabricMem tables; `None` when the device has none.
    fn hixl(&self) -> Option<&dyn HixlAccess>;
}
