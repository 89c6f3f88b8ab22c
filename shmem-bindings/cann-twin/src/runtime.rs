//! The process-wide runtime state behind one mutex, the device address space behind its own read-write lock, and
//! the rules every entry point shares: initialisation, the calling thread's current device, copy planning.
//!
//! Lock order: the SHMEM state (`shmem`), then the runtime mutex, then the space lock. Translations and the copies
//! through them run under the space's *read* lock (so the SDMA engines copy without the runtime mutex, in parallel
//! with each other and with the Host's copies); allocation, free, map and unmap take its *write* lock, so no
//! translated pointer outlives the memory behind it.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use ascendcl_sys::sys::*;

use crate::memory::{Physical, Segment, Segments, Space};
use crate::stream::{Stream, Task};

/// Devices reported when `AIV_TWIN_DEVICES` is unset or not a number in `1..=1024`.
pub const DEFAULT_DEVICE_COUNT: u32 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Init {
    Never,
    Initialized,
    Finalized,
}

/// One `aclrtMallocHost` allocation: a shared mapping of its own memfd, so that an IPC key of a Host window onto it
/// (`aclrtHostRegister`, then `aclrtIpcMemGetExportKey`) lets another process map the same pages.
#[derive(Debug)]
pub struct HostAllocation {
    /// The mapped length (whole pages).
    pub length: usize,
    /// The memfd behind the mapping.
    pub fd: Arc<std::os::fd::OwnedFd>,
}

/// Everything the runtime owns.
#[derive(Debug)]
pub(crate) struct Runtime {
    init: Init,
    pub device_count: u32,
    /// `aclrtSetDevice` calls not yet matched by `aclrtResetDevice`, per device.
    device_refs: Vec<u32>,
    /// Created streams by handle (the address of the `Stream`).
    pub streams: HashMap<usize, Arc<Stream>>,
    /// The default (null) stream of each device, made on first use.
    default_streams: HashMap<i32, Arc<Stream>>,
    /// `aclrtMallocHost` mappings by address.
    pub host: HashMap<usize, HostAllocation>,
    /// `aclrtMallocPhysical` allocations by handle value.
    pub physical: HashMap<usize, Physical>,
    next_handle: usize,
}

thread_local! {
    /// The device `aclrtSetDevice` last made current on this thread.
    static CURRENT: Cell<Option<i32>> = const { Cell::new(None) };
}

fn device_count_from_env() -> u32 {
    std::env::var("AIV_TWIN_DEVICES")
        .ok()
        .and_then(|value| value.trim().parse::<u32>().ok())
        .filter(|count| (1..=1024).contains(count))
        .unwrap_or(DEFAULT_DEVICE_COUNT)
}

static RUNTIME: LazyLock<Mutex<Runtime>> = LazyLock::new(|| {
    let device_count = device_count_from_env();
    Mutex::new(Runtime {
        init: Init::Never,
        device_count,
        device_refs: vec![0; device_count as usize],
        streams: HashMap::new(),
        default_streams: HashMap::new(),
        host: HashMap::new(),
        physical: HashMap::new(),
        next_handle: 0,
    })
});

/// The device address space, made on first mutable use.
static SPACE: RwLock<Option<Space>> = RwLock::new(None);

/// The device address space, read-locked (`None` until something was allocated). Never take it twice on one thread.
pub(crate) fn space() -> RwLockReadGuard<'static, Option<Space>> {
    SPACE.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Bumped by every change of the device address space: what an emulated core remembers of it is valid only while
/// this has not moved (`kernel`'s translation cache).
static SPACE_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The device address space's generation (see [`SPACE_GENERATION`]).
pub(crate) fn space_generation() -> u64 {
    SPACE_GENERATION.load(std::sync::atomic::Ordering::Acquire)
}

/// Runs `body` on the device address space, write-locked, creating the space on first use.
pub(crate) fn with_space_mut<R>(body: impl FnOnce(&mut Space) -> Result<R, aclError>) -> Result<R, aclError> {
    let mut guard = SPACE.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    // Before the change, under the write lock: a core that reads the new generation after this sees the new space.
    SPACE_GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    if guard.is_none() {
        *guard = Some(Space::new()?);
    }
    match guard.as_mut() {
        Some(space) => body(space),
        None => Err(ACL_ERROR_RT_INTERNAL_ERROR),
    }
}

/// Runs `body` on the device address space, write-locked, if it exists.
fn with_existing_space_mut(body: impl FnOnce(&mut Space)) {
    let mut guard = SPACE.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    SPACE_GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    if let Some(space) = guard.as_mut() {
        body(space);
    }
}

/// Whether `address` is a device address (takes the space's read lock: do not call while holding it).
pub(crate) fn is_device_address(address: usize) -> bool {
    space().as_ref().is_some_and(|space| space.contains(address))
}

/// The runtime, locked. A poisoned lock is recovered: every mutation leaves the state consistent before it can
/// panic, and no panic crosses the C ABI.
pub(crate) fn runtime() -> MutexGuard<'static, Runtime> {
    RUNTIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Runtime {
    pub fn init(&mut self) -> Result<(), aclError> {
        if self.init == Init::Initialized {
            return Err(ACL_ERROR_REPEAT_INITIALIZE);
        }
        self.init = Init::Initialized;
        Ok(())
    }

    /// Marks the runtime finalised and hands back every stream, for the caller to drain without the lock.
    pub fn finalize(&mut self) -> Result<Vec<Arc<Stream>>, aclError> {
        match self.init {
            Init::Never => return Err(ACL_ERROR_UNINITIALIZE),
            Init::Finalized => return Err(ACL_ERROR_REPEAT_FINALIZE),
            Init::Initialized => {}
        }
        self.init = Init::Finalized;
        for device in 0..self.device_count as i32 {
            // The AI CPU's channels go with the device's engines, before its memory.
            crate::sdma::destroy_aicpu(device);
            if self.device_refs[device as usize] > 0 {
                with_existing_space_mut(|space| space.free_device(device));
            }
        }
        self.device_refs.iter_mut().for_each(|refs| *refs = 0);
        let mut streams: Vec<Arc<Stream>> = self.streams.drain().map(|(_, stream)| stream).collect();
        streams.extend(self.default_streams.drain().map(|(_, stream)| stream));
        Ok(streams)
    }

    /// `ACL_ERROR_UNINITIALIZE` unless `aclInit` has succeeded and `aclFinalize` has not followed.
    pub fn ready(&self) -> Result<(), aclError> {
        if self.init == Init::Initialized {
            Ok(())
        } else {
            Err(ACL_ERROR_UNINITIALIZE)
        }
    }

    pub fn check_device_id(&self, device: i32) -> Result<usize, aclError> {
        usize::try_from(device)
            .ok()
            .filter(|&index| index < self.device_count as usize)
            .ok_or(ACL_ERROR_RT_INVALID_DEVICEID)
    }

    pub fn set_device(&mut self, device: i32) -> Result<(), aclError> {
        self.ready()?;
        let index = self.check_device_id(device)?;
        self.device_refs[index] += 1;
        CURRENT.with(|current| current.set(Some(device)));
        Ok(())
    }

    /// Drops one reference; on the last, hands back the device's streams (for the caller to drain) and frees its
    /// `aclrtMalloc` memory.
    pub fn reset_device(&mut self, device: i32) -> Result<Vec<Arc<Stream>>, aclError> {
        self.ready()?;
        let index = self.check_device_id(device)?;
        if self.device_refs[index] == 0 {
            return Err(ACL_ERROR_RT_CONTEXT_NULL);
        }
        self.device_refs[index] -= 1;
        if self.device_refs[index] > 0 {
            return Ok(Vec::new());
        }
        CURRENT.with(|current| {
            if current.get() == Some(device) {
                current.set(None);
            }
        });
        let handles: Vec<usize> =
            self.streams.iter().filter(|(_, stream)| stream.device == device).map(|(&handle, _)| handle).collect();
        let mut streams: Vec<Arc<Stream>> = handles.iter().filter_map(|handle| self.streams.remove(handle)).collect();
        streams.extend(self.default_streams.remove(&device));
        // A kernel still running on the device is aborted (its cores stop at their next access) before its memory
        // goes; bounded: a core inside one long access finishes it first.
        crate::kernel::abort_device(device);
        let deadline = std::time::Instant::now() + crate::kernel::ABORT_WAIT;
        while crate::kernel::running_on(device) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // The AI CPU's channels go with the device's engines, before its memory (an AI-CPU task still running fails).
        crate::sdma::destroy_aicpu(device);
        with_existing_space_mut(|space| space.free_device(device));
        Ok(streams)
    }

    /// The calling thread's current device, which must still be set: else `ACL_ERROR_RT_CONTEXT_NULL`.
    pub fn current_device(&self) -> Result<i32, aclError> {
        self.ready()?;
        let device = CURRENT.with(Cell::get).ok_or(ACL_ERROR_RT_CONTEXT_NULL)?;
        match self.device_refs.get(device as usize) {
            Some(&refs) if refs > 0 => Ok(device),
            _ => Err(ACL_ERROR_RT_CONTEXT_NULL),
        }
    }

    /// Makes `device` the calling thread's current device without counting a reference (`aclrtSetCurrentContext`
    /// of that device's context); the device must be set (by some thread) already.
    pub fn set_current_without_reference(&self, device: i32) -> Result<(), aclError> {
        self.ready()?;
        let index = self.check_device_id(device)?;
        if self.device_refs[index] == 0 {
            return Err(ACL_ERROR_RT_CONTEXT_NULL);
        }
        CURRENT.with(|current| current.set(Some(device)));
        Ok(())
    }

    /// A fresh handle value for a physical allocation (opaque; never an address).
    pub fn new_handle(&mut self) -> usize {
        self.next_handle += 1;
        0x7a1e_0000_0000 + self.next_handle * 16
    }

    /// The stream a handle names: a created stream, or the current device's default stream for null.
    pub fn stream(&mut self, handle: usize) -> Result<Arc<Stream>, aclError> {
        if handle == 0 {
            let device = self.current_device()?;
            if let Some(stream) = self.default_streams.get(&device) {
                return Ok(Arc::clone(stream));
            }
            let stream = Stream::spawn(device, run_task)?;
            self.default_streams.insert(device, Arc::clone(&stream));
            return Ok(stream);
        }
        self.ready()?;
        self.streams.get(&handle).cloned().ok_or(ACL_ERROR_RT_INVALID_HANDLE)
    }
}

/// Device memory a memset (or the device model) reaches: `[address, address + len)` translated in `space`.
pub(crate) fn device_segments(
    space: Option<&Space>,
    address: usize,
    len: usize,
    write: bool,
) -> Result<Segments, aclError> {
    match space {
        Some(space) if space.contains(address) => space.translate(address, len, write),
        _ => Err(ACL_ERROR_RT_INVALID_MEMORY_TYPE),
    }
}

/// Checks a copy as `aclrtMemcpy` does and translates both sides in `space` (read-locked by the caller, who keeps
/// the lock while using the segments). `count` is non-zero and both pointers non-null (checked by the caller, in
/// the vendor's order).
pub(crate) fn plan_copy(
    space: Option<&Space>,
    dst: usize,
    dest_max: usize,
    src: usize,
    count: usize,
    kind: aclrtMemcpyKind,
) -> Result<(Segments, Segments), aclError> {
    let contains = |address: usize| space.is_some_and(|space| space.contains(address));
    let dst_device = contains(dst);
    let src_device = contains(src);
    let matches = match kind {
        ACL_MEMCPY_HOST_TO_HOST => !dst_device && !src_device,
        ACL_MEMCPY_HOST_TO_DEVICE | ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE => !src_device && dst_device,
        ACL_MEMCPY_DEVICE_TO_HOST => src_device && !dst_device,
        ACL_MEMCPY_DEVICE_TO_DEVICE => src_device && dst_device,
        ACL_MEMCPY_DEFAULT => true,
        _ => return Err(ACL_ERROR_INVALID_PARAM),
    };
    if !matches {
        return Err(ACL_ERROR_RT_INVALID_MEMORY_TYPE);
    }
    if dest_max < count {
        return Err(ACL_ERROR_RT_PARAM_INVALID);
    }
    let side = |address: usize, device: bool, write: bool| -> Result<Segments, aclError> {
        if device {
            device_segments(space, address, count, write)
        } else {
            address.checked_add(count).ok_or(ACL_ERROR_INVALID_PARAM)?;
            if contains(address + count - 1) {
                // A Host range running into the device address space.
                return Err(ACL_ERROR_RT_PARAM_INVALID);
            }
            Ok(Segments::one(address as *mut u8, count))
        }
    };
    Ok((side(dst, dst_device, true)?, side(src, src_device, false)?))
}

/// Copies `src` onto `dst` (the same total length), segment by segment, as `memmove` would.
///
/// # Safety
///
/// Every segment is valid memory for its length (device segments come from [`Space::translate`] under the space's
/// read lock, still held; Host segments are the caller's promise under the C contract).
pub(crate) unsafe fn perform_copy(dst: &[Segment], src: &[Segment]) {
    let (mut d, mut s) = (0, 0);
    let (mut d_off, mut s_off) = (0, 0);
    while d < dst.len() && s < src.len() {
        let take = (dst[d].len - d_off).min(src[s].len - s_off);
        // SAFETY: both ranges lie inside their segments (see the function's contract); `copy` allows overlap.
        unsafe { core::ptr::copy(src[s].ptr.add(s_off), dst[d].ptr.add(d_off), take) };
        d_off += take;
        s_off += take;
        if d_off == dst[d].len {
            d += 1;
            d_off = 0;
        }
        if s_off == src[s].len {
            s += 1;
            s_off = 0;
        }
    }
}

/// After a runtime copy of `count` bytes from `src` to `dst`: when it copied device memory into Host memory, the
/// calling thread observed what it copied (a landed completion flag among it is recorded as seen by the Host, or by
/// the AI CPU if the thread is the AI CPU's).
///
/// # Safety
///
/// `dst` is the copy's destination, valid for reading `count` bytes (the copy just wrote them).
pub(crate) unsafe fn host_observed(space: Option<&Space>, dst: usize, src: usize, count: usize) {
    let device = |address: usize| space.is_some_and(|space| space.contains(address));
    if device(src) && !device(dst) {
        // SAFETY: the caller's contract.
        let bytes = unsafe { std::slice::from_raw_parts(dst as *const u8, count) };
        crate::sdma::provenance::read(src as u64, bytes);
    }
}

/// Runs one stream task on a worker thread (a copy as the thread that submitted it: its writes and reads are that
/// thread's for the provenance records).
pub(crate) fn run_task(task: &Task) -> aclError {
    match *task {
        Task::Copy { device, dst, dest_max, src, count, kind, by } => crate::sdma::provenance::acting_as(by, || {
            // An injected device fault (`control::fail_next_destinations`): the copy engine finds its destination
            // unmapped, as a copy to freed memory would.
            if crate::sdma::take_injected_destination_fault(device) {
                return ACL_ERROR_RT_PARAM_INVALID;
            }
            let space = space();
            let (task_dst, task_src) = (dst, src);
            match plan_copy(space.as_ref(), dst, dest_max, src, count, kind) {
                Ok((dst, src)) => {
                    // SAFETY: the segments were just translated under the read lock still held; the Host side is the
                    // submitter's promise that it stays valid until the stream is synchronised.
                    unsafe { perform_copy(&dst, &src) };
                    // SAFETY: `dst` was just written `count` bytes (a Host destination is one segment at `dst`).
                    unsafe { host_observed(space.as_ref(), task_dst, task_src, count) };
                    ACL_SUCCESS
                }
                Err(code) => code,
            }
        }),
        Task::Kernel { device, ref launch } => crate::kernel::run(device, launch),
        Task::AiCpu { device, ref launch } => crate::aicpu::run(device, launch),
    }
}
