//! Batches between two devices of one process: put and get of random sizes and offsets verified through
//! `aclrtMemcpy`, the AI CPU's records of a device batch (and the Host's under the mis-wiring switch), a stalled AI
//! CPU timing a batch out, and the ignored throughput report.

use core::ffi::c_void;
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::*;

use super::{aicpu_records, hixl, malloc_on, mem, on_device, op, since, Client, Rng, Server, MIB, ROLE};
use crate::common::{api, download, pattern, upload};

#[test]
fn put_and_get_between_two_devices_of_one_process() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let size = 4 * MIB;
    let remote = malloc_on(api, 0, size);
    let local = malloc_on(api, 1, size);
    let server = Server::start(&[mem(remote, size)]);
    let client = Client::connect(server.port, &[mem(local, size)]).expect("connect");
    // The server's registrations, as HixlCSClientGetRemoteMem hands them out.
    let (mut list, mut tags, mut count) = (core::ptr::null_mut(), core::ptr::null_mut(), 0u32);
    // SAFETY: live out-pointers; the arrays are read before the next call.
    unsafe {
        assert_eq!(cann_twin::hixl::HixlCSClientGetRemoteMem(client.raw, &mut list, &mut tags, &mut count, 100), 0);
        assert_eq!(count, 1);
        let first: CommMem = *list;
        assert_eq!((first.r#type, first.addr, first.size), (COMM_MEM_TYPE_DEVICE, remote, size as u64));
        assert_eq!(std::ffi::CStr::from_ptr(*tags).to_str(), Ok("heap"));
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..6u8 {
        // Put: random entries of one batch into disjoint remote slots; every byte checked on the server's side.
        let source = pattern(size, round);
        upload(api, local, &source);
        upload(api, remote, &vec![0u8; size]);
        let mut list = Vec::new();
        for slot in 0..4 {
            let len = 1 + rng.below(MIB + MIB / 3);
            let local_off = rng.below(size - len);
            let remote_off = slot * MIB + rng.below(MIB / 8);
            let len = len.min(size - remote_off);
            list.push(op(remote, remote_off, local, local_off, len));
        }
        assert_eq!(client.run(true, &list), HIXL_COMPLETE_STATUS_COMPLETED, "round {round}");
        let seen = download(api, remote, size);
        let mut expected = vec![0u8; size];
        for e in &list {
            let (r, l, n) =
                (e.remote_buf as usize - remote as usize, e.local_buf as usize - local as usize, e.len as usize);
            expected[r..r + n].copy_from_slice(&source[l..l + n]);
        }
        assert!(seen == expected, "put round {round}: server memory differs");
        // Get: random remote ranges into random local ranges, checked on the client's side.
        let served = pattern(size, round.wrapping_add(100));
        upload(api, remote, &served);
        let len = 1 + rng.below(2 * MIB);
        let (remote_off, local_off) = (rng.below(size - len), rng.below(size - len));
        let list = [op(remote, remote_off, local, local_off, len)];
        assert_eq!(client.run(false, &list), HIXL_COMPLETE_STATUS_COMPLETED);
        let got = download(api, (local as usize + local_off) as *const c_void, len);
        assert!(got[..] == served[remote_off..remote_off + len], "get round {round}");
    }
    // The Sync calls.
    upload(api, local, &pattern(MIB, 55));
    let list = [op(remote, 0, local, 0, MIB)];
    // SAFETY: live list; ranges checked by the twin.
    let code = unsafe { hixl().HixlCSClientBatchPutSync(client.raw, 1, list.as_ptr(), 5000).expect("resolved") };
    assert_eq!(code, HIXL_SUCCESS);
    assert_eq!(download(api, remote, MIB), pattern(MIB, 55));
    upload(api, remote, &pattern(MIB, 66));
    let list = [op(remote, 0, local, MIB, MIB)];
    // SAFETY: as above.
    let code = unsafe { hixl().HixlCSClientBatchGetSync(client.raw, 1, list.as_ptr(), 5000).expect("resolved") };
    assert_eq!(code, HIXL_SUCCESS);
    assert_eq!(download(api, (local as usize + MIB) as *const c_void, MIB), pattern(MIB, 66));
    // A final state released the handle.
    let handle = client.submit(true, &[op(remote, 0, local, 0, 64)]).expect("submit");
    assert_eq!(client.wait(handle, Duration::from_secs(5)), HIXL_COMPLETE_STATUS_COMPLETED);
    assert_eq!(client.query(handle), Err(HIXL_PARAM_INVALID));
}

/// The device path, as HiXL's client-server mode runs it: a put batch of 200 entries between device memory is two
/// AI-CPU launches on the client's stream; every SQE the AI CPU's SDMA channels executed for it was written by the
/// AI CPU, every doorbell rung by it, both flags read first by it, and the Host copied none of the data. The
/// test-only mis-wiring (`control::hixl_host_copies`) moves a batch with Host copies instead, and the records say so.
#[test]
fn a_device_batch_is_the_ai_cpus_in_the_records_and_the_host_copy_mis_wiring_turns_them_to_the_host() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    cann_twin::control::record_provenance(true);
    let size = 4 * MIB;
    let remote = malloc_on(api, 0, size);
    let local = malloc_on(api, 1, size);
    let server = Server::start(&[mem(remote, size)]);
    // The client on device 3: that device's AI CPU is this test's alone.
    let client = on_device(api, 3, || Client::connect(server.port, &[mem(local, size)]).expect("connect"));
    let source = pattern(size, 17);
    upload(api, local, &source);
    upload(api, remote, &vec![0u8; size]);
    // 200 entries: 128 and 72 per launch; the first of 2.5 MiB (three SQEs of at most 1 MiB), the others 4 KiB.
    let mut list = vec![op(remote, 0, local, 0, 5 * MIB / 2)];
    list.extend((1..200).map(|i| op(remote, 3 * MIB + i * 4096, local, 3 * MIB + i * 4096, 4096)));
    let (before, records_before, occupancy_before) =
        (client.evidence(), aicpu_records(3), cann_twin::control::occupancy(3).aicpu);
    assert_eq!(client.run(true, &list), HIXL_COMPLETE_STATUS_COMPLETED);
    let seen = download(api, remote, size);
    for e in &list {
        let (r, l, n) =
            (e.remote_buf as usize - remote as usize, e.local_buf as usize - local as usize, e.len as usize);
        assert!(seen[r..r + n] == source[l..l + n], "entry at remote offset {r}");
    }
    let d = since(&client.evidence(), &before);
    assert_eq!((d.batches, d.entries, d.device_batches, d.wire_batches, d.launches), (1, 200, 1, 0, 2), "{d:?}");
    // 3 + 199 data SQEs and one flag SQE per launch.
    assert_eq!((d.sqes_by_aicpu, d.sqes_by_host, d.sqes_by_aiv, d.sqes_unattributed), (204, 0, 0, 0), "{d:?}");
    assert!(d.doorbells_by_aicpu >= 2, "at least one doorbell per launch: {d:?}");
    assert_eq!((d.doorbells_by_host, d.doorbells_by_aiv, d.doorbells_unattributed), (0, 0, 0), "{d:?}");
    assert_eq!((d.flags_by_aicpu, d.flags_by_host, d.flags_by_aiv, d.flags_unread), (2, 0, 0, 0), "{d:?}");
    assert_eq!((d.host_copies, d.host_copy_bytes, d.log_entries_lost, d.unrecorded_launches), (0, 0, 0, 0));
    // The AI CPU's channels' own records (device 3's, this client's alone) agree.
    let records = aicpu_records(3);
    assert_eq!(records.sqes_by_aicpu - records_before.sqes_by_aicpu, 204, "{records:?}");
    // The records count register writes; the log one per doorbell the engine took (two writes it took together
    // count once there).
    assert!(records.doorbells_by_aicpu - records_before.doorbells_by_aicpu >= d.doorbells_by_aicpu, "{records:?}");
    assert_eq!(records.flags_seen_by_aicpu - records_before.flags_seen_by_aicpu, 2, "{records:?}");
    assert_eq!(
        (records.sqes_by_host, records.sqes_unknown, records.doorbells_by_host, records.doorbells_unknown),
        (records_before.sqes_by_host, records_before.sqes_unknown, records_before.doorbells_by_host, 0),
        "{records:?}"
    );
    assert_eq!((records.flags_seen_by_host, records.flags_seen_by_core), (0, 0), "{records:?}");
    // The AI CPU's occupancy: two tasks ran on its threads.
    let occupancy = cann_twin::control::occupancy(3).aicpu;
    assert_eq!(occupancy.threads, 4, "{occupancy:?}");
    assert_eq!(occupancy.tasks_run - occupancy_before.tasks_run, 2, "{occupancy:?}");
    assert_eq!(occupancy.tasks_launched - occupancy_before.tasks_launched, 2, "{occupancy:?}");
    assert!(
        occupancy.executing_ns + occupancy.polling_ns > occupancy_before.executing_ns + occupancy_before.polling_ns
    );
    assert_eq!(occupancy.executing_ns + occupancy.polling_ns + occupancy.idle_ns, occupancy.thread_ns);

    // A get batch, both ways through the device path, checked on the client's side.
    let served = pattern(size, 71);
    upload(api, remote, &served);
    let before = client.evidence();
    assert_eq!(client.run(false, &[op(remote, 5, local, 7, 3 * MIB)]), HIXL_COMPLETE_STATUS_COMPLETED);
    assert!(download(api, (local as usize + 7) as *const c_void, 3 * MIB)[..] == served[5..5 + 3 * MIB]);
    let d = since(&client.evidence(), &before);
    assert_eq!((d.device_batches, d.launches, d.sqes_by_aicpu, d.flags_by_aicpu, d.host_copies), (1, 1, 4, 1, 0));

    // Mis-wired (test-only): the same kind of batch with Host copies. Now the Host did it all, and the AI CPU nothing.
    upload(api, local, &pattern(size, 23));
    cann_twin::control::hixl_host_copies(3, true);
    let before = client.evidence();
    let records_before = aicpu_records(3);
    let status = client.run(true, &list[..2]);
    cann_twin::control::hixl_host_copies(3, false);
    assert_eq!(status, HIXL_COMPLETE_STATUS_COMPLETED);
    let d = since(&client.evidence(), &before);
    assert_eq!((d.batches, d.device_batches, d.wire_batches, d.launches), (1, 0, 1, 0), "{d:?}");
    assert_eq!((d.sqes_by_aicpu, d.doorbells_by_aicpu, d.flags_by_aicpu), (0, 0, 0), "{d:?}");
    // The put's data read by the Host from the client's memory: 2.5 MiB in 1 MiB pieces, and 4 KiB.
    assert_eq!((d.host_copies, d.host_copy_bytes), (4, (5 * MIB / 2 + 4096) as u64), "{d:?}");
    assert_eq!(aicpu_records(3).sqes_by_aicpu, records_before.sqes_by_aicpu, "the AI CPU's channels ran nothing");
    assert!(download(api, remote, 5 * MIB / 2) == pattern(size, 23)[..5 * MIB / 2]);
}

/// A stalled AI CPU (its SDMA channels hold every SQE): a Sync batch on the device path ends `HIXL_TIMEOUT` at its
/// deadline, the kernel drops its SQEs (the channel reset), and after the release the next batch runs.
#[test]
fn a_stalled_ai_cpu_times_the_batch_out_and_the_next_one_runs() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let remote = malloc_on(api, 0, MIB);
    let local = malloc_on(api, 1, MIB);
    let server = Server::start(&[mem(remote, MIB)]);
    // The client on device 4, whose AI CPU only this test stalls.
    let client = on_device(api, 4, || Client::connect(server.port, &[mem(local, MIB)]).expect("connect"));
    cann_twin::control::set_aicpu_stalled(4, true).expect("the AI CPU's channels");
    upload(api, local, &pattern(MIB, 3));
    upload(api, remote, &vec![0u8; MIB]);
    let list = [op(remote, 0, local, 0, MIB)];
    let (before, tasks_before) = (client.evidence(), cann_twin::control::occupancy(4).aicpu.tasks_run);
    let started = Instant::now();
    // SAFETY: live list; ranges checked by the twin.
    let code = unsafe { hixl().HixlCSClientBatchPutSync(client.raw, 1, list.as_ptr(), 300).expect("resolved") };
    let took = started.elapsed();
    // The kernel itself stops at the deadline too (its SQEs dropped by the channel's reset): wait for it before the
    // release.
    while cann_twin::control::occupancy(4).aicpu.tasks_run == tasks_before {
        assert!(started.elapsed() < Duration::from_secs(5), "the AI-CPU task did not end");
        std::thread::sleep(Duration::from_millis(1));
    }
    cann_twin::control::set_aicpu_stalled(4, false).expect("released");
    assert_eq!(code, HIXL_TIMEOUT);
    assert!(took >= Duration::from_millis(290) && took < Duration::from_millis(1500), "{took:?}");
    assert_eq!(since(&client.evidence(), &before).device_batches, 1);
    assert!(download(api, remote, MIB) == vec![0u8; MIB], "the dropped SQE never ran");
    assert_eq!(client.run(true, &list), HIXL_COMPLETE_STATUS_COMPLETED);
    assert!(download(api, remote, MIB) == pattern(MIB, 3));
}

/// Prints put/get throughput and batch latency over loopback
/// (`cargo test -p cann-twin --release --test hixl -- --ignored --nocapture`).
#[test]
#[ignore]
fn throughput() {
    let api = api();
    let size = 64 * MIB;
    let remote = malloc_on(api, 0, size);
    let local = malloc_on(api, 1, size);
    let server = Server::start(&[mem(remote, size)]);
    let client = Client::connect(server.port, &[mem(local, size)]).expect("connect");
    for (block, batch) in [(4096usize, 16usize), (64 << 10, 16), (MIB, 16), (4 * MIB, 16)] {
        for put in [true, false] {
            let list: Vec<_> = (0..batch).map(|i| op(remote, i * block, local, i * block, block)).collect();
            let started = Instant::now();
            let mut rounds = 0u32;
            while started.elapsed() < Duration::from_millis(500) {
                assert_eq!(client.run(put, &list), HIXL_COMPLETE_STATUS_COMPLETED);
                rounds += 1;
            }
            let seconds = started.elapsed().as_secs_f64();
            let bytes = (block * batch) as f64 * f64::from(rounds);
            println!(
                "{} block {block:>8} x {batch}: {:>8.1} MB/s, {:>8.1} us per batch",
                if put { "put" } else { "get" },
                bytes / seconds / 1e6,
                seconds * 1e6 / f64::from(rounds)
            );
        }
    }
}
