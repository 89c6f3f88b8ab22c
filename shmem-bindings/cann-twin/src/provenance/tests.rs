//! Unit tests of the provenance records: slot writers, ringer sets, resets and flag readers.

use super::records::Reader;
use super::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
        let sqe = SLOT_BYTES;
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
    assert_eq!((seen.flags_landed, seen.flags_seen_by_host, seen.flags_seen_by_core, seen.flags_unseen), (1, 1, 0, 0));
    channel.flag_landing(0x8008, 6);
    channel.flag_landing(0x8008, 7);
    line[8..16].copy_from_slice(&7u64.to_le_bytes());
    channel.read(Reader::Core, 0x8000, &line);
    let seen = channel.snapshot();
    assert_eq!((seen.flags_landed, seen.flags_seen_by_core, seen.flags_unseen), (3, 1, 1), "6 was overwritten");
}
