//! Segment descriptors in Mooncake's JSON form (MOONCAKE_COMPAT.md section 2).
//!
//! Readers ignore fields they do not know (serde's default), accept `protocol` as a string or an array, and this
//! project's own fields live under one namespaced object, `"aiv"`, that Mooncake peers ignore.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One buffer a segment exposes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferDescriptor {
    /// Mooncake writes the segment name here.
    #[serde(default)]
    pub name: String,
    /// Absolute address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
}

/// The protocols a descriptor advertises: a string in single-protocol builds, an array in multi-protocol ones.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ProtocolList(pub Vec<String>);

impl ProtocolList {
    /// Whether `name` is advertised (case-insensitive).
    pub fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|p| p.eq_ignore_ascii_case(name))
    }
}

impl Serialize for ProtocolList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // One protocol is written as a plain string so single-protocol Mooncake builds can read it.
        match self.0.as_slice() {
            [single] => serializer.serialize_str(single),
            many => many.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ProtocolList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        match OneOrMany::deserialize(deserializer) {
            Ok(OneOrMany::One(single)) => Ok(ProtocolList(vec![single])),
            Ok(OneOrMany::Many(many)) => Ok(ProtocolList(many)),
            Err(_) => Err(serde::de::Error::custom("\"protocol\" must be a string or an array of strings")),
        }
    }
}

/// A segment descriptor as published under `mooncake/[cluster/]ram/<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDescriptor {
    /// The segment name (`host:port` in P2P mode).
    pub name: String,
    /// Advertised protocols.
    #[serde(default)]
    pub protocol: ProtocolList,
    /// TCP data port of the `tcp` transport (0 when it has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_data_port: Option<u16>,
    /// TCP wire version; a missing field means 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_proto_version: Option<u64>,
    /// Host the TCP data port listens on; missing means "the rpc_meta host".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_data_host: Option<String>,
    /// Mooncake's RDMA server name; empty for TCP-only peers.
    #[serde(default)]
    pub rdma_server_name: String,
    /// Publication time, as Mooncake writes it.
    #[serde(default)]
    pub timestamp: String,
    /// The buffers the segment exposes.
    #[serde(default)]
    pub buffers: Vec<BufferDescriptor>,
    /// This project's own fields (device windows, export endpoints, ...); Mooncake peers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aiv: Option<serde_json::Value>,
}

impl SegmentDescriptor {
    /// A descriptor with no buffers advertising `protocols`.
    pub fn new(name: impl Into<String>, protocols: Vec<String>) -> Self {
        SegmentDescriptor {
            name: name.into(),
            protocol: ProtocolList(protocols),
            tcp_data_port: None,
            tcp_proto_version: None,
            tcp_data_host: None,
            rdma_server_name: String::new(),
            timestamp: String::new(),
            buffers: Vec::new(),
            aiv: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_mooncake_tcp_descriptor_and_ignores_unknown_fields() {
        let json = r#"{"name": "127.0.0.1:12501", "protocol": "tcp",
            "tcp_data_port": 16024, "tcp_proto_version": 2, "tcp_data_host": "127.0.0.1",
            "rdma_server_name": "", "timestamp": "2026-11-29 16:05:36.860683", "devices": [], "priority_matrix": {},
            "buffers": [{"name": "127.0.0.1:12501", "addr": 140537000624128, "length": 100663296, "rkey": [], "lkey": []}]}"#;
        let descriptor: SegmentDescriptor = serde_json::from_str(json).expect("a real Mooncake descriptor parses");
        assert_eq!(descriptor.tcp_data_port, Some(16024));
        assert!(descriptor.protocol.contains("TCP"));
        assert_eq!(descriptor.buffers[0].addr, 140537000624128);
        let array: SegmentDescriptor =
            serde_json::from_str(r#"{"name":"a","protocol":["rdma","tcp"],"buffers":[]}"#).expect("array form");
        assert!(array.protocol.contains("rdma") && array.protocol.contains("tcp"));
        let bad = serde_json::from_str::<SegmentDescriptor>(r#"{"name":"a","protocol":7}"#);
        assert!(bad.expect_err("a number is not a protocol").to_string().contains("protocol"));
    }
}
