//! What a client refuses or fails: out-of-bounds entries and bad arguments, a range the server withdrew (the stream
//! stays in step), and the bound of 4096 unqueried entries.

use core::ffi::c_void;
use std::ffi::CString;
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::*;
use cann_twin::hixl::MAX_PENDING;

use super::{free_port, hixl, malloc_on, mem, op, since, Client, Server, MIB, ROLE};
use crate::common::{api, download, pattern, upload};

#[test]
fn out_of_bounds_entries_and_bad_arguments_are_refused() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let size = MIB;
    let remote = malloc_on(api, 0, 2 * size);
    let local = malloc_on(api, 1, 2 * size);
    // Only the first half of each is registered.
    let server = Server::start(&[mem(remote, size)]);
    let client = Client::connect(server.port, &[mem(local, size)]).expect("connect");
    let refused = [
        op(remote, size - 10, local, 0, 11),
        op(remote, 0, local, size - 10, 11),
        op(remote, size, local, 0, 1),
        op(remote, 0, local, 0, 0),
        HixlOneSideOpDesc { remote_buf: usize::MAX as *mut c_void, local_buf: local, len: 2 },
        HixlOneSideOpDesc { remote_buf: remote, local_buf: core::ptr::null_mut(), len: 2 },
    ];
    for entry in refused {
        for put in [true, false] {
            // A good entry first: the whole call is refused, nothing submitted.
            let list = [op(remote, 0, local, 0, 8), entry];
            assert_eq!(client.submit(put, &list), Err(HIXL_PARAM_INVALID), "{entry:?}");
        }
    }
    let mut handle = core::ptr::null_mut();
    // SAFETY: null and empty lists, bogus handles: all checked, never dereferenced.
    unsafe {
        assert_eq!(hixl().HixlCSClientBatchPutAsync(client.raw, 1, core::ptr::null(), &mut handle), HIXL_PARAM_INVALID);
        let list = [op(remote, 0, local, 0, 8)];
        assert_eq!(hixl().HixlCSClientBatchPutAsync(client.raw, 0, list.as_ptr(), &mut handle), HIXL_PARAM_INVALID);
        assert_eq!(
            hixl().HixlCSClientBatchPutAsync(0xdead as HixlClientHandle, 1, list.as_ptr(), &mut handle),
            HIXL_PARAM_INVALID
        );
        assert_eq!(hixl().HixlCSClientBatchPutAsync(server.raw, 1, list.as_ptr(), &mut handle), HIXL_PARAM_INVALID);
        assert_eq!(hixl().HixlCSServerListen(client.raw, 1), HIXL_PARAM_INVALID);
        assert_eq!(hixl().HixlCSServerListen(server.raw, 1), HIXL_PARAM_INVALID, "listening twice");
        assert_eq!(hixl().HixlCSClientCreate(core::ptr::null(), core::ptr::null(), &mut handle), HIXL_PARAM_INVALID);
    }
    assert_eq!(client.query(0x77 as CompleteHandle), Err(HIXL_PARAM_INVALID));
    // A device endpoint needs a device bound on the calling thread (the documentation's rule).
    let unbound = std::thread::spawn(|| {
        let ip = CString::new("127.0.0.1").expect("ip");
        let endpoint = EndpointDesc::device(COMM_PROTOCOL_HCCS, 0);
        let desc = HixlServerDesc {
            endpoint_list: &endpoint,
            server_ip: ip.as_ptr(),
            server_port: free_port(),
            endpoint_list_num: 1,
            reserved: [0; 104],
        };
        let mut raw = core::ptr::null_mut();
        // SAFETY: live locals.
        let code = unsafe { hixl().HixlCSServerCreate(&desc, &HixlServerConfig::new(), &mut raw) };
        let no_list = HixlServerDesc { endpoint_list_num: 0, ..desc };
        // SAFETY: live locals.
        let empty = unsafe { hixl().HixlCSServerCreate(&no_list, &HixlServerConfig::new(), &mut raw) };
        (code, empty)
    });
    assert_eq!(unbound.join().expect("thread"), (HIXL_FAILED, HIXL_PARAM_INVALID));
    let long_tag = CString::new(vec![b'x'; 256]).expect("tag");
    let mut mem_handle = core::ptr::null_mut();
    let extra = malloc_on(api, 0, 4096);
    // SAFETY: live locals; a tag above 255 bytes is refused before anything is kept.
    unsafe {
        let code = hixl().HixlCSServerRegMem(server.raw, long_tag.as_ptr(), &mem(extra, 4096), &mut mem_handle);
        assert_eq!(code, HIXL_PARAM_INVALID);
        let code = hixl().HixlCSServerRegMem(server.raw, core::ptr::null(), &mem(remote, 16), &mut mem_handle);
        assert_eq!(code, HIXL_PARAM_INVALID, "overlapping registration");
        let code = hixl().HixlCSServerRegMem(server.raw, core::ptr::null(), &mem(extra, 4096), &mut mem_handle);
        assert_eq!(code, HIXL_SUCCESS, "a null tag is allowed");
        assert_eq!(hixl().HixlCSServerUnregMem(server.raw, mem_handle), HIXL_SUCCESS);
        assert_eq!(hixl().HixlCSServerUnregMem(server.raw, mem_handle), HIXL_PARAM_INVALID);
    }
    // Still serving.
    upload(api, local, &pattern(size, 9));
    assert_eq!(client.run(true, &[op(remote, 0, local, 0, size)]), HIXL_COMPLETE_STATUS_COMPLETED);
    assert_eq!(download(api, remote, size), pattern(size, 9));
    // Nobody listening: a clear failure, in bounded time.
    let started = Instant::now();
    assert_eq!(Client::connect(free_port(), &[]).err(), Some(HIXL_FAILED));
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_range_the_server_withdrew_fails_its_batch_and_the_stream_stays_in_step() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let (a, b) = (malloc_on(api, 0, MIB), malloc_on(api, 0, MIB));
    let local = malloc_on(api, 1, MIB);
    let server = Server::start(&[mem(a, MIB)]);
    let mut b_handle = core::ptr::null_mut();
    // SAFETY: live locals; the memory is never freed.
    unsafe {
        assert_eq!(hixl().HixlCSServerRegMem(server.raw, core::ptr::null(), &mem(b, MIB), &mut b_handle), 0);
    }
    let client = Client::connect(server.port, &[mem(local, MIB)]).expect("connect");
    // SAFETY: the handles are looked up.
    assert_eq!(unsafe { hixl().HixlCSServerUnregMem(server.raw, b_handle) }, HIXL_SUCCESS);
    upload(api, a, &vec![0u8; MIB]);
    upload(api, local, &pattern(MIB, 12));
    // The client still lists b (it connected before), the server refuses it: the batch fails, its other entries run.
    // b's import is withdrawn (its registry stamp is gone), so these batches take the wire path, where the server
    // checks its registrations of the moment.
    let before = client.evidence();
    let list = [op(a, 0, local, 0, 4096), op(b, 0, local, 0, 4096), op(a, 8192, local, 8192, 4096)];
    assert_eq!(client.run(true, &list), HIXL_COMPLETE_STATUS_FAILED);
    assert_eq!(client.run(false, &[op(b, 0, local, 0, 64)]), HIXL_COMPLETE_STATUS_FAILED);
    assert_eq!(since(&client.evidence(), &before).wire_batches, 2);
    let seen = download(api, a, 3 * 4096);
    assert!(seen[..4096] == pattern(MIB, 12)[..4096] && seen[8192..] == pattern(MIB, 12)[8192..3 * 4096]);
    // Many small entries in one batch (pipelined windows), both ways, every byte checked.
    upload(api, a, &pattern(MIB, 99));
    let gets: Vec<_> = (0..1000).map(|i| op(a, i * 1000, local, MIB - (i + 1) * 1000, 1000)).collect();
    assert_eq!(client.run(false, &gets), HIXL_COMPLETE_STATUS_COMPLETED);
    let got = download(api, local, MIB);
    let served = pattern(MIB, 99);
    for i in 0..1000 {
        assert!(got[MIB - (i + 1) * 1000..MIB - i * 1000] == served[i * 1000..(i + 1) * 1000], "entry {i}");
    }
    let puts: Vec<_> = (0..1000).map(|i| op(a, MIB - (i + 1) * 1000, local, i * 1000, 1000)).collect();
    upload(api, local, &pattern(MIB, 5));
    let before = client.evidence();
    assert_eq!(client.run(true, &puts), HIXL_COMPLETE_STATUS_COMPLETED);
    // a is still live: the device path, 8 launches of at most 128 entries.
    let d = since(&client.evidence(), &before);
    assert_eq!((d.device_batches, d.launches), (1, 8), "{d:?}");
    let seen = download(api, a, MIB);
    let sent = pattern(MIB, 5);
    for i in 0..1000 {
        assert!(seen[MIB - (i + 1) * 1000..MIB - i * 1000] == sent[i * 1000..(i + 1) * 1000], "entry {i}");
    }
}

#[test]
fn at_most_4096_unqueried_entries() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let remote = malloc_on(api, 0, 4096);
    let local = malloc_on(api, 1, 4096);
    let server = Server::start(&[mem(remote, 4096)]);
    let client = Client::connect(server.port, &[mem(local, 4096)]).expect("connect");
    let list = [op(remote, 0, local, 0, 8)];
    // Entries count, not batches: one batch of 4097 never fits.
    assert_eq!(client.submit(true, &vec![list[0]; MAX_PENDING + 1]), Err(HIXL_RESOURCE_EXHAUSTED));
    let mut handle = core::ptr::null_mut();
    // SAFETY: a count far past the list: refused before the list is read (it would be read past its end).
    let code = unsafe { hixl().HixlCSClientBatchGetAsync(client.raw, u32::MAX, list.as_ptr(), &mut handle) };
    assert_eq!(code, HIXL_RESOURCE_EXHAUSTED);
    let big = client.submit(true, &vec![list[0]; MAX_PENDING - 10]).expect("submit");
    assert_eq!(client.submit(true, &vec![list[0]; 11]), Err(HIXL_RESOURCE_EXHAUSTED));
    assert_eq!(client.wait(big, Duration::from_secs(20)), HIXL_COMPLETE_STATUS_COMPLETED);
    let handles: Vec<_> = (0..MAX_PENDING).map(|_| client.submit(true, &list).expect("submit")).collect();
    assert_eq!(client.submit(true, &list), Err(HIXL_RESOURCE_EXHAUSTED));
    assert_eq!(client.wait(handles[0], Duration::from_secs(20)), HIXL_COMPLETE_STATUS_COMPLETED);
    // One queried to its end frees one place.
    let last = client.submit(false, &list).expect("a place again");
    for handle in handles.into_iter().skip(1).chain([last]) {
        assert_eq!(client.wait(handle, Duration::from_secs(20)), HIXL_COMPLETE_STATUS_COMPLETED);
    }
}
