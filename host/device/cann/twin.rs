//! What the CANN backend reaches only on the twin runtime linked into this process: the twin NIC behind the RDMA
//! route's calls (whether it is there: [`CannDevice::twin_nic`]; its errors: [`CannDevice::nic_error`]), the twin's
//! provenance logs of SDMA channels and QPs, and the exception a channel's SDMA engine recorded.
//!
//! Must not reach the twin on the vendor's runtime or on the twin loaded in its place (that copy's state is not this
//! process's `cann_twin`): each helper checks the runtime first, or its caller does.

use super::{CannDevice, CannRuntime};
use crate::device::{ChannelException, ChannelLog, DeviceError, SdmaSyndrome};
use crate::kernel_abi::SQE_BYTES;

impl CannDevice {
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

    pub(super) fn nic_error(&self, step: &'static str) -> impl Fn(cann_twin::nic::NicError) -> DeviceError {
        let device = self.id;
        move |error| DeviceError::Runtime { device, step, detail: error.to_string() }
    }

    /// One of the in-process twin's provenance logs, read by `read` (a channel's SQE log or a QP's WQE log,
    /// `what`); not observable on the vendor's runtime, not recorded while the records are off.
    pub(super) fn read_twin_log(
        &self,
        what: std::fmt::Arguments<'_>,
        read: impl FnOnce() -> Result<(u64, u64), String>,
    ) -> ChannelLog {
        if self.runtime != CannRuntime::Twin {
            return ChannelLog::NotObservable;
        }
        if !cann_twin::control::provenance_recorded() {
            return ChannelLog::NotRecorded;
        }
        match read() {
            Ok((first, end)) => ChannelLog::Read { first, end },
            Err(error) => {
                tracing::warn!(device = self.id, %what, %error, "no provenance log");
                ChannelLog::NotObservable
            }
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
