//! The `tcp` transport: Mooncake's TCP data wire (docs/mooncake.md section 4), server and client.
//!
//! - [`wire`]: the 24-byte request header and the v2 status frame;
//! - [`server`]: the data server that serves peers' requests against this engine's registered memory;
//! - [`client`]: persistent, pipelined lanes per peer that carry this engine's transfers;
//! - this module: [`TcpTransport`], which owns both, publishes `tcp_data_port`/`tcp_proto_version`/`tcp_data_host`
//!   in the engine's descriptor, and checks every transfer's ranges again before anything is sent.
//!
//! Environment (Mooncake's names where Mooncake has one): `MC_TCP_BIND_ADDRESS` binds the data listener to that
//! address instead of the host of `local_hostname` (`0.0.0.0` or `::` for all interfaces, only when asked);
//! `MC_TCP_PROTO=1` makes this side speak and advertise v1; `AIV_TCP_LANES` sets connections per peer.

pub mod client;
mod io;
pub mod server;
pub mod wire;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

pub use client::{ClientOptions, PeerKey, TcpClient};
pub use server::{ServerError, ServerLimits, SharedMemory, TcpDataServer};
pub use wire::WireVersion;

use super::Transport;
use crate::config::{EngineConfig, Environment, ProcessEnvironment};
use crate::metadata::SegmentDescriptor;
use crate::transfer::{FailureKind, Transfer, TransferFailure};

/// How the tcp transport is set up.
#[derive(Clone, Debug)]
pub struct TcpOptions {
    /// Address the data listener binds (port 0: any free port).
    pub bind: SocketAddr,
    /// Host published as `tcp_data_host`.
    pub advertised_host: String,
    /// The highest framing this side speaks and advertises.
    pub max_version: WireVersion,
    /// Client lanes and timeouts.
    pub client: ClientOptions,
    /// Server timeouts and limits.
    pub server: ServerLimits,
}

/// Why the tcp transport could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpError {
    /// The bind host could not be turned into an address.
    #[error("tcp transport: resolve bind host {host:?}: {reason}")]
    ResolveBindHost { host: String, reason: String },
    /// An environment variable had a value that cannot be used.
    #[error("tcp transport: {name}={value:?}: {reason}")]
    Environment { name: &'static str, value: String, reason: &'static str },
    /// The data server did not start.
    #[error(transparent)]
    Server(#[from] ServerError),
}

/// The host part of a segment name: `host:port`, `[v6]:port`, `ip:port:npu_N`, or a bare host.
pub fn host_of_segment_name(name: &str) -> &str {
    if let Some(rest) = name.strip_prefix('[') {
        if let Some(end) = rest.find(']') {
            return &rest[..end];
        }
    }
    if name.parse::<IpAddr>().is_ok() {
        return name;
    }
    name.split(':').next().unwrap_or(name)
}

impl TcpOptions {
    /// Options for an engine started with `config`, reading the process environment.
    pub fn from_config(config: &EngineConfig) -> Result<Self, TcpError> {
        TcpOptions::from_config_and_env(config, &ProcessEnvironment)
    }

    /// Options for an engine started with `config`, reading `env`.
    pub fn from_config_and_env(config: &EngineConfig, env: &dyn Environment) -> Result<Self, TcpError> {
        let name_host = host_of_segment_name(&config.local_hostname).to_owned();
        let bind_host = env.var("MC_TCP_BIND_ADDRESS").filter(|v| !v.trim().is_empty()).unwrap_or(name_host.clone());
        let bind_ip = resolve_host(bind_host.trim())?;
        let advertised_host = if bind_ip.is_unspecified() { name_host } else { bind_ip.to_string() };
        let max_version = match env.var("MC_TCP_PROTO").as_deref().map(str::trim) {
            Some("1") => WireVersion::V1,
            None | Some("") | Some("2") => WireVersion::V2,
            Some(other) => {
                return Err(TcpError::Environment {
                    name: "MC_TCP_PROTO",
                    value: other.into(),
                    reason: "expected 1 or 2",
                })
            }
        };
        let mut client = ClientOptions {
            io_timeout: config.aiv.transfer_timeout,
            connect_timeout: config.aiv.tcp_connect_timeout,
            reconnect_backoff: config.aiv.tcp_reconnect_backoff,
            reconnect_backoff_max: config.aiv.tcp_reconnect_backoff_max,
            ..ClientOptions::default()
        };
        if let Some(lanes) = env.var("AIV_TCP_LANES") {
            client.lanes = match lanes.trim().parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => n,
                _ => {
                    return Err(TcpError::Environment {
                        name: "AIV_TCP_LANES",
                        value: lanes,
                        reason: "expected 1..=64",
                    })
                }
            };
        }
        let server = ServerLimits {
            io_timeout: config.aiv.transfer_timeout,
            first_request_timeout: config.aiv.tcp_first_request_timeout,
            max_connections_per_source: config.aiv.tcp_max_connections_per_source,
            max_connections: config.aiv.tcp_max_connections,
            max_serving: config.aiv.tcp_max_serving_threads,
            idle_timeout: config.aiv.tcp_idle_timeout,
            request_timeout: config.aiv.tcp_request_timeout,
            request_min_rate: config.aiv.tcp_request_min_kib_per_s.saturating_mul(1024),
            ..ServerLimits::default()
        };
        Ok(TcpOptions { bind: SocketAddr::new(bind_ip, 0), advertised_host, max_version, client, server })
    }
}

fn resolve_host(host: &str) -> Result<IpAddr, TcpError> {
    if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        return Ok(ip);
    }
    let mut addresses = (host, 0u16)
        .to_socket_addrs()
        .map_err(|error| TcpError::ResolveBindHost { host: host.into(), reason: error.to_string() })?;
    addresses
        .next()
        .map(|address| address.ip())
        .ok_or_else(|| TcpError::ResolveBindHost { host: host.into(), reason: "no address".into() })
}

/// Mooncake's `tcp` transport: a data server for peers and pipelined lanes to them.
#[derive(Debug)]
pub struct TcpTransport {
    options: TcpOptions,
    memory: SharedMemory,
    server: TcpDataServer,
    client: TcpClient,
}

impl TcpTransport {
    /// Starts the data server on `options.bind`, serving `memory` (the engine's registered buffers).
    pub fn start(options: TcpOptions, memory: SharedMemory) -> Result<Self, TcpError> {
        let server = TcpDataServer::start(options.bind, memory.clone(), options.server.clone())?;
        let client = TcpClient::new(options.client.clone());
        Ok(TcpTransport { options, memory, server, client })
    }

    /// Writes this transport's fields into the engine's descriptor.
    pub fn describe(&self, descriptor: &mut SegmentDescriptor) {
        descriptor.tcp_data_port = Some(self.server.address().port());
        descriptor.tcp_proto_version = Some(self.options.max_version.number());
        descriptor.tcp_data_host = Some(self.options.advertised_host.clone());
    }

    /// The data server.
    pub fn server(&self) -> &TcpDataServer {
        &self.server
    }

    /// The options in force.
    pub fn options(&self) -> &TcpOptions {
        &self.options
    }

    /// Where to send `transfer`, or why it cannot be sent. Checks both ranges again (the engine already did):
    /// nothing leaves this process for a range that is not inside one buffer on each side.
    fn plan(&self, transfer: &Transfer) -> Result<PeerKey, String> {
        self.memory
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .find_containing(transfer.local_addr, transfer.length)
            .map_err(|error| format!("local range is not inside one registered buffer: {error}"))?;
        let segment = &transfer.target;
        segment
            .buffers
            .find_containing(transfer.remote_addr, transfer.length)
            .map_err(|error| format!("remote range is not inside one buffer of segment {:?}: {error}", segment.name))?;
        usize::try_from(transfer.length).map_err(|_| "length exceeds this host's address space".to_string())?;
        let descriptor = &segment.descriptor;
        let port = descriptor
            .tcp_data_port
            .filter(|&port| port != 0)
            .ok_or_else(|| format!("segment {:?} advertises no tcp_data_port", segment.name))?;
        let host = descriptor
            .tcp_data_host
            .as_deref()
            .filter(|host| !host.is_empty())
            .unwrap_or_else(|| host_of_segment_name(&segment.name))
            .to_owned();
        let peer_version = WireVersion::from_descriptor(descriptor.tcp_proto_version);
        let version = if self.options.max_version == WireVersion::V1 { WireVersion::V1 } else { peer_version };
        Ok(PeerKey { host, port, version })
    }
}

/// Transfers refused before sending (a peer's descriptor without a data port, a range outside its buffers): one per
/// transfer, so a caller looping over a bad peer would otherwise log without end.
static REFUSED_BEFORE_SENDING: crate::log_limit::LogLimiter = crate::log_limit::LogLimiter::per_second(5);

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn submit(&self, transfers: Vec<Transfer>) {
        let mut by_peer: HashMap<PeerKey, Vec<client::Job>> = HashMap::new();
        for transfer in transfers {
            match self.plan(&transfer) {
                Ok(key) => by_peer.entry(key).or_default().push(client::Job::new(transfer)),
                Err(reason) => {
                    if let Some(suppressed) = REFUSED_BEFORE_SENDING.admit() {
                        tracing::warn!(segment = %transfer.target.name, %reason, suppressed,
                            "tcp transfer refused before sending ({suppressed} more like this in the last second)");
                    }
                    transfer.slot.fail(TransferFailure::new("tcp", FailureKind::InvalidRequest, reason));
                }
            }
        }
        for (key, jobs) in by_peer {
            self.client.submit(key, jobs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::BufferDescriptor;
    use crate::transfer::{
        BufferSet, CompletionSignal, Opcode, RegisteredBuffer, Segment, SegmentId, TaskSlot, TransferState,
    };
    use std::sync::{Arc, RwLock};
    use std::time::Instant;

    #[test]
    fn the_client_checks_both_ranges_before_sending_anything() {
        let mut memory = vec![0u8; 8192];
        let base = memory.as_mut_ptr() as u64;
        let mut set = BufferSet::new();
        set.insert(RegisteredBuffer { addr: base, length: 4096, location: "cpu:0".into() }).expect("insert");
        set.insert(RegisteredBuffer { addr: base + 4096, length: 4096, location: "cpu:0".into() }).expect("insert");
        let shared = Arc::new(RwLock::new(set));
        let config = EngineConfig::new("127.0.0.1:1");
        let none = |_: &str| None::<String>;
        let options = TcpOptions::from_config_and_env(&config, &none).expect("options");
        let transport = TcpTransport::start(options, shared).expect("start");
        // A descriptor that lists the same two buffers (the target is this very server), as a peer would publish.
        let mut descriptor = SegmentDescriptor::new("127.0.0.1:1", vec!["tcp".into()]);
        transport.describe(&mut descriptor);
        descriptor.buffers =
            vec![BufferDescriptor::new("b0", base, 4096), BufferDescriptor::new("b1", base + 4096, 4096)];
        let segment = Arc::new(Segment::from_descriptor(SegmentId(1), descriptor).expect("segment"));
        let signal = Arc::new(CompletionSignal::default());
        let bad = [
            (base, base + 4000, 200u64), // remote range spans two adjacent buffers
            (base + 4000, base, 200),    // local range spans two adjacent buffers
            (base + 9000, base, 8),      // local range not registered
            (base, base + 8192, 1),      // remote range past every buffer
            (base, base, 0),             // zero length
        ];
        let mut slots = Vec::new();
        for (local_addr, remote_addr, length) in bad {
            let slot = Arc::new(TaskSlot::new(Instant::now() + std::time::Duration::from_secs(5), signal.clone()));
            slots.push(slot.clone());
            let transfer =
                Transfer { opcode: Opcode::Write, local_addr, remote_addr, length, target: segment.clone(), slot };
            transport.submit(vec![transfer]);
        }
        for slot in &slots {
            assert_eq!(slot.state(), TransferState::Failed, "{:?}", slot.reason());
        }
        assert_eq!(transport.server().connections(), 0, "no connection was even opened");
        assert_eq!(transport.server().served(), 0);
    }

    /// Many transfers in several submissions reuse the same `lanes` connections (persistent, pipelined).
    #[test]
    fn lanes_are_persistent_connections() {
        let mut a_memory = vec![1u8; 1 << 16];
        let mut b_memory = vec![2u8; 1 << 16];
        let share = |memory: &mut Vec<u8>| {
            let mut set = BufferSet::new();
            let buffer = RegisteredBuffer {
                addr: memory.as_mut_ptr() as u64,
                length: memory.len() as u64,
                location: "cpu:0".into(),
            };
            set.insert(buffer).expect("insert");
            Arc::new(RwLock::new(set))
        };
        let config = EngineConfig::new("127.0.0.1:1");
        let none = |_: &str| None::<String>;
        let options = TcpOptions::from_config_and_env(&config, &none).expect("options");
        let lanes = options.client.lanes;
        let a = TcpTransport::start(options.clone(), share(&mut a_memory)).expect("a");
        let b = TcpTransport::start(options, share(&mut b_memory)).expect("b");
        let mut descriptor = SegmentDescriptor::new("127.0.0.1:2", vec!["tcp".into()]);
        b.describe(&mut descriptor);
        let b_base = b_memory.as_ptr() as u64;
        descriptor.buffers = vec![BufferDescriptor::new("b", b_base, b_memory.len() as u64)];
        let segment = Arc::new(Segment::from_descriptor(SegmentId(1), descriptor).expect("segment"));
        let signal = Arc::new(CompletionSignal::default());
        let a_base = a_memory.as_ptr() as u64;
        let mut slots = Vec::new();
        for round in 0..5u64 {
            let transfers: Vec<Transfer> = (0..20u64)
                .map(|i| {
                    let slot =
                        Arc::new(TaskSlot::new(Instant::now() + std::time::Duration::from_secs(10), signal.clone()));
                    slots.push(slot.clone());
                    let offset = (round * 20 + i) * 256;
                    Transfer {
                        opcode: Opcode::Write,
                        local_addr: a_base + offset,
                        remote_addr: b_base + offset,
                        length: 256,
                        target: segment.clone(),
                        slot,
                    }
                })
                .collect();
            a.submit(transfers);
            signal.wait_for(slots.len(), Instant::now() + std::time::Duration::from_secs(10));
        }
        assert!(slots.iter().all(|slot| slot.state() == TransferState::Completed));
        assert_eq!(b.server().served(), 100);
        assert_eq!(b.server().connections(), lanes, "100 requests over {lanes} persistent connections");
        assert_eq!(b_memory[..100 * 256], a_memory[..100 * 256]);
        drop((a, b));
    }

    #[test]
    fn segment_name_hosts() {
        assert_eq!(host_of_segment_name("127.0.0.1:12501"), "127.0.0.1");
        assert_eq!(host_of_segment_name("[::1]:12501"), "::1");
        assert_eq!(host_of_segment_name("10.0.0.2:12501:npu_3"), "10.0.0.2");
        assert_eq!(host_of_segment_name("node7"), "node7");
        assert_eq!(host_of_segment_name("::1"), "::1");
    }

    #[test]
    fn options_bind_the_configured_host_unless_told_otherwise() {
        let config = EngineConfig::new("127.0.0.1:12345");
        let none = |_: &str| None::<String>;
        let options = TcpOptions::from_config_and_env(&config, &none).expect("loopback binds");
        assert_eq!(options.bind, "127.0.0.1:0".parse().expect("address"));
        assert_eq!(options.advertised_host, "127.0.0.1");
        assert_eq!(options.max_version, WireVersion::V2);
        let all = |name: &str| (name == "MC_TCP_BIND_ADDRESS").then(|| "0.0.0.0".to_string());
        let options = TcpOptions::from_config_and_env(&config, &all).expect("all interfaces when asked");
        assert!(options.bind.ip().is_unspecified());
        assert_eq!(options.advertised_host, "127.0.0.1", "the unspecified address is never advertised");
        let v1 = |name: &str| (name == "MC_TCP_PROTO").then(|| "1".to_string());
        assert_eq!(TcpOptions::from_config_and_env(&config, &v1).expect("v1").max_version, WireVersion::V1);
        let bad = |name: &str| (name == "AIV_TCP_LANES").then(|| "0".to_string());
        assert!(TcpOptions::from_config_and_env(&config, &bad).is_err());
    }
}
