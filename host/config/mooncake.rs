//! [`EngineConfig`]: Mooncake's top-level keys of mooncake.json, with the `MOONCAKE_*` environment variables filling
//! what the file leaves out, and where the configuration is loaded from.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::aiv_object::read_aiv_options;
use super::environment::{Environment, ProcessEnvironment};
use super::fields::{kind_of, Fields};
use super::options::{parse_ascend_protocol, transfer_timeout_from_env, AivOptions};
use super::{ConfigError, ASCEND_PROTOCOL_ENV, CONFIG_PATH_ENV};
use crate::transfer::Protocol;

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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    use crate::config::{FixedEnvironment, RecordingEnvironment};

    pub(crate) fn no_env(_: &str) -> Option<String> {
        None
    }

    pub(crate) fn parse(text: &str) -> Result<EngineConfig, ConfigError> {
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
    fn mooncake_only_and_unknown_protocols_are_refused_by_name() {
        let error = parse(r#"{"local_hostname": "h", "protocol": "rdma"}"#).expect_err("rdma is not provided");
        let message = error.to_string();
        assert!(message.contains("\"protocol\"") && message.contains("does not provide"), "{message}");
        let error = parse(r#"{"local_hostname": "h", "protocol": "carrier-pigeon"}"#).expect_err("unknown");
        assert!(error.to_string().contains("unknown protocol"), "{error}");
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
}
