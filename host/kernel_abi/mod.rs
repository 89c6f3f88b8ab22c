//! The kernel ABI: what the Host shares with the AIV transfer kernel, and the Host's typed views of it.
//!
//! Owns: the Rust mirror of `kernels/include/aiv/layouts.h` ([`layout`]), the ring index rules and the typed views
//! of the request ring and the DCQ ([`ring`]), the RoCE queue entries, doorbell words and queue-pair record of the
//! device-initiated RDMA path ([`roce`]), and the chunking rule that splits a transfer into SQEs ([`chunk`]),
//! which every path uses. It must not touch device state: the device backends and the transports use these types to
//! read and write shared memory.

pub mod chunk;
pub mod layout;
pub mod ring;
pub mod roce;

pub use chunk::{even_piece_count, even_pieces, piece_count, pieces, Piece};
pub use layout::*;
pub use ring::{
    CompletionRing, Completions, RequestBatch, RequestRing, SpscIndex, SqIndex, TraceRing, UndecodableCompletion,
};
