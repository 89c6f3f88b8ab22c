//! Twin-only, not a CANN API: the engine selection and option checks of `adxl::AdxlEngine::Initialize`, for the
//! twin's `libllm_datadist.so` (`cxx/adxl_engine.cpp`, a thin C++ shim), as the C function
//! [`cannTwinAdxlSelectEngine`].
//!
//! The vendor's `AdxlEngine::Initialize` creates its engine with HiXL's `EngineFactory::CreateEngine`
//! (`hicann/hixl` `src/llm_datadist/api/adxl_engine_impl.cc`), which parses the options (`src/hixl/engine/hixl_options.cc`,
//! `HixlOptions::Parse`) and picks, in this order (`src/hixl/engine/engine_factory.cc`):
//!
//! 1. `EnableUseFabricMem` "1": the FabricMem engine;
//! 2. a non-empty `LocalCommRes` (or `adxl.LocalCommRes`, or the file `GlobalResourceConfig.local_comm_res_path`
//!    names when neither is set): JSON with `"version": "1.3"` selects the client-server engine (`HixlEngine`, log name
//!    `hixl_cs`), other JSON the communication-domain engine (`CommEngine`); text that is no JSON fails;
//! 3. a non-empty `GlobalResourceConfig` `comm_resource_config.protocol_desc`: the client-server engine;
//! 4. an Ascend950 SoC: the client-server engine (never on the twin: its SoC name is `cann-twin`);
//! 5. otherwise the communication-domain engine (HCCL), the legacy path. The twin's stand-in for it is its own TCP
//!    engine (`cxx/adxl_engine.cpp`), Host-submitted.
//!
//! Then the selected engine checks its options: the client-server and FabricMem engines accept only their own keys
//! (`HixlEngine::kSupportedOptions`, `FabricMemEngine::kSupportedOptions`) and a `BufferPool` that is absent or
//! `"0:0"` (`hixl_engine.cc`, `fabric_mem_engine.cc`); FabricMem reads `fabric_memory.enable_aicpu_unfold` (flat or
//! nested, a JSON bool, default true) and `fabric_memory.task_stream_num` (1 to 8, default 1, and 1 with AI-CPU
//! unfold: `ApplyFabricMemoryOptions`). Every failure here is `PARAM_INVALID`, as the vendor's parser returns (a
//! `nullptr` engine is `PARAM_INVALID` in `ADXL_CHECK_NOTNULL`, `src/llm_datadist/adxl/adxl_checker.h`).
//!
//! Not modelled: the environment fallbacks `HCCL_RDMA_TC` / `HCCL_RDMA_SL` (the values are only range-checked when
//! given as options), and the SoC rule (4).

use core::ffi::{c_char, CStr};

use serde_json::{Map, Value};

/// `adxl::SUCCESS`.
pub const ADXL_SUCCESS: u32 = 0;
/// `adxl::PARAM_INVALID`.
pub const ADXL_PARAM_INVALID: u32 = 103_900;

/// The engine [`cannTwinAdxlSelectEngine`] chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum EngineKind {
    /// `CommEngine`, the HCCL communication-domain engine: on the twin, its TCP engine (Host-submitted).
    Comm = 0,
    /// `HixlEngine`, the client-server engine over HiXL's C API.
    ClientServer = 1,
    /// `FabricMemEngine`.
    FabricMem = 2,
}

/// What [`cannTwinAdxlSelectEngine`] writes (C layout; `version` [`SELECTION_VERSION`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CannTwinAdxlSelection {
    pub version: u32,
    /// An [`EngineKind`].
    pub engine: u32,
    /// `AutoConnect`: -1 not given, else 0 or 1.
    pub auto_connect: i32,
    /// FabricMem: 1 AI-CPU unfold, 0 Host unfold.
    pub aicpu_unfold: u32,
    /// FabricMem: the Host unfold's streams (1 with AI-CPU unfold).
    pub task_stream_num: u32,
    pub reserved: u32,
    /// Why this engine (the vendor's `LogSelectedEngine` reason), NUL-terminated.
    pub reason: [c_char; 96],
    /// What was wrong, when the call did not return `SUCCESS`, NUL-terminated.
    pub error: [c_char; 256],
}

/// The layout version of [`CannTwinAdxlSelection`].
pub const SELECTION_VERSION: u32 = 1;

/// The parsed result, before it is laid out for C.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub engine: EngineKind,
    pub reason: &'static str,
    pub auto_connect: Option<bool>,
    pub aicpu_unfold: bool,
    pub task_stream_num: u32,
}

const ENABLE_FABRIC_MEM: &str = "EnableUseFabricMem";
const GLOBAL_RESOURCE_CONFIG: &str = "GlobalResourceConfig";
const AUTO_CONNECT: &str = "AutoConnect";
const LOCAL_COMM_RES: [&str; 2] = ["LocalCommRes", "adxl.LocalCommRes"];
const BUFFER_POOL: [&str; 2] = ["BufferPool", "adxl.BufferPool"];
const TRAFFIC_CLASS: [&str; 2] = ["RdmaTrafficClass", "adxl.RdmaTrafficClass"];
const SERVICE_LEVEL: [&str; 2] = ["RdmaServiceLevel", "adxl.RdmaServiceLevel"];

/// `HixlEngine::kSupportedOptions` (`hixl_engine.cc`).
const CLIENT_SERVER_OPTIONS: &[&str] = &[
    "RdmaTrafficClass",
    "adxl.RdmaTrafficClass",
    "RdmaServiceLevel",
    "adxl.RdmaServiceLevel",
    "LocalCommRes",
    "adxl.LocalCommRes",
    "BufferPool",
    "adxl.BufferPool",
    "AutoConnect",
    "GlobalResourceConfig",
];
/// `FabricMemEngine::kSupportedOptions` (`fabric_mem_engine.cc`): the client-server set and `EnableUseFabricMem`.
const FABRIC_MEM_EXTRA: &str = ENABLE_FABRIC_MEM;
/// The largest `local_comm_res_path` file (`kMaxLocalCommResFileSizeBytes`, `hixl_options.cc`).
const MAX_LOCAL_COMM_RES_FILE: u64 = 1 << 20;

type Checked<T> = Result<T, String>;

/// The first of `keys` the options hold (the HiXL spelling before the ADXL one, as `HixlOptions` looks them up).
fn either<'a>(options: &'a [(String, String)], keys: [&str; 2]) -> Option<&'a str> {
    keys.iter().find_map(|key| options.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()))
}

fn option<'a>(options: &'a [(String, String)], key: &str) -> Option<&'a str> {
    options.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// `ToNumber` of a decimal string (`hixl_utils`): digits only, within `i64`.
fn number(text: &str) -> Option<i64> {
    let trimmed = text.trim();
    let digits = trimmed.strip_prefix('-').unwrap_or(trimmed);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    trimmed.parse().ok()
}

/// `JsonToNumber`: an integer, or a string holding one.
fn json_integer(value: &Value, name: &str) -> Checked<i64> {
    match value {
        Value::String(text) => number(text).ok_or_else(|| format!("{name}: not a number: {text:?}")),
        Value::Number(n) => n.as_i64().ok_or_else(|| format!("{name}: expected an integer, got {n}")),
        other => Err(format!("{name}: expected an integer, got {other}")),
    }
}

fn in_range(json: &Map<String, Value>, name: &str, low: i64, high: i64) -> Checked<Option<i64>> {
    let Some(value) = json.get(name) else { return Ok(None) };
    let got = json_integer(value, name)?;
    if got < low || got > high {
        return Err(format!("{name} must be in [{low}, {high}], got {got}"));
    }
    Ok(Some(got))
}

fn json_bool(value: &Value, name: &str) -> Checked<bool> {
    value.as_bool().ok_or_else(|| format!("{name} must be a JSON bool, got {value}"))
}

/// What `GlobalResourceConfig` says that the selection and the FabricMem engine read.
#[derive(Debug, Default)]
struct GlobalResourceConfig {
    aicpu_unfold: Option<bool>,
    task_stream_num: Option<i64>,
    protocol_desc: Vec<String>,
    local_comm_res_path: Option<String>,
}

/// `ParseGlobalResourceConfigJson` (`hixl_options.cc`): the fields, their types and ranges.
fn global_resource_config(text: &str) -> Checked<GlobalResourceConfig> {
    let json: Value = serde_json::from_str(text).map_err(|e| format!("GlobalResourceConfig is not valid JSON: {e}"))?;
    let Value::Object(json) = json else { return Err("GlobalResourceConfig must be a JSON object".into()) };
    let mut config = GlobalResourceConfig::default();
    // fabric_memory: the nested object first, then the flat keys (which win).
    let mut fabric = |fields: &Map<String, Value>, prefix: &str| -> Checked<()> {
        let name = |field: &str| format!("{prefix}{field}");
        in_range(fields, &name("max_capacity"), 1, 1024)?;
        in_range(fields, &name("start_address"), 0, 1024)?;
        if let Some(n) = in_range(fields, &name("task_stream_num"), 1, 8)? {
            config.task_stream_num = Some(n);
        }
        if let Some(value) = fields.get(&name("enable_aicpu_unfold")) {
            config.aicpu_unfold = Some(json_bool(value, &name("enable_aicpu_unfold"))?);
        }
        Ok(())
    };
    if let Some(Value::Object(nested)) = json.get("fabric_memory") {
        fabric(nested, "")?;
    }
    fabric(&json, "fabric_memory.")?;
    if config.aicpu_unfold.unwrap_or(true) && config.task_stream_num.is_some_and(|n| n != 1) {
        return Err(format!(
            "aicpu_unfold mode only supports fabric_memory.task_stream_num=1, got {}",
            config.task_stream_num.unwrap_or_default()
        ));
    }
    in_range(&json, "connect_pool.thread_num", 1, 64)?;
    in_range(&json, "connect_pool.task_queue_capacity", 1, 65535)?;
    match json.get("comm_resource_config.protocol_desc") {
        None => {}
        Some(Value::String(one)) => config.protocol_desc = vec![one.clone()],
        Some(Value::Array(many)) => {
            for item in many {
                let Value::String(text) = item else {
                    return Err("comm_resource_config.protocol_desc must be a string or a list of strings".into());
                };
                config.protocol_desc.push(text.clone());
            }
        }
        Some(_) => return Err("comm_resource_config.protocol_desc must be a string or a list of strings".into()),
    }
    in_range(&json, "comm_resource_config.listen_port", 1, 65535)?;
    in_range(&json, "comm_resource_config.qos", 0, 7)?;
    in_range(&json, "comm_resource_config.max_active_channels", 1, i64::from(u32::MAX))?;
    match json.get("local_comm_res_path") {
        None => {}
        Some(Value::String(path)) if !path.is_empty() => config.local_comm_res_path = Some(path.clone()),
        Some(_) => return Err("local_comm_res_path must be a non-empty string".into()),
    }
    Ok(config)
}

/// `ReadLocalCommResFile`: a regular file of 1 byte to 1 MiB.
fn read_local_comm_res(path: &str) -> Checked<String> {
    let metadata = std::fs::metadata(path).map_err(|e| format!("local_comm_res_path {path}: {e}"))?;
    if !metadata.is_file() || metadata.len() == 0 || metadata.len() > MAX_LOCAL_COMM_RES_FILE {
        return Err(format!("local_comm_res_path {path} must be a regular file of 1 byte to 1 MiB"));
    }
    std::fs::read_to_string(path).map_err(|e| format!("local_comm_res_path {path}: {e}"))
}

/// The options parsed (`HixlOptions::Parse`), the engine selected (`EngineFactory::CreateEngine`) and its own checks
/// (`HixlEngine::Initialize`, `FabricMemEngine::InitializeLocked`); the error says what was wrong.
pub fn select(options: &[(String, String)]) -> Checked<Selection> {
    // ParseRdmaOptions.
    if let Some(text) = either(options, TRAFFIC_CLASS).filter(|t| !t.is_empty()) {
        let tc = number(text).ok_or_else(|| format!("Traffic class is invalid, value = {text}"))?;
        if !(0..=255).contains(&tc) || tc % 4 != 0 {
            return Err(format!("Traffic class is invalid, value = {tc}, must be between 0-255 and a multiple of 4"));
        }
    }
    if let Some(text) = either(options, SERVICE_LEVEL).filter(|t| !t.is_empty()) {
        let sl = number(text).ok_or_else(|| format!("Service level is invalid, value = {text}"))?;
        if !(0..=7).contains(&sl) {
            return Err(format!("service_level must be in [0, 7], value = {sl}"));
        }
    }
    // ParseEndpointOptions.
    let mut local_comm_res = either(options, LOCAL_COMM_RES).map(str::to_owned);
    // ParseFabricMemOptions.
    let mut fabric_mem = false;
    if let Some(text) = option(options, ENABLE_FABRIC_MEM).filter(|t| !t.is_empty()) {
        match number(text) {
            Some(0) => {}
            Some(1) => fabric_mem = true,
            _ => return Err(format!("{ENABLE_FABRIC_MEM} is invalid, should be zero or one, value = {text}")),
        }
    }
    // ParseAutoConnectOptions.
    let auto_connect = match option(options, AUTO_CONNECT) {
        None => None,
        Some(text) => match number(text) {
            Some(0) => Some(false),
            Some(1) => Some(true),
            _ => return Err(format!("{AUTO_CONNECT} is invalid, should be zero or one, value = {text:?}")),
        },
    };
    // ParseGlobalResourceConfig and ResolveLocalCommResFromFile.
    let config = match option(options, GLOBAL_RESOURCE_CONFIG).filter(|t| !t.is_empty()) {
        Some(text) => Some(global_resource_config(text)?),
        None => None,
    };
    if let Some(path) = config.as_ref().and_then(|c| c.local_comm_res_path.as_deref()) {
        if local_comm_res.as_deref().is_none_or(str::is_empty) {
            local_comm_res = Some(read_local_comm_res(path)?);
        }
    }
    // EngineFactory::CreateEngine.
    let (engine, reason) = if fabric_mem {
        (EngineKind::FabricMem, "EnableFabricMem is true")
    } else if let Some(text) = local_comm_res.as_deref().filter(|t| !t.is_empty()) {
        let json: Value = serde_json::from_str(text).map_err(|e| format!("Invalid json, exception:{e}"))?;
        if json.get("version").and_then(Value::as_str) == Some("1.3") {
            (EngineKind::ClientServer, "LocalCommRes version is 1.3")
        } else {
            (EngineKind::Comm, "LocalCommRes version is not 1.3")
        }
    } else if config.as_ref().is_some_and(|c| !c.protocol_desc.is_empty()) {
        (EngineKind::ClientServer, "protocol_desc is configured")
    } else {
        (EngineKind::Comm, "no hixl_cs selector matched")
    };
    let mut selection = Selection { engine, reason, auto_connect, aicpu_unfold: true, task_stream_num: 1 };
    if engine == EngineKind::Comm {
        return Ok(selection);
    }
    // The engine's own checks: its option keys, then BufferPool.
    for (key, _) in options {
        let supported = CLIENT_SERVER_OPTIONS.contains(&key.as_str())
            || (engine == EngineKind::FabricMem && key == FABRIC_MEM_EXTRA);
        if !supported {
            return Err(format!("Unsupported option '{key}' for this engine"));
        }
    }
    if let Some(pool) = either(options, BUFFER_POOL) {
        if pool != "0:0" {
            return Err(format!("BufferPool for this engine only supports 0:0, got {pool:?}"));
        }
    }
    if engine == EngineKind::FabricMem {
        let config = config.unwrap_or_default();
        selection.aicpu_unfold = config.aicpu_unfold.unwrap_or(true);
        selection.task_stream_num =
            if selection.aicpu_unfold { 1 } else { config.task_stream_num.unwrap_or(1).clamp(1, 8) as u32 };
    }
    Ok(selection)
}

fn copy_text(text: &str, out: &mut [c_char]) {
    out.fill(0);
    let room = out.len().saturating_sub(1);
    for (slot, byte) in out.iter_mut().zip(text.bytes().take(room)) {
        *slot = byte as c_char;
    }
}

/// **Twin-only, not a CANN API**: selects and checks the engine of an `adxl::AdxlEngine` from its `count` options
/// (`keys[i]` = `values[i]`, NUL-terminated), as the module documentation says. Writes `out` (its `version` set to
/// [`SELECTION_VERSION`] by the caller) and returns `adxl::SUCCESS`, or `adxl::PARAM_INVALID` with `out.error`
/// saying why (also for null pointers or another version: then nothing is written).
///
/// # Safety
/// `keys` and `values` are null only with `count` 0, else each points to `count` NUL-terminated strings; `out` is
/// null or a writable [`CannTwinAdxlSelection`].
#[no_mangle]
pub unsafe extern "C" fn cannTwinAdxlSelectEngine(
    keys: *const *const c_char,
    values: *const *const c_char,
    count: u32,
    out: *mut CannTwinAdxlSelection,
) -> u32 {
    if out.is_null() || (count > 0 && (keys.is_null() || values.is_null())) {
        return ADXL_PARAM_INVALID;
    }
    // SAFETY: `out` is non-null and writable by the contract.
    let out = unsafe { &mut *out };
    if out.version != SELECTION_VERSION {
        return ADXL_PARAM_INVALID;
    }
    let result = std::panic::catch_unwind(|| {
        let mut options = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            // SAFETY: `i < count`; both arrays hold `count` pointers by the contract.
            let (key, value) = unsafe { (*keys.add(i), *values.add(i)) };
            if key.is_null() || value.is_null() {
                return Err("a null option key or value".to_owned());
            }
            // SAFETY: non-null NUL-terminated strings by the contract.
            let text = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            options.push((text(key), text(value)));
        }
        select(&options)
    })
    .unwrap_or_else(|_| Err("internal error".to_owned()));
    match result {
        Ok(selection) => {
            out.engine = selection.engine as u32;
            out.auto_connect = selection.auto_connect.map_or(-1, i32::from);
            out.aicpu_unfold = u32::from(selection.aicpu_unfold);
            out.task_stream_num = selection.task_stream_num;
            copy_text(selection.reason, &mut out.reason);
            copy_text("", &mut out.error);
            ADXL_SUCCESS
        }
        Err(error) => {
            copy_text(&error, &mut out.error);
            ADXL_PARAM_INVALID
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn engine(list: &[(&str, &str)]) -> Checked<EngineKind> {
        select(&pairs(list)).map(|s| s.engine)
    }

    #[test]
    fn the_vendor_s_order_picks_the_engine() {
        let mooncake = [("AutoConnect", "1"), ("adxl.BufferPool", "0:0")];
        assert_eq!(engine(&mooncake), Ok(EngineKind::Comm));
        let cs = [("AutoConnect", "1"), ("adxl.BufferPool", "0:0"), ("adxl.LocalCommRes", r#"{"version":"1.3"}"#)];
        assert_eq!(engine(&cs), Ok(EngineKind::ClientServer));
        assert_eq!(engine(&[("adxl.LocalCommRes", r#"{"version":"1.2"}"#)]), Ok(EngineKind::Comm));
        assert!(engine(&[("adxl.LocalCommRes", "not json")]).is_err());
        let desc = [("GlobalResourceConfig", r#"{"comm_resource_config.protocol_desc":["roce:device"]}"#)];
        assert_eq!(engine(&desc), Ok(EngineKind::ClientServer));
        let fabric = [
            ("EnableUseFabricMem", "1"),
            ("adxl.LocalCommRes", r#"{"version":"1.3"}"#),
            ("GlobalResourceConfig", r#"{"fabric_memory":{"enable_aicpu_unfold":true}}"#),
        ];
        let selected = select(&pairs(&fabric)).expect("FabricMem");
        assert_eq!(
            (selected.engine, selected.aicpu_unfold, selected.task_stream_num),
            (EngineKind::FabricMem, true, 1)
        );
        assert_eq!(engine(&[("EnableUseFabricMem", "0"), ("AutoConnect", "1")]), Ok(EngineKind::Comm));
    }

    #[test]
    fn fabric_memory_settings_flat_or_nested_with_their_rules() {
        let host = select(&pairs(&[
            ("EnableUseFabricMem", "1"),
            (
                "GlobalResourceConfig",
                r#"{"fabric_memory.enable_aicpu_unfold":false,"fabric_memory.task_stream_num":4}"#,
            ),
        ]))
        .expect("Host unfold");
        assert_eq!((host.aicpu_unfold, host.task_stream_num), (false, 4));
        let nested = select(&pairs(&[
            ("EnableUseFabricMem", "1"),
            ("GlobalResourceConfig", r#"{"fabric_memory":{"enable_aicpu_unfold":false,"task_stream_num":"3"}}"#),
        ]))
        .expect("nested");
        assert_eq!((nested.aicpu_unfold, nested.task_stream_num), (false, 3));
        for bad in [
            r#"{"fabric_memory.enable_aicpu_unfold":"false"}"#,
            r#"{"fabric_memory.task_stream_num":2}"#,
            r#"{"fabric_memory.enable_aicpu_unfold":false,"fabric_memory.task_stream_num":9}"#,
            r#"[1]"#,
            "{",
        ] {
            let result = select(&pairs(&[("EnableUseFabricMem", "1"), ("GlobalResourceConfig", bad)]));
            assert!(result.is_err(), "{bad}: {result:?}");
        }
        assert!(engine(&[("EnableUseFabricMem", "2")]).is_err());
    }

    #[test]
    fn the_client_server_and_fabric_engines_check_buffer_pool_and_their_keys() {
        let cs = r#"{"version":"1.3"}"#;
        assert!(engine(&[("adxl.LocalCommRes", cs), ("adxl.BufferPool", "4:8")]).is_err());
        assert!(engine(&[("EnableUseFabricMem", "1"), ("BufferPool", "1:1")]).is_err());
        assert!(engine(&[("adxl.LocalCommRes", cs), ("EnableUseFabricMem", "0")]).is_err(), "not a hixl_cs key");
        assert!(engine(&[("adxl.LocalCommRes", cs), ("Unknown", "1")]).is_err());
        // The communication-domain engine is not checked here.
        assert_eq!(engine(&[("adxl.BufferPool", "4:8")]), Ok(EngineKind::Comm));
        assert!(engine(&[("AutoConnect", "")]).is_err());
        assert!(engine(&[("adxl.RdmaTrafficClass", "3")]).is_err());
        assert!(engine(&[("adxl.RdmaServiceLevel", "8")]).is_err());
    }

    #[test]
    fn the_c_function_writes_the_selection_or_the_error() {
        let keys = [c"adxl.LocalCommRes".as_ptr(), c"AutoConnect".as_ptr()];
        let values = [c"{\"version\":\"1.3\"}".as_ptr(), c"1".as_ptr()];
        let mut out = CannTwinAdxlSelection {
            version: SELECTION_VERSION,
            engine: 9,
            auto_connect: 9,
            aicpu_unfold: 9,
            task_stream_num: 9,
            reserved: 0,
            reason: [0; 96],
            error: [0; 256],
        };
        // SAFETY: two keys and two values, NUL-terminated; `out` is a whole structure.
        let code = unsafe { cannTwinAdxlSelectEngine(keys.as_ptr(), values.as_ptr(), 2, &mut out) };
        assert_eq!((code, out.engine, out.auto_connect), (ADXL_SUCCESS, EngineKind::ClientServer as u32, 1));
        let values = [c"{".as_ptr(), c"1".as_ptr()];
        // SAFETY: as above.
        let code = unsafe { cannTwinAdxlSelectEngine(keys.as_ptr(), values.as_ptr(), 2, &mut out) };
        assert_eq!(code, ADXL_PARAM_INVALID);
        assert_ne!(out.error[0], 0);
        // SAFETY: a null output is refused before any access.
        let code = unsafe { cannTwinAdxlSelectEngine(keys.as_ptr(), values.as_ptr(), 2, std::ptr::null_mut()) };
        assert_eq!(code, ADXL_PARAM_INVALID);
    }
}
