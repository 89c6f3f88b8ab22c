//! What the HiXL modules share: the limits and the wire's constants, the guard of a C entry point, registrations
//! ([`Region`]) and their checks, the handle tables' type and the Host-side copy through the twin's ACL.

use core::ffi::{c_char, c_void, CStr};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ascendcl_sys::hixl::*;
use ascendcl_sys::sys::{ACL_MEMCPY_DEFAULT, ACL_SUCCESS};

use super::device::RegionExport;

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

pub(super) const CHUNK: usize = 1 << 20;
/// Entries in flight at once on a connection (see `run_batch`).
pub(super) const WINDOW: usize = 256;
pub(super) const POLL: Duration = Duration::from_millis(100);

pub(super) type Status = Result<(), HixlStatus>;

pub(super) fn guard(body: impl FnOnce() -> Status) -> HixlStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => HIXL_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => HIXL_FAILED,
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(super) fn not_null<T>(pointer: *const T) -> Status {
    if pointer.is_null() {
        Err(HIXL_PARAM_INVALID)
    } else {
        Ok(())
    }
}

/// Copies `len` bytes through this process's ACL (`ACL_MEMCPY_DEFAULT`: device or Host on either side).
pub(super) fn acl_copy(dst: usize, src: usize, len: usize) -> Status {
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
pub(super) struct Region {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) kind: i32,
    pub(super) tag: Vec<u8>,
    pub(super) export: Option<RegionExport>,
}

pub(super) fn inside<'a>(regions: impl IntoIterator<Item = &'a Region>, addr: u64, len: u64) -> bool {
    len > 0
        && addr.checked_add(len).is_some_and(|end| {
            regions.into_iter().any(|r| addr >= r.addr && r.addr.checked_add(r.size).is_some_and(|r_end| end <= r_end))
        })
}

pub(super) fn region_of(mem: *const CommMem, tag: *const c_char) -> Result<Region, HixlStatus> {
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
pub(super) struct Table<T> {
    pub(super) next: usize,
    pub(super) items: BTreeMap<usize, Arc<T>>,
}

impl<T> Table<T> {
    /// Ids after `start`: servers and clients count from different starts, so one is never taken for the other.
    pub(super) const fn new(start: usize) -> Self {
        Table { next: start, items: BTreeMap::new() }
    }
    pub(super) fn insert(&mut self, item: Arc<T>) -> usize {
        self.next += 1;
        self.items.insert(self.next, item);
        self.next
    }
}

pub(super) fn next_mem_handle() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Endpoints a server description may list (a twin limit).
pub const MAX_ENDPOINTS: u32 = 1024;

/// Makes `device` current on the calling thread (a HiXL worker), so that its copies count as that device's
/// copy-engine work; nothing if the creating thread had no device.
pub(super) fn bind_device(device: Option<i32>) {
    if let Some(device) = device {
        let _ = crate::runtime::runtime().set_current_without_reference(device);
    }
}

/// The documentation's rule for a local device endpoint: `aclrtSetDevice` on the calling thread first. Without
/// one (or before `aclInit`) the call fails with `HIXL_FAILED`.
pub(super) fn device_bound_if(endpoints: &[EndpointDesc]) -> Status {
    if endpoints.iter().any(|endpoint| endpoint.loc.locType == ENDPOINT_LOC_TYPE_DEVICE) {
        crate::runtime::runtime().current_device().map_err(|_| HIXL_FAILED)?;
    }
    Ok(())
}

pub(super) fn ip_address(ip: *const c_char, port: u32) -> Result<SocketAddr, HixlStatus> {
    not_null(ip)?;
    let port = u16::try_from(port).map_err(|_| HIXL_PARAM_INVALID)?;
    // SAFETY: non-null NUL-terminated string by the C contract.
    let ip = unsafe { CStr::from_ptr(ip) }.to_str().map_err(|_| HIXL_PARAM_INVALID)?;
    let ip: std::net::IpAddr = ip.trim().parse().map_err(|_| HIXL_PARAM_INVALID)?;
    Ok(SocketAddr::new(ip, port))
}
