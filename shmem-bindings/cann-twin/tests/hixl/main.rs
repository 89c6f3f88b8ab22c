//! HiXL's client/server API on the twin, through `cann_twin::hixl_api()`: a server and a client on two devices of
//! one process (put and get of random sizes and offsets, verified through `aclrtMemcpy`), a server in a child
//! process (a re-exec of this binary), out-of-bounds entries, a killed server and hostile bytes on its port.
//!
//! This file holds the shared helpers (a server, a client, the records) and the table test; module `transfers` the
//! batches between two devices and the throughput report, `refusals` what a client refuses, `peers` servers in other
//! processes and misbehaving peers, `cdylib` the library loaded as `libcann_hixl`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../../../../tests/common/skip.rs"]
mod skip;

mod cdylib;
mod peers;
mod refusals;
mod transfers;

use core::ffi::c_void;
use std::ffi::CString;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::*;
use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;
use cann_twin::hixl::HIXL_EXPORTED;

const ROLE: &str = "CANN_TWIN_HIXL_CHILD";
const MIB: usize = 1 << 20;

fn hixl() -> &'static HixlApi {
    cann_twin::hixl_api()
}

/// A port nobody listens on now.
fn free_port() -> u32 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    u32::from(listener.local_addr().expect("address").port())
}

/// `aclrtMalloc` of `size` bytes on `device` (the thread is left on device 0).
fn malloc_on(api: &AclApi, device: i32, size: usize) -> *mut c_void {
    // SAFETY: plain values.
    assert_eq!(unsafe { api.aclrtSetDevice(device) }, ACL_SUCCESS);
    let ptr = common::malloc(api, size);
    // SAFETY: plain values.
    assert_eq!(unsafe { api.aclrtSetDevice(0) }, ACL_SUCCESS);
    ptr
}

fn mem(ptr: *mut c_void, size: usize) -> CommMem {
    CommMem { r#type: COMM_MEM_TYPE_DEVICE, addr: ptr, size: size as u64 }
}

struct Server {
    raw: HixlServerHandle,
    port: u32,
}

impl Server {
    /// A server on a port the OS reported free, tried again on a new port (up to 8 times) when another socket took
    /// it before `HixlCSServerListen` (an outgoing connection's ephemeral port of a test running beside this one).
    fn start(memory: &[CommMem]) -> Server {
        let mut last = 0;
        for _ in 0..8 {
            match Server::try_start(free_port(), memory) {
                Ok(server) => return server,
                Err(code) => last = code,
            }
        }
        panic!("HixlCSServerListen failed on 8 free ports, the last with {last}");
    }

    fn try_start(port: u32, memory: &[CommMem]) -> Result<Server, HixlStatus> {
        let ip = CString::new("127.0.0.1").expect("ip");
        let endpoint = EndpointDesc::device(COMM_PROTOCOL_HCCS, 0);
        let desc = HixlServerDesc {
            endpoint_list: &endpoint,
            server_ip: ip.as_ptr(),
            server_port: port,
            endpoint_list_num: 1,
            reserved: [0; 104],
        };
        let mut raw = core::ptr::null_mut();
        let tag = CString::new("heap").expect("tag");
        // SAFETY: live locals; the memory is the tests' device memory, never freed.
        unsafe {
            assert_eq!(hixl().HixlCSServerCreate(&desc, &HixlServerConfig::new(), &mut raw), HIXL_SUCCESS);
            let server = Server { raw, port };
            for m in memory {
                let mut handle = core::ptr::null_mut();
                assert_eq!(hixl().HixlCSServerRegMem(raw, tag.as_ptr(), m, &mut handle), HIXL_SUCCESS);
            }
            match hixl().HixlCSServerListen(raw, 16) {
                HIXL_SUCCESS => Ok(server),
                code => Err(code),
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: the handle is looked up, never dereferenced.
        let _ = unsafe { hixl().HixlCSServerDestroy(self.raw) };
    }
}

struct Client {
    raw: HixlClientHandle,
}

impl Client {
    fn connect(port: u32, memory: &[CommMem]) -> Result<Client, HixlStatus> {
        let ip = CString::new("127.0.0.1").expect("ip");
        let (local, remote) =
            (EndpointDesc::device(COMM_PROTOCOL_HCCS, 1), EndpointDesc::device(COMM_PROTOCOL_HCCS, 0));
        let desc = HixlClientDesc {
            local_endpoint: &local,
            remote_endpoint: &remote,
            server_ip: ip.as_ptr(),
            server_port: port,
            tc: 0,
            sl: 0,
            reserved: [0; 98],
        };
        let mut raw = core::ptr::null_mut();
        let tag = CString::new("local").expect("tag");
        // SAFETY: live locals; the memory is the tests' device memory, never freed.
        unsafe {
            assert_eq!(hixl().HixlCSClientCreate(&desc, &HixlClientConfig::new(), &mut raw), HIXL_SUCCESS);
            let client = Client { raw };
            for m in memory {
                let mut handle = core::ptr::null_mut();
                assert_eq!(hixl().HixlCSClientRegMem(raw, tag.as_ptr(), m, &mut handle), HIXL_SUCCESS);
            }
            match hixl().HixlCSClientConnect(raw, 2000) {
                HIXL_SUCCESS => Ok(client),
                code => Err(code),
            }
        }
    }

    fn submit(&self, put: bool, list: &[HixlOneSideOpDesc]) -> Result<CompleteHandle, HixlStatus> {
        let mut handle = core::ptr::null_mut();
        let (api, n) = (hixl(), list.len() as u32);
        // SAFETY: the list is live for the call; the twin checks every range.
        let code = unsafe {
            if put {
                api.HixlCSClientBatchPutAsync(self.raw, n, list.as_ptr(), &mut handle)
            } else {
                api.HixlCSClientBatchGetAsync(self.raw, n, list.as_ptr(), &mut handle)
            }
        };
        match code {
            HIXL_SUCCESS => Ok(handle),
            code => Err(code),
        }
    }

    fn query(&self, handle: CompleteHandle) -> Result<HixlCompleteStatus, HixlStatus> {
        let mut status = HIXL_COMPLETE_STATUS_WAITING;
        // SAFETY: live out-pointer; handles are looked up.
        match unsafe { hixl().HixlCSClientQueryCompleteStatus(self.raw, handle, &mut status) } {
            HIXL_SUCCESS => Ok(status),
            code => Err(code),
        }
    }

    /// Polls `handle` to a final state within `limit`.
    fn wait(&self, handle: CompleteHandle, limit: Duration) -> HixlCompleteStatus {
        let deadline = Instant::now() + limit;
        loop {
            let status = self.query(handle).expect("query");
            if status != HIXL_COMPLETE_STATUS_WAITING {
                return status;
            }
            assert!(Instant::now() < deadline, "batch not final within {limit:?}");
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn run(&self, put: bool, list: &[HixlOneSideOpDesc]) -> HixlCompleteStatus {
        let handle = self.submit(put, list).expect("submit");
        self.wait(handle, Duration::from_secs(20))
    }

    /// The twin-only counts of this client (`cannTwinHixlClientEvidence`).
    fn evidence(&self) -> CannTwinHixlEvidence {
        let mut out = CannTwinHixlEvidence::new();
        // SAFETY: `out` is a whole structure and says so; the handle is looked up.
        let code = unsafe { hixl().cannTwinHixlClientEvidence(self.raw, &mut out).expect("the twin exports it") };
        assert_eq!(code, HIXL_SUCCESS);
        out
    }
}

/// `later - earlier`, field by field.
fn since(later: &CannTwinHixlEvidence, earlier: &CannTwinHixlEvidence) -> CannTwinHixlEvidence {
    let words = |e: &CannTwinHixlEvidence| -> Vec<u64> {
        // SAFETY: the structure is `#[repr(C)]`: two u32, then u64 counts only (pinned in ascendcl-sys).
        let bytes =
            unsafe { core::slice::from_raw_parts((e as *const CannTwinHixlEvidence).cast::<u8>(), size_of_val(e)) };
        bytes[8..].chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).collect()
    };
    let diff: Vec<u64> = words(later).iter().zip(words(earlier)).map(|(a, b)| a - b).collect();
    let mut out = CannTwinHixlEvidence::new();
    // SAFETY: as above; `diff` holds exactly the structure's u64 counts.
    unsafe {
        core::ptr::copy_nonoverlapping(
            diff.as_ptr(),
            (&mut out as *mut CannTwinHixlEvidence).cast::<u8>().add(8).cast(),
            diff.len(),
        )
    };
    out
}

/// Runs `body` with `device` current on the calling thread (device 0 again after).
fn on_device<T>(api: &AclApi, device: i32, body: impl FnOnce() -> T) -> T {
    // SAFETY: plain values.
    assert_eq!(unsafe { api.aclrtSetDevice(device) }, ACL_SUCCESS);
    let out = body();
    // SAFETY: plain values.
    assert_eq!(unsafe { api.aclrtSetDevice(0) }, ACL_SUCCESS);
    out
}

/// The provenance records of `device`'s AI-CPU channels, summed.
fn aicpu_records(device: i32) -> cann_twin::control::Provenance {
    let mut sum = cann_twin::control::Provenance::default();
    for channel in cann_twin::control::aicpu_channels(device) {
        let p = cann_twin::control::provenance(device, channel).expect("an AI-CPU channel");
        sum.sqes_by_aicpu += p.sqes_by_aicpu;
        sum.sqes_by_host += p.sqes_by_host;
        sum.sqes_unknown += p.sqes_unknown + p.sqes_by_block.iter().map(|(_, n)| n).sum::<u64>();
        sum.doorbells_by_aicpu += p.doorbells_by_aicpu;
        sum.doorbells_by_host += p.doorbells_by_host;
        sum.doorbells_unknown += p.doorbells_unknown + p.doorbells_by_block.iter().map(|(_, n)| n).sum::<u64>();
        sum.flags_landed += p.flags_landed;
        sum.flags_seen_by_aicpu += p.flags_seen_by_aicpu;
        sum.flags_seen_by_host += p.flags_seen_by_host;
        sum.flags_seen_by_core += p.flags_seen_by_core;
    }
    sum
}

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: looked up, never dereferenced.
        let _ = unsafe { hixl().HixlCSClientDestroy(self.raw) };
    }
}

fn op(remote: *mut c_void, remote_off: usize, local: *mut c_void, local_off: usize, len: usize) -> HixlOneSideOpDesc {
    HixlOneSideOpDesc {
        remote_buf: (remote as usize + remote_off) as *mut c_void,
        local_buf: (local as usize + local_off) as *mut c_void,
        len: len as u64,
    }
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[test]
fn the_table_resolves_every_declared_function() {
    let declared: Vec<_> = HixlApi::function_decls().into_iter().map(|decl| decl.name).collect();
    for name in &declared {
        assert!(HIXL_EXPORTED.contains(name), "{name} is declared but not implemented");
        assert!(cann_twin::resolve_hixl(name).is_some());
    }
    // One more than the table: HixlCSClientGetRemoteMem, in hixl_cs.h but not (yet) in HixlApi.
    assert_eq!(HIXL_EXPORTED.len(), declared.len() + 1);
    assert!(cann_twin::resolve_hixl("HixlCSClientGetRemoteMem").is_some());
    let api = hixl();
    assert!(api.is_resolved("HixlCSClientBatchPutSync") && api.is_resolved("HixlCSClientBatchGetSync"));
    assert_eq!(api.path().display().to_string(), cann_twin::hixl::IN_PROCESS_HIXL_PATH);
}
