//! How a transfer is split into SQEs: pieces of at most `max_piece` bytes (1 MiB on SDMA), the last holding the
//! remainder; a zero-length transfer has no piece (the kernel reports it FAILED with a bad-request syndrome, the
//! engine never sends one). The kernel implements the same rule in C++ (`aiv::piece_count`, `aiv::piece_length`);
//! tests check the two agree.

/// One piece of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Offset from the transfer's start.
    pub offset: u64,
    /// Bytes, from 1 to `max_piece`.
    pub length: u32,
}

/// Number of pieces of a `length`-byte transfer (0 for length 0 or `max_piece` 0).
pub fn piece_count(length: u64, max_piece: u32) -> u64 {
    if length == 0 || max_piece == 0 {
        return 0;
    }
    length.div_ceil(u64::from(max_piece))
}

/// The pieces of a transfer, in order.
pub fn pieces(length: u64, max_piece: u32) -> impl Iterator<Item = Piece> {
    let max = u64::from(max_piece);
    (0..piece_count(length, max_piece)).map(move |index| {
        let offset = index * max;
        Piece { offset, length: (length - offset).min(max) as u32 }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Pieces tile the transfer exactly, none is empty or oversized, only the last may be short.
        #[test]
        fn pieces_tile_the_transfer(length in 0u64..(64 << 20), max_log in 0u32..21) {
            let max = 1u32 << max_log;
            let all: Vec<Piece> = pieces(length, max).collect();
            prop_assert_eq!(all.len() as u64, piece_count(length, max));
            let mut expected_offset = 0;
            for (index, piece) in all.iter().enumerate() {
                prop_assert_eq!(piece.offset, expected_offset);
                prop_assert!(piece.length >= 1 && piece.length <= max);
                if index + 1 < all.len() {
                    prop_assert_eq!(piece.length, max);
                }
                expected_offset += u64::from(piece.length);
            }
            prop_assert_eq!(expected_offset, length);
        }

        /// Huge lengths do not overflow the count.
        #[test]
        fn counts_do_not_overflow(length in any::<u64>(), max in 1u32..=(1 << 20)) {
            let count = piece_count(length, max);
            prop_assert!(count >= length / u64::from(max));
            prop_assert!(count <= length / u64::from(max) + 1);
        }
    }

    #[test]
    fn edge_cases() {
        assert_eq!(piece_count(0, 1 << 20), 0);
        assert_eq!(piece_count(5, 0), 0);
        assert_eq!(piece_count(1 << 20, 1 << 20), 1);
        assert_eq!(piece_count((1 << 20) + 1, 1 << 20), 2);
        assert_eq!(pieces((1 << 20) + 1, 1 << 20).last(), Some(Piece { offset: 1 << 20, length: 1 }));
        assert_eq!(piece_count(u64::MAX, 1), u64::MAX);
    }
}
