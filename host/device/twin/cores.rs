//! Emulated AIV cores: one thread per core that runs kernel launches from its queue, in order. Each run installs the
//! thread as the block's core of the CPU model of AscendC (`core_ops::on_core`: its own data cache and unified
//! buffer, its block index) and calls the kernel's NPU entry, compiled for the host from `kernels/npu/entry.cpp`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::core_ops::{on_core, BlockContext};
use crate::device::Launch;

extern "C" {
    /// The transfer kernel's entry (`kernels/npu/entry.cpp`, `GM_ADDR` argument), built against `kernels/cpu/`.
    fn aiv_transfer_kernel(kernel_args: *mut u8);
}

/// A launch in flight: counts the blocks still running.
#[derive(Debug)]
pub struct TwinLaunch {
    remaining: Mutex<u32>,
    done: Condvar,
}

impl Launch for TwinLaunch {
    fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut remaining = self.remaining.lock().unwrap_or_else(|p| p.into_inner());
        while *remaining > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            remaining = match self.done.wait_timeout(remaining, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        true
    }
}

#[derive(Debug)]
struct Job {
    kernel_args: u64,
    block_dim: u32,
    /// The block's context (`BlockContext`), owned by the device, which outlives its launches.
    context: usize,
    launch: Arc<TwinLaunch>,
}

#[derive(Debug, Default)]
struct CoreQueue {
    jobs: Mutex<VecDeque<Job>>,
    wake: Condvar,
}

/// The emulated cores of one device.
#[derive(Debug)]
pub struct CorePool {
    queues: Vec<Arc<CoreQueue>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    shutdown: Arc<AtomicBool>,
}

impl CorePool {
    /// Starts `count` cores.
    pub fn start(device: u32, count: u32) -> std::io::Result<CorePool> {
        let shutdown = Arc::new(AtomicBool::new(false));
        let mut queues = Vec::new();
        let mut threads = Vec::new();
        for index in 0..count {
            let queue = Arc::new(CoreQueue::default());
            let (queue_for_thread, shutdown_for_thread) = (queue.clone(), shutdown.clone());
            let thread = std::thread::Builder::new()
                .name(format!("{}{device}.{index}", super::CORE_THREAD_PREFIX))
                .spawn(move || run_core(index, &queue_for_thread, &shutdown_for_thread))?;
            queues.push(queue);
            threads.push(thread);
        }
        Ok(CorePool { queues, threads: Mutex::new(threads), shutdown })
    }

    /// Number of cores.
    pub fn len(&self) -> u32 {
        self.queues.len() as u32
    }

    /// Whether the pool has no core.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Queues a launch on cores `0..block_dim` (the caller checked `block_dim <= len` and `<= contexts.len()`).
    pub fn launch(&self, kernel_args: u64, block_dim: u32, contexts: &[BlockContext]) -> Arc<TwinLaunch> {
        let launch = Arc::new(TwinLaunch { remaining: Mutex::new(block_dim), done: Condvar::new() });
        for (queue, context) in self.queues[..block_dim as usize].iter().zip(contexts) {
            queue.jobs.lock().unwrap_or_else(|p| p.into_inner()).push_back(Job {
                kernel_args,
                block_dim,
                context: context as *const BlockContext as usize,
                launch: launch.clone(),
            });
            queue.wake.notify_one();
        }
        launch
    }

    /// Stops the cores once their queued launches have returned (bounded: cores still busy after `timeout` are
    /// left detached and reported).
    pub fn shut_down(&self, timeout: Duration) {
        self.shutdown.store(true, Ordering::Release);
        for queue in &self.queues {
            let _guard = queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
            queue.wake.notify_all();
        }
        let deadline = Instant::now() + timeout;
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for thread in threads {
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                tracing::error!("an emulated AIV core is still running a kernel at shutdown; leaving it detached");
            }
        }
    }
}

fn run_core(index: u32, queue: &CoreQueue, shutdown: &AtomicBool) {
    loop {
        let job = {
            let mut jobs = queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(job) = jobs.pop_front() {
                    break Some(job);
                }
                if shutdown.load(Ordering::Acquire) {
                    break None;
                }
                jobs = match queue.wake.wait_timeout(jobs, Duration::from_millis(100)) {
                    Ok((guard, _)) => guard,
                    Err(poisoned) => poisoned.into_inner().0,
                };
            }
        };
        let Some(job) = job else { return };
        // SAFETY: the device owns the contexts and joins its cores before dropping them.
        let context = unsafe { &*(job.context as *const BlockContext) };
        // SAFETY: `kernel_args` is the device address of a KernelArgs the launcher keeps alive until the launch has
        // returned (the aiv transport owns it and waits for its launches before freeing); the kernel reaches memory
        // only through the core model, which translates every access against the device's ranges.
        let ran = on_core(context, index, job.block_dim, || unsafe { aiv_transfer_kernel(job.kernel_args as *mut u8) });
        match ran {
            Some(((), 0)) => {}
            Some(((), dirty)) => {
                tracing::warn!(core = index, dirty, "kernel returned with scalar stores never cleaned to memory")
            }
            None => tracing::error!(core = index, "the CPU model of the AIV core refused to install"),
        }
        let mut remaining = job.launch.remaining.lock().unwrap_or_else(|p| p.into_inner());
        *remaining -= 1;
        job.launch.done.notify_all();
    }
}
