//! The runtime's copy work in `control::occupancy(device).streams`: stream copy tasks (`aclrtMemcpyAsync`) and
//! synchronous copies (`aclrtMemcpy`) through the table. Each test works on a device of its own (tests of this
//! binary run in parallel and the counters are the device's), made current on the test's thread.
//!
//! The stream worker's kernel-launch tasks need a kernel binary built for the twin, which this crate's tests do not
//! have: that their time is counted apart from copies is tested on the counters themselves (`occupancy::tests`).

mod common;

use core::ffi::c_void;
use std::time::Duration;

use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;
use cann_twin::control::{self, DeviceOccupancy, StreamOccupancy};
use common::{api, download, malloc, memcpy, pattern, upload};

/// The table with `device` current on the calling thread.
fn on_device(device: i32) -> &'static AclApi {
    let api = api();
    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtSetDevice(device) }, ACL_SUCCESS);
    api
}

fn create_stream(api: &AclApi) -> aclrtStream {
    let mut stream: aclrtStream = core::ptr::null_mut();
    // SAFETY: `stream` is writable.
    assert_eq!(unsafe { api.aclrtCreateStream(&mut stream) }, ACL_SUCCESS);
    stream
}

/// Synchronises `stream`, waiting at most 30 s (a hung worker fails the test instead of hanging it).
fn synchronize(api: &AclApi, stream: aclrtStream) -> aclError {
    // SAFETY: a stream this test created.
    unsafe { api.aclrtSynchronizeStreamWithTimeout(stream, 30_000) }
}

fn destroy(api: &AclApi, stream: aclrtStream) {
    // SAFETY: a stream this test created, synchronised.
    assert_eq!(unsafe { api.aclrtDestroyStream(stream) }, ACL_SUCCESS);
}

/// `later - earlier` of every count, and of the busy times.
fn diff(later: &StreamOccupancy, earlier: &StreamOccupancy) -> [u64; 9] {
    [
        later.copy_busy_ns - earlier.copy_busy_ns,
        later.copies - earlier.copies,
        later.copy_bytes - earlier.copy_bytes,
        later.failed_copies - earlier.failed_copies,
        later.sync_copy_busy_ns - earlier.sync_copy_busy_ns,
        later.sync_copies - earlier.sync_copies,
        later.sync_copy_bytes - earlier.sync_copy_bytes,
        later.kernel_task_ns - earlier.kernel_task_ns,
        later.kernel_tasks - earlier.kernel_tasks,
    ]
}

fn wall_between(later: &DeviceOccupancy, earlier: &DeviceOccupancy) -> u64 {
    later.taken_at_ns - earlier.taken_at_ns
}

#[test]
fn n_async_copies_count_n_copies_of_their_bytes_within_the_wall_time() {
    let device = 1;
    let api = on_device(device);
    let (n, size) = (16u64, 1usize << 20);
    let data = pattern(size, 7);
    let dev = malloc(api, size);
    let stream = create_stream(api);
    let before = control::occupancy(device);
    for _ in 0..n {
        // SAFETY: `data` outlives the synchronisation below; the device address is checked by the twin.
        let code =
            unsafe { api.aclrtMemcpyAsync(dev, size, data.as_ptr().cast(), size, ACL_MEMCPY_HOST_TO_DEVICE, stream) };
        assert_eq!(code, ACL_SUCCESS);
    }
    assert_eq!(synchronize(api, stream), ACL_SUCCESS);
    let after = control::occupancy(device);
    let [busy, copies, bytes, failed, sync_busy, sync_copies, _, kernel_ns, kernels] =
        diff(&after.streams, &before.streams);
    assert_eq!((copies, bytes, failed), (n, n * size as u64, 0), "{:?} then {:?}", before.streams, after.streams);
    // One stream runs one task at a time: its copies' time fits in the wall time between the snapshots.
    assert!(
        busy > 0 && busy <= wall_between(&after, &before),
        "busy {busy} ns over {} ns",
        wall_between(&after, &before)
    );
    assert_eq!((sync_busy, sync_copies, kernel_ns, kernels), (0, 0, 0, 0), "no other work on device {device}");
    assert_eq!(after.streams.copies_running, 0, "the synchronisation saw every task counted");
    assert_eq!(download(api, dev, size), data);
    destroy(api, stream);
}

#[test]
fn a_stream_without_tasks_or_whose_launch_is_refused_adds_no_copy_time() {
    let device = 2;
    let api = on_device(device);
    let stream = create_stream(api);
    let before = control::occupancy(device);
    assert_eq!(synchronize(api, stream), ACL_SUCCESS);
    std::thread::sleep(Duration::from_millis(5));
    // A launch of a function that does not exist is refused at submission: no task.
    let args = [0u64; 1];
    // SAFETY: `args` is 8 readable bytes; the handle is checked by the twin.
    let code = unsafe {
        api.aclrtLaunchKernelWithHostArgs(
            0xdead_0000 as aclrtFuncHandle,
            1,
            stream,
            core::ptr::null_mut(),
            args.as_ptr() as *mut c_void,
            8,
            core::ptr::null_mut(),
            0,
        )
    };
    assert_ne!(code.expect("the twin implements aclrtLaunchKernelWithHostArgs"), ACL_SUCCESS);
    assert_eq!(synchronize(api, stream), ACL_SUCCESS);
    let after = control::occupancy(device);
    assert_eq!(diff(&after.streams, &before.streams), [0; 9], "{:?} then {:?}", before.streams, after.streams);
    assert!(wall_between(&after, &before) >= 5_000_000, "the wall time passed, the copy time did not");
    destroy(api, stream);
}

#[test]
fn synchronous_copies_with_device_memory_count_and_host_to_host_does_not() {
    let device = 3;
    let api = on_device(device);
    let size = 256usize << 10;
    let data = pattern(size, 11);
    let (dev, other) = (malloc(api, size), malloc(api, size));
    let before = control::occupancy(device);
    upload(api, dev, &data);
    assert_eq!(memcpy(api, other, size, dev, size, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
    assert_eq!(download(api, other, size), data);
    let mut host = vec![0u8; size];
    assert_eq!(
        memcpy(api, host.as_mut_ptr().cast(), size, data.as_ptr().cast(), size, ACL_MEMCPY_HOST_TO_HOST),
        ACL_SUCCESS
    );
    // A refused copy (the destination is too small) is not a copy.
    assert_ne!(memcpy(api, dev, size / 2, data.as_ptr().cast(), size, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    let after = control::occupancy(device);
    let [busy, copies, _, _, sync_busy, sync_copies, sync_bytes, _, _] = diff(&after.streams, &before.streams);
    assert_eq!((busy, copies), (0, 0), "no stream copies");
    assert_eq!((sync_copies, sync_bytes), (3, 3 * size as u64), "{:?} then {:?}", before.streams, after.streams);
    assert!(sync_busy > 0 && sync_busy <= wall_between(&after, &before), "{sync_busy} ns");
    assert_eq!(host, data);
}

#[test]
fn held_copies_are_not_busy_until_a_worker_takes_them_and_a_failed_copy_moves_no_bytes() {
    let device = 4;
    let api = on_device(device);
    let size = 64usize << 10;
    let data = pattern(size, 13);
    let dev = malloc(api, size);
    let stream = create_stream(api);
    let before = control::occupancy(device);
    control::hold_device_streams(device, true);
    for _ in 0..3 {
        // SAFETY: `data` outlives the synchronisation below.
        let code =
            unsafe { api.aclrtMemcpyAsync(dev, size, data.as_ptr().cast(), size, ACL_MEMCPY_HOST_TO_DEVICE, stream) };
        assert_eq!(code, ACL_SUCCESS);
    }
    std::thread::sleep(Duration::from_millis(10));
    let held = control::occupancy(device);
    control::hold_device_streams(device, false);
    assert_eq!(diff(&held.streams, &before.streams), [0; 9], "queued, held copies: {:?}", held.streams);
    assert_eq!(held.streams.copies_running, 0, "a held copy is not running");
    // The next copy's destination faults when it runs.
    control::fail_next_destinations(device, 1);
    // SAFETY: as above.
    let code =
        unsafe { api.aclrtMemcpyAsync(dev, size, data.as_ptr().cast(), size, ACL_MEMCPY_HOST_TO_DEVICE, stream) };
    assert_eq!(code, ACL_SUCCESS);
    assert_ne!(synchronize(api, stream), ACL_SUCCESS, "the injected fault is reported");
    let after = control::occupancy(device);
    let [busy, copies, bytes, failed, ..] = diff(&after.streams, &before.streams);
    assert_eq!((copies, bytes, failed), (4, 3 * size as u64, 1), "{:?}", after.streams);
    assert!(busy > 0 && busy < wall_between(&after, &held), "the 10 ms held are not busy: {busy} ns");
    destroy(api, stream);
}
