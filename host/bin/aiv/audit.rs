//! `aiv audit`: the flags turned into the audit's options (paths, Mooncake variants, workloads, cross-host), its
//! run and report, `--inspect`, `--compare` and `--rerun` of a recorded report, `--results-pages`.

use std::path::PathBuf;

use aiv_transport::EngineConfig;
use clap::Parser;

use crate::args::{opcode, AuditArgs, Cli, Command, DEFAULT_SERVER_NAME};
use crate::gflags::gflags_argv;

pub(crate) fn run_audit(config_path: Option<PathBuf>, args: AuditArgs) -> Result<(), String> {
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
    if let Some(dir) = args.results_pages {
        for page in audit::pages::write(&dir)? {
            println!("wrote {}", page.display());
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
    if args.rerun.is_some() || args.compare.is_some() || args.inspect.is_some() || args.results_pages.is_some() {
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
