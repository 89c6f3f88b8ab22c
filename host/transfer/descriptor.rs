//! Segment descriptors in Mooncake's JSON form (docs/mooncake.md section 2).
//!
//! This module owns the descriptor's shape and its validity rules; it does not know where descriptors are stored.
//! Readers accept `protocol` as a string or an array, and keep the fields they do not interpret (Mooncake's
//! protocol-specific `devices`, `rank_info`, per-buffer `device_id`, `shm_name`, ...) in `extra` so that a descriptor
//! read and written again loses nothing. This project's own fields live under one namespaced object, `"aiv"`, that
//! Mooncake peers ignore.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

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
    /// Fields of other protocols (`device_id`, `shm_name`, `rkey`, ...), kept as read.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl BufferDescriptor {
    /// A buffer with no protocol-specific fields.
    pub fn new(name: impl Into<String>, addr: u64, length: u64) -> Self {
        BufferDescriptor { name: name.into(), addr, length, extra: Map::new() }
    }
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
    /// TCP wire version; a missing field means 1 (see [`Self::tcp_wire_version`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_proto_version: Option<u64>,
    /// Host the TCP data port listens on; missing means "the rpc_meta host" (see [`Self::tcp_data_host_or`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_data_host: Option<String>,
    /// Mooncake's RDMA server name; empty for TCP-only peers.
    #[serde(default)]
    pub rdma_server_name: String,
    /// Publication time, as Mooncake writes it (`YYYY-MM-DD HH:MM:SS.micros`).
    #[serde(default)]
    pub timestamp: String,
    /// The buffers the segment exposes.
    #[serde(default)]
    pub buffers: Vec<BufferDescriptor>,
    /// This project's own fields (device windows, export endpoints, ...); Mooncake peers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aiv: Option<Value>,
    /// Fields of other protocols (`devices`, `rank_info`, `priority_matrix`, ...), kept as read.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Why a descriptor cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescriptorError {
    /// The text is not JSON, or not a JSON object with the descriptor's fields of the right types.
    #[error("parse segment descriptor: {0}")]
    Syntax(String),
    /// The descriptor parsed but breaks a rule of its protocol.
    #[error("check segment descriptor {name:?}: {reason}")]
    Invalid { name: String, reason: String },
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
            extra: Map::new(),
        }
    }

    /// Parses descriptor JSON and checks it (see [`Self::validate`]).
    pub fn from_json(text: &[u8]) -> Result<Self, DescriptorError> {
        let descriptor: SegmentDescriptor = serde_json::from_slice(text).map_err(|error| {
            DescriptorError::Syntax(format!("line {} column {}: {error}", error.line(), error.column()))
        })?;
        descriptor.validate()?;
        Ok(descriptor)
    }

    /// The descriptor as JSON text.
    pub fn to_json(&self) -> String {
        // Serializing plain data (strings, integers, JSON values) into a String cannot fail.
        serde_json::to_string(self).unwrap_or_else(|error| unreachable!("descriptor serialization: {error}"))
    }

    /// Checks the rules a reader relies on: a name, and for `tcp` descriptors buffers with a name, a non-zero
    /// address and a non-zero length (Mooncake's TCP transport rejects such a descriptor the same way).
    pub fn validate(&self) -> Result<(), DescriptorError> {
        let invalid = |reason: String| DescriptorError::Invalid { name: self.name.clone(), reason };
        if self.name.trim().is_empty() {
            return Err(invalid("the \"name\" field is empty".into()));
        }
        if self.protocol.contains("tcp") {
            for (index, buffer) in self.buffers.iter().enumerate() {
                if buffer.name.is_empty() {
                    return Err(invalid(format!("tcp buffer {index} has an empty name")));
                }
                if buffer.addr == 0 {
                    return Err(invalid(format!("tcp buffer {index} has address 0")));
                }
                if buffer.length == 0 {
                    return Err(invalid(format!("tcp buffer {index} has length 0")));
                }
            }
        }
        Ok(())
    }

    /// The TCP wire version the peer speaks: `tcp_proto_version`, 1 when absent.
    pub fn tcp_wire_version(&self) -> u64 {
        self.tcp_proto_version.unwrap_or(1)
    }

    /// The host of the TCP data port: `tcp_data_host` when present and non-empty, else the peer's rpc_meta host.
    pub fn tcp_data_host_or<'a>(&'a self, rpc_meta_host: &'a str) -> &'a str {
        match self.tcp_data_host.as_deref() {
            Some(host) if !host.is_empty() => host,
            _ => rpc_meta_host,
        }
    }
}

/// The current time as Mooncake writes descriptor timestamps (UTC here), e.g. `2026-11-29 16:05:36.860683`.
pub fn timestamp_now() -> String {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs();
    let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
    let in_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:06}",
        in_day / 3600,
        in_day / 60 % 60,
        in_day % 60,
        since_epoch.subsec_micros()
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor as Mooncake's TCP transport publishes it, plus fields other builds add.
    const TCP_SAMPLE: &str = r#"{"name": "127.0.0.1:12501", "protocol": "tcp",
        "tcp_data_port": 16024, "tcp_proto_version": 2, "tcp_data_host": "127.0.0.1",
        "rdma_server_name": "", "timestamp": "2026-11-29 16:05:36.860683", "devices": [], "priority_matrix": {},
        "buffers": [{"name": "127.0.0.1:12501", "addr": 140537000624128, "length": 100663296, "rkey": [], "lkey": []}]}"#;

    /// A multi-protocol build: `protocol` is an array; an older TCP peer without version or data host.
    const MULTI_PROTOCOL_SAMPLE: &str = r#"{"name": "10.0.0.7:15123", "protocol": ["rdma", "tcp"],
        "tcp_data_port": 16100, "rdma_server_name": "10.0.0.7:15123", "timestamp": "2026-11-29 16:06:01.000001",
        "devices": [{"name": "mlx5_0", "lid": 0, "gid": "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:07"}],
        "priority_matrix": {"cpu:0": [["mlx5_0"], []]},
        "buffers": [{"name": "cpu:0", "addr": 139800000000000, "length": 1073741824,
                     "rkey": [4660], "lkey": [4661]}]}"#;

    /// Mooncake's Ascend transport: devices, per-buffer device_id and the HCCL rank table entry.
    const ASCEND_SAMPLE: &str = r#"{"name": "192.168.3.1:12345", "protocol": "ascend",
        "rdma_server_name": "", "timestamp": "2026-11-29 16:07:11.123456",
        "devices": [{"name": "npu_2", "lid": 0, "gid": ""}],
        "rank_info": {"rankId": 2, "hostIp": "192.168.3.1", "hostPort": 12345, "deviceLogicId": 2,
                      "devicePhyId": 2, "deviceType": 1, "deviceIp": "29.0.3.2", "devicePort": 16666,
                      "pid": 4242},
        "buffers": [{"name": "npu:2", "addr": 20615843020800, "length": 67108864, "device_id": 2}]}"#;

    /// Mooncake's UB shared-memory transport: each buffer carries its hex-encoded exported handle.
    const UBSHMEM_SAMPLE: &str = r#"{"name": "127.0.0.1:15555", "protocol": "ubshmem",
        "rdma_server_name": "", "timestamp": "2026-11-29 16:08:00.000000",
        "buffers": [{"name": "127.0.0.1:15555", "addr": 281470681743360, "length": 2097152,
                     "shm_name": "0a1b2c3d4e5f60718293a4b5c6d7e8f9"}]}"#;

    fn round_trip(text: &str) -> SegmentDescriptor {
        let descriptor = SegmentDescriptor::from_json(text.as_bytes()).expect("a Mooncake sample parses");
        let written = descriptor.to_json();
        let again = SegmentDescriptor::from_json(written.as_bytes()).expect("what we write parses");
        assert_eq!(again, descriptor);
        // Nothing the sample said is lost on the way through.
        let original: Value = serde_json::from_str(text).expect("sample is JSON");
        let rewritten: Value = serde_json::from_str(&written).expect("output is JSON");
        assert_eq!(rewritten, original, "round trip of {text}");
        descriptor
    }

    #[test]
    fn tcp_sample_round_trips_and_reads_its_tcp_fields() {
        let descriptor = round_trip(TCP_SAMPLE);
        assert!(descriptor.protocol.contains("TCP"));
        assert_eq!(descriptor.tcp_data_port, Some(16024));
        assert_eq!(descriptor.tcp_wire_version(), 2);
        assert_eq!(descriptor.tcp_data_host_or("10.9.9.9"), "127.0.0.1");
        assert_eq!(descriptor.buffers[0].addr, 140537000624128);
        assert_eq!(descriptor.buffers[0].extra.get("rkey"), Some(&Value::Array(vec![])));
        assert!(descriptor.extra.contains_key("priority_matrix"));
    }

    #[test]
    fn multi_protocol_sample_defaults_version_and_data_host() {
        let descriptor = round_trip(MULTI_PROTOCOL_SAMPLE);
        assert_eq!(descriptor.protocol.0, vec!["rdma".to_owned(), "tcp".to_owned()]);
        assert_eq!(descriptor.tcp_wire_version(), 1, "missing tcp_proto_version means 1");
        assert_eq!(descriptor.tcp_data_host_or("10.0.0.7"), "10.0.0.7", "missing tcp_data_host means rpc_meta host");
        let mut empty_host = descriptor.clone();
        empty_host.tcp_data_host = Some(String::new());
        assert_eq!(empty_host.tcp_data_host_or("10.0.0.7"), "10.0.0.7");
    }

    #[test]
    fn ascend_and_ubshmem_samples_keep_their_protocol_fields() {
        let ascend = round_trip(ASCEND_SAMPLE);
        assert!(ascend.protocol.contains("ascend"));
        assert_eq!(ascend.buffers[0].extra.get("device_id"), Some(&Value::from(2)));
        assert_eq!(ascend.extra["rank_info"]["deviceIp"], Value::from("29.0.3.2"));
        assert_eq!(ascend.extra["devices"][0]["name"], Value::from("npu_2"));

        let ubshmem = round_trip(UBSHMEM_SAMPLE);
        assert_eq!(ubshmem.buffers[0].extra["shm_name"], Value::from("0a1b2c3d4e5f60718293a4b5c6d7e8f9"));
    }

    #[test]
    fn aiv_extras_stay_in_their_namespace() {
        let mut descriptor = SegmentDescriptor::new("127.0.0.1:15001", vec!["aiv".into()]);
        descriptor.buffers.push(BufferDescriptor::new("127.0.0.1:15001", 0x1000, 4096));
        descriptor.aiv = Some(serde_json::json!({"device_id": 3, "windows": [{"addr": 4096, "length": 4096}]}));
        let value: Value = serde_json::from_str(&descriptor.to_json()).expect("json");
        assert_eq!(value["aiv"]["device_id"], Value::from(3));
        assert!(value.get("device_id").is_none(), "aiv fields never leak to the top level");
        assert_eq!(value["protocol"], Value::from("aiv"), "one protocol is written as a string");
        let back = SegmentDescriptor::from_json(descriptor.to_json().as_bytes()).expect("parses");
        assert_eq!(back, descriptor);
    }

    #[test]
    fn malformed_descriptors_are_rejected_with_the_reason() {
        let cases: &[(&str, &str)] = &[
            (r#"{"name":"a","protocol":7}"#, "\"protocol\" must be a string or an array"),
            (r#"{"name":"a","protocol":"tcp","buffers":[{"name":"a","addr":"x","length":1}]}"#, "invalid type"),
            (r#"{"protocol":"tcp"}"#, "missing field `name`"),
            (r#"[1,2]"#, "invalid type"),
            (r#"{"name":"a","#, "line 1"),
            (r#"{"name":" ","protocol":"tcp"}"#, "\"name\" field is empty"),
            (r#"{"name":"a","protocol":"tcp","buffers":[{"name":"","addr":1,"length":1}]}"#, "empty name"),
            (r#"{"name":"a","protocol":["rdma","tcp"],"buffers":[{"name":"a","addr":0,"length":1}]}"#, "address 0"),
            (r#"{"name":"a","protocol":"tcp","buffers":[{"name":"a","addr":1,"length":0}]}"#, "length 0"),
            (r#"{"name":"a","protocol":"tcp","buffers":[{"name":"a","addr":-1,"length":1}]}"#, "invalid value"),
        ];
        for (text, expected) in cases {
            let error = SegmentDescriptor::from_json(text.as_bytes()).expect_err(text);
            assert!(error.to_string().contains(expected), "{text}: {error}");
        }
        // The tcp buffer rules are the tcp transport's: an ascend buffer named by its device is fine.
        SegmentDescriptor::from_json(
            br#"{"name":"a","protocol":"ascend","buffers":[{"name":"","addr":0,"length":8}]}"#,
        )
        .expect("non-tcp descriptor");
    }

    #[test]
    fn timestamps_have_mooncakes_shape() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let now = timestamp_now();
        assert_eq!(now.len(), "2026-11-29 16:05:36.860683".len(), "{now}");
        assert_eq!((&now[4..5], &now[10..11], &now[19..20]), ("-", " ", "."), "{now}");
    }
}
