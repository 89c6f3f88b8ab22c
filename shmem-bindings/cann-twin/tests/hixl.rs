//! HiXL's client/server API on the twin, through `cann_twin::hixl_api()`: a server and a client on two devices of
//! one process (put and get of random sizes and offsets, verified through `aclrtMemcpy`), a server in a child
//! process (a re-exec of this binary), out-of-bounds entries, a killed server and hostile bytes on its port.

mod common;
#[path = "../../../tests/common/skip.rs"]
mod skip;

use core::ffi::c_void;
use std::ffi::CString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::*;
use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;
use cann_twin::hixl::{HELLO_ANSWER_BYTES, HELLO_ENTRY_BYTES, HIXL_EXPORTED, MAGIC, MAX_PENDING, VERSION};
use common::{api, cdylib, download, pattern, upload};
use proptest::prelude::*;

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

/// The child's role: a server on 2 MiB of device memory holding `pattern(2 MiB, 42)`; prints `READY port addr`,
/// serves until stdin closes (or 60 s).
#[test]
fn child_server() {
    if std::env::var(ROLE).as_deref() != Ok("server") {
        return;
    }
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(3);
    });
    let api = api();
    let size = 2 * MIB;
    let remote = malloc_on(api, 0, size);
    upload(api, remote, &pattern(size, 42));
    let server = Server::start(&[mem(remote, size)]);
    println!("READY {} {:x}", server.port, remote as usize);
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    drop(server);
}

struct Child {
    child: std::process::Child,
    port: u32,
    remote: *mut c_void,
}

impl Child {
    fn spawn() -> Child {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "child_server", "--nocapture", "--test-threads", "1"])
            .env(ROLE, "server")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        // Owned first, so a child that never gets ready is still killed and reaped.
        let mut owned = Child { child, port: 0, remote: core::ptr::null_mut() };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let line = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("READY line");
            if let Some(at) = line.find("READY ") {
                let words: Vec<&str> = line[at..].split_whitespace().collect();
                owned.port = words[1].parse().expect("port");
                owned.remote = usize::from_str_radix(words[2], 16).expect("address") as *mut c_void;
                return owned;
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_server_in_a_child_process() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let size = 2 * MIB;
    let child = Child::spawn();
    let local = malloc_on(api, 1, size);
    let client = Client::connect(child.port, &[mem(local, size)]).expect("connect");
    // Get the child's pattern, unaligned: the device path, its memory imported from the child.
    let before = client.evidence();
    assert_eq!(client.run(false, &[op(child.remote, 3, local, 5, size - 8)]), HIXL_COMPLETE_STATUS_COMPLETED);
    assert_eq!(since(&client.evidence(), &before).device_batches, 1);
    assert_eq!(download(api, (local as usize + 5) as *const c_void, size - 8), pattern(size, 42)[3..size - 5]);
    // Put new bytes, get them back into the other half.
    upload(api, local, &pattern(MIB, 77));
    assert_eq!(client.run(true, &[op(child.remote, 100, local, 0, MIB)]), HIXL_COMPLETE_STATUS_COMPLETED);
    assert_eq!(client.run(false, &[op(child.remote, 100, local, MIB, MIB)]), HIXL_COMPLETE_STATUS_COMPLETED);
    assert_eq!(download(api, (local as usize + MIB) as *const c_void, MIB), pattern(MIB, 77));
    // The child's address space is not this one's: a range outside its registration is refused here.
    assert_eq!(client.submit(false, &[op(child.remote, size, local, 0, 1)]), Err(HIXL_PARAM_INVALID));
}

#[test]
fn a_killed_server_fails_pending_transfers_in_bounded_time() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let size = 2 * MIB;
    let mut child = Child::spawn();
    let local = malloc_on(api, 1, size);
    let client = Client::connect(child.port, &[mem(local, size)]).expect("connect");
    // Far more than can move before the kill: 4000 gets of 2 MiB.
    let list = vec![op(child.remote, 0, local, 0, size); 4000];
    let before = client.evidence();
    let pending = client.submit(false, &list).expect("submit");
    let queued = client.submit(true, &list[..1]).expect("submit");
    assert_eq!(since(&client.evidence(), &before).device_batches, 2, "both on the AI CPU, the child's memory imported");
    std::thread::sleep(Duration::from_millis(50));
    child.child.kill().expect("kill");
    let _ = child.child.wait();
    let killed = Instant::now();
    assert_eq!(client.wait(pending, Duration::from_secs(3)), HIXL_COMPLETE_STATUS_FAILED);
    assert_eq!(client.wait(queued, Duration::from_secs(3)), HIXL_COMPLETE_STATUS_FAILED);
    assert!(killed.elapsed() < Duration::from_secs(3));
    // The connection is gone: later batches are refused at once; a new connect is tried (and fails: nobody there).
    assert_eq!(client.submit(true, &list[..1]), Err(HIXL_FAILED));
    // SAFETY: looked up, never dereferenced.
    assert_eq!(unsafe { hixl().HixlCSClientConnect(client.raw, 500) }, HIXL_FAILED);
}

/// A peer that accepts and then says nothing (`answer_hello`: after a valid hello with one region at `remote`).
fn silent_peer(answer_hello: bool, remote: usize) -> u32 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = u32::from(listener.local_addr().expect("address").port());
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else { return };
        if answer_hello {
            let mut hello = [0u8; 12];
            let _ = stream.read_exact(&mut hello);
            // Version 2: no registry (token 0), one registration without an export (token 0): the wire path.
            let mut reply = MAGIC.to_vec();
            reply.extend_from_slice(&HIXL_SUCCESS.to_le_bytes());
            reply.extend_from_slice(&1u32.to_le_bytes());
            reply.extend_from_slice(&0u64.to_le_bytes());
            reply.extend_from_slice(&(remote as u64).to_le_bytes());
            reply.extend_from_slice(&(MIB as u64).to_le_bytes());
            reply.extend_from_slice(&COMM_MEM_TYPE_DEVICE.0.to_le_bytes());
            reply.extend_from_slice(&0u32.to_le_bytes());
            reply.extend_from_slice(&[0u8; 24]);
            assert_eq!(reply.len(), HELLO_ANSWER_BYTES + HELLO_ENTRY_BYTES);
            let _ = stream.write_all(&reply);
        }
        std::thread::sleep(Duration::from_secs(5));
    });
    port
}

#[test]
fn a_silent_peer_times_out_within_the_bound() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let api = api();
    let local = malloc_on(api, 1, MIB);
    let port = silent_peer(false, 0);
    let started = Instant::now();
    assert_eq!(Client::connect(port, &[]).err(), Some(HIXL_TIMEOUT), "no hello answer within the connect timeout");
    assert!(started.elapsed() < Duration::from_millis(2800));
    let remote = 0x1000_0000usize;
    let client = Client::connect(silent_peer(true, remote), &[mem(local, MIB)]).expect("connect");
    let list = [op(remote as *mut c_void, 0, local, 0, MIB)];
    let started = Instant::now();
    // SAFETY: live list; ranges checked by the twin.
    let code = unsafe { hixl().HixlCSClientBatchPutSync(client.raw, 1, list.as_ptr(), 300).expect("resolved") };
    assert_eq!(code, HIXL_TIMEOUT);
    assert!(started.elapsed() < Duration::from_millis(1500));
    // The stream is out of step: later batches are refused.
    assert_eq!(client.submit(false, &list), Err(HIXL_FAILED));
}

/// One shared server for the hostile-bytes cases, with its memory and a client's.
fn hostile_target() -> &'static (u32, usize, usize) {
    static TARGET: std::sync::OnceLock<(u32, usize, usize)> = std::sync::OnceLock::new();
    TARGET.get_or_init(|| {
        let api = api();
        let remote = malloc_on(api, 0, MIB);
        let local = malloc_on(api, 1, MIB);
        let server = Server::start(&[mem(remote, MIB)]);
        let port = server.port;
        std::mem::forget(server);
        (port, remote as usize, local as usize)
    })
}

fn hello_bytes() -> Vec<u8> {
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn hostile_bytes_leave_the_server_serving(
        prefix_hello in any::<bool>(),
        op_word in prop_oneof![Just(1u32), Just(2u32), any::<u32>()],
        remote_off in any::<u64>(),
        len in prop_oneof![Just(8u64), 1u64..4096, any::<u64>()],
        tail in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        if std::env::var_os(ROLE).is_some() {
            return Ok(());
        }
        let api = api();
        let &(port, remote, local) = hostile_target();
        let mut bytes = if prefix_hello { hello_bytes() } else { Vec::new() };
        bytes.extend_from_slice(&op_word.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&(remote as u64).wrapping_add(remote_off % (2 * MIB as u64)).to_le_bytes());
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&tail);
        let mut stream = TcpStream::connect(("127.0.0.1", port as u16)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        let _ = stream.write_all(&bytes);
        let mut sink = [0u8; 4096];
        let _ = stream.read(&mut sink);
        drop(stream);
        // Still serving a real client.
        let client = Client::connect(port, &[mem(local as *mut c_void, MIB)]).expect("connect after hostile bytes");
        let seed = tail.first().copied().unwrap_or(1);
        upload(api, local as *mut c_void, &pattern(4096, seed));
        prop_assert_eq!(client.run(true, &[op(remote as *mut c_void, 0, local as *mut c_void, 0, 4096)]), HIXL_COMPLETE_STATUS_COMPLETED);
        prop_assert_eq!(download(api, remote as *const c_void, 4096), pattern(4096, seed));
    }
}

#[test]
fn the_cdylib_loads_as_libcann_hixl_and_moves_data() {
    let Some(library) = cdylib() else {
        skip::skip("CARGO is not set (the test binary was not run by cargo), so the cdylib cannot be built");
        return;
    };
    match std::env::var(ROLE).ok().as_deref() {
        // In a process of its own: two copies of the runtime in one process cannot both run the VMM export service,
        // which the device path of each copy's HiXL server uses (the other tests' servers here are the linked copy's).
        None => {
            let status = Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", "the_cdylib_loads_as_libcann_hixl_and_moves_data", "--nocapture"])
                .env(ROLE, "cdylib")
                .status()
                .expect("run the child");
            assert!(status.success(), "the child failed: {status}");
            return;
        }
        Some("cdylib") => {}
        Some(_) => return,
    }
    // Both tables from the one library, as a user pointing AIV_ASCENDCL_LIB and AIV_HIXL_LIB at the twin would: the
    // loaded copy has its own runtime, separate from the one linked into this test.
    let path = library.into_os_string();
    let env = move |name: &str| (name == "AIV_ASCENDCL_LIB" || name == "AIV_HIXL_LIB").then(|| path.clone());
    let acl = AclApi::load(&ASCENDCL_LIBRARY, &ASCENDCL_LIBRARY.candidates(&env)).expect("loads as libascendcl.so");
    let hx = HixlApi::load(&HIXL_LIBRARY, &HIXL_LIBRARY.candidates(&env)).expect("loads as libcann_hixl.so");
    assert!(hx.is_resolved("HixlCSClientBatchPutSync"));
    let len = 100_000usize;
    let data = pattern(len, 3);
    let mut back = vec![0u8; len];
    let (mut remote, mut local) = (core::ptr::null_mut(), core::ptr::null_mut());
    let ip = CString::new("127.0.0.1").expect("ip");
    let mut port = free_port();
    let endpoint = EndpointDesc::device(COMM_PROTOCOL_HCCS, 0);
    let (mut server, mut client, mut mem_handle, mut batch) =
        (core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut());
    // SAFETY: live locals and Host buffers of the lengths passed; device addresses and handles are checked by the
    // loaded twin.
    unsafe {
        assert_eq!(acl.aclInit(core::ptr::null()), ACL_SUCCESS);
        assert_eq!(acl.aclrtSetDevice(0), ACL_SUCCESS);
        assert_eq!(acl.aclrtMalloc(&mut remote, len, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
        assert_eq!(acl.aclrtMalloc(&mut local, len, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
        assert_eq!(acl.aclrtMemcpy(local, len, data.as_ptr().cast(), len, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
        // A new port when another socket took the one the OS reported free (see `Server::start`).
        for attempt in 1..=8 {
            let sdesc = HixlServerDesc {
                endpoint_list: &endpoint,
                server_ip: ip.as_ptr(),
                server_port: port,
                endpoint_list_num: 1,
                reserved: [0; 104],
            };
            assert_eq!(hx.HixlCSServerCreate(&sdesc, &HixlServerConfig::new(), &mut server), HIXL_SUCCESS);
            assert_eq!(hx.HixlCSServerRegMem(server, ip.as_ptr(), &mem(remote, len), &mut mem_handle), HIXL_SUCCESS);
            let code = hx.HixlCSServerListen(server, 4);
            if code == HIXL_SUCCESS {
                break;
            }
            assert!(attempt < 8, "HixlCSServerListen failed on 8 free ports, the last with {code}");
            assert_eq!(hx.HixlCSServerDestroy(server), HIXL_SUCCESS);
            port = free_port();
        }
        let cdesc = HixlClientDesc {
            local_endpoint: &endpoint,
            remote_endpoint: &endpoint,
            server_ip: ip.as_ptr(),
            server_port: port,
            tc: 0,
            sl: 0,
            reserved: [0; 98],
        };
        assert_eq!(hx.HixlCSClientCreate(&cdesc, &HixlClientConfig::new(), &mut client), HIXL_SUCCESS);
        assert_eq!(hx.HixlCSClientRegMem(client, ip.as_ptr(), &mem(local, len), &mut mem_handle), HIXL_SUCCESS);
        assert_eq!(hx.HixlCSClientConnect(client, 2000), HIXL_SUCCESS);
        let list = [op(remote, 0, local, 0, len)];
        assert_eq!(hx.HixlCSClientBatchPutAsync(client, 1, list.as_ptr(), &mut batch), HIXL_SUCCESS);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut status = HIXL_COMPLETE_STATUS_WAITING;
        while status == HIXL_COMPLETE_STATUS_WAITING && Instant::now() < deadline {
            assert_eq!(hx.HixlCSClientQueryCompleteStatus(client, batch, &mut status), HIXL_SUCCESS);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(status, HIXL_COMPLETE_STATUS_COMPLETED);
        assert_eq!(acl.aclrtMemcpy(back.as_mut_ptr().cast(), len, remote, len, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
        assert_eq!(hx.HixlCSClientDestroy(client), HIXL_SUCCESS);
        assert_eq!(hx.HixlCSServerDestroy(server), HIXL_SUCCESS);
        assert_eq!(acl.aclrtResetDevice(0), ACL_SUCCESS);
    }
    assert!(back == data, "the server's memory holds what the client put");
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
