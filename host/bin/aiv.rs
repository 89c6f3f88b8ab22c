//! `aiv`: the command-line front of aiv-transport.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use aiv_transport::bench::{self, BenchParams, ReportUnit};
use aiv_transport::cpu_time::SectionClock;
use aiv_transport::{EngineConfig, Opcode, Protocol, TransferEngine};
use clap::{Parser, Subcommand, ValueEnum};

/// aiv-transport: move KV-cache and other data between Ascend NPUs, and measure how.
///
/// Speaks Mooncake's configuration and benchmark language. The device backend is the CPU twin unless mooncake.json
/// says `"aiv": {"device_backend": "cann"}`. Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more.
#[derive(Debug, Parser)]
#[command(name = "aiv", version, propagate_version = true)]
struct Cli {
    /// mooncake.json to read (default: $MOONCAKE_CONFIG_PATH); the MOONCAKE_* and MC_TRANSFER_TIMEOUT environment
    /// variables fill what it leaves out, or make the whole configuration without a file
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Say whether this Ascend machine is ready for this project (driver, device nodes, npu-smi, CANN toolkit and
    /// compiler, libraries, device count, RoCE link config, memlock limit), then which device backends are usable.
    #[command(after_help = aiv_transport::doctor::cli::AFTER_HELP)]
    Doctor(aiv_transport::doctor::cli::DoctorOptions),
    /// The comparative audit: every path (aiv, adxl, adxl-fabric, ubshmem, tcp) on the same workloads in one process, rounds
    /// interleaved across paths, a same-run memcpy reference, verdicts from the transfers' evidence; writes
    /// report.json and report.md into a directory (docs/audit.md).
    Audit(AuditArgs),
    /// Run Mooncake's transfer_engine_bench workload (same flags and result line).
    Bench(BenchArgs),
    /// Serve segment metadata over HTTP with Mooncake's REST rules (for `http://host:port/metadata`), until killed.
    #[command(name = "metadata-server")]
    MetadataServer(MetadataServerArgs),
}

/// Where the HTTP metadata server listens.
#[derive(Debug, clap::Args)]
struct MetadataServerArgs {
    /// TCP port to listen on
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Address to bind; loopback unless told otherwise
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Largest body of one PUT, in bytes (above it: HTTP 413)
    #[arg(long, default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// Largest total of stored keys and values, in bytes (a PUT past it: HTTP 507)
    #[arg(long, default_value_t = 256 << 20)]
    max_total_bytes: u64,
    /// Most keys stored (a PUT of a new key past it: HTTP 507)
    #[arg(long, default_value_t = 65_536)]
    max_keys: usize,
    /// Connections held at once; a new one over it evicts a waiting one, else is closed (default:
    /// aiv.metadata_server_max_connections of --config, else 1024; 1..=65536)
    #[arg(long)]
    max_connections: Option<usize>,
    /// Request body bytes all connections together may buffer; a PUT that does not fit gets HTTP 503 (default:
    /// aiv.metadata_server_max_buffered_bytes of --config, else 64 MiB; 1..=2^40)
    #[arg(long)]
    max_buffered_bytes: Option<u64>,
    /// Each request, headers and body, must arrive within this many milliseconds of its connection starting to wait
    /// for it (default: aiv.metadata_server_request_timeout_ms of --config, else 10000; 1..=600000)
    #[arg(long)]
    request_timeout_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Initiator,
    Target,
}

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum Operation {
    Read,
    Write,
}

fn opcode(operation: Operation) -> Opcode {
    match operation {
        Operation::Read => Opcode::Read,
        Operation::Write => Opcode::Write,
    }
}

/// Flags and defaults follow transfer_engine_bench. For tcp without --segment_id, a second engine of this process
/// is the target (over loopback sockets); --mode target serves a buffer to another process. gflags spellings
/// (-flag=value) work, and transfer_engine_bench's flags that mean nothing here are ignored with a notice.
#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// Role of this process: initiator, or target (serves a buffer of buffer_size bytes until SIGINT or SIGTERM)
    #[arg(long, value_enum, default_value = "initiator")]
    mode: Mode,
    /// Transfer direction
    #[arg(long, value_enum, default_value = "read")]
    operation: Operation,
    /// adxl-fabric with FabricMem's Host unfold (one aclrtMemcpyAsync per operation) instead of its default AI-CPU
    /// unfold: sets `aiv.fabric_memory.enable_aicpu_unfold` false (twin runtime only)
    #[arg(long = "fabric-host-unfold")]
    fabric_host_unfold: bool,
    /// Protocol of every request: aiv, adxl, adxl-fabric, ubshmem or tcp, or Mooncake's `ascend`, which runs on
    /// `aiv.ascend_protocol` (default aiv). Default: the config's protocol
    #[arg(long)]
    protocol: Option<String>,
    /// Metadata connection string (default: the config's, else P2PHANDSHAKE)
    #[arg(long = "metadata_server")]
    metadata_server: Option<String>,
    /// This engine's name (default: the config's local_hostname, else 127.0.0.1:12345)
    #[arg(long = "local_server_name")]
    local_server_name: Option<String>,
    /// Segment to transfer with (default: this engine's own segment; for tcp, a second engine of this process
    /// reached over loopback sockets). An initiator follows a target that restarts under this name: after a batch
    /// that did not complete, the next one fetches its descriptor again first. A target that stops answering fails
    /// each pending batch as timed out after aiv.transfer_timeout_ms (default 30 s)
    #[arg(long = "segment_id")]
    segment_id: Option<String>,
    /// NIC list, kept for compatibility (default: the config's, else $MOONCAKE_DEVICE)
    #[arg(long = "device_name")]
    device_name: Option<String>,
    /// Bytes of each side's buffer (suffixes allowed: 1gb, 256mb), at most half this machine's memory
    #[arg(long = "buffer_size", default_value = "1073741824", value_parser = |t: &str| bench::parse_buffer_size("--buffer_size", t))]
    buffer_size: u64,
    /// Requests per batch (1 to 65536)
    #[arg(long = "batch_size", default_value = "128", value_parser = bench::parse_batch_size)]
    batch_size: usize,
    /// Bytes per request (suffixes allowed)
    #[arg(long = "block_size", default_value = "65536", value_parser = |t: &str| bench::parse_buffer_size("--block_size", t))]
    block_size: u64,
    /// Seconds to run (0.000001 to one year; default 10). A target serves until SIGINT or SIGTERM, or for
    /// --duration seconds when it is given
    #[arg(long, value_parser = bench::parse_duration)]
    duration: Option<Duration>,
    /// Initiator threads (1 to 1024)
    #[arg(long, default_value = "12", value_parser = bench::parse_threads)]
    threads: usize,
    /// Throughput unit: GB GiB Gb MB MiB Mb KB KiB Kb
    #[arg(long = "report_unit", default_value = "GB")]
    report_unit: ReportUnit,
    /// Digits after the decimal point (0 to 16)
    #[arg(long = "report_precision", default_value = "2", value_parser = bench::parse_report_precision)]
    report_precision: usize,
    /// How Host sections that never sleep are timed for the Host CPU figure: monotonic (wall time, an upper bound of
    /// their CPU time, no system call) or thread (the thread CPU clock, a system call per reading)
    #[arg(long = "section_clock", default_value = "monotonic", value_parser = parse_section_clock)]
    section_clock: SectionClock,
    /// Print one JSON document on stdout with the run's parameters, results, latency quantiles and evidence (the
    /// records' runtime, the four checks, per-transfer counts); the human report then goes to stderr
    #[arg(long)]
    json: bool,
}

/// What `aiv audit` runs. Without flags: `--quick`, on the embedded twin runtime (no servers to start).
#[derive(Debug, clap::Args)]
struct AuditArgs {
    /// The default matrix: 4 KiB latency, 64 KiB and 1 MiB bandwidth and a KV request, 5 rounds, the cells sharing
    /// 75 s (at most 1 s each, at least 0.5 s) unless --cell-seconds says otherwise (about 90 s on two cores)
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// The complete matrix: block sizes 4 KiB to 16 MiB and batched small transfers from two threads, 7 rounds
    #[arg(long)]
    full: bool,
    /// Paths to audit, comma-separated, in the first round's order (default: aiv,adxl,adxl-fabric,ubshmem,tcp, and
    /// mooncake-ascend when its wheel and libraries are found; mooncake-ascend+aiv only when listed here)
    #[arg(long, value_delimiter = ',')]
    paths: Option<Vec<String>>,
    /// The virtualenv with Mooncake's Ascend wheel, for the mooncake-ascend path (default:
    /// target/mooncake-npu-venv here; tests/support/mooncake_npu.sh installs it)
    #[arg(long = "mooncake-npu-venv", value_name = "DIR", env = "AIV_MOONCAKE_NPU_VENV")]
    mooncake_npu_venv: Option<PathBuf>,
    /// The twin runtime's CANN libraries for the mooncake-ascend path (default: target/twin-cann-libs here;
    /// tests/support/twin_cann_libs.sh builds them)
    #[arg(long = "twin-cann-libs", value_name = "DIR", env = "AIV_TWIN_CANN_LIBS")]
    twin_cann_libs: Option<PathBuf>,
    /// The directory of libllm_datadist.so over aiv with the twin's libascendcl.so and libmetadef.so, for the
    /// mooncake-ascend+aiv path (default: target/mooncake-over-aiv here; tests/support/mooncake_over_aiv.sh builds it)
    #[arg(long = "mooncake-over-aiv-libs", value_name = "DIR", env = "AIV_MOONCAKE_OVER_AIV_LIBS")]
    mooncake_over_aiv_libs: Option<PathBuf>,
    /// ASCEND_GLOBAL_RESOURCE_CONFIG (JSON) for the mooncake-ascend processes (default: unset, the wheel's defaults,
    /// which select ADXL's client-server engine); a fabric_memory key selects FabricMem, e.g.
    /// '{"fabric_memory":{"enable_aicpu_unfold":false,"task_stream_num":4}}' its Host unfold
    #[arg(long = "mooncake-global-resource-config", value_name = "JSON", env = "AIV_MOONCAKE_GLOBAL_RESOURCE_CONFIG")]
    mooncake_global_resource_config: Option<String>,
    /// The adxl-fabric path with FabricMem's Host unfold instead of its default AI-CPU unfold: sets
    /// `aiv.fabric_memory.enable_aicpu_unfold` false (twin runtime only)
    #[arg(long = "fabric-host-unfold")]
    fabric_host_unfold: bool,
    /// Block sizes to run instead of the matrix's, comma-separated (suffixes allowed: 4k, 1m); each with
    /// --batch-size and --threads
    #[arg(long, value_delimiter = ',', value_parser = |t: &str| bench::parse_buffer_size("--sizes", t))]
    sizes: Option<Vec<u64>>,
    /// Requests per batch for --sizes (default: 8 MiB worth, 1 to 32)
    #[arg(long = "batch-size", value_parser = bench::parse_batch_size, requires = "sizes")]
    batch_size: Option<usize>,
    /// Initiator threads for --sizes (default 1)
    #[arg(long, value_parser = bench::parse_threads, requires = "sizes")]
    threads: Option<usize>,
    /// Rounds per workload (each visits every path once)
    #[arg(long)]
    rounds: Option<usize>,
    /// Seconds each path runs each workload in each round
    #[arg(long = "cell-seconds", value_parser = bench::parse_duration)]
    cell_seconds: Option<Duration>,
    /// Transfer direction
    #[arg(long, value_enum, default_value = "read")]
    operation: Operation,
    /// How Host sections that never sleep are timed for the Host CPU figures: monotonic (wall time, an upper bound
    /// of their CPU time) or thread (the thread CPU clock, a system call per reading)
    #[arg(long = "section-clock", default_value = "monotonic", value_parser = parse_section_clock)]
    section_clock: SectionClock,
    /// Leave out the error-recovery rounds (a fault injected per path: an out-of-bounds request, a stalled engine, a
    /// killed peer process)
    #[arg(long = "no-faults")]
    no_faults: bool,
    /// Leave out allocation success (a device and a Host heap requested in chunks, registered, then freed)
    #[arg(long = "no-alloc")]
    no_alloc: bool,
    /// Bytes of the heap allocation success requests per memory kind (suffixes allowed; default: aiv.hbm_size)
    #[arg(long = "alloc-request", value_parser = aiv_transport::config::parse_size, conflicts_with = "no_alloc")]
    alloc_request: Option<u64>,
    /// After each workload's measured rounds, one traced cell per path: per-stage traces (Host, AIV blocks, SDMA
    /// engines) written as trace-<workload>-<path>.json, Chrome trace files for Perfetto (docs/trace.md)
    #[arg(long)]
    trace: bool,
    /// Also measure aiv against tcp between two hosts, after everything else: two network namespaces joined by one
    /// veth pair (made and deleted by the audit; needs root and `ip`, else the section says "not run" and why), per
    /// run an `aiv bench` target in one and an initiator in the other, WRITE then READ (or --cross-operations),
    /// batches of 8 from 2 threads (or --batch-size, --threads), block sizes 1 MiB and 64 KiB (or --sizes), --rounds
    /// rounds of --cell-seconds per protocol alternating the order; reports the medians of bandwidth and
    /// whole-process Host CPU per transfer, the ratios aiv/tcp against the bar aiv is held to (bandwidth >= 0.8x tcp's
    /// at 1 MiB, where both are bandwidth-bound; Host CPU per transfer <= 0.1x tcp's, since aiv's kernel, not the
    /// Host, builds and submits the transfers), the route aiv took and each failure (twin runtime: unverified on
    /// hardware; docs/multihost.md)
    #[arg(long = "cross-host")]
    cross_host: bool,
    /// The operations the cross-host section measures, in order (comma-separated)
    #[arg(long = "cross-operations", value_enum, value_delimiter = ',', requires = "cross_host", num_args = 1..)]
    cross_operations: Vec<Operation>,
    /// Directory for report.json and report.md (default: aiv-audit-<UTC time> here)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Compare two report.json files instead of running: what differs, and per workload and path the medians with
    /// their ratio B/A
    #[arg(long, num_args = 2, value_names = ["A", "B"], conflicts_with_all = ["quick", "full", "paths", "sizes", "rounds", "cell_seconds", "out"])]
    compare: Option<Vec<PathBuf>>,
    /// Inspect wheels, ELF files and source trees instead of running: per component the evidence for and against
    /// each check of AIV direct-drive, and a verdict (docs/inspect.md)
    #[arg(long, num_args = 1.., value_name = "PATH", conflicts_with_all = ["quick", "full", "paths", "sizes", "batch_size", "threads", "rounds", "cell_seconds", "operation", "out", "compare"])]
    inspect: Option<Vec<PathBuf>>,
    /// With --inspect: print the report as JSON (schema aiv-inspect/2) instead of text
    #[arg(long, requires = "inspect")]
    json: bool,
    /// Run again the audit a report.json records: its command line, its mooncake.json text and the configuration
    /// variables it read (not this process's); writes a new report (into --out, default aiv-audit-<UTC time>) that
    /// names the one it repeats
    #[arg(long, value_name = "REPORT", conflicts_with_all = ["quick", "full", "paths", "sizes", "batch_size", "threads", "rounds", "cell_seconds", "no_faults", "no_alloc", "alloc_request", "trace", "compare", "inspect"])]
    rerun: Option<PathBuf>,
}

/// transfer_engine_bench's flags that mean nothing here (`mooncake-transfer-engine/example/transfer_engine_bench.cpp`:
/// RDMA NIC selection, topology discovery, the TENT backend, GPU memory), and the glog flags it links in. Accepted
/// and ignored, with a notice, so that scripts written for it run unchanged. `true` marks a boolean flag (gflags
/// takes its value only as `--flag=value`, or `--noflag`).
const MOONCAKE_ONLY_FLAGS: [(&str, bool); 19] = [
    ("nic_priority_matrix", false),
    ("auto_discovery", true),
    ("backend", false),
    ("use_vram", true),
    ("init_mem", true),
    ("gpu_id", false),
    ("logtostderr", true),
    ("alsologtostderr", true),
    ("colorlogtostderr", true),
    ("stderrthreshold", false),
    ("minloglevel", false),
    ("log_dir", false),
    ("log_prefix", true),
    ("logbuflevel", false),
    ("logbufsecs", false),
    ("max_log_size", false),
    ("stop_logging_if_full_disk", true),
    ("v", false),
    ("vmodule", false),
];

/// Rewrites gflags spellings into what the parser takes: `-flag` and `-flag=value` become `--flag` and
/// `--flag=value` (single-letter `-h`, `-V` stay short), and [`MOONCAKE_ONLY_FLAGS`] are dropped (with their value
/// when it is the next argument), each with a notice. Arguments after `--` are left alone.
fn gflags_argv(argv: Vec<std::ffi::OsString>) -> (Vec<std::ffi::OsString>, Vec<String>) {
    let mut out = Vec::with_capacity(argv.len());
    let mut notices = Vec::new();
    let mut args = argv.into_iter();
    if let Some(program) = args.next() {
        out.push(program);
    }
    // Whether the previous argument was a `--flag` (no `=`) that takes the next argument as its value.
    let mut value_next = false;
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            value_next = false;
            out.push(arg);
            continue;
        };
        if value_next || text == "--" || !text.starts_with('-') {
            value_next = false;
            if text == "--" {
                out.push(arg);
                out.extend(args);
                break;
            }
            out.push(arg);
            continue;
        }
        let long = match text.strip_prefix("--") {
            Some(rest) => rest.to_owned(),
            None => {
                let rest = &text[1..];
                let name_len = rest.find('=').unwrap_or(rest.len());
                let mooncake_short = MOONCAKE_ONLY_FLAGS.iter().any(|(flag, _)| *flag == &rest[..name_len]);
                if (name_len < 2 && !mooncake_short) || !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
                    out.push(arg);
                    continue;
                }
                rest.to_owned()
            }
        };
        let (name, inline_value) = match long.split_once('=') {
            Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
            None => (long.clone(), None),
        };
        let mooncake_only = MOONCAKE_ONLY_FLAGS
            .iter()
            .find(|(flag, boolean)| *flag == name || (*boolean && name.strip_prefix("no") == Some(flag)));
        if let Some((_, boolean)) = mooncake_only {
            let mut spelled = format!("--{name}");
            if let Some(value) = &inline_value {
                spelled.push_str(&format!("={value}"));
            } else if !boolean {
                if let Some(value) = args.next() {
                    spelled.push_str(&format!(" {}", value.to_string_lossy()));
                }
            }
            notices.push(format!("notice: {spelled}: a transfer_engine_bench flag with no effect here; ignored"));
            continue;
        }
        value_next = inline_value.is_none() && !matches!(name.as_str(), "help" | "version");
        out.push(format!("--{long}").into());
    }
    (out, notices)
}

/// transfer_engine_bench's default `--duration` (for an initiator).
const DEFAULT_DURATION: Duration = Duration::from_secs(10);

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

/// transfer_engine_bench's default `--local_server_name`.
const DEFAULT_SERVER_NAME: &str = "127.0.0.1:12345";

fn parse_section_clock(text: &str) -> Result<SectionClock, String> {
    text.parse()
}

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

fn run_audit(config_path: Option<PathBuf>, args: AuditArgs) -> Result<(), String> {
    use aiv_transport::audit::{self, AuditReport};
    if let Some(paths) = args.inspect {
        if let Some(missing) = paths.iter().find(|path| !path.exists()) {
            return Err(format!("--inspect: {} does not exist", missing.display()));
        }
        let report = audit::inspect::inspect(&paths);
        if args.json {
            let text = serde_json::to_string_pretty(&report).map_err(|e| format!("--inspect --json: {e}"))?;
            println!("{text}");
        } else {
            print!("{}", report.render());
        }
        return Ok(());
    }
    if let Some(files) = args.compare {
        let (a, b) = (AuditReport::read(&files[0])?, AuditReport::read(&files[1])?);
        print!("{}", audit::compare::compare(&a, &b));
        return Ok(());
    }
    if let Some(report) = args.rerun.clone() {
        return rerun_audit(&report, args.out);
    }
    // The program as `aiv` (not where this binary lies), then the arguments as given.
    let command = std::iter::once("aiv".to_owned()).chain(std::env::args().skip(1)).collect();
    run_audit_with(config_path, &aiv_transport::config::ProcessEnvironment, args, command, None)
}

/// `aiv audit --rerun REPORT`: the recorded command line parsed again (without its --out and --config), on the
/// recorded configuration file (written into the new output directory as rerun-config.json) and variables.
fn rerun_audit(path: &std::path::Path, out: Option<PathBuf>) -> Result<(), String> {
    use aiv_transport::audit::{report::RerunOf, AuditReport};
    let recorded = AuditReport::read(path)?;
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    let mut words = recorded.command.iter();
    while let Some(word) = words.next() {
        match word.as_str() {
            "--out" | "--config" => {
                words.next();
            }
            w if w.starts_with("--out=") || w.starts_with("--config=") => {}
            w => argv.push(w.into()),
        }
    }
    let (argv, _) = gflags_argv(argv);
    let what = |reason: String| format!("--rerun {}: {reason}", path.display());
    let cli = Cli::try_parse_from(&argv).map_err(|e| what(format!("its command does not parse here: {e}")))?;
    let Command::Audit(mut args) = cli.command else {
        return Err(what(format!("its command is not an audit: {}", recorded.command.join(" "))));
    };
    if args.rerun.is_some() || args.compare.is_some() || args.inspect.is_some() {
        return Err(what("its command did not run an audit".into()));
    }
    let out = out.unwrap_or_else(default_audit_dir);
    let config_path = match &recorded.config.file {
        Some(text) => {
            std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
            let file = out.join("rerun-config.json");
            std::fs::write(&file, text).map_err(|e| format!("writing {}: {e}", file.display()))?;
            Some(file)
        }
        None => None,
    };
    args.out = Some(out);
    let env = aiv_transport::config::FixedEnvironment(recorded.config.env.clone());
    let of = RerunOf {
        report: path.display().to_string(),
        started_utc: recorded.started_utc.clone(),
        source_commit: recorded.environment.source_commit.clone(),
    };
    eprintln!("aiv: rerunning `{}` (started {}) with its configuration", recorded.command.join(" "), of.started_utc);
    run_audit_with(config_path, &env, args, recorded.command.clone(), Some(of))
}

/// `aiv-audit-<UTC time>` in the current directory.
fn default_audit_dir() -> PathBuf {
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    PathBuf::from(format!("aiv-audit-{}", stamp.replace([':', '-'], "")))
}

/// Runs an audit of `args` on the configuration `config_path` and `env` make; `command` is what the report records.
fn run_audit_with(
    config_path: Option<PathBuf>,
    env: &dyn aiv_transport::config::Environment,
    args: AuditArgs,
    command: Vec<String>,
    rerun_of: Option<aiv_transport::audit::report::RerunOf>,
) -> Result<(), String> {
    use aiv_transport::audit::{self, AuditOptions, Workload};
    use aiv_transport::config::{RecordingEnvironment, CONFIG_PATH_ENV};
    let recording = RecordingEnvironment::new(env);
    let mut config =
        EngineConfig::load_with(config_path.as_deref(), &recording, DEFAULT_SERVER_NAME).map_err(|e| e.to_string())?;
    if args.fabric_host_unfold {
        config.aiv.fabric_memory.enable_aicpu_unfold = false;
    }
    let mut options = if args.full { AuditOptions::full() } else { AuditOptions::quick() };
    // The Mooncake paths: mooncake-ascend by default when found (else left out, with a line saying why); with
    // --paths only when listed. mooncake-ascend listed but not found is skipped with the reason. mooncake-ascend+aiv
    // runs only when --paths lists it: its two processes each run a twin device with a persistent kernel, whose
    // threads take CPU from the other paths' cells on a small machine (on two cores aiv's 4 KiB p50 went from about
    // 30 to about 160 µs beside it); listed but not found is an error naming the script that builds it.
    for variant in audit::mooncake::Variant::ALL {
        let listed = args.paths.as_ref().map(|names| names.iter().any(|n| n == variant.path()));
        let libs = match variant {
            audit::mooncake::Variant::TwinHixl => args.twin_cann_libs.clone(),
            audit::mooncake::Variant::OverAiv => args.mooncake_over_aiv_libs.clone(),
        };
        let found =
            audit::mooncake::discover_variant(variant, args.mooncake_npu_venv.clone(), libs, config.aiv.device_backend);
        let (setup, skipped) = match (found, listed) {
            (Ok(_), None) if variant == audit::mooncake::Variant::OverAiv => {
                let reason = format!(
                    "not in the default run (its processes' twin devices take CPU from the other paths' cells); \
                     --paths lists it to run it, e.g. --paths aiv,mooncake-ascend,{}",
                    variant.path()
                );
                eprintln!("aiv: audit: {} left out: {reason}", variant.path());
                (None, Some(reason))
            }
            (Ok(mut setup), None | Some(true)) => {
                if variant == audit::mooncake::Variant::TwinHixl {
                    setup.global_resource_config = args.mooncake_global_resource_config.clone();
                }
                (Some(setup), None)
            }
            (Ok(_), Some(false)) => (None, Some(format!("not selected (--paths does not list {})", variant.path()))),
            (Err(reason), Some(true)) if variant == audit::mooncake::Variant::OverAiv => {
                return Err(format!("--paths {}: {reason}", variant.path()));
            }
            (Err(reason), listed) => {
                if listed.is_none() {
                    eprintln!("aiv: audit: {} left out: {reason}", variant.path());
                }
                (None, Some(reason))
            }
        };
        match variant {
            audit::mooncake::Variant::TwinHixl => (options.mooncake, options.mooncake_skipped) = (setup, skipped),
            audit::mooncake::Variant::OverAiv => {
                (options.mooncake_over_aiv, options.mooncake_over_aiv_skipped) = (setup, skipped)
            }
        }
    }
    if let Some(names) = args.paths {
        options.paths = names
            .iter()
            .filter(|name| audit::mooncake::Variant::from_path(name).is_none())
            .map(|name| config.aiv.resolve_protocol(name).map_err(|e| format!("--paths: {e}")))
            .collect::<Result<_, _>>()?;
    }
    if options.paths.is_empty() && options.mooncake_setups().is_empty() {
        let reason = options.mooncake_skipped.as_deref().unwrap_or("no path");
        return Err(format!("--paths: nothing to run: mooncake-ascend: {reason}"));
    }
    let cross_sizes = args.sizes.clone();
    if let Some(sizes) = args.sizes {
        let threads = args.threads.unwrap_or(1);
        options.workloads = sizes
            .into_iter()
            .map(|block_size| {
                let batch_size = args.batch_size.unwrap_or(((8u64 << 20) / block_size.max(1)).clamp(1, 32) as usize);
                Workload::bench(block_size, batch_size, threads)
            })
            .collect();
    }
    if let Some(rounds) = args.rounds {
        options.rounds = rounds;
    }
    if let Some(cell) = args.cell_seconds {
        options.cell = cell;
    } else if !args.full {
        options.fit_quick_budget();
    }
    options.operation = opcode(args.operation);
    options.faults = !args.no_faults;
    options.trace = args.trace;
    // The killed-peer round runs this binary as the target in another process.
    options.peer_program = std::env::current_exe().ok();
    if args.cross_host {
        let mut cross =
            audit::cross_host::CrossHostOptions::new(options.peer_program.clone(), options.rounds, options.cell);
        if let Some(sizes) = cross_sizes {
            cross.sizes = sizes;
        }
        cross.batch_size = args.batch_size.unwrap_or(cross.batch_size);
        cross.threads = args.threads.unwrap_or(cross.threads);
        if !args.cross_operations.is_empty() {
            cross.operations = args.cross_operations.iter().map(|&op| opcode(op)).collect();
            cross.operations.dedup();
        }
        options.cross_host = Some(cross);
    }
    // A test hook: a warning the named fault's rounds do not declare, to show it still prints.
    options.inject_warning = std::env::var("AIV_AUDIT_INJECT_WARNING").ok();
    options.allocation = !args.no_alloc;
    options.alloc_request = args.alloc_request;
    options.command = command;
    options.rerun_of = rerun_of;
    let file = config_path.clone().or_else(|| env.var(CONFIG_PATH_ENV).map(PathBuf::from));
    options.config_file = file.and_then(|path| std::fs::read_to_string(path).ok());
    // The file's text is recorded; where it lay is not needed to rerun.
    options.config_env = recording.seen().into_iter().filter(|(name, _)| name != CONFIG_PATH_ENV).collect();
    options.validate().map_err(|e| e.to_string())?;
    aiv_transport::cpu_time::set_section_clock(args.section_clock);
    let out = args.out.unwrap_or_else(default_audit_dir);
    let progress = audit::terminal::AuditProgress::new();
    let report = audit::run(&config, &options, &progress).map_err(|e| e.to_string())?;
    progress.finish();
    let mut report = report;
    let [json, md] = report.write(&out).map_err(|e| format!("writing the report into {}: {e}", out.display()))?;
    for verdict in &report.verdicts {
        if let Some(line) = verdict.lines.first() {
            println!("{:8} {line}", verdict.path);
        }
    }
    println!("report: {} and {}", md.display(), json.display());
    Ok(())
}

fn run_bench(config_path: Option<PathBuf>, args: BenchArgs) -> Result<(), String> {
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

/// Prints what a bench run measured: the workload, the evidence, the memcpy reference, and the result line.
fn print_bench_report(
    params: &BenchParams,
    report: &bench::LoopbackReport,
    target: &str,
    json: bool,
) -> Result<(), String> {
    use std::io::Write as _;
    let outcome = &report.outcome;
    // With --json, stdout carries only the JSON document; the report for people goes to stderr.
    let mut out: Box<dyn std::io::Write> =
        if json { Box::new(std::io::stderr().lock()) } else { Box::new(std::io::stdout().lock()) };
    let _ = writeln!(
        out,
        "aiv bench: protocol {}, {} {} x {} B per batch, {} thread(s), {target}",
        params.protocol,
        params.operation.as_str(),
        params.batch_size,
        params.block_size,
        params.threads,
    );
    if let Some(sample) = &outcome.evidence.sample {
        let evidence = &outcome.evidence;
        let _ = writeln!(
            out,
            "evidence: path {}, {} transfers; per transfer: {:.2} host device-API calls (counted by the loader \
             tables), {:.2} descriptors, {:.2} doorbells",
            sample.path, evidence.transfers, evidence.host_device_api_calls, evidence.descriptors, evidence.doorbells,
        );
        // The verdict, derived from every record's observed acts, names the runtime they came from: on the twin
        // runtime it is the model's, not an NPU's.
        for line in evidence.tally.verdict_lines() {
            let _ = writeln!(out, "{line}");
        }
        // Host CPU: the whole process first (no attribution can move work out of it), then the path's share.
        match evidence.process_host_cpu_ns {
            Some(process) => {
                let _ = writeln!(
                    out,
                    "host CPU per transfer, whole process: {process:.0} ns on every Host thread (the waiting \
                     callers, the engine, the path's threads, the probe; the twin's device threads excluded); \
                     attributed to the path: {:.0} ns ({:.0}%: its own threads and sections {:.0} ns, the waiting \
                     callers {:.0} ns)",
                    evidence.host_cpu_ns + evidence.waiting_cpu_ns,
                    100.0 * (evidence.host_cpu_ns + evidence.waiting_cpu_ns) / process.max(1.0),
                    evidence.host_cpu_ns,
                    evidence.waiting_cpu_ns,
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "host CPU per transfer, whole process: not measured (/proc could not be read); attributed to \
                     the path: {:.0} ns (its own threads and sections {:.0} ns, the waiting callers {:.0} ns)",
                    evidence.host_cpu_ns + evidence.waiting_cpu_ns,
                    evidence.host_cpu_ns,
                    evidence.waiting_cpu_ns
                );
            }
        }
        // The accounting reads clocks, the thread CPU clock through a system call: say how much of the figure above
        // that is.
        let _ = writeln!(
            out,
            "host CPU accounting: sections that never sleep timed by the {} clock; per transfer {:.1} thread-CPU \
             clock readings at {:.0} ns each and {:.1} monotonic-clock readings at {:.0} ns each (up to {:.0} ns of \
             the host CPU above is the measurement itself)",
            aiv_transport::cpu_time::section_clock().name(),
            evidence.clock_readings,
            evidence.clock_reading_ns,
            evidence.monotonic_readings,
            evidence.monotonic_reading_ns,
            evidence.clock_readings * evidence.clock_reading_ns
                + evidence.monotonic_readings * evidence.monotonic_reading_ns,
        );
    }
    // What the run kept busy: the twin's cores and engines (a CPU model), Host CPU by thread role.
    let _ = write!(out, "{}", outcome.occupancy);
    let _ = writeln!(
        out,
        "latency per batch: p50 {:.1} us, p99 {:.1} us over {} batches",
        outcome.latency_quantile(0.5).as_secs_f64() * 1e6,
        outcome.latency_quantile(0.99).as_secs_f64() * 1e6,
        outcome.batch_latencies.len()
    );
    let throughput = outcome.bytes_per_second();
    let _ = writeln!(
        out,
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
    eprintln!("{}", outcome.result_line(params));
    if json {
        drop(out);
        let document = bench::report_json(params, report, target);
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{document}")
            .and_then(|()| stdout.flush())
            .map_err(|e| format!("write the JSON report: {e}"))?;
    }
    // transfer_engine_bench users script against the exit code: any failed batch is a failed run.
    if outcome.failed_batches > 0 {
        return Err(format!(
            "{} of {} batch(es) failed",
            outcome.failed_batches,
            outcome.failed_batches.saturating_add(outcome.completed_batches)
        ));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    const FLAGS: [&str; 19] = [
        "-duration",
        "-threads",
        "--gpu_id",
        "--auto_discovery",
        "-nouse_vram",
        "--mode",
        "--operation",
        "--protocol",
        "--metadata_server",
        "--local_server_name",
        "--segment_id",
        "--buffer_size",
        "--batch_size",
        "--block_size",
        "--duration",
        "--threads",
        "--report_unit",
        "--report_precision",
        "--section_clock",
    ];

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|x| x.to_string()),
            Just("18446744073709551615".to_owned()),
            Just("1e300".to_owned()),
            Just("-1".to_owned()),
            Just("1tb".to_owned()),
            Just("NaN".to_owned()),
            "[0-9]{1,25}(b|kb|mb|gb|tb|\\.5gb)?",
            "\\PC{0,12}",
        ]
    }

    fn rewrite(args: &[&str]) -> (Vec<String>, Vec<String>) {
        let argv = std::iter::once("aiv").chain(args.iter().copied()).map(Into::into).collect();
        let (out, notices) = gflags_argv(argv);
        (out.into_iter().skip(1).map(|a| a.into_string().expect("utf-8")).collect(), notices)
    }

    #[test]
    fn gflags_spellings_are_rewritten_and_mooncake_only_flags_dropped_with_a_notice() {
        let (out, notices) = rewrite(&["bench", "-duration=1", "-threads", "2", "--batch_size=4", "--block_size", "8"]);
        assert_eq!(out, ["bench", "--duration=1", "--threads", "2", "--batch_size=4", "--block_size", "8"]);
        assert!(notices.is_empty());
        let (out, notices) = rewrite(&[
            "bench",
            "--logtostderr",
            "--nic_priority_matrix",
            "m.json",
            "-gpu_id=-1",
            "-nouse_vram",
            "-v",
            "2",
            "--segment_id",
            "-odd-name",
            "-h",
        ]);
        assert_eq!(out, ["bench", "--segment_id", "-odd-name", "-h"]);
        assert_eq!(notices.len(), 5, "{notices:?}");
        assert!(notices[1].contains("--nic_priority_matrix m.json") && notices[1].contains("no effect"), "{notices:?}");
        let (out, _) = rewrite(&["bench", "--", "-duration=1"]);
        assert_eq!(out, ["bench", "--", "-duration=1"], "nothing after -- is rewritten");
    }

    proptest! {
        // Failure seeds are kept beside this file (host/bin/aiv.proptest-regressions), not in a top-level folder.
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
            ..ProptestConfig::default()
        })]

        /// Whatever the flags say, parsing them and checking the workload they describe returns an answer: it never
        /// panics, and what it accepts is inside the documented ranges.
        #[test]
        fn bench_flags_error_or_run_never_panic(pairs in proptest::collection::vec((0..FLAGS.len(), value()), 0..6)) {
            let mut argv = vec!["aiv".to_owned(), "bench".to_owned()];
            for (flag, value) in pairs {
                argv.push(FLAGS[flag].to_owned());
                argv.push(value);
            }
            let (argv, _) = gflags_argv(argv.into_iter().map(Into::into).collect());
            if let Ok(Cli { command: Command::Bench(args), .. }) = Cli::try_parse_from(&argv) {
                let duration = args.duration.unwrap_or(DEFAULT_DURATION);
                prop_assert!(duration > Duration::ZERO);
                prop_assert!(duration.as_secs_f64() <= bench::MAX_DURATION_SECS);
                prop_assert!((1..=bench::MAX_THREADS).contains(&args.threads));
                prop_assert!((1..=bench::MAX_BATCH_SIZE).contains(&args.batch_size));
                prop_assert!(args.report_precision <= bench::MAX_REPORT_PRECISION);
                let params = BenchParams {
                    operation: Opcode::Read,
                    protocol: Protocol::Tcp,
                    buffer_size: args.buffer_size,
                    batch_size: args.batch_size,
                    block_size: args.block_size,
                    duration,
                    threads: args.threads,
                    report_unit: args.report_unit,
                    report_precision: args.report_precision,
                };
                let _ = params.validate();
                let outcome = bench::BenchOutcome {
                    elapsed: duration,
                    completed_batches: u64::MAX,
                    failed_batches: 0,
                    first_failure: None,
                    evidence: Default::default(),
                    bytes_per_batch: u64::MAX,
                    batch_latencies: bench::latency_histogram(),
                    window: aiv_transport::device::cann::profiler::Window { start_us: 0.0, end_us: 0.0 },
                    occupancy: {
                        let before = aiv_transport::occupancy::OccupancySnapshot::take(&[], false);
                        aiv_transport::occupancy::OccupancySnapshot::take(&[], false).since(&before)
                    },
                };
                let _ = outcome.result_line(&params);
            }
        }

        /// The environment variables Mooncake reads: each value is taken or refused, never a panic.
        #[test]
        fn environment_error_or_run_never_panic(
            vars in proptest::collection::vec((0..5usize, value()), 0..5),
        ) {
            const NAMES: [&str; 5] = [
                "MOONCAKE_LOCAL_HOSTNAME",
                "MOONCAKE_TE_META_DATA_SERVER",
                "MOONCAKE_PROTOCOL",
                "MC_TRANSFER_TIMEOUT",
                "MOONCAKE_DEVICE",
            ];
            let env = |name: &str| vars.iter().rev().find(|(i, _)| NAMES[*i] == name).map(|(_, v)| v.clone());
            // The plumbing `aiv bench` uses without a file (MOONCAKE_CONFIG_PATH is never among these names).
            if let Ok(config) = EngineConfig::load_with(None, &env, DEFAULT_SERVER_NAME) {
                let timeout = config.aiv.transfer_timeout;
                prop_assert!(timeout >= Duration::from_secs(1));
                prop_assert!(timeout.as_millis() <= u128::from(aiv_transport::config::MAX_TRANSFER_TIMEOUT_MS));
            }
        }
    }
}
