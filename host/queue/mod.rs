//! Layouts shared with the transfer kernel, and the index math of the rings built from them.
//!
//! Owns: the Rust mirror of `kernels/include/aiv/layouts.h` ([`layout`]), the SPSC ring index rules ([`ring`]) and
//! the chunking rule that splits a transfer into SQEs ([`chunk`]). It must not touch device state: the twin device and
//! the aiv transport use these types to read and write shared memory.

pub mod chunk;
pub mod layout;
pub mod ring;

pub use chunk::{piece_count, pieces, Piece};
pub use layout::*;
pub use ring::{CompletionRing, Completions, RequestBatch, RequestRing, SpscIndex, SqIndex, UndecodableCompletion};
