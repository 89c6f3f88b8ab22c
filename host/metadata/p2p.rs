//! The `P2PHANDSHAKE` backend: no store at all. A segment's name is the address of its owner's handshake server
//! (`host:rpc_port`), opening it is a Metadata exchange with that server, and publishing means updating what the
//! local handshake server answers.
//!
//! Engines of one process find each other the same way, through their handshake servers on loopback: there is no
//! in-process shortcut, so what a test of two engines in one process exercises is the wire a remote peer sees.

use std::sync::Arc;

use super::handshake::{Frame, FrameKind, HandshakeClient, HandshakeState};
use super::{MetadataBackend, RpcMeta, SegmentDescriptor, SegmentName};
use crate::error::{EngineError, Result};

/// Peers found by handshake.
#[derive(Debug)]
pub struct P2pBackend {
    /// What the local handshake server serves (our descriptor, sent along with each Metadata request).
    local: Arc<HandshakeState>,
    client: HandshakeClient,
}

impl P2pBackend {
    /// A backend whose local descriptor is the one `local` serves.
    pub fn new(local: Arc<HandshakeState>, client: HandshakeClient) -> Self {
        P2pBackend { local, client }
    }

    fn address_of(name: &str) -> Result<(String, u16)> {
        let parsed = SegmentName::parse(name)
            .map_err(|error| EngineError::SegmentNotFound { name: name.to_owned(), reason: error.to_string() })?;
        let port = parsed.port.ok_or_else(|| EngineError::SegmentNotFound {
            name: name.to_owned(),
            reason: "with P2PHANDSHAKE a segment name is host:port (the owner's RPC port), and this one has no port"
                .into(),
        })?;
        Ok((parsed.host, port))
    }
}

impl MetadataBackend for P2pBackend {
    /// Nothing to store: the handshake server answers with the descriptor the metadata service gave it.
    fn publish(&self, _descriptor: &SegmentDescriptor) -> Result<()> {
        Ok(())
    }

    fn fetch(&self, name: &str) -> Result<SegmentDescriptor> {
        let (host, port) = P2pBackend::address_of(name)?;
        let ours = self.local.descriptor().map_or_else(|| "{}".to_owned(), |descriptor| descriptor.to_json());
        let reply = self.client.exchange(&host, port, &Frame::typed(FrameKind::Metadata, ours)).map_err(|error| {
            match error {
                // Nothing listening at the name's address: no such segment (any more).
                EngineError::Handshake { operation: "connect to handshake server", .. } => {
                    EngineError::SegmentNotFound { name: name.to_owned(), reason: error.to_string() }
                }
                other => other,
            }
        })?;
        if reply.payload.iter().filter(|byte| !byte.is_ascii_whitespace()).eq(b"{}".iter()) {
            return Err(EngineError::SegmentNotFound {
                name: name.to_owned(),
                reason: format!("the handshake server at {host}:{port} publishes no segment (it is shutting down)"),
            });
        }
        SegmentDescriptor::from_json(&reply.payload).map_err(|error| EngineError::MalformedDescriptor {
            origin: format!("the handshake server of {name}"),
            reason: error.to_string(),
        })
    }

    /// Nothing to remove: the metadata service clears what the handshake server answers and stops it.
    fn remove(&self, _name: &str) -> Result<()> {
        Ok(())
    }

    /// Nothing to store: in P2P mode the segment name carries the RPC address.
    fn publish_rpc_meta(&self, _name: &str, _rpc_meta: &RpcMeta) -> Result<()> {
        Ok(())
    }

    fn fetch_rpc_meta(&self, name: &str) -> Result<RpcMeta> {
        let (host, port) = P2pBackend::address_of(name)?;
        Ok(RpcMeta { ip_or_host_name: host, rpc_port: port })
    }

    fn remove_rpc_meta(&self, _name: &str) -> Result<()> {
        Ok(())
    }
}
