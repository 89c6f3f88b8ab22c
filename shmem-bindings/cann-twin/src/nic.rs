//! The twin NIC: a CPU model of a RoCE NIC per device, for the device-initiated RDMA path (docs/rdma.md, "The twin
//! NIC"), driven by the transfer kernel's RDMA route and the aiv transport's setup. Twin runtime only, unverified on
//! hardware.
//!
//! - [`open`] starts a device's NIC: a TCP listener for the wire protocol (`nic/wire.rs`) between twin NICs.
//! - [`register_memory`] registers a device-memory range under a pair of keys; a remote access is checked against
//!   the *target* NIC's registrations (rkey, range inside, remote read or write right), a local one against the
//!   initiator's (lkey, range inside).
//! - [`create_qp`] makes a reliable-connected QP: an SQ of 64-byte slots and a CQ of 32-byte CQEs in twin device
//!   memory (zeroed), and a register page whose SQ doorbell is the 64-bit word at offset 0x0 and whose CQ doorbell
//!   (hardware mode) the 64-bit word at 0x8 (offsets: this project's choice). [`connect_qp`] connects it to a QP of
//!   a peer NIC (INIT to RTS in one call).
//! - A doorbell is a write to the register page (an emulated core's `copy_ubuf_to_gm`, or
//!   [`crate::register_write`]); the SDMA register registry is consulted first and, when it misses, the NIC's
//!   (`nic::register_write`). Only an 8-byte write at 0x0 with the QPN as tag and the SQ command, or at 0x8 with
//!   the CQN and the CQ_DB_PTR command, is accepted; anything else writes nothing, records a [`QpException`] and
//!   moves the QP to the error state.
//! - One engine thread per QP takes the rung WQEs in order: owner bit for the lap, opcode (RDMA WRITE 3, READ 5),
//!   one SGE, local validation, then the request (a PSN per message) on the QP's connection at once. A window of
//!   requests is outstanding: at most [`QpConfig::max_outstanding`] (default [`DEFAULT_OUTSTANDING`]) and
//!   [`WINDOW_BYTES`] of messages (a single larger message travels alone). A reader thread per connection hands the
//!   responses (one per request) to the engine.
//! - Payloads move in place: a WRITE's bytes go from the initiator's device memory to the socket at each send (a
//!   retransmission reads them again), and on the target a large WRITE's from the socket into the registered memory
//!   once it is checked (`Nic::land_write`; docs/rdma.md, "Data movement").
//! - Completions are strictly in WQE order: a response completes the oldest outstanding request only if it carries
//!   that request's PSN (others are ignored); a READ's bytes land in local memory then. The engine writes a CQE at
//!   the CQ's producer index with the owner bit of the lap, never over a CQE the consumer has not released, and
//!   then signals [`QpConfig::wake_block`]'s activity record.
//! - Go back N: when the oldest request's timer (the QP's timeout per attempt, from when it left) runs out, the
//!   connection is given up, and the NIC reconnects and sends every outstanding request again from the oldest, each
//!   counting a retransmission against the retry count; the oldest, out of retries, fails with
//!   TRANSPORT_RETRY_EXC_ERR. A lost connection waits for the timer.
//! - The target executes each initiator QP's requests strictly in PSN order, each at most once: the next PSN is
//!   executed, an earlier one (a retransmission) answered again without applying a WRITE again (a READ is read
//!   again), one past a gap dropped unanswered (the initiator goes back N). After it refuses a request
//!   (REMOTE_ACCESS_ERR, touching nothing) it drops every later request of that initiator QP, so the refused WQE's
//!   successors in the window are not applied. A WRITE applied on the target before the initiator saw an earlier
//!   WQE fail for a reason the target did not see (retries exhausted with the responses lost, a READ response of
//!   the wrong length) is not undone: its WQE is flushed all the same, as RC allows.
//! - RC error semantics: the first error CQE carries its status, the QP goes to the error state, and every later
//!   WQE, already sent or not, completes with WR_FLUSH_ERR (error CQEs are written whether or not the WQE is
//!   signaled).
//!
//! Not modelled: congestion control, PFC and ECN, real NIC timing (loopback TCP sets the pace; a retry waits exactly
//! its timeout), NAKs and coalesced acknowledgements, MTU segmentation (docs/rdma.md, "The twin NIC").
//!
//! Every wait is bounded; nothing from the wire or from device memory can panic the model; threads are named
//! `cann-twin-nic-d{device}...` (`-listen`, `-r{n}` per accepted connection, `q{qpn}` per engine, `q{qpn}-rx` per
//! engine's connection), and [`close`] joins them within [`JOIN_WAIT`].
//!
//! The files: this one holds the NIC's state, its registrations and the calls above; `nic/common.rs` what the other
//! files share (the helpers that reach device memory, thread spawning, the handshake, a reader's events, a target's
//! per-initiator state); `nic/types.rs` the public types and limits, `nic/layout.rs` roce.h's constants re-declared, `nic/qp.rs` a
//! QP (its doorbells, CQEs and teardown), `nic/engine.rs` the initiator's engine and reader threads,
//! `nic/responder.rs` the listener and responder threads, `nic/wire.rs` the frames (the QP
//! records are `provenance::qp`'s) and `nic/divert.rs` the test-only doorbell divert.

mod common;
pub mod divert;
mod engine;
mod layout;
mod qp;
mod responder;
mod types;
pub(crate) mod wire;

pub use layout::{
    status, CQE_BYTES, CQ_DOORBELL_OFFSET, DOORBELL_WIDTH, OPCODE_RDMA_READ, OPCODE_RDMA_WRITE, SQ_DOORBELL_OFFSET,
    WQE_STRIDE,
};
pub use types::{
    Access, MemoryKeys, NicCounters, NicError, QpConfig, QpException, QpFault, QpInfo, QpState, QpStatus, CONNECT_WAIT,
    DEFAULT_OUTSTANDING, JOIN_WAIT, MAX_CONNECTIONS, MAX_CQ_DEPTH, MAX_MESSAGE_BYTES, MAX_OUTSTANDING, MAX_RETRY_COUNT,
    MAX_SQ_DEPTH, MAX_TIMEOUT, WINDOW_BYTES,
};

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;

use crate::memory::page;
use crate::sdma::{write_device, RegisterFault};
use crate::space::{space, with_space_mut};
use common::{handshake, join_until, lock, spawn};
use layout::DB_TAG_MASK;
use qp::{Qp, QpInner};

#[derive(Clone, Copy, Debug)]
struct Region {
    va: u64,
    len: u64,
    access: Access,
    keys: MemoryKeys,
}

impl Region {
    fn holds(&self, va: u64, len: u64) -> bool {
        va >= self.va && va.checked_add(len).is_some_and(|end| end <= self.va + self.len)
    }
}

#[derive(Debug, Default)]
struct Counters {
    qps_created: AtomicU64,
    wqes_executed: AtomicU64,
    cqes_written: AtomicU64,
    retries: AtomicU64,
    requests_served: AtomicU64,
    requests_refused: AtomicU64,
    writes_applied: AtomicU64,
    duplicates_answered: AtomicU64,
    requests_dropped: AtomicU64,
}

/// One device's NIC.
#[derive(Debug)]
struct Nic {
    device: i32,
    address: SocketAddr,
    link_down: AtomicBool,
    /// Responses still to withhold after the request was served ([`drop_responses`]).
    drop_responses: AtomicU32,
    shutdown: AtomicBool,
    regions: RwLock<Vec<Region>>,
    qps: Mutex<HashMap<u32, Arc<Qp>>>,
    next_qpn: AtomicU32,
    counters: Counters,
    listener: Mutex<Option<JoinHandle<()>>>,
    /// The responder threads, one per accepted connection.
    responders: Mutex<Vec<JoinHandle<()>>>,
}

static NICS: LazyLock<Mutex<HashMap<i32, Arc<Nic>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// Register pages of every NIC's QPs, by page address.
static NIC_PAGES: LazyLock<RwLock<HashMap<u64, Arc<Qp>>>> = LazyLock::new(|| RwLock::new(HashMap::new()));

fn nic(device: i32) -> Result<Arc<Nic>, NicError> {
    lock(&NICS).get(&device).cloned().ok_or(NicError::NotOpen(device))
}

fn random_u32() -> u32 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.finish() as u32
}

/// Starts `device`'s NIC listening at `listen` (port 0: any); returns the bound address.
pub fn open(device: i32, listen: SocketAddr) -> Result<SocketAddr, NicError> {
    if device < 0 {
        return Err(NicError::InvalidDevice(device));
    }
    let mut nics = lock(&NICS);
    if nics.contains_key(&device) {
        return Err(NicError::AlreadyOpen(device));
    }
    let listener = TcpListener::bind(listen).map_err(|error| NicError::Io(format!("bind {listen}: {error}")))?;
    let address = listener.local_addr().map_err(|error| NicError::Io(error.to_string()))?;
    listener.set_nonblocking(true).map_err(|error| NicError::Io(error.to_string()))?;
    let nic = Arc::new(Nic {
        device,
        address,
        link_down: AtomicBool::new(false),
        drop_responses: AtomicU32::new(0),
        shutdown: AtomicBool::new(false),
        regions: RwLock::new(Vec::new()),
        qps: Mutex::new(HashMap::new()),
        next_qpn: AtomicU32::new(0x100 + (random_u32() & 0xFFF)),
        counters: Counters::default(),
        listener: Mutex::new(None),
        responders: Mutex::new(Vec::new()),
    });
    let serving = Arc::clone(&nic);
    let handle = spawn(format!("cann-twin-nic-d{device}-listen"), move || serving.listen(listener))?;
    *lock(&nic.listener) = Some(handle);
    nics.insert(device, nic);
    Ok(address)
}

/// The address `device`'s NIC listens at.
pub fn address(device: i32) -> Result<SocketAddr, NicError> {
    Ok(nic(device)?.address)
}

/// Stops `device`'s NIC: destroys its QPs (joining their engines, freeing their queues and register pages), closes
/// its connections and joins every thread, within [`JOIN_WAIT`] in all.
pub fn close(device: i32) -> Result<(), NicError> {
    let nic = lock(&NICS).remove(&device).ok_or(NicError::NotOpen(device))?;
    let deadline = Instant::now() + JOIN_WAIT;
    nic.shutdown.store(true, Ordering::Release);
    let qps: Vec<Arc<Qp>> = lock(&nic.qps).drain().map(|(_, qp)| qp).collect();
    let mut left = 0;
    for qp in qps {
        left += qp.destroy(deadline);
    }
    let listener = lock(&nic.listener).take();
    left += join_until(listener.into_iter().collect(), deadline);
    let responders = std::mem::take(&mut *lock(&nic.responders));
    left += join_until(responders, deadline);
    if left > 0 {
        return Err(NicError::ThreadsLeft(left));
    }
    Ok(())
}

/// Registers `[va, va + len)` of device memory (it must translate: inside one allocation, mapping or window) with
/// the remote rights `access`; returns its keys (random, distinct, non-zero, unique on this NIC).
pub fn register_memory(device: i32, va: u64, len: u64, access: Access) -> Result<MemoryKeys, NicError> {
    let nic = nic(device)?;
    if len == 0 || va.checked_add(len).is_none() || len > usize::MAX as u64 {
        return Err(NicError::InvalidArgument("the range is empty or wraps"));
    }
    {
        let guard = space();
        let space = guard.as_ref().ok_or(NicError::Device(ACL_ERROR_RT_INTERNAL_ERROR))?;
        space.translate(va as usize, len as usize, false).map_err(NicError::Device)?;
    }
    let mut regions = nic.regions.write().unwrap_or_else(|p| p.into_inner());
    let used = |key: u32| regions.iter().any(|r| r.keys.lkey == key || r.keys.rkey == key);
    let fresh = || loop {
        let key = random_u32();
        if key != 0 && !used(key) {
            break key;
        }
    };
    let lkey = fresh();
    let rkey = loop {
        let key = fresh();
        if key != lkey {
            break key;
        }
    };
    let keys = MemoryKeys { lkey, rkey };
    regions.push(Region { va, len, access, keys });
    Ok(keys)
}

/// Removes the registration whose lkey is `lkey`: its keys no longer validate any access.
pub fn deregister_memory(device: i32, lkey: u32) -> Result<(), NicError> {
    let nic = nic(device)?;
    let mut regions = nic.regions.write().unwrap_or_else(|p| p.into_inner());
    let before = regions.len();
    regions.retain(|r| r.keys.lkey != lkey);
    if regions.len() == before {
        return Err(NicError::NoSuchRegion { device, lkey });
    }
    Ok(())
}

/// Creates a reliable-connected QP with its CQ on `device`'s NIC, in state INIT.
pub fn create_qp(device: i32, config: QpConfig) -> Result<QpInfo, NicError> {
    let nic = nic(device)?;
    let depth_ok = |depth: u32, max: u32| depth.is_power_of_two() && depth <= max;
    if !depth_ok(config.sq_depth, MAX_SQ_DEPTH) {
        return Err(NicError::InvalidArgument("sq_depth must be a power of two up to MAX_SQ_DEPTH"));
    }
    if !depth_ok(config.cq_depth, MAX_CQ_DEPTH) {
        return Err(NicError::InvalidArgument("cq_depth must be a power of two up to MAX_CQ_DEPTH"));
    }
    if config.retry_count > MAX_RETRY_COUNT {
        return Err(NicError::InvalidArgument("retry_count is at most 7"));
    }
    if config.timeout < Duration::from_millis(1) || config.timeout > MAX_TIMEOUT {
        return Err(NicError::InvalidArgument("timeout must lie in 1 ms..=10 s"));
    }
    if config.cq_full_wait > MAX_TIMEOUT {
        return Err(NicError::InvalidArgument("cq_full_wait is at most 10 s"));
    }
    if config.max_outstanding == 0 || config.max_outstanding > MAX_OUTSTANDING {
        return Err(NicError::InvalidArgument("max_outstanding must lie in 1..=MAX_OUTSTANDING"));
    }
    let sq_bytes = config.sq_depth as usize * WQE_STRIDE as usize;
    let cq_bytes = config.cq_depth as usize * CQE_BYTES as usize;
    let mut taken = (None, None, None);
    let made = with_space_mut(|space| {
        taken.0 = Some(space.malloc(sq_bytes, device)?);
        taken.1 = Some(space.malloc(cq_bytes, device)?);
        taken.2 = Some(space.take_register_page()?);
        Ok(())
    });
    let undo = |taken: (Option<usize>, Option<usize>, Option<usize>)| {
        let _ = with_space_mut(|space| {
            taken.0.into_iter().chain(taken.1).for_each(|address| {
                let _ = space.free(address);
            });
            taken.2.into_iter().for_each(|address| space.give_register_page(address));
            Ok(())
        });
    };
    let (Ok(()), (Some(sq), Some(cq), Some(page))) = (made, taken) else {
        undo(taken);
        return Err(NicError::Device(made.err().unwrap_or(ACL_ERROR_RT_INTERNAL_ERROR)));
    };
    let zeroed = write_device(sq as u64, &vec![0; sq_bytes]).and_then(|()| write_device(cq as u64, &vec![0; cq_bytes]));
    if let Err(code) = zeroed {
        undo(taken);
        return Err(NicError::Device(code));
    }
    let qpn = nic.next_qpn.fetch_add(1, Ordering::Relaxed) & DB_TAG_MASK as u32;
    let info = QpInfo {
        device,
        qpn,
        // One CQ per QP; its number is the QPN's (a choice: numbers need only be unique per NIC).
        cqn: qpn,
        sq_base: sq as u64,
        cq_base: cq as u64,
        sq_db_addr: page as u64 + SQ_DOORBELL_OFFSET,
        cq_db_addr: page as u64 + CQ_DOORBELL_OFFSET,
        sq_depth: config.sq_depth,
        cq_depth: config.cq_depth,
    };
    let qp = Arc::new(Qp {
        info,
        config,
        page: page as u64,
        inner: Mutex::new(QpInner {
            state: QpState::Init,
            peer: None,
            exception: None,
            producer: 0,
            head: 0,
            cq_producer: 0,
            cq_consumer: 0,
            first_error: None,
            cq_broken: false,
            cqes_lost: 0,
            shutdown: false,
            inbox: VecDeque::new(),
            inbox_bytes: 0,
        }),
        wake: Condvar::new(),
        handoff: Mutex::new(None),
        responders: Mutex::new(VecDeque::new()),
        engine: Mutex::new(None),
        readers: Mutex::new(Vec::new()),
        activity: config.wake_block.map(|block| crate::activity::Activity::of(device, block)),
        provenance: Arc::new(crate::provenance::qp::QpProvenance::new(
            device,
            info.sq_base,
            info.sq_depth,
            info.cq_base,
            info.cq_depth,
        )),
    });
    let (engine_nic, engine_qp) = (Arc::clone(&nic), Arc::clone(&qp));
    let handle = match spawn(format!("cann-twin-nic-d{device}q{qpn:x}"), move || engine_qp.run(&engine_nic)) {
        Ok(handle) => handle,
        Err(error) => {
            undo(taken);
            return Err(error);
        }
    };
    *lock(&qp.engine) = Some(handle);
    crate::provenance::qp::watch(&qp.provenance);
    lock(&nic.qps).insert(qpn, Arc::clone(&qp));
    // Before the first page exists: the register writes to it come here.
    crate::sdma::on_other_register_write(register_write);
    NIC_PAGES.write().unwrap_or_else(|p| p.into_inner()).insert(page as u64, qp);
    nic.counters.qps_created.fetch_add(1, Ordering::Relaxed);
    Ok(info)
}

/// Connects QP `qpn` of `device` to QP `remote_qpn` of the NIC at `peer` (INIT to RTR to RTS): a TCP connection and
/// a handshake naming the remote QP, which must exist, within [`CONNECT_WAIT`].
pub fn connect_qp(device: i32, qpn: u32, peer: SocketAddr, remote_qpn: u32) -> Result<(), NicError> {
    let nic = nic(device)?;
    let qp = lock(&nic.qps).get(&qpn).cloned().ok_or(NicError::NoSuchQp { device, qpn })?;
    let state = lock(&qp.inner).state;
    if state != QpState::Init {
        return Err(NicError::WrongState { qpn, state });
    }
    let deadline = Instant::now() + CONNECT_WAIT;
    let conn = handshake(peer, remote_qpn, qpn, deadline, &|| false)
        .map_err(|error| NicError::Handshake(format!("{peer} QP {remote_qpn:#x}: {error}")))?;
    let mut inner = lock(&qp.inner);
    if inner.state != QpState::Init {
        return Err(NicError::WrongState { qpn, state: inner.state });
    }
    *lock(&qp.handoff) = Some(conn);
    inner.peer = Some((peer, remote_qpn));
    inner.state = QpState::ReadyToSend;
    qp.wake.notify_all();
    Ok(())
}

/// Destroys QP `qpn` of `device`: joins its engine and its connection's reader (the WQEs in flight are abandoned
/// without CQEs), frees its queues and its register page.
pub fn destroy_qp(device: i32, qpn: u32) -> Result<(), NicError> {
    let nic = nic(device)?;
    let qp = lock(&nic.qps).remove(&qpn).ok_or(NicError::NoSuchQp { device, qpn })?;
    match qp.destroy(Instant::now() + JOIN_WAIT) {
        0 => Ok(()),
        left => Err(NicError::ThreadsLeft(left)),
    }
}

/// QP `qpn` of `device` as its engine sees it.
pub fn qp_status(device: i32, qpn: u32) -> Result<QpStatus, NicError> {
    let nic = nic(device)?;
    let qp = lock(&nic.qps).get(&qpn).cloned().ok_or(NicError::NoSuchQp { device, qpn })?;
    let inner = lock(&qp.inner);
    Ok(QpStatus {
        state: inner.state,
        exception: inner.exception,
        sq_producer: inner.producer,
        sq_head: inner.head,
        cq_producer: inner.cq_producer,
        cq_consumer: inner.cq_consumer,
        first_error: inner.first_error,
        cqes_lost: inner.cqes_lost,
    })
}

fn qp_of(device: i32, qpn: u32) -> Result<Arc<Qp>, NicError> {
    lock(&nic(device)?.qps).get(&qpn).cloned().ok_or(NicError::NoSuchQp { device, qpn })
}

/// QP `qpn`'s provenance tallies since it was created, while the records were on
/// ([`crate::control::record_provenance`]): in the [`crate::control::Provenance`] fields, `sqes_*` count the WQEs
/// the NIC took by who wrote their 64 bytes last, `doorbells_*` the accepted SQ doorbells by origin (the Host's
/// [`crate::register_write`] is "unknown"), and `flags_*` the CQEs written by who first read them.
pub fn qp_provenance(device: i32, qpn: u32) -> Result<crate::control::Provenance, NicError> {
    Ok(qp_of(device, qpn)?.provenance.records.snapshot())
}

/// Appends to `out` QP `qpn`'s log entries from position `from` on, one per WQE completed while the records were on,
/// in WQE order: who wrote it, who rang the SQ doorbells since the NIC's previous take of a WQE that found new ones
/// (and the count of accepted SQ doorbells when it took it), and for a WQE with a CQE who read the CQE first (`flag`;
/// `None`: an unsignaled WQE, or its CQE was lost). Returns the position of the first entry appended and the position
/// after the last, as [`crate::control::sqe_log`] does.
pub fn qp_log(
    device: i32,
    qpn: u32,
    from: u64,
    out: &mut Vec<crate::control::LoggedSqe>,
) -> Result<(u64, u64), NicError> {
    Ok(qp_of(device, qpn)?.provenance.records.read_log(from, out))
}

/// Where QP `qpn`'s next log entry goes.
pub fn qp_log_position(device: i32, qpn: u32) -> Result<u64, NicError> {
    Ok(qp_of(device, qpn)?.provenance.records.log_position())
}

/// Drops (`true`) or restores `device`'s link: while down the NIC answers nothing (frames it receives are lost) and
/// sends nothing (its requests time out), as with `ip link down`; connections stay open.
pub fn set_link_down(device: i32, down: bool) -> Result<(), NicError> {
    nic(device)?.link_down.store(down, Ordering::Release);
    Ok(())
}

/// Makes `device`'s NIC, as target, lose the responses to the next `count` requests it serves: the request is
/// applied (a WRITE) or read (a READ), the ACK or READ_RESPONSE never leaves. The initiator times out and goes back
/// N; a WRITE is not applied twice.
pub fn drop_responses(device: i32, count: u32) -> Result<(), NicError> {
    nic(device)?.drop_responses.store(count, Ordering::Release);
    Ok(())
}

/// `device`'s NIC counters since [`open`].
pub fn counters(device: i32) -> Result<NicCounters, NicError> {
    let nic = nic(device)?;
    let c = &nic.counters;
    Ok(NicCounters {
        qps_created: c.qps_created.load(Ordering::Relaxed),
        wqes_executed: c.wqes_executed.load(Ordering::Relaxed),
        cqes_written: c.cqes_written.load(Ordering::Relaxed),
        retries: c.retries.load(Ordering::Relaxed),
        requests_served: c.requests_served.load(Ordering::Relaxed),
        requests_refused: c.requests_refused.load(Ordering::Relaxed),
        writes_applied: c.writes_applied.load(Ordering::Relaxed),
        duplicates_answered: c.duplicates_answered.load(Ordering::Relaxed),
        requests_dropped: c.requests_dropped.load(Ordering::Relaxed),
    })
}

/// A device write to `device_va` by `origin` (a `WRITER_*` id of the provenance records) if it lies in a NIC QP's
/// register page (`None`: not a NIC page). Called by the SDMA register path when its own registry misses.
pub(crate) fn register_write(device_va: u64, bytes: &[u8], origin: u32) -> Option<Result<(), RegisterFault>> {
    let base = device_va - device_va % page() as u64;
    let qp = NIC_PAGES.read().unwrap_or_else(|p| p.into_inner()).get(&base).cloned()?;
    if divert::park(qp.info.device, qp.info.qpn, device_va - base, bytes, origin) {
        return Some(Ok(()));
    }
    Some(qp.doorbell(device_va - base, bytes, origin))
}

impl Nic {
    /// The registration `rkey` names, if `[va, va + len)` lies inside it and it grants the right.
    fn check_remote(&self, rkey: u32, va: u64, len: u64, write: bool) -> bool {
        self.regions.read().unwrap_or_else(|p| p.into_inner()).iter().any(|r| {
            r.keys.rkey == rkey && r.holds(va, len) && if write { r.access.remote_write } else { r.access.remote_read }
        })
    }

    fn check_local(&self, lkey: u32, va: u64, len: u64) -> bool {
        self.regions.read().unwrap_or_else(|p| p.into_inner()).iter().any(|r| r.keys.lkey == lkey && r.holds(va, len))
    }
}

/// Applies SQ doorbell `word` to QP `qpn` of `device` with the Host as its origin (validated as any doorbell: a
/// wrong tag, command or producer index is refused and puts the QP in error).
pub fn host_ring_sq_doorbell(device: i32, qpn: u32, word: u64) -> Result<(), divert::HostRingError> {
    let qp = qp_of(device, qpn).map_err(divert::HostRingError::Nic)?;
    qp.doorbell(SQ_DOORBELL_OFFSET, &word.to_le_bytes(), crate::provenance::WRITER_HOST)
        .map_err(divert::HostRingError::Refused)
}
