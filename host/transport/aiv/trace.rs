//! The aiv path's part of a per-stage trace (docs/trace.md): each block's trace ring in shared memory, allocated the
//! first time tracing is switched on and pointed at by the block's kernel arguments (the kernel picks the switch up
//! at launch and whenever a persistent launch is idle), and its drain into the engine's [`Tracer`].
//!
//! Owns: [`AivTransport::set_trace`], [`AivTransport::drain_traces`] and the Host's alignment records (when a
//! request was published, when its DCQ entry was first seen). It must not touch the request ring or the DCQ: submit
//! and drain call [`Inner::active_tracer`] and record their own moments.
//!
//! Off (the default, and until the first `set_trace(.., true)`), the data path pays one atomic load per submit and
//! per drain pass (`active_tracer`), and the kernel one test per stage of a group ([`BlockArgs::trace_ring`] is 0).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::block::BlockTrace;
use super::{AivTransport, Inner};
use crate::config::LaunchMode;
use crate::device::DeviceError;
use crate::kernel_abi::{trace_ring_bytes, BlockArgs, SpscIndex, TraceRing, KERNEL_ARGS_BLOCKS_OFFSET};
use crate::trace::Tracer;
use crate::transfer::completion::poll_until;

/// Entries of a block's trace ring unless the caller asks for another depth (128 KiB a block).
pub const DEFAULT_TRACE_DEPTH: u32 = 4096;

/// How long switching the trace waits for the persistent kernels to acknowledge it. An idle launch reads the switch
/// within 16 idle polls (a few ms on the twin); a busy one only once its work runs out.
pub const TRACE_SWITCH_WAIT: Duration = Duration::from_secs(1);

impl Inner {
    /// The engine's tracer when tracing is on (one atomic load, plus a relaxed one once a tracer was set).
    pub(super) fn active_tracer(&self) -> Option<&Tracer> {
        self.tracer.get().map(|tracer| &**tracer).filter(|tracer| tracer.is_enabled())
    }

    /// The device id as the trace names it.
    pub(super) fn trace_device(&self) -> i32 {
        self.device.device_id() as i32
    }

    /// Block `index`'s trace switch in its kernel arguments: the ring's device address and its depth.
    fn trace_switch(&self, index: usize) -> (&AtomicU64, &AtomicU32) {
        // SAFETY: the words lie inside the kernel-argument mapping (`block_args_word`), 8- and 4-aligned (the mapping
        // is page-aligned, BlockArgs 128 bytes, the fields at 80 and 88), and live as long as `self`; the kernel only
        // reads them.
        unsafe {
            (
                &*self.block_args_word(index, std::mem::offset_of!(BlockArgs, trace_ring)).cast::<AtomicU64>(),
                &*self.block_args_word(index, std::mem::offset_of!(BlockArgs, trace_depth)).cast::<AtomicU32>(),
            )
        }
    }

    /// The address of word `offset` of block `index`'s arguments in the kernel-argument mapping.
    fn block_args_word(&self, index: usize, offset: usize) -> *mut u8 {
        // SAFETY (of the pointer's use by the callers): the mapping holds BlockArgs[blocks] from
        // KERNEL_ARGS_BLOCKS_OFFSET (setup sized it), index < blocks, offset < size_of::<BlockArgs>().
        self.kernel_args.host_ptr().wrapping_add(KERNEL_ARGS_BLOCKS_OFFSET + index * size_of::<BlockArgs>() + offset)
    }
}

impl AivTransport {
    /// Switches this transport's part of a trace on or off, recording into `tracer` (the engine's, kept from the
    /// first call). On: each block gets its trace ring of `depth` entries (a power of two >= 2; the first call's
    /// depth stays), its arguments point at it, and the kernel records from its next launch or idle moment. Off: the
    /// arguments are cleared (the kernel stops at its next idle moment); the rings stay until the transport drops,
    /// since a kernel may still write them. Either way it returns once every running persistent launch has
    /// acknowledged the switch, or after [`TRACE_SWITCH_WAIT`] (see `await_trace_switch`).
    pub fn set_trace(&self, tracer: &Arc<Tracer>, on: bool, depth: u32) -> Result<(), DeviceError> {
        let inner = &self.inner;
        let _ = inner.tracer.set(tracer.clone());
        let tracer = inner.tracer.get().unwrap_or(tracer);
        let index = SpscIndex::new(depth).ok_or_else(|| DeviceError::Invalid {
            device: inner.device.device_id(),
            operation: "set trace",
            reason: format!("trace ring depth {depth} is not a power of two from 2 to 2^31"),
        })?;
        tracer.cycles_per_second(inner.trace_device(), inner.device.cycles_per_second());
        for (i, block) in inner.blocks.iter().enumerate() {
            let mut trace = block.trace.lock().unwrap_or_else(|p| p.into_inner());
            if on && trace.is_none() {
                let mapping = inner.memory.allocate_shared(trace_ring_bytes(index.depth()))?;
                // SAFETY: allocated above for this depth (zeroed: head, tail and dropped start at 0), page-aligned,
                // kept beside the view; the kernel follows the ring protocol.
                let ring = unsafe { TraceRing::new(mapping.host_ptr(), index) };
                *trace = Some(BlockTrace { ring, _mapping: mapping, dropped_seen: 0, scratch: Vec::new() });
            }
            let (ring, ring_depth) = match (&*trace, on) {
                (Some(held), true) => (held._mapping.device_addr(), held.ring.depth()),
                _ => (0, 0),
            };
            let (ring_word, depth_word) = inner.trace_switch(i);
            // The depth before the address (Release): a kernel that reads the new address reads its depth.
            if ring != 0 {
                depth_word.store(ring_depth, Ordering::Release);
            }
            ring_word.store(ring, Ordering::Release);
        }
        inner.await_trace_switch();
        Ok(())
    }

    /// Drains every block's trace ring into the tracer (what the kernels published so far, and the drops they
    /// counted since the last drain). Returns the entries drained.
    pub fn drain_traces(&self) -> usize {
        self.inner.drain_traces()
    }
}

impl Inner {
    /// Waits, at most [`TRACE_SWITCH_WAIT`], until every persistent launch that runs and is not halted has
    /// acknowledged the ring its arguments name now (`ControlBlock::trace_ring_seen`, stored by the kernel when it
    /// reads a changed switch: at its next idle moment). A launch that has not by then picks the switch up at its next
    /// idle moment; a warning names its block. A per-batch launch reads the switch when it starts: nothing to wait for.
    fn await_trace_switch(&self) {
        if self.launch_mode != LaunchMode::Persistent {
            return;
        }
        let behind = || {
            self.blocks.iter().enumerate().filter(|(i, block)| {
                let control = block.control();
                let wanted = self.trace_switch(*i).0.load(Ordering::Acquire);
                control.running.load(Ordering::Acquire) == 1
                    && control.halt_count.load(Ordering::Acquire) == control.resume_count.load(Ordering::Acquire)
                    && control.trace_ring_seen.load(Ordering::Acquire) != wanted
            })
        };
        if !poll_until(|| behind().next().is_none(), TRACE_SWITCH_WAIT) {
            let blocks: Vec<u32> = behind().map(|(_, block)| block.index).collect();
            tracing::warn!(
                ?blocks,
                wait_ms = TRACE_SWITCH_WAIT.as_millis() as u64,
                "a persistent kernel has not acknowledged the trace switch yet; it takes it at its next idle moment"
            );
        }
    }

    pub(super) fn drain_traces(&self) -> usize {
        let Some(tracer) = self.tracer.get() else { return 0 };
        let device = self.trace_device();
        let mut total = 0;
        for block in &self.blocks {
            let mut guard = block.trace.lock().unwrap_or_else(|p| p.into_inner());
            let Some(trace) = guard.as_mut() else { continue };
            trace.scratch.clear();
            let BlockTrace { ring, scratch, dropped_seen, .. } = trace;
            total += ring.drain_into(scratch);
            let dropped = ring.dropped();
            let since = dropped.wrapping_sub(*dropped_seen);
            *dropped_seen = dropped;
            if !scratch.is_empty() || since > 0 {
                tracer.device_entries(device, block.index, scratch, u64::from(since));
            }
        }
        total
    }
}
