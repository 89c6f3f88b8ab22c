//! Provenance records of the SDMA channels (issue 15): who wrote each SQE an engine consumes, who rang each
//! doorbell, and who first read each completion flag an engine landed. Every record is made where the act happens:
//!
//! - a write into a registered SQ marks the slots it covers in the channel's shadow array of writer ids, from the
//!   code that performs the write (an emulated core's DMA completion and cache-line write-back, through the
//!   `gm_written` op of `kernels/cpu/aiv_cpu_core.h`; every Host-side write translated by the device address space
//!   for writing, from [`crate::memory`]);
//! - the engine reads the slot's writer when it reads the SQE, and tallies it when the SQE has executed;
//! - an accepted doorbell write tallies its origin (the ringing core's block, or the Host's test-only path) and joins
//!   the doorbell's set of ringers, which the engine takes with the tail ([`RingerTake`]);
//! - the engine's 8-byte flag copy publishes the flag (address and value) before it stores it; the first read that
//!   covers the word and returns that value claims it (a core's line fill or GM -> UB DMA through the `gm_read`
//!   op, or a Host runtime copy to Host memory).
//!
//! The hot path: a write or read checks one atomic counter (nothing watched or nothing pending: done), then the
//! calling thread's cached copy of the watch list (refreshed only when [`WATCH_GENERATION`] moved), a range test
//! per watched SQ, and for a hit one relaxed store per covered slot. No lock is taken there; the engine takes none
//! either per SQE for these records (blocks numbered 64 or more are tallied under a mutex of their own, which the
//! engine takes only for SQEs such a block wrote).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use crossbeam_utils::CachePadded;

/// Writer id of a slot nobody wrote since the channel was created (the twin's zeroing of the ring).
pub(crate) const WRITER_UNKNOWN: u32 = 0;
/// Writer id of a Host-side write (a runtime copy, memset or any other Host path into device memory) by a Host
/// thread.
pub(crate) const WRITER_HOST: u32 = 1;
/// Writer id of a slot written last by a device-side agent that is not a core (an SDMA engine's copy), or partly
/// by one writer and partly by another: not attributable.
pub(crate) const WRITER_OTHER: u32 = 2;
/// Writer id of the AI CPU (the NPU's control CPU, running AI-CPU kernels): a write through the device address space
/// by a thread marked as the AI CPU's ([`mark_aicpu_thread`]), or a doorbell it rang. Never a core, never the Host.
pub(crate) const WRITER_AICPU: u32 = 3;
/// Writer id of block `k` is `WRITER_BLOCK0 + k`.
pub(crate) const WRITER_BLOCK0: u32 = 4;
/// The bits of a [`Ringers`] set that mean nobody one can name (the ids [`WRITER_UNKNOWN`] and [`WRITER_OTHER`]).
const UNATTRIBUTED_BITS: u64 = 1 << WRITER_UNKNOWN | 1 << WRITER_OTHER;
/// Blocks tallied in lock-free counters; higher ones go to a map under a mutex.
const DIRECT_BLOCKS: usize = 64;
/// Flags of one channel that can wait to be read at a time (the transfer kernel has at most two unexecuted flag
/// SQEs per channel, landing on one word).
const FLAG_SLOTS: usize = 4;
/// Bits of the device address in a flag slot's key; the rest is the landing's sequence number (no ABA between two
/// landings on the same word).
const ADDRESS_BITS: u32 = 48;

/// The writer id of block `block`.
pub(crate) fn block_writer(block: u32) -> u32 {
    WRITER_BLOCK0.saturating_add(block)
}

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
    sq_base: u64,
    sq_bytes: u64,
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

/// Who did an act, as the consumption log names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Doer {
    /// An emulated core of this block.
    Block(u32),
    /// A Host-side write or ring.
    Host,
    /// The AI CPU: a write by one of its threads, or a ring through its register path.
    AiCpu,
    /// Nobody one can name (see [`Provenance::sqes_unknown`]).
    Unattributed,
}

impl Doer {
    fn of(id: u32) -> Doer {
        match id {
            WRITER_HOST => Doer::Host,
            WRITER_AICPU => Doer::AiCpu,
            WRITER_UNKNOWN | WRITER_OTHER => Doer::Unattributed,
            block => Doer::Block(block - WRITER_BLOCK0),
        }
    }

    /// The writer id of this doer ([`WRITER_UNKNOWN`] for nobody one can name).
    fn id(self) -> u32 {
        match self {
            Doer::Block(block) => block_writer(block),
            Doer::Host => WRITER_HOST,
            Doer::AiCpu => WRITER_AICPU,
            Doer::Unattributed => WRITER_UNKNOWN,
        }
    }
}

/// Who first read a flag SQE's landed value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagReader {
    /// An emulated core.
    Core,
    /// A Host runtime copy.
    Host,
    /// A runtime copy by an AI-CPU thread.
    AiCpu,
    /// Nobody yet, or never (a later landing on the same word replaced it unread).
    Unread,
}

/// Who made a read that may claim a landed flag or CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reader {
    /// An emulated core (a line fill or a GM -> UB DMA).
    Core,
    /// A runtime copy to Host memory by a Host thread.
    Host,
    /// A runtime copy to Host memory by an AI-CPU thread.
    AiCpu,
}

impl Reader {
    /// The reader of a runtime copy made by the calling thread.
    fn of_thread() -> Reader {
        if thread_writer() == WRITER_AICPU {
            Reader::AiCpu
        } else {
            Reader::Host
        }
    }

    /// Its code in a claim slot of the log (0: no claim).
    fn code(self) -> u64 {
        match self {
            Reader::Core => 1,
            Reader::Host => 2,
            Reader::AiCpu => 3,
        }
    }
}

/// Everyone who rang the doorbell that exposed an SQE (or a twin NIC's WQE): every accepted doorbell write since the
/// engine's previous take of the tail, each doer once. Never empty in a log entry: a doorbell nobody recorded (rung
/// while the records were off) names [`Doer::Unattributed`].
///
/// A set of bits, one per writer id below 64: the Host, the AI CPU, nobody one can name, blocks 0 to 59 (an NPU has
/// 48 AIV cores; a block numbered 60 or more counts as unattributed).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Ringers(u64);

impl Ringers {
    /// The set's bit for a ring by `origin` (a `WRITER_*` id).
    #[inline]
    pub(crate) fn bit(origin: u32) -> u64 {
        if origin < 64 {
            1 << origin
        } else {
            1 << WRITER_OTHER
        }
    }

    /// The set of these doers.
    pub fn of(doers: &[Doer]) -> Ringers {
        Ringers(doers.iter().fold(0, |set, &doer| set | Ringers::bit(doer.id())))
    }

    /// Everyone in either set.
    pub fn union(self, other: Ringers) -> Ringers {
        Ringers(self.0 | other.0)
    }

    /// Whether `doer` rang.
    pub fn contains(self, doer: Doer) -> bool {
        self.0 & Ringers::bit(doer.id()) != 0 || (doer == Doer::Unattributed && self.0 & UNATTRIBUTED_BITS != 0)
    }

    /// Each doer in the set once: the Host, the AI CPU, then blocks in ascending order, then [`Doer::Unattributed`].
    pub fn iter(self) -> impl Iterator<Item = Doer> {
        let named = self.0 & !UNATTRIBUTED_BITS;
        let unattributed = self.0 & UNATTRIBUTED_BITS != 0;
        (0..64u32)
            .filter(move |&id| named >> id & 1 != 0)
            .map(Doer::of)
            .chain(unattributed.then_some(Doer::Unattributed))
    }

    /// How many doers the set names.
    pub fn len(self) -> usize {
        self.iter().count()
    }

    /// Whether the set names nobody.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl From<Doer> for Ringers {
    fn from(doer: Doer) -> Ringers {
        Ringers::of(&[doer])
    }
}

impl std::fmt::Debug for Ringers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// The engine's side of a doorbell's set of ringers (an SDMA channel's engine, a twin NIC QP's): each ring joins
/// the set the engine has not taken yet ([`Ringers::bit`], one atomic OR, before the ring stores its tail with
/// release); each take of the tail swaps that set out.
///
/// A take that finds the set empty keeps the previous take's set: no ring came since (an engine resuming the same
/// tail after an interruption), or every ring since had joined before the previous take (a ring caught between its
/// OR and its tail or count by that take joins that take's set). Unless the records were turned on or off since the
/// previous take: the rings in between were not recorded, and the set is unattributed (as it is with no previous
/// take).
#[derive(Debug, Default)]
pub(crate) struct RingerTake {
    /// The set of the last take (0: none yet).
    set: u64,
    /// [`RECORDING_EPOCH`] at the last take.
    epoch: u64,
}

impl RingerTake {
    /// A take of the tail: swaps out the set the rings since the previous take joined (`joined`) and returns the
    /// ringers of the SQEs that tail exposes; `epoch` is [`recording_epoch`] now.
    pub(crate) fn take(&mut self, joined: &AtomicU64, epoch: u64) -> Ringers {
        let taken = joined.swap(0, Ordering::Acquire);
        let same = std::mem::replace(&mut self.epoch, epoch) == epoch;
        self.set = match taken {
            0 if same && self.set != 0 => self.set,
            0 => 1 << WRITER_UNKNOWN,
            taken => taken,
        };
        Ringers(self.set)
    }

    /// The ringers of the last take (unattributed before any).
    pub(crate) fn current(&self) -> Ringers {
        Ringers(if self.set == 0 { 1 << WRITER_UNKNOWN } else { self.set })
    }

    /// Forgets the last take (the SQEs it exposed were dropped: a channel reset).
    pub(crate) fn forget(&mut self) {
        self.set = 0;
    }
}

/// One executed SQE, as [`crate::control::sqe_log`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoggedSqe {
    /// Who wrote its 64 bytes last.
    pub writer: Doer,
    /// Who rang the doorbell that exposed it: every ring since the engine's previous take of the tail.
    pub ringers: Ringers,
    /// The doorbell count when the engine took that tail: SQEs with the same number were exposed together.
    pub doorbell: u64,
    /// For a flag SQE (an engine's 8-byte flag copy), who read the flag first; `None` for a data SQE.
    pub flag: Option<FlagReader>,
}

impl LoggedSqe {
    /// An entry as the log would report it (for tests of code that reads the log).
    pub fn new_for_tests(writer: Doer, ringers: Ringers, doorbell: u64, flag: Option<FlagReader>) -> LoggedSqe {
        LoggedSqe { writer, ringers, doorbell, flag }
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

/// What [`crate::control::provenance`] reports for one channel; see its documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Provenance {
    /// SQEs the engine consumed (executed) whose 64 bytes an emulated core of block `k` wrote last: `(k, count)`,
    /// ascending by block, blocks with no SQE left out.
    pub sqes_by_block: Vec<(u32, u64)>,
    /// SQEs consumed whose bytes a Host-side write (a runtime copy or memset into device memory) by a Host thread
    /// wrote last.
    pub sqes_by_host: u64,
    /// SQEs consumed whose bytes a write by an AI-CPU thread wrote last.
    pub sqes_by_aicpu: u64,
    /// SQEs consumed whose slot nobody wrote since the channel was created, or that an SDMA engine's copy wrote,
    /// or that two writers each wrote part of: not attributable to one writer.
    pub sqes_unknown: u64,
    /// Accepted doorbell writes by an emulated core of block `k`: `(k, count)`.
    pub doorbells_by_block: Vec<(u32, u64)>,
    /// Accepted doorbell writes through the Host's test-only path ([`crate::control::host_ring_doorbell`]).
    pub doorbells_by_host: u64,
    /// Accepted doorbell writes through the AI CPU's register path.
    pub doorbells_by_aicpu: u64,
    /// Accepted doorbell writes through [`crate::register_write`] (a caller the twin cannot name).
    pub doorbells_unknown: u64,
    /// Completion flags (the engine's 8-byte flag copies) landed on this channel.
    pub flags_landed: u64,
    /// Of those, flags whose first read returning the landed value was an emulated core's (a line fill of its
    /// scalar load, or a GM -> UB DMA, covering the word).
    pub flags_seen_by_core: u64,
    /// Flags whose first such read was a Host runtime copy to Host memory (`aclrtMemcpy` D2H, or a stream copy) by a
    /// Host thread.
    pub flags_seen_by_host: u64,
    /// Flags whose first such read was a runtime copy to Host memory by an AI-CPU thread.
    pub flags_seen_by_aicpu: u64,
    /// Flags never read with their value: overwritten by a later landing before any read, still pending, or not
    /// tracked (more than four pending at once). `flags_landed` less the three `flags_seen_by_*`.
    pub flags_unseen: u64,
}

impl ChannelProvenance {
    pub(crate) fn new(device: i32, sq_base: u64, depth: u32) -> ChannelProvenance {
        ChannelProvenance {
            device,
            sq_base,
            sq_bytes: u64::from(depth) * super::SQE_BYTES as u64,
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
        let sqe = super::SQE_BYTES as u64;
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
    fn forget_writers(&self) {
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

    /// Counts a landing (a flag, or a twin NIC's CQE for the QP records of [`crate::nic::provenance`]) and returns
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

/// Every watched channel (all channels of all devices with engines), by SQ address, with compact copies of what a
/// lookup compares, so that a write or read that concerns no channel touches none of the channels' own lines (which
/// their engines and cores write).
#[derive(Debug, Default)]
struct Watches {
    /// `[sq_base, sq_base + sq_bytes)` of each channel, ascending (SQs are disjoint ranges of one address space).
    ranges: Vec<(u64, u64)>,
    /// The device of each channel.
    devices: Vec<i32>,
    channels: Vec<Arc<ChannelProvenance>>,
}

impl Watches {
    fn of(mut channels: Vec<Arc<ChannelProvenance>>) -> Watches {
        channels.sort_by_key(|channel| channel.sq_base);
        Watches {
            ranges: channels.iter().map(|c| (c.sq_base, c.sq_base.saturating_add(c.sq_bytes))).collect(),
            devices: channels.iter().map(|c| c.device).collect(),
            channels,
        }
    }
}

static WATCHES: LazyLock<RwLock<Arc<Watches>>> = LazyLock::new(RwLock::default);

/// Whether the records are kept (off until [`set_recording`] turns them on; `crate::control::record_provenance`).
/// Off, every hook returns after one relaxed load. Measured on the 2-vCPU machine the records cost the post path
/// about 70-140 ns per SQE at doorbell batch 1 and up to 4 ns at batch 32 (docs/twin-runtime.md; the engine reads
/// each slot's writer from a line the ringing core has just written), so they stay off until the Host's evidence
/// reads them.
static RECORDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The address of [`RECORDING`]'s byte, for the kernel model (`CoreOps::records_on`), which reads it atomically.
pub(crate) const RECORDING_BYTE: *const u8 = RECORDING.as_ptr().cast_const().cast::<u8>();

/// Serialises [`set_recording`] (a turn on forgets the slots' writers before the records are on).
static TOGGLE: Mutex<()> = Mutex::new(());

/// Bumped by every turn of the records on or off ([`RingerTake`]: rings between two takes of a tail were recorded
/// only if it did not move).
static RECORDING_EPOCH: AtomicU64 = AtomicU64::new(0);

/// The number of turns of the records on or off so far.
pub(crate) fn recording_epoch() -> u64 {
    RECORDING_EPOCH.load(Ordering::Acquire)
}

/// Turns the records on or off for the process (each channel keeps its tallies and log). Turning them on when they
/// were off first forgets who wrote each slot of every watched SQ (SDMA channels and twin NIC QPs): writes made
/// while the records were off were not marked, so a slot's writer from before would otherwise be credited with
/// them.
pub(crate) fn set_recording(on: bool) {
    let _toggle = TOGGLE.lock().unwrap_or_else(|p| p.into_inner());
    if on == RECORDING.load(Ordering::Acquire) {
        return;
    }
    if on {
        forget_watched_writers();
    }
    RECORDING_EPOCH.fetch_add(1, Ordering::AcqRel);
    RECORDING.store(on, Ordering::Release);
}

/// Forgets the slot writers of every watched SQ ([`ChannelProvenance::forget_writers`]).
fn forget_watched_writers() {
    let watches = WATCHES.read().unwrap_or_else(|p| p.into_inner()).clone();
    for channel in &watches.channels {
        channel.forget_writers();
    }
}

/// Whether the records are kept.
#[inline]
pub(crate) fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}
/// The lowest SQ address and the end of the highest SQ of [`WATCHES`] (0, 0 when none): a write outside this span
/// marks nothing, and is dismissed before the watch list is looked at (most writes: data copies, rings, records).
static SQ_LOW: AtomicU64 = AtomicU64::new(0);
static SQ_HIGH: AtomicU64 = AtomicU64::new(0);
/// Bumped under [`WATCHES`]' write lock by every change of it.
static WATCH_GENERATION: AtomicU64 = AtomicU64::new(1);
/// Flags pending, process-wide (0: every read is done after one load).
static PENDING: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's copy of the watch list and the generation it was taken at.
    static CACHED: RefCell<Cached> = RefCell::new(Cached::default());
    /// The writer id of a write this thread makes through the device address space: the Host unless the thread is
    /// a device-side agent (an SDMA engine marks itself [`WRITER_OTHER`]) or the AI CPU's ([`WRITER_AICPU`]).
    static THREAD_WRITER: std::cell::Cell<u32> = const { std::cell::Cell::new(WRITER_HOST) };
}

/// Marks the calling thread as a device-side agent that is not a core (an SDMA engine thread).
pub(crate) fn mark_device_thread() {
    THREAD_WRITER.with(|writer| writer.set(WRITER_OTHER));
}

/// Marks the calling thread as the AI CPU's: its writes through the device address space are the AI CPU's
/// ([`WRITER_AICPU`]), and so are the flags and CQEs its runtime copies read first.
pub(crate) fn mark_aicpu_thread() {
    THREAD_WRITER.with(|writer| writer.set(WRITER_AICPU));
}

/// The writer id of the calling thread's writes through the device address space.
pub(crate) fn thread_writer() -> u32 {
    THREAD_WRITER.with(|writer| writer.get())
}

/// Runs `work` with the calling thread acting as `writer` (a stream's worker running a copy a thread of that kind
/// submitted), then restores the thread's own writer id.
pub(crate) fn acting_as<R>(writer: u32, work: impl FnOnce() -> R) -> R {
    /// Restores the thread's writer id, also when `work` unwinds.
    struct Restore(u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            THREAD_WRITER.with(|writer| writer.set(self.0));
        }
    }
    let _restore = Restore(THREAD_WRITER.with(|own| own.replace(writer)));
    work()
}

pub(crate) fn watch(channels: &[Arc<ChannelProvenance>]) {
    let mut watches = WATCHES.write().unwrap_or_else(|p| p.into_inner());
    let mut next: Vec<_> = watches.channels.to_vec();
    next.extend(channels.iter().cloned());
    publish(&mut watches, next);
}

/// Stops watching these channels' SQs (a device's SDMA channels when its engines go, a twin NIC QP's when the QP
/// is destroyed); the other channels of the same device stay watched.
pub(crate) fn unwatch(channels: &[Arc<ChannelProvenance>]) {
    let mut watches = WATCHES.write().unwrap_or_else(|p| p.into_inner());
    let next: Vec<_> =
        watches.channels.iter().filter(|held| !channels.iter().any(|gone| Arc::ptr_eq(held, gone))).cloned().collect();
    publish(&mut watches, next);
}

/// Replaces the watch list (under its write lock) and the span of its SQs.
fn publish(watches: &mut Arc<Watches>, channels: Vec<Arc<ChannelProvenance>>) {
    let next = Watches::of(channels);
    let low = next.ranges.first().map_or(0, |&(start, _)| start);
    let high = next.ranges.iter().map(|&(_, end)| end).max().unwrap_or(0);
    // Widened before the list changes and narrowed after, so that no write into a watched SQ is dismissed.
    SQ_LOW.fetch_min(low, Ordering::AcqRel);
    SQ_HIGH.fetch_max(high, Ordering::AcqRel);
    *watches = Arc::new(next);
    WATCH_GENERATION.fetch_add(1, Ordering::AcqRel);
    SQ_LOW.store(if high == 0 { 0 } else { low }, Ordering::Release);
    SQ_HIGH.store(high, Ordering::Release);
}

/// Whether `[address, end)` can overlap a watched SQ (the span test of [`SQ_LOW`] and [`SQ_HIGH`]).
fn near_an_sq(address: u64, end: u64) -> bool {
    end > SQ_LOW.load(Ordering::Acquire) && address < SQ_HIGH.load(Ordering::Acquire)
}

/// A thread's copy of the watch list, and what its last lookups found in it.
#[derive(Debug, Default)]
struct Cached {
    /// The [`WATCH_GENERATION`] `watches` was taken at; the memo holds for it only.
    generation: u64,
    watches: Arc<Watches>,
    memo: Memo,
}

/// What a thread's last lookups of its writes in the watch list found. A core writes the same few places over and
/// over (its SQ's next landing place, its channel record): the memo answers those without a search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Memo {
    /// A span between two SQs (or before the first, or after the last) that a lookup found: a write wholly inside
    /// it overlaps no SQ. Empty at first.
    gap: (u64, u64),
    /// The SQ (an index into the watch list) that last wholly held a write.
    hit: usize,
}

impl Default for Memo {
    fn default() -> Memo {
        Memo { gap: (0, 0), hit: usize::MAX }
    }
}

impl Memo {
    /// The SQs of `ranges` (ascending, disjoint: [`Watches::ranges`]) that `[address, end)` overlaps, as indices.
    fn overlapping(&mut self, ranges: &[(u64, u64)], address: u64, end: u64) -> std::ops::Range<usize> {
        if self.gap.0 <= address && end <= self.gap.1 {
            return 0..0;
        }
        // Disjoint SQs: a write inside one overlaps no other.
        if let Some(&(sq_start, sq_end)) = ranges.get(self.hit) {
            if sq_start <= address && end <= sq_end {
                return self.hit..self.hit + 1;
            }
        }
        // The first SQ that ends after `address`, then each one that starts before `end`.
        let first = ranges.partition_point(|&(_, sq_end)| sq_end <= address);
        let overlapping = ranges[first..].iter().take_while(|&&(sq_start, _)| sq_start < end).count();
        match ranges.get(first) {
            Some(&(sq_start, sq_end)) if overlapping == 1 && sq_start <= address && end <= sq_end => self.hit = first,
            _ if overlapping == 0 => {
                // Every SQ before `first` ends at or before `address`; the one at `first` starts at or after `end`.
                let after = first.checked_sub(1).map_or(0, |before| ranges[before].1);
                self.gap = (after, ranges.get(first).map_or(u64::MAX, |&(sq_start, _)| sq_start));
            }
            _ => {}
        }
        first..first + overlapping
    }
}

/// Runs `body` on the calling thread's current copy of the watch list and its memo.
fn with_watches(body: impl FnOnce(&mut Cached)) {
    let generation = WATCH_GENERATION.load(Ordering::Acquire);
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.generation != generation {
            let watches = WATCHES.read().unwrap_or_else(|p| p.into_inner()).clone();
            *cached = Cached { generation, watches, memo: Memo::default() };
        }
        body(&mut cached);
    });
}

/// A write of `[address, address + len)` by `writer` (a core's id): marks the SQ slots it covers.
pub(crate) fn wrote(writer: u32, address: u64, len: u64) {
    let end = address.saturating_add(len);
    if len == 0 || !recording() || !near_an_sq(address, end) {
        return;
    }
    with_watches(|cached| {
        let found = cached.memo.overlapping(&cached.watches.ranges, address, end);
        for channel in &cached.watches.channels[found] {
            channel.mark(writer, address, len);
        }
    });
}

/// A write through the device address space by the calling thread (the Host unless it marked itself).
pub(crate) fn thread_wrote(address: u64, len: u64) {
    if len == 0 || !recording() || !near_an_sq(address, address.saturating_add(len)) {
        return;
    }
    wrote(thread_writer(), address, len);
}

/// A runtime copy's read of device memory at `address` into Host memory that returned `data`, by the calling thread
/// (the Host's, or the AI CPU's if the thread is marked so): it may observe a flag of any channel.
pub(crate) fn read(address: u64, data: &[u8]) {
    if !recording() || data.len() < 8 {
        return;
    }
    read_on(None, Reader::of_thread(), address, data);
}

/// A read by a core of `device`: the flags it can observe are those of its own device's channels (a core reads its
/// device's memory; flags land in the memory of the device whose engine executes them).
pub(crate) fn core_read(device: i32, address: u64, data: &[u8]) {
    read_on(Some(device), Reader::Core, address, data);
}

fn read_on(device: Option<i32>, reader: Reader, address: u64, data: &[u8]) {
    if !recording() || data.len() < 8 {
        return;
    }
    // The twin NIC's CQEs (one relaxed load when none waits to be read).
    crate::nic::provenance::read(device, reader, address, data);
    if PENDING.load(Ordering::Relaxed) == 0 {
        return;
    }
    with_watches(|cached| {
        let watches = &cached.watches;
        for (channel, &of) in watches.channels.iter().zip(&watches.devices) {
            if device.is_none_or(|device| device == of) {
                channel.read(reader, address, data);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_take_their_last_whole_writer_and_partial_writes_of_another_make_them_unattributable() {
        let channel = ChannelProvenance::new(9, 0x1000, 4);
        channel.mark(block_writer(2), 0x1000, 128);
        assert_eq!(channel.writer_of(0), block_writer(2));
        assert_eq!(channel.writer_of(1), block_writer(2));
        assert_eq!(channel.writer_of(2), WRITER_UNKNOWN);
        channel.mark(WRITER_HOST, 0x1040 + 8, 8);
        assert_eq!(channel.writer_of(1), WRITER_OTHER, "a Host write into a core's SQE");
        channel.mark(block_writer(2), 0x1000 + 8, 8);
        assert_eq!(channel.writer_of(0), block_writer(2), "the same writer again");
        channel.mark(WRITER_HOST, 0x0, 0x10000);
        assert!((0..4).all(|slot| channel.writer_of(slot) == WRITER_HOST));
        let (b7, host) = (Ringers::from(Doer::Block(7)), Ringers::from(Doer::Host));
        channel.consumed(channel.writer_of(0), b7, 1, None);
        channel.consumed(block_writer(70), b7, 1, None);
        channel.consumed(WRITER_OTHER, Ringers::of(&[Doer::Host, Doer::Block(7)]), 2, None);
        let seen = channel.snapshot();
        assert_eq!((seen.sqes_by_host, seen.sqes_unknown, seen.sqes_by_block), (1, 1, vec![(70, 1)]));
        // The log has the same three, in order, with their ringers and doorbell counts.
        let mut log = Vec::new();
        assert_eq!(channel.read_log(0, &mut log), (0, 3));
        let who: Vec<(Doer, Ringers, u64)> = log.iter().map(|sqe| (sqe.writer, sqe.ringers, sqe.doorbell)).collect();
        let both = Ringers::of(&[Doer::Block(7), Doer::Host]);
        assert_eq!(who, [(Doer::Host, b7, 1), (Doer::Block(70), b7, 1), (Doer::Unattributed, both, 2)]);
        assert_eq!(log[2].ringers.iter().collect::<Vec<_>>(), [Doer::Host, Doer::Block(7)]);
        assert!(host.contains(Doer::Host) && !host.contains(Doer::Block(7)));
        assert!(log.iter().all(|sqe| sqe.flag.is_none()));
    }

    #[test]
    fn a_ringer_set_names_each_doer_once_and_a_block_it_cannot_name_as_unattributed() {
        let set = Ringers::of(&[Doer::Block(47), Doer::Unattributed, Doer::Host, Doer::Block(0), Doer::Host]);
        assert_eq!(set.iter().collect::<Vec<_>>(), [Doer::Host, Doer::Block(0), Doer::Block(47), Doer::Unattributed]);
        assert_eq!(set.len(), 4);
        // An engine's write and a nameless caller are both unattributed: named once.
        let nameless = Ringers(Ringers::bit(WRITER_OTHER) | Ringers::bit(WRITER_UNKNOWN));
        assert_eq!(nameless.iter().collect::<Vec<_>>(), [Doer::Unattributed]);
        assert!(nameless.contains(Doer::Unattributed) && !nameless.contains(Doer::Host));
        assert_eq!(Ringers::from(Doer::Block(59)).iter().collect::<Vec<_>>(), [Doer::Block(59)]);
        assert_eq!(Ringers::from(Doer::Block(60)).iter().collect::<Vec<_>>(), [Doer::Unattributed]);
        assert!(Ringers::default().is_empty() && Ringers::default().iter().next().is_none());
    }

    #[test]
    fn a_take_has_every_ringer_since_the_previous_one_and_keeps_its_set_when_none_joined_since() {
        let joined = AtomicU64::new(0);
        let mut take = RingerTake::default();
        assert_eq!(take.current(), Ringers::from(Doer::Unattributed), "nothing taken yet");
        let ring = |origin: u32| joined.fetch_or(Ringers::bit(origin), Ordering::Relaxed);
        ring(WRITER_HOST);
        ring(block_writer(3));
        ring(block_writer(3));
        assert_eq!(take.take(&joined, 5), Ringers::of(&[Doer::Host, Doer::Block(3)]));
        ring(block_writer(3));
        assert_eq!(take.take(&joined, 5), Ringers::from(Doer::Block(3)), "only the rings since the previous take");
        // Rings counted after the take whose bits the previous take had: its set again.
        assert_eq!(take.take(&joined, 5), Ringers::from(Doer::Block(3)));
        assert_eq!(take.current(), Ringers::from(Doer::Block(3)));
        // The records were turned off or on since: the rings in between were not recorded.
        assert_eq!(take.take(&joined, 6), Ringers::from(Doer::Unattributed));
        ring(block_writer(3));
        assert_eq!(take.take(&joined, 6), Ringers::from(Doer::Block(3)));
        take.forget();
        assert_eq!(take.take(&joined, 6), Ringers::from(Doer::Unattributed), "after a reset, nobody recorded");
    }

    #[test]
    fn a_reset_forgets_who_wrote_each_slot() {
        let channel = ChannelProvenance::new(9, 0x1000, 4);
        channel.mark(block_writer(1), 0x1000, 256);
        channel.reset();
        assert!((0..4).all(|slot| channel.writer_of(slot) == WRITER_UNKNOWN));
        channel.mark(WRITER_HOST, 0x1040, 64);
        assert_eq!((channel.writer_of(0), channel.writer_of(1)), (WRITER_UNKNOWN, WRITER_HOST));
    }

    proptest::proptest! {
        /// `mark` against the rule it implements, slot by slot: a slot wholly inside the write takes the writer; a
        /// slot the write only touches keeps the writer if it is the same, else becomes unattributable.
        #[test]
        fn mark_follows_the_rule_slot_by_slot(
            writes in proptest::collection::vec((0u64..0x1400, 0u64..0x300, 0u32..4), 1..12),
        ) {
            let (base, depth) = (0x1000u64, 8u32);
            let channel = ChannelProvenance::new(9, base, depth);
            let mut model = vec![WRITER_UNKNOWN; depth as usize];
            let sqe = super::super::SQE_BYTES as u64;
            for (address, len, who) in writes {
                let writer = [WRITER_HOST, block_writer(0), block_writer(5), block_writer(70_000)][who as usize];
                // What the shadow keeps: an id above 16 bits as unattributable.
                let kept = if writer > u32::from(u16::MAX) { WRITER_OTHER } else { writer };
                channel.mark(writer, address, len);
                for (slot, cell) in model.iter_mut().enumerate() {
                    let (start, stop) = (base + slot as u64 * sqe, base + (slot as u64 + 1) * sqe);
                    if len == 0 || address >= stop || address + len <= start {
                        continue;
                    }
                    if address <= start && address + len >= stop {
                        *cell = kept;
                    } else if *cell != kept {
                        *cell = WRITER_OTHER;
                    }
                }
                let marked: Vec<u32> = (0..depth).map(|slot| channel.writer_of(slot)).collect();
                proptest::prop_assert_eq!(&marked, &model);
            }
        }

        /// The memo answers every write as a search of the whole list would: the SQs it overlaps, no more, no
        /// fewer, whatever the writes before it left in the memo.
        #[test]
        fn the_memo_finds_the_sqs_a_write_overlaps(
            layout in proptest::collection::vec((0u64..0x300, 1u64..0x300), 0..5),
            writes in proptest::collection::vec((0u64..0x1000, 1u64..0x200), 1..40),
        ) {
            // Ascending, disjoint SQs: each one starts a gap (possibly empty) after the previous one's end.
            let mut ranges = Vec::new();
            let mut at = 0;
            for (gap, len) in layout {
                ranges.push((at + gap, at + gap + len));
                at += gap + len;
            }
            let mut memo = Memo::default();
            for (address, len) in writes {
                let end = address + len;
                let expected: Vec<usize> =
                    (0..ranges.len()).filter(|&i| ranges[i].0 < end && address < ranges[i].1).collect();
                let found: Vec<usize> = memo.overlapping(&ranges, address, end).collect();
                proptest::prop_assert_eq!(&found, &expected, "write [{:#x}, {:#x}) in {:x?}", address, end, ranges);
            }
        }
    }

    #[test]
    fn the_log_names_a_flags_first_reader_when_read_and_says_where_it_starts_after_an_overrun() {
        let channel = Arc::new(ChannelProvenance::new(9, 0x1000, 4));
        let landing = channel.flag_landing(0x8008, 5);
        channel.consumed(block_writer(0), Ringers::from(Doer::Block(0)), 1, Some(landing));
        let mut log = Vec::new();
        channel.read_log(0, &mut log);
        assert_eq!(log[0].flag, Some(FlagReader::Unread), "landed, not read yet");
        let mut line = [0u8; 64];
        line[8..16].copy_from_slice(&5u64.to_le_bytes());
        channel.read(Reader::Core, 0x8000, &line);
        log.clear();
        assert_eq!(channel.read_log(0, &mut log), (0, 1));
        assert_eq!(log[0].flag, Some(FlagReader::Core));
        // A reader that fell more than LOG_CAPACITY behind is told where the kept entries start.
        for _ in 0..LOG_CAPACITY + 4 {
            channel.consumed(WRITER_HOST, Ringers::from(Doer::Host), 3, None);
        }
        log.clear();
        let (first, end) = channel.read_log(0, &mut log);
        assert_eq!((first, end, log.len() as u64), (5, LOG_CAPACITY + 5, LOG_CAPACITY));
        log.clear();
        assert_eq!(channel.read_log(end, &mut log), (end, end), "nothing new");
        assert!(log.is_empty());
    }

    #[test]
    fn a_flag_is_claimed_by_the_first_read_that_returns_its_value() {
        let channel = Arc::new(ChannelProvenance::new(9, 0x1000, 4));
        channel.flag_landing(0x8008, 5);
        let mut line = [0u8; 64];
        channel.read(Reader::Core, 0x8000, &line);
        assert_eq!(channel.snapshot().flags_seen_by_core, 0, "a read of the old value sees nothing");
        line[8..16].copy_from_slice(&5u64.to_le_bytes());
        channel.read(Reader::Host, 0x8010, &line[16..]);
        assert_eq!(channel.snapshot().flags_seen_by_host, 0, "a read not covering the word");
        channel.read(Reader::Host, 0x8000, &line);
        channel.read(Reader::Core, 0x8000, &line);
        let seen = channel.snapshot();
        assert_eq!(
            (seen.flags_landed, seen.flags_seen_by_host, seen.flags_seen_by_core, seen.flags_unseen),
            (1, 1, 0, 0)
        );
        channel.flag_landing(0x8008, 6);
        channel.flag_landing(0x8008, 7);
        line[8..16].copy_from_slice(&7u64.to_le_bytes());
        channel.read(Reader::Core, 0x8000, &line);
        let seen = channel.snapshot();
        assert_eq!((seen.flags_landed, seen.flags_seen_by_core, seen.flags_unseen), (3, 1, 1), "6 was overwritten");
    }
}
