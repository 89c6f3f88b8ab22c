//! A twin NIC QP ([`Qp`]): its state, shared by its engine, its reader thread and the calls ([`QpInner`]), and what
//! is done to it outside the engine's loop: the doorbells written to its register page (decoded and checked here; a
//! write that is no valid doorbell writes nothing, records the QP's exception and moves it to the error state),
//! the CQE of a completed WQE written at the CQ's producer index, never over one the consumer has not released, and
//! its teardown.
//!
//! It does not decide anything about a WQE: which one completes, when and with what status is the engine's
//! (`nic/engine.rs`); nothing here takes a WQE from the SQ or touches a connection.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::common::Event;
use super::common::Responder;
use super::common::{join_until, lock, write_cqe};
use super::layout::{
    CQE_OPCODE_MASK, CQE_OWNER_BIT, CQE_QPN_MASK, CQE_STATUS_SHIFT, CQE_WQE_INDEX_SHIFT, DB_CMD_CQ_PTR, DB_CMD_SHIFT,
    DB_CMD_SQ, DB_CQ_INDEX_MASK, DB_INDEX_SHIFT, DB_SQ_INDEX_MASK, DB_TAG_MASK,
};
use super::wire::Conn;
use super::{
    Nic, QpConfig, QpException, QpFault, QpInfo, QpState, CQE_BYTES, CQ_DOORBELL_OFFSET, NIC_PAGES, SQ_DOORBELL_OFFSET,
};
use crate::provenance::qp as provenance;
use crate::sdma::RegisterFault;
use crate::space::with_space_mut;

#[derive(Debug)]
pub(super) struct QpInner {
    pub(super) state: QpState,
    pub(super) peer: Option<(SocketAddr, u32)>,
    pub(super) exception: Option<QpException>,
    /// Free-running SQ producer index from the doorbells.
    pub(super) producer: u32,
    pub(super) head: u32,
    pub(super) cq_producer: u32,
    pub(super) cq_consumer: u32,
    pub(super) first_error: Option<(u32, u32)>,
    pub(super) cq_broken: bool,
    pub(super) cqes_lost: u64,
    pub(super) shutdown: bool,
    /// Responses (and connection losses) the reader thread of the link of that generation handed over.
    pub(super) inbox: VecDeque<(u64, Event)>,
    /// Payload bytes in `inbox`.
    pub(super) inbox_bytes: usize,
}

/// One QP and its CQ.
#[derive(Debug)]
pub(super) struct Qp {
    pub(super) info: QpInfo,
    pub(super) config: QpConfig,
    pub(super) page: u64,
    pub(super) inner: Mutex<QpInner>,
    pub(super) wake: Condvar,
    /// The connection [`connect_qp`](super::connect_qp) made, for the engine to take.
    pub(super) handoff: Mutex<Option<Conn>>,
    /// As target: the request sequence of each initiator QP served (a few; the oldest is forgotten first).
    pub(super) responders: Mutex<VecDeque<Responder>>,
    pub(super) engine: Mutex<Option<JoinHandle<()>>>,
    /// The reader threads of the engine's connections (one running at a time).
    pub(super) readers: Mutex<Vec<JoinHandle<()>>>,
    /// The activity record of the config's `wake_block`, signalled after each CQE.
    pub(super) activity: Option<Arc<crate::activity::Activity>>,
    /// Who wrote each WQE taken, rang its doorbell and first read its CQE ([`provenance`]).
    pub(super) provenance: Arc<provenance::QpProvenance>,
}

/// One WQE's outcome.
pub(super) struct Completion {
    pub(super) opcode: u32,
    pub(super) status: u32,
    pub(super) bytes: u32,
    pub(super) signaled: bool,
}

impl Qp {
    /// Stops the engine, unregisters the page and frees the queues; returns the threads left running.
    pub(super) fn destroy(&self, deadline: Instant) -> usize {
        NIC_PAGES.write().unwrap_or_else(|p| p.into_inner()).remove(&self.page);
        provenance::unwatch(&self.provenance);
        {
            let mut inner = lock(&self.inner);
            inner.shutdown = true;
            self.wake.notify_all();
        }
        let mut left = join_until(lock(&self.engine).take().into_iter().collect(), deadline);
        left += join_until(std::mem::take(&mut *lock(&self.readers)), deadline);
        if let Some(conn) = lock(&self.handoff).take() {
            conn.close();
        }
        let _ = with_space_mut(|space| {
            let _ = space.free(self.info.sq_base as usize);
            let _ = space.free(self.info.cq_base as usize);
            space.give_register_page(self.page as usize);
            Ok(())
        });
        left
    }

    /// Records the first exception and moves the QP to the error state.
    pub(super) fn fail(&self, inner: &mut QpInner, fault: QpFault) {
        if inner.exception.is_none() {
            inner.exception = Some(QpException { device: self.info.device, qpn: self.info.qpn, fault });
        }
        inner.state = QpState::Error;
        self.wake.notify_all();
    }

    pub(super) fn doorbell(&self, offset: u64, bytes: &[u8], origin: u32) -> Result<(), RegisterFault> {
        let refused =
            || RegisterFault::QpRefused { device: self.info.device, qpn: self.info.qpn, offset, width: bytes.len() };
        let mut inner = lock(&self.inner);
        let word = match <[u8; 8]>::try_from(bytes) {
            Ok(word) if offset == SQ_DOORBELL_OFFSET || offset == CQ_DOORBELL_OFFSET => u64::from_le_bytes(word),
            _ => {
                self.fail(&mut inner, QpFault::RegisterAccess { offset, width: bytes.len() });
                return Err(refused());
            }
        };
        let tag = (word & DB_TAG_MASK) as u32;
        let command = (word >> DB_CMD_SHIFT & 0xF) as u32;
        let (want_tag, want_command) =
            if offset == SQ_DOORBELL_OFFSET { (self.info.qpn, DB_CMD_SQ) } else { (self.info.cqn, DB_CMD_CQ_PTR) };
        if u64::from(command) != want_command {
            self.fail(&mut inner, QpFault::DoorbellCommand { offset, command });
            return Err(refused());
        }
        if tag != want_tag {
            self.fail(&mut inner, QpFault::DoorbellTag { offset, tag });
            return Err(refused());
        }
        if offset == SQ_DOORBELL_OFFSET {
            let index = (word >> DB_INDEX_SHIFT & DB_SQ_INDEX_MASK) as u16;
            let producer = inner.producer.wrapping_add(u32::from(index.wrapping_sub(inner.producer as u16)));
            if producer.wrapping_sub(inner.head) > self.info.sq_depth {
                let head = inner.head;
                self.fail(&mut inner, QpFault::SqOverflow { producer, head, depth: self.info.sq_depth });
                return Err(refused());
            }
            inner.producer = producer;
            self.provenance.rung(origin, crate::provenance::recording());
        } else {
            let index = (word >> DB_INDEX_SHIFT & DB_CQ_INDEX_MASK) as u32;
            let consumer =
                inner.cq_consumer.wrapping_add(index.wrapping_sub(inner.cq_consumer) & DB_CQ_INDEX_MASK as u32);
            if consumer.wrapping_sub(inner.cq_consumer) > inner.cq_producer.wrapping_sub(inner.cq_consumer) {
                let producer = inner.cq_producer;
                self.fail(&mut inner, QpFault::CqBeyondProducer { consumer, producer });
                return Err(refused());
            }
            inner.cq_consumer = consumer;
        }
        self.wake.notify_all();
        Ok(())
    }

    pub(super) fn stopping(&self, nic: &Nic) -> bool {
        nic.shutdown.load(Ordering::Acquire) || lock(&self.inner).shutdown
    }

    /// Writes the CQE of the WQE at `index` if a CQ slot is free (`false`: the CQ is full). After a CQ overrun or
    /// a queue fault nothing is written and the completion is counted as lost.
    pub(super) fn try_complete(
        &self,
        nic: &Nic,
        index: u32,
        completion: &Completion,
        taken: provenance::Taken,
    ) -> bool {
        let depth = self.info.cq_depth;
        let recording = crate::provenance::recording();
        let mut inner = lock(&self.inner);
        if inner.cq_broken {
            inner.cqes_lost += 1;
            drop(inner);
            if recording {
                self.provenance.completed(taken);
            }
            return true;
        }
        if inner.cq_producer.wrapping_sub(inner.cq_consumer) >= depth {
            return false;
        }
        let producer = inner.cq_producer;
        drop(inner);
        let owner = if producer & depth != 0 { 0 } else { CQE_OWNER_BIT };
        let byte4 = completion.opcode & CQE_OPCODE_MASK
            | owner
            | (completion.status & 0xFF) << CQE_STATUS_SHIFT
            | (index & 0xFFFF) << CQE_WQE_INDEX_SHIFT;
        let mut cqe = [0u8; CQE_BYTES as usize];
        cqe[0..4].copy_from_slice(&byte4.to_le_bytes());
        cqe[12..16].copy_from_slice(&(self.info.qpn & CQE_QPN_MASK).to_le_bytes());
        cqe[16..20].copy_from_slice(&completion.bytes.to_le_bytes());
        let address = self.info.cq_base + u64::from(producer & (depth - 1)) * CQE_BYTES;
        if recording {
            // Before the CQE is written: a reader that sees it finds its record.
            let first_word = u64::from_le_bytes(cqe[0..8].try_into().expect("8 bytes"));
            self.provenance.cqe_landing(taken, producer, first_word);
        }
        let mut inner = lock(&self.inner);
        if write_cqe(address, &cqe).is_err() {
            self.fail(&mut inner, QpFault::QueueFault { address });
            inner.cq_broken = true;
            inner.cqes_lost += 1;
            return true;
        }
        inner.cq_producer = producer.wrapping_add(1);
        drop(inner);
        nic.counters.cqes_written.fetch_add(1, Ordering::Relaxed);
        if let Some(activity) = &self.activity {
            activity.progressed();
        }
        true
    }
}
