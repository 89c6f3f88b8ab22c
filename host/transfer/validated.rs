//! A request after the engine has validated it: what a transport receives.

use std::sync::Arc;

use super::request::Opcode;
use super::segment::Segment;
use super::task::TaskSlot;

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
