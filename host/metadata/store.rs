//! Metadata kept in a key-value store (HTTP metadata server, etcd): Mooncake's key layout and the backend that
//! reads and writes descriptors and `rpc_meta` through any [`KeyValueStore`].
//!
//! Keys: `mooncake/[<cluster>/]ram/<segment>` holds the descriptor, `mooncake/[<cluster>/]rpc_meta/<segment>` holds
//! `{"ip_or_host_name": ..., "rpc_port": ...}` (docs/mooncake.md section 2). This module owns the layout; the
//! stores own their wire.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{MetadataBackend, SegmentDescriptor};
use crate::error::{EngineError, Result};

/// Where a segment's handshake server listens, as Mooncake stores it under `rpc_meta`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcMeta {
    /// Address (or host name) of the handshake server.
    pub ip_or_host_name: String,
    /// Its port.
    pub rpc_port: u16,
}

/// Mooncake's key names, with the optional cluster prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    /// Keys under `mooncake/`, or `mooncake/<cluster>/` when a cluster id (`MC_METADATA_CLUSTER_ID`) is given.
    pub fn new(cluster_id: Option<&str>) -> KeyLayout {
        let prefix = match cluster_id.map(|id| id.trim().trim_matches('/')).filter(|id| !id.is_empty()) {
            Some(cluster) => format!("mooncake/{cluster}/"),
            None => "mooncake/".to_owned(),
        };
        KeyLayout { prefix }
    }

    /// The key of a segment's descriptor.
    pub fn segment(&self, name: &str) -> String {
        format!("{}ram/{name}", self.prefix)
    }

    /// The key of a segment's `rpc_meta`.
    pub fn rpc_meta(&self, name: &str) -> String {
        format!("{}rpc_meta/{name}", self.prefix)
    }
}

/// A store of byte values under string keys, with bounded waits.
pub trait KeyValueStore: Send + Sync + fmt::Debug {
    /// Where the store is, for messages (`http://host:port/metadata`, `etcd://host:port`).
    fn endpoint(&self) -> String;
    /// The value under `key`, `None` when absent.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
    /// Stores `value` under `key`.
    fn put(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Deletes `key`; whether it existed.
    fn delete(&self, key: &str) -> Result<bool>;
}

/// Descriptors and `rpc_meta` in a [`KeyValueStore`].
#[derive(Debug)]
pub struct StoreBackend<S> {
    store: S,
    keys: KeyLayout,
}

impl<S: KeyValueStore> StoreBackend<S> {
    /// A backend writing Mooncake's keys into `store`.
    pub fn new(store: S, keys: KeyLayout) -> Self {
        StoreBackend { store, keys }
    }

    /// The underlying store.
    pub fn store(&self) -> &S {
        &self.store
    }
}

impl<S: KeyValueStore> MetadataBackend for StoreBackend<S> {
    fn publish(&self, descriptor: &SegmentDescriptor) -> Result<()> {
        let key = self.keys.segment(&descriptor.name);
        self.store.put(&key, descriptor.to_json().as_bytes())?;
        tracing::debug!(key, endpoint = %self.store.endpoint(), buffers = descriptor.buffers.len(), "descriptor published");
        Ok(())
    }

    fn fetch(&self, name: &str) -> Result<SegmentDescriptor> {
        let key = self.keys.segment(name);
        let bytes = self.store.get(&key)?.ok_or_else(|| EngineError::SegmentNotFound {
            name: name.to_owned(),
            reason: format!("no descriptor under key {key:?} at {}", self.store.endpoint()),
        })?;
        SegmentDescriptor::from_json(&bytes).map_err(|error| EngineError::MalformedDescriptor {
            origin: format!("key {key:?} at {}", self.store.endpoint()),
            reason: error.to_string(),
        })
    }

    fn remove(&self, name: &str) -> Result<()> {
        let key = self.keys.segment(name);
        if !self.store.delete(&key)? {
            tracing::debug!(key, "descriptor was already gone");
        }
        Ok(())
    }

    fn publish_rpc_meta(&self, name: &str, rpc_meta: &RpcMeta) -> Result<()> {
        let key = self.keys.rpc_meta(name);
        let json = serde_json::to_vec(rpc_meta)
            .map_err(|error| EngineError::Metadata { operation: "publish rpc_meta", reason: error.to_string() })?;
        self.store.put(&key, &json)
    }

    fn fetch_rpc_meta(&self, name: &str) -> Result<RpcMeta> {
        let key = self.keys.rpc_meta(name);
        let bytes = self.store.get(&key)?.ok_or_else(|| EngineError::SegmentNotFound {
            name: name.to_owned(),
            reason: format!("no rpc_meta under key {key:?} at {}", self.store.endpoint()),
        })?;
        serde_json::from_slice(&bytes).map_err(|error| EngineError::MalformedDescriptor {
            origin: format!("key {key:?} at {}", self.store.endpoint()),
            reason: format!("rpc_meta is not {{\"ip_or_host_name\": string, \"rpc_port\": port}}: {error}"),
        })
    }

    fn remove_rpc_meta(&self, name: &str) -> Result<()> {
        self.store.delete(&self.keys.rpc_meta(name)).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_mooncake_with_and_without_cluster() {
        let plain = KeyLayout::new(None);
        assert_eq!(plain.segment("127.0.0.1:15001"), "mooncake/ram/127.0.0.1:15001");
        assert_eq!(plain.rpc_meta("127.0.0.1:15001"), "mooncake/rpc_meta/127.0.0.1:15001");
        let clustered = KeyLayout::new(Some("blue"));
        assert_eq!(clustered.segment("n"), "mooncake/blue/ram/n");
        assert_eq!(clustered.rpc_meta("n"), "mooncake/blue/rpc_meta/n");
        assert_eq!(KeyLayout::new(Some("  ")), plain, "a blank cluster id is no cluster");
    }

    #[test]
    fn rpc_meta_json_is_mooncakes() {
        let meta = RpcMeta { ip_or_host_name: "10.0.0.1".into(), rpc_port: 15123 };
        let json = serde_json::to_value(&meta).expect("json");
        assert_eq!(json, serde_json::json!({"ip_or_host_name": "10.0.0.1", "rpc_port": 15123}));
    }
}
