//! mooncake.json and this project's options.
//!
//! Mooncake's fields are read as Mooncake reads them (docs/mooncake.md section 1): `local_hostname` and
//! `metadata_server` required, `protocol` lower-cased (default `tcp`), sizes with suffixes, unknown keys accepted and
//! ignored, and the `MOONCAKE_*` environment variables filling what the file leaves out. This project's own options
//! live in one object, `"aiv": {...}`, which Mooncake ignores. A file that cannot be used fails with its path, the
//! key and what was expected.
//!
//! The parts: [`EngineConfig`] and Mooncake's top-level keys (`mooncake.rs`), the option types with their defaults
//! and ranges (`options.rs`), the reader of the `"aiv"` object (`aiv_object.rs`), typed access to one JSON object
//! and size suffixes (`fields.rs`), and the environment the configuration reads (`environment.rs`).

use std::path::PathBuf;

mod aiv_object;
mod environment;
mod fields;
mod mooncake;
mod options;

pub use environment::{Environment, FixedEnvironment, ProcessEnvironment, RecordingEnvironment};
pub use fields::parse_size;
pub use mooncake::EngineConfig;
pub use options::{
    transfer_timeout_from_env, transfer_timeout_ms, AivOptions, DeviceBackendKind, FabricMemoryOptions,
    HandshakeLimits, LaunchMode, MetadataServerLimits, RouteMode, MAX_DEVICE_ID, MAX_FABRIC_TASK_STREAMS, MAX_HBM_SIZE,
    MAX_TRANSFER_TIMEOUT_MS, METADATA_SERVER_MAX_BUFFERED_BYTES, METADATA_SERVER_MAX_CONNECTIONS,
    METADATA_SERVER_REQUEST_TIMEOUT_MS,
};

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
