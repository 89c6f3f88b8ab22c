//! Registered buffers and the bounds rule every transfer is checked against.
//!
//! A range is acceptable only if it lies inside ONE registered buffer: two adjacent buffers are not one buffer, even
//! when their ranges touch (Mooncake's TCP server applies the same rule).

use std::collections::BTreeMap;

use crate::error::EngineError;

/// Where a registered buffer lives (Mooncake's `location`: `"*"`, `"cpu:0"`, `"npu:0"`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredBuffer {
    /// First byte.
    pub addr: u64,
    /// Length in bytes, never zero.
    pub length: u64,
    /// Location string given at registration.
    pub location: String,
}

impl RegisteredBuffer {
    /// One past the last byte; never overflows (checked at insertion).
    pub fn end(&self) -> u64 {
        self.addr + self.length
    }
}

/// Why a range is not inside one buffer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Length zero.
    #[error("length is zero")]
    ZeroLength,
    /// `addr + length` does not fit in 64 bits.
    #[error("range [{addr:#x}, +{length}) overflows the 64-bit address space")]
    Overflow { addr: u64, length: u64 },
    /// No registered buffer contains the start address.
    #[error("[{addr:#x}, +{length}) starts in no registered buffer")]
    NotRegistered { addr: u64, length: u64 },
    /// The start is inside a buffer but the end is past it.
    #[error(
        "[{addr:#x}, +{length}) runs {overrun} byte(s) past the end of the buffer [{buffer_addr:#x}, +{buffer_length})"
    )]
    PastEnd { addr: u64, length: u64, buffer_addr: u64, buffer_length: u64, overrun: u64 },
}

/// A set of non-overlapping buffers, ordered by start address.
#[derive(Clone, Debug, Default)]
pub struct BufferSet {
    by_start: BTreeMap<u64, RegisteredBuffer>,
}

impl BufferSet {
    /// An empty set.
    pub fn new() -> Self {
        BufferSet::default()
    }

    /// Adds a buffer; rejects length 0, ranges past the end of the address space and overlaps.
    pub fn insert(&mut self, buffer: RegisteredBuffer) -> Result<(), EngineError> {
        let (addr, length) = (buffer.addr, buffer.length);
        if length == 0 {
            return Err(EngineError::InvalidRegistration { addr, length, reason: "length is zero" });
        }
        let Some(end) = addr.checked_add(length) else {
            return Err(EngineError::InvalidRegistration { addr, length, reason: "range overflows the address space" });
        };
        // The only candidates for overlap: the last buffer starting before `end`.
        if let Some((_, existing)) = self.by_start.range(..end).next_back() {
            if existing.end() > addr {
                return Err(EngineError::AddressOverlapped {
                    addr,
                    length,
                    existing_addr: existing.addr,
                    existing_length: existing.length,
                });
            }
        }
        self.by_start.insert(addr, buffer);
        Ok(())
    }

    /// Removes the buffer that starts at `addr`.
    pub fn remove(&mut self, addr: u64) -> Option<RegisteredBuffer> {
        self.by_start.remove(&addr)
    }

    /// The buffer that contains all of `[addr, addr + length)`.
    pub fn find_containing(&self, addr: u64, length: u64) -> Result<&RegisteredBuffer, RangeError> {
        if length == 0 {
            return Err(RangeError::ZeroLength);
        }
        let end = addr.checked_add(length).ok_or(RangeError::Overflow { addr, length })?;
        let buffer = self
            .by_start
            .range(..=addr)
            .next_back()
            .map(|(_, buffer)| buffer)
            .filter(|buffer| buffer.end() > addr)
            .ok_or(RangeError::NotRegistered { addr, length })?;
        if end > buffer.end() {
            return Err(RangeError::PastEnd {
                addr,
                length,
                buffer_addr: buffer.addr,
                buffer_length: buffer.length,
                overrun: end - buffer.end(),
            });
        }
        Ok(buffer)
    }

    /// The buffers in address order.
    pub fn iter(&self) -> impl Iterator<Item = &RegisteredBuffer> {
        self.by_start.values()
    }

    /// Number of buffers.
    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    /// Whether no buffer is registered.
    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn buffer(addr: u64, length: u64) -> RegisteredBuffer {
        RegisteredBuffer { addr, length, location: "cpu:0".into() }
    }

    fn set(buffers: &[(u64, u64)]) -> BufferSet {
        let mut set = BufferSet::new();
        for &(addr, length) in buffers {
            set.insert(buffer(addr, length)).expect("test buffers do not overlap");
        }
        set
    }

    #[test]
    fn bounds_rules() {
        let set = set(&[(0x1000, 0x1000), (0x2000, 0x1000)]);
        // Exact fit and strictly inside.
        assert_eq!(set.find_containing(0x1000, 0x1000).map(|b| b.addr), Ok(0x1000));
        assert_eq!(set.find_containing(0x1800, 0x10).map(|b| b.addr), Ok(0x1000));
        // One byte over the end of the first buffer, even though the next buffer starts right there.
        assert_eq!(
            set.find_containing(0x1000, 0x1001),
            Err(RangeError::PastEnd {
                addr: 0x1000,
                length: 0x1001,
                buffer_addr: 0x1000,
                buffer_length: 0x1000,
                overrun: 1
            })
        );
        // Spanning two adjacent buffers.
        assert!(matches!(set.find_containing(0x1800, 0x1000), Err(RangeError::PastEnd { .. })));
        // Zero length, before any buffer, after all buffers.
        assert_eq!(set.find_containing(0x1000, 0), Err(RangeError::ZeroLength));
        assert!(matches!(set.find_containing(0xfff, 1), Err(RangeError::NotRegistered { .. })));
        assert!(matches!(set.find_containing(0x3000, 1), Err(RangeError::NotRegistered { .. })));
        // u64 overflow.
        assert_eq!(set.find_containing(u64::MAX, 2), Err(RangeError::Overflow { addr: u64::MAX, length: 2 }));
    }

    #[test]
    fn registration_rules() {
        let mut set = set(&[(0x1000, 0x1000)]);
        assert!(matches!(set.insert(buffer(0x5000, 0)), Err(EngineError::InvalidRegistration { .. })));
        assert!(matches!(set.insert(buffer(u64::MAX - 1, 4)), Err(EngineError::InvalidRegistration { .. })));
        assert!(matches!(
            set.insert(buffer(0x1fff, 1)),
            Err(EngineError::AddressOverlapped { existing_addr: 0x1000, .. })
        ));
        assert!(matches!(set.insert(buffer(0x800, 0x801)), Err(EngineError::AddressOverlapped { .. })));
        assert!(matches!(set.insert(buffer(0x800, 0x2000)), Err(EngineError::AddressOverlapped { .. })));
        // Touching on either side is not overlapping.
        set.insert(buffer(0x800, 0x800)).expect("adjacent below");
        set.insert(buffer(0x2000, 0x10)).expect("adjacent above");
        assert_eq!(set.len(), 3);
        assert_eq!(set.remove(0x1000).map(|b| b.length), Some(0x1000));
        assert!(set.find_containing(0x1000, 1).is_err());
    }

    proptest! {
        /// find_containing agrees with a brute-force scan over every buffer.
        #[test]
        fn containment_matches_brute_force(
            starts in proptest::collection::btree_set(0u64..64, 1..8),
            probe_addr in 0u64..80 * 16,
            probe_len in 0u64..64,
        ) {
            let mut set = BufferSet::new();
            let buffers: Vec<(u64, u64)> = starts.iter().map(|&s| (s * 16, 1 + (s % 3) * 5)).collect();
            for &(addr, length) in &buffers {
                set.insert(buffer(addr, length)).expect("starts 16 apart, lengths below 16");
            }
            let expected = probe_len > 0 && buffers.iter().any(|&(a, l)| probe_addr >= a && probe_addr + probe_len <= a + l);
            prop_assert_eq!(set.find_containing(probe_addr, probe_len).is_ok(), expected);
        }

        /// Insertion succeeds exactly when the new range overlaps nothing registered.
        #[test]
        fn overlap_matches_brute_force(
            ranges in proptest::collection::vec((0u64..256, 1u64..32), 1..12),
        ) {
            let mut set = BufferSet::new();
            let mut accepted: Vec<(u64, u64)> = Vec::new();
            for (addr, length) in ranges {
                let overlaps = accepted.iter().any(|&(a, l)| addr < a + l && a < addr + length);
                let result = set.insert(buffer(addr, length));
                prop_assert_eq!(result.is_ok(), !overlaps);
                if !overlaps {
                    accepted.push((addr, length));
                }
            }
        }
    }
}
