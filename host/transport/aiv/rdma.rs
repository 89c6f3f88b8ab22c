//! The RDMA route of the aiv transport (docs/rdma.md section 7): the device's NIC, its registration of the device
//! memory, the per-block QP tables the kernel reads, the choice of route per peer, and the QP handshake over the
//! metadata's Connection frame (initiator and target sides).
//!
//! Owns: [`Rdma`] (NIC address, registrations, QP tables and the state of each slot, responder QPs). It must not
//! post requests or drain completions: `submit` asks it for a request's route and keys, `drain` tells it of QP
//! errors.
//!
//! Per (block, peer device) one QP, in the slot the peer was given (the same slot index on every block). A slot is
//! set up on the first transfer from that block to that peer, within the handshake's deadline; after a QP error it
//! is replaced on the next transfer, once no request on the old QP is in flight; after a failed handshake transfers
//! to the peer fail fast with its reason for [`HANDSHAKE_RETRY`], then the next one tries again.
//!
//! The target side connects a responder QP only to a NIC the initiator's own descriptor lists: the request names the
//! initiator (`local_server_name`, its segment name), the engine's metadata resolves that descriptor
//! ([`InitiatorResolver`]) and `local_nic_path` must be its `aiv.rdma.nic`. In P2P mode the descriptor comes from
//! the initiator's own handshake server, so the name's host and the NIC's address must both be the handshake's
//! source address: a request can make this engine connect back only to the host it came from. Mooncake's RDMA
//! transport likewise derives the peer's server name from the handshake's `local_nic_path` (`server@device`) and
//! looks its segment descriptor up (kvcache-ai/Mooncake, `mooncake-transfer-engine/src/transport/rdma_transport/`).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::{AivOptions, RouteMode};
use crate::device::{
    ConnectedQp, DeviceAdvertisement, DeviceError, HostIdentity, MemorySharing, QpSpec, RdmaAdvertisement, RdmaKeys,
    RdmaNic, RdmaRegion, SharedMemory,
};
use crate::kernel_abi::roce::QpRecord;
use crate::kernel_abi::{QP_TABLE_SLOTS, REQUEST_QP_SHIFT, REQUEST_ROUTE_RDMA};
use crate::metadata::SegmentDescriptor;

/// How long transfers to a peer fail fast after its QP handshake failed, before the next one tries again.
pub const HANDSHAKE_RETRY: Duration = Duration::from_millis(300);
/// Responder QPs this device keeps for its peers' initiators at most (the oldest is destroyed beyond).
pub const MAX_RESPONDERS: usize = 1024;

/// Sends a Connection handshake to the engine serving a segment and returns the reply payload (set by the engine:
/// its metadata service knows where the peer's handshake server is).
pub type ConnectionSender = dyn Fn(&str, &Value) -> Result<Value, String> + Send + Sync;

/// Resolves a Connection handshake's initiator (set by the engine: its metadata service): its descriptor by its
/// segment name (`local_server_name`), the handshake's source address, and whether to bypass a cached copy; with the
/// address its NIC must have when the initiator vouches only for its own host (P2P mode), or `None` (a store).
pub type InitiatorResolver =
    dyn Fn(&str, SocketAddr, bool) -> Result<(SegmentDescriptor, Option<IpAddr>), String> + Send + Sync;

/// The path chosen for a transfer to a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    Sdma,
    Rdma,
}

/// The route to a peer, by where it is and what it advertises; `Err` says why neither route serves it.
pub(crate) fn choose_route(
    mode: RouteMode,
    local: &HostIdentity,
    nic: Result<(), &str>,
    segment: &str,
    peer: &DeviceAdvertisement,
) -> Result<Route, String> {
    let same_host = match &peer.host {
        Some(host) => *host == local.0,
        // An older descriptor says nothing of its host: taken as this host unless it offers RDMA.
        None => peer.rdma.is_none(),
    };
    let remote = || peer.host.clone().unwrap_or_else(|| "unknown".into());
    match (mode, same_host, &peer.rdma, nic) {
        (RouteMode::Sdma, true, _, _) | (RouteMode::Auto, true, _, _) => Ok(Route::Sdma),
        (RouteMode::Rdma, true, None, _) => Ok(Route::Sdma),
        (RouteMode::Sdma, false, _, _) => Err(format!(
            "peer segment {segment:?} is on another host ({}; this one is {}) and aiv.route is \"sdma\": SDMA \
             reaches only this host's devices, and the RDMA route is off",
            remote(),
            local.0
        )),
        (_, false, None, _) => Err(format!(
            "peer segment {segment:?} is on another host ({}; this one is {}) and advertises no RDMA NIC (no \
             aiv.rdma object in its descriptor): no route reaches it",
            remote(),
            local.0
        )),
        (_, _, Some(_), Err(why)) if !same_host || mode == RouteMode::Rdma => {
            Err(format!("peer segment {segment:?} needs the RDMA route, which is unavailable here: {why}"))
        }
        (_, _, Some(_), _) => Ok(Route::Rdma),
    }
}

/// A responder QP made for a peer's initiator: (initiator NIC, initiator QPN) and this NIC's QP.
type Responder = ((String, u32), Box<dyn ConnectedQp>);

/// One QP of a slot, as the Host set it up.
#[derive(Debug)]
struct Qp {
    qp: Box<dyn ConnectedQp>,
    remote_qpn: u32,
    peer_nic: SocketAddr,
}

impl Qp {
    fn qpn(&self) -> u32 {
        self.qp.handle().qpn
    }
}

#[derive(Debug, Default)]
enum SlotState {
    /// Nothing set up.
    #[default]
    Empty,
    /// Connected; its record is in the block's table.
    Ready(Qp),
    /// In error (or given up by the kernel): replaced on the next transfer once nothing on it is in flight.
    Broken { qp: Qp, why: String },
    /// The last handshake failed: transfers fail fast with `reason` until `retry_at`.
    Failed { reason: String, retry_at: Instant, replaces: Option<u32> },
}

impl SlotState {
    /// The slot's QP, connected or broken.
    fn qp(&self) -> Option<&Qp> {
        match self {
            SlotState::Ready(qp) | SlotState::Broken { qp, .. } => Some(qp),
            _ => None,
        }
    }
}

/// One slot of one block.
#[derive(Debug, Default)]
struct Slot {
    state: Mutex<SlotState>,
    /// Requests posted on this slot whose completion has not been drained.
    in_flight: AtomicU32,
    /// A QP failure a drain learnt while a submit held `state` (the QP number and why): the next submit applies it.
    /// The drain never waits for `state`, which a submit may hold through a whole QP handshake.
    failed: Mutex<Option<(u32, String)>>,
}

/// What a peer's slot is given for.
#[derive(Debug)]
struct SlotOwner {
    /// The peer device's identity (its advertisement's `device`).
    device: String,
}

/// Where a transfer on the RDMA route goes: the request fields.
#[derive(Clone, Copy, Debug)]
pub(super) struct RdmaRequest {
    pub(super) flags: u32,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    pub(super) slot: u32,
    /// The QP the request goes on: the slot's QP when the request was counted in flight, which stays the slot's QP
    /// until the request is drained (a QP is replaced only when nothing is in flight on it).
    pub(super) qpn: u32,
}

/// The RDMA route of one device.
pub(super) struct Rdma {
    /// The device's backend name, for errors.
    backend: &'static str,
    /// The open NIC, or why it could not be opened (then only SDMA serves).
    nic: Result<Box<dyn RdmaNic>, String>,
    identity: HostIdentity,
    mode: RouteMode,
    spec: QpSpec,
    /// The device memory registered with the NIC, with its keys.
    registrations: Mutex<Vec<(RdmaRegion, RdmaKeys)>>,
    /// Per block: its QP table (shared with the kernel).
    tables: Vec<SharedMemory>,
    /// `[block][slot]`.
    slots: Vec<Vec<Slot>>,
    /// Which peer each slot index serves.
    owners: Mutex<Vec<Option<SlotOwner>>>,
    sender: OnceLock<Arc<ConnectionSender>>,
    resolver: OnceLock<Arc<InitiatorResolver>>,
    /// Responder QPs made for peers' initiators: (initiator NIC, initiator QPN) -> this NIC's QP, oldest first.
    responders: Mutex<VecDeque<Responder>>,
    closed: AtomicBool,
}

impl std::fmt::Debug for Rdma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rdma").field("nic", &self.nic_address()).field("mode", &self.mode).finish_non_exhaustive()
    }
}

fn record_bytes() -> usize {
    std::mem::size_of::<QpRecord>()
}

impl Rdma {
    /// Opens the device's NIC `rdma` (unless the route is `sdma`), registers the exported memory of `device` and
    /// allocates one QP table per block in it. A NIC that cannot be opened (or a device without one) is no error: the
    /// RDMA route is then unavailable, saying why.
    pub(super) fn start(
        device: &dyn MemorySharing,
        rdma: Result<&dyn crate::device::Rdma, DeviceError>,
        options: &AivOptions,
        blocks: u32,
    ) -> Result<Rdma, DeviceError> {
        let identity = options.host_identity.clone().map(HostIdentity).unwrap_or_else(HostIdentity::current);
        // The tables first: a failure here leaves no NIC open.
        let mut tables = Vec::new();
        let mut slots = Vec::new();
        for _ in 0..blocks {
            tables.push(device.allocate_shared(record_bytes() * QP_TABLE_SLOTS as usize)?);
            slots.push((0..QP_TABLE_SLOTS).map(|_| Slot::default()).collect());
        }
        let mut registrations = Vec::new();
        let nic = if options.route == RouteMode::Sdma {
            Err("aiv.route is \"sdma\"".to_owned())
        } else {
            let ip = options.rdma_host.as_deref().unwrap_or("127.0.0.1");
            match ip.parse::<std::net::IpAddr>() {
                Err(_) => Err(format!("rdma_host {ip:?} is not an IP address")),
                Ok(ip) => match rdma.and_then(|rdma| rdma.open(SocketAddr::new(ip, 0))) {
                    Err(error) => Err(error.to_string()),
                    Ok(nic) => {
                        let mut failed = None;
                        for region in device.advertisement().regions {
                            match nic.register(region.addr, region.length) {
                                Ok(keys) => registrations.push((
                                    RdmaRegion { addr: region.addr, length: region.length, rkey: keys.rkey },
                                    keys,
                                )),
                                Err(error) => failed = Some(error.to_string()),
                            }
                        }
                        match failed {
                            Some(error) => {
                                let _ = nic.close();
                                registrations.clear();
                                Err(format!("register the device memory with the NIC: {error}"))
                            }
                            None => Ok(nic),
                        }
                    }
                },
            }
        };
        if let Err(why) = &nic {
            tracing::info!(device = device.device_id(), %why, "aiv RDMA route unavailable");
        }
        Ok(Rdma {
            backend: device.backend_name(),
            nic,
            identity,
            mode: options.route,
            spec: QpSpec {
                sq_depth: options.rdma_sq_depth,
                cq_depth: options.rdma_sq_depth,
                retry_count: options.rdma_retry_count,
                timeout: options.rdma_timeout,
                wake_block: None,
            },
            registrations: Mutex::new(registrations),
            tables,
            slots,
            owners: Mutex::new((0..QP_TABLE_SLOTS).map(|_| None).collect()),
            sender: OnceLock::new(),
            resolver: OnceLock::new(),
            responders: Mutex::new(VecDeque::new()),
            closed: AtomicBool::new(false),
        })
    }

    /// Whether the NIC is open.
    pub(super) fn available(&self) -> bool {
        self.nic.is_ok()
    }

    /// The NIC's address, or why there is no NIC.
    fn nic_address(&self) -> Result<SocketAddr, &String> {
        self.nic.as_ref().map(|nic| nic.address())
    }

    /// The device address of block `block`'s QP table and its entries (0, 0 without a NIC).
    pub(super) fn table(&self, block: usize) -> (u64, u32) {
        match (&self.nic, self.tables.get(block)) {
            (Ok(_), Some(table)) => (table.device_addr(), QP_TABLE_SLOTS),
            _ => (0, 0),
        }
    }

    pub(super) fn identity(&self) -> &HostIdentity {
        &self.identity
    }

    pub(super) fn set_sender(&self, sender: Arc<ConnectionSender>) {
        let _ = self.sender.set(sender);
    }

    pub(super) fn set_resolver(&self, resolver: Arc<InitiatorResolver>) {
        let _ = self.resolver.set(resolver);
    }

    /// The `rdma` object of the device's advertisement (`None` without a NIC).
    pub(super) fn advertisement(&self) -> Option<RdmaAdvertisement> {
        let nic = self.nic_address().ok()?;
        let regions = lock(&self.registrations).iter().map(|(region, _)| *region).collect();
        Some(RdmaAdvertisement { nic: nic.to_string(), regions })
    }

    /// The registrations with their lkeys (tests withdraw one through the twin NIC to see a target refuse).
    pub(super) fn registrations(&self) -> Vec<(RdmaRegion, u32)> {
        lock(&self.registrations).iter().map(|(region, keys)| (*region, keys.lkey)).collect()
    }

    /// Registers the exported memory again (new keys) and withdraws the old registrations; the descriptor must be
    /// republished for peers to learn the new rkeys.
    pub(super) fn reregister(&self) -> Result<(), DeviceError> {
        let nic = match &self.nic {
            Ok(nic) => nic,
            Err(why) => return Err(DeviceError::Unavailable { backend: self.backend, reason: why.clone() }),
        };
        let mut registrations = lock(&self.registrations);
        let mut fresh = Vec::new();
        for (region, _) in registrations.iter() {
            let keys = nic.register(region.addr, region.length)?;
            fresh.push((RdmaRegion { rkey: keys.rkey, ..*region }, keys));
        }
        for (_, keys) in std::mem::replace(&mut *registrations, fresh) {
            // Already withdrawn (by a test) is fine.
            let _ = nic.deregister(keys.lkey);
        }
        Ok(())
    }

    /// The route to `peer` (the segment `segment`'s advertisement).
    pub(super) fn route(&self, segment: &str, peer: &DeviceAdvertisement) -> Result<Route, String> {
        choose_route(self.mode, &self.identity, self.nic.as_ref().map(|_| ()).map_err(String::as_str), segment, peer)
    }

    /// The request fields of a transfer on the RDMA route from `block`, setting the QP up if it needs one (bounded
    /// by the handshake's deadline). Counts the request in flight on its slot: [`Rdma::drained`] uncounts it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn prepare(
        &self,
        block: usize,
        segment: &str,
        peer: &DeviceAdvertisement,
        local_addr: u64,
        remote_addr: u64,
        length: u64,
    ) -> Result<RdmaRequest, (crate::transfer::FailureKind, String)> {
        use crate::transfer::FailureKind;
        let advertised = peer
            .rdma
            .as_ref()
            .ok_or((FailureKind::Unreachable, format!("peer segment {segment:?} advertises no RDMA NIC")))?;
        let lkey = lock(&self.registrations)
            .iter()
            .find(|(region, _)| region.holds(local_addr, length))
            .map(|(_, keys)| keys.lkey)
            .ok_or_else(|| {
                (
                    FailureKind::InvalidRequest,
                    format!(
                        "local range [{local_addr:#x}, +{length}) is not in memory this device registered with its NIC"
                    ),
                )
            })?;
        let rkey = advertised.regions.iter().find(|region| region.holds(remote_addr, length)).map(|r| r.rkey).ok_or_else(
            || {
                (
                    FailureKind::InvalidRequest,
                    format!(
                        "target range [{remote_addr:#x}, +{length}) is in no RDMA-registered region of segment {segment:?}"
                    ),
                )
            },
        )?;
        let peer_nic: SocketAddr = advertised.nic.parse().map_err(|_| {
            (
                FailureKind::Unreachable,
                format!("segment {segment:?} advertises an unreadable NIC address {:?}", advertised.nic),
            )
        })?;
        let slot = self.slot_for(&peer.device).ok_or_else(|| {
            (
                FailureKind::Resources,
                format!(
                    "the QP table is full: {QP_TABLE_SLOTS} peer devices hold a QP slot with requests in flight; \
                     segment {segment:?} gets none now"
                ),
            )
        })?;
        let qpn =
            self.ensure_qp(block, slot, segment, peer_nic).map_err(|reason| (FailureKind::Unreachable, reason))?;
        Ok(RdmaRequest { flags: REQUEST_ROUTE_RDMA | slot << REQUEST_QP_SHIFT, lkey, rkey, slot, qpn })
    }

    /// The slot index of `device`, giving it a free one (or one whose peer has nothing in flight) the first time.
    fn slot_for(&self, device: &str) -> Option<u32> {
        let mut owners = lock(&self.owners);
        if let Some(index) = owners.iter().position(|owner| owner.as_ref().is_some_and(|o| o.device == device)) {
            return Some(index as u32);
        }
        let free = owners.iter().position(Option::is_none).or_else(|| {
            (0..owners.len())
                .find(|&index| self.slots.iter().all(|block| block[index].in_flight.load(Ordering::Acquire) == 0))
        })?;
        // A reclaimed slot: its old QPs go (nothing is in flight on them).
        for block in 0..self.slots.len() {
            let old = std::mem::take(&mut *lock(&self.slots[block][free].state));
            if let SlotState::Ready(qp) | SlotState::Broken { qp, .. } = old {
                self.destroy(qp.qp);
            }
        }
        owners[free] = Some(SlotOwner { device: device.to_owned() });
        Some(free as u32)
    }

    /// The kernel-written error status of block `block`'s record in `slot`, if the kernel's line is about QP `qpn`
    /// (a replaced record keeps the old QP's line until the kernel adopts the new one).
    fn kernel_error(&self, block: usize, slot: u32, qpn: u32) -> u32 {
        let table = &self.tables[block];
        let word = |offset: usize| {
            // SAFETY: the table holds QP_TABLE_SLOTS records (allocated so in `start`), 4-byte aligned words; the
            // kernel writes these words, so they are read atomically.
            unsafe {
                (*table.host_ptr().add(slot as usize * record_bytes() + offset).cast::<AtomicU32>())
                    .load(Ordering::Acquire)
            }
        };
        if word(std::mem::offset_of!(QpRecord, qpn_seen)) != qpn {
            return 0;
        }
        word(std::mem::offset_of!(QpRecord, error_status))
    }

    /// Makes slot `slot` of `block` hold a connected QP to `peer_nic` and counts one request in flight on it, under
    /// the slot's lock (so the QP cannot be replaced before the request is drained); returns the QP's number.
    fn ensure_qp(&self, block: usize, slot: u32, segment: &str, peer_nic: SocketAddr) -> Result<u32, String> {
        let entry = &self.slots[block][slot as usize];
        let mut state = lock(&entry.state);
        let parked = lock(&entry.failed).take();
        if let SlotState::Ready(qp) = &*state {
            let error = self.kernel_error(block, slot, qp.qpn());
            let failed = parked.filter(|(qpn, _)| *qpn == qp.qpn()).map(|(_, why)| why);
            if error == 0 && failed.is_none() && qp.peer_nic == peer_nic {
                entry.in_flight.fetch_add(1, Ordering::AcqRel);
                return Ok(qp.qpn());
            }
            let why = if let Some(why) = failed {
                why
            } else if error != 0 {
                format!("the kernel put it in error (status {error:#x})")
            } else {
                format!("the peer's NIC moved to {peer_nic}")
            };
            if let SlotState::Ready(qp) = std::mem::take(&mut *state) {
                *state = SlotState::Broken { qp, why };
            }
        }
        let mut replaces = None;
        match &*state {
            SlotState::Failed { reason, retry_at, replaces: old } => {
                if Instant::now() < *retry_at {
                    return Err(reason.clone());
                }
                replaces = *old;
            }
            SlotState::Broken { qp, why } => {
                let pending = entry.in_flight.load(Ordering::Acquire);
                if pending > 0 {
                    return Err(format!(
                        "QP {:#x} to segment {segment:?} (block {block}, slot {slot}) is being replaced ({why}); {pending} \
                         requests are still in flight on it",
                        qp.qpn()
                    ));
                }
                replaces = Some(qp.qpn());
                if let SlotState::Broken { qp, .. } = std::mem::take(&mut *state) {
                    self.destroy(qp.qp);
                }
            }
            _ => {}
        }
        if self.closed.load(Ordering::Acquire) {
            return Err("the aiv transport is shutting down".into());
        }
        match self.handshake(block, slot, segment, peer_nic, replaces) {
            Ok(qp) => {
                let qpn = qp.qpn();
                *state = SlotState::Ready(qp);
                entry.in_flight.fetch_add(1, Ordering::AcqRel);
                Ok(qpn)
            }
            Err(error) => {
                let reason = format!(
                    "QP handshake with segment {segment:?} (NIC {peer_nic}, block {block}) failed: {error} (retried \
                     after {HANDSHAKE_RETRY:?})"
                );
                tracing::warn!(%reason, "aiv RDMA");
                *state =
                    SlotState::Failed { reason: reason.clone(), retry_at: Instant::now() + HANDSHAKE_RETRY, replaces };
                Err(reason)
            }
        }
    }

    /// Creates a QP, exchanges QPNs with the target's handshake server, connects, and writes the record.
    fn handshake(
        &self,
        block: usize,
        slot: u32,
        segment: &str,
        peer_nic: SocketAddr,
        replaces: Option<u32>,
    ) -> Result<Qp, String> {
        let nic = self.nic.as_ref().map_err(Clone::clone)?;
        let sender = self.sender.get().ok_or("no metadata service to send the QP handshake through")?;
        let spec = QpSpec { wake_block: Some(block as u32), ..self.spec };
        let created = nic.create_qp(&spec).map_err(|error| error.to_string())?;
        let handle = *created.handle();
        let nic = nic.address();
        // Until connected, a failure destroys the created QP as it drops (logged there).
        let request = json!({
            "local_nic_path": nic.to_string(),
            "local_lid": 0,
            "local_gid": "",
            "peer_nic_path": peer_nic.to_string(),
            "qp_num": [handle.qpn],
            "payload": "",
            "reply_msg": "",
            "aiv_replaces": replaces.map_or_else(Vec::new, |qpn| vec![qpn]),
        });
        let reply = sender(segment, &request)?;
        let reply_msg = reply.get("reply_msg").and_then(Value::as_str).unwrap_or("");
        if !reply_msg.is_empty() {
            return Err(format!("the target refused: {reply_msg}"));
        }
        let remote_qpn = reply
            .get("qp_num")
            .and_then(Value::as_array)
            .and_then(|qps| qps.first())
            .and_then(Value::as_u64)
            .and_then(|qpn| u32::try_from(qpn).ok())
            .filter(|&qpn| qpn != 0)
            .ok_or_else(|| format!("the target's reply names no QP (it offers no RDMA route?): {reply}"))?;
        let qp = created.connect(peer_nic, remote_qpn).map_err(|error| error.to_string())?;
        let (default_lkey, default_rkey) = (0, 0);
        let record = QpRecord {
            sq_base: handle.sq_base.into(),
            sq_db_addr: handle.sq_db_addr.into(),
            cq_base: handle.cq_base.into(),
            cq_db_addr: handle.cq_db_addr.into(),
            qpn: 0.into(),
            cqn: handle.cqn.into(),
            sq_depth: handle.sq_depth.into(),
            cq_depth: handle.cq_depth.into(),
            sl: 0.into(),
            cq_db_mode: crate::kernel_abi::roce::CQ_DB_MODE_HW.into(),
            lkey: default_lkey.into(),
            rkey: default_rkey.into(),
            ..zerocopy::FromZeros::new_zeroed()
        };
        self.write_record(block, slot, &record, handle.qpn);
        tracing::debug!(block, slot, qpn = handle.qpn, remote_qpn, %peer_nic, segment, "aiv RDMA QP connected");
        Ok(Qp { qp, remote_qpn, peer_nic })
    }

    /// Writes the Host line of a record (the kernel's line untouched), its qpn last with release ordering.
    fn write_record(&self, block: usize, slot: u32, record: &QpRecord, qpn: u32) {
        use zerocopy::IntoBytes;
        let table = &self.tables[block];
        let base = slot as usize * record_bytes();
        let qpn_offset = std::mem::offset_of!(QpRecord, qpn);
        let host_line = &record.as_bytes()[..64];
        // SAFETY: the table holds QP_TABLE_SLOTS records; no request on this slot is in flight (a replaced QP is
        // destroyed only then), so the kernel does not read the line while it is written, except its qpn, which is
        // written atomically last.
        unsafe {
            let ptr = table.host_ptr().add(base);
            let qpn_word = &*ptr.add(qpn_offset).cast::<AtomicU32>();
            qpn_word.store(0, Ordering::Release);
            for (i, byte) in host_line.iter().enumerate() {
                if !(qpn_offset..qpn_offset + 4).contains(&i) {
                    std::ptr::write_volatile(ptr.add(i), *byte);
                }
            }
            qpn_word.store(qpn, Ordering::Release);
        }
    }

    fn destroy(&self, qp: Box<dyn ConnectedQp>) {
        let qpn = qp.handle().qpn;
        if let Err(error) = qp.destroy() {
            tracing::debug!(qpn, %error, "destroy QP");
        }
    }

    /// A drained request of `slot` on `block` that went on QP `qpn`: uncounts it; a failure that says the QP is in
    /// error marks the slot for replacement. Never waits for the slot's lock: while a submit holds it, the failure
    /// is parked for the next submit to apply.
    pub(super) fn drained(&self, block: usize, slot: u32, qpn: u32, qp_failed: Option<&str>) {
        let Some(entry) = self.slots.get(block).and_then(|b| b.get(slot as usize)) else { return };
        let _ = entry.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        let Some(why) = qp_failed else { return };
        let Ok(mut state) = entry.state.try_lock() else {
            *lock(&entry.failed) = Some((qpn, why.to_owned()));
            return;
        };
        if matches!(&*state, SlotState::Ready(qp) if qp.qpn() == qpn) {
            tracing::info!(block, slot, qpn, why, "aiv RDMA QP in error: replaced on the next transfer");
            if let SlotState::Ready(qp) = std::mem::take(&mut *state) {
                *state = SlotState::Broken { qp, why: why.to_owned() };
            }
        }
    }

    /// Whether the initiator named in `request` lists `initiator` (`local_nic_path`) as its NIC in its descriptor, as
    /// this engine's metadata resolves it from `source`; `Err` says why not. A NIC missing from a cached descriptor
    /// is looked up once more, fresh (the initiator may have restarted on another NIC port).
    fn check_initiator(&self, request: &Value, source: SocketAddr, initiator: SocketAddr) -> Result<(), String> {
        let name = request.get("local_server_name").and_then(Value::as_str).unwrap_or("");
        let resolver = self.resolver.get().ok_or("no metadata service to resolve the initiator through")?;
        let mut listed = None;
        for fresh in [false, true] {
            let (descriptor, host) = resolver(name, source, fresh)?;
            listed = descriptor
                .aiv
                .and_then(|aiv| serde_json::from_value::<DeviceAdvertisement>(aiv).ok())
                .and_then(|advertisement| advertisement.rdma)
                .map(|rdma| rdma.nic);
            if listed.as_deref().and_then(|nic| nic.parse::<SocketAddr>().ok()) == Some(initiator) {
                return match host {
                    Some(host) if crate::metadata::canonical_ip(initiator.ip()) != host => Err(format!(
                        "local_nic_path {initiator} is not on the handshake's source host {host}: with P2P handshake \
                         metadata an initiator vouches only for its own host"
                    )),
                    _ => Ok(()),
                };
            }
        }
        Err(match listed {
            Some(nic) => format!("local_nic_path {initiator} is not the NIC segment {name:?} lists ({nic})"),
            None => format!("segment {name:?} lists no RDMA NIC (no aiv.rdma object), so not {initiator}"),
        })
    }

    /// The target side of the handshake: a Connection request from a peer's initiator, sent from `source`. A
    /// responder QP is created and connected only to a NIC the initiator's descriptor lists
    /// ([`Rdma::check_initiator`]); anything else is refused with the reason in `reply_msg`, connecting nowhere.
    pub(super) fn answer_connection(&self, request: &Value, source: SocketAddr) -> Result<Value, String> {
        let tcp_only = || {
            json!({"local_nic_path": "", "local_lid": 0, "local_gid": "", "peer_nic_path": "",
                   "qp_num": [], "payload": "", "reply_msg": ""})
        };
        let field = |key: &str| request.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
        let (initiator_nic, wanted_nic) = (field("local_nic_path"), field("peer_nic_path"));
        let initiator_qpn = request
            .get("qp_num")
            .and_then(Value::as_array)
            .and_then(|qps| qps.first())
            .and_then(Value::as_u64)
            .and_then(|qpn| u32::try_from(qpn).ok());
        let (Some(initiator_qpn), false) = (initiator_qpn, initiator_nic.is_empty()) else {
            // Not an RDMA QP exchange (a TCP-only Mooncake peer's probe): answered as such a peer does.
            return Ok(tcp_only());
        };
        let refuse =
            |why: String| json!({"local_nic_path": "", "peer_nic_path": initiator_nic, "qp_num": [], "reply_msg": why});
        let (nic, address) = match &self.nic {
            Ok(nic) => (nic, nic.address()),
            Err(why) => return Ok(refuse(format!("this device offers no RDMA route: {why}"))),
        };
        if self.closed.load(Ordering::Acquire) {
            return Ok(refuse("the aiv transport is shutting down".into()));
        }
        if wanted_nic != address.to_string() {
            return Ok(refuse(format!("this engine's NIC is {address}, not {wanted_nic:?}")));
        }
        let Ok(initiator) = initiator_nic.parse::<SocketAddr>() else {
            return Ok(refuse(format!("local_nic_path {initiator_nic:?} is not ip:port")));
        };
        if let Err(why) = self.check_initiator(request, source, initiator) {
            return Ok(refuse(format!("the initiator is not verified: {why}")));
        }
        // The initiator's earlier QPs it replaced: their responders go.
        let replaced: Vec<u32> = request
            .get("aiv_replaces")
            .and_then(Value::as_array)
            .map(|qps| qps.iter().filter_map(Value::as_u64).filter_map(|q| u32::try_from(q).ok()).take(16).collect())
            .unwrap_or_default();
        {
            let mut responders = lock(&self.responders);
            for (key, local) in std::mem::take(&mut *responders) {
                if key.0 == initiator_nic && replaced.contains(&key.1) {
                    self.destroy(local);
                } else {
                    responders.push_back((key, local));
                }
            }
        }
        let created = match nic.create_qp(&self.spec) {
            Ok(created) => created,
            Err(error) => return Ok(refuse(format!("create a responder QP: {error}"))),
        };
        let qpn = created.handle().qpn;
        // A QP that fails to connect is destroyed before the error comes back.
        let qp = match created.connect(initiator, initiator_qpn) {
            Ok(qp) => qp,
            Err(error) => return Ok(refuse(format!("connect the responder QP: {error}"))),
        };
        let mut responders = lock(&self.responders);
        responders.push_back(((initiator_nic.clone(), initiator_qpn), qp));
        while responders.len() > MAX_RESPONDERS {
            if let Some((_, oldest)) = responders.pop_front() {
                self.destroy(oldest);
            }
        }
        Ok(json!({
            "local_nic_path": address.to_string(),
            "local_lid": 0,
            "local_gid": "",
            "peer_nic_path": initiator_nic,
            "qp_num": [qpn],
            "payload": "",
            "reply_msg": "",
        }))
    }

    /// Destroys every QP and closes the NIC (bounded: the NIC joins its threads within its own limit).
    pub(super) fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) || self.nic.is_err() {
            return;
        }
        for block in &self.slots {
            for slot in block {
                if let SlotState::Ready(qp) | SlotState::Broken { qp, .. } = std::mem::take(&mut *lock(&slot.state)) {
                    self.destroy(qp.qp);
                }
            }
        }
        for (_, local) in std::mem::take(&mut *lock(&self.responders)) {
            self.destroy(local);
        }
        let Ok(nic) = &self.nic else { return };
        for (_, keys) in std::mem::take(&mut *lock(&self.registrations)) {
            let _ = nic.deregister(keys.lkey);
        }
        if let Err(error) = nic.close() {
            tracing::warn!(%error, "closing the device's NIC");
        }
    }

    /// Test-only: every slot's lock, held as a submit holds one while it checks or sets its slot up.
    pub(super) fn hold_slots(&self) -> Vec<std::sync::MutexGuard<'_, impl Sized>> {
        self.slots.iter().flatten().map(|slot| lock(&slot.state)).collect()
    }

    /// QP `qpn` of `slot` on `block`, with its peer NIC and remote QPN while it is still the slot's, for messages.
    pub(super) fn describe_qp(&self, block: usize, slot: u32, qpn: u32) -> String {
        let peer = self
            .slots
            .get(block)
            .and_then(|b| b.get(slot as usize))
            .and_then(|entry| entry.state.try_lock().ok())
            .and_then(|state| state.qp().filter(|qp| qp.qpn() == qpn).map(|qp| (qp.peer_nic, qp.remote_qpn)));
        match peer {
            Some((nic, remote)) => format!("QP {qpn:#x} (block {block}, slot {slot}) to NIC {nic} QP {remote:#x}"),
            None => format!("QP {qpn:#x} (block {block}, slot {slot})"),
        }
    }
}

impl Drop for Rdma {
    /// A transport whose start failed after the NIC opened closes it here (a closed one is left alone).
    fn drop(&mut self) {
        self.close();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advertisement(host: Option<&str>, rdma: bool) -> DeviceAdvertisement {
        DeviceAdvertisement {
            device: "d".into(),
            device_id: 1,
            backend: "cann".into(),
            regions: Vec::new(),
            process_id: None,
            hixl_server: None,
            fabric_mem_server: None,
            rdma: rdma.then(|| RdmaAdvertisement { nic: "127.0.0.1:1".into(), regions: Vec::new() }),
            host: host.map(str::to_owned),
        }
    }

    #[test]
    fn the_route_follows_the_host_identity_and_the_mode() {
        let here = HostIdentity("a".into());
        let route =
            |mode, host, rdma, nic: Result<(), &str>| choose_route(mode, &here, nic, "s", &advertisement(host, rdma));
        assert_eq!(route(RouteMode::Auto, Some("a"), true, Ok(())), Ok(Route::Sdma));
        assert_eq!(route(RouteMode::Auto, Some("b"), true, Ok(())), Ok(Route::Rdma));
        assert_eq!(route(RouteMode::Rdma, Some("a"), true, Ok(())), Ok(Route::Rdma));
        assert_eq!(route(RouteMode::Rdma, Some("a"), false, Ok(())), Ok(Route::Sdma));
        // Old descriptors (no host, no rdma) keep working over SDMA.
        assert_eq!(route(RouteMode::Auto, None, false, Ok(())), Ok(Route::Sdma));
        let error = route(RouteMode::Sdma, Some("b"), true, Ok(())).expect_err("sdma to another host");
        assert!(error.contains("another host") && error.contains("\"sdma\""), "{error}");
        let error = route(RouteMode::Auto, Some("b"), false, Ok(())).expect_err("no rdma object");
        assert!(error.contains("advertises no RDMA NIC"), "{error}");
        let error = route(RouteMode::Auto, Some("b"), true, Err("no NIC")).expect_err("no local NIC");
        assert!(error.contains("unavailable here: no NIC"), "{error}");
    }
}
