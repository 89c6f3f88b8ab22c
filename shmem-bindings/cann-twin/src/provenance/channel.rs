//! A channel's own records ([`ChannelProvenance`]): its SQ slots' writers, its tallies and its consumption log; and
//! the process-wide count of landed flags not yet read.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use crossbeam_utils::CachePadded;

use super::records::{Doer, FlagReader, LoggedSqe, Provenance, Reader, Ringers};
use super::writer::{WRITER_AICPU, WRITER_BLOCK0, WRITER_HOST, WRITER_OTHER, WRITER_UNKNOWN};

/// Flags pending, process-wide (0: every read is done after one load).
static PENDING: AtomicU64 = AtomicU64::new(0);

/// Whether any landed flag waits for its first read (one relaxed load).
#[inline]
pub(super) fn flags_pending() -> bool {
    PENDING.load(Ordering::Relaxed) != 0
}

/// The bytes of one SQ slot the records shadow: an SDMA SQE (`sdma::SQE_BYTES`, which checks it), a twin NIC WQE.
pub(crate) const SLOT_BYTES: u64 = 64;

/// Blocks tallied in lock-free counters; higher ones go to a map under a mutex.
const DIRECT_BLOCKS: usize = 64;
/// Flags of one channel that can wait to be read at a time (the transfer kernel has at most two unexecuted flag
/// SQEs per channel, landing on one word).
const FLAG_SLOTS: usize = 4;
/// Bits of the device address in a flag slot's key; the rest is the landing's sequence number (no ABA between two
/// landings on the same word).
const ADDRESS_BITS: u32 = 48;

/// Counts per block: the first [`DIRECT_BLOCKS`] lock-free, the rest under a mutex.
#[derive(Debug)]
struct PerBlock {
    direct: Box<[AtomicU64]>,
    high: Mutex<BTreeMap<u32, u64>>,
}

impl Default for PerBlock {
    fn default() -> Self {
        PerBlock { direct: (0..DIRECT_BLOCKS).map(|_| AtomicU64::new(0)).collect(), high: Mutex::default() }
    }
}

impl PerBlock {
    fn add(&self, block: u32) {
        match self.direct.get(block as usize) {
            Some(count) => {
                count.fetch_add(1, Ordering::Relaxed);
            }
            None => *self.high.lock().unwrap_or_else(|p| p.into_inner()).entry(block).or_default() += 1,
        }
    }
    fn snapshot(&self) -> Vec<(u32, u64)> {
        let mut out: Vec<(u32, u64)> = self
            .direct
            .iter()
            .enumerate()
            .map(|(block, count)| (block as u32, count.load(Ordering::Relaxed)))
            .filter(|&(_, count)| count > 0)
            .collect();
        out.extend(self.high.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(&b, &c)| (b, c)));
        out
    }
    fn reset(&self) {
        self.direct.iter().for_each(|count| count.store(0, Ordering::Relaxed));
        self.high.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// One flag landed and not yet claimed by a read.
#[derive(Debug, Default)]
struct FlagSlot {
    /// 0: free; else the flag's device address (low [`ADDRESS_BITS`]) and the landing's sequence number above.
    key: AtomicU64,
    /// The value the engine stores.
    value: AtomicU64,
}

/// The provenance records of one channel.
#[derive(Debug)]
pub(crate) struct ChannelProvenance {
    pub device: i32,
    /// Device address of slot 0 and the ring's length in bytes.
    pub(super) sq_base: u64,
    pub(super) sq_bytes: u64,
    /// Per slot: the id of its last writer (`WRITER_*`).
    /// 16 bits a slot, so that a landing of 32 SQEs marks one cache line (which the engine reads, on its own core):
    /// writer ids that do not fit (blocks 65532 and up) are kept as [`WRITER_OTHER`].
    shadow: Box<[AtomicU16]>,
    sqes: CachePadded<SqeTally>,
    doorbells: CachePadded<DoorbellTally>,
    flags: CachePadded<FlagTally>,
    /// Every SQE executed while the records were on, in execution order ([`crate::control::sqe_log`]).
    log: CachePadded<SqeLog>,
}

/// Entries the consumption log keeps: a reader that falls further behind loses the oldest.
pub const LOG_CAPACITY: u64 = 8192;
/// Flag claims kept, by landing sequence (a claim is looked up within a few groups of its landing).
const CLAIM_SLOTS: u64 = 1024;
/// Bits of a landing sequence the flag slots keep (above the address in their key).
const SEQUENCE_BITS: u32 = 64 - ADDRESS_BITS;
/// Bits of a writer id in a log entry (the shadow keeps 16), above the landing sequence's.
const WRITER_BITS: u32 = 16;
/// The landing sequence's part of a log entry's `writer_landing`.
const LANDING_MASK: u64 = (1 << (64 - WRITER_BITS)) - 1;

/// The consumption log of one channel: written by its engine thread only, read by anyone.
#[derive(Debug)]
struct SqeLog {
    /// Per entry: the set of the doorbell's ringers ([`Ringers`]).
    ringers: Box<[AtomicU64]>,
    /// Per entry: the doorbell count when the engine took the tail that exposed the SQE.
    doorbell: Box<[AtomicU64]>,
    /// Per entry: the writer id (the top [`WRITER_BITS`]) and the flag's landing sequence for a flag SQE, 0 for a
    /// data SQE (the rest).
    writer_landing: Box<[AtomicU64]>,
    /// Entries written (the next entry's position).
    written: AtomicU64,
    /// Per landing sequence modulo [`CLAIM_SLOTS`]: `(sequence << 2) | 1` if a core read the flag first, `| 2` if the
    /// Host did.
    claims: Box<[AtomicU64]>,
}

impl SqeLog {
    fn new() -> SqeLog {
        let cells = |n: u64| (0..n).map(|_| AtomicU64::new(0)).collect::<Box<[AtomicU64]>>();
        SqeLog {
            ringers: cells(LOG_CAPACITY),
            doorbell: cells(LOG_CAPACITY),
            writer_landing: cells(LOG_CAPACITY),
            written: AtomicU64::new(0),
            claims: cells(CLAIM_SLOTS),
        }
    }
}

#[derive(Debug, Default)]
struct SqeTally {
    by_block: PerBlock,
    by_host: AtomicU64,
    by_aicpu: AtomicU64,
    unknown: AtomicU64,
}

#[derive(Debug, Default)]
struct DoorbellTally {
    by_block: PerBlock,
    by_host: AtomicU64,
    by_aicpu: AtomicU64,
    unknown: AtomicU64,
}

#[derive(Debug, Default)]
struct FlagTally {
    slots: [FlagSlot; FLAG_SLOTS],
    /// Slots holding a flag (a reader skips the channel when 0).
    pending: AtomicU32,
    landings: AtomicU64,
    landed: AtomicU64,
    seen_by_core: AtomicU64,
    seen_by_host: AtomicU64,
    seen_by_aicpu: AtomicU64,
}

impl ChannelProvenance {
    pub(crate) fn new(device: i32, sq_base: u64, depth: u32) -> ChannelProvenance {
        ChannelProvenance {
            device,
            sq_base,
            sq_bytes: u64::from(depth) * SLOT_BYTES,
            shadow: (0..depth).map(|_| AtomicU16::new(WRITER_UNKNOWN as u16)).collect(),
            sqes: CachePadded::default(),
            doorbells: CachePadded::default(),
            flags: CachePadded::default(),
            log: CachePadded::new(SqeLog::new()),
        }
    }

    /// Marks the slots `[address, address + len)` covers as written by `writer`: a slot wholly covered takes the
    /// writer; a slot partly covered keeps it if it is the same, else becomes [`WRITER_OTHER`]. A writer id above
    /// 16 bits counts as [`WRITER_OTHER`].
    pub(crate) fn mark(&self, writer: u32, address: u64, len: u64) {
        let writer = u16::try_from(writer).unwrap_or(WRITER_OTHER as u16);
        let end = address.saturating_add(len);
        let (from, to) = (address.max(self.sq_base), end.min(self.sq_base + self.sq_bytes));
        if from >= to {
            return;
        }
        let sqe = SLOT_BYTES;
        // Slots touched: [first, last); wholly covered: [whole_first, whole_last) (the ring ends on a slot boundary).
        let (first, last) = ((from - self.sq_base) / sqe, (to - self.sq_base).div_ceil(sqe));
        // A write within one slot, or across two without covering either, covers none wholly: an empty middle.
        let whole_first = (from - self.sq_base).div_ceil(sqe);
        let whole_last = ((to - self.sq_base) / sqe).max(whole_first);
        let partly = |slot: u64| {
            let cell = &self.shadow[slot as usize];
            if cell.load(Ordering::Relaxed) != writer {
                cell.store(WRITER_OTHER as u16, Ordering::Release);
            }
        };
        (first..whole_first).for_each(partly);
        // The common case, a landing of whole SQEs: a plain run of stores.
        for cell in &self.shadow[whole_first as usize..whole_last as usize] {
            cell.store(writer, Ordering::Release);
        }
        (whole_last..last).for_each(partly);
    }

    /// Forgets every slot's writer: each slot is [`WRITER_UNKNOWN`] until its next write.
    pub(super) fn forget_writers(&self) {
        for cell in self.shadow.iter() {
            cell.store(WRITER_UNKNOWN as u16, Ordering::Release);
        }
    }

    /// The writer of slot `slot`, read by the engine when it reads the SQE.
    pub(crate) fn writer_of(&self, slot: u32) -> u32 {
        self.shadow.get(slot as usize).map_or(WRITER_UNKNOWN, |cell| u32::from(cell.load(Ordering::Acquire)))
    }

    /// The engine executed an SQE whose writer (read with it) was `writer`, exposed by the doorbell rung by
    /// `ringers` that the engine took at doorbell count `doorbell`; `landing` is the flag's landing sequence for a
    /// flag SQE. Tallies it and appends it to the consumption log (called by the channel's engine thread only).
    pub(crate) fn consumed(&self, writer: u32, ringers: Ringers, doorbell: u64, landing: Option<u64>) {
        let log = &self.log;
        let at = log.written.load(Ordering::Relaxed);
        let index = (at % LOG_CAPACITY) as usize;
        // The shadow's writer ids fit in 16 bits; another id is unattributable, as the shadow keeps it.
        let kept = if writer >> WRITER_BITS == 0 { writer } else { WRITER_OTHER };
        let writer_landing = u64::from(kept) << (64 - WRITER_BITS) | landing.unwrap_or(0) & LANDING_MASK;
        log.ringers[index].store(ringers.0, Ordering::Relaxed);
        log.doorbell[index].store(doorbell, Ordering::Relaxed);
        log.writer_landing[index].store(writer_landing, Ordering::Relaxed);
        // Release: a reader that sees the new count sees the entry.
        log.written.store(at + 1, Ordering::Release);
        self.tally(writer);
    }

    fn tally(&self, writer: u32) {
        match writer {
            WRITER_HOST => {
                self.sqes.by_host.fetch_add(1, Ordering::Relaxed);
            }
            WRITER_AICPU => {
                self.sqes.by_aicpu.fetch_add(1, Ordering::Relaxed);
            }
            WRITER_UNKNOWN | WRITER_OTHER => {
                self.sqes.unknown.fetch_add(1, Ordering::Relaxed);
            }
            block => self.sqes.by_block.add(block - WRITER_BLOCK0),
        }
    }

    /// An accepted doorbell write by `origin` (`WRITER_HOST`, `WRITER_AICPU`, `WRITER_OTHER` or a block's id).
    pub(crate) fn rung(&self, origin: u32) {
        match origin {
            WRITER_HOST => {
                self.doorbells.by_host.fetch_add(1, Ordering::Relaxed);
            }
            WRITER_AICPU => {
                self.doorbells.by_aicpu.fetch_add(1, Ordering::Relaxed);
            }
            WRITER_UNKNOWN | WRITER_OTHER => {
                self.doorbells.unknown.fetch_add(1, Ordering::Relaxed);
            }
            block => self.doorbells.by_block.add(block - WRITER_BLOCK0),
        }
    }

    /// The engine is about to store `value` into the flag word at `address` (called before the store, so a reader
    /// that sees the value finds the record). A pending flag on the same word is replaced (it was never read).
    /// Returns the landing's sequence number.
    pub(crate) fn flag_landing(&self, address: u64, value: u64) -> u64 {
        let flags = &self.flags;
        let sequence = self.next_landing();
        let key = (address & ((1 << ADDRESS_BITS) - 1)) | (sequence << ADDRESS_BITS);
        let same = flags.slots.iter().find(|slot| {
            let held = slot.key.load(Ordering::Acquire);
            held != 0 && held & ((1 << ADDRESS_BITS) - 1) == address
        });
        let slot = match same {
            Some(slot) => {
                // Free it first: a reader that claims the old key now credits the old landing, not this one.
                if slot.key.swap(0, Ordering::AcqRel) != 0 {
                    flags.pending.fetch_sub(1, Ordering::AcqRel);
                    PENDING.fetch_sub(1, Ordering::AcqRel);
                }
                Some(slot)
            }
            None => flags.slots.iter().find(|slot| slot.key.load(Ordering::Acquire) == 0),
        };
        // Only the channel's engine thread fills slots, so a free slot stays free until the store below.
        if let Some(slot) = slot {
            slot.value.store(value, Ordering::Relaxed);
            flags.pending.fetch_add(1, Ordering::AcqRel);
            PENDING.fetch_add(1, Ordering::AcqRel);
            slot.key.store(key, Ordering::Release);
        }
        sequence
    }

    /// Counts a landing (a flag, or a twin NIC's CQE for the QP records of [`crate::provenance::qp`]) and returns
    /// its sequence number (from 1).
    pub(crate) fn next_landing(&self) -> u64 {
        self.flags.landed.fetch_add(1, Ordering::Relaxed);
        self.flags.landings.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Records that landing `sequence` was first read by `reader`: tallied, and named in the log entries that carry
    /// the landing.
    pub(crate) fn claim(&self, sequence: u64, reader: Reader) {
        let seen = match reader {
            Reader::Core => &self.flags.seen_by_core,
            Reader::Host => &self.flags.seen_by_host,
            Reader::AiCpu => &self.flags.seen_by_aicpu,
        };
        seen.fetch_add(1, Ordering::Relaxed);
        let low = sequence & ((1 << SEQUENCE_BITS) - 1);
        let claim = (low << 2) | reader.code();
        self.log.claims[(low % CLAIM_SLOTS) as usize].store(claim, Ordering::Release);
    }

    /// A read of `[address, address + data.len())` that returned `data`: claims every pending flag it covers whose
    /// landed value it returned.
    pub(crate) fn read(&self, reader: Reader, address: u64, data: &[u8]) {
        let flags = &self.flags;
        if flags.pending.load(Ordering::Acquire) == 0 {
            return;
        }
        let end = address.saturating_add(data.len() as u64);
        for slot in &flags.slots {
            let key = slot.key.load(Ordering::Acquire);
            if key == 0 {
                continue;
            }
            let at = key & ((1 << ADDRESS_BITS) - 1);
            if at < address || at + 8 > end {
                continue;
            }
            let offset = (at - address) as usize;
            let mut word = [0u8; 8];
            word.copy_from_slice(&data[offset..offset + 8]);
            if u64::from_le_bytes(word) != slot.value.load(Ordering::Relaxed) {
                continue;
            }
            if slot.key.compare_exchange(key, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                flags.pending.fetch_sub(1, Ordering::AcqRel);
                PENDING.fetch_sub(1, Ordering::AcqRel);
                // The key keeps the sequence's low bits; the claim is found by them.
                self.claim(key >> ADDRESS_BITS, reader);
            }
        }
    }

    /// Entries logged so far (the position the next executed SQE takes).
    pub(crate) fn log_position(&self) -> u64 {
        self.log.written.load(Ordering::Acquire)
    }

    /// Appends to `out` the log's entries from position `from` on (those still kept); returns the position of the
    /// first entry appended (later than `from` if older ones were overwritten) and the position after the last.
    pub(crate) fn read_log(&self, from: u64, out: &mut Vec<LoggedSqe>) -> (u64, u64) {
        let log = &self.log;
        let end = log.written.load(Ordering::Acquire);
        let start = from.max(end.saturating_sub(LOG_CAPACITY)).min(end);
        let first = out.len();
        for at in start..end {
            let index = (at % LOG_CAPACITY) as usize;
            let writer_landing = log.writer_landing[index].load(Ordering::Relaxed);
            let landing = writer_landing & LANDING_MASK;
            let flag = (landing != 0).then(|| {
                let low = landing & ((1 << SEQUENCE_BITS) - 1);
                let claim = log.claims[(low % CLAIM_SLOTS) as usize].load(Ordering::Acquire);
                match (claim >> 2 == low, claim & 3) {
                    (true, 1) => FlagReader::Core,
                    (true, 2) => FlagReader::Host,
                    (true, 3) => FlagReader::AiCpu,
                    _ => FlagReader::Unread,
                }
            });
            out.push(LoggedSqe {
                writer: Doer::of((writer_landing >> (64 - WRITER_BITS)) as u32),
                ringers: Ringers(log.ringers[index].load(Ordering::Relaxed)),
                doorbell: log.doorbell[index].load(Ordering::Relaxed),
                flag,
            });
        }
        // Entries the engine overwrote while they were read (it ran LOG_CAPACITY ahead meanwhile) are dropped.
        let now = log.written.load(Ordering::Acquire);
        let kept_from = now.saturating_sub(LOG_CAPACITY).max(start);
        let dropped = (kept_from - start).min(end - start) as usize;
        out.drain(first..first + dropped);
        (kept_from.min(end), end)
    }

    /// Device addresses of the flags landed and not yet claimed.
    pub(crate) fn pending_flags(&self) -> Vec<u64> {
        let keys = self.flags.slots.iter().map(|slot| slot.key.load(Ordering::Acquire));
        keys.filter(|&key| key != 0).map(|key| key & ((1 << ADDRESS_BITS) - 1)).collect()
    }

    pub(crate) fn snapshot(&self) -> Provenance {
        let flags = &self.flags;
        let landed = flags.landed.load(Ordering::Relaxed);
        let seen_by_core = flags.seen_by_core.load(Ordering::Relaxed);
        let seen_by_host = flags.seen_by_host.load(Ordering::Relaxed);
        let seen_by_aicpu = flags.seen_by_aicpu.load(Ordering::Relaxed);
        Provenance {
            sqes_by_block: self.sqes.by_block.snapshot(),
            sqes_by_host: self.sqes.by_host.load(Ordering::Relaxed),
            sqes_by_aicpu: self.sqes.by_aicpu.load(Ordering::Relaxed),
            sqes_unknown: self.sqes.unknown.load(Ordering::Relaxed),
            doorbells_by_block: self.doorbells.by_block.snapshot(),
            doorbells_by_host: self.doorbells.by_host.load(Ordering::Relaxed),
            doorbells_by_aicpu: self.doorbells.by_aicpu.load(Ordering::Relaxed),
            doorbells_unknown: self.doorbells.unknown.load(Ordering::Relaxed),
            flags_landed: landed,
            flags_seen_by_core: seen_by_core,
            flags_seen_by_host: seen_by_host,
            flags_seen_by_aicpu: seen_by_aicpu,
            flags_unseen: landed.saturating_sub(seen_by_core + seen_by_host + seen_by_aicpu),
        }
    }

    /// Zeroes the tallies, drops pending flags (they count neither way) and forgets who wrote each slot: a slot
    /// written before the reset and not written again after it is unattributed when the engine executes it.
    pub(crate) fn reset(&self) {
        self.forget_writers();
        self.sqes.by_block.reset();
        self.sqes.by_host.store(0, Ordering::Relaxed);
        self.sqes.by_aicpu.store(0, Ordering::Relaxed);
        self.sqes.unknown.store(0, Ordering::Relaxed);
        self.doorbells.by_block.reset();
        self.doorbells.by_host.store(0, Ordering::Relaxed);
        self.doorbells.by_aicpu.store(0, Ordering::Relaxed);
        self.doorbells.unknown.store(0, Ordering::Relaxed);
        for slot in &self.flags.slots {
            if slot.key.swap(0, Ordering::AcqRel) != 0 {
                self.flags.pending.fetch_sub(1, Ordering::AcqRel);
                PENDING.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.flags.landed.store(0, Ordering::Relaxed);
        self.flags.seen_by_core.store(0, Ordering::Relaxed);
        self.flags.seen_by_host.store(0, Ordering::Relaxed);
        self.flags.seen_by_aicpu.store(0, Ordering::Relaxed);
    }
}
