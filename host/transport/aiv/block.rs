//! One AIV block as the Host sees it: its mappings, the typed ring views built once over them, and the Host's
//! per-block state (producer, transfers in flight, drain state, counters).
//!
//! Owns: [`HostBlock`] and the state types it holds. It must not post or drain: `submit` and `drain` do, through
//! the views.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Mutex;

use super::inflight::{InFlight, InFlightTable};
use crate::device::SharedMemory;
use crate::kernel_abi::{
    CompletionRing, ControlBlock, DcqEntry, RequestEntry, RequestRing, TraceEntry, TraceRing, UndecodableCompletion,
};

/// One AIV block as the Host sees it.
#[derive(Debug)]
pub(super) struct HostBlock {
    pub(super) index: u32,
    /// The producer view of the block's request ring (over `_request_mapping`).
    pub(super) request_ring: RequestRing,
    /// The consumer view of the block's DCQ (over `_dcq_mapping`).
    pub(super) completion_ring: CompletionRing,
    pub(super) control: SharedMemory,
    /// Keeps the request ring mapped while `request_ring` views it.
    pub(super) _request_mapping: SharedMemory,
    /// Keeps the DCQ mapped while `completion_ring` views it.
    pub(super) _dcq_mapping: SharedMemory,
    pub(super) producer: Mutex<Producer>,
    pub(super) inflight: Mutex<InFlightTable>,
    /// DCQ entries drained so far (free-running); requests in flight = producer tail - drained.
    pub(super) drained: AtomicU32,
    /// DCQ entries drained so far (the block's share of `AivCounters::completions`).
    pub(super) completions: AtomicU64,
    /// DCQ entries that named no transfer in flight.
    pub(super) unmatched: AtomicU64,
    /// DCQ entries whose status word the kernel never writes.
    pub(super) undecodable: AtomicU64,
    /// Drain passes that found the kernel's DCQ tail more than a ring's depth past the head.
    pub(super) corrupt_tails: AtomicU64,
    /// Held while one thread drains this block's DCQ (the drain thread or a waiting thread).
    pub(super) drain_lock: Mutex<DrainScratch>,
    /// The block's trace ring, from the first time tracing was switched on.
    pub(super) trace: Mutex<Option<BlockTrace>>,
}

impl HostBlock {
    /// The block's control words.
    pub(super) fn control(&self) -> &ControlBlock {
        // SAFETY: the control mapping starts with a ControlBlock (allocated for one in `start`, page-aligned) and
        // lives as long as the block; its words are atomics, so a shared reference is sound while the kernel writes
        // them.
        unsafe { &*self.control.host_ptr().cast::<ControlBlock>() }
    }

    /// Whether no request of this block is in flight (every published request's completion has been drained). A
    /// hint: a submit may publish right after.
    pub(super) fn is_idle(&self) -> bool {
        self.request_ring.published_tail() == self.drained.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(super) fn inflight_map(&self) -> std::sync::MutexGuard<'_, InFlightTable> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The drain lock if no other thread holds it (a pass that panicked does not stop later ones).
    pub(super) fn try_drain_lock(&self) -> Option<std::sync::MutexGuard<'_, DrainScratch>> {
        match self.drain_lock.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// A block's producer state: its own copy of the request-ring tail, and requests waiting for room in the ring.
#[derive(Debug, Default)]
pub(super) struct Producer {
    pub(super) tail: u32,
    pub(super) backlog: VecDeque<(RequestEntry, InFlight)>,
}

/// Buffers one drain pass of a block uses, kept between passes (a pass allocates nothing once they have grown).
#[derive(Debug, Default)]
pub(super) struct DrainScratch {
    /// Each entry drained, with its free-running DCQ position.
    pub(super) entries: Vec<(u32, Result<DcqEntry, UndecodableCompletion>)>,
    /// Index into `entries`, and the transfer it completes.
    pub(super) finished: Vec<(usize, InFlight)>,
    /// The block's place in its channel's SQE log, for the evidence.
    pub(super) records: super::observe::BlockRecords,
    /// The acts of each transfer of the pass, in `finished` order.
    pub(super) acts: Vec<[crate::evidence::Act; 3]>,
    /// The DCQ entries of `finished`, in order (the walk's input; a pass's own buffer).
    pub(super) walked: Vec<DcqEntry>,
}

/// A block's trace ring, as the Host holds it.
#[derive(Debug)]
pub(super) struct BlockTrace {
    pub(super) ring: TraceRing,
    /// Keeps the ring mapped while `ring` views it (and while any launch may still write it: until the transport
    /// drops).
    pub(super) _mapping: SharedMemory,
    /// The kernel's drop count as last read.
    pub(super) dropped_seen: u32,
    /// Drained entries of one pass (kept between passes).
    pub(super) scratch: Vec<TraceEntry>,
}
