//! The process-wide runtime state behind one mutex and the rules every entry point shares: initialisation, the
//! devices, the calling thread's current device, streams and their tasks. The device address space is `space`'s.
//!
//! Lock order: the SHMEM state (`shmem`), then the runtime mutex, then the space lock (`space`).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use ascendcl_sys::sys::*;

use crate::memory::Physical;
use crate::space::{host_observed, perform_copy, plan_copy, space, with_existing_space_mut};
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

/// Runs one stream task on a worker thread (a copy as the thread that submitted it: its writes and reads are that
/// thread's for the provenance records).
pub(crate) fn run_task(task: &Task) -> aclError {
    match *task {
        Task::Copy { device, dst, dest_max, src, count, kind, by } => crate::provenance::acting_as(by, || {
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
