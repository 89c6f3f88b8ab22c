//! Device ids of the twin runtime for tests (included with `#[path]`): on the twin runtime, as on an NPU, a device
//! of a process is one SHMEM PE, opened once at a time, so tests running in parallel threads each lease distinct ids.
#![allow(dead_code)]

use std::time::Duration;

/// Device ids of the twin runtime in use by this test process.
static LEASED: std::sync::Mutex<[bool; LEASABLE]> = std::sync::Mutex::new([false; LEASABLE]);
static RETURNED: std::sync::Condvar = std::sync::Condvar::new();
/// The twin runtime's default device count.
const LEASABLE: usize = 8;

/// A device id held by one node until it drops.
#[derive(Debug)]
pub struct DeviceLease(pub u32);

impl DeviceLease {
    /// A free device id, waiting at most a minute for one.
    pub fn acquire() -> DeviceLease {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut leased = LEASED.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(id) = leased.iter().position(|taken| !taken) {
                leased[id] = true;
                return DeviceLease(id as u32);
            }
            let now = std::time::Instant::now();
            assert!(now < deadline, "no twin device id came free within a minute");
            leased = RETURNED.wait_timeout(leased, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for DeviceLease {
    fn drop(&mut self) {
        LEASED.lock().unwrap_or_else(|p| p.into_inner())[self.0 as usize] = false;
        RETURNED.notify_all();
    }
}
