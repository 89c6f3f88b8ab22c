//! What every transfer records about how it was carried out.
//!
//! The comparative audit decides which paths are AIV-direct from these records (docs/hardware.md section 1: a kernel on
//! the AI Vector cores builds the descriptors, rings the doorbell and observes completion on the Device). No path
//! asserts that by name: each act is counted where it was observed, with the source of the counts beside them, and
//! the four checks are derived from the counts ([`TransferEvidence::checks`]). docs/evidence.md documents every field
//! of the serialised form.

use serde::{Deserialize, Serialize};

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
    fn doers(&self) -> Doers {
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
    fn check(&self, unattributed_allowed: bool, observer: Corroboration) -> Check {
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

/// Task counts by type that an independent device-side observer saw in a window: CANN's profiler (or the twin's
/// model of it), its task records whose execution overlapped the window, by task type (docs/evidence.md, "The
/// profiler").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedTasks {
    /// Kernels on the AI Vector cores (`KERNEL_AIVEC`, `KERNEL_MIX_AIV`).
    pub aiv_kernels: u64,
    /// AI-CPU tasks (`KERNEL_AICPU`).
    pub aicpu_tasks: u64,
    /// Copy and memset tasks (`MEMCPY_ASYNC`, `MEMSET_ASYNC`, `MEMCPY_ASYNC_WITHOUT_SDMA`, ...): the runtime's own
    /// descriptors, written on a Host call's behalf.
    pub copy_tasks: u64,
    /// Every other task type seen, by its name (other kernels, event and notify records, stream waits, ...).
    pub other_tasks: std::collections::BTreeMap<String, u64>,
}

impl ObservedTasks {
    /// `"only the AIV kernel ran (1 launch), 0 copy tasks"`, or what else ran.
    pub fn describe(&self) -> String {
        let count = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let others: u64 = self.other_tasks.values().sum();
        if self.aiv_kernels > 0 && self.copy_tasks == 0 && self.aicpu_tasks == 0 && others == 0 {
            return format!(
                "only the AIV kernel ran ({}), 0 copy tasks",
                count(self.aiv_kernels, "launch", "launches")
            );
        }
        let mut parts = vec![
            count(self.copy_tasks, "copy task", "copy tasks"),
            count(self.aicpu_tasks, "AI-CPU task", "AI-CPU tasks"),
            count(self.aiv_kernels, "AIV kernel launch", "AIV kernel launches"),
        ];
        if others > 0 {
            let names: Vec<String> = self.other_tasks.iter().map(|(name, count)| format!("{count} {name}")).collect();
            parts.push(format!("other tasks: {}", names.join(", ")));
        }
        parts.join(", ")
    }
}

/// What a run's independent device-side observer (CANN's profiler on `device_backend: "cann"`) made of the run's
/// window, or why there was none. [`EvidenceTally::observer`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DeviceObserver {
    /// The profiler ran around the run and its task records were read back.
    Profiler {
        /// The tasks whose execution overlapped the run's window.
        tasks: ObservedTasks,
    },
    /// No observer: the profiler is missing, failed, or its records could not be read.
    Unavailable {
        /// Why.
        reason: String,
    },
}

/// What an observer says of self-reported acts by AIV cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Corroboration {
    /// It saw the AIV kernel run and nothing else: no copy, no AI-CPU task, no other task.
    Corroborates,
    /// It saw a copy task or an AI-CPU task in the window: somebody else may have written descriptors.
    Contradicts,
    /// There was none, or it saw no AIV kernel, or it saw other tasks beside it.
    Silent,
}

impl DeviceObserver {
    fn corroboration(&self) -> Corroboration {
        match self {
            DeviceObserver::Unavailable { .. } => Corroboration::Silent,
            DeviceObserver::Profiler { tasks } if tasks.copy_tasks > 0 || tasks.aicpu_tasks > 0 => {
                Corroboration::Contradicts
            }
            DeviceObserver::Profiler { tasks } if tasks.aiv_kernels > 0 && tasks.other_tasks.is_empty() => {
                Corroboration::Corroborates
            }
            DeviceObserver::Profiler { .. } => Corroboration::Silent,
        }
    }

    fn saw_aiv_kernel(&self) -> bool {
        matches!(self, DeviceObserver::Profiler { tasks } if tasks.aiv_kernels > 0)
    }

    /// `"profiler: only the AIV kernel ran (1 launch), 0 copy tasks"` or `"no independent device-side observer:
    /// <why>"`.
    pub fn describe(&self) -> String {
        match self {
            DeviceObserver::Profiler { tasks } => format!("profiler: {}", tasks.describe()),
            DeviceObserver::Unavailable { reason } => format!("no independent device-side observer: {reason}"),
        }
    }
}

/// The outcome of one AIV-direct check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The observations show it.
    Yes,
    /// The observations show otherwise (or show nothing that would make it hold).
    No,
    /// Not observed on this runtime or in this run: neither yes nor no.
    Unknown,
}

impl Check {
    /// `yes`, `no` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Check::Yes => "yes",
            Check::No => "no",
            Check::Unknown => "unknown",
        }
    }
}

/// The four AIV-direct checks (docs/hardware.md section 1), derived from a record's acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Checks {
    /// A kernel on the AI Vector cores took part: some act was observed done by an AIV core.
    pub kernel_on_aiv: Check,
    /// The kernel wrote the descriptors: every descriptor consumed was written by an AIV core.
    pub kernel_writes_descriptors: Check,
    /// The kernel rang the doorbell: every doorbell write was an AIV core's.
    pub kernel_rings_doorbell: Check,
    /// Completion was observed on the Device: every completion flag read first was read by an AIV core.
    pub device_observes_completion: Check,
}

impl Checks {
    /// The checks of a transfer whose three acts are these (no independent device-side observer: a
    /// [self-reported](Source::SelfReported) act makes its check `unknown` at best).
    pub fn of(descriptors: &Act, doorbells: &Act, completion: &Act) -> Checks {
        Checks::observed(descriptors, doorbells, completion, None)
    }

    /// The checks of acts whose window `observer` watched (a run's, [`EvidenceTally::observer`]).
    pub fn observed(descriptors: &Act, doorbells: &Act, completion: &Act, observer: Option<&DeviceObserver>) -> Checks {
        let acts = [descriptors, doorbells, completion];
        let corroboration = observer.map_or(Corroboration::Silent, DeviceObserver::corroboration);
        let kernel_on_aiv = if acts.iter().any(|act| act.source.is_observed() && act.by_aiv > 0) {
            Check::Yes
        } else if acts.iter().any(|act| act.source == Source::SelfReported && act.by_aiv > 0) {
            // The kernel says it ran: the observer must have seen it run.
            if observer.is_some_and(DeviceObserver::saw_aiv_kernel) {
                Check::Yes
            } else {
                Check::Unknown
            }
        } else if acts.iter().all(|act| act.source.has_counts()) {
            Check::No
        } else {
            Check::Unknown
        };
        Checks {
            kernel_on_aiv,
            kernel_writes_descriptors: descriptors.check(false, corroboration),
            kernel_rings_doorbell: doorbells.check(false, corroboration),
            // A flag overwritten by the next one before anybody read it is covered by that next flag's read (an
            // SDMA engine executes a channel's SQEs in order).
            device_observes_completion: completion.check(true, corroboration),
        }
    }

    /// The four in order: kernel on the AIV cores, descriptors, doorbell, completion.
    pub fn as_array(&self) -> [Check; 4] {
        [
            self.kernel_on_aiv,
            self.kernel_writes_descriptors,
            self.kernel_rings_doorbell,
            self.device_observes_completion,
        ]
    }

    /// All four together: yes if every one is yes, no if any is no, else unknown.
    pub fn aiv_direct(&self) -> Check {
        let all = self.as_array();
        if all.iter().all(|&check| check == Check::Yes) {
            Check::Yes
        } else if all.contains(&Check::No) {
            Check::No
        } else {
            Check::Unknown
        }
    }
}

/// Which kinds of doer an act's counts name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Doers {
    aiv: bool,
    aicpu: bool,
    host: bool,
    unattributed: bool,
}

impl Doers {
    fn union(self, other: Doers) -> Doers {
        Doers {
            aiv: self.aiv || other.aiv,
            aicpu: self.aicpu || other.aicpu,
            host: self.host || other.host,
            unattributed: self.unattributed || other.unattributed,
        }
    }

    fn none(self) -> bool {
        self == Doers::default()
    }
}

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
    fn slot(&mut self, submitter: Submitter) -> &mut u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn by_aiv(count: u64) -> Act {
        Act { aiv_blocks: Some([0, 1]), ..Act { by_aiv: count, ..Act::unknown(Source::TwinModel) } }
    }

    #[test]
    fn each_act_turns_exactly_its_check() {
        let good = Checks::of(&by_aiv(64), &by_aiv(2), &by_aiv(1));
        assert_eq!(good.as_array(), [Check::Yes; 4]);
        assert_eq!(good.aiv_direct(), Check::Yes);
        let host_wrote = Act { by_host: 1, ..by_aiv(63) };
        let checks = Checks::of(&host_wrote, &by_aiv(2), &by_aiv(1));
        assert_eq!(checks.as_array(), [Check::Yes, Check::No, Check::Yes, Check::Yes]);
        assert_eq!(checks.aiv_direct(), Check::No);
        let checks = Checks::of(&by_aiv(64), &Act::host(Source::TwinModel, 2), &by_aiv(1));
        assert_eq!(checks.as_array(), [Check::Yes, Check::Yes, Check::No, Check::Yes]);
        let checks = Checks::of(&by_aiv(64), &by_aiv(2), &Act::host(Source::TwinModel, 1));
        assert_eq!(checks.as_array(), [Check::Yes, Check::Yes, Check::Yes, Check::No]);
    }

    #[test]
    fn unattributed_descriptors_fail_their_check_but_overwritten_flags_do_not() {
        let mixed = Act { unattributed: 1, ..by_aiv(63) };
        assert_eq!(Checks::of(&mixed, &by_aiv(2), &by_aiv(1)).kernel_writes_descriptors, Check::No);
        assert_eq!(Checks::of(&by_aiv(64), &by_aiv(2), &mixed).device_observes_completion, Check::Yes);
        let nobody_read = Act { source: Source::TwinModel, unattributed: 3, ..Act::unknown(Source::TwinModel) };
        assert_eq!(Checks::of(&by_aiv(64), &by_aiv(2), &nobody_read).device_observes_completion, Check::No);
    }

    #[test]
    fn a_host_path_fails_every_check_and_missing_records_are_unknown_not_no() {
        let host = Act::host(Source::HostCalls, 1);
        let checks = Checks::of(&host, &host, &host);
        assert_eq!(checks.as_array(), [Check::No; 4]);
        let record = TransferEvidence::new("aiv", RuntimeLabel::NONE);
        assert_eq!(record.checks().as_array(), [Check::Unknown; 4]);
        assert_eq!(record.checks().aiv_direct(), Check::Unknown);
        let hidden = Act::unknown(Source::NotObservable);
        let checks = Checks::of(&by_aiv(3), &by_aiv(1), &hidden);
        assert_eq!(checks.as_array(), [Check::Yes, Check::Yes, Check::Yes, Check::Unknown]);
        assert_eq!(checks.aiv_direct(), Check::Unknown);
    }

    #[test]
    fn a_tally_counts_a_shared_window_once_and_derives_the_run_verdict_from_the_sums() {
        let mut tally = EvidenceTally::default();
        let mut record = TransferEvidence::new("aiv", RuntimeLabel::new(RuntimeKind::Twin, "cann-twin 0.1.0"));
        record.descriptors_written = by_aiv(64);
        record.doorbells_rung = by_aiv(8);
        record.completion_seen = by_aiv(2);
        record.window = 2;
        tally.add(&record);
        tally.add(&record);
        assert_eq!(tally.descriptors_written.as_act().by_aiv, 64, "one window of two transfers, counted once");
        assert_eq!(tally.checks().aiv_direct(), Check::Yes);
        assert_eq!(tally.per_transfer[4], CheckCounts { yes: 2, no: 0, unknown: 0 });
        let lines = tally.verdict_lines();
        assert_eq!(lines[0], "submitted by: AIV-direct (twin runtime, cann-twin 0.1.0; 2 transfers: 2 AIV-direct)");
        assert!(lines[1].starts_with("  AIV-direct: yes (transfers: 2 yes, 0 no, 0 unknown)"), "{lines:?}");
        assert!(lines[3].contains("64 of 64 descriptors by AIV blocks 0-1; 0 by Host"), "{lines:?}");
        // One more transfer whose SQE the Host wrote turns the run's descriptor check, and only that one, to no.
        record.descriptors_written = Act { by_host: 1, ..by_aiv(1) };
        record.window = 1;
        tally.add(&record);
        let checks = tally.checks();
        assert_eq!(checks.as_array(), [Check::Yes, Check::No, Check::Yes, Check::Yes]);
        assert_eq!(tally.per_transfer[1], CheckCounts { yes: 2, no: 1, unknown: 0 });
        let lines = tally.verdict_lines();
        assert!(
            lines[0]
                .starts_with("submitted by: mixed (twin runtime, cann-twin 0.1.0; 3 transfers: 2 AIV-direct, 1 mixed"),
            "{lines:?}"
        );
        assert!(lines[1].starts_with("  AIV-direct: no"), "{lines:?}");
    }

    #[test]
    fn who_submitted_tells_the_three_submitters_apart_and_can_come_out_each_way() {
        let aiv = [by_aiv(64), by_aiv(2), by_aiv(1)];
        assert_eq!(Submitter::of(&aiv[0], &aiv[1], &aiv[2]), Submitter::AivDirect);
        // HiXL's AI-CPU kernel builds the SQEs and commits the tail; the Host learns completion from a flag.
        let aicpu = Act::aicpu(Source::TwinModel, 8);
        let host = Act::host(Source::TwinModel, 1);
        assert_eq!(Submitter::of(&aicpu, &Act::aicpu(Source::TwinModel, 1), &host), Submitter::AiCpuSubmitted);
        assert_eq!(Submitter::of(&host, &host, &host), Submitter::HostSubmitted);
        // A Host-side copy hands nothing to an engine: who saw it end did the work.
        let nothing = Act::host(Source::HostCode, 0);
        assert_eq!(Submitter::of(&nothing, &nothing, &Act::host(Source::HostCode, 1)), Submitter::HostSubmitted);
        // One act by another doer, or by nobody one can name, makes it mixed.
        assert_eq!(Submitter::of(&Act { by_host: 1, ..by_aiv(63) }, &aiv[1], &aiv[2]), Submitter::Mixed);
        assert_eq!(Submitter::of(&aiv[0], &aicpu, &aiv[2]), Submitter::Mixed);
        assert_eq!(Submitter::of(&Act { unattributed: 1, ..by_aiv(63) }, &aiv[1], &aiv[2]), Submitter::Mixed);
        assert_eq!(Submitter::of(&aicpu, &Act { by_host: 1, ..aicpu }, &host), Submitter::Mixed);
        // AIV submission with the Host seeing completion is not AIV-direct.
        assert_eq!(Submitter::of(&aiv[0], &aiv[1], &host), Submitter::Mixed);
        // Unobserved submission acts, or nothing that names a doer, say nothing.
        let lost = Act::unknown(Source::Lost);
        assert_eq!(Submitter::of(&lost, &aiv[1], &aiv[2]), Submitter::Unknown);
        assert_eq!(Submitter::of(&aiv[0], &aiv[1], &Act::unknown(Source::NotObservable)), Submitter::Unknown);
        let unnamed = Act { unattributed: 2, ..Act::unknown(Source::TwinModel) };
        assert_eq!(Submitter::of(&unnamed, &unnamed, &aiv[2]), Submitter::Unknown);
        for submitter in Submitter::ALL {
            assert_eq!(Submitter::parse(submitter.as_str()), Some(submitter));
            assert_eq!(serde_json::to_value(submitter).expect("serialises"), submitter.as_str());
        }
    }

    #[test]
    fn an_act_by_the_ai_cpu_fails_its_aiv_check_and_is_described() {
        let act = Act { by_aicpu: 3, ..by_aiv(5) };
        assert_eq!(Checks::of(&act, &by_aiv(1), &by_aiv(1)).kernel_writes_descriptors, Check::No);
        assert_eq!(act.describe("SQEs"), "5 of 8 SQEs by AIV blocks 0-1; 3 by AI CPU; 0 by Host");
        let mut tally = EvidenceTally::default();
        let mut record = TransferEvidence::new("adxl", RuntimeLabel::new(RuntimeKind::Twin, "cann-twin 0.1.0"));
        record.descriptors_written = Act::aicpu(Source::TwinModel, 8);
        record.doorbells_rung = Act::aicpu(Source::TwinModel, 1);
        record.completion_seen = Act::host(Source::HostCalls, 1);
        record.window = 4;
        record.host_launches = 0.25;
        for _ in 0..4 {
            tally.add(&record);
        }
        assert_eq!(tally.submitter(), Submitter::AiCpuSubmitted);
        assert_eq!(tally.host_launches_per_transfer(), 0.25);
        assert_eq!(tally.verdict_lines()[0], "submitted by: AI-CPU-submitted (twin runtime, cann-twin 0.1.0; 4 transfers: 4 AI-CPU-submitted; 0.250 Host kernel launches per transfer)");
    }

    #[test]
    fn self_reported_acts_are_yes_only_with_an_observer_that_saw_only_the_aiv_kernel() {
        let reported = |count: u64| Act {
            source: Source::SelfReported,
            by_aiv: count,
            aiv_blocks: Some([0, 1]),
            ..Act::unknown(Source::SelfReported)
        };
        let acts = [reported(64), reported(2), reported(1)];
        let seen = |tasks: ObservedTasks| DeviceObserver::Profiler { tasks };
        let clean = seen(ObservedTasks { aiv_kernels: 1, ..ObservedTasks::default() });
        let copied = seen(ObservedTasks { aiv_kernels: 1, copy_tasks: 2, ..ObservedTasks::default() });
        let aicpu = seen(ObservedTasks { aiv_kernels: 1, aicpu_tasks: 1, ..ObservedTasks::default() });
        let other = seen(ObservedTasks {
            aiv_kernels: 1,
            other_tasks: [("EVENT_RECORD".to_string(), 1)].into_iter().collect(),
            ..ObservedTasks::default()
        });
        let none_ran = seen(ObservedTasks::default());
        let missing = DeviceObserver::Unavailable { reason: "no libmsprofiler.so".into() };
        let verdict = |observer: Option<&DeviceObserver>| {
            (
                Checks::observed(&acts[0], &acts[1], &acts[2], observer).aiv_direct(),
                Submitter::observed(&acts[0], &acts[1], &acts[2], observer),
            )
        };
        // The kernel's word alone is never yes.
        assert_eq!(verdict(None), (Check::Unknown, Submitter::Unknown));
        assert_eq!(verdict(Some(&missing)), (Check::Unknown, Submitter::Unknown));
        assert_eq!(verdict(Some(&none_ran)), (Check::Unknown, Submitter::Unknown));
        assert_eq!(verdict(Some(&other)), (Check::Unknown, Submitter::Unknown));
        assert_eq!(Checks::observed(&acts[0], &acts[1], &acts[2], Some(&none_ran)).kernel_on_aiv, Check::Unknown);
        // Corroborated: yes; contradicted by a copy or an AI-CPU task: no, mixed.
        assert_eq!(verdict(Some(&clean)), (Check::Yes, Submitter::AivDirect));
        assert_eq!(verdict(Some(&copied)), (Check::No, Submitter::Mixed));
        assert_eq!(verdict(Some(&aicpu)), (Check::No, Submitter::Mixed));
        // A Host act the loader tables counted while in flight: no, mixed, whatever the observer says.
        let host = Act { by_host: 1, ..reported(64) };
        assert_eq!(Checks::observed(&host, &acts[1], &acts[2], Some(&clean)).aiv_direct(), Check::No);
        assert_eq!(Submitter::observed(&host, &acts[1], &acts[2], None), Submitter::Mixed);
        // The run's line names every source.
        let mut tally = EvidenceTally::default();
        let mut record = TransferEvidence::new("aiv", RuntimeLabel::new(RuntimeKind::Npu, "8.0.RC1"));
        (record.descriptors_written, record.doorbells_rung, record.completion_seen) = (acts[0], acts[1], acts[2]);
        tally.add(&record);
        assert_eq!(tally.submitter(), Submitter::Unknown);
        tally.observer = Some(clean);
        assert_eq!(
            tally.verdict_lines()[0],
            "submitted by: AIV-direct (NPU, CANN 8.0.RC1; device acts self-reported by the kernel; 0 Host \
             submissions counted; profiler: only the AIV kernel ran (1 launch), 0 copy tasks; 1 transfers: 1 unknown)"
        );
        tally.observer = Some(missing);
        assert_eq!(
            tally.verdict_lines()[0],
            "submitted by: unknown (NPU, CANN 8.0.RC1; device acts self-reported by the kernel; 0 Host submissions \
             counted; no independent device-side observer: no libmsprofiler.so; 1 transfers: 1 unknown)"
        );
        assert!(tally.verdict_lines()[3].contains("(self-reported by the kernel;"), "{:?}", tally.verdict_lines());
        let json = serde_json::to_value(&tally.observer).expect("serialises");
        assert_eq!(json["outcome"], "unavailable");
        assert_eq!(serde_json::to_value(Source::SelfReported).expect("serialises"), "self_reported");
    }

    #[test]
    fn an_act_describes_its_counts_or_why_there_are_none() {
        assert_eq!(by_aiv(64).describe("SQEs"), "64 of 64 SQEs by AIV blocks 0-1; 0 by Host");
        let one = Act { aiv_blocks: Some([3, 3]), by_host: 2, unattributed: 1, ..by_aiv(5) };
        assert_eq!(one.describe("SQEs"), "5 of 8 SQEs by AIV block 3; 2 by Host; 1 unattributed");
        assert_eq!(Act::unknown(Source::NotObservable).describe("x"), "not observable on this runtime");
    }
}
