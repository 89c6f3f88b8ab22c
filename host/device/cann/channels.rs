//! Kernel launches and SDMA channels of the CANN backend ([`KernelChannels`]): the channels read from SHMEM's SDMA
//! workspace with a flag area each (step 5 of the `cann` module doc), a channel's exception (the twin's engine record,
//! else the kernel stream's error with the record and the SQE at its head), a channel's reset (twin runtime only), and
//! the launches `launch.rs` makes, found through the device's `Arc`.
//!
//! Must not decide what an exception means for transfers (the transport does).

use std::ffi::c_void;
use std::sync::Arc;

use ascendcl_sys::result as acl;
use zerocopy::FromBytes;

use super::errors::runtime;
use super::{registry_lookup, CannDevice, CannRuntime, CHANNEL_RECORDS_OFFSET, MAX_CHANNELS};
use crate::device::{ChannelException, ChannelInfo, DeviceError, DeviceMemory, KernelChannels, Launch, SdmaSyndrome};
use crate::kernel_abi::{ChannelRecord, FlagArea, CHANNEL_RECORD_BYTES, SQE_BYTES};

impl KernelChannels for CannDevice {
    fn open_channels(&self, count: u32, sq_depth: u32) -> Result<Vec<ChannelInfo>, DeviceError> {
        let unavailable = |reason: String| DeviceError::Unavailable { backend: "cann", reason };
        if count == 0 || count > MAX_CHANNELS {
            return Err(DeviceError::Invalid {
                device: self.id,
                operation: "open channels",
                reason: format!("{count} channels requested, 1 to {MAX_CHANNELS} exist"),
            });
        }
        let (workspace, source) = self.discover_workspace()?;
        let mut bytes = vec![0u8; CHANNEL_RECORDS_OFFSET as usize + count as usize * CHANNEL_RECORD_BYTES];
        self.read_device(workspace, &mut bytes, "read the SDMA workspace")?;
        let flag = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let queues = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        if flag == 0 || queues < count {
            return Err(unavailable(format!(
                "device {}: SDMA workspace at {workspace:#x} (from {source}) reports flag {flag} and {queues} \
                 queues; {count} channel records are needed (was SHMEM initialised with the SDMA engine and enough \
                 blocks?)",
                self.id
            )));
        }
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        channels.clear();
        let mut infos = Vec::new();
        for index in 0..count {
            let offset = CHANNEL_RECORDS_OFFSET as usize + index as usize * CHANNEL_RECORD_BYTES;
            let record =
                ChannelRecord::read_from_bytes(&bytes[offset..offset + CHANNEL_RECORD_BYTES]).map_err(|_| {
                    DeviceError::Invalid { device: self.id, operation: "open channels", reason: "short record".into() }
                })?;
            let depth = record.sq_depth.get();
            if record.sq_base.get() == 0 || record.sq_reg_base.get() == 0 || depth < 2 {
                return Err(unavailable(format!(
                    "device {}: channel record {index} is not usable (sq_base {:#x}, sq_reg_base {:#x}, sq_depth \
                     {depth})",
                    self.id,
                    record.sq_base.get(),
                    record.sq_reg_base.get()
                )));
            }
            if depth != sq_depth {
                tracing::info!(
                    device = self.id,
                    channel = index,
                    configured = sq_depth,
                    record = depth,
                    "SQ depth comes from SHMEM's channel record, not from aiv.sq_depth"
                );
            }
            let flag_area = self.allocate(std::mem::size_of::<FlagArea>() as u64)?;
            self.bind()?;
            // SAFETY: the flag area was just allocated from this device's mapped heap.
            unsafe {
                acl::memory::memset(
                    self.acl,
                    flag_area.addr() as *mut c_void,
                    std::mem::size_of::<FlagArea>(),
                    0,
                    std::mem::size_of::<FlagArea>(),
                )
            }
            .map_err(runtime(self.id, "clear a flag area"))?;
            let info = ChannelInfo {
                index,
                record_addr: workspace + offset as u64,
                flag_area_addr: flag_area.addr(),
                platform_context: 0,
            };
            infos.push(info);
            channels.push((info, flag_area));
        }
        Ok(infos)
    }

    fn channel_exception(&self, channel: u32) -> Option<ChannelException> {
        if self.runtime == CannRuntime::Twin {
            if let Some(exception) = self.twin_channel_exception(channel) {
                return Some(exception);
            }
        }
        // In persistent mode nothing waits for the kernel's launch: look at the stream now (bounded, 1 ms), so a
        // kernel that ended with an exception is seen.
        self.poll_stream();
        let error = self.stream_error()?;
        let record_addr = {
            let channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
            channels.get(channel as usize)?.0.record_addr
        };
        let mut bytes = [0u8; CHANNEL_RECORD_BYTES];
        self.read_device(record_addr, &mut bytes, "read a channel record").ok()?;
        let record = ChannelRecord::read_from_bytes(&bytes).ok()?;
        let depth = record.sq_depth.get().max(1);
        let head = record.sq_head.get();
        let mut sqe = [0u8; SQE_BYTES as usize];
        let sqe_addr = record.sq_base.get() + u64::from(head % depth) * SQE_BYTES;
        if self.read_device(sqe_addr, &mut sqe, "read the SQE at the head").is_err() {
            sqe = [0; SQE_BYTES as usize];
        }
        tracing::warn!(device = self.id, channel, error = %error, "channel exception from the kernel stream");
        Some(ChannelException {
            channel,
            sq_id: record.sq_id.get(),
            head,
            tail: record.sq_tail.get(),
            syndrome: SdmaSyndrome::STREAM_EXCEPTION,
            sqe,
            detail: Some(format!("stream error: {error}")),
        })
    }

    fn reset_channel(&self, channel: u32) -> Result<(), DeviceError> {
        if self.runtime == CannRuntime::Twin {
            return cann_twin::control::reset_channel(self.id as i32, channel).map_err(|error| DeviceError::Runtime {
                device: self.id,
                step: "reset an SDMA channel (twin runtime)",
                detail: error.to_string(),
            });
        }
        Err(DeviceError::Unavailable {
            backend: "cann",
            reason: format!(
                "device {}: resetting SDMA channel {channel} after an exception is not implemented on CANN (the \
                 stream and SHMEM's queues must be recovered by the runtime; no call for it is known)",
                self.id
            ),
        })
    }

    fn launch(&self, kernel_args: u64, block_dim: u32) -> Result<Arc<dyn Launch>, DeviceError> {
        // The trait takes `&self`; the launch must keep the device alive, so find our own Arc in the registry.
        let me = registry_lookup(self).ok_or_else(|| DeviceError::Invalid {
            device: self.id,
            operation: "launch",
            reason: "device not registered".into(),
        })?;
        me.launch_arc(kernel_args, block_dim)
    }

    fn launch_function(&self, name: &str, argument: u64, block_dim: u32) -> Result<Arc<dyn Launch>, DeviceError> {
        // As for `launch`: the launch keeps the device alive.
        let me = registry_lookup(self).ok_or_else(|| DeviceError::Invalid {
            device: self.id,
            operation: "launch a kernel by name",
            reason: "device not registered".into(),
        })?;
        me.launch_by_name(name, argument, block_dim)
    }

    fn cycles_per_second(&self) -> u64 {
        self.settings.counter_hz
    }
}
