//! `aiv`: the command-line front of aiv-transport.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use aiv_transport::bench::{self, BenchParams, ReportUnit};
use aiv_transport::config::parse_size;
use aiv_transport::{EngineConfig, Opcode, Protocol, TransferEngine};
use clap::{Parser, Subcommand, ValueEnum};

/// aiv-transport: move KV-cache and other data between Ascend NPUs, and measure how.
///
/// Speaks Mooncake's configuration and benchmark language. The device backend is the CPU twin unless mooncake.json
/// says `"aiv": {"device_backend": "cann"}`. Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more.
#[derive(Debug, Parser)]
#[command(name = "aiv", version, propagate_version = true)]
struct Cli {
    /// mooncake.json to read (default: $MOONCAKE_CONFIG_PATH, else the MOONCAKE_* environment variables)
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Say which device backends are usable here and, for `cann`, what was looked for and not found.
    Doctor,
    /// Run Mooncake's transfer_engine_bench workload (same flags and result line).
    Bench(BenchArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Initiator,
    Target,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Operation {
    Read,
    Write,
}

/// Flags and defaults follow transfer_engine_bench; initiator and target run in this process for now.
#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// Role of this process (only the in-process initiator is available in this build)
    #[arg(long, value_enum, default_value = "initiator")]
    mode: Mode,
    /// Transfer direction
    #[arg(long, value_enum, default_value = "read")]
    operation: Operation,
    /// Protocol of every request: aiv, adxl, ubshmem or tcp (default: the config's protocol)
    #[arg(long)]
    protocol: Option<String>,
    /// Metadata connection string (default: the config's, else P2PHANDSHAKE)
    #[arg(long = "metadata_server")]
    metadata_server: Option<String>,
    /// This engine's name (default: the config's local_hostname, else 127.0.0.1:12345)
    #[arg(long = "local_server_name")]
    local_server_name: Option<String>,
    /// Segment to transfer with (default: this engine's own segment)
    #[arg(long = "segment_id")]
    segment_id: Option<String>,
    /// NIC list, kept for compatibility
    #[arg(long = "device_name", default_value = "")]
    device_name: String,
    /// Bytes of each side's buffer (suffixes allowed: 1gb, 256mb)
    #[arg(long = "buffer_size", default_value = "1073741824", value_parser = parse_size)]
    buffer_size: u64,
    /// Requests per batch
    #[arg(long = "batch_size", default_value_t = 128)]
    batch_size: usize,
    /// Bytes per request (suffixes allowed)
    #[arg(long = "block_size", default_value = "65536", value_parser = parse_size)]
    block_size: u64,
    /// Seconds to run
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Initiator threads
    #[arg(long, default_value_t = 12)]
    threads: usize,
    /// Throughput unit: GB GiB Gb MB MiB Mb KB KiB Kb
    #[arg(long = "report_unit", default_value = "GB")]
    report_unit: ReportUnit,
    /// Digits after the decimal point
    #[arg(long = "report_precision", default_value_t = 2)]
    report_precision: usize,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Doctor => {
            print!("{}", aiv_transport::doctor::diagnose().render());
            Ok(())
        }
        Command::Bench(args) => run_bench(cli.config, args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("aiv: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run_bench(config_path: Option<PathBuf>, args: BenchArgs) -> Result<(), String> {
    let config_given = config_path.is_some() || std::env::var_os(aiv_transport::config::CONFIG_PATH_ENV).is_some();
    let mut config = if config_given {
        EngineConfig::load(config_path.as_deref()).map_err(|e| e.to_string())?
    } else {
        EngineConfig::new("127.0.0.1:12345")
    };
    if let Some(name) = args.local_server_name {
        config.local_hostname = name;
    }
    if let Some(server) = args.metadata_server {
        config.metadata_server = server;
    }
    config.device_name = args.device_name;
    let protocol = match args.protocol {
        Some(name) => name.parse::<Protocol>().map_err(|e| format!("--protocol: {e}"))?,
        None => config.protocol,
    };
    if matches!(args.mode, Mode::Target) {
        return Err("--mode target: serving memory to another process is not available in this build yet; \
                    run without --mode to benchmark initiator and target in one process"
            .into());
    }
    if !(args.duration.is_finite() && args.duration > 0.0) {
        return Err(format!("--duration: expected a positive number of seconds, found {}", args.duration));
    }
    let params = BenchParams {
        operation: match args.operation {
            Operation::Read => Opcode::Read,
            Operation::Write => Opcode::Write,
        },
        protocol,
        buffer_size: args.buffer_size,
        batch_size: args.batch_size,
        block_size: args.block_size,
        duration: Duration::from_secs_f64(args.duration),
        threads: args.threads,
        report_unit: args.report_unit,
        report_precision: args.report_precision,
    };
    let engine = TransferEngine::new(config).map_err(|e| e.to_string())?;
    if let Some(segment) = &args.segment_id {
        if segment != engine.name() {
            return Err(format!(
                "--segment_id {segment:?}: only this engine's own segment ({:?}) is reachable in this build",
                engine.name()
            ));
        }
    }
    let (report, target_kind) = if protocol == Protocol::Aiv {
        // Two engines on two devices of this process (the initiator's and the next device id).
        let config = engine.config().clone();
        drop(engine);
        let report = bench::run_aiv_pair(&config, &params).map_err(|e| e.to_string())?;
        (report, format!("in-process target on {:?} device {}", config.aiv.device_backend, config.aiv.device_id + 1))
    } else {
        (bench::run_loopback(&engine, &params).map_err(|e| e.to_string())?, "in-process target".to_owned())
    };
    let outcome = &report.outcome;
    println!(
        "aiv bench: protocol {protocol}, {} {} x {} B per batch, {} thread(s), {target_kind}",
        params.operation.as_str(),
        params.batch_size,
        params.block_size,
        params.threads
    );
    if let Some(sample) = &outcome.evidence.sample {
        println!(
            "evidence: path {}, descriptors by {:?}, doorbell by {:?}, completion seen by {:?}; per transfer: {:.2} host device-API calls, {:.2} descriptors, {:.2} doorbells, {:.0} ns host CPU",
            sample.path,
            sample.descriptor_builder,
            sample.doorbell_ringer,
            sample.completion_observer,
            outcome.evidence.host_device_api_calls,
            outcome.evidence.descriptors,
            outcome.evidence.doorbells,
            outcome.evidence.host_cpu_ns,
        );
        let checks = sample.aiv_direct_checks();
        println!(
            "aiv-direct checks: kernel-on-aiv {} / kernel-writes-descriptors {} / kernel-rings-doorbell {} / device-observes-completion {}",
            yes_no(checks[0]), yes_no(checks[1]), yes_no(checks[2]), yes_no(checks[3])
        );
    }
    let throughput = outcome.bytes_per_second();
    println!(
        "reference: memcpy {:.2} GB/s in the same run; this path reached {:.3}x memcpy",
        report.memcpy_bytes_per_second / 1e9,
        throughput / report.memcpy_bytes_per_second.max(1.0)
    );
    if outcome.failed_batches > 0 {
        eprintln!(
            "aiv: {} batch(es) failed; first reason: {}",
            outcome.failed_batches,
            outcome.first_failure.as_deref().unwrap_or("none recorded")
        );
    }
    eprintln!("{}", outcome.result_line(&params));
    if outcome.failed_batches > 0 && outcome.completed_batches == 0 {
        return Err("every batch failed".into());
    }
    Ok(())
}

fn yes_no(flag: bool) -> &'static str {
    if flag {
        "yes"
    } else {
        "no"
    }
}
