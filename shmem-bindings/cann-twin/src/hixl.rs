//! HiXL's plain C client/server API (`ascendcl_sys::hixl::HixlApi`), implemented on the twin: resolved in-process
//! by [`resolve_hixl`] ([`hixl_api`]) and exported under the C names from the cdylib, with
//! [`HixlCSClientGetRemoteMem`], which `hixl_cs.h` declares and `HixlApi` does not, and the twin-only
//! [`cannTwinHixlClientEvidence`] (not a HiXL API: a client's records, which `HixlApi` declares optional).
//!
//! A server listens on the TCP address of its [`HixlServerDesc`] (`server_ip`, `server_port`); a client connects to
//! the address of its [`HixlClientDesc`] and gets the server's registrations in the hello answer. Then a batch takes
//! one of two paths:
//!
//! - **the device path** (module `device`): HiXL's client-server mode with a device endpoint, as the vendor's library
//!   runs it. The server exports its DEVICE registrations; a client with a device imports them into its own device
//!   address space at connect; a batch between device memory and live imports is copied to device memory and
//!   launched as AI-CPU tasks on the client's stream (one per 128 entries), which write SQEs into an SDMA channel of
//!   the emulated AI CPU (module `aicpu`), followed by a copy of a device constant 1 into the batch's Host flag;
//!   the status query reads that flag and the batch's error status only;
//! - **the wire path**, for what cannot be imported (remote HOST memory, which HiXL's HCCS client-server mode does
//!   not reach; a client without a device; memory a server could not export): the bytes go over the one TCP
//!   connection, each side reading and writing its own memory only through its own process's ACL copies
//!   (`aclrtMemcpy` with `ACL_MEMCPY_DEFAULT`, so device and Host registrations both work). Host-submitted, and its
//!   records say so.
//!
//! Endpoints are accepted and not interpreted (no HCCS, RoCE or UB transport is modelled).
//!
//! Files: this one holds the shared pieces (limits, handle tables, registrations) and the resolver; module `server`
//! the server and its connections, `client` the client's state, connect and destroy, `batch` submission, the
//! worker and the status query, `socket` the bounded socket I/O, `device` the device path, [`fabric_mem`] the
//! twin-only FabricMem engine.
//!
//! Checks: every local range of a batch must lie inside one of the client's registrations, every remote range
//! inside one of the server's registrations (the list the server sent at connect, checked again by the server
//! against its registrations of the moment), else the call returns `HIXL_PARAM_INVALID` and submits nothing.
//! Handles are ids looked up in tables, never dereferenced: an unknown handle is `HIXL_PARAM_INVALID`.
//!
//! Wire protocol (little-endian, [`VERSION`] 2; docs/twin-runtime.md has the full table):
//! - hello, client to server: `HIXLTWN1`, `u32` version; the server answers `HIXLTWN1`, `u32` status, `u32` count,
//!   `u64` its registry's export token, then `count` times `(u64 addr, u64 size, i32 CommMemType, u32 tag length,
//!   u64 export token, u64 stamp, u32 registry slot, u32 0, tag)` of its registrations (at most
//!   [`MAX_REGISTRATIONS`], tags at most [`MAX_TAG_LEN`] bytes): what [`HixlCSClientGetRemoteMem`] returns, and what
//!   the device path imports;
//! - request: `u32` op (1 put, 2 get), `u32` 0, `u64` remote address, `u64` length (at most [`MAX_ENTRY_LEN`]);
//!   a put is followed by `length` bytes, answered by one `u32` status; a get is answered by a `u32` status, and
//!   when it is 0 by `length` bytes and a second `u32` status (a copy that failed midway still sends the bytes).
//!
//! Bounds: connect within the call's `timeout_ms`; a batch within its deadline (the Sync calls' `timeout_ms`,
//! [`ASYNC_TIMEOUT`] for the Async ones, counted from submission), else `HIXL_COMPLETE_STATUS_TIMEOUT` (on the wire
//! path the connection is then closed: the stream is out of step; on the device path the task stops at the deadline);
//! a vanished server fails the batch at once (reset or end of stream, which the client's worker also watches for while
//! idle: the device path's link is then revoked) or at its deadline. The server: the hello within [`HELLO_TIMEOUT`], a frame's remaining bytes within
//! [`FRAME_TIMEOUT`] of its first, at most [`MAX_CONNECTIONS`] connections; anything malformed closes that
//! connection only.

use core::ffi::{c_char, c_void, CStr};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use ascendcl_sys::hixl::*;
use ascendcl_sys::sys::{ACL_MEMCPY_DEFAULT, ACL_SUCCESS};

mod batch;
mod client;
mod device;
pub mod fabric_mem;
mod server;
mod socket;

pub(crate) use batch::set_host_copies;
use batch::{device_range, peer_gone};
pub use batch::{
    HixlCSClientBatchGetAsync, HixlCSClientBatchGetSync, HixlCSClientBatchPutAsync, HixlCSClientBatchPutSync,
    HixlCSClientQueryCompleteStatus,
};
pub use client::{
    cannTwinHixlClientEvidence, HixlCSClientConnect, HixlCSClientCreate, HixlCSClientDestroy, HixlCSClientGetRemoteMem,
    HixlCSClientRegMem, HixlCSClientUnregMem,
};
use client::{hello, Client};
pub use device::{RegionExport, MAX_KERNEL_ENTRIES};
pub(crate) use server::{create_server, set_stalled};
use server::{destroy_server, listen_server, register_with_server, unregister_with_server, Server};
pub use server::{
    HixlCSServerCreate, HixlCSServerDestroy, HixlCSServerListen, HixlCSServerRegMem, HixlCSServerUnregMem,
};

/// What [`HixlApi::path`] reports for [`hixl_api`].
pub const IN_PROCESS_HIXL_PATH: &str = "cann-twin HiXL (in-process)";
/// Unqueried transfers a client may hold: entries of batches not yet seen in a final state (the CS
/// documentation's "4K"); a batch that would pass it is `HIXL_RESOURCE_EXHAUSTED`.
pub const MAX_PENDING: usize = 4096;
/// The deadline of an Async batch, from its submission.
pub const ASYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// The server waits this long for a connection's hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Once a frame's first byte arrived, the server waits this long for each further part of it.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections a server serves at once; more are closed on accept.
pub const MAX_CONNECTIONS: usize = 64;
/// Registrations a server may hold (and a hello may list).
pub const MAX_REGISTRATIONS: usize = 4096;
/// The longest entry of a batch (4 GiB; a twin limit).
pub const MAX_ENTRY_LEN: u64 = 1 << 32;
/// The longest memory tag (bytes; a twin limit).
pub const MAX_TAG_LEN: usize = 255;
/// The protocol's magic.
pub const MAGIC: &[u8; 8] = b"HIXLTWN1";
/// The protocol's version (2: the hello answer carries the exports of the device path).
pub const VERSION: u32 = 2;
/// Bytes of the hello answer before its registrations: magic, status, count, the registry's token.
pub const HELLO_ANSWER_BYTES: usize = 24;
/// Bytes of one registration in the hello answer before its tag: address, size, `CommMemType`, tag length, export
/// token (0: not exported), stamp, slot, a reserved 0.
pub const HELLO_ENTRY_BYTES: usize = 48;
/// Request opcode of a put.
pub const OP_PUT: u32 = 1;
/// Request opcode of a get.
pub const OP_GET: u32 = 2;

const CHUNK: usize = 1 << 20;
/// Entries in flight at once on a connection (see `run_batch`).
const WINDOW: usize = 256;
const POLL: Duration = Duration::from_millis(100);

type Status = Result<(), HixlStatus>;

fn guard(body: impl FnOnce() -> Status) -> HixlStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => HIXL_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => HIXL_FAILED,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn not_null<T>(pointer: *const T) -> Status {
    if pointer.is_null() {
        Err(HIXL_PARAM_INVALID)
    } else {
        Ok(())
    }
}

/// Copies `len` bytes through this process's ACL (`ACL_MEMCPY_DEFAULT`: device or Host on either side).
fn acl_copy(dst: usize, src: usize, len: usize) -> Status {
    // SAFETY: the twin's aclrtMemcpy translates device addresses and refuses bad ranges; the Host side is a live
    // buffer of this module or registered memory the caller vouched for at registration.
    let code =
        unsafe { crate::acl::aclrtMemcpy(dst as *mut c_void, len, src as *const c_void, len, ACL_MEMCPY_DEFAULT) };
    if code == ACL_SUCCESS {
        Ok(())
    } else {
        Err(HIXL_FAILED)
    }
}

/// A registered range, its `CommMemType`, its tag and (a server's DEVICE registration) its export.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Region {
    addr: u64,
    size: u64,
    kind: i32,
    tag: Vec<u8>,
    export: Option<RegionExport>,
}

fn inside<'a>(regions: impl IntoIterator<Item = &'a Region>, addr: u64, len: u64) -> bool {
    len > 0
        && addr.checked_add(len).is_some_and(|end| {
            regions.into_iter().any(|r| addr >= r.addr && r.addr.checked_add(r.size).is_some_and(|r_end| end <= r_end))
        })
}

fn region_of(mem: *const CommMem, tag: *const c_char) -> Result<Region, HixlStatus> {
    not_null(mem)?;
    let tag = if tag.is_null() {
        Vec::new()
    } else {
        // SAFETY: non-null NUL-terminated string by the C contract.
        unsafe { CStr::from_ptr(tag) }.to_bytes().to_vec()
    };
    if tag.len() > MAX_TAG_LEN {
        return Err(HIXL_PARAM_INVALID);
    }
    // SAFETY: non-null; the C contract makes it a readable CommMem.
    let mem = unsafe { mem.read() };
    if mem.r#type != COMM_MEM_TYPE_DEVICE && mem.r#type != COMM_MEM_TYPE_HOST {
        return Err(HIXL_PARAM_INVALID);
    }
    let addr = mem.addr as u64;
    if addr == 0 || mem.size == 0 || addr.checked_add(mem.size).is_none() {
        return Err(HIXL_PARAM_INVALID);
    }
    Ok(Region { addr, size: mem.size, kind: mem.r#type.0, tag, export: None })
}

/// Handle tables: handles are ids (never 0), never pointers into this process.
struct Table<T> {
    next: usize,
    items: BTreeMap<usize, Arc<T>>,
}

impl<T> Table<T> {
    /// Ids after `start`: servers and clients count from different starts, so one is never taken for the other.
    const fn new(start: usize) -> Self {
        Table { next: start, items: BTreeMap::new() }
    }
    fn insert(&mut self, item: Arc<T>) -> usize {
        self.next += 1;
        self.items.insert(self.next, item);
        self.next
    }
}

fn servers() -> MutexGuard<'static, Table<Server>> {
    static SERVERS: Mutex<Table<Server>> = Mutex::new(Table::new(0x1000));
    lock(&SERVERS)
}

fn clients() -> MutexGuard<'static, Table<Client>> {
    static CLIENTS: Mutex<Table<Client>> = Mutex::new(Table::new(0x4000_0000));
    lock(&CLIENTS)
}

fn next_mem_handle() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Endpoints a server description may list (a twin limit).
pub const MAX_ENDPOINTS: u32 = 1024;

/// Makes `device` current on the calling thread (a HiXL worker), so that its copies count as that device's
/// copy-engine work; nothing if the creating thread had no device.
fn bind_device(device: Option<i32>) {
    if let Some(device) = device {
        let _ = crate::runtime::runtime().set_current_without_reference(device);
    }
}

/// The documentation's rule for a local device endpoint: `aclrtSetDevice` on the calling thread first. Without
/// one (or before `aclInit`) the call fails with `HIXL_FAILED`.
fn device_bound_if(endpoints: &[EndpointDesc]) -> Status {
    if endpoints.iter().any(|endpoint| endpoint.loc.locType == ENDPOINT_LOC_TYPE_DEVICE) {
        crate::runtime::runtime().current_device().map_err(|_| HIXL_FAILED)?;
    }
    Ok(())
}

fn ip_address(ip: *const c_char, port: u32) -> Result<SocketAddr, HixlStatus> {
    not_null(ip)?;
    let port = u16::try_from(port).map_err(|_| HIXL_PARAM_INVALID)?;
    // SAFETY: non-null NUL-terminated string by the C contract.
    let ip = unsafe { CStr::from_ptr(ip) }.to_str().map_err(|_| HIXL_PARAM_INVALID)?;
    let ip: std::net::IpAddr = ip.trim().parse().map_err(|_| HIXL_PARAM_INVALID)?;
    Ok(SocketAddr::new(ip, port))
}

// ---------------------------------------------------------------------------------------------------------------
// Table.

macro_rules! hixl_exports {
    ($($name:ident),* $(,)?) => {
        /// The C names of every HiXL function this runtime implements and exports.
        pub const HIXL_EXPORTED: &[&str] = &[$(stringify!($name)),*];

        /// The address of the implemented HiXL function called `name`, or `None`: the resolver for
        /// [`HixlApi::from_resolver`]. Each function has exactly the prototype `ascendcl_sys::hixl` declares.
        pub fn resolve_hixl(name: &str) -> Option<*const c_void> {
            match name {
                $(stringify!($name) => Some($name as *const c_void),)*
                _ => None,
            }
        }
    };
}

hixl_exports! {
    HixlCSServerCreate,
    HixlCSServerRegMem,
    HixlCSServerListen,
    HixlCSServerUnregMem,
    HixlCSServerDestroy,
    HixlCSClientCreate,
    HixlCSClientConnect,
    HixlCSClientGetRemoteMem,
    HixlCSClientRegMem,
    HixlCSClientUnregMem,
    HixlCSClientBatchPutAsync,
    HixlCSClientBatchGetAsync,
    HixlCSClientBatchPutSync,
    HixlCSClientBatchGetSync,
    HixlCSClientQueryCompleteStatus,
    HixlCSClientDestroy,
    cannTwinHixlClientEvidence,
}

/// The process-wide HiXL table resolved to this runtime, built once.
pub fn hixl_api() -> &'static HixlApi {
    static API: OnceLock<HixlApi> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: `resolve_hixl` returns only functions of this module declared with the prototypes of the table's
        // fields of the same names, callable from any thread for the life of the process.
        match unsafe { HixlApi::from_resolver(PathBuf::from(IN_PROCESS_HIXL_PATH), &resolve_hixl) } {
            Ok(api) => api,
            Err(error) => panic!("cann-twin does not implement a required HiXL symbol: {error}"),
        }
    })
}

/// What [`fabric_mem_api`]'s table reports as its path.
pub const IN_PROCESS_FABRIC_MEM_PATH: &str = "cann-twin FabricMem (in-process)";

/// **Twin-only**: the FabricMem engine's C functions ([`fabric_mem`]) as the process-wide table
/// `ascendcl_sys::hixl::FabricMemApi`, built once.
pub fn fabric_mem_api() -> &'static ascendcl_sys::hixl::FabricMemApi {
    static API: OnceLock<ascendcl_sys::hixl::FabricMemApi> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: `resolve_fabric_mem` returns only functions of module `fabric_mem` declared with the prototypes of
        // the table's fields of the same names, callable from any thread for the life of the process.
        match unsafe {
            ascendcl_sys::hixl::FabricMemApi::from_resolver(
                PathBuf::from(IN_PROCESS_FABRIC_MEM_PATH),
                &fabric_mem::resolve_fabric_mem,
            )
        } {
            Ok(api) => api,
            Err(error) => panic!("cann-twin does not implement a required FabricMem symbol: {error}"),
        }
    })
}
