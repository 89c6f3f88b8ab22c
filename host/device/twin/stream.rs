//! Twin copy streams: in-order copy queues, each executed by its own emulated copy-engine thread (the "device").
//!
//! What an ACL stream does for `aclrtMemcpyAsync` (docs/hardware.md section 7): the Host runtime queues a copy task and
//! returns; the device executes the stream's tasks in order; `aclrtSynchronizeStreamWithTimeout` returns when the
//! stream is empty, or reports the task exception of a refused copy. Copies are checked against the device's windows
//! exactly as the SDMA engine checks SQEs. Owns only its queue and thread; never touches engine state.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::sdma::Windows;
use crate::device::{CopyStream, DeviceError};

#[derive(Debug, Default)]
struct Queue {
    copies: VecDeque<(u64, u64, u64)>,
    queued: u64,
    executed: u64,
    /// The first refused copy since the last synchronisation.
    exception: Option<String>,
    shutdown: bool,
}

#[derive(Debug)]
struct State {
    device: u32,
    index: u32,
    windows: Windows,
    stalled: Arc<AtomicBool>,
    queue: Mutex<Queue>,
    /// Signalled when a copy is queued (engine side) and when one executed (synchronise side).
    changed: Condvar,
}

/// One twin stream; dropping it stops its copy engine.
#[derive(Debug)]
pub struct TwinStream {
    state: Arc<State>,
    engine: Mutex<Option<JoinHandle<()>>>,
}

impl TwinStream {
    /// Starts a stream whose copies may name any range inside `windows`; while `stalled` is set it executes nothing.
    pub fn start(device: u32, index: u32, windows: Windows, stalled: Arc<AtomicBool>) -> Result<Self, DeviceError> {
        let state = Arc::new(State {
            device,
            index,
            windows,
            stalled,
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        });
        let engine_state = state.clone();
        let engine = std::thread::Builder::new()
            .name(format!("{}{device}.{index}", super::STREAM_THREAD_PREFIX))
            .spawn(move || engine_state.run())
            .map_err(|source| DeviceError::Os { device, operation: "start copy stream", source })?;
        Ok(TwinStream { state, engine: Mutex::new(Some(engine)) })
    }
}

impl State {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self) {
        let mut queue = self.lock();
        loop {
            if queue.shutdown {
                return;
            }
            if queue.copies.is_empty() || self.stalled.load(Ordering::Acquire) {
                // Bounded so a released stall is noticed without a wake-up.
                queue = self.changed.wait_timeout(queue, Duration::from_millis(5)).unwrap_or_else(|p| p.into_inner()).0;
                continue;
            }
            let Some((dst, src, length)) = queue.copies.pop_front() else { continue };
            drop(queue);
            let refused = self.execute(dst, src, length);
            queue = self.lock();
            if let Some(reason) = refused {
                tracing::warn!(stream = self.index, %reason, "twin stream refused a copy");
                queue.exception.get_or_insert(reason);
            }
            queue.executed += 1;
            self.changed.notify_all();
        }
    }

    fn execute(&self, dst: u64, src: u64, length: u64) -> Option<String> {
        {
            let windows = self.windows.read().unwrap_or_else(|p| p.into_inner());
            let inside = |addr: u64| {
                addr.checked_add(length)
                    .is_some_and(|end| windows.iter().any(|&(base, len)| addr >= base && end <= base + len))
            };
            if !inside(src) {
                return Some(format!("source [{src:#x}, +{length}) is outside every mapped window"));
            }
            if !inside(dst) {
                return Some(format!("destination [{dst:#x}, +{length}) is outside every mapped window"));
            }
        }
        // SAFETY: both ranges lie inside windows this device maps for its lifetime (checked above); the transfer
        // contract keeps the bytes valid until the copy's synchronisation. `copy` tolerates overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, length as usize) };
        None
    }
}

impl CopyStream for TwinStream {
    fn memcpy_async(&self, dst: u64, src: u64, length: u64) -> Result<(), DeviceError> {
        if length == 0 || usize::try_from(length).is_err() {
            return Err(DeviceError::Invalid {
                device: self.state.device,
                operation: "memcpy async",
                reason: format!("length {length} is not a copy size"),
            });
        }
        let mut queue = self.state.lock();
        queue.copies.push_back((dst, src, length));
        queue.queued += 1;
        self.state.changed.notify_all();
        Ok(())
    }

    fn synchronize(&self, timeout: Duration) -> Result<(), DeviceError> {
        let deadline = Instant::now() + timeout;
        let mut queue = self.state.lock();
        let target = queue.queued;
        while queue.executed < target {
            let now = Instant::now();
            if now >= deadline {
                return Err(DeviceError::Timeout {
                    device: self.state.device,
                    operation: "synchronize stream",
                    waited: timeout,
                });
            }
            queue = self.state.changed.wait_timeout(queue, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        match queue.exception.take() {
            Some(reason) => Err(DeviceError::Invalid {
                device: self.state.device,
                operation: "stream task",
                reason: format!("stream {}: {reason}", self.state.index),
            }),
            None => Ok(()),
        }
    }
}

impl Drop for TwinStream {
    fn drop(&mut self) {
        self.state.lock().shutdown = true;
        self.state.changed.notify_all();
        if let Some(engine) = self.engine.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = engine.join();
        }
    }
}
