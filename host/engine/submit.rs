//! Batches and submission: a batch allocated, each request checked (its local range inside one registered buffer,
//! its target range inside one buffer of the target segment, a stale descriptor fetched again at most every
//! [`STALE_REFRESH_INTERVAL`]) and routed to its transport, or refused with a [`RouteError`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{deadline_after, lock, read, Batch, TransferEngine, STALE_REFRESH_INTERVAL};
use crate::error::{EngineError, Result};
use crate::transfer::{
    BatchId, FailureKind, Protocol, RangeError, Segment, SegmentId, TaskSlot, Transfer, TransferFailure,
    TransferRequest,
};
use crate::transport::Transport;

/// What [`TransferEngine::route`] looked up last within one submit.
#[derive(Default)]
struct RouteCache {
    segment: Option<(SegmentId, Arc<Segment>)>,
    transport: Option<(Protocol, Arc<dyn Transport>)>,
}

/// Why the engine refused a request before any transport saw it.
#[derive(Debug, thiserror::Error)]
enum RouteError {
    /// The target segment id is not open.
    #[error(transparent)]
    Segment(EngineError),
    /// The source range is not inside one registered local buffer.
    #[error("source range is not inside one registered local buffer: {0}")]
    Source(RangeError),
    /// The target range is not inside one buffer of the target segment.
    #[error("target range is not inside one buffer of segment {segment:?}: {error}")]
    Target { segment: String, error: RangeError },
    /// No transport of the request's protocol is installed.
    #[error("protocol {protocol} has no transport in this engine for segment {segment:?}")]
    NoTransport { protocol: Protocol, segment: String },
    /// A tcp request names device memory the Host cannot read or write.
    #[error(
        "protocol tcp moves memory with the Host's own reads and writes, and the {side} range is device memory \
         ({location}), which the Host cannot reach (on the twin runtime as on an NPU); use aiv, adxl or ubshmem for \
         device memory"
    )]
    DeviceMemoryOverTcp { side: &'static str, location: String },
}

impl RouteError {
    /// The failure of the rejected task, with Mooncake's code for the refusal.
    fn failure(&self) -> TransferFailure {
        let mooncake_code = match self {
            RouteError::Segment(error) => error.mooncake_code(),
            // ERR_ADDRESS_NOT_REGISTERED, as Mooncake answers a range outside the registered buffers.
            RouteError::Source(_) | RouteError::Target { .. } => 3,
            // ERR_NOT_SUPPORTED_TRANSPORT.
            RouteError::NoTransport { .. } | RouteError::DeviceMemoryOverTcp { .. } => 8,
        };
        TransferFailure::new("engine", FailureKind::Rejected, self.to_string()).with_mooncake_code(mooncake_code)
    }
}

impl TransferEngine {
    /// Allocates a batch that holds up to `capacity` requests over all its submissions.
    pub fn allocate_batch(&self, capacity: usize) -> Result<BatchId> {
        if capacity == 0 {
            return Err(EngineError::InvalidArgument {
                operation: "allocate batch",
                reason: "capacity is zero".into(),
            });
        }
        let id = BatchId(self.next_batch.fetch_add(1, Ordering::Relaxed));
        lock(&self.batches).insert(id, Arc::new(Batch::new(capacity)));
        Ok(id)
    }

    pub(super) fn batch(&self, operation: &'static str, id: BatchId) -> Result<Arc<Batch>> {
        lock(&self.batches).get(&id).cloned().ok_or(EngineError::UnknownBatch { operation, id: id.0 })
    }

    /// Submits requests to a batch; may be called several times per batch.
    ///
    /// Fails as a whole only for an unknown batch or with TooManyRequests. Each request is then checked on its own;
    /// one that fails its checks becomes a FAILED task with the reason (see [`Self::task_reason`]) and touches no
    /// memory, while the others proceed.
    pub fn submit_transfer(&self, batch_id: BatchId, requests: &[TransferRequest]) -> Result<()> {
        let batch = self.batch("submit transfer", batch_id)?;
        // By transport, in the order of their first request (a batch rarely uses more than one or two).
        let mut by_transport: Vec<(Arc<dyn Transport>, Vec<Transfer>)> = Vec::new();
        let mut cache = RouteCache::default();
        {
            let mut tasks = batch.tasks();
            if tasks.len() + requests.len() > batch.capacity {
                return Err(EngineError::TooManyRequests {
                    batch: batch_id.0,
                    capacity: batch.capacity,
                    submitted: tasks.len(),
                    requested: requests.len(),
                });
            }
            let deadline = deadline_after(self.config.aiv.transfer_timeout);
            for request in requests {
                match self.route(request, &mut cache) {
                    Ok((transport, target)) => {
                        let slot = Arc::new(TaskSlot::new(deadline, batch.signal.clone()));
                        tasks.push(slot.clone());
                        let transfer = Transfer {
                            opcode: request.opcode,
                            local_addr: request.source,
                            remote_addr: request.target_offset,
                            length: request.length,
                            target,
                            slot,
                        };
                        let key = Arc::as_ptr(&transport) as *const ();
                        match by_transport.iter_mut().find(|(known, _)| Arc::as_ptr(known) as *const () == key) {
                            Some((_, transfers)) => transfers.push(transfer),
                            None => by_transport.push((transport, vec![transfer])),
                        }
                    }
                    Err(error) => {
                        // The engine's own target (not this file's module path): what users filter on and what the
                        // audit's reports record, whichever file of the engine submits.
                        tracing::warn!(target: "aiv_transport::engine", batch = batch_id.0, task = tasks.len(), %error,
                            "request rejected");
                        tasks.push(Arc::new(TaskSlot::rejected(error.failure(), batch.signal.clone())));
                    }
                }
            }
        }
        let traced = self.tracer.is_enabled();
        for (transport, transfers) in by_transport {
            batch.note_transport(transport.completion_poller());
            if traced {
                batch.note_traced_path(transport.name());
            }
            for transfer in &transfers {
                transfer.slot.mark_pending();
            }
            let (count, start) = (transfers.len() as u64, if traced { crate::trace::now_ns() } else { 0 });
            transport.submit(transfers);
            if traced {
                let end = crate::trace::now_ns();
                self.tracer.host(transport.name(), crate::trace::HostStage::Submit, start, end, batch_id.0, count);
            }
        }
        Ok(())
    }

    /// Checks one request and picks its transport; the error becomes the task's failure. `cache` keeps the last
    /// segment and transport looked up, for the next request of the same submit (most name one segment and one
    /// protocol).
    fn route(
        &self,
        request: &TransferRequest,
        cache: &mut RouteCache,
    ) -> std::result::Result<(Arc<dyn Transport>, Arc<Segment>), RouteError> {
        let protocol = request.protocol.unwrap_or(self.config.protocol);
        let mut target = match &cache.segment {
            Some((id, segment)) if *id == request.target_id => segment.clone(),
            _ => {
                let segment = self.segment(request.target_id).map_err(RouteError::Segment)?;
                cache.segment = Some((request.target_id, segment.clone()));
                segment
            }
        };
        let locate = |segment: &Segment| segment.buffers.find_containing(request.target_offset, request.length).is_ok();
        let mut located = locate(&target);
        if !located && self.may_refresh_stale(request.target_id) {
            // The peer may have registered this memory after the segment was opened, or restarted under the same
            // name with other buffers: its descriptor is fetched once more before the request is refused.
            match self.refresh_segment(request.target_id) {
                Ok(()) => {
                    target = self.segment(request.target_id).map_err(RouteError::Segment)?;
                    cache.segment = Some((request.target_id, target.clone()));
                    located = locate(&target);
                }
                Err(error) => tracing::debug!(segment = %target.name, %error, "descriptor refresh failed"),
            }
        }
        {
            let memory = read(&self.memory);
            let source = memory.find_containing(request.source, request.length).map_err(RouteError::Source)?;
            // The target buffer is looked up again only for its error or, on tcp, its location.
            if !located || protocol == Protocol::Tcp {
                let target_buffer = target
                    .buffers
                    .find_containing(request.target_offset, request.length)
                    .map_err(|error| RouteError::Target { segment: target.name.clone(), error })?;
                if protocol == Protocol::Tcp {
                    Self::check_host_reachable(&source.location, &target_buffer.location)?;
                }
            }
        }
        // A Host-protocol transfer into this process's own segment needs no wire: copy in place.
        if request.target_id == SegmentId::LOCAL && protocol == Protocol::Tcp {
            return Ok((self.local_transport.clone(), target));
        }
        if let Some((known, transport)) = &cache.transport {
            if *known == protocol {
                return Ok((transport.clone(), target));
            }
        }
        if let Some(transport) = read(&self.transports).get(&protocol) {
            cache.transport = Some((protocol, transport.clone()));
            return Ok((transport.clone(), target));
        }
        Err(RouteError::NoTransport { protocol, segment: target.name.clone() })
    }

    /// Whether a request into no buffer of segment `id`'s cached descriptor may fetch it again now (a remote
    /// segment, not refreshed so within [`STALE_REFRESH_INTERVAL`]); records the attempt.
    pub(super) fn may_refresh_stale(&self, id: SegmentId) -> bool {
        if id == SegmentId::LOCAL {
            return false;
        }
        let mut refreshes = lock(&self.stale_refreshes);
        let now = Instant::now();
        match refreshes.get(&id) {
            Some(last) if now.duration_since(*last) < STALE_REFRESH_INTERVAL => false,
            _ => {
                refreshes.insert(id, now);
                true
            }
        }
    }

    /// Refuses a tcp request whose source or target is device memory (location `npu:<id>`), which the Host's reads
    /// and writes cannot reach (on the twin runtime as on an NPU).
    fn check_host_reachable(source_location: &str, target_location: &str) -> std::result::Result<(), RouteError> {
        for (side, location) in [("source", source_location), ("target", target_location)] {
            if location.starts_with("npu:") {
                return Err(RouteError::DeviceMemoryOverTcp { side, location: location.to_owned() });
            }
        }
        Ok(())
    }
}
