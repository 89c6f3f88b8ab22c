//! A deliberate device fault, for the hardware tier's fault test only: one request posted straight into a block's
//! request ring with device addresses the caller chooses, so that the kernel builds an SDMA copy the engine would
//! never let through (a destination outside every mapping). What the device then reports is what the test observes:
//! on the twin runtime its SDMA engine refuses the copy with a destination fault; on the NPU the test asks whether
//! the fault surfaces as a task exception of the kernel's stream (docs/HARDWARE_TESTING.md, "Assumptions and the
//! hardware tests").
//!
//! Owns nothing: it goes through `HostBlock::post_backlog`, the one place requests enter a ring, and the drain
//! finishes the request like any other (recovery included).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocopy::little_endian::{U32, U64};

use super::inflight::InFlight;
use super::observe::HostMark;
use super::AivTransport;
use crate::config::LaunchMode;
use crate::device::DeviceError;
use crate::kernel_abi::{RequestEntry, REQUEST_OPCODE_WRITE};
use crate::transfer::{CompletionSignal, TaskSlot};

impl AivTransport {
    /// Test-only: posts one WRITE of `length` bytes from device address `src` to device address `dst` on block
    /// `block`, unchecked: neither address is resolved through a registration or a peer window, and no bounds check
    /// of the engine runs. Returns the request's slot, which the drain finishes as it finishes any transfer (its
    /// state and reason say what the device did); nothing else waits for it, so the caller polls it, bounded by
    /// `timeout` (the slot's watchdog deadline).
    ///
    /// Unreachable from the engine's transfer API and from the network: `TransferEngine` and its batches, the C
    /// and Python bindings, the tcp, handshake and metadata servers never call it; every request they carry is
    /// validated against registered buffers and translated through the transport's windows before it reaches a
    /// ring. Only Rust code holding the device's `AivTransport` (`AivDevice::transport`) can call it, and only the
    /// hardware tier's fault test does.
    #[doc(hidden)]
    pub fn post_unchecked_write_for_fault_tests(
        &self,
        block: u32,
        src: u64,
        dst: u64,
        length: u64,
        timeout: Duration,
    ) -> Result<Arc<TaskSlot>, DeviceError> {
        let inner = &self.inner;
        let invalid = |reason: String| DeviceError::Invalid {
            device: inner.device.device_id(),
            operation: "post an unchecked request for a fault test",
            reason,
        };
        let Some(host_block) = inner.blocks.get(block as usize) else {
            return Err(invalid(format!("block {block} of {}", inner.blocks.len())));
        };
        if length == 0 || src.checked_add(length).is_none() || dst.checked_add(length).is_none() {
            return Err(invalid(format!("length {length} from {src:#x} to {dst:#x}")));
        }
        let slot = Arc::new(TaskSlot::new(Instant::now() + timeout, Arc::new(CompletionSignal::default())));
        slot.mark_pending();
        let id = inner.next_transfer_id.fetch_add(1, Ordering::Relaxed);
        let entry = RequestEntry {
            transfer_id: U64::new(id),
            src_addr: U64::new(src),
            dst_addr: U64::new(dst),
            length: U64::new(length),
            opcode: U32::new(REQUEST_OPCODE_WRITE),
            ..RequestEntry::default()
        };
        let inflight = InFlight { slot: slot.clone(), peer: None, length, rdma: None, host_mark: HostMark::default() };
        let mut producer = host_block.producer.lock().unwrap_or_else(|p| p.into_inner());
        producer.backlog.push_back((entry, inflight));
        host_block.post_backlog(producer, None);
        if inner.launch_mode == LaunchMode::PerBatch {
            inner.launch()?;
        }
        Ok(slot)
    }
}
