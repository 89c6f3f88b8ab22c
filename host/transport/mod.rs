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

use crate::transfer::{CompletionPoller, Transfer};

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
