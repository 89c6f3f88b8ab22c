//! `aiv bench`: the flags applied to the configuration, the run in the role and on the path they pick (an initiator
//! with an in-process, loopback or another process's target; a target serving until signalled), and the stop
//! signals a target serves under.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use aiv_transport::bench::{self, BenchParams};
use aiv_transport::{EngineConfig, Protocol, TransferEngine};

use crate::args::{opcode, BenchArgs, Mode, DEFAULT_DURATION, DEFAULT_SERVER_NAME};
use crate::bench_report::print_bench_report;

/// Set by SIGINT or SIGTERM: a target stops serving, withdraws its segment and exits 0.
static STOP: AtomicBool = AtomicBool::new(false);
/// The signal that set [`STOP`].
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: libc::c_int) {
    // Only atomic stores: async-signal-safe.
    STOP_SIGNAL.store(signal, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to [`STOP`] instead of killing the process.
fn install_stop_signals() -> Result<(), String> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores atomics; `signal` replaces the disposition of a catchable signal.
        let previous =
            unsafe { libc::signal(signal, on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
        if previous == libc::SIG_ERR {
            return Err(format!("cannot handle signal {signal}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// How long a target serves, for its ready line.
fn serving_for(duration: Duration) -> String {
    if duration == Duration::MAX {
        "until SIGINT or SIGTERM".to_owned()
    } else {
        format!("for {} s (or until SIGINT or SIGTERM)", duration.as_secs_f64())
    }
}

/// Says that a target stopped, and why.
fn target_stopped(name: &str) {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => tracing::info!(segment = name, "target: --duration elapsed; withdrawing the segment"),
        signal => tracing::info!(segment = name, signal, "target: signal received; withdrawing the segment"),
    }
}

pub(crate) fn run_bench(config_path: Option<PathBuf>, args: BenchArgs) -> Result<(), String> {
    // With a file or without, the MOONCAKE_* and MC_* variables fill what is left out, as transfer_engine_bench
    // reads them; without a file and without MOONCAKE_LOCAL_HOSTNAME the name is transfer_engine_bench's default.
    let env = aiv_transport::config::ProcessEnvironment;
    let mut config =
        EngineConfig::load_with(config_path.as_deref(), &env, DEFAULT_SERVER_NAME).map_err(|e| e.to_string())?;
    if let Some(name) = args.local_server_name {
        config.local_hostname = name;
    }
    if let Some(server) = args.metadata_server {
        config.metadata_server = server;
    }
    if let Some(names) = args.device_name {
        config.device_name = names;
    }
    if args.fabric_host_unfold {
        config.aiv.fabric_memory.enable_aicpu_unfold = false;
    }
    let protocol = match args.protocol {
        Some(name) => config.aiv.resolve_protocol(&name).map_err(|e| format!("--protocol: {e}"))?,
        None => config.protocol,
    };
    aiv_transport::cpu_time::set_section_clock(args.section_clock);
    let params = BenchParams {
        operation: opcode(args.operation),
        protocol,
        buffer_size: args.buffer_size,
        batch_size: args.batch_size,
        block_size: args.block_size,
        duration: match (args.duration, args.mode) {
            (Some(duration), _) => duration,
            (None, Mode::Initiator) => DEFAULT_DURATION,
            (None, Mode::Target) => Duration::MAX,
        },
        threads: args.threads,
        report_unit: args.report_unit,
        report_precision: args.report_precision,
    };
    if protocol == Protocol::Tcp {
        config.protocol = Protocol::Tcp;
    }
    // Device paths (aiv and the baselines adxl, ubshmem) without --segment_id: two engines on two devices of this
    // process (the configured device id and the next).
    if protocol.is_device_path() && args.segment_id.is_none() && matches!(args.mode, Mode::Initiator) {
        let report = bench::run_aiv_pair(&config, &params).map_err(|e| e.to_string())?;
        let target =
            format!("in-process target on {:?} device {}", config.aiv.device_backend, config.aiv.device_id + 1);
        return print_bench_report(&params, &report, &target, args.json);
    }
    // An initiator's aiv run on the vendor's runtime: CANN's profiler observes it (started before the engine opens).
    let session = if matches!(args.mode, Mode::Initiator) {
        bench::start_observer(&config, protocol, &[config.aiv.device_id])
    } else {
        None
    };
    let engine = TransferEngine::new(config.clone()).map_err(|e| e.to_string())?;
    // tcp without --segment_id: a second engine of this process is the target, so every byte crosses the wire.
    let wire_target = if protocol == Protocol::Tcp && args.segment_id.is_none() && matches!(args.mode, Mode::Initiator)
    {
        let mut target_config = config;
        target_config.local_hostname = sibling_name(engine.name());
        Some(TransferEngine::new(target_config).map_err(|e| format!("starting the target engine: {e}"))?)
    } else {
        None
    };
    if matches!(args.mode, Mode::Target) && protocol == Protocol::Aiv {
        install_stop_signals()?;
        bench::serve_aiv_target(&engine, &params, &STOP, |addr| {
            println!(
                "aiv bench target: segment {} serving {} bytes of device memory at {addr:#x} over aiv, {}",
                engine.name(),
                params.buffer_size,
                serving_for(params.duration)
            );
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
        })
        .map_err(|e| e.to_string())?;
        target_stopped(engine.name());
        // Dropping the engine removes its metadata keys, so a restart under the same name is accepted.
        drop(engine);
        return Ok(());
    }
    if matches!(args.mode, Mode::Target) {
        install_stop_signals()?;
        let port = engine.local_descriptor().tcp_data_port.unwrap_or(0);
        bench::serve_target(&engine, &params, &STOP, |addr| {
            println!(
                "aiv bench target: segment {} serving {} bytes at {addr:#x}, tcp data port {port}, {}",
                engine.name(),
                params.buffer_size,
                serving_for(params.duration)
            );
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
        })
        .map_err(|e| e.to_string())?;
        target_stopped(engine.name());
        drop(engine);
        return Ok(());
    }
    let remote_segment = args.segment_id.as_deref().filter(|segment| *segment != engine.name());
    let report = match (&wire_target, remote_segment) {
        (Some(target), _) => bench::run_two_engines(&engine, target, &params),
        (None, Some(segment)) if protocol == Protocol::Aiv => bench::run_aiv_against_segment(&engine, &params, segment),
        (None, Some(segment)) => bench::run_against_segment(&engine, &params, segment),
        (None, None) => bench::run_loopback(&engine, &params),
    };
    let target = match (&wire_target, remote_segment) {
        (Some(target), _) => format!("target engine {:?} of this process over loopback tcp", target.name()),
        (None, Some(segment)) => format!("target segment {segment:?} of another process"),
        (None, None) => "in-process target (this engine's own segment)".to_string(),
    };
    // The engines close (their kernels end) before the profiler stops.
    drop(wire_target);
    drop(engine);
    let mut report = report.map_err(|e| e.to_string())?;
    bench::observe_run(&mut report, session);
    print_bench_report(&params, &report, &target, args.json)
}

/// A name for a second engine next to `name`: the same host with the next port (`host:port` names), else a suffix.
fn sibling_name(name: &str) -> String {
    if let Some((host, port)) = name.rsplit_once(':') {
        if let Ok(port) = port.parse::<u16>() {
            return format!("{host}:{}", port.wrapping_add(1).max(1));
        }
    }
    format!("{name}-target")
}
