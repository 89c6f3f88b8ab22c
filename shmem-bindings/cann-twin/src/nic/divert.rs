//! **Test-only, deliberately mis-wired**: the twin NIC's SQ doorbells diverted from the emulated cores to the Host,
//! the RDMA analogue of [`crate::control::divert_core_doorbells`] for an SDMA channel. While a device is diverted, an
//! emulated core's SQ doorbell write to any of its NIC's QPs does not reach the QP: it is neither applied nor
//! recorded, and its word is parked per QP; a test forwards it with [`host_ring_sq_doorbell`], which applies it with
//! the Host as its origin. The WQEs stay the kernel's and the CQEs are still read by it: only the doorbell check of
//! such a transfer's evidence can turn to no. Nothing in the model or any configuration reaches it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};

use super::common::lock;
pub use super::host_ring_sq_doorbell;
use super::{NicError, SQ_DOORBELL_OFFSET};
use crate::provenance::WRITER_BLOCK0;
use crate::sdma::RegisterFault;

/// Any device diverted: the doorbell path's one check while none is.
static ANY: AtomicBool = AtomicBool::new(false);
static DEVICES: LazyLock<Mutex<HashSet<i32>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
/// Per (device, QPN): how many SQ doorbell words were parked so far, and the last of them.
type Parked = HashMap<(i32, u32), (u32, u64)>;
static PARKED: LazyLock<Mutex<Parked>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Diverts (`true`) or restores the emulated cores' SQ doorbells of `device`'s NIC. Restoring drops what is parked.
pub fn divert_core_sq_doorbells(device: i32, diverted: bool) {
    let mut devices = lock(&DEVICES);
    if diverted {
        devices.insert(device);
    } else {
        devices.remove(&device);
        lock(&PARKED).retain(|&(parked_device, _), _| parked_device != device);
    }
    ANY.store(!devices.is_empty(), Ordering::Release);
}

/// The SQ doorbells parked so far for each QP of `device` whose cores rang while diverted, and the last word of each:
/// `(qpn, count, word)`, in QPN order.
pub fn diverted_sq_doorbells(device: i32) -> Vec<(u32, u32, u64)> {
    let mut parked: Vec<(u32, u32, u64)> = lock(&PARKED)
        .iter()
        .filter(|((parked_device, _), _)| *parked_device == device)
        .map(|(&(_, qpn), &(count, word))| (qpn, count, word))
        .collect();
    parked.sort_unstable();
    parked
}

/// Why [`host_ring_sq_doorbell`] did not ring.
#[derive(Debug)]
pub enum HostRingError {
    /// No such NIC or QP.
    Nic(NicError),
    /// The QP refused the word.
    Refused(RegisterFault),
}

impl std::fmt::Display for HostRingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostRingError::Nic(error) => write!(f, "the Host's SQ doorbell: {error}"),
            HostRingError::Refused(fault) => write!(f, "the Host's SQ doorbell was refused: {fault}"),
        }
    }
}

impl std::error::Error for HostRingError {}

/// Called by the doorbell path: parks a core's 8-byte SQ doorbell on QP `qpn` of a diverted `device` (`true`: the
/// write is taken here and goes no further).
pub(super) fn park(device: i32, qpn: u32, offset: u64, bytes: &[u8], origin: u32) -> bool {
    if !ANY.load(Ordering::Acquire) || offset != SQ_DOORBELL_OFFSET || origin < WRITER_BLOCK0 {
        return false;
    }
    let Ok(word) = <[u8; 8]>::try_from(bytes) else { return false };
    if !lock(&DEVICES).contains(&device) {
        return false;
    }
    let mut parked = lock(&PARKED);
    let entry = parked.entry((device, qpn)).or_insert((0, 0));
    *entry = (entry.0.wrapping_add(1), u64::from_le_bytes(word));
    true
}
