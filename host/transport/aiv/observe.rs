//! The acts of the aiv path as observed: who wrote the SQEs a block's SDMA channel consumed, who rang its doorbell,
//! who first read its completion flags (docs/evidence.md, "The aiv path").
//!
//! On the twin runtime the device model records each act where it happens ([`ChannelRecords::Twin`]); a drain pass
//! of a block diffs the channel's records against those of the block's previous pass, and the transfers the pass
//! completes share that window. An act the window holds nothing of (its SQEs executed, or its doorbell rang, before
//! the previous pass) keeps the counts of the latest window that held some. On the vendor's runtime the same fields
//! come from the kernel's tallies in each DCQ entry. Owns: the block's last records; it must not touch the rings.

use crate::device::ChannelRecords;
use crate::evidence::{Act, Source};
use crate::kernel_abi::{DcqEntry, DcqStatus};

/// What one drain pass of a block observed, for the transfers it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PassActs {
    /// The twin's records of the window: descriptors written, doorbells rung, completions first seen.
    Window([Act; 3]),
    /// No records on this runtime: the acts come from each transfer's DCQ entry.
    KernelTally,
    /// Records exist but were off.
    NotRecorded,
}

impl PassActs {
    /// The three acts of one transfer completed by the pass with `entry`, on block `block`.
    pub(super) fn of(&self, block: u32, entry: &DcqEntry) -> [Act; 3] {
        match *self {
            PassActs::Window(acts) => acts,
            PassActs::NotRecorded => [Act::unknown(Source::NotRecorded); 3],
            PassActs::KernelTally => {
                let tally = |count: u64| Act {
                    source: Source::KernelTally,
                    by_aiv: count,
                    aiv_blocks: (count > 0).then_some([block, block]),
                    // The aiv path makes no Host call that writes device memory, rings a doorbell or reads a flag
                    // while a transfer is in flight: its calls on a transfer's behalf (a launch, a channel reset, an
                    // exception query) are counted in `host_device_api_calls`.
                    by_host: 0,
                    unattributed: 0,
                };
                // The kernel publishes a COMPLETED entry only after it read the flag that covers the transfer.
                let seen = u64::from(DcqStatus(entry.status.get()) == DcqStatus::COMPLETED);
                [tally(u64::from(entry.sqes.get())), tally(u64::from(entry.doorbells.get())), tally(seen)]
            }
        }
    }
}

/// A block's records as of its previous drain pass, and the latest non-empty window of each act.
#[derive(Debug)]
pub(super) struct BlockRecords {
    last: Option<cann_twin::control::Provenance>,
    /// The flag counts (seen by a core, seen by the Host, unseen) as of the last pass whose window held a read.
    flags_base: [u64; 3],
    acts: [Act; 3],
}

impl Default for BlockRecords {
    fn default() -> Self {
        BlockRecords { last: None, flags_base: [0; 3], acts: [Act::unknown(Source::TwinModel); 3] }
    }
}

impl BlockRecords {
    /// The window of a drain pass whose channel records are now `records`.
    pub(super) fn pass(&mut self, records: ChannelRecords) -> PassActs {
        let now = match records {
            ChannelRecords::NotRecorded => return PassActs::NotRecorded,
            ChannelRecords::NotObservable => return PassActs::KernelTally,
            ChannelRecords::Twin(now) => now,
        };
        let empty = cann_twin::control::Provenance::default();
        let mut before = self.last.as_ref().unwrap_or(&empty);
        if went_back(before, &now) {
            // The records were reset (`reset_provenance`) since the previous pass: count from zero again.
            before = &empty;
            self.flags_base = [0; 3];
        }
        let [sqes, doorbells] = window(before, &now);
        for (kept, seen) in self.acts.iter_mut().zip([sqes, doorbells]) {
            if seen.total() > 0 {
                *kept = seen;
            }
        }
        // A flag that landed but is not read yet counts as unseen until it is read: a window holds the flags only
        // once one was read in it, and then every flag landed since the last such window (the pending ones it saw
        // come back out as they are read).
        let flags = [now.flags_seen_by_core, now.flags_seen_by_host, now.flags_unseen];
        let [core, host, unseen] = [0, 1, 2].map(|i| flags[i].saturating_sub(self.flags_base[i]));
        if core + host > 0 {
            // Flags are read by the cores of the channel's block; the records do not name which block read.
            self.acts[2] =
                Act { source: Source::TwinModel, by_aiv: core, aiv_blocks: None, by_host: host, unattributed: unseen };
            self.flags_base = flags;
        }
        self.last = Some(now);
        PassActs::Window(self.acts)
    }
}

/// What the records `now` hold beyond `before`: descriptors written, doorbells rung.
fn window(before: &cann_twin::control::Provenance, now: &cann_twin::control::Provenance) -> [Act; 2] {
    let (sqes, sqe_blocks) = by_block(&before.sqes_by_block, &now.sqes_by_block);
    let (doorbells, doorbell_blocks) = by_block(&before.doorbells_by_block, &now.doorbells_by_block);
    let less = |now: u64, before: u64| now.saturating_sub(before);
    let act = |by_aiv: u64, aiv_blocks: Option<[u32; 2]>, by_host: u64, unattributed: u64| Act {
        source: Source::TwinModel,
        by_aiv,
        aiv_blocks: aiv_blocks.filter(|_| by_aiv > 0),
        by_host,
        unattributed,
    };
    [
        act(sqes, sqe_blocks, less(now.sqes_by_host, before.sqes_by_host), less(now.sqes_unknown, before.sqes_unknown)),
        act(
            doorbells,
            doorbell_blocks,
            less(now.doorbells_by_host, before.doorbells_by_host),
            less(now.doorbells_unknown, before.doorbells_unknown),
        ),
    ]
}

/// Whether some count of `now` is below `before`'s: the records were reset in between.
fn went_back(before: &cann_twin::control::Provenance, now: &cann_twin::control::Provenance) -> bool {
    let sum = |counts: &[(u32, u64)]| counts.iter().map(|&(_, count)| count).sum::<u64>();
    let totals = |p: &cann_twin::control::Provenance| {
        [
            sum(&p.sqes_by_block) + p.sqes_by_host + p.sqes_unknown,
            sum(&p.doorbells_by_block) + p.doorbells_by_host + p.doorbells_unknown,
            p.flags_landed,
        ]
    };
    totals(now).iter().zip(totals(before)).any(|(now, before)| *now < before)
}

/// The counts `now` holds beyond `before` (both `(block, count)` ascending), summed, with the lowest and highest
/// block that has any.
fn by_block(before: &[(u32, u64)], now: &[(u32, u64)]) -> (u64, Option<[u32; 2]>) {
    let mut total = 0u64;
    let mut span: Option<[u32; 2]> = None;
    for &(block, count) in now {
        let earlier = before.iter().find(|&&(b, _)| b == block).map_or(0, |&(_, c)| c);
        let delta = count.saturating_sub(earlier);
        if delta > 0 {
            total = total.saturating_add(delta);
            span = Some(match span {
                None => [block, block],
                Some([low, high]) => [low.min(block), high.max(block)],
            });
        }
    }
    (total, span)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sqes: u32, doorbells: u32, status: DcqStatus) -> DcqEntry {
        let mut entry = DcqEntry::default();
        entry.sqes.set(sqes);
        entry.doorbells.set(doorbells);
        entry.status.set(status.0);
        entry
    }

    fn records(sqes: &[(u32, u64)], sqes_by_host: u64, flags_seen_by_core: u64) -> ChannelRecords {
        let mut records = cann_twin::control::Provenance::default();
        records.sqes_by_block = sqes.to_vec();
        records.sqes_by_host = sqes_by_host;
        records.doorbells_by_block = vec![(0, 1)];
        records.flags_landed = flags_seen_by_core + 1;
        records.flags_seen_by_core = flags_seen_by_core;
        // One flag landed and not read yet.
        records.flags_unseen = 1;
        ChannelRecords::Twin(records)
    }

    #[test]
    fn a_pass_sees_what_the_channel_recorded_since_the_previous_pass() {
        let mut block = BlockRecords::default();
        let PassActs::Window([sqes, _, flags]) = block.pass(records(&[(0, 10)], 0, 1)) else { panic!("a window") };
        assert_eq!((sqes.by_aiv, sqes.aiv_blocks, sqes.by_host, flags.by_aiv), (10, Some([0, 0]), 0, 1));
        // The next pass: 3 more by block 0, 2 by block 1, 1 by the Host.
        let PassActs::Window([sqes, doorbells, flags]) = block.pass(records(&[(0, 13), (1, 2)], 1, 2)) else {
            panic!("a window")
        };
        assert_eq!((sqes.by_aiv, sqes.aiv_blocks, sqes.by_host), (5, Some([0, 1]), 1));
        assert_eq!((flags.by_aiv, flags.unattributed), (1, 0), "the pending flag is not counted as unseen");
        // A pass in which no flag was read keeps the flags of the latest window with a read.
        let PassActs::Window([_, _, flags]) = block.pass(records(&[(0, 13), (1, 2)], 1, 2)) else { panic!("a window") };
        assert_eq!(flags.by_aiv, 1);
        // Nothing new rang: the doorbell act keeps the latest window that had one.
        assert_eq!((doorbells.by_aiv, doorbells.aiv_blocks), (1, Some([0, 0])));
    }

    #[test]
    fn without_records_the_acts_are_not_recorded_or_come_from_the_kernel_tally() {
        let mut block = BlockRecords::default();
        let done = entry(7, 2, DcqStatus::COMPLETED);
        let acts = block.pass(ChannelRecords::NotRecorded).of(3, &done);
        assert!(acts.iter().all(|act| act.source == Source::NotRecorded));
        let [sqes, doorbells, seen] = block.pass(ChannelRecords::NotObservable).of(3, &done);
        assert_eq!((sqes.source, sqes.by_aiv, sqes.aiv_blocks), (Source::KernelTally, 7, Some([3, 3])));
        assert_eq!((doorbells.by_aiv, seen.by_aiv), (2, 1));
        let timed_out = entry(7, 2, DcqStatus::TIMEOUT);
        assert_eq!(block.pass(ChannelRecords::NotObservable).of(3, &timed_out)[2].by_aiv, 0);
    }
}
