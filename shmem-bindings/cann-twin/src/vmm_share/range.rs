//! Twin-internal range exports: how the twin's HiXL server shares the memory behind a registration (and its registry
//! page) with its clients, as the vendor's shares it through VMM export and import. Not ACL calls.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use ascendcl_sys::sys::*;

use super::importer::fetch;
use super::{
    dup, forget_inherited, handle_pid, lock, own_pid, random_token, with_exports, RangeExport, Service,
    OP_RANGE_IMPORT, PID_BITS, SERVICE, TOKEN_BITS, TOKEN_MASK,
};
use crate::runtime::runtime;

/// Shares `size` bytes at `offset` of `fd` (a memfd: the heap or a physical allocation behind device memory, or a
/// page of the exporter's own) on this process's export service, with every process of this uid; returns the token
/// that names it (laid out as a shareable handle: this pid, random bits). Withdrawn by [`withdraw_range`].
pub(crate) fn export_range(fd: Arc<OwnedFd>, offset: usize, size: usize) -> Result<u64, aclError> {
    if size == 0 {
        return Err(ACL_ERROR_INVALID_PARAM);
    }
    let pid = u64::from(own_pid());
    if pid >> PID_BITS != 0 {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    let mut service = lock(&SERVICE);
    forget_inherited(&mut service);
    let token = with_exports(|exports| -> Result<u64, aclError> {
        let token = loop {
            let random = random_token()?;
            let candidate = (pid << TOKEN_BITS) | random;
            if random != 0 && !exports.ranges.contains_key(&candidate) {
                break candidate;
            }
        };
        exports.ranges.insert(token, RangeExport { fd, offset, size });
        Ok(token)
    })?;
    if service.is_none() {
        match Service::start() {
            Ok(started) => *service = Some(started),
            Err(code) => {
                with_exports(|exports| exports.ranges.remove(&token));
                return Err(code);
            }
        }
    }
    Ok(token)
}

/// Withdraws a range export (later imports fail; mappings already made stay). Stops the service with the last export.
pub(crate) fn withdraw_range(token: u64) {
    let mut service = lock(&SERVICE);
    let now_empty = with_exports(|exports| exports.ranges.remove(&token).is_some() && exports.is_empty());
    if now_empty {
        if let Some(running) = service.take() {
            running.stop();
        }
    }
}

/// The memfd and offset behind device range `[address, address + size)` of this process, if it lies in one heap
/// allocation or one mapping of a physical allocation: what [`export_range`] shares for it.
pub(crate) fn backing_of(address: u64, size: u64) -> Result<(Arc<OwnedFd>, usize), aclError> {
    let (address, size) = (
        usize::try_from(address).map_err(|_| ACL_ERROR_INVALID_PARAM)?,
        usize::try_from(size).map_err(|_| ACL_ERROR_INVALID_PARAM)?,
    );
    // Lock order: the runtime, then the space.
    let runtime = runtime();
    let guard = crate::space::space();
    let space = guard.as_ref().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
    if let Ok((fd, offset, _)) = space.heap_range(address, size) {
        return Ok((Arc::new(dup(fd)?), offset));
    }
    let (handle, offset) = space.mapped_range(address, size)?;
    let physical = runtime.physical.get(&handle).ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
    Ok((Arc::new(dup(physical.fd())?), offset))
}

/// A range another process (or this one) exported with [`export_range`], mapped into this process: `size` bytes at
/// `host`, in a shared mapping unmapped on drop.
#[derive(Debug)]
pub(crate) struct RangeMapping {
    pub(super) view: usize,
    pub(super) map_len: usize,
    /// The range's first byte in this process.
    pub host: usize,
    pub size: usize,
}

impl Drop for RangeMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map_range`, owned by this value; whoever gave the range a device window
        // removed it first (the space's write lock), so no translation to it is live.
        unsafe { libc::munmap(self.view as *mut libc::c_void, self.map_len) };
    }
}

/// Maps the range `token` names, from this process's exports or through the exporter's service (within
/// [`IMPORT_TIMEOUT`](super::IMPORT_TIMEOUT); `ACL_ERROR_RT_IPC_ERROR` when the exporter is gone).
pub(crate) fn import_range(token: u64) -> Result<RangeMapping, aclError> {
    let pid = handle_pid(token);
    if pid == 0 || token & TOKEN_MASK == 0 {
        return Err(ACL_ERROR_RT_INVALID_HANDLE);
    }
    let (fd, size, offset) = if pid == own_pid() {
        with_exports(|exports| -> Result<(OwnedFd, usize, usize), aclError> {
            let export = exports.ranges.get(&token).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
            Ok((dup(&export.fd)?, export.size, export.offset))
        })?
    } else {
        fetch(pid, OP_RANGE_IMPORT, token)?
    };
    map_range(&fd, offset, size)
}

/// Maps `size` bytes at `offset` of the memfd `fd` (an export's, checked by `fetch` or this process's own) shared,
/// readable and writable, at an address the kernel picks.
pub(super) fn map_range(fd: &OwnedFd, offset: usize, size: usize) -> Result<RangeMapping, aclError> {
    let page = crate::memory::page();
    let first = offset / page * page;
    let in_page = offset - first;
    let map_len = (in_page + size).div_ceil(page) * page;
    let file_offset = libc::off_t::try_from(first).map_err(|_| ACL_ERROR_RT_INTERNAL_ERROR)?;
    // SAFETY: a new shared mapping of a range the memfd holds, at an address the kernel picks.
    let view = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            fd.as_raw_fd(),
            file_offset,
        )
    };
    if view == libc::MAP_FAILED {
        return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
    }
    let view = view as usize;
    Ok(RangeMapping { view, map_len, host: view + in_page, size })
}
