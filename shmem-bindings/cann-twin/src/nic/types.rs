//! The twin NIC's public types and limits: why a call failed ([`NicError`]), a registration's rights and keys, a
//! QP's attributes, where its queues and doorbells are, its state, faults and status, the NIC's counters, and the
//! bounds the calls check. All are re-exported as `nic::X`, the paths other crates and the tests use.
//!
//! Plain data: nothing here opens a NIC, touches a QP or reads device memory (that is `nic.rs` and the modules
//! beside this one).

use std::time::Duration;

use ascendcl_sys::sys::aclError;

use super::wire::MAX_MESSAGE;

/// Largest SQ depth: the SQ doorbell carries the producer index modulo 65536, so at most half of that may be
/// outstanding for the count of new WQEs to be unambiguous.
pub const MAX_SQ_DEPTH: u32 = 1 << 15;
/// Largest CQ depth (the twin's choice).
pub const MAX_CQ_DEPTH: u32 = 1 << 16;
/// Largest retry count: IB's `retry_cnt` is a 3-bit attribute.
pub const MAX_RETRY_COUNT: u8 = 7;
/// Longest timeout per attempt the twin accepts.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`close`](super::close) and [`destroy_qp`](super::destroy_qp) wait for the threads they stop.
pub const JOIN_WAIT: Duration = Duration::from_secs(5);
/// How long [`connect_qp`](super::connect_qp) waits for the peer's handshake.
pub const CONNECT_WAIT: Duration = Duration::from_secs(2);
/// Connections a NIC serves at once; more are closed at accept.
pub const MAX_CONNECTIONS: usize = 256;
/// Largest message of one WQE (bytes): larger ones complete with LOCAL_LENGTH_ERR.
pub const MAX_MESSAGE_BYTES: u32 = MAX_MESSAGE;
/// Requests a QP keeps outstanding on its connection by default ([`QpConfig::max_outstanding`]).
pub const DEFAULT_OUTSTANDING: u32 = 16;
/// Largest [`QpConfig::max_outstanding`].
pub const MAX_OUTSTANDING: u32 = 256;
/// Bytes of messages a QP keeps outstanding at most: a request that would pass it waits for the responses before
/// it (a single message larger than this travels alone).
pub const WINDOW_BYTES: u64 = 8 << 20;

/// Why a NIC call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NicError {
    /// A negative device id.
    InvalidDevice(i32),
    /// The device's NIC is already open.
    AlreadyOpen(i32),
    /// The device has no open NIC.
    NotOpen(i32),
    /// No such QP on the device's NIC.
    NoSuchQp { device: i32, qpn: u32 },
    /// No registration with that lkey.
    NoSuchRegion { device: i32, lkey: u32 },
    /// An argument out of its range (named).
    InvalidArgument(&'static str),
    /// The QP is not in the state the call needs.
    WrongState { qpn: u32, state: QpState },
    /// The device address space refused (an ACL code).
    Device(aclError),
    /// A socket operation failed.
    Io(String),
    /// The peer did not complete the handshake (no answer in time, or it has no such QP).
    Handshake(String),
    /// Threads that did not end within [`JOIN_WAIT`] (they are left detached).
    ThreadsLeft(usize),
}

impl std::fmt::Display for NicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NicError::InvalidDevice(device) => write!(f, "device {device} is not a device id"),
            NicError::AlreadyOpen(device) => write!(f, "device {device}'s NIC is already open"),
            NicError::NotOpen(device) => write!(f, "device {device} has no open NIC"),
            NicError::NoSuchQp { device, qpn } => write!(f, "device {device}'s NIC has no QP {qpn:#x}"),
            NicError::NoSuchRegion { device, lkey } => write!(f, "device {device}'s NIC has no region {lkey:#x}"),
            NicError::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            NicError::WrongState { qpn, state } => write!(f, "QP {qpn:#x} is in state {state:?}"),
            NicError::Device(code) => write!(f, "the device address space refused (ACL error {code})"),
            NicError::Io(what) => write!(f, "socket: {what}"),
            NicError::Handshake(what) => write!(f, "QP handshake: {what}"),
            NicError::ThreadsLeft(count) => write!(f, "{count} NIC threads did not end within {JOIN_WAIT:?}"),
        }
    }
}

impl std::error::Error for NicError {}

/// The remote rights of a registration (local access is always allowed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub remote_read: bool,
    pub remote_write: bool,
}

impl Access {
    /// Remote read and write.
    pub const REMOTE_ALL: Access = Access { remote_read: true, remote_write: true };
}

/// The keys of a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryKeys {
    pub lkey: u32,
    pub rkey: u32,
}

/// A QP's attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// SQ slots, a power of two up to [`MAX_SQ_DEPTH`].
    pub sq_depth: u32,
    /// CQEs, a power of two up to [`MAX_CQ_DEPTH`].
    pub cq_depth: u32,
    /// Retransmissions of a request before TRANSPORT_RETRY_EXC_ERR (at most [`MAX_RETRY_COUNT`]).
    pub retry_count: u8,
    /// The wait for a response per attempt (1 ms up to [`MAX_TIMEOUT`]): the oldest outstanding request's timer,
    /// from when it left.
    pub timeout: Duration,
    /// How long the engine waits for a free CQ slot before it raises a CQ overrun.
    pub cq_full_wait: Duration,
    /// Requests outstanding on the connection at most, 1 to [`MAX_OUTSTANDING`] (the send window; the byte budget
    /// [`WINDOW_BYTES`] applies as well, whichever is smaller).
    pub max_outstanding: u32,
    /// The block of the QP's device whose emulated AI core polls the CQ (`None`: nobody polls it). After each CQE
    /// the engine signals that block's device-internal activity record (as an SDMA channel signals the block that
    /// drives it), so a core napping in its poll resumes at once; a core of another block naps its nap out.
    pub wake_block: Option<u32>,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            sq_depth: 64,
            cq_depth: 64,
            retry_count: 7,
            timeout: Duration::from_millis(100),
            cq_full_wait: Duration::from_secs(1),
            max_outstanding: DEFAULT_OUTSTANDING,
            wake_block: None,
        }
    }
}

/// Where a QP's queues and doorbells are: what fills an `AivQpRecord`'s first line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    pub device: i32,
    pub qpn: u32,
    pub cqn: u32,
    pub sq_base: u64,
    pub cq_base: u64,
    pub sq_db_addr: u64,
    pub cq_db_addr: u64,
    pub sq_depth: u32,
    pub cq_depth: u32,
}

/// A QP's state (RESET is not modelled: a QP is created in INIT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Created, not connected: a WQE rung now completes with LOCAL_QP_OP_ERR.
    Init,
    /// Connected (RTR and RTS in one step).
    ReadyToSend,
    /// After the first error: every later WQE is flushed.
    Error,
}

/// What stopped a QP outside a WQE's own status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpFault {
    /// A register write of the wrong width or at an offset that is no doorbell.
    RegisterAccess { offset: u64, width: usize },
    /// The doorbell's tag is not this QP's QPN (SQ) or CQN (CQ).
    DoorbellTag { offset: u64, tag: u32 },
    /// The doorbell's command is not the one of its offset.
    DoorbellCommand { offset: u64, command: u32 },
    /// The SQ doorbell exposed more WQEs than the SQ holds.
    SqOverflow { producer: u32, head: u32, depth: u32 },
    /// The CQ doorbell released CQEs the NIC has not written.
    CqBeyondProducer { consumer: u32, producer: u32 },
    /// The CQ stayed full for the QP's `cq_full_wait`: the CQE of `wqe_index` was not written, nor any after it.
    CqOverrun { wqe_index: u32 },
    /// An SQ slot or a CQE no longer translates (its memory was freed under the NIC).
    QueueFault { address: u64 },
}

/// A QP's first exception.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpException {
    pub device: i32,
    pub qpn: u32,
    pub fault: QpFault,
}

/// A QP as its engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpStatus {
    pub state: QpState,
    pub exception: Option<QpException>,
    /// WQEs rung (free-running producer index).
    pub sq_producer: u32,
    /// WQEs the engine has completed (free-running).
    pub sq_head: u32,
    /// CQEs written (free-running).
    pub cq_producer: u32,
    /// CQEs released by the CQ doorbell (free-running).
    pub cq_consumer: u32,
    /// The first error CQE's status and WQE index.
    pub first_error: Option<(u32, u32)>,
    /// Completions not written because the CQ overran.
    pub cqes_lost: u64,
}

/// A NIC's counters since [`open`](super::open).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NicCounters {
    /// QPs created ([`create_qp`](super::create_qp) calls that succeeded; destroyed ones stay counted).
    pub qps_created: u64,
    /// WQEs whose operation completed successfully.
    pub wqes_executed: u64,
    /// CQEs written (every status).
    pub cqes_written: u64,
    /// Retransmissions (attempts after the first).
    pub retries: u64,
    /// Remote requests this NIC served as target (applied, refused or answered again).
    pub requests_served: u64,
    /// Remote requests this NIC refused with REMOTE_ACCESS_ERR.
    pub requests_refused: u64,
    /// WRITEs this NIC applied to its memory as target.
    pub writes_applied: u64,
    /// Duplicate requests (retransmissions of requests already executed) answered again as target, without
    /// applying a WRITE again.
    pub duplicates_answered: u64,
    /// Requests dropped unanswered as target: after a PSN gap (an earlier request lost) or after the request of
    /// that initiator it refused.
    pub requests_dropped: u64,
}
