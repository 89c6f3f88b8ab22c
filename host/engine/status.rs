//! What became of submitted work: each task's status, reason, failure and evidence, a batch's status, bounded
//! waits (traced when tracing is on), and freeing a batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{deadline_after, lock, TransferEngine};
use crate::error::{EngineError, Result};
use crate::evidence::TransferEvidence;
use crate::transfer::{BatchId, TaskSlot, TransferFailure, TransferStatus};

impl TransferEngine {
    /// Status of one task (index in submission order).
    pub fn transfer_status(&self, batch_id: BatchId, task: usize) -> Result<TransferStatus> {
        // Completions a polling caller can collect itself (aiv's DCQ) are collected here, as a waiter would.
        self.batch("get transfer status", batch_id)?.poll();
        let slot = self.task(batch_id, task)?;
        Ok(TransferStatus { state: slot.state(), transferred_bytes: slot.transferred_bytes() })
    }

    /// Why a task failed or timed out, if it did.
    pub fn task_reason(&self, batch_id: BatchId, task: usize) -> Result<Option<String>> {
        Ok(self.task(batch_id, task)?.reason())
    }

    /// Why a task failed or timed out, as the typed failure its path recorded.
    pub fn task_failure(&self, batch_id: BatchId, task: usize) -> Result<Option<TransferFailure>> {
        Ok(self.task(batch_id, task)?.failure())
    }

    /// What a finished task recorded about how it was carried.
    pub fn task_evidence(&self, batch_id: BatchId, task: usize) -> Result<Option<TransferEvidence>> {
        Ok(self.task(batch_id, task)?.evidence())
    }

    fn task(&self, batch_id: BatchId, task: usize) -> Result<Arc<TaskSlot>> {
        let batch = self.batch("get transfer status", batch_id)?;
        let tasks = batch.tasks();
        tasks.get(task).cloned().ok_or(EngineError::UnknownTask { batch: batch_id.0, task, submitted: tasks.len() })
    }

    /// Status of a whole batch: COMPLETED if every task completed, FAILED if any failed or timed out.
    pub fn batch_status(&self, batch_id: BatchId) -> Result<TransferStatus> {
        let batch = self.batch("get batch status", batch_id)?;
        batch.poll();
        Ok(batch.status())
    }

    /// Blocks until every task of the batch is terminal (bounded by the transfer timeout) and returns its status.
    pub fn wait_batch(&self, batch_id: BatchId) -> Result<TransferStatus> {
        self.wait_batch_until(batch_id, None)
    }

    /// As [`Self::wait_batch`], returning after `timeout` at the latest: the status is then PENDING if some task is
    /// still running (the wait is bounded by the transfer timeout too, so a `timeout` beyond it changes nothing).
    pub fn wait_batch_for(&self, batch_id: BatchId, timeout: Duration) -> Result<TransferStatus> {
        self.wait_batch_until(batch_id, Some(deadline_after(timeout)))
    }

    fn wait_batch_until(&self, batch_id: BatchId, until: Option<Instant>) -> Result<TransferStatus> {
        let batch = self.batch("wait batch", batch_id)?;
        let Some(path) = batch.traced_path() else { return Ok(batch.wait(until)) };
        let start = crate::trace::now_ns();
        let status = batch.wait(until);
        let end = crate::trace::now_ns();
        let tasks = batch.tasks().len() as u64;
        let id = batch_id.0;
        if let Some((at, thread)) = batch.signal.last_notify() {
            self.tracer.host_on(thread, path, crate::trace::HostStage::CompletionSeen, at, at, id, tasks);
        }
        self.tracer.host(path, crate::trace::HostStage::Wait, start, end, id, tasks);
        self.tracer.host(path, crate::trace::HostStage::Woken, end, end, id, tasks);
        Ok(status)
    }
    /// Frees a batch; BatchBusy while any of its tasks is pending.
    pub fn free_batch(&self, batch_id: BatchId) -> Result<()> {
        let mut batches = lock(&self.batches);
        let batch =
            batches.get(&batch_id).ok_or(EngineError::UnknownBatch { operation: "free batch", id: batch_id.0 })?;
        let pending = batch.pending();
        if pending > 0 {
            return Err(EngineError::BatchBusy { batch: batch_id.0, pending });
        }
        batches.remove(&batch_id);
        Ok(())
    }
}
