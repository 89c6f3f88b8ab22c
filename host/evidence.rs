//! What every transfer records about how it was carried out.
//!
//! The comparative audit decides which paths are AIV-direct from these records (docs/hardware.md section 1: a kernel on
//! the AI Vector cores builds the descriptors, rings the doorbell and observes completion on the Device). No path
//! asserts that by name: each transport fills in what actually happened, counted where it happened.

use serde::Serialize;

/// Who performed one step of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Actor {
    /// Nobody: the step does not exist on this path (a plain memcpy builds no descriptor).
    Nobody,
    /// A kernel running on the AI Vector cores (on the twin: an emulated AIV core running the same kernel source).
    AivKernel,
    /// A Host thread of this process (an engine worker, or the thread that called `submit`).
    HostThread,
    /// A Host-side runtime library on the caller's behalf (ACL streams, the ADXL engine, the OS socket layer).
    HostRuntime,
}

impl Actor {
    /// Whether this actor runs on the Device.
    pub fn is_device(self) -> bool {
        matches!(self, Actor::AivKernel)
    }
}

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

/// The record one transfer leaves behind, whichever transport carried it.
///
/// Non-exhaustive: fields will be added (issue 15's observations); code outside the crate builds one with
/// [`TransferEvidence::new`] and sets the fields it knows. Its serialised form (`serde`, as `aiv bench --json` writes
/// it) is documented field by field in docs/evidence.md.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TransferEvidence {
    /// The transport that carried the transfer (`"local"`, `"aiv"`, `"tcp"`, ...).
    pub path: &'static str,
    /// The device runtime the record was observed on: every verdict drawn from it names this.
    pub runtime: RuntimeLabel,
    /// Who wrote the work descriptors (SQEs, WQEs, request headers).
    pub descriptor_builder: Actor,
    /// Who told the engine that executes them to start (doorbell write, stream submit, socket send).
    pub doorbell_ringer: Actor,
    /// Who first observed that the data had landed.
    pub completion_observer: Actor,
    /// Calls the Host made into the device runtime for this transfer (launches, copies, synchronisations).
    pub host_device_api_calls: u64,
    /// Work descriptors written for this transfer, its completion descriptors included.
    pub descriptors: u64,
    /// Doorbells rung for this transfer (a doorbell shared by k transfers counts 1/k, rounded up per transfer).
    pub doorbells: u64,
    /// Host CPU time spent on this transfer by the engine's own threads, in nanoseconds (emulated device threads of
    /// the CPU twin excluded).
    pub host_cpu_ns: u64,
}

impl TransferEvidence {
    /// A record of `path` on `runtime` in which nobody did anything yet: every actor [`Actor::Nobody`], every count 0.
    pub fn new(path: &'static str, runtime: RuntimeLabel) -> Self {
        TransferEvidence {
            path,
            runtime,
            descriptor_builder: Actor::Nobody,
            doorbell_ringer: Actor::Nobody,
            completion_observer: Actor::Nobody,
            host_device_api_calls: 0,
            descriptors: 0,
            doorbells: 0,
            host_cpu_ns: 0,
        }
    }

    /// The four AIV-direct checks (docs/hardware.md section 1), derived from what was recorded.
    pub fn aiv_direct_checks(&self) -> [bool; 4] {
        [
            self.descriptor_builder == Actor::AivKernel || self.doorbell_ringer == Actor::AivKernel,
            self.descriptor_builder == Actor::AivKernel,
            self.doorbell_ringer == Actor::AivKernel,
            self.completion_observer.is_device(),
        ]
    }

    /// Whether all four AIV-direct checks hold.
    pub fn is_aiv_direct(&self) -> bool {
        self.aiv_direct_checks().iter().all(|&check| check)
    }
}
