//! The completion slot of one task: the only place a transport writes a transfer's outcome.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::completion::CompletionSignal;
use super::failure::TransferFailure;
use super::request::TransferState;
use crate::evidence::TransferEvidence;

/// The outcome of one task, shared between the batch that owns it and the transport that carries it.
///
/// The state moves once from WAITING/PENDING to a terminal state; the first terminal write wins, so a late
/// completion after the watchdog declared TIMEOUT changes nothing. Terminal writes take a small lock so the byte
/// count, failure and evidence are always those of the winning write; readers of the state never take it.
#[derive(Debug)]
pub struct TaskSlot {
    state: AtomicU32,
    transferred: AtomicU64,
    outcome: Mutex<Outcome>,
    deadline: Instant,
    signal: Arc<CompletionSignal>,
    /// Where the carrying transport will report the task's completion, in its own encoding (0: not known). Lets a
    /// waiting thread sleep until exactly its tasks' completions are out (see `CompletionPoller::wait_for`).
    ticket: AtomicU64,
}

#[derive(Debug, Default)]
struct Outcome {
    failure: Option<TransferFailure>,
    evidence: Option<TransferEvidence>,
}

impl TaskSlot {
    /// A slot in state WAITING that the watchdog turns to TIMEOUT at `deadline`; `signal` is notified once, when
    /// the slot reaches a terminal state.
    pub fn new(deadline: Instant, signal: Arc<CompletionSignal>) -> Self {
        TaskSlot {
            state: AtomicU32::new(TransferState::Waiting as u32),
            transferred: AtomicU64::new(0),
            outcome: Mutex::new(Outcome::default()),
            deadline,
            signal,
            ticket: AtomicU64::new(0),
        }
    }

    /// A slot already failed with `failure` (a request the engine rejected before any transport saw it).
    pub fn rejected(failure: TransferFailure, signal: Arc<CompletionSignal>) -> Self {
        let slot = TaskSlot::new(Instant::now(), signal);
        slot.fail(failure);
        slot
    }

    /// The current state; a pending task past its deadline is turned to TIMEOUT here (the Host watchdog).
    pub fn state(&self) -> TransferState {
        self.state_at(Instant::now())
    }

    /// As [`TaskSlot::state`], with the current time read by the caller (once for many slots).
    pub fn state_at(&self, now: Instant) -> TransferState {
        let state = TransferState::from_raw(self.state.load(Ordering::Acquire));
        if !state.is_terminal() && now >= self.deadline {
            self.fail(TransferFailure::watchdog());
            return TransferState::from_raw(self.state.load(Ordering::Acquire));
        }
        state
    }

    /// Bytes moved.
    pub fn transferred_bytes(&self) -> u64 {
        self.transferred.load(Ordering::Acquire)
    }

    /// Why the task failed or timed out, if it did.
    pub fn failure(&self) -> Option<TransferFailure> {
        self.lock_outcome().failure.clone()
    }

    /// The failure rendered as text ([`TransferFailure::report`]), if the task failed or timed out.
    pub fn reason(&self) -> Option<String> {
        self.lock_outcome().failure.as_ref().map(TransferFailure::report)
    }

    /// What the transport recorded about how it carried the task.
    pub fn evidence(&self) -> Option<TransferEvidence> {
        self.lock_outcome().evidence.clone()
    }

    /// When the watchdog gives up on the task.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Adds `cpu_ns` of a thread that waited for the task (its share of the wait) to the task's evidence
    /// ([`TransferEvidence::waiting_cpu_ns`]); nothing if the task has no evidence (it failed before a path took it).
    pub fn charge_waiting(&self, cpu_ns: u64) {
        if let Some(evidence) = self.lock_outcome().evidence.as_mut() {
            evidence.waiting_cpu_ns = evidence.waiting_cpu_ns.saturating_add(cpu_ns);
        }
    }

    /// Records where the carrying transport will report the completion (its own encoding; never 0).
    pub fn set_ticket(&self, ticket: u64) {
        self.ticket.store(ticket, Ordering::Release);
    }

    /// What [`TaskSlot::set_ticket`] recorded, 0 if nothing.
    pub fn ticket(&self) -> u64 {
        self.ticket.load(Ordering::Acquire)
    }

    /// Marks the task handed to a transport (WAITING -> PENDING).
    pub fn mark_pending(&self) {
        let _ = self.state.compare_exchange(
            TransferState::Waiting as u32,
            TransferState::Pending as u32,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Records success. Returns false if the task had already reached a terminal state.
    pub fn complete(&self, bytes: u64, evidence: TransferEvidence) -> bool {
        self.transition(TransferState::Completed, bytes, None, Some(evidence))
    }

    /// Records a failure or timeout (the state comes from the failure). Returns false if the task was already
    /// terminal.
    pub fn fail(&self, failure: TransferFailure) -> bool {
        self.transition(failure.state(), 0, Some(failure), None)
    }

    /// Records a failure or timeout together with what the transport saw on the way.
    pub fn fail_with_evidence(&self, failure: TransferFailure, evidence: TransferEvidence) -> bool {
        self.transition(failure.state(), 0, Some(failure), Some(evidence))
    }

    fn lock_outcome(&self) -> std::sync::MutexGuard<'_, Outcome> {
        self.outcome.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn transition(
        &self,
        to: TransferState,
        bytes: u64,
        failure: Option<TransferFailure>,
        evidence: Option<TransferEvidence>,
    ) -> bool {
        debug_assert!(to.is_terminal());
        let mut outcome = self.lock_outcome();
        if TransferState::from_raw(self.state.load(Ordering::Acquire)).is_terminal() {
            return false;
        }
        outcome.failure = failure;
        outcome.evidence = evidence;
        self.transferred.store(bytes, Ordering::Release);
        // Release: a reader that sees the terminal state also sees the byte count stored above.
        self.state.store(to as u32, Ordering::Release);
        drop(outcome);
        self.signal.notify();
        true
    }
}
