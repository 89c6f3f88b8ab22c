//! Peers' segments: opened by name, fetched again on request or after a failed transfer, closed.

use std::sync::Arc;

use super::{lock, read, write, TransferEngine};
use crate::error::{EngineError, Result};
use crate::transfer::{Segment, SegmentId};

impl TransferEngine {
    /// Opens a segment by name; the engine's own name is [`SegmentId::LOCAL`]. An already-open name returns its id.
    pub fn open_segment(&self, name: &str) -> Result<SegmentId> {
        if name == self.name {
            return Ok(SegmentId::LOCAL);
        }
        if let Some(id) = read(&self.segments).id_of(name) {
            return Ok(id);
        }
        let descriptor = self.metadata.fetch(name)?;
        let mut segments = write(&self.segments);
        if let Some(id) = segments.id_of(name) {
            return Ok(id);
        }
        let id = segments.next_id();
        let mut segment = Segment::from_descriptor(id, descriptor)
            .map_err(|reason| EngineError::SegmentNotFound { name: name.to_owned(), reason })?;
        // Cache under the name the caller used (a peer may call itself differently, e.g. localhost vs 127.0.0.1),
        // so opening the same name again hits the cache.
        segment.name = name.to_owned();
        tracing::debug!(name, id = id.0, buffers = segment.buffers.len(), "segment opened");
        segments.insert(Arc::new(segment));
        Ok(id)
    }

    /// Fetches the descriptor of an open segment again and replaces the cached one.
    pub fn refresh_segment(&self, id: SegmentId) -> Result<()> {
        if id == SegmentId::LOCAL {
            return Ok(());
        }
        let name = self.segment(id)?.name.clone();
        let descriptor = self.metadata.fetch(&name)?;
        let mut segment = Segment::from_descriptor(id, descriptor)
            .map_err(|reason| EngineError::SegmentNotFound { name: name.clone(), reason })?;
        segment.name = name;
        write(&self.segments).insert(Arc::new(segment));
        Ok(())
    }

    /// Marks segment `name` as one a transfer to failed: the next [`Self::refresh_if_suspect`] for it fetches its
    /// descriptor again. A peer restarted under the same name (the same RPC port in P2P mode, the same name in a
    /// store) then is found with its new data port, device and buffers. The Python binding and `aiv bench --mode
    /// initiator` mark a segment after a failed transfer and refresh before the next submission to it.
    pub fn suspect_segment(&self, name: &str) {
        lock(&self.suspect_segments).insert(name.to_owned());
    }

    /// Fetches the descriptor of segment `name` again if it was marked by [`Self::suspect_segment`] since the last
    /// fetch (clearing the mark); whether a new descriptor replaced the cached one. A fetch that fails (the peer is
    /// still gone) keeps the cached descriptor, so transfers fail as they would without it (and mark it again).
    pub fn refresh_if_suspect(&self, name: &str) -> bool {
        if !lock(&self.suspect_segments).remove(name) {
            return false;
        }
        match self.open_segment(name).and_then(|id| self.refresh_segment(id)) {
            Ok(()) => {
                tracing::debug!(segment = %name, "descriptor fetched again after a failed transfer");
                true
            }
            Err(error) => {
                tracing::debug!(segment = %name, %error, "descriptor kept: fetching it again failed");
                false
            }
        }
    }

    /// Forgets an open segment.
    pub fn close_segment(&self, id: SegmentId) -> Result<()> {
        if id == SegmentId::LOCAL {
            return Ok(());
        }
        write(&self.segments)
            .remove(id)
            .map(drop)
            .ok_or(EngineError::UnknownSegment { operation: "close segment", id: id.0 })
    }

    /// The open segment `id`.
    pub fn segment(&self, id: SegmentId) -> Result<Arc<Segment>> {
        if id == SegmentId::LOCAL {
            return Ok(read(&self.local_segment).clone());
        }
        read(&self.segments).get(id).cloned().ok_or(EngineError::UnknownSegment { operation: "segment", id: id.0 })
    }
}
