//! The transfer engine: memory registration, segments, batches and per-request routing, with Mooncake's semantics
//! (docs/mooncake.md section 5).
//!
//! The engine owns validation: no request reaches a transport before its local range lies inside one registered
//! local buffer and its target range inside one buffer of the target segment. It never moves bytes itself; the
//! transports behind [`Transport`] do.
//!
//! Registration refuses what cannot be memory (the null page; Host ranges with a page that is not mapped, asked of
//! the kernel) and publishes the descriptor once per call, a batch included, so registering n regions costs time
//! linear in n.

mod adxl_client;
mod batch;
mod device;
mod segment;

pub use adxl_client::{AdxlClient, AdxlRequest, AdxlTransferStatus, TransferOpDesc};
pub use device::AivDevice;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use batch::Batch;
use segment::SegmentTable;

use crate::config::{EngineConfig, ProcessEnvironment};
use crate::error::{EngineError, Result};
use crate::evidence::TransferEvidence;
use crate::metadata::{BufferDescriptor, MetadataOptions, MetadataService, SegmentDescriptor};
use crate::transfer::{
    host_copy, BatchId, BufferSet, FailureKind, Opcode, Protocol, RangeError, RegisteredBuffer, Segment, SegmentId,
    TaskSlot, Transfer, TransferFailure, TransferRequest, TransferState, TransferStatus,
};
use crate::transport::local::LocalTransport;
use crate::transport::Transport;

/// What [`TransferEngine::route`] looked up last within one submit.
#[derive(Default)]
struct RouteCache {
    segment: Option<(SegmentId, Arc<Segment>)>,
    transport: Option<(Protocol, Arc<dyn Transport>)>,
}

/// Why the engine refused a request before any transport saw it.
#[derive(Debug, thiserror::Error)]
enum RouteError {
    /// The target segment id is not open.
    #[error(transparent)]
    Segment(EngineError),
    /// The source range is not inside one registered local buffer.
    #[error("source range is not inside one registered local buffer: {0}")]
    Source(RangeError),
    /// The target range is not inside one buffer of the target segment.
    #[error("target range is not inside one buffer of segment {segment:?}: {error}")]
    Target { segment: String, error: RangeError },
    /// No transport of the request's protocol is installed.
    #[error("protocol {protocol} has no transport in this engine for segment {segment:?}")]
    NoTransport { protocol: Protocol, segment: String },
    /// A tcp request names device memory the Host cannot read or write.
    #[error(
        "protocol tcp moves memory with the Host's own reads and writes, and the {side} range is device memory \
         ({location}), which the Host cannot reach (on the twin runtime as on an NPU); use aiv, adxl or ubshmem for \
         device memory"
    )]
    DeviceMemoryOverTcp { side: &'static str, location: String },
}

impl RouteError {
    /// The failure of the rejected task, with Mooncake's code for the refusal.
    fn failure(&self) -> TransferFailure {
        let mooncake_code = match self {
            RouteError::Segment(error) => error.mooncake_code(),
            // ERR_ADDRESS_NOT_REGISTERED, as Mooncake answers a range outside the registered buffers.
            RouteError::Source(_) | RouteError::Target { .. } => 3,
            // ERR_NOT_SUPPORTED_TRANSPORT.
            RouteError::NoTransport { .. } | RouteError::DeviceMemoryOverTcp { .. } => 8,
        };
        TransferFailure::new("engine", FailureKind::Rejected, self.to_string()).with_mooncake_code(mooncake_code)
    }
}

/// A Mooncake-compatible transfer engine.
#[derive(Debug)]
pub struct TransferEngine {
    config: EngineConfig,
    name: String,
    /// Shared with the tcp data server, which checks every peer request against it.
    memory: Arc<RwLock<BufferSet>>,
    /// The engine's own segment, rebuilt whenever local registration changes.
    local_segment: RwLock<Arc<Segment>>,
    segments: RwLock<SegmentTable>,
    batches: Mutex<HashMap<BatchId, Arc<Batch>>>,
    next_batch: AtomicU64,
    local_transport: Arc<LocalTransport>,
    transports: RwLock<HashMap<Protocol, Arc<dyn Transport>>>,
    /// Shared (weakly) with the aiv transport's RDMA route, which sends its QP handshakes through it.
    metadata: Arc<MetadataService>,
    /// The device behind the `aiv` transport, created on first use by [`Self::device`].
    device: Mutex<Option<Arc<AivDevice>>>,
    /// Per-stage traces (docs/trace.md), off until [`Self::set_trace`].
    tracer: Arc<crate::trace::Tracer>,
    /// Entries of each aiv block's trace ring, when tracing first allocates them.
    trace_depth: std::sync::atomic::AtomicU32,
    /// When each open segment's descriptor was last fetched again because a request's target range was in none of
    /// its buffers ([`STALE_REFRESH_INTERVAL`] apart at most once).
    stale_refreshes: Mutex<HashMap<SegmentId, Instant>>,
    /// Segments, by name, a transfer to which failed since their descriptor was last fetched
    /// ([`Self::suspect_segment`]).
    suspect_segments: Mutex<std::collections::HashSet<String>>,
}

/// A request whose target range is in no buffer of the cached descriptor fetches the descriptor again (the peer may
/// have registered memory since, or restarted under the same name), at most once per this interval per segment.
pub const STALE_REFRESH_INTERVAL: Duration = Duration::from_millis(250);

impl TransferEngine {
    /// Starts an engine, with the metadata settings of the `MC_*` environment variables
    /// ([`MetadataOptions::from_env`]).
    ///
    /// Metadata (see [`MetadataService::start`]): the connection string picks P2P handshake, an HTTP metadata server
    /// or etcd. Every engine runs a handshake server on its RPC port. With `P2PHANDSHAKE` the engine is named
    /// `host:<rpc port>` after the host of `config.local_hostname` (see [`Self::name`]); with a store it is named
    /// `config.local_hostname` and publishes its `rpc_meta`. The (empty) descriptor is published before this returns.
    pub fn new(config: EngineConfig) -> Result<Self> {
        let options = MetadataOptions::from_env(&ProcessEnvironment)?;
        Self::with_metadata_options(config, &options)
    }

    /// Starts an engine with explicit metadata settings instead of the `MC_*` environment variables.
    pub fn with_metadata_options(config: EngineConfig, options: &MetadataOptions) -> Result<Self> {
        let metadata = Arc::new(MetadataService::start(&config, options)?);
        let name = metadata.segment_name().to_owned();
        let descriptor = SegmentDescriptor::new(name.clone(), vec![config.protocol.as_str().to_owned()]);
        let local_segment = Segment::from_descriptor(SegmentId::LOCAL, descriptor)
            .map_err(|reason| EngineError::Metadata { operation: "build local segment", reason })?;
        metadata.publish(&local_segment.descriptor)?;
        tracing::info!(name = %name, protocol = %config.protocol, metadata = %config.metadata_server, "engine started");
        let engine = TransferEngine {
            config,
            name,
            memory: Arc::new(RwLock::new(BufferSet::new())),
            local_segment: RwLock::new(Arc::new(local_segment)),
            segments: RwLock::new(SegmentTable::default()),
            batches: Mutex::new(HashMap::new()),
            next_batch: AtomicU64::new(1),
            local_transport: Arc::new(LocalTransport),
            transports: RwLock::new(HashMap::new()),
            metadata,
            device: Mutex::new(None),
            tracer: Arc::default(),
            trace_depth: std::sync::atomic::AtomicU32::new(crate::transport::aiv::DEFAULT_TRACE_DEPTH),
            stale_refreshes: Mutex::new(HashMap::new()),
            suspect_segments: Mutex::new(std::collections::HashSet::new()),
        };
        if engine.config.protocol == Protocol::Tcp {
            engine.enable_tcp_transport()?;
        }
        Ok(engine)
    }

    /// Starts the `tcp` transport (data server and client lanes), publishes its port, version and host in this
    /// engine's descriptor, and installs it. Done by [`Self::new`] when the configured protocol is `tcp`; other
    /// engines may call it to serve and reach Mooncake's TCP peers too. Calling it again changes nothing.
    pub fn enable_tcp_transport(&self) -> Result<()> {
        let options = crate::transport::tcp::TcpOptions::from_config(&self.config).map_err(tcp_start_error)?;
        self.enable_tcp_transport_with(options)
    }

    /// [`Self::enable_tcp_transport`] with explicit options (bind address, wire version, lanes, timeouts).
    pub fn enable_tcp_transport_with(&self, options: crate::transport::tcp::TcpOptions) -> Result<()> {
        if self.has_transport(Protocol::Tcp) {
            return Ok(());
        }
        let transport =
            crate::transport::tcp::TcpTransport::start(options, self.memory.clone()).map_err(tcp_start_error)?;
        {
            let mut local = write(&self.local_segment);
            let mut descriptor = local.descriptor.clone();
            transport.describe(&mut descriptor);
            let segment = Segment::from_descriptor(SegmentId::LOCAL, descriptor)
                .map_err(|reason| EngineError::Metadata { operation: "build local segment", reason })?;
            *local = Arc::new(segment);
        }
        self.install_transport(Protocol::Tcp, Arc::new(transport));
        self.republish_local_segment()
    }

    /// The registered local buffers, shared: a server that serves peers' requests checks each one against the
    /// registrations of that moment.
    pub fn shared_memory(&self) -> Arc<RwLock<BufferSet>> {
        self.memory.clone()
    }

    /// The engine's segment name: what peers pass to `open_segment` (`host:<rpc port>` with P2P handshake).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The port of this engine's handshake server (Mooncake's `get_rpc_port`).
    pub fn rpc_port(&self) -> u16 {
        self.metadata.rpc_meta().rpc_port
    }

    /// The engine's metadata service: peers' `rpc_meta`, received notifications, the connection in use.
    pub fn metadata(&self) -> &MetadataService {
        &self.metadata
    }

    /// The configuration the engine was started with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Makes `transport` carry requests for `protocol` (replacing any earlier one).
    pub fn install_transport(&self, protocol: Protocol, transport: Arc<dyn Transport>) {
        tracing::debug!(protocol = %protocol, transport = transport.name(), "transport installed");
        write(&self.transports).insert(protocol, transport);
    }

    /// Whether a transport for `protocol` is installed.
    pub fn has_transport(&self, protocol: Protocol) -> bool {
        read(&self.transports).contains_key(&protocol)
    }

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

    fn republish_local_segment(&self) -> Result<()> {
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

    // ----- Device memory and the aiv transport (see docs/device.md). -----

    /// The device of this engine (created on first call from `config.aiv`: the twin runtime by default), with the `aiv`
    /// transport and the baselines `adxl` (through HiXL) and `ubshmem` (Host-submitted) installed and the device's
    /// exported memory advertised in this engine's descriptor.
    ///
    /// Allocate device memory with `device.allocate(len)`, then `register_memory(buf.addr(), buf.len(),
    /// &device.location())`.
    pub fn device(&self) -> Result<Arc<AivDevice>> {
        let mut slot = lock(&self.device);
        if let Some(device) = &*slot {
            return Ok(device.clone());
        }
        let start_error = |reason: String| EngineError::TransportStart { protocol: Protocol::Aiv, reason };
        let exchange = DescriptorUidExchange { engine: self };
        let mut options = self.config.aiv.clone();
        if options.hixl_host.is_none() {
            options.hixl_host =
                Some(crate::transport::adxl::default_hixl_host(&ProcessEnvironment, &self.config.local_hostname));
        }
        if options.rdma_host.is_none() {
            options.rdma_host = Some(default_rdma_host(&self.config.local_hostname));
        }
        let device = Arc::new(
            AivDevice::open_with_exchange(&options, Some(&exchange)).map_err(|error| start_error(error.to_string()))?,
        );
        let mut advertisement =
            serde_json::to_value(device.advertisement()).map_err(|error| start_error(error.to_string()))?;
        // Keep a published SHMEM unique id: PEs that join later still find it.
        let published = self.local_descriptor().aiv.and_then(|aiv| aiv.get("shmem_uid").cloned());
        if let (Some(uid), Some(object)) = (published, advertisement.as_object_mut()) {
            object.insert("shmem_uid".into(), uid);
        }
        self.set_descriptor_extension(advertisement)?;
        if self.tracer.is_enabled() {
            device
                .transport()
                .set_trace(&self.tracer, true, self.trace_depth.load(Ordering::Relaxed))
                .map_err(|error| start_error(error.to_string()))?;
        }
        // The RDMA route's QP handshake (docs/rdma.md section 7): sent through the metadata service to the peer's
        // handshake server, answered by this transport on ours (every metadata mode runs one).
        let metadata = Arc::downgrade(&self.metadata);
        device.transport().set_connection_sender(Arc::new(move |segment: &str, payload: &serde_json::Value| {
            let metadata = metadata.upgrade().ok_or("the engine's metadata service has shut down")?;
            metadata.send_connection(segment, payload).map_err(|error| error.to_string())
        }));
        // The target side connects only to NICs the initiator's descriptor lists, resolved through this engine's
        // own metadata (docs/rdma.md section 7).
        let metadata = Arc::downgrade(&self.metadata);
        device.transport().set_initiator_resolver(Arc::new(move |name: &str, source, fresh| {
            let metadata = metadata.upgrade().ok_or("the engine's metadata service has shut down")?;
            let descriptor = metadata.resolve_initiator(name, source, fresh)?;
            Ok((descriptor, metadata.is_p2p().then(|| crate::metadata::canonical_ip(source.ip()))))
        }));
        self.metadata.set_connection_handler(Some(device.transport().connection_handler()));
        self.install_transport(Protocol::Aiv, device.transport().clone());
        self.install_transport(Protocol::Adxl, device.adxl().clone());
        self.install_transport(Protocol::AdxlFabric, device.adxl_fabric().clone());
        self.install_transport(Protocol::Ubshmem, device.ubshmem().clone());
        *slot = Some(device.clone());
        Ok(device)
    }

    /// Registers the device memory with the NIC again (new keys, the old registrations withdrawn) and republishes
    /// the descriptor with the new rkeys; peers use them once they refresh the segment. Fails when the device has no
    /// RDMA route.
    pub fn refresh_rdma_registration(&self) -> Result<()> {
        let device = self.device()?;
        device
            .transport()
            .rdma_reregister()
            .map_err(|error| EngineError::TransportStart { protocol: Protocol::Aiv, reason: error.to_string() })?;
        self.republish_local_segment()
    }

    /// The `shmem_uid` another engine published in its descriptor's `aiv` object (see [`DescriptorUidExchange`]), or
    /// why there is none yet: the fetch's error, or what the descriptor lacked.
    fn published_shmem_uid(&self, segment: &str) -> std::result::Result<[u8; 136], String> {
        use base64::Engine as _;
        let descriptor = self.metadata.fetch(segment).map_err(|error| format!("the fetch failed: {error}"))?;
        let aiv = descriptor.aiv.as_ref().ok_or("the descriptor has no aiv object")?;
        let text = aiv.get("shmem_uid").ok_or("its aiv object has no shmem_uid")?;
        let text = text.as_str().ok_or("its shmem_uid is not a string")?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|error| format!("its shmem_uid is not base64: {error}"))?;
        let length = bytes.len();
        bytes.try_into().map_err(|_| format!("its shmem_uid holds {length} bytes, not 136"))
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

    /// Opens a segment by name; the engine's own name is [`SegmentId::LOCAL`]. An already-open name returns its id.
    pub fn open_segment(&self, name: &str) -> Result<SegmentId> {
        if name == self.name {
            return Ok(SegmentId::LOCAL);
        }
        if let Some(id) = read(&self.segments).id_of(name) {
            return Ok(id);
        }
        let descriptor = self.metadata.fetch(name)?;
        let mut segments = write(&self.segments);
        if let Some(id) = segments.id_of(name) {
            return Ok(id);
        }
        let id = segments.next_id();
        let mut segment = Segment::from_descriptor(id, descriptor)
            .map_err(|reason| EngineError::SegmentNotFound { name: name.to_owned(), reason })?;
        // Cache under the name the caller used (a peer may call itself differently, e.g. localhost vs 127.0.0.1),
        // so opening the same name again hits the cache.
        segment.name = name.to_owned();
        tracing::debug!(name, id = id.0, buffers = segment.buffers.len(), "segment opened");
        segments.insert(Arc::new(segment));
        Ok(id)
    }

    /// Fetches the descriptor of an open segment again and replaces the cached one.
    pub fn refresh_segment(&self, id: SegmentId) -> Result<()> {
        if id == SegmentId::LOCAL {
            return Ok(());
        }
        let name = self.segment(id)?.name.clone();
        let descriptor = self.metadata.fetch(&name)?;
        let mut segment = Segment::from_descriptor(id, descriptor)
            .map_err(|reason| EngineError::SegmentNotFound { name: name.clone(), reason })?;
        segment.name = name;
        write(&self.segments).insert(Arc::new(segment));
        Ok(())
    }

    /// Marks segment `name` as one a transfer to failed: the next [`Self::refresh_if_suspect`] for it fetches its
    /// descriptor again. A peer restarted under the same name (the same RPC port in P2P mode, the same name in a
    /// store) then is found with its new data port, device and buffers. The Python binding and `aiv bench --mode
    /// initiator` mark a segment after a failed transfer and refresh before the next submission to it.
    pub fn suspect_segment(&self, name: &str) {
        lock(&self.suspect_segments).insert(name.to_owned());
    }

    /// Fetches the descriptor of segment `name` again if it was marked by [`Self::suspect_segment`] since the last
    /// fetch (clearing the mark); whether a new descriptor replaced the cached one. A fetch that fails (the peer is
    /// still gone) keeps the cached descriptor, so transfers fail as they would without it (and mark it again).
    pub fn refresh_if_suspect(&self, name: &str) -> bool {
        if !lock(&self.suspect_segments).remove(name) {
            return false;
        }
        match self.open_segment(name).and_then(|id| self.refresh_segment(id)) {
            Ok(()) => {
                tracing::debug!(segment = %name, "descriptor fetched again after a failed transfer");
                true
            }
            Err(error) => {
                tracing::debug!(segment = %name, %error, "descriptor kept: fetching it again failed");
                false
            }
        }
    }

    /// Forgets an open segment.
    pub fn close_segment(&self, id: SegmentId) -> Result<()> {
        if id == SegmentId::LOCAL {
            return Ok(());
        }
        write(&self.segments)
            .remove(id)
            .map(drop)
            .ok_or(EngineError::UnknownSegment { operation: "close segment", id: id.0 })
    }

    /// The open segment `id`.
    pub fn segment(&self, id: SegmentId) -> Result<Arc<Segment>> {
        if id == SegmentId::LOCAL {
            return Ok(read(&self.local_segment).clone());
        }
        read(&self.segments).get(id).cloned().ok_or(EngineError::UnknownSegment { operation: "segment", id: id.0 })
    }

    /// Allocates a batch that holds up to `capacity` requests over all its submissions.
    pub fn allocate_batch(&self, capacity: usize) -> Result<BatchId> {
        if capacity == 0 {
            return Err(EngineError::InvalidArgument {
                operation: "allocate batch",
                reason: "capacity is zero".into(),
            });
        }
        let id = BatchId(self.next_batch.fetch_add(1, Ordering::Relaxed));
        lock(&self.batches).insert(id, Arc::new(Batch::new(capacity)));
        Ok(id)
    }

    fn batch(&self, operation: &'static str, id: BatchId) -> Result<Arc<Batch>> {
        lock(&self.batches).get(&id).cloned().ok_or(EngineError::UnknownBatch { operation, id: id.0 })
    }

    /// Submits requests to a batch; may be called several times per batch.
    ///
    /// Fails as a whole only for an unknown batch or with TooManyRequests. Each request is then checked on its own;
    /// one that fails its checks becomes a FAILED task with the reason (see [`Self::task_reason`]) and touches no
    /// memory, while the others proceed.
    pub fn submit_transfer(&self, batch_id: BatchId, requests: &[TransferRequest]) -> Result<()> {
        let batch = self.batch("submit transfer", batch_id)?;
        // By transport, in the order of their first request (a batch rarely uses more than one or two).
        let mut by_transport: Vec<(Arc<dyn Transport>, Vec<Transfer>)> = Vec::new();
        let mut cache = RouteCache::default();
        {
            let mut tasks = batch.tasks();
            if tasks.len() + requests.len() > batch.capacity {
                return Err(EngineError::TooManyRequests {
                    batch: batch_id.0,
                    capacity: batch.capacity,
                    submitted: tasks.len(),
                    requested: requests.len(),
                });
            }
            let deadline = deadline_after(self.config.aiv.transfer_timeout);
            for request in requests {
                match self.route(request, &mut cache) {
                    Ok((transport, target)) => {
                        let slot = Arc::new(TaskSlot::new(deadline, batch.signal.clone()));
                        tasks.push(slot.clone());
                        let transfer = Transfer {
                            opcode: request.opcode,
                            local_addr: request.source,
                            remote_addr: request.target_offset,
                            length: request.length,
                            target,
                            slot,
                        };
                        let key = Arc::as_ptr(&transport) as *const ();
                        match by_transport.iter_mut().find(|(known, _)| Arc::as_ptr(known) as *const () == key) {
                            Some((_, transfers)) => transfers.push(transfer),
                            None => by_transport.push((transport, vec![transfer])),
                        }
                    }
                    Err(error) => {
                        tracing::warn!(batch = batch_id.0, task = tasks.len(), %error, "request rejected");
                        tasks.push(Arc::new(TaskSlot::rejected(error.failure(), batch.signal.clone())));
                    }
                }
            }
        }
        let traced = self.tracer.is_enabled();
        for (transport, transfers) in by_transport {
            batch.note_transport(transport.completion_poller());
            if traced {
                batch.note_traced_path(transport.name());
            }
            for transfer in &transfers {
                transfer.slot.mark_pending();
            }
            let (count, start) = (transfers.len() as u64, if traced { crate::trace::now_ns() } else { 0 });
            transport.submit(transfers);
            if traced {
                let end = crate::trace::now_ns();
                self.tracer.host(transport.name(), crate::trace::HostStage::Submit, start, end, batch_id.0, count);
            }
        }
        Ok(())
    }

    /// Checks one request and picks its transport; the error becomes the task's failure. `cache` keeps the last
    /// segment and transport looked up, for the next request of the same submit (most name one segment and one
    /// protocol).
    fn route(
        &self,
        request: &TransferRequest,
        cache: &mut RouteCache,
    ) -> std::result::Result<(Arc<dyn Transport>, Arc<Segment>), RouteError> {
        let protocol = request.protocol.unwrap_or(self.config.protocol);
        let mut target = match &cache.segment {
            Some((id, segment)) if *id == request.target_id => segment.clone(),
            _ => {
                let segment = self.segment(request.target_id).map_err(RouteError::Segment)?;
                cache.segment = Some((request.target_id, segment.clone()));
                segment
            }
        };
        let locate = |segment: &Segment| segment.buffers.find_containing(request.target_offset, request.length).is_ok();
        let mut located = locate(&target);
        if !located && self.may_refresh_stale(request.target_id) {
            // The peer may have registered this memory after the segment was opened, or restarted under the same
            // name with other buffers: its descriptor is fetched once more before the request is refused.
            match self.refresh_segment(request.target_id) {
                Ok(()) => {
                    target = self.segment(request.target_id).map_err(RouteError::Segment)?;
                    cache.segment = Some((request.target_id, target.clone()));
                    located = locate(&target);
                }
                Err(error) => tracing::debug!(segment = %target.name, %error, "descriptor refresh failed"),
            }
        }
        {
            let memory = read(&self.memory);
            let source = memory.find_containing(request.source, request.length).map_err(RouteError::Source)?;
            // The target buffer is looked up again only for its error or, on tcp, its location.
            if !located || protocol == Protocol::Tcp {
                let target_buffer = target
                    .buffers
                    .find_containing(request.target_offset, request.length)
                    .map_err(|error| RouteError::Target { segment: target.name.clone(), error })?;
                if protocol == Protocol::Tcp {
                    Self::check_host_reachable(&source.location, &target_buffer.location)?;
                }
            }
        }
        // A Host-protocol transfer into this process's own segment needs no wire: copy in place.
        if request.target_id == SegmentId::LOCAL && protocol == Protocol::Tcp {
            return Ok((self.local_transport.clone(), target));
        }
        if let Some((known, transport)) = &cache.transport {
            if *known == protocol {
                return Ok((transport.clone(), target));
            }
        }
        if let Some(transport) = read(&self.transports).get(&protocol) {
            cache.transport = Some((protocol, transport.clone()));
            return Ok((transport.clone(), target));
        }
        Err(RouteError::NoTransport { protocol, segment: target.name.clone() })
    }

    /// Whether a request into no buffer of segment `id`'s cached descriptor may fetch it again now (a remote
    /// segment, not refreshed so within [`STALE_REFRESH_INTERVAL`]); records the attempt.
    fn may_refresh_stale(&self, id: SegmentId) -> bool {
        if id == SegmentId::LOCAL {
            return false;
        }
        let mut refreshes = lock(&self.stale_refreshes);
        let now = Instant::now();
        match refreshes.get(&id) {
            Some(last) if now.duration_since(*last) < STALE_REFRESH_INTERVAL => false,
            _ => {
                refreshes.insert(id, now);
                true
            }
        }
    }

    /// Refuses a tcp request whose source or target is device memory (location `npu:<id>`), which the Host's reads
    /// and writes cannot reach (on the twin runtime as on an NPU).
    fn check_host_reachable(source_location: &str, target_location: &str) -> std::result::Result<(), RouteError> {
        for (side, location) in [("source", source_location), ("target", target_location)] {
            if location.starts_with("npu:") {
                return Err(RouteError::DeviceMemoryOverTcp { side, location: location.to_owned() });
            }
        }
        Ok(())
    }

    /// Status of one task (index in submission order).
    pub fn transfer_status(&self, batch_id: BatchId, task: usize) -> Result<TransferStatus> {
        // Completions a polling caller can collect itself (aiv's DCQ) are collected here, as a waiter would.
        self.batch("get transfer status", batch_id)?.poll();
        let slot = self.task(batch_id, task)?;
        Ok(TransferStatus { state: slot.state(), transferred_bytes: slot.transferred_bytes() })
    }

    /// Why a task failed or timed out, if it did.
    pub fn task_reason(&self, batch_id: BatchId, task: usize) -> Result<Option<String>> {
        Ok(self.task(batch_id, task)?.reason())
    }

    /// Why a task failed or timed out, as the typed failure its path recorded.
    pub fn task_failure(&self, batch_id: BatchId, task: usize) -> Result<Option<TransferFailure>> {
        Ok(self.task(batch_id, task)?.failure())
    }

    /// What a finished task recorded about how it was carried.
    pub fn task_evidence(&self, batch_id: BatchId, task: usize) -> Result<Option<TransferEvidence>> {
        Ok(self.task(batch_id, task)?.evidence())
    }

    fn task(&self, batch_id: BatchId, task: usize) -> Result<Arc<TaskSlot>> {
        let batch = self.batch("get transfer status", batch_id)?;
        let tasks = batch.tasks();
        tasks.get(task).cloned().ok_or(EngineError::UnknownTask { batch: batch_id.0, task, submitted: tasks.len() })
    }

    /// Status of a whole batch: COMPLETED if every task completed, FAILED if any failed or timed out.
    pub fn batch_status(&self, batch_id: BatchId) -> Result<TransferStatus> {
        let batch = self.batch("get batch status", batch_id)?;
        batch.poll();
        Ok(batch.status())
    }

    /// Blocks until every task of the batch is terminal (bounded by the transfer timeout) and returns its status.
    pub fn wait_batch(&self, batch_id: BatchId) -> Result<TransferStatus> {
        self.wait_batch_until(batch_id, None)
    }

    /// As [`Self::wait_batch`], returning after `timeout` at the latest: the status is then PENDING if some task is
    /// still running (the wait is bounded by the transfer timeout too, so a `timeout` beyond it changes nothing).
    pub fn wait_batch_for(&self, batch_id: BatchId, timeout: Duration) -> Result<TransferStatus> {
        self.wait_batch_until(batch_id, Some(deadline_after(timeout)))
    }

    fn wait_batch_until(&self, batch_id: BatchId, until: Option<Instant>) -> Result<TransferStatus> {
        let batch = self.batch("wait batch", batch_id)?;
        let Some(path) = batch.traced_path() else { return Ok(batch.wait(until)) };
        let start = crate::trace::now_ns();
        let status = batch.wait(until);
        let end = crate::trace::now_ns();
        let tasks = batch.tasks().len() as u64;
        let id = batch_id.0;
        if let Some((at, thread)) = batch.signal.last_notify() {
            self.tracer.host_on(thread, path, crate::trace::HostStage::CompletionSeen, at, at, id, tasks);
        }
        self.tracer.host(path, crate::trace::HostStage::Wait, start, end, id, tasks);
        self.tracer.host(path, crate::trace::HostStage::Woken, end, end, id, tasks);
        Ok(status)
    }

    /// Switches per-stage tracing on or off (docs/trace.md; off by default). On: every batch submitted from now on
    /// records its Host events (submit, completion seen, wait and caller woken), the aiv path's blocks record their
    /// kernel stages into trace rings (allocated now, or when the device opens), and on the twin runtime linked into
    /// this process the SDMA engines record their runs (switched per device). [`Self::take_trace`]
    /// collects what was recorded.
    pub fn set_trace(&self, on: bool) -> Result<()> {
        self.tracer.set_enabled(on);
        let device = lock(&self.device).clone();
        if self.twin_in_process() {
            cann_twin::control::record_engine_runs(self.config.aiv.device_id as i32, on);
        }
        if let Some(device) = device {
            device
                .transport()
                .set_trace(&self.tracer, on, self.trace_depth.load(Ordering::Relaxed))
                .map_err(|error| EngineError::TransportStart { protocol: Protocol::Aiv, reason: error.to_string() })?;
        }
        Ok(())
    }

    /// Entries of each aiv block's trace ring (a power of two >= 2), used when tracing first allocates them (default
    /// [`crate::transport::aiv::DEFAULT_TRACE_DEPTH`]).
    pub fn set_trace_ring_depth(&self, depth: u32) {
        self.trace_depth.store(depth, Ordering::Relaxed);
    }

    /// Whether the device backend is the twin runtime linked into this process (its control API reaches it).
    fn twin_in_process(&self) -> bool {
        self.config.aiv.device_backend == crate::config::DeviceBackendKind::Twin
    }

    /// Everything traced since the last call: the Host events, the aiv kernels' stages (each block's trace ring
    /// drained until it stays empty for 2 ms, at most 100 ms: the kernel publishes its trace just after the DCQ), and
    /// on the twin runtime in this process the SDMA engine runs of this engine's device, put on the Host's clock
    /// with a pair of readings of both clocks.
    pub fn take_trace(&self) -> crate::trace::TraceLog {
        let device = lock(&self.device).clone();
        if let Some(device) = &device {
            let deadline = Instant::now() + Duration::from_millis(100);
            loop {
                std::thread::sleep(Duration::from_millis(2));
                if device.transport().drain_traces() == 0 || Instant::now() >= deadline {
                    break;
                }
            }
        }
        if self.twin_in_process() {
            let before = crate::trace::now_ns();
            let twin = cann_twin::control::clock_ns();
            let after = crate::trace::now_ns();
            let offset = (before / 2 + after / 2) as i128 - i128::from(twin);
            let (runs, dropped) = cann_twin::control::take_engine_runs(self.config.aiv.device_id as i32);
            let to_host = |ns: u64| (i128::from(ns) + offset).max(0) as u64;
            self.tracer.engine_runs(
                runs.into_iter().map(|run| crate::trace::EngineRunEvent {
                    device: run.device,
                    channel: run.channel,
                    start_ns: to_host(run.start_ns),
                    end_ns: to_host(run.end_ns),
                    sqes: run.sqes,
                }),
                dropped,
            );
            self.tracer.note(
                "engine_track",
                format!(
                    "twin runtime: SDMA engine runs from cann_twin::control, on the Host clock by one pair of \
                     readings (error at most {} ns)",
                    after - before
                ),
            );
            self.tracer.note("runtime", "twin runtime (a CPU model; device timestamps unverified on hardware)");
        } else {
            self.tracer.note("engine_track", "not recorded: the vendor's runtime exposes no SDMA engine runs");
            self.tracer.note("runtime", "vendor runtime");
        }
        self.tracer.take()
    }

    /// Frees a batch; BatchBusy while any of its tasks is pending.
    pub fn free_batch(&self, batch_id: BatchId) -> Result<()> {
        let mut batches = lock(&self.batches);
        let batch =
            batches.get(&batch_id).ok_or(EngineError::UnknownBatch { operation: "free batch", id: batch_id.0 })?;
        let pending = batch.pending();
        if pending > 0 {
            return Err(EngineError::BatchBusy { batch: batch_id.0, pending });
        }
        batches.remove(&batch_id);
        Ok(())
    }

    // ----- The helpers users know from Mooncake's Python `TransferEngine`. -----

    /// Reads `length` bytes at `peer_addr` of segment `target` into local `buffer`, and waits.
    pub fn transfer_sync_read(&self, target: &str, buffer: u64, peer_addr: u64, length: u64) -> Result<()> {
        self.batch_transfer_sync(Opcode::Read, target, &[buffer], &[peer_addr], &[length])
    }

    /// Writes `length` bytes of local `buffer` to `peer_addr` of segment `target`, and waits.
    pub fn transfer_sync_write(&self, target: &str, buffer: u64, peer_addr: u64, length: u64) -> Result<()> {
        self.batch_transfer_sync(Opcode::Write, target, &[buffer], &[peer_addr], &[length])
    }

    /// Reads several ranges and waits for all of them.
    pub fn batch_transfer_sync_read(
        &self,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<()> {
        self.batch_transfer_sync(Opcode::Read, target, buffers, peer_addrs, lengths)
    }

    /// Writes several ranges and waits for all of them.
    pub fn batch_transfer_sync_write(
        &self,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<()> {
        self.batch_transfer_sync(Opcode::Write, target, buffers, peer_addrs, lengths)
    }

    /// Starts reading several ranges; poll with [`Self::get_batch_transfer_status`], then [`Self::free_batch`].
    pub fn batch_transfer_async_read(
        &self,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<BatchId> {
        self.batch_transfer_async(Opcode::Read, target, buffers, peer_addrs, lengths)
    }

    /// Starts writing several ranges; poll with [`Self::get_batch_transfer_status`], then [`Self::free_batch`].
    pub fn batch_transfer_async_write(
        &self,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<BatchId> {
        self.batch_transfer_async(Opcode::Write, target, buffers, peer_addrs, lengths)
    }

    /// Status of several batches at once.
    pub fn get_batch_transfer_status(&self, batch_ids: &[BatchId]) -> Vec<Result<TransferStatus>> {
        batch_ids.iter().map(|&id| self.batch_status(id)).collect()
    }

    /// Address of the first buffer of a segment (its lowest address). A segment cached with no buffer is fetched
    /// again first, rate-limited like a transfer's stale-descriptor refresh.
    pub fn get_first_buffer_address(&self, target: &str) -> Result<u64> {
        let id = self.open_segment(target)?;
        let mut segment = self.segment(id)?;
        if segment.buffers.iter().next().is_none() && self.may_refresh_stale(id) {
            // A peer publishes its descriptor before it registers memory: one opened in between is cached with no
            // buffer, so it is fetched again (at most once per STALE_REFRESH_INTERVAL) before the call fails.
            match self.refresh_segment(id) {
                Ok(()) => segment = self.segment(id)?,
                Err(error) => tracing::debug!(segment = %target, %error, "descriptor refresh failed"),
            }
        }
        let first = segment.buffers.iter().next().map(|buffer| buffer.addr);
        first.ok_or_else(|| EngineError::SegmentNotFound {
            name: target.to_owned(),
            reason: "the segment exposes no buffer".into(),
        })
    }

    fn batch_transfer_async(
        &self,
        opcode: Opcode,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<BatchId> {
        self.batch_transfer_async_over(opcode, target, buffers, peer_addrs, lengths, None)
    }

    /// Starts `buffers.len()` transfers in one direction to segment `target` in a new batch, each over `protocol`
    /// (`None`: the configured protocol). Refuses lists of different lengths and an empty list; a batch whose
    /// submission is refused is freed.
    pub fn batch_transfer_async_over(
        &self,
        opcode: Opcode,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
        protocol: Option<Protocol>,
    ) -> Result<BatchId> {
        let operation = "batch transfer";
        if buffers.len() != peer_addrs.len() || buffers.len() != lengths.len() {
            return Err(EngineError::InvalidArgument {
                operation,
                reason: format!(
                    "{} buffers, {} peer addresses and {} lengths: the lists must have one length",
                    buffers.len(),
                    peer_addrs.len(),
                    lengths.len()
                ),
            });
        }
        if buffers.is_empty() {
            return Err(EngineError::InvalidArgument { operation, reason: "no transfer given".into() });
        }
        let target_id = self.open_segment(target)?;
        let requests: Vec<TransferRequest> = (0..buffers.len())
            .map(|i| TransferRequest {
                opcode,
                source: buffers[i],
                target_id,
                target_offset: peer_addrs[i],
                length: lengths[i],
                protocol,
            })
            .collect();
        let batch = self.allocate_batch(requests.len())?;
        if let Err(error) = self.submit_transfer(batch, &requests) {
            let _ = self.free_batch(batch);
            return Err(error);
        }
        Ok(batch)
    }

    fn batch_transfer_sync(
        &self,
        opcode: Opcode,
        target: &str,
        buffers: &[u64],
        peer_addrs: &[u64],
        lengths: &[u64],
    ) -> Result<()> {
        let batch = self.batch_transfer_async(opcode, target, buffers, peer_addrs, lengths)?;
        let status = self.wait_batch(batch)?;
        let result = if status.state == TransferState::Completed {
            Ok(())
        } else {
            let batch_ref = self.batch("wait batch", batch)?;
            let reason = batch_ref
                .tasks()
                .iter()
                .enumerate()
                .find_map(|(index, task)| task.reason().map(|reason| format!("task {index}: {reason}")))
                .unwrap_or_else(|| "no reason recorded".into());
            Err(EngineError::TransferFailed {
                operation: opcode.as_str(),
                segment: target.to_owned(),
                state: status.state,
                transferred: status.transferred_bytes,
                reason,
            })
        };
        // The wait above is bounded and leaves every task terminal, so the batch is free-able.
        self.free_batch(batch)?;
        result
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        // Removes the descriptor and rpc_meta and stops the handshake server (bounded waits); the aiv transport no
        // longer answers QP handshakes.
        self.metadata.set_connection_handler(None);
        self.metadata.withdraw();
    }
}

fn tcp_start_error(error: crate::transport::tcp::TcpError) -> EngineError {
    EngineError::TransportStart { protocol: Protocol::Tcp, reason: error.to_string() }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn lock<T>(lock: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// SHMEM's unique id carried over the metadata channel (CANN backend with more than one PE): PE 0 publishes it as
/// `"aiv": {"shmem_uid": "<base64 of 136 bytes>"}` in its own segment descriptor before `aclshmemx_init_attr`; the
/// other PEs poll the descriptor of the segment named by `AIV_SHMEM_ROOT_SEGMENT` until it appears. The `aiv` object
/// is replaced by the device advertisement once the device is up.
struct DescriptorUidExchange<'a> {
    engine: &'a TransferEngine,
}

impl crate::device::UniqueIdExchange for DescriptorUidExchange<'_> {
    fn publish(&self, uid: &[u8; 136]) -> std::result::Result<(), String> {
        use base64::Engine as _;
        let text = base64::engine::general_purpose::STANDARD.encode(uid);
        self.engine
            .set_descriptor_extension(serde_json::json!({ "shmem_uid": text }))
            .map_err(|error| error.to_string())
    }

    fn fetch(&self, timeout: std::time::Duration) -> std::result::Result<[u8; 136], String> {
        let root = std::env::var("AIV_SHMEM_ROOT_SEGMENT")
            .map_err(|_| "AIV_SHMEM_ROOT_SEGMENT (the segment name of SHMEM PE 0's engine) is not set".to_string())?;
        let deadline = deadline_after(timeout);
        let mut polls = 0u64;
        loop {
            polls += 1;
            let why = match self.engine.published_shmem_uid(&root) {
                Ok(uid) => return Ok(uid),
                Err(why) => why,
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "segment {root:?} published no aiv.shmem_uid within {timeout:?} ({polls} polls; the last: {why})"
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// `timeout` from now, saturated a century ahead where the clock cannot represent it: a configured budget never
/// panics the submitting thread.
/// The IP address the device's NIC listens on by default: the host part of `local_hostname` if it is an IP address,
/// else the first IPv4 address it resolves to, else 127.0.0.1.
fn default_rdma_host(local_hostname: &str) -> String {
    let host = crate::metadata::SegmentName::parse(local_hostname)
        .map(|name| name.host)
        .unwrap_or_else(|_| local_hostname.trim().to_owned());
    if host.parse::<std::net::IpAddr>().is_ok() {
        return host;
    }
    use std::net::ToSocketAddrs;
    (host.as_str(), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.find(|address| address.is_ipv4()))
        .map_or_else(|| "127.0.0.1".to_owned(), |address| address.ip().to_string())
}

pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600))).unwrap_or(now)
}
