//! The twin's FabricMem engine through its twin-only table (`cann_twin::fabric_mem_api()`): the engine's records
//! (`cannTwinFabricMemEvidence`) for AI-CPU unfold, Host unfold and the test-only Host-copy mis-wiring, with the data
//! checked through `aclrtMemcpy`; and what the records function refuses.

mod common;

use core::ffi::c_void;
use std::ffi::CString;
use std::net::TcpListener;

use ascendcl_sys::hixl::{CannTwinHixlEvidence, FabricMemApi};
use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;
use cann_twin::hixl::fabric_mem::{PARAM_INVALID, STATUS_COMPLETED, SUCCESS};
use common::{api, download, pattern, upload};

const MIB: usize = 1 << 20;

fn fabric() -> &'static FabricMemApi {
    cann_twin::fabric_mem_api()
}

fn on_device<T>(api: &AclApi, device: i32, body: impl FnOnce() -> T) -> T {
    // SAFETY: plain values.
    assert_eq!(unsafe { api.aclrtSetDevice(device) }, ACL_SUCCESS);
    let out = body();
    // SAFETY: plain values.
    assert_eq!(unsafe { api.aclrtSetDevice(0) }, ACL_SUCCESS);
    out
}

/// An engine on `device` listening on a free port, with `size` bytes of its device memory registered.
struct Engine {
    raw: u64,
    name: CString,
    memory: *mut c_void,
}

impl Engine {
    fn new(api: &AclApi, device: i32, aicpu_unfold: bool, size: usize) -> Engine {
        on_device(api, device, || {
            let memory = common::malloc(api, size);
            let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
            let name = CString::new(format!("127.0.0.1:{port}")).expect("name");
            let mut raw = 0;
            let mut handle = 0;
            // SAFETY: live locals; the memory is this test's, never freed.
            unsafe {
                assert_eq!(fabric().cannTwinFabricMemCreate(name.as_ptr(), u32::from(aicpu_unfold), 1, &mut raw), 0);
                assert_eq!(fabric().cannTwinFabricMemRegister(raw, memory as u64, size as u64, 0, &mut handle), 0);
            }
            Engine { raw, name, memory }
        })
    }

    fn evidence(&self) -> CannTwinHixlEvidence {
        let mut out = CannTwinHixlEvidence::new();
        // SAFETY: a whole structure with its header set.
        let code = unsafe { fabric().cannTwinFabricMemEvidence(self.raw, &mut out).expect("the twin exports it") };
        assert_eq!(code, SUCCESS);
        out
    }

    /// An Async WRITE of `ops` (local offset, remote offset, length) to `peer`, queried to its final status.
    fn write(&self, peer: &Engine, ops: &[(usize, usize, usize)]) -> i32 {
        let words: Vec<u64> = ops
            .iter()
            .flat_map(|&(l, r, n)| [self.memory as u64 + l as u64, peer.memory as u64 + r as u64, n as u64])
            .collect();
        let mut request = 0;
        // SAFETY: `3 len` readable words, live strings.
        let code = unsafe {
            fabric().cannTwinFabricMemTransfer(
                self.raw,
                peer.name.as_ptr(),
                1,
                words.as_ptr(),
                ops.len() as u64,
                0,
                &mut request,
            )
        };
        assert_eq!(code, SUCCESS);
        let mut status = 0;
        for _ in 0..20_000 {
            // SAFETY: a writable status.
            assert_eq!(unsafe { fabric().cannTwinFabricMemQuery(self.raw, request, &mut status) }, SUCCESS);
            if status != 0 {
                return status;
            }
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        status
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: the handle this value created; destroyed once, here.
        let _ = unsafe { fabric().cannTwinFabricMemDestroy(self.raw) };
    }
}

fn delta(after: &CannTwinHixlEvidence, before: &CannTwinHixlEvidence) -> [u64; 6] {
    [
        after.device_batches - before.device_batches,
        after.wire_batches - before.wire_batches,
        after.launches - before.launches,
        after.sqes_by_aicpu - before.sqes_by_aicpu,
        after.sqes_by_host - before.sqes_by_host,
        after.host_copies - before.host_copies,
    ]
}

/// AI-CPU unfold: one launch for a batch of three, its SQEs the AI CPU's, no Host copy; the mis-wiring moves the same
/// batch with three Host copies and no launch; Host unfold is one Host copy per operation. The data lands each time.
#[test]
fn the_engines_records_name_who_moved_each_batch() {
    let api = api();
    cann_twin::control::record_provenance(true);
    let size = 4 * MIB;
    let target = Engine::new(api, 6, true, size);
    let aicpu = Engine::new(api, 5, true, size);
    let host = Engine::new(api, 7, false, size);
    for engine in [&aicpu, &host] {
        // SAFETY: a live string.
        assert_eq!(unsafe { fabric().cannTwinFabricMemConnect(engine.raw, target.name.as_ptr(), 5000) }, SUCCESS);
    }
    let ops = [(0, MIB, 4096), (8192, 2 * MIB, 100_000), (3 * MIB, 0, 777)];
    let check = |engine: &Engine, seed: u8| {
        let source = pattern(size, seed);
        upload(api, engine.memory, &source);
        move |seen: Vec<u8>| {
            for &(l, r, n) in &ops {
                assert!(seen[r..r + n] == source[l..l + n], "op at remote offset {r}");
            }
        }
    };

    let verify = check(&aicpu, 3);
    let before = aicpu.evidence();
    assert_eq!(aicpu.write(&target, &ops), STATUS_COMPLETED);
    verify(download(api, target.memory, size));
    let d = delta(&aicpu.evidence(), &before);
    assert_eq!((d[0], d[1], d[2], d[4], d[5]), (1, 0, 1, 0, 0), "{d:?}");
    assert!(d[3] >= 3, "at least one SQE per operation, all the AI CPU's: {d:?}");

    let verify = check(&aicpu, 9);
    cann_twin::control::fabric_mem_host_copies(5, true);
    let before = aicpu.evidence();
    let status = aicpu.write(&target, &ops);
    cann_twin::control::fabric_mem_host_copies(5, false);
    assert_eq!(status, STATUS_COMPLETED);
    verify(download(api, target.memory, size));
    assert_eq!(delta(&aicpu.evidence(), &before), [0, 1, 0, 0, 0, 3], "mis-wired: three Host copies");

    let verify = check(&host, 27);
    let before = host.evidence();
    assert_eq!(host.write(&target, &ops), STATUS_COMPLETED);
    verify(download(api, target.memory, size));
    let after = host.evidence();
    assert_eq!(delta(&after, &before), [0, 1, 0, 0, 0, 3], "Host unfold: one aclrtMemcpyAsync per operation");
    assert_eq!(after.host_copy_bytes - before.host_copy_bytes, 4096 + 100_000 + 777);
}

#[test]
fn the_records_function_refuses_what_it_cannot_answer() {
    let api = api();
    let engine = Engine::new(api, 4, true, MIB);
    let mut old = CannTwinHixlEvidence::new();
    old.version = 0;
    let mut small = CannTwinHixlEvidence::new();
    small.size = 8;
    // SAFETY: whole structures; a null pointer is refused before any access.
    unsafe {
        assert_eq!(fabric().cannTwinFabricMemEvidence(engine.raw, &mut old), Ok(PARAM_INVALID));
        assert_eq!(fabric().cannTwinFabricMemEvidence(engine.raw, &mut small), Ok(PARAM_INVALID));
        assert_eq!(fabric().cannTwinFabricMemEvidence(engine.raw, core::ptr::null_mut()), Ok(PARAM_INVALID));
        assert_eq!(fabric().cannTwinFabricMemEvidence(0xdead, &mut CannTwinHixlEvidence::new()), Ok(PARAM_INVALID));
    }
    assert_eq!(engine.evidence().batches, 0);
}
