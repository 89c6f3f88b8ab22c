//! Who submitted a transfer's work (or a run's): the "submitted by" verdict in its five words, and how many
//! transfers each verdict went to.

use serde::{Deserialize, Serialize};

use super::act::Act;
use super::checks::{Check, Checks};
use super::observer::DeviceObserver;

/// Who submitted a transfer's work (or a run's), derived from its acts: the "submitted by" verdict of `aiv bench`,
/// the audit's report and `aiv audit --inspect`, in these five words only (docs/evidence.md, "Who submitted").
///
/// The submission acts are writing the descriptors and ringing the doorbell; completion decides only between
/// `AIV-direct` and `mixed` (an AIV submission whose completion the Host observed is not AIV-direct).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Submitter {
    /// Every act by AIV cores: the four checks all yes.
    #[serde(rename = "AIV-direct")]
    AivDirect,
    /// Descriptors written and doorbells rung by AI-CPU tasks only (the Host launched them; how many launches a
    /// transfer cost is [`TransferEvidence::host_launches`]).
    #[serde(rename = "AI-CPU-submitted")]
    AiCpuSubmitted,
    /// Descriptors written and doorbells rung by the Host only (for a path that hands nothing to an engine, such as
    /// the in-process copy: completion seen by the Host only).
    #[serde(rename = "Host-submitted")]
    HostSubmitted,
    /// The submission acts were done by more than one kind of doer (or by one and by somebody one cannot name), or
    /// by AIV cores with completion seen by someone else.
    #[serde(rename = "mixed")]
    Mixed,
    /// A submission act was not observed, or nothing was done that names a doer.
    #[serde(rename = "unknown")]
    Unknown,
}

impl Submitter {
    /// Every value, in the order reports list them.
    pub const ALL: [Submitter; 5] = [
        Submitter::AivDirect,
        Submitter::AiCpuSubmitted,
        Submitter::HostSubmitted,
        Submitter::Mixed,
        Submitter::Unknown,
    ];

    /// `AIV-direct`, `AI-CPU-submitted`, `Host-submitted`, `mixed` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Submitter::AivDirect => "AIV-direct",
            Submitter::AiCpuSubmitted => "AI-CPU-submitted",
            Submitter::HostSubmitted => "Host-submitted",
            Submitter::Mixed => "mixed",
            Submitter::Unknown => "unknown",
        }
    }

    /// The value [`Submitter::as_str`] names, if any.
    pub fn parse(text: &str) -> Option<Submitter> {
        Submitter::ALL.into_iter().find(|submitter| submitter.as_str() == text)
    }

    /// The submitter of a transfer whose three acts are these (no independent device-side observer).
    pub fn of(descriptors: &Act, doorbells: &Act, completion: &Act) -> Submitter {
        Submitter::observed(descriptors, doorbells, completion, None)
    }

    /// The submitter of acts whose window `observer` watched. Self-reported acts by AIV cores alone are
    /// `AIV-direct` only as the four checks are, with the observer; a Host act the loader tables counted among them
    /// makes them `mixed`.
    pub fn observed(
        descriptors: &Act,
        doorbells: &Act,
        completion: &Act,
        observer: Option<&DeviceObserver>,
    ) -> Submitter {
        if !descriptors.source.has_counts() || !doorbells.source.has_counts() {
            return Submitter::Unknown;
        }
        let mut doers = descriptors.doers().union(doorbells.doers());
        if doers.none() {
            // Nothing was handed to an engine (a Host-side copy): whoever saw the copy end did the work.
            if !completion.source.has_counts() {
                return Submitter::Unknown;
            }
            doers = completion.doers();
        }
        let named = [doers.aiv, doers.aicpu, doers.host].into_iter().filter(|&named| named).count();
        match (named, doers.unattributed) {
            (0, _) => Submitter::Unknown,
            (1, false) if doers.aiv => {
                match Checks::observed(descriptors, doorbells, completion, observer).aiv_direct() {
                    Check::Yes => Submitter::AivDirect,
                    Check::Unknown => Submitter::Unknown,
                    Check::No => Submitter::Mixed,
                }
            }
            (1, false) if doers.aicpu => Submitter::AiCpuSubmitted,
            (1, false) => Submitter::HostSubmitted,
            _ => Submitter::Mixed,
        }
    }
}

impl std::fmt::Display for Submitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many transfers each [`Submitter`] verdict went to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitterCounts {
    #[serde(rename = "AIV-direct")]
    pub aiv_direct: u64,
    #[serde(rename = "AI-CPU-submitted")]
    pub ai_cpu_submitted: u64,
    #[serde(rename = "Host-submitted")]
    pub host_submitted: u64,
    pub mixed: u64,
    pub unknown: u64,
}

impl SubmitterCounts {
    pub(super) fn slot(&mut self, submitter: Submitter) -> &mut u64 {
        match submitter {
            Submitter::AivDirect => &mut self.aiv_direct,
            Submitter::AiCpuSubmitted => &mut self.ai_cpu_submitted,
            Submitter::HostSubmitted => &mut self.host_submitted,
            Submitter::Mixed => &mut self.mixed,
            Submitter::Unknown => &mut self.unknown,
        }
    }

    /// Transfers whose verdict was `submitter`.
    pub fn get(&self, submitter: Submitter) -> u64 {
        let mut copy = *self;
        *copy.slot(submitter)
    }

    /// `"3 AIV-direct, 1 mixed"`: the verdicts that occurred, in [`Submitter::ALL`] order (`"none"` if none).
    pub fn describe(&self) -> String {
        let parts: Vec<String> = Submitter::ALL
            .into_iter()
            .filter(|&submitter| self.get(submitter) > 0)
            .map(|submitter| format!("{} {submitter}", self.get(submitter)))
            .collect();
        if parts.is_empty() {
            "none".to_string()
        } else {
            parts.join(", ")
        }
    }
}
