//! A path's verdict over the whole audit: who submitted its work and the four checks, from the tally of the evidence
//! its transfers (or its runtime) recorded.

use serde::{Deserialize, Serialize};

use crate::evidence::{Check, EvidenceTally, Submitter, SubmitterCounts};
use crate::transfer::Protocol;

/// A path's verdict over the whole audit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PathVerdict {
    pub path: String,
    /// Who submitted the path's work: `AIV-direct`, `AI-CPU-submitted`, `Host-submitted`, `mixed` or `unknown`
    /// ([`Submitter`]), derived from the summed acts.
    pub submitted_by: Submitter,
    /// How many transfers' own verdicts came out as each word.
    pub per_transfer_submitted_by: SubmitterCounts,
    /// Host kernel launches per transfer (AIV or AI-CPU kernels the Host launched for the path's transfers).
    pub host_launches_per_transfer: f64,
    /// `yes`, `no` or `unknown`, and the four checks.
    pub aiv_direct: String,
    pub kernel_on_aiv: String,
    pub kernel_writes_descriptors: String,
    pub kernel_rings_doorbell: String,
    pub device_observes_completion: String,
    /// The runtime the records came from ("twin runtime, cann-twin 0.1.0"), if any recorded it.
    pub runtime: Option<String>,
    pub transfers: u64,
    /// The verdict and each check with its counts and source, as `aiv bench` prints them.
    pub lines: Vec<String>,
    /// The run's independent device-side observer where the path's device-side acts are self-reported (aiv on the
    /// vendor's runtime: CANN's profiler over the path's cells), else `None`.
    #[serde(default)]
    pub observer: Option<crate::evidence::DeviceObserver>,
    /// The first failure a batch of this path reported, if any.
    pub first_failure: Option<String>,
}

impl PathVerdict {
    pub(crate) fn new(path: Protocol, tally: &EvidenceTally, first_failure: Option<String>) -> PathVerdict {
        PathVerdict::from_tally(path.as_str(), tally, first_failure)
    }

    /// The verdict of `path` (one of this engine's protocols, or a path it does not carry itself, such as
    /// mooncake-ascend) from a tally of the acts its transfers or its runtime counted.
    pub fn from_tally(path: &str, tally: &EvidenceTally, first_failure: Option<String>) -> PathVerdict {
        let checks = tally.checks();
        let s = |check: Check| check.as_str().to_owned();
        PathVerdict {
            path: path.into(),
            submitted_by: tally.submitter(),
            per_transfer_submitted_by: tally.per_transfer_submitters,
            host_launches_per_transfer: tally.host_launches_per_transfer(),
            aiv_direct: s(checks.aiv_direct()),
            kernel_on_aiv: s(checks.kernel_on_aiv),
            kernel_writes_descriptors: s(checks.kernel_writes_descriptors),
            kernel_rings_doorbell: s(checks.kernel_rings_doorbell),
            device_observes_completion: s(checks.device_observes_completion),
            runtime: tally.runtime.map(|runtime| runtime.to_string()),
            transfers: tally.transfers,
            lines: tally.verdict_lines(),
            observer: tally.observer.clone(),
            first_failure,
        }
    }
}
