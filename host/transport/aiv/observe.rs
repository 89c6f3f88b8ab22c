//! The acts of the aiv path as observed, per transfer: who wrote the SQEs the block's SDMA channel executed for it,
//! who rang the doorbells that exposed them, who first read the completion flag that covered it (docs/evidence.md,
//! "The aiv path").
//!
//! On the twin runtime the device model logs every SQE its engine executes, in order, with those facts
//! ([`cann_twin::control::sqe_log`]). A block's kernel posts, per group of requests, each transfer's data SQEs in
//! request order and then one flag SQE, and publishes the group's DCQ entries once the flag has landed; each entry
//! says how many SQEs its transfer took (its data SQEs plus its share of the flag). So a drain pass walks the log
//! from where the block's previous pass stopped: each drained transfer takes its data SQEs, and the flag SQE that
//! follows a group's last transfer closes the group. A group whose flag nobody read (a later landing replaced it
//! before any read) was seen through the next flag that was read. Where the walk cannot follow (a failed group and
//! its channel reset, entries the log no longer keeps) the transfers' acts are `lost` and the walk starts again at
//! the log's end. On the vendor's runtime there is no such log: the device-side acts are the kernel's own tallies in
//! each DCQ entry (`self_reported`), and the Host-side acts are the classified loader-table calls any thread made
//! while the transfer was in flight ([`HostMark`]: a mark at submit, another at drain).
//!
//! A transfer on the RDMA route takes no SQE: its acts come from the twin NIC's log of the transfer's QP
//! ([`cann_twin::nic::qp_log`]), one entry per WQE in WQE order (the kernel posts a QP's WQEs in request order, and
//! a block's DCQ entries come in request order): the transfer's WQEs are the next `sqes` entries, and its completion
//! was seen by whoever first read the CQE of its last WQE (the only one it signals for sure). A failed RDMA transfer
//! puts its QP in error (the Host replaces it): its acts are `lost` and the QP's walk skips what its log holds.
//!
//! Owns: the block's log positions (its channel's, its QPs') and the walks' buffers; it must not touch the rings.

use std::collections::HashMap;

use ascendcl_sys::calls::{act, HostActs};
use cann_twin::control::{Doer, FlagReader, LoggedSqe, Ringers};

use super::inflight::PostedOn;
use crate::device::{ChannelLog, Observation};
use crate::evidence::{Act, Source};
use crate::kernel_abi::{DcqEntry, DcqStatus};

/// A block's place in its channel's consumption log, and the buffers of a walk.
#[derive(Debug, Default)]
pub(super) struct BlockRecords {
    /// The log position of the next SQE no transfer has taken yet (`None`: no log on this runtime, or not known).
    cursor: Option<u64>,
    log: Vec<LoggedSqe>,
    /// The transfers of the group being walked (indices into the acts), waiting for the group's flag.
    group: Vec<usize>,
    /// Per QP slot of the block: the number of the QP the slot's last RDMA transfer went on, and the position in
    /// that QP's log of the next WQE no transfer took yet. One entry per slot: a replaced QP's entry is replaced with
    /// it (the new QP's log starts at 0), so the map stays as small as the block's slots and a reused QP number
    /// starts afresh.
    qp_cursors: HashMap<u32, (u32, u64)>,
}

impl BlockRecords {
    /// Starts the walk at the channel's log position now: before the block posts anything, and again after the
    /// channel was reset (its unexecuted SQEs dropped), before the block resumes.
    pub(super) fn start_at(&mut self, device: Option<&dyn Observation>, channel: u32) {
        self.cursor = device.and_then(|device| device.channel_log_position(channel));
    }

    /// The acts of each transfer a drain pass completes, in DCQ order (`entries`), into `acts`.
    pub(super) fn attribute(
        &mut self,
        device: Option<&dyn Observation>,
        block: u32,
        entries: &[DcqEntry],
        acts: &mut Vec<[Act; 3]>,
    ) {
        acts.clear();
        let Some(cursor) = self.cursor else {
            acts.extend(entries.iter().map(|entry| self_reported(block, entry)));
            return;
        };
        self.log.clear();
        let read = device.map(|device| device.read_channel_log(block, cursor, &mut self.log));
        let (first, end) = match read.unwrap_or(ChannelLog::NotObservable) {
            ChannelLog::NotRecorded => {
                acts.extend(entries.iter().map(|_| [Act::unknown(Source::NotRecorded); 3]));
                return;
            }
            ChannelLog::NotObservable => {
                acts.extend(entries.iter().map(|entry| self_reported(block, entry)));
                return;
            }
            ChannelLog::Read { first, end } => (first, end),
        };
        acts.extend(entries.iter().map(|_| [Act::unknown(Source::Lost); 3]));
        if first != cursor {
            // Entries the walk needed were overwritten: these transfers' acts are lost.
            tracing::warn!(block, cursor, first, "the SQE log no longer holds a drain pass's SQEs");
            self.cursor = Some(end);
            return;
        }
        let taken = self.walk(entries, acts);
        self.cursor = Some(match taken {
            Some(taken) => first + taken as u64,
            None => end,
        });
    }

    /// Walks the log for `entries`, filling `acts`; returns the log entries taken, or `None` if the walk lost its
    /// way (the rest of `acts` stays lost, and the next pass starts at the log's end).
    fn walk(&mut self, entries: &[DcqEntry], acts: &mut [[Act; 3]]) -> Option<usize> {
        let mut at = 0usize;
        self.group.clear();
        for (k, entry) in entries.iter().enumerate() {
            let status = DcqStatus(entry.status.get());
            let sqes = entry.sqes.get() as usize;
            if sqes == 0 && status == DcqStatus::FAILED {
                // Refused before posting (a bad request): no descriptor, no doorbell, no flag.
                acts[k] = [observed(&[], |_| Doer::Unattributed), observed(&[], |_| Doer::Unattributed), none()];
                continue;
            }
            if status != DcqStatus::COMPLETED || sqes == 0 {
                // A failed group: its SQEs were dropped by the channel's reset; the log cannot be followed past it.
                return None;
            }
            let data = sqes - 1;
            let mine = self.log.get(at..at + data)?;
            if mine.iter().any(|sqe| sqe.flag.is_some()) {
                return None;
            }
            at += data;
            let closes = self.log.get(at).is_some_and(|sqe| sqe.flag.is_some());
            let taken = if closes { &self.log[at - data..=at] } else { mine };
            acts[k][0] = observed(taken, |sqe| sqe.writer);
            acts[k][1] = doorbells(taken);
            self.group.push(k);
            if closes {
                let reader = self.flag_reader(at);
                for &member in &self.group {
                    acts[member][2] = reader;
                }
                self.group.clear();
                at += 1;
            }
        }
        // A group's entries are published together, after its flag: one still open means the walk lost its way.
        self.group.is_empty().then_some(at)
    }

    /// Who saw the completion of the group whose flag SQE is log entry `at`: its flag's first reader, or, if nobody
    /// read it (a later flag replaced it first), the first later flag that was read (the engine lands a channel's
    /// flags in order, so that read covered this group).
    fn flag_reader(&self, at: usize) -> Act {
        let reader = self.log[at..].iter().filter_map(|sqe| sqe.flag).find(|reader| *reader != FlagReader::Unread);
        let mut act = none();
        match reader {
            Some(FlagReader::Core) => act.by_aiv = 1,
            Some(FlagReader::AiCpu) => act.by_aicpu = 1,
            Some(FlagReader::Host) => act.by_host = 1,
            _ => act.unattributed = 1,
        }
        act
    }
}

/// An act counted from the twin's log: nothing yet.
fn none() -> Act {
    Act::unknown(Source::TwinModel)
}

/// The act of `sqes` by the doer `who` names for each.
fn observed(sqes: &[LoggedSqe], who: impl Fn(&LoggedSqe) -> Doer) -> Act {
    let mut act = none();
    for sqe in sqes {
        add(&mut act, who(sqe));
    }
    act
}

/// The doorbells that exposed `sqes` (one per distinct doorbell count), each counted once for every doer that rang
/// it (a doorbell the Host and a core both rang before the engine took it: 1 by the Host, 1 by AIV).
fn doorbells(sqes: &[LoggedSqe]) -> Act {
    let mut act = none();
    // The doorbell being walked and the union of its entries' ringers (an engine that resumed the same tail may log
    // a later ring's set beside the first one's).
    let mut current: Option<(u64, Ringers)> = None;
    for sqe in sqes {
        current = match current {
            Some((doorbell, ringers)) if doorbell == sqe.doorbell => Some((doorbell, ringers.union(sqe.ringers))),
            done => {
                if let Some((_, ringers)) = done {
                    ringers.iter().for_each(|ringer| add(&mut act, ringer));
                }
                Some((sqe.doorbell, sqe.ringers))
            }
        };
    }
    if let Some((_, ringers)) = current {
        ringers.iter().for_each(|ringer| add(&mut act, ringer));
    }
    act
}

fn add(act: &mut Act, doer: Doer) {
    match doer {
        Doer::Block(block) => {
            act.by_aiv += 1;
            act.aiv_blocks = Some(match act.aiv_blocks {
                None => [block, block],
                Some([low, high]) => [low.min(block), high.max(block)],
            });
        }
        Doer::AiCpu => act.by_aicpu += 1,
        Doer::Host => act.by_host += 1,
        Doer::Unattributed => act.unattributed += 1,
    }
}

impl BlockRecords {
    /// The acts of one RDMA transfer of this block, drained in DCQ order: from the log of the QP it was posted on
    /// (`posted`: the QP its slot held when the transfer was submitted, recorded with the transfer, so the walk never
    /// depends on the slot's state at drain time).
    pub(super) fn attribute_rdma(
        &mut self,
        device: Option<&dyn Observation>,
        block: u32,
        posted: PostedOn,
        entry: &DcqEntry,
    ) -> [Act; 3] {
        let PostedOn { slot, qpn } = posted;
        let status = DcqStatus(entry.status.get());
        let wqes = entry.sqes.get() as usize;
        if wqes == 0 && status == DcqStatus::FAILED {
            // Refused before posting (no QP, a QP in error): no WQE, no doorbell, no CQE.
            return [observed(&[], |_| Doer::Unattributed), observed(&[], |_| Doer::Unattributed), none()];
        }
        // A QP's log starts at 0 when the NIC creates it, before any WQE.
        let cursor = match self.qp_cursors.get(&slot) {
            Some(&(known, cursor)) if known == qpn => cursor,
            _ => 0,
        };
        self.log.clear();
        let read = device.map(|device| device.read_qp_log(qpn, cursor, &mut self.log));
        let (first, end) = match read.unwrap_or(ChannelLog::NotObservable) {
            ChannelLog::NotRecorded => return [Act::unknown(Source::NotRecorded); 3],
            // The QP's WQEs are the kernel's word alone; the Host counts come at drain.
            ChannelLog::NotObservable => return self_reported(block, entry),
            ChannelLog::Read { first, end } => (first, end),
        };
        if status != DcqStatus::COMPLETED || first != cursor || self.log.len() < wqes {
            // A failed transfer (its QP is replaced; WQEs after its own may still be logged), or entries the walk
            // needed are gone: lost, and the walk goes on from the log's end.
            if status == DcqStatus::COMPLETED {
                tracing::warn!(block, qpn, cursor, first, end, wqes, "the QP's log does not hold the transfer's WQEs");
            }
            self.qp_cursors.insert(slot, (qpn, end));
            return [Act::unknown(Source::Lost); 3];
        }
        self.qp_cursors.insert(slot, (qpn, cursor + wqes as u64));
        rdma_acts(&self.log[..wqes])
    }
}

/// The acts of an RDMA transfer whose WQEs the NIC logged as `wqes`: who wrote them, the SQ doorbells that exposed
/// them, and who first read the CQE of the last (a CQE nobody read, or none, is unattributed).
fn rdma_acts(wqes: &[LoggedSqe]) -> [Act; 3] {
    let mut completion = none();
    match wqes.last().and_then(|wqe| wqe.flag) {
        Some(FlagReader::Core) => completion.by_aiv = 1,
        Some(FlagReader::AiCpu) => completion.by_aicpu = 1,
        Some(FlagReader::Host) => completion.by_host = 1,
        Some(FlagReader::Unread) | None => completion.unattributed = 1,
    }
    [observed(wqes, |wqe| wqe.writer), doorbells(wqes), completion]
}

/// The device-side acts of one transfer where no log shows them: the kernel's own tallies in its DCQ entry. The
/// Host-side counts are 0 here and set at drain from the transfer's [`HostMark`]s ([`add_host_acts`]).
fn self_reported(block: u32, entry: &DcqEntry) -> [Act; 3] {
    let tally = |count: u64| Act {
        source: Source::SelfReported,
        by_aiv: count,
        aiv_blocks: (count > 0).then_some([block, block]),
        by_aicpu: 0,
        by_host: 0,
        unattributed: 0,
    };
    // The kernel publishes a COMPLETED entry only after it read the flag that covers the transfer.
    let seen = u64::from(DcqStatus(entry.status.get()) == DcqStatus::COMPLETED);
    [tally(u64::from(entry.sqes.get())), tally(u64::from(entry.doorbells.get())), tally(seen)]
}

/// The classified loader-table calls every thread of the process had made (outside the transports' own work) at
/// one moment, as the three acts count them: calls that could write a descriptor (they write device memory or
/// submit device work), that could ring a doorbell (they submit device work), that could read a completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct HostMark([u64; 3]);

impl HostMark {
    /// The counts now (`ascendcl_sys::calls::HostActs::now`).
    pub(super) fn now() -> HostMark {
        let acts = HostActs::now();
        HostMark([
            acts.with_any(act::WRITES_DEVICE | act::SUBMITS),
            acts.with_any(act::SUBMITS),
            acts.with_any(act::READS_COMPLETION),
        ])
    }
}

/// Sets the Host counts of a transfer's self-reported acts: the calls made between its submit (`submitted`) and its
/// drain (`drained`). Acts of any other source are left as they are (on the twin the device model saw every act).
pub(super) fn add_host_acts(acts: &mut [Act; 3], submitted: HostMark, drained: HostMark) {
    for ((act, then), now) in acts.iter_mut().zip(submitted.0).zip(drained.0) {
        if act.source == Source::SelfReported {
            act.by_host = now.saturating_sub(then);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sqes: u32, status: DcqStatus) -> DcqEntry {
        let mut entry = DcqEntry::default();
        entry.sqes.set(sqes);
        entry.doorbells.set(1);
        entry.status.set(status.0);
        entry
    }

    fn sqe(writer: Doer, ringer: Doer, doorbell: u64, flag: Option<FlagReader>) -> LoggedSqe {
        LoggedSqe::new_for_tests(writer, Ringers::from(ringer), doorbell, flag)
    }

    fn rung_by(writer: Doer, ringers: &[Doer], doorbell: u64, flag: Option<FlagReader>) -> LoggedSqe {
        LoggedSqe::new_for_tests(writer, Ringers::of(ringers), doorbell, flag)
    }

    fn walk(log: Vec<LoggedSqe>, entries: &[DcqEntry]) -> (Vec<[Act; 3]>, Option<usize>) {
        let mut records = BlockRecords { cursor: Some(0), log, group: Vec::new(), qp_cursors: HashMap::new() };
        let mut acts = vec![[Act::unknown(Source::Lost); 3]; entries.len()];
        let taken = records.walk(entries, &mut acts);
        (acts, taken)
    }

    const B0: Doer = Doer::Block(0);

    #[test]
    fn each_transfer_takes_its_data_sqes_and_the_last_of_a_group_its_flag() {
        // A group of two transfers (2 and 1 data SQEs), then its flag, read by a core.
        let log = vec![
            sqe(B0, B0, 1, None),
            sqe(B0, B0, 1, None),
            sqe(Doer::Host, B0, 2, None),
            sqe(B0, B0, 2, Some(FlagReader::Core)),
        ];
        let (acts, taken) = walk(log, &[entry(3, DcqStatus::COMPLETED), entry(2, DcqStatus::COMPLETED)]);
        assert_eq!(taken, Some(4));
        assert_eq!((acts[0][0].by_aiv, acts[0][0].by_host, acts[0][1].by_aiv), (2, 0, 1));
        // The second took a Host-written SQE and the flag SQE: its descriptor check alone fails.
        assert_eq!((acts[1][0].by_aiv, acts[1][0].by_host, acts[1][1].by_aiv), (1, 1, 1));
        assert!(acts.iter().all(|acts| acts[2].by_aiv == 1), "both seen through the flag: {acts:?}");
    }

    #[test]
    fn an_unread_flag_is_seen_through_the_next_flag_read() {
        let log = vec![
            sqe(B0, B0, 1, None),
            sqe(B0, B0, 1, Some(FlagReader::Unread)),
            sqe(B0, B0, 2, None),
            sqe(B0, Doer::Host, 3, Some(FlagReader::Host)),
        ];
        let (acts, taken) = walk(log, &[entry(2, DcqStatus::COMPLETED), entry(2, DcqStatus::COMPLETED)]);
        assert_eq!(taken, Some(4));
        assert_eq!(acts[0][2].by_host, 1, "the next flag read was the Host's: {acts:?}");
        // The second's flag SQE was exposed by a Host ring: 2 doorbells, 1 by the Host.
        assert_eq!((acts[1][1].by_aiv, acts[1][1].by_host), (1, 1));
    }

    #[test]
    fn a_doorbell_rung_by_the_host_and_a_core_counts_each_ringer_once_and_fails_the_doorbell_check() {
        use crate::evidence::{Check, Checks};
        // Two data SQEs and the flag SQE behind one doorbell that the Host and block 0's core both rang.
        let both = [Doer::Host, B0];
        let log = vec![
            rung_by(B0, &both, 4, None),
            rung_by(B0, &both, 4, None),
            rung_by(B0, &both, 4, Some(FlagReader::Core)),
        ];
        let (acts, taken) = walk(log, &[entry(3, DcqStatus::COMPLETED)]);
        assert_eq!(taken, Some(3));
        let rung = acts[0][1];
        assert_eq!((rung.by_aiv, rung.by_host, rung.unattributed, rung.aiv_blocks), (1, 1, 0, Some([0, 0])));
        let checks = Checks::of(&acts[0][0], &rung, &acts[0][2]);
        assert_eq!((checks.kernel_writes_descriptors, checks.kernel_rings_doorbell), (Check::Yes, Check::No));
        // The same doorbell logged with the core's set first and both after (the engine resumed the same tail):
        // the doorbell's ringers are the union, counted once each.
        let log = vec![rung_by(B0, &[B0], 4, None), rung_by(B0, &both, 4, Some(FlagReader::Core))];
        let (acts, _) = walk(log, &[entry(2, DcqStatus::COMPLETED)]);
        assert_eq!((acts[0][1].by_aiv, acts[0][1].by_host), (1, 1));
        // The RDMA route counts a WQE's doorbell the same way.
        let [_, rung, _] = rdma_acts(&[rung_by(B0, &[Doer::Unattributed, B0], 9, Some(FlagReader::Core))]);
        assert_eq!((rung.by_aiv, rung.unattributed), (1, 1));
    }

    #[test]
    fn acts_of_the_ai_cpu_count_as_the_ai_cpus_never_as_a_core_or_the_host() {
        use crate::evidence::{Check, Checks, Submitter};
        let aicpu = Doer::AiCpu;
        // A group the AI CPU wrote, rang and whose flag it read first.
        let log = vec![sqe(aicpu, aicpu, 1, None), sqe(aicpu, aicpu, 1, Some(FlagReader::AiCpu))];
        let (acts, taken) = walk(log, &[entry(2, DcqStatus::COMPLETED)]);
        assert_eq!(taken, Some(2));
        for act in acts[0] {
            assert_eq!((act.by_aicpu, act.by_aiv, act.by_host, act.unattributed), (act.total(), 0, 0, 0), "{act:?}");
        }
        assert_eq!((acts[0][0].by_aicpu, acts[0][1].by_aicpu, acts[0][2].by_aicpu), (2, 1, 1));
        let checks = Checks::of(&acts[0][0], &acts[0][1], &acts[0][2]);
        assert_eq!(checks.aiv_direct(), Check::No);
        assert_eq!(Submitter::of(&acts[0][0], &acts[0][1], &acts[0][2]), Submitter::AiCpuSubmitted);
        // A core's SQEs rung by the AI CPU as well: 1 by AIV and 1 by the AI CPU, the doorbell check fails.
        let log = vec![rung_by(B0, &[B0, aicpu], 2, Some(FlagReader::Core))];
        let (acts, _) = walk(log, &[entry(1, DcqStatus::COMPLETED)]);
        assert_eq!((acts[0][1].by_aiv, acts[0][1].by_aicpu, acts[0][1].by_host), (1, 1, 0));
        assert_eq!(Checks::of(&acts[0][0], &acts[0][1], &acts[0][2]).kernel_rings_doorbell, Check::No);
        // On the RDMA route: a WQE the AI CPU wrote and whose CQE it read.
        let [wqes, _, seen] = rdma_acts(&[sqe(aicpu, B0, 1, Some(FlagReader::AiCpu))]);
        assert_eq!((wqes.by_aicpu, wqes.by_host, seen.by_aicpu, seen.by_aiv), (1, 0, 1, 0));
    }

    #[test]
    fn a_walk_that_cannot_follow_the_log_stops_and_says_so() {
        // Fewer SQEs logged than the entry says.
        let (_, taken) = walk(vec![sqe(B0, B0, 1, None)], &[entry(3, DcqStatus::COMPLETED)]);
        assert_eq!(taken, None);
        // A failed group.
        let (_, taken) = walk(vec![sqe(B0, B0, 1, None)], &[entry(2, DcqStatus::TIMEOUT)]);
        assert_eq!(taken, None);
        // A flag where a data SQE should be.
        let log = vec![sqe(B0, B0, 1, Some(FlagReader::Core)), sqe(B0, B0, 1, None)];
        assert_eq!(walk(log, &[entry(3, DcqStatus::COMPLETED)]).1, None);
        // A bad request took nothing.
        let log = vec![sqe(B0, B0, 1, None), sqe(B0, B0, 1, Some(FlagReader::Core))];
        let (acts, taken) = walk(log, &[entry(0, DcqStatus::FAILED), entry(2, DcqStatus::COMPLETED)]);
        assert_eq!(taken, Some(2));
        assert_eq!((acts[0][0].total(), acts[1][0].by_aiv), (0, 2));
    }

    #[test]
    fn an_rdma_transfer_takes_its_wqes_and_the_reader_of_its_last_cqe_and_a_host_act_fails_its_check() {
        use crate::evidence::{Check, Checks};
        // Three WQEs behind two doorbells, by block 1's core; only the last has a CQE, read by the core.
        let b1 = Doer::Block(1);
        let by_core = [sqe(b1, b1, 4, None), sqe(b1, b1, 4, None), sqe(b1, b1, 5, Some(FlagReader::Core))];
        let [wqes, rung, seen] = rdma_acts(&by_core);
        assert_eq!((wqes.source, wqes.by_aiv, wqes.aiv_blocks, wqes.by_host), (Source::TwinModel, 3, Some([1, 1]), 0));
        assert_eq!((rung.by_aiv, rung.by_host, seen.by_aiv, seen.by_host), (2, 0, 1, 0));
        assert_eq!(Checks::of(&wqes, &rung, &seen).aiv_direct(), Check::Yes);
        // The same transfer with a Host-written WQE, a Host ring, a CQE the Host read first: each check says no.
        let host = [sqe(Doer::Host, b1, 4, None), sqe(b1, Doer::Host, 5, Some(FlagReader::Host))];
        let [wqes, rung, seen] = rdma_acts(&host);
        let checks = Checks::of(&wqes, &rung, &seen);
        assert_eq!(
            (checks.kernel_writes_descriptors, checks.kernel_rings_doorbell, checks.device_observes_completion),
            (Check::No, Check::No, Check::No)
        );
        // A CQE nobody read (or no CQE at all) names no reader.
        assert_eq!(rdma_acts(&[sqe(b1, b1, 1, Some(FlagReader::Unread))])[2].unattributed, 1);
        assert_eq!(rdma_acts(&[sqe(b1, b1, 1, None)])[2].unattributed, 1);
    }

    #[test]
    fn without_a_log_the_acts_are_self_reported_and_host_calls_in_flight_are_counted_against_them() {
        use crate::evidence::{Check, Checks, Submitter};
        let [sqes, doorbells, seen] = self_reported(3, &entry(7, DcqStatus::COMPLETED));
        assert_eq!((sqes.source, sqes.by_aiv, sqes.aiv_blocks), (Source::SelfReported, 7, Some([3, 3])));
        assert_eq!((doorbells.by_aiv, seen.by_aiv), (1, 1));
        assert_eq!(self_reported(3, &entry(7, DcqStatus::TIMEOUT))[2].by_aiv, 0);
        // No Host call in flight: the kernel's word alone, so unknown (never yes).
        let mut acts = self_reported(3, &entry(7, DcqStatus::COMPLETED));
        add_host_acts(&mut acts, HostMark([5, 2, 9]), HostMark([5, 2, 9]));
        assert_eq!(acts.map(|act| act.by_host), [0, 0, 0]);
        assert_eq!(Checks::of(&acts[0], &acts[1], &acts[2]).aiv_direct(), Check::Unknown);
        assert_eq!(Submitter::of(&acts[0], &acts[1], &acts[2]), Submitter::Unknown);
        // One Host copy (writes, submits and reads) while it was in flight: each act counts it, and it is mixed.
        add_host_acts(&mut acts, HostMark([5, 2, 9]), HostMark([6, 3, 10]));
        assert_eq!(acts.map(|act| act.by_host), [1, 1, 1]);
        assert_eq!(Checks::of(&acts[0], &acts[1], &acts[2]).aiv_direct(), Check::No);
        assert_eq!(Submitter::of(&acts[0], &acts[1], &acts[2]), Submitter::Mixed);
        // The twin's records are left alone.
        let mut modelled = [none(); 3];
        add_host_acts(&mut modelled, HostMark([0; 3]), HostMark([4; 3]));
        assert_eq!(modelled.map(|act| act.by_host), [0, 0, 0]);
    }

    /// An observer with one log per QP number (each starting at 0) and no channel logs.
    #[derive(Debug, Default)]
    struct QpLogs(std::sync::Mutex<HashMap<u32, Vec<LoggedSqe>>>);

    impl Observation for QpLogs {
        fn channel_log_position(&self, _: u32) -> Option<u64> {
            unreachable!("not used by the walk")
        }
        fn read_channel_log(&self, _: u32, _: u64, _: &mut Vec<LoggedSqe>) -> ChannelLog {
            unreachable!("not used by the walk")
        }
        fn read_qp_log(&self, qpn: u32, from: u64, out: &mut Vec<LoggedSqe>) -> ChannelLog {
            let logs = self.0.lock().expect("logs");
            let log = logs.get(&qpn).map_or(&[][..], Vec::as_slice);
            out.extend_from_slice(&log[(from as usize).min(log.len())..]);
            ChannelLog::Read { first: from, end: log.len() as u64 }
        }
    }

    #[test]
    fn a_replaced_qp_starts_its_slot_afresh_even_under_a_reused_number() {
        let device = QpLogs::default();
        let wqe = || sqe(B0, B0, 1, Some(FlagReader::Core));
        let mut records = BlockRecords::default();
        let done = entry(2, DcqStatus::COMPLETED);
        let aiv_direct = |acts: [Act; 3]| acts.iter().all(|act| act.by_aiv > 0 && act.by_host == 0);
        // Slot 0's QP 7 carries two transfers of 2 WQEs each.
        device.0.lock().expect("logs").insert(7, vec![wqe(); 4]);
        assert!(aiv_direct(records.attribute_rdma(Some(&device), 0, PostedOn { slot: 0, qpn: 7 }, &done)));
        assert!(aiv_direct(records.attribute_rdma(Some(&device), 0, PostedOn { slot: 0, qpn: 7 }, &done)));
        // The slot's QP is replaced by QP 9: its log starts at 0, and the slot's entry is replaced, not added to.
        device.0.lock().expect("logs").insert(9, vec![wqe(); 2]);
        assert!(aiv_direct(records.attribute_rdma(Some(&device), 0, PostedOn { slot: 0, qpn: 9 }, &done)));
        assert_eq!(records.qp_cursors.len(), 1, "one entry per slot: {:?}", records.qp_cursors);
        // Replaced again by a QP that reuses number 7, with a new log: attributed from 0, not from the old cursor 4.
        device.0.lock().expect("logs").insert(7, vec![wqe(); 2]);
        assert!(aiv_direct(records.attribute_rdma(Some(&device), 0, PostedOn { slot: 0, qpn: 7 }, &done)));
        // A second slot has its own cursor; a transfer whose WQEs the log lacks is lost.
        assert_eq!(
            records.attribute_rdma(Some(&device), 0, PostedOn { slot: 1, qpn: 11 }, &done)[0].source,
            Source::Lost
        );
        assert_eq!(records.qp_cursors.len(), 2);
    }
}
