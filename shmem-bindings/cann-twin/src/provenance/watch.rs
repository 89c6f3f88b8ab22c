//! The process-wide side of the records: turning them on and off, the list of watched channels (published to
//! every thread's cached copy), the thread marks that name a writer, and the hooks the memory model calls on each
//! write and read (the hot path the module docs describe).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use super::channel::{flags_pending, ChannelProvenance};
use super::records::Reader;
use super::writer::thread_writer;

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

/// Bumped by every turn of the records on or off ([`RingerTake`](super::RingerTake): rings between two takes of a tail were recorded
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

thread_local! {
    /// This thread's copy of the watch list and the generation it was taken at.
    static CACHED: RefCell<Cached> = RefCell::new(Cached::default());
}

pub(crate) fn watch_channels(channels: &[Arc<ChannelProvenance>]) {
    let mut watches = WATCHES.write().unwrap_or_else(|p| p.into_inner());
    let mut next: Vec<_> = watches.channels.to_vec();
    next.extend(channels.iter().cloned());
    publish(&mut watches, next);
}

/// Stops watching these channels' SQs (a device's SDMA channels when its engines go, a twin NIC QP's when the QP
/// is destroyed); the other channels of the same device stay watched.
pub(crate) fn unwatch_channels(channels: &[Arc<ChannelProvenance>]) {
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
    super::qp::read(device, reader, address, data);
    if !flags_pending() {
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

    proptest::proptest! {
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
}
