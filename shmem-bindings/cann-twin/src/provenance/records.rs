//! What the provenance records name and report: the doers of an act ([`Doer`]), the readers of a flag, the set of
//! ringers a doorbell carries, one consumption-log entry ([`LoggedSqe`]) and the per-channel counts
//! ([`Provenance`]).

use std::sync::atomic::{AtomicU64, Ordering};

use super::writer::{
    block_writer, thread_writer, UNATTRIBUTED_BITS, WRITER_AICPU, WRITER_BLOCK0, WRITER_HOST, WRITER_OTHER,
    WRITER_UNKNOWN,
};

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
    pub(super) fn of(id: u32) -> Doer {
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
    pub(super) fn of_thread() -> Reader {
        if thread_writer() == WRITER_AICPU {
            Reader::AiCpu
        } else {
            Reader::Host
        }
    }

    /// Its code in a claim slot of the log (0: no claim).
    pub(super) fn code(self) -> u64 {
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
pub struct Ringers(pub(super) u64);

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
    /// `RECORDING_EPOCH` (module `watch`) at the last take.
    epoch: u64,
}

impl RingerTake {
    /// A take of the tail: swaps out the set the rings since the previous take joined (`joined`) and returns the
    /// ringers of the SQEs that tail exposes; `epoch` is [`recording_epoch`](super::recording_epoch) now.
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
