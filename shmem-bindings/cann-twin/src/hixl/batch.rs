//! HiXL batches: the client's worker running queued batches over the wire, the choice between the device path and
//! the wire path at submission, the `HixlCSClientBatch*` C functions and the completion-status query.

use core::ffi::c_void;
use std::io::ErrorKind;
use std::net::{Shutdown, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::*;

use super::client::{client_of, Batch, Client, ClientState, Outcome};
use super::common::{
    acl_copy, guard, inside, lock, not_null, Status, ASYNC_TIMEOUT, CHUNK, MAX_ENTRY_LEN, MAX_PENDING, OP_GET, OP_PUT,
    POLL, WINDOW,
};
use super::device;
use super::socket::{read_full, write_full, Io};

/// Whether the server closed or reset the connection (a peek that does not wait: the server sends nothing unasked).
pub(super) fn peer_gone(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    // SAFETY: peeks at most one byte into a live local buffer, without blocking.
    let read =
        unsafe { libc::recv(stream.as_raw_fd(), byte.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    match read {
        0 => true,
        n if n > 0 => false,
        _ => !matches!(
            std::io::Error::last_os_error().kind(),
            ErrorKind::WouldBlock | ErrorKind::Interrupted | ErrorKind::TimedOut
        ),
    }
}

/// Whether the client's server is gone (its connection closed or reset: its process killed, or its server destroyed),
/// looked at when a device batch ends: the imported memory outlives its exporter, so a batch that ran on into it
/// after the server went did not reach the server. The client is then broken and its link revoked, as its worker
/// does when it finds the loss while idle.
fn server_lost(client: &Client, state: &ClientState) -> bool {
    let Some(connection) = state.connection.as_ref() else { return true };
    if client.broken.load(Ordering::Relaxed) || peer_gone(&connection.stream) {
        client.broken.store(true, Ordering::Relaxed);
        if let Some(imports) = &connection.imports {
            imports.link.revoke();
        }
        return true;
    }
    false
}

/// The client's worker: runs the wire path's batches in order, and while idle watches the connection (every
/// [`POLL`]): a server that is gone (its process killed, or destroyed) breaks the client and revokes the device path's
/// link, so device batches on it fail.
pub(super) fn run_client(
    mut stream: TcpStream,
    batches: mpsc::Receiver<Arc<Batch>>,
    stop: &AtomicBool,
    broken: &AtomicBool,
    link: Option<&device::Link>,
    tallies: &device::Tallies,
) {
    let lost = |stream: &TcpStream| {
        broken.store(true, Ordering::Relaxed);
        let _ = stream.shutdown(Shutdown::Both);
        if let Some(link) = link {
            link.revoke();
        }
    };
    let mut staging = Vec::with_capacity(CHUNK + 64);
    loop {
        let batch = match batches.recv_timeout(POLL) {
            Ok(batch) => batch,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if !broken.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) && peer_gone(&stream) {
                    lost(&stream);
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        if broken.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
            batch.finish(Outcome::Failed);
            continue;
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| run_batch(&mut stream, &batch, &mut staging, stop, tallies)))
            .unwrap_or(Err(Io::Gone));
        match outcome {
            Ok(true) => batch.finish(Outcome::Completed),
            Ok(false) => batch.finish(Outcome::Failed),
            Err(io) => {
                // The stream is out of step or gone: no later batch may use it.
                lost(&stream);
                batch.finish(if io == Io::Timeout { Outcome::Timeout } else { Outcome::Failed });
            }
        }
    }
}

/// Runs every entry; `Ok(false)` when an entry failed but the stream is still in step.
///
/// Entries are pipelined in windows of [`WINDOW`]: the window's requests (with a put's bytes) are sent, coalesced
/// into writes of up to 1 MiB, then its answers are read. Neither side can block the other for good: a window's
/// put answers are `4 * WINDOW` bytes and its get requests `24 * WINDOW`, far below any socket buffer.
fn run_batch(
    stream: &mut TcpStream,
    batch: &Batch,
    staging: &mut Vec<u8>,
    stop: &AtomicBool,
    tallies: &device::Tallies,
) -> Result<bool, Io> {
    let deadline = batch.deadline;
    let mut all_ok = true;
    for window in batch.entries.chunks(WINDOW) {
        staging.clear();
        let mut local_ok = [true; WINDOW];
        for (index, entry) in window.iter().enumerate() {
            let (remote, local, len) = (entry.remote_buf as u64, entry.local_buf as u64, entry.len);
            staging.extend_from_slice(&(if batch.put { OP_PUT } else { OP_GET }).to_le_bytes());
            staging.extend_from_slice(&0u32.to_le_bytes());
            staging.extend_from_slice(&remote.to_le_bytes());
            staging.extend_from_slice(&len.to_le_bytes());
            let mut done = 0u64;
            while batch.put && done < len {
                if staging.len() >= CHUNK {
                    write_full(stream, staging, deadline, stop)?;
                    staging.clear();
                }
                let n = (len - done).min((CHUNK - staging.len()) as u64) as usize;
                let at = staging.len();
                staging.resize(at + n, 0);
                if local_ok[index] {
                    tallies.host_copy(n);
                    if acl_copy(staging[at..].as_mut_ptr() as usize, (local + done) as usize, n).is_err() {
                        // The bytes must still go (zeros, already there): the stream stays in step.
                        local_ok[index] = false;
                        staging[at..].fill(0);
                    }
                }
                done += n as u64;
            }
        }
        write_full(stream, staging, deadline, stop)?;
        staging.clear();
        let mut word = [0u8; 4];
        for (index, entry) in window.iter().enumerate() {
            read_full(stream, &mut word, Some(deadline), stop)?;
            if batch.put || u32::from_le_bytes(word) != HIXL_SUCCESS {
                all_ok &= local_ok[index] && u32::from_le_bytes(word) == HIXL_SUCCESS;
                continue;
            }
            let (local, len) = (entry.local_buf as u64, entry.len);
            staging.resize(CHUNK, 0);
            let mut ok = true;
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(CHUNK as u64) as usize;
                read_full(stream, &mut staging[..n], Some(deadline), stop)?;
                if ok {
                    tallies.host_copy(n);
                    ok = acl_copy((local + done) as usize, staging.as_ptr() as usize, n).is_ok();
                }
                done += n as u64;
            }
            read_full(stream, &mut word, Some(deadline), stop)?;
            all_ok &= ok && u32::from_le_bytes(word) == HIXL_SUCCESS;
        }
    }
    Ok(all_ok)
}

/// Test-only mis-wiring ([`crate::control::hixl_host_copies`]): the devices whose clients' batches all take the wire
/// path (Host copies).
static HOST_COPIES: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Makes every batch of the clients on `device` take the wire path (`true`), or lets the device path run again.
pub(crate) fn set_host_copies(device: i32, on: bool) {
    let mut devices = lock(&HOST_COPIES);
    devices.retain(|&other| other != device);
    if on {
        devices.push(device);
    }
}

fn host_copies(device: Option<i32>) -> bool {
    device.is_some_and(|device| lock(&HOST_COPIES).contains(&device))
}

/// A submitted batch: its client, its handle's id, the batch, and (device path) the stream it runs on.
struct Submitted {
    client: Arc<Client>,
    id: usize,
    batch: Arc<Batch>,
    stream: Option<Arc<crate::stream::Stream>>,
}

/// Whether `[address, address + len)` is device memory of this process (its first and last byte device addresses).
pub(super) fn device_range(address: u64, len: u64) -> bool {
    let end = address.saturating_add(len.saturating_sub(1));
    crate::space::is_device_address(address as usize) && crate::space::is_device_address(end as usize)
}

/// Checks a batch and hands it to its path; the id of its handle.
///
/// The device path when the connection imported the server's memory, the client has its slot, every remote range lies
/// in one live import and every local range is device memory of this process (HiXL's HCCS client-server mode does not
/// reach remote Host memory: the fact and its source are in docs/twin-runtime.md); the wire path otherwise.
fn submit(
    client_handle: HixlClientHandle,
    put: bool,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout: Duration,
    with_flag: bool,
) -> Result<Submitted, HixlStatus> {
    let client = client_of(client_handle)?;
    not_null(desc_list)?;
    if list_num == 0 {
        return Err(HIXL_PARAM_INVALID);
    }
    // A batch above the limit can never be accepted: refused before its list is read.
    if list_num as usize > MAX_PENDING {
        return Err(HIXL_RESOURCE_EXHAUSTED);
    }
    // SAFETY: non-null; the C contract makes it `list_num` readable descriptors.
    let entries = unsafe { core::slice::from_raw_parts(desc_list, list_num as usize) }.to_vec();
    let mut state = lock(&client.state);
    let Some(connection) = state.connection.as_ref() else { return Err(HIXL_FAILED) };
    if client.broken.load(Ordering::Relaxed) {
        return Err(HIXL_FAILED);
    }
    for entry in &entries {
        if entry.len > MAX_ENTRY_LEN
            || !inside(state.local.iter().map(|(_, r)| r), entry.local_buf as u64, entry.len)
            || !inside(&connection.remote, entry.remote_buf as u64, entry.len)
        {
            return Err(HIXL_PARAM_INVALID);
        }
    }
    // The limit counts entries (the documentation's "4K transfers"), not batches: the stricter reading.
    let pending: usize = state.pending.values().map(|batch| batch.entries.len()).sum();
    if pending + entries.len() > MAX_PENDING {
        return Err(HIXL_RESOURCE_EXHAUSTED);
    }
    let deadline = Instant::now() + timeout;
    let relocated: Option<Vec<HixlOneSideOpDesc>> = match (&state.slot, &connection.imports) {
        (Some(_), Some(imports)) if !host_copies(client.device) => entries
            .iter()
            .map(|entry| {
                let remote = imports.link.relocate(entry.remote_buf as u64, entry.len)?;
                device_range(entry.local_buf as u64, entry.len)
                    .then_some(HixlOneSideOpDesc { remote_buf: remote as *mut c_void, ..*entry })
            })
            .collect(),
        _ => None,
    };
    let on_device = match (relocated, &state.slot, &connection.imports) {
        (Some(list), Some(slot), Some(imports)) => {
            let launched = device::launch(slot, &imports.link, &client.tallies, put, &list, deadline, with_flag)?;
            Some((launched, slot.stream()))
        }
        _ => None,
    };
    let (device, stream) = on_device.map_or((None, None), |(launched, stream)| (Some(launched), Some(stream)));
    let batch =
        Arc::new(Batch { put, entries, deadline, outcome: Mutex::new(Outcome::Waiting), done: Condvar::new(), device });
    if stream.is_none() {
        // Not importable: the batch runs on the connection's wire worker.
        connection.queue.send(batch.clone()).map_err(|_| HIXL_FAILED)?;
    }
    client.tallies.batch(batch.entries.len(), stream.is_some());
    state.next_batch += 1;
    let id = state.next_batch;
    state.pending.insert(id, batch.clone());
    state.reap();
    drop(state);
    Ok(Submitted { client, id, batch, stream })
}

fn submit_async(
    client_handle: HixlClientHandle,
    put: bool,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut CompleteHandle,
) -> Status {
    not_null(complete_handle)?;
    let Submitted { id, .. } = submit(client_handle, put, list_num, desc_list, ASYNC_TIMEOUT, true)?;
    // SAFETY: non-null, writable by the C contract.
    unsafe { complete_handle.write(id as CompleteHandle) };
    Ok(())
}

fn submit_sync(
    client_handle: HixlClientHandle,
    put: bool,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> Status {
    if timeout_ms == 0 {
        return Err(HIXL_PARAM_INVALID);
    }
    let timeout = Duration::from_millis(u64::from(timeout_ms));
    let Submitted { client, id, batch, stream } = submit(client_handle, put, list_num, desc_list, timeout, false)?;
    let outcome = match (&batch.device, stream) {
        // The device path's Sync calls wait for the client's stream (`aclrtSynchronizeStreamWithTimeout`), then read
        // the batch's error status.
        (Some(launched), Some(stream)) => {
            let left = batch.deadline.saturating_duration_since(Instant::now());
            let synchronized = stream.synchronize(Some(left));
            if synchronized == ascendcl_sys::sys::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT || launched.timed_out() {
                Outcome::Timeout
            } else if launched.failed() || server_lost(&client, &lock(&client.state)) {
                Outcome::Failed
            } else {
                Outcome::Completed
            }
        }
        _ => {
            // The worker ends the batch by its deadline; the extra second only covers scheduling.
            let limit = batch.deadline + Duration::from_secs(1);
            let mut outcome = lock(&batch.outcome);
            while *outcome == Outcome::Waiting {
                let left = limit.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                outcome = batch.done.wait_timeout(outcome, left).unwrap_or_else(|p| p.into_inner()).0;
            }
            *outcome
        }
    };
    let mut state = lock(&client.state);
    state.pending.remove(&id);
    if batch.device.as_ref().is_some_and(|launched| !launched.quiet()) {
        state.retired.push(batch);
    }
    state.reap();
    drop(state);
    match outcome {
        Outcome::Completed => Ok(()),
        Outcome::Waiting | Outcome::Timeout => Err(HIXL_TIMEOUT),
        Outcome::Failed => Err(HIXL_FAILED),
    }
}

/// `HixlCSClientBatchPutAsync`: `local_buf` to `remote_buf` for every entry; the handle for
/// `HixlCSClientQueryCompleteStatus`.
///
/// # Safety
/// The C contract: `desc_list` holds `list_num` descriptors; the ranges stay registered until the batch is final.
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientBatchPutAsync(
    client_handle: HixlClientHandle,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut CompleteHandle,
) -> HixlStatus {
    guard(|| submit_async(client_handle, true, list_num, desc_list, complete_handle))
}

/// `HixlCSClientBatchGetAsync`: `remote_buf` to `local_buf` for every entry.
///
/// # Safety
/// As [`HixlCSClientBatchPutAsync`].
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientBatchGetAsync(
    client_handle: HixlClientHandle,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut CompleteHandle,
) -> HixlStatus {
    guard(|| submit_async(client_handle, false, list_num, desc_list, complete_handle))
}

/// `HixlCSClientBatchPutSync`: as the Async call, waiting up to `timeout_ms` (`HIXL_TIMEOUT` past it).
///
/// # Safety
/// As [`HixlCSClientBatchPutAsync`].
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientBatchPutSync(
    client_handle: HixlClientHandle,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> HixlStatus {
    guard(|| submit_sync(client_handle, true, list_num, desc_list, timeout_ms))
}

/// `HixlCSClientBatchGetSync`.
///
/// # Safety
/// As [`HixlCSClientBatchPutAsync`].
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientBatchGetSync(
    client_handle: HixlClientHandle,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> HixlStatus {
    guard(|| submit_sync(client_handle, false, list_num, desc_list, timeout_ms))
}

/// `HixlCSClientQueryCompleteStatus`: waiting, completed, failed or timeout; a final state releases the handle
/// (a later query of it is `HIXL_PARAM_INVALID`).
///
/// # Safety
/// The C contract: `complete_status` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn HixlCSClientQueryCompleteStatus(
    client_handle: HixlClientHandle,
    complete_handle: CompleteHandle,
    complete_status: *mut HixlCompleteStatus,
) -> HixlStatus {
    guard(|| {
        let client = client_of(client_handle)?;
        not_null(complete_status)?;
        let mut state = lock(&client.state);
        let id = complete_handle as usize;
        let batch = state.pending.get(&id).cloned().ok_or(HIXL_PARAM_INVALID)?;
        let outcome = match &batch.device {
            // The device path: the Host flag and the error status only (no synchronisation, no copy).
            Some(launched) if launched.landed() => {
                if launched.timed_out() {
                    Outcome::Timeout
                } else if launched.failed() || server_lost(&client, &state) {
                    Outcome::Failed
                } else {
                    Outcome::Completed
                }
            }
            Some(_) if Instant::now() >= batch.deadline => Outcome::Timeout,
            Some(_) => Outcome::Waiting,
            None => *lock(&batch.outcome),
        };
        let status = match outcome {
            Outcome::Waiting => HIXL_COMPLETE_STATUS_WAITING,
            Outcome::Completed => HIXL_COMPLETE_STATUS_COMPLETED,
            Outcome::Failed => HIXL_COMPLETE_STATUS_FAILED,
            Outcome::Timeout => HIXL_COMPLETE_STATUS_TIMEOUT,
        };
        if outcome != Outcome::Waiting {
            state.pending.remove(&id);
            if batch.device.is_some() {
                // Its list is freed once nothing of it runs (the next submit reaps it).
                state.retired.push(batch);
            }
        }
        // SAFETY: non-null, writable by the C contract.
        unsafe { complete_status.write(status) };
        Ok(())
    })
}
