//! The device memory model: a device virtual address space the Host cannot dereference, physical memory in memfds,
//! and the device's private view through which the model (copies, memset) reaches that memory.
//!
//! - The device address space is one `mmap(PROT_NONE, MAP_NORESERVE)` reservation of [`SPACE_LEN`] bytes. Every
//!   device address the runtime hands out (from `aclrtMalloc`, `aclrtReserveMemAddress`, `aclrtHostRegister`) lies
//!   inside it, and nothing inside it is ever made accessible: a Host load or store through a device address
//!   faults (SIGSEGV), as it does on the NPU, where device addresses are not in the Host's page tables.
//! - `aclrtMalloc` memory lives in the *heap*, one sparse memfd as long as the space: the allocation at device
//!   address `base + o` is the memfd's bytes at offset `o`. The device view of the heap is a second, shared
//!   mapping of the memfd at an unrelated address; the model translates a device address to a view pointer.
//!   Freed ranges are punched out of the memfd (their pages return to the system and read zero when reused).
//! - Each `aclrtMallocPhysical` allocation is a memfd of its own with its own view; `aclrtMapMem` records that a
//!   range of a reservation translates to that view, `aclrtUnmapMem` removes the record.
//! - `aclrtHostRegister` gives Host memory a device address window inside the space, translating to the Host pages
//!   themselves: the device reaches the same pages, the Host keeps using its own pointer, and the two addresses
//!   differ (using one for the other fails).
//!
//! Every translation is bounded by the object it lands in: a range that runs past an allocation, a mapping or a
//! registered window, or that touches unallocated device addresses, is refused with an error code, never copied.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use ascendcl_sys::sys::*;

/// Length of the device virtual address space (and of the heap memfd, which is sparse).
pub(crate) const SPACE_LEN: usize = 1 << 38;
/// The Host page size (4 KiB or 64 KiB on the Host CPUs NPUs are paired with), the unit of every VA rounding.
pub(crate) fn page() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: `sysconf` has no preconditions.
    *PAGE.get_or_init(|| usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(4096))
}
/// The owner recorded for heap allocations a library of the runtime makes for itself (the twin's HiXL: its batches'
/// descriptor lists, its constant): no device reset frees them ([`Space::free_device`]); their owner does.
pub(crate) const LIBRARY_OWNED: i32 = -1;
/// The VMM granularity the twin reports and enforces (2 MiB).
pub(crate) const GRANULARITY: usize = 2 << 20;
/// The granularity for 1 GiB-page memory attributes.
pub(crate) const GRANULARITY_1G: usize = 1 << 30;

/// A device address range translated to model-reachable memory, in order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    pub ptr: *mut u8,
    pub len: usize,
}

/// What a translation found: one contiguous range (in an allocation, a registered window or one mapping of a VMM
/// reservation: no heap allocation, as the SDMA engines translate three ranges per SQE) or the pieces of a range
/// across several mappings of a reservation.
#[derive(Clone, Debug)]
pub(crate) enum Segments {
    One([Segment; 1]),
    Many(Vec<Segment>),
}

impl Segments {
    pub(crate) fn one(ptr: *mut u8, len: usize) -> Segments {
        Segments::One([Segment { ptr, len }])
    }
}

impl std::ops::Deref for Segments {
    type Target = [Segment];
    fn deref(&self) -> &[Segment] {
        match self {
            Segments::One(one) => one,
            Segments::Many(many) => many,
        }
    }
}

/// One `aclrtMalloc` allocation.
#[derive(Debug)]
struct HeapAllocation {
    /// Bytes the caller asked for: the bound of every access.
    size: usize,
    /// VA taken from the space (page-rounded, plus a guard page).
    span: usize,
    device: i32,
}

/// One `aclrtMallocPhysical` allocation.
#[derive(Debug)]
pub(crate) struct Physical {
    /// Keeps the memory alive; what an export shares (`vmm_share`).
    fd: OwnedFd,
    pub size: usize,
    /// The device view of the memfd.
    view: usize,
    /// Live mappings of this allocation.
    pub mapped: usize,
}

impl Drop for Physical {
    fn drop(&mut self) {
        // SAFETY: `view` is the mapping of `size` bytes made in `Physical::new`, owned by this value. It is dropped
        // only once unmapped (`aclrtFreePhysical` refuses mapped memory), and unmapping takes the space's write
        // lock, so no translation to the view (used under the read lock) is live.
        unsafe { libc::munmap(self.view as *mut libc::c_void, self.size) };
    }
}

impl Physical {
    /// A memfd of `size` bytes and its device view.
    pub(crate) fn new(size: usize) -> Result<Physical, aclError> {
        let fd = memfd(c"cann-twin-physical", size)?;
        Physical::from_fd(fd, size)
    }

    /// Physical memory backed by an existing memfd of at least `size` bytes (an import: the exporter's pages).
    pub(crate) fn from_fd(fd: OwnedFd, size: usize) -> Result<Physical, aclError> {
        let view = map_shared(&fd, size)?;
        Ok(Physical { fd, size, view, mapped: 0 })
    }

    /// The memfd behind this allocation.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

/// One `aclrtMapMem` record.
#[derive(Debug)]
struct Mapping {
    len: usize,
    handle: usize,
    /// Where the mapped range starts in the physical allocation.
    offset: usize,
    /// Device view address of the mapped range's first byte.
    view: usize,
    access: aclrtMemAccessFlags,
}

/// One `aclrtReserveMemAddress` range.
#[derive(Debug, Default)]
struct Reservation {
    len: usize,
    /// Keyed by device address.
    mappings: BTreeMap<usize, Mapping>,
}

/// One `aclrtHostRegister` window.
#[derive(Debug)]
struct Registered {
    host: usize,
    size: usize,
    /// VA taken from the space for the window, and where it starts.
    window: usize,
    span: usize,
    readonly: bool,
}

/// What runs when an `aclrtMalloc` allocation of the heap is released, under the space's write lock and before its
/// pages go: the layer that shares heap ranges with other processes (IPC keys, `vmm_share`) withdraws them. That layer
/// registers it before it shares the first range ([`on_heap_released`]); with nothing shared there is nothing to do.
static HEAP_RELEASED: std::sync::OnceLock<fn(usize)> = std::sync::OnceLock::new();

/// Registers what runs when a heap allocation is released (see [`HEAP_RELEASED`]); the first registration holds.
pub(crate) fn on_heap_released(released: fn(usize)) {
    let _ = HEAP_RELEASED.set(released);
}

/// The device address space and everything allocated in it.
#[derive(Debug)]
pub(crate) struct Space {
    base: usize,
    heap_fd: OwnedFd,
    heap_view: usize,
    /// Free VA as offsets from `base`: start -> length.
    free: BTreeMap<usize, usize>,
    heap: BTreeMap<usize, HeapAllocation>,
    reservations: BTreeMap<usize, Reservation>,
    /// Keyed by the window's device address handed out.
    registered: BTreeMap<usize, Registered>,
    /// Host start -> device address.
    registered_by_host: BTreeMap<usize, usize>,
    /// Device register pages (see `sdma`): addresses only, never translated.
    register_pages: std::collections::BTreeSet<usize>,
}

pub(crate) fn memfd(name: &core::ffi::CStr, size: usize) -> Result<OwnedFd, aclError> {
    // SAFETY: `name` is NUL-terminated; the flags are valid.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let length = libc::off_t::try_from(size).map_err(|_| ACL_ERROR_RT_MEMORY_ALLOCATION)?;
    // SAFETY: `fd` is a valid memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), length) } != 0 {
        return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
    }
    Ok(fd)
}

fn map_shared(fd: &OwnedFd, size: usize) -> Result<usize, aclError> {
    // SAFETY: a new shared mapping of `size` bytes of a memfd at least that long, at an address the kernel picks.
    let view = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            fd.as_raw_fd(),
            0,
        )
    };
    if view == libc::MAP_FAILED {
        return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
    }
    Ok(view as usize)
}

fn round_up(value: usize, to: usize) -> Option<usize> {
    value.checked_add(to - 1).map(|v| v / to * to)
}

impl Drop for Space {
    fn drop(&mut self) {
        // SAFETY: both mappings were made in `Space::new`, are owned by this value and are no longer used.
        unsafe {
            libc::munmap(self.heap_view as *mut libc::c_void, SPACE_LEN);
            libc::munmap(self.base as *mut libc::c_void, SPACE_LEN);
        }
    }
}

impl Space {
    pub(crate) fn new() -> Result<Space, aclError> {
        if GRANULARITY % page() != 0 {
            return Err(ACL_ERROR_RT_INTERNAL_ERROR);
        }
        // SAFETY: a new private, inaccessible, unreserved mapping at an address the kernel picks; nothing is ever
        // made accessible inside it.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                SPACE_LEN,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
        }
        let base = base as usize;
        let heap = memfd(c"cann-twin-heap", SPACE_LEN).and_then(|fd| map_shared(&fd, SPACE_LEN).map(|view| (fd, view)));
        let (heap_fd, heap_view) = match heap {
            Ok(heap) => heap,
            Err(code) => {
                // SAFETY: the reservation made above, not yet handed out.
                unsafe { libc::munmap(base as *mut libc::c_void, SPACE_LEN) };
                return Err(code);
            }
        };
        // The first granule stays unused so that no device address is the space's base.
        let free = BTreeMap::from([(GRANULARITY, SPACE_LEN - GRANULARITY)]);
        Ok(Space {
            base,
            heap_fd,
            heap_view,
            free,
            heap: BTreeMap::new(),
            reservations: BTreeMap::new(),
            registered: BTreeMap::new(),
            registered_by_host: BTreeMap::new(),
            register_pages: std::collections::BTreeSet::new(),
        })
    }

    /// Whether `address` is a device address (inside the space), allocated or not.
    pub(crate) fn contains(&self, address: usize) -> bool {
        address >= self.base && address - self.base < SPACE_LEN
    }

    /// First-fit VA of `len` bytes aligned to `align` (a power of two, at least a page); returns the device address.
    fn take_va(&mut self, len: usize, align: usize) -> Result<usize, aclError> {
        let mut found = None;
        for (&start, &free_len) in &self.free {
            // Aligned as a device address (the space's own start is only page-aligned for sure), as an offset.
            let Some(aligned) = round_up(self.base + start, align).map(|address| address - self.base) else { continue };
            if aligned - start <= free_len && free_len - (aligned - start) >= len {
                found = Some((start, free_len, aligned));
                break;
            }
        }
        let (start, free_len, aligned) = found.ok_or(ACL_ERROR_RT_MEMORY_ALLOCATION)?;
        self.free.remove(&start);
        if aligned > start {
            self.free.insert(start, aligned - start);
        }
        let end = aligned + len;
        if end < start + free_len {
            self.free.insert(end, start + free_len - end);
        }
        Ok(self.base + aligned)
    }

    fn give_va(&mut self, address: usize, len: usize) {
        let mut start = address - self.base;
        let mut len = len;
        if let Some((&before, &before_len)) = self.free.range(..start).next_back() {
            if before + before_len == start {
                self.free.remove(&before);
                start = before;
                len += before_len;
            }
        }
        if let Some(&after_len) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += after_len;
        }
        self.free.insert(start, len);
    }

    /// `aclrtMalloc`: `size` bytes of heap for `device`.
    pub(crate) fn malloc(&mut self, size: usize, device: i32) -> Result<usize, aclError> {
        let align = if size >= GRANULARITY { GRANULARITY } else { page() };
        self.malloc_aligned(size, device, align)
    }

    /// `size` bytes of heap for `device` at an address aligned to `align` (a power of two; at least a page is used).
    pub(crate) fn malloc_aligned(&mut self, size: usize, device: i32, align: usize) -> Result<usize, aclError> {
        let page = page();
        let span = round_up(size, page).and_then(|s| s.checked_add(page)).ok_or(ACL_ERROR_RT_MEMORY_ALLOCATION)?;
        if span > SPACE_LEN || !align.is_power_of_two() {
            return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
        }
        let address = self.take_va(span, align.max(page))?;
        self.heap.insert(address, HeapAllocation { size, span, device });
        Ok(address)
    }

    /// For an IPC export: the heap memfd, the offset of `address` in it, and the start of the `aclrtMalloc`
    /// allocation `[address, address + size)` lies in (`size > 0`).
    pub(crate) fn heap_range(&self, address: usize, size: usize) -> Result<(&OwnedFd, usize, usize), aclError> {
        let end = address.checked_add(size).ok_or(ACL_ERROR_INVALID_PARAM)?;
        let (&start, allocation) = self.heap.range(..=address).next_back().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        if address - start >= allocation.size || end - start > allocation.size {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        Ok((&self.heap_fd, address - self.base, start))
    }

    /// The physical handle and the offset in it behind `[address, address + size)` (`size > 0`), when the range lies
    /// in one mapping of a reservation (what a range export of mapped memory shares).
    pub(crate) fn mapped_range(&self, address: usize, size: usize) -> Result<(usize, usize), aclError> {
        let end = address.checked_add(size).ok_or(ACL_ERROR_INVALID_PARAM)?;
        let (&start, reservation) =
            self.reservations.range(..=address).next_back().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        if address - start >= reservation.len {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        let (&at, mapping) = reservation.mappings.range(..=address).next_back().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        if address - at >= mapping.len || end - at > mapping.len {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        Ok((mapping.handle, mapping.offset + (address - at)))
    }

    /// `aclrtFree`: `address` must be what `malloc` returned.
    pub(crate) fn free(&mut self, address: usize) -> Result<(), aclError> {
        let allocation = self.heap.remove(&address).ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        self.release_heap(address, allocation.span);
        Ok(())
    }

    fn release_heap(&mut self, address: usize, span: usize) {
        // IPC keys of this allocation stop being served before its pages go.
        if let Some(released) = HEAP_RELEASED.get() {
            released(address);
        }
        let offset = address - self.base;
        // SAFETY: punching a hole in the heap memfd over the freed allocation's own pages; no translation to them
        // is live (translations are used under the space's read lock, and this runs under its write lock).
        unsafe {
            libc::fallocate(
                self.heap_fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                span as libc::off_t,
            )
        };
        self.give_va(address, span);
    }

    /// Frees every heap allocation of `device` (its last `aclrtResetDevice`).
    pub(crate) fn free_device(&mut self, device: i32) {
        let owned: Vec<(usize, usize)> =
            self.heap.iter().filter(|(_, a)| a.device == device).map(|(&address, a)| (address, a.span)).collect();
        for (address, span) in owned {
            self.heap.remove(&address);
            self.release_heap(address, span);
        }
    }

    /// One page of device addresses (plus a guard page) for a device register page: nothing translates there, so
    /// neither a copy nor an SDMA engine can reach it, and the Host cannot dereference it (it lies in the space).
    pub(crate) fn take_register_page(&mut self) -> Result<usize, aclError> {
        let page = page();
        let address = self.take_va(2 * page, page)?;
        self.register_pages.insert(address);
        Ok(address)
    }

    /// Returns a register page taken by [`Space::take_register_page`].
    pub(crate) fn give_register_page(&mut self, address: usize) {
        if self.register_pages.remove(&address) {
            self.give_va(address, 2 * page());
        }
    }

    /// `aclrtReserveMemAddress`.
    pub(crate) fn reserve(&mut self, len: usize, align: usize) -> Result<usize, aclError> {
        let address = self.take_va(len, align)?;
        self.reservations.insert(address, Reservation { len, mappings: BTreeMap::new() });
        Ok(address)
    }

    /// `aclrtReleaseMemAddress`: the start of a reservation with nothing mapped.
    pub(crate) fn release(&mut self, address: usize) -> Result<(), aclError> {
        let reservation = self.reservations.get(&address).ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        if !reservation.mappings.is_empty() {
            return Err(ACL_ERROR_RT_MEMORY_FREE);
        }
        let len = reservation.len;
        self.reservations.remove(&address);
        self.give_va(address, len);
        Ok(())
    }

    /// `aclrtMapMem`: `[address, address + len)` of a reservation to `[offset, offset + len)` of `physical`.
    pub(crate) fn map(
        &mut self,
        address: usize,
        len: usize,
        offset: usize,
        handle: usize,
        physical: &mut Physical,
    ) -> Result<(), aclError> {
        if address % GRANULARITY != 0 || len % GRANULARITY != 0 || offset % GRANULARITY != 0 {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let end_in_physical = offset.checked_add(len).ok_or(ACL_ERROR_INVALID_PARAM)?;
        if end_in_physical > physical.size {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let (&start, reservation) =
            self.reservations.range_mut(..=address).next_back().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        if address - start >= reservation.len || reservation.len - (address - start) < len {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        let overlaps_before =
            reservation.mappings.range(..address).next_back().is_some_and(|(&at, mapping)| at + mapping.len > address);
        let overlaps_after = reservation.mappings.range(address..address + len).next().is_some();
        if overlaps_before || overlaps_after {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        let view = physical.view + offset;
        reservation
            .mappings
            .insert(address, Mapping { len, handle, offset, view, access: ACL_RT_MEM_ACCESS_FLAGS_READWRITE });
        physical.mapped += 1;
        Ok(())
    }

    /// `aclrtUnmapMem`: the start of a mapping. Returns the physical handle it used.
    pub(crate) fn unmap(&mut self, address: usize) -> Result<usize, aclError> {
        let (_, reservation) = self.reservations.range_mut(..=address).next_back().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        let mapping = reservation.mappings.remove(&address).ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        Ok(mapping.handle)
    }

    /// `aclrtMemSetAccess`: `[address, address + len)` must be exactly a run of whole, adjacent mappings.
    pub(crate) fn set_access(
        &mut self,
        address: usize,
        len: usize,
        access: aclrtMemAccessFlags,
    ) -> Result<(), aclError> {
        let (_, reservation) = self.reservations.range_mut(..=address).next_back().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        let end = address.checked_add(len).ok_or(ACL_ERROR_INVALID_PARAM)?;
        let mut cursor = address;
        for (&at, mapping) in reservation.mappings.range(address..end) {
            if at != cursor || at + mapping.len > end {
                return Err(ACL_ERROR_RT_PARAM_INVALID);
            }
            cursor = at + mapping.len;
        }
        if cursor != end {
            return Err(ACL_ERROR_RT_PARAM_INVALID);
        }
        for (_, mapping) in reservation.mappings.range_mut(address..end) {
            mapping.access = access;
        }
        Ok(())
    }

    /// `aclrtHostRegister`: a device window onto `[host, host + size)`; returns the device address for `host`.
    pub(crate) fn register(&mut self, host: usize, size: usize, readonly: bool) -> Result<usize, aclError> {
        let end = host.checked_add(size).ok_or(ACL_ERROR_INVALID_PARAM)?;
        if self.contains(host) || self.contains(end - 1) || (host < self.base && end > self.base) {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let overlaps_before = self
            .registered_by_host
            .range(..=host)
            .next_back()
            .is_some_and(|(&at, window)| at + self.registered[window].size > host);
        let overlaps_after = self.registered_by_host.range(host..end).next().is_some();
        if overlaps_before || overlaps_after {
            return Err(ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        let page = page();
        let in_page = host % page;
        let span = round_up(in_page + size, page).and_then(|s| s.checked_add(page)).ok_or(ACL_ERROR_INVALID_PARAM)?;
        let window = self.take_va(span, page)?;
        let address = window + in_page;
        self.registered.insert(address, Registered { host, size, window, span, readonly });
        self.registered_by_host.insert(host, address);
        Ok(address)
    }

    /// The Host address behind `[address, address + size)` (`size > 0`) when the range lies in one registered Host
    /// window (`aclrtHostRegister`).
    pub(crate) fn registered_host(&self, address: usize, size: usize) -> Option<usize> {
        let end = address.checked_add(size)?;
        let (&start, window) = self.registered.range(..=address).next_back()?;
        (end - start <= window.size).then(|| window.host + (address - start))
    }

    /// `aclrtHostUnregister`: `host` must be a registered start.
    pub(crate) fn unregister(&mut self, host: usize) -> Result<(), aclError> {
        let address = self.registered_by_host.remove(&host).ok_or(ACL_ERROR_HOST_MEMORY_NOT_REGISTERED)?;
        if let Some(window) = self.registered.remove(&address) {
            self.give_va(window.window, window.span);
        }
        Ok(())
    }

    /// The one contiguous object holding `address`: its first device address, its length and the Host pointer of
    /// that first byte (a heap allocation, a registered window, or one mapping of a reservation), if readable. What
    /// an emulated core may remember until the space next changes (`space::space_generation`).
    pub(crate) fn window_of(&self, address: usize) -> Option<(usize, usize, *mut u8)> {
        if let Some((&start, allocation)) = self.heap.range(..=address).next_back() {
            if address - start < allocation.size {
                return Some((start, allocation.size, (self.heap_view + (start - self.base)) as *mut u8));
            }
        }
        if let Some((&start, window)) = self.registered.range(..=address).next_back() {
            if address - start < window.size {
                return Some((start, window.size, window.host as *mut u8));
            }
        }
        let (&start, reservation) = self.reservations.range(..=address).next_back()?;
        if address - start >= reservation.len {
            return None;
        }
        let (&at, mapping) = reservation.mappings.range(..=address).next_back()?;
        (address - at < mapping.len && mapping.access != ACL_RT_MEM_ACCESS_FLAGS_NONE).then_some((
            at,
            mapping.len,
            mapping.view as *mut u8,
        ))
    }

    /// The model-reachable memory behind device range `[address, address + len)` (`len > 0`), for a read or a
    /// write. Errors: the range touches unallocated device addresses, runs past the object it starts in, or is
    /// not writable.
    ///
    /// A translation for writing is where every Host-side write into device memory passes (runtime copies and
    /// memsets, and the other Host paths of the twin): it marks the SQ slots the range covers as the calling
    /// thread's (the Host's, unless an SDMA engine's thread: see `crate::provenance`). The emulated cores
    /// translate through their own op and report their writes themselves.
    pub(crate) fn translate(&self, address: usize, len: usize, write: bool) -> Result<Segments, aclError> {
        let segments = self.translate_range(address, len, write)?;
        if write {
            crate::provenance::thread_wrote(address as u64, len as u64);
        }
        Ok(segments)
    }

    fn translate_range(&self, address: usize, len: usize, write: bool) -> Result<Segments, aclError> {
        let end = address.checked_add(len).ok_or(ACL_ERROR_INVALID_PARAM)?;
        if let Some((&start, allocation)) = self.heap.range(..=address).next_back() {
            if address - start < allocation.size {
                if end - start > allocation.size {
                    return Err(ACL_ERROR_RT_PARAM_INVALID);
                }
                return Ok(Segments::one((self.heap_view + (address - self.base)) as *mut u8, len));
            }
        }
        if let Some((&start, window)) = self.registered.range(..=address).next_back() {
            if address - start < window.size {
                if end - start > window.size || (write && window.readonly) {
                    return Err(ACL_ERROR_RT_PARAM_INVALID);
                }
                return Ok(Segments::one((window.host + (address - start)) as *mut u8, len));
            }
        }
        if let Some((&start, reservation)) = self.reservations.range(..=address).next_back() {
            if address - start < reservation.len {
                // The mapping holding `cursor`, if it allows the access.
                let mapped = |cursor: usize| -> Result<(usize, &Mapping), aclError> {
                    let (&at, mapping) =
                        reservation.mappings.range(..=cursor).next_back().ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
                    let allowed = if write {
                        mapping.access == ACL_RT_MEM_ACCESS_FLAGS_READWRITE
                    } else {
                        mapping.access != ACL_RT_MEM_ACCESS_FLAGS_NONE
                    };
                    if cursor - at >= mapping.len || !allowed {
                        return Err(ACL_ERROR_RT_PARAM_INVALID);
                    }
                    Ok((at, mapping))
                };
                let (at, first) = mapped(address)?;
                if end - at <= first.len {
                    // Within one mapping, the common case (the project's HBM heap is one reservation mapped in one
                    // piece, and the SDMA engines translate three ranges of it per SQE): no list to allocate.
                    return Ok(Segments::one((first.view + (address - at)) as *mut u8, len));
                }
                let mut segments = Vec::new();
                let mut cursor = address;
                while cursor < end {
                    let (at, mapping) = mapped(cursor)?;
                    let take = (at + mapping.len - cursor).min(end - cursor);
                    segments.push(Segment { ptr: (mapping.view + (cursor - at)) as *mut u8, len: take });
                    cursor += take;
                }
                return Ok(Segments::Many(segments));
            }
        }
        Err(ACL_ERROR_RT_PARAM_INVALID)
    }
}
