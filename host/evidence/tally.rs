//! The evidence of a run: its records' acts summed (a shared window counted once), each transfer's checks and
//! verdicts counted, and the run's checks, verdict and printed lines derived from the sums.

use serde::Serialize;

use super::act::{Act, RuntimeLabel, Source};
use super::checks::{Check, Checks};
use super::observer::DeviceObserver;
use super::submitter::{Submitter, SubmitterCounts};
use super::TransferEvidence;

/// One act summed over many records: each record's counts weighted by 1 / its `window`, so that a window the
/// records of k transfers share is counted once.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ActTotals {
    /// Every source the records named, in the order first seen (one, unless a run mixed runtimes or settings).
    pub sources: Vec<Source>,
    /// Times an AIV core did the act.
    pub by_aiv: f64,
    /// The lowest and highest block seen doing it.
    pub aiv_blocks: Option<[u32; 2]>,
    /// Times an AI-CPU task did it.
    pub by_aicpu: f64,
    /// Times the Host did it.
    pub by_host: f64,
    /// Times it was done by nobody attributable.
    pub unattributed: f64,
}

impl ActTotals {
    fn add(&mut self, act: &Act, window: u32) {
        if !self.sources.contains(&act.source) {
            self.sources.push(act.source);
        }
        let share = 1.0 / f64::from(window.max(1));
        self.by_aiv += act.by_aiv as f64 * share;
        self.by_aicpu += act.by_aicpu as f64 * share;
        self.by_host += act.by_host as f64 * share;
        self.unattributed += act.unattributed as f64 * share;
        self.aiv_blocks = span(self.aiv_blocks, act.aiv_blocks);
    }

    fn merge(&mut self, other: &ActTotals) {
        for source in &other.sources {
            if !self.sources.contains(source) {
                self.sources.push(*source);
            }
        }
        self.by_aiv += other.by_aiv;
        self.by_aicpu += other.by_aicpu;
        self.by_host += other.by_host;
        self.unattributed += other.unattributed;
        self.aiv_blocks = span(self.aiv_blocks, other.aiv_blocks);
    }

    /// The totals as one act (counts rounded; the source is the one every record named, else
    /// [`Source::NotRecorded`] if any record lacked the act, else the first).
    pub fn as_act(&self) -> Act {
        let source = match self.sources.as_slice() {
            [] => Source::NotRecorded,
            [one] => *one,
            // The weakest: a source without counts, else a self-report, else the first.
            many => many
                .iter()
                .copied()
                .find(|source| !source.has_counts())
                .or_else(|| many.iter().copied().find(|source| !source.is_observed()))
                .unwrap_or(many[0]),
        };
        let round = |count: f64| count.round() as u64;
        Act {
            source,
            by_aiv: round(self.by_aiv),
            aiv_blocks: self.aiv_blocks.filter(|_| round(self.by_aiv) > 0),
            by_aicpu: round(self.by_aicpu),
            by_host: round(self.by_host),
            unattributed: round(self.unattributed),
        }
    }
}

fn span(a: Option<[u32; 2]>, b: Option<[u32; 2]>) -> Option<[u32; 2]> {
    match (a, b) {
        (Some([a0, a1]), Some([b0, b1])) => Some([a0.min(b0), a1.max(b1)]),
        (a, b) => a.or(b),
    }
}

/// How many transfers' own checks came out yes, no and unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CheckCounts {
    /// Transfers whose check came out yes.
    pub yes: u64,
    /// ... no.
    pub no: u64,
    /// ... unknown.
    pub unknown: u64,
}

impl CheckCounts {
    fn add(&mut self, check: Check) {
        match check {
            Check::Yes => self.yes += 1,
            Check::No => self.no += 1,
            Check::Unknown => self.unknown += 1,
        }
    }
}

/// The evidence of many transfers (a run of one path): the acts summed, each transfer's checks counted, and the
/// run's verdict derived from the sums by the same rules as one transfer's.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EvidenceTally {
    /// Records added.
    pub transfers: u64,
    /// The runtime of the first record (a run is on one runtime).
    pub runtime: Option<RuntimeLabel>,
    /// Descriptors written, summed.
    pub descriptors_written: ActTotals,
    /// Doorbells rung, summed.
    pub doorbells_rung: ActTotals,
    /// Completions first seen, summed.
    pub completion_seen: ActTotals,
    /// Per check (kernel on AIV, descriptors, doorbell, completion, all four), how the transfers' own came out.
    pub per_transfer: [CheckCounts; 5],
    /// How many transfers' own "submitted by" verdict came out as each word.
    pub per_transfer_submitters: SubmitterCounts,
    /// Host kernel launches, summed (each record holds its own share).
    pub host_launches: f64,
    /// The run's independent device-side observer, where the records' device-side acts are
    /// [self-reported](Source::SelfReported) (set by the caller that ran it: `aiv bench`, the audit); `None`: none
    /// was asked for. The run's checks and verdict use it; each transfer's own do not (it sees a window, not a
    /// transfer).
    pub observer: Option<DeviceObserver>,
}

impl EvidenceTally {
    /// Adds one transfer's record.
    pub fn add(&mut self, evidence: &TransferEvidence) {
        self.transfers += 1;
        self.runtime.get_or_insert(evidence.runtime);
        self.descriptors_written.add(&evidence.descriptors_written, evidence.window);
        self.doorbells_rung.add(&evidence.doorbells_rung, evidence.window);
        self.completion_seen.add(&evidence.completion_seen, evidence.window);
        self.host_launches += evidence.host_launches;
        *self.per_transfer_submitters.slot(evidence.submitter()) += 1;
        let checks = evidence.checks();
        for (counts, check) in
            self.per_transfer.iter_mut().zip(checks.as_array().into_iter().chain([checks.aiv_direct()]))
        {
            counts.add(check);
        }
    }

    /// Adds another tally (another thread's share of the run).
    pub fn merge(&mut self, other: &EvidenceTally) {
        self.transfers += other.transfers;
        if self.runtime.is_none() {
            self.runtime = other.runtime;
        }
        if self.observer.is_none() {
            self.observer.clone_from(&other.observer);
        }
        self.descriptors_written.merge(&other.descriptors_written);
        self.doorbells_rung.merge(&other.doorbells_rung);
        self.completion_seen.merge(&other.completion_seen);
        self.host_launches += other.host_launches;
        for submitter in Submitter::ALL {
            *self.per_transfer_submitters.slot(submitter) += other.per_transfer_submitters.get(submitter);
        }
        for (mine, theirs) in self.per_transfer.iter_mut().zip(other.per_transfer) {
            mine.yes += theirs.yes;
            mine.no += theirs.no;
            mine.unknown += theirs.unknown;
        }
    }

    /// The run's checks, derived from the summed acts and the run's observer.
    pub fn checks(&self) -> Checks {
        Checks::observed(
            &self.descriptors_written.as_act(),
            &self.doorbells_rung.as_act(),
            &self.completion_seen.as_act(),
            self.observer.as_ref(),
        )
    }

    /// The run's "submitted by" verdict, derived from the summed acts and the run's observer by the rules of one
    /// transfer's.
    pub fn submitter(&self) -> Submitter {
        Submitter::observed(
            &self.descriptors_written.as_act(),
            &self.doorbells_rung.as_act(),
            &self.completion_seen.as_act(),
            self.observer.as_ref(),
        )
    }

    /// Whether some record's acts were [self-reported](Source::SelfReported).
    pub fn self_reported(&self) -> bool {
        [&self.descriptors_written, &self.doorbells_rung, &self.completion_seen]
            .iter()
            .any(|totals| totals.sources.contains(&Source::SelfReported))
    }

    /// `"device acts self-reported by the kernel; 0 Host submissions counted; profiler: ..."`: every source behind
    /// a run whose device-side acts are self-reported (`None` for other runs).
    pub fn sources_clause(&self) -> Option<String> {
        if !self.self_reported() {
            return None;
        }
        let round = |count: f64| count.round() as u64;
        let mut clause = format!(
            "device acts self-reported by the kernel; {} Host submissions counted",
            round(self.descriptors_written.by_host)
        );
        let reads = round(self.completion_seen.by_host);
        if reads > 0 {
            clause.push_str(&format!(", {reads} Host completion reads counted"));
        }
        let observer =
            self.observer.clone().unwrap_or(DeviceObserver::Unavailable { reason: "none ran for this run".into() });
        clause.push_str("; ");
        clause.push_str(&observer.describe());
        Some(clause)
    }

    /// Host kernel launches per transfer (0 with no transfers).
    pub fn host_launches_per_transfer(&self) -> f64 {
        if self.transfers == 0 {
            0.0
        } else {
            self.host_launches / self.transfers as f64
        }
    }

    /// The verdict for people: `submitted by: AIV-direct (twin runtime, cann-twin 0.1.0; ...)`, the AIV-direct
    /// verdict, then one line per check with its counts and how many transfers' own checks agreed.
    pub fn verdict_lines(&self) -> Vec<String> {
        let runtime = self.runtime.unwrap_or(RuntimeLabel::NONE);
        let checks = self.checks();
        let per = |i: usize| {
            let c = self.per_transfer[i];
            format!("transfers: {} yes, {} no, {} unknown", c.yes, c.no, c.unknown)
        };
        let launches = if self.host_launches > 0.0 {
            format!("; {:.3} Host kernel launches per transfer", self.host_launches_per_transfer())
        } else {
            String::new()
        };
        let sources = self.sources_clause().map(|clause| format!("; {clause}")).unwrap_or_default();
        let mut lines = vec![
            format!(
                "submitted by: {} ({runtime}{sources}; {} transfers: {}{launches})",
                self.submitter(),
                self.transfers,
                self.per_transfer_submitters.describe()
            ),
            format!("  AIV-direct: {} ({})", checks.aiv_direct().as_str(), per(4)),
        ];
        let acts = [
            (
                "kernel writes the descriptors",
                checks.kernel_writes_descriptors,
                &self.descriptors_written,
                "descriptors",
            ),
            ("kernel rings the doorbell", checks.kernel_rings_doorbell, &self.doorbells_rung, "doorbells"),
            (
                "completion observed on the Device",
                checks.device_observes_completion,
                &self.completion_seen,
                "completions",
            ),
        ];
        lines.push(format!("  kernel on the AIV cores: {} ({})", checks.kernel_on_aiv.as_str(), per(0)));
        for (i, (name, check, totals, noun)) in acts.into_iter().enumerate() {
            let act = totals.as_act();
            lines.push(format!(
                "  {name}: {}: {} ({}; {})",
                check.as_str(),
                act.describe(noun),
                act.source.describe(),
                per(i + 1)
            ));
        }
        lines
    }
}
