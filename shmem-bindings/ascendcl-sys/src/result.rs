//! Result layer: one function per ACL call, grouped by domain, each returning `Result` with the C function's name
//! in the error. Calls take the function table explicitly, so tests can pass a table loaded from a fake library
//! while the backend passes [`crate::api()`].
//!
//! Calls that take only values are safe. Calls that take raw handles or device addresses are `unsafe fn`: the
//! runtime cannot check that the handle is live or the address range is valid, so the caller must.

use core::ffi::{c_char, c_void, CStr};
use std::ptr;

use crate::error::{check, Error};
use crate::sys::*;

/// Process-wide initialisation and teardown (`aclInit`, `aclFinalize`).
pub mod runtime {
    use super::*;

    /// `aclInit`: `config` is an optional JSON configuration file path.
    pub fn init(api: &AclApi, config: Option<&CStr>) -> Result<(), Error> {
        let config = config.map_or(ptr::null(), CStr::as_ptr);
        // SAFETY: `config` is null or a NUL-terminated string that outlives the call.
        check("aclInit", unsafe { api.aclInit(config) })
    }

    /// `aclFinalize`.
    pub fn finalize(api: &AclApi) -> Result<(), Error> {
        // SAFETY: no arguments.
        check("aclFinalize", unsafe { api.aclFinalize() })
    }
}

/// Device selection (`aclrtSetDevice`, `aclrtResetDevice`, `aclrtGetDevice`, `aclrtGetDeviceCount`).
pub mod device {
    use super::*;

    /// `aclrtSetDevice`: selects `device_id` for the calling process and thread.
    pub fn set(api: &AclApi, device_id: i32) -> Result<(), Error> {
        // SAFETY: value argument only.
        check("aclrtSetDevice", unsafe { api.aclrtSetDevice(device_id) })
    }

    /// `aclrtResetDevice`.
    pub fn reset(api: &AclApi, device_id: i32) -> Result<(), Error> {
        // SAFETY: value argument only.
        check("aclrtResetDevice", unsafe { api.aclrtResetDevice(device_id) })
    }

    /// `aclrtGetDevice`: the device bound to the calling thread.
    pub fn current(api: &AclApi) -> Result<i32, Error> {
        let mut device_id = -1;
        // SAFETY: the out-pointer is a live local.
        check("aclrtGetDevice", unsafe { api.aclrtGetDevice(&mut device_id) })?;
        Ok(device_id)
    }

    /// `aclrtGetDeviceCount`.
    pub fn count(api: &AclApi) -> Result<u32, Error> {
        let mut count = 0;
        // SAFETY: the out-pointer is a live local.
        check("aclrtGetDeviceCount", unsafe { api.aclrtGetDeviceCount(&mut count) })?;
        Ok(count)
    }
}

/// Streams.
pub mod stream {
    use super::*;

    /// `aclrtCreateStream`.
    pub fn create(api: &AclApi) -> Result<aclrtStream, Error> {
        let mut stream = ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        check("aclrtCreateStream", unsafe { api.aclrtCreateStream(&mut stream) })?;
        Ok(stream)
    }

    /// `aclrtCreateStreamWithConfig`: `flags` is a combination of the `ACL_STREAM_*` constants.
    pub fn create_with_config(api: &AclApi, priority: u32, flags: u32) -> Result<aclrtStream, Error> {
        let mut stream = ptr::null_mut();
        // SAFETY: the out-pointer is a live local; the others are values.
        check("aclrtCreateStreamWithConfig", unsafe { api.aclrtCreateStreamWithConfig(&mut stream, priority, flags) })?;
        Ok(stream)
    }

    /// `aclrtSynchronizeStream`: waits without a bound; prefer [`synchronize_with_timeout`].
    ///
    /// # Safety
    /// `stream` must be a live stream of the current context.
    pub unsafe fn synchronize(api: &AclApi, stream: aclrtStream) -> Result<(), Error> {
        // SAFETY: the caller guarantees the stream is live.
        check("aclrtSynchronizeStream", unsafe { api.aclrtSynchronizeStream(stream) })
    }

    /// `aclrtSynchronizeStreamWithTimeout`: per the header, `timeout_ms` -1 waits indefinitely and 0 only checks
    /// whether the stream has completed.
    ///
    /// # Safety
    /// `stream` must be a live stream of the current context.
    pub unsafe fn synchronize_with_timeout(api: &AclApi, stream: aclrtStream, timeout_ms: i32) -> Result<(), Error> {
        // SAFETY: the caller guarantees the stream is live.
        check("aclrtSynchronizeStreamWithTimeout", unsafe { api.aclrtSynchronizeStreamWithTimeout(stream, timeout_ms) })
    }

    /// `aclrtDestroyStream`.
    ///
    /// # Safety
    /// `stream` must be a live stream not used afterwards.
    pub unsafe fn destroy(api: &AclApi, stream: aclrtStream) -> Result<(), Error> {
        // SAFETY: the caller guarantees the stream is live and unused afterwards.
        check("aclrtDestroyStream", unsafe { api.aclrtDestroyStream(stream) })
    }
}

/// Notifies (optional symbols).
pub mod notify {
    use super::*;

    /// `aclrtCreateNotify`: `flags` is `ACL_NOTIFY_DEFAULT` or `ACL_NOTIFY_DEVICE_USE_ONLY`.
    pub fn create(api: &AclApi, flags: u64) -> Result<aclrtNotify, Error> {
        let mut notify = ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        check("aclrtCreateNotify", unsafe { api.aclrtCreateNotify(&mut notify, flags)? })?;
        Ok(notify)
    }

    /// `aclrtDestroyNotify`.
    ///
    /// # Safety
    /// `notify` must be live and unused afterwards.
    pub unsafe fn destroy(api: &AclApi, notify: aclrtNotify) -> Result<(), Error> {
        // SAFETY: the caller guarantees the notify is live.
        check("aclrtDestroyNotify", unsafe { api.aclrtDestroyNotify(notify)? })
    }

    /// `aclrtRecordNotify`.
    ///
    /// # Safety
    /// `notify` and `stream` must be live.
    pub unsafe fn record(api: &AclApi, notify: aclrtNotify, stream: aclrtStream) -> Result<(), Error> {
        // SAFETY: the caller guarantees both handles are live.
        check("aclrtRecordNotify", unsafe { api.aclrtRecordNotify(notify, stream)? })
    }

    /// `aclrtWaitAndResetNotify`: `timeout_ms` in milliseconds (the header states only the unit, not what 0 means,
    /// so pass a real bound).
    ///
    /// # Safety
    /// `notify` and `stream` must be live.
    pub unsafe fn wait_and_reset(
        api: &AclApi,
        notify: aclrtNotify,
        stream: aclrtStream,
        timeout_ms: u32,
    ) -> Result<(), Error> {
        // SAFETY: the caller guarantees both handles are live.
        check("aclrtWaitAndResetNotify", unsafe { api.aclrtWaitAndResetNotify(notify, stream, timeout_ms)? })
    }

    /// `aclrtGetNotifyId`.
    ///
    /// # Safety
    /// `notify` must be live.
    pub unsafe fn id(api: &AclApi, notify: aclrtNotify) -> Result<u32, Error> {
        let mut id = 0;
        // SAFETY: the caller guarantees the notify is live; the out-pointer is a live local.
        check("aclrtGetNotifyId", unsafe { api.aclrtGetNotifyId(notify, &mut id)? })?;
        Ok(id)
    }
}

/// Device and pinned host memory, fills and copies.
pub mod memory {
    use super::*;

    /// `aclrtMalloc`.
    pub fn malloc(api: &AclApi, size: usize, policy: aclrtMemMallocPolicy) -> Result<*mut c_void, Error> {
        let mut ptr = ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        check("aclrtMalloc", unsafe { api.aclrtMalloc(&mut ptr, size, policy) })?;
        Ok(ptr)
    }

    /// `aclrtFree`.
    ///
    /// # Safety
    /// `ptr` must come from `aclrtMalloc` and not be used afterwards.
    pub unsafe fn free(api: &AclApi, ptr: *mut c_void) -> Result<(), Error> {
        // SAFETY: the caller guarantees `ptr` is a live allocation.
        check("aclrtFree", unsafe { api.aclrtFree(ptr) })
    }

    /// `aclrtMallocHost`: page-locked host memory.
    pub fn malloc_host(api: &AclApi, size: usize) -> Result<*mut c_void, Error> {
        let mut ptr = ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        check("aclrtMallocHost", unsafe { api.aclrtMallocHost(&mut ptr, size) })?;
        Ok(ptr)
    }

    /// `aclrtFreeHost`.
    ///
    /// # Safety
    /// `ptr` must come from `aclrtMallocHost` and not be used afterwards.
    pub unsafe fn free_host(api: &AclApi, ptr: *mut c_void) -> Result<(), Error> {
        // SAFETY: the caller guarantees `ptr` is a live allocation.
        check("aclrtFreeHost", unsafe { api.aclrtFreeHost(ptr) })
    }

    /// `aclrtMemset`: fills `count` bytes (at most `max_count`) with `value`.
    ///
    /// # Safety
    /// `[ptr, ptr + max_count)` must be memory the runtime may write.
    pub unsafe fn memset(
        api: &AclApi,
        ptr: *mut c_void,
        max_count: usize,
        value: i32,
        count: usize,
    ) -> Result<(), Error> {
        // SAFETY: the caller guarantees the range.
        check("aclrtMemset", unsafe { api.aclrtMemset(ptr, max_count, value, count) })
    }

    /// `aclrtMemcpy`: a synchronous copy of `count` bytes into a destination of `dest_max` bytes.
    ///
    /// # Safety
    /// Both ranges must be valid for `kind` and must not be freed during the call.
    pub unsafe fn memcpy(
        api: &AclApi,
        dst: *mut c_void,
        dest_max: usize,
        src: *const c_void,
        count: usize,
        kind: aclrtMemcpyKind,
    ) -> Result<(), Error> {
        // SAFETY: the caller guarantees both ranges.
        check("aclrtMemcpy", unsafe { api.aclrtMemcpy(dst, dest_max, src, count, kind) })
    }

    /// `aclrtMemcpyAsync`: queued on `stream`.
    ///
    /// # Safety
    /// Both ranges must be valid for `kind` and stay allocated until the stream has passed the copy; `stream`
    /// must be live.
    pub unsafe fn memcpy_async(
        api: &AclApi,
        dst: *mut c_void,
        dest_max: usize,
        src: *const c_void,
        count: usize,
        kind: aclrtMemcpyKind,
        stream: aclrtStream,
    ) -> Result<(), Error> {
        // SAFETY: the caller guarantees both ranges and the stream.
        check("aclrtMemcpyAsync", unsafe { api.aclrtMemcpyAsync(dst, dest_max, src, count, kind, stream) })
    }
}

/// Virtual memory management: physical allocations, reserved ranges, mappings, export and import.
pub mod vmm {
    use super::*;

    /// `aclrtMallocPhysical`.
    pub fn malloc_physical(
        api: &AclApi,
        size: usize,
        prop: &aclrtPhysicalMemProp,
        flags: u64,
    ) -> Result<aclrtDrvMemHandle, Error> {
        let mut handle = ptr::null_mut();
        // SAFETY: `prop` is a live reference; the out-pointer is a live local.
        check("aclrtMallocPhysical", unsafe { api.aclrtMallocPhysical(&mut handle, size, prop, flags)? })?;
        Ok(handle)
    }

    /// `aclrtFreePhysical`.
    ///
    /// # Safety
    /// `handle` must be live, unmapped and unused afterwards.
    pub unsafe fn free_physical(api: &AclApi, handle: aclrtDrvMemHandle) -> Result<(), Error> {
        // SAFETY: the caller guarantees the handle.
        check("aclrtFreePhysical", unsafe { api.aclrtFreePhysical(handle)? })
    }

    /// `aclrtMemGetAllocationGranularity`.
    pub fn allocation_granularity(
        api: &AclApi,
        prop: &aclrtPhysicalMemProp,
        option: aclrtMemGranularityOptions,
    ) -> Result<usize, Error> {
        let mut prop = *prop;
        let mut granularity = 0;
        // SAFETY: both pointers are live locals (the C prototype takes a non-const pointer, so a copy is passed).
        check("aclrtMemGetAllocationGranularity", unsafe {
            api.aclrtMemGetAllocationGranularity(&mut prop, option, &mut granularity)?
        })?;
        Ok(granularity)
    }

    /// `aclrtReserveMemAddress`: reserves `size` bytes of device virtual addresses, preferably at
    /// `expected_address` (0: anywhere).
    pub fn reserve_address(
        api: &AclApi,
        size: usize,
        alignment: usize,
        expected_address: usize,
        flags: u64,
    ) -> Result<*mut c_void, Error> {
        let mut address = ptr::null_mut();
        let expect = expected_address as *mut c_void;
        // SAFETY: `expect` is only a placement hint the runtime validates, never dereferenced by us; the
        // out-pointer is a live local.
        check("aclrtReserveMemAddress", unsafe {
            api.aclrtReserveMemAddress(&mut address, size, alignment, expect, flags)?
        })?;
        Ok(address)
    }

    /// `aclrtReleaseMemAddress`.
    ///
    /// # Safety
    /// `address` must be a reserved range with nothing mapped, unused afterwards.
    pub unsafe fn release_address(api: &AclApi, address: *mut c_void) -> Result<(), Error> {
        // SAFETY: the caller guarantees the range.
        check("aclrtReleaseMemAddress", unsafe { api.aclrtReleaseMemAddress(address)? })
    }

    /// `aclrtMapMem`.
    ///
    /// # Safety
    /// `address` must lie in a reserved range and `handle` be live.
    pub unsafe fn map(
        api: &AclApi,
        address: *mut c_void,
        size: usize,
        offset: usize,
        handle: aclrtDrvMemHandle,
        flags: u64,
    ) -> Result<(), Error> {
        // SAFETY: the caller guarantees the range and the handle.
        check("aclrtMapMem", unsafe { api.aclrtMapMem(address, size, offset, handle, flags)? })
    }

    /// `aclrtUnmapMem`.
    ///
    /// # Safety
    /// `address` must be mapped and no longer accessed.
    pub unsafe fn unmap(api: &AclApi, address: *mut c_void) -> Result<(), Error> {
        // SAFETY: the caller guarantees the mapping.
        check("aclrtUnmapMem", unsafe { api.aclrtUnmapMem(address)? })
    }

    /// `aclrtMemSetAccess`.
    ///
    /// # Safety
    /// `[address, address + size)` must be mapped.
    pub unsafe fn set_access(
        api: &AclApi,
        address: *mut c_void,
        size: usize,
        descs: &[aclrtMemAccessDesc],
    ) -> Result<(), Error> {
        let mut descs = descs.to_vec();
        // SAFETY: the caller guarantees the range; `descs` is a live local array of `len` entries (copied because the
        // C prototype takes a non-const pointer).
        check("aclrtMemSetAccess", unsafe { api.aclrtMemSetAccess(address, size, descs.as_mut_ptr(), descs.len())? })
    }

    /// `aclrtMemExportToShareableHandle`: a 64-bit handle another process imports.
    ///
    /// # Safety
    /// `handle` must be live.
    pub unsafe fn export_to_shareable_handle(
        api: &AclApi,
        handle: aclrtDrvMemHandle,
        handle_type: aclrtMemHandleType,
        flags: u64,
    ) -> Result<u64, Error> {
        let mut shareable = 0;
        // SAFETY: the caller guarantees the handle; the out-pointer is a live local.
        check("aclrtMemExportToShareableHandle", unsafe {
            api.aclrtMemExportToShareableHandle(handle, handle_type, flags, &mut shareable)?
        })?;
        Ok(shareable)
    }

    /// `aclrtMemExportToShareableHandleV2` with `ACL_MEM_SHARE_HANDLE_TYPE_FABRIC`: the 128-byte fabric handle.
    ///
    /// # Safety
    /// `handle` must be live.
    pub unsafe fn export_fabric_handle(
        api: &AclApi,
        handle: aclrtDrvMemHandle,
        flags: u64,
    ) -> Result<aclrtMemFabricHandle, Error> {
        let mut fabric = aclrtMemFabricHandle { data: [0; 128] };
        // SAFETY: the caller guarantees the handle; the output is a live 128-byte local, the size the fabric type
        // writes.
        check("aclrtMemExportToShareableHandleV2", unsafe {
            api.aclrtMemExportToShareableHandleV2(
                handle,
                flags,
                ACL_MEM_SHARE_HANDLE_TYPE_FABRIC,
                (&mut fabric as *mut aclrtMemFabricHandle).cast(),
            )?
        })?;
        Ok(fabric)
    }

    /// `aclrtMemImportFromShareableHandle`.
    pub fn import_from_shareable_handle(
        api: &AclApi,
        shareable: u64,
        device_id: i32,
    ) -> Result<aclrtDrvMemHandle, Error> {
        let mut handle = ptr::null_mut();
        // SAFETY: value arguments and a live out-pointer; the runtime validates the shareable handle.
        check("aclrtMemImportFromShareableHandle", unsafe {
            api.aclrtMemImportFromShareableHandle(shareable, device_id, &mut handle)?
        })?;
        Ok(handle)
    }

    /// `aclrtMemImportFromShareableHandleV2` with a fabric handle.
    pub fn import_fabric_handle(
        api: &AclApi,
        fabric: &aclrtMemFabricHandle,
        flags: u64,
    ) -> Result<aclrtDrvMemHandle, Error> {
        let mut fabric = *fabric;
        let mut handle = ptr::null_mut();
        // SAFETY: the fabric handle is a live local copy (the prototype takes `void *`); the out-pointer is live.
        check("aclrtMemImportFromShareableHandleV2", unsafe {
            api.aclrtMemImportFromShareableHandleV2(
                (&mut fabric as *mut aclrtMemFabricHandle).cast(),
                ACL_MEM_SHARE_HANDLE_TYPE_FABRIC,
                flags,
                &mut handle,
            )?
        })?;
        Ok(handle)
    }
}

/// IPC keys for device memory shared between processes (optional symbols).
pub mod ipc {
    use super::*;

    /// The key buffer size passed to exports (docs/hardware.md section 7 notes Mooncake's 65-byte IPC keys).
    pub const KEY_CAPACITY: usize = 128;

    /// `aclrtIpcMemGetExportKey`: the key as bytes up to (not including) its NUL.
    ///
    /// # Safety
    /// `[ptr, ptr + size)` must be a live device allocation.
    pub unsafe fn get_export_key(api: &AclApi, ptr: *mut c_void, size: usize, flags: u64) -> Result<Vec<u8>, Error> {
        let mut key = [0 as c_char; KEY_CAPACITY];
        // SAFETY: the caller guarantees the allocation; `key` is a live buffer of the length passed.
        check("aclrtIpcMemGetExportKey", unsafe {
            api.aclrtIpcMemGetExportKey(ptr, size, key.as_mut_ptr(), key.len(), flags)?
        })?;
        let bytes: Vec<u8> = key.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
        if bytes.len() == KEY_CAPACITY {
            return Err(Error::InvalidArgument {
                function: "aclrtIpcMemGetExportKey",
                reason: "key not NUL-terminated".into(),
            });
        }
        Ok(bytes)
    }

    /// `aclrtIpcMemImportByKey`.
    pub fn import_by_key(api: &AclApi, key: &CStr, flags: u64) -> Result<*mut c_void, Error> {
        let mut ptr = ptr::null_mut();
        // SAFETY: `key` is NUL-terminated and outlives the call; the out-pointer is a live local.
        check("aclrtIpcMemImportByKey", unsafe { api.aclrtIpcMemImportByKey(&mut ptr, key.as_ptr(), flags)? })?;
        Ok(ptr)
    }

    /// `aclrtIpcMemClose`.
    ///
    /// # Safety
    /// Memory imported by `key` must no longer be accessed.
    pub unsafe fn close(api: &AclApi, key: &CStr) -> Result<(), Error> {
        // SAFETY: `key` is NUL-terminated; the caller guarantees the imported memory is unused.
        check("aclrtIpcMemClose", unsafe { api.aclrtIpcMemClose(key.as_ptr())? })
    }
}

/// Loading device binaries and launching kernels (optional symbols).
pub mod kernel {
    use super::*;

    /// `aclrtBinaryLoadFromData`: loads a device object from memory.
    ///
    /// # Safety
    /// The header does not say whether the runtime copies `data` or keeps pointing at it, so `data` must stay
    /// alive and unchanged until the binary is unloaded; `options` must describe valid options.
    pub unsafe fn load_from_data(
        api: &AclApi,
        data: &[u8],
        options: Option<&aclrtBinaryLoadOptions>,
    ) -> Result<aclrtBinHandle, Error> {
        let options = options.map_or(ptr::null(), |options| options as *const aclrtBinaryLoadOptions);
        let mut handle = ptr::null_mut();
        // SAFETY: `data` and `options` are live for the call (and, per the caller, `data` until the unload); the
        // out-pointer is a live local.
        check("aclrtBinaryLoadFromData", unsafe {
            api.aclrtBinaryLoadFromData(data.as_ptr().cast(), data.len(), options, &mut handle)?
        })?;
        Ok(handle)
    }

    /// `aclrtBinaryGetFunction`.
    ///
    /// # Safety
    /// `binary` must be a live loaded binary.
    pub unsafe fn get_function(api: &AclApi, binary: aclrtBinHandle, name: &CStr) -> Result<aclrtFuncHandle, Error> {
        let mut function = ptr::null_mut();
        // SAFETY: the caller guarantees the binary; `name` is NUL-terminated; out-pointer live.
        check("aclrtBinaryGetFunction", unsafe { api.aclrtBinaryGetFunction(binary, name.as_ptr(), &mut function)? })?;
        Ok(function)
    }

    /// `aclrtLaunchKernel`: `args` is a device buffer holding the kernel arguments.
    ///
    /// # Safety
    /// `function` and `stream` must be live, `args` must point to `args_size` bytes of device memory laid out as the
    /// kernel expects, and every address in them must stay valid until the kernel finishes.
    pub unsafe fn launch(
        api: &AclApi,
        function: aclrtFuncHandle,
        num_blocks: u32,
        args: *const c_void,
        args_size: usize,
        stream: aclrtStream,
    ) -> Result<(), Error> {
        // SAFETY: the caller guarantees every argument.
        check("aclrtLaunchKernel", unsafe { api.aclrtLaunchKernel(function, num_blocks, args, args_size, stream)? })
    }

    /// `aclrtLaunchKernelWithHostArgs`: the kernel arguments are passed from host memory.
    ///
    /// # Safety
    /// As [`launch`]; `config` attributes must be valid for the kernel. The header does not say when the runtime
    /// has finished reading `host_args`, so keep it unchanged until the stream has passed the launch.
    pub unsafe fn launch_with_host_args(
        api: &AclApi,
        function: aclrtFuncHandle,
        num_blocks: u32,
        stream: aclrtStream,
        config: Option<&mut aclrtLaunchKernelCfg>,
        host_args: &mut [u8],
    ) -> Result<(), Error> {
        let config = config.map_or(ptr::null_mut(), |config| config as *mut aclrtLaunchKernelCfg);
        // SAFETY: the caller guarantees the handles and argument layout; `host_args` is live for the call.
        check("aclrtLaunchKernelWithHostArgs", unsafe {
            api.aclrtLaunchKernelWithHostArgs(
                function,
                num_blocks,
                stream,
                config,
                host_args.as_mut_ptr().cast(),
                host_args.len(),
                ptr::null_mut(),
                0,
            )?
        })
    }

    /// `aclrtBinaryUnLoad`.
    ///
    /// # Safety
    /// `binary` must be live, with no kernel of it still running or launched afterwards.
    pub unsafe fn unload(api: &AclApi, binary: aclrtBinHandle) -> Result<(), Error> {
        // SAFETY: the caller guarantees the binary.
        check("aclrtBinaryUnLoad", unsafe { api.aclrtBinaryUnLoad(binary)? })
    }
}

/// Version queries.
pub mod version {
    use super::*;

    /// `aclrtGetVersion`: (major, minor, patch) of the ACL interface.
    pub fn runtime(api: &AclApi) -> Result<(i32, i32, i32), Error> {
        let (mut major, mut minor, mut patch) = (0, 0, 0);
        // SAFETY: three live out-pointers.
        check("aclrtGetVersion", unsafe { api.aclrtGetVersion(&mut major, &mut minor, &mut patch) })?;
        Ok((major, minor, patch))
    }

    /// `aclsysGetCANNVersion`: the full version string of one package (optional symbol).
    pub fn package(api: &AclApi, package: aclCANNPackageName) -> Result<String, Error> {
        // SAFETY: the struct is plain bytes; all-zero is a valid (empty) value.
        let mut version: aclCANNPackageVersion = unsafe { core::mem::zeroed() };
        // SAFETY: a live out-pointer to a struct of the header's layout (checked by the ABI test).
        check("aclsysGetCANNVersion", unsafe { api.aclsysGetCANNVersion(package, &mut version)? })?;
        let bytes: Vec<u8> = version.version.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Registering host memory for device access (optional symbols).
pub mod host {
    use super::*;

    /// `aclrtHostRegister`: returns the device address of the host range.
    ///
    /// # Safety
    /// `[ptr, ptr + size)` must be live host memory that stays allocated until unregistered.
    pub unsafe fn register(
        api: &AclApi,
        ptr: *mut c_void,
        size: u64,
        kind: aclrtHostRegisterType,
    ) -> Result<*mut c_void, Error> {
        let mut device = ptr::null_mut();
        // SAFETY: the caller guarantees the range; the out-pointer is a live local.
        check("aclrtHostRegister", unsafe { api.aclrtHostRegister(ptr, size, kind, &mut device)? })?;
        Ok(device)
    }

    /// `aclrtHostUnregister`.
    ///
    /// # Safety
    /// `ptr` must be registered and its device address no longer used.
    pub unsafe fn unregister(api: &AclApi, ptr: *mut c_void) -> Result<(), Error> {
        // SAFETY: the caller guarantees the registration.
        check("aclrtHostUnregister", unsafe { api.aclrtHostUnregister(ptr)? })
    }
}
