//! The peer probe: a thread that asks, every `peer_probe_interval_ms`, whether each imported peer still serves its
//! memory, and fails the transfers pending to one found gone.
//!
//! Owns: the probe loop and the failure of pending transfers to a lost peer. It must not decide loss itself: the
//! device backend's probe does ([`crate::transport::window::PeerWindows::probe_all`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::inflight::InFlight;
use super::Inner;
use crate::transfer::{FailureKind, TransferFailure};
use crate::transport::window::Peer;

impl Inner {
    /// Probes every imported peer each probe interval until stop; declares lost the ones that are gone.
    pub(super) fn probe_loop(self: Arc<Self>) {
        while !self.stop.load(Ordering::Acquire) {
            for peer in self.windows.probe_all() {
                self.fail_pending_to(&peer);
            }
            self.nap(self.probe_interval);
        }
    }

    /// Fails every transfer still pending to `peer`, just marked lost (the DCQ entries that come later find their
    /// tasks already terminal and change nothing).
    fn fail_pending_to(&self, peer: &Arc<Peer>) {
        let reason = peer.lost_reason().unwrap_or_default();
        tracing::warn!(segment = %peer.name(), %reason, "aiv peer lost");
        let failure = TransferFailure::new(
            "aiv",
            FailureKind::PeerLost,
            format!("peer segment {:?} lost while the transfer was pending: {reason}", peer.name()),
        );
        let reaches = |inflight: &InFlight| inflight.peer == Some(peer.id());
        let mut failed = 0usize;
        // Backlog before the in-flight map: an entry moves from the first to the second, so none is missed.
        for block in &self.blocks {
            {
                let producer = block.producer.lock().unwrap_or_else(|p| p.into_inner());
                for (_, inflight) in producer.backlog.iter().filter(|(_, inflight)| reaches(inflight)) {
                    failed += usize::from(inflight.slot.fail(failure.clone()));
                }
            }
            for inflight in block.inflight_map().iter().filter(|inflight| reaches(inflight)) {
                failed += usize::from(inflight.slot.fail(failure.clone()));
            }
        }
        tracing::warn!(segment = %peer.name(), failed, "pending transfers to a lost peer failed");
        // Threads polling for DCQ tails learn of these failures from this counter: they never reach a DCQ.
        self.host_finished.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}
