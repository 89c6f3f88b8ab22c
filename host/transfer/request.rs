//! Requests and statuses with Mooncake's numeric values (docs/mooncake.md section 5).

use super::protocol::Protocol;

/// Mooncake's segment handle. [`SegmentId::LOCAL`] (0) is the engine's own segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentId(pub u64);

impl SegmentId {
    /// The engine's own segment: `open_segment` of the engine's own name returns it.
    pub const LOCAL: SegmentId = SegmentId(0);
}

/// A batch handle; 0 is never a valid batch (the Python API uses 0 for failure).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId(pub u64);

/// Direction of a transfer, seen from the initiator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Opcode {
    /// Copy from the target segment into local memory.
    Read = 0,
    /// Copy from local memory into the target segment.
    Write = 1,
}

impl Opcode {
    /// The lower-case name used by `transfer_engine_bench --operation`.
    pub fn as_str(self) -> &'static str {
        match self {
            Opcode::Read => "read",
            Opcode::Write => "write",
        }
    }
}

/// One transfer as the caller describes it (Mooncake's `TransferRequest`, plus an optional protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferRequest {
    /// READ or WRITE.
    pub opcode: Opcode,
    /// Local address: must lie, with `length`, inside one buffer registered with this engine.
    pub source: u64,
    /// The segment to read from or write to.
    pub target_id: SegmentId,
    /// Absolute address in the target segment (Mooncake's `target_offset`).
    pub target_offset: u64,
    /// Bytes to move; zero is rejected.
    pub length: u64,
    /// The protocol for this request; `None` uses the engine's configured default.
    pub protocol: Option<Protocol>,
}

/// A task's state, with Mooncake's numeric values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u32)]
pub enum TransferState {
    /// Accepted, not yet handed to a transport.
    Waiting = 0,
    /// Handed to a transport, not finished.
    Pending = 1,
    /// Not a valid task (Mooncake uses it for unknown ids).
    Invalid = 2,
    /// Withdrawn before it ran.
    Canceled = 3,
    /// All bytes moved.
    Completed = 4,
    /// Not finished within the configured budget.
    Timeout = 5,
    /// Rejected or failed; see the task's reason.
    Failed = 6,
}

impl TransferState {
    /// Decodes a raw status value totally: anything unknown is [`TransferState::Invalid`].
    pub fn from_raw(raw: u32) -> TransferState {
        match raw {
            0 => TransferState::Waiting,
            1 => TransferState::Pending,
            3 => TransferState::Canceled,
            4 => TransferState::Completed,
            5 => TransferState::Timeout,
            6 => TransferState::Failed,
            _ => TransferState::Invalid,
        }
    }

    /// Whether the task will not change any more.
    pub fn is_terminal(self) -> bool {
        !matches!(self, TransferState::Waiting | TransferState::Pending)
    }
}

/// Mooncake's `TransferStatus`: a state and the bytes moved so far.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TransferStatus {
    /// The state.
    pub state: TransferState,
    /// Bytes moved (for a batch: summed over its tasks).
    pub transferred_bytes: u64,
}
