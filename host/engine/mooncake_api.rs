//! The helpers users know from Mooncake's Python `TransferEngine`: synchronous and asynchronous reads and writes of
//! one range or a list, batch status, the first buffer of a segment.

use super::TransferEngine;
use crate::error::{EngineError, Result};
use crate::transfer::{BatchId, Opcode, Protocol, TransferRequest, TransferState, TransferStatus};

impl TransferEngine {
    /// Reads `length` bytes at `peer_addr` of segment `target` into local `buffer`, and waits.
    pub fn transfer_sync_read(&self, target: &str, buffer: u64, peer_addr: u64, length: u64) -> Result<()> {
        self.batch_transfer_sync(Opcode::Read, target, &[buffer], &[peer_addr], &[length])
    }

    /// Writes `length` bytes of local `buffer` to `peer_addr` of segment `target`, and waits.
    pub fn transfer_sync_write(&self, target: &str, buffer: u64, peer_addr: u64, length: u64) -> Result<()> {
        self.batch_transfer_sync(Opcode::Write, target, &[buffer], &[peer_addr], &[length])
    }

    /// Reads several ranges and waits for all of them.
    pub fn batch_transfer_sync_read(
        &self,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<()> {
        self.batch_transfer_sync(Opcode::Read, target, buffers, peer_addrs, lengths)
    }

    /// Writes several ranges and waits for all of them.
    pub fn batch_transfer_sync_write(
        &self,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<()> {
        self.batch_transfer_sync(Opcode::Write, target, buffers, peer_addrs, lengths)
    }

    /// Starts reading several ranges; poll with [`Self::get_batch_transfer_status`], then [`Self::free_batch`].
    pub fn batch_transfer_async_read(
        &self,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<BatchId> {
        self.batch_transfer_async(Opcode::Read, target, buffers, peer_addrs, lengths)
    }

    /// Starts writing several ranges; poll with [`Self::get_batch_transfer_status`], then [`Self::free_batch`].
    pub fn batch_transfer_async_write(
        &self,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<BatchId> {
        self.batch_transfer_async(Opcode::Write, target, buffers, peer_addrs, lengths)
    }

    /// Status of several batches at once.
    pub fn get_batch_transfer_status(&self, batch_ids: &[BatchId]) -> Vec<Result<TransferStatus>> {
        batch_ids.iter().map(|&id| self.batch_status(id)).collect()
    }

    /// Address of the first buffer of a segment (its lowest address). A segment cached with no buffer is fetched
    /// again first, rate-limited like a transfer's stale-descriptor refresh.
    pub fn get_first_buffer_address(&self, target: &str) -> Result<u64> {
        let id = self.open_segment(target)?;
        let mut segment = self.segment(id)?;
        if segment.buffers.iter().next().is_none() && self.may_refresh_stale(id) {
            // A peer publishes its descriptor before it registers memory: one opened in between is cached with no
            // buffer, so it is fetched again (at most once per STALE_REFRESH_INTERVAL) before the call fails.
            match self.refresh_segment(id) {
                Ok(()) => segment = self.segment(id)?,
                Err(error) => tracing::debug!(segment = %target, %error, "descriptor refresh failed"),
            }
        }
        let first = segment.buffers.iter().next().map(|buffer| buffer.addr);
        first.ok_or_else(|| EngineError::SegmentNotFound {
            name: target.to_owned(),
            reason: "the segment exposes no buffer".into(),
        })
    }

    fn batch_transfer_async(
        &self,
        opcode: Opcode,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<BatchId> {
        self.batch_transfer_async_over(opcode, target, buffers, peer_addrs, lengths, None)
    }

    /// Starts `buffers.len()` transfers in one direction to segment `target` in a new batch, each over `protocol`
    /// (`None`: the configured protocol). Refuses lists of different lengths and an empty list; a batch whose
    /// submission is refused is freed.
    pub fn batch_transfer_async_over(
        &self,
        opcode: Opcode,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
        protocol: Option<Protocol>,
    ) -> Result<BatchId> {
        let operation = "batch transfer";
        if buffers.len() != peer_addrs.len() || buffers.len() != lengths.len() {
            return Err(EngineError::InvalidArgument {
                operation,
                reason: format!(
                    "{} buffers, {} peer addresses and {} lengths: the lists must have one length",
                    buffers.len(),
                    peer_addrs.len(),
                    lengths.len()
                ),
            });
        }
        if buffers.is_empty() {
            return Err(EngineError::InvalidArgument { operation, reason: "no transfer given".into() });
        }
        let target_id = self.open_segment(target)?;
        let requests: Vec<TransferRequest> = (0..buffers.len())
            .map(|i| TransferRequest {
                opcode,
                source: buffers[i],
                target_id,
                target_offset: peer_addrs[i],
                length: lengths[i],
                protocol,
            })
            .collect();
        let batch = self.allocate_batch(requests.len())?;
        if let Err(error) = self.submit_transfer(batch, &requests) {
            let _ = self.free_batch(batch);
            return Err(error);
        }
        Ok(batch)
    }

    fn batch_transfer_sync(
        &self,
        opcode: Opcode,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<()> {
        let batch = self.batch_transfer_async(opcode, target, buffers, peer_addrs, lengths)?;
        let status = self.wait_batch(batch)?;
        let result = if status.state == TransferState::Completed {
            Ok(())
        } else {
            let batch_ref = self.batch("wait batch", batch)?;
            let reason = batch_ref
                .tasks()
                .iter()
                .enumerate()
                .find_map(|(index, task)| task.reason().map(|reason| format!("task {index}: {reason}")))
                .unwrap_or_else(|| "no reason recorded".into());
            Err(EngineError::TransferFailed {
                operation: opcode.as_str(),
                segment: target.to_owned(),
                state: status.state,
                transferred: status.transferred_bytes,
                reason,
            })
        };
        // The wait above is bounded and leaves every task terminal, so the batch is free-able.
        self.free_batch(batch)?;
        result
    }
}
