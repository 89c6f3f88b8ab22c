//! The Host-submitted baselines on the `cann` device backend, against fake CANN libraries (feature `cann`).
//!
//! `ubshmem`: the backend's copy streams (`aclrtCreateStreamWithConfig`, `aclrtMemcpyAsync` D2D,
//! `aclrtSynchronizeStreamWithTimeout`, `aclrtDestroyStream`) over the fake ACL of
//! `shmem-bindings/ascendcl-sys/tests/fake/fake_acl.c` (built with `FAKE_BACKEND`), whose "device memory" is host
//! memory and whose VMM import really aliases the exporter's bytes, so the bytes a transfer moves can be checked.
//! The fake copies at once; a synchronisation timeout or a task exception is injected through its result overrides.
//!
//! `adxl`: the HiXL client/server API over the fake `libcann_hixl.so` of
//! `shmem-bindings/ascendcl-sys/tests/fake/fake_hixl.c` (in-process servers, memcpy at submit, injectable statuses
//! and never-completing batches): server per device, connect per peer, batch put/get with the bytes checked, and
//! each failure mapped to its ADXL status. Like the vendor's, the fake has no twin-only evidence function: who wrote
//! the descriptors and rang the doorbells is not observable, the Host's final status queries are its completion. A
//! missing HiXL library is `tests/cann_hixl_missing.rs`.
//!
//! Nothing here shows how either path behaves on an NPU: unverified on hardware.
#![cfg(feature = "cann")]

#[path = "common/cann.rs"]
mod common;

use std::time::Duration;

use aiv_transport::evidence::{Act, Check, Source, Submitter};
use aiv_transport::transport::adxl::AdxlStatus;
use aiv_transport::{Opcode, Protocol, TransferState};
use common::*;

/// This binary loads the fake `libcann_hixl.so`.
const WITH_FAKE_HIXL: bool = true;

#[test]
fn ubshmem_on_cann_copies_through_acl_streams_into_the_peers_imported_heap() {
    let _serial = serial();
    let a = node(0);
    let b = node(1);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let sent = pattern(7, 200 << 10);
    a.write(4096, &sent);
    let theirs = pattern(91, 100 << 10);
    b.write(512 << 10, &theirs);
    acl_log();
    let tables_before = ascendcl_sys::calls::process();

    // WRITE of 200 KiB: 4 pieces (>= 64 KiB each) on 4 streams of the pool.
    let outcome = run(
        &a.engine,
        &[request(Protocol::Ubshmem, Opcode::Write, a.buffer.addr() + 4096, peer, b.buffer.addr() + 8192, 200 << 10)],
    );
    assert_eq!(outcome.states, [TransferState::Completed], "{:?}", outcome.reasons);
    assert_eq!(b.read(8192, sent.len()), sent, "the bytes landed in the peer's heap");
    let log = acl_log();
    let table_counts = ascendcl_sys::calls::process().since(&tables_before);
    let names = calls(&log);
    // The pool's 4 streams are created on the first transfer, on the submitting thread.
    assert_eq!(names.iter().filter(|c| **c == "aclrtCreateStreamWithConfig").count(), 4, "{log:?}");
    assert!(log.iter().any(|l| l == "aclrtCreateStreamWithConfig priority=0 flag=0"), "{log:?}");
    // The peer's heap was imported through VMM before the copies.
    let import = names.iter().position(|c| *c == "aclrtMemImportFromShareableHandle").expect("imported");
    let copies: Vec<&String> = log.iter().filter(|l| l.starts_with("aclrtMemcpyAsync")).collect();
    assert_eq!(
        copies, ["aclrtMemcpyAsync dest_max=51200 count=51200 kind=3"; 4],
        "four D2D pieces with destMax = count"
    );
    let syncs: Vec<&String> = log.iter().filter(|l| l.starts_with("aclrtSynchronizeStreamWithTimeout")).collect();
    assert_eq!(syncs, ["aclrtSynchronizeStreamWithTimeout timeout=300"; 4], "one bounded sync per stream used");
    // The worker is its own thread: it binds the device before its first copy (ACL's device is per thread), and
    // every copy is queued before the first synchronisation.
    let first_copy = names.iter().position(|c| *c == "aclrtMemcpyAsync").expect("copies");
    let first_sync = names.iter().position(|c| *c == "aclrtSynchronizeStreamWithTimeout").expect("syncs");
    let last_copy = names.iter().rposition(|c| *c == "aclrtMemcpyAsync").expect("copies");
    assert!(import < first_copy && last_copy < first_sync, "{log:?}");
    assert_eq!(log[first_copy - 1], "aclrtSetDevice device=0", "worker thread bound before copying: {log:?}");
    // The loader tables counted exactly what the fake logged (two independent counts of the same calls).
    assert_eq!(table_counts.total(), log.len() as u64, "{table_counts:?} against {log:?}");
    for name in &names {
        let logged = names.iter().filter(|c| *c == name).count() as u64;
        assert_eq!(table_counts.get("AclApi", name), logged, "{name}");
    }
    // The evidence is those counts: the 4 copies written and submitted by the runtime, the 4 synchronisations that
    // saw them complete; the calls made for it are the submitting thread's import of the peer's heap and the
    // worker's binding, copies and synchronisations (the pool's setup before them and the test's read after are not).
    let evidence = outcome.evidence[0].clone().expect("evidence");
    assert_eq!(evidence.path, "ubshmem");
    assert_eq!(evidence.window, 1);
    let logged = |name: &str| names.iter().filter(|c| **c == name).count() as u64;
    assert_eq!((logged("aclrtMemcpyAsync"), logged("aclrtSynchronizeStreamWithTimeout")), (4, 4));
    assert_eq!(evidence.descriptors_written, Act::host(Source::HostCalls, logged("aclrtMemcpyAsync")));
    assert_eq!(evidence.doorbells_rung, Act::host(Source::HostCalls, logged("aclrtMemcpyAsync")));
    assert_eq!(evidence.completion_seen, Act::host(Source::HostCalls, logged("aclrtSynchronizeStreamWithTimeout")));
    assert_eq!((evidence.descriptors, evidence.doorbells), (4, 4));
    let made_for_it =
        &log[import..=names.iter().rposition(|c| *c == "aclrtSynchronizeStreamWithTimeout").expect("syncs")];
    assert_eq!(evidence.host_device_api_calls, made_for_it.len() as u64, "{made_for_it:?}");
    assert_eq!(evidence.host_device_api_calls, 14, "5 import calls, 1 binding, 4 copies, 4 synchronisations");
    assert_eq!(evidence.checks().as_array(), [Check::No; 4]);

    // READ of 100 KiB from the peer: 2 pieces; the pool's streams are reused, nothing created.
    let outcome = run(
        &a.engine,
        &[request(
            Protocol::Ubshmem,
            Opcode::Read,
            a.buffer.addr() + (300 << 10),
            peer,
            b.buffer.addr() + (512 << 10),
            100 << 10,
        )],
    );
    assert_eq!(outcome.states, [TransferState::Completed], "{:?}", outcome.reasons);
    let log = acl_log();
    let evidence = outcome.evidence[0].clone().expect("evidence");
    assert_eq!(
        (evidence.descriptors_written, evidence.doorbells_rung, evidence.completion_seen),
        (Act::host(Source::HostCalls, 2), Act::host(Source::HostCalls, 2), Act::host(Source::HostCalls, 2))
    );
    assert_eq!(evidence.host_device_api_calls, log.len() as u64, "every call logged was made for it: {log:?}");
    assert_eq!(a.read(300 << 10, theirs.len()), theirs, "the peer's bytes were read");
    assert_eq!(
        calls(&log),
        [
            "aclrtMemcpyAsync",
            "aclrtMemcpyAsync",
            "aclrtSynchronizeStreamWithTimeout",
            "aclrtSynchronizeStreamWithTimeout"
        ],
        "{log:?}"
    );
    assert_eq!(a.device.ubshmem().counters().transfers, 2);

    // Dropping the engines destroys every stream (after a bounded synchronisation).
    drop(a);
    let log = acl_log();
    let destroyed = calls(&log).iter().filter(|c| **c == "aclrtDestroyStream").count();
    assert_eq!(destroyed, 4 + 1, "the pool's 4 streams, then the device's kernel stream: {log:?}");
    let first_destroy = calls(&log).iter().position(|c| *c == "aclrtDestroyStream").expect("destroyed");
    assert_eq!(log[first_destroy - 1], "aclrtSynchronizeStreamWithTimeout timeout=1000", "{log:?}");
    assert_eq!(calls(&log).last(), Some(&"aclrtResetDevice"), "streams go before the device: {log:?}");
    drop(b);
}

#[test]
fn ubshmem_on_cann_maps_a_sync_timeout_to_timeout_and_a_task_exception_to_failed() {
    let _serial = serial();
    let a = node(0);
    let b = node(1);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let write = request(Protocol::Ubshmem, Opcode::Write, a.buffer.addr(), peer, b.buffer.addr(), 4096);
    // Warm up: the pool and the import exist before the injection.
    assert_eq!(run(&a.engine, &[write]).states, [TransferState::Completed]);
    acl_log();

    // ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: the bound passed.
    set_acl_result("aclrtSynchronizeStreamWithTimeout", 507046);
    let outcome = run(&a.engine, &[write]);
    set_acl_result("aclrtSynchronizeStreamWithTimeout", 0);
    assert_eq!(outcome.states, [TransferState::Timeout], "{:?}", outcome.reasons);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(
        reason.contains("synchronisation did not finish within 300ms")
            && reason.contains("device 0: synchronize a copy stream (aclrtSynchronizeStreamWithTimeout)"),
        "{reason}"
    );
    assert!(outcome.elapsed < Duration::from_secs(5), "bounded: {:?}", outcome.elapsed);

    // ACL_ERROR_RT_AICORE_EXCEPTION from the synchronisation: the stream's task exception.
    set_acl_result("aclrtSynchronizeStreamWithTimeout", 507015);
    let outcome = run(&a.engine, &[write]);
    set_acl_result("aclrtSynchronizeStreamWithTimeout", 0);
    assert_eq!(outcome.states, [TransferState::Failed], "{:?}", outcome.reasons);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(
        reason.contains("device 0: synchronize a copy stream (ubshmem): task exception: copy stream")
            && reason.contains("aclrtSynchronizeStreamWithTimeout failed")
            && reason.contains("507015"),
        "{reason}"
    );

    // A refused copy: the runtime's error names the call and the stream.
    set_acl_result("aclrtMemcpyAsync", 507899);
    let outcome = run(&a.engine, &[write]);
    set_acl_result("aclrtMemcpyAsync", 0);
    assert_eq!(outcome.states, [TransferState::Failed], "{:?}", outcome.reasons);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(reason.contains("aclrtMemcpyAsync failed") && reason.contains("507899"), "{reason}");

    // After the injections the path works again.
    let data = pattern(3, 4096);
    a.write(0, &data);
    assert_eq!(run(&a.engine, &[write]).states, [TransferState::Completed]);
    assert_eq!(b.read(0, 4096), data);
    drop((a, b));
}

fn hixl_server(node: &Node) -> String {
    let aiv = node.engine.local_descriptor().aiv.expect("aiv object");
    aiv["hixl_server"].as_str().expect("the cann device advertises its HiXL server").to_owned()
}

#[test]
fn adxl_on_cann_connects_through_hixl_and_moves_batches_both_ways() {
    let _serial = serial();
    let a = node(0);
    let b = node(1);
    // Each device started a HiXL server with its exported heap registered before listening.
    assert_eq!(
        calls(&hixl_log()),
        ["HixlCSServerCreate", "HixlCSServerRegMem", "HixlCSServerListen"].repeat(2),
        "servers of both engines"
    );
    let server = hixl_server(&b);
    let (host, port) = server.rsplit_once(':').expect("ip:port");
    assert_eq!(host, "127.0.0.1");
    assert!(port.parse::<u16>().is_ok_and(|port| port > 0), "{server}");
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let tables_before = ascendcl_sys::calls::process();

    let first = pattern(5, 70_000);
    let second = pattern(9, 3000);
    a.write(0, &first);
    a.write(100_000, &second);
    let base_a = a.buffer.addr();
    let base_b = b.buffer.addr();
    let outcome = run(
        &a.engine,
        &[
            request(Protocol::Adxl, Opcode::Write, base_a, peer, base_b + 4096, 70_000),
            request(Protocol::Adxl, Opcode::Write, base_a + 100_000, peer, base_b + 200_000, 3000),
        ],
    );
    assert_eq!(outcome.states, [TransferState::Completed; 2], "{:?}", outcome.reasons);
    let log = hixl_log();
    assert_eq!(b.read(4096, first.len()), first, "first entry landed in the peer's heap");
    assert_eq!(b.read(200_000, second.len()), second, "second entry landed");
    assert_eq!(
        log,
        [
            format!("HixlCSClientCreate ip=127.0.0.1 port={port} local=0 remote=1"),
            format!("HixlCSClientRegMem tag=aiv-npu0-region0 type=0 size={HBM}"),
            "HixlCSClientConnect timeout=300".into(),
            "HixlCSClientBatchPutAsync list_num=2 bytes=73000".into(),
            "HixlCSClientQueryCompleteStatus status=1".into(),
        ],
        "connect once (memory registered first), one batch of both writes, one final status"
    );
    let hixl_counts = ascendcl_sys::calls::process().since(&tables_before);
    for name in calls(&log) {
        let logged = calls(&log).iter().filter(|c| **c == name).count() as u64;
        assert_eq!(hixl_counts.get("HixlApi", name), logged, "the table counted what the fake logged: {name}");
    }
    let evidence: Vec<_> = outcome.evidence.iter().map(|e| e.clone().expect("evidence")).collect();
    assert!(evidence.iter().all(|e| e.path == "adxl"), "{evidence:?}");
    // One batch, its acts shared by both transfers: who submitted inside the library (the vendor's HiXL runs a
    // device endpoint's batches on AI-CPU kernels) is not observable; 1 query saw it complete.
    for e in &evidence {
        assert_eq!(e.window, 2, "{e:?}");
        assert_eq!(e.descriptors_written, Act::unknown(Source::NotObservable), "{e:?}");
        assert_eq!(e.doorbells_rung, Act::unknown(Source::NotObservable), "{e:?}");
        assert_eq!(e.completion_seen, Act::host(Source::HostCalls, 1), "one logged query, status=1");
        assert_eq!((e.descriptors, e.doorbells, e.host_launches), (0, 0, 0.0));
        assert_eq!(e.checks().as_array(), [Check::Unknown, Check::Unknown, Check::Unknown, Check::No]);
        assert_eq!(e.submitter(), Submitter::Unknown);
    }
    // Submit + one query = 2 calls shared by 2 transfers (1 each); create + 1 registration + connect on the first.
    assert_eq!((evidence[0].host_device_api_calls, evidence[1].host_device_api_calls), (1 + 3, 1));
    let charged: u64 = evidence.iter().map(|e| e.host_device_api_calls).sum();
    assert_eq!(charged, hixl_counts.entries().iter().filter(|c| c.table == "HixlApi").map(|c| c.count).sum::<u64>());

    // READ back through a get batch; the client is reused.
    let theirs = pattern(77, 50_000);
    b.write(600_000, &theirs);
    hixl_log();
    let outcome =
        run(&a.engine, &[request(Protocol::Adxl, Opcode::Read, base_a + 300_000, peer, base_b + 600_000, 50_000)]);
    assert_eq!(outcome.states, [TransferState::Completed], "{:?}", outcome.reasons);
    assert_eq!(
        hixl_log(),
        ["HixlCSClientBatchGetAsync list_num=1 bytes=50000", "HixlCSClientQueryCompleteStatus status=1"]
    );
    assert_eq!(a.read(300_000, theirs.len()), theirs, "the peer's bytes were read");
    let counters = a.device.adxl().counters();
    assert_eq!((counters.connects, counters.groups), (1, 2));

    // Teardown: the client is unregistered and destroyed, then each server.
    drop(a);
    let log = calls(&hixl_log()).join(" ");
    assert!(
        log.starts_with("HixlCSClientUnregMem HixlCSClientDestroy HixlCSServerUnregMem HixlCSServerDestroy"),
        "{log}"
    );
    drop(b);
    assert_eq!(calls(&hixl_log()), ["HixlCSServerUnregMem", "HixlCSServerDestroy"]);
}

#[test]
fn adxl_on_cann_maps_hixl_failures_and_timeouts_to_adxl_statuses() {
    let _serial = serial();
    let a = node(0);
    let b = node(1);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let write = request(Protocol::Adxl, Opcode::Write, a.buffer.addr(), peer, b.buffer.addr(), 4096);

    // A connect that fails: NOT_CONNECTED with HiXL's code; the next transfer connects again.
    hixl_log();
    set_hixl_result("HixlCSClientConnect", 103_901);
    let outcome = run(&a.engine, &[write]);
    set_hixl_result("HixlCSClientConnect", 0);
    assert_eq!(outcome.states, [TransferState::Failed]);
    // The calls made trying to connect are counted for it; nothing was submitted or seen completing.
    let log = hixl_log();
    let evidence = outcome.evidence[0].clone().expect("evidence");
    assert!(calls(&log).contains(&"HixlCSClientConnect"), "{log:?}");
    assert_eq!(evidence.host_device_api_calls, log.len() as u64, "{log:?}");
    assert_eq!(log.len(), 5, "create, registration, connect, then the failed client's release: {log:?}");
    assert_eq!(evidence.descriptors_written.source, Source::NotObservable);
    assert_eq!(evidence.completion_seen, Act::host(Source::HostCalls, 0));
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(
        reason.starts_with("adxl: NOT_CONNECTED (103902): connect to the HiXL server")
            && reason.contains("HixlCSClientConnect failed: HixlError(103901 HIXL_TIMEOUT)"),
        "{reason}"
    );
    assert_eq!(AdxlStatus::of_failure(outcome.failures[0].as_ref().expect("failure")), AdxlStatus::NOT_CONNECTED);
    assert_eq!(run(&a.engine, &[write]).states, [TransferState::Completed], "connected on the next transfer");

    // The batch's final status is FAILED: FAILED 503900 naming HiXL's status.
    hixl_log();
    set_hixl_completion(3);
    let outcome = run(&a.engine, &[write]);
    set_hixl_completion(1);
    assert_eq!(outcome.states, [TransferState::Failed]);
    // A final status (FAILED) was seen by one query.
    let log = hixl_log();
    let evidence = outcome.evidence[0].clone().expect("evidence");
    assert_eq!(calls(&log), ["HixlCSClientBatchPutAsync", "HixlCSClientQueryCompleteStatus"], "{log:?}");
    assert_eq!((evidence.doorbells_rung.source, evidence.completion_seen.by_host), (Source::NotObservable, 1));
    assert_eq!(evidence.host_device_api_calls, 2);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert_eq!(reason, "adxl: FAILED (503900): HiXL reported HIXL_COMPLETE_STATUS_FAILED for the batch");

    // The library refuses the batch: its code is the status.
    set_hixl_result("HixlCSClientBatchPutAsync", 103_900);
    let outcome = run(&a.engine, &[write]);
    set_hixl_result("HixlCSClientBatchPutAsync", 0);
    assert_eq!(outcome.states, [TransferState::Failed]);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(
        reason.starts_with("adxl: PARAM_INVALID (103900): HiXL refused the batch")
            && reason.contains("HixlError(103900 HIXL_PARAM_INVALID)"),
        "{reason}"
    );

    // A batch that never completes: TIMEOUT once baseline_timeout (300 ms) has passed, well before the engine's
    // 10 s watchdog.
    hixl_log();
    let tables_before = ascendcl_sys::calls::process();
    set_hixl_completion(0);
    let outcome = run(&a.engine, &[write]);
    set_hixl_completion(1);
    assert_eq!(outcome.states, [TransferState::Timeout], "{:?}", outcome.reasons);
    // Every query answered WAITING (the fake logs final statuses only, so the tables' count says how many were
    // made): none saw the batch complete; all of them were made for it.
    let log = hixl_log();
    let made = ascendcl_sys::calls::process().since(&tables_before);
    let evidence = outcome.evidence[0].clone().expect("evidence");
    assert_eq!(calls(&log), ["HixlCSClientBatchPutAsync"], "no final status was reported: {log:?}");
    let queries = made.get("HixlApi", "HixlCSClientQueryCompleteStatus");
    assert!(queries >= 2, "polled until the deadline: {made:?}");
    assert_eq!(evidence.doorbells_rung, Act::unknown(Source::NotObservable));
    assert_eq!(evidence.completion_seen, Act::host(Source::HostCalls, 0), "no query saw it final");
    assert_eq!(evidence.host_device_api_calls, 1 + queries);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert_eq!(reason, "adxl: TIMEOUT (103901): the HiXL batch did not complete within 300ms");
    assert!(
        outcome.elapsed >= BASELINE_TIMEOUT && outcome.elapsed < Duration::from_secs(3),
        "bounded by the baseline timeout: {:?}",
        outcome.elapsed
    );
    assert_eq!(a.device.adxl().counters().timeouts, 1);

    // The path still works, with the data checked.
    let data = pattern(11, 4096);
    a.write(0, &data);
    assert_eq!(run(&a.engine, &[write]).states, [TransferState::Completed]);
    assert_eq!(b.read(0, 4096), data);

    // A registered local range that is not device memory is PARAM_INVALID before HiXL is called.
    let host = vec![0u8; 4096];
    // SAFETY: the vector outlives its registration (unregistered below, after the batch was waited for).
    unsafe { a.engine.register_memory(host.as_ptr() as u64, 4096, "cpu:0") }.expect("host memory registers");
    hixl_log();
    let outcome =
        run(&a.engine, &[request(Protocol::Adxl, Opcode::Write, host.as_ptr() as u64, peer, b.buffer.addr(), 64)]);
    a.engine.unregister_memory(host.as_ptr() as u64).expect("unregister");
    assert_eq!(outcome.states, [TransferState::Failed]);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(reason.starts_with("adxl: PARAM_INVALID (103900): local range"), "{reason}");
    assert!(hixl_log().is_empty(), "HiXL was not called");
    drop((a, b));
}
