//! The segments an engine has opened, by id and by name.

use std::collections::HashMap;
use std::sync::Arc;

use crate::transfer::{Segment, SegmentId};

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
