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
//!
//! The engine's methods by concern: this file holds [`TransferEngine`], its start and its transports;
//! `registration` local memory and the published descriptor; `device_start` the device and its paths, with SHMEM's
//! unique id carried through the descriptor; `open_segments` peers' segments; `submit` batches and the checks and
//! routing of every request; `status` task and batch status, waits, freeing; `trace_control` per-stage tracing;
//! `mooncake_api` the helpers of Mooncake's Python `TransferEngine`.

mod adxl_client;
mod batch;
mod device;
mod device_start;
mod mooncake_api;
mod open_segments;
mod registration;
mod segment;
mod status;
mod submit;
mod trace_control;

pub use adxl_client::{AdxlClient, AdxlRequest, AdxlTransferStatus, TransferOpDesc};
pub use device::AivDevice;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use batch::Batch;
use segment::SegmentTable;

use crate::config::{EngineConfig, ProcessEnvironment};
use crate::error::{EngineError, Result};
use crate::metadata::{MetadataOptions, MetadataService, SegmentDescriptor};
use crate::transfer::{BatchId, BufferSet, Protocol, Segment, SegmentId};
use crate::transport::local::LocalTransport;
use crate::transport::Transport;

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

/// `timeout` from now, saturated a century ahead where the clock cannot represent it: a configured budget never
/// panics the submitting thread.
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600))).unwrap_or(now)
}
