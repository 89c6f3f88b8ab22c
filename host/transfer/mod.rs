//! The ground floor: what every path and the engine share.
//!
//! Owns the vocabulary of a transfer — requests and opcodes, states and statuses with Mooncake's numeric values, the
//! validated [`Transfer`] a transport receives, the [`TaskSlot`] it writes the outcome into, the batch's
//! [`CompletionSignal`], opened [`Segment`]s with their descriptors, the registered-buffer set and its bounds rule, the
//! checked copy of Host memory ([`host_copy`]: an unmapped page is an error, not a crash), and the [`Protocol`]
//! names. Mooncake keeps the same types at the bottom of its transfer engine
//! (`mooncake-transfer-engine/include/transport/transport.h`).
//!
//! Must not import the engine, a transport, metadata or a device backend: everything above builds on this module.

pub mod completion;
pub mod descriptor;
pub mod failure;
pub mod host_copy;
pub mod memory;
pub mod protocol;
pub mod request;
pub mod segment;
pub mod task;
pub mod validated;

pub use completion::{
    poll_until, poll_until_charged, poll_until_paced, poll_until_paced_expecting, CompletionPoller, CompletionSignal,
    FEW_UNITS,
};
pub use descriptor::{BufferDescriptor, DescriptorError, ProtocolList, SegmentDescriptor};
pub use failure::{CodeFamily, FailureKind, PathCode, TransferFailure};
pub use memory::{BufferSet, RangeError, RegisteredBuffer};
pub use protocol::{Protocol, ProtocolParseError, MOONCAKE_ONLY_PROTOCOLS};
pub use request::{BatchId, Opcode, SegmentId, TransferRequest, TransferState, TransferStatus};
pub use segment::Segment;
pub use task::TaskSlot;
pub use validated::Transfer;
