//! `aiv`: the command-line front of aiv-transport.
//!
//! The parts: the command line's definitions (`aiv/args.rs`), the translation of Mooncake's gflags spellings
//! (`aiv/gflags.rs`), `aiv audit` (`aiv/audit.rs`), `aiv bench` (`aiv/bench.rs`) and the printing of its report
//! (`aiv/bench_report.rs`); `main` and `aiv metadata-server` are here.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use aiv_transport::EngineConfig;
use clap::Parser;

// A binary's root sits beside its folder: the modules' paths name it.
#[path = "aiv/args.rs"]
mod args;
#[path = "aiv/audit.rs"]
mod audit;
#[path = "aiv/bench.rs"]
mod bench;
#[path = "aiv/bench_report.rs"]
mod bench_report;
#[path = "aiv/gflags.rs"]
mod gflags;

use args::{Cli, Command, MetadataServerArgs};
use audit::run_audit;
use bench::run_bench;
use gflags::gflags_argv;

fn main() -> ExitCode {
    // Log lines on stderr, less the warnings an audit's error-recovery round provokes on purpose (recorded in its
    // report instead), written above the audit's progress bar.
    aiv_transport::audit::terminal::install_subscriber();
    let (argv, notices) = gflags_argv(std::env::args_os().collect());
    for notice in notices {
        eprintln!("aiv: {notice}");
    }
    let cli = Cli::parse_from(argv);
    let result = match cli.command {
        Command::Doctor(options) => match aiv_transport::doctor::cli::run(options) {
            Ok(code) => return ExitCode::from(code),
            Err(message) => Err(message),
        },
        Command::Audit(args) => run_audit(cli.config, args),
        Command::Bench(args) => run_bench(cli.config, args),
        Command::MetadataServer(args) => run_metadata_server(cli.config, &args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("aiv: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The HTTP metadata server: its server limits from `--config`'s `aiv` object (only when a file is given
/// explicitly), each overridden by its flag; store limits from the flags.
fn run_metadata_server(config_path: Option<PathBuf>, args: &MetadataServerArgs) -> Result<(), String> {
    let address = std::net::SocketAddr::new(args.host, args.port);
    let limits = aiv_transport::metadata::http_server::StoreLimits {
        max_body_bytes: args.max_body_bytes,
        max_total_bytes: args.max_total_bytes,
        max_keys: args.max_keys,
    };
    let mut server_limits = match config_path {
        Some(path) => {
            let env = aiv_transport::config::ProcessEnvironment;
            EngineConfig::from_file(&path, &env).map_err(|e| e.to_string())?.aiv.metadata_server_limits
        }
        None => aiv_transport::config::MetadataServerLimits::default(),
    };
    if let Some(count) = args.max_connections {
        server_limits.max_connections = count;
    }
    if let Some(bytes) = args.max_buffered_bytes {
        server_limits.max_buffered_bytes = bytes;
    }
    if let Some(ms) = args.request_timeout_ms {
        server_limits.request_timeout = Duration::from_millis(ms);
    }
    let server = aiv_transport::metadata::http_server::MetadataHttpServer::start_with(address, limits, server_limits)
        .map_err(|e| e.to_string())?;
    println!("aiv metadata-server: serving {} (connection string for engines)", server.url());
    server.wait();
    Ok(())
}
