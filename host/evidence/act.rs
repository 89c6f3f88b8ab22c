//! What a record is made of: the device runtime it was observed on ([`RuntimeLabel`]) and the counted acts
//! ([`Act`]: who wrote the descriptors, rang the doorbell, first saw completion) with the [`Source`] of the counts.

use serde::Serialize;

use super::checks::Check;
use super::observer::Corroboration;

/// Which device runtime a record was observed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    /// No device runtime took part (a Host path: tcp, the in-process copy).
    None,
    /// The project's twin runtime, a CPU model of the NPU: what it records is the model's, unverified on hardware.
    Twin,
    /// The vendor's CANN runtime on an NPU.
    Npu,
}

/// The device runtime a record came from, with the version string that runtime reports (for CANN,
/// `aclsysGetCANNVersion` of the CANN package; for the twin, `cann-twin <version>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct RuntimeLabel {
    /// Twin, NPU, or none.
    pub kind: RuntimeKind,
    /// What the runtime reports about itself (`"unknown"` when it reports nothing; empty for [`RuntimeKind::None`]).
    pub version: &'static str,
}

impl RuntimeLabel {
    /// No device runtime (Host paths).
    pub const NONE: RuntimeLabel = RuntimeLabel { kind: RuntimeKind::None, version: "" };

    /// A label for `kind` with a version string known only at run time; each distinct string is kept once for the
    /// process's life (a process sees a handful of runtimes at most).
    pub fn new(kind: RuntimeKind, version: &str) -> RuntimeLabel {
        use std::collections::HashSet;
        use std::sync::{Mutex, OnceLock};
        static VERSIONS: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
        let mut versions = VERSIONS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        let version = match versions.get(version) {
            Some(&known) => known,
            None => {
                let leaked: &'static str = Box::leak(version.to_owned().into_boxed_str());
                versions.insert(leaked);
                leaked
            }
        };
        RuntimeLabel { kind, version }
    }
}

impl std::fmt::Display for RuntimeLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            RuntimeKind::None => f.write_str("no device runtime"),
            RuntimeKind::Twin => write!(f, "twin runtime, {}", self.version),
            RuntimeKind::Npu => write!(f, "NPU, CANN {}", self.version),
        }
    }
}

/// Where the counts of an [`Act`] come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Nothing recorded the act: the twin runtime's provenance records were off (`aiv.record_provenance`). The
    /// counts are zero and mean nothing; the checks that need them are unknown.
    NotRecorded,
    /// This runtime cannot show who did it (on an NPU: who first read a completion flag). The counts are zero and
    /// mean nothing; the checks that need them are unknown.
    NotObservable,
    /// The records existed but could not be tied to this transfer: its group failed and the channel's reset dropped
    /// its SQEs, or the twin's log no longer held them when the Host read it. The counts are zero; the checks that
    /// need them are unknown.
    Lost,
    /// The twin runtime's device model, where the act happened: the writer of each SQ slot an SDMA engine consumed,
    /// the origin of each doorbell register write, the first reader of each completion flag.
    TwinModel,
    /// The device-side counts (`by_aiv`) are the kernel's own tallies in the transfer's completion entry, which no
    /// independent device-side observer saw; the Host-side counts (`by_host`) are the classified calls any thread of
    /// the process made through the `-sys` loader tables while the transfer was in flight
    /// (`ascendcl_sys::calls::HostActs`). Not [observed](Source::is_observed): a check it supports alone is never
    /// `yes` (docs/evidence.md, "Self-reported acts").
    SelfReported,
    /// Calls into the device runtime made on the transfer's behalf, counted by the `-sys` loader tables (a Host
    /// path's stream copies, submits and synchronisations).
    HostCalls,
    /// This project's Host code, counted at the act (a request header written, a socket send, a Host-side copy).
    HostCode,
}

impl Source {
    /// Whether the counts were observed by somebody other than the doer (the twin's device model, the loader
    /// tables, the Host code): only such counts can make a check `yes` alone.
    pub fn is_observed(self) -> bool {
        matches!(self, Source::TwinModel | Source::HostCalls | Source::HostCode)
    }

    /// Whether the counts mean something: observed, or [self-reported](Source::SelfReported).
    pub fn has_counts(self) -> bool {
        self.is_observed() || self == Source::SelfReported
    }

    /// How this source is named in printed verdicts.
    pub fn describe(self) -> &'static str {
        match self {
            Source::NotRecorded => "not recorded (provenance records off)",
            Source::NotObservable => "not observable on this runtime",
            Source::Lost => "records lost (a failed group, or the log overran)",
            Source::TwinModel => "recorded by the twin's device model",
            Source::SelfReported => "self-reported by the kernel",
            Source::HostCalls => "counted Host runtime calls",
            Source::HostCode => "counted in the Host code",
        }
    }
}

/// One act of a transfer (writing its descriptors, ringing the doorbell, first seeing its completion), counted by
/// who performed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Act {
    /// Where the counts come from.
    pub source: Source,
    /// Times an AI Vector core did it (on the twin: an emulated core running the kernel).
    pub by_aiv: u64,
    /// The lowest and highest block whose core did it (`None` when `by_aiv` is 0).
    pub aiv_blocks: Option<[u32; 2]>,
    /// Times a task on the AI CPU (the NPU's control CPU cores, which run AI-CPU kernels such as HiXL's batch
    /// transfer) did it; on the twin, its emulated AI CPU. Never an AIV core.
    pub by_aicpu: u64,
    /// Times the Host did it (a Host thread, or a runtime library on the Host's behalf).
    pub by_host: u64,
    /// Times it was done and cannot be attributed to one doer (on the twin: an SQ slot nobody wrote since the ring
    /// was made, or written in part by two writers, or by a device engine that is not a core; a completion flag
    /// overwritten by a later one before anybody read it).
    pub unattributed: u64,
}

impl Act {
    /// An act with nothing counted, for a `source` that holds no counts ([`Source::NotRecorded`],
    /// [`Source::NotObservable`], [`Source::Lost`]).
    pub const fn unknown(source: Source) -> Act {
        Act { source, by_aiv: 0, aiv_blocks: None, by_aicpu: 0, by_host: 0, unattributed: 0 }
    }

    /// `count` acts by the Host, from `source`.
    pub const fn host(source: Source, count: u64) -> Act {
        Act { source, by_aiv: 0, aiv_blocks: None, by_aicpu: 0, by_host: count, unattributed: 0 }
    }

    /// `count` acts by AI-CPU tasks, from `source`.
    pub const fn aicpu(source: Source, count: u64) -> Act {
        Act { source, by_aiv: 0, aiv_blocks: None, by_aicpu: count, by_host: 0, unattributed: 0 }
    }

    /// Every time the act was done.
    pub fn total(&self) -> u64 {
        self.by_aiv.saturating_add(self.by_aicpu).saturating_add(self.by_host).saturating_add(self.unattributed)
    }

    /// The kinds of doer the counts name (an observed act only; empty for one done zero times).
    pub(super) fn doers(&self) -> Doers {
        Doers {
            aiv: self.by_aiv > 0,
            aicpu: self.by_aicpu > 0,
            host: self.by_host > 0,
            unattributed: self.unattributed > 0,
        }
    }

    /// Whether the act was done by AIV cores only: observed, at least once by a core, never by the Host, and (unless
    /// `unattributed_allowed`) never by anybody else. A [self-reported](Source::SelfReported) act is `no` on the
    /// counts of others that it holds (the Host calls the loader tables counted) or when the kernel reports doing
    /// nothing, and otherwise only as `yes` as the run's independent device-side observer makes it.
    pub(super) fn check(&self, unattributed_allowed: bool, observer: Corroboration) -> Check {
        let others = self.by_aicpu > 0 || self.by_host > 0 || (!unattributed_allowed && self.unattributed > 0);
        if !self.source.has_counts() {
            Check::Unknown
        } else if others || self.by_aiv == 0 {
            Check::No
        } else if self.source.is_observed() {
            Check::Yes
        } else {
            match observer {
                Corroboration::Corroborates => Check::Yes,
                Corroboration::Contradicts => Check::No,
                Corroboration::Silent => Check::Unknown,
            }
        }
    }

    /// `"<aiv> of <total> <noun> by AIV block a-b[; <n> by AI CPU]; <host> by Host[; <n> unattributed]"`, or the
    /// reason the counts are missing.
    pub fn describe(&self, noun: &str) -> String {
        if !self.source.has_counts() {
            return self.source.describe().to_string();
        }
        let blocks = match self.aiv_blocks {
            Some([low, high]) if low == high => format!(" by AIV block {low}"),
            Some([low, high]) => format!(" by AIV blocks {low}-{high}"),
            None => " by AIV cores".to_string(),
        };
        let mut text = format!("{} of {} {noun}{blocks}", self.by_aiv, self.total());
        if self.by_aicpu > 0 {
            text.push_str(&format!("; {} by AI CPU", self.by_aicpu));
        }
        text.push_str(&format!("; {} by Host", self.by_host));
        if self.unattributed > 0 {
            text.push_str(&format!("; {} unattributed", self.unattributed));
        }
        text
    }
}

/// Which kinds of doer an act's counts name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Doers {
    pub(super) aiv: bool,
    pub(super) aicpu: bool,
    pub(super) host: bool,
    pub(super) unattributed: bool,
}

impl Doers {
    pub(super) fn union(self, other: Doers) -> Doers {
        Doers {
            aiv: self.aiv || other.aiv,
            aicpu: self.aicpu || other.aicpu,
            host: self.host || other.host,
            unattributed: self.unattributed || other.unattributed,
        }
    }

    pub(super) fn none(self) -> bool {
        self == Doers::default()
    }
}
