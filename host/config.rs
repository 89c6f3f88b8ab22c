//! mooncake.json and this project's options.
//!
//! Mooncake's fields are read as Mooncake reads them (docs/mooncake.md section 1): `local_hostname` and
//! `metadata_server` required, `protocol` lower-cased (default `tcp`), sizes with suffixes, unknown keys accepted and
//! ignored, and the `MOONCAKE_*` environment variables filling what the file leaves out. This project's own options
//! live in one object, `"aiv": {...}`, which Mooncake ignores. A file that cannot be used fails with its path, the
//! key and what was expected.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::transfer::Protocol;

/// Environment variable naming the config file.
pub const CONFIG_PATH_ENV: &str = "MOONCAKE_CONFIG_PATH";

/// The environment variable that picks the path of Mooncake's protocol name `"ascend"` when mooncake.json's
/// `aiv.ascend_protocol` does not (see [`AivOptions::resolve_protocol`]).
pub const ASCEND_PROTOCOL_ENV: &str = "AIV_ASCEND_PROTOCOL";

/// Mooncake's name of its Ascend Direct transport, and what vLLM-Ascend passes to `initialize`.
pub const ASCEND_PROTOCOL_NAME: &str = "ascend";

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("read config {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// The file is not JSON, or not a JSON object.
    #[error("parse config {origin}: {message}")]
    Syntax { origin: String, message: String },
    /// A required key is absent from the file and from its environment fallback.
    #[error("config {origin}: key {key:?} is required (or set {env})")]
    Missing { origin: String, key: String, env: &'static str },
    /// A key has a value of the wrong shape.
    #[error("config {origin}: key {key:?}: expected {expected}, found {found}")]
    Invalid { origin: String, key: String, expected: String, found: String },
}

/// Which device implementation backs the device protocols.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceBackendKind {
    /// The CPU twin (default, runs anywhere): the CANN backend with its ACL and SHMEM tables resolved to the twin
    /// runtime (`shmem-bindings/cann-twin`), the CPU model of the NPU, instead of the vendor's libraries.
    Twin,
    /// Real Ascend NPUs through runtime-loaded CANN libraries (feature `cann`).
    Cann,
}

/// How the aiv transfer kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchMode {
    /// The kernel stays resident and polls the request ring: no Host device-API call per transfer (default).
    Persistent,
    /// One kernel launch per submitted group of requests.
    PerBatch,
}

/// Which path the aiv transport takes to a peer device (`"route"`, docs/rdma.md section 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteMode {
    /// SDMA through imported windows to a peer on this host (same host identity), RDMA to a peer on another host
    /// that advertises an `rdma` object; else the transfer fails, saying why (default).
    Auto,
    /// RDMA to every peer that advertises it, on this host too (tests and measurements on one machine); SDMA to
    /// peers that do not.
    Rdma,
    /// Never RDMA: the NIC is not opened; a peer on another host cannot be reached.
    Sdma,
}

impl RouteMode {
    /// The configuration value.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteMode::Auto => "auto",
            RouteMode::Rdma => "rdma",
            RouteMode::Sdma => "sdma",
        }
    }
}

/// This project's options: the `"aiv"` object of mooncake.json.
#[derive(Clone, Debug, PartialEq)]
pub struct AivOptions {
    /// `device_backend`: `"twin"` (default) or `"cann"`.
    pub device_backend: DeviceBackendKind,
    /// `device_id`: the NPU this engine drives (default 0).
    pub device_id: u32,
    /// `aiv_blocks`: AIV blocks the transfer kernel runs on, one SDMA channel each (default 2, at most 48).
    pub aiv_blocks: u32,
    /// `doorbell_batch`: SQEs written per doorbell; 1 rings after every SQE (default 8).
    pub doorbell_batch: u32,
    /// `launch_mode`: `"persistent"` (default) or `"per_batch"`.
    pub launch_mode: LaunchMode,
    /// `transfer_timeout_ms`: the Host watchdog's budget per transfer (default `MC_TRANSFER_TIMEOUT` seconds, else 30 s).
    pub transfer_timeout: Duration,
    /// `kernel_wait_budget_us`: how long the kernel spins on one completion flag before reporting TIMEOUT (default 1 s;
    /// with the RDMA route, at least the NIC's retry schedule, see `transport::aiv::setup::kernel_wait_budget`).
    pub kernel_wait_budget: Duration,
    /// `request_ring_depth`: entries per block's request ring, a power of two (default 1024).
    pub request_ring_depth: u32,
    /// `sq_depth`: SQEs per SDMA channel, a power of two (default 2048).
    pub sq_depth: u32,
    /// `hbm_size`: bytes of twin HBM per device (default 1 GiB; sizes accept suffixes).
    pub hbm_size: u64,
    /// `peer_probe_interval_ms`: how often the aiv transport checks that each imported peer still serves its memory
    /// (default 50 ms); a peer found gone fails its pending transfers (docs/ARCHITECTURE.md, "Peer loss").
    pub peer_probe_interval: Duration,
    /// `baseline_timeout_ms`: how long a baseline Host thread waits for one completion (an adxl HiXL batch, a
    /// ubshmem stream synchronisation; default 1 s).
    pub baseline_timeout: Duration,
    /// `ubshmem_workers`: Host worker threads of the ubshmem baseline (default 8, Mooncake's).
    pub ubshmem_workers: u32,
    /// `ubshmem_streams`: streams in the ubshmem stream pool (default 32, at least 4: a transfer uses 4).
    pub ubshmem_streams: u32,
    /// `hixl_host`: the address the adxl baseline's HiXL server (cann backend only) and the adxl-fabric baseline's
    /// FabricMem control server (twin runtime only) listen on and advertise.
    /// Default: `AIV_HIXL_HOST`, else the host part of `local_hostname` (filled in by the engine).
    pub hixl_host: Option<String>,
    /// `hixl_port`: that server's port; 0 (default) means `AIV_HIXL_PORT`, else a port the OS reports free.
    pub hixl_port: u16,
    /// `fabric_mem_port`: the port of the adxl-fabric baseline's FabricMem control server (twin runtime only; it
    /// listens on the HiXL host); 0 (default): a port the OS reports free.
    pub fabric_mem_port: u16,
    /// `fabric_memory`: the adxl-fabric baseline's FabricMem options, HiXL's `fabric_memory.*` keys
    /// ([`FabricMemoryOptions`]).
    pub fabric_memory: FabricMemoryOptions,
    /// `ascend_protocol`: the path that Mooncake's protocol name `"ascend"` (what vLLM-Ascend passes to
    /// `initialize`) runs on here: `aiv` (default), `adxl`, `adxl-fabric`, `ubshmem` or `tcp`. Default: `AIV_ASCEND_PROTOCOL`, else
    /// `aiv`. See [`AivOptions::resolve_protocol`].
    pub ascend_protocol: Protocol,
    /// `record_provenance`: whether the twin runtime records who wrote each SQE its SDMA engines consume, who rang each
    /// doorbell and who first read each completion flag, so the aiv path's evidence is observed (default `true`; on
    /// the vendor's runtime there are no such records and the option changes nothing). Off saves the records' cost
    /// on the post path (docs/evidence.md) and leaves those acts "not recorded". Process-wide: an engine that turns
    /// them on leaves them on.
    pub record_provenance: bool,

    // --- the RDMA route (docs/rdma.md section 7) ---
    /// `route`: `"auto"` (default), `"rdma"` or `"sdma"` ([`RouteMode`]).
    pub route: RouteMode,
    /// `rdma_max_wqe_bytes`: the largest message of one WQE; longer transfers take several (default 1 MiB, a power
    /// of two from 1 byte to 16 MiB: the kernel cuts pieces with shifts, having no divider).
    pub rdma_max_wqe_bytes: u32,
    /// `rdma_sq_depth`: SQ slots of each QP, a power of two (default 256, 4 to 32768); its CQ has as many CQEs.
    pub rdma_sq_depth: u32,
    /// `rdma_retry_count`: retransmissions of a request before the QP fails it with "transport retry count
    /// exceeded" (default 7, 0 to 7).
    pub rdma_retry_count: u8,
    /// `rdma_timeout_ms`: the wait for a response per attempt (default 100 ms, 1 to 10000).
    pub rdma_timeout: Duration,
    /// `rdma_host`: the IP address the device's NIC listens on and advertises. Default: the host part of
    /// `local_hostname` (filled in by the engine), else 127.0.0.1.
    pub rdma_host: Option<String>,
    /// `host_identity`: overrides where this engine says it is (default: the boot id and network namespace,
    /// `crate::device::HostIdentity::current`). For tests: engines of one process posing as different hosts.
    pub host_identity: Option<String>,

    // --- tcp client limits (connect deadline, reconnect backoff); parsed by `read_tcp_client_limits` ---
    /// `tcp_connect_timeout_ms`: one connect to a peer's data server, over every address its host resolves to
    /// (default 5000 ms, 1..=600000).
    pub tcp_connect_timeout: Duration,
    /// `tcp_reconnect_backoff_ms`: wait before reconnecting to a peer after a failed connect, doubled with each further
    /// failure (default 10 ms, 1..=60000).
    pub tcp_reconnect_backoff: Duration,
    /// `tcp_reconnect_backoff_max_ms`: the cap of that wait (default 1000 ms, 1..=600000, at least
    /// `tcp_reconnect_backoff_ms`).
    pub tcp_reconnect_backoff_max: Duration,

    // --- admission limits of the tcp data server; parsed by `read_admission_limits` ---
    /// The tcp data server's first-request deadline and per-source limit (`tcp_first_request_ms`, default 1 s;
    /// `tcp_max_connections_per_source`, default 128; see `transport::tcp::server`).
    pub tcp_first_request_timeout: Duration,
    /// See [`AivOptions::tcp_first_request_timeout`].
    pub tcp_max_connections_per_source: usize,
    /// `tcp_max_connections`: connections the tcp data server holds at once, from all sources (default 1024,
    /// 1..=65536, at least `tcp_max_connections_per_source`).
    pub tcp_max_connections: usize,
    /// `tcp_max_serving_threads`: threads serving tcp requests at once; waiting connections hold none (default 64,
    /// 1..=1024).
    pub tcp_max_serving_threads: usize,
    /// `tcp_idle_timeout_ms`: a tcp data connection with no request for this long is closed (default 300000,
    /// 1..=3600000).
    pub tcp_idle_timeout: Duration,
    /// `tcp_request_timeout_ms`: every tcp data request must be done (its WRITE payload in, its READ reply out)
    /// within this plus its size at `tcp_request_min_kib_per_s` of its header arriving, however steadily its bytes
    /// move (default 10000, 1..=3600000).
    pub tcp_request_timeout: Duration,
    /// `tcp_request_min_kib_per_s`: the rate (KiB per second) a request's size is granted at beyond
    /// `tcp_request_timeout_ms` (default 1024, 1..=16777216).
    pub tcp_request_min_kib_per_s: u64,
    /// `metadata_connect_timeout_ms`: one TCP connect of a metadata client (handshake, HTTP, etcd); when set, wins
    /// over `AIV_METADATA_CONNECT_TIMEOUT_MS` (default: that variable, else 1500 ms; 1..=600000).
    pub metadata_connect_timeout: Option<Duration>,
    /// `metadata_deadline_ms`: one whole metadata client operation (default: `AIV_METADATA_DEADLINE_MS`, else
    /// 3000 ms; 1..=600000).
    pub metadata_deadline: Option<Duration>,
    /// The handshake server's admission limits (`handshake_first_request_ms`, `handshake_max_connections`,
    /// `handshake_max_per_source`, `handshake_max_connection_handlers`; see `metadata::handshake::server`).
    pub handshake: HandshakeLimits,
    /// The HTTP metadata server's limits (`metadata_server_max_connections`, `metadata_server_max_buffered_bytes`,
    /// `metadata_server_request_timeout_ms`; see `metadata::http_server`), read by `aiv metadata-server --config`.
    pub metadata_server_limits: MetadataServerLimits,
}

impl AivOptions {
    /// The path a protocol name runs on: one of this engine's protocols by its own name (case-insensitive, as
    /// Mooncake lower-cases it), or Mooncake's `"ascend"`, which runs on [`AivOptions::ascend_protocol`]. Other
    /// Mooncake protocols (`rdma`, `hccl`, ...) and unknown names are refused, naming them.
    pub fn resolve_protocol(&self, name: &str) -> Result<Protocol, crate::transfer::ProtocolParseError> {
        if name.trim().eq_ignore_ascii_case(ASCEND_PROTOCOL_NAME) {
            return Ok(self.ascend_protocol);
        }
        name.parse::<Protocol>()
    }
}

/// `ascend_protocol`'s value: a path of this engine (`ascend` itself is not one); the error says what was found.
fn parse_ascend_protocol(text: &str) -> Result<Protocol, String> {
    text.parse::<Protocol>().map_err(|error| format!("{text:?} ({error})"))
}

impl Default for AivOptions {
    fn default() -> Self {
        AivOptions {
            device_backend: DeviceBackendKind::Twin,
            device_id: 0,
            aiv_blocks: 2,
            doorbell_batch: 8,
            launch_mode: LaunchMode::Persistent,
            transfer_timeout: Duration::from_secs(30),
            kernel_wait_budget: Duration::from_secs(1),
            request_ring_depth: 1024,
            sq_depth: 2048,
            hbm_size: 1 << 30,
            peer_probe_interval: Duration::from_millis(50),
            baseline_timeout: Duration::from_secs(1),
            ubshmem_workers: 8,
            ubshmem_streams: 32,
            hixl_host: None,
            hixl_port: 0,
            fabric_mem_port: 0,
            fabric_memory: FabricMemoryOptions::default(),
            ascend_protocol: Protocol::Aiv,
            record_provenance: true,
            route: RouteMode::Auto,
            rdma_max_wqe_bytes: 1 << 20,
            rdma_sq_depth: 256,
            rdma_retry_count: 7,
            rdma_timeout: Duration::from_millis(100),
            rdma_host: None,
            host_identity: None,
            // tcp client limits
            tcp_connect_timeout: Duration::from_secs(5),
            tcp_reconnect_backoff: Duration::from_millis(10),
            tcp_reconnect_backoff_max: Duration::from_secs(1),
            // admission limits
            tcp_first_request_timeout: Duration::from_secs(1),
            tcp_max_connections_per_source: 128,
            tcp_max_connections: 1024,
            tcp_max_serving_threads: 64,
            tcp_idle_timeout: Duration::from_secs(300),
            tcp_request_timeout: Duration::from_secs(10),
            tcp_request_min_kib_per_s: 1024,
            metadata_connect_timeout: None,
            metadata_deadline: None,
            handshake: HandshakeLimits::default(),
            metadata_server_limits: MetadataServerLimits::default(),
        }
    }
}

/// Admission limits of the handshake server on the RPC port (`metadata::handshake::server`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// The whole request frame must arrive within this of the accept (`aiv` option `handshake_first_request_ms`,
    /// default 1 s).
    pub request_timeout: Duration,
    /// Connections held at once (`handshake_max_connections`, default 256).
    pub max_connections: usize,
    /// Of those, from one source: an IPv4 address or an IPv6 /64 (`handshake_max_per_source`, default 32).
    pub max_per_source: usize,
    /// Connection handshakes answered at once by the transport's handler, each on a blocking thread
    /// (`handshake_max_connection_handlers`, default 4); one over that is refused at once, saying so.
    pub max_connection_handlers: usize,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits {
            request_timeout: Duration::from_secs(1),
            max_connections: 256,
            max_per_source: 32,
            max_connection_handlers: 4,
        }
    }
}

/// Accepted range of `metadata_server_max_connections`.
pub const METADATA_SERVER_MAX_CONNECTIONS: std::ops::RangeInclusive<u64> = 1..=65_536;
/// Accepted range of `metadata_server_max_buffered_bytes`: 1 byte to 1 TiB.
pub const METADATA_SERVER_MAX_BUFFERED_BYTES: std::ops::RangeInclusive<u64> = 1..=(1 << 40);
/// Accepted range of `metadata_server_request_timeout_ms`: 1 ms to 10 minutes.
pub const METADATA_SERVER_REQUEST_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 1..=600_000;

/// Limits of the HTTP metadata server (`metadata::http_server`): the connections it holds, how long a request may
/// take to arrive, and the request body bytes it buffers. Its store's own bounds are `StoreLimits`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataServerLimits {
    /// Connections held at once; a new one over it evicts a waiting one or is closed
    /// (`metadata_server_max_connections`, default 1024, well under the usual descriptor limit).
    pub max_connections: usize,
    /// Request body bytes all connections together may buffer; a PUT that does not fit is refused with 503
    /// (`metadata_server_max_buffered_bytes`, default 64 MiB).
    pub max_buffered_bytes: u64,
    /// Each request, headers and body, must arrive within this of the moment its connection started waiting for it
    /// (`metadata_server_request_timeout_ms`, default 10 s).
    pub request_timeout: Duration,
}

impl Default for MetadataServerLimits {
    fn default() -> Self {
        MetadataServerLimits {
            max_connections: 1024,
            max_buffered_bytes: 64 << 20,
            request_timeout: Duration::from_secs(10),
        }
    }
}

impl MetadataServerLimits {
    /// Checks each limit lies in its range; the error names the key, its value and the range.
    pub fn validate(&self) -> Result<(), String> {
        let limits = [
            ("metadata_server_max_connections", self.max_connections as u64, METADATA_SERVER_MAX_CONNECTIONS),
            ("metadata_server_max_buffered_bytes", self.max_buffered_bytes, METADATA_SERVER_MAX_BUFFERED_BYTES),
            (
                "metadata_server_request_timeout_ms",
                self.request_timeout.as_millis().min(u128::from(u64::MAX)) as u64,
                METADATA_SERVER_REQUEST_TIMEOUT_MS,
            ),
        ];
        for (name, value, range) in limits {
            if !range.contains(&value) {
                return Err(format!("{name} = {value} is outside {}..={}", range.start(), range.end()));
            }
        }
        Ok(())
    }
}

/// Everything an engine is started with.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// `local_hostname`: this engine's host (and, in P2P mode, the host part of its segment name).
    pub local_hostname: String,
    /// `metadata_server`: `P2PHANDSHAKE`, `http://host:port/metadata` or `etcd://host:port`.
    pub metadata_server: String,
    /// `protocol`: the default protocol of requests that name none.
    pub protocol: Protocol,
    /// `device_name`: comma-separated NIC list (kept for Mooncake compatibility).
    pub device_name: String,
    /// `master_server_address` (Mooncake Store; kept, unused by the transfer engine).
    pub master_server_address: Option<String>,
    /// `global_segment_size` in bytes (Mooncake Store; kept).
    pub global_segment_size: Option<u64>,
    /// `local_buffer_size` in bytes (Mooncake Store; kept).
    pub local_buffer_size: Option<u64>,
    /// The `"aiv"` object.
    pub aiv: AivOptions,
    /// Where the configuration came from, for messages.
    pub origin: String,
}

/// Environment the configuration may read, injectable for tests.
pub trait Environment {
    /// The value of `name`, if set and valid UTF-8.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl<F: Fn(&str) -> Option<String>> Environment for F {
    fn var(&self, name: &str) -> Option<String> {
        self(name)
    }
}

/// An environment that remembers every variable read through it that was set, with its value: what a report
/// records so that a rerun sees the same configuration ([`FixedEnvironment`]).
pub struct RecordingEnvironment<'a> {
    inner: &'a dyn Environment,
    seen: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

impl std::fmt::Debug for RecordingEnvironment<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingEnvironment").field("seen", &self.seen()).finish_non_exhaustive()
    }
}

impl<'a> RecordingEnvironment<'a> {
    pub fn new(inner: &'a dyn Environment) -> Self {
        RecordingEnvironment { inner, seen: std::sync::Mutex::new(std::collections::BTreeMap::new()) }
    }

    /// The variables read that were set, by name.
    pub fn seen(&self) -> std::collections::BTreeMap<String, String> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Environment for RecordingEnvironment<'_> {
    fn var(&self, name: &str) -> Option<String> {
        let value = self.inner.var(name);
        if let Some(value) = &value {
            self.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_owned(), value.clone());
        }
        value
    }
}

/// An environment of exactly these variables (nothing of the process's): a recorded run's, replayed.
#[derive(Clone, Debug, Default)]
pub struct FixedEnvironment(pub std::collections::BTreeMap<String, String>);

impl Environment for FixedEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
}

impl EngineConfig {
    /// A configuration for `local_hostname` with every other field at its default (P2P handshake, tcp).
    pub fn new(local_hostname: impl Into<String>) -> Self {
        EngineConfig {
            local_hostname: local_hostname.into(),
            metadata_server: "P2PHANDSHAKE".into(),
            protocol: Protocol::Tcp,
            device_name: String::new(),
            master_server_address: None,
            global_segment_size: None,
            local_buffer_size: None,
            aiv: AivOptions::default(),
            origin: "defaults".into(),
        }
    }

    /// Loads the file named by `path`, else by `MOONCAKE_CONFIG_PATH`, else builds the configuration from the
    /// `MOONCAKE_*` environment variables alone.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let env = ProcessEnvironment;
        match path.map(Path::to_path_buf).or_else(|| env.var(CONFIG_PATH_ENV).map(PathBuf::from)) {
            Some(path) => EngineConfig::from_file(&path, &env),
            None => EngineConfig::from_json("{}", "environment", &env),
        }
    }

    /// [`EngineConfig::load`] with `env` for the environment; without a file, `default_hostname` stands in for
    /// `MOONCAKE_LOCAL_HOSTNAME` when that is unset (a file must still name its host, as Mooncake requires).
    pub fn load_with(path: Option<&Path>, env: &dyn Environment, default_hostname: &str) -> Result<Self, ConfigError> {
        match path.map(Path::to_path_buf).or_else(|| env.var(CONFIG_PATH_ENV).map(PathBuf::from)) {
            Some(path) => EngineConfig::from_file(&path, env),
            None => {
                let with_default = |name: &str| {
                    env.var(name).or_else(|| (name == "MOONCAKE_LOCAL_HOSTNAME").then(|| default_hostname.to_owned()))
                };
                EngineConfig::from_json("{}", "environment", &with_default)
            }
        }
    }

    /// Reads a mooncake.json file.
    pub fn from_file(path: &Path, env: &dyn Environment) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        EngineConfig::from_json(&text, &path.display().to_string(), env)
    }

    /// Parses mooncake.json text; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str, env: &dyn Environment) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|error| ConfigError::Syntax {
            origin: origin.to_owned(),
            message: format!("line {} column {}: {error}", error.line(), error.column()),
        })?;
        let Value::Object(root) = value else {
            return Err(ConfigError::Syntax {
                origin: origin.to_owned(),
                message: format!("expected a JSON object at the top level, found {}", kind_of(&value)),
            });
        };
        let fields = Fields { origin, object: &root, prefix: "" };

        let local_hostname = fields
            .string("local_hostname")?
            .or_else(|| env.var("MOONCAKE_LOCAL_HOSTNAME"))
            .filter(|host| !host.trim().is_empty())
            .ok_or_else(|| ConfigError::Missing {
                origin: origin.to_owned(),
                key: "local_hostname".into(),
                env: "MOONCAKE_LOCAL_HOSTNAME",
            })?;
        let metadata_server = fields
            .string("metadata_server")?
            .or_else(|| env.var("MOONCAKE_TE_META_DATA_SERVER"))
            .unwrap_or_else(|| "P2PHANDSHAKE".into());
        let (protocol_name, protocol_key) = match fields.string("protocol")? {
            Some(name) => (name, "protocol"),
            None => (env.var("MOONCAKE_PROTOCOL").unwrap_or_else(|| "tcp".into()), "MOONCAKE_PROTOCOL"),
        };
        let device_name = fields.string("device_name")?.or_else(|| env.var("MOONCAKE_DEVICE")).unwrap_or_default();

        let mut aiv = AivOptions::default();
        if let Some(text) = env.var(ASCEND_PROTOCOL_ENV) {
            aiv.ascend_protocol = parse_ascend_protocol(&text).map_err(|found| ConfigError::Invalid {
                origin: "environment".into(),
                key: ASCEND_PROTOCOL_ENV.into(),
                expected: "one of aiv, adxl, adxl-fabric, ubshmem, tcp".into(),
                found,
            })?;
        }
        if let Some(text) = env.var("MC_TRANSFER_TIMEOUT") {
            aiv.transfer_timeout = transfer_timeout_from_env(&text).map_err(|expected| ConfigError::Invalid {
                origin: "environment".into(),
                key: "MC_TRANSFER_TIMEOUT".into(),
                expected,
                found: format!("{text:?}"),
            })?;
        }
        match root.get("aiv") {
            None | Some(Value::Null) => {}
            Some(Value::Object(object)) => read_aiv_options(&Fields { origin, object, prefix: "aiv." }, &mut aiv)?,
            Some(other) => return Err(fields.invalid("aiv", "an object", other)),
        }
        // After the "aiv" object: "ascend" runs on the path its `ascend_protocol` names.
        let protocol = aiv.resolve_protocol(&protocol_name).map_err(|error| ConfigError::Invalid {
            origin: origin.to_owned(),
            key: protocol_key.into(),
            expected: "one of aiv, adxl, adxl-fabric, ubshmem, tcp, or ascend (mapped by aiv.ascend_protocol)".into(),
            found: error.to_string(),
        })?;

        Ok(EngineConfig {
            local_hostname,
            metadata_server,
            protocol,
            device_name,
            master_server_address: fields.string("master_server_address")?,
            global_segment_size: fields.size("global_segment_size")?,
            local_buffer_size: fields.size("local_buffer_size")?,
            aiv,
            origin: origin.to_owned(),
        })
    }
}

fn read_aiv_options(fields: &Fields<'_>, aiv: &mut AivOptions) -> Result<(), ConfigError> {
    if let Some(name) = fields.string("device_backend")? {
        aiv.device_backend = match name.to_ascii_lowercase().as_str() {
            "twin" => DeviceBackendKind::Twin,
            "cann" => DeviceBackendKind::Cann,
            _ => return Err(fields.invalid("device_backend", "\"twin\" or \"cann\"", &Value::String(name))),
        };
    }
    if let Some(name) = fields.string("launch_mode")? {
        aiv.launch_mode = match name.to_ascii_lowercase().as_str() {
            "persistent" => LaunchMode::Persistent,
            "per_batch" => LaunchMode::PerBatch,
            _ => return Err(fields.invalid("launch_mode", "\"persistent\" or \"per_batch\"", &Value::String(name))),
        };
    }
    if let Some(id) = fields.integer("device_id", 0, u64::from(MAX_DEVICE_ID))? {
        aiv.device_id = id as u32;
    }
    if let Some(blocks) = fields.integer("aiv_blocks", 1, 48)? {
        aiv.aiv_blocks = blocks as u32;
    }
    if let Some(batch) = fields.integer("doorbell_batch", 1, 1024)? {
        aiv.doorbell_batch = batch as u32;
    }
    if let Some(ms) = fields.integer("transfer_timeout_ms", 0, u64::MAX)? {
        aiv.transfer_timeout = transfer_timeout_ms(ms)
            .map_err(|expected| fields.invalid("transfer_timeout_ms", &expected, &Value::from(ms)))?;
    }
    if let Some(us) = fields.integer("kernel_wait_budget_us", 1, 600_000_000)? {
        aiv.kernel_wait_budget = Duration::from_micros(us);
    }
    if let Some(ms) = fields.integer("peer_probe_interval_ms", 1, 60_000)? {
        aiv.peer_probe_interval = Duration::from_millis(ms);
    }
    if let Some(depth) = fields.power_of_two("request_ring_depth", 2, 1 << 20)? {
        aiv.request_ring_depth = depth;
    }
    if let Some(depth) = fields.power_of_two("sq_depth", 4, 1 << 16)? {
        aiv.sq_depth = depth;
    }
    if let Some(size) = fields.size("hbm_size")? {
        if !(1 << 20..=MAX_HBM_SIZE).contains(&size) {
            return Err(fields.invalid("hbm_size", "from 1 MiB to 64 GiB", &Value::from(size)));
        }
        aiv.hbm_size = size;
    }
    if let Some(ms) = fields.integer("baseline_timeout_ms", 1, 600_000)? {
        aiv.baseline_timeout = Duration::from_millis(ms);
    }
    if let Some(workers) = fields.integer("ubshmem_workers", 1, 256)? {
        aiv.ubshmem_workers = workers as u32;
    }
    if let Some(streams) = fields.integer("ubshmem_streams", 4, 1024)? {
        aiv.ubshmem_streams = streams as u32;
    }
    if let Some(host) = fields.string("hixl_host")? {
        if host.trim().is_empty() || host.contains('\0') {
            return Err(fields.invalid("hixl_host", "a host name or IP address", &Value::String(host)));
        }
        aiv.hixl_host = Some(host.trim().to_owned());
    }
    if let Some(port) = fields.integer("hixl_port", 0, u64::from(u16::MAX))? {
        aiv.hixl_port = port as u16;
    }
    if let Some(port) = fields.integer("fabric_mem_port", 0, u64::from(u16::MAX))? {
        aiv.fabric_mem_port = port as u16;
    }
    aiv.fabric_memory = read_fabric_memory(fields)?;
    if let Some(name) = fields.string("ascend_protocol")? {
        aiv.ascend_protocol = parse_ascend_protocol(&name).map_err(|_| {
            fields.invalid("ascend_protocol", "one of aiv, adxl, adxl-fabric, ubshmem, tcp", &Value::String(name))
        })?;
    }
    if let Some(on) = fields.boolean("record_provenance")? {
        aiv.record_provenance = on;
    }
    read_rdma_options(fields, aiv)?;
    read_tcp_client_limits(fields, aiv)?;
    read_admission_limits(fields, aiv)?;
    read_metadata_server_limits(fields, &mut aiv.metadata_server_limits)
}

/// The adxl-fabric baseline's FabricMem options (`aiv.fabric_memory`), with HiXL's names, defaults and ranges
/// (`fabric_memory.*` of its global resource configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FabricMemoryOptions {
    /// `enable_aicpu_unfold`: AI-CPU unfold (default `true`: batched SDMA SQEs written by AI-CPU launches, one launch
    /// per 128 descriptors); `false`: Host unfold (one `aclrtMemcpyAsync` per operation).
    pub enable_aicpu_unfold: bool,
    /// `task_stream_num`: the Host unfold's streams, 1 to 8 (default 1); must be 1 with AI-CPU unfold, which HiXL
    /// refuses otherwise.
    pub task_stream_num: u32,
}

impl Default for FabricMemoryOptions {
    fn default() -> Self {
        FabricMemoryOptions { enable_aicpu_unfold: true, task_stream_num: 1 }
    }
}

/// The most streams of FabricMem's Host unfold (`fabric_memory.task_stream_num`).
pub const MAX_FABRIC_TASK_STREAMS: u64 = 8;

/// `aiv.fabric_memory`: an object `{"enable_aicpu_unfold": bool, "task_stream_num": 1..8}`, or the flat keys
/// `"fabric_memory.enable_aicpu_unfold"` / `"fabric_memory.task_stream_num"` of the `"aiv"` object (HiXL takes both
/// forms); a key given both ways is refused.
fn read_fabric_memory(fields: &Fields<'_>) -> Result<FabricMemoryOptions, ConfigError> {
    let mut options = FabricMemoryOptions::default();
    let nested = match fields.object.get("fabric_memory") {
        None | Some(Value::Null) => None,
        Some(Value::Object(object)) => Some(Fields { origin: fields.origin, object, prefix: "aiv.fabric_memory." }),
        Some(other) => {
            return Err(fields.invalid(
                "fabric_memory",
                "an object with enable_aicpu_unfold and task_stream_num",
                other,
            ))
        }
    };
    let flat = |key: &str| format!("fabric_memory.{key}");
    for key in ["enable_aicpu_unfold", "task_stream_num"] {
        if nested.as_ref().is_some_and(|n| n.object.contains_key(key)) && fields.object.contains_key(&flat(key)) {
            return Err(fields.invalid(
                &flat(key),
                "one form: the key inside \"fabric_memory\" or the flat key, not both",
                &fields.object[&flat(key)],
            ));
        }
    }
    let unfold = match &nested {
        Some(nested) if nested.object.contains_key("enable_aicpu_unfold") => nested.boolean("enable_aicpu_unfold")?,
        _ => fields.boolean("fabric_memory.enable_aicpu_unfold")?,
    };
    let streams = match &nested {
        Some(nested) if nested.object.contains_key("task_stream_num") => {
            nested.integer("task_stream_num", 1, MAX_FABRIC_TASK_STREAMS)?
        }
        _ => fields.integer("fabric_memory.task_stream_num", 1, MAX_FABRIC_TASK_STREAMS)?,
    };
    if let Some(on) = unfold {
        options.enable_aicpu_unfold = on;
    }
    if let Some(streams) = streams {
        options.task_stream_num = streams as u32;
    }
    if options.enable_aicpu_unfold && options.task_stream_num != 1 {
        return Err(fields.invalid(
            "fabric_memory.task_stream_num",
            "1 while fabric_memory.enable_aicpu_unfold is true (HiXL refuses more streams with AI-CPU unfold; set \
             enable_aicpu_unfold to false for the Host unfold's 1 to 8)",
            &Value::from(options.task_stream_num),
        ));
    }
    Ok(options)
}

/// The RDMA route's options of the `"aiv"` object.
fn read_rdma_options(fields: &Fields<'_>, aiv: &mut AivOptions) -> Result<(), ConfigError> {
    if let Some(name) = fields.string("route")? {
        aiv.route = match name.to_ascii_lowercase().as_str() {
            "auto" => RouteMode::Auto,
            "rdma" => RouteMode::Rdma,
            "sdma" => RouteMode::Sdma,
            _ => return Err(fields.invalid("route", "\"auto\", \"rdma\" or \"sdma\"", &Value::String(name))),
        };
    }
    let max_wqe = u64::from(crate::kernel_abi::RDMA_MAX_WQE_BYTES);
    if let Some(bytes) = fields.power_of_two("rdma_max_wqe_bytes", 1, max_wqe)? {
        aiv.rdma_max_wqe_bytes = bytes;
    }
    if let Some(depth) = fields.power_of_two("rdma_sq_depth", 4, 1 << 15)? {
        aiv.rdma_sq_depth = depth;
    }
    if let Some(count) = fields.integer("rdma_retry_count", 0, 7)? {
        aiv.rdma_retry_count = count as u8;
    }
    if let Some(ms) = fields.integer("rdma_timeout_ms", 1, 10_000)? {
        aiv.rdma_timeout = Duration::from_millis(ms);
    }
    if let Some(host) = fields.string("rdma_host")? {
        if host.trim().parse::<std::net::IpAddr>().is_err() {
            return Err(fields.invalid("rdma_host", "an IP address", &Value::String(host)));
        }
        aiv.rdma_host = Some(host.trim().to_owned());
    }
    if let Some(identity) = fields.string("host_identity")? {
        if identity.trim().is_empty() {
            return Err(fields.invalid("host_identity", "a non-empty string", &Value::String(identity)));
        }
        aiv.host_identity = Some(identity.trim().to_owned());
    }
    Ok(())
}

/// The tcp client limits of the `"aiv"` object.
fn read_tcp_client_limits(fields: &Fields<'_>, aiv: &mut AivOptions) -> Result<(), ConfigError> {
    if let Some(ms) = fields.integer("tcp_connect_timeout_ms", 1, 600_000)? {
        aiv.tcp_connect_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = fields.integer("tcp_reconnect_backoff_ms", 1, 60_000)? {
        aiv.tcp_reconnect_backoff = Duration::from_millis(ms);
    }
    if let Some(ms) = fields.integer("tcp_reconnect_backoff_max_ms", 1, 600_000)? {
        aiv.tcp_reconnect_backoff_max = Duration::from_millis(ms);
    }
    if aiv.tcp_reconnect_backoff_max < aiv.tcp_reconnect_backoff {
        let found = Value::from(aiv.tcp_reconnect_backoff_max.as_millis() as u64);
        let expected = format!("at least tcp_reconnect_backoff_ms ({})", aiv.tcp_reconnect_backoff.as_millis());
        return Err(fields.invalid("tcp_reconnect_backoff_max_ms", &expected, &found));
    }
    Ok(())
}

/// The admission limits of the `"aiv"` object: the tcp data server's and the handshake
/// server's.
fn read_admission_limits(fields: &Fields<'_>, aiv: &mut AivOptions) -> Result<(), ConfigError> {
    if let Some(ms) = fields.integer("tcp_first_request_ms", 1, 600_000)? {
        aiv.tcp_first_request_timeout = Duration::from_millis(ms);
    }
    if let Some(count) = fields.integer("tcp_max_connections_per_source", 1, 65_536)? {
        aiv.tcp_max_connections_per_source = count as usize;
    }
    if let Some(count) = fields.integer("tcp_max_connections", 1, 65_536)? {
        aiv.tcp_max_connections = count as usize;
    }
    if aiv.tcp_max_connections_per_source > aiv.tcp_max_connections {
        let found = Value::from(aiv.tcp_max_connections_per_source as u64);
        let expected = format!("at most tcp_max_connections ({})", aiv.tcp_max_connections);
        return Err(fields.invalid("tcp_max_connections_per_source", &expected, &found));
    }
    if let Some(count) = fields.integer("tcp_max_serving_threads", 1, 1024)? {
        aiv.tcp_max_serving_threads = count as usize;
    }
    if let Some(ms) = fields.integer("tcp_idle_timeout_ms", 1, 3_600_000)? {
        aiv.tcp_idle_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = fields.integer("tcp_request_timeout_ms", 1, 3_600_000)? {
        aiv.tcp_request_timeout = Duration::from_millis(ms);
    }
    if let Some(rate) = fields.integer("tcp_request_min_kib_per_s", 1, 16_777_216)? {
        aiv.tcp_request_min_kib_per_s = rate;
    }
    if let Some(ms) = fields.integer("metadata_connect_timeout_ms", 1, 600_000)? {
        aiv.metadata_connect_timeout = Some(Duration::from_millis(ms));
    }
    if let Some(ms) = fields.integer("metadata_deadline_ms", 1, 600_000)? {
        aiv.metadata_deadline = Some(Duration::from_millis(ms));
    }
    if let Some(ms) = fields.integer("handshake_first_request_ms", 1, 60_000)? {
        aiv.handshake.request_timeout = Duration::from_millis(ms);
    }
    if let Some(count) = fields.integer("handshake_max_connections", 1, 65_536)? {
        aiv.handshake.max_connections = count as usize;
    }
    if let Some(count) = fields.integer("handshake_max_per_source", 1, 65_536)? {
        aiv.handshake.max_per_source = count as usize;
    }
    if let Some(count) = fields.integer("handshake_max_connection_handlers", 1, 256)? {
        aiv.handshake.max_connection_handlers = count as usize;
    }
    if aiv.handshake.max_per_source > aiv.handshake.max_connections {
        let found = Value::from(aiv.handshake.max_per_source as u64);
        let expected = format!("at most handshake_max_connections ({})", aiv.handshake.max_connections);
        return Err(fields.invalid("handshake_max_per_source", &expected, &found));
    }
    Ok(())
}

/// The HTTP metadata server's limits in the `"aiv"` object.
fn read_metadata_server_limits(fields: &Fields<'_>, limits: &mut MetadataServerLimits) -> Result<(), ConfigError> {
    let (low, high) = (*METADATA_SERVER_MAX_CONNECTIONS.start(), *METADATA_SERVER_MAX_CONNECTIONS.end());
    if let Some(count) = fields.integer("metadata_server_max_connections", low, high)? {
        limits.max_connections = count as usize;
    }
    if let Some(bytes) = fields.size("metadata_server_max_buffered_bytes")? {
        if !METADATA_SERVER_MAX_BUFFERED_BYTES.contains(&bytes) {
            let expected = "a size from 1 byte to 1 TiB (1099511627776 bytes)";
            return Err(fields.invalid("metadata_server_max_buffered_bytes", expected, &Value::from(bytes)));
        }
        limits.max_buffered_bytes = bytes;
    }
    let (low, high) = (*METADATA_SERVER_REQUEST_TIMEOUT_MS.start(), *METADATA_SERVER_REQUEST_TIMEOUT_MS.end());
    if let Some(ms) = fields.integer("metadata_server_request_timeout_ms", low, high)? {
        limits.request_timeout = Duration::from_millis(ms);
    }
    Ok(())
}

/// Largest `aiv.hbm_size`: 64 GiB. The twin maps its HBM as one sparse memfd (pages are allocated as they are
/// touched), so the bound is a guard against typos such as `"1tb"`, not a statement about a device.
pub const MAX_HBM_SIZE: u64 = 64 << 30;

/// Largest `aiv.device_id`: the in-process bench pair puts its target on `device_id + 1`, which must not wrap.
pub const MAX_DEVICE_ID: u32 = 65_535;

/// Largest per-transfer watchdog budget, from the file (`transfer_timeout_ms`) or `MC_TRANSFER_TIMEOUT`: one hour.
pub const MAX_TRANSFER_TIMEOUT_MS: u64 = 3_600_000;

/// The one rule for the per-transfer watchdog budget, wherever it comes from: 1 ms to one hour. The error says what
/// is accepted.
pub fn transfer_timeout_ms(ms: u64) -> Result<Duration, String> {
    if (1..=MAX_TRANSFER_TIMEOUT_MS).contains(&ms) {
        Ok(Duration::from_millis(ms))
    } else {
        Err(format!("an integer from 1 to {MAX_TRANSFER_TIMEOUT_MS} (milliseconds)"))
    }
}

/// The transfer timeout from `MC_TRANSFER_TIMEOUT`: whole seconds, as Mooncake reads it, under
/// [`transfer_timeout_ms`]'s rule (so 1 to 3600 s).
pub fn transfer_timeout_from_env(text: &str) -> Result<Duration, String> {
    let expected = || format!("whole seconds from 1 to {}", MAX_TRANSFER_TIMEOUT_MS / 1000);
    let seconds = text.trim().parse::<u64>().map_err(|_| expected())?;
    transfer_timeout_ms(seconds.saturating_mul(1000)).map_err(|_| expected())
}

/// Typed access to the keys of one JSON object, with errors naming origin and key.
struct Fields<'a> {
    origin: &'a str,
    object: &'a Map<String, Value>,
    prefix: &'static str,
}

impl Fields<'_> {
    fn invalid(&self, key: &str, expected: &str, found: &Value) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.to_owned(),
            key: format!("{}{key}", self.prefix),
            expected: expected.to_owned(),
            found: describe(found),
        }
    }

    fn string(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(other) => Err(self.invalid(key, "a string", other)),
        }
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(on)) => Ok(Some(*on)),
            Some(other) => Err(self.invalid(key, "true or false", other)),
        }
    }

    fn integer(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ConfigError> {
        let value = match self.object.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(value) => value,
        };
        let expected = format!("an integer from {min} to {max}");
        let number = match value {
            Value::Number(number) => number.as_u64(),
            Value::String(text) => text.trim().parse::<u64>().ok(),
            _ => None,
        };
        match number {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(self.invalid(key, &expected, value)),
        }
    }

    fn power_of_two(&self, key: &str, min: u64, max: u64) -> Result<Option<u32>, ConfigError> {
        match self.integer(key, min, max)? {
            Some(n) if n.is_power_of_two() => Ok(Some(n as u32)),
            Some(n) => Err(self.invalid(key, &format!("a power of two from {min} to {max}"), &Value::from(n))),
            None => Ok(None),
        }
    }

    fn size(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(number)) => match number.as_u64() {
                Some(n) => Ok(Some(n)),
                None => Err(self.invalid(
                    key,
                    "a size in bytes or a string such as \"4gb\"",
                    &Value::Number(number.clone()),
                )),
            },
            Some(Value::String(text)) => parse_size(text).map(Some).map_err(|reason| {
                self.invalid(key, &format!("a size such as \"512mb\" ({reason})"), &Value::String(text.clone()))
            }),
            Some(other) => Err(self.invalid(key, "a size in bytes or a string such as \"4gb\"", other)),
        }
    }
}

/// Parses a size: a number of bytes with an optional suffix `b`, `k`/`kb`/`kib`, `m`/`mb`/`mib`, `g`/`gb`/`gib`,
/// `t`/`tb`/`tib` (case-insensitive, binary multiples as Mooncake uses them); a fraction such as `1.5gb` is allowed.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let lower = text.trim().to_ascii_lowercase();
    let split = lower.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(lower.len());
    let (number, unit) = lower.split_at(split);
    let shift = match unit.trim() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("unknown unit {other:?}")),
    };
    if number.is_empty() {
        return Err("no number".into());
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_shl(shift).filter(|v| v >> shift == whole).ok_or_else(|| "too large".into());
    }
    let fraction: f64 = number.parse().map_err(|_| format!("{number:?} is not a number"))?;
    let bytes = fraction * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err("too large".into());
    }
    Ok(bytes.round() as u64)
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::String(text) => format!("{text:?}"),
        Value::Number(number) => number.to_string(),
        Value::Bool(flag) => flag.to_string(),
        other => kind_of(other).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn parse(text: &str) -> Result<EngineConfig, ConfigError> {
        EngineConfig::from_json(text, "test.json", &no_env)
    }

    #[test]
    fn a_recorded_environment_replays_the_same_configuration() {
        let process = |name: &str| match name {
            "MOONCAKE_PROTOCOL" => Some("ubshmem".to_owned()),
            "MC_TRANSFER_TIMEOUT" => Some("7".to_owned()),
            "UNRELATED" => Some("x".to_owned()),
            _ => None,
        };
        let recording = RecordingEnvironment::new(&process);
        let first = EngineConfig::load_with(None, &recording, "h").expect("valid environment");
        let seen = recording.seen();
        assert_eq!(seen.get("MOONCAKE_PROTOCOL").map(String::as_str), Some("ubshmem"));
        assert!(!seen.contains_key("UNRELATED"), "only what the configuration read: {seen:?}");
        let replayed = EngineConfig::load_with(None, &FixedEnvironment(seen), "h").expect("replays");
        assert_eq!(format!("{first:?}"), format!("{replayed:?}"));
        let other = EngineConfig::load_with(None, &FixedEnvironment::default(), "h").expect("defaults");
        assert_ne!(format!("{first:?}"), format!("{other:?}"), "the recorded variables change the configuration");
    }

    #[test]
    fn reads_a_mooncake_file_with_unknown_keys() {
        let config = parse(
            r#"{"local_hostname": "10.0.0.1", "metadata_server": "etcd://127.0.0.1:2379", "protocol": "AIV",
                "device_name": "", "master_server_address": "127.0.0.1:50051", "global_segment_size": "4gb",
                "local_buffer_size": 536870912, "some_future_key": {"x": 1}}"#,
        )
        .expect("valid file");
        assert_eq!(config.protocol, Protocol::Aiv);
        assert_eq!(config.global_segment_size, Some(4 << 30));
        assert_eq!(config.local_buffer_size, Some(512 << 20));
        assert_eq!(config.aiv, AivOptions::default());
    }

    #[test]
    fn baseline_options_are_read_and_checked() {
        let config = parse(
            r#"{"local_hostname": "h", "aiv": {"baseline_timeout_ms": 250, "ubshmem_workers": 2, "ubshmem_streams": 8}}"#,
        )
        .expect("valid baseline options");
        assert_eq!(config.aiv.baseline_timeout, Duration::from_millis(250));
        assert_eq!((config.aiv.ubshmem_workers, config.aiv.ubshmem_streams), (2, 8));
        let error = parse(r#"{"local_hostname": "h", "aiv": {"ubshmem_streams": 3}}"#).expect_err("below 4");
        assert!(error.to_string().contains("aiv.ubshmem_streams"), "{error}");
        let config = parse(r#"{"local_hostname": "h", "aiv": {"hixl_host": "10.0.0.7", "hixl_port": 16000}}"#)
            .expect("valid HiXL server options");
        assert_eq!((config.aiv.hixl_host.as_deref(), config.aiv.hixl_port), (Some("10.0.0.7"), 16000));
        let error = parse(r#"{"local_hostname": "h", "aiv": {"hixl_port": 70000}}"#).expect_err("not a port");
        assert!(error.to_string().contains("aiv.hixl_port"), "{error}");
        let error = parse(r#"{"local_hostname": "h", "aiv": {"hixl_host": " "}}"#).expect_err("empty host");
        assert!(error.to_string().contains("aiv.hixl_host"), "{error}");
    }

    #[test]
    fn tcp_client_limits_are_read_and_range_checked() {
        let config = parse(
            r#"{"local_hostname": "h", "aiv": {"tcp_connect_timeout_ms": 250, "tcp_reconnect_backoff_ms": 20,
                "tcp_reconnect_backoff_max_ms": 400}}"#,
        )
        .expect("valid tcp client limits");
        assert_eq!(config.aiv.tcp_connect_timeout, Duration::from_millis(250));
        assert_eq!(config.aiv.tcp_reconnect_backoff, Duration::from_millis(20));
        assert_eq!(config.aiv.tcp_reconnect_backoff_max, Duration::from_millis(400));
        assert_eq!(AivOptions::default().tcp_reconnect_backoff_max, Duration::from_secs(1));
        let error = parse(r#"{"local_hostname": "h", "aiv": {"tcp_connect_timeout_ms": 0}}"#).expect_err("zero");
        assert!(
            error.to_string().contains("aiv.tcp_connect_timeout_ms") && error.to_string().contains("600000"),
            "{error}"
        );
        let error = parse(
            r#"{"local_hostname": "h", "aiv": {"tcp_reconnect_backoff_ms": 50, "tcp_reconnect_backoff_max_ms": 10}}"#,
        )
        .expect_err("cap below the first wait");
        assert!(error.to_string().contains("aiv.tcp_reconnect_backoff_max_ms"), "{error}");
    }

    #[test]
    fn admission_limits_are_read_and_checked() {
        let config = parse(
            r#"{"local_hostname": "h", "aiv": {"tcp_first_request_ms": 700, "tcp_max_connections_per_source": 16}}"#,
        )
        .expect("valid admission limits");
        assert_eq!(config.aiv.tcp_first_request_timeout, Duration::from_millis(700));
        assert_eq!(config.aiv.tcp_max_connections_per_source, 16);
        let config = parse(
            r#"{"local_hostname": "h", "aiv": {"handshake_first_request_ms": 300, "handshake_max_connections": 40,
                "handshake_max_per_source": 4, "handshake_max_connection_handlers": 2}}"#,
        )
        .expect("valid handshake limits");
        let handshake = &config.aiv.handshake;
        assert_eq!(handshake.request_timeout, Duration::from_millis(300));
        assert_eq!((handshake.max_connections, handshake.max_per_source), (40, 4));
        assert_eq!(handshake.max_connection_handlers, 2);
        assert_eq!(HandshakeLimits::default().max_connection_handlers, 4);
        let error = parse(r#"{"local_hostname": "h", "aiv": {"handshake_max_connection_handlers": 257}}"#)
            .expect_err("above the range");
        assert!(error.to_string().contains("aiv.handshake_max_connection_handlers"), "{error}");
        let config = parse(
            r#"{"local_hostname": "h", "aiv": {"tcp_max_connections": 200, "tcp_max_serving_threads": 8,
                "tcp_idle_timeout_ms": 5000, "metadata_connect_timeout_ms": 250, "metadata_deadline_ms": 900}}"#,
        )
        .expect("valid tcp and metadata limits");
        assert_eq!((config.aiv.tcp_max_connections, config.aiv.tcp_max_serving_threads), (200, 8));
        assert_eq!(config.aiv.tcp_idle_timeout, Duration::from_secs(5));
        assert_eq!(config.aiv.metadata_connect_timeout, Some(Duration::from_millis(250)));
        assert_eq!(config.aiv.metadata_deadline, Some(Duration::from_millis(900)));
        let error = parse(r#"{"local_hostname": "h", "aiv": {"tcp_max_connections": 100}}"#)
            .expect_err("fewer in all than per source (128 by default)");
        assert!(error.to_string().contains("at most tcp_max_connections (100)"), "{error}");
        let error = parse(r#"{"local_hostname": "h", "aiv": {"handshake_max_per_source": 300}}"#)
            .expect_err("more per source than in all (256 by default)");
        assert!(error.to_string().contains("at most handshake_max_connections (256)"), "{error}");
        for key in [
            "tcp_first_request_ms",
            "tcp_max_connections_per_source",
            "handshake_first_request_ms",
            "handshake_max_connections",
            "handshake_max_connection_handlers",
        ] {
            let error = parse(&format!(r#"{{"local_hostname": "h", "aiv": {{"{key}": 0}}}}"#)).expect_err("zero");
            assert!(error.to_string().contains(&format!("aiv.{key}")), "{error}");
        }
    }

    #[test]
    fn metadata_server_limits_are_read_and_checked() {
        let config = parse(
            r#"{"local_hostname": "h", "aiv": {"metadata_server_max_connections": 64,
                "metadata_server_max_buffered_bytes": "8mb", "metadata_server_request_timeout_ms": 1500}}"#,
        )
        .expect("valid metadata server limits");
        let limits = &config.aiv.metadata_server_limits;
        assert_eq!((limits.max_connections, limits.max_buffered_bytes), (64, 8 << 20));
        assert_eq!(limits.request_timeout, Duration::from_millis(1500));
        assert_eq!(
            parse(r#"{"local_hostname": "h"}"#).expect("defaults").aiv.metadata_server_limits,
            MetadataServerLimits::default()
        );
        for (key, value, range) in [
            ("metadata_server_max_connections", "0", "from 1 to 65536"),
            ("metadata_server_max_connections", "65537", "from 1 to 65536"),
            ("metadata_server_max_buffered_bytes", "0", "1 TiB"),
            ("metadata_server_max_buffered_bytes", "\"2tb\"", "1 TiB"),
            ("metadata_server_request_timeout_ms", "0", "from 1 to 600000"),
            ("metadata_server_request_timeout_ms", "600001", "from 1 to 600000"),
        ] {
            let error =
                parse(&format!(r#"{{"local_hostname": "h", "aiv": {{"{key}": {value}}}}}"#)).expect_err("out of range");
            let text = error.to_string();
            assert!(text.contains(&format!("aiv.{key}")) && text.contains(range), "{key} = {value}: {text}");
        }
        let outside = MetadataServerLimits { max_connections: 0, ..MetadataServerLimits::default() };
        let error = outside.validate().expect_err("zero connections");
        assert!(error.contains("metadata_server_max_connections = 0") && error.contains("1..=65536"), "{error}");
        let outside = MetadataServerLimits { request_timeout: Duration::ZERO, ..MetadataServerLimits::default() };
        assert!(outside.validate().expect_err("zero timeout").contains("metadata_server_request_timeout_ms = 0"));
    }

    #[test]
    fn tcp_request_deadline_is_read_and_range_checked() {
        let defaults = parse(r#"{"local_hostname": "h"}"#).expect("defaults");
        assert_eq!(defaults.aiv.tcp_request_timeout, Duration::from_secs(10));
        assert_eq!(defaults.aiv.tcp_request_min_kib_per_s, 1024);
        let config = parse(
            r#"{"local_hostname": "h", "aiv": {"tcp_request_timeout_ms": 1500, "tcp_request_min_kib_per_s": 64}}"#,
        )
        .expect("valid request deadline");
        assert_eq!(config.aiv.tcp_request_timeout, Duration::from_millis(1500));
        assert_eq!(config.aiv.tcp_request_min_kib_per_s, 64);
        for (key, value, range) in [
            ("tcp_request_timeout_ms", 0u64, "from 1 to 3600000"),
            ("tcp_request_timeout_ms", 3_600_001, "from 1 to 3600000"),
            ("tcp_request_min_kib_per_s", 0, "from 1 to 16777216"),
            ("tcp_request_min_kib_per_s", 16_777_217, "from 1 to 16777216"),
        ] {
            let error =
                parse(&format!(r#"{{"local_hostname": "h", "aiv": {{"{key}": {value}}}}}"#)).expect_err("out of range");
            let text = error.to_string();
            assert!(text.contains(&format!("aiv.{key}")) && text.contains(range), "{text}");
        }
    }

    #[test]
    fn aiv_options_are_namespaced_and_checked() {
        let config = parse(
            r#"{"local_hostname": "h", "aiv": {"device_backend": "cann", "aiv_blocks": 8, "doorbell_batch": 32,
                "launch_mode": "per_batch", "transfer_timeout_ms": 500, "hbm_size": "256mb",
                "peer_probe_interval_ms": 20}}"#,
        )
        .expect("valid aiv options");
        assert_eq!(config.aiv.device_backend, DeviceBackendKind::Cann);
        assert_eq!((config.aiv.aiv_blocks, config.aiv.doorbell_batch), (8, 32));
        assert_eq!(config.aiv.launch_mode, LaunchMode::PerBatch);
        assert_eq!(config.aiv.transfer_timeout, Duration::from_millis(500));
        assert_eq!(config.aiv.hbm_size, 256 << 20);
        assert_eq!(config.aiv.peer_probe_interval, Duration::from_millis(20));

        let error = parse(r#"{"local_hostname": "h", "aiv": {"aiv_blocks": 64}}"#).expect_err("too many blocks");
        let message = error.to_string();
        assert!(
            message.contains("test.json") && message.contains("aiv.aiv_blocks") && message.contains("1 to 48"),
            "{message}"
        );
        for size in ["\"1tb\"", "\"512kb\"", "18446744073709551615"] {
            let error = parse(&format!(r#"{{"local_hostname": "h", "aiv": {{"hbm_size": {size}}}}}"#)).expect_err(size);
            assert!(
                error.to_string().contains("aiv.hbm_size") && error.to_string().contains("1 MiB to 64 GiB"),
                "{error}"
            );
        }
        let error = parse(r#"{"local_hostname": "h", "aiv": {"sq_depth": 1000}}"#).expect_err("not a power of two");
        assert!(error.to_string().contains("power of two"), "{error}");
    }

    #[test]
    fn mooncake_only_and_unknown_protocols_are_refused_by_name() {
        let error = parse(r#"{"local_hostname": "h", "protocol": "rdma"}"#).expect_err("rdma is not provided");
        let message = error.to_string();
        assert!(message.contains("\"protocol\"") && message.contains("does not provide"), "{message}");
        let error = parse(r#"{"local_hostname": "h", "protocol": "carrier-pigeon"}"#).expect_err("unknown");
        assert!(error.to_string().contains("unknown protocol"), "{error}");
    }

    #[test]
    fn rdma_route_options_have_defaults_and_are_validated() {
        let parse = |aiv: &str| {
            EngineConfig::from_json(&format!(r#"{{"local_hostname": "h", "aiv": {aiv}}}"#), "test.json", &|_: &str| {
                None
            })
        };
        let config = parse("{}").expect("valid");
        assert_eq!(config.aiv.route, RouteMode::Auto);
        assert_eq!((config.aiv.rdma_max_wqe_bytes, config.aiv.rdma_sq_depth), (1 << 20, 256));
        let config = parse(
            r#"{"route": "RDMA", "rdma_max_wqe_bytes": 4096, "rdma_sq_depth": 64,
            "rdma_retry_count": 2, "rdma_timeout_ms": 20, "rdma_host": "127.0.0.1"}"#,
        )
        .expect("valid");
        assert_eq!(config.aiv.route, RouteMode::Rdma);
        assert_eq!((config.aiv.rdma_max_wqe_bytes, config.aiv.rdma_sq_depth), (4096, 64));
        assert_eq!((config.aiv.rdma_retry_count, config.aiv.rdma_timeout), (2, Duration::from_millis(20)));
        for (bad, key) in [
            (r#"{"route": "carrier"}"#, "aiv.route"),
            (r#"{"rdma_max_wqe_bytes": 0}"#, "aiv.rdma_max_wqe_bytes"),
            (r#"{"rdma_max_wqe_bytes": 16777217}"#, "aiv.rdma_max_wqe_bytes"),
            (r#"{"rdma_max_wqe_bytes": 3000}"#, "a power of two from 1 to 16777216"),
            (r#"{"rdma_sq_depth": 100}"#, "aiv.rdma_sq_depth"),
            (r#"{"rdma_retry_count": 8}"#, "aiv.rdma_retry_count"),
            (r#"{"rdma_timeout_ms": 0}"#, "aiv.rdma_timeout_ms"),
            (r#"{"rdma_host": "not an ip"}"#, "aiv.rdma_host"),
        ] {
            let message = parse(bad).expect_err(bad).to_string();
            assert!(message.contains(key), "{bad}: {message}");
        }
    }

    #[test]
    fn fabric_memory_options_take_hixls_names_defaults_and_ranges() {
        let parse = |aiv: &str| {
            EngineConfig::from_json(&format!(r#"{{"local_hostname": "h", "aiv": {aiv}}}"#), "test.json", &no_env)
        };
        let options = |aiv: &str| parse(aiv).expect("valid").aiv.fabric_memory;
        assert_eq!(options("{}"), FabricMemoryOptions { enable_aicpu_unfold: true, task_stream_num: 1 });
        let host = options(r#"{"fabric_memory": {"enable_aicpu_unfold": false, "task_stream_num": 8}}"#);
        assert_eq!(host, FabricMemoryOptions { enable_aicpu_unfold: false, task_stream_num: 8 });
        let flat = options(r#"{"fabric_memory.enable_aicpu_unfold": false, "fabric_memory.task_stream_num": 3}"#);
        assert_eq!(flat, FabricMemoryOptions { enable_aicpu_unfold: false, task_stream_num: 3 });
        for (aiv, names) in [
            (
                r#"{"fabric_memory": {"enable_aicpu_unfold": false, "task_stream_num": 9}}"#,
                ["aiv.fabric_memory.task_stream_num", "from 1 to 8"],
            ),
            (
                r#"{"fabric_memory": {"enable_aicpu_unfold": false, "task_stream_num": 0}}"#,
                ["aiv.fabric_memory.task_stream_num", "from 1 to 8"],
            ),
            (r#"{"fabric_memory": {"task_stream_num": 2}}"#, ["aiv.fabric_memory.task_stream_num", "AI-CPU unfold"]),
            (r#"{"fabric_memory.task_stream_num": 4}"#, ["aiv.fabric_memory.task_stream_num", "AI-CPU unfold"]),
            (
                r#"{"fabric_memory": {"enable_aicpu_unfold": "no"}}"#,
                ["aiv.fabric_memory.enable_aicpu_unfold", "true or false"],
            ),
            (r#"{"fabric_memory": 1}"#, ["aiv.fabric_memory", "an object"]),
            (
                r#"{"fabric_memory": {"task_stream_num": 1}, "fabric_memory.task_stream_num": 1}"#,
                ["aiv.fabric_memory.task_stream_num", "not both"],
            ),
            (r#"{"fabric_mem_port": 70000}"#, ["aiv.fabric_mem_port", "from 0 to 65535"]),
        ] {
            let message = parse(aiv).expect_err(aiv).to_string();
            assert!(names.iter().all(|name| message.contains(name)), "{aiv}: {message}");
        }
    }

    #[test]
    fn record_provenance_is_on_by_default_and_takes_only_a_boolean() {
        let parse = |aiv: &str| {
            EngineConfig::from_json(&format!(r#"{{"local_hostname": "h", "aiv": {aiv}}}"#), "test.json", &|_: &str| {
                None
            })
        };
        assert!(parse("{}").expect("valid").aiv.record_provenance);
        assert!(!parse(r#"{"record_provenance": false}"#).expect("valid").aiv.record_provenance);
        let message = parse(r#"{"record_provenance": "no"}"#).expect_err("a string").to_string();
        assert!(message.contains("aiv.record_provenance") && message.contains("true or false"), "{message}");
    }

    #[test]
    fn ascend_runs_on_the_path_ascend_protocol_names() {
        // Default: aiv, from the file's "protocol" and from MOONCAKE_PROTOCOL alike.
        let config = parse(r#"{"local_hostname": "h", "protocol": "Ascend"}"#).expect("ascend is mapped");
        assert_eq!(config.protocol, Protocol::Aiv);
        let config = parse(r#"{"local_hostname": "h", "protocol": "ascend", "aiv": {"ascend_protocol": "adxl"}}"#)
            .expect("mapped by the file");
        assert_eq!(config.protocol, Protocol::Adxl);
        assert_eq!(config.aiv.resolve_protocol("ASCEND"), Ok(Protocol::Adxl));
        assert_eq!(config.aiv.resolve_protocol("tcp"), Ok(Protocol::Tcp));
        let env = |name: &str| match name {
            "MOONCAKE_PROTOCOL" => Some("ascend".to_owned()),
            ASCEND_PROTOCOL_ENV => Some("ubshmem".to_owned()),
            _ => None,
        };
        let config = EngineConfig::from_json(r#"{"local_hostname": "h"}"#, "test.json", &env).expect("env maps it");
        assert_eq!(config.protocol, Protocol::Ubshmem);
        // The file wins over the environment, as for every other key.
        let config =
            EngineConfig::from_json(r#"{"local_hostname": "h", "aiv": {"ascend_protocol": "tcp"}}"#, "test.json", &env)
                .expect("file wins");
        assert_eq!(config.protocol, Protocol::Tcp);
        // "ascend" cannot map to itself or to a protocol this engine lacks; the message names the key and value.
        for bad in ["ascend", "rdma", "pigeon"] {
            let text = format!(r#"{{"local_hostname": "h", "aiv": {{"ascend_protocol": "{bad}"}}}}"#);
            let message = parse(&text).expect_err("refused").to_string();
            assert!(message.contains("aiv.ascend_protocol") && message.contains(bad), "{message}");
        }
        let env = |name: &str| (name == ASCEND_PROTOCOL_ENV).then(|| "hccl".to_owned());
        let message =
            EngineConfig::from_json(r#"{"local_hostname": "h"}"#, "test.json", &env).expect_err("refused").to_string();
        assert!(message.contains(ASCEND_PROTOCOL_ENV) && message.contains("hccl"), "{message}");
        // Other Mooncake protocols stay refused.
        assert!(parse(r#"{"local_hostname": "h", "protocol": "ascend_direct"}"#).is_err());
    }

    #[test]
    fn malformed_files_name_the_problem() {
        let error = parse("{\"local_hostname\": ").expect_err("truncated");
        assert!(matches!(error, ConfigError::Syntax { .. }) && error.to_string().contains("test.json"), "{error}");
        let error = parse("[1, 2]").expect_err("not an object");
        assert!(error.to_string().contains("an array"), "{error}");
        let error = parse(r#"{"local_hostname": 7}"#).expect_err("wrong type");
        assert!(error.to_string().contains("\"local_hostname\": expected a string, found 7"), "{error}");
        let error = parse(r#"{"metadata_server": "P2PHANDSHAKE"}"#).expect_err("missing hostname");
        assert!(error.to_string().contains("MOONCAKE_LOCAL_HOSTNAME"), "{error}");
        let error = parse(r#"{"local_hostname": "h", "global_segment_size": "4 parsecs"}"#).expect_err("bad unit");
        assert!(error.to_string().contains("global_segment_size"), "{error}");
    }

    #[test]
    fn environment_fills_what_the_file_leaves_out() {
        let env = |name: &str| match name {
            "MOONCAKE_LOCAL_HOSTNAME" => Some("192.168.0.9".to_owned()),
            "MOONCAKE_PROTOCOL" => Some("ubshmem".to_owned()),
            "MC_TRANSFER_TIMEOUT" => Some("7".to_owned()),
            _ => None,
        };
        let config = EngineConfig::from_json("{}", "environment", &env).expect("env only");
        assert_eq!(config.local_hostname, "192.168.0.9");
        assert_eq!(config.metadata_server, "P2PHANDSHAKE");
        assert_eq!(config.protocol, Protocol::Ubshmem);
        assert_eq!(config.aiv.transfer_timeout, Duration::from_secs(7));
        // The file wins over the environment.
        let config = EngineConfig::from_json(r#"{"local_hostname": "file-host", "protocol": "tcp"}"#, "f", &env)
            .expect("file and env");
        assert_eq!((config.local_hostname.as_str(), config.protocol), ("file-host", Protocol::Tcp));
    }

    #[test]
    fn out_of_range_device_ids_and_timeouts_are_refused_with_the_range() {
        let error = parse(r#"{"local_hostname": "h", "aiv": {"device_id": 4294967295}}"#).expect_err("would wrap");
        assert!(error.to_string().contains("aiv.device_id") && error.to_string().contains("0 to 65535"), "{error}");
        let error = parse(r#"{"local_hostname": "h", "aiv": {"transfer_timeout_ms": 0}}"#).expect_err("zero");
        assert!(error.to_string().contains("1 to 3600000"), "{error}");
        for bad in ["0", "18446744073709551615", "3601", "-1", "ten"] {
            let env = |name: &str| match name {
                "MOONCAKE_LOCAL_HOSTNAME" => Some("h".to_owned()),
                "MC_TRANSFER_TIMEOUT" => Some(bad.to_owned()),
                _ => None,
            };
            let error = EngineConfig::from_json("{}", "environment", &env).expect_err(bad);
            let message = error.to_string();
            assert!(
                message.contains("MC_TRANSFER_TIMEOUT") && message.contains("from 1 to 3600") && message.contains(bad),
                "{message}"
            );
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4gb"), Ok(4 << 30));
        assert_eq!(parse_size("512MB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5 kb"), Ok(1536));
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("64kib"), Ok(64 << 10));
        assert!(parse_size("gb").is_err());
        assert!(parse_size("99999999999tb").is_err());
        assert!(parse_size("12 furlongs").is_err());
    }
}
