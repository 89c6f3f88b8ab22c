//! `aiv audit`: the comparative audit. Every path runs the same workloads in one process, on the same two engines,
//! the same device memory and the same request layout, in rounds interleaved across paths (each round visits every
//! path once, in an order rotated from round to round), next to a same-run memcpy reference; each figure is reported
//! as the median over the rounds with its spread, and each path's AIV-direct verdict comes from the evidence its
//! transfers recorded (docs/audit.md).
//!
//! Owns: the workload matrix, the interleaving, the statistics over rounds. One cell is measured by the bench's
//! loops ([`crate::bench::run_initiator`], the one `aiv bench` runs, or `run_request_lists` / `run_layerwise` for
//! the workloads from the use, all in one measuring frame); the report's shape is [`report`].

pub mod alloc;
mod child;
pub mod compare;
pub mod cross_host;
mod faults;
pub mod inspect;
pub mod kernel_bench;
pub mod kv;
pub mod mooncake;
mod options;
pub mod pages;
mod peer;
mod plot;
pub mod report;
pub mod terminal;
pub mod trace;
pub mod warnings;

use std::time::{Duration, Instant};

use crate::bench::{self, BenchOutcome, BenchParams, ReportUnit};
use crate::config::{DeviceBackendKind, EngineConfig};
use crate::error::{EngineError, Result};
use crate::evidence::EvidenceTally;
use crate::transfer::{Protocol, SegmentId};
use crate::TransferEngine;

pub use options::{full_workloads, quick_workloads, round_order, AuditOptions, DEFAULT_KV, MAX_SPAN};
pub use report::{AuditReport, CellStats, PathVerdict, RoundResult, Stats, Workload, WorkloadReport, AUDIT_SCHEMA};

pub use faults::FAULTS;

/// Where the audit reports progress: one call per finished cell.
pub trait Progress {
    /// A cell finished: `done` of `total`, what it was and its headline figure.
    fn cell(&self, done: usize, total: usize, what: &str);
}

/// No progress output.
#[derive(Debug)]
pub struct Silent;

impl Progress for Silent {
    fn cell(&self, _: usize, _: usize, _: &str) {}
}

/// One path's buffers: where its transfers read and write.
#[derive(Clone, Copy, Debug)]
struct Buffers {
    local: u64,
    remote: u64,
}

/// The two engines and their buffers, for every path of the audit.
struct Rig {
    initiator: TransferEngine,
    target: TransferEngine,
    segment: SegmentId,
    /// Device memory of the initiator's and the target's device (aiv, adxl, adxl-fabric, ubshmem), if a device path is audited.
    device: Option<(crate::device::DeviceBuffer, crate::device::DeviceBuffer, Buffers)>,
    /// Host memory of both engines (tcp: the Host cannot reach device memory over sockets).
    host: Option<(Vec<u8>, Vec<u8>, Buffers)>,
    /// Time to register the buffers, per memory kind.
    registration: Vec<report::Registration>,
}

impl Rig {
    fn new(config: &EngineConfig, options: &AuditOptions) -> Result<Rig> {
        let size = options.buffer_size();
        let device_paths = options.paths.iter().any(|p| p.is_device_path());
        let host_paths = options.paths.contains(&Protocol::Tcp);
        if device_paths && size > config.aiv.hbm_size {
            return Err(EngineError::InvalidArgument {
                operation: "audit",
                reason: format!(
                    "the workloads need {} of device memory per side, above aiv.hbm_size ({}): raise \"aiv\": \
                     {{\"hbm_size\": ...}} or drop the largest workloads",
                    report::size_name(size),
                    report::size_name(config.aiv.hbm_size)
                ),
            });
        }
        let initiator = TransferEngine::new(config.clone())?;
        let target = TransferEngine::new(bench::target_config(config))?;
        let mut registration = Vec::new();
        let device = if device_paths {
            let (a, b) = (initiator.device()?, target.device()?);
            let allocation = |error: crate::device::DeviceError| EngineError::InvalidArgument {
                operation: "audit: allocate device memory",
                reason: error.to_string(),
            };
            let local = a.allocate(size).map_err(allocation)?;
            let remote = b.allocate(size).map_err(allocation)?;
            // Written through the devices' copy path, so that first touches are not measured.
            bench::fill_device(&a, local.addr(), size as usize, |_| 0xA5).map_err(allocation)?;
            bench::fill_device(&b, remote.addr(), size as usize, |_| 0x5A).map_err(allocation)?;
            let started = Instant::now();
            // SAFETY: the buffers live in the rig next to the engines and outlive every batch (run_initiator waits
            // for each); the rig withdraws both registrations before they drop.
            unsafe {
                initiator.register_memory(local.addr(), local.len(), &a.location())?;
                target.register_memory(remote.addr(), remote.len(), &b.location())?;
            }
            registration.push(report::Registration::new("device", 2 * size, started.elapsed()));
            let buffers = Buffers { local: local.addr(), remote: remote.addr() };
            Some((local, remote, buffers))
        } else {
            None
        };
        let host = if host_paths {
            let (mut local, mut remote) = (host_buffer(size, 0xA5)?, host_buffer(size, 0x5A)?);
            let buffers = Buffers { local: local.as_mut_ptr() as u64, remote: remote.as_mut_ptr() as u64 };
            let started = Instant::now();
            // SAFETY: as above: the vectors live in the rig and are withdrawn before they drop.
            unsafe {
                initiator.register_memory(buffers.local, size, "cpu:0")?;
                target.register_memory(buffers.remote, size, "cpu:0")?;
            }
            registration.push(report::Registration::new("host", 2 * size, started.elapsed()));
            Some((local, remote, buffers))
        } else {
            None
        };
        let segment = initiator.open_segment(target.name())?;
        Ok(Rig { initiator, target, segment, device, host, registration })
    }

    fn buffers(&self, path: Protocol) -> Buffers {
        let side =
            if path.is_device_path() { self.device.as_ref().map(|d| d.2) } else { self.host.as_ref().map(|h| h.2) };
        side.expect("the rig registered buffers for every audited path")
    }

    fn withdraw(self) {
        for buffers in self.device.iter().map(|d| d.2).chain(self.host.iter().map(|h| h.2)) {
            let _ = self.initiator.unregister_memory(buffers.local);
            let _ = self.target.unregister_memory(buffers.remote);
        }
        // The initiator goes first, so that its peer probe never finds the target's device gone.
        let Rig { initiator, target, device, host, .. } = self;
        let device_buffers = device.map(|(local, remote, _)| (local, remote));
        drop(initiator);
        drop(device_buffers);
        drop(target);
        drop(host);
    }
}

fn host_buffer(size: u64, fill: u8) -> Result<Vec<u8>> {
    let size = usize::try_from(size)
        .map_err(|_| EngineError::InvalidArgument { operation: "audit", reason: "buffer size exceeds usize".into() })?;
    bench::filled_buffer(size, fill).map_err(|_| EngineError::InvalidArgument {
        operation: "audit",
        reason: format!("cannot allocate {} of Host memory", report::size_name(size as u64)),
    })
}

impl AuditReport {
    /// Writes the SVG plots, `report.json` and `report.md` into `dir` (created if missing); returns the paths of the
    /// last two. The plots come first, so that both files name them; a plot that cannot be drawn is left out, named
    /// on stderr.
    pub fn write(&mut self, dir: &std::path::Path) -> std::io::Result<[std::path::PathBuf; 2]> {
        std::fs::create_dir_all(dir)?;
        self.plots = plot::draw(self, dir);
        let json = dir.join("report.json");
        let mut text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        text.push('\n');
        std::fs::write(&json, text)?;
        let md = dir.join("report.md");
        std::fs::write(&md, self.markdown())?;
        // Written once: the documents are not part of the report itself (report.json names them in `traces`).
        for (file, document) in std::mem::take(&mut self.trace_documents) {
            std::fs::write(dir.join(file), serde_json::to_vec(&document).map_err(std::io::Error::other)?)?;
        }
        Ok([json, md])
    }
}

/// One cell's figures from its bench outcome.
fn round_result(round: usize, slot: usize, outcome: &BenchOutcome) -> RoundResult {
    let quantile = |q: f64| u64::try_from(outcome.latency_quantile(q).as_nanos()).unwrap_or(u64::MAX);
    let evidence = &outcome.evidence;
    RoundResult {
        round,
        slot,
        bytes_per_second: outcome.bytes_per_second(),
        latency_p50_ns: quantile(0.5),
        latency_p99_ns: quantile(0.99),
        latency_p999_ns: quantile(0.999),
        batches: outcome.completed_batches + outcome.failed_batches,
        failed_batches: outcome.failed_batches,
        transfers: evidence.transfers,
        process_cpu_ns_per_transfer: evidence.process_host_cpu_ns,
        path_cpu_ns_per_transfer: evidence.host_cpu_ns + evidence.waiting_cpu_ns,
        occupancy: cell_occupancy(&outcome.occupancy),
    }
}

/// The cell's occupancy summed over the devices the snapshot covered.
fn cell_occupancy(occupancy: &crate::occupancy::Occupancy) -> report::CellOccupancy {
    let device_model_cpu_ns = occupancy.device_model_cpu.as_ref().map(|roles| roles.iter().map(|r| r.cpu_ns).sum());
    let mut cell = report::CellOccupancy { wall_ns: occupancy.wall_ns, device_model_cpu_ns, ..Default::default() };
    match &occupancy.device {
        crate::occupancy::DeviceReport::TwinModel { devices } => {
            let cores = || devices.iter().flat_map(|d| d.cores.iter());
            cell.aiv_executing_ns = Some(cores().map(|c| c.executing_ns).sum());
            cell.aiv_polling_ns = Some(cores().map(|c| c.polling_ns).sum());
            cell.sdma_busy_ns = Some(devices.iter().flat_map(|d| d.channels.iter()).map(|c| c.busy_ns).sum());
            cell.runtime_copy_busy_ns =
                Some(devices.iter().map(|d| d.streams.copy_busy_ns + d.streams.sync_copy_busy_ns).sum());
            cell.aicpu_busy_ns = Some(devices.iter().map(|d| d.aicpu.executing_ns + d.aicpu.polling_ns).sum());
        }
        crate::occupancy::DeviceReport::NotExposed { reason } => cell.not_exposed = Some(reason.clone()),
    }
    cell
}

/// Runs the audit: sets up the rig, then per workload `rounds` rounds over the paths, interleaved.
pub fn run(config: &EngineConfig, options: &AuditOptions, progress: &dyn Progress) -> Result<AuditReport> {
    options.validate()?;
    let capture = warnings::AuditCapture::start();
    let started_utc = report::utc_now();
    let started = Instant::now();
    // The machine as the audit starts (its load average is the load the audit met, not the load it made).
    let mut environment = report::Environment::probe(config);
    // The aiv path on the vendor's runtime: CANN's profiler observes its cells (docs/evidence.md, "The profiler"),
    // started before the engines open and stopped after they closed; each aiv cell's window is counted.
    let observer_session = options
        .paths
        .iter()
        .find(|path| **path == Protocol::Aiv)
        .and_then(|&path| bench::start_observer(config, path, &[config.aiv.device_id, config.aiv.device_id + 1]));
    let mut aiv_windows = Vec::new();
    let rig = Rig::new(config, options)?;
    let total = options.workloads.len() * options.rounds * (options.paths.len() + 1)
        + if options.faults { 3 * options.paths.len() } else { 0 }
        + usize::from(options.allocation)
        + if options.trace { options.workloads.len() * options.paths.len() } else { 0 };
    let moon_setups = options.mooncake_setups();
    let total =
        total + moon_setups.len() * (options.workloads.len() * options.rounds + 1 + usize::from(options.faults));
    let total = total + options.cross_host.as_ref().map_or(0, |c| c.runs());
    let mut moons: Vec<mooncake::Session> =
        moon_setups.iter().map(|setup| mooncake::Session::start(setup, options.buffer_size())).collect();
    let mut traces = Vec::new();
    let mut done = 0;
    let mut workloads = Vec::new();
    let mut tallies: Vec<EvidenceTally> = vec![EvidenceTally::default(); options.paths.len()];
    let mut failures: Vec<Option<String>> = vec![None; options.paths.len()];
    let (reference_src, mut reference_dst) =
        (host_buffer(options.buffer_size(), 1)?, host_buffer(options.buffer_size(), 2)?);
    for workload in &options.workloads {
        let mut per_path: Vec<Vec<RoundResult>> = vec![Vec::new(); options.paths.len()];
        let mut latencies: Vec<hdrhistogram::Histogram<u64>> =
            (0..options.paths.len()).map(|_| bench::latency_histogram()).collect();
        let mut memcpy = Vec::new();
        let mut moon_rounds: Vec<Vec<RoundResult>> = vec![Vec::new(); moons.len()];
        let mut moon_latencies: Vec<hdrhistogram::Histogram<u64>> =
            moons.iter().map(|_| bench::latency_histogram()).collect();
        let moon_unsupported = mooncake::Session::unsupported(workload);
        if let Some(reason) = &moon_unsupported {
            for session in &mut moons {
                mooncake::skip_workload(&mut session.record, workload, reason.clone());
            }
        }
        for round in 0..options.rounds {
            // The memcpy reference takes the round's first slot on odd rounds and its last on even ones.
            let order = mooncake::round_order_with(&options.paths, moons.len(), round);
            let reference_first = round % 2 == 1;
            let mut slot = 0;
            let mut reference = |slot: usize, done: &mut usize| {
                let params = params_for(options, workload, Protocol::Tcp);
                let bytes_per_second =
                    bench::memcpy_reference(&reference_src, &mut reference_dst, &params, options.reference);
                memcpy.push(report::ReferenceRound { round, slot, bytes_per_second });
                *done += 1;
                progress.cell(*done, total, &format!("{} round {}: memcpy", workload.name(), round + 1));
            };
            if reference_first {
                reference(slot, &mut done);
                slot += 1;
            }
            for entry in order {
                let path = match entry {
                    mooncake::Slot::Engine(path) => path,
                    mooncake::Slot::Mooncake(at) => {
                        let session = &mut moons[at];
                        if moon_unsupported.is_none() {
                            let (rounds, latencies) = (&mut moon_rounds[at], &mut moon_latencies[at]);
                            session.run_cell(options, workload, (round, slot), rounds, latencies);
                        }
                        slot += 1;
                        done += 1;
                        let name = session.variant().path();
                        progress.cell(done, total, &format!("{} round {}: {name}", workload.name(), round + 1));
                        continue;
                    }
                };
                let index = options.paths.iter().position(|p| *p == path).expect("a listed path");
                let outcome = measure(&rig, options, workload, path)?;
                if outcome.failed_batches > 0 && failures[index].is_none() {
                    failures[index] = outcome.first_failure.clone();
                }
                tallies[index].merge(&outcome.evidence.tally);
                if path == Protocol::Aiv {
                    aiv_windows.push(outcome.window);
                }
                per_path[index].push(round_result(round, slot, &outcome));
                // Same bounds on both sides: adding cannot fail.
                let _ = latencies[index].add(&outcome.batch_latencies);
                slot += 1;
                done += 1;
                progress.cell(done, total, &format!("{} round {}: {}", workload.name(), round + 1, path.as_str()));
            }
            if !reference_first {
                reference(slot, &mut done);
            }
        }
        workloads.push(WorkloadReport::new(workload.clone(), &options.paths, per_path, &latencies, memcpy));
        if let (Some(report), true) = (workloads.last_mut(), moon_unsupported.is_none()) {
            for ((session, rounds), latencies) in moons.iter().zip(moon_rounds).zip(&moon_latencies) {
                report.paths.push(mooncake::cell_stats(report, session.variant(), rounds, latencies));
            }
        }
        if options.trace {
            let measured = workloads.last().expect("pushed above");
            for &path in &options.paths {
                traces.push(trace::traced_cell(&rig, options, workload, path, measured)?);
                done += 1;
                progress.cell(done, total, &format!("{} traced: {}", workload.name(), path.as_str()));
            }
        }
    }
    let mut fault_rounds = Vec::new();
    // Each round's capture, by its index in fault_rounds.
    let mut round_captures = Vec::new();
    if options.faults {
        for &path in &options.paths {
            let buffers = rig.buffers(path);
            let site = faults::Site {
                initiator: &rig.initiator,
                segment: rig.segment,
                local: buffers.local,
                remote: buffers.remote,
                size: options.buffer_size(),
            };
            for fault in FAULTS {
                let expects = match fault {
                    "out_of_bounds" => faults::OUT_OF_BOUNDS_WARNINGS,
                    "stalled_engine" => faults::STALLED_ENGINE_WARNINGS,
                    _ => peer::WARNINGS,
                };
                let capture = warnings::RoundCapture::start(expects);
                if options.inject_warning.as_deref() == Some(fault) {
                    tracing::warn!(
                        path = path.as_str(),
                        "AIV_AUDIT_INJECT_WARNING: a warning the {fault} round does not declare"
                    );
                }
                let round = match fault {
                    "out_of_bounds" => faults::out_of_bounds(path, &site)?,
                    "stalled_engine" => faults::stalled_engine(config, path, &site)?,
                    _ => peer::killed_peer(config, options.peer_program.as_deref(), path, &site)?,
                };
                round_captures.push((fault_rounds.len(), capture.id()));
                fault_rounds.push(round);
            }
            done += 3;
            progress.cell(done, total, &format!("error recovery: {}", path.as_str()));
        }
    }
    let mut registration = rig.registration.clone();
    rig.withdraw();
    if let (Some(session), Some(index)) =
        (observer_session, options.paths.iter().position(|path| *path == Protocol::Aiv))
    {
        tallies[index].observer = Some(crate::device::cann::profiler::observer(session, &aiv_windows));
    }
    let allocation = if options.allocation {
        let request = options.alloc_request.unwrap_or(config.aiv.hbm_size);
        let allocation = alloc::measure(config, &options.paths, request);
        done += 1;
        progress.cell(done, total, "allocation success");
        allocation
    } else {
        Vec::new()
    };
    let mut moon_records = std::collections::BTreeMap::new();
    let mut moon_verdicts = Vec::new();
    for mut session in moons {
        let path = session.variant().path();
        session.verify();
        done += 1;
        progress.cell(done, total, &format!("{path}: data check"));
        if options.faults {
            fault_rounds.extend(session.fault_rounds());
            done += 1;
            progress.cell(done, total, &format!("error recovery: {path}"));
        }
        registration.extend(session.registration.clone());
        let variant = session.variant();
        let (record, tally, first_failure) = session.finish();
        moon_verdicts.push(PathVerdict::from_tally(path, &tally, first_failure));
        moon_records.insert(variant, record);
    }
    // Between two network namespaces, after the in-process engines are gone (docs/multihost.md).
    let cross_host = options.cross_host.as_ref().map(|cross| {
        cross_host::run(cross, &mut |what: &str| {
            done += 1;
            progress.cell(done, total, what);
        })
    });
    let mut verdicts: Vec<PathVerdict> = options
        .paths
        .iter()
        .zip(tallies.iter())
        .zip(failures)
        .map(|((path, tally), first_failure)| PathVerdict::new(*path, tally, first_failure))
        .collect();
    verdicts.extend(moon_verdicts);
    let (trace_records, trace_documents): (Vec<_>, Vec<_>) =
        traces.into_iter().map(|(record, document)| (record.clone(), (record.file, document))).unzip();
    environment.runtime = verdicts_runtime(&verdicts);
    let mut captured = capture.finish();
    for (index, id) in round_captures {
        let round = captured.rounds.remove(&id).unwrap_or_default();
        (fault_rounds[index].expected_warnings, fault_rounds[index].unexpected_warnings) =
            (round.expected, round.unexpected);
    }
    Ok(AuditReport {
        schema: AUDIT_SCHEMA.into(),
        command: options.command.clone(),
        started_utc,
        elapsed_s: started.elapsed().as_secs_f64(),
        environment,
        config: report::ConfigRecord {
            file: options.config_file.clone(),
            effective: effective_config(config),
            env: options.config_env.clone(),
        },
        rerun_of: options.rerun_of.clone(),
        method: method(options),
        paths: options
            .paths
            .iter()
            .map(|p| p.as_str().to_owned())
            .chain(options.mooncake_setups().iter().map(|setup| setup.variant.path().to_owned()))
            .collect(),
        skipped: skipped_paths(config, options),
        registration,
        workloads,
        verdicts,
        plots: Vec::new(),
        faults: fault_rounds,
        allocation,
        mooncake: moon_records.remove(&mooncake::Variant::TwinHixl),
        mooncake_over_aiv: moon_records.remove(&mooncake::Variant::OverAiv),
        traces: trace_records,
        trace_documents,
        cross_host,
        warnings: captured.outside,
    })
}

/// The configuration as the engine holds it, for the report: where it was read from by file name only (a report
/// names no directory of the machine it ran on).
fn effective_config(config: &EngineConfig) -> String {
    let mut shown = config.clone();
    if let Some(name) = std::path::Path::new(&config.origin).file_name() {
        shown.origin = name.to_string_lossy().into_owned();
    }
    format!("{shown:#?}")
}

/// The method section of a report of `options`.
fn method(options: &AuditOptions) -> report::Method {
    let mut method = report::Method {
        rounds: options.rounds,
        cell_s: options.cell.as_secs_f64(),
        reference_s: options.reference.as_secs_f64(),
        operation: options.operation.as_str().into(),
        section_clock: crate::cpu_time::section_clock().name().into(),
        order: "each round runs every path once, in the first round's order rotated left by the round number; \
                    the memcpy reference runs last in even rounds and first in odd ones"
            .into(),
        layout: "one process; two engines (initiator on aiv.device_id, target on the next device) for every path; \
                     device paths move between the same two device buffers, tcp between two Host buffers of the same \
                     size (sockets cannot reach device memory); thread t's request i is at offset \
                     block x (i x threads + t) in both buffers, as in transfer_engine_bench"
            .into(),
    };
    for setup in options.mooncake_setups() {
        method.layout.push_str(&setup.variant.layout());
    }
    method
}

/// The runtime the first path with records names.
fn verdicts_runtime(verdicts: &[PathVerdict]) -> Option<String> {
    verdicts.iter().find_map(|v| v.runtime.clone())
}

/// One cell: `path` moving `workload` on the rig for `options.cell`, by the workload's own loop.
fn measure(rig: &Rig, options: &AuditOptions, workload: &Workload, path: Protocol) -> Result<BenchOutcome> {
    let buffers = rig.buffers(path);
    let target =
        kv::Target { protocol: path, segment: rig.segment, local_base: buffers.local, remote_base: buffers.remote };
    match &workload.shape {
        None => {
            let params = params_for(options, workload, path);
            bench::run_initiator(&rig.initiator, &params, rig.segment, buffers.local, buffers.remote)
        }
        Some(report::Shape::KvLayerwise { cache, compute_us }) => {
            let compute = Duration::from_micros(u64::from(*compute_us));
            bench::run_layerwise(&rig.initiator, options.cell, &[kv::layerwise(cache, target)], compute)
        }
        Some(shape) => {
            bench::run_request_lists(&rig.initiator, options.cell, &[kv::batches(shape, options.operation, target)])
        }
    }
}

/// The bench parameters of one cell.
fn params_for(options: &AuditOptions, workload: &Workload, path: Protocol) -> BenchParams {
    BenchParams {
        operation: options.operation,
        protocol: path,
        buffer_size: options.buffer_size(),
        batch_size: workload.batch_size,
        block_size: workload.block_size,
        duration: options.cell,
        threads: workload.threads,
        report_unit: "GB".parse::<ReportUnit>().expect("a known unit"),
        report_precision: 2,
    }
}

/// Paths the audit knows of and did not run, with the reason.
fn skipped_paths(config: &EngineConfig, options: &AuditOptions) -> Vec<report::Skipped> {
    let mut skipped = Vec::new();
    for variant in mooncake::Variant::ALL {
        if let Some(reason) = options.mooncake_skip_reason(variant) {
            skipped.push(report::Skipped { path: variant.path().into(), reason });
        }
    }
    if config.aiv.device_backend != DeviceBackendKind::Twin {
        skipped.push(report::Skipped {
            path: "occupancy".into(),
            reason: "device occupancy is only read from the twin runtime linked into this process".into(),
        });
    }
    skipped
}
