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

/// The record one transfer leaves behind, whichever transport carried it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TransferEvidence {
    /// The transport that carried the transfer (`"local"`, `"aiv"`, `"tcp"`, ...).
    pub path: &'static str,
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
