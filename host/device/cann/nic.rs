//! The RDMA capability of the CANN backend ([`Rdma`]): the twin runtime's NIC (`cann_twin::nic`), reachable only
//! when the twin runtime is linked into this process ([`CannDevice::twin_nic`] says why not elsewhere). An open NIC
//! is [`TwinNic`]; its QPs are [`TwinCreatedQp`] until connected and [`TwinConnectedQp`] after, each destroyed once:
//! explicitly, or when dropped.
//!
//! Must not reach the twin on the vendor's runtime or on the twin loaded in its place.

use std::fmt;
use std::net::SocketAddr;

use super::CannDevice;
use crate::device::{ConnectedQp, CreatedQp, DeviceError, QpHandle, QpSpec, QpState, Rdma, RdmaKeys, RdmaNic};

/// A twin NIC error as `DeviceError::Runtime`, naming the device and the step.
fn nic_error(device: u32, step: &'static str) -> impl Fn(cann_twin::nic::NicError) -> DeviceError {
    move |error| DeviceError::Runtime { device, step, detail: error.to_string() }
}

impl Rdma for CannDevice {
    fn open(&self, listen: SocketAddr) -> Result<Box<dyn RdmaNic>, DeviceError> {
        self.twin_nic("open the device's NIC")?;
        let address =
            cann_twin::nic::open(self.id as i32, listen).map_err(nic_error(self.id, "open the NIC (twin runtime)"))?;
        Ok(Box::new(TwinNic { device: self.id, address }))
    }
}

/// The device's twin NIC, open.
#[derive(Debug)]
pub struct TwinNic {
    device: u32,
    address: SocketAddr,
}

impl RdmaNic for TwinNic {
    fn address(&self) -> SocketAddr {
        self.address
    }

    fn register(&self, addr: u64, length: u64) -> Result<RdmaKeys, DeviceError> {
        let keys =
            cann_twin::nic::register_memory(self.device as i32, addr, length, cann_twin::nic::Access::REMOTE_ALL)
                .map_err(nic_error(self.device, "register device memory (twin runtime NIC)"))?;
        Ok(RdmaKeys { lkey: keys.lkey, rkey: keys.rkey })
    }

    fn deregister(&self, lkey: u32) -> Result<(), DeviceError> {
        cann_twin::nic::deregister_memory(self.device as i32, lkey)
            .map_err(nic_error(self.device, "deregister device memory (twin runtime NIC)"))
    }

    fn create_qp(&self, spec: &QpSpec) -> Result<Box<dyn CreatedQp>, DeviceError> {
        let config = cann_twin::nic::QpConfig {
            sq_depth: spec.sq_depth,
            cq_depth: spec.cq_depth,
            retry_count: spec.retry_count,
            timeout: spec.timeout,
            wake_block: spec.wake_block,
            ..cann_twin::nic::QpConfig::default()
        };
        let info = cann_twin::nic::create_qp(self.device as i32, config)
            .map_err(nic_error(self.device, "create a QP (twin runtime NIC)"))?;
        let handle = QpHandle {
            qpn: info.qpn,
            cqn: info.cqn,
            sq_base: info.sq_base,
            cq_base: info.cq_base,
            sq_db_addr: info.sq_db_addr,
            cq_db_addr: info.cq_db_addr,
            sq_depth: info.sq_depth,
            cq_depth: info.cq_depth,
        };
        Ok(Box::new(TwinCreatedQp(TwinQp { device: self.device, handle, live: true })))
    }

    fn close(&self) -> Result<(), DeviceError> {
        cann_twin::nic::close(self.device as i32).map_err(nic_error(self.device, "close the NIC (twin runtime)"))
    }
}

/// A QP of the twin NIC, destroyed once: by `destroy`, or at drop while `live`.
struct TwinQp {
    device: u32,
    handle: QpHandle,
    live: bool,
}

impl TwinQp {
    fn destroy(&mut self) -> Result<(), DeviceError> {
        self.live = false;
        cann_twin::nic::destroy_qp(self.device as i32, self.handle.qpn)
            .map_err(nic_error(self.device, "destroy a QP (twin runtime NIC)"))
    }

    /// Hands the QP on to its next state: this value no longer destroys it.
    fn pass_on(&mut self) -> TwinQp {
        self.live = false;
        TwinQp { device: self.device, handle: self.handle, live: true }
    }
}

impl Drop for TwinQp {
    fn drop(&mut self) {
        if self.live {
            if let Err(error) = self.destroy() {
                tracing::debug!(qpn = self.handle.qpn, %error, "destroy QP");
            }
        }
    }
}

impl fmt::Debug for TwinQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TwinQp").field("device", &self.device).field("qpn", &self.handle.qpn).finish()
    }
}

/// A twin NIC QP, created and not connected.
#[derive(Debug)]
pub struct TwinCreatedQp(TwinQp);

impl CreatedQp for TwinCreatedQp {
    fn handle(&self) -> &QpHandle {
        &self.0.handle
    }

    fn connect(mut self: Box<Self>, peer: SocketAddr, remote_qpn: u32) -> Result<Box<dyn ConnectedQp>, DeviceError> {
        let qp = &self.0;
        // On failure `self` drops here, destroying the QP before the error is returned.
        cann_twin::nic::connect_qp(qp.device as i32, qp.handle.qpn, peer, remote_qpn)
            .map_err(nic_error(qp.device, "connect a QP (twin runtime NIC)"))?;
        Ok(Box::new(TwinConnectedQp(self.0.pass_on())))
    }

    fn destroy(mut self: Box<Self>) -> Result<(), DeviceError> {
        self.0.destroy()
    }
}

/// A twin NIC QP, connected.
#[derive(Debug)]
pub struct TwinConnectedQp(TwinQp);

impl ConnectedQp for TwinConnectedQp {
    fn handle(&self) -> &QpHandle {
        &self.0.handle
    }

    fn state(&self) -> Result<QpState, DeviceError> {
        let qp = &self.0;
        let status = cann_twin::nic::qp_status(qp.device as i32, qp.handle.qpn)
            .map_err(nic_error(qp.device, "read a QP's state (twin runtime NIC)"))?;
        let error = match (status.state, status.first_error, status.exception) {
            (_, _, Some(exception)) => Some(format!("NIC exception {:?}", exception.fault)),
            (_, Some((code, index)), None) => {
                Some(format!("first error CQE {} at WQE {index}", crate::kernel_abi::roce::CqeStatus(code).describe()))
            }
            (cann_twin::nic::QpState::Error, None, None) => Some("in the error state".into()),
            _ => None,
        };
        Ok(QpState {
            ready: status.state == cann_twin::nic::QpState::ReadyToSend,
            error,
            posted: status.sq_producer,
            completed: status.sq_head,
        })
    }

    fn destroy(mut self: Box<Self>) -> Result<(), DeviceError> {
        self.0.destroy()
    }
}
