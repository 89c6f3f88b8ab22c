//! HiXL's client-server mode with a device endpoint, as the vendor's library runs it (`hicann/hixl`
//! `src/hixl/cs/hixl_cs_client.cc`, `src/ops/hixl_kernel/hixl_batch_transfer.cc`): the Host copies a batch's op list
//! to device memory, launches one AI-CPU kernel per 128 entries on the client's stream, then queues a copy of a device
//! constant 1 into a Host flag of the batch; the AI-CPU kernel turns each entry into SDMA SQEs on its own channel and
//! waits for them; the server's memory is passive, imported into the client's device address space at connect.
//!
//! - **Server side**: each DEVICE registration is exported (the twin-internal range export of
//!   [`crate::vmm_share::export_range`]: the heap range or the physical allocation behind it, as `vmm_share` shares
//!   memory for `aclrtMemExportToShareableHandle` and IPC keys), and a **registry page** (a memfd of one `u64` per
//!   registration slot, exported the same way) holds a nonzero stamp while the registration lives and 0 once it is
//!   withdrawn. The hello answer carries the registry's token and each registration's token, slot and stamp.
//! - **Client side** ([`import`]): the registry and every exported DEVICE registration are mapped and given device
//!   windows of the client's address space at connect ([`Imports`]), unmapped when the connection ends; the
//!   connection's [`Link`] says whether each is still live (the connection not lost, the stamp unchanged).
//! - **A batch** ([`launch`]): its remote ranges relocated into the windows; the list copied with a synchronous
//!   `aclrtMemcpy` into device memory the library owns; per [`MAX_KERNEL_ENTRIES`] entries one AI-CPU launch
//!   ([`BatchKernel`]) on the client's stream ([`Slot`]); then (Async calls) the D2H copy of the constant 1 into the
//!   batch's Host flag. The vendor's client also queues a notify wait after the last chunk; the twin's kernel waits
//!   for its own SQEs, so the stream needs none.
//! - **The kernel**: per entry, SQEs of at most 1 MiB (the twin engine's limit) written by the AI CPU into its channel,
//!   committed per 128, then its flag SQE and the poll of its completion word ([`crate::aicpu::Cpu`]); an entry whose
//!   import is no longer live fails the batch while the others run; a revoked link or the batch's deadline stops it. It
//!   adds its entries of the channel's consumption log to the client's [`Tallies`].

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::{CannTwinHixlEvidence, HixlOneSideOpDesc, HixlStatus, HIXL_FAILED};
use ascendcl_sys::sys::*;

use super::common::Region;
use crate::aicpu::{Acts, Cpu, Kernel, Launch};
use crate::stream::{Stream, Task};
use crate::vmm_share::RangeMapping;

/// Entries per AI-CPU launch (`kMaxKernelBatchSize`, `hicann/hixl` `src/hixl/cs/hixl_cs_client.cc`).
pub const MAX_KERNEL_ENTRIES: usize = 128;
/// Bytes of one `HixlOneSideOpDesc` in the device copy of a batch's list.
const DESC_BYTES: usize = 24;
/// The largest piece of an entry one SQE carries: the twin engine's limit (1 MiB), not the vendor's.
const PIECE: u64 = crate::sdma::SQE_MAX_LENGTH as u64;
/// How far past the batch's deadline a launch's timeout runs (the kernel stops at the deadline itself).
const LAUNCH_SLACK: Duration = Duration::from_secs(2);
/// Slots of a registry page: one per registration a server may hold.
pub const REGISTRY_SLOTS: usize = super::common::MAX_REGISTRATIONS;

fn status(_: aclError) -> HixlStatus {
    HIXL_FAILED
}

// ---------------------------------------------------------------------------------------------------------------
// Server side.

/// What the hello answer says about one registration's export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionExport {
    /// The range export's token (`vmm_share::export_range`).
    pub token: u64,
    /// Its slot in the server's registry page and the stamp that slot holds while it lives.
    pub slot: u32,
    pub stamp: u64,
}

/// A server's registry page: one `u64` per registration slot, the stamp of the live registration there or 0.
#[derive(Debug)]
pub(super) struct Registry {
    view: usize,
    token: u64,
    used: Vec<bool>,
    next_stamp: u64,
}

/// Bytes of a registry page.
const REGISTRY_BYTES: usize = REGISTRY_SLOTS * 8;

impl Registry {
    /// A zeroed registry in a memfd of its own, exported.
    pub(super) fn new() -> Result<Registry, aclError> {
        // SAFETY: a NUL-terminated name and valid flags.
        let raw = unsafe { libc::memfd_create(c"cann-twin-hixl-registry".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `fd` is a valid memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), REGISTRY_BYTES as libc::off_t) } != 0 {
            return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
        }
        // SAFETY: a new shared mapping of the whole memfd, at an address the kernel picks.
        let view = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                REGISTRY_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if view == libc::MAP_FAILED {
            return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
        }
        let view = view as usize;
        match crate::vmm_share::export_range(Arc::new(fd), 0, REGISTRY_BYTES) {
            Ok(token) => Ok(Registry { view, token, used: vec![false; REGISTRY_SLOTS], next_stamp: 0 }),
            Err(code) => {
                // SAFETY: the mapping made above, shared with nobody.
                unsafe { libc::munmap(view as *mut libc::c_void, REGISTRY_BYTES) };
                Err(code)
            }
        }
    }

    /// The registry's export token.
    pub(super) fn token(&self) -> u64 {
        self.token
    }

    fn word(&self, slot: usize) -> &AtomicU64 {
        // SAFETY: `slot < REGISTRY_SLOTS` (checked by the callers), so the word lies in the mapping, which lives as
        // long as `self`; every user of the page reads and writes its words atomically.
        unsafe { AtomicU64::from_ptr((self.view + slot * 8) as *mut u64) }
    }

    /// Exports the device memory behind `region` and gives it a slot; `None` when it cannot be exported (HOST memory,
    /// a range that is no heap allocation or mapping of this process, no free slot).
    pub(super) fn export(&mut self, region: &Region) -> Option<RegionExport> {
        if region.kind != ascendcl_sys::hixl::COMM_MEM_TYPE_DEVICE.0 {
            return None;
        }
        let slot = self.used.iter().position(|used| !used)?;
        let (fd, offset) = crate::vmm_share::backing_of(region.addr, region.size).ok()?;
        let size = usize::try_from(region.size).ok()?;
        let token = crate::vmm_share::export_range(fd, offset, size).ok()?;
        self.next_stamp += 1;
        let stamp = self.next_stamp;
        self.used[slot] = true;
        self.word(slot).store(stamp, Ordering::Release);
        Some(RegionExport { token, slot: slot as u32, stamp })
    }

    /// Withdraws an export: its slot reads 0 (its importers see it gone), later imports fail.
    pub(super) fn withdraw(&mut self, export: &RegionExport) {
        let slot = export.slot as usize;
        if slot < REGISTRY_SLOTS {
            self.word(slot).store(0, Ordering::Release);
            self.used[slot] = false;
        }
        crate::vmm_share::withdraw_range(export.token);
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        for slot in 0..REGISTRY_SLOTS {
            self.word(slot).store(0, Ordering::Release);
        }
        crate::vmm_share::withdraw_range(self.token);
        // SAFETY: the mapping made in `new`, owned by this value; importers hold mappings of their own.
        unsafe { libc::munmap(self.view as *mut libc::c_void, REGISTRY_BYTES) };
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Client side: imports.

/// One imported registration: where it lies in the server's address space and in this process's device addresses.
#[derive(Clone, Copy, Debug)]
struct Imported {
    remote: u64,
    size: u64,
    local: u64,
    slot: u32,
    stamp: u64,
}

/// What a connection knows of the server's imported memory, shared with the batches that use it.
#[derive(Debug)]
pub(super) struct Link {
    /// Set when the connection is lost or ended: every batch on it stops.
    revoked: AtomicBool,
    registry: RangeMapping,
    imported: Vec<Imported>,
}

impl Link {
    /// Whether the connection is lost or ended.
    pub(super) fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// Marks the connection lost or ended: batches on it fail, no new one uses it.
    pub(super) fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    fn live(&self, imported: &Imported) -> bool {
        let slot = imported.slot as usize;
        if self.revoked() || slot >= REGISTRY_SLOTS {
            return false;
        }
        // SAFETY: `slot < REGISTRY_SLOTS` and the registry mapping holds `REGISTRY_BYTES` (checked at import); it
        // lives as long as `self`. The server writes the words atomically.
        let word = unsafe { AtomicU64::from_ptr((self.registry.host + slot * 8) as *mut u64) };
        word.load(Ordering::Acquire) == imported.stamp
    }

    /// The device address in this process of the server's `[remote, remote + len)`, if it lies in one live import.
    pub(super) fn relocate(&self, remote: u64, len: u64) -> Option<u64> {
        let end = remote.checked_add(len)?;
        let imported = self.imported.iter().find(|i| remote >= i.remote && end <= i.remote + i.size)?;
        self.live(imported).then(|| imported.local + (remote - imported.remote))
    }

    /// Whether this process's device range `[local, local + len)` lies in one live import.
    fn live_local(&self, local: u64, len: u64) -> bool {
        let Some(end) = local.checked_add(len) else { return false };
        self.imported.iter().any(|i| local >= i.local && end <= i.local + i.size && self.live(i))
    }
}

/// A device window of this process onto an imported registration.
#[derive(Debug)]
struct Window {
    mapping: RangeMapping,
}

impl Drop for Window {
    fn drop(&mut self) {
        // The window goes before its mapping (the space's write lock: no translation to it is live after).
        let _ = crate::space::with_space_mut(|space| space.unregister(self.mapping.host));
    }
}

/// A connection's imports: the link its batches share and the device windows it owns (removed on drop).
#[derive(Debug)]
pub(super) struct Imports {
    pub link: Arc<Link>,
    _windows: Vec<Window>,
}

impl Drop for Imports {
    fn drop(&mut self) {
        // Batches still running on the link stop at their next check; their SQEs into the windows fault after this.
        self.link.revoke();
    }
}

/// Imports the server's registry (`registry_token`) and each of its registrations that carries an export, as
/// device windows of this process; `None` when the registry cannot be imported (nothing then runs on the device
/// path). A registration that cannot be imported is left to the wire path.
pub(super) fn import(registry_token: u64, remote: &[Region]) -> Option<Imports> {
    if registry_token == 0 {
        return None;
    }
    let registry = crate::vmm_share::import_range(registry_token).ok()?;
    if registry.size < REGISTRY_BYTES {
        return None;
    }
    let mut imported = Vec::new();
    let mut windows = Vec::new();
    for region in remote {
        let Some(export) = region.export else { continue };
        let Ok(mapping) = crate::vmm_share::import_range(export.token) else { continue };
        if mapping.size as u64 != region.size {
            continue;
        }
        let Ok(local) = crate::space::with_space_mut(|space| space.register(mapping.host, mapping.size, false)) else {
            continue;
        };
        imported.push(Imported {
            remote: region.addr,
            size: region.size,
            local: local as u64,
            slot: export.slot,
            stamp: export.stamp,
        });
        windows.push(Window { mapping });
    }
    let link = Arc::new(Link { revoked: AtomicBool::new(false), registry, imported });
    Some(Imports { link, _windows: windows })
}

// ---------------------------------------------------------------------------------------------------------------
// Client side: the slot, the tallies, batches.

/// A client's device resources (the vendor's pool slot): its stream, on which its batches run in order, and a
/// device constant 1 (`dev_const_one`) the Async batches copy into their Host flag.
pub(super) struct Slot {
    device: i32,
    stream: Arc<Stream>,
    const_one: u64,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("device", &self.device).finish_non_exhaustive()
    }
}

impl Slot {
    /// The slot of a client on `device`.
    pub(super) fn new(device: i32) -> Result<Slot, HixlStatus> {
        let const_one =
            crate::space::with_space_mut(|space| space.malloc(8, crate::memory::LIBRARY_OWNED)).map_err(status)? as u64;
        let written = crate::sdma::write_device(const_one, &1u64.to_le_bytes());
        let stream = written.and_then(|()| Stream::spawn(device, crate::runtime::run_task));
        match stream {
            Ok(stream) => Ok(Slot { device, stream, const_one }),
            Err(code) => {
                let _ = crate::space::with_space_mut(|space| space.free(const_one as usize));
                Err(status(code))
            }
        }
    }

    /// The slot's stream (to wait for it without the client's lock).
    pub(super) fn stream(&self) -> Arc<Stream> {
        Arc::clone(&self.stream)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Every queued task runs first (the kernels of a revoked link stop at once).
        self.stream.shut_down();
        let _ = crate::space::with_space_mut(|space| space.free(self.const_one as usize));
    }
}

/// A client's counts ([`CannTwinHixlEvidence`]), made where each act happens.
#[derive(Debug, Default)]
pub(super) struct Tallies {
    batches: AtomicU64,
    entries: AtomicU64,
    device_batches: AtomicU64,
    launches: AtomicU64,
    unrecorded_launches: AtomicU64,
    lost: AtomicU64,
    sqes: [AtomicU64; 4],
    doorbells: [AtomicU64; 4],
    flags: [AtomicU64; 4],
    wire_batches: AtomicU64,
    host_copies: AtomicU64,
    host_copy_bytes: AtomicU64,
}

fn add(counter: &AtomicU64, value: u64) {
    counter.fetch_add(value, Ordering::Relaxed);
}

impl Tallies {
    /// A batch of `entries` was accepted; `device`: it runs on the AI CPU, else over the wire.
    pub(super) fn batch(&self, entries: usize, device: bool) {
        add(&self.batches, 1);
        add(&self.entries, entries as u64);
        add(if device { &self.device_batches } else { &self.wire_batches }, 1);
    }

    /// A client-side runtime copy of a wire batch's data, of `bytes`.
    pub(super) fn host_copy(&self, bytes: usize) {
        add(&self.host_copies, 1);
        add(&self.host_copy_bytes, bytes as u64);
    }

    fn acts(&self, acts: &Acts) {
        let by = |counters: &[AtomicU64; 4], values: [u64; 4]| {
            counters.iter().zip(values).for_each(|(counter, value)| add(counter, value));
        };
        by(&self.sqes, [acts.sqes_by_aicpu, acts.sqes_by_host, acts.sqes_by_aiv, acts.sqes_unattributed]);
        by(
            &self.doorbells,
            [acts.doorbells_by_aicpu, acts.doorbells_by_host, acts.doorbells_by_aiv, acts.doorbells_unattributed],
        );
        by(&self.flags, [acts.flags_by_aicpu, acts.flags_by_host, acts.flags_by_aiv, acts.flags_unread]);
        add(&self.lost, acts.lost);
        add(&self.unrecorded_launches, u64::from(acts.unrecorded));
    }

    /// The counts now, as version 1 of [`CannTwinHixlEvidence`].
    pub(super) fn snapshot(&self) -> CannTwinHixlEvidence {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CannTwinHixlEvidence {
            batches: load(&self.batches),
            entries: load(&self.entries),
            device_batches: load(&self.device_batches),
            launches: load(&self.launches),
            unrecorded_launches: load(&self.unrecorded_launches),
            log_entries_lost: load(&self.lost),
            sqes_by_aicpu: load(&self.sqes[0]),
            sqes_by_host: load(&self.sqes[1]),
            sqes_by_aiv: load(&self.sqes[2]),
            sqes_unattributed: load(&self.sqes[3]),
            doorbells_by_aicpu: load(&self.doorbells[0]),
            doorbells_by_host: load(&self.doorbells[1]),
            doorbells_by_aiv: load(&self.doorbells[2]),
            doorbells_unattributed: load(&self.doorbells[3]),
            flags_by_aicpu: load(&self.flags[0]),
            flags_by_host: load(&self.flags[1]),
            flags_by_aiv: load(&self.flags[2]),
            flags_unread: load(&self.flags[3]),
            wire_batches: load(&self.wire_batches),
            host_copies: load(&self.host_copies),
            host_copy_bytes: load(&self.host_copy_bytes),
            ..CannTwinHixlEvidence::new()
        }
    }
}

/// What a batch's launches share: its error status (the vendor's slot error flag, written by the kernel), its
/// deadline, its link, and how many of its launches have not ended yet.
#[derive(Debug)]
struct BatchShared {
    error: AtomicU32,
    deadline: Instant,
    link: Arc<Link>,
    launches_left: AtomicU32,
}

impl BatchShared {
    fn fail(&self, code: aclError) {
        let _ = self.error.compare_exchange(0, code.max(1) as u32, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// A batch on the device path: its Host flag (Async calls), its shared state, and its list in device memory.
#[derive(Debug)]
pub(super) struct DeviceBatch {
    host_flag: Option<Box<AtomicU64>>,
    shared: Arc<BatchShared>,
    descs: u64,
}

impl DeviceBatch {
    /// Whether the D2H copy of the constant 1 has landed in the Host flag (every launch before it on the stream has
    /// ended). Reads the flag only.
    pub(super) fn landed(&self) -> bool {
        self.host_flag.as_ref().is_some_and(|flag| flag.load(Ordering::Acquire) == 1)
    }

    /// Whether a launch of the batch failed (the kernel's error status).
    pub(super) fn failed(&self) -> bool {
        self.shared.error.load(Ordering::Acquire) != 0
    }

    /// Whether it failed because its deadline passed (the kernel stopped at it, or its launch timed out).
    pub(super) fn timed_out(&self) -> bool {
        self.shared.error.load(Ordering::Acquire) == ACL_ERROR_RT_AICPU_TIMEOUT as u32
    }

    /// Whether nothing of the batch runs any more: every launch ended, and the Host flag's copy (if any) landed. Only
    /// then may the batch be dropped (its list freed).
    pub(super) fn quiet(&self) -> bool {
        self.shared.launches_left.load(Ordering::Acquire) == 0 && (self.host_flag.is_none() || self.landed())
    }
}

impl Drop for DeviceBatch {
    fn drop(&mut self) {
        // A launch that still runs (a client destroyed with its stream stuck past its bound) keeps the list: leaked
        // rather than freed under it.
        if self.shared.launches_left.load(Ordering::Acquire) == 0 {
            let _ = crate::space::with_space_mut(|space| space.free(self.descs as usize));
        }
    }
}

/// Submits a batch on the device path: `list` (its remote addresses already relocated into the imports) copied into
/// device memory with a synchronous `aclrtMemcpy`, one AI-CPU launch per [`MAX_KERNEL_ENTRIES`] entries on the slot's
/// stream, then (`with_flag`) the D2H copy of the constant 1 into the batch's Host flag.
pub(super) fn launch(
    slot: &Slot,
    link: &Arc<Link>,
    tallies: &Arc<Tallies>,
    put: bool,
    list: &[HixlOneSideOpDesc],
    deadline: Instant,
    with_flag: bool,
) -> Result<DeviceBatch, HixlStatus> {
    let bytes: Vec<u8> = list
        .iter()
        .flat_map(|entry| {
            let mut raw = [0u8; DESC_BYTES];
            raw[0..8].copy_from_slice(&(entry.remote_buf as u64).to_le_bytes());
            raw[8..16].copy_from_slice(&(entry.local_buf as u64).to_le_bytes());
            raw[16..24].copy_from_slice(&entry.len.to_le_bytes());
            raw
        })
        .collect();
    let descs = crate::space::with_space_mut(|space| space.malloc(bytes.len(), crate::memory::LIBRARY_OWNED))
        .map_err(status)? as u64;
    let chunks = list.len().div_ceil(MAX_KERNEL_ENTRIES);
    let shared = Arc::new(BatchShared {
        error: AtomicU32::new(0),
        deadline,
        link: Arc::clone(link),
        launches_left: AtomicU32::new(0),
    });
    let batch =
        DeviceBatch { host_flag: with_flag.then(|| Box::new(AtomicU64::new(0))), shared: Arc::clone(&shared), descs };
    // The vendor's client uploads the list with a synchronous `aclrtMemcpy`: the launches' arguments, part of the
    // launches (as a kernel launch's own argument copy), so the process's evidence counts them with the AI-CPU launches
    // (`aicpu_kernels_launched`), not among the Host's copies of data.
    crate::sdma::write_device(descs, &bytes).map_err(|_| HIXL_FAILED)?;
    shared.launches_left.store(chunks as u32, Ordering::Release);
    let timeout = deadline.saturating_duration_since(Instant::now()) + LAUNCH_SLACK;
    for chunk in 0..chunks {
        let first = chunk * MAX_KERNEL_ENTRIES;
        let count = (list.len() - first).min(MAX_KERNEL_ENTRIES) as u32;
        let kernel = BatchKernel {
            put,
            descs: descs + (first * DESC_BYTES) as u64,
            count,
            shared: Arc::clone(&shared),
            tallies: Arc::clone(tallies),
        };
        let launch = Launch::new(slot.device, Box::new(kernel), timeout);
        slot.stream.submit(Task::AiCpu { device: slot.device, launch });
        add(&tallies.launches, 1);
    }
    if let Some(flag) = &batch.host_flag {
        let by = crate::provenance::thread_writer();
        let dst = flag.as_ptr() as usize;
        let (device, src) = (slot.device, slot.const_one as usize);
        // The completion signal of the launches (the vendor's `aclrtMemcpyAsync` of `dev_const_one`): not a copy of
        // data, so not among the Host's stream copies in the process's evidence either.
        slot.stream.submit(Task::Copy { device, dst, dest_max: 8, src, count: 8, kind: ACL_MEMCPY_DEVICE_TO_HOST, by });
    }
    Ok(batch)
}

/// The AI-CPU kernel of one chunk of a batch (`HixlBatchPut` / `HixlBatchGet`): up to [`MAX_KERNEL_ENTRIES`] entries
/// read from device memory.
struct BatchKernel {
    put: bool,
    descs: u64,
    count: u32,
    shared: Arc<BatchShared>,
    tallies: Arc<Tallies>,
}

impl BatchKernel {
    fn transfer(&self, cpu: &mut Cpu<'_>) -> Result<(), aclError> {
        let shared = &self.shared;
        let mut check = || {
            if shared.link.revoked() {
                Err(ACL_ERROR_RT_AICPU_EXCEPTION)
            } else if Instant::now() >= shared.deadline {
                Err(ACL_ERROR_RT_AICPU_TIMEOUT)
            } else {
                Ok(())
            }
        };
        check()?;
        let mut raw = vec![0u8; self.count as usize * DESC_BYTES];
        cpu.read(self.descs, &mut raw)?;
        let word = |entry: &[u8], at: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&entry[at..at + 8]);
            u64::from_le_bytes(bytes)
        };
        let mut refused = false;
        for entry in raw.chunks_exact(DESC_BYTES) {
            let (remote, local, len) = (word(entry, 0), word(entry, 8), word(entry, 16));
            // The remote side must still be a live import (the server may have withdrawn it since the submit).
            if len == 0 || !shared.link.live_local(remote, len) {
                refused = true;
                continue;
            }
            let (src, dst) = if self.put { (local, remote) } else { (remote, local) };
            let mut done = 0;
            while done < len {
                let piece = (len - done).min(PIECE);
                let sqe = cpu.copy_sqe(src + done, dst + done, piece as u32);
                cpu.push(sqe, &mut check)?;
                done += piece;
            }
        }
        cpu.complete(&mut check)?;
        if refused {
            Err(ACL_ERROR_RT_AICPU_EXCEPTION)
        } else {
            Ok(())
        }
    }
}

impl Kernel for BatchKernel {
    fn run(&self, cpu: &mut Cpu<'_>) -> Result<(), aclError> {
        // The stream stops on a failure (`ACL_STOP_ON_FAILURE` on the vendor's slot stream): a later chunk of a failed
        // batch does nothing.
        if self.shared.error.load(Ordering::Acquire) != 0 {
            return Ok(());
        }
        let result = self.transfer(cpu);
        self.tallies.acts(&cpu.acts());
        if let Err(code) = result {
            self.shared.fail(code);
        }
        result
    }

    fn abandoned(&self, code: aclError) {
        self.shared.fail(code);
    }
}

impl Drop for BatchKernel {
    fn drop(&mut self) {
        // The launch is gone from the stream and from the AI CPU: it reads the list no more.
        self.shared.launches_left.fetch_sub(1, Ordering::AcqRel);
    }
}
