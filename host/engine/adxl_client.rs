//! ADXL's client shape over the engine (`adxl::AdxlEngine`'s `Connect`, `TransferSync`, `TransferAsync`,
//! `GetTransferStatus`), for programs written against ADXL: every request goes through the `adxl` transport.
//!
//! Owns: the connected-remote table of one client. It must not move bytes or touch a transport: it only submits
//! batches to the engine and reads their task states.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::TransferEngine;
use crate::transfer::{BatchId, Opcode, Protocol, SegmentId, TransferRequest, TransferState};
use crate::transport::adxl::AdxlStatus;

/// One entry of an ADXL transfer list (`adxl::TransferOpDesc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferOpDesc {
    /// Address of registered memory of this engine.
    pub local_addr: u64,
    /// Address in the remote engine's view.
    pub remote_addr: u64,
    /// Bytes.
    pub len: u64,
}

/// A transfer list started by [`AdxlClient::transfer_async`].
#[derive(Debug)]
pub struct AdxlRequest {
    batch: BatchId,
    tasks: usize,
}

/// What [`AdxlClient::get_transfer_status`] reports (`adxl::TransferStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdxlTransferStatus {
    /// Still in flight.
    Waiting,
    /// Every entry completed.
    Completed,
    /// At least one entry ended with this status.
    Failed(AdxlStatus),
}

/// ADXL's client shape over the engine: `Connect` per remote engine, `TransferSync` / `TransferAsync` of a list of
/// [`TransferOpDesc`], `GetTransferStatus` polling, timeouts; every request goes through the `adxl` transport.
#[derive(Debug)]
pub struct AdxlClient<'e> {
    engine: &'e TransferEngine,
    connected: Mutex<std::collections::HashMap<String, SegmentId>>,
}

impl<'e> AdxlClient<'e> {
    /// A client of `engine` (whose device must be open: [`TransferEngine::device`]).
    pub fn new(engine: &'e TransferEngine) -> Self {
        AdxlClient { engine, connected: Mutex::new(std::collections::HashMap::new()) }
    }

    /// `Connect`: finds the remote engine's segment (bounded by the metadata layer's own timeouts) and checks that
    /// it advertises device memory; NOT_CONNECTED otherwise.
    pub fn connect(&self, remote: &str) -> AdxlStatus {
        let Ok(id) = self.engine.open_segment(remote) else { return AdxlStatus::NOT_CONNECTED };
        match self.engine.segment(id) {
            Ok(segment) if segment.descriptor.aiv.is_some() => {
                self.connected.lock().unwrap_or_else(|p| p.into_inner()).insert(remote.to_owned(), id);
                AdxlStatus::SUCCESS
            }
            _ => AdxlStatus::NOT_CONNECTED,
        }
    }

    /// `Disconnect`.
    pub fn disconnect(&self, remote: &str) -> AdxlStatus {
        match self.connected.lock().unwrap_or_else(|p| p.into_inner()).remove(remote) {
            Some(_) => AdxlStatus::SUCCESS,
            None => AdxlStatus::NOT_CONNECTED,
        }
    }

    /// `TransferAsync`: starts the list; poll with [`Self::get_transfer_status`].
    pub fn transfer_async(
        &self,
        remote: &str,
        operation: Opcode,
        list: &[TransferOpDesc],
    ) -> Result<AdxlRequest, AdxlStatus> {
        let Some(&target) = self.connected.lock().unwrap_or_else(|p| p.into_inner()).get(remote) else {
            return Err(AdxlStatus::NOT_CONNECTED);
        };
        if list.is_empty() || list.iter().any(|op| op.len == 0) {
            return Err(AdxlStatus::PARAM_INVALID);
        }
        let requests: Vec<TransferRequest> = list
            .iter()
            .map(|op| TransferRequest {
                opcode: operation,
                source: op.local_addr,
                target_id: target,
                target_offset: op.remote_addr,
                length: op.len,
                protocol: Some(Protocol::Adxl),
            })
            .collect();
        let batch = self.engine.allocate_batch(requests.len()).map_err(|_| AdxlStatus::FAILED)?;
        if self.engine.submit_transfer(batch, &requests).is_err() {
            let _ = self.engine.free_batch(batch);
            return Err(AdxlStatus::PARAM_INVALID);
        }
        Ok(AdxlRequest { batch, tasks: requests.len() })
    }

    /// `GetTransferStatus`: Waiting, Completed, or the first failing entry's status.
    pub fn get_transfer_status(&self, request: &AdxlRequest) -> AdxlTransferStatus {
        let mut waiting = false;
        for task in 0..request.tasks {
            let Ok(status) = self.engine.transfer_status(request.batch, task) else {
                return AdxlTransferStatus::Failed(AdxlStatus::PARAM_INVALID);
            };
            match status.state {
                TransferState::Completed => {}
                TransferState::Timeout => return AdxlTransferStatus::Failed(AdxlStatus::TIMEOUT),
                state if state.is_terminal() => {
                    let failure = self.engine.task_failure(request.batch, task).ok().flatten();
                    return AdxlTransferStatus::Failed(
                        failure.as_ref().map_or(AdxlStatus::FAILED, AdxlStatus::of_failure),
                    );
                }
                _ => waiting = true,
            }
        }
        if waiting {
            AdxlTransferStatus::Waiting
        } else {
            AdxlTransferStatus::Completed
        }
    }

    /// Releases a finished request; false while it is still in flight.
    pub fn release(&self, request: &AdxlRequest) -> bool {
        self.engine.free_batch(request.batch).is_ok()
    }

    /// `TransferSync`: starts the list and polls its status until it ends or `timeout` passes (TIMEOUT; the
    /// transfers still end within the engine's watchdog budget and the request is released then).
    pub fn transfer_sync(
        &self,
        remote: &str,
        operation: Opcode,
        list: &[TransferOpDesc],
        timeout: Duration,
    ) -> AdxlStatus {
        let request = match self.transfer_async(remote, operation, list) {
            Ok(request) => request,
            Err(status) => return status,
        };
        let deadline = super::deadline_after(timeout);
        loop {
            match self.get_transfer_status(&request) {
                AdxlTransferStatus::Waiting if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(20));
                }
                AdxlTransferStatus::Waiting => {
                    self.engine.wait_batch(request.batch).ok();
                    self.release(&request);
                    return AdxlStatus::TIMEOUT;
                }
                AdxlTransferStatus::Completed => {
                    self.release(&request);
                    return AdxlStatus::SUCCESS;
                }
                AdxlTransferStatus::Failed(status) => {
                    self.engine.wait_batch(request.batch).ok();
                    self.release(&request);
                    return status;
                }
            }
        }
    }
}
