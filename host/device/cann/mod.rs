//! The CANN device backend (feature `cann`): [`DeviceBackend`] over the runtime-loaded ACL and SHMEM bindings.
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
//! workspace address in `workspace.rs`; step 6 in `launch.rs`; what only the twin runtime linked in offers (its NIC,
//! provenance logs, SDMA exception records) in `twin.rs`; the wording of runtime errors in `errors.rs`; the heap's
//! allocator in `heap.rs`; the ubshmem copy streams in `stream.rs`. This file keeps the device, its [`DeviceBackend`]
//! implementation (memory, imports, Host memory, channels, the RDMA calls), the registry a launch finds the device's
//! `Arc` in, and teardown (step 7).
//!
//! Nothing here has run on an NPU; the call sequences are checked against fake libraries (`tests/cann_backend.rs`),
//! and the loaded path moves data on the twin runtime's library (`tests/cann_vendor_path_on_twin.rs`).

mod errors;
pub mod heap;
mod launch;
mod open;
pub mod profiler;
mod runtime_kind;
mod settings;
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
use zerocopy::FromBytes;

use self::errors::runtime;
use self::heap::RangeAllocator;
use self::runtime_kind::same_loaded_object;
use self::vmm::{unmap_physical, Mapping, Unwind};
use crate::device::{
    ChannelException, ChannelInfo, ChannelLog, CopyStream, DeviceAdvertisement, DeviceBackend, DeviceBuffer,
    DeviceError, ExportedRegion, ImportedWindow, Launch, SdmaSyndrome, SharedMemory,
};
use crate::evidence::RuntimeLabel;
use crate::kernel_abi::{ChannelRecord, FlagArea, CHANNEL_RECORD_BYTES, SQE_BYTES};

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

    /// This device as the `Arc` it was opened as (for [`CannDevice::launch_function`] through a `&dyn DeviceBackend`).
    pub fn self_arc(&self) -> Option<Arc<CannDevice>> {
        registry_lookup(self)
    }

    /// Which runtime the device's tables are resolved to.
    pub fn runtime(&self) -> CannRuntime {
        self.runtime
    }

    /// Maps a peer's range exported by IPC key (once per key).
    fn import_ipc(&self, key: &str, region: &ExportedRegion) -> Result<ImportedWindow, DeviceError> {
        let mut imports = self.ipc_imports.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(window) = imports.get(key) {
            return Ok(*window);
        }
        let text = CString::new(key).map_err(|_| DeviceError::Invalid {
            device: self.id,
            operation: "import",
            reason: "an IPC key with a NUL byte".into(),
        })?;
        self.bind()?;
        let address = acl::ipc::import_by_key(self.acl, &text, ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT)
            .map_err(runtime(self.id, "import a peer's range by IPC key"))?;
        let window = ImportedWindow { local_base: address as u64, remote_base: region.addr, length: region.length };
        imports.insert(key.to_owned(), window);
        Ok(window)
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

impl DeviceBackend for CannDevice {
    fn backend_name(&self) -> &'static str {
        "cann"
    }

    fn device_id(&self) -> u32 {
        self.id
    }

    fn runtime_label(&self) -> RuntimeLabel {
        self.runtime_label
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

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

    fn advertisement(&self) -> DeviceAdvertisement {
        DeviceAdvertisement {
            device: self.identity.clone(),
            device_id: self.id,
            backend: "cann".into(),
            regions: std::iter::once(ExportedRegion {
                addr: self.heap_mapping.address,
                length: self.heap_mapping.length,
                export_id: self.export_id,
                ipc_key: None,
            })
            .chain(self.ipc_exports.lock().unwrap_or_else(|p| p.into_inner()).values().cloned())
            .collect(),
            // The VMM shareable handle is the capability.
            process_id: Some(std::process::id()),
            hixl_server: None,
            fabric_mem_server: None,
            // The aiv transport adds the NIC and keys once it opened the NIC (crate::engine::AivDevice).
            rdma: None,
            host: Some(crate::device::HostIdentity::current().0),
        }
    }

    fn bind_thread(&self) -> Result<(), DeviceError> {
        self.bind()
    }

    /// One bounded probe of a peer: import its heap's shareable handle again and free the new handle at once. An
    /// exporter that is gone (its process exited, its heap freed) refuses the import; a live one grants it, or, when
    /// this process imported the handle already, refuses the duplicate (`ACL_ERROR_RT_PARAM_INVALID`). `None`
    /// when the runtime has no import call, or for this device's own memory. On the twin runtime the import asks
    /// the exporter's process with bounded waits; on an NPU it is a driver call (*unverified on hardware* that it
    /// fails for a vanished exporter).
    fn probe_peer(&self, exporter: &DeviceAdvertisement) -> Option<std::io::Result<()>> {
        if exporter.device == self.identity {
            return None;
        }
        let region = exporter.regions.first()?;
        if self.bind().is_err() {
            return None;
        }
        match acl::vmm::import_from_shareable_handle(self.acl, region.export_id, self.id as i32) {
            Ok(handle) => {
                // SAFETY: imported just now, never mapped.
                let _ = unsafe { acl::vmm::free_physical(self.acl, handle) };
                Some(Ok(()))
            }
            Err(ascendcl_sys::Error::MissingSymbol(_)) => None,
            // One import of a handle per process is allowed (the vendor's documentation; the twin enforces it after
            // asking the exporter): a peer already mapped answers with this refusal while it is alive.
            Err(error) if error.code() == Some(ascendcl_sys::AclError(ACL_ERROR_RT_PARAM_INVALID)) => Some(Ok(())),
            Err(error) => {
                // Evidence of loss (what `PeerWindows` acts on): the exporter's process is gone (507022) or it no
                // longer knows the handle (107017: its heap was freed). Anything else (a timeout, a busy exporter)
                // proves nothing. The codes are the twin runtime's; which the vendor's runtime returns for a vanished
                // exporter is *unverified on hardware*.
                let gone = matches!(
                    error.code(),
                    Some(ascendcl_sys::AclError(ACL_ERROR_RT_IPC_ERROR | ACL_ERROR_RT_INVALID_HANDLE))
                );
                let kind = if gone { std::io::ErrorKind::NotFound } else { std::io::ErrorKind::Other };
                Some(Err(std::io::Error::new(
                    kind,
                    format!(
                        "the exporter {} no longer grants its heap (import of shareable handle {:#x}): {error}",
                        exporter.device, region.export_id
                    ),
                )))
            }
        }
    }

    fn import(&self, exporter: &DeviceAdvertisement, region: &ExportedRegion) -> Result<ImportedWindow, DeviceError> {
        if exporter.device == self.identity {
            return Ok(ImportedWindow { local_base: region.addr, remote_base: region.addr, length: region.length });
        }
        if let Some(key) = &region.ipc_key {
            return self.import_ipc(key, region);
        }
        let mut imports = self.imports.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((window, _)) = imports.get(&region.export_id) {
            return Ok(*window);
        }
        self.bind()?;
        let size = usize::try_from(region.length).map_err(|_| DeviceError::Invalid {
            device: self.id,
            operation: "import",
            reason: "region larger than the address space".into(),
        })?;
        let acl = self.acl;
        let id = self.id;
        let handle = acl::vmm::import_from_shareable_handle(acl, region.export_id, id as i32)
            .map_err(runtime(id, "import a peer's HBM heap"))?;
        let handle_value = handle as usize;
        let mut unwind = Unwind { steps: Vec::new() };
        unwind.push(move || {
            // SAFETY: imported above and unmapped by the time this runs.
            let _ = unsafe { acl::vmm::free_physical(acl, handle_value as aclrtDrvMemHandle) };
        });
        let address = acl::vmm::reserve_address(acl, size, 0, 0, 0)
            .map_err(runtime(id, "reserve device addresses for a peer's heap"))?;
        let address_value = address as usize;
        unwind.push(move || {
            // SAFETY: reserved above, nothing mapped by the time this runs.
            let _ = unsafe { acl::vmm::release_address(acl, address_value as *mut c_void) };
        });
        // SAFETY: `address` is the range reserved above; `handle` the imported allocation of the same size.
        unsafe { acl::vmm::map(acl, address, size, 0, handle, 0) }.map_err(runtime(id, "map a peer's HBM heap"))?;
        unwind.disarm();
        let window = ImportedWindow { local_base: address as u64, remote_base: region.addr, length: region.length };
        let mapping = Mapping { handle: handle_value, address: address as u64, length: region.length };
        imports.insert(region.export_id, (window, mapping));
        Ok(window)
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

    fn hixl(&self) -> Option<Result<&'static ascendcl_sys::hixl::HixlApi, String>> {
        match self.runtime {
            CannRuntime::Vendor => {
                Some(ascendcl_sys::hixl::api().map_err(|error| format!("the HiXL library: {error}")))
            }
            CannRuntime::LoadedTwin => Some(match ascendcl_sys::hixl::api() {
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
            }),
            CannRuntime::Twin => Some(Ok(cann_twin::hixl_api())),
        }
    }

    /// Twin runtime only: the vendor's FabricMem engine has no C API.
    fn fabric_mem(&self) -> Option<Result<&'static ascendcl_sys::hixl::FabricMemApi, String>> {
        match self.runtime {
            CannRuntime::Vendor => Some(Err(VENDOR_FABRIC_MEM.to_owned())),
            CannRuntime::LoadedTwin => Some(match ascendcl_sys::hixl::fabric_mem_api_in(self.acl.path()) {
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
            }),
            CannRuntime::Twin => Some(Ok(cann_twin::fabric_mem_api())),
        }
    }

    fn create_stream(&self) -> Result<Arc<dyn CopyStream>, DeviceError> {
        // The stream holds the device, so it is destroyed before the device is reset.
        let me = registry_lookup(self).ok_or_else(|| DeviceError::Invalid {
            device: self.id,
            operation: "create a copy stream",
            reason: "device not registered".into(),
        })?;
        Ok(Arc::new(stream::CannStream::create(me)?))
    }

    fn export_range(&self, addr: u64, length: u64) -> Result<ExportedRegion, DeviceError> {
        // The whole heap was exported at bring-up (one VMM shareable handle); a registered range inside it is
        // reachable through that export already, and the advertisement keeps listing the heap as one region.
        if self.heap.contains(addr, length) {
            return Ok(ExportedRegion {
                addr: self.heap_mapping.address,
                length: self.heap_mapping.length,
                export_id: self.export_id,
                ipc_key: None,
            });
        }
        // Memory the host program allocated on this device itself (aclrtMalloc): exported by IPC key, as the range
        // registered, for as long as it stays registered.
        if !self.is_own_memory(addr, length) {
            return Err(DeviceError::Invalid {
                device: self.id,
                operation: "export a registered range",
                reason: format!(
                    "[{addr:#x}, +{length}) is neither inside this device's exported HBM heap nor memory the runtime \
                     reports as this device's"
                ),
            });
        }
        let size = usize::try_from(length).map_err(|_| DeviceError::Invalid {
            device: self.id,
            operation: "export a registered range",
            reason: "range larger than the address space".into(),
        })?;
        self.bind()?;
        // SAFETY: the runtime reports the range's start as this device's memory; the export call checks the extent
        // against the live allocation and refuses a range past its end.
        let key = unsafe {
            acl::ipc::get_export_key(
                self.acl,
                addr as *mut c_void,
                size,
                ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION,
            )
        }
        .map_err(runtime(self.id, "export a registered range by IPC key"))?;
        let key = String::from_utf8(key).map_err(|_| DeviceError::Runtime {
            device: self.id,
            step: "export a registered range by IPC key",
            detail: "the runtime returned a key that is not UTF-8".into(),
        })?;
        let region = ExportedRegion { addr, length, export_id: 0, ipc_key: Some(key) };
        self.ipc_exports.lock().unwrap_or_else(|p| p.into_inner()).insert(addr, region.clone());
        Ok(region)
    }

    fn export_host_range(&self, addr: u64, length: u64) -> Result<ExportedRegion, DeviceError> {
        let step = "export registered Host memory by IPC key";
        let size = usize::try_from(length).map_err(|_| DeviceError::Invalid {
            device: self.id,
            operation: "export registered Host memory",
            reason: "range larger than the address space".into(),
        })?;
        self.bind()?;
        // SAFETY: the engine's caller keeps `[addr, +length)` mapped Host memory of this process while it stays
        // registered; the window is removed when the export is withdrawn (or the device closes).
        let device_addr =
            unsafe { acl::host::register(self.acl, addr as *mut c_void, length, ACL_HOST_REGISTER_MAPPED) }
                .map_err(runtime(self.id, "register Host memory for the device (for peers)"))?;
        let unregister = || {
            // SAFETY: registered above and not exported.
            let _ = unsafe { acl::host::unregister(self.acl, addr as *mut c_void) };
        };
        // The key of the Host window: the runtime decides whether it can share those pages (the twin's
        // `aclrtMallocHost` memory it can; CANN documents the key for `aclrtMalloc` memory only).
        // SAFETY: the window registered above covers the whole range.
        let key = match unsafe {
            acl::ipc::get_export_key(self.acl, device_addr, size, ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION)
        } {
            Ok(key) => key,
            Err(error) => {
                unregister();
                return Err(runtime(self.id, step)(error));
            }
        };
        let Ok(key) = String::from_utf8(key) else {
            unregister();
            return Err(DeviceError::Runtime {
                device: self.id,
                step,
                detail: "the runtime returned a key that is not UTF-8".into(),
            });
        };
        let region = ExportedRegion { addr, length, export_id: 0, ipc_key: Some(key) };
        self.ipc_exports.lock().unwrap_or_else(|p| p.into_inner()).insert(addr, region.clone());
        self.host_exports.lock().unwrap_or_else(|p| p.into_inner()).insert(addr, (device_addr as u64, length));
        Ok(region)
    }

    fn host_window(&self, addr: u64, length: u64) -> Option<u64> {
        let exports = self.host_exports.lock().unwrap_or_else(|p| p.into_inner());
        let (&start, &(device, size)) = exports.range(..=addr).next_back()?;
        let end = addr.checked_add(length)?;
        (end <= start + size).then(|| device + (addr - start))
    }

    fn withdraw_range(&self, addr: u64) -> bool {
        let Some(region) = self.ipc_exports.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr) else {
            return false;
        };
        let _ = self.bind();
        if let Some(key) = region.ipc_key.and_then(|key| CString::new(key).ok()) {
            // SAFETY: withdrawing the export; mappings peers made stay theirs (the runtime keeps the pages).
            let _ = unsafe { acl::ipc::close(self.acl, &key) };
        }
        if self.host_exports.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr).is_some() {
            // SAFETY: the Host window export_host_range registered; its key is closed.
            let _ = unsafe { acl::host::unregister(self.acl, addr as *mut c_void) };
        }
        true
    }

    fn rdma_open(&self, listen: std::net::SocketAddr) -> Result<std::net::SocketAddr, DeviceError> {
        self.twin_nic("open the device's NIC")?;
        cann_twin::nic::open(self.id as i32, listen).map_err(self.nic_error("open the NIC (twin runtime)"))
    }

    fn rdma_close(&self) -> Result<(), DeviceError> {
        self.twin_nic("close the device's NIC")?;
        cann_twin::nic::close(self.id as i32).map_err(self.nic_error("close the NIC (twin runtime)"))
    }

    fn rdma_register(&self, addr: u64, length: u64) -> Result<crate::device::RdmaKeys, DeviceError> {
        self.twin_nic("register device memory with the NIC")?;
        let keys = cann_twin::nic::register_memory(self.id as i32, addr, length, cann_twin::nic::Access::REMOTE_ALL)
            .map_err(self.nic_error("register device memory (twin runtime NIC)"))?;
        Ok(crate::device::RdmaKeys { lkey: keys.lkey, rkey: keys.rkey })
    }

    fn rdma_deregister(&self, lkey: u32) -> Result<(), DeviceError> {
        self.twin_nic("deregister device memory")?;
        cann_twin::nic::deregister_memory(self.id as i32, lkey)
            .map_err(self.nic_error("deregister device memory (twin runtime NIC)"))
    }

    fn rdma_create_qp(&self, spec: &crate::device::QpSpec) -> Result<crate::device::QpHandle, DeviceError> {
        self.twin_nic("create a QP")?;
        let config = cann_twin::nic::QpConfig {
            sq_depth: spec.sq_depth,
            cq_depth: spec.cq_depth,
            retry_count: spec.retry_count,
            timeout: spec.timeout,
            wake_block: spec.wake_block,
            ..cann_twin::nic::QpConfig::default()
        };
        let info = cann_twin::nic::create_qp(self.id as i32, config)
            .map_err(self.nic_error("create a QP (twin runtime NIC)"))?;
        Ok(crate::device::QpHandle {
            qpn: info.qpn,
            cqn: info.cqn,
            sq_base: info.sq_base,
            cq_base: info.cq_base,
            sq_db_addr: info.sq_db_addr,
            cq_db_addr: info.cq_db_addr,
            sq_depth: info.sq_depth,
            cq_depth: info.cq_depth,
        })
    }

    fn rdma_connect_qp(&self, qpn: u32, peer: std::net::SocketAddr, remote_qpn: u32) -> Result<(), DeviceError> {
        self.twin_nic("connect a QP")?;
        cann_twin::nic::connect_qp(self.id as i32, qpn, peer, remote_qpn)
            .map_err(self.nic_error("connect a QP (twin runtime NIC)"))
    }

    fn rdma_qp_state(&self, qpn: u32) -> Result<crate::device::QpState, DeviceError> {
        self.twin_nic("read a QP's state")?;
        let status = cann_twin::nic::qp_status(self.id as i32, qpn)
            .map_err(self.nic_error("read a QP's state (twin runtime NIC)"))?;
        let error = match (status.state, status.first_error, status.exception) {
            (_, _, Some(exception)) => Some(format!("NIC exception {:?}", exception.fault)),
            (_, Some((code, index)), None) => {
                Some(format!("first error CQE {} at WQE {index}", crate::kernel_abi::roce::CqeStatus(code).describe()))
            }
            (cann_twin::nic::QpState::Error, None, None) => Some("in the error state".into()),
            _ => None,
        };
        Ok(crate::device::QpState {
            ready: status.state == cann_twin::nic::QpState::ReadyToSend,
            error,
            posted: status.sq_producer,
            completed: status.sq_head,
        })
    }

    fn rdma_destroy_qp(&self, qpn: u32) -> Result<(), DeviceError> {
        self.twin_nic("destroy a QP")?;
        cann_twin::nic::destroy_qp(self.id as i32, qpn).map_err(self.nic_error("destroy a QP (twin runtime NIC)"))
    }

    fn open_channels(&self, count: u32, sq_depth: u32) -> Result<Vec<ChannelInfo>, DeviceError> {
        let unavailable = |reason: String| DeviceError::Unavailable { backend: "cann", reason };
        if count == 0 || count > MAX_CHANNELS {
            return Err(DeviceError::Invalid {
                device: self.id,
                operation: "open channels",
                reason: format!("{count} channels requested, 1 to {MAX_CHANNELS} exist"),
            });
        }
        let (workspace, source) = self.discover_workspace()?;
        let mut bytes = vec![0u8; CHANNEL_RECORDS_OFFSET as usize + count as usize * CHANNEL_RECORD_BYTES];
        self.read_device(workspace, &mut bytes, "read the SDMA workspace")?;
        let flag = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let queues = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        if flag == 0 || queues < count {
            return Err(unavailable(format!(
                "device {}: SDMA workspace at {workspace:#x} (from {source}) reports flag {flag} and {queues} \
                 queues; {count} channel records are needed (was SHMEM initialised with the SDMA engine and enough \
                 blocks?)",
                self.id
            )));
        }
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        channels.clear();
        let mut infos = Vec::new();
        for index in 0..count {
            let offset = CHANNEL_RECORDS_OFFSET as usize + index as usize * CHANNEL_RECORD_BYTES;
            let record =
                ChannelRecord::read_from_bytes(&bytes[offset..offset + CHANNEL_RECORD_BYTES]).map_err(|_| {
                    DeviceError::Invalid { device: self.id, operation: "open channels", reason: "short record".into() }
                })?;
            let depth = record.sq_depth.get();
            if record.sq_base.get() == 0 || record.sq_reg_base.get() == 0 || depth < 2 {
                return Err(unavailable(format!(
                    "device {}: channel record {index} is not usable (sq_base {:#x}, sq_reg_base {:#x}, sq_depth \
                     {depth})",
                    self.id,
                    record.sq_base.get(),
                    record.sq_reg_base.get()
                )));
            }
            if depth != sq_depth {
                tracing::info!(
                    device = self.id,
                    channel = index,
                    configured = sq_depth,
                    record = depth,
                    "SQ depth comes from SHMEM's channel record, not from aiv.sq_depth"
                );
            }
            let flag_area = self.allocate(std::mem::size_of::<FlagArea>() as u64)?;
            self.bind()?;
            // SAFETY: the flag area was just allocated from this device's mapped heap.
            unsafe {
                acl::memory::memset(
                    self.acl,
                    flag_area.addr() as *mut c_void,
                    std::mem::size_of::<FlagArea>(),
                    0,
                    std::mem::size_of::<FlagArea>(),
                )
            }
            .map_err(runtime(self.id, "clear a flag area"))?;
            let info = ChannelInfo {
                index,
                record_addr: workspace + offset as u64,
                flag_area_addr: flag_area.addr(),
                platform_context: 0,
            };
            infos.push(info);
            channels.push((info, flag_area));
        }
        Ok(infos)
    }

    fn channel_log_position(&self, channel: u32) -> Option<u64> {
        if self.runtime != CannRuntime::Twin {
            return None;
        }
        cann_twin::control::sqe_log_position(self.id as i32, channel).ok()
    }

    fn read_channel_log(&self, channel: u32, from: u64, out: &mut Vec<cann_twin::control::LoggedSqe>) -> ChannelLog {
        self.read_twin_log(format_args!("SDMA channel {channel}"), || {
            cann_twin::control::sqe_log(self.id as i32, channel, from, out).map_err(|error| error.to_string())
        })
    }

    fn read_qp_log(&self, qpn: u32, from: u64, out: &mut Vec<cann_twin::control::LoggedSqe>) -> ChannelLog {
        self.read_twin_log(format_args!("QP {qpn:#x}"), || {
            cann_twin::nic::qp_log(self.id as i32, qpn, from, out).map_err(|error| error.to_string())
        })
    }

    fn channel_exception(&self, channel: u32) -> Option<ChannelException> {
        if self.runtime == CannRuntime::Twin {
            if let Some(exception) = self.twin_channel_exception(channel) {
                return Some(exception);
            }
        }
        // In persistent mode nothing waits for the kernel's launch: look at the stream now (bounded, 1 ms), so a
        // kernel that ended with an exception is seen.
        self.poll_stream();
        let error = self.stream_error()?;
        let record_addr = {
            let channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
            channels.get(channel as usize)?.0.record_addr
        };
        let mut bytes = [0u8; CHANNEL_RECORD_BYTES];
        self.read_device(record_addr, &mut bytes, "read a channel record").ok()?;
        let record = ChannelRecord::read_from_bytes(&bytes).ok()?;
        let depth = record.sq_depth.get().max(1);
        let head = record.sq_head.get();
        let mut sqe = [0u8; SQE_BYTES as usize];
        let sqe_addr = record.sq_base.get() + u64::from(head % depth) * SQE_BYTES;
        if self.read_device(sqe_addr, &mut sqe, "read the SQE at the head").is_err() {
            sqe = [0; SQE_BYTES as usize];
        }
        tracing::warn!(device = self.id, channel, error = %error, "channel exception from the kernel stream");
        Some(ChannelException {
            channel,
            sq_id: record.sq_id.get(),
            head,
            tail: record.sq_tail.get(),
            syndrome: SdmaSyndrome::STREAM_EXCEPTION,
            sqe,
            detail: Some(format!("stream error: {error}")),
        })
    }

    fn reset_channel(&self, channel: u32) -> Result<(), DeviceError> {
        if self.runtime == CannRuntime::Twin {
            return cann_twin::control::reset_channel(self.id as i32, channel).map_err(|error| DeviceError::Runtime {
                device: self.id,
                step: "reset an SDMA channel (twin runtime)",
                detail: error.to_string(),
            });
        }
        Err(DeviceError::Unavailable {
            backend: "cann",
            reason: format!(
                "device {}: resetting SDMA channel {channel} after an exception is not implemented on CANN (the \
                 stream and SHMEM's queues must be recovered by the runtime; no call for it is known)",
                self.id
            ),
        })
    }

    fn launch(&self, kernel_args: u64, block_dim: u32) -> Result<Arc<dyn Launch>, DeviceError> {
        // The trait takes `&self`; the launch must keep the device alive, so find our own Arc in the registry.
        let me = registry_lookup(self).ok_or_else(|| DeviceError::Invalid {
            device: self.id,
            operation: "launch",
            reason: "device not registered".into(),
        })?;
        me.launch_arc(kernel_args, block_dim)
    }

    fn cycles_per_second(&self) -> u64 {
        self.settings.counter_hz
    }
}

// ---- self-references for launches ----

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
