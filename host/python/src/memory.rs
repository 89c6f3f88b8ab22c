//! Memory the binding hands out: Host buffers of `allocate_managed_buffer`, device buffers of
//! `allocate_device_buffer` (recorded process-wide so that any engine's `write_bytes_to_buffer` finds the device
//! that owns an address), and the byte copies of `write_bytes_to_buffer` / `read_bytes_from_buffer` (checked copies:
//! an unmapped page is an error, not a crash).

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use aiv_transport::engine::AivDevice;
use aiv_transport::transfer::host_copy;

/// Alignment of managed Host buffers (a page).
const HOST_ALIGN: usize = 4096;

/// A zeroed, page-aligned Host allocation; freed when dropped.
#[derive(Debug)]
pub struct HostAllocation {
    addr: u64,
    layout: Layout,
}

impl HostAllocation {
    /// Allocates `length` zeroed bytes (None for 0 or when the allocator refuses).
    pub fn new(length: u64) -> Option<HostAllocation> {
        let size = usize::try_from(length).ok().filter(|&size| size > 0)?;
        let layout = Layout::from_size_align(size, HOST_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size (checked above).
        let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
        if pointer.is_null() {
            return None;
        }
        Some(HostAllocation { addr: pointer as u64, layout })
    }

    /// Address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes.
    pub fn len(&self) -> u64 {
        self.layout.size() as u64
    }
}

impl Drop for HostAllocation {
    fn drop(&mut self) {
        // SAFETY: `addr` came from `alloc_zeroed` with this layout and is freed only here, once.
        unsafe { std::alloc::dealloc(self.addr as *mut u8, self.layout) };
    }
}

/// Device buffers allocated through the binding, by first address: `(length, device)`.
static DEVICE_RANGES: Mutex<BTreeMap<u64, (u64, Weak<AivDevice>)>> = Mutex::new(BTreeMap::new());

fn ranges() -> MutexGuard<'static, BTreeMap<u64, (u64, Weak<AivDevice>)>> {
    DEVICE_RANGES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Records `[addr, addr + length)` as memory of `device`.
pub fn record_device_range(addr: u64, length: u64, device: &Arc<AivDevice>) {
    ranges().insert(addr, (length, Arc::downgrade(device)));
}

/// Forgets the device buffer that starts at `addr`.
pub fn forget_device_range(addr: u64) {
    ranges().remove(&addr);
}

/// Where `[addr, addr + length)` lies with respect to the device buffers the binding allocated.
#[derive(Debug)]
pub enum DeviceRange {
    /// Inside one buffer of this device.
    Inside(Arc<AivDevice>),
    /// Partly inside a buffer: refused, neither a device copy past the buffer nor a Host copy of device memory.
    Partial { start: u64, length: u64 },
    /// In no buffer the binding allocated.
    Outside,
}

/// Where `[addr, addr + length)` lies with respect to the device buffers the binding allocated (any engine's).
pub fn device_range(addr: u64, length: u64) -> DeviceRange {
    let end = addr.saturating_add(length.max(1));
    let ranges = ranges();
    // Buffers do not overlap one another, so only the last one starting before `end` can reach `addr`.
    let Some((&start, (size, device))) = ranges.range(..end).next_back() else { return DeviceRange::Outside };
    let buffer_end = start.saturating_add(*size);
    if buffer_end <= addr {
        return DeviceRange::Outside;
    }
    match device.upgrade() {
        Some(device) if start <= addr && end <= buffer_end => DeviceRange::Inside(device),
        _ => DeviceRange::Partial { start, length: *size },
    }
}

/// Why a byte copy was refused.
pub fn check_host_range(addr: u64, length: u64) -> Result<(), String> {
    if addr == 0 {
        return Err("address 0 is not memory".into());
    }
    if addr.checked_add(length).is_none() || isize::try_from(length).is_err() {
        return Err(format!("[{addr:#x}, +{length}) wraps the address space"));
    }
    Ok(())
}

/// Copies `data` to Host memory at `addr`, by the checked copy ([`host_copy`]): a page of the range that is not
/// mapped is an error naming the range, not a crash of the interpreter.
///
/// # Safety
/// `[addr, addr + data.len())` must be Host memory of this process that nothing else accesses meanwhile (Mooncake's
/// `write_bytes_to_buffer` makes the same demand of its caller); an unmapped page is caught, a mapped range that
/// belongs to something else is not.
pub unsafe fn write_host(addr: u64, data: &[u8]) -> Result<(), String> {
    host_copy::copy(addr, data.as_ptr() as u64, data.len())
        .map_err(|error| format!("[{addr:#x}, +{}) is not writable memory of this process: {error}", data.len()))
}

/// Appends `length` bytes of Host memory at `addr` to the empty `out`, whose capacity the caller reserved, by the
/// checked copy: a page that is not mapped is an error naming the range (and `out` stays empty).
///
/// # Safety
/// `[addr, addr + length)` must be Host memory of this process (an unmapped page is caught).
pub unsafe fn read_host(addr: u64, out: &mut Vec<u8>, length: usize) -> Result<(), String> {
    if !out.is_empty() || out.capacity() < length {
        return Err("read_host: reserve the capacity first".into());
    }
    host_copy::copy(out.as_mut_ptr() as u64, addr, length)
        .map_err(|error| format!("[{addr:#x}, +{length}) is not readable memory of this process: {error}"))?;
    // SAFETY: the copy initialised the first `length` bytes of the reserved capacity.
    unsafe { out.set_len(length) };
    Ok(())
}
