//! Unit tests of the aiv transport on a one-block twin device.

use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocopy::little_endian::{U32, U64};

use super::inflight::InFlight;
use super::submit::{decode_ticket, encode_ticket};
use crate::config::AivOptions;
use crate::device::DeviceBuffer;
// Test-only: the engine's device facade opens a twin device with the transport on it.
use crate::engine::AivDevice;
use crate::kernel_abi::{RequestEntry, REQUEST_OPCODE_WRITE};
use crate::transfer::{CompletionSignal, TaskSlot, TransferState};

/// A twin device with the aiv transport on one block (ring depth 8) and 8 KiB of its HBM. Each test passes its own
/// `device_id`: a twin-runtime device is opened once at a time per process (one SHMEM PE), and the tests run in
/// parallel threads.
fn one_block_device(device_id: u32) -> (AivDevice, DeviceBuffer) {
    let options = AivOptions {
        device_id,
        aiv_blocks: 1,
        request_ring_depth: 8,
        sq_depth: 16,
        hbm_size: 4 << 20,
        kernel_wait_budget: Duration::from_millis(500),
        ..AivOptions::default()
    };
    let device = AivDevice::open(&options).expect("twin");
    let buffer = device.allocate(8192).expect("hbm");
    (device, buffer)
}

/// Requests the engine would never send (zero length, address overflow, unknown opcode) are refused by the
/// kernel itself with a bad-request syndrome, without an SQE; a good request in the same group still completes.
#[test]
fn the_kernel_rejects_malformed_requests_on_its_own() {
    let (device, buffer) = one_block_device(0);
    let signal = Arc::new(CompletionSignal::default());
    let deadline = Instant::now() + Duration::from_secs(10);
    let entry = |id: u64, src: u64, length: u64, opcode: u32| RequestEntry {
        transfer_id: U64::new(id),
        src_addr: U64::new(src),
        dst_addr: U64::new(buffer.addr() + 4096),
        length: U64::new(length),
        opcode: U32::new(opcode),
        ..RequestEntry::default()
    };
    let cases = [
        entry(1, buffer.addr(), 0, REQUEST_OPCODE_WRITE),
        entry(2, u64::MAX - 10, 100, REQUEST_OPCODE_WRITE),
        entry(3, buffer.addr(), 100, 7),
        entry(4, buffer.addr(), 100, REQUEST_OPCODE_WRITE),
    ];
    let slots: Vec<Arc<TaskSlot>> = cases.iter().map(|_| Arc::new(TaskSlot::new(deadline, signal.clone()))).collect();
    let inner = &device.transport().inner;
    let block = &inner.blocks[0];
    {
        let mut producer = block.producer.lock().expect("producer");
        for (entry, slot) in cases.iter().zip(&slots) {
            let inflight = InFlight {
                slot: slot.clone(),
                peer: None,
                length: entry.length.get(),
                rdma: None,
                host_mark: Default::default(),
            };
            producer.backlog.push_back((*entry, inflight));
        }
        assert_eq!(block.post_backlog(producer, None), 4);
    }
    signal.wait_for(4, deadline);
    for slot in &slots[..3] {
        assert_eq!(slot.state(), TransferState::Failed);
        let reason = slot.reason().expect("reason");
        assert!(reason.contains("bad request"), "{reason}");
        let evidence = slot.evidence().expect("evidence");
        assert_eq!((evidence.descriptors, evidence.doorbells), (0, 0), "no SQE for a refused request");
    }
    assert_eq!(slots[3].state(), TransferState::Completed, "{:?}", slots[3].reason());
}

/// A waiting thread collects completions itself, and is told when another thread holds a block's DCQ (that
/// thread may finish the waiter's slots without waking it, so the waiter must not sleep long).
#[test]
fn tickets_round_trip_and_zero_is_no_ticket() {
    for (block, position) in [(0, 0), (1, 7), (31, u32::MAX)] {
        let ticket = encode_ticket(block, position);
        assert_ne!(ticket, 0);
        assert_eq!(decode_ticket(ticket), Some((block, position)));
    }
    assert_eq!(decode_ticket(0), None);
    assert_eq!(decode_ticket(0x0000_0000_0000_0005), None);
}

#[test]
fn a_poll_drains_in_the_calling_thread_and_reports_a_drain_elsewhere() {
    let (device, buffer) = one_block_device(1);
    let signal = Arc::new(CompletionSignal::default());
    let deadline = Instant::now() + Duration::from_secs(10);
    let slot = Arc::new(TaskSlot::new(deadline, signal.clone()));
    slot.mark_pending();
    let inner = &device.transport().inner;
    let block = &inner.blocks[0];
    // Stand in for another drainer: neither the drain thread nor the poll may take this block's DCQ.
    let held = block.drain_lock.lock().expect("drain lock");
    {
        let mut producer = block.producer.lock().expect("producer");
        let entry = RequestEntry {
            transfer_id: U64::new(77),
            src_addr: U64::new(buffer.addr()),
            dst_addr: U64::new(buffer.addr() + 4096),
            length: U64::new(4096),
            opcode: U32::new(REQUEST_OPCODE_WRITE),
            ..RequestEntry::default()
        };
        let inflight =
            InFlight { slot: slot.clone(), peer: None, length: 4096, rdma: None, host_mark: Default::default() };
        producer.backlog.push_back((entry, inflight));
        assert_eq!(block.post_backlog(producer, None), 1);
    }
    while !inner.completions_ready() {
        assert!(Instant::now() < deadline, "the kernel never published the completion");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(inner.poll_inline(), "a poll while another thread holds the DCQ must say so");
    assert_eq!(slot.state(), TransferState::Pending, "nobody may drain a DCQ another thread holds");
    drop(held);
    assert!(!inner.poll_inline(), "no other drainer now");
    assert_eq!(slot.state(), TransferState::Completed, "{:?}", slot.reason());
    assert!(!inner.completions_ready());
    assert!(slot.evidence().is_some(), "a finished transfer carries evidence");
    assert!(inner.unattributed_cpu.take() > 0, "the drain pass was timed and pooled for the next transfers");
    assert_eq!(signal.finished(), 1);
}

/// With the RDMA route the kernel's wait budget covers the NIC's whole retry schedule, so that a silent peer ends as
/// the NIC's retry-exceeded CQE; without it, and when the configured budget is longer, the configured one stands.
#[test]
fn the_kernel_wait_budget_covers_the_nic_retry_schedule_on_the_rdma_route() {
    let options = AivOptions {
        kernel_wait_budget: Duration::from_millis(300),
        rdma_timeout: Duration::from_millis(50),
        rdma_retry_count: 7,
        ..AivOptions::default()
    };
    assert_eq!(super::setup::kernel_wait_budget(&options, false), Duration::from_millis(300));
    assert_eq!(super::setup::kernel_wait_budget(&options, true), Duration::from_millis(500));
    let long = AivOptions { kernel_wait_budget: Duration::from_secs(2), ..options };
    assert_eq!(super::setup::kernel_wait_budget(&long, true), Duration::from_secs(2));
}

/// The learned pace: nothing before a first wait of at least 64 KiB, then the time per byte (a quarter towards each
/// newer wait); small waits neither learn nor get an expected time.
#[test]
fn the_wait_pace_learns_time_per_byte_from_large_waits_only() {
    let pace = super::pace::WaitPace::default();
    assert_eq!(pace.expected(1 << 20), None, "nothing learned yet");
    pace.learn(4096, Duration::from_millis(50));
    assert_eq!(pace.expected(1 << 20), None, "a small wait teaches nothing");
    pace.learn(1 << 20, Duration::from_millis(2));
    let expected = pace.expected(1 << 20).expect("learned");
    assert!(expected.abs_diff(Duration::from_millis(2)) < Duration::from_micros(5), "{expected:?}");
    assert_eq!(pace.expected(4096), None, "a small wait gets no expected time");
    pace.learn(1 << 20, Duration::from_millis(6));
    let expected = pace.expected(1 << 20).expect("learned");
    assert!(expected.abs_diff(Duration::from_millis(3)) < Duration::from_micros(5), "{expected:?}");
}
