//! Where segment descriptors are published and found.
//!
//! This module owns the metadata layer: the descriptor format ([`descriptor`]), segment names ([`name`]), the
//! connection string that picks a backend ([`MetadataConnection`]), the backends behind [`MetadataBackend`] (P2P
//! handshake, HTTP metadata server, etcd), the handshake server every engine runs on its RPC port, the embedded HTTP
//! metadata server, and [`MetadataService`], which ties them together for one engine. It never touches registered
//! memory and never moves bytes.

mod admission;
pub mod etcd;
pub mod handshake;
pub mod http;
pub mod http_server;
pub mod name;
pub mod p2p;
pub mod runtime;
mod service;
pub mod store;

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

pub use crate::transfer::descriptor::{BufferDescriptor, DescriptorError, ProtocolList, SegmentDescriptor};
pub use name::{SegmentName, SegmentNameError};
pub(crate) use service::canonical_ip;
pub use service::{MetadataService, INITIATOR_CACHE_TTL};
pub use store::{KeyLayout, RpcMeta};

use crate::config::{ConfigError, Environment};
use crate::error::{EngineError, Result};

/// Publishes this engine's descriptor and fetches peers'.
pub trait MetadataBackend: Send + Sync + fmt::Debug {
    /// Publishes (or replaces) the descriptor of a segment this process owns.
    fn publish(&self, descriptor: &SegmentDescriptor) -> Result<()>;
    /// Fetches a peer's descriptor by segment name.
    fn fetch(&self, name: &str) -> Result<SegmentDescriptor>;
    /// Withdraws a descriptor this process published (clean shutdown).
    fn remove(&self, name: &str) -> Result<()>;
    /// Publishes where the handshake server of segment `name` listens (`rpc_meta`).
    fn publish_rpc_meta(&self, name: &str, rpc_meta: &RpcMeta) -> Result<()>;
    /// Where the handshake server of segment `name` listens.
    fn fetch_rpc_meta(&self, name: &str) -> Result<RpcMeta>;
    /// Withdraws the `rpc_meta` of a segment this process owns (clean shutdown).
    fn remove_rpc_meta(&self, name: &str) -> Result<()>;
}

/// A metadata connection string, parsed (docs/mooncake.md section 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataConnection {
    /// `P2PHANDSHAKE`: no store; a segment name is the address of its owner's handshake server.
    P2pHandshake,
    /// `http://host:port/metadata`: an HTTP metadata server (Mooncake's REST rules).
    Http {
        /// The URL without query, e.g. `http://127.0.0.1:8080/metadata`.
        url: String,
    },
    /// `etcd://host:port` or `host:port` (no scheme means etcd); several endpoints may be separated by `,` or `;`.
    Etcd {
        /// `host:port` of each endpoint, tried in order.
        endpoints: Vec<String>,
    },
}

impl MetadataConnection {
    /// Parses a connection string; schemes this engine does not speak (`redis://`, `https://`, ...) are refused by
    /// name.
    pub fn parse(text: &str) -> Result<MetadataConnection> {
        let text = text.trim();
        let refuse = |reason: String| EngineError::Metadata { operation: "parse metadata server", reason };
        if text.eq_ignore_ascii_case("P2PHANDSHAKE") {
            return Ok(MetadataConnection::P2pHandshake);
        }
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
            None => (String::from("etcd"), text),
        };
        match scheme.as_str() {
            "http" => {
                if rest.is_empty() || rest.starts_with('/') {
                    return Err(refuse(format!("{text:?}: the HTTP metadata server URL has no host")));
                }
                Ok(MetadataConnection::Http { url: format!("http://{rest}") })
            }
            "etcd" => {
                let endpoints: Vec<String> = rest
                    .split([',', ';'])
                    .map(str::trim)
                    .filter(|endpoint| !endpoint.is_empty())
                    .map(str::to_owned)
                    .collect();
                if endpoints.is_empty() {
                    return Err(refuse(format!("{text:?}: no etcd endpoint (expected etcd://host:port)")));
                }
                for endpoint in &endpoints {
                    let parsed = SegmentName::parse(endpoint).map_err(|error| refuse(error.to_string()))?;
                    if parsed.port.is_none() || parsed.npu.is_some() || endpoint.contains('/') {
                        return Err(refuse(format!("{text:?}: etcd endpoint {endpoint:?} is not host:port")));
                    }
                }
                Ok(MetadataConnection::Etcd { endpoints })
            }
            "redis" => Err(refuse(format!(
                "{text:?}: redis metadata servers are not supported by aiv-transport; \
                 use P2PHANDSHAKE, http://host:port/metadata or etcd://host:port"
            ))),
            other => Err(refuse(format!(
                "{text:?}: scheme {other:?} is not supported; use P2PHANDSHAKE, http://host:port/metadata or \
                 etcd://host:port"
            ))),
        }
    }
}

/// Metadata settings Mooncake reads from `MC_*` environment variables at engine start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataOptions {
    /// `MC_MIN_RPC_PORT..=MC_MAX_RPC_PORT` (15000..=17000): where the handshake server's port is drawn from.
    pub rpc_ports: RangeInclusive<u16>,
    /// `MC_METADATA_CLUSTER_ID`: keys become `mooncake/<cluster>/...`.
    pub cluster_id: Option<String>,
    /// `MC_TCP_BIND_ADDRESS`: the address published in `rpc_meta` (and bound) with a metadata store; without it,
    /// the host of `local_hostname`.
    pub rpc_bind_address: Option<String>,
    /// `AIV_METADATA_CONNECT_TIMEOUT_MS` (1500 ms): bound on one TCP connect of a metadata client (handshake, HTTP,
    /// etcd); never beyond `client_deadline`.
    pub client_connect_timeout: Duration,
    /// `AIV_METADATA_DEADLINE_MS` (3000 ms): one overall deadline per metadata client operation: a handshake
    /// exchange, an HTTP request, an etcd call over all its endpoints (connect, send, the whole reply).
    pub client_deadline: Duration,
}

impl Default for MetadataOptions {
    fn default() -> Self {
        MetadataOptions {
            rpc_ports: 15000..=17000,
            cluster_id: None,
            rpc_bind_address: None,
            client_connect_timeout: Duration::from_millis(1500),
            client_deadline: Duration::from_secs(3),
        }
    }
}

/// Accepted range of the metadata client's timeouts, in milliseconds.
const CLIENT_TIMEOUT_MS: RangeInclusive<u64> = 1..=600_000;

/// Reads one of the metadata client's millisecond timeouts from `env`.
fn client_timeout(env: &dyn Environment, key: &str, default: Duration) -> std::result::Result<Duration, ConfigError> {
    let Some(text) = env.var(key) else { return Ok(default) };
    text.trim().parse::<u64>().ok().filter(|ms| CLIENT_TIMEOUT_MS.contains(ms)).map(Duration::from_millis).ok_or(
        ConfigError::Invalid {
            origin: "environment".into(),
            key: key.into(),
            expected: format!("milliseconds from {} to {}", CLIENT_TIMEOUT_MS.start(), CLIENT_TIMEOUT_MS.end()),
            found: format!("{text:?}"),
        },
    )
}

impl MetadataOptions {
    /// Reads the `MC_*` variables; unset ones keep their defaults.
    pub fn from_env(env: &dyn Environment) -> std::result::Result<Self, ConfigError> {
        let mut options = MetadataOptions::default();
        let port = |key: &str, default: u16| -> std::result::Result<u16, ConfigError> {
            match env.var(key) {
                None => Ok(default),
                Some(text) => text.trim().parse::<u16>().ok().filter(|port| *port > 0).ok_or(ConfigError::Invalid {
                    origin: "environment".into(),
                    key: key.into(),
                    expected: "a port from 1 to 65535".into(),
                    found: format!("{text:?}"),
                }),
            }
        };
        let low = port("MC_MIN_RPC_PORT", *options.rpc_ports.start())?;
        let high = port("MC_MAX_RPC_PORT", *options.rpc_ports.end())?;
        if low > high {
            return Err(ConfigError::Invalid {
                origin: "environment".into(),
                key: "MC_MIN_RPC_PORT".into(),
                expected: format!("at most MC_MAX_RPC_PORT ({high})"),
                found: low.to_string(),
            });
        }
        options.rpc_ports = low..=high;
        options.cluster_id = env.var("MC_METADATA_CLUSTER_ID").filter(|id| !id.trim().is_empty());
        options.rpc_bind_address = env.var("MC_TCP_BIND_ADDRESS").filter(|address| !address.trim().is_empty());
        options.client_connect_timeout =
            client_timeout(env, "AIV_METADATA_CONNECT_TIMEOUT_MS", options.client_connect_timeout)?;
        options.client_deadline = client_timeout(env, "AIV_METADATA_DEADLINE_MS", options.client_deadline)?;
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_pick_the_backend() {
        assert_eq!(MetadataConnection::parse("P2PHANDSHAKE").expect("p2p"), MetadataConnection::P2pHandshake);
        assert_eq!(MetadataConnection::parse(" p2phandshake ").expect("p2p"), MetadataConnection::P2pHandshake);
        assert_eq!(
            MetadataConnection::parse("http://127.0.0.1:8080/metadata").expect("http"),
            MetadataConnection::Http { url: "http://127.0.0.1:8080/metadata".into() }
        );
        assert_eq!(
            MetadataConnection::parse("etcd://127.0.0.1:2379").expect("etcd"),
            MetadataConnection::Etcd { endpoints: vec!["127.0.0.1:2379".into()] }
        );
        assert_eq!(
            MetadataConnection::parse("10.0.0.1:2379;[::1]:2379").expect("no scheme means etcd"),
            MetadataConnection::Etcd { endpoints: vec!["10.0.0.1:2379".into(), "[::1]:2379".into()] }
        );
    }

    #[test]
    fn unsupported_and_malformed_connection_strings_say_why() {
        let cases = [
            ("redis://127.0.0.1:6379", "redis metadata servers are not supported"),
            ("https://meta:443/metadata", "scheme \"https\" is not supported"),
            ("http:///metadata", "has no host"),
            ("etcd://", "no etcd endpoint"),
            ("etcd://127.0.0.1", "is not host:port"),
            ("etcd://host:port", "port"),
        ];
        for (text, expected) in cases {
            let error = MetadataConnection::parse(text).expect_err(text);
            assert!(error.to_string().contains(expected), "{text}: {error}");
            assert_eq!(error.mooncake_code(), 200, "{text}");
        }
    }

    #[test]
    fn options_come_from_mc_variables() {
        let env = |name: &str| match name {
            "MC_MIN_RPC_PORT" => Some("20000".to_owned()),
            "MC_MAX_RPC_PORT" => Some("20010".to_owned()),
            "MC_METADATA_CLUSTER_ID" => Some("blue".to_owned()),
            _ => None,
        };
        let options = MetadataOptions::from_env(&env).expect("valid");
        assert_eq!(options.rpc_ports, 20000..=20010);
        assert_eq!(options.cluster_id.as_deref(), Some("blue"));
        assert_eq!(options.rpc_bind_address, None);
        let inverted = |name: &str| match name {
            "MC_MIN_RPC_PORT" => Some("30000".to_owned()),
            "MC_MAX_RPC_PORT" => Some("20000".to_owned()),
            _ => None,
        };
        let error = MetadataOptions::from_env(&inverted).expect_err("inverted range");
        assert!(error.to_string().contains("MC_MIN_RPC_PORT"), "{error}");
        let garbage = |name: &str| (name == "MC_MAX_RPC_PORT").then(|| "lots".to_owned());
        let error = MetadataOptions::from_env(&garbage).expect_err("not a port");
        assert!(error.to_string().contains("MC_MAX_RPC_PORT") && error.to_string().contains("lots"), "{error}");
    }

    #[test]
    fn client_deadlines_come_from_the_environment_and_are_range_checked() {
        let env = |name: &str| match name {
            "AIV_METADATA_DEADLINE_MS" => Some("250".to_owned()),
            "AIV_METADATA_CONNECT_TIMEOUT_MS" => Some("100".to_owned()),
            _ => None,
        };
        let options = MetadataOptions::from_env(&env).expect("valid");
        assert_eq!(options.client_deadline, Duration::from_millis(250));
        assert_eq!(options.client_connect_timeout, Duration::from_millis(100));
        assert_eq!(MetadataOptions::default().client_deadline, Duration::from_secs(3));
        let zero = |name: &str| (name == "AIV_METADATA_DEADLINE_MS").then(|| "0".to_owned());
        let error = MetadataOptions::from_env(&zero).expect_err("zero deadline");
        let text = error.to_string();
        assert!(
            text.contains("AIV_METADATA_DEADLINE_MS") && text.contains("600000") && text.contains("\"0\""),
            "{text}"
        );
    }
}
