//! The reader of mooncake.json's `"aiv"` object: each key's shape and range checked, the error naming the key and
//! what was expected, per section (device and kernel, baselines, FabricMem, the RDMA route, tcp client limits,
//! admission limits, the HTTP metadata server's limits).

use std::time::Duration;

use serde_json::Value;

use super::fields::Fields;
use super::options::{
    parse_ascend_protocol, transfer_timeout_ms, AivOptions, DeviceBackendKind, FabricMemoryOptions, LaunchMode,
    MetadataServerLimits, RouteMode, MAX_DEVICE_ID, MAX_FABRIC_TASK_STREAMS, MAX_HBM_SIZE,
    METADATA_SERVER_MAX_BUFFERED_BYTES, METADATA_SERVER_MAX_CONNECTIONS, METADATA_SERVER_REQUEST_TIMEOUT_MS,
};
use super::ConfigError;

pub(super) fn read_aiv_options(fields: &Fields<'_>, aiv: &mut AivOptions) -> Result<(), ConfigError> {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::mooncake::tests::{no_env, parse};
    use crate::config::{
        AivOptions, DeviceBackendKind, EngineConfig, FabricMemoryOptions, HandshakeLimits, LaunchMode,
        MetadataServerLimits, RouteMode,
    };

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
}
