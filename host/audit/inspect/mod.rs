//! `aiv audit --inspect PATH...`: static inspection of wheels, ELF files and source trees for the four checks of AIV
//! direct-drive (a kernel on the AIV cores, descriptors written by the kernel, the doorbell rung by the kernel,
//! completion observed on the Device), with the evidence for and against each and a "submitted by" verdict per
//! component in the five words of the run evidence ([`Submitter`]; docs/inspect.md).
//!
//! Self-contained: std, serde, `serde_json` (AI-CPU op registrations), `object` (ELF), `cpp_demangle` (C++ names) and
//! `zip` (wheels) only. What a vendor library does inside a call is outside what this can see, and a verdict from
//! inspection is not an observation of a run: [`CAVEAT`] says so in every report.
//!
//! The parts: [`schema`] the report's types (the JSON document), [`inputs`] the entry point that tells each given path's
//! kind, [`read`] bounded reading of files, [`wheel`] and [`tree`] the inputs that hold many files, [`elf`] and
//! [`source`] the scans of one binary or source file, [`names`] the rules every scan applies to identifiers, [`aicpu`]
//! the AI-CPU ops, [`verdict`] one component's evidence and verdict, [`render`] the text a human reads.

mod aicpu;
mod elf;
mod inputs;
mod names;
mod read;
mod render;
mod schema;
mod source;
mod tree;
mod verdict;
mod wheel;

pub use crate::evidence::Submitter;
pub use inputs::inspect;
pub use schema::{Check, Component, ComponentKind, Evidence, EvidenceClass, InspectReport, Problem, Stance};

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
