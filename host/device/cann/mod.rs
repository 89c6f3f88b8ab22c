//! The CANN device backend (feature `cann`): the device seam's traits ([`DeviceBackend`]) over the runtime-loaded ACL
//! and SHMEM bindings.
//!
//! Owns one NPU's runtime state for this process: the ACL device binding, one stream, the SHMEM bootstrap (with the
//! SDMA data engine, so SHMEM builds its SDMA workspace), a VMM-mapped HBM heap exported to peers, imported peer
//! heaps, the loaded transfer-kernel binary, Host memory registered for device access. Must not touch engine state.
//!
//! Step by step (docs/hardware.md sections 3, 4, 6; docs/device.md, "The `cann` device backend"):
//! 1. `aclInit` (a repeated initialisation is accepted), `aclrtSetDevice`, `aclrtCreateStreamWithConfig`.
//! 2. SHMEM: PE 0 `aclshmemx_get_uniqueid` and publishes the 136 bytes through
//!    [`UniqueIdExchange`](crate::device::UniqueIdExchange); other PEs fetch them; every PE
//!    `aclshmemx_set_attr_uniqueid_args`, sets `data_op_engine_type = SDMA`, `aclshmemx_init_attr`.
//! 3. HBM heap: `aclrtMallocPhysical` -> `aclrtReserveMemAddress` -> `aclrtMapMem` -> `aclrtMemSetAccess`, exported
//!    with `aclrtMemExportToShareableHandle` (the handle is the advertised `export_id`).
//! 4. Kernel: `aclrtBinaryLoadFromData(kernel object)` -> `aclrtBinaryGetFunction("aiv_transfer_kernel")`. The NPU
//!    object on the vendor's runtime, the twin object on the twin runtime, in-process or loaded in the vendor's place
//!    (which a loaded library is: [`identify_runtime`]).
//! 5. Channels: read the SDMA workspace's flag info and per-block channel records with `aclrtMemcpy` D2H. SHMEM has
//!    no public host call returning the workspace address; it keeps it in field `sdma_workspace_addr` of its internal
//!    state struct (`cann_shmem_sys::device_state`). `open_channels` takes the first of: the override
//!    [`CannSettings::workspace_addr`] (`AIV_SDMA_WORKSPACE_ADDR`); the host copy `g_state` exported by
//!    `libshmem.so`; the device copy at SHMEM's fixed device address, read with `aclrtMemcpy` D2H. A copy counts only
//!    if its version word names the mirrored layout and its `mype`/`npes` are this process's; the source used is
//!    logged, and when all fail the error names each source and why. *Inferred* from SHMEM's source, unverified on
//!    hardware.
//! 6. Launch: `aclrtLaunchKernelWithHostArgs` with ENGINE_TYPE = AIV and the 8-byte kernel argument (device address
//!    of `KernelArgs`); a launch is waited for with `aclrtSynchronizeStreamWithTimeout`.
//! 7. Teardown (drop): unload the binary, unmap imports and the heap, free physical memory, destroy the stream,
//!    `aclshmem_finalize`, `aclrtResetDevice` (never `aclFinalize`: ACL initialisation is process-wide).
//!
//! Files: steps 1-4 in `open.rs`, with the heap's VMM mapping (and the undo list of a failed bring-up) in `vmm.rs`;
//! the settings from `AIV_*` variables in `settings.rs`; which runtime the tables are in `runtime_kind.rs`; step 5's
//! workspace address in `workspace.rs` and the channels ([`KernelChannels`]) in `channels.rs`; step 6 in `launch.rs`;
//! memory sharing ([`MemorySharing`]: exports, imports, peer probes) in `sharing.rs`; what only the twin runtime
//! linked in offers (provenance logs, SDMA exception records) in `twin.rs`, and its NIC ([`Rdma`]) in `nic.rs`; the
//! wording of runtime errors in `errors.rs`; the heap's allocator in `heap.rs`; the ubshmem copy streams in
//! `stream.rs`. This file keeps the device, its identity, memory, copy streams, HiXL tables and [`DeviceBackend`]
//! accessors, the registry a launch finds the device's `Arc` in, and teardown (step 7).
//!
//! Nothing here has run on an NPU; the call sequences are checked against fake libraries (`tests/cann_backend.rs`),
//! and the loaded path moves data on the twin runtime's library (`tests/cann_vendor_path_on_twin.rs`).

mod channels;
mod errors;
pub mod heap;
mod launch;
mod nic;
mod open;
pub mod profiler;
mod runtime_kind;
mod settings;
mod sharing;
pub mod stream;
mod twin;
mod vmm;
mod workspace;

pub use self::runtime_kind::{identify_runtime, CannRuntime};
pub use self::settings::{CannSettings, DEFAULT_COUNTER_HZ};

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ascendcl_sys::result as acl;
use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;
use cann_shmem_sys::result as shmem;
use cann_shmem_sys::ShmemApi;

use self::errors::runtime;
use self::heap::RangeAllocator;
use self::runtime_kind::same_loaded_object;
use self::vmm::{unmap_physical, Mapping};
use crate::device::{
    ChannelInfo, CopyStream, CopyStreams, Device, DeviceBackend, DeviceBuffer, DeviceError, DeviceMemory,
    ExportedRegion, HixlAccess, ImportedWindow, KernelChannels, MemorySharing, Observation, Rdma, SharedMemory,
};
use crate::evidence::RuntimeLabel;

/// Bytes of SHMEM's SDMA workspace (docs/hardware.md section 4).
pub const SDMA_WORKSPACE_BYTES: usize = 16 << 10;
/// Offset of the first channel record in the workspace; records are 64 bytes, one per AIV block.
pub const CHANNEL_RECORDS_OFFSET: u64 = 64;
/// Most AIV blocks (and channel records) per NPU on A2/A3.
pub const MAX_CHANNELS: u32 = 48;
/// SHMEM symmetric-heap size asked for at bootstrap. The data path uses the backend's own VMM heap, so SHMEM's heap
/// only has to exist; 32 MiB is a guess at a size SHMEM accepts (*unverified on hardware*).
pub const SHMEM_LOCAL_MEM_BYTES: u64 = 32 << 20;
/// `aclrtMemExportToShareableHandle` flag: no PID validation on import (docs/hardware.md section 7).
pub const EXPORT_WITHOUT_PID_CHECK: u64 = 0x1;
/// How long a non-root PE waits for PE 0's unique id.
pub const UID_FETCH_TIMEOUT: Duration = Duration::from_secs(120);

thread_local! {
    /// The device this thread last bound with `aclrtSetDevice` (ACL's current device is per thread).
    static BOUND_DEVICE: std::cell::Cell<i32> = const { std::cell::Cell::new(-1) };
}

/// The loaded transfer kernel.
#[derive(Debug)]
struct Kernel {
    binary: usize,
    function: usize,
}

/// One NPU driven through CANN.
/// Why `adxl-fabric` is unavailable on the vendor's runtime.
pub const VENDOR_FABRIC_MEM: &str = "the vendor's FabricMem engine is reachable only through ADXL's C++ engine \
     (adxl::AdxlEngine with the option EnableUseFabricMem=1), which this engine does not drive: adxl-fabric runs on \
     the twin runtime only; on an NPU, the audit's mooncake-ascend path with --mooncake-global-resource-config runs \
     FabricMem through Mooncake";

pub struct CannDevice {
    runtime: CannRuntime,
    /// What every record drawn from this device names as its runtime.
    runtime_label: RuntimeLabel,
    acl: &'static AclApi,
    shmem: &'static ShmemApi,
    id: u32,
    identity: String,
    settings: CannSettings,
    stream: usize,
    heap_mapping: Mapping,
    heap: Arc<RangeAllocator>,
    export_id: u64,
    kernel: Kernel,
    imports: Mutex<HashMap<u64, (ImportedWindow, Mapping)>>,
    /// Registered ranges of the runtime's own allocations (outside the heap) exported by IPC key, by address.
    ipc_exports: Mutex<std::collections::BTreeMap<u64, ExportedRegion>>,
    /// The exports above that are Host memory registered for the device (`aclrtHostRegister`), unregistered when
    /// withdrawn: Host start -> (device address of that start, length).
    host_exports: Mutex<std::collections::BTreeMap<u64, (u64, u64)>>,
    /// Peers' IPC-key exports mapped into this device, by key.
    ipc_imports: Mutex<HashMap<String, ImportedWindow>>,
    channels: Mutex<Vec<(ChannelInfo, DeviceBuffer)>>,
    stream_error: Mutex<Option<String>>,
    // Boxed: the runtime may still read an argument after the vector grows, so the bytes must not move.
    #[allow(clippy::vec_box)]
    pending_host_args: Mutex<Vec<Box<[u8; 8]>>>,
}

impl fmt::Debug for CannDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CannDevice")
            .field("id", &self.id)
            .field("identity", &self.identity)
            .field("shmem_pe", &self.settings.shmem_pe)
            .field("heap", &format_args!("{:#x}+{:#x}", self.heap.base(), self.heap.len()))
            .finish()
    }
}

impl CannDevice {
    /// Binds this thread to the device once (ACL's current device is per thread).
    fn bind(&self) -> Result<(), DeviceError> {
        let device = self.id as i32;
        if BOUND_DEVICE.with(|bound| bound.get()) != device {
            acl::device::set(self.acl, device).map_err(runtime(self.id, "set the device on this thread"))?;
            BOUND_DEVICE.with(|bound| bound.set(device));
        }
        Ok(())
    }

    /// Copies `out.len()` bytes of device memory at `addr` to the Host.
    fn read_device(&self, addr: u64, out: &mut [u8], step: &'static str) -> Result<(), DeviceError> {
        self.bind()?;
        // SAFETY: `out` is a live Host buffer of the length passed; `addr` names device memory the caller obtained
        // from the runtime (the workspace or a channel ring) and the runtime checks it.
        unsafe {
            acl::memory::memcpy(
                self.acl,
                out.as_mut_ptr().cast(),
                out.len(),
                addr as *const c_void,
                out.len(),
                ACL_MEMCPY_DEVICE_TO_HOST,
            )
        }
        .map_err(runtime(self.id, step))
    }

    /// The cann device behind `device`, when it is one this process opened: for what only this backend offers
    /// (its runtime, its stream error) to tests and benchmarks holding the device as a [`DeviceBackend`].
    pub fn of(device: &dyn DeviceBackend) -> Option<Arc<CannDevice>> {
        let address = device as *const dyn DeviceBackend;
        let registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        registry
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .find(|candidate| std::ptr::addr_eq(Arc::as_ptr(candidate), address))
    }

    /// Which runtime the device's tables are resolved to.
    pub fn runtime(&self) -> CannRuntime {
        self.runtime
    }

    /// Whether `[addr, addr + length)` lies in one window of a peer's memory mapped into this device.
    fn in_imported_window(&self, addr: u64, length: u64) -> bool {
        let inside = |window: &ImportedWindow| {
            addr.checked_sub(window.local_base)
                .and_then(|offset| offset.checked_add(length))
                .is_some_and(|end| end <= window.length)
        };
        self.imports.lock().unwrap_or_else(|p| p.into_inner()).values().any(|(window, _)| inside(window))
            || self.ipc_imports.lock().unwrap_or_else(|p| p.into_inner()).values().any(inside)
    }

    /// Whether the runtime reports `addr` as memory of this device (`aclrtPointerGetAttributes`). False when the
    /// runtime lacks the call or refuses the address.
    fn is_runtime_device_memory(&self, addr: u64) -> bool {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut attributes: aclrtPtrAttributes = unsafe { std::mem::zeroed() };
        // SAFETY: any address may be asked about; `attributes` is a live out-parameter of the declared layout.
        let code = unsafe { self.acl.aclrtPointerGetAttributes(addr as *const c_void, &mut attributes) };
        code == Ok(ACL_SUCCESS)
            && attributes.location.r#type == ACL_MEM_LOCATION_TYPE_DEVICE
            && attributes.location.id == self.id
    }
}

impl Device for CannDevice {
    fn backend_name(&self) -> &'static str {
        "cann"
    }

    fn device_id(&self) -> u32 {
        self.id
    }

    fn runtime_label(&self) -> RuntimeLabel {
        self.runtime_label
    }

    fn bind_thread(&self) -> Result<(), DeviceError> {
        self.bind()
    }
}

impl DeviceMemory for CannDevice {
    fn allocate(&self, length: u64) -> Result<DeviceBuffer, DeviceError> {
        let (addr, rounded) = self.heap.allocate(length).ok_or_else(|| DeviceError::OutOfMemory {
            device: self.id,
            length,
            reason: format!("the {} byte HBM heap has no free range that large", self.heap.len()),
        })?;
        let heap = self.heap.clone();
        Ok(DeviceBuffer::new(addr, length, Box::new(move || heap.release(addr, rounded))))
    }

    fn is_mapped(&self, addr: u64, length: u64) -> bool {
        self.is_own_memory(addr, length) || self.in_imported_window(addr, length)
    }

    /// The heap, and allocations of the runtime on this device (`aclrtMalloc` by the host program: the runtime
    /// says the address is memory of this device, and it is no peer's memory mapped here).
    fn is_own_memory(&self, addr: u64, length: u64) -> bool {
        if self.heap.contains(addr, length) {
            return true;
        }
        if length == 0 || addr.checked_add(length).is_none() || self.in_imported_window(addr, length) {
            return false;
        }
        self.is_runtime_device_memory(addr)
    }

    /// `aclrtMemcpy` H2D.
    fn copy_to_device(&self, addr: u64, data: &[u8]) -> Result<(), DeviceError> {
        if !self.is_mapped(addr, data.len() as u64) {
            return Err(DeviceError::Invalid {
                device: self.id,
                operation: "copy to device",
                reason: format!("[{addr:#x}, +{}) is not device memory of this backend", data.len()),
            });
        }
        self.bind()?;
        // SAFETY: the destination range was checked above to be mapped device memory; `data` is live Host memory.
        unsafe {
            acl::memory::memcpy(
                self.acl,
                addr as *mut c_void,
                data.len(),
                data.as_ptr().cast(),
                data.len(),
                ACL_MEMCPY_HOST_TO_DEVICE,
            )
        }
        .map_err(runtime(self.id, "copy Host data to the device"))
    }

    /// `aclrtMemcpy` D2H.
    fn copy_from_device(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        if !self.is_mapped(addr, out.len() as u64) {
            return Err(DeviceError::Invalid {
                device: self.id,
                operation: "copy from device",
                reason: format!("[{addr:#x}, +{}) is not device memory of this backend", out.len()),
            });
        }
        self.read_device(addr, out, "copy device data to the Host")
    }

    fn allocate_shared(&self, length: usize) -> Result<SharedMemory, DeviceError> {
        self.bind()?;
        let (host, rounded) = crate::device::map_anonymous_pages(self.id, length, "map Host memory for the device")?;
        let host = host.cast::<c_void>();
        let unmap = move || {
            // SAFETY: the mapping made above, no longer used.
            unsafe { libc::munmap(host, rounded) };
        };
        // SAFETY: `host` is a live mapping of `rounded` bytes that stays mapped until unregistered (release below).
        let device_addr = match unsafe { acl::host::register(self.acl, host, rounded as u64, ACL_HOST_REGISTER_MAPPED) }
        {
            Ok(device_addr) => device_addr as u64,
            Err(error) => {
                unmap();
                // No fallback to aclrtMallocHost: nothing in the sources says its Host pointer is also the address
                // a kernel uses, and a wrong DCQ address would fail silently on the device.
                return Err(runtime(self.id, "register Host memory for the device (DCQ, rings)")(error));
            }
        };
        let acl = self.acl;
        let host_value = host as usize;
        let release = Box::new(move || {
            // SAFETY: registered above; the transport releases shared memory only after its kernel returned.
            let _ = unsafe { acl::host::unregister(acl, host_value as *mut c_void) };
            // SAFETY: the mapping made above, unregistered now.
            unsafe { libc::munmap(host_value as *mut c_void, rounded) };
        });
        // SAFETY: a fresh anonymous mapping is zeroed and page-aligned, owned by the value until release.
        Ok(unsafe { SharedMemory::from_raw(host.cast(), device_addr, rounded, release) })
    }
}

impl CopyStreams for CannDevice {
    fn create_stream(&self) -> Result<Arc<dyn CopyStream>, DeviceError> {
        // The stream holds the device, so it is destroyed before the device is reset.
        let me = registry_lookup(self).ok_or_else(|| DeviceError::Invalid {
            device: self.id,
            operation: "create a copy stream",
            reason: "device not registered".into(),
        })?;
        Ok(Arc::new(stream::CannStream::create(me)?))
    }
}

impl HixlAccess for CannDevice {
    fn hixl_api(&self) -> Result<&'static ascendcl_sys::hixl::HixlApi, String> {
        match self.runtime {
            CannRuntime::Vendor => ascendcl_sys::hixl::api().map_err(|error| format!("the HiXL library: {error}")),
            CannRuntime::LoadedTwin => match ascendcl_sys::hixl::api() {
                Err(error) => Err(format!("the HiXL library: {error}")),
                // The twin's HiXL reads and writes memory through its own copy's ACL: it must be the ACL loaded here.
                Ok(hixl)
                    if !same_loaded_object(
                        self.acl.address("aclInit").unwrap_or(std::ptr::null()),
                        hixl.address("HixlCSServerCreate").unwrap_or(std::ptr::null()),
                    ) =>
                {
                    Err(format!(
                        "the HiXL library {} is another copy of the twin runtime than the ACL library {}: point \
                     AIV_HIXL_LIB at the file AIV_ASCENDCL_LIB names",
                        hixl.path().display(),
                        self.acl.path().display()
                    ))
                }
                Ok(hixl) => Ok(hixl),
            },
            CannRuntime::Twin => Ok(cann_twin::hixl_api()),
        }
    }

    /// Twin runtime only: the vendor's FabricMem engine has no C API.
    fn fabric_mem_api(&self) -> Result<&'static ascendcl_sys::hixl::FabricMemApi, String> {
        match self.runtime {
            CannRuntime::Vendor => Err(VENDOR_FABRIC_MEM.to_owned()),
            CannRuntime::LoadedTwin => match ascendcl_sys::hixl::fabric_mem_api_in(self.acl.path()) {
                Err(error) => Err(format!("the twin runtime's FabricMem functions: {error}")),
                // The twin's FabricMem moves memory through its own copy's ACL: it must be the ACL loaded here.
                Ok(fabric)
                    if !same_loaded_object(
                        self.acl.address("aclInit").unwrap_or(std::ptr::null()),
                        fabric.address("cannTwinFabricMemCreate").unwrap_or(std::ptr::null()),
                    ) =>
                {
                    Err(format!(
                        "the FabricMem functions of {} are another copy of the twin runtime than the ACL library {}",
                        fabric.path().display(),
                        self.acl.path().display()
                    ))
                }
                Ok(fabric) => Ok(fabric),
            },
            CannRuntime::Twin => Ok(cann_twin::fabric_mem_api()),
        }
    }
}

impl DeviceBackend for CannDevice {
    fn memory(self: Arc<Self>) -> Arc<dyn DeviceMemory> {
        self
    }

    fn sharing(self: Arc<Self>) -> Arc<dyn MemorySharing> {
        self
    }

    fn streams(self: Arc<Self>) -> Arc<dyn CopyStreams> {
        self
    }

    fn kernel(self: Arc<Self>) -> Arc<dyn KernelChannels> {
        self
    }

    /// The in-process twin's logs; none on the vendor's runtime or on the twin loaded in its place.
    fn observation(self: Arc<Self>) -> Option<Arc<dyn Observation>> {
        self.twin_logs()
    }
    /// The twin NIC, on the twin runtime linked into this process only.
    fn rdma(&self) -> Result<&dyn Rdma, DeviceError> {
        self.twin_nic("open the device's NIC")?;
        Ok(self)
    }

    fn hixl(&self) -> Option<&dyn HixlAccess> {
        Some(self)
    }
}

// ---- self-references for launches, copy streams and `CannDevice::of` ----

static REGISTRY: Mutex<Vec<std::sync::Weak<CannDevice>>> = Mutex::new(Vec::new());

fn register(device: &Arc<CannDevice>) {
    let mut registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    registry.retain(|weak| weak.strong_count() > 0);
    registry.push(Arc::downgrade(device));
}

fn registry_lookup(device: &CannDevice) -> Option<Arc<CannDevice>> {
    let registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    registry.iter().filter_map(std::sync::Weak::upgrade).find(|candidate| std::ptr::eq(&**candidate, device))
}

impl Drop for CannDevice {
    fn drop(&mut self) {
        let acl = self.acl;
        let _ = self.bind();
        let started = Instant::now();
        // SAFETY: the stream is live; bounded wait so a kernel that never returns cannot hang teardown.
        let _ = unsafe { acl::stream::synchronize_with_timeout(acl, self.stream as aclrtStream, 1000) };
        // SAFETY: no launch of this device is waited for any more (launches hold the device).
        let _ = unsafe { acl::kernel::unload(acl, self.kernel.binary as aclrtBinHandle) };
        self.channels.lock().unwrap_or_else(|p| p.into_inner()).clear();
        for (_, (_, mapping)) in self.imports.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            unmap_physical(acl, &mapping);
        }
        let mut ipc_keys: Vec<String> =
            self.ipc_imports.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(key, _)| key).collect();
        let exports = std::mem::take(&mut *self.ipc_exports.lock().unwrap_or_else(|p| p.into_inner()));
        ipc_keys.extend(exports.into_values().filter_map(|region| region.ipc_key));
        for key in ipc_keys.into_iter().filter_map(|key| CString::new(key).ok()) {
            // SAFETY: the kernel has returned; nothing of this device reaches imported or exported ranges any more.
            let _ = unsafe { acl::ipc::close(acl, &key) };
        }
        for host in std::mem::take(&mut *self.host_exports.lock().unwrap_or_else(|p| p.into_inner())).into_keys() {
            // SAFETY: Host windows export_host_range registered; their keys are closed above.
            let _ = unsafe { acl::host::unregister(acl, host as *mut c_void) };
        }
        unmap_physical(acl, &self.heap_mapping);
        // SAFETY: the stream is live and unused afterwards.
        let _ = unsafe { acl::stream::destroy(acl, self.stream as aclrtStream) };
        let _ = shmem::bootstrap::finalize(self.shmem);
        let _ = acl::device::reset(acl, self.id as i32);
        BOUND_DEVICE.with(|bound| bound.set(-1));
        tracing::info!(device = self.id, teardown = ?started.elapsed(), "CANN device closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_char;

    /// An `aclsysGetCANNVersion` answering `$text` for every package.
    macro_rules! version_fn {
        ($name:ident, $text:expr) => {
            unsafe extern "C" fn $name(_: aclCANNPackageName, version: *mut aclCANNPackageVersion) -> aclError {
                // SAFETY: the caller passes a live out-pointer (`acl::version::package` does).
                let version = unsafe { &mut *version };
                for (slot, byte) in version.version.iter_mut().zip($text.bytes()) {
                    *slot = byte as c_char;
                }
                ACL_SUCCESS
            }
        };
    }
    version_fn!(this_twin, cann_twin::TWIN_VERSION_STRING);
    version_fn!(other_twin, "cann-twin 9.9.9");
    version_fn!(vendor, "8.0.RC1");
    version_fn!(named_alike, "cann-twinkle 1.0");

    /// The twin's ACL table with `aclsysGetCANNVersion` replaced (or absent, for `None`).
    fn table(version: Option<*const c_void>) -> AclApi {
        let resolve = move |name: &str| match name {
            "aclsysGetCANNVersion" => version,
            other => cann_twin::resolve(other),
        };
        // SAFETY: the twin's functions, and the version functions above, each with the declared prototype.
        unsafe { AclApi::from_resolver("libascendcl.so".into(), &resolve) }.expect("every required symbol")
    }

    #[test]
    fn the_runtime_is_identified_by_its_cann_version_string_alone() {
        assert_eq!(identify_runtime(&table(Some(this_twin as *const c_void))), Ok(CannRuntime::LoadedTwin));
        assert_eq!(identify_runtime(&table(Some(vendor as *const c_void))), Ok(CannRuntime::Vendor));
        assert_eq!(identify_runtime(&table(Some(named_alike as *const c_void))), Ok(CannRuntime::Vendor));
        // A runtime without the query (older CANN) is the vendor's.
        assert_eq!(identify_runtime(&table(None)), Ok(CannRuntime::Vendor));
        let refused = identify_runtime(&table(Some(other_twin as *const c_void))).expect_err("another twin version");
        assert!(refused.contains("cann-twin 9.9.9") && refused.contains(cann_twin::TWIN_VERSION_STRING), "{refused}");
    }
}
