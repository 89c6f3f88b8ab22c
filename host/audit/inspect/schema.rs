//! The inspection report's types, as `aiv audit --inspect --json` writes them (schema
//! [`INSPECT_SCHEMA`](super::INSPECT_SCHEMA)): components, their evidence items by check and stance, and the files not
//! inspected.

use serde::{Deserialize, Serialize};

use super::Submitter;

/// What one inspection found: every component of every path, the files that could not be read, and the caveat.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InspectReport {
    /// [`INSPECT_SCHEMA`].
    pub schema: String,
    /// The paths as given.
    pub inputs: Vec<String>,
    pub components: Vec<Component>,
    /// Paths that do not exist, and files that are unreadable or malformed, by name.
    pub problems: Vec<Problem>,
    pub caveat: String,
}

/// A file that could not be inspected, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub problem: String,
}

/// What a component is.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ComponentKind {
    /// An ELF file inside a wheel.
    WheelElf,
    /// The Python/C/C++ sources (and AI-CPU op registrations) of a wheel, together.
    WheelSources,
    /// An ELF file given as a path.
    Elf,
    /// A group of source files of a tree (or a single source file or registration given as a path).
    SourceTree,
}

impl ComponentKind {
    pub(super) fn label(self) -> &'static str {
        match self {
            ComponentKind::WheelElf => "wheel-elf",
            ComponentKind::WheelSources => "wheel-sources",
            ComponentKind::Elf => "elf",
            ComponentKind::SourceTree => "source-tree",
        }
    }
}

/// One component: its evidence and verdict.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Component {
    /// `wheel.whl!path/in/zip.so`, `wheel.whl!sources`, the ELF's path, or the group's path relative to its root.
    pub name: String,
    pub kind: ComponentKind,
    /// The path given on the command line this component was found under.
    pub root: String,
    /// Source files (and AI-CPU op registrations) read for it (0 for an ELF).
    pub files_read: usize,
    pub evidence: Vec<Evidence>,
    /// Evidence items past [`MAX_EVIDENCE`], not kept.
    pub evidence_dropped: usize,
    /// Who submits, in the five words of the run evidence: `AIV-direct`, `AI-CPU-submitted`, `Host-submitted`,
    /// `mixed`, `unknown`.
    pub verdict: Submitter,
    pub reason: String,
}

/// Which check an item bears on: 1 to 4, `"ai_cpu_submission"` or `"host_submission"` (both against checks 2 to 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// 1: a kernel runs on the AIV cores.
    Kernel,
    /// 2: the kernel writes the DMA descriptors itself.
    Descriptors,
    /// 3: the kernel rings the doorbell itself.
    Doorbell,
    /// 4: completion is observed on the Device.
    Completion,
    /// Submission of the copies by AI-CPU kernels: against checks 2 and 3 (the AI CPU, not the AIV, submits).
    AiCpuSubmission,
    /// Host submission of the copies: against checks 2 to 4.
    HostSubmission,
}

impl Check {
    pub(super) const ALL: [Check; 6] = [
        Check::Kernel,
        Check::Descriptors,
        Check::Doorbell,
        Check::Completion,
        Check::AiCpuSubmission,
        Check::HostSubmission,
    ];

    pub(super) fn title(self) -> &'static str {
        match self {
            Check::Kernel => "check 1: a kernel runs on the AIV cores",
            Check::Descriptors => "check 2: the kernel writes the DMA descriptors itself",
            Check::Doorbell => "check 3: the kernel rings the doorbell itself",
            Check::Completion => "check 4: completion is observed on the Device",
            Check::AiCpuSubmission => "AI-CPU submission (against checks 2-3)",
            Check::HostSubmission => "Host submission (against checks 2-4)",
        }
    }
}

impl Serialize for Check {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Check::Kernel => serializer.serialize_u8(1),
            Check::Descriptors => serializer.serialize_u8(2),
            Check::Doorbell => serializer.serialize_u8(3),
            Check::Completion => serializer.serialize_u8(4),
            Check::AiCpuSubmission => serializer.serialize_str("ai_cpu_submission"),
            Check::HostSubmission => serializer.serialize_str("host_submission"),
        }
    }
}

impl<'de> Deserialize<'de> for Check {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Check, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u8),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(1) => Ok(Check::Kernel),
            Raw::Number(2) => Ok(Check::Descriptors),
            Raw::Number(3) => Ok(Check::Doorbell),
            Raw::Number(4) => Ok(Check::Completion),
            Raw::Text(text) if text == "ai_cpu_submission" => Ok(Check::AiCpuSubmission),
            Raw::Text(text) if text == "host_submission" => Ok(Check::HostSubmission),
            _ => Err(serde::de::Error::custom("check: 1 to 4, \"ai_cpu_submission\" or \"host_submission\"")),
        }
    }
}

/// Whether an item speaks for the check, against it, or is only context or a name.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Stance {
    /// Counts for the check.
    For,
    /// Counts against AIV direct-drive: Host or AI-CPU submission.
    Against,
    /// Context, never counted: a descriptor or doorbell name in Host code, an AI-CPU kernel that nothing shows
    /// submitting copies.
    Neutral,
    /// A name only, never counted: a symbol, section or variable whose name mentions ascend, aicore or kernel, a
    /// variable named after a launch API, an ELF image for another processor, an AI-CPU op's name not tied to a
    /// launch.
    Mentions,
}

/// The class of an item.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceClass {
    /// AscendC/CCE markers in source; a device object in a binary (an ELF for the NPU's machine).
    DeviceKernel,
    /// A kernel-launch API (`aclrtLaunchKernel*`, `aclrtBinaryLoad*`, `aclrtBinaryGetFunction`, `rtKernelLaunch*`).
    KernelLaunch,
    /// SQE/WQE/CQE structures.
    Descriptor,
    /// Doorbell writes.
    Doorbell,
    /// The SHMEM device API.
    ShmemDeviceApi,
    /// Flag or CQE polling, `dcci` near polling.
    DeviceCompletion,
    /// An AI-CPU kernel: an op registered with `opKernelLib=AICPUKernel`, the `.so` holding an op's body, an op's
    /// name where a kernel is launched, a path into the runtime's AI-CPU op directory.
    AiCpuKernel,
    /// A Host copy or transfer call.
    HostSubmission,
}

/// One item of evidence.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Evidence {
    pub class: EvidenceClass,
    pub check: Check,
    pub for_or_against: Stance,
    /// What was found, and why it counts (or does not).
    pub what: String,
    /// `file:line`, or `symbol NAME (...)`, or `section NAME ...`, or `ELF header`.
    pub location: String,
    /// Found only on a comment line: reported, never counted for a verdict.
    pub in_comment: bool,
    /// Found in AIV device code (a source file with device-kernel markers outside comments, or a device object).
    pub in_device_code: bool,
    /// Found in AI-CPU code (a source file of an AI-CPU kernel, or the `.so` holding an AI-CPU op's body).
    #[serde(default)]
    pub in_ai_cpu_code: bool,
}

impl Evidence {
    pub(super) fn new(class: EvidenceClass, check: Check, stance: Stance, what: String, location: String) -> Evidence {
        Evidence {
            class,
            check,
            for_or_against: stance,
            what,
            location,
            in_comment: false,
            in_device_code: false,
            in_ai_cpu_code: false,
        }
    }

    pub(super) fn device(mut self) -> Evidence {
        self.in_device_code = true;
        self
    }

    pub(super) fn ai_cpu(mut self) -> Evidence {
        self.in_ai_cpu_code = true;
        self
    }
}
