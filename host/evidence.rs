//! What every transfer records about how it was carried out.
//!
//! The comparative audit decides which paths are AIV-direct from these records (docs/hardware.md section 1: a kernel on
//! the AI Vector cores builds the descriptors, rings the doorbell and observes completion on the Device). No path
//! asserts that by name: each act is counted where it was observed, with the source of the counts beside them, and
//! the four checks are derived from the counts ([`TransferEvidence::checks`]). docs/evidence.md documents every field
//! of the serialised form.
//!
//! The files: `act` the runtime a record came from and the counted acts; `observer` a run's independent device-side
//! observer; `checks` the four AIV-direct checks; `submitter` the "submitted by" verdict; `tally` a run's records
//! summed; this one [`TransferEvidence`], the record itself.

mod act;
mod checks;
mod observer;
mod submitter;
mod tally;
#[cfg(test)]
mod tests;

pub use act::{Act, RuntimeKind, RuntimeLabel, Source};
pub use checks::{Check, Checks};
pub use observer::{DeviceObserver, ObservedTasks};
pub use submitter::{Submitter, SubmitterCounts};
pub use tally::{ActTotals, CheckCounts, EvidenceTally};

use serde::Serialize;

/// The record one transfer leaves behind, whichever transport carried it.
///
/// Non-exhaustive: fields may be added; code outside the crate builds one with [`TransferEvidence::new`] and sets
/// the fields it knows. Its serialised form (`serde`, as `aiv bench --json` writes it) is documented field by field
/// in docs/evidence.md.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct TransferEvidence {
    /// The transport that carried the transfer (`"local"`, `"aiv"`, `"tcp"`, ...).
    pub path: &'static str,
    /// The device runtime the record was observed on: every verdict drawn from it names this.
    pub runtime: RuntimeLabel,
    /// Who wrote the work descriptors (SQEs, WQEs, request headers) that were consumed.
    pub descriptors_written: Act,
    /// Who told the engine that executes them to start (doorbell register writes, stream submits, socket sends).
    pub doorbells_rung: Act,
    /// Who first read the completion (flag, CQE, DCQ entry, reply).
    pub completion_seen: Act,
    /// How many transfers share the three acts' counts (1: this transfer's alone). The transfers of one adxl HiXL
    /// batch share its acts; aiv's are each transfer's own.
    pub window: u32,
    /// Calls the Host made into the device runtime on this transfer's behalf, counted by the `-sys` loader tables
    /// (a call made for k transfers counts 1/k, rounded up per transfer).
    pub host_device_api_calls: u64,
    /// This transfer's share of the kernel launches (AIV or AI-CPU kernels) the Host made for it, counted where the
    /// launch call is made: a launch made for k transfers counts 1/k in each (a persistent kernel launched once
    /// before the run counts for none).
    pub host_launches: f64,
    /// Work descriptors written for this transfer, its completion descriptors included (on aiv: the kernel's tally).
    pub descriptors: u64,
    /// Doorbells rung for this transfer (a doorbell shared by k transfers counts 1/k, rounded up per transfer).
    pub doorbells: u64,
    /// Host CPU time spent on this transfer by the path's own threads and sections, in nanoseconds
    /// (docs/cpu-accounting.md).
    pub host_cpu_ns: u64,
    /// Host CPU time of the thread(s) that waited for this transfer (their polling, naps' wake-ups), its share of
    /// each wait, in nanoseconds: the path's too, so the path's whole attribution is `host_cpu_ns + waiting_cpu_ns`.
    /// Added when a wait for the batch ends; 0 for a transfer nobody waited for.
    pub waiting_cpu_ns: u64,
    /// The route the transfer took where its path has more than one (aiv: `"sdma"` on the same host, `"rdma"` to a
    /// peer on another host); `None` (and left out of JSON) for a path with one route.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<&'static str>,
}

impl TransferEvidence {
    /// A record of `path` on `runtime` with nothing observed yet: every act [`Source::NotRecorded`], every count 0,
    /// a window of 1.
    pub fn new(path: &'static str, runtime: RuntimeLabel) -> Self {
        TransferEvidence {
            path,
            runtime,
            descriptors_written: Act::unknown(Source::NotRecorded),
            doorbells_rung: Act::unknown(Source::NotRecorded),
            completion_seen: Act::unknown(Source::NotRecorded),
            window: 1,
            host_device_api_calls: 0,
            host_launches: 0.0,
            descriptors: 0,
            doorbells: 0,
            host_cpu_ns: 0,
            waiting_cpu_ns: 0,
            route: None,
        }
    }

    /// The four AIV-direct checks, derived from the three acts.
    pub fn checks(&self) -> Checks {
        Checks::of(&self.descriptors_written, &self.doorbells_rung, &self.completion_seen)
    }

    /// Whether all four AIV-direct checks hold.
    pub fn is_aiv_direct(&self) -> bool {
        self.checks().aiv_direct() == Check::Yes
    }

    /// Who submitted the transfer's work, derived from the three acts.
    pub fn submitter(&self) -> Submitter {
        Submitter::of(&self.descriptors_written, &self.doorbells_rung, &self.completion_seen)
    }
}
