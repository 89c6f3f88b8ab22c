//! The device seam's values: the types the capability traits (`capability.rs`, `rdma.rs`) hand out and take.
//!
//! Owns: the traits behind their handles ([`Launch`], [`CopyStream`]), the values ([`DeviceBuffer`],
//! [`SharedMemory`], [`ExportedRegion`], [`ImportedWindow`], [`DeviceAdvertisement`] with its [`RdmaAdvertisement`],
//! [`ChannelInfo`], [`ChannelException`] with its [`SdmaSyndrome`], [`ChannelLog`], [`HostIdentity`]),
//! [`DeviceError`], the [`UniqueIdExchange`] a backend may need at bring-up, and the page mapping backends share
//! Host memory with. The backend (`cann`, on either runtime) builds on this file. It must not name a backend, choose
//! one (`super::open` does) or touch engine state (batches, segments, task slots).

use std::fmt;
use std::time::Duration;

/// Why a device operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// Device memory is exhausted or the request cannot be met.
    #[error("device {device}: allocate {length} bytes: {reason}")]
    OutOfMemory { device: u32, length: u64, reason: String },
    /// An operating-system call failed.
    #[error("device {device}: {operation}: {source}")]
    Os { device: u32, operation: &'static str, source: std::io::Error },
    /// An argument is invalid whatever the device state.
    #[error("device {device}: {operation}: {reason}")]
    Invalid { device: u32, operation: &'static str, reason: String },
    /// The backend is not available in this build or on this machine.
    #[error("device backend {backend}: {reason}")]
    Unavailable { backend: &'static str, reason: String },
    /// The device did not answer within a bounded wait.
    #[error("device {device}: {operation}: no answer within {waited:?}")]
    Timeout { device: u32, operation: &'static str, waited: Duration },
    /// A vendor runtime call failed (CANN backend): the bring-up or data-path step and the ACL/SHMEM error, which
    /// names the C function and its code.
    #[error("device {device}: {step}: {detail}")]
    Runtime { device: u32, step: &'static str, detail: String },
}

/// A device memory region that another device may import (an exported heap, like a VMM/IPC handle).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExportedRegion {
    /// Device address of the region's first byte, in the exporter's view.
    pub addr: u64,
    /// Bytes.
    pub length: u64,
    /// The shareable handle the importer presents (`aclrtMemExportToShareableHandle`'s `u64`); 0 for a region
    /// exported by IPC key.
    pub export_id: u64,
    /// The IPC key the importer presents instead (`aclrtIpcMemGetExportKey`'s text), for a range of the runtime's
    /// own allocations (`aclrtMalloc`) that lies outside the exported heap; absent for heap exports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc_key: Option<String>,
}

/// What a device advertises in its segment descriptor's `aiv` object so peers can import its memory.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceAdvertisement {
    /// Unique identity of the device instance.
    pub device: String,
    /// The device id from the configuration.
    pub device_id: u32,
    /// The backend (`"cann"`, on either runtime).
    pub backend: String,
    /// Exported regions (the heap, one VMM export: its handle is a capability for whoever reads the descriptor).
    pub regions: Vec<ExportedRegion>,
    /// The exporting process (informational: logs and diagnostics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_id: Option<u32>,
    /// Where the device's HiXL server listens (`"ip:port"`), for the `adxl` baseline on the `cann` backend: peers'
    /// HiXL clients connect there. Absent when the server could not start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hixl_server: Option<String>,
    /// Where the device's FabricMem engine's control server listens (`"ip:port"`), for the `adxl-fabric` baseline
    /// (twin runtime only): peers' engines connect there. Absent when the device has no FabricMem engine (older
    /// descriptors, the vendor's runtime, an engine that could not start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_mem_server: Option<String>,
    /// Where the device's RDMA NIC listens and the keys of its registered memory, for the aiv transport's RDMA route
    /// (docs/rdma.md section 7). Absent: the device offers no RDMA route (older descriptors, the vendor's runtime,
    /// or `"route": "sdma"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<RdmaAdvertisement>,
    /// Where the device is: [`HostIdentity`] (boot id and network namespace). Absent in older descriptors; a peer
    /// without one is taken to be on this host only if it advertises no `rdma` object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// The `rdma` object of a [`DeviceAdvertisement`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RdmaAdvertisement {
    /// The NIC's address, `"ip:port"`.
    pub nic: String,
    /// The device memory registered with remote read and write, each with its rkey.
    pub regions: Vec<RdmaRegion>,
}

/// One registered range of an [`RdmaAdvertisement`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RdmaRegion {
    /// Device address of the first byte, in the owner's view.
    pub addr: u64,
    /// Bytes.
    pub length: u64,
    /// The key a peer's WQE presents to reach it.
    pub rkey: u32,
}

impl RdmaRegion {
    /// Whether `[addr, addr + length)` lies inside the region.
    pub fn holds(&self, addr: u64, length: u64) -> bool {
        addr >= self.addr && addr.checked_add(length).is_some_and(|end| end <= self.addr.saturating_add(self.length))
    }
}

/// Where a process runs, as far as device memory sharing goes: the kernel's boot id and the network namespace. Two
/// processes with equal identities can import each other's VMM exports (same machine) and reach each other's
/// loopback; processes in two network namespaces of one machine count as two hosts (the multi-host tests use
/// namespaces). Read from `/proc/sys/kernel/random/boot_id` and the link `/proc/self/ns/net`; either missing is
/// written `unknown`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostIdentity(pub String);

impl HostIdentity {
    /// This process's identity, `"<boot id>/<net namespace>"`.
    pub fn current() -> HostIdentity {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|text| text.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        let net = std::fs::read_link("/proc/self/ns/net")
            .map(|link| link.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".into());
        HostIdentity(format!("{boot}/{net}"))
    }
}

/// A peer's memory mapped into this device's view: `local = local_base + (remote - remote_base)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportedWindow {
    /// First byte of the window in this device's view.
    pub local_base: u64,
    /// First byte in the exporter's view.
    pub remote_base: u64,
    /// Bytes.
    pub length: u64,
}

impl ImportedWindow {
    /// Relocates `[remote, remote + length)` into this device's view; `None` if it is not inside the window.
    pub fn translate(&self, remote: u64, length: u64) -> Option<u64> {
        let offset = remote.checked_sub(self.remote_base)?;
        (offset.checked_add(length)? <= self.length).then(|| self.local_base + offset)
    }
}

/// Memory both the Host and the device access (rings, control words): a Host pointer and the device address of
/// the same bytes: Host memory registered for the device (`aclrtHostRegister`), whose device address differs from the
/// Host pointer (on the twin runtime as on an NPU).
pub struct SharedMemory {
    host: *mut u8,
    device_addr: u64,
    length: usize,
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

// SAFETY: the region is plain memory owned by this value until drop; concurrent access to it is through atomics and
// the ring protocols of crate::queue, whose users document their own synchronisation.
unsafe impl Send for SharedMemory {}
// SAFETY: as above; `&SharedMemory` only hands out raw pointers.
unsafe impl Sync for SharedMemory {}

impl fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMemory")
            .field("device_addr", &format_args!("{:#x}", self.device_addr))
            .field("length", &self.length)
            .finish()
    }
}

impl SharedMemory {
    /// # Safety
    /// `host` must be valid for reads and writes of `length` bytes, zero-initialised, page-aligned and owned by the
    /// returned value until `release` runs (at drop).
    pub unsafe fn from_raw(
        host: *mut u8,
        device_addr: u64,
        length: usize,
        release: Box<dyn FnOnce() + Send + Sync>,
    ) -> Self {
        SharedMemory { host, device_addr, length, release: Some(release) }
    }
    /// Host pointer to the first byte.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }
    /// Device address of the first byte.
    pub fn device_addr(&self) -> u64 {
        self.device_addr
    }
    /// Bytes.
    pub fn len(&self) -> usize {
        self.length
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// A fresh private anonymous mapping of `length` bytes rounded up to whole pages: zeroed and page aligned, the Host
/// side of memory a backend shares with its device. Returns the address and the rounded length; the caller owns the
/// mapping and unmaps it.
pub(crate) fn map_anonymous_pages(
    device: u32,
    length: usize,
    operation: &'static str,
) -> Result<(*mut u8, usize), DeviceError> {
    let rounded = length.max(1).div_ceil(4096) * 4096;
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it, and the result is checked below.
    let host = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            rounded,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if host == libc::MAP_FAILED {
        return Err(DeviceError::Os { device, operation, source: std::io::Error::last_os_error() });
    }
    Ok((host.cast(), rounded))
}

/// One SDMA channel as the kernel sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelInfo {
    /// Channel index (= AIV block index).
    pub index: u32,
    /// Device address of the channel record (docs/hardware.md section 4 layout).
    pub record_addr: u64,
    /// Device address of the block's flag area (`FlagArea`, device memory).
    pub flag_area_addr: u64,
    /// The opaque handle the platform layer receives in `BlockArgs::platform_context` (0 on the NPU).
    pub platform_context: u64,
}

/// A structured SDMA exception: the queue context and the raw SQE that stopped the channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelException {
    /// Channel index.
    pub channel: u32,
    /// The record's `sq_id`.
    pub sq_id: u32,
    /// SQ head when the SQE was rejected (its index).
    pub head: u32,
    /// Doorbell tail seen then.
    pub tail: u32,
    /// Why, as an [`SdmaSyndrome`].
    pub syndrome: SdmaSyndrome,
    /// The 64 raw bytes of the SQE (zero when the exception is not about an SQE).
    pub sqe: [u8; 64],
    /// What else the device said, e.g. the offset and width of a refused register write.
    pub detail: Option<String>,
}

impl fmt::Display for ChannelException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SDMA exception on channel {} (sq_id {}, head {}, tail {}): syndrome {:#x} ({}); ",
            self.channel,
            self.sq_id,
            self.head,
            self.tail,
            self.syndrome.0,
            self.syndrome.describe()
        )?;
        if let Some(detail) = &self.detail {
            write!(f, "{detail}; ")?;
        }
        write!(f, "raw SQE ")?;
        for byte in self.sqe {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// Why the SDMA engine stopped a channel; decoded totally.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct SdmaSyndrome(pub u32);

impl SdmaSyndrome {
    /// SQE type is not SDMA.
    pub const BAD_TYPE: SdmaSyndrome = SdmaSyndrome(0x10);
    /// Opcode is not a copy.
    pub const BAD_OPCODE: SdmaSyndrome = SdmaSyndrome(0x11);
    /// Length zero or above 1 MiB.
    pub const BAD_LENGTH: SdmaSyndrome = SdmaSyndrome(0x12);
    /// Source range outside every mapped window.
    pub const SRC_OUT_OF_WINDOW: SdmaSyndrome = SdmaSyndrome(0x13);
    /// Destination range outside every mapped window.
    pub const DST_OUT_OF_WINDOW: SdmaSyndrome = SdmaSyndrome(0x14);
    /// The doorbell carried a tail outside the ring.
    pub const BAD_TAIL: SdmaSyndrome = SdmaSyndrome(0x15);
    /// A write to the channel's doorbell register page of another width or at another offset than the doorbell's
    /// (a u32 at offset 0x8): the register takes nothing and the channel stops.
    pub const BAD_REGISTER_WRITE: SdmaSyndrome = SdmaSyndrome(0x16);
    /// The block's AIV core faulted (an access outside device memory, a broken AscendC rule; the detail says which).
    pub const KERNEL_FAULT: SdmaSyndrome = SdmaSyndrome(0x17);
    /// A copy SQE whose opcode word, kernel credit, pointer mode or link type is not what SHMEM writes for a copy
    /// (the twin runtime refuses it; docs/twin-runtime.md).
    pub const BAD_FIELDS: SdmaSyndrome = SdmaSyndrome(0x18);
    /// The CANN runtime reported an exception on the kernel's stream (no per-SQE status exists on the NPU:
    /// docs/hardware.md section 4); the queue context is read back from the channel record.
    pub const STREAM_EXCEPTION: SdmaSyndrome = SdmaSyndrome(0x20);

    /// A readable description.
    pub fn describe(self) -> String {
        match self {
            SdmaSyndrome::BAD_TYPE => "SQE type is not SDMA".into(),
            SdmaSyndrome::BAD_OPCODE => "opcode is not a copy".into(),
            SdmaSyndrome::BAD_LENGTH => "length is zero or above 1 MiB".into(),
            SdmaSyndrome::SRC_OUT_OF_WINDOW => "source range is outside every mapped window".into(),
            SdmaSyndrome::DST_OUT_OF_WINDOW => "destination range is outside every mapped window".into(),
            SdmaSyndrome::BAD_TAIL => "doorbell tail is outside the ring".into(),
            SdmaSyndrome::BAD_REGISTER_WRITE => "a doorbell register write of the wrong width or offset".into(),
            SdmaSyndrome::KERNEL_FAULT => "the block's AIV core faulted".into(),
            SdmaSyndrome::BAD_FIELDS => "copy SQE fields are not SHMEM's for a copy".into(),
            SdmaSyndrome::STREAM_EXCEPTION => "the runtime reported an exception on the kernel's stream".into(),
            SdmaSyndrome(other) => format!("unknown syndrome {other:#x}"),
        }
    }
}

/// A running kernel launch.
pub trait Launch: Send + Sync + fmt::Debug {
    /// Waits until every block has returned; false if `timeout` passed first.
    fn wait(&self, timeout: Duration) -> bool;
}

/// What [`Observation::read_channel_log`](super::Observation::read_channel_log) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelLog {
    /// The runtime keeps such a log, but its records are off (the twin's, `aiv.record_provenance`).
    NotRecorded,
    /// The runtime keeps none (the vendor's runtime on an NPU; the twin loaded as a separate library, whose log is
    /// that copy's).
    NotObservable,
    /// Entries `[first, end)` were appended; `first` is past the position asked for when older entries were lost.
    Read { first: u64, end: u64 },
}

/// An in-order copy queue executed by the device (an ACL stream).
pub trait CopyStream: Send + Sync + fmt::Debug {
    /// Queues a device-to-device copy of `length` bytes (`aclrtMemcpyAsync`, kind D2D); returns at once.
    fn memcpy_async(&self, dst: u64, src: u64, length: u64) -> Result<(), DeviceError>;
    /// Waits until every copy queued so far has executed (`aclrtSynchronizeStreamWithTimeout`). A copy the device
    /// refused since the last synchronisation is reported here, as ACL reports a stream's task exception.
    fn synchronize(&self, timeout: Duration) -> Result<(), DeviceError>;
}

/// Device memory owned by the caller; freed when dropped.
pub struct DeviceBuffer {
    addr: u64,
    length: u64,
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("length", &self.length)
            .finish()
    }
}

impl DeviceBuffer {
    /// A buffer at `addr` whose `release` runs at drop.
    pub fn new(addr: u64, length: u64, release: Box<dyn FnOnce() + Send + Sync>) -> Self {
        DeviceBuffer { addr, length, release: Some(release) }
    }
    /// Device address of the first byte (never a Host address: reach it through the device's copies).
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Bytes.
    pub fn len(&self) -> u64 {
        self.length
    }
    /// Whether the buffer is empty (never, for a successful allocation).
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// Carries SHMEM's 136-byte unique id from PE 0 to the other PEs over the project's metadata channel (the engine
/// implements it through the segment descriptor's `aiv` object; tests use an in-memory one).
pub trait UniqueIdExchange: Send + Sync {
    /// PE 0: make `uid` visible to the other PEs.
    fn publish(&self, uid: &[u8; 136]) -> Result<(), String>;
    /// PE > 0: the id PE 0 published, waiting at most `timeout`.
    fn fetch(&self, timeout: Duration) -> Result<[u8; 136], String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fabric_mem_server` is optional both ways: an advertisement without it (an older peer, the vendor's runtime)
    /// reads as a peer without a FabricMem engine, and one without an engine writes no such key.
    #[test]
    fn the_fabric_mem_server_field_is_backward_compatible() {
        let older = serde_json::json!({
            "device": "npu-0", "device_id": 0, "backend": "cann", "regions": [],
            "hixl_server": "127.0.0.1:1"
        });
        let read: DeviceAdvertisement = serde_json::from_value(older.clone()).expect("an older advertisement reads");
        assert_eq!((read.hixl_server.as_deref(), read.fabric_mem_server.as_deref()), (Some("127.0.0.1:1"), None));
        assert_eq!(serde_json::to_value(&read).expect("writes"), older, "no key written for no engine");
        let newer = DeviceAdvertisement { fabric_mem_server: Some("127.0.0.1:2".into()), ..read };
        let value = serde_json::to_value(&newer).expect("writes");
        assert_eq!(value["fabric_mem_server"], "127.0.0.1:2");
        assert_eq!(serde_json::from_value::<DeviceAdvertisement>(value).expect("reads back"), newer);
    }
}
