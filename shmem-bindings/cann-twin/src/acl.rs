//! The exported ACL entry points, with the prototypes of `ascendcl_sys::sys::AclApi`. Each validates its arguments
//! in the vendor's order where it is known (see the crate docs for the sources), runs under the runtime lock (and
//! the device address space's lock, read for copies, write for allocation and mapping), and catches any panic, returning `ACL_ERROR_RT_INTERNAL_ERROR` instead of unwinding into C.

use core::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::Duration;

use ascendcl_sys::sys::*;

use crate::memory::{page, Physical, GRANULARITY, GRANULARITY_1G};
use crate::runtime::runtime;
use crate::space::{device_segments, is_device_address, perform_copy, plan_copy, space, with_space_mut};
use crate::stream::{Stream, Task};
pub use crate::vmm_share::{
    aclrtIpcMemClose, aclrtIpcMemGetExportKey, aclrtIpcMemImportByKey, aclrtMemExportToShareableHandle,
    aclrtMemExportToShareableHandleV2, aclrtMemImportFromShareableHandle, aclrtMemImportFromShareableHandleV2,
};

pub use crate::{RUNTIME_NAME, TWIN_VERSION, TWIN_VERSION_STRING};

pub use crate::acl_compat::*;
use crate::entry::{acl_entry, not_null};

fn positive(size: usize) -> Result<(), aclError> {
    if size == 0 {
        Err(ACL_ERROR_INVALID_PARAM)
    } else {
        Ok(())
    }
}

/// Shuts streams down without the runtime lock (their workers take it).
fn drain(streams: Vec<Arc<Stream>>) {
    for stream in streams {
        stream.shut_down();
    }
}

acl_entry! {
    /// Initialises the runtime. `config_path` may be null or empty; otherwise the file must exist (its contents
    /// are not interpreted). A second call before `aclFinalize` returns `ACL_ERROR_REPEAT_INITIALIZE`.
    fn aclInit(config_path: *const c_char) {
        if !config_path.is_null() {
            // SAFETY: a non-null `config_path` is a NUL-terminated string (C contract).
            let path = unsafe { core::ffi::CStr::from_ptr(config_path) };
            if !path.is_empty() {
                use std::os::unix::ffi::OsStrExt;
                let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
                if !path.is_file() {
                    return Err(ACL_ERROR_INVALID_FILE);
                }
            }
        }
        runtime().init()
    }
}

acl_entry! {
    /// Finalises the runtime: every stream is drained and destroyed, every device reset.
    fn aclFinalize() {
        let streams = runtime().finalize()?;
        drain(streams);
        Ok(())
    }
}

acl_entry! {
    /// Makes `device_id` the calling thread's current device (counted: each call needs an `aclrtResetDevice`).
    fn aclrtSetDevice(device_id: i32) {
        runtime().set_device(device_id)
    }
}

acl_entry! {
    /// Drops one `aclrtSetDevice` reference; the last releases the device's streams and `aclrtMalloc` memory.
    fn aclrtResetDevice(device_id: i32) {
        let streams = runtime().reset_device(device_id)?;
        drain(streams);
        Ok(())
    }
}

acl_entry! {
    /// The calling thread's current device; `ACL_ERROR_RT_CONTEXT_NULL` when none is set.
    fn aclrtGetDevice(device_id: *mut i32) {
        not_null(device_id)?;
        let device = runtime().current_device()?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { device_id.write(device) };
        Ok(())
    }
}

acl_entry! {
    /// The number of devices: `AIV_TWIN_DEVICES` (1 to 1024) when set, else 8.
    fn aclrtGetDeviceCount(count: *mut u32) {
        not_null(count)?;
        let runtime = runtime();
        runtime.ready()?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { count.write(runtime.device_count) };
        Ok(())
    }
}

acl_entry! {
    /// This runtime's version, [`TWIN_VERSION`]; needs no initialisation.
    fn aclrtGetVersion(major: *mut i32, minor: *mut i32, patch: *mut i32) {
        not_null(major)?;
        not_null(minor)?;
        not_null(patch)?;
        // SAFETY: all three checked non-null; writable by the C contract.
        unsafe {
            major.write(TWIN_VERSION.0);
            minor.write(TWIN_VERSION.1);
            patch.write(TWIN_VERSION.2);
        }
        Ok(())
    }
}

fn c_text<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (slot, byte) in out.iter_mut().zip(text.bytes().take(N - 1)) {
        *slot = byte as c_char;
    }
    out
}

acl_entry! {
    /// The twin's version for `ACL_PKG_NAME_CANN` and `ACL_PKG_NAME_RUNTIME` ([`TWIN_VERSION_STRING`]);
    /// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` for every other package, which the twin does not model.
    fn aclsysGetCANNVersion(name: aclCANNPackageName, version: *mut aclCANNPackageVersion) {
        not_null(version)?;
        if name != ACL_PKG_NAME_CANN && name != ACL_PKG_NAME_RUNTIME {
            return Err(ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
        }
        let (major, minor, patch) = TWIN_VERSION;
        let filled = aclCANNPackageVersion {
            version: c_text(TWIN_VERSION_STRING),
            majorVersion: c_text(&major.to_string()),
            minorVersion: c_text(&minor.to_string()),
            releaseVersion: c_text(&patch.to_string()),
            patchVersion: c_text(""),
            reserved: c_text(""),
        };
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { version.write(filled) };
        Ok(())
    }
}

acl_entry! {
    /// A stream of the current device.
    fn aclrtCreateStream(stream: *mut aclrtStream) {
        create_stream(stream, 0, 0)
    }
}

acl_entry! {
    /// A stream of the current device; `flag` must be a combination of the `ACL_STREAM_*` flags (recorded, not
    /// modelled), `priority` is accepted as is.
    fn aclrtCreateStreamWithConfig(stream: *mut aclrtStream, priority: u32, flag: u32) {
        create_stream(stream, priority, flag)
    }
}

fn create_stream(stream: *mut aclrtStream, _priority: u32, flag: u32) -> Result<(), aclError> {
    not_null(stream)?;
    const KNOWN: u64 = ACL_STREAM_FAST_LAUNCH
        | ACL_STREAM_FAST_SYNC
        | ACL_STREAM_PERSISTENT
        | ACL_STREAM_HUGE
        | ACL_STREAM_CPU_SCHEDULE
        | ACL_STREAM_DEVICE_USE_ONLY;
    if u64::from(flag) & !KNOWN != 0 {
        return Err(ACL_ERROR_INVALID_PARAM);
    }
    let mut runtime = runtime();
    let device = runtime.current_device()?;
    let created = Stream::spawn(device, crate::runtime::run_task)?;
    let handle = Arc::as_ptr(&created) as usize;
    runtime.streams.insert(handle, created);
    // SAFETY: checked non-null; writable by the C contract.
    unsafe { stream.write(handle as aclrtStream) };
    Ok(())
}

fn synchronize(stream: aclrtStream, timeout: Option<Duration>) -> Result<(), aclError> {
    let stream = runtime().stream(stream as usize)?;
    match stream.synchronize(timeout) {
        ACL_SUCCESS => {
            crate::evidence::note_stream_sync();
            Ok(())
        }
        code => Err(code),
    }
}

acl_entry! {
    /// Waits for every task submitted to `stream` (null: the current device's default stream) and returns the
    /// first failure among them.
    fn aclrtSynchronizeStream(stream: aclrtStream) {
        synchronize(stream, None)
    }
}

acl_entry! {
    /// As `aclrtSynchronizeStream`, waiting at most `timeout` ms (-1: without limit, 0: only checks);
    /// `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT` when the work is not done in time.
    fn aclrtSynchronizeStreamWithTimeout(stream: aclrtStream, timeout: i32) {
        let limit = match timeout {
            -1 => None,
            ms if ms >= 0 => Some(Duration::from_millis(ms as u64)),
            _ => return Err(ACL_ERROR_INVALID_PARAM),
        };
        synchronize(stream, limit)
    }
}

acl_entry! {
    /// Destroys a created stream after its queued tasks have run.
    fn aclrtDestroyStream(stream: aclrtStream) {
        not_null(stream)?;
        let removed = {
            let mut runtime = runtime();
            runtime.ready()?;
            runtime.streams.remove(&(stream as usize)).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?
        };
        removed.shut_down();
        Ok(())
    }
}

acl_entry! {
    /// `size` bytes of device memory (HBM) on the current device, at a device address the Host cannot
    /// dereference. Contents are unspecified (the twin's are zero; the NPU's need not be).
    fn aclrtMalloc(dev_ptr: *mut *mut c_void, size: usize, policy: aclrtMemMallocPolicy) {
        not_null(dev_ptr)?;
        positive(size)?;
        let _ = policy;
        let runtime = runtime();
        let device = runtime.current_device()?;
        let address = with_space_mut(|space| space.malloc(size, device))?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { dev_ptr.write(address as *mut c_void) };
        Ok(())
    }
}

acl_entry! {
    /// Frees what `aclrtMalloc` returned (the exact address).
    fn aclrtFree(dev_ptr: *mut c_void) {
        not_null(dev_ptr)?;
        let runtime = runtime();
        runtime.ready()?;
        if !is_device_address(dev_ptr as usize) {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        with_space_mut(|space| space.free(dev_ptr as usize))
    }
}

acl_entry! {
    /// `size` bytes of page-aligned Host memory (the NPU's is pinned; the twin's is a shared mapping of a memfd of
    /// its own, so that an IPC key of a Host window onto it reaches the same pages from another process: see
    /// `aclrtIpcMemGetExportKey`).
    fn aclrtMallocHost(host_ptr: *mut *mut c_void, size: usize) {
        not_null(host_ptr)?;
        positive(size)?;
        let mut runtime = runtime();
        runtime.current_device()?;
        let page = page();
        let length = size.checked_add(page - 1).ok_or(ACL_ERROR_RT_MEMORY_ALLOCATION)? / page * page;
        let fd = crate::memory::memfd(c"cann-twin-host", length)?;
        // SAFETY: a new shared mapping of the whole fresh memfd, at an address the kernel picks.
        let address = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
        }
        runtime.host.insert(address as usize, crate::runtime::HostAllocation { length, fd: Arc::new(fd) });
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { host_ptr.write(address) };
        Ok(())
    }
}

acl_entry! {
    /// Frees what `aclrtMallocHost` returned (the exact address); IPC keys of Host windows onto it stop being
    /// served (importers keep their mappings of the pages).
    fn aclrtFreeHost(host_ptr: *mut c_void) {
        not_null(host_ptr)?;
        let mut runtime = runtime();
        runtime.ready()?;
        let allocation = runtime.host.remove(&(host_ptr as usize)).ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        crate::vmm_share::heap_released(host_ptr as usize);
        // SAFETY: the mapping `aclrtMallocHost` made, of that length, now forgotten by the runtime.
        unsafe { libc::munmap(host_ptr, allocation.length) };
        Ok(())
    }
}

acl_entry! {
    /// Sets `count` bytes of device memory to `value`'s low byte; `count` must not exceed `max_count`.
    fn aclrtMemset(dev_ptr: *mut c_void, max_count: usize, value: i32, count: usize) {
        if count == 0 {
            return Ok(());
        }
        not_null(dev_ptr)?;
        if max_count < count {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        runtime().ready()?;
        let space = space();
        for segment in device_segments(space.as_ref(), dev_ptr as usize, count, true)?.iter() {
            // SAFETY: a translated device segment, valid while the space's read lock is held.
            unsafe { core::ptr::write_bytes(segment.ptr, value as u8, segment.len) };
        }
        Ok(())
    }
}

acl_entry! {
    /// A synchronous copy; `kind` must match where the pointers are (or be `ACL_MEMCPY_DEFAULT`).
    fn aclrtMemcpy(dst: *mut c_void, dest_max: usize, src: *const c_void, count: usize, kind: aclrtMemcpyKind) {
        if count == 0 {
            return Ok(());
        }
        not_null(dst)?;
        not_null(src)?;
        // The calling thread's current device, if any: the device whose copy engine the copy is charged to.
        let current = {
            let runtime = runtime();
            runtime.ready()?;
            runtime.current_device().ok()
        };
        let space = space();
        let (to, from) = plan_copy(space.as_ref(), dst as usize, dest_max, src as usize, count, kind)?;
        // Occupancy: a copy with device memory on a side is the device's copy work (docs/occupancy.md).
        let reaches_device =
            space.as_ref().is_some_and(|space| space.contains(dst as usize) || space.contains(src as usize));
        let profiled = crate::prof::started();
        crate::occupancy::timed_sync_copy(current.filter(|_| reaches_device), count, || {
            // SAFETY: device segments translated under the read lock still held; Host segments valid by the C
            // contract.
            unsafe { perform_copy(&to, &from) };
            // SAFETY: the copy just wrote `count` bytes at `dst`.
            unsafe { crate::space::host_observed(space.as_ref(), dst as usize, src as usize, count) };
        });
        crate::evidence::note_sync_copy(count);
        if reaches_device {
            // A copy task of the calling thread's device (stream 0: no stream of the caller's) for the profiler.
            crate::prof::ran(current.unwrap_or(0), 0, crate::prof::TaskType::Memcpy, profiled);
        }
        Ok(())
    }
}

acl_entry! {
    /// Enqueues a copy on `stream` (null: the current device's default stream) and returns; the copy is done
    /// only once the stream is synchronised. Arguments are checked now and again when the copy runs. A
    /// device-to-device copy needs 64-byte-aligned addresses.
    fn aclrtMemcpyAsync(
        dst: *mut c_void,
        dest_max: usize,
        src: *const c_void,
        count: usize,
        kind: aclrtMemcpyKind,
        stream: aclrtStream,
    ) {
        if count == 0 {
            return Ok(());
        }
        not_null(dst)?;
        not_null(src)?;
        let mut runtime = runtime();
        runtime.ready()?;
        let (dst, src) = (dst as usize, src as usize);
        {
            let guard = space();
            let space = guard.as_ref();
            plan_copy(space, dst, dest_max, src, count, kind)?;
            let device = |address: usize| space.is_some_and(|space| space.contains(address));
            if device(dst) && device(src) && (dst % 64 != 0 || src % 64 != 0) {
                return Err(ACL_ERROR_RT_ADDR_UNALIGNED);
            }
        }
        let target = runtime.stream(stream as usize)?;
        drop(runtime);
        let device = target.device;
        let by = crate::provenance::thread_writer();
        target.submit(Task::Copy { device, dst, dest_max, src, count, kind, by });
        crate::evidence::note_stream_copy(count);
        Ok(())
    }
}

acl_entry! {
    /// Gives `size` bytes of Host memory at `ptr` a device address (written to `dev_ptr`), distinct from `ptr`,
    /// through which the device reaches the same pages. `ACL_HOST_REGISTER_READONLY` makes the window read-only
    /// for the device; `ACL_HOST_REGISTER_IOMEMORY` is not supported.
    fn aclrtHostRegister(ptr: *mut c_void, size: u64, kind: aclrtHostRegisterType, dev_ptr: *mut *mut c_void) {
        not_null(ptr)?;
        not_null(dev_ptr)?;
        let size = usize::try_from(size).map_err(|_| ACL_ERROR_INVALID_PARAM)?;
        positive(size)?;
        let readonly = match kind {
            ACL_HOST_REGISTER_MAPPED => false,
            ACL_HOST_REGISTER_READONLY => true,
            ACL_HOST_REGISTER_IOMEMORY => return Err(ACL_ERROR_RT_FEATURE_NOT_SUPPORT),
            _ => return Err(ACL_ERROR_INVALID_PARAM),
        };
        let runtime = runtime();
        runtime.current_device()?;
        let address = with_space_mut(|space| space.register(ptr as usize, size, readonly))?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { dev_ptr.write(address as *mut c_void) };
        Ok(())
    }
}

acl_entry! {
    /// Removes the device window of Host memory registered at exactly `ptr`.
    fn aclrtHostUnregister(ptr: *mut c_void) {
        not_null(ptr)?;
        let runtime = runtime();
        runtime.ready()?;
        with_space_mut(|space| space.unregister(ptr as usize))
    }
}

fn granularity_of(prop: &aclrtPhysicalMemProp) -> Result<usize, aclError> {
    match prop.memAttr {
        ACL_HBM_MEM_HUGE1G | ACL_HBM_MEM_P2P_HUGE1G | ACL_MEM_HUGE1G | ACL_MEM_P2P_HUGE1G => Ok(GRANULARITY_1G),
        attr if attr.name().is_some() => Ok(GRANULARITY),
        _ => Err(ACL_ERROR_INVALID_PARAM),
    }
}

fn check_physical_prop(prop: &aclrtPhysicalMemProp) -> Result<(), aclError> {
    if prop.handleType != ACL_MEM_HANDLE_TYPE_NONE || prop.allocationType != ACL_MEM_ALLOCATION_TYPE_PINNED {
        return Err(ACL_ERROR_INVALID_PARAM);
    }
    match prop.location.r#type {
        ACL_MEM_LOCATION_TYPE_DEVICE => {}
        ACL_MEM_LOCATION_TYPE_HOST | ACL_MEM_LOCATION_TYPE_HOST_NUMA => return Err(ACL_ERROR_RT_FEATURE_NOT_SUPPORT),
        _ => return Err(ACL_ERROR_INVALID_PARAM),
    }
    let ddr = [ACL_DDR_MEM_HUGE, ACL_DDR_MEM_NORMAL, ACL_DDR_MEM_P2P_HUGE, ACL_DDR_MEM_P2P_NORMAL];
    if ddr.contains(&prop.memAttr) {
        return Err(ACL_ERROR_INVALID_PARAM);
    }
    granularity_of(prop).map(|_| ())
}

acl_entry! {
    /// The allocation granularity for `prop`: 2 MiB, or 1 GiB for the 1 GiB-page attributes.
    fn aclrtMemGetAllocationGranularity(
        prop: *mut aclrtPhysicalMemProp,
        option: aclrtMemGranularityOptions,
        granularity: *mut usize,
    ) {
        not_null(prop)?;
        not_null(granularity)?;
        // SAFETY: checked non-null; readable by the C contract.
        let prop = unsafe { prop.read() };
        if option != ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM && option != ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        runtime().ready()?;
        let value = granularity_of(&prop)?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { granularity.write(value) };
        Ok(())
    }
}

acl_entry! {
    /// `size` bytes (a multiple of the granularity) of physical device memory on `prop.location.id`.
    fn aclrtMallocPhysical(handle: *mut aclrtDrvMemHandle, size: usize, prop: *const aclrtPhysicalMemProp, flags: u64) {
        not_null(handle)?;
        not_null(prop)?;
        positive(size)?;
        if flags != 0 {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        // SAFETY: checked non-null; readable by the C contract.
        let prop = unsafe { prop.read() };
        check_physical_prop(&prop)?;
        if size % granularity_of(&prop)? != 0 {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let mut runtime = runtime();
        runtime.current_device()?;
        let device = i32::try_from(prop.location.id).map_err(|_| ACL_ERROR_RT_INVALID_DEVICEID)?;
        runtime.check_device_id(device)?;
        let physical = Physical::new(size)?;
        let value = runtime.new_handle();
        runtime.physical.insert(value, physical);
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { handle.write(value as aclrtDrvMemHandle) };
        Ok(())
    }
}

acl_entry! {
    /// Frees a physical allocation; it must no longer be mapped.
    fn aclrtFreePhysical(handle: aclrtDrvMemHandle) {
        not_null(handle)?;
        let mut runtime = runtime();
        runtime.ready()?;
        let physical = runtime.physical.get(&(handle as usize)).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
        if physical.mapped > 0 {
            return Err(ACL_ERROR_RT_MEMORY_FREE);
        }
        runtime.physical.remove(&(handle as usize));
        crate::vmm_share::forget_handle(handle as usize);
        Ok(())
    }
}

acl_entry! {
    /// Reserves `size` bytes (a multiple of 2 MiB) of device addresses; `expect_ptr` must be null, `flags` 0 or 1.
    fn aclrtReserveMemAddress(vir_ptr: *mut *mut c_void, size: usize, alignment: usize, expect_ptr: *mut c_void, flags: u64) {
        not_null(vir_ptr)?;
        positive(size)?;
        if flags > 1 || !expect_ptr.is_null() || size % GRANULARITY != 0 {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let align = match alignment {
            0 => GRANULARITY,
            a if a.is_power_of_two() => a.max(GRANULARITY),
            _ => return Err(ACL_ERROR_INVALID_PARAM),
        };
        let runtime = runtime();
        runtime.current_device()?;
        let address = with_space_mut(|space| space.reserve(size, align))?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { vir_ptr.write(address as *mut c_void) };
        Ok(())
    }
}

acl_entry! {
    /// Releases a reservation (its start address); nothing may still be mapped in it.
    fn aclrtReleaseMemAddress(vir_ptr: *mut c_void) {
        not_null(vir_ptr)?;
        let runtime = runtime();
        runtime.ready()?;
        if !is_device_address(vir_ptr as usize) {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        with_space_mut(|space| space.release(vir_ptr as usize))
    }
}

acl_entry! {
    /// Maps `[offset, offset + size)` of a physical allocation at `vir_ptr` inside a reservation (granularity-aligned,
    /// not overlapping another mapping). Mapped memory is readable and writable by the device until
    /// `aclrtMemSetAccess` says otherwise.
    fn aclrtMapMem(vir_ptr: *mut c_void, size: usize, offset: usize, handle: aclrtDrvMemHandle, flags: u64) {
        not_null(vir_ptr)?;
        not_null(handle)?;
        positive(size)?;
        if flags != 0 {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let mut guard = runtime();
        let runtime = &mut *guard;
        runtime.ready()?;
        if !is_device_address(vir_ptr as usize) {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        let key = handle as usize;
        let mut physical = runtime.physical.remove(&key).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
        let mapped = with_space_mut(|space| space.map(vir_ptr as usize, size, offset, key, &mut physical));
        runtime.physical.insert(key, physical);
        mapped
    }
}

acl_entry! {
    /// Unmaps the mapping that starts at `vir_ptr`.
    fn aclrtUnmapMem(vir_ptr: *mut c_void) {
        not_null(vir_ptr)?;
        let mut runtime = runtime();
        runtime.ready()?;
        if !is_device_address(vir_ptr as usize) {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        let handle = with_space_mut(|space| space.unmap(vir_ptr as usize))?;
        if let Some(physical) = runtime.physical.get_mut(&handle) {
            physical.mapped -= 1;
        }
        Ok(())
    }
}

acl_entry! {
    /// Sets the device's access to `[vir_ptr, vir_ptr + size)`, which must be exactly a run of whole mappings.
    /// Each descriptor must name a device location with a valid id; the widest access among them applies (the
    /// twin does not model per-device access).
    fn aclrtMemSetAccess(vir_ptr: *mut c_void, size: usize, desc: *mut aclrtMemAccessDesc, count: usize) {
        not_null(vir_ptr)?;
        not_null(desc)?;
        positive(size)?;
        positive(count)?;
        let runtime = runtime();
        runtime.ready()?;
        let mut widest = ACL_RT_MEM_ACCESS_FLAGS_NONE;
        for index in 0..count {
            // SAFETY: `desc` points to `count` descriptors (C contract); `index < count`.
            let one = unsafe { desc.add(index).read() };
            if one.location.r#type != ACL_MEM_LOCATION_TYPE_DEVICE {
                return Err(ACL_ERROR_INVALID_PARAM);
            }
            runtime.check_device_id(i32::try_from(one.location.id).map_err(|_| ACL_ERROR_RT_INVALID_DEVICEID)?)?;
            match one.flags {
                ACL_RT_MEM_ACCESS_FLAGS_NONE => {}
                ACL_RT_MEM_ACCESS_FLAGS_READ => {
                    if widest == ACL_RT_MEM_ACCESS_FLAGS_NONE {
                        widest = ACL_RT_MEM_ACCESS_FLAGS_READ;
                    }
                }
                ACL_RT_MEM_ACCESS_FLAGS_READWRITE => widest = ACL_RT_MEM_ACCESS_FLAGS_READWRITE,
                _ => return Err(ACL_ERROR_INVALID_PARAM),
            }
        }
        if !is_device_address(vir_ptr as usize) {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        with_space_mut(|space| space.set_access(vir_ptr as usize, size, widest))
    }
}

acl_entry! {
    /// Loads a kernel binary from `length` bytes at `data` (`options` may be null; none is modelled). On the twin
    /// the binary is a shared object built for the CPU model (`crate::kernel`); anything else is refused.
    fn aclrtBinaryLoadFromData(
        data: *const c_void,
        length: usize,
        options: *const aclrtBinaryLoadOptions,
        bin_handle: *mut aclrtBinHandle,
    ) {
        let _ = options;
        not_null(data)?;
        not_null(bin_handle)?;
        positive(length)?;
        runtime().ready()?;
        // SAFETY: the C contract: `data` holds `length` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), length) };
        let handle = crate::kernel::load(bytes)?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { bin_handle.write(handle as aclrtBinHandle) };
        Ok(())
    }
}

acl_entry! {
    /// The kernel function `kernel_name` of a loaded binary.
    fn aclrtBinaryGetFunction(bin_handle: aclrtBinHandle, kernel_name: *const c_char, func_handle: *mut aclrtFuncHandle) {
        not_null(func_handle)?;
        runtime().ready()?;
        // SAFETY: the C contract: null or NUL-terminated.
        let name = unsafe { crate::kernel::kernel_name(kernel_name) }?;
        let handle = crate::kernel::get_function(bin_handle as usize, name)?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { func_handle.write(handle as aclrtFuncHandle) };
        Ok(())
    }
}

acl_entry! {
    /// Unloads a binary (refused while a launch of it is queued or running).
    fn aclrtBinaryUnLoad(bin_handle: aclrtBinHandle) {
        runtime().ready()?;
        crate::kernel::unload(bin_handle as usize)
    }
}

fn submit_launch(stream: aclrtStream, launch: crate::kernel::Launch) -> Result<(), aclError> {
    let mut runtime = runtime();
    runtime.ready()?;
    let target = runtime.stream(stream as usize)?;
    drop(runtime);
    let device = target.device;
    target.submit(Task::Kernel { device, launch: Box::new(launch) });
    Ok(())
}

acl_entry! {
    /// Queues `func_handle` on `num_blocks` blocks with its parameters at device address `args_data` (`args_size`
    /// bytes: 1 to 4 words, read when the launch starts).
    fn aclrtLaunchKernel(
        func_handle: aclrtFuncHandle,
        num_blocks: u32,
        args_data: *const c_void,
        args_size: usize,
        stream: aclrtStream,
    ) {
        not_null(args_data)?;
        if args_size % 8 != 0 {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let args = crate::kernel::Args::Device { address: args_data as usize, count: args_size / 8 };
        let launch = crate::kernel::prepare(func_handle as usize, num_blocks, core::ptr::null(), args)?;
        submit_launch(stream, launch)?;
        crate::evidence::note_launch(num_blocks);
        Ok(())
    }
}

acl_entry! {
    /// Queues `func_handle` on `num_blocks` blocks with parameters copied from `host_args` now (`args_size` bytes:
    /// 1 to 4 words). `cfg` may be null; an engine type other than AIV and placeholders are not supported.
    fn aclrtLaunchKernelWithHostArgs(
        func_handle: aclrtFuncHandle,
        num_blocks: u32,
        stream: aclrtStream,
        cfg: *mut aclrtLaunchKernelCfg,
        host_args: *mut c_void,
        args_size: usize,
        place_holder_array: *mut aclrtPlaceHolderInfo,
        place_holder_num: usize,
    ) {
        not_null(host_args)?;
        if args_size % 8 != 0 {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        if place_holder_num > 0 || !place_holder_array.is_null() {
            return Err(ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
        }
        // SAFETY: the C contract: `host_args` holds `args_size` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(host_args.cast::<u8>(), args_size) };
        let words = bytes.chunks_exact(8).map(|word| u64::from_le_bytes(word.try_into().unwrap_or([0; 8]))).collect();
        let launch = crate::kernel::prepare(func_handle as usize, num_blocks, cfg, crate::kernel::Args::Host(words))?;
        submit_launch(stream, launch)?;
        crate::evidence::note_launch(num_blocks);
        Ok(())
    }
}
