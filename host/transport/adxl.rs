//! The `adxl` baseline: one-sided transfers with ADXL's shape (docs/hardware.md section 7), through the device's HiXL
//! library (`hixl` submodule: a HiXL server per device, a client per remote engine, batch put/get, status polling) —
//! the vendor's on an NPU, the twin runtime's on the CPU ([`HixlAccess::hixl_api`]). Nothing runs on the AIV cores.
//! HiXL's client-server mode with a device endpoint submits each batch from AI-CPU kernels the library launches
//! (`hicann/hixl` `src/hixl/cs/hixl_cs_client.cc`); the twin's HiXL does the same on its emulated AI CPU, and its
//! records make the path AI-CPU-submitted in the evidence. On the vendor's runtime who submitted is not observable.
//!
//! ADXL's behaviour made visible: the first transfer to a peer engine connects its client (a failure is
//! NOT_CONNECTED), a peer the device's probe found gone is refused at once, and every outcome carries an ADXL status
//! code ([`AdxlStatus`]) in its reason.
//!
//! The `adxl-fabric` baseline ([`AdxlFabricTransport`], `fabric` submodule) is its sibling over HiXL's FabricMem
//! engine (twin runtime only), with the same statuses and the same evidence reading.
//!
//! Owns: the HiXL path of one device. Touches no engine state beyond the task slots of the transfers it accepted.
//! Every wait is bounded by `baseline_timeout`.

mod fabric;
mod hixl;
mod jobs;

pub use fabric::AdxlFabricTransport;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::window::PeerWindows;
use super::Transport;
use crate::config::{AivOptions, Environment};
use crate::cpu_time::CpuCarry;
use crate::device::{HixlAccess, MemorySharing};
use crate::transfer::{CodeFamily, FailureKind, Transfer, TransferFailure, TransferState};

/// An ADXL status code (`adxl::Status`), decoded totally.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct AdxlStatus(pub i32);

impl AdxlStatus {
    /// The transfer completed.
    pub const SUCCESS: AdxlStatus = AdxlStatus(0);
    /// An argument was refused.
    pub const PARAM_INVALID: AdxlStatus = AdxlStatus(103_900);
    /// The transfer did not complete in time.
    pub const TIMEOUT: AdxlStatus = AdxlStatus(103_901);
    /// The remote engine is not connected (its memory could not be imported).
    pub const NOT_CONNECTED: AdxlStatus = AdxlStatus(103_902);
    /// The device reported an error.
    pub const FAILED: AdxlStatus = AdxlStatus(503_900);

    /// The constant's name.
    pub fn name(self) -> String {
        match self {
            AdxlStatus::SUCCESS => "SUCCESS".into(),
            AdxlStatus::PARAM_INVALID => "PARAM_INVALID".into(),
            AdxlStatus::TIMEOUT => "TIMEOUT".into(),
            AdxlStatus::NOT_CONNECTED => "NOT_CONNECTED".into(),
            AdxlStatus::FAILED => "FAILED".into(),
            AdxlStatus(other) => format!("status {other}"),
        }
    }

    /// The engine's task state for this status.
    pub fn task_state(self) -> TransferState {
        match self {
            AdxlStatus::SUCCESS => TransferState::Completed,
            AdxlStatus::TIMEOUT => TransferState::Timeout,
            _ => TransferState::Failed,
        }
    }

    /// The task failure of a transfer that ended with this status; renders as `adxl: <NAME> (<code>): <detail>`.
    pub fn failure(self, detail: impl Into<String>) -> TransferFailure {
        self.failure_of(self.kind(), detail)
    }

    /// As [`AdxlStatus::failure`], of a kind the status alone does not tell (a shutdown, a lost peer).
    pub fn failure_of(self, kind: FailureKind, detail: impl Into<String>) -> TransferFailure {
        self.failure_on("adxl", kind, detail)
    }

    /// As [`AdxlStatus::failure`], of `path` (`"adxl"`, `"adxl-fabric"`): renders as `<path>: <NAME> (<code>): ..`.
    pub fn failure_at(self, path: &'static str, detail: impl Into<String>) -> TransferFailure {
        self.failure_on(path, self.kind(), detail)
    }

    /// As [`AdxlStatus::failure_of`], of `path`.
    pub fn failure_on(self, path: &'static str, kind: FailureKind, detail: impl Into<String>) -> TransferFailure {
        TransferFailure::new(path, kind, detail).with_code(CodeFamily::Adxl, i64::from(self.0), self.name())
    }

    fn kind(self) -> FailureKind {
        match self {
            AdxlStatus::TIMEOUT => FailureKind::Timeout,
            AdxlStatus::PARAM_INVALID => FailureKind::InvalidRequest,
            AdxlStatus::NOT_CONNECTED => FailureKind::Unreachable,
            _ => FailureKind::Device,
        }
    }

    /// The status a task failure of this transport carries; FAILED for a failure without an ADXL code.
    pub fn of_failure(failure: &TransferFailure) -> AdxlStatus {
        failure
            .code_of(CodeFamily::Adxl)
            .and_then(|code| i32::try_from(code).ok())
            .map_or(AdxlStatus::FAILED, AdxlStatus)
    }
}

/// Counters of the adxl transport (peers are HiXL clients) or the adxl-fabric one (peers are FabricMem engines) as a
/// whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdxlCounters {
    /// Peer engines connected (HiXL clients connected).
    pub connects: u64,
    /// Batches submitted to HiXL.
    pub groups: u64,
    /// Batches that did not end in time.
    pub timeouts: u64,
    /// Batches HiXL reported failed.
    pub failures: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connects: AtomicU64,
    groups: AtomicU64,
    timeouts: AtomicU64,
    failures: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> AdxlCounters {
        AdxlCounters {
            connects: self.connects.load(Ordering::Relaxed),
            groups: self.groups.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug)]
struct Shared {
    /// The device's memory: what HiXL registers and transfers may name.
    device: Arc<dyn MemorySharing>,
    windows: Arc<PeerWindows>,
    timeout: Duration,
    counters: Counters,
    /// Submit hand-offs not charged yet (see [`CpuCarry`]).
    carry: CpuCarry,
    /// Where the HiXL server listens (cann backend; `aiv.hixl_host` / `aiv.hixl_port`).
    hixl_host: Option<String>,
    hixl_port: u16,
}

/// The adxl transport of one device.
#[derive(Debug)]
pub struct AdxlTransport {
    shared: Arc<Shared>,
    /// The device's HiXL path; `None` when the device has no HiXL library (every transfer then fails saying so).
    hixl: Option<hixl::HixlPath>,
}

impl AdxlTransport {
    /// The transport for `device`, through its HiXL library (`hixl`; `None`: the device has none), refusing peers
    /// the device's shared `windows` found lost; its HiXL server starts now, its clients with the first transfer to
    /// each peer.
    pub fn new(
        device: Arc<dyn MemorySharing>,
        hixl: Option<&dyn HixlAccess>,
        windows: Arc<PeerWindows>,
        options: &AivOptions,
    ) -> Self {
        let shared = Arc::new(Shared {
            windows,
            device,
            timeout: options.baseline_timeout,
            counters: Counters::default(),
            carry: CpuCarry::default(),
            hixl_host: options.hixl_host.clone(),
            hixl_port: options.hixl_port,
        });
        let hixl = hixl.map(|access| hixl::HixlPath::new(shared.clone(), access.hixl_api()));
        AdxlTransport { shared, hixl }
    }

    /// Where this device's HiXL server listens (`"ip:port"`), advertised to peers; `None` when it could not start.
    pub fn hixl_server(&self) -> Option<String> {
        self.hixl.as_ref().and_then(hixl::HixlPath::server_address)
    }

    /// Transport-wide counters.
    pub fn counters(&self) -> AdxlCounters {
        self.shared.counters.snapshot()
    }
}

impl Transport for AdxlTransport {
    fn name(&self) -> &'static str {
        "adxl"
    }

    /// `TransferAsync`: hand the list to HiXL; its Host thread polls the completion.
    fn submit(&self, transfers: Vec<Transfer>) {
        match &self.hixl {
            Some(hixl) => hixl.submit(transfers),
            None => {
                let reason = format!(
                    "device {} ({}) has no HiXL library for the adxl baseline",
                    self.shared.device.device_id(),
                    self.shared.device.backend_name()
                );
                for transfer in transfers {
                    transfer.slot.fail(AdxlStatus::FAILED.failure(reason.clone()));
                }
            }
        }
    }
}

/// Where the adxl baseline's HiXL server (cann backend) listens when `aiv.hixl_host` is not set: `AIV_HIXL_HOST`
/// if set, else the host part of the engine's `local_hostname`, so that peers reach it where they reach the engine.
pub fn default_hixl_host(environment: &dyn Environment, local_hostname: &str) -> String {
    match environment.var("AIV_HIXL_HOST") {
        Some(host) if !host.trim().is_empty() => host.trim().to_owned(),
        _ => super::tcp::host_of_segment_name(local_hostname).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_round_trip_through_task_failures() {
        for status in [AdxlStatus::PARAM_INVALID, AdxlStatus::TIMEOUT, AdxlStatus::NOT_CONNECTED, AdxlStatus::FAILED] {
            let failure = status.failure("detail (with parentheses)");
            assert_eq!(AdxlStatus::of_failure(&failure), status);
            assert_eq!(failure.state(), status.task_state());
            assert_eq!(
                failure.to_string(),
                format!("adxl: {} ({}): detail (with parentheses)", status.name(), status.0)
            );
        }
        let tcp = crate::transfer::TransferFailure::new("tcp", crate::transfer::FailureKind::Network, "refused");
        assert_eq!(AdxlStatus::of_failure(&tcp), AdxlStatus::FAILED, "a failure without an ADXL code is FAILED");
        assert_eq!(AdxlStatus::TIMEOUT.task_state(), TransferState::Timeout);
        assert_eq!(AdxlStatus::NOT_CONNECTED.task_state(), TransferState::Failed);
        assert_eq!(AdxlStatus(7).name(), "status 7");
    }
}
