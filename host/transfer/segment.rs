//! An opened segment: a descriptor plus the buffer set its transfers are checked against.

use super::descriptor::SegmentDescriptor;
use super::memory::{BufferSet, RegisteredBuffer};
use super::request::SegmentId;

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
