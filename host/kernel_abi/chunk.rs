//! How a transfer is split into pieces, the one place the rules live.
//!
//! - SQE pieces ([`pieces`]): at most `max_piece` bytes each (1 MiB on SDMA), the last holding the remainder; a
//!   zero-length transfer has no piece (the kernel reports it FAILED with a bad-request syndrome, the engine never
//!   sends one). The kernel implements the same rule in C++ (`aiv::piece_count`, `aiv::piece_length`); tests check
//!   the two agree. The aiv kernel and the adxl baseline post SQEs by it.
//! - Stream pieces ([`even_pieces`]): Mooncake's UBShmem transport spreads one transfer over up to N streams in equal
//!   pieces of at least a minimum size; the ubshmem baseline issues its copies by it.

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

/// Number of equal pieces a `length`-byte transfer is spread over: one per `min_piece` bytes (rounded up), at least
/// one and at most `max_pieces`.
pub fn even_piece_count(length: u64, min_piece: u64, max_pieces: usize) -> usize {
    let wanted = length.div_ceil(min_piece.max(1));
    usize::try_from(wanted).unwrap_or(usize::MAX).clamp(1, max_pieces.max(1))
}

/// The `(offset, length)` of each of the [`even_piece_count`] pieces: all of one length but the last, which holds the
/// rest; none is empty (for `length > 0`).
pub fn even_pieces(length: u64, min_piece: u64, max_pieces: usize) -> impl Iterator<Item = (u64, u64)> {
    let count = even_piece_count(length, min_piece, max_pieces) as u64;
    let piece = length.div_ceil(count).max(1);
    (0..count)
        .map(move |index| index * piece)
        .take_while(move |&offset| offset < length)
        .map(move |offset| (offset, piece.min(length - offset)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Pieces tile the transfer exactly, none is empty or oversized, only the last may be short.
        #[test]
        fn pieces_tile_the_transfer(
            (length, max_log) in prop_oneof![(0u64..4096, 0u32..21), (0u64..(64 << 20), 10u32..21)],
        ) {
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

        /// Even pieces tile the transfer, number at most `max_pieces`, and are equal but for the last.
        #[test]
        fn even_pieces_tile_the_transfer(length in 1u64..(64 << 20), min_log in 10u32..20, max_pieces in 1usize..9) {
            let min_piece = 1u64 << min_log;
            let all: Vec<(u64, u64)> = even_pieces(length, min_piece, max_pieces).collect();
            prop_assert!(!all.is_empty() && all.len() <= max_pieces);
            prop_assert!(all.len() <= even_piece_count(length, min_piece, max_pieces));
            let mut expected_offset = 0;
            for (index, &(offset, piece)) in all.iter().enumerate() {
                prop_assert_eq!(offset, expected_offset);
                prop_assert!(piece >= 1);
                if index + 1 < all.len() {
                    prop_assert_eq!(piece, all[0].1);
                }
                expected_offset += piece;
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

/// The kernel's own chunking (C++, `kernels/include/aiv/transfer_kernel.h`), callable from Rust so tests can hold
/// the two implementations against each other.
pub mod kernel {
    extern "C" {
        fn aiv_kernel_piece_count(length: u64, max_piece: u32) -> u64;
        fn aiv_kernel_piece_length(length: u64, max_piece: u32, index: u64) -> u32;
    }

    /// `aiv::piece_count` of the kernel, which cuts pieces of a power-of-two size only (0 for any other
    /// `max_piece`).
    pub fn piece_count(length: u64, max_piece: u32) -> u64 {
        // SAFETY: a pure function of its integer arguments (kernels/cpu/host_hooks.cpp).
        unsafe { aiv_kernel_piece_count(length, max_piece) }
    }

    /// `aiv::piece_length` of the kernel (for `index < piece_count`).
    pub fn piece_length(length: u64, max_piece: u32, index: u64) -> u32 {
        // SAFETY: a pure function of its integer arguments.
        unsafe { aiv_kernel_piece_length(length, max_piece, index) }
    }
}

#[cfg(test)]
mod kernel_agreement {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The C++ kernel splits every transfer exactly as the Rust rule does.
        #[test]
        fn kernel_chunking_matches(length in prop_oneof![0u64..(8 << 20), any::<u64>()], max_log in 0u32..21) {
            let max = 1u32 << max_log;
            prop_assert_eq!(kernel::piece_count(length, max), piece_count(length, max));
            if piece_count(length, max) <= 4096 {
                for piece in pieces(length, max) {
                    prop_assert_eq!(kernel::piece_length(length, max, piece.offset / u64::from(max)), piece.length);
                }
            }
        }
    }
}
