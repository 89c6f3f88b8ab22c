//! One engine's metadata service: its handshake server, its segment name, and the backend its connection string
//! picked. The engine talks to metadata only through this.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::etcd::EtcdStore;
use super::handshake::{Frame, FrameKind, HandshakeClient, HandshakeServer, HandshakeState, Notification};
use super::http::HttpStore;
use super::p2p::P2pBackend;
use super::store::{KeyLayout, StoreBackend};
use super::{MetadataBackend, MetadataConnection, MetadataOptions, RpcMeta, SegmentDescriptor, SegmentName};
use crate::config::EngineConfig;
use crate::error::{EngineError, Result};

/// The metadata side of one engine; withdraws its keys and stops its handshake server when dropped.
#[derive(Debug)]
pub struct MetadataService {
    connection: MetadataConnection,
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
    /// through its `rpc_meta`, and returns the reply payload. Bounded by the client's deadline; never retried.
    pub fn send_connection(&self, peer: &str, payload: &serde_json::Value) -> Result<serde_json::Value> {
        let rpc = self.fetch_rpc_meta(peer)?;
        let request = Frame::typed(FrameKind::Connection, payload.to_string());
        let reply = self.client.exchange(&rpc.ip_or_host_name, rpc.rpc_port, &request)?;
        serde_json::from_slice(&reply.payload).map_err(|error| EngineError::Handshake {
            peer: SegmentName::with_port(&rpc.ip_or_host_name, rpc.rpc_port),
            operation: "connection handshake",
            reason: format!("the reply is not JSON: {error}"),
        })
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

impl Drop for MetadataService {
    fn drop(&mut self) {
        self.withdraw();
    }
}
