//! The command line's definitions: the subcommands, their flags with defaults and ranges, and the defaults taken
//! from transfer_engine_bench.

use std::path::PathBuf;
use std::time::Duration;

use aiv_transport::bench::{self, ReportUnit};
use aiv_transport::cpu_time::SectionClock;
use aiv_transport::Opcode;
use clap::{Parser, Subcommand, ValueEnum};

/// aiv-transport: move KV-cache and other data between Ascend NPUs, and measure how.
///
/// Speaks Mooncake's configuration and benchmark language. The device backend is the CPU twin unless mooncake.json
/// says `"aiv": {"device_backend": "cann"}`. Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more.
#[derive(Debug, Parser)]
#[command(name = "aiv", version, propagate_version = true)]
pub(crate) struct Cli {
    /// mooncake.json to read (default: $MOONCAKE_CONFIG_PATH); the MOONCAKE_* and MC_TRANSFER_TIMEOUT environment
    /// variables fill what it leaves out, or make the whole configuration without a file
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
pub(crate) struct MetadataServerArgs {
    /// TCP port to listen on
    #[arg(long, default_value_t = 8080)]
    pub(crate) port: u16,
    /// Address to bind; loopback unless told otherwise
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: std::net::IpAddr,
    /// Largest body of one PUT, in bytes (above it: HTTP 413)
    #[arg(long, default_value_t = 16 << 20)]
    pub(crate) max_body_bytes: usize,
    /// Largest total of stored keys and values, in bytes (a PUT past it: HTTP 507)
    #[arg(long, default_value_t = 256 << 20)]
    pub(crate) max_total_bytes: u64,
    /// Most keys stored (a PUT of a new key past it: HTTP 507)
    #[arg(long, default_value_t = 65_536)]
    pub(crate) max_keys: usize,
    /// Connections held at once; a new one over it evicts a waiting one, else is closed (default:
    /// aiv.metadata_server_max_connections of --config, else 1024; 1..=65536)
    #[arg(long)]
    pub(crate) max_connections: Option<usize>,
    /// Request body bytes all connections together may buffer; a PUT that does not fit gets HTTP 503 (default:
    /// aiv.metadata_server_max_buffered_bytes of --config, else 64 MiB; 1..=2^40)
    #[arg(long)]
    pub(crate) max_buffered_bytes: Option<u64>,
    /// Each request, headers and body, must arrive within this many milliseconds of its connection starting to wait
    /// for it (default: aiv.metadata_server_request_timeout_ms of --config, else 10000; 1..=600000)
    #[arg(long)]
    pub(crate) request_timeout_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Mode {
    Initiator,
    Target,
}

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub(crate) enum Operation {
    Read,
    Write,
}

pub(crate) fn opcode(operation: Operation) -> Opcode {
    match operation {
        Operation::Read => Opcode::Read,
        Operation::Write => Opcode::Write,
    }
}

/// Flags and defaults follow transfer_engine_bench. For tcp without --segment_id, a second engine of this process
/// is the target (over loopback sockets); --mode target serves a buffer to another process. gflags spellings
/// (-flag=value) work, and transfer_engine_bench's flags that mean nothing here are ignored with a notice.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Role of this process: initiator, or target (serves a buffer of buffer_size bytes until SIGINT or SIGTERM)
    #[arg(long, value_enum, default_value = "initiator")]
    pub(crate) mode: Mode,
    /// Transfer direction
    #[arg(long, value_enum, default_value = "read")]
    pub(crate) operation: Operation,
    /// adxl-fabric with FabricMem's Host unfold (one aclrtMemcpyAsync per operation) instead of its default AI-CPU
    /// unfold: sets `aiv.fabric_memory.enable_aicpu_unfold` false (twin runtime only)
    #[arg(long = "fabric-host-unfold")]
    pub(crate) fabric_host_unfold: bool,
    /// Protocol of every request: aiv, adxl, adxl-fabric, ubshmem or tcp, or Mooncake's `ascend`, which runs on
    /// `aiv.ascend_protocol` (default aiv). Default: the config's protocol
    #[arg(long)]
    pub(crate) protocol: Option<String>,
    /// Metadata connection string (default: the config's, else P2PHANDSHAKE)
    #[arg(long = "metadata_server")]
    pub(crate) metadata_server: Option<String>,
    /// This engine's name (default: the config's local_hostname, else 127.0.0.1:12345)
    #[arg(long = "local_server_name")]
    pub(crate) local_server_name: Option<String>,
    /// Segment to transfer with (default: this engine's own segment; for tcp, a second engine of this process
    /// reached over loopback sockets). An initiator follows a target that restarts under this name: after a batch
    /// that did not complete, the next one fetches its descriptor again first. A target that stops answering fails
    /// each pending batch as timed out after aiv.transfer_timeout_ms (default 30 s)
    #[arg(long = "segment_id")]
    pub(crate) segment_id: Option<String>,
    /// NIC list, kept for compatibility (default: the config's, else $MOONCAKE_DEVICE)
    #[arg(long = "device_name")]
    pub(crate) device_name: Option<String>,
    /// Bytes of each side's buffer (suffixes allowed: 1gb, 256mb), at most half this machine's memory
    #[arg(long = "buffer_size", default_value = "1073741824", value_parser = |t: &str| bench::parse_buffer_size("--buffer_size", t))]
    pub(crate) buffer_size: u64,
    /// Requests per batch (1 to 65536)
    #[arg(long = "batch_size", default_value = "128", value_parser = bench::parse_batch_size)]
    pub(crate) batch_size: usize,
    /// Bytes per request (suffixes allowed)
    #[arg(long = "block_size", default_value = "65536", value_parser = |t: &str| bench::parse_buffer_size("--block_size", t))]
    pub(crate) block_size: u64,
    /// Seconds to run (0.000001 to one year; default 10). A target serves until SIGINT or SIGTERM, or for
    /// --duration seconds when it is given
    #[arg(long, value_parser = bench::parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// Initiator threads (1 to 1024)
    #[arg(long, default_value = "12", value_parser = bench::parse_threads)]
    pub(crate) threads: usize,
    /// Throughput unit: GB GiB Gb MB MiB Mb KB KiB Kb
    #[arg(long = "report_unit", default_value = "GB")]
    pub(crate) report_unit: ReportUnit,
    /// Digits after the decimal point (0 to 16)
    #[arg(long = "report_precision", default_value = "2", value_parser = bench::parse_report_precision)]
    pub(crate) report_precision: usize,
    /// How Host sections that never sleep are timed for the Host CPU figure: monotonic (wall time, an upper bound of
    /// their CPU time, no system call) or thread (the thread CPU clock, a system call per reading)
    #[arg(long = "section_clock", default_value = "monotonic", value_parser = parse_section_clock)]
    pub(crate) section_clock: SectionClock,
    /// Print one JSON document on stdout with the run's parameters, results, latency quantiles and evidence (the
    /// records' runtime, the four checks, per-transfer counts); the human report then goes to stderr
    #[arg(long)]
    pub(crate) json: bool,
}

/// What `aiv audit` runs. Without flags: `--quick`, on the embedded twin runtime (no servers to start).
#[derive(Debug, clap::Args)]
pub(crate) struct AuditArgs {
    /// The default matrix: 4 KiB latency, 64 KiB and 1 MiB bandwidth and a KV request, 5 rounds, the cells sharing
    /// 75 s (at most 1 s each, at least 0.5 s) unless --cell-seconds says otherwise (about 90 s on two cores)
    #[arg(long, conflicts_with = "full")]
    pub(crate) quick: bool,
    /// The complete matrix: block sizes 4 KiB to 16 MiB and batched small transfers from two threads, 7 rounds
    #[arg(long)]
    pub(crate) full: bool,
    /// Paths to audit, comma-separated, in the first round's order (default: aiv,adxl,adxl-fabric,ubshmem,tcp, and
    /// mooncake-ascend when its wheel and libraries are found; mooncake-ascend+aiv only when listed here)
    #[arg(long, value_delimiter = ',')]
    pub(crate) paths: Option<Vec<String>>,
    /// The virtualenv with Mooncake's Ascend wheel, for the mooncake-ascend path (default:
    /// target/mooncake-npu-venv here; tests/support/mooncake_npu.sh installs it)
    #[arg(long = "mooncake-npu-venv", value_name = "DIR", env = "AIV_MOONCAKE_NPU_VENV")]
    pub(crate) mooncake_npu_venv: Option<PathBuf>,
    /// The twin runtime's CANN libraries for the mooncake-ascend path (default: target/twin-cann-libs here;
    /// tests/support/twin_cann_libs.sh builds them)
    #[arg(long = "twin-cann-libs", value_name = "DIR", env = "AIV_TWIN_CANN_LIBS")]
    pub(crate) twin_cann_libs: Option<PathBuf>,
    /// The directory of libllm_datadist.so over aiv with the twin's libascendcl.so and libmetadef.so, for the
    /// mooncake-ascend+aiv path (default: target/mooncake-over-aiv here; tests/support/mooncake_over_aiv.sh builds it)
    #[arg(long = "mooncake-over-aiv-libs", value_name = "DIR", env = "AIV_MOONCAKE_OVER_AIV_LIBS")]
    pub(crate) mooncake_over_aiv_libs: Option<PathBuf>,
    /// ASCEND_GLOBAL_RESOURCE_CONFIG (JSON) for the mooncake-ascend processes (default: unset, the wheel's defaults,
    /// which select ADXL's client-server engine); a fabric_memory key selects FabricMem, e.g.
    /// '{"fabric_memory":{"enable_aicpu_unfold":false,"task_stream_num":4}}' its Host unfold
    #[arg(long = "mooncake-global-resource-config", value_name = "JSON", env = "AIV_MOONCAKE_GLOBAL_RESOURCE_CONFIG")]
    pub(crate) mooncake_global_resource_config: Option<String>,
    /// The adxl-fabric path with FabricMem's Host unfold instead of its default AI-CPU unfold: sets
    /// `aiv.fabric_memory.enable_aicpu_unfold` false (twin runtime only)
    #[arg(long = "fabric-host-unfold")]
    pub(crate) fabric_host_unfold: bool,
    /// Block sizes to run instead of the matrix's, comma-separated (suffixes allowed: 4k, 1m); each with
    /// --batch-size and --threads
    #[arg(long, value_delimiter = ',', value_parser = |t: &str| bench::parse_buffer_size("--sizes", t))]
    pub(crate) sizes: Option<Vec<u64>>,
    /// Requests per batch for --sizes (default: 8 MiB worth, 1 to 32)
    #[arg(long = "batch-size", value_parser = bench::parse_batch_size, requires = "sizes")]
    pub(crate) batch_size: Option<usize>,
    /// Initiator threads for --sizes (default 1)
    #[arg(long, value_parser = bench::parse_threads, requires = "sizes")]
    pub(crate) threads: Option<usize>,
    /// Rounds per workload (each visits every path once)
    #[arg(long)]
    pub(crate) rounds: Option<usize>,
    /// Seconds each path runs each workload in each round
    #[arg(long = "cell-seconds", value_parser = bench::parse_duration)]
    pub(crate) cell_seconds: Option<Duration>,
    /// Transfer direction
    #[arg(long, value_enum, default_value = "read")]
    pub(crate) operation: Operation,
    /// How Host sections that never sleep are timed for the Host CPU figures: monotonic (wall time, an upper bound
    /// of their CPU time) or thread (the thread CPU clock, a system call per reading)
    #[arg(long = "section-clock", default_value = "monotonic", value_parser = parse_section_clock)]
    pub(crate) section_clock: SectionClock,
    /// Leave out the error-recovery rounds (a fault injected per path: an out-of-bounds request, a stalled engine, a
    /// killed peer process)
    #[arg(long = "no-faults")]
    pub(crate) no_faults: bool,
    /// Leave out allocation success (a device and a Host heap requested in chunks, registered, then freed)
    #[arg(long = "no-alloc")]
    pub(crate) no_alloc: bool,
    /// Bytes of the heap allocation success requests per memory kind (suffixes allowed; default: aiv.hbm_size)
    #[arg(long = "alloc-request", value_parser = aiv_transport::config::parse_size, conflicts_with = "no_alloc")]
    pub(crate) alloc_request: Option<u64>,
    /// After each workload's measured rounds, one traced cell per path: per-stage traces (Host, AIV blocks, SDMA
    /// engines) written as trace-<workload>-<path>.json, Chrome trace files for Perfetto (docs/trace.md)
    #[arg(long)]
    pub(crate) trace: bool,
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
    pub(crate) cross_host: bool,
    /// The operations the cross-host section measures, in order (comma-separated)
    #[arg(long = "cross-operations", value_enum, value_delimiter = ',', requires = "cross_host", num_args = 1..)]
    pub(crate) cross_operations: Vec<Operation>,
    /// Directory for report.json and report.md (default: aiv-audit-<UTC time> here)
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Compare two report.json files instead of running: what differs, and per workload and path the medians with
    /// their ratio B/A
    #[arg(long, num_args = 2, value_names = ["A", "B"], conflicts_with_all = ["quick", "full", "paths", "sizes", "rounds", "cell_seconds", "out"])]
    pub(crate) compare: Option<Vec<PathBuf>>,
    /// Inspect wheels, ELF files and source trees instead of running: per component the evidence for and against
    /// each check of AIV direct-drive, and a verdict (docs/inspect.md)
    #[arg(long, num_args = 1.., value_name = "PATH", conflicts_with_all = ["quick", "full", "paths", "sizes", "batch_size", "threads", "rounds", "cell_seconds", "operation", "out", "compare"])]
    pub(crate) inspect: Option<Vec<PathBuf>>,
    /// With --inspect: print the report as JSON (schema aiv-inspect/2) instead of text
    #[arg(long, requires = "inspect")]
    pub(crate) json: bool,
    /// Run again the audit a report.json records: its command line, its mooncake.json text and the configuration
    /// variables it read (not this process's); writes a new report (into --out, default aiv-audit-<UTC time>) that
    /// names the one it repeats
    #[arg(long, value_name = "REPORT", conflicts_with_all = ["quick", "full", "paths", "sizes", "batch_size", "threads", "rounds", "cell_seconds", "no_faults", "no_alloc", "alloc_request", "trace", "compare", "inspect"])]
    pub(crate) rerun: Option<PathBuf>,
    /// Render the results pages instead of running: every DIR/<PAGE>.template.md, its tables from the reports
    /// DIR/<name>.json, written as <PAGE>.md beside DIR (docs/audit.md, "The results pages")
    #[arg(long = "results-pages", value_name = "DIR", conflicts_with_all = ["quick", "full", "paths", "sizes", "batch_size", "threads", "rounds", "cell_seconds", "out", "compare", "inspect", "rerun"])]
    pub(crate) results_pages: Option<PathBuf>,
}

/// transfer_engine_bench's default `--duration` (for an initiator).
pub(crate) const DEFAULT_DURATION: Duration = Duration::from_secs(10);

/// transfer_engine_bench's default `--local_server_name`.
pub(crate) const DEFAULT_SERVER_NAME: &str = "127.0.0.1:12345";

fn parse_section_clock(text: &str) -> Result<SectionClock, String> {
    text.parse()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gflags::gflags_argv;
    use aiv_transport::bench::BenchParams;
    use aiv_transport::{EngineConfig, Protocol};
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

    proptest! {
        // Failure seeds are kept beside this file (host/bin/aiv/args.proptest-regressions), not in a top-level folder.
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
