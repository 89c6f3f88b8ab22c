//! One component's evidence, collected as the scans find it ([`Sink`]: kept up to
//! [`MAX_EVIDENCE`](super::MAX_EVIDENCE), counted whatever was dropped, AI-CPU op names held until the component is
//! known to launch a kernel), and its "submitted by" verdict with the reason.

use std::collections::{BTreeMap, BTreeSet};

use super::aicpu::AiCpuOp;
use super::schema::{Check, Component, ComponentKind, Evidence, EvidenceClass, Stance};
use super::{Submitter, MAX_EVIDENCE};

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
pub(super) struct Sink {
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
    pub(super) fn push(&mut self, item: Evidence) {
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
    pub(super) fn push_once(&mut self, item: Evidence) {
        if self.seen.insert((item.class, item.what.clone(), item.location.clone())) {
            self.push(item);
        }
    }

    /// An AI-CPU op's name met outside AI-CPU code, decided at [`Sink::finish`].
    pub(super) fn pending_op(&mut self, name: &str, op: AiCpuOp<'_>, found: String, location: String) {
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

    pub(super) fn finish(mut self, name: String, kind: ComponentKind, root: &str, files_read: usize) -> Component {
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
