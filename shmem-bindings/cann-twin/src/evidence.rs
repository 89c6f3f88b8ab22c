//! Twin-only, not a CANN API: what this copy of the runtime saw happen in its process, as counts a process that
//! loaded it as `libascendcl.so` (Mooncake's Ascend wheel, driven by `aiv audit`) can read through the C function
//! [`cannTwinEvidence`]. The vendor's runtime has no such function; a caller that does not find the symbol must
//! report the counts as not observable.
//!
//! Every count is cumulative since the process loaded the runtime (a caller diffs two snapshots), made where the act
//! happens, never from what a caller says it is:
//!
//! - kernels: launches queued by `aclrtLaunchKernel` / `aclrtLaunchKernelWithHostArgs` and their blocks;
//! - the SDMA engines of every live channel (SHMEM instances not finalised): SQEs executed and accepted doorbells,
//!   and, while the provenance records are on (`control::record_provenance`), who wrote each SQE, who rang each
//!   doorbell and who first read each completion flag (docs/twin-runtime.md, "Provenance records");
//! - copies submitted by Host threads: synchronous `aclrtMemcpy` calls that moved bytes (the twin's ADXL moves every
//!   transfer's bytes with them, on each side), stream copies queued by `aclrtMemcpyAsync`, and stream
//!   synchronisations that returned success (the Host learning that its stream copies completed);
//! - the twin's ADXL (`libllm_datadist.so`, which reports through [`cannTwinEvidenceNote`]): transfer calls made by
//!   Host threads with their descriptors, and peer requests its server thread accepted with their ranges.

use core::ffi::c_char;
use std::sync::atomic::{AtomicU64, Ordering};

use ascendcl_sys::sys::{aclError, ACL_ERROR_INVALID_PARAM, ACL_SUCCESS};

/// The layout version of [`CannTwinEvidence`].
pub const EVIDENCE_VERSION: u32 = 1;

static KERNELS_LAUNCHED: AtomicU64 = AtomicU64::new(0);
static KERNEL_BLOCKS_LAUNCHED: AtomicU64 = AtomicU64::new(0);
static SYNC_COPIES: AtomicU64 = AtomicU64::new(0);
static SYNC_COPY_BYTES: AtomicU64 = AtomicU64::new(0);
static STREAM_COPIES: AtomicU64 = AtomicU64::new(0);
static STREAM_COPY_BYTES: AtomicU64 = AtomicU64::new(0);
static STREAM_SYNCS: AtomicU64 = AtomicU64::new(0);
static ADXL_TRANSFERS: AtomicU64 = AtomicU64::new(0);
static ADXL_DESCS: AtomicU64 = AtomicU64::new(0);
static ADXL_REQUESTS_SERVED: AtomicU64 = AtomicU64::new(0);
static ADXL_DESCS_SERVED: AtomicU64 = AtomicU64::new(0);

pub(crate) fn note_launch(blocks: u32) {
    KERNELS_LAUNCHED.fetch_add(1, Ordering::Relaxed);
    KERNEL_BLOCKS_LAUNCHED.fetch_add(u64::from(blocks), Ordering::Relaxed);
}

pub(crate) fn note_sync_copy(bytes: usize) {
    SYNC_COPIES.fetch_add(1, Ordering::Relaxed);
    SYNC_COPY_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

pub(crate) fn note_stream_copy(bytes: usize) {
    STREAM_COPIES.fetch_add(1, Ordering::Relaxed);
    STREAM_COPY_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

pub(crate) fn note_stream_sync() {
    STREAM_SYNCS.fetch_add(1, Ordering::Relaxed);
}

/// Twin-only (not a CANN function): the twin's ADXL (`cxx/adxl_engine.cpp`, in `libllm_datadist.so`) counts its
/// work here: `what` 1, a `TransferSync` / `TransferAsync` call by a Host thread with `count` descriptors; 2, a peer's
/// request of `count` ranges accepted by this process's ADXL server thread. Returns 0, or -1 for an unknown `what`.
#[no_mangle]
pub extern "C" fn cannTwinEvidenceNote(what: u32, count: u64) -> i32 {
    let (calls, items) = match what {
        1 => (&ADXL_TRANSFERS, &ADXL_DESCS),
        2 => (&ADXL_REQUESTS_SERVED, &ADXL_DESCS_SERVED),
        _ => return -1,
    };
    calls.fetch_add(1, Ordering::Relaxed);
    items.fetch_add(count, Ordering::Relaxed);
    0
}

/// What [`cannTwinEvidence`] writes (C layout, every field a `uint64_t` after the two `uint32_t` and the version
/// string). A caller sets `version` to [`EVIDENCE_VERSION`] and `size` to the bytes it allocated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CannTwinEvidence {
    pub version: u32,
    pub size: u32,
    /// `cann-twin <version>`, NUL-terminated.
    pub runtime: [c_char; 32],
    /// 1 while the provenance records are on (the SQE, doorbell and flag attributions below are then observed).
    pub provenance_recorded: u64,
    pub kernels_launched: u64,
    pub kernel_blocks_launched: u64,
    /// SDMA channels alive now (0: no SHMEM with SDMA in this process, so no engine can consume a descriptor).
    pub sdma_channels: u64,
    pub sqes_executed: u64,
    pub sqes_by_kernel: u64,
    pub sqes_by_host: u64,
    pub sqes_unknown: u64,
    pub doorbells_rung: u64,
    pub doorbells_by_kernel: u64,
    pub doorbells_by_host: u64,
    pub doorbells_unknown: u64,
    pub flags_landed: u64,
    pub flags_seen_by_kernel: u64,
    pub flags_seen_by_host: u64,
    pub host_sync_copies: u64,
    pub host_sync_copy_bytes: u64,
    pub host_stream_copies: u64,
    pub host_stream_copy_bytes: u64,
    pub host_stream_syncs: u64,
    /// The twin's ADXL: transfer calls by Host threads and their descriptors; peer requests served and their ranges.
    pub adxl_transfers: u64,
    pub adxl_descs: u64,
    pub adxl_requests_served: u64,
    pub adxl_descs_served: u64,
}

/// The counts now (see the module documentation).
pub fn snapshot() -> CannTwinEvidence {
    let mut out = CannTwinEvidence {
        version: EVIDENCE_VERSION,
        size: std::mem::size_of::<CannTwinEvidence>() as u32,
        provenance_recorded: u64::from(crate::control::provenance_recorded()),
        kernels_launched: KERNELS_LAUNCHED.load(Ordering::Relaxed),
        kernel_blocks_launched: KERNEL_BLOCKS_LAUNCHED.load(Ordering::Relaxed),
        host_sync_copies: SYNC_COPIES.load(Ordering::Relaxed),
        host_sync_copy_bytes: SYNC_COPY_BYTES.load(Ordering::Relaxed),
        host_stream_copies: STREAM_COPIES.load(Ordering::Relaxed),
        host_stream_copy_bytes: STREAM_COPY_BYTES.load(Ordering::Relaxed),
        host_stream_syncs: STREAM_SYNCS.load(Ordering::Relaxed),
        adxl_transfers: ADXL_TRANSFERS.load(Ordering::Relaxed),
        adxl_descs: ADXL_DESCS.load(Ordering::Relaxed),
        adxl_requests_served: ADXL_REQUESTS_SERVED.load(Ordering::Relaxed),
        adxl_descs_served: ADXL_DESCS_SERVED.load(Ordering::Relaxed),
        ..CannTwinEvidence::default()
    };
    for (i, byte) in crate::TWIN_VERSION_STRING.bytes().take(out.runtime.len() - 1).enumerate() {
        out.runtime[i] = byte as c_char;
    }
    for channel in crate::sdma::all_channels() {
        out.sdma_channels += 1;
        out.sqes_executed += channel.progress.executed.load(Ordering::Relaxed);
        out.doorbells_rung += channel.doorbell.count.load(Ordering::Relaxed);
        let p = channel.provenance.snapshot();
        out.sqes_by_kernel += p.sqes_by_block.iter().map(|(_, n)| n).sum::<u64>();
        out.sqes_by_host += p.sqes_by_host;
        out.sqes_unknown += p.sqes_unknown;
        out.doorbells_by_kernel += p.doorbells_by_block.iter().map(|(_, n)| n).sum::<u64>();
        out.doorbells_by_host += p.doorbells_by_host;
        out.doorbells_unknown += p.doorbells_unknown;
        out.flags_landed += p.flags_landed;
        out.flags_seen_by_kernel += p.flags_seen_by_core;
        out.flags_seen_by_host += p.flags_seen_by_host;
    }
    out
}

/// Twin-only (not a CANN function): writes [`snapshot`] into `out`, whose `version` must be [`EVIDENCE_VERSION`]
/// and `size` at least the structure's; `ACL_ERROR_INVALID_PARAM` otherwise (nothing written).
///
/// # Safety
///
/// `out` is null or points to `out->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cannTwinEvidence(out: *mut CannTwinEvidence) -> aclError {
    if out.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: the caller's contract: `out` is readable for the two header words.
    let (version, size) = unsafe { ((*out).version, (*out).size) };
    if version != EVIDENCE_VERSION || (size as usize) < std::mem::size_of::<CannTwinEvidence>() {
        return ACL_ERROR_INVALID_PARAM;
    }
    match std::panic::catch_unwind(snapshot) {
        Ok(evidence) => {
            // SAFETY: `out` holds at least the structure's bytes (checked above).
            unsafe { out.write(evidence) };
            ACL_SUCCESS
        }
        Err(_) => ascendcl_sys::sys::ACL_ERROR_RT_INTERNAL_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_c_function_checks_its_header_and_counts_copies() {
        // SAFETY: a null pointer is refused before any access.
        assert_eq!(unsafe { cannTwinEvidence(std::ptr::null_mut()) }, ACL_ERROR_INVALID_PARAM);
        let mut bad = CannTwinEvidence { version: 99, size: 4096, ..Default::default() };
        // SAFETY: `bad` is a whole structure (its `size` claims more, which is refused with the version first).
        assert_eq!(unsafe { cannTwinEvidence(&mut bad) }, ACL_ERROR_INVALID_PARAM);
        assert_eq!(bad.kernels_launched, 0);
        let before = snapshot();
        note_sync_copy(100);
        note_stream_copy(7);
        note_launch(4);
        assert_eq!(cannTwinEvidenceNote(1, 3), 0);
        assert_eq!(cannTwinEvidenceNote(7, 3), -1);
        let mut out = CannTwinEvidence {
            version: EVIDENCE_VERSION,
            size: std::mem::size_of::<CannTwinEvidence>() as u32,
            ..Default::default()
        };
        // SAFETY: `out` is a whole structure and says so.
        assert_eq!(unsafe { cannTwinEvidence(&mut out) }, ACL_SUCCESS);
        assert!(out.host_sync_copies > before.host_sync_copies);
        assert!(out.host_sync_copy_bytes >= before.host_sync_copy_bytes + 100);
        assert!(out.host_stream_copies > before.host_stream_copies);
        assert!(out.kernel_blocks_launched >= before.kernel_blocks_launched + 4);
        assert!(out.adxl_transfers > before.adxl_transfers && out.adxl_descs >= before.adxl_descs + 3);
        let name: Vec<u8> = out.runtime.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        assert_eq!(name, crate::TWIN_VERSION_STRING.as_bytes());
    }
}
