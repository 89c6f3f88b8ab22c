//! Completion: draining a block's device completion queue, mapping each entry to its task's outcome, recovering a
//! block after a failed group, and the waiting thread's side of it ([`CompletionPoller`]).
//!
//! Owns: the drain thread's loop, the drain pass, outcome mapping and channel recovery. It must not place new
//! requests on a ring other than through `HostBlock::post_backlog`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::block::{DrainScratch, HostBlock};
use super::inflight::{InFlight, PostedOn};
use super::observe::{add_host_acts, HostMark};
use super::submit::decode_ticket;
use super::Inner;
use crate::config::LaunchMode;
use crate::cpu_time::{thread_cpu_time_ns, Section};
use crate::evidence::{Act, Source, TransferEvidence};
use crate::kernel_abi::{DcqEntry, DcqStatus, Syndrome, UndecodableCompletion};
use crate::transfer::{
    poll_until_charged, poll_until_paced_expecting, CodeFamily, CompletionPoller, FailureKind, TransferFailure,
};

/// How long the drain thread leaves completions to waiting threads after the last one stopped waiting; it checks the
/// DCQs every such interval meanwhile (a safety net for transfers nobody waits for).
const DRAIN_BACKOFF: Duration = Duration::from_millis(2);

/// The longest nap of the drain thread while threads keep waiting: its naps double from [`DRAIN_BACKOFF`] up to this
/// while every look finds waiters and nothing to drain (each wake-up is Host CPU charged to aiv). Completions of
/// transfers that nobody waits for or polls are collected at most this long after the last waiter left.
const DRAIN_BACKOFF_MAX: Duration = Duration::from_millis(16);

/// The longest nap of the drain thread while nobody waits: completions of transfers nobody waits for are collected
/// within this of their publish, or at the next status query.
const DRAIN_IDLE_MAX: Duration = Duration::from_millis(4);

/// What each transfer of a drain pass is charged for the Host work nobody's transfer did alone.
#[derive(Clone, Copy, Debug)]
struct Shares {
    /// Host CPU of collection that drained nothing yet, per transfer.
    cpu_ns: u64,
    /// Device-runtime calls, per transfer (rounded up).
    calls: u64,
    /// Kernel launches, per transfer.
    launches: f64,
}

impl Inner {
    pub(super) fn drain_loop(self: std::sync::Arc<Self>) {
        // Every CPU nanosecond of this thread (wake-ups and idle checks included) is charged to the transfers drained
        // next, as the baselines charge their Host threads.
        let mut cpu_mark = thread_cpu_time_ns();
        let mut backoff = DRAIN_BACKOFF;
        while !self.stop.load(Ordering::Acquire) {
            // Everything this thread spent since the last pass (its wake-up included) goes to the pool first.
            let now = thread_cpu_time_ns();
            self.unattributed_cpu.add(now.saturating_sub(cpu_mark));
            cpu_mark = now;
            let mut progressed = false;
            for block in &self.blocks {
                let Some(mut scratch) = block.try_drain_lock() else { continue };
                progressed |= self.drain_block(block, &mut scratch);
            }
            if progressed {
                backoff = DRAIN_BACKOFF;
                continue;
            }
            // While tracing, the trace rings are emptied here (off the waiters' path) so that they do not fill.
            if self.active_tracer().is_some() {
                self.drain_traces();
            }
            // A waiting thread collects its own completions, and a status query collects what is ready; this thread
            // is the safety net for transfers nobody waits for. Nothing wakes it (nothing on an NPU could): it looks
            // again after a nap that doubles while there is nothing to drain.
            self.nap(backoff);
            backoff = (backoff * 2).min(if self.waiters_present() { DRAIN_BACKOFF_MAX } else { DRAIN_IDLE_MAX });
        }
    }

    /// Whether a thread waits through the poller now or did within the last [`DRAIN_BACKOFF`].
    fn waiters_present(&self) -> bool {
        if self.attached_waiters.load(Ordering::Acquire) > 0 {
            return true;
        }
        let last = *self.last_detach.lock().unwrap_or_else(|p| p.into_inner());
        last.is_some_and(|at| at.elapsed() < DRAIN_BACKOFF)
    }

    /// Whether any block's DCQ holds entries not yet drained (a few atomic loads).
    pub(super) fn completions_ready(&self) -> bool {
        self.blocks.iter().any(|block| block.completion_ring.is_ready())
    }

    /// Drains what is ready on the calling thread (a waiter or a status query). The pass's CPU time goes to the pool,
    /// charged to the transfers drained next. Returns whether another thread was draining a block meanwhile (it may
    /// be finishing the caller's slots right now, without waking the caller).
    pub(super) fn poll_inline(&self) -> bool {
        self.poll_inline_timed().0
    }

    /// [`Inner::poll_inline`], also returning the section time it put into the pool (ns): a wait that drains as it
    /// looks leaves that time out of its own charge, so that it is not counted twice.
    fn poll_inline_timed(&self) -> (bool, u64) {
        let ready = self.completions_ready();
        // A section that never sleeps (see cpu_time::Section): try-locks and DCQ reads only.
        let section = ready.then(Section::start);
        let mut contended = false;
        for block in &self.blocks {
            match block.try_drain_lock() {
                Some(mut scratch) => {
                    if ready {
                        self.drain_block(block, &mut scratch);
                    }
                }
                None => contended = true,
            }
        }
        let pooled = section.map_or(0, |section| section.elapsed_ns());
        self.unattributed_cpu.add(pooled);
        (contended, pooled)
    }

    /// Drains one block's DCQ (the caller holds its drain lock); returns whether anything was drained. The drained
    /// transfers share the pool of Host time not charged yet (submits, earlier drain passes, drain-thread wake-ups).
    pub(super) fn drain_block(&self, block: &HostBlock, scratch: &mut DrainScratch) -> bool {
        let DrainScratch { entries, finished, records, acts, walked } = scratch;
        // Device-runtime calls this pass makes (an exception query, a reset, a relaunch), counted by the tables.
        let calls = ascendcl_sys::calls::thread_total();
        entries.clear();
        finished.clear();
        let tracer = self.active_tracer();
        let pass_start = if tracer.is_some() { crate::trace::now_ns() } else { 0 };
        let new_head = {
            let mut completions = block.completion_ring.consume();
            if completions.remaining() == 0 {
                return false;
            }
            // Read just after the tail's acquire load: the kernel published these entries before this moment.
            let seen_at = if tracer.is_some() { crate::trace::now_ns() } else { 0 };
            if let Some(tail) = completions.corrupt_tail() {
                block.corrupt_tails.fetch_add(1, Ordering::Relaxed);
                tracing::error!(block = block.index, head = completions.head(), tail, "DCQ tail past the ring's depth");
            }
            entries.extend(completions.by_ref());
            if let Some(tracer) = tracer {
                let ids = entries.iter().map(|(_, entry)| match entry {
                    Ok(entry) | Err(UndecodableCompletion { entry }) => entry.transfer_id.get(),
                });
                tracer.completions_seen(self.trace_device(), ids, seen_at);
            }
            completions.head().wrapping_add(entries.len() as u32)
            // Dropping `completions` publishes the new head: the kernel may reuse the slots.
        };
        block.drained.store(new_head, Ordering::Release);
        // The completions were seen now: every Host act since a transfer's submit counts against it.
        let drain_mark = if self.host_marks { HostMark::now() } else { HostMark::default() };
        let count = entries.len() as u32;
        // Per block (its drainer holds the drain lock): no counter shared by every draining thread.
        block.completions.fetch_add(u64::from(count), Ordering::Relaxed);

        let group_failed = entries.iter().any(|(_, entry)| {
            entry
                .as_ref()
                .is_ok_and(|entry| matches!(DcqStatus(entry.status.get()), DcqStatus::TIMEOUT | DcqStatus::ABORTED))
        });
        // Read the exception before deciding FAILED vs TIMEOUT, and before the reset clears it.
        let exception = if group_failed {
            ascendcl_sys::calls::own_work(|| self.device.channel_exception(block.index))
        } else {
            None
        };
        {
            let mut inflight = block.inflight_map();
            for (i, (position, entry)) in entries.iter().enumerate() {
                let transfer_id = match entry {
                    Ok(entry) | Err(UndecodableCompletion { entry }) => entry.transfer_id.get(),
                };
                match inflight.take(block.request_ring.index().slot(*position) as usize, transfer_id) {
                    Some(transfer) => finished.push((i, transfer)),
                    None => {
                        block.unmatched.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(block = block.index, transfer_id, "DCQ entry names no transfer in flight");
                    }
                }
            }
        }
        // The acts of each transfer, from the runtime's SQE log (before a recovery, which starts the log walk again).
        // RDMA transfers took no SQE of the channel: they are left out of the walk (their acts come from their QP's
        // WQE log, `attribute_rdma`, below).
        walked.clear();
        walked.extend(finished.iter().filter(|(_, transfer)| transfer.rdma.is_none()).map(
            |&(i, _)| match &entries[i].1 {
                Ok(entry) | Err(UndecodableCompletion { entry }) => *entry,
            },
        ));
        records.attribute(self.observation.as_deref(), block.index, walked, acts);
        // Recover first, so that a caller who sees the failure can submit again at once.
        if group_failed {
            self.recover(block, records);
        }
        let drain_share = self.unattributed_cpu.take() / u64::from(count.max(1));
        // A call made for k transfers counts 1/k, rounded up per transfer.
        self.unattributed_calls.add(ascendcl_sys::calls::thread_total().saturating_sub(calls));
        let calls_share = self.unattributed_calls.take().div_ceil(u64::from(count.max(1)));
        let launches_share = self.uncharged_launches.take() as f64 / f64::from(count.max(1));
        let calls = ascendcl_sys::calls::thread_total();
        let mut sdma_acts = acts.iter();
        for (i, transfer) in finished.drain(..) {
            let entry = match &entries[i].1 {
                Ok(entry) => entry,
                Err(undecodable) => {
                    // Counted here and failed by `finish` as a value the device should never write.
                    block.undecodable.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(block = block.index, %undecodable, "undecodable DCQ entry");
                    &undecodable.entry
                }
            };
            let mut observed = match transfer.rdma {
                Some(posted) => records.attribute_rdma(self.observation.as_deref(), block.index, posted, entry),
                None => sdma_acts.next().copied().unwrap_or([Act::unknown(Source::Lost); 3]),
            };
            add_host_acts(&mut observed, transfer.host_mark, drain_mark);
            let shares = Shares { cpu_ns: drain_share, calls: calls_share, launches: launches_share };
            self.finish(block, entry, transfer, shares, observed, exception.as_ref());
        }
        let producer = block.producer.lock().unwrap_or_else(|p| p.into_inner());
        // The kernel may be waiting for the requests this publishes. (It never waits for DCQ space: the Host keeps at
        // most ring-depth requests in flight, so undrained entries always fit the DCQ.)
        let pumped = block.post_backlog(producer, self.active_tracer().map(|tracer| (tracer, self.trace_device())));
        if pumped > 0 && self.launch_mode == LaunchMode::PerBatch {
            // A runtime launch call may block (see cpu_time::may_sleep).
            if let Err(error) = crate::cpu_time::may_sleep(|| self.launch()) {
                tracing::error!(%error, "relaunch for backlog failed");
            }
        }
        // For the transfers drained next: this relaunch is theirs.
        self.unattributed_calls.add(ascendcl_sys::calls::thread_total().saturating_sub(calls));
        if let Some(tracer) = tracer {
            tracer.host("aiv", crate::trace::HostStage::Drain, pass_start, crate::trace::now_ns(), 0, u64::from(count));
        }
        true
    }

    fn finish(
        &self,
        block: &HostBlock,
        entry: &DcqEntry,
        transfer: InFlight,
        shares: Shares,
        observed: [Act; 3],
        exception: Option<&crate::device::ChannelException>,
    ) {
        let [descriptors_written, doorbells_rung, completion_seen] = observed;
        let mut evidence = TransferEvidence::new("aiv", self.device.runtime_label());
        evidence.descriptors_written = descriptors_written;
        evidence.doorbells_rung = doorbells_rung;
        evidence.completion_seen = completion_seen;
        evidence.host_device_api_calls = shares.calls;
        evidence.host_launches = shares.launches;
        evidence.descriptors = u64::from(entry.sqes.get());
        evidence.doorbells = u64::from(entry.doorbells.get());
        evidence.host_cpu_ns = shares.cpu_ns;
        evidence.route = Some(if transfer.rdma.is_some() { "rdma" } else { "sdma" });
        let syndrome = Syndrome(entry.syndrome.get());
        let status = DcqStatus(entry.status.get());
        let channel = block.index;
        // The RDMA route: the QP the request went on, told of the outcome (a QP error has it replaced).
        let rdma = transfer.rdma.map(|PostedOn { slot, qpn }| {
            let qp_failed = (syndrome == Syndrome::RDMA_QP_ERROR
                || syndrome.rdma_cqe().is_some()
                || matches!(status, DcqStatus::TIMEOUT | DcqStatus::ABORTED))
            .then(|| syndrome.describe());
            // Named for a failure's message only (before `drained` may mark the slot broken); a completed transfer
            // formats nothing.
            let described =
                (status != DcqStatus::COMPLETED).then(|| self.rdma.describe_qp(channel as usize, slot, qpn));
            self.rdma.drained(channel as usize, slot, qpn, qp_failed.as_deref());
            described
        });
        if let Some(qp) = rdma.flatten() {
            let peer = transfer.peer.map(|id| self.windows.peer_name(id)).unwrap_or_default();
            let (kind, what) = match syndrome.rdma_cqe() {
                Some((cqe, _)) if cqe == crate::kernel_abi::roce::CqeStatus::TRANSPORT_RETRY_EXC_ERR => {
                    (FailureKind::Network, syndrome.describe())
                }
                Some((cqe, _)) if cqe == crate::kernel_abi::roce::CqeStatus::REMOTE_ACCESS_ERR => {
                    (FailureKind::Remote, syndrome.describe())
                }
                Some(_) => (FailureKind::Device, syndrome.describe()),
                None if status == DcqStatus::TIMEOUT => (FailureKind::Timeout, syndrome.describe()),
                None if status == DcqStatus::ABORTED => (FailureKind::Aborted, syndrome.describe()),
                None => (FailureKind::Kernel, syndrome.describe()),
            };
            let failure = TransferFailure::new(
                "aiv",
                kind,
                format!("RDMA route to segment {peer:?}, {qp}: {} ({what})", status.name()),
            )
            .with_code(CodeFamily::DcqStatus, i64::from(status.0), status.name());
            transfer.slot.fail_with_evidence(failure, evidence);
            return;
        }
        let failure = |kind: FailureKind, message: String| {
            TransferFailure::new("aiv", kind, message).with_code(
                CodeFamily::DcqStatus,
                i64::from(status.0),
                status.name(),
            )
        };
        let failure = match status {
            DcqStatus::COMPLETED if entry.bytes.get() == transfer.length => {
                transfer.slot.complete(transfer.length, evidence);
                return;
            }
            DcqStatus::COMPLETED => failure(
                FailureKind::Kernel,
                format!("kernel reported {} of {} bytes", entry.bytes.get(), transfer.length),
            ),
            DcqStatus::FAILED => failure(
                FailureKind::InvalidRequest,
                format!("kernel rejected the request on block {channel}: {}", syndrome.describe()),
            ),
            DcqStatus::TIMEOUT | DcqStatus::ABORTED => match exception {
                Some(exception) => failure(FailureKind::Device, exception.to_string()),
                None if status == DcqStatus::TIMEOUT => failure(
                    FailureKind::Timeout,
                    format!("block {channel}: {} (no SDMA exception recorded on the channel)", syndrome.describe()),
                ),
                None => failure(FailureKind::Aborted, format!("block {channel}: aborted: {}", syndrome.describe())),
            },
            other => failure(FailureKind::Kernel, format!("block {channel}: device wrote {}", other.name())),
        };
        transfer.slot.fail_with_evidence(failure, evidence);
    }

    /// After a failed group: reset the channel and let the halted block resume.
    fn recover(&self, block: &HostBlock, records: &mut super::observe::BlockRecords) {
        let control = block.control();
        // The kernel incremented halt_count before publishing the failed entries we drained; if the Host already
        // resumed that halt (entries of one failure seen in two drain passes), the block may be posting again: a
        // second reset now would drop its new SQEs.
        let halted = control.halt_count.load(Ordering::Acquire);
        if halted == control.resume_count.load(Ordering::Acquire) {
            return;
        }
        if let Err(error) = ascendcl_sys::calls::own_work(|| self.device.reset_channel(block.index)) {
            tracing::error!(block = block.index, %error, "channel reset failed; the block stays halted");
            return;
        }
        self.channel_resets.fetch_add(1, Ordering::Relaxed);
        // The reset dropped the failed group's unexecuted SQEs: the log walk starts again at the log's end, before
        // the block resumes and posts more.
        records.start_at(self.observation.as_deref(), block.index);
        // Release: the reset above happens before the kernel sees the resume.
        control.resume_count.store(halted, Ordering::Release);
        if self.launch_mode == LaunchMode::PerBatch {
            let pending = block.request_ring.published_tail() != block.request_ring.consumer_head();
            if pending {
                if let Err(error) = self.launch() {
                    tracing::error!(%error, "relaunch after recovery failed");
                }
            }
        }
    }
}

impl CompletionPoller for Inner {
    fn poll(&self) -> bool {
        self.poll_inline()
    }

    fn wait(&self, timeout: Duration) -> u64 {
        let finished = self.host_finished.load(Ordering::Acquire);
        let ready = || self.completions_ready() || self.host_finished.load(Ordering::Acquire) != finished;
        // The waiting thread's polling and wake-ups: the batch charges them to the transfers it waited for.
        poll_until_charged(ready, timeout).1
    }

    fn wait_for(&self, tickets: &[u64], timeout: Duration) -> u64 {
        // Per block, the DCQ tail that covers the last of the tasks there (the kernel completes a block's requests
        // in ring order, so DCQ position p is request position p).
        let mut needs: Vec<(u32, u32)> = Vec::with_capacity(self.blocks.len());
        for &ticket in tickets {
            let Some((block, position)) = decode_ticket(ticket) else {
                return self.wait(timeout);
            };
            let tail = position.wrapping_add(1);
            match needs.iter_mut().find(|(known, _)| *known == block) {
                Some((_, need)) if tail.wrapping_sub(*need) as i32 > 0 => *need = tail,
                Some(_) => {}
                None => needs.push((block, tail)),
            }
        }
        let finished = self.host_finished.load(Ordering::Acquire);
        // The DCQ tails live in Host-registered memory: reading them is what the Host can do on an NPU too.
        // The entries still missing in one block: 0 once its DCQ tail reached what the tickets need.
        let missing = |&(block, need): &(u32, u32)| {
            self.blocks.get(block as usize).map_or(0, |b| {
                let short = need.wrapping_sub(b.completion_ring.published_tail()) as i32;
                u64::from(short.max(0) as u32)
            })
        };
        // The bytes this wait covers, and how long similar waits say it takes.
        let bytes: u64 = needs
            .iter()
            .filter_map(|&(block, _)| self.blocks.get(block as usize).map(|b| (block, b)))
            .map(|(block, b)| {
                let map = b.inflight_map();
                tickets
                    .iter()
                    .filter_map(|&ticket| decode_ticket(ticket))
                    .filter(|&(of, _)| of == block)
                    .filter_map(|(_, position)| map.length_at(b.request_ring.index().slot(position) as usize))
                    .sum::<u64>()
            })
            .sum();
        let expected = self.wait_pace.expected(bytes);
        let started = Instant::now();
        let drained_ns = std::cell::Cell::new(0u64);
        // The last look that still found entries missing: the wait ended between it and the look that found none.
        let last_short = std::cell::Cell::new(started);
        let left = || {
            if self.host_finished.load(Ordering::Acquire) != finished {
                return 0;
            }
            // What is ready is collected now, while the rest is in flight: the end of the wait then collects only
            // the last completions. That time goes to the pool (charged to the transfers drained), not to the wait.
            if self.completions_ready() {
                drained_ns.set(drained_ns.get() + self.poll_inline_timed().1);
            }
            let short: u64 = needs.iter().map(missing).sum();
            if short > 0 {
                last_short.set(Instant::now());
            }
            short
        };
        let (done, cpu) = poll_until_paced_expecting(left, timeout, expected);
        if done && self.host_finished.load(Ordering::Acquire) == finished {
            // The midpoint of the last nap, not its end: what the wait learns is when the batch ended, without the
            // time the waiter took to see it (else that latency would come back as a later expected end).
            let ended = last_short.get().duration_since(started);
            self.wait_pace.learn(bytes, ended + (started.elapsed().saturating_sub(ended)) / 2);
        }
        cpu.saturating_sub(drained_ns.get())
    }

    fn attach(&self) {
        self.attached_waiters.fetch_add(1, Ordering::AcqRel);
    }

    fn detach(&self) {
        if self.attached_waiters.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.last_detach.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
    }
}
