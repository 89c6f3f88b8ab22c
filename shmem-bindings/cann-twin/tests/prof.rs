//! The profiler model (`cann_twin::prof`) through `ascendcl_sys::prof::ProfApi`: a session records the copies the
//! device ran (a stream's and the synchronous path's) with their type and time, writes them as msprof's `task_time`
//! summary at `aclprofStop`, and refuses the call orders the documentation forbids.

mod common;

use ascendcl_sys::prof::{self, ACL_PROF_AICPU, ACL_PROF_TASK_TIME};
use ascendcl_sys::sys::*;
use common::{api, malloc};

fn summary(root: &std::path::Path) -> Vec<String> {
    let mut files = Vec::new();
    for run in std::fs::read_dir(root).expect("the session directory").flatten() {
        let output = run.path().join("mindstudio_profiler_output");
        for file in std::fs::read_dir(&output).expect("the export directory").flatten() {
            files.push(std::fs::read_to_string(file.path()).expect("readable"));
        }
    }
    assert_eq!(files.len(), 1, "one summary per session");
    files.remove(0).lines().map(str::to_owned).collect()
}

#[test]
fn a_session_records_the_copies_the_device_ran_and_the_documented_orders_are_enforced() {
    let acl = api();
    let prof = cann_twin::prof_api();
    let dir = std::env::temp_dir().join(format!("cann-twin-prof-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.to_str().expect("UTF-8");
    // Start and stop need aclprofInit first; a config with no device or an unknown one is null.
    let config = prof::result::create_config(prof, &[0], ACL_PROF_TASK_TIME | ACL_PROF_AICPU).expect("a config");
    // SAFETY: a config of this table, live until destroyed below.
    let error = unsafe { prof::result::start(prof, config) }.expect_err("no aclprofInit yet");
    assert_eq!(error.code(), Some(ascendcl_sys::AclError(ACL_ERROR_PROF_NOT_RUN)));
    assert!(prof::result::create_config(prof, &[], ACL_PROF_TASK_TIME).is_none());
    assert!(prof::result::create_config(prof, &[4096], ACL_PROF_TASK_TIME).is_none());
    prof::result::init(prof, path).expect("aclprofInit");

    let len = 64 << 10;
    let device = malloc(acl, len);
    let data = vec![7u8; len];
    // Before the session: not recorded.
    // SAFETY: a live Host buffer and device memory of `len` bytes.
    unsafe {
        ascendcl_sys::result::memory::memcpy(acl, device, len, data.as_ptr().cast(), len, ACL_MEMCPY_HOST_TO_DEVICE)
    }
    .expect("H2D");
    // SAFETY: as above.
    unsafe { prof::result::start(prof, config) }.expect("aclprofStart");
    // A second start naming the same device is refused.
    let other = prof::result::create_config(prof, &[0], ACL_PROF_TASK_TIME).expect("a config");
    // SAFETY: as above.
    let error = unsafe { prof::result::start(prof, other) }.expect_err("device 0 is profiled");
    assert_eq!(error.code(), Some(ascendcl_sys::AclError(ACL_ERROR_PROF_ALREADY_RUN)));
    // SAFETY: never started.
    unsafe { prof::result::destroy_config(prof, other) }.expect("destroyed");
    // A started config cannot be destroyed, nor the profiler finalised.
    // SAFETY: the live config; the call is refused.
    assert!(unsafe { prof::result::destroy_config(prof, config) }.is_err());
    assert!(prof::result::finalize(prof).is_err());

    let started_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_micros();
    // One synchronous copy and one stream copy.
    // SAFETY: as above.
    unsafe {
        ascendcl_sys::result::memory::memcpy(acl, device, len, data.as_ptr().cast(), len, ACL_MEMCPY_HOST_TO_DEVICE)
    }
    .expect("H2D");
    let stream = ascendcl_sys::result::stream::create(acl).expect("a stream");
    let mut back = vec![0u8; len];
    // SAFETY: the buffers outlive the synchronisation below.
    unsafe {
        ascendcl_sys::result::memory::memcpy_async(
            acl,
            back.as_mut_ptr().cast(),
            len,
            device,
            len,
            ACL_MEMCPY_DEVICE_TO_HOST,
            stream,
        )
        .expect("D2H async");
        ascendcl_sys::result::stream::synchronize(acl, stream).expect("synchronised");
    }
    assert_eq!(back, data);
    // SAFETY: as above.
    unsafe { prof::result::stop(prof, config) }.expect("aclprofStop");
    // SAFETY: as above.
    let error = unsafe { prof::result::stop(prof, config) }.expect_err("not started");
    assert_eq!(error.code(), Some(ascendcl_sys::AclError(ACL_ERROR_PROF_NOT_RUN)));
    // SAFETY: stopped; never used again.
    unsafe { prof::result::destroy_config(prof, config) }.expect("destroyed");
    prof::result::finalize(prof).expect("aclprofFinalize");

    let lines = summary(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(lines[0], cann_twin::prof::TASK_TIME_HEADER);
    let rows: Vec<Vec<&str>> = lines[1..].iter().map(|line| line.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "the two copies of the session, not the one before: {lines:?}");
    for row in &rows {
        assert_eq!((row[0], row[2]), ("0", "MEMCPY_ASYNC"), "{row:?}");
        let (start, stop): (f64, f64) = (row[6].parse().expect("start"), row[7].parse().expect("stop"));
        assert!(start >= started_us as f64 - 1.0 && stop >= start, "{row:?}");
    }
    assert_eq!(rows[0][3], "0", "the synchronous copy has no stream");
    assert_ne!(rows[1][3], "0", "the stream copy names its stream");
    // SAFETY: the stream is idle.
    unsafe { ascendcl_sys::result::stream::destroy(acl, stream) }.expect("destroyed");
}
