//! Provenance records of the twin NIC's queue pairs: who wrote each WQE the NIC took from a QP's SQ, who rang the SQ
//! doorbell that exposed it, and who first read the CQE the NIC wrote for it. The same records, log and tallies as an
//! SDMA channel's ([`crate::provenance`]), made where each act happens:
//!
//! - the SQ is watched like an SDMA channel's (64-byte slots): a core's DMA into it, or a Host write, marks the slots
//!   it covers with its writer, and the NIC reads a slot's writer when it takes the WQE;
//! - an accepted SQ doorbell records its origin (the ringing core's block, the Host's test-only path, or a caller the
//!   twin cannot name); a WQE's ringers are those of every SQ doorbell since the NIC's previous take of a WQE that
//!   found new doorbells ([`records::RingerTake`]);
//! - the NIC counts each CQE as a landing and logs the WQE before it writes the CQE (a reader that sees the CQE finds
//!   the entry); the first read that covers the CQE's first 8 bytes and returns them claims it: a core's line fill or
//!   GM -> UB DMA, or a Host runtime copy.
//!
//! Each QP has its own log, in WQE order (the NIC completes a QP's WQEs in order); an unsignaled WQE has no CQE.
//! [`crate::control::qp_log`] and [`crate::control::qp_provenance`] read them.
//!
//! Each is recorded only while the records are on ([`crate::provenance::recording`]; the NIC's callers test it).
//!
//! The hot path: a read checks one atomic counter (no CQE waits to be read: done), then the calling thread's cached
//! list of QPs, a range test per QP and for a hit the one or two CQ slots it covers.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use super::channel::ChannelProvenance;
use super::records::{Reader, RingerTake, Ringers};
#[cfg(test)]
use super::{self as records};

/// The records of one QP.
#[derive(Debug)]
pub(crate) struct QpProvenance {
    pub device: i32,
    /// The SQ's slot writers, the log of taken WQEs and the tallies (WQEs as "SQEs", CQEs as "flags").
    pub records: Arc<ChannelProvenance>,
    cq_base: u64,
    cq_depth: u32,
    /// Per CQ slot: 0, or the landing sequence of the CQE written there and not yet read.
    cqe_key: Box<[AtomicU64]>,
    /// Per CQ slot: the first 8 bytes of that CQE.
    cqe_value: Box<[AtomicU64]>,
    /// CQEs waiting for their first read.
    pending: AtomicU32,
    /// Accepted SQ doorbells (while the records are off too).
    doorbells: AtomicU64,
    /// Who rang since the NIC's last take that found new doorbells ([`Ringers`] bits).
    ringers: AtomicU64,
    /// The NIC's side (its engine thread's): the doorbell count at its last take and the set it took then.
    take: Mutex<(u64, RingerTake)>,
}

/// CQ bytes per CQE (docs/rdma.md section 3; `nic::CQE_BYTES`, which checks it).
pub(crate) const CQE_BYTES: u64 = 32;

impl QpProvenance {
    pub(crate) fn new(device: i32, sq_base: u64, sq_depth: u32, cq_base: u64, cq_depth: u32) -> Self {
        let cells = |n: u32| (0..n).map(|_| AtomicU64::new(0)).collect::<Box<[AtomicU64]>>();
        QpProvenance {
            device,
            records: Arc::new(ChannelProvenance::new(device, sq_base, sq_depth)),
            cq_base,
            cq_depth,
            cqe_key: cells(cq_depth),
            cqe_value: cells(cq_depth),
            pending: AtomicU32::new(0),
            doorbells: AtomicU64::new(0),
            ringers: AtomicU64::new(0),
            take: Mutex::default(),
        }
    }

    /// An accepted SQ doorbell by `origin`, counted; its origin is recorded if `recorded` (the records are on).
    pub(crate) fn rung(&self, origin: u32, recorded: bool) {
        if recorded {
            self.ringers.fetch_or(Ringers::bit(origin), Ordering::Relaxed);
            self.records.rung(origin);
        }
        self.doorbells.fetch_add(1, Ordering::Release);
    }

    /// Who wrote the WQE at SQ index `index` last, who rang the doorbells since the NIC's previous take that found
    /// new ones, and the doorbell count: read by the NIC (its engine thread) when it takes the WQE.
    pub(crate) fn taken(&self, index: u32, depth: u32) -> Taken {
        let doorbell = self.doorbells.load(Ordering::Acquire);
        let mut take = self.take.lock().unwrap_or_else(|p| p.into_inner());
        let ringers = if take.0 == doorbell {
            take.1.current()
        } else {
            take.0 = doorbell;
            take.1.take(&self.ringers, super::watch::recording_epoch())
        };
        Taken { writer: self.records.writer_of(index & (depth - 1)), ringers, doorbell }
    }

    /// A taken WQE completed without a CQE (unsignaled, or its CQE was lost): logged and tallied.
    pub(crate) fn completed(&self, taken: Taken) {
        self.records.consumed(taken.writer, taken.ringers, taken.doorbell, None);
    }

    /// The NIC is about to write CQE `first_word ..` at producer index `producer` for the taken WQE: logged with
    /// its landing before the write, so that a reader that sees the CQE finds both.
    pub(crate) fn cqe_landing(&self, taken: Taken, producer: u32, first_word: u64) {
        let sequence = self.records.next_landing();
        let slot = (producer & (self.cq_depth - 1)) as usize;
        self.cqe_value[slot].store(first_word, Ordering::Relaxed);
        // A CQE still unread in this slot was one lap ago: the CQ cannot hold it any more (counted unseen).
        if self.cqe_key[slot].swap(sequence, Ordering::AcqRel) == 0 {
            self.pending.fetch_add(1, Ordering::AcqRel);
            PENDING.fetch_add(1, Ordering::AcqRel);
        }
        self.records.consumed(taken.writer, taken.ringers, taken.doorbell, Some(sequence));
    }

    /// A read of `[address, address + data.len())` that returned `data`: claims each CQE it covers whose first 8
    /// bytes it returned.
    fn read(&self, reader: Reader, address: u64, data: &[u8]) {
        if self.pending.load(Ordering::Acquire) == 0 {
            return;
        }
        let end = address.saturating_add(data.len() as u64);
        let cq_end = self.cq_base + u64::from(self.cq_depth) * CQE_BYTES;
        if end <= self.cq_base || address >= cq_end {
            return;
        }
        let first = address.max(self.cq_base).saturating_sub(self.cq_base).div_ceil(CQE_BYTES);
        for slot in first..u64::from(self.cq_depth) {
            let at = self.cq_base + slot * CQE_BYTES;
            if at + 8 > end {
                break;
            }
            let key = self.cqe_key[slot as usize].load(Ordering::Acquire);
            if key == 0 {
                continue;
            }
            let offset = (at - address) as usize;
            let word = u64::from_le_bytes(data[offset..offset + 8].try_into().expect("8 bytes"));
            if word != self.cqe_value[slot as usize].load(Ordering::Relaxed) {
                continue;
            }
            if self.cqe_key[slot as usize].compare_exchange(key, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                self.pending.fetch_sub(1, Ordering::AcqRel);
                PENDING.fetch_sub(1, Ordering::AcqRel);
                self.records.claim(key, reader);
            }
        }
    }

    /// Drops the CQEs waiting to be read (the QP is destroyed: they count as unseen).
    fn forget_pending(&self) {
        for key in self.cqe_key.iter() {
            if key.swap(0, Ordering::AcqRel) != 0 {
                self.pending.fetch_sub(1, Ordering::AcqRel);
                PENDING.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// What the NIC read about a WQE when it took it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Taken {
    writer: u32,
    ringers: Ringers,
    doorbell: u64,
}

/// Every live QP's records (their CQ ranges are what reads are matched against).
static QPS: LazyLock<RwLock<Arc<Vec<Arc<QpProvenance>>>>> = LazyLock::new(RwLock::default);
/// Bumped under [`QPS`]' write lock by every change of it.
static GENERATION: AtomicU64 = AtomicU64::new(1);
/// CQEs waiting for their first read, process-wide (0: every read is done after one load).
static PENDING: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static CACHED: RefCell<(u64, Arc<Vec<Arc<QpProvenance>>>)> = RefCell::new((0, Arc::default()));
}

/// Starts the records of a new QP: its SQ is watched for writes, its CQ for reads.
pub(crate) fn watch(qp: &Arc<QpProvenance>) {
    super::watch::watch_channels(std::slice::from_ref(&qp.records));
    let mut qps = QPS.write().unwrap_or_else(|p| p.into_inner());
    let mut next = qps.to_vec();
    next.push(Arc::clone(qp));
    *qps = Arc::new(next);
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Ends the records of a destroyed QP (its log stays readable through whoever holds it).
pub(crate) fn unwatch(qp: &Arc<QpProvenance>) {
    super::watch::unwatch_channels(std::slice::from_ref(&qp.records));
    let mut qps = QPS.write().unwrap_or_else(|p| p.into_inner());
    let next: Vec<_> = qps.iter().filter(|held| !Arc::ptr_eq(held, qp)).cloned().collect();
    *qps = Arc::new(next);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    drop(qps);
    qp.forget_pending();
}

/// A read by `reader` that returned `data` from `[address, ..)`: a core of `device` (`Some`), or a runtime copy of a
/// Host or AI-CPU thread (`None`).
pub(crate) fn read(device: Option<i32>, reader: Reader, address: u64, data: &[u8]) {
    if PENDING.load(Ordering::Relaxed) == 0 {
        return;
    }
    let generation = GENERATION.load(Ordering::Acquire);
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != generation {
            *cached = (generation, QPS.read().unwrap_or_else(|p| p.into_inner()).clone());
        }
        for qp in cached.1.iter() {
            if device.is_none_or(|device| device == qp.device) {
                qp.read(reader, address, data);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cqe_is_claimed_by_the_first_read_that_returns_its_first_word_and_the_log_names_the_reader() {
        let qp = QpProvenance::new(7, 0x10_0000, 4, 0x20_0000, 4);
        qp.records.mark(records::block_writer(1), 0x10_0040, 64);
        qp.rung(records::block_writer(1), true);
        let taken = qp.taken(1, 4);
        qp.cqe_landing(taken, 5, 0xABCD);
        // A line of the CQ: CQE slot 1 (producer 5 of depth 4) is its bytes 32..40.
        let mut line = [0u8; 64];
        qp.read(Reader::Core, 0x20_0000, &line);
        assert_eq!(qp.records.snapshot().flags_seen_by_core, 0, "a read of the old bytes claims nothing");
        line[32..40].copy_from_slice(&0xABCDu64.to_le_bytes());
        qp.read(Reader::Host, 0x20_0000 + 8, &line[8..]);
        qp.read(Reader::Core, 0x20_0000, &line);
        let seen = qp.records.snapshot();
        assert_eq!((seen.flags_landed, seen.flags_seen_by_host, seen.flags_seen_by_core), (1, 1, 0), "Host first");
        let mut log = Vec::new();
        qp.records.read_log(0, &mut log);
        assert_eq!(log.len(), 1);
        let entry = log[0];
        let b1 = records::Doer::Block(1);
        assert_eq!((entry.writer, entry.ringers, entry.doorbell), (b1, Ringers::from(b1), 1));
        assert_eq!(entry.flag, Some(records::FlagReader::Host));
        qp.completed(qp.taken(2, 4));
        log.clear();
        qp.records.read_log(1, &mut log);
        assert_eq!((log[0].writer, log[0].flag), (records::Doer::Unattributed, None), "never written, no CQE");
    }

    #[test]
    fn a_wqe_exposed_by_two_doorbells_before_the_nic_took_it_names_both_ringers() {
        let qp = QpProvenance::new(7, 0x10_0000, 4, 0x20_0000, 4);
        let b1 = records::Doer::Block(1);
        qp.rung(records::WRITER_HOST, true);
        qp.rung(records::block_writer(1), true);
        qp.completed(qp.taken(0, 4));
        // The next WQE, taken with no doorbell since: the same doorbell; then one rung by the core alone.
        qp.completed(qp.taken(1, 4));
        qp.rung(records::block_writer(1), true);
        qp.completed(qp.taken(2, 4));
        // One by the AI CPU.
        qp.rung(records::WRITER_AICPU, true);
        qp.completed(qp.taken(3, 4));
        let mut log = Vec::new();
        qp.records.read_log(0, &mut log);
        let who: Vec<(Ringers, u64)> = log.iter().map(|entry| (entry.ringers, entry.doorbell)).collect();
        let both = Ringers::of(&[records::Doer::Host, b1]);
        let aicpu = Ringers::from(records::Doer::AiCpu);
        assert_eq!(who, [(both, 2), (both, 2), (Ringers::from(b1), 3), (aicpu, 4)]);
        let seen = qp.records.snapshot();
        assert_eq!((seen.doorbells_by_host, seen.doorbells_by_aicpu), (1, 1), "each ring tallied once: {seen:?}");
    }

    #[test]
    fn turning_the_records_on_forgets_who_wrote_each_wqe_slot_and_turning_them_on_again_does_not() {
        let was = records::recording();
        let (sq, cq) = (0x7100_0000, 0x7200_0000);
        let qp = Arc::new(QpProvenance::new(7, sq, 4, cq, 4));
        watch(&qp);
        records::set_recording(true);
        qp.records.mark(records::WRITER_HOST, sq, 128);
        records::set_recording(true);
        assert_eq!(qp.records.writer_of(0), records::WRITER_HOST, "on while on: nothing was written unmarked");
        // Off, then on: a write made meanwhile was not marked, so the slot's writer from before is forgotten.
        records::set_recording(false);
        records::set_recording(true);
        let unknown = records::WRITER_UNKNOWN;
        assert_eq!((qp.records.writer_of(0), qp.records.writer_of(1)), (unknown, unknown));
        unwatch(&qp);
        records::set_recording(was);
    }
}
