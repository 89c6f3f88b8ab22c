//! Index math of the rings shared with the kernel.
//!
//! Two conventions, because the hardware dictates one of them:
//! - [`SpscIndex`]: this project's rings (request ring, DCQ) use free-running `u32` indices, `slot = index & mask`,
//!   `len = tail - head` (wrapping); full at `depth` entries (io-uring's convention).
//! - [`SqIndex`]: the SDMA SQ keeps wrapped indices (`tail = (tail + 1) % depth`, HARDWARE.md section 4), so it is
//!   full at `depth - 1` entries.
//!
//! Atomic accessors for ring words in shared memory are here too, so every fence of the Host side is in one place.

use std::sync::atomic::{AtomicU32, Ordering};

/// A power-of-two SPSC ring with free-running indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpscIndex {
    mask: u32,
}

impl SpscIndex {
    /// `depth` must be a power of two from 2 to 2^31.
    pub fn new(depth: u32) -> Option<SpscIndex> {
        (depth >= 2 && depth.is_power_of_two() && depth <= 1 << 31).then(|| SpscIndex { mask: depth - 1 })
    }
    /// Entries in the ring.
    pub fn depth(self) -> u32 {
        self.mask + 1
    }
    /// Slot of a free-running index.
    pub fn slot(self, index: u32) -> u32 {
        index & self.mask
    }
    /// Entries published and not yet consumed; a value above `depth` means a corrupt peer index.
    pub fn len(self, head: u32, tail: u32) -> u32 {
        tail.wrapping_sub(head)
    }
    /// Whether nothing is waiting.
    pub fn is_empty(self, head: u32, tail: u32) -> bool {
        head == tail
    }
    /// Slots the producer may still fill (0 if the peer's index is corrupt).
    pub fn free(self, head: u32, tail: u32) -> u32 {
        self.depth().saturating_sub(self.len(head, tail))
    }
}

/// The SDMA SQ's wrapped indices (HARDWARE.md section 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqIndex {
    depth: u32,
}

impl SqIndex {
    /// `depth` must be at least 2 (the config requires a power of two from 4).
    pub fn new(depth: u32) -> Option<SqIndex> {
        (depth >= 2).then_some(SqIndex { depth })
    }
    /// Entries in the ring (one is always left empty).
    pub fn depth(self) -> u32 {
        self.depth
    }
    /// The index after `index`.
    pub fn next(self, index: u32) -> u32 {
        if index + 1 >= self.depth {
            0
        } else {
            index + 1
        }
    }
    /// SQEs between `head` and `tail`; `None` if either index is out of range (a corrupt register).
    pub fn len(self, head: u32, tail: u32) -> Option<u32> {
        (head < self.depth && tail < self.depth)
            .then(|| if tail >= head { tail - head } else { self.depth - head + tail })
    }
    /// Byte offset of SQE `index` from `sq_base`.
    pub fn offset(self, index: u32) -> u64 {
        u64::from(index) * super::layout::SQE_BYTES
    }
}

/// Atomic view of a `u32` ring word in shared memory.
///
/// # Safety
/// `word` must be a 4-byte-aligned address, valid for the returned lifetime, that every other agent accesses only
/// atomically (the kernel uses acquire/release builtins, the NPU uses dcci-bracketed single stores).
pub unsafe fn atomic_word<'a>(word: *mut u32) -> &'a AtomicU32 {
    // SAFETY: the caller guarantees alignment, validity and atomic-only access (the contract of `from_ptr`).
    unsafe { AtomicU32::from_ptr(word) }
}

/// Loads a peer's index: Acquire, so the entries the peer wrote before publishing it are visible.
pub fn load_peer(word: &AtomicU32) -> u32 {
    word.load(Ordering::Acquire)
}

/// Publishes an own index: Release, so the entries written before it are visible to a peer that acquires it.
pub fn publish(word: &AtomicU32, value: u32) {
    word.store(value, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Free-running indices agree with a model that counts entries, across u32 wraparound.
        #[test]
        fn spsc_matches_a_counting_model(depth_log in 1u32..12, start in any::<u32>(), ops in proptest::collection::vec(any::<bool>(), 0..300)) {
            let ring = SpscIndex::new(1 << depth_log).expect("power of two");
            let (mut head, mut tail, mut model) = (start, start, 0u32);
            let mut slots_in_use = std::collections::VecDeque::new();
            for produce in ops {
                if produce && ring.free(head, tail) > 0 {
                    prop_assert!(!slots_in_use.contains(&ring.slot(tail)), "slot reused while occupied");
                    slots_in_use.push_back(ring.slot(tail));
                    tail = tail.wrapping_add(1);
                    model += 1;
                } else if !produce && !ring.is_empty(head, tail) {
                    prop_assert_eq!(slots_in_use.pop_front(), Some(ring.slot(head)));
                    head = head.wrapping_add(1);
                    model -= 1;
                }
                prop_assert_eq!(ring.len(head, tail), model);
                prop_assert!(model <= ring.depth());
                prop_assert_eq!(ring.free(head, tail), ring.depth() - model);
            }
        }

        /// Wrapped SQ indices agree with a counting model and never exceed depth - 1 entries.
        #[test]
        fn sq_matches_a_counting_model(depth in 2u32..300, start_raw in any::<u32>(), ops in proptest::collection::vec(any::<bool>(), 0..600)) {
            let sq = SqIndex::new(depth).expect("depth >= 2");
            let start = start_raw % depth;
            let (mut head, mut tail, mut model) = (start, start, 0u32);
            for produce in ops {
                if produce && model < depth - 1 {
                    tail = sq.next(tail);
                    model += 1;
                } else if !produce && model > 0 {
                    head = sq.next(head);
                    model -= 1;
                }
                prop_assert!(head < depth && tail < depth);
                prop_assert_eq!(sq.len(head, tail), Some(model));
            }
            prop_assert_eq!(sq.len(depth, 0), None);
        }
    }

    #[test]
    fn constructors_refuse_bad_depths() {
        assert!(SpscIndex::new(0).is_none() && SpscIndex::new(3).is_none() && SpscIndex::new(1).is_none());
        assert!(SqIndex::new(1).is_none());
        // A corrupt peer index never yields room to write.
        let ring = SpscIndex::new(8).expect("8");
        assert_eq!(ring.free(0, 100), 0);
    }
}
