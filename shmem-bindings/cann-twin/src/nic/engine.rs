//! The initiator side of a twin NIC QP. One engine thread per QP ([`Engine`]) takes the rung WQEs from the SQ in
//! order, validates them, sends their requests at once within the window, matches the responses that its
//! connection's reader thread hands over through the QP's inbox, goes back N when the oldest request's timer runs
//! out, and completes the WQEs strictly in order through the QP's CQ ([`Qp::try_complete`]).
//!
//! It serves no peer's requests (that is `nic/responder.rs`) and does not decode doorbells or lay out CQEs (that is
//! `nic/qp.rs`). Every wait is bounded (the oldest request's timer, the CQ-full wait, [`IDLE_TICK`]), and nothing
//! read from the wire or from device memory may panic it.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::common::{device_readable, handshake, lend_device, lock, psn_before, read_device, spawn, Event, IDLE_TICK};
use super::layout::{WQE_OPCODE_MASK, WQE_OWNER_BIT, WQE_SGE_NUM_SHIFT, WQE_SIGNALED_BIT};
use super::qp::{Completion, Qp};
use super::wire::{Conn, Frame, WireError, MAX_MESSAGE};
use super::{
    status, Nic, QpFault, QpState, MAX_OUTSTANDING, OPCODE_RDMA_READ, OPCODE_RDMA_WRITE, WINDOW_BYTES, WQE_STRIDE,
};
use crate::provenance::qp as provenance;
use crate::sdma::write_device;

/// Responses a reader thread holds for its engine at most, and their payload bytes: more than the requests sent on
/// one connection between two looks of the engine (two windows) can be answered by; past them the peer breaks the
/// protocol and the connection is given up.
const MAX_INBOX: usize = 4 * MAX_OUTSTANDING as usize;
const MAX_INBOX_BYTES: usize = 2 * (WINDOW_BYTES as usize + MAX_MESSAGE as usize);

/// The connection an engine sends on, and the generation its reader tags responses with.
struct Link {
    conn: Conn,
    generation: u64,
}

/// A request on the wire (sent at least once, or lost on the way), waiting for its response.
struct Request {
    psn: u32,
    frame: Frame,
    /// Where a READ's bytes land; where a WRITE's are read from at each send.
    local_va: u64,
    /// Retransmissions so far.
    retries: u8,
    /// When the current attempt times out.
    deadline: Instant,
}

/// Where a WQE the engine has taken from the SQ stands.
enum Stage {
    Pending(Request),
    /// Decided with this status: its CQE (if any) is to be written, in WQE order.
    Done(u32),
}

/// A WQE taken from the SQ and not yet completed.
struct Entry {
    index: u32,
    opcode: u32,
    signaled: bool,
    len: u32,
    stage: Stage,
    /// Who wrote the WQE and rang for it, as the NIC read them when it took it.
    taken: provenance::Taken,
}

impl Qp {
    /// The engine thread's body.
    pub(super) fn run(self: &Arc<Self>, nic: &Arc<Nic>) {
        let mut engine = Engine {
            qp: self,
            nic,
            window: VecDeque::new(),
            fetched: 0,
            psn: 0,
            link: None,
            generation: 0,
            full_since: None,
            fill_limited: false,
        };
        while engine.step() {}
        engine.drop_link();
    }

    /// A reader thread's body: the responses arriving on one connection (`generation`), handed to the engine
    /// through the QP's inbox, until the connection ends or the QP stops.
    fn read_responses(&self, nic: &Nic, mut conn: Conn, generation: u64) {
        let stop = || self.stopping(nic);
        loop {
            let event = match conn.receive(Instant::now() + IDLE_TICK, &stop) {
                Ok(None) => continue,
                // The link is down: the frame is lost.
                Ok(Some(_)) if nic.link_down.load(Ordering::Acquire) => continue,
                Ok(Some(frame)) => Event::Frame(frame),
                Err(WireError::Stopped) => break,
                Err(_) => Event::Lost,
            };
            let lost = matches!(event, Event::Lost);
            let bytes = match &event {
                Event::Frame(Frame::ReadResponse { bytes, .. }) => bytes.len(),
                _ => 0,
            };
            let mut inner = lock(&self.inner);
            if inner.inbox.len() >= MAX_INBOX || inner.inbox_bytes + bytes > MAX_INBOX_BYTES {
                // More responses than requests outstanding: the peer breaks the protocol.
                inner.inbox.push_back((generation, Event::Lost));
                self.wake.notify_all();
                break;
            }
            inner.inbox.push_back((generation, event));
            inner.inbox_bytes += bytes;
            self.wake.notify_all();
            drop(inner);
            if lost {
                break;
            }
        }
        conn.close();
    }
}

/// One QP's engine: the window of WQEs taken from the SQ and not yet completed, oldest first.
struct Engine<'a> {
    qp: &'a Arc<Qp>,
    nic: &'a Arc<Nic>,
    window: VecDeque<Entry>,
    /// The next SQ index to take (free-running; the QP's `head` is the next to complete).
    fetched: u32,
    /// The PSN of the last request taken.
    psn: u32,
    link: Option<Link>,
    generation: u64,
    /// Since when the CQ has been full for the oldest decided WQE.
    full_since: Option<Instant>,
    /// The last fill stopped at the window's limits (not for want of WQEs).
    fill_limited: bool,
}

impl Engine<'_> {
    /// One round: responses, completions in order, new WQEs into the window, the oldest request's timer; a bounded
    /// wait when none of them had anything to do. `false` when the QP or the NIC stops.
    fn step(&mut self) -> bool {
        if self.qp.stopping(self.nic) {
            return false;
        }
        let mut busy = self.take_events();
        busy |= self.complete_done();
        busy |= self.fill();
        busy |= self.check_timer();
        if !busy {
            self.wait();
        }
        true
    }

    fn oldest_pending(&self) -> Option<usize> {
        self.window.iter().position(|entry| matches!(entry.stage, Stage::Pending(_)))
    }

    fn drop_link(&mut self) {
        if let Some(link) = self.link.take() {
            link.conn.close();
        }
    }

    /// Makes `conn` the link, with a reader thread of its own.
    fn attach(&mut self, conn: Conn) {
        let Some(reading) = conn.try_clone() else {
            conn.close();
            return;
        };
        self.generation += 1;
        let generation = self.generation;
        let (qp, nic) = (Arc::clone(self.qp), Arc::clone(self.nic));
        let name = format!("cann-twin-nic-d{}q{:x}-rx", self.qp.info.device, self.qp.info.qpn);
        let mut readers = lock(&self.qp.readers);
        let (done, running): (Vec<_>, Vec<_>) = readers.drain(..).partition(|handle| handle.is_finished());
        done.into_iter().for_each(|handle| drop(handle.join()));
        *readers = running;
        match spawn(name, move || qp.read_responses(&nic, reading, generation)) {
            Ok(handle) => {
                readers.push(handle);
                self.link = Some(Link { conn, generation });
            }
            Err(_) => conn.close(),
        }
    }

    /// The responses and connection losses the reader handed over; `true` if there were any.
    fn take_events(&mut self) -> bool {
        let events: Vec<(u64, Event)> = {
            let mut inner = lock(&self.qp.inner);
            inner.inbox_bytes = 0;
            inner.inbox.drain(..).collect()
        };
        let any = !events.is_empty();
        for (generation, event) in events {
            if self.link.as_ref().map(|link| link.generation) != Some(generation) {
                // From a connection given up already.
                continue;
            }
            match event {
                Event::Lost => self.drop_link(),
                Event::Frame(frame) => self.respond(frame),
            }
        }
        any
    }

    /// A response: it completes the oldest pending request if it answers that request's PSN. A response to a PSN
    /// before it (an earlier attempt answered twice) or to a later request (the oldest's response was lost) is
    /// ignored: the oldest's timer goes back N. Anything else breaks the protocol and the connection is closed.
    fn respond(&mut self, frame: Frame) {
        let (got, status, bytes) = match frame {
            Frame::Ack { psn, status } => (psn, status, None),
            Frame::ReadResponse { psn, status, bytes } => (psn, status, Some(bytes)),
            _ => return self.drop_link(),
        };
        let Some(pos) = self.oldest_pending() else {
            // Nothing outstanding: a late answer to a retransmission.
            return;
        };
        let entry = &self.window[pos];
        let Stage::Pending(request) = &entry.stage else { return };
        if got != request.psn {
            let known = psn_before(got, request.psn)
                || self.window.iter().any(|e| matches!(&e.stage, Stage::Pending(r) if r.psn == got));
            if !known {
                self.drop_link();
            }
            return;
        }
        if (entry.opcode == OPCODE_RDMA_READ) != bytes.is_some() {
            return self.drop_link();
        }
        if status != 0 {
            return self.decide(pos, u32::from(status));
        }
        if let Some(bytes) = bytes {
            if bytes.len() != entry.len as usize {
                return self.decide(pos, status::LOCAL_LENGTH_ERR);
            }
            if write_device(request.local_va, &bytes).is_err() {
                return self.decide(pos, status::LOCAL_PROT_ERR);
            }
        }
        self.window[pos].stage = Stage::Done(status::SUCCESS);
    }

    /// The WQE at `pos` of the window (every one before it decided) fails with `status`: the QP goes to the error
    /// state and every later WQE of the window, sent or not, is flushed.
    fn decide(&mut self, pos: usize, status: u32) {
        let index = self.window[pos].index;
        self.window[pos].stage = Stage::Done(status);
        for later in self.window.iter_mut().skip(pos + 1) {
            later.stage = Stage::Done(status::WR_FLUSH_ERR);
        }
        let mut inner = lock(&self.qp.inner);
        if inner.first_error.is_none() && status != status::WR_FLUSH_ERR {
            inner.first_error = Some((status, index & 0xFFFF));
        }
        inner.state = QpState::Error;
    }

    /// Writes the CQEs of the decided WQEs at the front of the window, in order, while the CQ has room; raises a CQ
    /// overrun when it stays full for `cq_full_wait`. `true` if any WQE completed.
    fn complete_done(&mut self) -> bool {
        let mut any = false;
        while let Some(entry) = self.window.front() {
            let Stage::Done(status) = entry.stage else { break };
            let (index, len, taken) = (entry.index, entry.len, entry.taken);
            let completion = Completion {
                opcode: entry.opcode,
                status,
                bytes: if status == status::SUCCESS { len } else { 0 },
                signaled: entry.signaled,
            };
            if status != status::SUCCESS {
                let mut inner = lock(&self.qp.inner);
                if inner.first_error.is_none() && status != status::WR_FLUSH_ERR {
                    inner.first_error = Some((status, index & 0xFFFF));
                }
                inner.state = QpState::Error;
            }
            let wanted = status != status::SUCCESS || completion.signaled;
            let recording = crate::provenance::recording();
            if wanted && !self.qp.try_complete(self.nic, index, &completion, taken) {
                let since = *self.full_since.get_or_insert_with(Instant::now);
                if since.elapsed() < self.qp.config.cq_full_wait {
                    break;
                }
                let mut inner = lock(&self.qp.inner);
                self.qp.fail(&mut inner, QpFault::CqOverrun { wqe_index: index & 0xFFFF });
                inner.cq_broken = true;
                inner.cqes_lost += 1;
                drop(inner);
                if recording {
                    self.qp.provenance.completed(taken);
                }
            } else if !wanted && recording {
                self.qp.provenance.completed(taken);
            }
            self.full_since = None;
            self.window.pop_front();
            if status == status::SUCCESS {
                self.nic.counters.wqes_executed.fetch_add(1, Ordering::Relaxed);
            }
            lock(&self.qp.inner).head = index.wrapping_add(1);
            any = true;
        }
        any
    }

    /// Takes rung WQEs into the window while it has room (requests and bytes) and no local failure waits in it;
    /// sends each request at once. `true` if any WQE was taken.
    fn fill(&mut self) -> bool {
        let mut any = false;
        self.fill_limited = false;
        loop {
            let held_failure = self.window.iter().any(|e| {
                matches!(e.stage, Stage::Done(status) if status != status::SUCCESS && status != status::WR_FLUSH_ERR)
            });
            if self.window.len() >= self.qp.config.max_outstanding as usize || held_failure {
                self.fill_limited = true;
                return any;
            }
            let producer = lock(&self.qp.inner).producer;
            if self.fetched == producer {
                return any;
            }
            let Some(entry) = self.take(self.fetched) else {
                self.fill_limited = true;
                return any;
            };
            self.fetched = self.fetched.wrapping_add(1);
            let pending = matches!(entry.stage, Stage::Pending(_));
            self.window.push_back(entry);
            if pending {
                self.transmit(self.window.len() - 1);
            }
            any = true;
        }
    }

    /// The WQE at SQ index `index`, validated; `None` when its request does not fit in the window's byte budget
    /// beside the requests outstanding (it is taken later).
    fn take(&mut self, index: u32) -> Option<Entry> {
        let qp = self.qp;
        let depth = qp.info.sq_depth;
        let slot = qp.info.sq_base + u64::from(index & (depth - 1)) * WQE_STRIDE;
        let taken = qp.provenance.taken(index, depth);
        let done = |opcode: u32, status: u32| {
            Some(Entry { index, opcode, signaled: true, len: 0, stage: Stage::Done(status), taken })
        };
        let raw = match read_device(slot, WQE_STRIDE as usize) {
            Ok(raw) => raw,
            Err(_) => {
                qp.fail(&mut lock(&qp.inner), QpFault::QueueFault { address: slot });
                return done(0, status::LOCAL_QP_OP_ERR);
            }
        };
        let u32_at = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
        let u64_at = |at: usize| u64::from(u32_at(at)) | u64::from(u32_at(at + 4)) << 32;
        let byte4 = u32_at(0);
        let opcode = byte4 & WQE_OPCODE_MASK;
        let signaled = byte4 & WQE_SIGNALED_BIT != 0;
        let (msg_len, sge_num, rkey, remote_va) = (u32_at(4), u32_at(12) >> WQE_SGE_NUM_SHIFT, u32_at(20), u64_at(24));
        let (sge_len, lkey, local_va) = (u32_at(32), u32_at(36), u64_at(40));
        let (state, peer) = {
            let inner = lock(&qp.inner);
            (inner.state, inner.peer)
        };
        if state == QpState::Error {
            return done(opcode, status::WR_FLUSH_ERR);
        }
        let lap = index & depth != 0;
        if (byte4 & WQE_OWNER_BIT != 0) == lap {
            // The owner bit of an earlier lap: this slot was not written for this index.
            return done(opcode, status::LOCAL_QP_OP_ERR);
        }
        if peer.is_none() || state != QpState::ReadyToSend {
            return done(opcode, status::LOCAL_QP_OP_ERR);
        }
        if (opcode != OPCODE_RDMA_WRITE && opcode != OPCODE_RDMA_READ) || sge_num != 1 {
            return done(opcode, status::LOCAL_QP_OP_ERR);
        }
        if msg_len > MAX_MESSAGE || sge_len != msg_len {
            return done(opcode, status::LOCAL_LENGTH_ERR);
        }
        if !self.nic.check_local(lkey, local_va, u64::from(msg_len)) {
            return done(opcode, status::LOCAL_PROT_ERR);
        }
        let outstanding: u64 =
            self.window.iter().filter(|e| matches!(e.stage, Stage::Pending(_))).map(|e| u64::from(e.len)).sum();
        if outstanding > 0 && outstanding + u64::from(msg_len) > WINDOW_BYTES {
            return None;
        }
        let psn = self.psn.wrapping_add(1);
        let frame = if opcode == OPCODE_RDMA_WRITE {
            // The payload is read from local memory at each send, in place (a retransmission reads it again, as a
            // NIC's DMA does); it must translate now.
            if !device_readable(local_va, msg_len as usize) {
                return done(opcode, status::LOCAL_PROT_ERR);
            }
            Frame::WriteHead { psn, rkey, va: remote_va, len: msg_len }
        } else {
            Frame::Read { psn, rkey, va: remote_va, len: msg_len }
        };
        self.psn = psn;
        let deadline = Instant::now() + qp.config.timeout;
        let request = Request { psn, frame, local_va, retries: 0, deadline };
        Some(Entry { index, opcode, signaled, len: msg_len, stage: Stage::Pending(request), taken })
    }

    /// Sends the request of the window's entry `pos`. Without a link it takes the one `connect_qp` made, or
    /// reconnects when this request is the oldest outstanding (a later one is counted lost and goes again with
    /// the oldest). With the link down, or on a failed send, the request is lost: its timer retransmits it.
    fn transmit(&mut self, pos: usize) {
        if self.nic.link_down.load(Ordering::Acquire) {
            // The link is down: nothing leaves the NIC.
            return;
        }
        let oldest = self.oldest_pending() == Some(pos);
        let Stage::Pending(request) = &self.window[pos].stage else { return };
        let deadline = request.deadline;
        if self.link.is_none() {
            if let Some(conn) = lock(&self.qp.handoff).take() {
                self.attach(conn);
            } else if oldest {
                let Some((peer, remote_qpn)) = lock(&self.qp.inner).peer else { return };
                let stop = || self.qp.stopping(self.nic);
                match handshake(peer, remote_qpn, self.qp.info.qpn, deadline, &stop) {
                    Ok(conn) => self.attach(conn),
                    Err(_) => return,
                }
            }
        }
        let (Some(link), Stage::Pending(request)) = (self.link.as_mut(), &mut self.window[pos].stage) else { return };
        let limit = request.deadline.saturating_duration_since(Instant::now());
        let sent = match request.frame {
            Frame::WriteHead { len, .. } => {
                let (head, _) = request.frame.parts();
                let (local, total) = (request.local_va, len as usize);
                let mut lend =
                    |offset: usize, send: &mut dyn FnMut(&[std::io::IoSlice<'_>]) -> std::io::Result<usize>| {
                        lend_device(local + offset as u64, total - offset, send)
                    };
                link.conn.send_lent(&head, total, &mut lend, request.deadline)
            }
            _ => link.conn.send(&request.frame, limit),
        };
        if sent.is_err() {
            return self.drop_link();
        }
        // The attempt's timer runs from when the request has left.
        request.deadline = Instant::now() + self.qp.config.timeout;
    }

    /// The oldest request's timer: when it runs out, the connection is given up and every outstanding request is
    /// sent again from the oldest (go back N), each counting a retransmission; the oldest, out of retries,
    /// completes with TRANSPORT_RETRY_EXC_ERR and every later WQE is flushed. `true` if the timer ran out.
    fn check_timer(&mut self) -> bool {
        let Some(pos) = self.oldest_pending() else { return false };
        let Stage::Pending(request) = &self.window[pos].stage else { return false };
        if Instant::now() < request.deadline {
            return false;
        }
        let exhausted = request.retries >= self.qp.config.retry_count;
        self.drop_link();
        if exhausted {
            self.decide(pos, status::TRANSPORT_RETRY_EXC_ERR);
            return true;
        }
        let deadline = Instant::now() + self.qp.config.timeout;
        let mut again = Vec::new();
        for (at, entry) in self.window.iter_mut().enumerate().skip(pos) {
            if let Stage::Pending(request) = &mut entry.stage {
                request.retries += 1;
                request.deadline = deadline;
                self.nic.counters.retries.fetch_add(1, Ordering::Relaxed);
                again.push(at);
            }
        }
        for at in again {
            if self.qp.stopping(self.nic) {
                break;
            }
            self.transmit(at);
        }
        true
    }

    /// Waits for a doorbell, a response, a released CQE or the stop, at most until the oldest request's timer,
    /// the CQ-full wait's end or [`IDLE_TICK`].
    fn wait(&mut self) {
        let now = Instant::now();
        let mut until = now + IDLE_TICK;
        if let Some(pos) = self.oldest_pending() {
            if let Stage::Pending(request) = &self.window[pos].stage {
                until = until.min(request.deadline);
            }
        }
        if let Some(since) = self.full_since {
            until = until.min(since + self.qp.config.cq_full_wait);
        }
        let inner = lock(&self.qp.inner);
        let new_wqes = inner.producer != self.fetched && !self.fill_limited;
        let cq_room =
            self.full_since.is_some() && inner.cq_producer.wrapping_sub(inner.cq_consumer) < self.qp.info.cq_depth;
        if inner.shutdown || !inner.inbox.is_empty() || new_wqes || cq_room || until <= now {
            return;
        }
        let _ = self.qp.wake.wait_timeout(inner, until - now);
    }
}
