//! The occupancy counters of the SDMA engines through `control::occupancy`, with the engines reached as a kernel
//! would reach them (SQEs written H2D, doorbells rung with `register_write`, completion seen in the channel record).
//! The emulated cores' executing/polling split is tested in the crate (`kernel::tests`: the idle hints as the model
//! makes them) and with the real transfer kernel in the root crate's `tests/cann_on_twin.rs`.

mod common;

use core::ffi::c_void;
use std::time::{Duration, Instant};

use cann_twin::control::{self, ChannelOccupancy, DeviceOccupancy};
use cann_twin::register_write;
use common::{api, copy_sqe, download, malloc, pattern, sdma_workspace as workspace, upload};

const WAIT: Duration = Duration::from_secs(10);

/// A channel's head, SQ base and register base, read D2H from its record.
fn record(channel: u32) -> (u32, u64, u64) {
    let bytes = download(api(), (workspace() + 64 + 64 * u64::from(channel)) as *const c_void, 64);
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    (u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")), u64_at(8), u64_at(16))
}

fn channel_of(snapshot: &DeviceOccupancy, index: u32) -> ChannelOccupancy {
    snapshot.channels.iter().find(|channel| channel.index == index).copied().unwrap_or_else(|| {
        panic!("channel {index} is not reported: {snapshot:?}");
    })
}

#[test]
fn a_channel_that_copies_megabytes_is_busy_and_one_never_rung_is_not() {
    let (busy, idle) = (3, 4);
    workspace();
    let mib = 1usize << 20;
    let len = 8 * mib;
    let data = pattern(len, 3);
    let (src, dst) = (malloc(api(), len) as u64, malloc(api(), len) as u64);
    upload(api(), src as *mut c_void, &data);
    let (head, sq_base, reg_base) = record(busy);
    let before = control::occupancy(0);
    for i in 0..8u64 {
        let sqe = copy_sqe(src + i * mib as u64, dst + i * mib as u64, mib as u32);
        upload(api(), (sq_base + 64 * (u64::from(head) + i)) as *mut c_void, &sqe);
    }
    let tail = head + 8;
    register_write(reg_base + 8, &tail.to_le_bytes()).expect("the doorbell write is accepted");
    let started = Instant::now();
    while record(busy).0 != tail {
        assert!(started.elapsed() < WAIT, "channel {busy} never reached head {tail}");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(download(api(), dst as *const c_void, len), data, "the copies landed");
    let after = control::occupancy(0);
    // The run ended before the head was published: nothing of it is still open.
    std::thread::sleep(Duration::from_millis(20));
    let later = control::occupancy(0);
    let wall = after.taken_at_ns - before.taken_at_ns;
    let (b0, b1, b2) = (channel_of(&before, busy), channel_of(&after, busy), channel_of(&later, busy));
    let busy_ns = b1.busy_ns - b0.busy_ns;
    assert_eq!(b1.sqes - b0.sqes, 8, "{b0:?} -> {b1:?}");
    assert!(b1.runs > b0.runs && !b1.running, "{b0:?} -> {b1:?}");
    // Copying 8 MiB takes more than a microsecond, and the run lies between the two snapshots.
    assert!(busy_ns > 1_000 && busy_ns <= wall, "busy {busy_ns} ns of {wall} ns");
    assert_eq!(b2.busy_ns, b1.busy_ns, "an engine waiting for its next doorbell is not busy");
    let (i0, i1) = (channel_of(&before, idle), channel_of(&later, idle));
    assert_eq!((i1.busy_ns, i1.runs, i1.sqes), (i0.busy_ns, i0.runs, i0.sqes), "channel {idle} was never rung");
    assert!(later.since_ns <= before.taken_at_ns && later.wall_ns() >= wall);
}

#[test]
fn a_device_never_used_reports_nothing_and_its_clock_starts() {
    let first = control::occupancy(6);
    std::thread::sleep(Duration::from_millis(2));
    let second = control::occupancy(6);
    assert!(first.cores.is_empty() && first.channels.is_empty(), "{first:?}");
    assert_eq!(second.since_ns, first.since_ns);
    assert!(second.wall_ns() >= 2_000_000 && second.device == 6, "{second:?}");
}
