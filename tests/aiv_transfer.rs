//! Twin end-to-end tests of the aiv transport: READ and WRITE between two twin devices in one process, random
//! contents, sizes and offsets, both launch modes, and the evidence each transfer records.

#[path = "common/aiv.rs"]
mod common;

use aiv_transport::config::LaunchMode;
use aiv_transport::evidence::{Check, Source, Submitter};
use aiv_transport::{Opcode, TransferRequest, TransferState};
use common::{node, options, writes};
use rand::{Rng, RngCore, SeedableRng};

fn random_round_trip(mode: LaunchMode, doorbell_batch: u32, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let size = 8u64 << 20;
    let mut a = node(options(0, mode, doorbell_batch), size);
    let mut b = node(options(1, mode, doorbell_batch), size);
    a.modify(|bytes| rng.fill_bytes(bytes));
    b.modify(|bytes| rng.fill_bytes(bytes));
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    // Device-runtime calls the transfers of each round were charged (counted by the loader tables).
    let mut calls = [0u64; 4];
    let mut launches = [0f64; 4];
    for round in 0..4 {
        // Disjoint random ranges: lengths from 1 byte to 2.5 MiB (not multiples of 1 MiB), random offsets.
        let mut requests = Vec::new();
        let slots = 3u64;
        let span = size / slots;
        for i in 0..slots {
            let length = rng.gen_range(1..=(span / 2).min(5 << 19));
            let local = i * span + rng.gen_range(0..span - length);
            let remote = i * span + rng.gen_range(0..span - length);
            let opcode = if rng.gen_bool(0.5) { Opcode::Read } else { Opcode::Write };
            requests.push(TransferRequest {
                opcode,
                source: a.buffer.addr() + local,
                target_id: peer,
                target_offset: b.buffer.addr() + remote,
                length,
                protocol: None,
            });
        }
        let expected: Vec<Vec<u8>> = requests
            .iter()
            .map(|r| {
                let (from_node, from) = match r.opcode {
                    Opcode::Read => (&b, r.target_offset - b.buffer.addr()),
                    Opcode::Write => (&a, r.source - a.buffer.addr()),
                };
                from_node.read(from as usize..(from + r.length) as usize)
            })
            .collect();
        let batch = a.engine.allocate_batch(requests.len()).expect("batch");
        a.engine.submit_transfer(batch, &requests).expect("submit");
        let status = a.engine.wait_batch(batch).expect("wait");
        for (task, request) in requests.iter().enumerate() {
            let reason = a.engine.task_reason(batch, task).expect("task");
            assert_eq!(
                a.engine.transfer_status(batch, task).expect("status").state,
                TransferState::Completed,
                "round {round} task {task}: {reason:?}"
            );
            let (to_node, to) = match request.opcode {
                Opcode::Read => (&a, request.source - a.buffer.addr()),
                Opcode::Write => (&b, request.target_offset - b.buffer.addr()),
            };
            assert!(
                to_node.read(to as usize..(to + request.length) as usize) == expected[task][..],
                "round {round} task {task}: data differs"
            );
            let evidence = a.engine.task_evidence(batch, task).expect("task").expect("evidence recorded");
            assert_eq!(evidence.path, "aiv");
            // Observed by the twin's device model, not declared: its SQEs and doorbells by AIV blocks only.
            assert_eq!(evidence.descriptors_written.source, Source::TwinModel, "{evidence:?}");
            assert_eq!(evidence.descriptors_written.by_host + evidence.doorbells_rung.by_host, 0, "{evidence:?}");
            assert!(evidence.descriptors_written.by_aiv >= 1, "{evidence:?}");
            assert_eq!(evidence.checks().as_array(), [Check::Yes; 4], "{evidence:?}");
            assert_eq!(evidence.submitter(), Submitter::AivDirect, "{evidence:?}");
            assert_eq!(evidence.descriptors_written.by_aicpu + evidence.doorbells_rung.by_aicpu, 0, "{evidence:?}");
            let data_sqes = request.length.div_ceil(1 << 20);
            assert_eq!(evidence.descriptors, data_sqes + 1, "data SQEs plus the flag SQE: {evidence:?}");
            *calls.get_mut(round).expect("4 rounds") += evidence.host_device_api_calls;
            *launches.get_mut(round).expect("4 rounds") += evidence.host_launches;
            assert!(evidence.doorbells >= 1 && evidence.doorbells <= data_sqes + 1, "{evidence:?}");
            if doorbell_batch == 1 {
                assert_eq!(evidence.doorbells, data_sqes + 1, "eager: one doorbell per SQE: {evidence:?}");
            }
        }
        assert_eq!(status.state, TransferState::Completed);
        a.engine.free_batch(batch).expect("free");
    }
    // The first round imports the peer's memory (runtime calls); after it, a persistent kernel needs none per
    // transfer, while each per-batch submit launches the kernel (charged to that round's transfers, or to the next
    // round's when the drain ran before the launch returned).
    assert!(calls[0] >= 1, "the import is counted: {calls:?}");
    match mode {
        LaunchMode::Persistent => assert_eq!(calls[1..], [0, 0, 0], "{calls:?}"),
        LaunchMode::PerBatch => assert!(calls[1..].iter().sum::<u64>() >= 2, "the launches are counted: {calls:?}"),
    }
    // The launches themselves: none charged to a transfer of the persistent kernel; one per per-batch submit, shared
    // by the transfers drained after it (so each round's transfers carry about one launch between them).
    let total: f64 = launches.iter().sum();
    match mode {
        LaunchMode::Persistent => assert_eq!(total, 0.0, "{launches:?}"),
        LaunchMode::PerBatch => assert!((2.0..=4.0 + 1e-9).contains(&total), "one launch per submit: {launches:?}"),
    }
}

#[test]
fn persistent_kernel_moves_random_ranges_between_two_devices() {
    random_round_trip(LaunchMode::Persistent, 8, 1);
}

#[test]
fn per_batch_launches_move_random_ranges_with_eager_doorbells() {
    random_round_trip(LaunchMode::PerBatch, 1, 2);
}

#[test]
fn many_small_transfers_spread_over_blocks_and_wrap_the_rings() {
    // 128-entry request rings and 64-entry SQs: 600 transfers wrap both several times.
    let mut a = node(options(0, LaunchMode::Persistent, 4), 1 << 20);
    let b = node(options(1, LaunchMode::Persistent, 4), 1 << 20);
    a.modify(|bytes| {
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = (i % 251) as u8;
        }
    });
    let requests = writes(&a, &b, 600, 1000);
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    let status = a.engine.wait_batch(batch).expect("wait");
    assert_eq!(status.state, TransferState::Completed, "{:?}", a.engine.task_reason(batch, 0));
    assert_eq!(status.transferred_bytes, 600_000);
    assert!(a.read(0..600_000) == b.read(0..600_000));
    let counters = a.device.transport().counters();
    assert_eq!(counters.completions, 600);
    assert_eq!(counters.launches, 1, "persistent: one launch at start, none per transfer");
    // One submit of 600: each block takes an equal contiguous run.
    let per_block = a.device.transport().completions_per_block();
    assert!(per_block.len() > 1 && 600 % per_block.len() == 0, "blocks: {per_block:?}");
    assert!(per_block.iter().all(|&n| n as usize == 600 / per_block.len()), "per block: {per_block:?}");
}

#[test]
fn a_local_buffer_outside_device_memory_fails_with_the_reason() {
    let a = node(options(0, LaunchMode::Persistent, 8), 1 << 20);
    let b = node(options(1, LaunchMode::Persistent, 8), 1 << 20);
    let mut host = vec![0u8; 4096];
    // SAFETY: `host` outlives the batch below, which is waited for.
    unsafe { a.engine.register_memory(host.as_mut_ptr() as u64, 4096, "cpu:0") }.expect("register host memory");
    let peer = a.engine.open_segment(b.engine.name()).expect("peer");
    let request = TransferRequest {
        opcode: Opcode::Read,
        source: host.as_ptr() as u64,
        target_id: peer,
        target_offset: b.buffer.addr(),
        length: 4096,
        protocol: None,
    };
    let batch = a.engine.allocate_batch(1).expect("batch");
    a.engine.submit_transfer(batch, &[request]).expect("submit");
    assert_eq!(a.engine.wait_batch(batch).expect("wait").state, TransferState::Failed);
    let reason = a.engine.task_reason(batch, 0).expect("task").expect("reason");
    assert!(reason.contains("not device memory"), "{reason}");
}

/// Mooncake's default location `"*"` finds device memory out: the buffer is registered as `npu:<id>`, so aiv moves it
/// and a tcp request is refused before any Host code touches it (a Host read of it would fault).
#[test]
fn device_memory_registered_with_mooncakes_default_location_is_known_as_device_memory() {
    let a = node(options(0, LaunchMode::Persistent, 8), 1 << 20);
    let b = node(options(1, LaunchMode::Persistent, 8), 1 << 20);
    let extra = a.device.allocate(64 << 10).expect("HBM");
    // SAFETY: `extra` outlives every batch below, each waited for.
    unsafe { a.engine.register_memory(extra.addr(), extra.len(), "*") }.expect("register with \"*\"");
    let descriptor = a.engine.local_descriptor();
    assert!(descriptor.buffers.iter().any(|buffer| buffer.addr == extra.addr()), "{descriptor:?}");
    let pattern: Vec<u8> = (0..64u32 << 10).map(|i| (i % 253) as u8).collect();
    a.device.write(extra.addr(), &pattern).expect("fill");
    let peer = a.engine.open_segment(b.engine.name()).expect("peer");
    let request = |protocol| TransferRequest {
        opcode: Opcode::Write,
        source: extra.addr(),
        target_id: peer,
        target_offset: b.buffer.addr(),
        length: 64 << 10,
        protocol,
    };
    let batch = a.engine.allocate_batch(2).expect("batch");
    a.engine.submit_transfer(batch, &[request(None), request(Some(aiv_transport::Protocol::Tcp))]).expect("submit");
    a.engine.wait_batch(batch).expect("wait");
    let aiv = a.engine.transfer_status(batch, 0).expect("aiv task");
    assert_eq!(aiv.state, TransferState::Completed, "{:?}", a.engine.task_reason(batch, 0));
    assert_eq!(&b.bytes()[..64 << 10], &pattern[..]);
    assert_eq!(a.engine.transfer_status(batch, 1).expect("tcp task").state, TransferState::Failed);
    let reason = a.engine.task_reason(batch, 1).expect("task").expect("reason");
    assert!(reason.contains("npu:"), "the tcp refusal names the device location: {reason}");
}

#[test]
fn transfers_within_one_device_use_the_local_segment() {
    let mut a = node(options(0, LaunchMode::Persistent, 8), 4 << 20);
    let half = 2u64 << 20;
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    a.modify(|bytes| rng.fill_bytes(&mut bytes[..half as usize]));
    let local = a.engine.open_segment(a.engine.name()).expect("own segment");
    let request = TransferRequest {
        opcode: Opcode::Write,
        source: a.buffer.addr(),
        target_id: local,
        target_offset: a.buffer.addr() + half,
        length: half - 12_345,
        protocol: None,
    };
    let batch = a.engine.allocate_batch(1).expect("batch");
    a.engine.submit_transfer(batch, &[request]).expect("submit");
    let status = a.engine.wait_batch(batch).expect("wait");
    assert_eq!(status.state, TransferState::Completed, "{:?}", a.engine.task_reason(batch, 0));
    let evidence = a.engine.task_evidence(batch, 0).expect("task").expect("evidence");
    assert_eq!((evidence.path, evidence.descriptors), ("aiv", 3), "2 data SQEs + flag: {evidence:?}");
    // The record names the runtime it was observed on: the twin's, with its version.
    assert_eq!(evidence.runtime.kind, aiv_transport::evidence::RuntimeKind::Twin, "{evidence:?}");
    assert_eq!(evidence.runtime.version, cann_twin::TWIN_VERSION_STRING);
    assert_eq!(evidence.runtime.to_string(), format!("twin runtime, {}", cann_twin::TWIN_VERSION_STRING));
    let bytes = a.bytes();
    let copied = (half - 12_345) as usize;
    assert!(bytes[..copied] == bytes[half as usize..half as usize + copied]);
}

/// Regression: with two groups in flight, the older group's flag SQE must not deliver the newer group's sequence
/// number (it did when both flags copied from one source word), or the newer group is reported before its data moved.
#[test]
fn a_newer_group_is_not_reported_before_its_data_has_moved() {
    let mut opts = options(0, LaunchMode::Persistent, 8);
    opts.aiv_blocks = 1;
    opts.sq_depth = 256;
    let size = 40u64 << 20;
    let mut a = node(opts, size);
    let b = node(options(1, LaunchMode::Persistent, 8), size);
    a.modify(|bytes| {
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = (i * 31 + i / 4093) as u8;
        }
    });
    let peer = a.engine.open_segment(b.engine.name()).expect("peer");
    // One block: a group of 64 small transfers, then a group of 36 x 1 MiB that takes the engine milliseconds; both
    // are posted while the engine is stalled, so the older flag SQE runs after the newer group's flag was written.
    let small = 4096u64;
    let mut requests = Vec::new();
    let mut offset = 0;
    for i in 0..100u64 {
        let length = if i < 64 { small } else { 1 << 20 };
        requests.push(TransferRequest {
            opcode: Opcode::Write,
            source: a.buffer.addr() + offset,
            target_id: peer,
            target_offset: b.buffer.addr() + offset,
            length,
            protocol: None,
        });
        offset += length;
    }
    let twin = a.twin();
    twin.stall_channel(0, true);
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    // Released once the kernel has rung both groups on the stalled channel: 100 data SQEs and a flag SQE per group.
    common::wait_until(std::time::Duration::from_secs(10), || match twin.rung_sqes(0) {
        102 => Ok(()),
        rung => Err(format!("the kernel rang both groups (102 SQEs) on the stalled channel 0: {rung} rung")),
    });
    twin.stall_channel(0, false);
    let status = a.engine.wait_batch(batch).expect("wait");
    // Read right after the batch completed: 100 data SQEs and 2 flag SQEs must all have executed.
    let executed = twin.executed_sqes(0);
    assert_eq!(status.state, TransferState::Completed, "{:?}", a.engine.task_reason(batch, 0));
    assert_eq!(executed, 102, "a group was reported complete before its SQEs ran");
    assert!(a.read(0..offset as usize) == b.read(0..offset as usize));
}

/// Completions reach every kind of caller: threads waiting on their own batches at the same time (they collect the
/// device completion queue themselves and share it), and a caller that only polls the status.
#[test]
fn concurrent_waiters_and_a_status_poller_all_see_their_transfers_complete() {
    let mut a = node(options(0, LaunchMode::Persistent, 4), 1 << 20);
    let b = node(options(1, LaunchMode::Persistent, 4), 1 << 20);
    a.modify(|bytes| {
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = (i % 241) as u8;
        }
    });
    let peer = a.engine.open_segment(b.engine.name()).expect("peer");
    // Thread t writes 8 x 2000 B into its own 16000-byte stripe, 40 batches in a row.
    let write = |thread: u64, i: u64| TransferRequest {
        opcode: Opcode::Write,
        source: a.buffer.addr() + thread * 16_000 + i * 2000,
        target_id: peer,
        target_offset: b.buffer.addr() + thread * 16_000 + i * 2000,
        length: 2000,
        protocol: None,
    };
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let (engine, write) = (&a.engine, &write);
            scope.spawn(move || {
                let requests: Vec<TransferRequest> = (0..8).map(|i| write(thread, i)).collect();
                for round in 0..40 {
                    let batch = engine.allocate_batch(requests.len()).expect("batch");
                    engine.submit_transfer(batch, &requests).expect("submit");
                    let status = engine.wait_batch(batch).expect("wait");
                    assert_eq!(
                        status.state,
                        TransferState::Completed,
                        "thread {thread} round {round}: {:?}",
                        engine.task_reason(batch, 0)
                    );
                    engine.free_batch(batch).expect("free");
                }
            });
        }
    });
    assert!(a.read(0..64_000) == b.read(0..64_000), "every stripe arrived");

    // A caller that never waits: polling the batch status alone brings the completions in.
    let requests: Vec<TransferRequest> = (0..8).map(|i| write(4, i)).collect();
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    let started = std::time::Instant::now();
    let status = loop {
        let status = a.engine.batch_status(batch).expect("status");
        if status.state != TransferState::Pending {
            break status;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "polling never saw the batch finish");
        std::thread::yield_now();
    };
    assert_eq!(status.state, TransferState::Completed, "{:?}", a.engine.task_reason(batch, 0));
    assert_eq!(status.transferred_bytes, 16_000);
    assert!(a.read(64_000..80_000) == b.read(64_000..80_000));
}

/// A thread waiting for a batch learns of its completions by reading the DCQ tails in Host memory (nothing wakes it,
/// as nothing could on an NPU): with both channels stalled it keeps polling, and it returns promptly once the stall
/// ends and the kernel publishes.
#[test]
fn a_batch_waiter_sees_its_completions_by_polling_host_memory() {
    let a = node(options(0, LaunchMode::Persistent, 8), 1 << 20);
    let b = node(options(1, LaunchMode::Persistent, 8), 1 << 20);
    let twin = a.twin();
    let requests = writes(&a, &b, 4, 4096);
    twin.stall_channel(0, true);
    twin.stall_channel(1, true);
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    let started = std::time::Instant::now();
    let (status, resumed) = std::thread::scope(|scope| {
        let resumer = scope.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            twin.stall_channel(0, false);
            twin.stall_channel(1, false);
            std::time::Instant::now()
        });
        let status = a.engine.wait_batch(batch).expect("wait");
        (status, resumer.join().expect("resumer"))
    });
    let returned = std::time::Instant::now();
    assert_eq!(status.state, TransferState::Completed, "{:?}", a.engine.task_reason(batch, 0));
    assert!(returned >= resumed, "returned before the stall ended");
    let after = returned - resumed;
    assert!(after < std::time::Duration::from_secs(1), "returned {after:?} after the stall ended");
    eprintln!("waited {:?} in all, {after:?} after the stall ended", started.elapsed());
}

/// `wait_batch_for` returns at the caller's limit with the batch still PENDING while its channels are stalled (the
/// tasks' deadline is far off), and COMPLETED once they run again.
#[test]
fn a_bounded_batch_wait_returns_pending_at_its_limit_and_completed_once_the_work_is_done() {
    let a = node(options(0, LaunchMode::Persistent, 8), 1 << 20);
    let b = node(options(1, LaunchMode::Persistent, 8), 1 << 20);
    let twin = a.twin();
    let requests = writes(&a, &b, 4, 4096);
    twin.stall_channel(0, true);
    twin.stall_channel(1, true);
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    let started = std::time::Instant::now();
    let status = a.engine.wait_batch_for(batch, std::time::Duration::from_millis(100)).expect("wait");
    let waited = started.elapsed();
    assert_eq!(status.state, TransferState::Pending, "{:?}", a.engine.task_reason(batch, 0));
    assert!(waited >= std::time::Duration::from_millis(100), "returned after {waited:?}, before its limit");
    assert!(waited < std::time::Duration::from_secs(2), "returned {waited:?} after a 100 ms limit");
    twin.stall_channel(0, false);
    twin.stall_channel(1, false);
    let status = a.engine.wait_batch_for(batch, std::time::Duration::from_secs(10)).expect("wait");
    assert_eq!(status.state, TransferState::Completed, "{:?}", a.engine.task_reason(batch, 0));
    a.engine.free_batch(batch).expect("free");
}

/// A thread that waits for each transfer keeps to one block (the other blocks' kernels can idle); a submit made while
/// that block still has work in flight goes to another block.
#[test]
fn a_waiting_thread_keeps_to_its_block_and_a_busy_block_sends_the_next_submit_elsewhere() {
    let a = node(options(0, LaunchMode::Persistent, 8), 1 << 20);
    let b = node(options(1, LaunchMode::Persistent, 8), 1 << 20);
    let requests = writes(&a, &b, 8, 4096);
    let transport = a.device.transport();
    for request in &requests[..4] {
        let batch = a.engine.allocate_batch(1).expect("batch");
        a.engine.submit_transfer(batch, std::slice::from_ref(request)).expect("submit");
        assert_eq!(a.engine.wait_batch(batch).expect("wait").state, TransferState::Completed);
        a.engine.free_batch(batch).expect("free");
    }
    let per_block = transport.completions_per_block();
    assert_eq!(per_block.iter().sum::<u64>(), 4);
    let home = per_block.iter().position(|&n| n == 4).unwrap_or_else(|| panic!("spread over blocks: {per_block:?}"));

    // Two submits back to back while the home block's channel is stalled: the second goes to the other block.
    let twin = a.twin();
    twin.stall_channel(home as u32, true);
    let first = a.engine.allocate_batch(1).expect("batch");
    a.engine.submit_transfer(first, &requests[4..5]).expect("submit");
    let second = a.engine.allocate_batch(1).expect("batch");
    a.engine.submit_transfer(second, &requests[5..6]).expect("submit");
    assert_eq!(a.engine.wait_batch(second).expect("wait").state, TransferState::Completed);
    twin.stall_channel(home as u32, false);
    assert_eq!(a.engine.wait_batch(first).expect("wait").state, TransferState::Completed);
    let after = transport.completions_per_block();
    assert_eq!(after[home], 5, "the first submit stayed home: {after:?}");
    assert_eq!(after.iter().sum::<u64>(), 6, "{after:?}");
}
