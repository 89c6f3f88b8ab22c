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
//! Files: this one holds the resolver and the tables; module `common` the shared pieces (limits, the wire's constants,
//! the handle tables' type, registrations); `server` the server, its connections and handles, `client` the client's
//! state, handles, connect and destroy, `batch` submission, the
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

use core::ffi::c_void;
use std::path::PathBuf;

use std::sync::OnceLock;

use ascendcl_sys::hixl::*;

mod batch;
mod client;
mod common;
mod device;
pub mod fabric_mem;
mod server;
mod socket;

pub(crate) use batch::set_host_copies;
pub use batch::{
    HixlCSClientBatchGetAsync, HixlCSClientBatchGetSync, HixlCSClientBatchPutAsync, HixlCSClientBatchPutSync,
    HixlCSClientQueryCompleteStatus,
};
pub use client::{
    cannTwinHixlClientEvidence, HixlCSClientConnect, HixlCSClientCreate, HixlCSClientDestroy, HixlCSClientGetRemoteMem,
    HixlCSClientRegMem, HixlCSClientUnregMem,
};
pub use common::{
    ASYNC_TIMEOUT, FRAME_TIMEOUT, HELLO_ANSWER_BYTES, HELLO_ENTRY_BYTES, HELLO_TIMEOUT, MAGIC, MAX_CONNECTIONS,
    MAX_ENDPOINTS, MAX_ENTRY_LEN, MAX_PENDING, MAX_REGISTRATIONS, MAX_TAG_LEN, OP_GET, OP_PUT, VERSION,
};
pub use device::{RegionExport, MAX_KERNEL_ENTRIES};
pub(crate) use server::set_stalled;
pub use server::{
    HixlCSServerCreate, HixlCSServerDestroy, HixlCSServerListen, HixlCSServerRegMem, HixlCSServerUnregMem,
};

/// What [`HixlApi::path`] reports for [`hixl_api`].
pub const IN_PROCESS_HIXL_PATH: &str = "cann-twin HiXL (in-process)";

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
