//! `libaiv_transport.so`: the C ABI of aiv-transport, declared in `include/aiv_transport.h` (docs/c-api.md).
//!
//! Owns: C calling conventions on top of [`engine::TransferEngine`]: opaque handles that stay checkable after they
//! are destroyed, status codes with a thread-local message, strings the caller frees, and the guarantee that no
//! input (a NULL or misaligned pointer, a stale handle, an out-of-range value) panics or aborts the process: every
//! entry point runs inside [`status::guard`]. It must not move bytes itself: the engine's transports do, and device
//! memory is reached only through the device's copies.
//!
//! The `#[repr(C)]` structs below are the header's; their sizes and field offsets are asserted here and, with the
//! same numbers, by `static_assert` in the header, so the two cannot drift apart unnoticed.

mod handles;
mod status;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ::engine::evidence::{Act, EvidenceTally, Submitter};
use ::engine::transfer::FailureKind;
use ::engine::{BatchId, Opcode, SegmentId, TransferRequest, TransferState};

use crate::handles::Engine;
use crate::status::{code, guard, Failure};

/// The ABI version the header declares as `AIV_ABI_VERSION`.
pub const ABI_VERSION: c_int = 1;

/// `aiv_engine`: never dereferenced; a handle's address is its number.
#[repr(C)]
#[derive(Debug)]
pub struct AivEngine {
    _opaque: [u8; 0],
}

/// `aiv_mem_region`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AivMemRegion {
    pub addr: u64,
    pub length: u64,
    pub kind: u32,
    pub reserved: u32,
}

/// `aiv_request`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AivRequest {
    pub opcode: u32,
    pub reserved: u32,
    pub local_addr: u64,
    pub segment: u64,
    pub remote_addr: u64,
    pub length: u64,
}

/// `aiv_batch_status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AivBatchStatus {
    pub state: i32,
    pub error: i32,
    pub tasks: u32,
    pub completed: u32,
    pub failed: u32,
    pub reserved: u32,
    pub transferred_bytes: u64,
}

/// `aiv_act_counts`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AivActCounts {
    pub by_aiv: u64,
    pub by_aicpu: u64,
    pub by_host: u64,
    pub unattributed: u64,
}

/// `aiv_evidence`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AivEvidence {
    pub transfers: u32,
    pub submitter: i32,
    pub descriptors_written: AivActCounts,
    pub doorbells_rung: AivActCounts,
    pub completion_seen: AivActCounts,
    pub host_launches: f64,
    pub submitter_word: [c_char; 24],
}

// The header's static_asserts carry the same numbers.
const _: () = {
    assert!(size_of::<AivMemRegion>() == 24);
    assert!(offset_of!(AivMemRegion, addr) == 0);
    assert!(offset_of!(AivMemRegion, length) == 8);
    assert!(offset_of!(AivMemRegion, kind) == 16);
    assert!(offset_of!(AivMemRegion, reserved) == 20);
    assert!(size_of::<AivRequest>() == 40);
    assert!(offset_of!(AivRequest, opcode) == 0);
    assert!(offset_of!(AivRequest, reserved) == 4);
    assert!(offset_of!(AivRequest, local_addr) == 8);
    assert!(offset_of!(AivRequest, segment) == 16);
    assert!(offset_of!(AivRequest, remote_addr) == 24);
    assert!(offset_of!(AivRequest, length) == 32);
    assert!(size_of::<AivBatchStatus>() == 32);
    assert!(offset_of!(AivBatchStatus, state) == 0);
    assert!(offset_of!(AivBatchStatus, error) == 4);
    assert!(offset_of!(AivBatchStatus, tasks) == 8);
    assert!(offset_of!(AivBatchStatus, completed) == 12);
    assert!(offset_of!(AivBatchStatus, failed) == 16);
    assert!(offset_of!(AivBatchStatus, reserved) == 20);
    assert!(offset_of!(AivBatchStatus, transferred_bytes) == 24);
    assert!(size_of::<AivActCounts>() == 32);
    assert!(offset_of!(AivActCounts, by_aiv) == 0);
    assert!(offset_of!(AivActCounts, by_aicpu) == 8);
    assert!(offset_of!(AivActCounts, by_host) == 16);
    assert!(offset_of!(AivActCounts, unattributed) == 24);
    assert!(size_of::<AivEvidence>() == 136);
    assert!(offset_of!(AivEvidence, transfers) == 0);
    assert!(offset_of!(AivEvidence, submitter) == 4);
    assert!(offset_of!(AivEvidence, descriptors_written) == 8);
    assert!(offset_of!(AivEvidence, doorbells_rung) == 40);
    assert!(offset_of!(AivEvidence, completion_seen) == 72);
    assert!(offset_of!(AivEvidence, host_launches) == 104);
    assert!(offset_of!(AivEvidence, submitter_word) == 112);
};

// Enumerations of the header.
const MEM_AUTO: u32 = 0;
const MEM_HOST: u32 = 1;
const MEM_DEVICE: u32 = 2;
const OP_READ: u32 = 0;
const OP_WRITE: u32 = 1;
const STATE_PENDING: i32 = 0;
const STATE_COMPLETED: i32 = 1;
const STATE_FAILED: i32 = 2;
const STATE_TIMEOUT: i32 = 3;
const SUBMITTER_UNKNOWN: i32 = 0;
const SUBMITTER_AIV_DIRECT: i32 = 1;
const SUBMITTER_AI_CPU: i32 = 2;
const SUBMITTER_HOST: i32 = 3;
const SUBMITTER_MIXED: i32 = 4;
/// `AIV_WAIT_DEFAULT`: a wait bounded by the engine's transfer timeout only.
const WAIT_DEFAULT: u64 = u64::MAX;

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Logs to stderr, filtered by `RUST_LOG` (default `warn`), once per process; a subscriber the host program
/// installed already wins.
fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let _ =
            tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).try_init();
    });
}

// ----- Argument checks: nothing below dereferences a pointer these did not check. -----

/// The UTF-8 text of a C string argument.
fn text<'a>(pointer: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if pointer.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: not NULL (checked); the header requires a NUL-terminated string that outlives the call.
    let text = unsafe { CStr::from_ptr(pointer) };
    text.to_str().map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// Writes `value` through an out-parameter.
fn put<T>(pointer: *mut T, what: &str, value: T) -> Result<(), Failure> {
    if pointer.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    if !pointer.is_aligned() {
        return Err(Failure::invalid(format!("{what} ({pointer:p}) is not aligned for its type")));
    }
    // SAFETY: not NULL and aligned (checked); the header requires it to point at writable memory of its type.
    unsafe { pointer.write(value) };
    Ok(())
}

/// Writes `value` through an optional out-parameter (NULL: not wanted).
fn put_optional<T>(pointer: *mut T, what: &str, value: impl FnOnce() -> T) -> Result<(), Failure> {
    if pointer.is_null() {
        return Ok(());
    }
    put(pointer, what, value())
}

/// The `count` elements of an array argument.
fn array<'a, T>(pointer: *const T, count: usize, what: &str) -> Result<&'a [T], Failure> {
    if count == 0 {
        return Err(Failure::invalid(format!("{what}: count is 0")));
    }
    if pointer.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    if !pointer.is_aligned() {
        return Err(Failure::invalid(format!("{what} ({pointer:p}) is not aligned for its type")));
    }
    if count.checked_mul(size_of::<T>()).is_none_or(|bytes| bytes > isize::MAX as usize) {
        return Err(Failure::invalid(format!("{what}: count {count} is too large")));
    }
    // SAFETY: not NULL, aligned, and the size fits isize (checked); the header requires `count` readable elements.
    Ok(unsafe { std::slice::from_raw_parts(pointer, count) })
}

/// A byte count that fits this process's address space.
fn byte_count(length: u64, what: &str) -> Result<usize, Failure> {
    usize::try_from(length)
        .ok()
        .filter(|&length| length <= isize::MAX as usize)
        .ok_or_else(|| Failure::invalid(format!("{what}: length {length} is too large")))
}

fn engine_of(handle: *const AivEngine) -> Result<Arc<Engine>, Failure> {
    handles::get(handle as usize as u64)
}

/// The engine's segment id of a segment handle (handle = id + 1: 0 is never a valid handle).
fn segment_id(handle: u64) -> Result<SegmentId, Failure> {
    handle
        .checked_sub(1)
        .map(SegmentId)
        .ok_or_else(|| Failure::new(code::INVALID_HANDLE, "segment handle 0 is never valid"))
}

fn batch_tasks(engine: &Engine, batch: u64) -> Result<usize, Failure> {
    lock(&engine.batches).get(&batch).copied().ok_or_else(|| {
        Failure::new(
            code::INVALID_HANDLE,
            format!("batch {batch} is not a live batch of this engine (never submitted, or freed)"),
        )
    })
}

// ----- Version, errors, strings. -----

/// `aiv_abi_version`.
#[no_mangle]
pub extern "C" fn aiv_abi_version() -> c_int {
    ABI_VERSION
}

/// `aiv_last_error`.
#[no_mangle]
pub extern "C" fn aiv_last_error() -> *const c_char {
    status::last_error()
}

/// `aiv_string_free`.
#[no_mangle]
pub extern "C" fn aiv_string_free(string: *mut c_char) -> c_int {
    guard("aiv_string_free", || status::free_string(string))
}

// ----- Engines. -----

/// `aiv_engine_create`.
#[no_mangle]
pub extern "C" fn aiv_engine_create(config_json: *const c_char, out: *mut *mut AivEngine) -> c_int {
    guard("aiv_engine_create", || {
        init_logging();
        put(out, "out", std::ptr::null_mut())?;
        let json = if config_json.is_null() { "" } else { text(config_json, "config_json")? };
        let engine = Engine::create(json)?;
        let handle = handles::insert(engine);
        put(out, "out", handle as usize as *mut AivEngine)
    })
}

/// `aiv_engine_destroy`.
#[no_mangle]
pub extern "C" fn aiv_engine_destroy(handle: *mut AivEngine) -> c_int {
    guard("aiv_engine_destroy", || {
        drop(handles::remove(handle as usize as u64)?);
        Ok(())
    })
}

/// `aiv_engine_segment_name`.
#[no_mangle]
pub extern "C" fn aiv_engine_segment_name(handle: *mut AivEngine, name: *mut *mut c_char) -> c_int {
    guard("aiv_engine_segment_name", || {
        let engine = engine_of(handle)?;
        put(name, "name", std::ptr::null_mut())?;
        put(name, "name", status::give_string(engine.engine.name()))
    })
}

// ----- Device memory. -----

/// `aiv_device_alloc`.
#[no_mangle]
pub extern "C" fn aiv_device_alloc(handle: *mut AivEngine, length: u64, addr: *mut u64) -> c_int {
    guard("aiv_device_alloc", || {
        let engine = engine_of(handle)?;
        put(addr, "addr", 0)?;
        if length == 0 {
            return Err(Failure::invalid("length is 0"));
        }
        let device = engine.device()?;
        let buffer =
            device.allocate(length).map_err(|error| Failure::device(format!("allocate {length} bytes: {error}")))?;
        let start = buffer.addr();
        lock(&engine.device_buffers).insert(start, buffer);
        put(addr, "addr", start)
    })
}

/// `aiv_device_free`.
#[no_mangle]
pub extern "C" fn aiv_device_free(handle: *mut AivEngine, addr: u64) -> c_int {
    guard("aiv_device_free", || {
        let engine = engine_of(handle)?;
        let buffer = lock(&engine.device_buffers).remove(&addr).ok_or_else(|| {
            Failure::invalid(format!("{addr:#x} is not an address aiv_device_alloc returned to this engine"))
        })?;
        // Registered or not: the buffer must not stay registered once freed.
        let _ = engine.engine.unregister_memory(addr);
        drop(buffer);
        Ok(())
    })
}

/// `aiv_copy_to_device`.
#[no_mangle]
pub extern "C" fn aiv_copy_to_device(
    handle: *mut AivEngine,
    device_addr: u64,
    src: *const c_void,
    length: u64,
) -> c_int {
    guard("aiv_copy_to_device", || {
        let engine = engine_of(handle)?;
        let size = byte_count(length, "src")?;
        if size == 0 {
            return Ok(());
        }
        if src.is_null() {
            return Err(Failure::invalid("src is NULL"));
        }
        let device = engine.device()?;
        // SAFETY: not NULL and at most isize::MAX bytes (checked); the header requires `length` readable bytes at
        // `src` that nothing writes during the call.
        let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), size) };
        device.write(device_addr, data).map_err(|error| {
            Failure::device(format!("copy {length} bytes to device address {device_addr:#x}: {error}"))
        })
    })
}

/// `aiv_copy_from_device`.
#[no_mangle]
pub extern "C" fn aiv_copy_from_device(
    handle: *mut AivEngine,
    dst: *mut c_void,
    device_addr: u64,
    length: u64,
) -> c_int {
    guard("aiv_copy_from_device", || {
        let engine = engine_of(handle)?;
        let size = byte_count(length, "dst")?;
        if size == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(Failure::invalid("dst is NULL"));
        }
        let device = engine.device()?;
        // SAFETY: not NULL and at most isize::MAX bytes (checked); the header requires `length` writable bytes at
        // `dst` that nothing else accesses during the call.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), size) };
        device.read(device_addr, out).map_err(|error| {
            Failure::device(format!("copy {length} bytes from device address {device_addr:#x}: {error}"))
        })
    })
}

// ----- Registration. -----

/// The location a region of `kind` is registered with.
fn region_location(engine: &Engine, addr: u64, length: u64, kind: u32) -> Result<String, Failure> {
    Ok(match kind {
        MEM_AUTO => "*".to_owned(),
        MEM_HOST => "cpu:0".to_owned(),
        MEM_DEVICE => {
            let device = engine.device()?;
            if !device.backend().is_own_memory(addr, length.max(1)) {
                return Err(Failure::invalid(format!(
                    "[{addr:#x}, +{length}) is not memory of this engine's device ({})",
                    device.location()
                )));
            }
            device.location()
        }
        other => return Err(Failure::invalid(format!("kind {other} is not an aiv_mem_kind"))),
    })
}

fn register_one(engine: &Engine, addr: u64, length: u64, kind: u32) -> Result<(), Failure> {
    let location = region_location(engine, addr, length, kind)?;
    // SAFETY: the header passes the engine's contract to the caller: the range is memory of this process that stays
    // valid, and is not accessed in conflict with transfers, until it is deregistered and its transfers are done.
    unsafe { engine.engine.register_memory(addr, length, &location) }.map_err(Failure::from)
}

/// `aiv_register`.
#[no_mangle]
pub extern "C" fn aiv_register(handle: *mut AivEngine, addr: u64, length: u64, kind: u32) -> c_int {
    guard("aiv_register", || register_one(&*engine_of(handle)?, addr, length, kind))
}

/// `aiv_register_batch`: all or nothing, with one publication of the descriptor for the whole batch.
#[no_mangle]
pub extern "C" fn aiv_register_batch(handle: *mut AivEngine, regions: *const AivMemRegion, count: usize) -> c_int {
    guard("aiv_register_batch", || {
        let engine = engine_of(handle)?;
        let regions = array(regions, count, "regions")?;
        for (index, region) in regions.iter().enumerate() {
            if region.reserved != 0 {
                return Err(Failure::invalid(format!("regions[{index}].reserved is not 0")));
            }
        }
        let mut locations = Vec::with_capacity(regions.len());
        for (index, region) in regions.iter().enumerate() {
            let location = region_location(&engine, region.addr, region.length, region.kind)
                .map_err(|failure| Failure::new(failure.code, format!("regions[{index}]: {}", failure.message)))?;
            locations.push(location);
        }
        let batch: Vec<(u64, u64, &str)> = regions
            .iter()
            .zip(&locations)
            .map(|(region, location)| (region.addr, region.length, location.as_str()))
            .collect();
        // SAFETY: as `register_one`, for every region. The engine unregisters the regions of this call registered
        // before a refused one.
        unsafe { engine.engine.register_memory_batch(&batch) }.map_err(|(index, error)| {
            let failure = Failure::from(error);
            Failure::new(failure.code, format!("regions[{index}]: {}", failure.message))
        })
    })
}

/// `aiv_deregister`.
#[no_mangle]
pub extern "C" fn aiv_deregister(handle: *mut AivEngine, addr: u64) -> c_int {
    guard("aiv_deregister", || Ok(engine_of(handle)?.engine.unregister_memory(addr)?))
}

// ----- Segments. -----

/// `aiv_segment_open`.
#[no_mangle]
pub extern "C" fn aiv_segment_open(
    handle: *mut AivEngine,
    name: *const c_char,
    timeout_ms: u64,
    segment: *mut u64,
) -> c_int {
    guard("aiv_segment_open", || {
        let engine = engine_of(handle)?;
        put(segment, "segment", 0)?;
        let name = text(name, "name")?.to_owned();
        if name.trim().is_empty() {
            return Err(Failure::invalid("name is empty"));
        }
        let opened = if timeout_ms == 0 || timeout_ms == WAIT_DEFAULT {
            engine.engine.open_segment(&name)
        } else {
            // The engine's fetch is bounded by its metadata deadlines; the caller's limit may be shorter. A fetch
            // that outlives it finishes on its own thread (and caches the segment if it succeeds).
            let (sender, receiver) = std::sync::mpsc::channel();
            let (opener, target) = (engine.clone(), name.clone());
            std::thread::Builder::new()
                .name("aiv-capi-open".into())
                .spawn(move || {
                    let _ = sender.send(opener.engine.open_segment(&target));
                })
                .map_err(|error| Failure::new(code::INTERNAL, format!("start a thread: {error}")))?;
            match receiver.recv_timeout(Duration::from_millis(timeout_ms)) {
                Ok(opened) => opened,
                Err(_) => {
                    return Err(Failure::new(
                        code::TIMEOUT,
                        format!("segment {name:?} was not opened within {timeout_ms} ms"),
                    ))
                }
            }
        };
        let id = opened.map_err(|error| {
            let mut failure = Failure::from(error);
            // Whatever kept the descriptor from being fetched (no handshake server, no store entry): not found.
            if failure.code == code::TRANSPORT {
                failure.code = code::SEGMENT_NOT_FOUND;
            }
            failure
        })?;
        put(segment, "segment", id.0 + 1)
    })
}

/// `aiv_segment_close`.
#[no_mangle]
pub extern "C" fn aiv_segment_close(handle: *mut AivEngine, segment: u64) -> c_int {
    guard("aiv_segment_close", || {
        let engine = engine_of(handle)?;
        Ok(engine.engine.close_segment(segment_id(segment)?)?)
    })
}

// ----- Batches. -----

/// `aiv_submit`.
#[no_mangle]
pub extern "C" fn aiv_submit(
    handle: *mut AivEngine,
    requests: *const AivRequest,
    count: usize,
    protocol: *const c_char,
    batch: *mut u64,
) -> c_int {
    guard("aiv_submit", || {
        let engine = engine_of(handle)?;
        put(batch, "batch", 0)?;
        let given = array(requests, count, "requests")?;
        let protocol = if protocol.is_null() { "" } else { text(protocol, "protocol")? };
        let protocol = match protocol.trim() {
            "" => None,
            name => Some(
                engine
                    .engine
                    .config()
                    .aiv
                    .resolve_protocol(name)
                    .map_err(|error| Failure::new(code::NOT_SUPPORTED, format!("protocol {name:?}: {error}")))?,
            ),
        };
        let mut checked = Vec::with_capacity(given.len());
        for (index, request) in given.iter().enumerate() {
            let opcode = match request.opcode {
                OP_READ => Opcode::Read,
                OP_WRITE => Opcode::Write,
                other => {
                    return Err(Failure::invalid(format!("requests[{index}].opcode {other} is not an aiv_opcode")))
                }
            };
            if request.reserved != 0 {
                return Err(Failure::invalid(format!("requests[{index}].reserved is not 0")));
            }
            let target_id = segment_id(request.segment)
                .map_err(|failure| Failure::new(failure.code, format!("requests[{index}]: {}", failure.message)))?;
            engine.engine.segment(target_id).map_err(|_| {
                Failure::new(
                    code::INVALID_HANDLE,
                    format!("requests[{index}]: segment handle {} is not open in this engine", request.segment),
                )
            })?;
            checked.push(TransferRequest {
                opcode,
                source: request.local_addr,
                target_id,
                target_offset: request.remote_addr,
                length: request.length,
                protocol,
            });
        }
        let id = engine.engine.allocate_batch(checked.len())?;
        if let Err(error) = engine.engine.submit_transfer(id, &checked) {
            let _ = engine.engine.free_batch(id);
            return Err(error.into());
        }
        lock(&engine.batches).insert(id.0, checked.len());
        put(batch, "batch", id.0)
    })
}

/// The status code a failed or timed-out task reports.
fn task_code(engine: &Engine, batch: BatchId, task: usize, state: TransferState) -> c_int {
    if state == TransferState::Timeout {
        return code::TIMEOUT;
    }
    let Ok(Some(failure)) = engine.engine.task_failure(batch, task) else { return code::TRANSFER_FAILED };
    if failure.state() == TransferState::Timeout {
        return code::TIMEOUT;
    }
    match (failure.kind(), failure.mooncake_code()) {
        (_, Some(3)) => code::ADDRESS_NOT_REGISTERED,
        (_, Some(8)) => code::NOT_SUPPORTED,
        (_, Some(200)) => code::SEGMENT_NOT_FOUND,
        (FailureKind::Rejected | FailureKind::InvalidRequest, _) => code::INVALID_ARGUMENT,
        _ => code::TRANSFER_FAILED,
    }
}

/// The batch's status and the first failure's message.
fn batch_status(engine: &Engine, batch: u64) -> Result<(AivBatchStatus, Option<String>), Failure> {
    let tasks = batch_tasks(engine, batch)?;
    let id = BatchId(batch);
    let mut status = AivBatchStatus { tasks: tasks as u32, ..AivBatchStatus::default() };
    let (mut pending, mut failed, mut timed_out) = (0usize, 0usize, 0usize);
    let mut message = None;
    for task in 0..tasks {
        let task_status = engine.engine.transfer_status(id, task)?;
        status.transferred_bytes += task_status.transferred_bytes;
        match task_status.state {
            TransferState::Completed => status.completed += 1,
            TransferState::Waiting | TransferState::Pending => pending += 1,
            state => {
                if state == TransferState::Timeout {
                    timed_out += 1;
                } else {
                    failed += 1;
                }
                if message.is_none() {
                    status.error = task_code(engine, id, task, state);
                    let reason = engine.engine.task_reason(id, task)?.unwrap_or_else(|| format!("{state:?}"));
                    message = Some(format!("task {task}: {reason}"));
                }
            }
        }
    }
    status.failed = (failed + timed_out) as u32;
    status.state = if pending > 0 {
        STATE_PENDING
    } else if failed > 0 {
        STATE_FAILED
    } else if timed_out > 0 {
        STATE_TIMEOUT
    } else {
        STATE_COMPLETED
    };
    Ok((status, message))
}

fn report_status(
    engine: &Engine,
    batch: u64,
    out: *mut AivBatchStatus,
    message: *mut *mut c_char,
) -> Result<i32, Failure> {
    put_optional(message, "message", std::ptr::null_mut)?;
    let (status, reason) = batch_status(engine, batch)?;
    put(out, "status", status)?;
    if let Some(reason) = reason {
        put_optional(message, "message", || status::give_string(&reason))?;
    }
    Ok(status.state)
}

/// `aiv_batch_status`.
#[no_mangle]
pub extern "C" fn aiv_batch_status(
    handle: *mut AivEngine,
    batch: u64,
    status: *mut AivBatchStatus,
    message: *mut *mut c_char,
) -> c_int {
    guard("aiv_batch_status", || report_status(&*engine_of(handle)?, batch, status, message).map(drop))
}

/// `aiv_batch_wait`.
#[no_mangle]
pub extern "C" fn aiv_batch_wait(
    handle: *mut AivEngine,
    batch: u64,
    timeout_ms: u64,
    status: *mut AivBatchStatus,
    message: *mut *mut c_char,
) -> c_int {
    guard("aiv_batch_wait", || {
        let engine = engine_of(handle)?;
        batch_tasks(&engine, batch)?;
        if status.is_null() {
            return Err(Failure::invalid("status is NULL"));
        }
        let id = BatchId(batch);
        if timeout_ms == WAIT_DEFAULT {
            engine.engine.wait_batch(id)?;
        } else {
            engine.engine.wait_batch_for(id, Duration::from_millis(timeout_ms))?;
        }
        match report_status(&engine, batch, status, message)? {
            STATE_PENDING => Err(Failure::new(
                code::TIMEOUT,
                format!("batch {batch} still has pending transfers after {timeout_ms} ms"),
            )),
            _ => Ok(()),
        }
    })
}

/// `aiv_batch_free`.
#[no_mangle]
pub extern "C" fn aiv_batch_free(handle: *mut AivEngine, batch: u64) -> c_int {
    guard("aiv_batch_free", || {
        let engine = engine_of(handle)?;
        batch_tasks(&engine, batch)?;
        engine.engine.free_batch(BatchId(batch))?;
        lock(&engine.batches).remove(&batch);
        Ok(())
    })
}

// ----- Evidence. -----

/// The evidence of the batch's finished tasks: the tally and each task's record (`None` for a task without one).
fn batch_evidence(
    engine: &Engine,
    batch: u64,
) -> Result<(EvidenceTally, Vec<Option<::engine::evidence::TransferEvidence>>), Failure> {
    let tasks = batch_tasks(engine, batch)?;
    let mut tally = EvidenceTally::default();
    let mut records = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let record = engine.engine.task_evidence(BatchId(batch), task)?;
        if let Some(record) = &record {
            tally.add(record);
        }
        records.push(record);
    }
    Ok((tally, records))
}

fn submitter_word(tally: &EvidenceTally) -> Submitter {
    if tally.transfers == 0 {
        Submitter::Unknown
    } else {
        tally.submitter()
    }
}

fn act_counts(act: &Act) -> AivActCounts {
    AivActCounts { by_aiv: act.by_aiv, by_aicpu: act.by_aicpu, by_host: act.by_host, unattributed: act.unattributed }
}

/// `aiv_batch_evidence`.
#[no_mangle]
pub extern "C" fn aiv_batch_evidence(
    handle: *mut AivEngine,
    batch: u64,
    evidence: *mut AivEvidence,
    verdict: *mut *mut c_char,
) -> c_int {
    guard("aiv_batch_evidence", || {
        let engine = engine_of(handle)?;
        put_optional(verdict, "verdict", std::ptr::null_mut)?;
        if evidence.is_null() {
            return Err(Failure::invalid("evidence is NULL"));
        }
        let (tally, _) = batch_evidence(&engine, batch)?;
        let submitter = submitter_word(&tally);
        let mut word = [0 as c_char; 24];
        for (slot, byte) in word.iter_mut().zip(submitter.as_str().bytes().take(23)) {
            *slot = byte as c_char;
        }
        let record = AivEvidence {
            transfers: u32::try_from(tally.transfers).unwrap_or(u32::MAX),
            submitter: match submitter {
                Submitter::AivDirect => SUBMITTER_AIV_DIRECT,
                Submitter::AiCpuSubmitted => SUBMITTER_AI_CPU,
                Submitter::HostSubmitted => SUBMITTER_HOST,
                Submitter::Mixed => SUBMITTER_MIXED,
                Submitter::Unknown => SUBMITTER_UNKNOWN,
            },
            descriptors_written: act_counts(&tally.descriptors_written.as_act()),
            doorbells_rung: act_counts(&tally.doorbells_rung.as_act()),
            completion_seen: act_counts(&tally.completion_seen.as_act()),
            host_launches: tally.host_launches,
            submitter_word: word,
        };
        put(evidence, "evidence", record)?;
        put_optional(verdict, "verdict", || status::give_string(&tally.verdict_lines().join("\n")))
    })
}

/// `aiv_batch_evidence_json`.
#[no_mangle]
pub extern "C" fn aiv_batch_evidence_json(handle: *mut AivEngine, batch: u64, json: *mut *mut c_char) -> c_int {
    guard("aiv_batch_evidence_json", || {
        let engine = engine_of(handle)?;
        put(json, "json", std::ptr::null_mut())?;
        let (tally, records) = batch_evidence(&engine, batch)?;
        let document = serde_json::json!({
            "transfers": tally.transfers,
            "submitter": submitter_word(&tally).as_str(),
            "verdict": tally.verdict_lines(),
            "tally": tally,
            "records": records,
        });
        put(json, "json", status::give_string(&document.to_string()))
    })
}
