//! Memory sharing of the CANN backend ([`MemorySharing`]): the advertisement of the exported heap and ranges, peers'
//! exports imported (VMM shareable handles, IPC keys), registered ranges and Host memory exported by IPC key and
//! withdrawn, and the probe of a peer's heap.
//!
//! Must not allocate or free the device's memory (`mod.rs` does) or tear imports down (the device's drop does).

use std::ffi::{c_void, CString};

use ascendcl_sys::result as acl;
use ascendcl_sys::sys::*;

use super::errors::runtime;
use super::vmm::{Mapping, Unwind};
use super::CannDevice;
use crate::device::{DeviceAdvertisement, DeviceError, DeviceMemory, ExportedRegion, ImportedWindow, MemorySharing};

impl CannDevice {
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
}

impl MemorySharing for CannDevice {
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
}
