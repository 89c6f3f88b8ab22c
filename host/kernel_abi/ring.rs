//! The rings shared with the kernel: their index math and the Host's typed views of them.
//!
//! Two index conventions, because the hardware dictates one of them:
//! - [`SpscIndex`]: this project's rings (request ring, DCQ) use free-running `u32` indices, `slot = index & mask`,
//!   `len = tail - head` (wrapping); full at `depth` entries (io-uring's convention).
//! - [`SqIndex`]: the SDMA SQ keeps wrapped indices (`tail = (tail + 1) % depth`, docs/hardware.md section 4), so it is
//!   full at `depth - 1` entries.
//!
//! The views are built once over a ring's shared mapping: [`RequestRing`] for the Host's side as producer of the
//! request ring (entries go in through a [`RequestBatch`], published with one Release store of the tail), and
//! [`CompletionRing`] for its side as consumer of the device completion queue (entries come out through
//! [`Completions`], whose drop publishes the head with Release), and [`TraceRing`] for its side as consumer of a
//! block's optional trace ring (the DCQ's protocol, plus the kernel's count of dropped entries). Every fence of the Host side of these rings is in
//! this file, each explained where it stands.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::layout::{DcqEntry, DcqStatus, RequestEntry, RingHeader, TraceEntry, TraceHeader, RING_HEADER_BYTES};

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

/// The SDMA SQ's wrapped indices (docs/hardware.md section 4).
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

/// A ring's shared mapping as the Host views it: the header's words as atomics, the entry array, the index rule.
#[derive(Debug)]
struct RingMapping<E> {
    header: NonNull<RingHeader>,
    entries: NonNull<E>,
    index: SpscIndex,
}

impl<E> RingMapping<E> {
    /// # Safety
    /// `mapping` is the cache-line-aligned start of a ring header followed by `index.depth()` entries of `E` in
    /// shared memory that stays mapped while the view lives; other agents access the header only atomically.
    unsafe fn new(mapping: *mut u8, index: SpscIndex) -> Self {
        let header = NonNull::new(mapping.cast::<RingHeader>()).expect("a shared mapping is never at address 0");
        // SAFETY: entries start RING_HEADER_BYTES into the mapping (the caller's contract sizes it for them).
        let entries = unsafe { header.cast::<u8>().add(RING_HEADER_BYTES as usize).cast::<E>() };
        RingMapping { header, entries, index }
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: the mapping outlives the view (contract of `new`); RingHeader's words are atomics, so shared
        // references to it are sound while the kernel writes them.
        unsafe { self.header.as_ref() }
    }

    /// The address of the entry in `slot`; inside the mapping's entry array when `slot` < depth, which callers
    /// ensure by taking slots from the index rule.
    fn entry(&self, slot: usize) -> *mut E {
        debug_assert!(slot < self.index.depth() as usize);
        self.entries.as_ptr().wrapping_add(slot)
    }
}

/// The Host's producer view of a request ring.
#[derive(Debug)]
pub struct RequestRing {
    ring: RingMapping<RequestEntry>,
}

// SAFETY: the view holds pointers into a shared mapping that outlives it (the contract of `RequestRing::new`); the
// header is touched only through atomics, and entry slots are written only through a `RequestBatch`, which borrows the
// producer's tail mutably, so one thread at a time writes slots.
unsafe impl Send for RequestRing {}
// SAFETY: as for Send.
unsafe impl Sync for RequestRing {}

impl RequestRing {
    /// A view of the request ring at `mapping`.
    ///
    /// # Safety
    /// `mapping` is the cache-line-aligned start of `request_ring_bytes(index.depth())` bytes of shared memory that
    /// stay mapped while the view lives; the kernel accesses the header only atomically and reads an entry only after
    /// acquiring a tail past it; the Host has one producer of this ring.
    pub unsafe fn new(mapping: *mut u8, index: SpscIndex) -> RequestRing {
        // SAFETY: the caller's contract is RingMapping's.
        RequestRing { ring: unsafe { RingMapping::new(mapping, index) } }
    }

    fn header(&self) -> &RingHeader {
        self.ring.header()
    }

    /// The ring's index rule.
    pub fn index(&self) -> SpscIndex {
        self.ring.index
    }

    /// The tail published so far. Acquire: the Host's own store, read by another Host thread (e.g. to see whether
    /// the block is idle).
    pub fn published_tail(&self) -> u32 {
        self.header().tail.load(Ordering::Acquire)
    }

    /// The kernel's head. Acquire: pairs with the kernel's release of the head after it read the entries before it.
    pub fn consumer_head(&self) -> u32 {
        self.header().head.load(Ordering::Acquire)
    }

    /// Starts writing entries after the producer's `tail`, with room for the slots that flow control allows: the
    /// Host keeps at most `depth` requests between `retired` (the position whose completions it has drained) and
    /// the tail, so no slot is overwritten before its request completed.
    pub fn batch<'a>(&'a self, tail: &'a mut u32, retired: u32) -> RequestBatch<'a> {
        let room = self.ring.index.free(retired, *tail);
        let next = *tail;
        RequestBatch { ring: self, tail, next, room }
    }
}

/// Entries being written to a request ring, published together by [`RequestBatch::commit`].
///
/// Dropping a batch without committing it publishes nothing: the slots it wrote lie past the published tail, so the
/// kernel never reads them, and the next batch overwrites them (rust-ibverbs' `PostBatch` shape).
#[derive(Debug)]
pub struct RequestBatch<'a> {
    ring: &'a RequestRing,
    tail: &'a mut u32,
    next: u32,
    room: u32,
}

impl RequestBatch<'_> {
    /// Writes `entry` into the next slot and returns its free-running position, or gives it back when flow control
    /// leaves no room.
    pub fn push(&mut self, entry: RequestEntry) -> Result<u32, RequestEntry> {
        if self.room == 0 {
            return Err(entry);
        }
        let position = self.next;
        let slot = self.ring.ring.index.slot(position) as usize;
        // SAFETY: the slot lies inside the mapping (`RingMapping::entry`); it is past the published tail, so the
        // kernel does not read it until a later Release of the tail; this batch holds the producer's tail mutably, so
        // no other Host thread writes slots now.
        unsafe { self.ring.ring.entry(slot).write(entry) };
        self.next = position.wrapping_add(1);
        self.room -= 1;
        Ok(position)
    }

    /// Entries pushed so far.
    pub fn len(&self) -> u32 {
        self.next.wrapping_sub(*self.tail)
    }

    /// Whether nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Publishes the pushed entries and returns how many there were.
    pub fn commit(self) -> u32 {
        let count = self.len();
        if count > 0 {
            *self.tail = self.next;
            // Release: the entries written above are visible to a kernel that acquires this tail.
            self.ring.header().tail.store(self.next, Ordering::Release);
        }
        count
    }
}

/// A DCQ entry that cannot be decoded: its status word is none the kernel writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("DCQ entry for transfer {} has status word {}, which the kernel never writes", .entry.transfer_id.get(), .entry.status.get())]
pub struct UndecodableCompletion {
    /// The entry as the device wrote it.
    pub entry: DcqEntry,
}

/// The Host's consumer view of a block's device completion queue.
#[derive(Debug)]
pub struct CompletionRing {
    ring: RingMapping<DcqEntry>,
}

// SAFETY: pointers into a shared mapping that outlives the view (contract of `CompletionRing::new`); the header is
// touched only through atomics and entries are only read, after acquiring a tail past them.
unsafe impl Send for CompletionRing {}
// SAFETY: as for Send.
unsafe impl Sync for CompletionRing {}

impl CompletionRing {
    /// A view of the DCQ at `mapping`.
    ///
    /// # Safety
    /// `mapping` is the cache-line-aligned start of `dcq_bytes(index.depth())` bytes of shared memory that stay
    /// mapped while the view lives; the kernel accesses the header only atomically and writes an entry only before
    /// releasing a tail past it.
    pub unsafe fn new(mapping: *mut u8, index: SpscIndex) -> CompletionRing {
        // SAFETY: the caller's contract is RingMapping's.
        CompletionRing { ring: unsafe { RingMapping::new(mapping, index) } }
    }

    fn header(&self) -> &RingHeader {
        self.ring.header()
    }

    /// Whether the kernel published entries not consumed yet (two atomic loads; Acquire on the kernel's tail).
    pub fn is_ready(&self) -> bool {
        self.header().tail.load(Ordering::Acquire) != self.header().head.load(Ordering::Relaxed)
    }

    /// The tail the kernel published (free-running; Acquire, pairs with the kernel's release store).
    pub fn published_tail(&self) -> u32 {
        self.header().tail.load(Ordering::Acquire)
    }

    /// The entries published so far, in ring order. One consumer at a time: the caller holds the block's drain lock.
    pub fn consume(&self) -> Completions<'_> {
        // Relaxed: the head is this consumer's own word.
        let head = self.header().head.load(Ordering::Relaxed);
        // Acquire pairs with the kernel's release store of the DCQ tail: the entries before it are complete.
        let tail = self.header().tail.load(Ordering::Acquire);
        let index = self.ring.index;
        let published = index.len(head, tail);
        let (end, corrupt_tail) =
            if published > index.depth() { (head.wrapping_add(index.depth()), Some(tail)) } else { (tail, None) };
        Completions { ring: self, head, next: head, end, corrupt_tail }
    }
}

/// Entries taken from a DCQ; dropping it publishes the head past the entries it yielded.
#[derive(Debug)]
pub struct Completions<'a> {
    ring: &'a CompletionRing,
    head: u32,
    next: u32,
    end: u32,
    corrupt_tail: Option<u32>,
}

impl Completions<'_> {
    /// The tail the kernel published, when it was more than a ring's depth past the head (a corrupt index: only a
    /// ring's depth of entries is read).
    pub fn corrupt_tail(&self) -> Option<u32> {
        self.corrupt_tail
    }

    /// The free-running position of the first entry.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Entries left to yield.
    pub fn remaining(&self) -> u32 {
        self.end.wrapping_sub(self.next)
    }
}

impl Iterator for Completions<'_> {
    /// An entry's free-running position, and the entry or why it cannot be decoded.
    type Item = (u32, Result<DcqEntry, UndecodableCompletion>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next == self.end {
            return None;
        }
        let position = self.next;
        let slot = self.ring.ring.index.slot(position) as usize;
        // SAFETY: the slot lies inside the mapping (`RingMapping::entry`); the kernel wrote it before the tail
        // acquired in `consume` and does not reuse the slot before the head published past it. DcqEntry is
        // FromBytes, so any bytes are a value.
        let entry = unsafe { self.ring.ring.entry(slot).read() };
        self.next = position.wrapping_add(1);
        let status = DcqStatus(entry.status.get());
        let decoded = if status.is_known() { Ok(entry) } else { Err(UndecodableCompletion { entry }) };
        Some((position, decoded))
    }
}

impl Drop for Completions<'_> {
    fn drop(&mut self) {
        if self.next != self.head {
            // Release: the kernel may reuse these slots once it acquires the new head; our reads of them come first.
            self.ring.header().head.store(self.next, Ordering::Release);
        }
    }
}

/// The Host's consumer view of a block's trace ring (`AivTraceHeader` + `AivTraceEntry[depth]`): the DCQ's
/// protocol, one consumer at a time.
#[derive(Debug)]
pub struct TraceRing {
    header: NonNull<TraceHeader>,
    entries: NonNull<TraceEntry>,
    index: SpscIndex,
}

// SAFETY: the view holds pointers into a shared mapping that outlives it (the contract of `TraceRing::new`); the
// header is touched only through atomics and entries are only read, by the one consumer (`drain_into` takes `&mut`).
unsafe impl Send for TraceRing {}
// SAFETY: as above; every method that reads entries or moves the head takes `&mut self`.
unsafe impl Sync for TraceRing {}

impl TraceRing {
    /// A view of the trace ring at `mapping`.
    ///
    /// # Safety
    /// `mapping` is the cache-line-aligned start of `trace_ring_bytes(index.depth())` bytes of shared memory that
    /// stay mapped while the view lives; the kernel accesses the header only atomically and writes an entry only
    /// before releasing a tail past it.
    pub unsafe fn new(mapping: *mut u8, index: SpscIndex) -> TraceRing {
        let header = NonNull::new(mapping.cast::<TraceHeader>()).expect("a shared mapping is never at address 0");
        // SAFETY: entries start right after the header (the caller's contract sizes the mapping for them).
        let entries = unsafe { header.cast::<u8>().add(RING_HEADER_BYTES as usize).cast::<TraceEntry>() };
        TraceRing { header, entries, index }
    }

    fn header(&self) -> &TraceHeader {
        // SAFETY: the mapping outlives the view; the header's words are atomics.
        unsafe { self.header.as_ref() }
    }

    /// Entries of the ring.
    pub fn depth(&self) -> u32 {
        self.index.depth()
    }

    /// Entries the kernel dropped so far because the ring was full (Relaxed: a count, ordered by nothing).
    pub fn dropped(&self) -> u32 {
        self.header().dropped.load(Ordering::Relaxed)
    }

    /// Appends the entries published so far to `out` and publishes the head past them; returns how many. A tail
    /// more than a ring's depth past the head (corrupt) reads only a ring's depth.
    pub fn drain_into(&mut self, out: &mut Vec<TraceEntry>) -> usize {
        let header = self.header();
        // Relaxed: the head is this consumer's own word.
        let head = header.head.load(Ordering::Relaxed);
        // Acquire pairs with the kernel's release store of the trace tail: the entries before it are complete.
        let tail = header.tail.load(Ordering::Acquire);
        let count = self.index.len(head, tail).min(self.index.depth());
        for position in 0..count {
            let slot = self.index.slot(head.wrapping_add(position)) as usize;
            // SAFETY: slot < depth lies inside the mapping; the kernel wrote it before the tail acquired above and
            // does not reuse it before the head published below. TraceEntry is FromBytes: any bytes are a value.
            out.push(unsafe { self.entries.as_ptr().add(slot).read() });
        }
        if count > 0 {
            // Release: the kernel may reuse these slots once it acquires the new head; our reads of them come first.
            header.head.store(head.wrapping_add(count), Ordering::Release);
        }
        count as usize
    }
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

    /// Cache-line-aligned zeroed memory standing in for a shared mapping.
    #[repr(C, align(64))]
    struct Mapping([u8; 128 + 8 * 64]);

    fn mapping() -> Box<Mapping> {
        Box::new(Mapping([0; 128 + 8 * 64]))
    }

    fn header(memory: &mut Mapping) -> &RingHeader {
        // SAFETY: the mapping starts with a zeroed, aligned RingHeader-sized area.
        unsafe { &*memory.0.as_mut_ptr().cast::<RingHeader>() }
    }

    fn request(id: u64) -> RequestEntry {
        RequestEntry { transfer_id: id.into(), ..RequestEntry::default() }
    }

    /// A batch publishes nothing until committed, stops at the flow-control limit, and a dropped batch leaves the
    /// tail where it was.
    #[test]
    fn a_request_batch_publishes_on_commit_only_and_respects_flow_control() {
        let mut memory = mapping();
        let base = memory.0.as_mut_ptr();
        let index = SpscIndex::new(8).expect("8");
        // SAFETY: the mapping holds a header and 8 request entries (64 bytes each) and outlives the view.
        let ring = unsafe { RequestRing::new(base, index) };
        let mut tail = 0u32;
        {
            let mut batch = ring.batch(&mut tail, 0);
            assert_eq!(batch.push(request(1)), Ok(0));
            assert_eq!(batch.push(request(2)), Ok(1));
            assert_eq!(ring.published_tail(), 0, "nothing is visible before commit");
            // Dropped without commit: rolled back.
        }
        assert_eq!((tail, ring.published_tail()), (0, 0));
        let mut batch = ring.batch(&mut tail, 0);
        for id in 0..8 {
            assert!(batch.push(request(id)).is_ok());
        }
        assert_eq!(batch.push(request(99)).map_err(|entry| entry.transfer_id.get()), Err(99), "ring full");
        assert_eq!(batch.commit(), 8);
        assert_eq!((tail, ring.published_tail()), (8, 8));
        // Two requests retired: room for two more, at free-running positions 8 and 9.
        let mut batch = ring.batch(&mut tail, 2);
        assert_eq!(batch.push(request(8)), Ok(8));
        assert_eq!(batch.push(request(9)), Ok(9));
        assert!(batch.push(request(10)).is_err());
        assert_eq!(batch.commit(), 2);
        assert_eq!(header(&mut memory).tail.load(Ordering::Relaxed), 10);
    }

    fn write_completion(memory: &mut Mapping, slot: usize, id: u64, status: u32) {
        let entry = DcqEntry { transfer_id: id.into(), status: status.into(), ..DcqEntry::default() };
        let offset = RING_HEADER_BYTES as usize + slot * std::mem::size_of::<DcqEntry>();
        memory.0[offset..offset + 32].copy_from_slice(zerocopy::IntoBytes::as_bytes(&entry));
    }

    /// Completions are read in order, only the ones yielded are released, an unknown status is an error naming the
    /// entry, and a tail more than a depth ahead is reported and clamped.
    #[test]
    fn completions_publish_the_head_on_drop_and_surface_bad_entries() {
        let mut memory = mapping();
        let index = SpscIndex::new(8).expect("8");
        write_completion(&mut memory, 0, 10, DcqStatus::COMPLETED.0);
        write_completion(&mut memory, 1, 11, 77);
        write_completion(&mut memory, 2, 12, DcqStatus::FAILED.0);
        header(&mut memory).tail.store(3, Ordering::Release);
        let base = memory.0.as_mut_ptr();
        // SAFETY: the mapping holds a header and 8 DCQ entries and outlives the view.
        let ring = unsafe { CompletionRing::new(base, index) };
        assert!(ring.is_ready());
        {
            let mut completions = ring.consume();
            assert_eq!(completions.corrupt_tail(), None);
            let (position, first) = completions.next().expect("first");
            assert_eq!((position, first.map(|entry| entry.transfer_id.get())), (0, Ok(10)));
            let (_, second) = completions.next().expect("second");
            let error = second.expect_err("status 77 is no status");
            assert_eq!(error.entry.transfer_id.get(), 11);
            assert!(error.to_string().contains("77"), "{error}");
        }
        // Two yielded, two released; the third is still there.
        // SAFETY: as above.
        let head = unsafe { &*base.cast::<RingHeader>() }.head.load(Ordering::Acquire);
        assert_eq!(head, 2);
        assert!(ring.is_ready());
        assert_eq!(ring.consume().count(), 1);
        assert!(!ring.is_ready());
        // SAFETY: as above.
        unsafe { &*base.cast::<RingHeader>() }.tail.store(3 + 100, Ordering::Release);
        let completions = ring.consume();
        assert_eq!(completions.corrupt_tail(), Some(103));
        assert_eq!(completions.remaining(), 8, "only a ring's depth is read");
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
