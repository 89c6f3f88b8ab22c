//! Opened segments: a descriptor plus the buffer set its transfers are checked against.

use std::collections::HashMap;
use std::sync::Arc;

use super::memory::{BufferSet, RegisteredBuffer};
use super::request::SegmentId;
use crate::metadata::SegmentDescriptor;

/// A segment as the engine sees it after `open_segment`.
#[derive(Debug)]
pub struct Segment {
    /// The handle `open_segment` returned.
    pub id: SegmentId,
    /// Segment name (`host:port` in P2P mode).
    pub name: String,
    /// The descriptor the segment was opened with.
    pub descriptor: SegmentDescriptor,
    /// The descriptor's buffers, indexed for the bounds check.
    pub buffers: BufferSet,
}

impl Segment {
    /// Builds a segment from a descriptor; a descriptor whose buffers are empty, zero-length or overlapping is
    /// rejected with the reason.
    pub fn from_descriptor(id: SegmentId, descriptor: SegmentDescriptor) -> Result<Segment, String> {
        let mut buffers = BufferSet::new();
        for (index, buffer) in descriptor.buffers.iter().enumerate() {
            let registered =
                RegisteredBuffer { addr: buffer.addr, length: buffer.length, location: buffer.name.clone() };
            buffers.insert(registered).map_err(|error| format!("buffer {index} of the descriptor: {error}"))?;
        }
        Ok(Segment { id, name: descriptor.name.clone(), descriptor, buffers })
    }
}

/// The segments this engine has opened, by id and by name.
#[derive(Debug, Default)]
pub(crate) struct SegmentTable {
    by_id: HashMap<SegmentId, Arc<Segment>>,
    by_name: HashMap<String, SegmentId>,
    next_id: u64,
}

impl SegmentTable {
    pub(crate) fn get(&self, id: SegmentId) -> Option<&Arc<Segment>> {
        self.by_id.get(&id)
    }

    pub(crate) fn id_of(&self, name: &str) -> Option<SegmentId> {
        self.by_name.get(name).copied()
    }

    /// Allocates the next remote segment id (never 0, which is the local segment).
    pub(crate) fn next_id(&mut self) -> SegmentId {
        self.next_id += 1;
        SegmentId(self.next_id)
    }

    /// Inserts or replaces the segment stored under its id and name.
    pub(crate) fn insert(&mut self, segment: Arc<Segment>) {
        self.by_name.insert(segment.name.clone(), segment.id);
        self.by_id.insert(segment.id, segment);
    }

    pub(crate) fn remove(&mut self, id: SegmentId) -> Option<Arc<Segment>> {
        let segment = self.by_id.remove(&id)?;
        self.by_name.remove(&segment.name);
        Some(segment)
    }
}
