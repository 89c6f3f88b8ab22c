//! First-fit allocator over one device address range (the backend's VMM-mapped HBM heap). Owns only offsets: it
//! never touches the memory, which the Host cannot dereference on an NPU.

use std::sync::Mutex;

/// Allocation granularity and alignment of [`RangeAllocator`] (bytes).
pub const ALIGN: u64 = 512;

/// Free ranges of `[base, base + length)`, sorted by address and merged on free.
#[derive(Debug)]
pub struct RangeAllocator {
    base: u64,
    length: u64,
    free: Mutex<Vec<(u64, u64)>>,
}

impl RangeAllocator {
    /// All of `[base, base + length)` free.
    pub fn new(base: u64, length: u64) -> Self {
        RangeAllocator { base, length, free: Mutex::new(vec![(base, length)]) }
    }

    /// First byte of the range.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Bytes of the range.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Whether `[addr, addr + length)` lies inside the range.
    pub fn contains(&self, addr: u64, length: u64) -> bool {
        addr >= self.base && addr.checked_add(length).is_some_and(|end| end <= self.base + self.length)
    }

    /// `length` bytes rounded up to [`ALIGN`], or `None` when no free range is large enough.
    pub fn allocate(&self, length: u64) -> Option<(u64, u64)> {
        let rounded = length.checked_add(ALIGN - 1)? / ALIGN * ALIGN;
        if rounded == 0 {
            return None;
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let index = free.iter().position(|&(_, len)| len >= rounded)?;
        let (start, len) = free[index];
        if len == rounded {
            free.remove(index);
        } else {
            free[index] = (start + rounded, len - rounded);
        }
        Some((start, rounded))
    }

    /// Returns `[addr, addr + length)` (as handed out by [`RangeAllocator::allocate`]).
    pub fn release(&self, addr: u64, length: u64) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let index = free.partition_point(|&(start, _)| start < addr);
        free.insert(index, (addr, length));
        // Merge with the next range, then with the previous one.
        if index + 1 < free.len() && free[index].0 + free[index].1 == free[index + 1].0 {
            free[index].1 += free[index + 1].1;
            free.remove(index + 1);
        }
        if index > 0 && free[index - 1].0 + free[index - 1].1 == free[index].0 {
            free[index - 1].1 += free[index].1;
            free.remove(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_disjoint_and_merge_back() {
        let heap = RangeAllocator::new(0x10_0000, 4 * ALIGN);
        let a = heap.allocate(1).expect("first");
        let b = heap.allocate(ALIGN + 1).expect("second");
        assert_eq!(a, (0x10_0000, ALIGN));
        assert_eq!(b, (0x10_0000 + ALIGN, 2 * ALIGN));
        assert!(heap.allocate(2 * ALIGN).is_none(), "only one granule left");
        heap.release(a.0, a.1);
        heap.release(b.0, b.1);
        assert_eq!(heap.allocate(4 * ALIGN), Some((0x10_0000, 4 * ALIGN)), "frees merged into one range");
        assert!(heap.contains(0x10_0000, 4 * ALIGN) && !heap.contains(0x10_0000, 4 * ALIGN + 1));
        assert!(heap.allocate(0).is_none());
    }
}
