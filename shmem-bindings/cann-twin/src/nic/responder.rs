//! The target side of a twin NIC. A listener thread accepts connections (at most [`MAX_CONNECTIONS`] served at once)
//! and a responder thread per connection serves one initiator QP's requests to the QP its handshake named. Per
//! target QP and initiator QP a [`Responder`] keeps the request sequence: requests execute strictly in PSN order,
//! each at most once, a retransmission is answered again without applying a WRITE again, and everything after a
//! refused request is dropped.
//!
//! A remote access is checked against this NIC's registrations before anything is touched, and a refused request
//! touches nothing. It never takes a WQE or writes a CQE: those are the initiator's engine's (`nic/engine.rs`).

use std::collections::VecDeque;
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::common::{land_device, lock, psn_before, read_device, spawn, Responder, IDLE_TICK};
use super::qp::Qp;
use super::wire::{self, Conn, Frame, MAX_MESSAGE};
use super::{status, Nic, MAX_CONNECTIONS};
use crate::sdma::write_device;

/// How often the listener looks for a connection (it accepts without blocking, to see its shutdown).
const ACCEPT_TICK: Duration = Duration::from_millis(5);

impl Nic {
    pub(super) fn listen(self: &Arc<Self>, listener: TcpListener) {
        let mut accepted = 0u64;
        while !self.shutdown.load(Ordering::Acquire) {
            match listener.accept() {
                Ok((stream, _)) => {
                    let mut responders = lock(&self.responders);
                    let (done, running): (Vec<_>, Vec<_>) = responders.drain(..).partition(|h| h.is_finished());
                    done.into_iter().for_each(|handle| drop(handle.join()));
                    *responders = running;
                    if responders.len() >= MAX_CONNECTIONS {
                        continue;
                    }
                    accepted += 1;
                    let nic = Arc::clone(self);
                    let name = format!("cann-twin-nic-d{}-r{accepted}", self.device);
                    if let Ok(handle) = spawn(name, move || nic.serve(Conn::new(stream))) {
                        responders.push(handle);
                    }
                }
                Err(_) => std::thread::sleep(ACCEPT_TICK),
            }
        }
    }

    /// One accepted connection: the handshake naming the target QP, then requests until the peer closes, a frame
    /// is malformed or the NIC shuts down.
    fn serve(&self, mut conn: Conn) {
        let stop = || self.shutdown.load(Ordering::Acquire);
        let mut target: Option<Arc<Qp>> = None;
        let mut initiator = 0u32;
        // A large WRITE's payload goes from the socket straight into the target's memory (land_write).
        conn.land_writes_in_place();
        loop {
            let frame = match conn.receive(Instant::now() + IDLE_TICK, &stop) {
                Ok(Some(frame)) => frame,
                Ok(None) => continue,
                Err(_) => break,
            };
            if self.link_down.load(Ordering::Acquire) {
                // The link is down: the frame is lost, nothing is applied or answered.
                continue;
            }
            let reply = match (frame, &target) {
                (Frame::Hello { qpn, from }, None) => {
                    target = lock(&self.qps).get(&qpn).cloned();
                    initiator = from;
                    Frame::HelloAck { status: u8::from(target.is_none()) }
                }
                (Frame::Write { psn, rkey, va, bytes }, Some(qp)) => {
                    let mut responders = lock(&qp.responders);
                    let status = match Responder::of(&mut responders, initiator).verdict(psn) {
                        Verdict::Drop => {
                            self.counters.requests_dropped.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Verdict::Again(status) => {
                            self.counters.duplicates_answered.fetch_add(1, Ordering::Relaxed);
                            status
                        }
                        Verdict::Execute => {
                            let status = self.apply_write(rkey, va, &bytes);
                            Responder::of(&mut responders, initiator).executed(psn, status);
                            status
                        }
                    };
                    drop(responders);
                    self.counters.requests_served.fetch_add(1, Ordering::Relaxed);
                    Frame::Ack { psn, status }
                }
                (Frame::WriteHead { psn, rkey, va, len }, Some(qp)) => {
                    let mut responders = lock(&qp.responders);
                    let status = match Responder::of(&mut responders, initiator).verdict(psn) {
                        // Their payloads are discarded by the next receive.
                        Verdict::Drop => {
                            self.counters.requests_dropped.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Verdict::Again(status) => {
                            self.counters.duplicates_answered.fetch_add(1, Ordering::Relaxed);
                            status
                        }
                        Verdict::Execute => {
                            let Ok(status) = self.land_write(&mut conn, rkey, va, len, &stop) else { break };
                            Responder::of(&mut responders, initiator).executed(psn, status);
                            status
                        }
                    };
                    drop(responders);
                    self.counters.requests_served.fetch_add(1, Ordering::Relaxed);
                    Frame::Ack { psn, status }
                }
                (Frame::Read { psn, rkey, va, len }, Some(qp)) => {
                    let mut responders = lock(&qp.responders);
                    let read = match Responder::of(&mut responders, initiator).verdict(psn) {
                        Verdict::Drop => {
                            self.counters.requests_dropped.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        // The READ that was refused, asked again: refused again.
                        Verdict::Again(status) if status != 0 => {
                            self.counters.duplicates_answered.fetch_add(1, Ordering::Relaxed);
                            Err(status)
                        }
                        // A duplicate READ is read again (its response replayed from memory as it is now).
                        Verdict::Again(_) => {
                            self.counters.duplicates_answered.fetch_add(1, Ordering::Relaxed);
                            self.serve_read(rkey, va, len)
                        }
                        Verdict::Execute => {
                            let read = self.serve_read(rkey, va, len);
                            let status = read.as_ref().err().copied().unwrap_or(0);
                            Responder::of(&mut responders, initiator).executed(psn, status);
                            read
                        }
                    };
                    drop(responders);
                    self.counters.requests_served.fetch_add(1, Ordering::Relaxed);
                    match read {
                        Ok(bytes) => Frame::ReadResponse { psn, status: 0, bytes },
                        Err(status) => Frame::ReadResponse { psn, status, bytes: Vec::new() },
                    }
                }
                // Anything else breaks the protocol: the connection is closed.
                _ => break,
            };
            let withheld = !matches!(reply, Frame::HelloAck { .. })
                && self
                    .drop_responses
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| left.checked_sub(1))
                    .is_ok();
            if withheld {
                // Served, but the response is lost on the way back.
                continue;
            }
            let refused = matches!(reply, Frame::HelloAck { status: 1 });
            if conn.send(&reply, Duration::from_secs(1)).is_err() || refused {
                break;
            }
        }
        conn.close();
    }

    fn refuse(&self) -> u8 {
        self.counters.requests_refused.fetch_add(1, Ordering::Relaxed);
        status::REMOTE_ACCESS_ERR as u8
    }

    fn apply_write(&self, rkey: u32, va: u64, bytes: &[u8]) -> u8 {
        if !self.check_remote(rkey, va, bytes.len() as u64, true) {
            return self.refuse();
        }
        match write_device(va, bytes) {
            Ok(()) => {
                self.counters.writes_applied.fetch_add(1, Ordering::Relaxed);
                status::SUCCESS as u8
            }
            Err(_) => self.refuse(),
        }
    }

    /// [`Self::apply_write`] for a large WRITE whose payload still waits in `conn`: checked first, then read from
    /// the socket into the target's memory in place (refused: read and discarded, nothing touched). `Err`: the
    /// payload did not arrive within [`wire::PAYLOAD_WAIT`] (the connection is given up, the WRITE not executed).
    fn land_write(&self, conn: &mut Conn, rkey: u32, va: u64, len: u32, stop: &dyn Fn() -> bool) -> Result<u8, ()> {
        let deadline = Instant::now() + wire::PAYLOAD_WAIT;
        if !self.check_remote(rkey, va, u64::from(len), true) {
            conn.receive_payload(None, deadline, stop).map_err(drop)?;
            return Ok(self.refuse());
        }
        let total = len as usize;
        let mut land = |offset: usize, fill: &mut dyn FnMut(&mut [u8]) -> std::io::Result<usize>| {
            land_device(va + offset as u64, total - offset, fill)
        };
        if conn.receive_payload(Some(&mut land), deadline, stop).map_err(drop)? {
            self.counters.writes_applied.fetch_add(1, Ordering::Relaxed);
            Ok(status::SUCCESS as u8)
        } else {
            Ok(self.refuse())
        }
    }

    fn serve_read(&self, rkey: u32, va: u64, len: u32) -> Result<Vec<u8>, u8> {
        if len > MAX_MESSAGE || !self.check_remote(rkey, va, u64::from(len), false) {
            return Err(self.refuse());
        }
        read_device(va, len as usize).map_err(|_| self.refuse())
    }
}

/// Initiator QPs a target QP keeps the request sequence of (RC connects one; more are served, the oldest
/// forgotten first).
const RESPONDERS: usize = 8;

/// What a target does with a request.
enum Verdict {
    /// The next in order: execute it.
    Execute,
    /// Executed before (a retransmission): answer with this status without executing a WRITE again.
    Again(u8),
    /// Past a gap (an earlier request was lost: the initiator goes back N) or after the refused request: neither
    /// executed nor answered.
    Drop,
}

impl Responder {
    /// The record of `initiator` in `all`, made if absent.
    fn of(all: &mut VecDeque<Responder>, initiator: u32) -> &mut Responder {
        let at = match all.iter().position(|r| r.initiator == initiator) {
            Some(at) => at,
            None => {
                if all.len() >= RESPONDERS {
                    all.pop_front();
                }
                all.push_back(Responder { initiator, next: 1, refused: None });
                all.len() - 1
            }
        };
        &mut all[at]
    }

    fn verdict(&self, psn: u32) -> Verdict {
        match self.refused {
            Some((refused, status)) if psn == refused => Verdict::Again(status),
            Some((refused, _)) if psn_before(psn, refused) => Verdict::Again(0),
            Some(_) => Verdict::Drop,
            None if psn == self.next => Verdict::Execute,
            None if psn_before(psn, self.next) => Verdict::Again(0),
            None => Verdict::Drop,
        }
    }

    fn executed(&mut self, psn: u32, status: u8) {
        self.next = psn.wrapping_add(1);
        if status != 0 {
            self.refused = Some((psn, status));
        }
    }
}
