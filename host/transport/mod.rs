//! Transports: the paths a validated transfer can take, behind one trait.
//!
//! The engine checks every request (segment, bounds, registration) before a transport sees it, so a transport only
//! moves bytes and reports the outcome through the transfer's [`TaskSlot`]. A transport
//! must finish every transfer it accepts within a bounded time: COMPLETED, FAILED or TIMEOUT, never silence.

pub mod adxl;
pub mod aiv;
pub mod local;
pub mod tcp;
pub mod ubshmem;
pub mod window;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{Opcode, Segment, TaskSlot};

/// The protocols a request can name. Mooncake spells them in lower case in mooncake.json and descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// AIV direct-drive: an AscendC kernel on the AI Vector cores builds and submits the descriptors.
    Aiv,
    /// Host-submitted one-sided engine (ADXL / HiXL shape), a baseline.
    Adxl,
    /// Host worker and stream pool over exported/imported device memory (Mooncake's UBShmem shape), a baseline.
    Ubshmem,
    /// Mooncake's TCP transport, wire compatible.
    Tcp,
}

/// Protocols Mooncake knows that this engine does not provide; named so the error can say so precisely.
pub const MOONCAKE_ONLY_PROTOCOLS: &[&str] = &[
    "rdma",
    "ascend",
    "hccl",
    "ub",
    "nvlink",
    "nvlink_intra",
    "hip",
    "cxl",
    "efa",
    "nvmeof",
    "barex",
    "ascend_direct",
];

impl Protocol {
    /// Every protocol this engine provides.
    pub const ALL: [Protocol; 4] = [Protocol::Aiv, Protocol::Adxl, Protocol::Ubshmem, Protocol::Tcp];

    /// The lower-case name used in mooncake.json, descriptors and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Aiv => "aiv",
            Protocol::Adxl => "adxl",
            Protocol::Ubshmem => "ubshmem",
            Protocol::Tcp => "tcp",
        }
    }

    /// Whether the data path runs through the Device (device memory on both ends).
    pub fn is_device_path(self) -> bool {
        !matches!(self, Protocol::Tcp)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a protocol name was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolParseError {
    /// Mooncake provides it; this engine does not.
    #[error(
        "protocol {0:?} is a Mooncake protocol that this engine does not provide (it provides aiv, adxl, ubshmem, tcp)"
    )]
    MooncakeOnly(String),
    /// Nobody knows it.
    #[error("unknown protocol {0:?} (this engine provides aiv, adxl, ubshmem, tcp)")]
    Unknown(String),
}

impl std::str::FromStr for Protocol {
    type Err = ProtocolParseError;

    /// Parses a protocol name case-insensitively, as Mooncake lower-cases it.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let lower = name.trim().to_ascii_lowercase();
        if let Some(protocol) = Protocol::ALL.into_iter().find(|p| p.as_str() == lower) {
            return Ok(protocol);
        }
        if MOONCAKE_ONLY_PROTOCOLS.contains(&lower.as_str()) {
            Err(ProtocolParseError::MooncakeOnly(name.to_owned()))
        } else {
            Err(ProtocolParseError::Unknown(name.to_owned()))
        }
    }
}

/// One request after the engine has validated it.
///
/// Invariants the engine guarantees before handing it over: `[local_addr, local_addr + length)` lies inside one
/// buffer registered with this engine, `[remote_addr, remote_addr + length)` inside one buffer of `target`'s
/// descriptor, and `length > 0`. For the local segment `remote_addr` is an address of this process.
#[derive(Debug)]
pub struct Transfer {
    /// READ copies remote -> local, WRITE local -> remote.
    pub opcode: Opcode,
    /// Address in this process.
    pub local_addr: u64,
    /// Address as the target segment's owner knows it (Mooncake's `target_offset`).
    pub remote_addr: u64,
    /// Bytes to move.
    pub length: u64,
    /// The segment the transfer targets.
    pub target: Arc<Segment>,
    /// Where the outcome goes.
    pub slot: Arc<TaskSlot>,
}

/// A path that moves validated transfers.
pub trait Transport: Send + Sync + fmt::Debug {
    /// The path name recorded in evidence and logs (`"local"`, `"aiv"`, `"tcp"`, ...).
    fn name(&self) -> &'static str;

    /// Accepts transfers. Each transfer's slot must reach a terminal state within the engine's transfer timeout;
    /// the engine's watchdog turns one that does not into TIMEOUT.
    fn submit(&self, transfers: Vec<Transfer>);

    /// How a thread waiting for this transport's transfers can observe their completions itself, if the transport
    /// allows it (aiv: drain the Device completion queue in the waiting thread instead of being woken by a Host
    /// drain thread). `None`: the transport finishes its slots from its own threads.
    fn completion_poller(&self) -> Option<Arc<dyn CompletionPoller>> {
        None
    }
}

/// Completions a waiting thread can collect itself (see [`Transport::completion_poller`]).
///
/// The engine's batch wait calls [`CompletionPoller::attach`] once, then loops: `token`, `poll`, check the batch,
/// `wait(token, ..)`; then `detach`. While a thread is attached the transport's own background completion thread
/// backs off, so a completion wakes one Host thread, the one that wants it.
pub trait CompletionPoller: Send + Sync + fmt::Debug {
    /// Finishes the task slots of every completion ready now; cheap when none is. Returns true when another thread
    /// was collecting completions at the same time (it may finish the caller's tasks without waking the caller, so
    /// the caller should only nap before looking again).
    fn poll(&self) -> bool;
    /// A token for [`CompletionPoller::wait`], read before `poll`.
    fn token(&self) -> u32;
    /// Sleeps until the device reported progress after `token` was read, or `timeout` passes.
    fn wait(&self, token: u32, timeout: Duration);
    /// Sleeps until the completions of the tasks with these tickets (`TaskSlot::ticket`, all set by this poller's
    /// transport) are ready to collect, or `timeout` passes; progress on other tasks wakes nobody. The default waits
    /// for any progress, as [`CompletionPoller::wait`].
    fn wait_for(&self, tickets: &[u64], token: u32, timeout: Duration) {
        let _ = tickets;
        self.wait(token, timeout);
    }
    /// A thread starts waiting through this poller.
    fn attach(&self);
    /// That thread stopped waiting.
    fn detach(&self);
}
