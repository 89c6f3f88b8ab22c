//! The RDMA capability of the device seam: a device's NIC and its reliable-connected queue pairs, for the aiv
//! transport's RDMA route (docs/rdma.md section 7).
//!
//! Owns: [`Rdma`] (opening the NIC), [`RdmaNic`] (an open NIC: registrations, QP creation, close), the QP states as
//! types ([`CreatedQp`]: created, not connected; [`ConnectedQp`]: connected, what posting and reading need), and the
//! values that cross them ([`QpSpec`], [`QpHandle`], [`QpState`], [`RdmaKeys`]). A device without a NIC has no
//! [`Rdma`] (`DeviceBackend::rdma` says why). Must not name a backend or know the transport's QP tables.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::backend::DeviceError;

/// The NIC of a device, not yet open.
pub trait Rdma: Send + Sync + fmt::Debug {
    /// Opens the device's NIC listening on `listen` (port 0: any); the open NIC knows its bound `ip:port`.
    fn open(&self, listen: SocketAddr) -> Result<Box<dyn RdmaNic>, DeviceError>;
}

/// An open NIC of a device. Every wait is bounded.
pub trait RdmaNic: Send + Sync + fmt::Debug {
    /// The bound address, `ip:port`.
    fn address(&self) -> SocketAddr;
    /// Registers `[addr, addr + length)` of device memory with remote read and write.
    fn register(&self, addr: u64, length: u64) -> Result<RdmaKeys, DeviceError>;
    /// Withdraws the registration whose lkey is `lkey`.
    fn deregister(&self, lkey: u32) -> Result<(), DeviceError>;
    /// Creates a reliable-connected QP, not yet connected.
    fn create_qp(&self, spec: &QpSpec) -> Result<Box<dyn CreatedQp>, DeviceError>;
    /// Closes the NIC (destroys its QPs; bounded).
    fn close(&self) -> Result<(), DeviceError>;
}

/// A QP created on a NIC and not connected: it can only be connected, or destroyed (explicitly, or when dropped).
pub trait CreatedQp: Send + Sync + fmt::Debug {
    /// Where its queues and doorbells are.
    fn handle(&self) -> &QpHandle;
    /// Connects it to QP `remote_qpn` of the NIC at `peer` (bounded). A QP that fails to connect is destroyed
    /// before the error is returned.
    fn connect(self: Box<Self>, peer: SocketAddr, remote_qpn: u32) -> Result<Box<dyn ConnectedQp>, DeviceError>;
    /// Destroys it (bounded).
    fn destroy(self: Box<Self>) -> Result<(), DeviceError>;
}

/// A connected QP: what posting to it and reading its state need. Destroyed explicitly, or when dropped.
pub trait ConnectedQp: Send + Sync + fmt::Debug {
    /// Where its queues and doorbells are.
    fn handle(&self) -> &QpHandle;
    /// Its state as the NIC reports it.
    fn state(&self) -> Result<QpState, DeviceError>;
    /// Destroys it (bounded).
    fn destroy(self: Box<Self>) -> Result<(), DeviceError>;
}

/// What a QP on this device's NIC is created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpSpec {
    /// SQ slots (a power of two).
    pub sq_depth: u32,
    /// CQEs (a power of two, at least `sq_depth`).
    pub cq_depth: u32,
    /// Retransmissions before a transport-retry-exceeded completion (at most 7).
    pub retry_count: u8,
    /// The wait for a response per attempt.
    pub timeout: Duration,
    /// The AIV block that polls the QP's CQ (`None`: a responder QP nobody polls). A hint for waking that block on a
    /// new CQE: the twin NIC signals that block's emulated core after each CQE it writes, so a core napping in its
    /// poll resumes at once.
    pub wake_block: Option<u32>,
}

/// Where a new QP's queues and doorbells are: what fills the first line of a `QpRecord`
/// (crate::kernel_abi::roce).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpHandle {
    pub qpn: u32,
    pub cqn: u32,
    pub sq_base: u64,
    pub cq_base: u64,
    pub sq_db_addr: u64,
    pub cq_db_addr: u64,
    pub sq_depth: u32,
    pub cq_depth: u32,
}

/// A QP's state as the NIC reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpState {
    /// Connected and not in error.
    pub ready: bool,
    /// In the error state, and why (the first error CQE's status or the NIC's exception), if known.
    pub error: Option<String>,
    /// WQEs rung and completed by the NIC (free-running).
    pub posted: u32,
    pub completed: u32,
}

/// A registration's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaKeys {
    pub lkey: u32,
    pub rkey: u32,
}
