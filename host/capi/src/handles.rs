//! The engine behind an `aiv_engine` handle: the live handles, the device buffers allocated through the library,
//! and the batches submitted through it (with their task counts).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use engine::config::ProcessEnvironment;
use engine::device::DeviceBuffer;
use engine::engine::AivDevice;
use engine::metadata::MetadataOptions;
use engine::{EngineConfig, TransferEngine};

use crate::lock;
use crate::status::{code, Failure};

/// One engine of the library.
///
/// Field order is drop order: the device buffers (unregistered in [`Drop`]) go before the device and the engine.
#[derive(Debug)]
pub struct Engine {
    /// Device buffers of `aiv_device_alloc`, by address.
    pub device_buffers: Mutex<BTreeMap<u64, DeviceBuffer>>,
    /// The engine's device, once opened ([`Engine::device`]).
    device: Mutex<Option<Arc<AivDevice>>>,
    /// Batches of `aiv_submit` not yet freed: their task counts.
    pub batches: Mutex<HashMap<u64, usize>>,
    pub engine: TransferEngine,
}

/// Device ids an engine of this process has opened: one engine per device, as on an NPU (a device is one SHMEM PE
/// of a process).
static DEVICES_IN_USE: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

impl Drop for Engine {
    fn drop(&mut self) {
        let buffers = std::mem::take(&mut *lock(&self.device_buffers));
        for &addr in buffers.keys() {
            let _ = self.engine.unregister_memory(addr);
        }
        drop(buffers);
        if lock(&self.device).take().is_some() {
            lock(&DEVICES_IN_USE).remove(&self.engine.config().aiv.device_id);
        }
    }
}

/// The keys of `"cann_libraries"` and the loader override variables they stand for.
const CANN_LIBRARY_KEYS: [(&str, &str); 4] = [
    ("ascendcl", "AIV_ASCENDCL_LIB"),
    ("shmem", "AIV_SHMEM_LIB"),
    ("hixl", "AIV_HIXL_LIB"),
    ("msprofiler", "AIV_MSPROFILER_LIB"),
];

/// The library's own key `"cann_libraries"`: `{"ascendcl": path, "shmem": path, "hixl": path, "msprofiler": path}`
/// (each optional), the files the `cann` backend's loaders open, as the override variables would name them.
fn cann_libraries(value: Option<serde_json::Value>) -> Result<Vec<(&'static str, PathBuf)>, Failure> {
    let config_error = |message: String| Failure::new(code::CONFIG, message);
    let object = match value {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Object(object)) => object,
        Some(found) => return Err(config_error(format!("cann_libraries: expected an object, found {found}"))),
    };
    let mut out = Vec::new();
    for (key, value) in object {
        let Some(&(_, var)) = CANN_LIBRARY_KEYS.iter().find(|(name, _)| *name == key) else {
            return Err(config_error(format!(
                "cann_libraries: unknown key {key:?} (expected ascendcl, shmem, hixl or msprofiler)"
            )));
        };
        match value.as_str().filter(|path| !path.is_empty()) {
            Some(path) => out.push((var, PathBuf::from(path))),
            None => return Err(config_error(format!("cann_libraries.{key}: expected a file path, found {value}"))),
        }
    }
    Ok(out)
}

/// With `"cann_libraries"."ascendcl"` and the `cann` backend: the ACL table this process loaded is that file (a
/// table is loaded once per process; an engine created earlier may have loaded another).
fn check_loaded_acl(libraries: &[(&'static str, PathBuf)], engine: &Engine) -> Result<(), Failure> {
    let Some((_, wanted)) = libraries.iter().find(|(var, _)| *var == "AIV_ASCENDCL_LIB") else { return Ok(()) };
    if engine.engine.config().aiv.device_backend != engine::config::DeviceBackendKind::Cann {
        return Ok(());
    }
    match ascendcl_sys::api().ok().map(|api| api.path().to_path_buf()) {
        Some(loaded) if loaded != *wanted => Err(Failure::new(
            code::CONFIG,
            format!(
                "cann_libraries.ascendcl: this process loaded the ACL runtime from {} already, not from {}",
                loaded.display(),
                wanted.display()
            ),
        )),
        _ => Ok(()),
    }
}

impl Engine {
    /// Starts an engine from the JSON text of `aiv_engine_create` (see the header for its keys).
    pub fn create(json: &str) -> Result<Engine, Failure> {
        let config_error = |message: String| Failure::new(code::CONFIG, message);
        let text = if json.trim().is_empty() { "{}" } else { json };
        let mut value: serde_json::Value =
            serde_json::from_str(text).map_err(|error| config_error(format!("the configuration JSON: {error}")))?;
        let object = value
            .as_object_mut()
            .ok_or_else(|| config_error("the configuration JSON: expected an object at the top level".into()))?;
        let rpc_port = match object.remove("rpc_port") {
            None | Some(serde_json::Value::Null) => None,
            Some(found) => Some(
                found
                    .as_u64()
                    .and_then(|port| u16::try_from(port).ok())
                    .filter(|&port| port > 0)
                    .ok_or_else(|| config_error(format!("rpc_port: expected a port 1..=65535, found {found}")))?,
            ),
        };
        let libraries = cann_libraries(object.remove("cann_libraries"))?;
        object.entry("protocol").or_insert_with(|| serde_json::Value::String("aiv".into()));
        let config =
            EngineConfig::from_json(&value.to_string(), "the aiv_engine_create configuration", &ProcessEnvironment)
                .map_err(|error| config_error(error.to_string()))?;
        let mut options =
            MetadataOptions::from_env(&ProcessEnvironment).map_err(|error| config_error(error.to_string()))?;
        if let Some(port) = rpc_port {
            options.rpc_ports = port..=port;
        }
        let device_path = config.protocol.is_device_path();
        for (var, path) in &libraries {
            ascendcl_sys::loader::set_program_override(var, path.clone());
        }
        let engine = Engine {
            device_buffers: Mutex::new(BTreeMap::new()),
            device: Mutex::new(None),
            batches: Mutex::new(HashMap::new()),
            engine: TransferEngine::with_metadata_options(config, &options)?,
        };
        // A device protocol needs its transport before the first transfer: a device that cannot be opened fails
        // the creation.
        if device_path {
            engine.device()?;
        }
        check_loaded_acl(&libraries, &engine)?;
        Ok(engine)
    }

    /// The engine's device, opened on first use.
    pub fn device(&self) -> Result<Arc<AivDevice>, Failure> {
        let mut slot = lock(&self.device);
        if let Some(device) = &*slot {
            return Ok(device.clone());
        }
        let id = self.engine.config().aiv.device_id;
        if !lock(&DEVICES_IN_USE).insert(id) {
            return Err(Failure::device(format!(
                "device {id} is already driven by another engine of this process; give this engine another with \
                 \"aiv\": {{\"device_id\": N}}"
            )));
        }
        match self.engine.device() {
            Ok(device) => {
                *slot = Some(device.clone());
                Ok(device)
            }
            Err(error) => {
                lock(&DEVICES_IN_USE).remove(&id);
                Err(Failure::device(format!("open device {id}: {error}")))
            }
        }
    }
}

/// Live engines by handle value; handles are never reused, so a destroyed one stays invalid.
static ENGINES: Mutex<BTreeMap<u64, Arc<Engine>>> = Mutex::new(BTreeMap::new());
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// Records a new engine; its handle value.
pub fn insert(engine: Engine) -> u64 {
    let handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    lock(&ENGINES).insert(handle, Arc::new(engine));
    handle
}

/// The live engine of `handle`.
pub fn get(handle: u64) -> Result<Arc<Engine>, Failure> {
    if handle == 0 {
        return Err(Failure::new(code::INVALID_HANDLE, "the engine handle is NULL"));
    }
    lock(&ENGINES).get(&handle).cloned().ok_or_else(|| {
        Failure::new(
            code::INVALID_HANDLE,
            format!("engine handle {handle:#x} is not a live engine (never created, or destroyed)"),
        )
    })
}

/// Forgets the engine of `handle`; it shuts down when the last call using it returns.
pub fn remove(handle: u64) -> Result<Arc<Engine>, Failure> {
    get(handle)?;
    lock(&ENGINES)
        .remove(&handle)
        .ok_or_else(|| Failure::new(code::INVALID_HANDLE, format!("engine handle {handle:#x} was destroyed meanwhile")))
}
