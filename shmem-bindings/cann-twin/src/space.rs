//! The device address space of the process: one [`Space`] behind a read-write lock, its generation, and the copy
//! rules every entry point and engine shares (planning a copy as `aclrtMemcpy` checks it, performing it segment by
//! segment, recording what the Host observed of device memory).
//!
//! Lock order: the runtime mutex (`runtime`), then this lock. Translations and the copies through them run under the
//! space's *read* lock (so the SDMA engines copy without the runtime mutex, in parallel with each other and with the
//! Host's copies); allocation, free, map and unmap take its *write* lock, so no translated pointer outlives the memory
//! behind it.

use std::sync::{RwLock, RwLockReadGuard};

use ascendcl_sys::sys::*;

use crate::memory::{Segment, Segments, Space};

/// The device address space, made on first mutable use.
static SPACE: RwLock<Option<Space>> = RwLock::new(None);

/// The device address space, read-locked (`None` until something was allocated). Never take it twice on one thread.
pub(crate) fn space() -> RwLockReadGuard<'static, Option<Space>> {
    SPACE.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Bumped by every change of the device address space: what an emulated core remembers of it is valid only while
/// this has not moved (`kernel`'s translation cache).
static SPACE_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The device address space's generation (see [`SPACE_GENERATION`]).
pub(crate) fn space_generation() -> u64 {
    SPACE_GENERATION.load(std::sync::atomic::Ordering::Acquire)
}

/// Runs `body` on the device address space, write-locked, creating the space on first use.
pub(crate) fn with_space_mut<R>(body: impl FnOnce(&mut Space) -> Result<R, aclError>) -> Result<R, aclError> {
    let mut guard = SPACE.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    // Before the change, under the write lock: a core that reads the new generation after this sees the new space.
    SPACE_GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    if guard.is_none() {
        *guard = Some(Space::new()?);
    }
    match guard.as_mut() {
        Some(space) => body(space),
        None => Err(ACL_ERROR_RT_INTERNAL_ERROR),
    }
}

/// Runs `body` on the device address space, write-locked, if it exists.
pub(crate) fn with_existing_space_mut(body: impl FnOnce(&mut Space)) {
    let mut guard = SPACE.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    SPACE_GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    if let Some(space) = guard.as_mut() {
        body(space);
    }
}

/// Whether `address` is a device address (takes the space's read lock: do not call while holding it).
pub(crate) fn is_device_address(address: usize) -> bool {
    space().as_ref().is_some_and(|space| space.contains(address))
}

/// Device memory a memset (or the device model) reaches: `[address, address + len)` translated in `space`.
pub(crate) fn device_segments(
    space: Option<&Space>,
    address: usize,
    len: usize,
    write: bool,
) -> Result<Segments, aclError> {
    match space {
        Some(space) if space.contains(address) => space.translate(address, len, write),
        _ => Err(ACL_ERROR_RT_INVALID_MEMORY_TYPE),
    }
}

/// Checks a copy as `aclrtMemcpy` does and translates both sides in `space` (read-locked by the caller, who keeps
/// the lock while using the segments). `count` is non-zero and both pointers non-null (checked by the caller, in
/// the vendor's order).
pub(crate) fn plan_copy(
    space: Option<&Space>,
    dst: usize,
    dest_max: usize,
    src: usize,
    count: usize,
    kind: aclrtMemcpyKind,
) -> Result<(Segments, Segments), aclError> {
    let contains = |address: usize| space.is_some_and(|space| space.contains(address));
    let dst_device = contains(dst);
    let src_device = contains(src);
    let matches = match kind {
        ACL_MEMCPY_HOST_TO_HOST => !dst_device && !src_device,
        ACL_MEMCPY_HOST_TO_DEVICE | ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE => !src_device && dst_device,
        ACL_MEMCPY_DEVICE_TO_HOST => src_device && !dst_device,
        ACL_MEMCPY_DEVICE_TO_DEVICE => src_device && dst_device,
        ACL_MEMCPY_DEFAULT => true,
        _ => return Err(ACL_ERROR_INVALID_PARAM),
    };
    if !matches {
        return Err(ACL_ERROR_RT_INVALID_MEMORY_TYPE);
    }
    if dest_max < count {
        return Err(ACL_ERROR_RT_PARAM_INVALID);
    }
    let side = |address: usize, device: bool, write: bool| -> Result<Segments, aclError> {
        if device {
            device_segments(space, address, count, write)
        } else {
            address.checked_add(count).ok_or(ACL_ERROR_INVALID_PARAM)?;
            if contains(address + count - 1) {
                // A Host range running into the device address space.
                return Err(ACL_ERROR_RT_PARAM_INVALID);
            }
            Ok(Segments::one(address as *mut u8, count))
        }
    };
    Ok((side(dst, dst_device, true)?, side(src, src_device, false)?))
}

/// Copies `src` onto `dst` (the same total length), segment by segment, as `memmove` would.
///
/// # Safety
///
/// Every segment is valid memory for its length (device segments come from [`Space::translate`] under the space's
/// read lock, still held; Host segments are the caller's promise under the C contract).
pub(crate) unsafe fn perform_copy(dst: &[Segment], src: &[Segment]) {
    let (mut d, mut s) = (0, 0);
    let (mut d_off, mut s_off) = (0, 0);
    while d < dst.len() && s < src.len() {
        let take = (dst[d].len - d_off).min(src[s].len - s_off);
        // SAFETY: both ranges lie inside their segments (see the function's contract); `copy` allows overlap.
        unsafe { core::ptr::copy(src[s].ptr.add(s_off), dst[d].ptr.add(d_off), take) };
        d_off += take;
        s_off += take;
        if d_off == dst[d].len {
            d += 1;
            d_off = 0;
        }
        if s_off == src[s].len {
            s += 1;
            s_off = 0;
        }
    }
}

/// After a runtime copy of `count` bytes from `src` to `dst`: when it copied device memory into Host memory, the
/// calling thread observed what it copied (a landed completion flag among it is recorded as seen by the Host, or by
/// the AI CPU if the thread is the AI CPU's).
///
/// # Safety
///
/// `dst` is the copy's destination, valid for reading `count` bytes (the copy just wrote them).
pub(crate) unsafe fn host_observed(space: Option<&Space>, dst: usize, src: usize, count: usize) {
    let device = |address: usize| space.is_some_and(|space| space.contains(address));
    if device(src) && !device(dst) {
        // SAFETY: the caller's contract.
        let bytes = unsafe { std::slice::from_raw_parts(dst as *const u8, count) };
        crate::provenance::read(src as u64, bytes);
    }
}
