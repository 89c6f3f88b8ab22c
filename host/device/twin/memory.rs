//! Twin HBM: memfd-backed regions mapped into this process, an allocator over them, and imported windows.
//!
//! A device address on the twin is the virtual address of the mapping. Exporting a registered range hands out the
//! heap's memfd with the range's offset (through the device's export service,
//! [`export_service`](super::export_service)); importing maps that range of the memfd again, at another address, and
//! relocates by offset — like VMM/IPC import on NPUs.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use crate::device::DeviceError;

/// Allocation granularity of twin HBM.
pub const ALLOCATION_ALIGN: u64 = 4096;

/// A shared mapping of a memfd.
#[derive(Debug)]
pub struct MemfdRegion {
    fd: Arc<OwnedFd>,
    base: *mut u8,
    length: usize,
}

// SAFETY: the mapping is plain shared memory; the region only hands out addresses, and every access through them is
// synchronised by the protocols of its users (SQE rings, DCQ, the transfer contract of registered memory).
unsafe impl Send for MemfdRegion {}
// SAFETY: as above.
unsafe impl Sync for MemfdRegion {}

impl MemfdRegion {
    /// Creates a memfd of `length` bytes (sparse: pages are allocated when touched) and maps it.
    pub fn create(device: u32, name: &str, length: u64) -> Result<MemfdRegion, DeviceError> {
        let os = |operation| move |source| DeviceError::Os { device, operation, source };
        let name = CString::new(name).map_err(|_| DeviceError::Invalid {
            device,
            operation: "create memfd",
            reason: "name contains a NUL byte".into(),
        })?;
        // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor or -1.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(os("memfd_create")(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(length).map_err(|_| DeviceError::Invalid {
            device,
            operation: "create memfd",
            reason: format!("{length} bytes do not fit off_t"),
        })?;
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(os("ftruncate memfd")(std::io::Error::last_os_error()));
        }
        MemfdRegion::map(device, Arc::new(fd), length)
    }

    /// Maps `length` bytes of an existing memfd (an import).
    pub fn map(device: u32, fd: Arc<OwnedFd>, length: u64) -> Result<MemfdRegion, DeviceError> {
        MemfdRegion::map_at(device, fd, 0, length)
    }

    /// Maps `length` bytes of an existing memfd from `offset`, a multiple of the page size.
    pub fn map_at(device: u32, fd: Arc<OwnedFd>, offset: u64, length: u64) -> Result<MemfdRegion, DeviceError> {
        let offset = libc::off_t::try_from(offset).map_err(|_| DeviceError::Invalid {
            device,
            operation: "map memfd",
            reason: "offset exceeds off_t".into(),
        })?;
        let length = usize::try_from(length).map_err(|_| DeviceError::Invalid {
            device,
            operation: "map memfd",
            reason: "length exceeds usize".into(),
        })?;
        // SAFETY: a fresh shared mapping chosen by the kernel over a descriptor we hold; nothing aliases it yet.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(DeviceError::Os { device, operation: "mmap memfd", source: std::io::Error::last_os_error() });
        }
        Ok(MemfdRegion { fd, base: base.cast(), length })
    }

    /// Address of the first byte.
    pub fn base(&self) -> u64 {
        self.base as u64
    }
    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.length as u64
    }
    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
    /// The memfd (for export).
    pub fn fd(&self) -> Arc<OwnedFd> {
        self.fd.clone()
    }
    /// Whether `[addr, addr + length)` lies inside the mapping.
    pub fn contains(&self, addr: u64, length: u64) -> bool {
        addr >= self.base() && addr.checked_add(length).is_some_and(|end| end <= self.base() + self.len())
    }
}

impl Drop for MemfdRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map`; users of its addresses are gone (the device and its
        // buffers hold the region through Arc).
        unsafe {
            libc::munmap(self.base.cast(), self.length);
        }
    }
}

/// First-fit allocator over one region; freed ranges are merged with their neighbours.
#[derive(Debug)]
pub struct Heap {
    region: Arc<MemfdRegion>,
    /// Free ranges: offset -> length.
    free: Mutex<BTreeMap<u64, u64>>,
    /// Live allocations: offset -> length.
    live: Mutex<BTreeMap<u64, u64>>,
}

impl Heap {
    /// A heap over all of `region`.
    pub fn new(region: Arc<MemfdRegion>) -> Heap {
        let mut free = BTreeMap::new();
        free.insert(0, region.len());
        Heap { region, free: Mutex::new(free), live: Mutex::new(BTreeMap::new()) }
    }

    /// The region under the heap.
    pub fn region(&self) -> &Arc<MemfdRegion> {
        &self.region
    }

    /// Allocates `length` bytes aligned to [`ALLOCATION_ALIGN`]; returns the address.
    pub fn allocate(&self, device: u32, length: u64) -> Result<u64, DeviceError> {
        if length == 0 {
            return Err(DeviceError::Invalid { device, operation: "allocate", reason: "length is zero".into() });
        }
        let rounded = length.div_ceil(ALLOCATION_ALIGN) * ALLOCATION_ALIGN;
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let found = free.iter().find(|(_, &len)| len >= rounded).map(|(&offset, &len)| (offset, len));
        let Some((offset, len)) = found else {
            let largest = free.values().copied().max().unwrap_or(0);
            return Err(DeviceError::OutOfMemory {
                device,
                length,
                reason: format!(
                    "twin HBM of {} bytes has no free range that large (largest {largest})",
                    self.region.len()
                ),
            });
        };
        free.remove(&offset);
        if len > rounded {
            free.insert(offset + rounded, len - rounded);
        }
        self.live.lock().unwrap_or_else(|p| p.into_inner()).insert(offset, rounded);
        Ok(self.region.base() + offset)
    }

    /// Frees the allocation starting at `addr`; unknown addresses are ignored (and reported as false).
    pub fn free(&self, addr: u64) -> bool {
        let offset = addr.wrapping_sub(self.region.base());
        let Some(length) = self.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&offset) else {
            return false;
        };
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let (mut start, mut len) = (offset, length);
        if let Some((&prev, &prev_len)) = free.range(..start).next_back() {
            if prev + prev_len == start {
                free.remove(&prev);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(&next_len) = free.get(&(offset + length)) {
            free.remove(&(offset + length));
            len += next_len;
        }
        free.insert(start, len);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_disjoint_and_freed_space_is_reused() {
        let region = Arc::new(MemfdRegion::create(0, "heap-test", 1 << 20).expect("memfd"));
        let heap = Heap::new(region.clone());
        let a = heap.allocate(0, 100).expect("a");
        let b = heap.allocate(0, 5000).expect("b");
        assert!(b >= a + ALLOCATION_ALIGN && region.contains(b, 5000));
        assert!(heap.allocate(0, 2 << 20).is_err());
        assert!(heap.free(a) && heap.free(b) && !heap.free(b));
        // Everything merged back: the whole region is allocatable again.
        assert_eq!(heap.allocate(0, 1 << 20).expect("whole"), region.base());
        // Writes through one mapping are visible through a second mapping of the same memfd (an import).
        let second = MemfdRegion::map(0, region.fd(), region.len()).expect("second mapping");
        // SAFETY: both addresses are inside live mappings of the same 1 MiB memfd.
        unsafe {
            (region.base() as *mut u64).write(0xfeed);
            assert_eq!((second.base() as *const u64).read(), 0xfeed);
        }
    }
}
