//! Address translation and peer state shared by every device path (`aiv`, `adxl`, `adxl-fabric`, `ubshmem`): both ends of a
//! validated transfer in the executing device's view, and whether the peer it reaches is still there.
//!
//! A peer segment's `aiv` object advertises its exported device regions; they are imported into this device once per
//! descriptor version and a peer address is relocated by its offset in the region (`local_base + (remote -
//! remote_base)`), the VMM/IPC import scheme all three paths use. A region that cannot be imported fails only the
//! transfers that reach it.
//!
//! Peer loss (docs/device.md, "Peer loss"): a new descriptor version is probed once before its first transfer
//! ([`MemorySharing::probe_peer`]), and [`PeerWindows::probe_all`] (called by the `aiv` probe thread) probes every
//! imported peer, lost ones included. A peer is marked lost only on evidence that it is gone ([`is_gone`]: nobody
//! listens on its endpoint, another device answers there, or its process no longer exists); a probe that times out
//! or finds the exporter busy proves nothing and changes nothing. While lost, every transfer to the peer fails with
//! [`ResolveError::Lost`]; a lost peer whose probe succeeds again is recovered, and transfers to it work again with
//! the same descriptor version (no refresh or reopen needed). One `PeerWindows` per device serves all three paths,
//! so the baselines see a loss the `aiv` probe found. Owns the import cache and the peers' lost state; failing
//! transfers already pending to a lost peer is the caller's part.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::Transfer;
use crate::device::{DeviceAdvertisement, ExportedRegion, ImportedWindow, MemorySharing};
use crate::transfer::{FailureKind, Opcode, Segment, SegmentId, TransferFailure};

/// The next [`Peer::id`].
static NEXT_PEER_ID: AtomicU64 = AtomicU64::new(1);

/// Whether a failed probe proves the exporter gone (`ConnectionRefused`, or `NotFound`: the `cann` backend's
/// re-import was answered that the exporting process or its handle no longer exists). A timeout, a busy service or
/// any other failure is not evidence: the peer may be slow or flooded.
pub fn is_gone(error: &std::io::Error) -> bool {
    matches!(error.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound)
}

/// A peer segment's exported regions, imported into this device (one descriptor version).
#[derive(Debug)]
pub struct Peer {
    /// The segment name.
    name: String,
    /// The descriptor version the windows were built from.
    segment: Weak<Segment>,
    advertisement: DeviceAdvertisement,
    /// Each advertised region with its window, or why it could not be imported (e.g. withdrawn since).
    windows: Vec<(ExportedRegion, Result<ImportedWindow, String>)>,
    /// Unique among the peers of this process (what a pending transfer remembers of the peer it reaches).
    id: u64,
    /// Whether the peer is on another host ([`Peer::is_remote_host`]).
    remote_host: bool,
    /// Whether `lost` holds a reason (read on every transfer without taking the lock).
    is_lost: AtomicBool,
    /// Why the peer counts as lost, once it does.
    lost: Mutex<Option<String>>,
}

impl Peer {
    /// The segment name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Unique among the peers of this process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What the peer's device advertises (its descriptor's `aiv` object).
    pub fn advertisement(&self) -> &DeviceAdvertisement {
        &self.advertisement
    }

    /// Whether the peer is on another host (its advertised host identity differs from this device's): its VMM
    /// exports are not imported and it is not probed through them (the RDMA route reaches it, docs/rdma.md section 7).
    pub fn is_remote_host(&self) -> bool {
        self.remote_host
    }

    /// Why the peer counts as lost, if it does.
    pub fn lost_reason(&self) -> Option<String> {
        // Acquire pairs with `mark_lost`: a peer seen lost has its reason stored.
        if !self.is_lost.load(Ordering::Acquire) {
            return None;
        }
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn mark_lost(&self, reason: String) {
        *self.lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        self.is_lost.store(true, Ordering::Release);
    }

    /// Clears the lost state (the peer answered again). Returns the reason it was lost for.
    fn recover(&self) -> Option<String> {
        let mut lost = self.lost.lock().unwrap_or_else(|p| p.into_inner());
        self.is_lost.store(false, Ordering::Release);
        lost.take()
    }
}

/// Why a transfer's addresses could not be resolved: the caller maps these onto its own status codes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolveError {
    /// An address range is not where it must be (a parameter error).
    Range(String),
    /// The peer's device memory could not be imported (no connection to it).
    Import(String),
    /// The peer was found lost (its device is gone); no connection to it until it answers a probe again or the
    /// segment is refreshed or reopened.
    Lost(String),
}

impl ResolveError {
    /// The readable reason.
    pub fn reason(&self) -> &str {
        match self {
            ResolveError::Range(reason) | ResolveError::Import(reason) | ResolveError::Lost(reason) => reason,
        }
    }

    /// The task failure of a transfer that `path` could not resolve.
    pub fn failure(&self, path: &'static str) -> TransferFailure {
        let kind = match self {
            ResolveError::Range(_) => FailureKind::InvalidRequest,
            ResolveError::Import(_) => FailureKind::Unreachable,
            ResolveError::Lost(_) => FailureKind::PeerLost,
        };
        TransferFailure::new(path, kind, self.reason())
    }
}

/// Both ends of a transfer in the executing device's view, and the peer it reaches.
#[derive(Debug)]
pub struct Resolved {
    /// Source address.
    pub src: u64,
    /// Destination address.
    pub dst: u64,
    /// The [`Peer::id`] of the peer reached, if not this device's own memory.
    pub peer: Option<u64>,
}

/// The import cache, translation and peer state of one device, shared by its transports.
#[derive(Debug)]
pub struct PeerWindows {
    device: Arc<dyn MemorySharing>,
    /// Where this device is (`crate::device::HostIdentity`): peers advertising another identity are not imported.
    identity: String,
    /// Peer segments' imported windows, by segment name (the newest descriptor version seen).
    peers: Mutex<HashMap<String, Arc<Peer>>>,
}

impl PeerWindows {
    /// Translation for `device`.
    pub fn new(device: Arc<dyn MemorySharing>) -> Self {
        Self::with_identity(device, crate::device::HostIdentity::current().0)
    }

    /// Translation for `device`, which is at host identity `identity`.
    pub fn with_identity(device: Arc<dyn MemorySharing>, identity: String) -> Self {
        PeerWindows { device, identity, peers: Mutex::new(HashMap::new()) }
    }

    /// The peer behind a segment (parsed, and imported unless on another host, once per descriptor version), or why
    /// it cannot be reached: an unreadable advertisement, or the peer was found lost.
    pub fn peer_with(
        &self,
        segment: &Arc<Segment>,
        last: &mut Option<(Arc<Segment>, Arc<Peer>)>,
    ) -> Result<Arc<Peer>, ResolveError> {
        let peer = match last {
            Some((known, peer)) if Arc::ptr_eq(known, segment) => peer.clone(),
            _ => {
                let peer = self.peer(segment).map_err(ResolveError::Import)?;
                last.insert((segment.clone(), peer)).1.clone()
            }
        };
        if let Some(reason) = peer.lost_reason() {
            return Err(ResolveError::Lost(format!(
                "peer segment {:?} was lost ({reason}); transfers resume once its device answers again (or refresh \
                 or reopen the segment)",
                segment.name
            )));
        }
        Ok(peer)
    }

    /// Why the peer behind `segment` (this descriptor version) counts as lost, if a path of this device imported it
    /// and the probe found it gone; `None` otherwise (nothing is imported here). For paths that relocate by
    /// themselves (adxl through HiXL) but share the device's peer state.
    pub fn lost_reason_of(&self, segment: &Arc<Segment>) -> Option<String> {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let peer = peers.get(&segment.name)?;
        let same_version = peer.segment.upgrade().is_some_and(|known| Arc::ptr_eq(&known, segment));
        same_version.then(|| peer.lost_reason()).flatten().map(|reason| {
            format!(
                "peer segment {:?} was lost ({reason}); transfers resume once its device answers again (or refresh or \
                 reopen the segment)",
                segment.name
            )
        })
    }

    /// Both ends of `transfer` in the executing device's view, or why not (see [`ResolveError::failure`]).
    pub fn resolve(&self, transfer: &Transfer) -> Result<Resolved, ResolveError> {
        self.resolve_with(transfer, &mut None)
    }

    /// As [`PeerWindows::resolve`], remembering the last segment's peer in `last`: the transfers of one submit
    /// usually target one segment, and the peer table is a lock and a hash lookup per transfer otherwise.
    pub fn resolve_with(
        &self,
        transfer: &Transfer,
        last: &mut Option<(Arc<Segment>, Arc<Peer>)>,
    ) -> Result<Resolved, ResolveError> {
        let device = &self.device;
        let length = transfer.length;
        // Device memory of this engine, or registered Host memory the device reaches through its window.
        let local = if device.is_own_memory(transfer.local_addr, length) {
            transfer.local_addr
        } else if let Some(window) = device.host_window(transfer.local_addr, length) {
            window
        } else {
            return Err(ResolveError::Range(format!(
                "local range [{:#x}, +{length}) is not device memory of {} device {} (allocate it with \
                 engine.device()?.allocate() and register it)",
                transfer.local_addr,
                device.backend_name(),
                device.device_id()
            )));
        };
        let mut reached = None;
        let remote = if transfer.target.id == SegmentId::LOCAL {
            if !device.is_own_memory(transfer.remote_addr, length) {
                return Err(ResolveError::Range(format!(
                    "target range [{:#x}, +{length}) of this engine's own segment is not device memory",
                    transfer.remote_addr
                )));
            }
            transfer.remote_addr
        } else {
            let peer = self.peer_with(&transfer.target, last)?;
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
                    // Registered by the peer but not exported (Host memory its runtime could not share): no AIV
                    // kernel of another process reaches it.
                    let registered = transfer.target.buffers.find_containing(transfer.remote_addr, length).is_ok();
                    ResolveError::Range(format!(
                        "target range [{:#x}, +{length}) is in no exported region of segment {:?}{}",
                        transfer.remote_addr,
                        transfer.target.name,
                        if registered {
                            ": it is memory the peer registered without exporting it (Host memory its device runtime could \
                             not share, for example), which no device of another process reaches"
                        } else {
                            ""
                        }
                    ))
                })?;
            let window = window.as_ref().map_err(|error| {
                ResolveError::Import(format!("import of segment {:?} failed: {error}", transfer.target.name))
            })?;
            let remote = device.translate(window, transfer.remote_addr, length).ok_or_else(|| {
                ResolveError::Range(format!(
                    "target range [{:#x}, +{length}) does not translate through the window of export {}",
                    transfer.remote_addr, region.export_id
                ))
            })?;
            reached = Some(peer.id);
            remote
        };
        let (src, dst) = match transfer.opcode {
            Opcode::Read => (remote, local),
            Opcode::Write => (local, remote),
        };
        Ok(Resolved { src, dst, peer: reached })
    }

    /// The imported windows of a peer segment, parsed and imported once per descriptor version.
    fn peer(&self, segment: &Arc<Segment>) -> Result<Arc<Peer>, String> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(peer) = peers.get(&segment.name) {
            // The weak reference keeps the segment's allocation, so equal addresses mean the same descriptor version
            // (and comparing them touches no reference count shared with other submitting threads).
            if std::ptr::eq(peer.segment.as_ptr(), Arc::as_ptr(segment)) {
                return Ok(peer.clone());
            }
        }
        // Once per descriptor version: imports (a request to the exporting process on the twin runtime) and a probe
        // of the exporter may block.
        crate::cpu_time::may_sleep(|| self.import_peer(segment, &mut peers))
    }

    /// Parses a segment's advertisement, imports its regions, probes the exporter, and caches the peer.
    fn import_peer(&self, segment: &Arc<Segment>, peers: &mut HashMap<String, Arc<Peer>>) -> Result<Arc<Peer>, String> {
        let value = segment
            .descriptor
            .aiv
            .clone()
            .ok_or_else(|| format!("segment {:?} advertises no aiv device", segment.name))?;
        let advertisement: DeviceAdvertisement = serde_json::from_value(value)
            .map_err(|error| format!("segment {:?} has an unreadable aiv object: {error}", segment.name))?;
        let remote_host = advertisement.host.as_ref().is_some_and(|host| *host != self.identity);
        let mut windows = Vec::new();
        for region in &advertisement.regions {
            // A region that cannot be imported fails only the transfers that reach it. A peer on another host is
            // not imported at all: VMM exports do not cross hosts (the RDMA route reaches it).
            let window = if remote_host {
                Err(format!(
                    "the peer is on another host ({}; this one is {}): its memory cannot be imported",
                    advertisement.host.as_deref().unwrap_or("unknown"),
                    self.identity
                ))
            } else {
                self.device.import(&advertisement, region).map_err(|error| error.to_string())
            };
            windows.push((region.clone(), window));
        }
        let peer = Arc::new(Peer {
            name: segment.name.clone(),
            segment: Arc::downgrade(segment),
            advertisement,
            windows,
            remote_host,
            id: NEXT_PEER_ID.fetch_add(1, Ordering::Relaxed),
            is_lost: AtomicBool::new(false),
            lost: Mutex::new(None),
        });
        // Imports are cached per exporting device, so a stale descriptor of a dead peer would import nothing new and
        // reach orphaned memory: check the exporter once before the first transfer, then `probe_all` does. A peer
        // on another host has nothing imported here and is not probed through its exports (its QPs report its loss).
        let probed = if remote_host { None } else { self.device.probe_peer(&peer.advertisement) };
        if let Some(Err(error)) = probed {
            if is_gone(&error) {
                peer.mark_lost(format!("its device {} is gone: {error}", peer.advertisement.device));
            }
        }
        peers.insert(segment.name.clone(), peer.clone());
        Ok(peer)
    }

    /// The segment name of the peer whose [`Peer::id`] is `id` (empty if none is known).
    pub fn peer_name(&self, id: u64) -> String {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers.values().find(|peer| peer.id == id).map(|peer| peer.name.clone()).unwrap_or_default()
    }

    /// Probes every imported peer once. Marks lost the ones a probe proves gone ([`is_gone`]) and returns them, so
    /// the caller can fail what it still has pending to them; recovers lost ones that answer again. A probe that
    /// fails without such evidence (a timeout, a busy exporter) changes nothing.
    pub fn probe_all(&self) -> Vec<Arc<Peer>> {
        let peers: Vec<Arc<Peer>> = self.peers.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        let mut lost = Vec::new();
        for peer in peers.into_iter().filter(|peer| !peer.remote_host) {
            let Some(outcome) = self.device.probe_peer(&peer.advertisement) else { continue };
            let was_lost = peer.lost_reason().is_some();
            match outcome {
                Ok(()) if was_lost => {
                    let reason = peer.recover().unwrap_or_default();
                    tracing::info!(segment = %peer.name, device = %peer.advertisement.device, was = %reason,
                        "peer answers again: recovered");
                }
                Ok(()) => {}
                Err(error) if is_gone(&error) => {
                    if !was_lost {
                        peer.mark_lost(format!("its device {} is gone: {error}", peer.advertisement.device));
                        lost.push(peer);
                    }
                }
                Err(error) => {
                    tracing::debug!(segment = %peer.name, device = %peer.advertisement.device, %error,
                        "peer probe failed without evidence of loss (slow or busy); state unchanged");
                }
            }
        }
        lost
    }
}
