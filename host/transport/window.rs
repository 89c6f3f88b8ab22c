//! Address translation shared by every device path (`aiv`, `adxl`, `ubshmem`): both ends of a validated transfer in
//! the executing device's view.
//!
//! A peer segment's `aiv` object advertises its exported device regions; they are imported into this device once per
//! descriptor version and a peer address is relocated by its offset in the region (`local_base + (remote -
//! remote_base)`), the VMM/IPC import scheme all three paths use. Owns the import cache; touches nothing else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::Transfer;
use crate::device::{DeviceAdvertisement, DeviceBackend, ExportedRegion, ImportedWindow};
use crate::engine::{Opcode, Segment, SegmentId};

/// A peer segment's exported regions, imported into this device.
#[derive(Debug)]
struct Peer {
    /// The descriptor version the windows were built from.
    segment: Weak<Segment>,
    windows: Vec<(ExportedRegion, ImportedWindow)>,
}

/// Why a transfer's addresses could not be resolved: the caller maps these onto its own status codes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolveError {
    /// An address range is not where it must be (a parameter error).
    Range(String),
    /// The peer's device memory could not be imported (no connection to it).
    Import(String),
}

impl ResolveError {
    /// The readable reason.
    pub fn reason(&self) -> &str {
        match self {
            ResolveError::Range(reason) | ResolveError::Import(reason) => reason,
        }
    }
}

/// The import cache and translation of one device, used by one transport.
#[derive(Debug)]
pub struct PeerWindows {
    device: Arc<dyn DeviceBackend>,
    /// Prefix of every reason (the transport's name).
    path: &'static str,
    /// Peer segments' imported windows, by segment name.
    peers: Mutex<HashMap<String, Arc<Peer>>>,
}

impl PeerWindows {
    /// Translation for `device`; reasons start with `path`.
    pub fn new(device: Arc<dyn DeviceBackend>, path: &'static str) -> Self {
        PeerWindows { device, path, peers: Mutex::new(HashMap::new()) }
    }

    /// `(source, destination)` in the executing device's view, or why not.
    pub fn resolve(&self, transfer: &Transfer) -> Result<(u64, u64), ResolveError> {
        let (device, path) = (&self.device, self.path);
        let length = transfer.length;
        if !device.is_own_memory(transfer.local_addr, length) {
            return Err(ResolveError::Range(format!(
                "{path}: local range [{:#x}, +{length}) is not device memory of {} device {} (allocate it with \
                 engine.device()?.allocate() and register it)",
                transfer.local_addr,
                device.backend_name(),
                device.device_id()
            )));
        }
        let remote = if transfer.target.id == SegmentId::LOCAL {
            if !device.is_own_memory(transfer.remote_addr, length) {
                return Err(ResolveError::Range(format!(
                    "{path}: target range [{:#x}, +{length}) of this engine's own segment is not device memory",
                    transfer.remote_addr
                )));
            }
            transfer.remote_addr
        } else {
            let peer = self.peer(&transfer.target).map_err(ResolveError::Import)?;
            let (region, window) = peer
                .windows
                .iter()
                .find(|(region, _)| {
                    transfer.remote_addr >= region.addr
                        && transfer
                            .remote_addr
                            .checked_add(length)
                            .is_some_and(|end| end <= region.addr + region.length)
                })
                .ok_or_else(|| {
                    ResolveError::Range(format!(
                        "{path}: target range [{:#x}, +{length}) is in no exported region of segment {:?}",
                        transfer.remote_addr, transfer.target.name
                    ))
                })?;
            device.translate(window, transfer.remote_addr, length).ok_or_else(|| {
                ResolveError::Range(format!(
                    "{path}: target range [{:#x}, +{length}) does not translate through the window of export {}",
                    transfer.remote_addr, region.export_id
                ))
            })?
        };
        Ok(match transfer.opcode {
            Opcode::Read => (remote, transfer.local_addr),
            Opcode::Write => (transfer.local_addr, remote),
        })
    }

    /// The imported windows of a peer segment, parsed and imported once per descriptor version.
    fn peer(&self, segment: &Arc<Segment>) -> Result<Arc<Peer>, String> {
        let path = self.path;
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(peer) = peers.get(&segment.name) {
            if peer.segment.upgrade().is_some_and(|known| Arc::ptr_eq(&known, segment)) {
                return Ok(peer.clone());
            }
        }
        let value = segment
            .descriptor
            .aiv
            .clone()
            .ok_or_else(|| format!("{path}: segment {:?} advertises no aiv device", segment.name))?;
        let advertisement: DeviceAdvertisement = serde_json::from_value(value)
            .map_err(|error| format!("{path}: segment {:?} has an unreadable aiv object: {error}", segment.name))?;
        let mut windows = Vec::new();
        for region in advertisement.regions.clone() {
            let window = self
                .device
                .import(&advertisement, &region)
                .map_err(|error| format!("{path}: import of segment {:?} failed: {error}", segment.name))?;
            windows.push((region, window));
        }
        let peer = Arc::new(Peer { segment: Arc::downgrade(segment), windows });
        peers.insert(segment.name.clone(), peer.clone());
        Ok(peer)
    }
}
