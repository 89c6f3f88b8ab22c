//! The engine's error type.
//!
//! Every variant names the operation that failed and carries what the caller needs to fix it. Mooncake's numeric
//! status codes (its `ERR_*` values) are available through [`EngineError::mooncake_code`] for callers that speak
//! Mooncake's C or Python API.

use std::path::PathBuf;

use crate::transfer::{Protocol, TransferState};

/// Result alias used across the runtime.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// A failed engine operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// mooncake.json (or an environment fallback) could not be used.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),

    /// `register_memory` was given a zero length or a range that wraps the address space.
    #[error("register memory: invalid range at {addr:#x} of length {length}: {reason}")]
    InvalidRegistration { addr: u64, length: u64, reason: &'static str },

    /// `register_memory` was given a range that overlaps a registered buffer.
    #[error(
        "register memory: [{addr:#x}, +{length}) overlaps the registered buffer [{existing_addr:#x}, +{existing_length})"
    )]
    AddressOverlapped { addr: u64, length: u64, existing_addr: u64, existing_length: u64 },

    /// `unregister_memory` (or a transfer) named an address that starts no registered buffer.
    #[error("{operation}: address {addr:#x} is not registered")]
    AddressNotRegistered { operation: &'static str, addr: u64 },

    /// `open_segment` could not resolve a segment name.
    #[error("open segment {name:?}: {reason}")]
    SegmentNotFound { name: String, reason: String },

    /// A segment id that `open_segment` never returned, or one already closed.
    #[error("{operation}: unknown segment id {id}")]
    UnknownSegment { operation: &'static str, id: u64 },

    /// A batch id that `allocate_batch` never returned, or one already freed.
    #[error("{operation}: unknown batch id {id}")]
    UnknownBatch { operation: &'static str, id: u64 },

    /// A task index beyond what was submitted to the batch.
    #[error("get transfer status: batch {batch} has {submitted} tasks, task {task} does not exist")]
    UnknownTask { batch: u64, task: usize, submitted: usize },

    /// `submit_transfer` would take the batch past the capacity it was allocated with.
    #[error("submit transfer: batch {batch} holds {capacity} requests, {submitted} submitted, {requested} more asked")]
    TooManyRequests { batch: u64, capacity: usize, submitted: usize, requested: usize },

    /// `free_batch` on a batch whose tasks have not all finished.
    #[error("free batch: batch {batch} still has {pending} pending task(s)")]
    BatchBusy { batch: u64, pending: usize },

    /// An argument that is invalid whatever the engine's state (zero capacity, mismatched list lengths, ...).
    #[error("{operation}: invalid argument: {reason}")]
    InvalidArgument { operation: &'static str, reason: String },

    /// The protocol is one Mooncake knows but this engine does not provide, or a transport not available here.
    #[error("{operation}: protocol {protocol:?} is not supported: {reason}")]
    NotSupportedTransport { operation: &'static str, protocol: String, reason: String },

    /// A transfer finished in a state other than COMPLETED (for the synchronous helpers).
    #[error("transfer {operation} to segment {segment:?}: {state:?} after {transferred} bytes: {reason}")]
    TransferFailed { operation: &'static str, segment: String, state: TransferState, transferred: u64, reason: String },

    /// A transport could not start (listener bind, device open, ...).
    #[error("start transport {protocol}: {reason}")]
    TransportStart { protocol: Protocol, reason: String },

    /// Reading or writing a file the engine was pointed at.
    #[error("{operation} {path}: {source}")]
    Io { operation: &'static str, path: PathBuf, source: std::io::Error },

    /// A metadata backend failed (publish, fetch or remove of a descriptor).
    #[error("metadata {operation}: {reason}")]
    Metadata { operation: &'static str, reason: String },

    /// A P2P handshake with a peer's RPC port failed (connect, send, receive, or a reply of the wrong form).
    #[error("{operation} {peer}: {reason}")]
    Handshake { peer: String, operation: &'static str, reason: String },

    /// A segment descriptor (or rpc_meta) read from metadata is not valid JSON of the expected shape.
    #[error("read segment descriptor from {origin}: {reason}")]
    MalformedDescriptor { origin: String, reason: String },
}

impl EngineError {
    /// Mooncake's numeric error code for this error (`ERR_INVALID_ARGUMENT` = -1 is returned as 1, and so on:
    /// Mooncake returns the negated values; this is the magnitude listed in its `error.h`).
    pub fn mooncake_code(&self) -> i32 {
        match self {
            EngineError::InvalidArgument { .. }
            | EngineError::InvalidRegistration { .. }
            | EngineError::UnknownBatch { .. }
            | EngineError::UnknownTask { .. }
            | EngineError::UnknownSegment { .. }
            | EngineError::Config(_) => 1,
            EngineError::TooManyRequests { .. } => 2,
            EngineError::AddressNotRegistered { .. } => 3,
            EngineError::BatchBusy { .. } => 4,
            EngineError::AddressOverlapped { .. } => 7,
            EngineError::NotSupportedTransport { .. } => 8,
            EngineError::TransportStart { .. } | EngineError::Io { .. } | EngineError::Handshake { .. } => 102,
            EngineError::MalformedDescriptor { .. } => 103,
            EngineError::SegmentNotFound { .. } | EngineError::Metadata { .. } => 200,
            EngineError::TransferFailed { .. } => 6,
        }
    }
}
