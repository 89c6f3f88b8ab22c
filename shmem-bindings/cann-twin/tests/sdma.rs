//! The SDMA engines through the tables, as the `cann` backend and a kernel would reach them: SHMEM initialised with
//! SDMA once for the process, the workspace read with `aclrtMemcpy`, SQEs written into an SQ with `aclrtMemcpy`
//! H2D, doorbells rung with `register_write`, completion seen only in the channel record (D2H). Each test uses its
//! own channels, so the tests can run side by side.

mod common;

use core::ffi::c_void;
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;
use cann_twin::control::{self, ControlError, RegisterAccess, Syndrome};
use cann_twin::{register_write, RegisterFault};
use common::{api, download, malloc, pattern, sdma_workspace as workspace, upload};

const WAIT: Duration = Duration::from_secs(10);

/// A channel's record, read D2H from the workspace; the fields decoded here at the documented offsets.
#[derive(Clone, Copy, Debug)]
struct Record {
    head: u32,
    sq_base: u64,
    reg_base: u64,
    depth: u32,
    sq_id: u32,
}

fn record(channel: u32) -> Record {
    let bytes = download(api(), (workspace() + 64 + 64 * u64::from(channel)) as *const c_void, 64);
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    Record { head: u32_at(0), sq_base: u64_at(8), reg_base: u64_at(16), depth: u32_at(24), sq_id: u32_at(28) }
}

/// [`common::copy_sqe`] with type `kind` and opcode `opcode` (bits 7:0 of the word at offset 16).
fn sqe(kind: u16, opcode: u8, src: u64, dst: u64, length: u32) -> [u8; 64] {
    let mut raw = common::copy_sqe(src, dst, length);
    raw[0..2].copy_from_slice(&kind.to_le_bytes());
    raw[16] = opcode;
    raw
}

fn copy_sqe(src: *mut c_void, dst: *mut c_void, length: u32) -> [u8; 64] {
    sqe(11, 0, src as u64, dst as u64, length)
}

/// Writes `entries` into the channel's SQ from `slot` on (H2D).
fn post(record: &Record, slot: u32, entries: &[[u8; 64]]) {
    for (i, entry) in entries.iter().enumerate() {
        let at = record.sq_base + 64 * u64::from((slot + i as u32) % record.depth);
        upload(api(), at as *mut c_void, entry);
    }
}

fn ring(record: &Record, tail: u32) {
    register_write(record.reg_base + 8, &tail.to_le_bytes()).expect("a 4-byte doorbell write at 0x8 is accepted");
}

fn wait_head(channel: u32, head: u32) -> Record {
    let started = Instant::now();
    loop {
        let now = record(channel);
        if now.head == head {
            return now;
        }
        assert!(started.elapsed() < WAIT, "channel {channel}: head {} never reached {head}", now.head);
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn wait_exception(channel: u32) -> control::ChannelException {
    let started = Instant::now();
    loop {
        if let Some(exception) = control::channel_exception(0, channel).expect("channel exists") {
            return exception;
        }
        assert!(started.elapsed() < WAIT, "channel {channel} never stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_workspace_has_the_header_and_a_record_per_channel() {
    let workspace = workspace();
    let bytes = download(api(), workspace as *const c_void, 64 + 48 * 64);
    let flag = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    let queues = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    assert_ne!(flag, 0, "the records are marked filled");
    assert_eq!(queues, 48);
    let mut bases = std::collections::HashSet::new();
    for channel in 0..48 {
        let record = record(channel);
        assert_eq!(record.sq_id, channel);
        assert!(record.depth >= 2 && record.depth.is_power_of_two(), "depth {}", record.depth);
        assert!(record.sq_base != 0 && record.sq_base % 64 == 0);
        assert!(record.reg_base != 0 && record.reg_base % 4096 == 0);
        assert!(bases.insert(record.sq_base) && bases.insert(record.reg_base), "distinct rings and pages");
        let mut sq = [0u8; 64];
        let code = common::memcpy(
            api(),
            sq.as_mut_ptr().cast(),
            64,
            record.sq_base as *const c_void,
            64,
            ACL_MEMCPY_DEVICE_TO_HOST,
        );
        assert_eq!(code, ACL_SUCCESS, "the SQ ring is device memory");
        // A register page is not memory: a copy from it is refused.
        let code = common::memcpy(
            api(),
            sq.as_mut_ptr().cast(),
            4,
            record.reg_base as *const c_void,
            4,
            ACL_MEMCPY_DEVICE_TO_HOST,
        );
        assert_ne!(code, ACL_SUCCESS, "a copy reads a register page");
    }
    // The workspace is 16 KiB of device memory.
    let tail = download(api(), (workspace + (16 << 10) - 64) as *const c_void, 64);
    assert_eq!(tail.len(), 64);
    let mut beyond = [0u8; 1];
    let past = (workspace + (16 << 10)) as *const c_void;
    assert_ne!(common::memcpy(api(), beyond.as_mut_ptr().cast(), 1, past, 1, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
}

#[test]
fn copy_sqes_and_a_flag_sqe_execute_in_order_after_one_doorbell() {
    let channel = 0;
    workspace();
    let len = (2 << 20) + 4096;
    let data = pattern(len, 7);
    let (src, dst) = (malloc(api(), len), malloc(api(), len));
    upload(api(), src, &data);
    let flags = malloc(api(), 64);
    let flag_value = 0xdead_beef_cafe_f00du64;
    upload(api(), flags, &flag_value.to_le_bytes());
    let at = |base: *mut c_void, offset: usize| (base as usize + offset) as *mut c_void;
    let record = record(channel);
    assert_eq!(record.head, 0);
    post(
        &record,
        0,
        &[
            copy_sqe(src, dst, 1 << 20),
            copy_sqe(at(src, 1 << 20), at(dst, 1 << 20), 1 << 20),
            copy_sqe(at(src, 2 << 20), at(dst, 2 << 20), 4096),
            copy_sqe(flags, at(flags, 8), 8),
        ],
    );
    assert_eq!(control::doorbells_rung(0, channel), Ok(0));
    ring(&record, 4);
    wait_head(channel, 4);
    assert_eq!(download(api(), dst, len), data, "the three copies landed");
    assert_eq!(download(api(), at(flags, 8), 8), flag_value.to_le_bytes(), "the flag SQE copied its 8 bytes");
    assert_eq!(control::sqes_executed(0, channel), Ok(4));
    assert_eq!(control::doorbells_rung(0, channel), Ok(1));
    assert_eq!(control::channel_exception(0, channel), Ok(None));
}

/// Posts good, bad, good at slots head..head+3, rings once, and checks the stop, the raw SQE and the reset.
fn bad_sqe_stops_the_channel(channel: u32, bad: impl FnOnce(*mut c_void, *mut c_void) -> [u8; 64], syndrome: Syndrome) {
    workspace();
    let data = pattern(4096, channel as u8);
    let (src, dst_first, dst_last) = (malloc(api(), 4096), malloc(api(), 4096), malloc(api(), 4096));
    upload(api(), src, &data);
    let record = record(channel);
    let head = record.head;
    let bad = bad(src, dst_last);
    post(&record, head, &[copy_sqe(src, dst_first, 4096), bad, copy_sqe(src, dst_last, 4096)]);
    let tail = head + 3;
    ring(&record, tail);
    let exception = wait_exception(channel);
    assert_eq!(exception.syndrome, syndrome, "channel {channel}");
    assert_eq!(
        (exception.channel, exception.sq_id, exception.head, exception.tail),
        (channel, record.sq_id, head + 1, tail)
    );
    assert_eq!(exception.sqe, bad, "the raw SQE is reported");
    assert_eq!(exception.register, None);
    assert_eq!(record_head(channel), head + 1, "the head stops at the bad SQE");
    assert_eq!(download(api(), dst_first, 4096), data, "the SQE before it ran");
    assert_eq!(download(api(), dst_last, 4096), vec![0; 4096], "nothing after it ran");
    assert_eq!(control::sqes_executed(0, channel), Ok(1));

    // Reset drops the pending SQEs and clears the exception; the channel runs again.
    control::reset_channel(0, channel).expect("reset");
    assert_eq!(control::channel_exception(0, channel), Ok(None));
    assert_eq!(record_head(channel), tail, "head := tail");
    assert_eq!(download(api(), dst_last, 4096), vec![0; 4096], "the dropped SQE never ran");
    post(&record, tail, &[copy_sqe(src, dst_last, 4096)]);
    ring(&record, tail + 1);
    wait_head(channel, tail + 1);
    assert_eq!(download(api(), dst_last, 4096), data);
    assert_eq!(control::sqes_executed(0, channel), Ok(2));
}

fn record_head(channel: u32) -> u32 {
    record(channel).head
}

#[test]
fn a_wrong_type_stops_the_channel() {
    bad_sqe_stops_the_channel(1, |src, dst| sqe(6, 0, src as u64, dst as u64, 4096), Syndrome::BAD_TYPE);
}

#[test]
fn a_wrong_opcode_stops_the_channel() {
    bad_sqe_stops_the_channel(2, |src, dst| sqe(11, 1, src as u64, dst as u64, 4096), Syndrome::BAD_OPCODE);
}

/// A copy SQE whose other control fields are not SHMEM's for a copy: one field changed at a time.
#[test]
fn a_copy_sqe_with_other_control_fields_stops_the_channel() {
    let changed = |channel: u32, at: usize, value: u8| {
        bad_sqe_stops_the_channel(
            channel,
            move |src, dst| {
                let mut raw = copy_sqe(src, dst, 4096);
                raw[at] = value;
                raw
            },
            Syndrome::BAD_FIELDS,
        )
    };
    changed(20, 14, 0); // kernel_credit 0 instead of 240
    changed(21, 15, 1); // ptr_mode 1
    changed(22, 17, 0); // the opcode word's sssv..dns bits and the low QoS bits cleared
    changed(23, 18, 1); // sro set
    changed(24, 48, 1); // link_type 1: neither SHMEM's 255 nor HiXL's on-chip 0
}

/// `link_type` 0 (on-chip, as HiXL's AI-CPU SQEs set it) is accepted as well as SHMEM's 255: the copy runs.
#[test]
fn an_on_chip_copy_sqe_runs() {
    workspace();
    let channel = 25;
    let data = pattern(4096, 25);
    let (src, dst) = (malloc(api(), 4096), malloc(api(), 4096));
    upload(api(), src, &data);
    let record = record(channel);
    let mut onchip = copy_sqe(src, dst, 4096);
    onchip[48] = 0;
    post(&record, record.head, &[onchip]);
    ring(&record, record.head + 1);
    wait_head(channel, record.head + 1);
    assert_eq!(control::channel_exception(0, channel), Ok(None));
    assert!(download(api(), dst, 4096) == data, "the on-chip copy landed");
}

#[test]
fn length_zero_stops_the_channel() {
    bad_sqe_stops_the_channel(3, |src, dst| copy_sqe(src, dst, 0), Syndrome::BAD_LENGTH);
}

#[test]
fn a_length_above_one_mib_stops_the_channel() {
    bad_sqe_stops_the_channel(4, |src, dst| copy_sqe(src, dst, (1 << 20) + 1), Syndrome::BAD_LENGTH);
}

#[test]
fn a_source_past_its_allocation_stops_the_channel() {
    // 4096 bytes from 64 bytes before the end of a 4096-byte allocation.
    bad_sqe_stops_the_channel(
        5,
        |src, dst| copy_sqe((src as usize + 4032) as *mut c_void, dst, 4096),
        Syndrome::SRC_FAULT,
    );
}

#[test]
fn an_unmapped_destination_stops_the_channel() {
    // The guard page after a 4096-byte allocation is not allocated.
    bad_sqe_stops_the_channel(
        6,
        |src, dst| copy_sqe(src, (dst as usize + 4096) as *mut c_void, 64),
        Syndrome::DST_FAULT,
    );
}

#[test]
fn a_host_address_is_not_a_device_address_for_the_engine() {
    let host = vec![0u8; 4096];
    bad_sqe_stops_the_channel(11, move |src, _| copy_sqe(src, host.as_ptr() as *mut c_void, 64), Syndrome::DST_FAULT);
}

/// A refused register write: an exception naming offset and width, nothing rung, nothing executed.
fn refused_register_write(channel: u32, offset: u64, bytes: &[u8]) {
    workspace();
    let data = pattern(4096, 99);
    let (src, dst) = (malloc(api(), 4096), malloc(api(), 4096));
    upload(api(), src, &data);
    let record = record(channel);
    assert_eq!(record.head, 0);
    post(&record, 0, &[copy_sqe(src, dst, 4096)]);
    let refused = register_write(record.reg_base + offset, bytes);
    assert_eq!(
        refused,
        Err(RegisterFault::Refused { device: 0, channel, offset, width: bytes.len() }),
        "a {}-byte write at {offset:#x}",
        bytes.len()
    );
    let exception = control::channel_exception(0, channel).expect("channel").expect("an exception is raised");
    assert_eq!(exception.syndrome, Syndrome::REGISTER_ACCESS);
    assert_eq!(exception.register, Some(RegisterAccess { offset, width: bytes.len() }));
    assert_eq!(exception.channel, channel);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(control::doorbells_rung(0, channel), Ok(0), "nothing rang");
    assert_eq!(control::sqes_executed(0, channel), Ok(0));
    assert_eq!(record_head(channel), 0);
    assert_eq!(download(api(), dst, 4096), vec![0; 4096]);

    // After a reset the right write rings.
    control::reset_channel(0, channel).expect("reset");
    ring(&record, 1);
    wait_head(channel, 1);
    assert_eq!(download(api(), dst, 4096), data);
    assert_eq!(control::doorbells_rung(0, channel), Ok(1));
}

#[test]
fn a_32_byte_doorbell_write_is_refused_and_does_not_ring() {
    // What `copy_ubuf_to_gm(.., 1, 1, ..)` writes: one burst of 32 bytes, the tail in the first four.
    let mut burst = [0u8; 32];
    burst[0..4].copy_from_slice(&1u32.to_le_bytes());
    refused_register_write(7, 8, &burst);
}

#[test]
fn a_doorbell_write_at_offset_0_is_refused_and_does_not_ring() {
    refused_register_write(8, 0, &1u32.to_le_bytes());
}

#[test]
fn the_c_register_write_reports_refusals_and_non_registers() {
    let record = record(12);
    let burst = [0u8; 32];
    let tail = 0u32.to_le_bytes();
    let heap = malloc(api(), 64) as u64;
    // SAFETY: every source is a live local of the given length.
    unsafe {
        assert_eq!(cann_twin::aiv_twin_register_write(record.reg_base + 8, burst.as_ptr(), 32), -2);
        assert_eq!(cann_twin::aiv_twin_register_write(heap, tail.as_ptr(), 4), -1, "heap memory is no register");
        assert_eq!(cann_twin::aiv_twin_register_write(record.reg_base + 8, core::ptr::null(), 4), -3);
    }
    control::reset_channel(0, 12).expect("reset");
    // SAFETY: as above.
    assert_eq!(unsafe { cann_twin::aiv_twin_register_write(record.reg_base + 8, tail.as_ptr(), 4) }, 0);
    assert_eq!(control::doorbells_rung(0, 12), Ok(1));
}

#[test]
fn a_stalled_channel_executes_nothing_until_released() {
    let channel = 9;
    workspace();
    let data = pattern(4096, 9);
    let (src, dst) = (malloc(api(), 4096), malloc(api(), 4096));
    upload(api(), src, &data);
    let record = record(channel);
    control::set_stalled(0, channel, true).expect("stall");
    post(&record, 0, &[copy_sqe(src, dst, 4096)]);
    ring(&record, 1);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(record_head(channel), 0);
    assert_eq!(control::sqes_executed(0, channel), Ok(0));
    assert_eq!(control::doorbells_rung(0, channel), Ok(1));
    control::set_stalled(0, channel, false).expect("release");
    wait_head(channel, 1);
    assert_eq!(download(api(), dst, 4096), data);
}

#[test]
fn a_tail_outside_the_ring_stops_the_channel() {
    let channel = 10;
    workspace();
    let record = record(channel);
    ring(&record, record.depth);
    let exception = wait_exception(channel);
    assert_eq!(exception.syndrome, Syndrome::BAD_TAIL);
    assert_eq!((exception.head, exception.tail), (0, record.depth));
    control::reset_channel(0, channel).expect("reset");
    assert_eq!(control::channel_exception(0, channel), Ok(None));
    assert_eq!(record_head(channel), 0, "depth % depth");
}

#[test]
fn the_control_api_names_missing_channels() {
    workspace();
    assert_eq!(control::sqes_executed(0, 48), Err(ControlError::NoSuchChannel { device: 0, channel: 48 }));
    assert_eq!(control::reset_channel(3, 0), Err(ControlError::NoSuchChannel { device: 3, channel: 0 }));
}

/// Not a pass/fail test: engine copy throughput against a Host `memcpy` of the same bytes, printed
/// (`cargo test -p cann-twin --release --test sdma -- --ignored --nocapture`).
#[test]
#[ignore]
fn engine_throughput_against_memcpy() {
    let channel = 40;
    workspace();
    for sqe_bytes in [64 << 10, 256 << 10, 1 << 20] {
        let total = 64 << 20;
        let count = (total / sqe_bytes) as u32;
        let (src, dst) = (malloc(api(), total), malloc(api(), total));
        upload(api(), src, &pattern(total, 3));
        let mut engine = Duration::ZERO;
        // Two rounds: the first touches the pages (memfd page faults), the second is measured.
        for _ in 0..2 {
            let record = record(channel);
            let head = record.head;
            let entries: Vec<[u8; 64]> = (0..count as usize)
                .map(|i| {
                    let at = |base: *mut c_void| (base as usize + i * sqe_bytes) as *mut c_void;
                    copy_sqe(at(src), at(dst), sqe_bytes as u32)
                })
                .collect();
            post(&record, head, &entries);
            let started = Instant::now();
            ring(&record, (head + count) % record.depth);
            wait_head(channel, (head + count) % record.depth);
            engine = started.elapsed();
        }
        let mut device_copy = Duration::ZERO;
        for _ in 0..2 {
            let started = Instant::now();
            let code = common::memcpy(api(), dst, total, src, total, ACL_MEMCPY_DEVICE_TO_DEVICE);
            device_copy = started.elapsed();
            assert_eq!(code, ACL_SUCCESS);
        }
        let (a, mut b) = (pattern(total, 3), vec![1u8; total]);
        let mut host = Duration::ZERO;
        for _ in 0..2 {
            let started = Instant::now();
            b.copy_from_slice(&a);
            host = started.elapsed();
            std::hint::black_box(&b);
        }
        println!(
            "{} KiB SQEs: engine {:.2} GB/s, aclrtMemcpy D2D {:.2} GB/s, memcpy {:.2} GB/s, ratio {:.2}",
            sqe_bytes >> 10,
            total as f64 / engine.as_secs_f64() / 1e9,
            total as f64 / device_copy.as_secs_f64() / 1e9,
            total as f64 / host.as_secs_f64() / 1e9,
            host.as_secs_f64() / engine.as_secs_f64()
        );
    }
}
