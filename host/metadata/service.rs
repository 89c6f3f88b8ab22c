//! One engine's metadata service: its handshake server, its segment name, and the backend its connection string
//! picked. The engine talks to metadata only through this. It also resolves the initiator of a Connection handshake
//! for the transport that answers it ([`MetadataService::resolve_initiator`]): through the store, or in P2P mode only
//! from the handshake's own source host, cached for [`INITIATOR_CACHE_TTL`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::etcd::EtcdStore;
use super::handshake::{Frame, FrameKind, HandshakeClient, HandshakeServer, HandshakeState, Notification};
use super::http::HttpStore;
use super::p2p::P2pBackend;
use super::store::{KeyLayout, StoreBackend};
use super::{MetadataBackend, MetadataConnection, MetadataOptions, RpcMeta, SegmentDescriptor, SegmentName};
use crate::config::EngineConfig;
use crate::error::{EngineError, Result};

/// How long a descriptor resolved for a Connection handshake's initiator is reused: one QP handshake per block and
/// peer arrives in a burst, and one lookup serves them all.
pub const INITIATOR_CACHE_TTL: Duration = Duration::from_secs(2);
/// Initiators' descriptors cached at most (the oldest goes first).
const INITIATOR_CACHE_ENTRIES: usize = 64;

/// The metadata side of one engine; withdraws its keys and stops its handshake server when dropped.
#[derive(Debug)]
pub struct MetadataService {
    connection: MetadataConnection,
    /// Descriptors of Connection handshake initiators, by name, with when they were fetched.
    initiators: Mutex<HashMap<String, (Instant, SegmentDescriptor)>>,
    backend: Box<dyn MetadataBackend>,
    handshake: HandshakeServer,
    segment_name: String,
    rpc_meta: RpcMeta,
    client: HandshakeClient,
    withdrawn: AtomicBool,
}

impl MetadataService {
    /// Starts the handshake server, names the segment and publishes `rpc_meta`.
    ///
    /// Naming follows Mooncake: with `P2PHANDSHAKE` the name is `host:<rpc port>` (host from `local_hostname`, any
    /// port given there ignored, the RPC port drawn at random from `options.rpc_ports`); with a store the name is
    /// `local_hostname` as given and `rpc_meta` says where the handshake server listens. The server binds the host
    /// of `local_hostname` (or `MC_TCP_BIND_ADDRESS` with a store), never all interfaces.
    pub fn start(config: &EngineConfig, options: &MetadataOptions) -> Result<MetadataService> {
        let connection = MetadataConnection::parse(&config.metadata_server)?;
        let local = SegmentName::parse(&config.local_hostname).map_err(|error| EngineError::Metadata {
            operation: "name local segment",
            reason: format!("local_hostname: {error}"),
        })?;
        let bind_host = match (&connection, options.rpc_bind_address.as_deref()) {
            (MetadataConnection::P2pHandshake, _) | (_, None) => local.host.clone(),
            (_, Some(address)) => address.trim().to_owned(),
        };
        let state = Arc::new(HandshakeState::default());
        let handshake = HandshakeServer::bind_with(
            &bind_host,
            options.rpc_ports.clone(),
            state.clone(),
            config.aiv.handshake.clone(),
        )?;
        let rpc_port = handshake.local_addr().port();
        let rpc_meta = RpcMeta { ip_or_host_name: bind_host.clone(), rpc_port };
        let keys = KeyLayout::new(options.cluster_id.as_deref());
        // The file's values win over the environment's (MetadataOptions::from_env).
        let connect_timeout = config.aiv.metadata_connect_timeout.unwrap_or(options.client_connect_timeout);
        let deadline = config.aiv.metadata_deadline.unwrap_or(options.client_deadline);
        let client = HandshakeClient { connect_timeout, deadline };
        let (segment_name, backend): (String, Box<dyn MetadataBackend>) = match &connection {
            MetadataConnection::P2pHandshake => {
                (SegmentName::with_port(&local.host, rpc_port), Box::new(P2pBackend::new(state, client)))
            }
            MetadataConnection::Http { url } => (
                config.local_hostname.trim().to_owned(),
                Box::new(StoreBackend::new(HttpStore::with_timeouts(url, connect_timeout, deadline), keys)),
            ),
            MetadataConnection::Etcd { endpoints } => (
                config.local_hostname.trim().to_owned(),
                Box::new(StoreBackend::new(
                    EtcdStore::with_timeouts(endpoints.clone(), connect_timeout, deadline),
                    keys,
                )),
            ),
        };
        backend.publish_rpc_meta(&segment_name, &rpc_meta)?;
        tracing::info!(segment = %segment_name, rpc = %handshake.local_addr(), metadata = ?connection, "metadata service started");
        Ok(MetadataService {
            initiators: Mutex::new(HashMap::new()),
            connection,
            backend,
            handshake,
            segment_name,
            rpc_meta,
            client,
            withdrawn: AtomicBool::new(false),
        })
    }

    /// The engine's segment name.
    pub fn segment_name(&self) -> &str {
        &self.segment_name
    }

    /// Where this engine's handshake server listens (what `rpc_meta` says).
    pub fn rpc_meta(&self) -> &RpcMeta {
        &self.rpc_meta
    }

    /// The socket address the handshake server is bound to.
    pub fn rpc_address(&self) -> std::net::SocketAddr {
        self.handshake.local_addr()
    }

    /// The backend the connection string picked.
    pub fn connection(&self) -> &MetadataConnection {
        &self.connection
    }

    /// Publishes the engine's descriptor (stamped with the current time) to the backend and the handshake server.
    pub fn publish(&self, descriptor: &SegmentDescriptor) -> Result<()> {
        let mut stamped = descriptor.clone();
        stamped.timestamp = crate::transfer::descriptor::timestamp_now();
        self.handshake.state().set_descriptor(Some(stamped.clone()));
        self.backend.publish(&stamped)
    }

    /// Fetches a peer's descriptor.
    pub fn fetch(&self, name: &str) -> Result<SegmentDescriptor> {
        self.backend.fetch(name)
    }

    /// Where a peer's handshake server listens (its `rpc_meta`; in P2P mode, its name).
    pub fn fetch_rpc_meta(&self, name: &str) -> Result<RpcMeta> {
        self.backend.fetch_rpc_meta(name)
    }

    /// Notify messages peers sent to this engine, oldest first.
    pub fn take_notifications(&self) -> Vec<Notification> {
        self.handshake.state().take_notifications()
    }

    /// Sends a Notify message to the engine serving segment `peer`, found through its `rpc_meta` (Mooncake's
    /// `sendNotifyByName`); the peer must answer `{"notify_msg": "success"}`.
    pub fn send_notification(&self, peer: &str, message: &str) -> Result<()> {
        let rpc = self.fetch_rpc_meta(peer)?;
        let payload = serde_json::json!({"name": self.segment_name, "notify_msg": message}).to_string();
        let request = Frame::typed(FrameKind::Notify, payload);
        let reply = self.client.exchange(&rpc.ip_or_host_name, rpc.rpc_port, &request)?;
        let answer: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap_or_default();
        if answer.get("notify_msg").and_then(serde_json::Value::as_str) == Some("success") {
            Ok(())
        } else {
            Err(EngineError::Handshake {
                peer: SegmentName::with_port(&rpc.ip_or_host_name, rpc.rpc_port),
                operation: "send notification",
                reason: format!("the peer did not accept it: {:?}", String::from_utf8_lossy(&reply.payload)),
            })
        }
    }

    /// Sets (or clears) what answers Connection requests on this engine's handshake server (the aiv transport's
    /// RDMA route registers its QP handler here).
    pub fn set_connection_handler(&self, handler: Option<Arc<super::handshake::ConnectionHandler>>) {
        self.handshake.state().set_connection_handler(handler);
    }

    /// Sends a Connection handshake (Mooncake's `HandShakeDesc` JSON) to the engine serving segment `peer`, found
    /// through its `rpc_meta`, and returns the reply payload. The request carries this engine's segment name as
    /// `local_server_name`: the target resolves this engine's descriptor by it ([`MetadataService::resolve_initiator`]).
    /// Bounded by the client's deadline; never retried.
    pub fn send_connection(&self, peer: &str, payload: &serde_json::Value) -> Result<serde_json::Value> {
        let rpc = self.fetch_rpc_meta(peer)?;
        let mut payload = payload.clone();
        if let Some(object) = payload.as_object_mut() {
            object.insert("local_server_name".into(), self.segment_name.clone().into());
        }
        let request = Frame::typed(FrameKind::Connection, payload.to_string());
        let reply = self.client.exchange(&rpc.ip_or_host_name, rpc.rpc_port, &request)?;
        serde_json::from_slice(&reply.payload).map_err(|error| EngineError::Handshake {
            peer: SegmentName::with_port(&rpc.ip_or_host_name, rpc.rpc_port),
            operation: "connection handshake",
            reason: format!("the reply is not JSON: {error}"),
        })
    }

    /// The descriptor of the engine named `name` that sent a Connection handshake from `source`, through this
    /// engine's own metadata, or why it cannot be trusted or found. With a store (HTTP, etcd) the store says; in P2P
    /// mode the name is `host:rpc_port`, its host must be `source`'s address (checked before anything is fetched, so
    /// the only lookup goes back to the sender's own host) and the descriptor comes from that handshake server.
    /// A descriptor fetched within [`INITIATOR_CACHE_TTL`] is reused unless `fresh`. Bounded by the metadata
    /// client's deadline.
    pub fn resolve_initiator(
        &self,
        name: &str,
        source: SocketAddr,
        fresh: bool,
    ) -> std::result::Result<SegmentDescriptor, String> {
        if name.is_empty() {
            return Err("the request names no local_server_name (the initiator's segment name)".into());
        }
        if matches!(self.connection, MetadataConnection::P2pHandshake) {
            check_p2p_source(name, source.ip())?;
        }
        let cached = |cache: &HashMap<String, (Instant, SegmentDescriptor)>| {
            cache.get(name).filter(|(at, _)| at.elapsed() < INITIATOR_CACHE_TTL).map(|(_, d)| d.clone())
        };
        if !fresh {
            if let Some(descriptor) = cached(&self.initiators.lock().unwrap_or_else(|p| p.into_inner())) {
                return Ok(descriptor);
            }
        }
        let descriptor =
            self.fetch(name).map_err(|error| format!("the initiator's descriptor {name:?} was not found: {error}"))?;
        let mut cache = self.initiators.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= INITIATOR_CACHE_ENTRIES && !cache.contains_key(name) {
            let oldest = cache.iter().min_by_key(|(_, (at, _))| *at).map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                cache.remove(&oldest);
            }
        }
        cache.insert(name.to_owned(), (Instant::now(), descriptor.clone()));
        Ok(descriptor)
    }

    /// Whether this engine finds peers by P2P handshake (no store): peers then vouch only for their own host.
    pub fn is_p2p(&self) -> bool {
        matches!(self.connection, MetadataConnection::P2pHandshake)
    }

    /// Removes the descriptor and `rpc_meta`, and stops the handshake server. Idempotent; failures are logged.
    pub fn withdraw(&self) {
        if self.withdrawn.swap(true, Ordering::AcqRel) {
            return;
        }
        self.handshake.state().set_descriptor(None);
        if let Err(error) = self.backend.remove(&self.segment_name) {
            tracing::warn!(segment = %self.segment_name, %error, "could not withdraw the segment descriptor");
        }
        if let Err(error) = self.backend.remove_rpc_meta(&self.segment_name) {
            tracing::warn!(segment = %self.segment_name, %error, "could not withdraw rpc_meta");
        }
        self.handshake.stop();
        tracing::debug!(segment = %self.segment_name, "metadata withdrawn");
    }
}

/// The same address, an IPv4-mapped IPv6 address taken as its IPv4 one.
pub(crate) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// In P2P mode a handshake's initiator `name` (`host:rpc_port`) must name the host the handshake came from: its host
/// is `source`, or resolves to it.
fn check_p2p_source(name: &str, source: IpAddr) -> std::result::Result<(), String> {
    let parsed = SegmentName::parse(name).map_err(|error| format!("local_server_name {name:?}: {error}"))?;
    let Some(port) = parsed.port else {
        return Err(format!("local_server_name {name:?} is not host:rpc_port (P2P handshake names are)"));
    };
    let source = canonical_ip(source);
    let matches = match parsed.host.parse::<IpAddr>() {
        Ok(ip) => canonical_ip(ip) == source,
        Err(_) => (parsed.host.as_str(), port)
            .to_socket_addrs()
            .map(|mut addresses| addresses.any(|address| canonical_ip(address.ip()) == source))
            .unwrap_or(false),
    };
    if matches {
        Ok(())
    } else {
        Err(format!(
            "local_server_name {name:?} names another host than the handshake's source {source}: with P2P handshake \
             metadata an initiator vouches only for its own host"
        ))
    }
}

impl Drop for MetadataService {
    fn drop(&mut self) {
        self.withdraw();
    }
}
