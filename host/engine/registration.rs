//! Local memory registration (one region or a batch, checked, exported to the device, published once) and the
//! engine's own descriptor as published to peers.

use std::sync::Arc;

use super::{lock, read, write, AivDevice, TransferEngine};
use crate::error::{EngineError, Result};
use crate::metadata::{BufferDescriptor, SegmentDescriptor};
use crate::transfer::{host_copy, Protocol, RegisteredBuffer, Segment, SegmentId};

impl TransferEngine {
    /// Registers `[addr, addr + length)` as a local buffer that transfers may read and write.
    ///
    /// Rejects length 0, ranges that wrap the address space, ranges that start in the null page (below the page size)
    /// and overlaps with a registered buffer. `location` `"*"` (Mooncake's default) or empty means "find out": memory
    /// of this engine's device is registered with the device's location (`npu:<id>`), anything else as given. Host
    /// memory (location `cpu:<n>`, or `"*"`/empty that is not this engine's device memory) must be mapped in this
    /// process: a range holding a page that is not is refused (asked of the kernel by `mincore(2)`, see
    /// [`host_copy::first_unmapped_chunk`]). Device memory is not probed: it need not be mapped in the Host's address
    /// space.
    ///
    /// # Safety
    /// The range must be memory of this process that stays valid, and that nothing else accesses in a way that
    /// conflicts with transfers, until it is unregistered and every transfer that uses it has finished. (A Host range
    /// unmapped meanwhile makes the Host paths' copies fail with an error, not crash; see [`host_copy`].)
    pub unsafe fn register_memory(&self, addr: u64, length: u64, location: &str) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.register_memory_batch(&[(addr, length, location)]) }.map_err(|(_, error)| error)
    }

    /// Registers several buffers `(addr, length, location)`, each as [`Self::register_memory`] would, and publishes
    /// the descriptor once for all of them (the work is linear in their number, plus a logarithmic overlap check
    /// each). All or nothing: at the first region refused, the regions of this call registered before it are
    /// unregistered again, and the error comes with the refused region's index. A failure to publish leaves them
    /// registered and comes with the last index.
    ///
    /// # Safety
    /// As [`Self::register_memory`], for every region.
    pub unsafe fn register_memory_batch(
        &self,
        regions: &[(u64, u64, &str)],
    ) -> std::result::Result<(), (usize, EngineError)> {
        let device = lock(&self.device).clone();
        for (index, &(addr, length, location)) in regions.iter().enumerate() {
            if let Err(error) = self.register_unpublished(device.as_ref(), addr, length, location) {
                for &(done, _, _) in &regions[..index] {
                    self.unregister_unpublished(device.as_ref(), done);
                }
                return Err((index, error));
            }
        }
        self.republish_local_segment().map_err(|error| (regions.len().saturating_sub(1), error))
    }

    /// One region of [`Self::register_memory_batch`]: checked, inserted and exported, not published.
    fn register_unpublished(
        &self,
        device: Option<&Arc<AivDevice>>,
        addr: u64,
        length: u64,
        location: &str,
    ) -> Result<()> {
        if addr < host_copy::page_size() {
            return Err(EngineError::InvalidRegistration {
                addr,
                length,
                reason: "the range starts in the null page (below the page size), which is never memory",
            });
        }
        let own_device = device.filter(|device| device.backend().is_own_memory(addr, length));
        // Mooncake's "*" (and an empty location) means: find out where the memory is, as Mooncake asks the runtime.
        // Memory of this engine's device gets the device's location, so Host paths refuse it instead of touching it.
        let location = match own_device {
            Some(device) if location.is_empty() || location == "*" => device.location(),
            _ => location.to_owned(),
        };
        let host = location.is_empty() || location == "*" || location.starts_with("cpu");
        if host && own_device.is_none() && length > 0 && addr.checked_add(length).is_some() {
            if let Err((chunk, chunk_length)) = host_copy::first_unmapped_chunk(addr, length) {
                tracing::debug!(addr, length, chunk, chunk_length, "register memory: a page is not mapped");
                return Err(EngineError::InvalidRegistration {
                    addr,
                    length,
                    reason: "Host memory that is not mapped in this process (mincore(2) found a page of the range \
                             unmapped)",
                });
            }
        }
        let buffer = RegisteredBuffer { addr, length, location: location.clone() };
        write(&self.memory).insert(buffer)?;
        // Device memory is offered to peers' devices (the aiv object lists it) while it stays registered.
        if let Some(device) = own_device {
            if let Err(error) = device.backend().export_range(addr, length) {
                write(&self.memory).remove(addr);
                return Err(EngineError::InvalidArgument { operation: "register memory", reason: error.to_string() });
            }
        } else if let Some(device) = device {
            // Other memory (Host memory) too, when the backend can share it (the `cann` backend, Host memory the
            // runtime can give a key); otherwise it stays registered for this engine's paths only.
            if let Err(error) = device.backend().export_host_range(addr, length) {
                tracing::debug!(addr, length, %error, "registered memory not exported to peers' devices");
            }
        }
        tracing::debug!(addr, length, location = %location, "memory registered");
        Ok(())
    }

    /// Unregisters the buffer that starts at `addr`. Transfers already submitted keep their checks.
    pub fn unregister_memory(&self, addr: u64) -> Result<()> {
        self.unregister_memory_batch(&[addr])
    }

    /// Unregisters the buffers that start at each of `addrs`, publishing the descriptor once. Every address is tried;
    /// the first failure (an address that starts no registered buffer) is returned.
    pub fn unregister_memory_batch(&self, addrs: &[u64]) -> Result<()> {
        let device = lock(&self.device).clone();
        let mut first_error = None;
        let mut removed = 0usize;
        for &addr in addrs {
            if self.unregister_unpublished(device.as_ref(), addr) {
                removed += 1;
            } else if first_error.is_none() {
                first_error = Some(EngineError::AddressNotRegistered { operation: "unregister memory", addr });
            }
        }
        let published = if removed > 0 { self.republish_local_segment() } else { Ok(()) };
        match first_error {
            Some(error) => Err(error),
            None => published,
        }
    }

    /// Removes the buffer at `addr` and withdraws it from the device; false if none starts there. Not published.
    fn unregister_unpublished(&self, device: Option<&Arc<AivDevice>>, addr: u64) -> bool {
        if write(&self.memory).remove(addr).is_none() {
            return false;
        }
        // Revokes device memory for new imports by peers (their existing mappings stay valid).
        if let Some(device) = device {
            device.backend().withdraw_range(addr);
        }
        tracing::debug!(addr, "memory unregistered");
        true
    }

    pub(super) fn republish_local_segment(&self) -> Result<()> {
        let mut descriptor = read(&self.local_segment).descriptor.clone();
        descriptor.buffers = read(&self.memory)
            .iter()
            .map(|buffer| BufferDescriptor::new(self.name.clone(), buffer.addr, buffer.length))
            .collect();
        if let Some(device) = lock(&self.device).clone() {
            descriptor.aiv =
                Some(serde_json::to_value(device.advertisement()).map_err(|error| EngineError::Metadata {
                    operation: "describe device",
                    reason: error.to_string(),
                })?);
        }
        let segment = Segment::from_descriptor(SegmentId::LOCAL, descriptor)
            .map_err(|reason| EngineError::Metadata { operation: "build local segment", reason })?;
        self.metadata.publish(&segment.descriptor)?;
        *write(&self.local_segment) = Arc::new(segment);
        Ok(())
    }
    /// Sets this project's `aiv` object of the local segment descriptor (and advertises protocol `aiv`), then
    /// republishes the descriptor.
    pub fn set_descriptor_extension(&self, aiv: serde_json::Value) -> Result<()> {
        let mut descriptor = read(&self.local_segment).descriptor.clone();
        descriptor.aiv = Some(aiv);
        if !descriptor.protocol.contains(Protocol::Aiv.as_str()) {
            descriptor.protocol.0.push(Protocol::Aiv.as_str().to_owned());
        }
        let segment = Segment::from_descriptor(SegmentId::LOCAL, descriptor)
            .map_err(|reason| EngineError::Metadata { operation: "build local segment", reason })?;
        self.metadata.publish(&segment.descriptor)?;
        *write(&self.local_segment) = Arc::new(segment);
        Ok(())
    }

    /// The engine's own descriptor as peers see it.
    pub fn local_descriptor(&self) -> SegmentDescriptor {
        read(&self.local_segment).descriptor.clone()
    }
}
