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
//!   doorbell and who first read each completion flag (docs/twin-runtime.md, "Provenance records"); version 2 names
//!   the AI CPU beside the kernel's cores and the Host;
//! - copies submitted by Host threads: synchronous `aclrtMemcpy` calls that moved bytes (the twin ADXL's TCP stand-in
//!   moves every transfer's bytes with them, on each side; the twin HiXL's wire path too), stream copies queued by
//!   `aclrtMemcpyAsync` (FabricMem's Host unfold), and stream synchronisations that returned success (the Host learning
//!   that its stream copies completed). The twin HiXL's upload of a batch's list and the copy into its Host flag are
//!   the AI-CPU launches' arguments and completion signal, counted with those launches, not here;
//! - the twin's ADXL (`libllm_datadist.so`, which reports through [`cannTwinEvidenceNote`]): transfer calls made by
//!   Host threads with their descriptors, and peer requests its TCP stand-in's server thread accepted with their
//!   ranges.
//!
//! [`cannTwinEvidenceLayout`] gives such a process the layout (version, size, the names of the counts in order) as
//! JSON, from the one definition here, so that it builds its structure without a list of its own.
//!
//! [`cannTwinRecordProvenance`] lets such a process turn the provenance records on before the acts it observes.

use core::ffi::{c_char, CStr};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use ascendcl_sys::sys::{aclError, ACL_ERROR_INVALID_PARAM, ACL_SUCCESS};

/// The layout version of [`CannTwinEvidence`] (a caller setting it gets that structure, with its values).
pub const EVIDENCE_VERSION_1: u32 = 1;
/// The layout version of [`CannTwinEvidenceV2`], the newest.
pub const EVIDENCE_VERSION: u32 = 2;

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
static AICPU_KERNELS_LAUNCHED: AtomicU64 = AtomicU64::new(0);
static AICPU_KERNEL_BLOCKS_LAUNCHED: AtomicU64 = AtomicU64::new(0);

pub(crate) fn note_launch(blocks: u32) {
    KERNELS_LAUNCHED.fetch_add(1, Ordering::Relaxed);
    KERNEL_BLOCKS_LAUNCHED.fetch_add(u64::from(blocks), Ordering::Relaxed);
}

pub(crate) fn note_aicpu_launch(blocks: u32) {
    AICPU_KERNELS_LAUNCHED.fetch_add(1, Ordering::Relaxed);
    AICPU_KERNEL_BLOCKS_LAUNCHED.fetch_add(u64::from(blocks), Ordering::Relaxed);
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

/// Defines an evidence structure (C layout) from its header fields, then its `u64` counts, and gives it the names of
/// its own counts in layout order ([`CannTwinEvidence::OWN_COUNTS`]), so that readers in other languages build the
/// layout from this one definition ([`cannTwinEvidenceLayout`]).
macro_rules! evidence_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$head_meta:meta])* pub $head:ident: $head_type:ty, )*
            ;
            $( $(#[$count_meta:meta])* pub $count:ident: u64, )*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$head_meta])* pub $head: $head_type, )*
            $( $(#[$count_meta])* pub $count: u64, )*
        }

        impl $name {
            /// The names of this structure's own `u64` counts, in layout order.
            pub const OWN_COUNTS: &'static [&'static str] = &[$(stringify!($count)),*];

            fn own_count_mut(&mut self, name: &str) -> Option<&mut u64> {
                match name {
                    $(stringify!($count) => Some(&mut self.$count),)*
                    _ => None,
                }
            }
        }
    };
}

evidence_struct! {
    /// What [`cannTwinEvidence`] writes for version 1 (C layout, every field a `uint64_t` after the two `uint32_t` and
    /// the version string). A caller sets `version` to [`EVIDENCE_VERSION_1`] and `size` to the bytes it allocated.
    /// The attributions name the kernel's cores and the Host only: SQEs, doorbells and flags of the AI CPU are in none
    /// of these fields (version 2 has them).
    pub struct CannTwinEvidence {
        pub version: u32,
        pub size: u32,
        /// `cann-twin <version>`, NUL-terminated.
        pub runtime: [c_char; 32],
        ;
        /// 1 while the provenance records are on (the SQE, doorbell and flag attributions below are then observed).
        pub provenance_recorded: u64,
        pub kernels_launched: u64,
        pub kernel_blocks_launched: u64,
        /// SDMA channels alive now (SHMEM's and the AI CPU's; 0: no engine can consume a descriptor).
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
        /// The twin's ADXL: transfer calls by Host threads and their descriptors; peer requests served and their
        /// ranges.
        pub adxl_transfers: u64,
        pub adxl_descs: u64,
        pub adxl_requests_served: u64,
        pub adxl_descs_served: u64,
    }
}

evidence_struct! {
    /// What [`cannTwinEvidence`] writes for version 2: the version-1 fields in their places (`version` 2 and `size` in
    /// `base`), then the AI CPU's. A caller sets `base.version` to [`EVIDENCE_VERSION`] and `base.size` to the bytes
    /// it allocated.
    pub struct CannTwinEvidenceV2 {
        pub base: CannTwinEvidence,
        ;
        /// SQEs executed whose slot an AI-CPU thread wrote last (while the provenance records were on).
        pub sqes_by_aicpu: u64,
        /// Accepted doorbell writes through the AI CPU's register path (while the records were on).
        pub doorbells_by_aicpu: u64,
        /// Flags whose first read returning the landed value was an AI-CPU thread's runtime copy.
        pub flags_seen_by_aicpu: u64,
        /// AI-CPU kernels launched (queued on a stream: the twin's HiXL launches its batch op so) and their blocks.
        pub aicpu_kernels_launched: u64,
        pub aicpu_kernel_blocks_launched: u64,
    }
}

impl CannTwinEvidenceV2 {
    /// The names of every `u64` count of version 2 in layout order (version 1's, then its own): the layout after the
    /// header (`uint32_t version`, `uint32_t size`, `char runtime[32]`), one `uint64_t` each.
    pub fn count_names() -> impl Iterator<Item = &'static str> {
        CannTwinEvidence::OWN_COUNTS.iter().chain(CannTwinEvidenceV2::OWN_COUNTS).copied()
    }

    /// Each count's name with its byte offset in the version-2 structure, in layout order: the counts follow the
    /// header one `uint64_t` each, so the first is at the structure's size less 8 bytes per count.
    pub fn count_offsets() -> impl Iterator<Item = (&'static str, usize)> {
        let first = std::mem::size_of::<CannTwinEvidenceV2>() - 8 * Self::count_names().count();
        Self::count_names().enumerate().map(move |(i, name)| (name, first + 8 * i))
    }

    /// The count called `name`, if there is one.
    pub fn count(&self, name: &str) -> Option<u64> {
        let mut copy = *self;
        copy.count_mut(name).map(|count| *count)
    }

    /// The count called `name`, to set it, if there is one.
    pub fn count_mut(&mut self, name: &str) -> Option<&mut u64> {
        if CannTwinEvidence::OWN_COUNTS.contains(&name) {
            self.base.own_count_mut(name)
        } else {
            self.own_count_mut(name)
        }
    }
}

/// The version-1 counts now (see the module documentation).
pub fn snapshot() -> CannTwinEvidence {
    let base = snapshot_v2().base;
    CannTwinEvidence { version: EVIDENCE_VERSION_1, size: std::mem::size_of::<CannTwinEvidence>() as u32, ..base }
}

/// The version-2 counts now (see the module documentation).
pub fn snapshot_v2() -> CannTwinEvidenceV2 {
    let mut base = CannTwinEvidence {
        version: EVIDENCE_VERSION,
        size: std::mem::size_of::<CannTwinEvidenceV2>() as u32,
        provenance_recorded: u64::from(crate::provenance::recording()),
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
    for (i, byte) in crate::TWIN_VERSION_STRING.bytes().take(base.runtime.len() - 1).enumerate() {
        base.runtime[i] = byte as c_char;
    }
    let mut out = CannTwinEvidenceV2 {
        base,
        aicpu_kernels_launched: AICPU_KERNELS_LAUNCHED.load(Ordering::Relaxed),
        aicpu_kernel_blocks_launched: AICPU_KERNEL_BLOCKS_LAUNCHED.load(Ordering::Relaxed),
        ..CannTwinEvidenceV2::default()
    };
    for channel in crate::sdma::all_channels() {
        let base = &mut out.base;
        base.sdma_channels += 1;
        base.sqes_executed += channel.progress.executed.load(Ordering::Relaxed);
        base.doorbells_rung += channel.doorbell.count.load(Ordering::Relaxed);
        let p = channel.provenance.snapshot();
        base.sqes_by_kernel += p.sqes_by_block.iter().map(|(_, n)| n).sum::<u64>();
        base.sqes_by_host += p.sqes_by_host;
        base.sqes_unknown += p.sqes_unknown;
        base.doorbells_by_kernel += p.doorbells_by_block.iter().map(|(_, n)| n).sum::<u64>();
        base.doorbells_by_host += p.doorbells_by_host;
        base.doorbells_unknown += p.doorbells_unknown;
        base.flags_landed += p.flags_landed;
        base.flags_seen_by_kernel += p.flags_seen_by_core;
        base.flags_seen_by_host += p.flags_seen_by_host;
        out.sqes_by_aicpu += p.sqes_by_aicpu;
        out.doorbells_by_aicpu += p.doorbells_by_aicpu;
        out.flags_seen_by_aicpu += p.flags_seen_by_aicpu;
    }
    out
}

/// Twin-only (not a CANN function): writes the counts in the layout of the `version` the caller set in `out`: 1,
/// [`snapshot`] (a [`CannTwinEvidence`]); 2, [`snapshot_v2`] (a [`CannTwinEvidenceV2`]). `size` must be at least
/// that structure's; `ACL_ERROR_INVALID_PARAM` otherwise, or for another version (nothing written).
///
/// # Safety
///
/// `out` is null or points to `out->size` writable bytes, aligned for a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cannTwinEvidence(out: *mut CannTwinEvidence) -> aclError {
    if out.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: the caller's contract: `out` is readable for the two header words.
    let (version, size) = unsafe { ((*out).version, (*out).size) };
    let needed = match version {
        EVIDENCE_VERSION_1 => std::mem::size_of::<CannTwinEvidence>(),
        EVIDENCE_VERSION => std::mem::size_of::<CannTwinEvidenceV2>(),
        _ => return ACL_ERROR_INVALID_PARAM,
    };
    if (size as usize) < needed {
        return ACL_ERROR_INVALID_PARAM;
    }
    match std::panic::catch_unwind(snapshot_v2) {
        Ok(evidence) if version == EVIDENCE_VERSION_1 => {
            let v1 = CannTwinEvidence {
                version: EVIDENCE_VERSION_1,
                size: std::mem::size_of::<CannTwinEvidence>() as u32,
                ..evidence.base
            };
            // SAFETY: `out` holds at least the version-1 structure's bytes (checked above), aligned (the contract).
            unsafe { out.write(v1) };
            ACL_SUCCESS
        }
        Ok(evidence) => {
            // SAFETY: `out` holds at least the version-2 structure's bytes (checked above) and is aligned for a
            // `uint64_t`, as the version-2 structure is (the contract).
            unsafe { out.cast::<CannTwinEvidenceV2>().write(evidence) };
            ACL_SUCCESS
        }
        Err(_) => ascendcl_sys::sys::ACL_ERROR_RT_INTERNAL_ERROR,
    }
}

/// The newest layout as [`cannTwinEvidenceLayout`] exports it: `{"version":2,"size":<bytes>,"counts":[<name>,...]}`,
/// the version to set, the size of [`CannTwinEvidenceV2`] and [`CannTwinEvidenceV2::count_names`] in layout order
/// (after the header, `uint32_t version`, `uint32_t size`, `char runtime[32]`, one `uint64_t` each). Built once.
pub fn layout_json() -> &'static CStr {
    static LAYOUT: OnceLock<CString> = OnceLock::new();
    LAYOUT.get_or_init(|| {
        let layout = serde_json::json!({
            "version": EVIDENCE_VERSION,
            "size": std::mem::size_of::<CannTwinEvidenceV2>(),
            "counts": CannTwinEvidenceV2::count_names().collect::<Vec<_>>(),
        });
        // JSON text has no NUL byte (serde_json escapes control characters), so this never falls back.
        CString::new(layout.to_string()).unwrap_or_default()
    })
}

/// Twin-only (not a CANN function): the layout [`cannTwinEvidence`] writes for the newest version, as a static
/// NUL-terminated JSON string ([`layout_json`]), so that a reader in another language builds its structure from
/// this one definition instead of a copy of the names. Never null; the string lives as long as the library.
#[no_mangle]
pub extern "C" fn cannTwinEvidenceLayout() -> *const c_char {
    std::panic::catch_unwind(|| layout_json().as_ptr()).unwrap_or(c"".as_ptr())
}

/// Twin-only (not a CANN function): turns the provenance records of this process on (`on` nonzero) or leaves them as
/// they are (0: the records are never turned off from here, as the engine never turns them off), so that an observer
/// that loaded this runtime as `libascendcl.so` (`aiv audit`'s Mooncake driver) sees who did each act
/// ([`crate::control::record_provenance`]: turn them on before the acts to be attributed). Returns 1 if they are on
/// now, else 0.
#[no_mangle]
pub extern "C" fn cannTwinRecordProvenance(on: u32) -> i32 {
    std::panic::catch_unwind(|| {
        if on != 0 && !crate::provenance::recording() {
            crate::provenance::set_recording(true);
        }
        i32::from(crate::provenance::recording())
    })
    .unwrap_or(0)
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
            version: EVIDENCE_VERSION_1,
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

    #[test]
    fn the_exported_layout_lists_every_count_in_layout_order_at_its_offset() {
        // SAFETY: the function returns a NUL-terminated string that lives as long as the library.
        let text = unsafe { CStr::from_ptr(cannTwinEvidenceLayout()) }.to_str().expect("UTF-8");
        let layout: serde_json::Value = serde_json::from_str(text).expect("JSON");
        let size = std::mem::size_of::<CannTwinEvidenceV2>();
        assert_eq!(layout["version"].as_u64(), Some(u64::from(EVIDENCE_VERSION)), "{text}");
        assert_eq!(layout["size"].as_u64(), Some(size as u64), "{text}");
        let names: Vec<&str> = layout["counts"].as_array().expect("counts").iter().filter_map(|n| n.as_str()).collect();
        assert_eq!(names, CannTwinEvidenceV2::count_names().collect::<Vec<_>>());
        assert_eq!(layout.as_object().map(|o| o.len()), Some(3), "version, size and counts only: {text}");
        // A reader places the counts after the header, one u64 each, ending at `size`: each name then reads the
        // field of that name (every field numbered apart, read back at the reader's offset).
        let first = size - 8 * names.len();
        assert_eq!(first, std::mem::offset_of!(CannTwinEvidence, provenance_recorded));
        let mut numbered = CannTwinEvidenceV2::default();
        for (i, name) in names.iter().enumerate() {
            *numbered.count_mut(name).expect("a count of the structure") = 1000 + i as u64;
        }
        // SAFETY: a version-2 structure is plain data of `size` bytes.
        let raw = unsafe { std::slice::from_raw_parts((&numbered as *const CannTwinEvidenceV2).cast::<u8>(), size) };
        let offsets: Vec<(&str, usize)> = CannTwinEvidenceV2::count_offsets().collect();
        for (i, name) in names.iter().enumerate() {
            let at = first + 8 * i;
            assert_eq!(offsets[i], (*name, at));
            let word = u64::from_le_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
            assert_eq!(word, 1000 + i as u64, "{name} at offset {at}");
        }
        assert_eq!(numbered.base.sdma_channels, 1003, "the fourth name is the fourth field");
        assert_eq!(numbered.sqes_by_aicpu, 1024, "version 2's first count follows version 1's");
        // The same string every call (static, so a caller may keep the pointer).
        assert_eq!(cannTwinEvidenceLayout(), cannTwinEvidenceLayout());
    }

    /// A buffer of `words` u64 (so aligned as the structures are), every byte 0xEE, with the header set.
    fn buffer(words: usize, version: u32, size: usize) -> Vec<u64> {
        let mut buffer = vec![u64::from_le_bytes([0xEE; 8]); words];
        buffer[0] = u64::from(version) | (size as u64) << 32;
        buffer
    }

    fn bytes(buffer: &[u64]) -> Vec<u8> {
        buffer.iter().flat_map(|word| word.to_le_bytes()).collect()
    }

    #[test]
    fn a_version_1_caller_gets_the_version_1_layout_and_a_version_2_caller_the_longer_one() {
        let (v1, v2) = (std::mem::size_of::<CannTwinEvidence>(), std::mem::size_of::<CannTwinEvidenceV2>());
        // Two u32, 32 bytes of name, 24 counts; then five more.
        assert_eq!((v1, v2), (8 + 32 + 24 * 8, 8 + 32 + 29 * 8));
        assert_eq!(std::mem::offset_of!(CannTwinEvidenceV2, sqes_by_aicpu), v1);
        // The names give the layout: the header, then one u64 per name, in order.
        assert_eq!(8 + 32 + 8 * CannTwinEvidenceV2::count_names().count(), v2);
        let mut numbered = CannTwinEvidenceV2::default();
        for (i, name) in CannTwinEvidenceV2::count_names().enumerate() {
            *numbered.count_mut(name).expect("a count") = i as u64 + 1;
        }
        // SAFETY: a version-2 structure is plain data: its bytes after the header are its counts.
        let raw: &[u8] =
            unsafe { std::slice::from_raw_parts((&numbered as *const CannTwinEvidenceV2).cast::<u8>(), v2) };
        for (i, word) in raw[40..].chunks_exact(8).enumerate() {
            assert_eq!(u64::from_le_bytes(word.try_into().expect("8 bytes")), i as u64 + 1);
        }
        assert_eq!(numbered.count("sqes_by_aicpu"), Some(25));
        assert_eq!(numbered.count("runtime"), None);
        let words = v2 / 8 + 4;
        // Version 1 with exactly its size: the version-1 structure, nothing written past it.
        let mut one = buffer(words, EVIDENCE_VERSION_1, v1);
        // SAFETY: `one` holds `words` u64, more than the size it claims, aligned for u64.
        assert_eq!(unsafe { cannTwinEvidence(one.as_mut_ptr().cast()) }, ACL_SUCCESS);
        let written = bytes(&one);
        let header = |at: usize| u32::from_le_bytes(written[at..at + 4].try_into().expect("4 bytes")) as usize;
        assert_eq!((header(0), header(4)), (1, v1));
        assert!(written[v1..].iter().all(|&byte| byte == 0xEE), "written past the version-1 structure");
        assert!(written[8..v1].iter().any(|&byte| byte != 0xEE), "the version-1 structure is written");
        // Version 2 with the version-1 size: refused, nothing written.
        let mut short = buffer(words, EVIDENCE_VERSION, v1);
        // SAFETY: as above.
        assert_eq!(unsafe { cannTwinEvidence(short.as_mut_ptr().cast()) }, ACL_ERROR_INVALID_PARAM);
        assert!(bytes(&short)[8..].iter().all(|&byte| byte == 0xEE));
        // Version 2 with its size: the version-2 structure, the same name and counts in the version-1 places.
        let mut two = buffer(words, EVIDENCE_VERSION, v2);
        note_sync_copy(1);
        note_aicpu_launch(1);
        // SAFETY: as above.
        assert_eq!(unsafe { cannTwinEvidence(two.as_mut_ptr().cast()) }, ACL_SUCCESS);
        let written = bytes(&two);
        assert!(written[v2..].iter().all(|&byte| byte == 0xEE), "written past the version-2 structure");
        // SAFETY: `two` holds a version-2 structure now (written above), aligned for u64.
        let two = unsafe { two.as_ptr().cast::<CannTwinEvidenceV2>().read() };
        // SAFETY: `one` holds a version-1 structure.
        let one = unsafe { one.as_ptr().cast::<CannTwinEvidence>().read() };
        assert_eq!((two.base.version, two.base.size as usize), (EVIDENCE_VERSION, v2));
        assert_eq!(two.base.runtime, one.runtime);
        assert!(two.base.host_sync_copies > one.host_sync_copies, "a copy counted between them: {two:?}");
        assert!(two.aicpu_kernels_launched >= 1, "an AI-CPU launch counted before it: {two:?}");
        assert!(two.aicpu_kernel_blocks_launched >= two.aicpu_kernels_launched, "{two:?}");
    }
}
