//! Engine API semantics with Mooncake's rules (docs/mooncake.md section 5), end to end in one process.
//!
//! Tier: host-only, no device, no network. Transfers into the engine's own segment go through the in-process path;
//! a test transport that holds transfers until told to finish stands in for slow transports.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aiv_transport::evidence::{Act, Source, TransferEvidence};
use aiv_transport::transfer::{FailureKind, TaskSlot, Transfer, TransferFailure};
use aiv_transport::transport::Transport;
use aiv_transport::{
    EngineConfig, EngineError, Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState,
};
use proptest::prelude::*;

static NEXT_ENGINE: AtomicUsize = AtomicUsize::new(0);

fn engine_with(timeout: Duration) -> TransferEngine {
    let mut config = EngineConfig::new(format!("127.0.0.1:{}", 20_000 + NEXT_ENGINE.fetch_add(1, Ordering::Relaxed)));
    config.aiv.transfer_timeout = timeout;
    TransferEngine::new(config).expect("engine starts")
}

fn engine() -> TransferEngine {
    engine_with(Duration::from_secs(10))
}

/// One allocation laid out as two registered target buffers that touch, [0, len) and [len, 2 len), then an
/// unregistered gap of 2 len bytes, then the registered source buffer of len bytes. The gap keeps every probe that
/// runs past the second target buffer inside unregistered memory, whatever the allocator does.
struct Memory {
    backing: Vec<u8>,
    len: usize,
}

impl Memory {
    fn new(engine: &TransferEngine, len: usize) -> Memory {
        let mut backing = vec![0u8; 5 * len];
        for (i, byte) in backing[4 * len..].iter_mut().enumerate() {
            *byte = (i % 251) as u8;
        }
        let base = backing.as_mut_ptr() as u64;
        let len64 = len as u64;
        // SAFETY: the allocation lives in the returned `Memory`, which every test keeps alive past its last transfer.
        unsafe {
            engine.register_memory(base, len64, "cpu:0").expect("first target buffer");
            engine.register_memory(base + len64, len64, "cpu:0").expect("adjacent target buffer");
            engine.register_memory(base + 4 * len64, len64, "cpu:0").expect("source buffer");
        }
        Memory { backing, len }
    }

    fn target(&self) -> &[u8] {
        &self.backing[..2 * self.len]
    }

    fn source(&self) -> &[u8] {
        &self.backing[4 * self.len..]
    }

    fn target_addr(&self) -> u64 {
        self.backing.as_ptr() as u64
    }

    fn source_addr(&self) -> u64 {
        self.backing.as_ptr() as u64 + 4 * self.len as u64
    }

    fn write(&self, target_offset: u64, length: u64) -> TransferRequest {
        TransferRequest {
            opcode: Opcode::Write,
            source: self.source_addr(),
            target_id: SegmentId::LOCAL,
            target_offset,
            length,
            protocol: None,
        }
    }
}

/// A transport that keeps transfers until `release` is called.
#[derive(Debug, Default)]
struct HeldTransport {
    held: Mutex<Vec<Transfer>>,
}

impl HeldTransport {
    fn release(&self) -> usize {
        let transfers = std::mem::take(&mut *self.held.lock().expect("not poisoned"));
        let count = transfers.len();
        for transfer in transfers {
            let mut evidence = TransferEvidence::new("held", aiv_transport::evidence::RuntimeLabel::NONE);
            evidence.descriptors_written = Act::host(Source::HostCode, 1);
            evidence.doorbells_rung = Act::host(Source::HostCode, 1);
            evidence.completion_seen = Act::host(Source::HostCode, 1);
            evidence.descriptors = 1;
            evidence.doorbells = 1;
            transfer.slot.complete(transfer.length, evidence);
        }
        count
    }
}

impl Transport for HeldTransport {
    fn name(&self) -> &'static str {
        "held"
    }

    fn submit(&self, transfers: Vec<Transfer>) {
        self.held.lock().expect("not poisoned").extend(transfers);
    }
}

#[test]
fn status_values_are_mooncakes() {
    let values = [
        (TransferState::Waiting, 0),
        (TransferState::Pending, 1),
        (TransferState::Invalid, 2),
        (TransferState::Canceled, 3),
        (TransferState::Completed, 4),
        (TransferState::Timeout, 5),
        (TransferState::Failed, 6),
    ];
    for (state, raw) in values {
        assert_eq!(state as u32, raw);
        assert_eq!(TransferState::from_raw(raw), state);
    }
    assert_eq!(TransferState::from_raw(7), TransferState::Invalid);
    assert_eq!(TransferState::from_raw(u32::MAX), TransferState::Invalid);
    let codes = [
        (EngineError::InvalidArgument { operation: "x", reason: String::new() }, 1),
        (EngineError::TooManyRequests { batch: 1, capacity: 1, submitted: 1, requested: 1 }, 2),
        (EngineError::AddressNotRegistered { operation: "x", addr: 0 }, 3),
        (EngineError::BatchBusy { batch: 1, pending: 1 }, 4),
        (EngineError::AddressOverlapped { addr: 0, length: 1, existing_addr: 0, existing_length: 1 }, 7),
    ];
    for (error, code) in codes {
        assert_eq!(error.mooncake_code(), code, "{error}");
    }
}

#[test]
fn registration_rejects_zero_length_and_overlap() {
    let engine = engine();
    let mut buffer = vec![0u8; 4096];
    let addr = buffer.as_mut_ptr() as u64;
    // SAFETY: `buffer` outlives the engine's use of it (no transfer is submitted).
    unsafe {
        assert!(matches!(engine.register_memory(addr, 0, "cpu:0"), Err(EngineError::InvalidRegistration { .. })));
        engine.register_memory(addr, 2048, "cpu:0").expect("first half");
        let overlap = engine.register_memory(addr + 2047, 2, "cpu:0").expect_err("overlaps by one byte");
        assert_eq!(overlap.mooncake_code(), 7, "{overlap}");
        engine.register_memory(addr + 2048, 2048, "cpu:0").expect("adjacent second half");
    }
    assert_eq!(engine.local_descriptor().buffers.len(), 2);
    engine.unregister_memory(addr).expect("registered");
    let error = engine.unregister_memory(addr).expect_err("already gone");
    assert_eq!(error.mooncake_code(), 3);
}

#[test]
fn bounds_are_checked_before_any_byte_moves() {
    let engine = engine();
    let memory = Memory::new(&engine, 4096);
    let base = memory.target_addr();
    let len = memory.len as u64;
    let cases: Vec<(&str, TransferRequest, bool)> = vec![
        ("exact fit", memory.write(base, len), true),
        ("inside", memory.write(base + 100, 200), true),
        ("exact fit of the second buffer", memory.write(base + len, len), true),
        ("one byte over", memory.write(base + 1, len), false),
        ("spanning two adjacent buffers", memory.write(base + len - 8, 16), false),
        ("zero length", memory.write(base, 0), false),
        ("u64 overflow", memory.write(u64::MAX - 4, 16), false),
        ("unregistered target", memory.write(8, 16), false),
        (
            "source past its buffer",
            TransferRequest { source: memory.source_addr() + 1, ..memory.write(base, len) },
            false,
        ),
    ];
    for (name, request, valid) in cases {
        let before = memory.target().to_vec();
        let batch = engine.allocate_batch(1).expect("batch");
        engine.submit_transfer(batch, &[request]).expect("submission itself succeeds");
        let status = engine.wait_batch(batch).expect("bounded wait");
        let reason = engine.task_reason(batch, 0).expect("task 0 exists");
        if valid {
            assert_eq!(status.state, TransferState::Completed, "{name}: {reason:?}");
            assert_eq!(status.transferred_bytes, request.length, "{name}");
            let start = (request.target_offset - base) as usize;
            assert_eq!(
                &memory.target()[start..start + request.length as usize],
                &memory.source()[..request.length as usize]
            );
        } else {
            assert_eq!(status.state, TransferState::Failed, "{name}");
            assert_eq!(status.transferred_bytes, 0, "{name}");
            assert!(reason.as_deref().is_some_and(|r| r.contains("range")), "{name}: {reason:?}");
            assert_eq!(memory.target(), &before[..], "{name}: a rejected request touched memory");
        }
        engine.free_batch(batch).expect("finished batch frees");
    }
}

#[test]
fn too_many_requests_counts_every_submission() {
    let engine = engine();
    let memory = Memory::new(&engine, 1024);
    let batch = engine.allocate_batch(3).expect("batch");
    let request = memory.write(memory.target_addr(), 8);
    engine.submit_transfer(batch, &[request, request]).expect("two fit");
    let error = engine.submit_transfer(batch, &[request, request]).expect_err("four do not");
    assert_eq!(error.mooncake_code(), 2, "{error}");
    engine.submit_transfer(batch, &[request]).expect("the third fits");
    assert_eq!(engine.wait_batch(batch).expect("wait").state, TransferState::Completed);
    assert!(matches!(engine.allocate_batch(0), Err(EngineError::InvalidArgument { .. })));
}

#[test]
fn batch_busy_while_a_task_is_pending_and_statuses_follow_the_task() {
    let engine = engine();
    let memory = Memory::new(&engine, 1024);
    let held = Arc::new(HeldTransport::default());
    engine.install_transport(Protocol::Adxl, held.clone());
    let batch = engine.allocate_batch(4).expect("batch");
    let held_request = TransferRequest { protocol: Some(Protocol::Adxl), ..memory.write(memory.target_addr(), 64) };
    let local_request = memory.write(memory.target_addr() + 64, 64);
    engine.submit_transfer(batch, &[held_request, local_request]).expect("submit");
    assert_eq!(engine.transfer_status(batch, 0).expect("task 0").state, TransferState::Pending);
    assert_eq!(engine.transfer_status(batch, 1).expect("task 1").state, TransferState::Completed);
    assert_eq!(engine.batch_status(batch).expect("batch").state, TransferState::Pending);
    let busy = engine.free_batch(batch).expect_err("task 0 pending");
    assert_eq!(busy.mooncake_code(), 4, "{busy}");
    assert!(matches!(engine.transfer_status(batch, 2), Err(EngineError::UnknownTask { .. })));
    assert_eq!(held.release(), 1);
    let status = engine.batch_status(batch).expect("batch");
    assert_eq!((status.state, status.transferred_bytes), (TransferState::Completed, 128));
    assert_eq!(engine.task_evidence(batch, 0).expect("task").map(|e| e.path), Some("held"));
    assert_eq!(engine.task_evidence(batch, 1).expect("task").map(|e| e.path), Some("local"));
    engine.free_batch(batch).expect("now free");
    assert!(matches!(engine.batch_status(batch), Err(EngineError::UnknownBatch { .. })));
}

/// A thread that waits for a batch is charged to its tasks: each carries its share of the waiter's CPU time
/// (`waiting_cpu_ns`), added when the wait ends; a batch nobody waited for carries none.
#[test]
fn a_waiting_thread_is_charged_to_the_tasks_it_waited_for() {
    let engine = Arc::new(engine());
    let memory = Memory::new(&engine, 1024);
    let held = Arc::new(HeldTransport::default());
    engine.install_transport(Protocol::Adxl, held.clone());
    let requests: Vec<TransferRequest> = (0..2)
        .map(|i| TransferRequest { protocol: Some(Protocol::Adxl), ..memory.write(memory.target_addr() + i * 64, 64) })
        .collect();
    let batch = engine.allocate_batch(2).expect("batch");
    engine.submit_transfer(batch, &requests).expect("submit");
    let started = std::time::Instant::now();
    let (tid_sender, tid) = std::sync::mpsc::channel();
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_sender.send(unsafe { libc::gettid() }).expect("the test waits for the thread id");
            let cpu = aiv_transport::cpu_time::thread_cpu_time_ns();
            let status = engine.wait_batch(batch).expect("wait");
            (status.state, aiv_transport::cpu_time::thread_cpu_time_ns() - cpu)
        })
    };
    // Released once the waiter sleeps in wait_batch: after sending its id, its only sleep is that wait's (the batch
    // has no poller, so the waiter sleeps until the transport finishes the tasks).
    let stat = format!("/proc/self/task/{}/stat", tid.recv().expect("the waiter's thread id"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&stat).expect("the waiter's thread is listed");
        let state = text.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next());
        if state == Some(Some('S')) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the waiter never slept in wait_batch: {text}");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(held.release(), 2);
    let (state, waiter_cpu) = waiter.join().expect("waiter");
    let wall = started.elapsed();
    assert_eq!(state, TransferState::Completed);
    let charged: Vec<u64> =
        (0..2).map(|t| engine.task_evidence(batch, t).expect("task").expect("evidence").waiting_cpu_ns).collect();
    assert!(charged.iter().all(|&ns| ns > 0), "each task carries a share: {charged:?}");
    assert_eq!(charged[0], charged[1], "equal shares");
    let total: u64 = charged.iter().sum();
    assert!(total <= waiter_cpu + 2, "no more than the waiter spent ({waiter_cpu} ns): {charged:?}");
    assert!(
        Duration::from_nanos(total) < wall,
        "a sleeping waiter is charged its wake-ups, not its sleep: {charged:?}"
    );
    engine.free_batch(batch).expect("free");
    // Nobody waits: nothing is charged.
    let batch = engine.allocate_batch(1).expect("batch");
    engine.submit_transfer(batch, &requests[..1]).expect("submit");
    assert_eq!(held.release(), 1);
    assert_eq!(engine.task_evidence(batch, 0).expect("task").expect("evidence").waiting_cpu_ns, 0);
}

#[test]
fn one_failed_task_fails_the_batch_and_others_still_run() {
    let engine = engine();
    let memory = Memory::new(&engine, 1024);
    let batch = engine.allocate_batch(2).expect("batch");
    let good = memory.write(memory.target_addr(), 16);
    let bad = memory.write(memory.target_addr() + 1020, 16);
    engine.submit_transfer(batch, &[good, bad]).expect("submit");
    let status = engine.wait_batch(batch).expect("wait");
    assert_eq!(status.state, TransferState::Failed);
    assert_eq!(status.transferred_bytes, 16);
    assert_eq!(engine.transfer_status(batch, 0).expect("task").state, TransferState::Completed);
}

#[test]
fn a_timeout_past_what_the_clock_holds_saturates_instead_of_panicking() {
    // Duration::MAX added to Instant::now() overflows; the engine's deadline saturates and the transfer still runs.
    let engine = engine_with(Duration::MAX);
    let memory = Memory::new(&engine, 1024);
    let batch = engine.allocate_batch(1).expect("batch");
    engine.submit_transfer(batch, &[memory.write(memory.target_addr(), 64)]).expect("submit does not panic");
    assert_eq!(engine.wait_batch(batch).expect("wait").state, TransferState::Completed);
    assert_eq!(&memory.target()[..64], &memory.source()[..64]);
}

#[test]
fn watchdog_turns_a_silent_transport_into_timeout() {
    let engine = engine_with(Duration::from_millis(50));
    let memory = Memory::new(&engine, 1024);
    let held = Arc::new(HeldTransport::default());
    engine.install_transport(Protocol::Ubshmem, held.clone());
    let batch = engine.allocate_batch(1).expect("batch");
    let request = TransferRequest { protocol: Some(Protocol::Ubshmem), ..memory.write(memory.target_addr(), 8) };
    engine.submit_transfer(batch, &[request]).expect("submit");
    let started = Instant::now();
    let status = engine.wait_batch(batch).expect("bounded wait");
    assert!(started.elapsed() < Duration::from_secs(5), "wait was not bounded by the 50 ms budget");
    assert_eq!(status.state, TransferState::Failed);
    assert_eq!(engine.transfer_status(batch, 0).expect("task").state, TransferState::Timeout);
    assert!(engine.task_reason(batch, 0).expect("task").is_some_and(|r| r.contains("watchdog")));
    // A completion arriving after the timeout changes nothing.
    assert_eq!(held.release(), 1);
    assert_eq!(engine.transfer_status(batch, 0).expect("task").state, TransferState::Timeout);
    engine.free_batch(batch).expect("timed-out batch frees");
}

#[test]
fn protocol_without_a_transport_fails_the_task_by_name() {
    let engine = engine();
    let memory = Memory::new(&engine, 1024);
    let batch = engine.allocate_batch(1).expect("batch");
    let request = TransferRequest { protocol: Some(Protocol::Ubshmem), ..memory.write(memory.target_addr(), 8) };
    engine.submit_transfer(batch, &[request]).expect("submit");
    assert_eq!(engine.wait_batch(batch).expect("wait").state, TransferState::Failed);
    let reason = engine.task_reason(batch, 0).expect("task").expect("a reason");
    assert!(reason.contains("ubshmem"), "{reason}");
    assert!("rdma".parse::<Protocol>().expect_err("not ours").to_string().contains("does not provide"));
    assert!("bogus".parse::<Protocol>().expect_err("unknown").to_string().contains("unknown protocol"));
}

#[test]
fn python_style_helpers() {
    let engine = engine();
    let memory = Memory::new(&engine, 4096);
    let name = engine.name().to_owned();
    let target = memory.target_addr();
    assert_eq!(engine.get_first_buffer_address(&name).expect("own segment"), target.min(memory.source_addr()));
    engine.transfer_sync_write(&name, memory.source_addr(), target + 8, 100).expect("sync write");
    assert_eq!(&memory.target()[8..108], &memory.source()[..100]);
    let mut back = vec![0u8; 100];
    // SAFETY: `back` outlives the synchronous read below.
    unsafe { engine.register_memory(back.as_mut_ptr() as u64, 100, "cpu:0").expect("register") };
    engine.transfer_sync_read(&name, back.as_ptr() as u64, target + 8, 100).expect("sync read");
    assert_eq!(back, memory.source()[..100]);
    let error = engine.transfer_sync_write(&name, memory.source_addr(), target + 4090, 100).expect_err("out of bounds");
    assert!(matches!(error, EngineError::TransferFailed { state: TransferState::Failed, .. }), "{error}");
    let batch = engine
        .batch_transfer_async_write(&name, &[memory.source_addr(); 2], &[target, target + 4096], &[64, 64])
        .expect("async batch");
    assert_eq!(engine.wait_batch(batch).expect("wait").state, TransferState::Completed);
    let statuses = engine.get_batch_transfer_status(&[batch]);
    assert_eq!(statuses[0].as_ref().expect("known batch").transferred_bytes, 128);
    engine.free_batch(batch).expect("free");
    let mismatch = engine.batch_transfer_sync_read(&name, &[1, 2], &[3], &[4, 5]).expect_err("lists differ");
    assert!(matches!(mismatch, EngineError::InvalidArgument { .. }));
    // Nobody listens on port 1: the handshake fails, bounded, naming the peer.
    let error = engine.open_segment("127.0.0.1:1").expect_err("no peer there");
    assert!(matches!(error, EngineError::Handshake { .. } | EngineError::SegmentNotFound { .. }), "{error}");
    assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
    drop(back);
}

#[test]
fn a_second_engine_finds_the_first_by_name_through_the_handshake() {
    let first = engine();
    let second = engine();
    let mut buffer = vec![7u8; 256];
    // SAFETY: `buffer` outlives both engines' use of it (descriptors only, no transfer).
    unsafe { first.register_memory(buffer.as_mut_ptr() as u64, 256, "cpu:0").expect("register") };
    let id = second.open_segment(first.name()).expect("found in this process");
    assert_ne!(id, SegmentId::LOCAL);
    assert_eq!(second.segment(id).expect("open").buffers.len(), 1);
    // P2P naming: the port in local_hostname is ignored, the name carries the RPC port actually bound.
    assert_eq!(first.name(), format!("127.0.0.1:{}", first.rpc_port()));
    assert_ne!(first.name(), second.name());
    drop(buffer);
}

#[test]
fn task_slot_first_terminal_write_wins() {
    let slot = TaskSlot::new(Instant::now() + Duration::from_secs(60), Default::default());
    slot.mark_pending();
    assert_eq!(slot.state(), TransferState::Pending);
    assert!(slot.fail(TransferFailure::new("test", FailureKind::Device, "first")));
    assert!(!slot.fail(TransferFailure::new("test", FailureKind::Timeout, "second")));
    assert_eq!(slot.state(), TransferState::Failed);
    assert_eq!(slot.reason().as_deref(), Some("test: first"));
    assert_eq!(slot.failure().map(|failure| failure.kind()), Some(FailureKind::Device));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any (offset, length) against two adjacent 512-byte buffers: completes exactly when the range lies inside one
    /// of them, and memory changes only then.
    #[test]
    fn submit_agrees_with_the_bounds_rule(offset in 0u64..1100, length in 0u64..600) {
        let engine = engine();
        let memory = Memory::new(&engine, 512);
        let base = memory.target_addr();
        let inside_one = length > 0 && ((offset + length <= 512) || (offset >= 512 && offset + length <= 1024));
        let before = memory.target().to_vec();
        let batch = engine.allocate_batch(1).expect("batch");
        engine.submit_transfer(batch, &[memory.write(base + offset, length)]).expect("submit");
        let state = engine.wait_batch(batch).expect("wait").state;
        prop_assert_eq!(state == TransferState::Completed, inside_one);
        if !inside_one {
            prop_assert_eq!(memory.target(), &before[..]);
        }
    }
}
