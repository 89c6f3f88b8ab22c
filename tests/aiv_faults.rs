//! Fault tests of the aiv twin: nothing hangs. A bad address stops the SDMA channel with a structured exception
//! and the transfer FAILS with it; a stalled engine makes transfers TIMEOUT within the kernel wait budget; the abort
//! flag ends a wait early; the Host watchdog bounds everything; and after each fault the engine serves new batches.
//! Faults are injected through the twin runtime's control API (`cann_twin::control`: `fail_next_destinations`,
//! `set_stalled`).

#[path = "common/aiv.rs"]
mod common;

use std::time::{Duration, Instant};

use aiv_transport::config::LaunchMode;
use aiv_transport::{TransferEngine, TransferRequest, TransferState};
use common::{node, options, writes, Node};

fn run(engine: &TransferEngine, requests: &[TransferRequest]) -> (Vec<TransferState>, Vec<Option<String>>) {
    let batch = engine.allocate_batch(requests.len()).expect("batch");
    engine.submit_transfer(batch, requests).expect("submit");
    engine.wait_batch(batch).expect("wait");
    let states = (0..requests.len()).map(|t| engine.transfer_status(batch, t).expect("status").state).collect();
    let reasons = (0..requests.len()).map(|t| engine.task_reason(batch, t).expect("reason")).collect();
    engine.free_batch(batch).expect("free");
    (states, reasons)
}

fn assert_serves_normally(a: &Node, b: &Node) {
    let (states, reasons) = run(&a.engine, &writes(a, b, 4, 300_000));
    assert!(states.iter().all(|s| *s == TransferState::Completed), "{states:?} {reasons:?}");
    assert!(a.read(0..1_200_000) == b.read(0..1_200_000));
}

fn bad_address_fails_with_the_exception(mode: LaunchMode) {
    let mut a = node(options(0, mode, 8), 4 << 20);
    let b = node(options(1, mode, 8), 4 << 20);
    a.modify(|bytes| bytes.fill(7));
    let twin = a.twin();
    twin.fail_next_destinations(1);
    let started = Instant::now();
    let (states, reasons) = run(&a.engine, &writes(&a, &b, 1, 4096));
    assert_eq!(states, [TransferState::Failed], "{reasons:?}");
    let reason = reasons[0].clone().expect("reason");
    assert!(reason.contains("SDMA exception"), "{reason}");
    assert!(reason.contains("destination range is outside every mapped window"), "{reason}");
    assert!(reason.contains("raw SQE 0b00"), "the raw SQE starts with type 11: {reason}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(a.device.transport().counters().channel_resets >= 1);
    assert_serves_normally(&a, &b);
}

#[test]
fn bad_address_fails_with_the_sdma_exception_then_the_engine_serves_again() {
    bad_address_fails_with_the_exception(LaunchMode::Persistent);
}

#[test]
fn bad_address_in_per_batch_mode_also_recovers() {
    bad_address_fails_with_the_exception(LaunchMode::PerBatch);
}

#[test]
fn a_stalled_engine_times_out_within_the_kernel_budget_then_recovers() {
    let mut a = node(options(0, LaunchMode::Persistent, 8), 4 << 20);
    let b = node(options(1, LaunchMode::Persistent, 8), 4 << 20);
    a.modify(|bytes| bytes.fill(3));
    let twin = a.twin();
    twin.stall_channel(0, true);
    twin.stall_channel(1, true);
    let started = Instant::now();
    let (states, reasons) = run(&a.engine, &writes(&a, &b, 2, 4096));
    let waited = started.elapsed();
    assert_eq!(states, [TransferState::Timeout, TransferState::Timeout], "{reasons:?}");
    let reason = reasons[0].clone().expect("reason");
    assert!(reason.contains("wait budget") && reason.contains("no SDMA exception"), "{reason}");
    // Kernel budget 300 ms, transfer timeout 10 s: the kernel's budget decided.
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "{waited:?}");
    twin.stall_channel(0, false);
    twin.stall_channel(1, false);
    assert_serves_normally(&a, &b);
}

#[test]
fn the_abort_flag_ends_a_long_wait_early() {
    let mut opts = options(0, LaunchMode::Persistent, 8);
    opts.kernel_wait_budget = Duration::from_secs(60);
    opts.transfer_timeout = Duration::from_secs(60);
    let mut a = node(opts.clone(), 4 << 20);
    let b = node(options(1, LaunchMode::Persistent, 8), 4 << 20);
    a.modify(|bytes| bytes.fill(5));
    let twin = a.twin();
    twin.stall_channel(0, true);
    twin.stall_channel(1, true);
    let transport = a.device.transport().clone();
    let stalled = a.twin();
    // The abort comes once the kernel waits: a group takes the abort epoch when it starts, before it rings its SQEs,
    // so it is raised when every group is rung on the stalled channels (the two data SQEs and one flag SQE per
    // group; a group on each channel, or both transfers in one).
    let aborter = std::thread::spawn(move || {
        common::wait_until(Duration::from_secs(10), || {
            let rung = [stalled.rung_sqes(0), stalled.rung_sqes(1)];
            let groups = rung.iter().filter(|&&count| count > 0).count() as u32;
            if groups > 0 && rung.iter().sum::<u32>() == 2 + groups {
                Ok(())
            } else {
                Err(format!("the two transfers and their flags rung on the stalled channels 0 and 1: {rung:?}"))
            }
        });
        transport.abort();
    });
    let started = Instant::now();
    let (states, reasons) = run(&a.engine, &writes(&a, &b, 2, 4096));
    aborter.join().expect("aborter");
    assert!(started.elapsed() < Duration::from_secs(5), "abort must end the 60 s wait: {:?}", started.elapsed());
    assert_eq!(states, [TransferState::Failed, TransferState::Failed], "{reasons:?}");
    assert!(reasons[0].as_deref().is_some_and(|r| r.contains("aborted")), "{reasons:?}");
    twin.stall_channel(0, false);
    twin.stall_channel(1, false);
    assert_serves_normally(&a, &b);
}

#[test]
fn the_host_watchdog_bounds_a_transfer_when_the_kernel_budget_is_longer() {
    let mut opts = options(0, LaunchMode::Persistent, 8);
    opts.kernel_wait_budget = Duration::from_secs(60);
    opts.transfer_timeout = Duration::from_millis(400);
    let mut a = node(opts, 4 << 20);
    let b = node(options(1, LaunchMode::Persistent, 8), 4 << 20);
    a.modify(|bytes| bytes.fill(9));
    let twin = a.twin();
    twin.stall_channel(0, true);
    twin.stall_channel(1, true);
    let started = Instant::now();
    let (states, reasons) = run(&a.engine, &writes(&a, &b, 1, 4096));
    assert_eq!(states, [TransferState::Timeout], "{reasons:?}");
    assert!(reasons[0].as_deref().is_some_and(|r| r.contains("host watchdog")), "{reasons:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    // The kernel is still waiting (60 s budget): abort it while the engine is still stalled, wait for its (late,
    // ignored) DCQ entry and the channel reset, then release the engine; the engine serves again.
    a.device.transport().abort();
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.device.transport().counters().channel_resets == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let counters = a.device.transport().counters();
    assert_eq!((counters.completions, counters.channel_resets), (1, 1), "{counters:?}");
    twin.stall_channel(0, false);
    twin.stall_channel(1, false);
    assert_serves_normally(&a, &b);
}

#[test]
fn a_stall_with_two_groups_in_flight_fails_both_groups_then_recovers() {
    // 200 transfers over 2 blocks: 100 each, taken as a group of 64 and a group of 36 that are both posted before
    // the kernel waits for the first flag (the SQ holds both: 256 entries).
    let mut opts = options(0, LaunchMode::Persistent, 8);
    opts.sq_depth = 256;
    let mut a = node(opts, 4 << 20);
    let b = node(options(1, LaunchMode::Persistent, 8), 4 << 20);
    a.modify(|bytes| bytes.fill(4));
    let twin = a.twin();
    twin.stall_channel(0, true);
    twin.stall_channel(1, true);
    let (states, reasons) = run(&a.engine, &writes(&a, &b, 200, 1000));
    assert!(states.iter().all(|s| *s == TransferState::Timeout), "{states:?} {:?}", reasons[0]);
    assert_eq!(a.device.transport().counters().channel_resets, 2, "one reset per halted block");
    twin.stall_channel(0, false);
    twin.stall_channel(1, false);
    assert_serves_normally(&a, &b);
    let (states, _) = run(&a.engine, &writes(&a, &b, 200, 1000));
    assert!(states.iter().all(|s| *s == TransferState::Completed));
}
