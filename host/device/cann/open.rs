//! Opening a CANN device (steps 1-4 of the `cann` module doc): [`CannDevice::open`] on the loaded libraries (the
//! vendor's, or the twin runtime loaded in their place), [`CannDevice::open_on_twin`] on the twin runtime linked into
//! this process, and the bring-up both share: ACL binding and kernel stream, SHMEM bootstrap by unique id with the
//! SDMA engine, the HBM heap mapped and exported, the transfer kernel loaded.
//!
//! A failed step undoes the steps done before it; what bring-up makes is handed to the [`CannDevice`] it returns and
//! registered for launches. Must not keep state of its own or tear a device down (the device's `Drop` does).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex};

use ascendcl_sys::result as acl;
use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;
use cann_shmem_sys::result as shmem;
use cann_shmem_sys::sys::{aclshmemx_uniqueid_t, ACLSHMEMX_INIT_WITH_UNIQUEID, ACLSHMEM_DATA_OP_SDMA};
use cann_shmem_sys::ShmemApi;

use super::errors::{runtime, shmem_error};
use super::heap::RangeAllocator;
use super::runtime_kind::{runtime_label, same_loaded_object};
use super::vmm::{map_physical, Unwind};
use super::{
    identify_runtime, register, CannDevice, CannRuntime, CannSettings, Kernel, BOUND_DEVICE, EXPORT_WITHOUT_PID_CHECK,
    SHMEM_LOCAL_MEM_BYTES, UID_FETCH_TIMEOUT,
};
use crate::config::AivOptions;
use crate::device::{DeviceError, UniqueIdExchange};

impl CannDevice {
    /// Brings the device up (steps 1-4 of the `cann` module doc). Every failure names its step and the ACL/SHMEM
    /// code, and undoes the steps already done.
    pub fn open(
        options: &AivOptions,
        settings: CannSettings,
        exchange: Option<&dyn UniqueIdExchange>,
    ) -> Result<Arc<CannDevice>, DeviceError> {
        let id = options.device_id;
        let acl = ascendcl_sys::api().map_err(runtime(id, "load the ACL runtime"))?;
        let kind = identify_runtime(acl).map_err(|detail| DeviceError::Runtime {
            device: id,
            step: "identify the loaded ACL runtime",
            detail,
        })?;
        let shmem_api = cann_shmem_sys::api().map_err(shmem_error(id, "load the SHMEM library"))?;
        if kind == CannRuntime::LoadedTwin
            && !same_loaded_object(
                acl.address("aclInit").unwrap_or(std::ptr::null()),
                shmem_api.address("aclshmem_my_pe").unwrap_or(std::ptr::null()),
            )
        {
            return Err(DeviceError::Runtime {
                device: id,
                step: "check the SHMEM library",
                detail: format!(
                    "the twin runtime's SHMEM works only in the copy of the runtime that holds its ACL state, but \
                     SHMEM was loaded from {} and ACL from {}, two copies: point AIV_SHMEM_LIB (and AIV_HIXL_LIB) at \
                     the file AIV_ASCENDCL_LIB names",
                    shmem_api.path().display(),
                    acl.path().display()
                ),
            });
        }
        let settings = match kind {
            // The twin runtime cannot run the NPU object; it runs the twin's, at the twin's counter rate.
            CannRuntime::LoadedTwin => {
                tracing::info!(
                    device = id,
                    library = %acl.path().display(),
                    "the loaded ACL runtime is the twin runtime: loading the twin kernel object"
                );
                CannSettings {
                    kernel_object: Some(crate::device::kernel_image::TWIN_KERNEL_OBJECT),
                    counter_hz: cann_twin::kernel::SYSTEM_COUNTER_HZ,
                    ..settings
                }
            }
            _ => settings,
        };
        Self::open_with(options, settings, (kind, acl, shmem_api), exchange)
    }

    /// Brings the device up on the twin runtime (`cann_twin`): the same steps, with the ACL and SHMEM tables
    /// resolved to the twin's functions in this process, the twin's kernel object (the kernel built for the CPU model
    /// of AscendC) and the twin's counter rate. The SHMEM PE settings come from the environment as on an NPU
    /// ([`CannSettings::from_env`]); each device id has its own instance of the twin's SHMEM library.
    pub fn open_on_twin(
        options: &AivOptions,
        exchange: Option<&dyn UniqueIdExchange>,
    ) -> Result<Arc<CannDevice>, DeviceError> {
        let settings = CannSettings {
            kernel_object: Some(crate::device::kernel_image::TWIN_KERNEL_OBJECT),
            counter_hz: cann_twin::kernel::SYSTEM_COUNTER_HZ,
            ..CannSettings::from_env(options.device_id)?
        };
        // One SHMEM instance per device of the process (SHMEM itself is one PE per process; the twin loads it once
        // per device so that a process can hold several devices, each one PE).
        let shmem = cann_twin::shmem_api_instance(options.device_id as usize).ok_or_else(|| DeviceError::Invalid {
            device: options.device_id,
            operation: "open on the twin runtime",
            reason: format!(
                "device ids 0 to {} have a SHMEM instance on the twin runtime",
                cann_twin::SHMEM_INSTANCES - 1
            ),
        })?;
        if options.record_provenance {
            // Before this device's rings are written, so that every SQE its engines consume has a known writer.
            cann_twin::control::record_provenance(true);
        }
        Self::open_with(options, settings, (CannRuntime::Twin, cann_twin::acl_api(), shmem), exchange)
    }

    fn open_with(
        options: &AivOptions,
        settings: CannSettings,
        (runtime_kind, acl, shmem_api): (CannRuntime, &'static AclApi, &'static ShmemApi),
        exchange: Option<&dyn UniqueIdExchange>,
    ) -> Result<Arc<CannDevice>, DeviceError> {
        let id = options.device_id;
        let kernel_object = settings.kernel_object.ok_or_else(|| DeviceError::Unavailable {
            backend: "cann",
            reason: "this build has no NPU kernel object: build with `--features cann` where bisheng or ccec is \
                     found (AIV_CANN_HOME, ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME or PATH), with \
                     AIV_REQUIRE_NPU_KERNEL=1 to make its absence \
                     a build error"
                .into(),
        })?;
        let device = i32::try_from(id).map_err(|_| DeviceError::Invalid {
            device: id,
            operation: "open",
            reason: "device id does not fit an ACL device id".into(),
        })?;
        let mut unwind = Unwind { steps: Vec::new() };

        // 1. ACL.
        match acl::runtime::init(acl, None) {
            Ok(()) => {}
            Err(error) if error.code() == Some(ascendcl_sys::AclError(ACL_ERROR_REPEAT_INITIALIZE)) => {}
            Err(error) => return Err(runtime(id, "aclInit")(error)),
        }
        acl::device::set(acl, device).map_err(runtime(id, "set the device"))?;
        BOUND_DEVICE.with(|bound| bound.set(device));
        unwind.push(move || {
            let _ = acl::device::reset(acl, device);
        });
        let stream = acl::stream::create_with_config(acl, 0, 0).map_err(runtime(id, "create the kernel stream"))?;
        let stream_handle = stream as usize;
        unwind.push(move || {
            // SAFETY: the stream was created above and nothing else holds it.
            let _ = unsafe { acl::stream::destroy(acl, stream_handle as aclrtStream) };
        });

        // 2. SHMEM bootstrap by unique id, with the SDMA data engine.
        let mut uid = if settings.shmem_pe == 0 {
            let uid = shmem::bootstrap::get_uniqueid(shmem_api).map_err(shmem_error(id, "get the SHMEM unique id"))?;
            if settings.shmem_pes > 1 {
                let exchange = exchange.ok_or_else(|| missing_exchange(id))?;
                exchange.publish(&uid.to_bytes()).map_err(|reason| DeviceError::Runtime {
                    device: id,
                    step: "publish the SHMEM unique id",
                    detail: reason,
                })?;
            }
            uid
        } else {
            let exchange = exchange.ok_or_else(|| missing_exchange(id))?;
            let bytes = exchange.fetch(UID_FETCH_TIMEOUT).map_err(|reason| DeviceError::Runtime {
                device: id,
                step: "fetch the SHMEM unique id from PE 0",
                detail: reason,
            })?;
            aclshmemx_uniqueid_t::from_bytes(&bytes)
        };
        let mut attr = shmem::bootstrap::set_attr_uniqueid_args(
            shmem_api,
            settings.shmem_pe,
            settings.shmem_pes,
            SHMEM_LOCAL_MEM_BYTES,
            &mut uid,
        )
        .map_err(shmem_error(id, "set the SHMEM attributes"))?;
        attr.option_attr.data_op_engine_type = ACLSHMEM_DATA_OP_SDMA;
        shmem::bootstrap::init_attr(shmem_api, ACLSHMEMX_INIT_WITH_UNIQUEID, &mut attr)
            .map_err(shmem_error(id, "initialise SHMEM with the SDMA engine"))?;
        unwind.push(move || {
            let _ = shmem::bootstrap::finalize(shmem_api);
        });

        // 3. The HBM heap through VMM, exported for peers.
        let heap_mapping = map_physical(acl, id, options.hbm_size, &mut unwind)?;
        let export_handle = heap_mapping.handle;
        // SAFETY: the physical handle was created by map_physical and is live.
        // Flag 0x1 disables the runtime's PID check on import (docs/hardware.md section 7): the peer engine is another
        // process whose PID this one does not learn. It widens who may import the heap.
        let export_id = unsafe {
            acl::vmm::export_to_shareable_handle(
                acl,
                export_handle as aclrtDrvMemHandle,
                ACL_MEM_HANDLE_TYPE_NONE,
                EXPORT_WITHOUT_PID_CHECK,
            )
        }
        .map_err(runtime(id, "export the HBM heap"))?;

        // 4. The transfer kernel.
        // SAFETY: the object is 'static, so it outlives the binary; no options are passed.
        let binary = unsafe { acl::kernel::load_from_data(acl, kernel_object, None) }
            .map_err(runtime(id, "load the kernel binary"))?;
        let binary_handle = binary as usize;
        unwind.push(move || {
            // SAFETY: the binary was loaded above and no kernel of it was launched.
            let _ = unsafe { acl::kernel::unload(acl, binary_handle as aclrtBinHandle) };
        });
        let entry = CString::new(crate::device::kernel_image::NPU_KERNEL_ENTRY).map_err(|_| DeviceError::Invalid {
            device: id,
            operation: "open",
            reason: "kernel entry name has a NUL".into(),
        })?;
        // SAFETY: the binary is live.
        let function = unsafe { acl::kernel::get_function(acl, binary, &entry) }
            .map_err(runtime(id, "find the kernel entry aiv_transfer_kernel"))?;

        unwind.disarm();
        let identity = match runtime_kind {
            CannRuntime::Vendor | CannRuntime::LoadedTwin => {
                format!("cann-{}-{id}-pe{}", std::process::id(), settings.shmem_pe)
            }
            CannRuntime::Twin => format!("cann-twin-{}-{id}-pe{}", std::process::id(), settings.shmem_pe),
        };
        tracing::info!(device = id, pe = settings.shmem_pe, pes = settings.shmem_pes, "CANN device opened");
        let heap = Arc::new(RangeAllocator::new(heap_mapping.address, heap_mapping.length));
        let runtime_label = runtime_label(runtime_kind);
        let device = Arc::new(CannDevice {
            runtime: runtime_kind,
            runtime_label,
            acl,
            shmem: shmem_api,
            id,
            identity,
            settings,
            stream: stream_handle,
            heap_mapping,
            heap,
            export_id,
            kernel: Kernel { binary: binary_handle, function: function as usize },
            imports: Mutex::new(HashMap::new()),
            ipc_exports: Mutex::new(std::collections::BTreeMap::new()),
            host_exports: Mutex::new(std::collections::BTreeMap::new()),
            ipc_imports: Mutex::new(HashMap::new()),
            channels: Mutex::new(Vec::new()),
            stream_error: Mutex::new(None),
            pending_host_args: Mutex::new(Vec::new()),
        });
        register(&device);
        Ok(device)
    }
}

fn missing_exchange(device: u32) -> DeviceError {
    DeviceError::Unavailable {
        backend: "cann",
        reason: format!(
            "device {device}: SHMEM with more than one PE needs the unique-id exchange over the metadata channel; \
             open the device through TransferEngine::device()"
        ),
    }
}
