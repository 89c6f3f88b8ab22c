//! The transfers in flight on one block, by request-ring slot.
//!
//! Owns: the slot table and what the Host remembers of each transfer until its completion is drained. It must not
//! read or write the rings.

use std::sync::Arc;

use crate::transfer::TaskSlot;

/// What the Host keeps of one transfer between submit and completion.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) slot: Arc<TaskSlot>,
    /// The [`crate::transport::window::Peer::id`] of the peer the transfer reaches, if not this device's own memory.
    pub(super) peer: Option<u64>,
    pub(super) length: u64,
    /// The RDMA route's QP the request was posted on (`None`: SDMA).
    pub(super) rdma: Option<PostedOn>,
    /// The process's classified Host calls when the transfer was submitted (zero where the device model observes
    /// the acts: no mark is taken there).
    pub(super) host_mark: super::observe::HostMark,
}

/// The QP slot of its block a request on the RDMA route was posted on, and the number of the slot's QP then (it
/// stays the slot's QP until the request is drained).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PostedOn {
    pub(super) slot: u32,
    pub(super) qpn: u32,
}

/// The transfers in flight on one block, by request-ring slot. The kernel completes a block's requests in ring order
/// (DCQ position p belongs to request position p), so a completion finds its transfer without a search; the
/// transfer id in the DCQ entry confirms it.
#[derive(Debug)]
pub(super) struct InFlightTable {
    slots: Vec<Option<(u64, InFlight)>>,
}

impl InFlightTable {
    pub(super) fn new(depth: usize) -> Self {
        InFlightTable { slots: (0..depth).map(|_| None).collect() }
    }

    pub(super) fn insert(&mut self, slot: usize, transfer_id: u64, inflight: InFlight) {
        if let Some((stale, _)) = self.slots[slot].replace((transfer_id, inflight)) {
            // Cannot happen while the ring's flow control holds (a slot is reused only after its entry drained).
            tracing::error!(slot, stale, transfer_id, "request-ring slot reused while its transfer was in flight");
        }
    }

    /// The transfer `transfer_id`, expected in `slot`; searched for if a completion ever arrives out of order.
    pub(super) fn take(&mut self, slot: usize, transfer_id: u64) -> Option<InFlight> {
        let position = if self.slots[slot].as_ref().is_some_and(|(id, _)| *id == transfer_id) {
            slot
        } else {
            self.slots.iter().position(|entry| entry.as_ref().is_some_and(|(id, _)| *id == transfer_id))?
        };
        self.slots[position].take().map(|(_, inflight)| inflight)
    }

    /// The length of the transfer in `slot`, if one is in flight there.
    pub(super) fn length_at(&self, slot: usize) -> Option<u64> {
        self.slots.get(slot)?.as_ref().map(|(_, inflight)| inflight.length)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &InFlight> {
        self.slots.iter().filter_map(|entry| entry.as_ref().map(|(_, inflight)| inflight))
    }

    pub(super) fn drain(&mut self) -> impl Iterator<Item = InFlight> + '_ {
        self.slots.iter_mut().filter_map(|entry| entry.take().map(|(_, inflight)| inflight))
    }
}
