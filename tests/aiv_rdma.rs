//! Twin end-to-end tests of the aiv transport's RDMA route (docs/rdma.md section 7): two engines in one process,
//! each with its own twin device and twin NIC on 127.0.0.1, P2P handshake metadata. With `"route": "rdma"` their
//! transfers go over QPs set up through the Connection handshake, posted by the kernel as WQEs; with `"auto"` two
//! engines of one process (one host identity) keep to SDMA. Twin runtime only: unverified on hardware.
//!
//! The RDMA cases need the kernel's RDMA route (the rdma-kernel branch): without it the kernel does not post WQEs
//! and these cases fail (the NIC counts no WQE).

#[path = "common/aiv.rs"]
mod common;

use std::time::{Duration, Instant};

use aiv_transport::config::{AivOptions, LaunchMode, RouteMode};
use aiv_transport::evidence::Source;
use aiv_transport::{Opcode, SegmentId, TransferRequest, TransferState};
use common::{node, options, Node};
use rand::{Rng, RngCore, SeedableRng};

const BUFFER: u64 = 16 << 20;

fn rdma_options(route: RouteMode) -> AivOptions {
    AivOptions {
        route,
        rdma_host: Some("127.0.0.1".into()),
        rdma_sq_depth: 64,
        rdma_max_wqe_bytes: 1 << 20,
        transfer_timeout: Duration::from_secs(10),
        ..options(0, LaunchMode::Persistent, 8)
    }
}

fn device_of(node: &Node) -> i32 {
    node.engine.config().aiv.device_id as i32
}

fn wqes(node: &Node) -> u64 {
    cann_twin::nic::counters(device_of(node)).map(|c| c.wqes_executed).unwrap_or(0)
}

/// Submits `requests` from `a` and waits; returns each task's state and reason.
fn run(a: &Node, requests: &[TransferRequest]) -> Vec<(TransferState, Option<String>)> {
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, requests).expect("submit");
    let _ = a.engine.wait_batch(batch).expect("wait");
    let out = (0..requests.len())
        .map(|task| {
            (
                a.engine.transfer_status(batch, task).expect("status").state,
                a.engine.task_reason(batch, task).expect("reason"),
            )
        })
        .collect();
    a.engine.free_batch(batch).expect("free");
    out
}

fn request(
    opcode: Opcode,
    a: &Node,
    local: u64,
    peer: SegmentId,
    b: &Node,
    remote: u64,
    length: u64,
) -> TransferRequest {
    TransferRequest {
        opcode,
        source: a.buffer.addr() + local,
        target_id: peer,
        target_offset: b.buffer.addr() + remote,
        length,
        protocol: None,
    }
}

fn pair(route_a: RouteMode, route_b: RouteMode) -> (Node, Node) {
    let a = node(rdma_options(route_a), BUFFER);
    let b = node(rdma_options(route_b), BUFFER);
    (a, b)
}

/// Withdraws `node`'s NIC registrations behind its peers' backs: their WRITEs into it get REMOTE_ACCESS_ERR.
fn withdraw_registrations(node: &Node) {
    for (_, lkey) in node.device.transport().rdma_registrations() {
        cann_twin::nic::deregister_memory(device_of(node), lkey).expect("deregister");
    }
}

/// Two engines on the RDMA route, `b` opened by `a`, their QP set up by a first 4 KiB WRITE.
fn warm_rdma_pair() -> (Node, Node, SegmentId) {
    let (a, b) = pair(RouteMode::Rdma, RouteMode::Rdma);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let warm = run(&a, &[request(Opcode::Write, &a, 0, peer, &b, 0, 4096)]);
    assert_eq!(warm[0].0, TransferState::Completed, "{warm:?}");
    (a, b, peer)
}

#[test]
fn rdma_writes_and_reads_of_random_sizes_and_offsets_move_the_data() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    let (mut a, mut b) = pair(RouteMode::Rdma, RouteMode::Rdma);
    assert!(a.device.transport().rdma_available(), "the twin NIC opens");
    a.modify(|bytes| rng.fill_bytes(bytes));
    b.modify(|bytes| rng.fill_bytes(bytes));
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let before = wqes(&a);
    for round in 0..3 {
        let slots = 3u64;
        let span = BUFFER / slots;
        let requests: Vec<TransferRequest> = (0..slots)
            .map(|i| {
                let length = rng.gen_range(1..=(4u64 << 20).min(span / 2));
                let local = i * span + rng.gen_range(0..span - length);
                let remote = i * span + rng.gen_range(0..span - length);
                let opcode = if rng.gen_bool(0.5) { Opcode::Read } else { Opcode::Write };
                request(opcode, &a, local, peer, &b, remote, length)
            })
            .collect();
        let expected: Vec<Vec<u8>> = requests
            .iter()
            .map(|r| match r.opcode {
                Opcode::Read => b.read(
                    (r.target_offset - b.buffer.addr()) as usize
                        ..(r.target_offset - b.buffer.addr() + r.length) as usize,
                ),
                Opcode::Write => {
                    a.read((r.source - a.buffer.addr()) as usize..(r.source - a.buffer.addr() + r.length) as usize)
                }
            })
            .collect();
        for (task, (state, reason)) in run(&a, &requests).into_iter().enumerate() {
            assert_eq!(state, TransferState::Completed, "round {round} task {task}: {reason:?}");
            let r = &requests[task];
            let landed = match r.opcode {
                Opcode::Read => {
                    a.read((r.source - a.buffer.addr()) as usize..(r.source - a.buffer.addr() + r.length) as usize)
                }
                Opcode::Write => b.read(
                    (r.target_offset - b.buffer.addr()) as usize
                        ..(r.target_offset - b.buffer.addr() + r.length) as usize,
                ),
            };
            assert!(landed == expected[task], "round {round} task {task}: data differs");
        }
    }
    assert!(wqes(&a) > before, "the transfers went through the initiator's NIC as WQEs");
}

#[test]
fn the_engine_refuses_an_out_of_bounds_remote_range_before_posting() {
    let (a, b) = pair(RouteMode::Rdma, RouteMode::Rdma);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let before = wqes(&a);
    let outcome = run(&a, &[request(Opcode::Write, &a, 0, peer, &b, BUFFER - 10, 4096)]);
    assert_eq!(outcome[0].0, TransferState::Failed, "{outcome:?}");
    assert_eq!(wqes(&a), before, "nothing was posted");
}

#[test]
fn a_range_the_target_nic_refuses_fails_that_transfer_and_the_next_batch_works() {
    let (a, b, peer) = warm_rdma_pair();
    // Withdraw the target's registration behind the initiator's back: its NIC answers REMOTE_ACCESS_ERR.
    withdraw_registrations(&b);
    let refused = run(&a, &[request(Opcode::Write, &a, 0, peer, &b, 4096, 4096)]);
    assert_eq!(refused[0].0, TransferState::Failed, "{refused:?}");
    let reason = refused[0].1.clone().unwrap_or_default();
    assert!(reason.contains("remote access error"), "{reason}");
    assert!(reason.contains(b.engine.name()) && reason.contains("QP"), "names the peer and the QP: {reason}");
    // Registered again, descriptor refreshed: the next batch runs on a new QP (the old one is in error).
    b.engine.refresh_rdma_registration().expect("register again");
    a.engine.refresh_segment(peer).expect("refresh");
    let again = run(
        &a,
        &[request(Opcode::Read, &a, 8192, peer, &b, 0, 1 << 20), request(Opcode::Write, &a, 0, peer, &b, 0, 64)],
    );
    for (state, reason) in &again {
        assert_eq!(*state, TransferState::Completed, "{reason:?}");
    }
}

#[test]
fn a_dropped_target_fails_pending_transfers_within_the_timeout_and_new_ones_fast() {
    let (a, b, peer) = warm_rdma_pair();
    let requests: Vec<TransferRequest> =
        (0..8).map(|i| request(Opcode::Write, &a, i << 20, peer, &b, i << 20, 1 << 20)).collect();
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    let b_base = b.buffer.addr();
    let started = Instant::now();
    drop(b);
    let _ = a.engine.wait_batch(batch).expect("wait");
    assert!(started.elapsed() < Duration::from_secs(10), "every pending transfer ended within the timeout");
    let fresh = run(
        &a,
        &[TransferRequest {
            opcode: Opcode::Write,
            source: a.buffer.addr(),
            target_id: peer,
            target_offset: b_base,
            length: 4096,
            protocol: None,
        }],
    );
    assert_eq!(fresh[0].0, TransferState::Failed, "{fresh:?}");
    assert!(fresh[0].1.as_deref().is_some_and(|reason| !reason.is_empty()), "{fresh:?}");
}

#[test]
fn route_sdma_to_a_peer_on_another_host_is_a_clear_error() {
    let a = node(rdma_options(RouteMode::Sdma), BUFFER);
    let b = node(AivOptions { host_identity: Some("another-host".into()), ..rdma_options(RouteMode::Auto) }, BUFFER);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let outcome = run(&a, &[request(Opcode::Write, &a, 0, peer, &b, 0, 4096)]);
    assert_eq!(outcome[0].0, TransferState::Failed, "{outcome:?}");
    let reason = outcome[0].1.clone().unwrap_or_default();
    assert!(reason.contains("another host") && reason.contains("\"sdma\""), "{reason}");
}

#[test]
fn route_auto_between_engines_of_one_process_stays_on_sdma() {
    let (a, b) = pair(RouteMode::Auto, RouteMode::Auto);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let before = wqes(&a);
    let batch = a.engine.allocate_batch(1).expect("batch");
    a.engine.submit_transfer(batch, &[request(Opcode::Write, &a, 0, peer, &b, 0, 4096)]).expect("submit");
    let _ = a.engine.wait_batch(batch).expect("wait");
    let reason = a.engine.task_reason(batch, 0).expect("reason");
    assert_eq!(a.engine.transfer_status(batch, 0).expect("status").state, TransferState::Completed, "{reason:?}");
    let evidence = a.engine.task_evidence(batch, 0).expect("task").expect("evidence");
    assert_eq!(evidence.descriptors_written.source, Source::TwinModel, "SDMA SQEs in the twin's log: {evidence:?}");
    assert_eq!(wqes(&a), before, "no WQE");
}

/// QPs created on `node`'s NIC so far: every QP handshake an initiator starts creates one (destroyed again when the
/// handshake fails).
fn qps_created(node: &Node) -> u64 {
    cann_twin::nic::counters(device_of(node)).map(|c| c.qps_created).unwrap_or(0)
}

#[test]
fn a_failed_qp_handshake_fails_transfers_fast_with_its_reason_then_retries() {
    use aiv_transport::transport::aiv::HANDSHAKE_RETRY;
    let (a, b) = pair(RouteMode::Rdma, RouteMode::Rdma);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    // The target still advertises its NIC but can no longer create QPs: its handler refuses the handshake.
    cann_twin::nic::close(device_of(&b)).expect("close the target's NIC");
    let write = [request(Opcode::Write, &a, 0, peer, &b, 0, 4096)];
    let handshakes = qps_created(&a);
    let started = Instant::now();
    let first = run(&a, &write);
    let ended = Instant::now();
    assert_eq!(first[0].0, TransferState::Failed, "{first:?}");
    let reason = first[0].1.clone().unwrap_or_default();
    assert!(reason.contains("QP handshake") && reason.contains("refused"), "{reason}");
    assert!(started.elapsed() < Duration::from_secs(5), "bounded: {:?}", started.elapsed());
    assert_eq!(qps_created(&a), handshakes + 1, "the transfer tried one QP handshake");
    // Within the retry interval the next transfer fails with the same reason, without a new handshake. The
    // interval began when the handshake failed, after its transfer started (`opened`): a handshake by a transfer
    // that ended before `opened + HANDSHAKE_RETRY` came inside it. A transfer slower than the interval tries a new
    // handshake (which opens a new interval): on such a machine the next transfer is tried, up to 20 in all.
    let (mut opened, mut last_handshake_ended) = (started, ended);
    let mut inside = None;
    for _ in 0..20 {
        let before = qps_created(&a);
        let began = Instant::now();
        let next = run(&a, &write);
        let done = Instant::now();
        assert_eq!(next[0].0, TransferState::Failed, "{next:?}");
        match qps_created(&a) - before {
            0 => {
                inside = Some(next);
                break;
            }
            1 => {
                let after = done.duration_since(opened);
                assert!(after >= HANDSHAKE_RETRY, "a new QP handshake {after:?} into the retry interval");
                (opened, last_handshake_ended) = (began, done);
            }
            more => panic!("{more} QP handshakes for one transfer"),
        }
    }
    let second = inside.expect("in 20 transfers none came within the retry interval of the previous handshake");
    assert_eq!(second[0].1, first[0].1, "the same reason, without a new handshake");
    // After it, a transfer tries again (and fails again: the NIC is still closed). The interval of the last handshake
    // has ended by HANDSHAKE_RETRY after that handshake's transfer returned.
    std::thread::sleep((last_handshake_ended + HANDSHAKE_RETRY).saturating_duration_since(Instant::now()));
    let before = qps_created(&a);
    let third = run(&a, &write);
    assert_eq!(third[0].0, TransferState::Failed, "{third:?}");
    assert_eq!(qps_created(&a), before + 1, "after the retry interval the transfer tried a new QP handshake");
}

#[test]
fn old_descriptors_without_host_or_rdma_parse() {
    let old = serde_json::json!({"device": "d", "device_id": 0, "backend": "cann",
        "regions": [{"addr": 4096, "length": 4096, "export_id": 7}]});
    let parsed: aiv_transport::device::DeviceAdvertisement = serde_json::from_value(old).expect("parses");
    assert_eq!((parsed.rdma, parsed.host), (None, None));
}

#[test]
fn a_target_whose_link_is_down_fails_its_transfers_within_the_retries_and_other_peers_keep_working() {
    let a = node(AivOptions { rdma_timeout: Duration::from_millis(50), ..rdma_options(RouteMode::Rdma) }, BUFFER);
    let b = node(rdma_options(RouteMode::Rdma), BUFFER);
    let c = node(rdma_options(RouteMode::Rdma), BUFFER);
    let to_b = a.engine.open_segment(b.engine.name()).expect("segment b");
    let to_c = a.engine.open_segment(c.engine.name()).expect("segment c");
    let warm =
        run(&a, &[request(Opcode::Write, &a, 0, to_b, &b, 0, 4096), request(Opcode::Write, &a, 0, to_c, &c, 0, 4096)]);
    assert!(warm.iter().all(|(state, _)| *state == TransferState::Completed), "{warm:?}");
    cann_twin::control::nic_link_down(device_of(&b), true).expect("link down");
    let started = Instant::now();
    let down = run(&a, &[request(Opcode::Write, &a, 0, to_b, &b, 0, 4096)]);
    assert_eq!(down[0].0, TransferState::Failed, "{down:?}");
    let reason = down[0].1.clone().unwrap_or_default();
    assert!(reason.contains("transport retry count exceeded"), "{reason}");
    // 8 attempts of 50 ms, with room for the loopback's pace.
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    let other = run(&a, &[request(Opcode::Read, &a, 0, to_c, &c, 0, 4096)]);
    assert_eq!(other[0].0, TransferState::Completed, "{other:?}");
    cann_twin::control::nic_link_down(device_of(&b), false).expect("link up");
    // The QP to b went to error: the next transfer handshakes a new one and works.
    let back = run(&a, &[request(Opcode::Write, &a, 0, to_b, &b, 0, 4096)]);
    assert_eq!(back[0].0, TransferState::Completed, "{back:?}");
}

#[test]
fn the_twin_nic_observes_the_kernel_writing_the_wqes_ringing_and_reading_each_cqe() {
    let (a, b) = pair(RouteMode::Rdma, RouteMode::Rdma);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    // Pieces of at most 1 MiB (rdma_max_wqe_bytes): 1, 3 and 2 WQEs, writes and reads.
    let requests = [
        request(Opcode::Write, &a, 0, peer, &b, 0, 4096),
        request(Opcode::Read, &a, 4 << 20, peer, &b, 4 << 20, (5 << 19) + 7),
        request(Opcode::Write, &a, 8 << 20, peer, &b, 8 << 20, 2 << 20),
    ];
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    let _ = a.engine.wait_batch(batch).expect("wait");
    for (task, wqes) in [1u64, 3, 2].into_iter().enumerate() {
        let status = a.engine.transfer_status(batch, task).expect("status");
        assert_eq!(status.state, TransferState::Completed, "task {task}: {:?}", a.engine.task_reason(batch, task));
        let evidence = a.engine.task_evidence(batch, task).expect("task").expect("evidence");
        assert_eq!(evidence.route, Some("rdma"), "{evidence:?}");
        let acts = [evidence.descriptors_written, evidence.doorbells_rung, evidence.completion_seen];
        assert!(acts.iter().all(|act| act.source == Source::TwinModel), "the NIC's log, not a tally: {evidence:?}");
        let written = evidence.descriptors_written;
        assert_eq!((written.by_aiv, written.by_host, written.unattributed), (wqes, 0, 0), "task {task}: {evidence:?}");
        let rung = evidence.doorbells_rung;
        assert!(rung.by_aiv >= 1 && rung.by_host == 0 && rung.unattributed == 0, "task {task}: {evidence:?}");
        assert_eq!(evidence.completion_seen.by_aiv, 1, "the kernel read the CQE first: {evidence:?}");
        assert_eq!(evidence.checks().aiv_direct(), aiv_transport::evidence::Check::Yes, "task {task}: {evidence:?}");
    }
    a.engine.free_batch(batch).expect("free");
}

/// A submit holds its QP slot's lock while it checks the QP (through a whole handshake when it sets one up). The
/// drain never waits for it: transfers drained meanwhile complete with their evidence from the QP they were posted
/// on, and a failure learnt meanwhile still has the QP replaced. (Evidence looked up through the slot would come out
/// lost, and a loaded run's AIV-direct verdict would read unknown.)
#[test]
fn transfers_drained_while_a_submit_holds_their_qp_slot_keep_their_evidence() {
    use aiv_transport::evidence::Check;
    let (a, b, peer) = warm_rdma_pair();
    let requests: Vec<TransferRequest> =
        (0..4).map(|i| request(Opcode::Write, &a, i << 20, peer, &b, i << 20, (64 << 10) + i * 8)).collect();
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    {
        let transport = a.device.transport();
        let _held = transport.hold_rdma_slots_for_tests();
        let _ = a.engine.wait_batch(batch).expect("wait");
        for task in 0..requests.len() {
            let status = a.engine.transfer_status(batch, task).expect("status");
            assert_eq!(status.state, TransferState::Completed, "{:?}", a.engine.task_reason(batch, task));
            let evidence = a.engine.task_evidence(batch, task).expect("task").expect("evidence");
            assert_eq!(evidence.descriptors_written.source, Source::TwinModel, "not lost: {evidence:?}");
            assert_eq!(evidence.checks().aiv_direct(), Check::Yes, "task {task}: {evidence:?}");
        }
    }
    a.engine.free_batch(batch).expect("free");
    // A remote access error drained while the slots are held: the next submit still replaces the QP in error.
    withdraw_registrations(&b);
    let batch = a.engine.allocate_batch(1).expect("batch");
    a.engine.submit_transfer(batch, &[request(Opcode::Write, &a, 0, peer, &b, 0, 4096)]).expect("submit");
    {
        let transport = a.device.transport();
        let _held = transport.hold_rdma_slots_for_tests();
        let _ = a.engine.wait_batch(batch).expect("wait");
        assert_eq!(a.engine.transfer_status(batch, 0).expect("status").state, TransferState::Failed);
        let reason = a.engine.task_reason(batch, 0).expect("reason").unwrap_or_default();
        assert!(reason.contains("remote access error") && reason.contains("QP 0x"), "{reason}");
    }
    a.engine.free_batch(batch).expect("free");
    b.engine.refresh_rdma_registration().expect("register again");
    a.engine.refresh_segment(peer).expect("refresh");
    let again = run(&a, &[request(Opcode::Write, &a, 0, peer, &b, 0, 4096)]);
    assert_eq!(again[0].0, TransferState::Completed, "{again:?}");
}

/// The negative case, through the whole engine: the kernel's SQ doorbells are diverted (test-only mis-wiring) and a
/// Host thread rings them instead. The data still moves; the WQEs stay the kernel's and it still reads the CQEs, but
/// the NIC saw the Host ring: exactly the doorbell check of each RDMA transfer turns to no.
#[test]
fn sq_doorbells_rung_by_the_host_turn_the_doorbell_check_to_no() {
    use aiv_transport::evidence::Check;
    let (mut a, b) = pair(RouteMode::Rdma, RouteMode::Rdma);
    a.modify(|bytes| bytes[..4 << 20].fill(0x5A));
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    // The QP is set up (and its first WQE rung by the kernel) before the divert.
    let warm = run(&a, &[request(Opcode::Write, &a, 0, peer, &b, 0, 4096)]);
    assert_eq!(warm[0].0, TransferState::Completed, "{warm:?}");
    a.twin().divert_sq_doorbells(true);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let forwarder = {
        let (stop, twin) = (stop.clone(), a.twin());
        std::thread::spawn(move || {
            let (mut forwarded, mut rung) = (std::collections::HashMap::new(), 0);
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                rung += twin.forward_sq_doorbells(&mut forwarded);
                std::thread::yield_now();
            }
            rung
        })
    };
    let requests = [
        request(Opcode::Write, &a, 0, peer, &b, 0, 4096),
        request(Opcode::Write, &a, 1 << 20, peer, &b, 1 << 20, (2 << 20) + 5),
    ];
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    let _ = a.engine.wait_batch(batch).expect("wait");
    stop.store(true, std::sync::atomic::Ordering::Release);
    let rung = forwarder.join().expect("forwarder");
    a.twin().divert_sq_doorbells(false);
    assert!(rung >= 1, "the Host forwarded no doorbell");
    for task in 0..requests.len() {
        let status = a.engine.transfer_status(batch, task).expect("status");
        assert_eq!(status.state, TransferState::Completed, "task {task}: {:?}", a.engine.task_reason(batch, task));
        let evidence = a.engine.task_evidence(batch, task).expect("task").expect("evidence");
        assert_eq!(evidence.route, Some("rdma"), "{evidence:?}");
        let (written, rung, seen) = (evidence.descriptors_written, evidence.doorbells_rung, evidence.completion_seen);
        assert!(written.by_aiv >= 1 && written.by_host == 0, "task {task}: {evidence:?}");
        assert!(rung.by_host >= 1 && rung.by_aiv == 0, "the Host rang, no core: task {task}: {evidence:?}");
        assert_eq!(seen.by_aiv, 1, "the kernel still read the CQE: {evidence:?}");
        let checks = evidence.checks();
        assert_eq!((checks.kernel_writes_descriptors, checks.kernel_rings_doorbell), (Check::Yes, Check::No));
        assert_eq!(checks.aiv_direct(), Check::No, "task {task}: {evidence:?}");
    }
    a.engine.free_batch(batch).expect("free");
    assert!(b.read(0..4096) == a.read(0..4096), "the first WRITE landed");
    assert!(b.read(1 << 20..(3 << 20) + 5) == a.read(1 << 20..(3 << 20) + 5), "the second WRITE landed");
    // Restored: the kernel's own doorbells again.
    let after = run(&a, &[request(Opcode::Write, &a, 0, peer, &b, 0, 4096)]);
    assert_eq!(after[0].0, TransferState::Completed, "{after:?}");
}
