//! This project's options, the `"aiv"` object of mooncake.json: their types, defaults and the ranges the reader
//! (`aiv_object.rs`) checks them against.

use std::time::Duration;

use super::ASCEND_PROTOCOL_NAME;
use crate::transfer::Protocol;

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
pub(super) fn parse_ascend_protocol(text: &str) -> Result<Protocol, String> {
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
