//! One Mooncake path's session for the whole audit: its two driver processes (target and initiator, started once,
//! stopped at the end or at the first failure that ends them), one cell per workload and round with the same
//! requests as the engine paths (`bench::run_initiator`'s layout, or [`super::super::kv`]'s lists, sent as offsets),
//! the cells' figures and the twin's counts summed over them, the data check, and the record and verdict tally the
//! session ends with. Its error-recovery rounds are in [`super::faults`].

use std::time::Duration;

use serde_json::{json, Value};

use super::counts::{evidence_spec, snapshot_of, tally_from_counts, TwinCounts};
use super::driver::Driver;
use super::{MooncakeSetup, Variant};
use crate::audit::kv;
use crate::audit::options::AuditOptions;
use crate::audit::report::{self, DataCheck, FailedCell, MooncakeRecord, RoundResult, Shape, Workload};
use crate::evidence::EvidenceTally;
use crate::transfer::{Opcode, Protocol, SegmentId};

/// What one cell measured.
pub(crate) struct Cell {
    pub result: RoundResult,
    pub latencies: Vec<u64>,
    pub first_failure: Option<String>,
}

/// The two processes and what they saw, for the whole audit.
pub(crate) struct Session {
    pub(super) variant: Variant,
    pub(super) target: Option<Driver>,
    pub(super) initiator: Option<Driver>,
    pub(super) peer: String,
    pub(super) remote: u64,
    pub(super) size: u64,
    pub(super) margin: Duration,
    /// The first failure that ended the processes: every later cell fails with it at once.
    pub(super) failure: Option<String>,
    /// The first failure any cell saw (a failed batch's reason, or the cell's own failure), for the verdict.
    first_failure: Option<String>,
    counts: Option<TwinCounts>,
    counts_observable: bool,
    transfers: u64,
    pub record: MooncakeRecord,
    /// Time each side took to register its buffer with its engine.
    pub registration: Option<report::Registration>,
}

impl Session {
    /// Starts both processes with buffers of `size` bytes; a failure is kept, and every cell then fails with it.
    pub fn start(setup: &MooncakeSetup, size: u64) -> Session {
        let mut session = Session {
            variant: setup.variant,
            target: None,
            initiator: None,
            peer: String::new(),
            remote: 0,
            size,
            margin: setup.reply_margin,
            failure: None,
            first_failure: None,
            counts: None,
            counts_observable: true,
            transfers: 0,
            record: MooncakeRecord {
                caveats: super::caveats(setup.variant),
                global_resource_config: setup.global_resource_config.clone(),
                ..MooncakeRecord::default()
            },
            registration: None,
        };
        if let Err(reason) = session.open(setup) {
            session.fail(reason);
        }
        session
    }

    fn open(&mut self, setup: &MooncakeSetup) -> std::result::Result<(), String> {
        let start = self.margin.max(Duration::from_secs(10)) + bulk_time(self.size);
        let mut target = Driver::spawn(setup, "target")?;
        let evidence = evidence_spec();
        let init = |fill: u8| json!({"cmd": "init", "size": self.size, "fill": fill, "evidence": evidence});
        let answer = target.call(init(0x5A), start);
        self.target = Some(target);
        let target_init = answer?;
        let mut initiator = Driver::spawn(setup, "initiator")?;
        let answer = initiator.call(init(0xA5), start);
        self.initiator = Some(initiator);
        let initiator_init = answer?;
        self.peer = target_init.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
        self.remote = target_init.get("addr").and_then(Value::as_u64).unwrap_or(0);
        if self.peer.is_empty() || self.remote == 0 {
            return Err(format!(
                "{} target: its init answer has no name or address: {target_init}",
                self.variant.path()
            ));
        }
        // The wheel connects on the first transfer (auto-connect): before the first cell, as the engine paths open
        // their segment before theirs.
        let peer = json!({"cmd": "connect", "peer": self.peer, "remote": self.remote});
        self.initiator.as_mut().map_or(Ok(json!({})), |initiator| initiator.call(peer, self.margin))?;
        self.record.engine = self.initiator.as_ref().and_then(Driver::selected_engine);
        let text = |key: &str| initiator_init.get(key).and_then(Value::as_str).map(str::to_owned);
        self.record.wheel = text("wheel");
        self.record.python = text("python");
        self.record.runtime = text("runtime");
        let seconds = |v: &Value| v.get("register_s").and_then(Value::as_f64).unwrap_or(0.0);
        let took = Duration::from_secs_f64((seconds(&target_init) + seconds(&initiator_init)).max(0.0));
        self.registration =
            Some(report::Registration::new(&format!("{} device", self.variant.path()), 2 * self.size, took));
        Ok(())
    }

    pub(super) fn fail(&mut self, reason: String) {
        if self.failure.is_none() {
            self.failure = Some(reason);
        }
        for driver in [self.target.take(), self.initiator.take()].into_iter().flatten() {
            driver.stop();
        }
    }

    pub(super) fn drivers(&mut self) -> std::result::Result<(&mut Driver, &mut Driver), String> {
        if let Some(failure) = &self.failure {
            return Err(format!("not run: the Mooncake processes ended earlier ({failure})"));
        }
        match (self.target.as_mut(), self.initiator.as_mut()) {
            (Some(t), Some(i)) => Ok((t, i)),
            _ => Err(format!("{}: the processes are not running", self.variant.path())),
        }
    }

    /// Which Mooncake path these two processes run.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Why `workload` does not run on this path, if it does not.
    pub fn unsupported(workload: &Workload) -> Option<String> {
        if workload.threads > 64 {
            return Some("more than 64 initiator threads".into());
        }
        None
    }

    /// One cell: `workload` for `options.cell`, the same requests the engine paths move. A failure of the cell
    /// (an error, not failed batches) is returned as its reason; a dead or hung process also ends the session.
    pub fn cell(
        &mut self,
        options: &AuditOptions,
        workload: &Workload,
        round: usize,
        slot: usize,
    ) -> std::result::Result<Cell, String> {
        let seconds = options.cell.as_secs_f64();
        let request = match &workload.shape {
            Some(Shape::KvLayerwise { cache, compute_us }) => {
                let requests: Vec<Vec<Value>> = kv::layerwise(cache, offsets_only())
                    .into_iter()
                    .map(|layers| layers.iter().map(|batch| batch_json(batch)).collect())
                    .collect();
                json!({"cmd": "layerwise", "peer": self.peer, "remote": self.remote, "requests": requests,
                       "compute_us": compute_us, "seconds": seconds})
            }
            shape => {
                let lists: Vec<Vec<Value>> = match shape {
                    None => bench_lists(options.operation, workload),
                    Some(shape) => {
                        vec![kv::batches(shape, options.operation, offsets_only())
                            .iter()
                            .map(|b| batch_json(b))
                            .collect()]
                    }
                };
                json!({"cmd": "run", "peer": self.peer, "remote": self.remote, "lists": lists, "seconds": seconds})
            }
        };
        let within = options.cell + self.margin;
        let margin = self.margin;
        let (target, initiator) = self.drivers()?;
        let outcome = (|| {
            let before = target.call(json!({"cmd": "snapshot"}), margin)?;
            let run = initiator.call(request, within)?;
            let after = target.call(json!({"cmd": "snapshot"}), margin)?;
            Ok::<_, String>((before, run, after))
        })();
        let (target_before, run, target_after) = match outcome {
            Ok(answers) => answers,
            Err(reason) => {
                self.fail(reason.clone());
                return Err(reason);
            }
        };
        let (t0, t1) = (snapshot_of(Some(&target_before)), snapshot_of(Some(&target_after)));
        let (i0, i1) = (snapshot_of(run.get("before")), snapshot_of(run.get("after")));
        let number = |key: &str| run.get(key).and_then(Value::as_u64).unwrap_or(0);
        let (wall_ns, batches, failed, transfers, bytes) =
            (number("wall_ns"), number("batches"), number("failed_batches"), number("transfers"), number("bytes"));
        let latencies: Vec<u64> = run
            .get("latencies_ns")
            .and_then(Value::as_array)
            .map(|values| values.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let host_cpu = i1.host_cpu_ns.saturating_sub(i0.host_cpu_ns) + t1.host_cpu_ns.saturating_sub(t0.host_cpu_ns);
        let model_cpu = i1.device_model_cpu_ns.saturating_sub(i0.device_model_cpu_ns)
            + t1.device_model_cpu_ns.saturating_sub(t0.device_model_cpu_ns);
        match (&i0.evidence, &i1.evidence, &t0.evidence, &t1.evidence) {
            (Some(a0), Some(a1), Some(b0), Some(b1)) => {
                let mut cell = TwinCounts::delta(a1, a0);
                cell.add(&TwinCounts::delta(b1, b0));
                self.counts.get_or_insert_with(TwinCounts::default).add(&cell);
            }
            _ => self.counts_observable = false,
        }
        self.transfers += transfers;
        let per_transfer = |ns: u64| (transfers > 0).then(|| ns as f64 / transfers as f64);
        let mut histogram = crate::bench::latency_histogram();
        for &ns in &latencies {
            let _ = histogram.record(ns.max(1));
        }
        let quantile = |q: f64| if histogram.is_empty() { 0 } else { histogram.value_at_quantile(q) };
        let result = RoundResult {
            round,
            slot,
            bytes_per_second: if wall_ns > 0 { bytes as f64 / (wall_ns as f64 / 1e9) } else { 0.0 },
            latency_p50_ns: quantile(0.5),
            latency_p99_ns: quantile(0.99),
            latency_p999_ns: quantile(0.999),
            batches,
            failed_batches: failed,
            transfers,
            process_cpu_ns_per_transfer: per_transfer(host_cpu),
            // The initiator process alone (the transfer engine's caller), for the "(path)" column.
            path_cpu_ns_per_transfer: per_transfer(i1.host_cpu_ns.saturating_sub(i0.host_cpu_ns)).unwrap_or(0.0),
            occupancy: report::CellOccupancy {
                wall_ns,
                device_model_cpu_ns: Some(model_cpu),
                not_exposed: Some(
                    "the Mooncake processes run their own copies of the twin runtime: their cores, engines and \
                     streams are not read; device-model CPU is their cann-twin threads' run time"
                        .into(),
                ),
                ..Default::default()
            },
        };
        let first_failure = run.get("first_failure").and_then(Value::as_str).map(str::to_owned);
        Ok(Cell { result, latencies, first_failure })
    }

    /// Runs one cell and files its figures (into `rounds` and `latencies`) or its failure (into the record).
    pub fn run_cell(
        &mut self,
        options: &AuditOptions,
        workload: &Workload,
        (round, slot): (usize, usize),
        rounds: &mut Vec<RoundResult>,
        latencies: &mut hdrhistogram::Histogram<u64>,
    ) {
        match self.cell(options, workload, round, slot) {
            Ok(cell) => {
                if cell.result.failed_batches > 0 && self.first_failure.is_none() {
                    self.first_failure = cell.first_failure.clone();
                }
                for &ns in &cell.latencies {
                    let _ = latencies.record(ns.max(1));
                }
                rounds.push(cell.result);
            }
            Err(reason) => {
                self.first_failure.get_or_insert_with(|| reason.clone());
                self.record.failed_cells.push(FailedCell { workload: workload.name(), round, reason });
            }
        }
    }

    /// The data check: a pattern written from the initiator into the target's memory, then another written into
    /// the target's and read back; each time both buffers' sha256 (read through aclrtMemcpy) must agree.
    pub fn verify(&mut self) {
        let bulk = self.margin + bulk_time(self.size);
        let (peer, remote, size) = (self.peer.clone(), self.remote, self.size);
        let check = match self.drivers() {
            Err(reason) => DataCheck { passed: false, detail: reason },
            Ok((target, initiator)) => {
                let outcome = (|| {
                    let digest = |d: &mut Driver| -> std::result::Result<String, String> {
                        let answer = d.call(json!({"cmd": "digest"}), bulk)?;
                        Ok(answer.get("sha256").and_then(Value::as_str).unwrap_or_default().to_owned())
                    };
                    // Each pattern's digest is taken where it was written, before it moves.
                    initiator.call(json!({"cmd": "fill", "seed": 11}), bulk)?;
                    let written = digest(initiator)?;
                    initiator.call(json!({"cmd": "copy_all", "peer": peer, "remote": remote, "op": "write"}), bulk)?;
                    let landed = digest(target)?;
                    target.call(json!({"cmd": "fill", "seed": 12}), bulk)?;
                    let source = digest(target)?;
                    initiator.call(json!({"cmd": "copy_all", "peer": peer, "remote": remote, "op": "read"}), bulk)?;
                    let read = digest(initiator)?;
                    Ok::<_, String>((written, landed, source, read))
                })();
                match outcome {
                    Ok((written, landed, source, read)) => {
                        let size = report::size_name(size);
                        let write_ok = !written.is_empty() && written == landed;
                        let read_ok = !source.is_empty() && source == read && source != written;
                        DataCheck {
                            passed: write_ok && read_ok,
                            detail: format!(
                                "{size} written from the initiator's device memory into the target's: {} (sha256 \
                                 {} there, {} here); {size} of another pattern read back: {} (sha256 {} there, {} \
                                 here)",
                                if write_ok { "same" } else { "DIFFERENT" },
                                short(&landed),
                                short(&written),
                                if read_ok { "same" } else { "DIFFERENT" },
                                short(&source),
                                short(&read)
                            ),
                        }
                    }
                    Err(reason) => {
                        self.fail(reason.clone());
                        DataCheck { passed: false, detail: reason }
                    }
                }
            }
        };
        self.record.data_check = Some(check);
    }

    /// Stops both processes and returns the record and the path's verdict tally.
    pub fn finish(mut self) -> (MooncakeRecord, EvidenceTally, Option<String>) {
        for driver in [self.target.take(), self.initiator.take()].into_iter().flatten() {
            driver.stop();
        }
        // Observed only if every snapshot of every cell had the counts, and some cell ran.
        let counts = if self.counts_observable { self.counts.clone() } else { None };
        let observed = counts.as_ref();
        let runtime = self.record.runtime.clone().filter(|_| observed.is_some());
        let tally = tally_from_counts(observed, self.transfers, runtime.as_deref());
        self.record.evidence = observed.map(TwinCounts::as_map);
        let failure = self.first_failure.clone().or_else(|| self.failure.clone());
        (std::mem::take(&mut self.record), tally, failure)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for driver in [self.target.take(), self.initiator.take()].into_iter().flatten() {
            driver.stop();
        }
    }
}

fn short(digest: &str) -> String {
    if digest.is_empty() {
        "-".into()
    } else {
        digest.chars().take(12).collect()
    }
}

/// Extra time a whole-buffer command may take: 1 s per 4 MiB.
pub(super) fn bulk_time(size: u64) -> Duration {
    Duration::from_secs(size.div_ceil(4 << 20).max(1))
}

/// A request target whose bases are 0: the lists then hold offsets, which the driver adds to its buffers.
fn offsets_only() -> kv::Target {
    kv::Target { protocol: Protocol::Aiv, segment: SegmentId::LOCAL, local_base: 0, remote_base: 0 }
}

fn batch_json(batch: &[crate::transfer::TransferRequest]) -> Value {
    Value::Array(batch.iter().map(|r| json!([r.opcode.as_str(), r.source, r.target_offset, r.length])).collect())
}

/// `bench::run_initiator`'s requests: thread `t`'s request `i` at offset `block x (i x threads + t)` on both sides,
/// one batch per thread.
pub(super) fn bench_lists(operation: Opcode, workload: &Workload) -> Vec<Vec<Value>> {
    (0..workload.threads)
        .map(|thread| {
            let batch: Vec<Value> = (0..workload.batch_size)
                .map(|i| {
                    let offset = workload.block_size * (i * workload.threads + thread) as u64;
                    json!([operation.as_str(), offset, offset, workload.block_size])
                })
                .collect();
            vec![Value::Array(batch)]
        })
        .collect()
}
