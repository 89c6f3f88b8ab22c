//! Memory the binding hands out: Host buffers of `allocate_managed_buffer`, device buffers of
//! `allocate_device_buffer` (recorded process-wide so that any engine's `write_bytes_to_buffer` finds the device
//! that owns an address), and the byte copies of `write_bytes_to_buffer` / `read_bytes_from_buffer`.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use aiv_transport::engine::AivDevice;

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

/// The device that owns all of `[addr, addr + length)`, if a buffer the binding allocated holds it.
pub fn device_of(addr: u64, length: u64) -> Option<Arc<AivDevice>> {
    let ranges = ranges();
    let (&start, (size, device)) = ranges.range(..=addr).next_back()?;
    let end = start.checked_add(*size)?;
    let last = addr.checked_add(length)?;
    (last <= end).then(|| device.upgrade()).flatten()
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

/// Copies `data` to Host memory at `addr`.
///
/// # Safety
/// `[addr, addr + data.len())` must be writable Host memory of this process that nothing else accesses meanwhile
/// (Mooncake's `write_bytes_to_buffer` makes the same demand of its caller).
pub unsafe fn write_host(addr: u64, data: &[u8]) {
    // SAFETY: the caller guarantees the destination; the source is a live slice that cannot overlap it mutably.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
}

/// Copies `length` bytes of Host memory at `addr`.
///
/// # Safety
/// `[addr, addr + length)` must be readable Host memory of this process.
pub unsafe fn read_host(addr: u64, length: usize) -> Vec<u8> {
    let mut out = vec![0u8; length];
    // SAFETY: the caller guarantees the source; `out` is a fresh buffer of `length` bytes.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), length) };
    out
}
