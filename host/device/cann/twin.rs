//! What the CANN backend reaches only on the twin runtime linked into this process: whether the twin NIC is there
//! ([`CannDevice::twin_nic`]; the NIC itself is `nic.rs`), the twin's provenance logs of SDMA channels and QPs
//! ([`TwinLogs`], the backend's [`Observation`]), and the exception a channel's SDMA engine recorded.
//!
//! Must not reach the twin on the vendor's runtime or on the twin loaded in its place (that copy's state is not this
//! process's `cann_twin`): each helper checks the runtime first, or its caller does ([`TwinLogs`] is made only on
//! the twin runtime linked in).

use super::{CannDevice, CannRuntime};
use crate::device::{ChannelException, ChannelLog, DeviceError, Observation, SdmaSyndrome};
use crate::kernel_abi::SQE_BYTES;

impl CannDevice {
    /// The in-process twin's provenance logs of this device: on the twin runtime linked in only.
    pub(super) fn twin_logs(&self) -> Option<std::sync::Arc<dyn Observation>> {
        (self.runtime == CannRuntime::Twin)
            .then(|| std::sync::Arc::new(TwinLogs { device: self.id }) as std::sync::Arc<dyn Observation>)
    }

    /// The RDMA route's NIC calls reach the twin NIC only when the twin runtime is linked in this process; on the
    /// vendor's runtime (and the twin loaded in its place, whose NIC is that copy's) they are not implemented.
    pub(super) fn twin_nic(&self, operation: &str) -> Result<(), DeviceError> {
        match self.runtime {
            CannRuntime::Twin => Ok(()),
            _ => Err(DeviceError::Unavailable {
                backend: "cann",
                reason: format!(
                    "RDMA route: {operation}: not implemented on the vendor's runtime (it would need HCCP's \
                     RaQpAiCreate in libra.so, which returns the QP's queues and doorbells as HccpAiQpInfo, and the \
                     matching registration calls; unverified on hardware)"
                ),
            }),
        }
    }

    /// On the twin runtime, the exception that stopped the channel as its SDMA engine recorded it (the NPU gives the
    /// Host no per-channel record: docs/hardware.md section 4), with the faults of the block's core.
    pub(super) fn twin_channel_exception(&self, channel: u32) -> Option<ChannelException> {
        let device = self.id as i32;
        let faults: Vec<String> = cann_twin::control::kernel_faults()
            .into_iter()
            .filter(|fault| fault.device == device && fault.block == channel)
            .map(|fault| fault.to_string())
            .collect();
        let exception = cann_twin::control::channel_exception(device, channel).ok().flatten();
        match exception {
            Some(exception) => {
                let mut detail = format!("twin runtime SDMA syndrome {:#x}", exception.syndrome.0);
                if let Some(access) = exception.register {
                    detail.push_str(&format!(
                        "; refused register write of {} bytes at offset {:#x}",
                        access.width, access.offset
                    ));
                }
                if !faults.is_empty() {
                    detail.push_str(&format!("; {}", faults.join("; ")));
                }
                Some(ChannelException {
                    channel,
                    sq_id: exception.sq_id,
                    head: exception.head,
                    tail: exception.tail,
                    syndrome: SdmaSyndrome(exception.syndrome.0),
                    sqe: exception.sqe,
                    detail: Some(detail),
                })
            }
            None if !faults.is_empty() => Some(ChannelException {
                channel,
                sq_id: channel,
                head: 0,
                tail: 0,
                syndrome: SdmaSyndrome::KERNEL_FAULT,
                sqe: [0; SQE_BYTES as usize],
                detail: Some(faults.join("; ")),
            }),
            None => None,
        }
    }
}

/// The in-process twin's provenance logs of one device: a channel's SQE log and a QP's WQE log (made only on the twin
/// runtime linked into this process).
#[derive(Debug)]
struct TwinLogs {
    device: u32,
}

impl TwinLogs {
    /// One of the logs, read by `read` (`what` names it); not recorded while the records are off.
    fn read(&self, what: std::fmt::Arguments<'_>, read: impl FnOnce() -> Result<(u64, u64), String>) -> ChannelLog {
        if !cann_twin::control::provenance_recorded() {
            return ChannelLog::NotRecorded;
        }
        match read() {
            Ok((first, end)) => ChannelLog::Read { first, end },
            Err(error) => {
                tracing::warn!(device = self.device, %what, %error, "no provenance log");
                ChannelLog::NotObservable
            }
        }
    }
}

impl Observation for TwinLogs {
    fn channel_log_position(&self, channel: u32) -> Option<u64> {
        cann_twin::control::sqe_log_position(self.device as i32, channel).ok()
    }

    fn read_channel_log(&self, channel: u32, from: u64, out: &mut Vec<cann_twin::control::LoggedSqe>) -> ChannelLog {
        self.read(format_args!("SDMA channel {channel}"), || {
            cann_twin::control::sqe_log(self.device as i32, channel, from, out).map_err(|error| error.to_string())
        })
    }

    fn read_qp_log(&self, qpn: u32, from: u64, out: &mut Vec<cann_twin::control::LoggedSqe>) -> ChannelLog {
        self.read(format_args!("QP {qpn:#x}"), || {
            cann_twin::nic::qp_log(self.device as i32, qpn, from, out).map_err(|error| error.to_string())
        })
    }
}
