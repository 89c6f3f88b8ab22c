//! `aiv audit --inspect PATH...`: static inspection of wheels, ELF files and source trees for the four checks of AIV
//! direct-drive (a kernel on the AIV cores, descriptors written by the kernel, the doorbell rung by the kernel,
//! completion observed on the Device), with the evidence for and against each and a verdict per component
//! (docs/inspect.md).
//!
//! Self-contained: std, serde, `object` (ELF), `cpp_demangle` (C++ names) and `zip` (wheels) only. What a vendor
//! library does inside a call is outside what this can see, and a verdict from inspection is not an observation of a
//! run: [`CAVEAT`] says so in every report.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection, ObjectSymbol};
use serde::{Deserialize, Serialize};

/// The `schema` of an [`InspectReport`].
pub const INSPECT_SCHEMA: &str = "aiv-inspect/1";

/// The standing caveat of every report.
pub const CAVEAT: &str = "Static inspection sees names, markers and structures in files; what a closed-source \
vendor library does inside a call (whether it writes descriptors or rings a doorbell from the Host or from the \
Device) is outside what it can see. A verdict from inspection is not an observation of a run: the audit's run \
verdicts come from the evidence its transfers recorded.";

/// At most this much of one binary (an ELF file, or an ELF inside a wheel) is read.
pub const MAX_BINARY_BYTES: u64 = 64 << 20;
/// Source files larger than this are skipped.
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
    /// The Python/C/C++ sources of a wheel, together.
    WheelSources,
    /// An ELF file given as a path.
    Elf,
    /// A group of source files of a tree (or a single source file given as a path).
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

/// The verdict on one component.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Verdict {
    #[serde(rename = "AIV-direct")]
    AivDirect,
    #[serde(rename = "Host-submitted")]
    HostSubmitted,
    #[serde(rename = "undetermined")]
    Undetermined,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::AivDirect => "AIV-direct",
            Verdict::HostSubmitted => "Host-submitted",
            Verdict::Undetermined => "undetermined",
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
    /// Source files read for it (0 for an ELF).
    pub files_read: usize,
    pub evidence: Vec<Evidence>,
    /// Evidence items past [`MAX_EVIDENCE`], not kept.
    pub evidence_dropped: usize,
    pub verdict: Verdict,
    pub reason: String,
}

/// Which check an item bears on: 1 to 4, or `"host_submission"` (against checks 2 to 4).
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
    /// Host submission of the copies: against checks 2 to 4.
    HostSubmission,
}

impl Check {
    const ALL: [Check; 5] =
        [Check::Kernel, Check::Descriptors, Check::Doorbell, Check::Completion, Check::HostSubmission];

    fn title(self) -> &'static str {
        match self {
            Check::Kernel => "check 1: a kernel runs on the AIV cores",
            Check::Descriptors => "check 2: the kernel writes the DMA descriptors itself",
            Check::Doorbell => "check 3: the kernel rings the doorbell itself",
            Check::Completion => "check 4: completion is observed on the Device",
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
            Raw::Text(text) if text == "host_submission" => Ok(Check::HostSubmission),
            _ => Err(serde::de::Error::custom("check: 1 to 4 or \"host_submission\"")),
        }
    }
}

/// Whether an item speaks for the check, against it, or is only context (a descriptor or doorbell name in Host code,
/// which does not count).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Stance {
    For,
    Against,
    Neutral,
}

/// The class of an item.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceClass {
    /// AscendC/CCE markers in source; an embedded device object in a binary.
    DeviceKernel,
    /// A kernel-launch API (`aclrtLaunchKernel*`, `aclrtBinaryLoad*`, `rtKernelLaunch*`).
    KernelLaunch,
    /// SQE/WQE/CQE structures.
    Descriptor,
    /// Doorbell writes.
    Doorbell,
    /// The SHMEM device API.
    ShmemDeviceApi,
    /// Flag or CQE polling, `dcci` near polling.
    DeviceCompletion,
    /// A Host copy or transfer call.
    HostSubmission,
}

/// One item of evidence.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Evidence {
    pub class: EvidenceClass,
    pub check: Check,
    pub for_or_against: Stance,
    /// What was found.
    pub what: String,
    /// `file:line`, or `symbol NAME (...)`, or `section NAME`.
    pub location: String,
    /// Found only on a comment line: reported, never counted for a verdict.
    pub in_comment: bool,
    /// Found in device code (a source file with device-kernel markers outside comments, or an embedded device
    /// object).
    pub in_device_code: bool,
}

/// Inspects every path: wheels, ELF files, source trees and single source files. A path that does not exist, and a
/// file that cannot be read or parsed, is a [`Problem`] of the report, never a panic.
pub fn inspect(paths: &[PathBuf]) -> InspectReport {
    let mut report = InspectReport {
        schema: INSPECT_SCHEMA.to_owned(),
        inputs: paths.iter().map(|p| p.display().to_string()).collect(),
        components: Vec::new(),
        problems: Vec::new(),
        caveat: CAVEAT.to_owned(),
    };
    for path in paths {
        inspect_path(path, &mut report);
    }
    report
}

fn problem(report: &mut InspectReport, path: impl Into<String>, what: impl Into<String>) {
    report.problems.push(Problem { path: path.into(), problem: what.into() });
}

fn inspect_path(path: &Path, report: &mut InspectReport) {
    let shown = path.display().to_string();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return problem(report, shown, "does not exist"),
        Err(e) => return problem(report, shown, format!("unreadable: {e}")),
    };
    if meta.is_dir() {
        return inspect_tree(path, report);
    }
    let mut head = [0u8; 4];
    let got = match std::fs::File::open(path).and_then(|mut f| read_up_to(&mut f, &mut head)) {
        Ok(got) => got,
        Err(e) => return problem(report, shown, format!("unreadable: {e}")),
    };
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    if got == 4 && head == *b"\x7fELF" {
        match read_bounded(path, MAX_BINARY_BYTES) {
            Ok(data) => {
                let mut sink = Sink::default();
                match inspect_elf(&data, &mut sink) {
                    Ok(()) => report.components.push(sink.finish(shown.clone(), ComponentKind::Elf, &shown, 0)),
                    Err(e) => problem(report, shown, format!("malformed ELF: {e}")),
                }
            }
            Err(e) => problem(report, shown, format!("unreadable: {e}")),
        }
    } else if extension == "whl" || extension == "zip" || (got == 4 && head == *b"PK\x03\x04") {
        inspect_wheel(path, report);
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
            scan_source(file, &macros, &mut sink);
        }
        report.components.push(sink.finish(shown.clone(), ComponentKind::SourceTree, &shown, 1));
    } else {
        problem(report, shown, "not a wheel, an ELF file, a directory or a source file (by name or content)");
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
}

impl Sink {
    fn push(&mut self, item: Evidence) {
        if item.in_comment {
            self.commented += 1;
        } else {
            *self.counted.entry((item.class, item.for_or_against)).or_default() += 1;
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

    fn has(&self, class: EvidenceClass, stance: Stance) -> bool {
        self.counted.get(&(class, stance)).is_some_and(|&n| n > 0)
    }

    fn finish(self, name: String, kind: ComponentKind, root: &str, files_read: usize) -> Component {
        let kernel =
            self.has(EvidenceClass::DeviceKernel, Stance::For) || self.has(EvidenceClass::KernelLaunch, Stance::For);
        let descriptors = [EvidenceClass::Descriptor, EvidenceClass::Doorbell, EvidenceClass::ShmemDeviceApi]
            .iter()
            .any(|&class| self.has(class, Stance::For));
        let host = self.has(EvidenceClass::HostSubmission, Stance::Against);
        let (verdict, reason) = if kernel && descriptors && !host {
            (
                Verdict::AivDirect,
                "device-kernel evidence and descriptor/doorbell evidence from device code, and no Host-submission \
                 evidence"
                    .to_owned(),
            )
        } else if host && !descriptors {
            let reason = if kernel {
                "Host-submission evidence and no descriptor/doorbell evidence from device code (a kernel is there, \
                 but nothing shows it writes descriptors)"
            } else {
                "Host-submission evidence and no descriptor/doorbell evidence from device code"
            };
            (Verdict::HostSubmitted, reason.to_owned())
        } else if host && descriptors {
            (Verdict::Undetermined, "both Host-submission and device-descriptor evidence".to_owned())
        } else if descriptors {
            (Verdict::Undetermined, "device-descriptor evidence but no device-kernel evidence".to_owned())
        } else if kernel {
            (
                Verdict::Undetermined,
                "device-kernel evidence (or a kernel launch) only: nothing shows who writes the descriptors and \
                 rings the doorbell"
                    .to_owned(),
            )
        } else if self.commented > 0 {
            (
                Verdict::Undetermined,
                "no evidence either way outside comments (comments alone never decide a verdict)".to_owned(),
            )
        } else {
            (Verdict::Undetermined, "no evidence either way".to_owned())
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
        return Some((C::HostSubmission, Check::HostSubmission, "HiXL client batch transfer call"));
    }
    if matches!(name, "HcclBatchPut" | "HcclBatchGet" | "HcclPut" | "HcclGet") || name.starts_with("hcclMemcpy") {
        return Some((C::HostSubmission, Check::HostSubmission, "HCCL memory-transport call"));
    }
    if matches!(name, "TransferSync" | "TransferAsync")
        && (qualified.contains("AdxlEngine") || qualified.contains("adxl::"))
    {
        return Some((C::HostSubmission, Check::HostSubmission, "ADXL engine transfer call"));
    }
    // Kernel launch (Host side of check 1).
    if name.starts_with("aclrtLaunchKernel")
        || name.starts_with("aclrtBinaryLoad")
        || name.starts_with("rtKernelLaunch")
    {
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

fn scan_source(file: &SourceFile, macros: &HashMap<String, String>, sink: &mut Sink) {
    let lines: Vec<&str> = file.text.lines().collect();
    // Device code: device-kernel markers outside comments.
    let device_code = lines.iter().any(|line| {
        !is_comment_line(line, &file.extension)
            && (!line_markers(line).is_empty()
                || identifiers(line).iter().any(|&(id, _)| device_marker(id).is_some() || macros.contains_key(id)))
    });
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
            } else if let Some((class, check, what)) = classify_name(id, if path.contains("::") { path } else { line })
            {
                let stance = match class {
                    EvidenceClass::HostSubmission => Stance::Against,
                    EvidenceClass::KernelLaunch => Stance::For,
                    _ if device_code => Stance::For,
                    _ => Stance::Neutral,
                };
                if class == EvidenceClass::DeviceCompletion {
                    polls.push(index);
                }
                let shown = if path.contains("::") { path } else { id };
                add(sink, class, check, format!("{what}: `{shown}`"), stance);
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
            });
        }
    }
}

/// A source tree: files grouped by their first three path segments relative to the root.
fn inspect_tree(root: &Path, report: &mut InspectReport) {
    let shown_root = root.display().to_string();
    let mut groups: BTreeMap<String, Vec<SourceFile>> = BTreeMap::new();
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
            let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
            if !kind.is_file() || !SOURCE_EXTENSIONS.contains(&extension.as_str()) {
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
            groups.entry(group).or_default().push(SourceFile { shown: segments.join("/"), extension, text });
        }
    }
    // Device-qualifier macros are taken from the whole tree: a kernel uses the one its platform header defines.
    let mut macros = HashMap::new();
    for files in groups.values() {
        for (name, at) in device_macros(files) {
            macros.entry(name).or_insert(at);
        }
    }
    for (group, mut files) in groups {
        files.sort_by(|a, b| a.shown.cmp(&b.shown));
        let mut sink = Sink::default();
        for file in &files {
            scan_source(file, &macros, &mut sink);
        }
        report.components.push(sink.finish(group, ComponentKind::SourceTree, &shown_root, files.len()));
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

/// The name rules applied to one (possibly demangled) symbol name: each identifier of it.
fn classify_symbol(demangled: &str) -> Option<(EvidenceClass, Check, &'static str)> {
    let ids = identifiers(demangled);
    // The function's own name is the last identifier before the parameter list.
    let head = demangled.split('(').next().unwrap_or(demangled);
    let own = identifiers(head).last().map(|&(id, _)| id).unwrap_or(demangled);
    classify_name(own, head).or_else(|| {
        // Device objects' symbols: any part of the name (a kernel's local structures, e.g. `CopySqe::fill`).
        ids.iter().find_map(|&(id, _)| {
            classify_name(id, head).filter(|(c, _, _)| !matches!(c, EvidenceClass::HostSubmission))
        })
    })
}

fn inspect_elf(data: &[u8], sink: &mut Sink) -> Result<(), String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    if file.format() != object::BinaryFormat::Elf {
        return Err("not an ELF file".to_owned());
    }
    let host_machine = elf_machine(data);
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
            let undefined = symbol.is_undefined();
            if let Some((class, check, what)) = classify_name_of_symbol(&name) {
                let stance = match class {
                    EvidenceClass::HostSubmission => Stance::Against,
                    EvidenceClass::KernelLaunch => Stance::For,
                    _ => Stance::Neutral, // a descriptor or doorbell name in Host code does not count
                };
                let verb = if undefined { "imports" } else { "defines" };
                let base = name.split('(').next().unwrap_or(&name).to_owned();
                sink.push_once(Evidence {
                    class,
                    check,
                    for_or_against: stance,
                    what: format!("{what}: {verb} `{base}`"),
                    location: format!("symbol {raw} ({table}{})", if undefined { ", undefined" } else { "" }),
                    in_comment: false,
                    in_device_code: false,
                });
            } else if !undefined && symbol.kind() == object::SymbolKind::Data && mentions_device(&name) {
                sink.push_once(Evidence {
                    class: EvidenceClass::DeviceKernel,
                    check: Check::Kernel,
                    for_or_against: Stance::For,
                    what: format!("embedded blob named like a device object: `{name}`"),
                    location: format!("symbol {raw} ({table})"),
                    in_comment: false,
                    in_device_code: true,
                });
            }
        }
    }
    // Sections: device objects by name, embedded ELF images for another machine, and the names a binary looks up at
    // run time (strings of its read-only data).
    let mut embedded = 0usize;
    for section in file.sections() {
        let name = section.name().unwrap_or("").to_owned();
        let Ok(bytes) = section.data() else { continue };
        let device_named = mentions_device(&name);
        if device_named {
            sink.push_once(Evidence {
                class: EvidenceClass::DeviceKernel,
                check: Check::Kernel,
                for_or_against: Stance::For,
                what: format!("section named like a device object: `{name}`"),
                location: format!("section {name}"),
                in_comment: false,
                in_device_code: true,
            });
            scan_device_blob(bytes, &format!("section {name}"), sink);
        }
        if section.kind() == object::SectionKind::Text {
            continue;
        }
        let mut at = 0;
        while embedded < MAX_EMBEDDED {
            let Some(found) = find(&bytes[at..], b"\x7fELF") else { break };
            let offset = at + found;
            at = offset + 4;
            let image = &bytes[offset..];
            let Some(machine) = elf_machine(image) else { continue };
            embedded += 1;
            if Some(machine) == host_machine {
                continue;
            }
            let location = format!("section {name} at offset {offset:#x}");
            sink.push_once(Evidence {
                class: EvidenceClass::DeviceKernel,
                check: Check::Kernel,
                for_or_against: Stance::For,
                what: format!(
                    "embedded ELF for another machine (e_machine {machine}, this file's {})",
                    host_machine.map_or_else(|| "unknown".to_owned(), |m| m.to_string())
                ),
                location: location.clone(),
                in_comment: false,
                in_device_code: true,
            });
            if let Ok(inner) = object::File::parse(image) {
                for symbol in inner.symbols().chain(inner.dynamic_symbols()) {
                    let Ok(raw) = symbol.name() else { continue };
                    let demangled = demangle(raw);
                    if let Some((class, check, what)) = classify_symbol(&demangled) {
                        let stance = if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                        sink.push_once(Evidence {
                            class,
                            check,
                            for_or_against: stance,
                            what: format!("{what}: device symbol `{demangled}`"),
                            location: format!("{location}, symbol {raw}"),
                            in_comment: false,
                            in_device_code: true,
                        });
                    }
                }
            }
            if !device_named {
                scan_device_blob(image, &location, sink);
            }
        }
        if !device_named
            && matches!(section.kind(), object::SectionKind::ReadOnlyData | object::SectionKind::ReadOnlyString)
        {
            for (offset, text) in strings(bytes) {
                for (id, path) in identifiers(text) {
                    if let Some((class, check, what)) = classify_name(id, path) {
                        if matches!(class, EvidenceClass::HostSubmission | EvidenceClass::KernelLaunch) {
                            let stance =
                                if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                            sink.push_once(Evidence {
                                class,
                                check,
                                for_or_against: stance,
                                what: format!("{what}: string `{id}` (a name looked up at run time, or a message)"),
                                location: format!("section {name} at offset {offset:#x}"),
                                in_comment: false,
                                in_device_code: false,
                            });
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// The symbol rule for a Host ELF: the function's own name, with its qualifier for ADXL's methods.
fn classify_name_of_symbol(demangled: &str) -> Option<(EvidenceClass, Check, &'static str)> {
    let head = demangled.split('(').next().unwrap_or(demangled);
    let own = identifiers(head).last().map(|&(id, _)| id)?;
    classify_name(own, head)
}

/// Strings of a device blob, by the name rules: all of them count as device code.
fn scan_device_blob(bytes: &[u8], location: &str, sink: &mut Sink) {
    for (offset, text) in strings(bytes) {
        for (id, path) in identifiers(text) {
            if let Some((class, check, what)) = classify_name(id, path) {
                let stance = if class == EvidenceClass::HostSubmission { Stance::Against } else { Stance::For };
                sink.push_once(Evidence {
                    class,
                    check,
                    for_or_against: stance,
                    what: format!("{what}: `{id}` in a device object"),
                    location: format!("{location}, string at offset {offset:#x}"),
                    in_comment: false,
                    in_device_code: true,
                });
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

fn inspect_wheel(path: &Path, report: &mut InspectReport) {
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
    let mut sources = Vec::new();
    let mut read = 0u64;
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
        let extension = Path::new(&inner).extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
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
        match inspect_elf(&data, &mut sink) {
            Ok(()) => report.components.push(sink.finish(member, ComponentKind::WheelElf, &shown, 0)),
            Err(e) => problem(report, member, format!("malformed ELF: {e}")),
        }
    }
    if !sources.is_empty() {
        let macros = device_macros(&sources);
        let mut sink = Sink::default();
        for file in &sources {
            scan_source(file, &macros, &mut sink);
        }
        report.components.push(sink.finish(
            format!("{wheel}!sources"),
            ComponentKind::WheelSources,
            &shown,
            sources.len(),
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
            let _ =
                writeln!(out, "## {} ({}): {}\n", component.name, component.kind.label(), component.verdict.label());
            let _ = writeln!(out, "Reason: {}.", component.reason);
            if component.files_read > 0 {
                let _ = writeln!(out, "Files read: {}.", component.files_read);
            }
            for check in Check::ALL {
                let mut items: Vec<&Evidence> = component.evidence.iter().filter(|e| e.check == check).collect();
                if items.is_empty() {
                    continue;
                }
                // Counted items first, then context, then comments; the same finding in one file on one line.
                items.sort_by_key(|e| (e.in_comment, e.for_or_against == Stance::Neutral));
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
                        Stance::Neutral => "context outside device code (not counted)",
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
            let _ = writeln!(out, "## No evidence either way (undetermined)\n\n{}\n", empty.join(", "));
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
