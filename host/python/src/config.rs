//! The [`EngineConfig`] that `initialize` starts an engine with.
//!
//! Mooncake's four fields come from `initialize`'s arguments. This project's `"aiv"` options come from the
//! mooncake.json that `MOONCAKE_CONFIG_PATH` names, when it is set (only its `"aiv"` object is read: the arguments
//! win for the four Mooncake fields), else from the defaults and the environment as [`EngineConfig`] reads them.

use std::path::Path;

use aiv_transport::config::{ProcessEnvironment, CONFIG_PATH_ENV};
use aiv_transport::EngineConfig;
use serde_json::{Map, Value};

/// The protocol name `initialize` passes on: an empty name means `tcp` (mooncake.json's default); any other is
/// passed unchanged, so the engine's configuration maps Mooncake's `"ascend"` (`aiv.ascend_protocol`, else
/// `AIV_ASCEND_PROTOCOL`, else `aiv`), accepts this engine's protocols and refuses the rest by name.
fn protocol_name(protocol: &str) -> String {
    if protocol.trim().is_empty() {
        "tcp".into()
    } else {
        protocol.to_owned()
    }
}

/// Mooncake's connection string for `initialize_ext`: `P2PHANDSHAKE` and strings with a scheme as given, else
/// `<metadata_type>://<metadata_server>` (no type: as given, which this engine reads as etcd, like Mooncake).
pub fn connection_string(metadata_server: &str, metadata_type: &str) -> String {
    let server = metadata_server.trim();
    let kind = metadata_type.trim();
    if server == "P2PHANDSHAKE" || server.contains("://") || kind.is_empty() {
        server.to_owned()
    } else {
        format!("{kind}://{server}")
    }
}

/// Builds the configuration of one engine from `initialize`'s arguments (see the module documentation).
/// `device_id`, when given, is the device this engine drives (an extension: `TransferEngine(device_id=N)`).
pub fn engine_config(
    local_hostname: &str,
    metadata_server: &str,
    protocol: &str,
    device_name: &str,
    device_id: Option<u32>,
) -> Result<EngineConfig, String> {
    let env = |name: &str| std::env::var(name).ok();
    let protocol = protocol_name(protocol);
    let mut root = Map::new();
    root.insert("local_hostname".into(), Value::String(local_hostname.to_owned()));
    root.insert("metadata_server".into(), Value::String(metadata_server.to_owned()));
    root.insert("protocol".into(), Value::String(protocol));
    root.insert("device_name".into(), Value::String(device_name.to_owned()));
    let mut origin = "initialize arguments".to_owned();
    if let Some(path) = env(CONFIG_PATH_ENV).filter(|path| !path.trim().is_empty()) {
        if let Some(aiv) = aiv_object(Path::new(&path))? {
            root.insert("aiv".into(), aiv);
        }
        origin = format!("initialize arguments and the \"aiv\" object of {path} ({CONFIG_PATH_ENV})");
    }
    let text = Value::Object(root).to_string();
    let mut config = EngineConfig::from_json(&text, &origin, &ProcessEnvironment).map_err(|error| error.to_string())?;
    if let Some(id) = device_id {
        config.aiv.device_id = id;
    }
    Ok(config)
}

/// The `"aiv"` object of the mooncake.json at `path`, if it has one.
fn aiv_object(path: &Path) -> Result<Option<Value>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("read {} ({CONFIG_PATH_ENV}): {error}", path.display()))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|error| format!("parse {} ({CONFIG_PATH_ENV}): {error}", path.display()))?;
    match value {
        Value::Object(mut object) => Ok(object.remove("aiv")),
        _ => Err(format!("{} ({CONFIG_PATH_ENV}): expected a JSON object at the top level", path.display())),
    }
}
