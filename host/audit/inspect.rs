//! `aiv audit --inspect PATH...`: static inspection of wheels, ELF files and source trees for the four checks of AIV
//! direct-drive (a kernel on the AIV cores, descriptors written by the kernel, the doorbell rung by the kernel,
//! completion observed on the Device), with the evidence for and against each and a "submitted by" verdict per
//! component in the five words of the run evidence ([`Submitter`]; docs/inspect.md).
//!
//! Self-contained: std, serde, `serde_json` (AI-CPU op registrations), `object` (ELF), `cpp_demangle` (C++ names) and
//! `zip` (wheels) only. What a vendor library does inside a call is outside what this can see, and a verdict from
//! inspection is not an observation of a run: [`CAVEAT`] says so in every report.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection, ObjectSymbol};
use serde::{Deserialize, Serialize};

pub use crate::evidence::Submitter;

/// The `schema` of an [`InspectReport`].
pub const INSPECT_SCHEMA: &str = "aiv-inspect/2";

/// The standing caveat of every report.
pub const CAVEAT: &str = "Static inspection sees names, markers and structures in files; what a closed-source \
vendor library does inside a call (whether it writes descriptors or rings a doorbell from the Host or from the \
Device) is outside what it can see. A verdict from inspection is not an observation of a run: the audit's run \
verdicts come from the evidence its transfers recorded.";

/// The ELF `e_machine` of the NPU's device objects: `EM_HIIPU`, 0x1029, as the Ascend runtime writes it into the
/// device ELF images it dumps (hicann/runtime `src/dfx/adump/adump/exception/dump_ELF.cpp`). That the device
/// compiler's kernel objects carry the same number is inferred from the machine's name (`objdump` reads an operator's
/// kernel object as `elf64-hiipu`); no public source of the compiler states the number (docs/inspect.md, "Device
/// objects").
pub const NPU_ELF_MACHINE: u16 = 0x1029;

/// `EM_AARCH64`, 183: the machine the Ascend runtime's ELF program loader takes for an AI-CPU kernel (hicann/runtime
/// `src/runtime/core/src/kernel/program.cc`, `ElfProgram::ParserBinary`). Named in evidence text only: an AArch64
/// image is not by itself an AI-CPU kernel.
pub const AICPU_ELF_MACHINE: u16 = 183;

/// At most this much of one binary (an ELF file, or an ELF inside a wheel) is read.
pub const MAX_BINARY_BYTES: u64 = 64 << 20;
/// Source files (and AI-CPU op registrations) larger than this are skipped.
pub const MAX_SOURCE_BYTES: u64 = 4 << 20;
/// At most this many evidence items are kept per component; the rest are counted in `evidence_dropped`.
pub const MAX_EVIDENCE: usize = 10_000;
/// At most this many embedded ELF images are looked into per binary.
const MAX_EMBEDDED: usize = 256;
/// At most this much is read from the members of one wheel, in all (each ELF member within [`MAX_BINARY_BYTES`]).
pub const MAX_WHEEL_BYTES: u64 = 1 << 30;
/// Directories deeper than this below a source root are not walked.
const MAX_DEPTH: usize = 64;
/// How many lines apart a `dcci` and a poll may be for the `dcci` to count as cache maintenance of that poll.
const DCCI_NEAR_LINES: usize = 20;

const SOURCE_EXTENSIONS: &[&str] = &["c", "cc", "cpp", "cxx", "h", "hh", "hpp", "rs", "py", "cu", "cuh", "asc"];
/// Files read only for AI-CPU op registrations (`opKernelLib=AICPUKernel`), never for names.
const REGISTRATION_EXTENSIONS: &[&str] = &["ini", "json"];

/// AI-CPU ops whose public source shows them submitting the copies from the AI CPU: the op's name, and what its
/// body does, with the source.
const AICPU_COPY_OPS: &[(&str, &str)] = &[
    (
        "HixlBatchPut",
        "HiXL's AI-CPU batch write: its body hands the list to HCOMM's batch transfer on the AI-CPU thread \
         (hicann/hixl src/ops/hixl_kernel/hixl_batch_transfer.cc)",
    ),
    (
        "HixlBatchGet",
        "HiXL's AI-CPU batch read: its body hands the list to HCOMM's batch transfer on the AI-CPU thread \
         (hicann/hixl src/ops/hixl_kernel/hixl_batch_transfer.cc)",
    ),
    (
        "HixlFabricMemBatchRead",
        "HiXL FabricMem's AI-CPU batch read: its body builds STARS SDMA SQEs on the AI CPU and publishes them to the \
         RTSQ (hicann/hixl src/ops/hixl_kernel/fabric_mem_aicpu_kernel.cc, fabric_mem_stars_sdma.cc)",
    ),
    (
        "HixlFabricMemBatchWrite",
        "HiXL FabricMem's AI-CPU batch write: its body builds STARS SDMA SQEs on the AI CPU and publishes them to the \
         RTSQ (hicann/hixl src/ops/hixl_kernel/fabric_mem_aicpu_kernel.cc, fabric_mem_stars_sdma.cc)",
    ),
    (
        "HybmBatchRead",
        "MemFabric's AI-CPU batch read: its body hands the list to HCOMM's batch transfer on the AI-CPU thread \
         (memfabric_hybrid src/hybm/ops/hybm_kernel/hybm_batch_transfer.cc, in the public copy \
         NoCoder0/memfabric_hybrid)",
    ),
    (
        "HybmBatchWrite",
        "MemFabric's AI-CPU batch write: its body hands the list to HCOMM's batch transfer on the AI-CPU thread \
         (memfabric_hybrid src/hybm/ops/hybm_kernel/hybm_batch_transfer.cc, in the public copy \
         NoCoder0/memfabric_hybrid)",
    ),
];

/// AI-CPU ops known from public source that submit no copy themselves.
const AICPU_OTHER_OPS: &[(&str, &str)] = &[(
    "HixlSyncTransferContext",
    "HiXL's AI-CPU transfer-context op: it sets up the AI-CPU side's transfer context, no copy \
     (hicann/hixl src/ops/hixl_kernel/hixl_sync_transfer_context.cc)",
)];

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
    fn label(self) -> &'static str {
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
    const ALL: [Check; 6] = [
        Check::Kernel,
        Check::Descriptors,
        Check::Doorbell,
        Check::Completion,
        Check::AiCpuSubmission,
        Check::HostSubmission,
    ];

    fn title(self) -> &'static str {
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
    fn new(class: EvidenceClass, check: Check, stance: Stance, what: String, location: String) -> Evidence {
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

    fn device(mut self) -> Evidence {
        self.in_device_code = true;
        self
    }

    fn ai_cpu(mut self) -> Evidence {
        self.in_ai_cpu_code = true;
        self
    }
}

// ---------------------------------------------------------------------------------------------------------------
// AI-CPU ops: the ones public source shows, and the ones an input registers.

/// One op registered with `opKernelLib=AICPUKernel` (a `.ini` section or a `.json` entry).
#[derive(Clone, Debug)]
struct Registration {
    op: String,
    function: String,
    kernel_so: String,
    /// `file:line` of the op's entry.
    at: String,
}

/// The AI-CPU op registrations in reach of a component: the ones of its input (wheel or tree), and the ones given
/// as paths.
#[derive(Clone, Debug, Default)]
struct AiCpuOps {
    registered: Vec<Registration>,
    /// Directories (as shown) holding a registration: the sources beside it are the AI-CPU kernel's.
    dirs: BTreeMap<String, String>,
}

/// What an AI-CPU op name is.
#[derive(Clone, Copy)]
enum AiCpuOp<'a> {
    /// One [`AICPU_COPY_OPS`] names: its body submits copies.
    Copy(&'static str),
    /// One [`AICPU_OTHER_OPS`] names.
    Other(&'static str),
    /// One an input registers, which public source does not show.
    Registered(&'a Registration),
}

impl AiCpuOps {
    fn add(&mut self, shown: &str, registrations: Vec<Registration>) {
        if let Some(first) = registrations.first() {
            let dir = shown.rsplit_once('/').map_or("", |(dir, _)| dir).to_owned();
            self.dirs.entry(dir).or_insert_with(|| first.at.clone());
        }
        self.registered.extend(registrations);
    }

    /// The op this name (a function name, exactly) is, if any.
    fn op(&self, name: &str) -> Option<AiCpuOp<'_>> {
        if let Some(&(_, what)) = AICPU_COPY_OPS.iter().find(|(op, _)| *op == name) {
            return Some(AiCpuOp::Copy(what));
        }
        if let Some(&(_, what)) = AICPU_OTHER_OPS.iter().find(|(op, _)| *op == name) {
            return Some(AiCpuOp::Other(what));
        }
        self.registered.iter().find(|r| r.function == name || r.op == name).map(AiCpuOp::Registered)
    }

    /// Whether `text` holds any op's name (a cheap look before demangling a symbol).
    fn named_in(&self, text: &str) -> bool {
        AICPU_COPY_OPS.iter().chain(AICPU_OTHER_OPS).any(|(op, _)| text.contains(op))
            || self.registered.iter().any(|r| text.contains(&r.function) || text.contains(&r.op))
    }

    /// The registration whose `kernelSo` is this file name.
    fn kernel_so(&self, file_name: &str) -> Option<&Registration> {
        self.registered.iter().find(|r| r.kernel_so == file_name)
    }
}

impl AiCpuOp<'_> {
    fn submits(self) -> bool {
        matches!(self, AiCpuOp::Copy(_))
    }

    fn stance(self) -> Stance {
        if self.submits() {
            Stance::Against
        } else {
            Stance::Neutral
        }
    }

    /// What the op is, for evidence text.
    fn describe(self) -> String {
        match self {
            AiCpuOp::Copy(what) => format!("{what}; so the AI CPU submits these copies"),
            AiCpuOp::Other(what) => format!("{what}; an AI-CPU kernel that submits no copy"),
            AiCpuOp::Registered(r) => format!(
                "registered as an AI-CPU op at {} (`{}` in `{}`); nothing here shows whether it submits copies",
                r.at, r.function, r.kernel_so
            ),
        }
    }
}

/// The `opKernelLib=AICPUKernel` entries of a `.ini` (`[Op]` sections of `opInfo.*` keys, as HiXL's
/// `libcann_hixl_kernel.ini`) or `.json` (`{"Op": {"opInfo": {...}}}`, as the runtime's AI-CPU op config) file.
fn parse_registrations(shown: &str, extension: &str, text: &str) -> Vec<Registration> {
    if !text.contains("AICPUKernel") {
        return Vec::new();
    }
    let mut out = Vec::new();
    if extension == "ini" {
        let mut section: Option<(String, usize, BTreeMap<String, String>)> = None;
        let finish = |section: Option<(String, usize, BTreeMap<String, String>)>, out: &mut Vec<Registration>| {
            if let Some((op, line, keys)) = section {
                if keys.get("opInfo.opKernelLib").map(String::as_str) == Some("AICPUKernel") {
                    out.push(Registration {
                        function: keys.get("opInfo.functionName").cloned().unwrap_or_else(|| op.clone()),
                        kernel_so: keys.get("opInfo.kernelSo").cloned().unwrap_or_default(),
                        op,
                        at: format!("{shown}:{line}"),
                    });
                }
            }
        };
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if let Some(name) = line.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
                finish(section.take(), &mut out);
                section = Some((name.trim().to_owned(), index + 1, BTreeMap::new()));
            } else if let (Some((key, value)), Some((_, _, keys))) = (line.split_once('='), section.as_mut()) {
                keys.insert(key.trim().to_owned(), value.trim().to_owned());
            }
        }
        finish(section, &mut out);
    } else if let Ok(serde_json::Value::Object(ops)) = serde_json::from_str::<serde_json::Value>(text) {
        for (op, entry) in &ops {
            let info = &entry["opInfo"];
            if info["opKernelLib"].as_str() != Some("AICPUKernel") {
                continue;
            }
            let quoted = format!("\"{op}\"");
            let line = text.lines().position(|l| l.contains(&quoted)).map_or(1, |i| i + 1);
            out.push(Registration {
                op: op.clone(),
                function: info["functionName"].as_str().unwrap_or(op).to_owned(),
                kernel_so: info["kernelSo"].as_str().unwrap_or_default().to_owned(),
                at: format!("{shown}:{line}"),
            });
        }
    }
    out
}

/// The evidence of one registration entry.
fn registration_evidence(registration: &Registration, ops: &AiCpuOps) -> Evidence {
    let op = ops.op(&registration.function).unwrap_or(AiCpuOp::Registered(registration));
    let what = match op {
        AiCpuOp::Registered(_) => format!(
            "AI-CPU op `{}` registered with opKernelLib=AICPUKernel (function `{}` in `{}`): an AI-CPU kernel; \
             nothing here shows whether it submits copies",
            registration.op, registration.function, registration.kernel_so
        ),
        known => format!(
            "AI-CPU op `{}` registered with opKernelLib=AICPUKernel (function `{}` in `{}`): {}",
            registration.op,
            registration.function,
            registration.kernel_so,
            known.describe()
        ),
    };
    Evidence::new(EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, op.stance(), what, registration.at.clone())
}

/// Inspects every path: wheels, ELF files, source trees, single source files and AI-CPU op registrations. A path
/// that does not exist, and a file that cannot be read or parsed, is a [`Problem`] of the report, never a panic.
pub fn inspect(paths: &[PathBuf]) -> InspectReport {
    let mut report = InspectReport {
        schema: INSPECT_SCHEMA.to_owned(),
        inputs: paths.iter().map(|p| p.display().to_string()).collect(),
        components: Vec::new(),
        problems: Vec::new(),
        caveat: CAVEAT.to_owned(),
    };
    // Registrations given as paths are in reach of every component: a kernel .so given beside its .ini is known.
    let mut given = AiCpuOps::default();
    for path in paths {
        let extension = extension_of(path);
        if REGISTRATION_EXTENSIONS.contains(&extension.as_str()) && path.is_file() {
            let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            if let Ok(Some(text)) = read_source(path, len) {
                let shown = path.display().to_string();
                let registrations = parse_registrations(&shown, &extension, &text);
                given.add(&shown, registrations);
            }
        }
    }
    for path in paths {
        inspect_path(path, &given, &mut report);
    }
    report
}

fn problem(report: &mut InspectReport, path: impl Into<String>, what: impl Into<String>) {
    report.problems.push(Problem { path: path.into(), problem: what.into() });
}

fn extension_of(path: &Path) -> String {
    path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase()
}

fn inspect_path(path: &Path, given: &AiCpuOps, report: &mut InspectReport) {
    let shown = path.display().to_string();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return problem(report, shown, "does not exist"),
        Err(e) => return problem(report, shown, format!("unreadable: {e}")),
    };
    if meta.is_dir() {
        return inspect_tree(path, given, report);
    }
    let mut head = [0u8; 4];
    let got = match std::fs::File::open(path).and_then(|mut f| read_up_to(&mut f, &mut head)) {
        Ok(got) => got,
        Err(e) => return problem(report, shown, format!("unreadable: {e}")),
    };
    let extension = extension_of(path);
    if got == 4 && head == *b"\x7fELF" {
        match read_bounded(path, MAX_BINARY_BYTES) {
            Ok(data) => {
                let mut sink = Sink::default();
                let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                match inspect_elf(&data, file_name.as_deref(), given, &mut sink) {
                    Ok(()) => report.components.push(sink.finish(shown.clone(), ComponentKind::Elf, &shown, 0)),
                    Err(e) => problem(report, shown, format!("malformed ELF: {e}")),
                }
            }
            Err(e) => problem(report, shown, format!("unreadable: {e}")),
        }
    } else if extension == "whl" || extension == "zip" || (got == 4 && head == *b"PK\x03\x04") {
        inspect_wheel(path, given, report);
    } else if SOURCE_EXTENSIONS.contains(&extension.as_str()) {
        let mut files = Vec::new();
        match read_source(path, meta.len()) {
            Ok(Some(text)) => files.push(SourceFile { shown: shown.clone(), extension, text }),
            Ok(None) => return problem(report, shown, "not a text file, or larger than 4 MiB"),
            Err(e) => return problem(report, shown, format!("unreadable: {e}")),
        }
        let macros = device_macros(&files);
        let mut sink = Sink::default();
        for file in &files {
            scan_source(file, &macros, given, &mut sink);
        }
        report.components.push(sink.finish(shown.clone(), ComponentKind::SourceTree, &shown, 1));
    } else if REGISTRATION_EXTENSIONS.contains(&extension.as_str()) {
        let text = match read_source(path, meta.len()) {
            Ok(Some(text)) => text,
            Ok(None) => return problem(report, shown, "not a text file, or larger than 4 MiB"),
            Err(e) => return problem(report, shown, format!("unreadable: {e}")),
        };
        let registrations = parse_registrations(&shown, &extension, &text);
        if registrations.is_empty() {
            return problem(report, shown, "not an AI-CPU op registration (no entry with opKernelLib=AICPUKernel)");
        }
        let mut sink = Sink::default();
        for registration in &registrations {
            sink.push(registration_evidence(registration, given));
        }
        report.components.push(sink.finish(shown.clone(), ComponentKind::SourceTree, &shown, 1));
    } else {
        problem(
            report,
            shown,
            "not a wheel, an ELF file, a directory, a source file or an AI-CPU op registration (by name or content)",
        );
    }
}

fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::new();
    std::fs::File::open(path)?.take(limit).read_to_end(&mut data)?;
    Ok(data)
}

/// A text file's content: `None` when it is larger than [`MAX_SOURCE_BYTES`] or holds a NUL byte.
fn read_source(path: &Path, len: u64) -> std::io::Result<Option<String>> {
    if len > MAX_SOURCE_BYTES {
        return Ok(None);
    }
    let data = read_bounded(path, MAX_SOURCE_BYTES + 1)?;
    Ok(text_of(data))
}

fn text_of(data: Vec<u8>) -> Option<String> {
    if data.len() as u64 > MAX_SOURCE_BYTES || data.contains(&0) {
        return None;
    }
    Some(String::from_utf8_lossy(&data).into_owned())
}

// ---------------------------------------------------------------------------------------------------------------
// Collecting one component's evidence, and its verdict.

/// An AI-CPU op's name met outside AI-CPU code: it counts (the Host side of an AI-CPU path) only when the same
/// component launches a kernel, which [`Sink::finish`] knows.
struct PendingOp {
    name: String,
    /// How it was found (`its name as a string in .rodata`).
    found: String,
    stance: Stance,
    describe: String,
    location: String,
}

#[derive(Default)]
struct Sink {
    evidence: Vec<Evidence>,
    dropped: usize,
    /// Items already kept, for the binary scans that can meet one name several times (`.symtab` and `.dynsym`).
    seen: BTreeSet<(EvidenceClass, String, String)>,
    /// Counted items (outside comments), by class and stance, whatever was dropped.
    counted: BTreeMap<(EvidenceClass, Stance), usize>,
    /// Items only in comments.
    commented: usize,
    /// Counted AI-CPU submission items from AI-CPU code itself (not a launch of an op).
    ai_cpu_code: usize,
    pending: Vec<PendingOp>,
}

impl Sink {
    fn push(&mut self, item: Evidence) {
        if item.in_comment {
            self.commented += 1;
        } else {
            *self.counted.entry((item.class, item.for_or_against)).or_default() += 1;
            if item.in_ai_cpu_code
                && item.for_or_against == Stance::Against
                && item.class != EvidenceClass::HostSubmission
            {
                self.ai_cpu_code += 1;
            }
        }
        if self.evidence.len() >= MAX_EVIDENCE {
            self.dropped += 1;
        } else {
            self.evidence.push(item);
        }
    }

    /// Pushes the item unless the same class, what and location was pushed before.
    fn push_once(&mut self, item: Evidence) {
        if self.seen.insert((item.class, item.what.clone(), item.location.clone())) {
            self.push(item);
        }
    }

    /// An AI-CPU op's name met outside AI-CPU code, decided at [`Sink::finish`].
    fn pending_op(&mut self, name: &str, op: AiCpuOp<'_>, found: String, location: String) {
        if self.seen.insert((EvidenceClass::AiCpuKernel, name.to_owned(), location.clone())) {
            self.pending.push(PendingOp {
                name: name.to_owned(),
                found,
                stance: op.stance(),
                describe: op.describe(),
                location,
            });
        }
    }

    fn has(&self, class: EvidenceClass, stance: Stance) -> bool {
        self.counted.get(&(class, stance)).is_some_and(|&n| n > 0)
    }

    fn finish(mut self, name: String, kind: ComponentKind, root: &str, files_read: usize) -> Component {
        let launch = self.has(EvidenceClass::KernelLaunch, Stance::For);
        for op in std::mem::take(&mut self.pending) {
            let (stance, what) = if launch {
                let side =
                    if op.stance == Stance::Against { "the Host side of an AI-CPU-submitted path: " } else { "" };
                (
                    op.stance,
                    format!(
                        "launches the AI-CPU op `{}` ({}, and a kernel launch API in this component): {side}{}",
                        op.name, op.found, op.describe
                    ),
                )
            } else {
                (
                    Stance::Mentions,
                    format!(
                        "names the AI-CPU op `{}` ({}), but nothing in this component launches a kernel: a name only",
                        op.name, op.found
                    ),
                )
            };
            self.push(Evidence::new(EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, stance, what, op.location));
        }

        let kernel =
            self.has(EvidenceClass::DeviceKernel, Stance::For) || self.has(EvidenceClass::KernelLaunch, Stance::For);
        let aiv = [EvidenceClass::Descriptor, EvidenceClass::Doorbell, EvidenceClass::ShmemDeviceApi]
            .iter()
            .any(|&class| self.has(class, Stance::For));
        let ai_cpu = [EvidenceClass::AiCpuKernel, EvidenceClass::Descriptor, EvidenceClass::Doorbell]
            .iter()
            .any(|&class| self.has(class, Stance::Against));
        let host = self.has(EvidenceClass::HostSubmission, Stance::Against);
        let (verdict, reason) = match (aiv, ai_cpu, host) {
            (true, false, false) if kernel => (
                Submitter::AivDirect,
                "device-kernel evidence and descriptor/doorbell evidence from device code, and no Host- or \
                 AI-CPU-submission evidence"
                    .to_owned(),
            ),
            (true, false, false) => {
                (Submitter::Unknown, "device-descriptor evidence but no device-kernel evidence".to_owned())
            }
            (false, true, false) if self.ai_cpu_code > 0 => (
                Submitter::AiCpuSubmitted,
                "AI-CPU-submission evidence from AI-CPU code (an AI-CPU kernel writes the descriptors or is an op \
                 that submits copies), and no AIV device-descriptor or Host-submission evidence"
                    .to_owned(),
            ),
            (false, true, false) => (
                Submitter::AiCpuSubmitted,
                "AI-CPU-submission evidence: it launches or registers AI-CPU ops that submit the copies (the Host \
                 side of an AI-CPU-submitted path), and no AIV device-descriptor or Host-submission evidence"
                    .to_owned(),
            ),
            (false, false, true) => {
                let reason = if kernel {
                    "Host-submission evidence and no descriptor/doorbell evidence from device code (a kernel is \
                     there, but nothing shows it writes descriptors)"
                } else {
                    "Host-submission evidence and no descriptor/doorbell evidence from device code"
                };
                (Submitter::HostSubmitted, reason.to_owned())
            }
            (true, false, true) => (Submitter::Mixed, "both Host-submission and device-descriptor evidence".to_owned()),
            (false, true, true) => (Submitter::Mixed, "both Host-submission and AI-CPU-submission evidence".to_owned()),
            (true, true, false) => {
                (Submitter::Mixed, "both AI-CPU-submission and device-descriptor evidence".to_owned())
            }
            (true, true, true) => {
                (Submitter::Mixed, "Host-submission, AI-CPU-submission and device-descriptor evidence".to_owned())
            }
            (false, false, false) if kernel => (
                Submitter::Unknown,
                "device-kernel evidence (or a kernel launch) only: nothing shows who writes the descriptors and \
                 rings the doorbell"
                    .to_owned(),
            ),
            (false, false, false) if self.has(EvidenceClass::AiCpuKernel, Stance::Neutral) => (
                Submitter::Unknown,
                "an AI-CPU kernel only: nothing shows it writes the descriptors and rings the doorbell".to_owned(),
            ),
            (false, false, false) if self.counted.keys().any(|&(_, stance)| stance == Stance::Mentions) => (
                Submitter::Unknown,
                "no evidence either way: only names that mention a device word or an op, which are never evidence"
                    .to_owned(),
            ),
            (false, false, false) if self.commented > 0 => (
                Submitter::Unknown,
                "no evidence either way outside comments (comments alone never decide a verdict)".to_owned(),
            ),
            (false, false, false) => (Submitter::Unknown, "no evidence either way".to_owned()),
        };
        Component {
            name,
            kind,
            root: root.to_owned(),
            files_read,
            evidence: self.evidence,
            evidence_dropped: self.dropped,
            verdict,
            reason,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Names: the rules every scan applies to identifiers.

/// What a name (an identifier in source, a symbol, a string in a binary) says, if anything. `qualified` is the text
/// around it (the line, or the demangled symbol) for rules that need a qualifier.
fn classify_name(name: &str, qualified: &str) -> Option<(EvidenceClass, Check, &'static str)> {
    use EvidenceClass as C;
    // Host submission.
    if name.starts_with("aclrtMemcpy") {
        return Some((C::HostSubmission, Check::HostSubmission, "Host copy call (ACL runtime memcpy)"));
    }
    if name.starts_with("HixlCSClientBatchPut") || name.starts_with("HixlCSClientBatchGet") {
        return Some((C::HostSubmission, Check::HostSubmission, "HiXL client batch transfer call (a Host API)"));
    }
    if matches!(name, "HcclBatchPut" | "HcclBatchGet" | "HcclPut" | "HcclGet") || name.starts_with("hcclMemcpy") {
        return Some((C::HostSubmission, Check::HostSubmission, "HCCL memory-transport call"));
    }
    if matches!(name, "TransferSync" | "TransferAsync")
        && (qualified.contains("AdxlEngine") || qualified.contains("adxl::"))
    {
        return Some((C::HostSubmission, Check::HostSubmission, "ADXL engine transfer call (a Host API)"));
    }
    // Kernel launch (Host side of check 1).
    if is_launch_api(name) {
        return Some((C::KernelLaunch, Check::Kernel, "kernel launch / device binary load API"));
    }
    // Completion (check 4), before the descriptor rule: `poll_cq` names a CQ.
    if name == "wait_flag" || name.contains("WaitFlag") || name == "poll_cq" || name.contains("PollCq") {
        return Some((C::DeviceCompletion, Check::Completion, "polls a completion flag or CQ"));
    }
    // Descriptors (check 2).
    if ["Sqe", "SQE", "Wqe", "WQE", "Cqe", "CQE"].iter().any(|part| name.contains(part))
        || name.split('_').any(|part| matches!(part, "sqe" | "sqes" | "wqe" | "wqes" | "cqe" | "cqes"))
    {
        return Some((C::Descriptor, Check::Descriptors, "SQE/WQE/CQE descriptor structure"));
    }
    // Doorbell (check 3).
    if name.to_ascii_lowercase().contains("doorbell") || name == "sq_tail" || name == "db_reg" {
        return Some((C::Doorbell, Check::Doorbell, "doorbell write (doorbell / SQ tail register)"));
    }
    // The SHMEM device API (checks 2-3: the library's device code writes descriptors and rings doorbells).
    if name.starts_with("aclshmem") || name.starts_with("shmem_") {
        return Some((C::ShmemDeviceApi, Check::Descriptors, "SHMEM device API call"));
    }
    None
}

/// The launch and device-binary APIs, by the start of their names.
const LAUNCH_APIS: &[&str] = &["aclrtLaunchKernel", "aclrtBinaryLoad", "aclrtBinaryGetFunction", "rtKernelLaunch"];

fn is_launch_api(name: &str) -> bool {
    LAUNCH_APIS.iter().any(|api| name.starts_with(api))
}

/// The launch API a variable's name is made of (`pAclrtLaunchKernelWithConfig`, `g_rtKernelLaunch`), if any.
fn launch_api_in(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    LAUNCH_APIS.iter().copied().find(|api| lower.contains(&api.to_ascii_lowercase()))
}

/// Device-kernel markers of AscendC/CCE device code, as identifiers.
fn device_marker(name: &str) -> Option<&'static str> {
    match name {
        "__aicore__" => Some("`__aicore__` function qualifier"),
        "__gm__" => Some("`__gm__` global-memory qualifier"),
        "GetBlockIdx" => Some("`GetBlockIdx` (AIV block index)"),
        _ if name.starts_with("KERNEL_TYPE_") => Some("AscendC kernel-type marker"),
        _ if name.starts_with("__DAV_") => Some("CCE target marker (`__DAV_*`)"),
        _ => None,
    }
}

/// The identifiers of a line, `::`-qualified paths kept whole as well.
fn identifiers(line: &str) -> Vec<(&str, &str)> {
    // (identifier, the path it ends, e.g. `adxl::AdxlEngine::TransferSync`)
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut path_start: Option<usize> = None;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let begin = path_start.unwrap_or(start);
            out.push((&line[start..i], &line[begin..i]));
            if bytes.get(i) == Some(&b':') && bytes.get(i + 1) == Some(&b':') {
                path_start = Some(begin);
                i += 2;
            } else {
                path_start = None;
            }
        } else if c.is_ascii_digit() {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            path_start = None;
        } else {
            path_start = None;
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------------------------
// Source files.

struct SourceFile {
    /// The name shown in locations (relative to the root, or as given).
    shown: String,
    extension: String,
    text: String,
}

/// Macros some file defines as a device qualifier (`#define AIV_DEVICE_FN __aicore__ static inline`): their uses are
/// device-kernel markers too. Name -> where it is defined.
fn device_macros(files: &[SourceFile]) -> HashMap<String, String> {
    let mut macros = HashMap::new();
    for file in files {
        for (index, line) in file.text.lines().enumerate() {
            let Some(rest) = line.trim_start().strip_prefix('#') else { continue };
            let Some(rest) = rest.trim_start().strip_prefix("define") else { continue };
            let ids = identifiers(rest);
            let Some(&(name, _)) = ids.first() else { continue };
            if device_marker(name).is_none() && ids[1..].iter().any(|&(id, _)| device_marker(id).is_some()) {
                macros.entry(name.to_owned()).or_insert_with(|| format!("{}:{}", file.shown, index + 1));
            }
        }
    }
    macros
}

fn is_comment_line(line: &str, extension: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("//") || t.starts_with("/*") || t.starts_with('*') || (extension == "py" && t.starts_with('#'))
}

/// The device-kernel markers of one line outside the name rules: `AscendC::`, `kernel_operator.h`, `__global__`
/// next to aicore.
fn line_markers(line: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    if line.contains("AscendC::") {
        found.push("`AscendC::` API");
    }
    if line.contains("#include") && line.contains("kernel_operator.h") {
        found.push("includes the AscendC `kernel_operator.h`");
    }
    if line.contains("__global__") && line.contains("aicore") {
        found.push("`__global__` kernel entry on the aicore");
    }
    found
}

/// Whether `id` (a slice of `line`) is the name of a function defined on this line: a type before it, `(` after it,
/// and no `;` ending the line (`uint32_t HixlBatchPut(HixlOneSideOpParam *param) {`).
fn defines(line: &str, id: &str) -> bool {
    let start = id.as_ptr() as usize - line.as_ptr() as usize;
    let before = line[..start].trim_end();
    let after = line[start + id.len()..].trim_start();
    let typed = before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '*' || c == '&');
    let keyword = ["return", "else", "case"].iter().any(|k| before.ends_with(k));
    typed && !keyword && after.starts_with('(') && !line.trim_end().ends_with(';')
}

/// Why a source file is AI-CPU code, if it is: it lies beside an AI-CPU op registration, or it defines an AI-CPU op.
fn ai_cpu_code_of(file: &SourceFile, ops: &AiCpuOps) -> Option<String> {
    let dir = file.shown.rsplit_once('/').map_or("", |(dir, _)| dir);
    if let Some(at) = ops.dirs.get(dir) {
        return Some(format!("beside the AI-CPU op registration at {at}"));
    }
    for line in file.text.lines() {
        if is_comment_line(line, &file.extension) {
            continue;
        }
        for (id, _) in identifiers(line) {
            if ops.op(id).is_some() && defines(line, id) {
                return Some(format!("defines the AI-CPU op `{id}`"));
            }
        }
    }
    None
}

fn scan_source(file: &SourceFile, macros: &HashMap<String, String>, ops: &AiCpuOps, sink: &mut Sink) {
    let lines: Vec<&str> = file.text.lines().collect();
    // Device code: device-kernel markers outside comments.
    let device_code = lines.iter().any(|line| {
        !is_comment_line(line, &file.extension)
            && (!line_markers(line).is_empty()
                || identifiers(line).iter().any(|&(id, _)| device_marker(id).is_some() || macros.contains_key(id)))
    });
    // AI-CPU code: the sources of an AI-CPU kernel (device code wins: an AIV kernel is not an AI-CPU one).
    let ai_cpu_code = if device_code { None } else { ai_cpu_code_of(file, ops) };
    let mut polls = Vec::new();
    let mut dccis = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let in_comment = is_comment_line(line, &file.extension);
        let location = format!("{}:{}", file.shown, index + 1);
        let mut on_line = BTreeSet::new();
        let mut add = |sink: &mut Sink, class, check, what: String, stance| {
            if on_line.insert((class, what.clone())) {
                sink.push(Evidence {
                    class,
                    check,
                    for_or_against: stance,
                    what,
                    location: location.clone(),
                    in_comment,
                    in_device_code: device_code,
                    in_ai_cpu_code: ai_cpu_code.is_some(),
                });
            }
        };
        for marker in line_markers(line) {
            add(sink, EvidenceClass::DeviceKernel, Check::Kernel, marker.to_owned(), Stance::For);
        }
        let ids = identifiers(line);
        let lower = line.to_ascii_lowercase();
        if lower.contains("cqe") && (lower.contains("owner") || lower.contains("phase")) {
            let what = "polls a CQE's owner/phase bit".to_owned();
            let stance = if device_code { Stance::For } else { Stance::Neutral };
            add(sink, EvidenceClass::DeviceCompletion, Check::Completion, what, stance);
            polls.push(index);
        }
        for &(id, path) in &ids {
            if let Some(what) = device_marker(id) {
                add(sink, EvidenceClass::DeviceKernel, Check::Kernel, format!("{what}: `{id}`"), Stance::For);
            } else if let Some(defined) = macros.get(id) {
                let what = format!("`{id}`, a device qualifier (defined at {defined})");
                add(sink, EvidenceClass::DeviceKernel, Check::Kernel, what, Stance::For);
            } else if id == "dcci" {
                dccis.push(index);
            } else if let Some(op) = ops.op(id) {
                match &ai_cpu_code {
                    // An op's body: the file is the AI-CPU kernel's.
                    Some(_) if defines(line, id) => {
                        let what = format!("defines the AI-CPU op `{id}` in AI-CPU code: {}", op.describe());
                        add(sink, EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, what, op.stance());
                    }
                    // Its name elsewhere in its own kernel (a log message, a declaration): nothing more.
                    Some(_) => {}
                    None if in_comment => {
                        let what = format!("names the AI-CPU op `{id}` in a comment: a name only");
                        add(sink, EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, what, Stance::Mentions);
                    }
                    None => sink.pending_op(id, op, "its name in Host code".to_owned(), location.clone()),
                }
            } else if let Some((class, check, what)) = classify_name(id, if path.contains("::") { path } else { line })
            {
                let stance = match class {
                    EvidenceClass::HostSubmission => Stance::Against,
                    EvidenceClass::KernelLaunch => Stance::For,
                    _ if device_code => Stance::For,
                    // Descriptors written and doorbells rung by an AI-CPU kernel: against the AIV doing it.
                    EvidenceClass::Descriptor | EvidenceClass::Doorbell if ai_cpu_code.is_some() => Stance::Against,
                    _ => Stance::Neutral,
                };
                if class == EvidenceClass::DeviceCompletion {
                    polls.push(index);
                }
                let shown = if path.contains("::") { path } else { id };
                let what = match (&ai_cpu_code, stance) {
                    (Some(why), Stance::Against) if class != EvidenceClass::HostSubmission => {
                        format!("{what} in AI-CPU code (this file {why}): `{shown}`")
                    }
                    _ => format!("{what}: `{shown}`"),
                };
                add(sink, class, check, what, stance);
            }
        }
    }
    // `dcci` near a poll: the cache maintenance that makes the polled word's new value visible.
    for &index in &dccis {
        if let Some(&poll) = polls.iter().find(|&&p| p.abs_diff(index) <= DCCI_NEAR_LINES) {
            let in_comment = is_comment_line(lines[index], &file.extension);
            sink.push(Evidence {
                class: EvidenceClass::DeviceCompletion,
                check: Check::Completion,
                for_or_against: if device_code { Stance::For } else { Stance::Neutral },
                what: format!("`dcci` cache maintenance near the poll at line {}", poll + 1),
                location: format!("{}:{}", file.shown, index + 1),
                in_comment,
                in_device_code: device_code,
                in_ai_cpu_code: ai_cpu_code.is_some(),
            });
        }
    }
}

/// A source tree: files grouped by their first three path segments relative to the root.
fn inspect_tree(root: &Path, given: &AiCpuOps, report: &mut InspectReport) {
    let shown_root = root.display().to_string();
    let mut groups: BTreeMap<String, Vec<SourceFile>> = BTreeMap::new();
    // AI-CPU op registrations, by group: (file shown, its entries).
    let mut registrations: BTreeMap<String, Vec<(String, Vec<Registration>)>> = BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) => {
                problem(report, dir.display().to_string(), format!("unreadable directory: {e}"));
                continue;
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_symlink() {
                continue;
            }
            if kind.is_dir() {
                let skipped = matches!(name.as_str(), "target" | ".git" | "node_modules") || name.contains("venv");
                if !skipped && depth < MAX_DEPTH {
                    stack.push((path, depth + 1));
                }
                continue;
            }
            let extension = extension_of(&path);
            let source = SOURCE_EXTENSIONS.contains(&extension.as_str());
            let registration = REGISTRATION_EXTENSIONS.contains(&extension.as_str());
            if !kind.is_file() || !(source || registration) {
                continue;
            }
            let relative = path.strip_prefix(root).unwrap_or(&path);
            let segments: Vec<String> =
                relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            let text = match read_source(&path, len) {
                Ok(Some(text)) => text,
                Ok(None) => continue,
                Err(e) => {
                    problem(report, path.display().to_string(), format!("unreadable: {e}"));
                    continue;
                }
            };
            let group = segments.iter().take(3).cloned().collect::<Vec<_>>().join("/");
            let shown = segments.join("/");
            if source {
                groups.entry(group).or_default().push(SourceFile { shown, extension, text });
            } else {
                let found = parse_registrations(&shown, &extension, &text);
                if !found.is_empty() {
                    registrations.entry(group).or_default().push((shown, found));
                }
            }
        }
    }
    // Device-qualifier macros and AI-CPU op registrations are taken from the whole tree: a kernel uses the qualifier
    // its platform header defines, and a Host file launches the ops another directory registers.
    let mut macros = HashMap::new();
    for files in groups.values() {
        for (name, at) in device_macros(files) {
            macros.entry(name).or_insert(at);
        }
    }
    let mut ops = given.clone();
    for entries in registrations.values() {
        for (shown, found) in entries {
            ops.add(shown, found.clone());
        }
    }
    for group in registrations.keys() {
        groups.entry(group.clone()).or_default();
    }
    for (group, mut files) in groups {
        files.sort_by(|a, b| a.shown.cmp(&b.shown));
        let mut sink = Sink::default();
        let mut read = files.len();
        for (_, found) in registrations.get(&group).map(Vec::as_slice).unwrap_or_default() {
            read += 1;
            for registration in found {
                sink.push(registration_evidence(registration, &ops));
            }
        }
        for file in &files {
            scan_source(file, &macros, &ops, &mut sink);
        }
        report.components.push(sink.finish(group, ComponentKind::SourceTree, &shown_root, read));
    }
}

// ---------------------------------------------------------------------------------------------------------------
// ELF files.

/// The name to match for a symbol: demangled when it is a C++ name.
fn demangle(name: &str) -> String {
    if name.starts_with("_Z") {
        if let Ok(symbol) = cpp_demangle::Symbol::new(name.as_bytes()) {
            if let Ok(text) = symbol.demangle() {
                return text;
            }
        }
    }
    name.to_owned()
}

/// A symbol that is never evidence: a C++ guard variable, vtable, VTT, typeinfo or typeinfo name, or a thread-local
/// wrapper. Their names repeat a class's or variable's name (`guard variable for ock::mf::env::ASCEND_HOME_PATH`),
/// and none of them is a device object.
fn is_cxx_runtime_symbol(raw: &str, demangled: &str) -> bool {
    ["_ZGV", "_ZTV", "_ZTT", "_ZTI", "_ZTS", "_ZTC", "_ZTH", "_ZTW"].iter().any(|prefix| raw.starts_with(prefix))
        || ["guard variable for ", "vtable for ", "VTT for ", "typeinfo for ", "typeinfo name for ", "{vtable("]
            .iter()
            .any(|prefix| demangled.starts_with(prefix))
}

/// The function's or variable's own name in a (demangled) symbol: the last identifier before the parameter list.
fn own_name(demangled: &str) -> &str {
    let head = demangled.split('(').next().unwrap_or(demangled);
    identifiers(head).last().map(|&(id, _)| id).unwrap_or(head)
}

/// The name rules applied to one (possibly demangled) symbol name of a device object: each identifier of it.
fn classify_symbol(demangled: &str) -> Option<(EvidenceClass, Check, &'static str)> {
    let ids = identifiers(demangled);
    let head = demangled.split('(').next().unwrap_or(demangled);
    classify_name(own_name(demangled), head).or_else(|| {
        // Device objects' symbols: any part of the name (a kernel's local structures, e.g. `CopySqe::fill`).
        ids.iter().find_map(|&(id, _)| {
            classify_name(id, head).filter(|(c, _, _)| !matches!(c, EvidenceClass::HostSubmission))
        })
    })
}

/// The symbol rule for a Host ELF: the function's own name, with its qualifier for ADXL's methods.
fn classify_name_of_symbol(demangled: &str) -> Option<(EvidenceClass, Check, &'static str)> {
    let head = demangled.split('(').next().unwrap_or(demangled);
    classify_name(own_name(demangled), head)
}

fn inspect_elf(data: &[u8], file_name: Option<&str>, ops: &AiCpuOps, sink: &mut Sink) -> Result<(), String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    if file.format() != object::BinaryFormat::Elf {
        return Err("not an ELF file".to_owned());
    }
    let own_machine = elf_machine(data);
    let own_shown = own_machine.map_or_else(|| "unknown".to_owned(), |m| format!("{m:#06x}"));
    // The file itself a device object: an ELF for the NPU's machine (a kernel object given or shipped as a file).
    let npu = own_machine == Some(NPU_ELF_MACHINE);
    if npu {
        sink.push_once(
            Evidence::new(
                EvidenceClass::DeviceKernel,
                Check::Kernel,
                Stance::For,
                format!(
                    "this file is an ELF for machine {NPU_ELF_MACHINE:#06x} (EM_HIIPU, the NPU's AI Core): a device \
                     object, so its symbols and strings are device code"
                ),
                format!("ELF header (e_machine {NPU_ELF_MACHINE:#06x})"),
            )
            .device(),
        );
    }
    // An AI-CPU kernel .so: the kernelSo an op registration names, or the file that holds an AI-CPU op's body.
    let mut ai_cpu = false;
    if !npu {
        if let Some(registration) = file_name.and_then(|name| ops.kernel_so(name)) {
            ai_cpu = true;
            let what = format!(
                "this file is `{}`, the kernelSo of the AI-CPU op `{}` registered at {}: an AI-CPU kernel .so, so \
                 its descriptor and doorbell names are AI-CPU code",
                registration.kernel_so, registration.op, registration.at
            );
            let location = format!("file name {}", registration.kernel_so);
            sink.push_once(
                Evidence::new(EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, Stance::Neutral, what, location)
                    .ai_cpu(),
            );
        }
        for (table, symbols) in [(".dynsym", file.dynamic_symbols()), (".symtab", file.symbols())] {
            for symbol in symbols {
                let Ok(raw) = symbol.name() else { continue };
                let text = symbol.kind() == object::SymbolKind::Text;
                if symbol.is_undefined() || !text || raw.is_empty() || !ops.named_in(raw) {
                    continue;
                }
                let name = demangle(raw);
                let own = own_name(&name);
                let Some(op) = ops.op(own) else { continue };
                ai_cpu = true;
                let what = format!(
                    "defines the AI-CPU op `{own}` (a function symbol): this file holds the op's body, an AI-CPU \
                     kernel .so; {}",
                    op.describe()
                );
                let location = format!("symbol {raw} ({table})");
                sink.push_once(
                    Evidence::new(EvidenceClass::AiCpuKernel, Check::AiCpuSubmission, op.stance(), what, location)
                        .ai_cpu(),
                );
            }
        }
    }
    // Symbols: imports (undefined) and definitions, from .dynsym and .symtab.
    // A name in both tables is reported once, from .dynsym.
    let mut named = BTreeSet::new();
    for (table, symbols) in [(".dynsym", file.dynamic_symbols()), (".symtab", file.symbols())] {
        for symbol in symbols {
            let Ok(raw) = symbol.name() else { continue };
            if raw.is_empty() || (!named.insert((raw, symbol.is_undefined())) && table == ".symtab") {
                continue;
            }
            let name = demangle(raw);
            if is_cxx_runtime_symbol(raw, &name) {
                continue;
            }
            let undefined = symbol.is_undefined();
            let location = format!("symbol {raw} ({table}{})", if undefined { ", undefined" } else { "" });
            let base = name.split('(').next().unwrap_or(&name).to_owned();
            if npu {
                if let Some((class, check, what)) = classify_symbol(&name) {
                    let stance = if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                    let what = format!("{what}: symbol `{base}` of this device object");
                    sink.push_once(Evidence::new(class, check, stance, what, location).device());
                }
                continue;
            }
            let own = own_name(&name);
            if let Some(op) = ops.op(own) {
                if undefined || symbol.kind() != object::SymbolKind::Text {
                    let verb = if undefined { "imports" } else { "defines" };
                    sink.pending_op(own, op, format!("{verb} a symbol of that name"), location);
                }
                continue;
            }
            let data_variable = !undefined && symbol.kind() == object::SymbolKind::Data;
            if data_variable {
                if let Some(api) = launch_api_in(own) {
                    let what = format!(
                        "a variable named after the launch API `{api}*`: `{base}` (by its name a function pointer \
                         filled at run time; a variable is neither a launch nor a device object)"
                    );
                    let item =
                        Evidence::new(EvidenceClass::KernelLaunch, Check::Kernel, Stance::Mentions, what, location);
                    sink.push_once(item);
                    continue;
                }
            }
            let classified = classify_name_of_symbol(&name).filter(|(class, _, _)| {
                !(data_variable && matches!(class, EvidenceClass::HostSubmission | EvidenceClass::KernelLaunch))
            });
            if let Some((class, check, what)) = classified {
                let stance = match class {
                    EvidenceClass::HostSubmission => Stance::Against,
                    EvidenceClass::KernelLaunch => Stance::For,
                    EvidenceClass::Descriptor | EvidenceClass::Doorbell if ai_cpu => Stance::Against,
                    _ => Stance::Neutral, // a descriptor or doorbell name in Host code does not count
                };
                let verb = if undefined { "imports" } else { "defines" };
                let what = if ai_cpu && stance == Stance::Against && class != EvidenceClass::HostSubmission {
                    format!("{what} in an AI-CPU kernel .so: {verb} `{base}`")
                } else {
                    format!("{what}: {verb} `{base}`")
                };
                let mut item = Evidence::new(class, check, stance, what, location);
                item.in_ai_cpu_code = ai_cpu;
                sink.push_once(item);
            } else if data_variable && mentions_device(&name) {
                let what = format!(
                    "a data variable whose name mentions ascend, aicore or kernel: `{base}` (a name, not a device \
                     object: no device ELF header is there)"
                );
                sink.push_once(Evidence::new(
                    EvidenceClass::DeviceKernel,
                    Check::Kernel,
                    Stance::Mentions,
                    what,
                    location,
                ));
            }
        }
    }
    // Sections: embedded ELF images (a device object is one for the NPU's machine), names of sections, and the
    // names a binary looks up at run time (strings of its read-only data).
    let mut embedded = 0usize;
    for section in file.sections() {
        let name = section.name().unwrap_or("").to_owned();
        let Ok(bytes) = section.data() else { continue };
        if mentions_device(&name) && !bytes.starts_with(b"\x7fELF") {
            let what = format!(
                "a section whose name mentions ascend, aicore or kernel: `{name}` (a name only: its bytes start with \
                 no ELF header, so it is not counted as a device object)"
            );
            let location = format!("section {name}");
            sink.push_once(Evidence::new(EvidenceClass::DeviceKernel, Check::Kernel, Stance::Mentions, what, location));
        }
        if section.kind() == object::SectionKind::Text {
            continue;
        }
        let read_only =
            matches!(section.kind(), object::SectionKind::ReadOnlyData | object::SectionKind::ReadOnlyString);
        if npu && (read_only || section.kind() == object::SectionKind::Data) {
            scan_device_blob(bytes, &format!("section {name}"), sink);
        }
        let mut at = 0;
        while embedded < MAX_EMBEDDED {
            let Some(found) = find(&bytes[at..], b"\x7fELF") else { break };
            let offset = at + found;
            at = offset + 4;
            let image = &bytes[offset..];
            let Some(machine) = elf_machine(image) else { continue };
            embedded += 1;
            if Some(machine) == own_machine {
                continue;
            }
            let location = format!("section {name} at offset {offset:#x}");
            if machine != NPU_ELF_MACHINE {
                let aarch64 = if machine == AICPU_ELF_MACHINE {
                    " (AArch64: the machine the Ascend runtime loads as AI-CPU kernels, and a Host library's too)"
                } else {
                    ""
                };
                let what = format!(
                    "embedded ELF for machine {machine:#06x}{aarch64} at offset {offset:#x} in {name}, not this \
                     file's machine {own_shown}: an image for another processor, not the NPU's \
                     {NPU_ELF_MACHINE:#06x}, so not counted as a device object"
                );
                sink.push_once(Evidence::new(
                    EvidenceClass::DeviceKernel,
                    Check::Kernel,
                    Stance::Mentions,
                    what,
                    location,
                ));
                continue;
            }
            let what = format!(
                "embedded ELF for machine {NPU_ELF_MACHINE:#06x} (EM_HIIPU, the NPU's AI Core) at offset {offset:#x} \
                 in {name}: a device object, so its symbols and strings are device code"
            );
            sink.push_once(
                Evidence::new(EvidenceClass::DeviceKernel, Check::Kernel, Stance::For, what, location.clone()).device(),
            );
            if let Ok(inner) = object::File::parse(image) {
                for symbol in inner.symbols().chain(inner.dynamic_symbols()) {
                    let Ok(raw) = symbol.name() else { continue };
                    let demangled = demangle(raw);
                    if let Some((class, check, what)) = classify_symbol(&demangled) {
                        let stance = if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                        let what = format!("{what}: symbol `{demangled}` of the embedded device object");
                        let location = format!("{location}, symbol {raw}");
                        sink.push_once(Evidence::new(class, check, stance, what, location).device());
                    }
                }
            }
            scan_device_blob(image, &location, sink);
        }
        if !npu && read_only {
            for (offset, text) in strings(bytes) {
                let location = format!("section {name} at offset {offset:#x}");
                if text.contains("op_impl/aicpu") {
                    let what = format!(
                        "a path into the runtime's AI-CPU op directory: `{text}` (it loads an AI-CPU kernel's \
                         registration; nothing here shows what that kernel does)"
                    );
                    let item = Evidence::new(
                        EvidenceClass::AiCpuKernel,
                        Check::AiCpuSubmission,
                        Stance::Neutral,
                        what,
                        location.clone(),
                    );
                    sink.push_once(if ai_cpu { item.ai_cpu() } else { item });
                }
                for (id, path) in identifiers(text) {
                    if let Some(op) = ops.op(id) {
                        if !ai_cpu {
                            sink.pending_op(id, op, format!("its name as a string in {name}"), location.clone());
                        }
                        continue;
                    }
                    let Some((class, check, what)) = classify_name(id, path) else { continue };
                    let item = match class {
                        EvidenceClass::HostSubmission | EvidenceClass::KernelLaunch => {
                            let stance =
                                if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                            let what = format!("{what}: string `{id}` (a name looked up at run time, or a message)");
                            Evidence::new(class, check, stance, what, location.clone())
                        }
                        EvidenceClass::Descriptor | EvidenceClass::Doorbell if ai_cpu => {
                            let what = format!("{what} in an AI-CPU kernel .so: string `{id}`");
                            Evidence::new(class, check, Stance::Against, what, location.clone()).ai_cpu()
                        }
                        _ => continue,
                    };
                    sink.push_once(item);
                }
            }
        }
    }
    Ok(())
}

/// Strings of a device object, by the name rules: all of them count as device code.
fn scan_device_blob(bytes: &[u8], location: &str, sink: &mut Sink) {
    for (offset, text) in strings(bytes) {
        for (id, path) in identifiers(text) {
            if let Some((class, check, what)) = classify_name(id, path) {
                let stance = if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                let what = format!("{what}: `{id}` in a device object");
                let location = format!("{location}, string at offset {offset:#x}");
                sink.push_once(Evidence::new(class, check, stance, what, location).device());
            }
        }
    }
}

fn mentions_device(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    ["ascend", "aicore", "kernel"].iter().any(|word| lower.contains(word))
}

/// The e_machine of an ELF header at the start of `data`, read by `object`.
fn elf_machine(data: &[u8]) -> Option<u16> {
    use object::read::elf::FileHeader;
    match object::FileKind::parse(data).ok()? {
        object::FileKind::Elf32 => {
            let header = object::elf::FileHeader32::<object::Endianness>::parse(data).ok()?;
            Some(header.e_machine(header.endian().ok()?).0)
        }
        object::FileKind::Elf64 => {
            let header = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
            Some(header.e_machine(header.endian().ok()?).0)
        }
        _ => None,
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// Printable ASCII runs of at least 4 bytes, with their offsets.
fn strings(bytes: &[u8]) -> impl Iterator<Item = (usize, &str)> {
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < bytes.len() {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_graphic() || bytes[i] == b' ') {
                i += 1;
            }
            if i - start >= 4 {
                // Printable ASCII is valid UTF-8.
                let text = std::str::from_utf8(&bytes[start..i]).unwrap_or("");
                i += 1;
                return Some((start, text));
            }
            i += 1;
        }
        None
    })
}

// ---------------------------------------------------------------------------------------------------------------
// Wheels.

fn inspect_wheel(path: &Path, given: &AiCpuOps, report: &mut InspectReport) {
    let shown = path.display().to_string();
    let wheel = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| shown.clone());
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) => return problem(report, shown, format!("unreadable: {e}")),
    };
    let mut archive = match zip::ZipArchive::new(std::io::BufReader::new(file)) {
        Ok(archive) => archive,
        Err(e) => return problem(report, shown, format!("not a readable zip archive (wheel): {e}")),
    };
    let mut read = 0u64;
    // First the AI-CPU op registrations: the ELF members and sources are read knowing them.
    let mut ops = given.clone();
    let mut registrations: Vec<(String, Vec<Registration>)> = Vec::new();
    for index in 0..archive.len() {
        let Ok(mut entry) = archive.by_index(index) else { continue };
        let inner = entry.name().to_owned();
        let extension = extension_of(Path::new(&inner));
        if entry.is_dir() || !REGISTRATION_EXTENSIONS.contains(&extension.as_str()) || entry.size() > MAX_SOURCE_BYTES {
            continue;
        }
        let mut data = Vec::new();
        if let Err(e) = (&mut entry).take(MAX_SOURCE_BYTES + 1).read_to_end(&mut data) {
            problem(report, format!("{wheel}!{inner}"), format!("unreadable zip entry: {e}"));
            continue;
        }
        read += data.len() as u64;
        if let Some(text) = text_of(data) {
            let found = parse_registrations(&inner, &extension, &text);
            if !found.is_empty() {
                ops.add(&inner, found.clone());
                registrations.push((inner, found));
            }
        }
    }
    let mut sources = Vec::new();
    for index in 0..archive.len() {
        if read >= MAX_WHEEL_BYTES {
            let left = archive.len() - index;
            problem(report, shown.clone(), format!("{left} members not read: over {MAX_WHEEL_BYTES} bytes read"));
            break;
        }
        let mut entry = match archive.by_index(index) {
            Ok(entry) => entry,
            Err(e) => {
                problem(report, format!("{wheel}!#{index}"), format!("unreadable zip entry: {e}"));
                continue;
            }
        };
        if entry.is_dir() {
            continue;
        }
        let inner = entry.name().to_owned();
        let member = format!("{wheel}!{inner}");
        let extension = extension_of(Path::new(&inner));
        if REGISTRATION_EXTENSIONS.contains(&extension.as_str()) {
            continue;
        }
        let mut data = Vec::new();
        if SOURCE_EXTENSIONS.contains(&extension.as_str()) {
            if entry.size() > MAX_SOURCE_BYTES {
                continue;
            }
            if let Err(e) = (&mut entry).take(MAX_SOURCE_BYTES + 1).read_to_end(&mut data) {
                problem(report, member, format!("unreadable zip entry: {e}"));
                continue;
            }
            read += data.len() as u64;
            if let Some(text) = text_of(data) {
                sources.push(SourceFile { shown: inner, extension, text });
            }
            continue;
        }
        let mut head = [0u8; 4];
        match read_up_to(&mut entry, &mut head) {
            Ok(4) if head == *b"\x7fELF" => {}
            Ok(_) => continue,
            Err(e) => {
                problem(report, member, format!("unreadable zip entry: {e}"));
                continue;
            }
        }
        data.extend_from_slice(&head);
        if let Err(e) = (&mut entry).take(MAX_BINARY_BYTES - 4).read_to_end(&mut data) {
            problem(report, member, format!("unreadable zip entry: {e}"));
            continue;
        }
        read += data.len() as u64;
        let mut sink = Sink::default();
        let file_name = inner.rsplit('/').next();
        match inspect_elf(&data, file_name, &ops, &mut sink) {
            Ok(()) => report.components.push(sink.finish(member, ComponentKind::WheelElf, &shown, 0)),
            Err(e) => problem(report, member, format!("malformed ELF: {e}")),
        }
    }
    if !sources.is_empty() || !registrations.is_empty() {
        let macros = device_macros(&sources);
        let mut sink = Sink::default();
        for (_, found) in &registrations {
            for registration in found {
                sink.push(registration_evidence(registration, &ops));
            }
        }
        for file in &sources {
            scan_source(file, &macros, &ops, &mut sink);
        }
        report.components.push(sink.finish(
            format!("{wheel}!sources"),
            ComponentKind::WheelSources,
            &shown,
            sources.len() + registrations.len(),
        ));
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The text a human reads.

/// Evidence lines shown per check and component in [`InspectReport::render`] (the JSON has them all).
const RENDER_PER_CHECK: usize = 12;
/// One finding in one file, as [`InspectReport::render`] groups items: stance, in a comment, what, file.
type Finding<'a> = (Stance, bool, &'a str, &'a str);

/// Line numbers shown per finding and file.
const RENDER_LINES: usize = 8;

impl InspectReport {
    /// The component of that name, if any.
    pub fn component(&self, name: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.name == name)
    }

    /// The report as Markdown: per component the verdict, the reason and the evidence grouped by check; components
    /// with no evidence in one line; the problems; the caveat.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# aiv audit --inspect ({INSPECT_SCHEMA})\n");
        let _ = writeln!(out, "Inputs: {}\n", self.inputs.join(", "));
        if self.components.is_empty() {
            let _ = writeln!(out, "No components found.\n");
        }
        let mut empty = Vec::new();
        for component in &self.components {
            if component.evidence.is_empty() {
                empty.push(component.name.as_str());
                continue;
            }
            let _ = writeln!(out, "## {} ({}): {}\n", component.name, component.kind.label(), component.verdict);
            let _ = writeln!(out, "Reason: {}.", component.reason);
            if component.files_read > 0 {
                let _ = writeln!(out, "Files read: {}.", component.files_read);
            }
            for check in Check::ALL {
                let mut items: Vec<&Evidence> = component.evidence.iter().filter(|e| e.check == check).collect();
                if items.is_empty() {
                    continue;
                }
                // Counted items first, then context, then names, then comments; the same finding in one file on one
                // line.
                items.sort_by_key(|e| {
                    (e.in_comment, matches!(e.for_or_against, Stance::Neutral | Stance::Mentions), e.for_or_against)
                });
                let mut groups: Vec<(Finding, Vec<&str>)> = Vec::new();
                for item in &items {
                    let (file, line) = match item.location.rsplit_once(':') {
                        Some((file, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => {
                            (file, Some(line))
                        }
                        _ => (item.location.as_str(), None),
                    };
                    let key = (item.for_or_against, item.in_comment, item.what.as_str(), file);
                    match groups.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, lines)) => lines.extend(line),
                        None => groups.push((key, line.into_iter().collect())),
                    }
                }
                let _ = writeln!(out, "\n### {}\n", check.title());
                for ((stance, in_comment, what, file), lines) in groups.iter().take(RENDER_PER_CHECK) {
                    let stance = match stance {
                        Stance::For => "for",
                        Stance::Against => "against",
                        Stance::Neutral => "context (not counted)",
                        Stance::Mentions => "mentions only (a name, not counted)",
                    };
                    let comment = if *in_comment { ", comment only (not counted)" } else { "" };
                    let mut at = file.to_string();
                    if !lines.is_empty() {
                        let shown: Vec<&str> = lines.iter().take(RENDER_LINES).copied().collect();
                        let _ = write!(at, ":{}", shown.join(", "));
                        if lines.len() > RENDER_LINES {
                            let _ = write!(at, " and {} more lines", lines.len() - RENDER_LINES);
                        }
                    }
                    let _ = writeln!(out, "- {stance}{comment}: {what} at {at}");
                }
                if groups.len() > RENDER_PER_CHECK {
                    let _ = writeln!(out, "- ... and {} more (--json lists them all)", groups.len() - RENDER_PER_CHECK);
                }
            }
            if component.evidence_dropped > 0 {
                let _ = writeln!(
                    out,
                    "\n{} more evidence items were dropped past the limit of {MAX_EVIDENCE} per component.",
                    component.evidence_dropped
                );
            }
            out.push('\n');
        }
        if !empty.is_empty() {
            let _ = writeln!(out, "## No evidence either way (unknown)\n\n{}\n", empty.join(", "));
        }
        if !self.problems.is_empty() {
            let _ = writeln!(out, "## Not inspected\n");
            for p in &self.problems {
                let _ = writeln!(out, "- {}: {}", p.path, p.problem);
            }
            out.push('\n');
        }
        let _ = writeln!(out, "## Caveat\n\n{}", self.caveat);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_are_read_from_ini_and_json() {
        let ini = "[HixlBatchPut]\nopInfo.opKernelLib=AICPUKernel\nopInfo.kernelSo=libcann_hixl_kernel.so\n\
                   opInfo.functionName=HixlBatchPut\n\n[NotAicpu]\nopInfo.opKernelLib=TBEKernel\n";
        let found = parse_registrations("ops/k.ini", "ini", ini);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].op.as_str(), found[0].function.as_str()), ("HixlBatchPut", "HixlBatchPut"));
        assert_eq!((found[0].kernel_so.as_str(), found[0].at.as_str()), ("libcann_hixl_kernel.so", "ops/k.ini:1"));
        let json = "{\n  \"Other\": {\"opInfo\": {\"opKernelLib\": \"TBEKernel\"}},\n  \"HybmBatchRead\": {\n    \
                    \"opInfo\": {\"functionName\": \"HybmBatchRead\", \"kernelSo\": \"libk.so\", \
                    \"opKernelLib\": \"AICPUKernel\"}\n  }\n}\n";
        let found = parse_registrations("k.json", "json", json);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].op.as_str(), found[0].at.as_str()), ("HybmBatchRead", "k.json:3"));
        assert!(parse_registrations("x.json", "json", "{\"a\": 1}").is_empty());
        assert!(parse_registrations("x.json", "json", "not json AICPUKernel").is_empty());
    }

    #[test]
    fn a_definition_is_told_from_a_call_and_a_declaration() {
        let check = |line: &str, name: &str| {
            let id = identifiers(line).into_iter().map(|(id, _)| id).find(|&id| id == name).expect("the name");
            defines(line, id)
        };
        assert!(check("uint32_t HixlBatchPut(HixlOneSideOpParam *param) {", "HixlBatchPut"));
        assert!(check("extern \"C\" unsigned *HixlBatchGet(", "HixlBatchGet"));
        assert!(!check("uint32_t HixlBatchPut(HixlOneSideOpParam *param);", "HixlBatchPut"));
        assert!(!check("    ret = HybmBatchRead(&readParam);", "HybmBatchRead"));
        assert!(!check("    return HybmBatchRead(param)", "HybmBatchRead"));
        assert!(!check("constexpr const char *kPut = \"HixlBatchPut\";", "HixlBatchPut"));
    }

    #[test]
    fn cxx_runtime_symbols_and_names_are_told_apart() {
        for raw in ["_ZGVN3ock2mf3env16ASCEND_HOME_PATHE", "_ZTVN8mooncake21AscendDirectTransportE", "_ZTSN1a1bE"] {
            assert!(is_cxx_runtime_symbol(raw, &demangle(raw)), "{raw}");
        }
        assert!(!is_cxx_runtime_symbol("_ZN3ock2mf3env16ASCEND_HOME_PATHE", "ock::mf::env::ASCEND_HOME_PATH"));
        assert_eq!(launch_api_in("pAclrtLaunchKernelWithConfig"), Some("aclrtLaunchKernel"));
        assert_eq!(launch_api_in("gAscendAclLibName"), None);
        assert_eq!(own_name("ock::mf::DlAclApi::pAclrtBinaryGetFunction"), "pAclrtBinaryGetFunction");
    }
}
