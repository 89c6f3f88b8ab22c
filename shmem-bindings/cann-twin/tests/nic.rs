//! The twin NIC, driven as the kernel will drive it: WQEs written into the SQ with `aclrtMemcpy` H2D, the SQ and CQ
//! doorbells rung with `register_write` (the entry an emulated core's `copy_ubuf_to_gm` to a register page reaches),
//! CQEs polled D2H by owner bit, data checked D2H. Two NICs on two twin devices of this process over loopback. The
//! WQE, CQE and doorbell words are built here from docs/rdma.md, not from the twin's decoder.
//!
//! Device pairs: (0, 1) shared by the tests that leave both NICs as they found them, each on QPs of its own; the
//! tests that change a whole NIC (link down, lost responses, close) have a pair each.

mod common;

use core::ffi::c_void;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cann_twin::control::{Doer, FlagReader};
use cann_twin::nic::{self, status, Access, MemoryKeys, QpConfig, QpFault, QpInfo, QpState};
use cann_twin::{register_write, RegisterFault};
use common::{api, download, malloc, pattern, upload};

const WAIT: Duration = Duration::from_secs(5);
const WRITE: u32 = 3;
const READ: u32 = 5;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("an address")
}

/// NICs on devices 0 and 1, opened once.
fn shared_pair() -> (i32, i32) {
    static OPENED: OnceLock<()> = OnceLock::new();
    OPENED.get_or_init(|| {
        nic::open(0, loopback()).expect("NIC 0 opens");
        nic::open(1, loopback()).expect("NIC 1 opens");
    });
    (0, 1)
}

/// One side of a connected QP as the kernel would drive it: the producer and consumer indices.
struct Driver {
    info: QpInfo,
    pi: u32,
    ci: u32,
}

/// A decoded CQE (docs/rdma.md section 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cqe {
    opcode: u32,
    owner: bool,
    status: u32,
    wqe_index: u32,
    qpn: u32,
    bytes: u32,
}

fn decode_cqe(raw: &[u8]) -> Cqe {
    let word = |at: usize| u32::from_le_bytes(raw[at..at + 4].try_into().expect("4 bytes"));
    Cqe {
        opcode: word(0) & 0x1F,
        owner: word(0) >> 7 & 1 == 1,
        status: word(0) >> 8 & 0xFF,
        wqe_index: word(0) >> 16,
        qpn: word(12) & 0xFF_FFFF,
        bytes: word(16),
    }
}

/// A QP on `initiator` connected to a QP on `target` (which is left in INIT: it only serves as the remote end).
fn connect(initiator: i32, target: i32, config: QpConfig) -> (Driver, QpInfo) {
    let local = nic::create_qp(initiator, config).expect("the initiator's QP");
    let remote = nic::create_qp(target, config).expect("the target's QP");
    let peer = nic::address(target).expect("the target listens");
    nic::connect_qp(initiator, local.qpn, peer, remote.qpn).expect("the QP connects");
    (Driver { info: local, pi: 0, ci: 0 }, remote)
}

/// Device memory of `len` bytes filled with `seed`'s pattern, registered on `device` with `access`.
fn buffer(device: i32, len: usize, seed: u8, access: Access) -> (u64, MemoryKeys, Vec<u8>) {
    let base = malloc(api(), len);
    let content = pattern(len, seed);
    upload(api(), base, &content);
    let keys = nic::register_memory(device, base as u64, len as u64, access).expect("registers");
    (base as u64, keys, content)
}

/// An SQ slot: the WQE and its SGE (docs/rdma.md section 1), signaled, with the owner bit for producer index `pi`.
#[allow(clippy::too_many_arguments)]
fn slot(opcode: u32, pi: u32, depth: u32, len: u32, rkey: u32, remote: u64, lkey: u32, local: u64) -> [u8; 64] {
    let mut raw = [0u8; 64];
    let owner = if pi & depth != 0 { 0 } else { 1 << 7 };
    raw[0..4].copy_from_slice(&(opcode | owner | 1 << 8).to_le_bytes());
    raw[4..8].copy_from_slice(&len.to_le_bytes());
    raw[12..16].copy_from_slice(&(1u32 << 24).to_le_bytes());
    raw[20..24].copy_from_slice(&rkey.to_le_bytes());
    raw[24..32].copy_from_slice(&remote.to_le_bytes());
    raw[32..36].copy_from_slice(&len.to_le_bytes());
    raw[36..40].copy_from_slice(&lkey.to_le_bytes());
    raw[40..48].copy_from_slice(&local.to_le_bytes());
    raw
}

impl Driver {
    /// Writes `raw` into the next SQ slot (H2D); not rung.
    fn post_raw(&mut self, raw: [u8; 64]) {
        let at = self.info.sq_base + 64 * u64::from(self.pi & (self.info.sq_depth - 1));
        upload(api(), at as *mut c_void, &raw);
        self.pi = self.pi.wrapping_add(1);
    }

    #[allow(clippy::too_many_arguments)]
    fn post(&mut self, opcode: u32, len: u32, rkey: u32, remote: u64, lkey: u32, local: u64) {
        let raw = slot(opcode, self.pi, self.info.sq_depth, len, rkey, remote, lkey, local);
        self.post_raw(raw);
    }

    /// The SQ doorbell: QPN, command 0, producer index mod 65536 at bit 32.
    fn ring(&self) {
        let word = u64::from(self.info.qpn) | u64::from(self.pi & 0xFFFF) << 32;
        register_write(self.info.sq_db_addr, &word.to_le_bytes()).expect("the SQ doorbell is accepted");
    }

    fn cqe_at(&self, index: u32) -> Cqe {
        let at = self.info.cq_base + 32 * u64::from(index & (self.info.cq_depth - 1));
        decode_cqe(&download(api(), at as *const c_void, 32))
    }

    /// The next new CQE (owner bit differs from the lap bit of the consumer index), consumed; not released.
    fn poll(&mut self) -> Cqe {
        let started = Instant::now();
        loop {
            let cqe = self.cqe_at(self.ci);
            if cqe.owner != (self.ci & self.info.cq_depth != 0) {
                self.ci = self.ci.wrapping_add(1);
                return cqe;
            }
            assert!(started.elapsed() < WAIT, "QP {:#x}: no CQE at {} within {WAIT:?}", self.info.qpn, self.ci);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The CQ doorbell (hardware mode): CQN, command 3, consumer index at bit 32, cmd_sn 1.
    fn release(&self) {
        let word = u64::from(self.info.cqn) | 3 << 24 | u64::from(self.ci & 0xFF_FFFF) << 32 | 1 << 56;
        register_write(self.info.cq_db_addr, &word.to_le_bytes()).expect("the CQ doorbell is accepted");
    }

    /// Posts one WQE, rings, returns its CQE (released).
    fn one(&mut self, opcode: u32, len: u32, rkey: u32, remote: u64, lkey: u32, local: u64) -> Cqe {
        self.post(opcode, len, rkey, remote, lkey, local);
        self.ring();
        let cqe = self.poll();
        self.release();
        cqe
    }
}

fn fast() -> QpConfig {
    QpConfig { timeout: Duration::from_millis(50), retry_count: 2, ..QpConfig::default() }
}

/// xorshift64, seeded from the clock; the seed is printed so that a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("NIC_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1
        });
        println!("NIC_TEST_SEED={seed}");
        Rng(seed)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn writes_and_reads_of_random_sizes_and_offsets_move_the_bytes() {
    let (a, b) = shared_pair();
    let len = 1 << 20;
    let (local, lkeys, mut local_model) = buffer(a, len, 3, Access::default());
    let (remote, rkeys, mut remote_model) = buffer(b, len, 200, Access::REMOTE_ALL);
    assert_ne!(lkeys.lkey, lkeys.rkey);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    let before = nic::counters(a).expect("counters");
    let mut rng = Rng::new();
    for round in 0..24u32 {
        let size = 1 + rng.below(64 << 10) as usize;
        let from = rng.below((len - size) as u64 + 1) as usize;
        let to = rng.below((len - size) as u64 + 1) as usize;
        let opcode = if round % 2 == 0 { WRITE } else { READ };
        let (local_at, remote_at) = if opcode == WRITE { (from, to) } else { (to, from) };
        let cqe =
            qp.one(opcode, size as u32, rkeys.rkey, remote + remote_at as u64, lkeys.lkey, local + local_at as u64);
        assert_eq!(
            cqe,
            Cqe {
                opcode,
                owner: cqe.owner,
                status: status::SUCCESS,
                wqe_index: round,
                qpn: qp.info.qpn,
                bytes: size as u32
            },
            "round {round}"
        );
        if opcode == WRITE {
            let moved = local_model[local_at..local_at + size].to_vec();
            remote_model[remote_at..remote_at + size].copy_from_slice(&moved);
        } else {
            let moved = remote_model[remote_at..remote_at + size].to_vec();
            local_model[local_at..local_at + size].copy_from_slice(&moved);
        }
    }
    assert!(download(api(), remote as *const c_void, len) == remote_model, "the target holds exactly what was written");
    assert!(download(api(), local as *const c_void, len) == local_model, "the initiator holds exactly what was read");
    // Several WQEs behind one doorbell, executed in order: a write, then a read of the same bytes back elsewhere.
    qp.post(WRITE, 4096, rkeys.rkey, remote, lkeys.lkey, local + 8192);
    qp.post(READ, 4096, rkeys.rkey, remote, lkeys.lkey, local + 3 * 4096);
    qp.ring();
    let (first, second) = (qp.poll(), qp.poll());
    qp.release();
    assert_eq!((first.status, first.wqe_index, second.status, second.wqe_index), (0, 24, 0, 25));
    let back = download(api(), (local + 3 * 4096) as *const c_void, 4096);
    assert!(back == local_model[8192..8192 + 4096], "the read saw the write before it");
    let after = nic::counters(a).expect("counters");
    assert!(after.wqes_executed - before.wqes_executed >= 26 && after.cqes_written - before.cqes_written >= 26);
    assert_eq!(nic::qp_status(a, qp.info.qpn).expect("status").state, QpState::ReadyToSend);
}

#[test]
fn a_message_of_megabytes_travels_in_one_piece_both_ways() {
    let (a, b) = shared_pair();
    let len = 4 << 20;
    let (local, lkeys, local_content) = buffer(a, 2 * len, 23, Access::default());
    let (remote, rkeys, _) = buffer(b, len, 24, Access::REMOTE_ALL);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    let cqe = qp.one(WRITE, len as u32, rkeys.rkey, remote, lkeys.lkey, local);
    assert_eq!((cqe.status, cqe.bytes), (status::SUCCESS, len as u32));
    assert!(download(api(), remote as *const c_void, len) == local_content[..len]);
    let cqe = qp.one(READ, len as u32, rkeys.rkey, remote, lkeys.lkey, local + len as u64);
    assert_eq!((cqe.status, cqe.bytes), (status::SUCCESS, len as u32));
    assert!(download(api(), (local + len as u64) as *const c_void, len) == local_content[..len]);
}

#[test]
fn an_out_of_bounds_remote_range_fails_with_remote_access_and_flushes_what_follows() {
    let (a, b) = shared_pair();
    let (local, lkeys, _) = buffer(a, 8192, 1, Access::default());
    let (remote, rkeys, remote_content) = buffer(b, 8192, 2, Access::REMOTE_ALL);
    // The registration covers the first 4096 bytes of the allocation only.
    nic::deregister_memory(b, rkeys.lkey).expect("deregisters");
    let small = nic::register_memory(b, remote, 4096, Access::REMOTE_ALL).expect("registers");
    let (mut qp, _) = connect(a, b, QpConfig::default());
    qp.post(WRITE, 200, small.rkey, remote + 4000, lkeys.lkey, local);
    qp.post(WRITE, 64, small.rkey, remote, lkeys.lkey, local);
    qp.ring();
    let failed = qp.poll();
    assert_eq!((failed.status, failed.wqe_index, failed.qpn), (status::REMOTE_ACCESS_ERR, 0, qp.info.qpn));
    let flushed = qp.poll();
    assert_eq!((flushed.status, flushed.wqe_index), (status::WR_FLUSH_ERR, 1), "an already-posted WQE is flushed");
    // Posted after the error: flushed too.
    let later = qp.one(READ, 64, small.rkey, remote, lkeys.lkey, local);
    assert_eq!((later.status, later.wqe_index), (status::WR_FLUSH_ERR, 2));
    assert!(download(api(), remote as *const c_void, 8192) == remote_content, "the target is untouched");
    let state = nic::qp_status(a, qp.info.qpn).expect("status");
    assert_eq!((state.state, state.first_error), (QpState::Error, Some((status::REMOTE_ACCESS_ERR, 0))));
}

#[test]
fn a_bad_rkey_or_a_missing_right_fails_with_remote_access() {
    let (a, b) = shared_pair();
    let (local, lkeys, local_content) = buffer(a, 4096, 5, Access::default());
    let (remote, rkeys, remote_content) = buffer(b, 4096, 6, Access::REMOTE_ALL);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    let cqe = qp.one(WRITE, 128, rkeys.rkey ^ 0x8000_0000, remote, lkeys.lkey, local);
    assert_eq!(cqe.status, status::REMOTE_ACCESS_ERR, "a key the target did not hand out");
    let cqe = qp.one(WRITE, 128, rkeys.rkey, remote, lkeys.lkey, local);
    assert_eq!(cqe.status, status::WR_FLUSH_ERR);
    // The lkey is not an rkey.
    let (mut qp, _) = connect(a, b, QpConfig::default());
    assert_eq!(qp.one(READ, 128, rkeys.lkey, remote, lkeys.lkey, local).status, status::REMOTE_ACCESS_ERR);
    // A read-only registration refuses writes and serves reads.
    let read_only =
        nic::register_memory(b, remote, 4096, Access { remote_read: true, remote_write: false }).expect("registers");
    let (mut qp, _) = connect(a, b, QpConfig::default());
    assert_eq!(qp.one(READ, 128, read_only.rkey, remote, lkeys.lkey, local).status, status::SUCCESS);
    assert_eq!(qp.one(WRITE, 128, read_only.rkey, remote, lkeys.lkey, local).status, status::REMOTE_ACCESS_ERR);
    assert!(download(api(), remote as *const c_void, 4096) == remote_content, "the target is untouched");
    let local_now = download(api(), local as *const c_void, 4096);
    assert!(local_now[..128] == remote_content[..128] && local_now[128..] == local_content[128..]);
}

#[test]
fn local_validation_names_the_fault() {
    let (a, b) = shared_pair();
    let (local, lkeys, _) = buffer(a, 4096, 7, Access::default());
    let (remote, rkeys, _) = buffer(b, 4096, 8, Access::REMOTE_ALL);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    assert_eq!(qp.one(WRITE, 64, rkeys.rkey, remote, lkeys.lkey ^ 1, local).status, status::LOCAL_PROT_ERR);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    assert_eq!(qp.one(WRITE, 64, rkeys.rkey, remote, lkeys.lkey, local + 4090).status, status::LOCAL_PROT_ERR);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    let too_long = nic::MAX_MESSAGE_BYTES + 1;
    assert_eq!(qp.one(WRITE, too_long, rkeys.rkey, remote, lkeys.lkey, local).status, status::LOCAL_LENGTH_ERR);
    // A QP that was never connected refuses its WQEs.
    let lonely = nic::create_qp(a, QpConfig::default()).expect("a QP");
    let mut qp = Driver { info: lonely, pi: 0, ci: 0 };
    assert_eq!(qp.one(WRITE, 64, rkeys.rkey, remote, lkeys.lkey, local).status, status::LOCAL_QP_OP_ERR);
    nic::destroy_qp(a, lonely.qpn).expect("destroyed");
    assert!(nic::qp_status(a, lonely.qpn).is_err());
}

#[test]
fn a_stale_owner_bit_is_a_local_qp_operation_error() {
    let (a, b) = shared_pair();
    let (local, lkeys, _) = buffer(a, 4096, 9, Access::default());
    let (remote, rkeys, remote_content) = buffer(b, 4096, 10, Access::REMOTE_ALL);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    // Slot 0 written with the owner bit of lap 1 (as a slot left from the previous lap would be).
    let mut raw = slot(WRITE, 0, qp.info.sq_depth, 64, rkeys.rkey, remote, lkeys.lkey, local);
    raw[0] &= !(1 << 7);
    qp.post_raw(raw);
    qp.ring();
    let cqe = qp.poll();
    assert_eq!((cqe.status, cqe.wqe_index), (status::LOCAL_QP_OP_ERR, 0));
    assert!(download(api(), remote as *const c_void, 4096) == remote_content, "nothing was sent");
}

#[test]
fn doorbells_of_the_wrong_width_offset_or_tag_stop_the_qp() {
    let (a, b) = shared_pair();
    let (local, lkeys, _) = buffer(a, 4096, 11, Access::default());
    let (remote, rkeys, _) = buffer(b, 4096, 12, Access::REMOTE_ALL);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    let word = u64::from(qp.info.qpn) | 1 << 32;
    let refused = register_write(qp.info.sq_db_addr, &(word as u32).to_le_bytes());
    assert_eq!(refused, Err(RegisterFault::QpRefused { device: a, qpn: qp.info.qpn, offset: 0, width: 4 }));
    let state = nic::qp_status(a, qp.info.qpn).expect("status");
    assert_eq!(state.state, QpState::Error);
    assert_eq!(state.exception.map(|e| e.fault), Some(QpFault::RegisterAccess { offset: 0, width: 4 }));
    // The QP is in error: a WQE rung properly now is flushed.
    assert_eq!(qp.one(WRITE, 64, rkeys.rkey, remote, lkeys.lkey, local).status, status::WR_FLUSH_ERR);

    let (qp, _) = connect(a, b, QpConfig::default());
    let bad_tag = u64::from(qp.info.qpn ^ 1) | 1 << 32;
    assert!(register_write(qp.info.sq_db_addr, &bad_tag.to_le_bytes()).is_err());
    let fault = nic::qp_status(a, qp.info.qpn).expect("status").exception.map(|e| e.fault);
    assert_eq!(fault, Some(QpFault::DoorbellTag { offset: 0, tag: qp.info.qpn ^ 1 }));

    // Through the C entry (the CPU AscendC layer's): a CQ doorbell of 4 bytes is refused with -2.
    let (qp, _) = connect(a, b, QpConfig::default());
    let short = [0u8; 4];
    // SAFETY: `short` is valid for its 4 bytes.
    assert_eq!(unsafe { cann_twin::aiv_twin_register_write(qp.info.cq_db_addr, short.as_ptr(), 4) }, -2);
    let fault = nic::qp_status(a, qp.info.qpn).expect("status").exception.map(|e| e.fault);
    assert_eq!(fault, Some(QpFault::RegisterAccess { offset: 8, width: 4 }));

    let (qp, _) = connect(a, b, QpConfig::default());
    assert!(register_write(qp.info.sq_db_addr + 0x10, &0u64.to_le_bytes()).is_err());
    let fault = nic::qp_status(a, qp.info.qpn).expect("status").exception.map(|e| e.fault);
    assert_eq!(fault, Some(QpFault::RegisterAccess { offset: 0x10, width: 8 }));

    // A producer index more than the SQ's depth ahead of the NIC.
    let (qp, _) = connect(a, b, QpConfig::default());
    let ahead = qp.info.sq_depth + 1;
    let word = u64::from(qp.info.qpn) | u64::from(ahead) << 32;
    assert!(register_write(qp.info.sq_db_addr, &word.to_le_bytes()).is_err());
    let fault = nic::qp_status(a, qp.info.qpn).expect("status").exception.map(|e| e.fault);
    assert_eq!(fault, Some(QpFault::SqOverflow { producer: ahead, head: 0, depth: qp.info.sq_depth }));

    // The SQ command at the CQ doorbell's offset.
    let (qp, _) = connect(a, b, QpConfig::default());
    assert!(register_write(qp.info.cq_db_addr, &(u64::from(qp.info.cqn) | 1 << 32).to_le_bytes()).is_err());
    let fault = nic::qp_status(a, qp.info.qpn).expect("status").exception.map(|e| e.fault);
    assert_eq!(fault, Some(QpFault::DoorbellCommand { offset: 8, command: 0 }));

    let (qp, _) = connect(a, b, QpConfig::default());
    // The CQ doorbell releasing CQEs never written.
    let word = u64::from(qp.info.cqn) | 3 << 24 | 5 << 32 | 1 << 56;
    assert!(register_write(qp.info.cq_db_addr, &word.to_le_bytes()).is_err());
    let fault = nic::qp_status(a, qp.info.qpn).expect("status").exception.map(|e| e.fault);
    assert_eq!(fault, Some(QpFault::CqBeyondProducer { consumer: 5, producer: 0 }));
}

#[test]
fn cq_owner_bits_flip_across_laps_and_a_full_cq_holds_the_nic_back() {
    let (a, b) = shared_pair();
    let (local, lkeys, _) = buffer(a, 4096, 13, Access::default());
    let (remote, rkeys, _) = buffer(b, 4096, 14, Access::REMOTE_ALL);
    let config = QpConfig { sq_depth: 8, cq_depth: 4, ..QpConfig::default() };
    let (mut qp, _) = connect(a, b, config);
    let mut expected_index = 0u32;
    for batch in [3u32, 1, 2, 3, 1] {
        for i in 0..batch {
            qp.post(WRITE, 32, rkeys.rkey, remote + 64 * u64::from(i), lkeys.lkey, local);
        }
        qp.ring();
        for _ in 0..batch {
            let lap = qp.ci & config.cq_depth != 0;
            let cqe = qp.poll();
            assert_eq!(cqe.owner, !lap, "the owner bit is the inverse of the lap bit");
            assert_eq!((cqe.status, cqe.wqe_index), (status::SUCCESS, expected_index));
            expected_index += 1;
        }
        qp.release();
    }
    assert_eq!(qp.ci, 10, "more CQEs than the CQ holds, over three laps");
    // Six WQEs, nothing released: the NIC writes four and waits for the consumer.
    for i in 0..6 {
        qp.post(WRITE, 32, rkeys.rkey, remote + 64 * i, lkeys.lkey, local);
    }
    qp.ring();
    let started = Instant::now();
    while nic::qp_status(a, qp.info.qpn).expect("status").cq_producer != 14 {
        assert!(started.elapsed() < WAIT, "the NIC did not fill the CQ");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(100));
    let state = nic::qp_status(a, qp.info.qpn).expect("status");
    assert_eq!((state.cq_producer, state.sq_head, state.state), (14, 14, QpState::ReadyToSend), "the NIC waits");
    let oldest = qp.cqe_at(qp.ci);
    assert_eq!(oldest.wqe_index, 10, "the oldest unreleased CQE was not overwritten");
    for index in 10..16 {
        assert_eq!(qp.poll().wqe_index, index);
        qp.release();
    }
    // A consumer that never releases: after cq_full_wait, a CQ overrun on the QP.
    let config = QpConfig { sq_depth: 8, cq_depth: 2, cq_full_wait: Duration::from_millis(100), ..QpConfig::default() };
    let (mut qp, _) = connect(a, b, config);
    for _ in 0..3 {
        qp.post(WRITE, 32, rkeys.rkey, remote, lkeys.lkey, local);
    }
    qp.ring();
    let started = Instant::now();
    let fault = loop {
        if let Some(exception) = nic::qp_status(a, qp.info.qpn).expect("status").exception {
            break exception.fault;
        }
        assert!(started.elapsed() < WAIT, "no CQ overrun");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(fault, QpFault::CqOverrun { wqe_index: 2 });
}

#[test]
fn a_dropped_link_ends_in_transport_retry_exceeded_and_a_new_qp_works_once_restored() {
    let (a, b) = (2, 3);
    nic::open(a, loopback()).expect("opens");
    nic::open(b, loopback()).expect("opens");
    let (local, lkeys, local_content) = buffer(a, 4096, 15, Access::default());
    let (remote, rkeys, remote_content) = buffer(b, 4096, 16, Access::REMOTE_ALL);
    let config = fast();
    let (mut qp, _) = connect(a, b, config);
    assert_eq!(qp.one(WRITE, 16, rkeys.rkey, remote, lkeys.lkey, local).status, status::SUCCESS);
    cann_twin::control::nic_link_down(b, true).expect("the link drops");
    let retries = cann_twin::control::nic_counters(a).expect("counters").retries;
    let started = Instant::now();
    qp.post(WRITE, 64, rkeys.rkey, remote + 64, lkeys.lkey, local + 64);
    qp.post(READ, 64, rkeys.rkey, remote, lkeys.lkey, local + 128);
    qp.ring();
    let cqe = qp.poll();
    let took = started.elapsed();
    let attempts = u32::from(config.retry_count) + 1;
    assert_eq!((cqe.status, cqe.wqe_index), (status::TRANSPORT_RETRY_EXC_ERR, 1));
    assert!(took >= config.timeout * attempts - Duration::from_millis(5), "every attempt waited: {took:?}");
    assert!(took < config.timeout * attempts + Duration::from_millis(750), "bounded: {took:?}");
    assert_eq!(qp.poll().status, status::WR_FLUSH_ERR);
    // Both requests were outstanding together: each retransmission round (go back N) sent both again.
    let counted = cann_twin::control::nic_counters(a).expect("counters").retries - retries;
    assert_eq!(counted, 2 * u64::from(config.retry_count));
    // While down, a new QP cannot even connect.
    let waiting = nic::create_qp(a, config).expect("a QP");
    let target = nic::create_qp(b, config).expect("a QP");
    let peer = nic::address(b).expect("listens");
    assert!(matches!(nic::connect_qp(a, waiting.qpn, peer, target.qpn), Err(nic::NicError::Handshake(_))));
    cann_twin::control::nic_link_down(b, false).expect("the link is back");
    let (mut qp, _) = connect(a, b, config);
    assert_eq!(qp.one(WRITE, 64, rkeys.rkey, remote + 256, lkeys.lkey, local).status, status::SUCCESS);
    let now = download(api(), remote as *const c_void, 4096);
    assert!(now[256..320] == local_content[..64], "the new QP wrote");
    assert!(now[64..128] == remote_content[64..128], "the WRITE that timed out was never applied");
    nic::close(a).expect("closes");
    nic::close(b).expect("closes");
}

#[test]
fn a_lost_ack_is_retransmitted_and_the_write_applied_once() {
    let (a, b) = (4, 5);
    nic::open(a, loopback()).expect("opens");
    nic::open(b, loopback()).expect("opens");
    let (local, lkeys, local_content) = buffer(a, 4096, 17, Access::default());
    let (remote, rkeys, _) = buffer(b, 4096, 18, Access::REMOTE_ALL);
    let config = QpConfig { timeout: Duration::from_millis(300), ..fast() };
    let (mut qp, _) = connect(a, b, config);
    nic::drop_responses(b, 1).expect("the next ACK is lost");
    let served = nic::counters(b).expect("counters").requests_served;
    qp.post(WRITE, 64, rkeys.rkey, remote, lkeys.lkey, local);
    qp.ring();
    let started = Instant::now();
    while nic::counters(b).expect("counters").requests_served == served {
        assert!(started.elapsed() < WAIT, "the target never saw the WRITE");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Applied once; now overwritten by someone else before the retransmission arrives.
    assert!(download(api(), remote as *const c_void, 64) == local_content[..64]);
    let marker = vec![0xEE; 64];
    upload(api(), remote as *mut c_void, &marker);
    let cqe = qp.poll();
    assert_eq!(cqe.status, status::SUCCESS, "the retransmission was acknowledged");
    assert!(nic::counters(a).expect("counters").retries >= 1);
    assert!(download(api(), remote as *const c_void, 64) == marker, "the retransmitted WRITE was not applied again");
    // A READ whose response is lost is simply read again.
    nic::drop_responses(b, 1).expect("the next response is lost");
    qp.release();
    assert_eq!(qp.one(READ, 64, rkeys.rkey, remote, lkeys.lkey, local + 64).status, status::SUCCESS);
    assert!(download(api(), (local + 64) as *const c_void, 64) == marker);
    nic::close(a).expect("closes");
    nic::close(b).expect("closes");
}

#[test]
fn malformed_frames_close_their_connection_only() {
    use std::io::{Read, Write};
    let (a, b) = shared_pair();
    let peer = nic::address(b).expect("listens");
    for garbage in [&[0xFF, 0xFF, 0xFF, 0xFF][..], &[1, 0, 0, 0, 0x77], &[5, 0, 0, 0, 1, 0, 0, 0, 0]] {
        let mut stream = std::net::TcpStream::connect(peer).expect("connects");
        stream.set_read_timeout(Some(WAIT)).expect("a timeout");
        stream.write_all(garbage).expect("sends");
        let mut byte = [0u8; 1];
        let read = stream.read(&mut byte);
        assert!(matches!(read, Ok(0) | Err(_)), "the NIC closed the connection: {read:?}");
    }
    // Random bytes, with a plausible length prefix or none: each connection ends (closed or left unanswered),
    // and the NIC goes on serving.
    let mut rng = Rng::new();
    for _ in 0..16 {
        let mut stream = std::net::TcpStream::connect(peer).expect("connects");
        stream.set_read_timeout(Some(Duration::from_millis(50))).expect("a timeout");
        let len = rng.below(48) as usize;
        let mut garbage: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
        if rng.below(2) == 0 {
            let mut framed = (len as u32).to_le_bytes().to_vec();
            framed.append(&mut garbage);
            garbage = framed;
        }
        let _ = stream.write_all(&garbage);
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply);
    }
    let (local, lkeys, _) = buffer(a, 4096, 19, Access::default());
    let (remote, rkeys, _) = buffer(b, 4096, 20, Access::REMOTE_ALL);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    assert_eq!(qp.one(WRITE, 64, rkeys.rkey, remote, lkeys.lkey, local).status, status::SUCCESS, "still serving");
}

#[test]
fn close_joins_every_thread_and_the_device_can_open_again() {
    let (a, b) = (6, 7);
    nic::open(a, loopback()).expect("opens");
    nic::open(b, loopback()).expect("opens");
    assert_eq!(nic::open(a, loopback()), Err(nic::NicError::AlreadyOpen(a)));
    let (local, lkeys, _) = buffer(a, 4096, 21, Access::default());
    let (remote, rkeys, _) = buffer(b, 4096, 22, Access::REMOTE_ALL);
    let config = fast();
    let (mut first, _) = connect(a, b, config);
    let (mut second, _) = connect(a, b, config);
    assert_eq!(first.one(WRITE, 64, rkeys.rkey, remote, lkeys.lkey, local).status, status::SUCCESS);
    assert_eq!(second.one(WRITE, 64, rkeys.rkey, remote, lkeys.lkey, local).status, status::SUCCESS);
    // The target NIC closes: its connections end and nothing listens. The next WQE is retried (every reconnection
    // refused) until the retry count is spent.
    nic::close(b).expect("every thread of NIC 7 ends");
    let started = Instant::now();
    let cqe = first.one(WRITE, 64, rkeys.rkey, remote, lkeys.lkey, local);
    assert_eq!(cqe.status, status::TRANSPORT_RETRY_EXC_ERR);
    let attempts = u32::from(config.retry_count) + 1;
    assert!(started.elapsed() < config.timeout * attempts + Duration::from_millis(750), "{:?}", started.elapsed());
    // A WQE in flight (being retried) when the initiator's NIC closes: abandoned, and every thread joined. Closed once
    // the NIC has retried it.
    let retried = nic::counters(a).expect("counters").retries;
    second.post(WRITE, 64, rkeys.rkey, remote, lkeys.lkey, local);
    second.ring();
    let started = Instant::now();
    while nic::counters(a).expect("counters").retries == retried {
        assert!(started.elapsed() < WAIT, "the NIC did not retry the WQE to the closed target");
        std::thread::sleep(Duration::from_millis(1));
    }
    let started = Instant::now();
    // `close` joins every thread it started (listener, responders, QP engines) or says how many were left.
    nic::close(a).expect("every thread of NIC 6 ends");
    assert!(started.elapsed() < nic::JOIN_WAIT);
    assert_eq!(nic::register_memory(a, local, 64, Access::default()), Err(nic::NicError::NotOpen(a)));
    nic::open(a, loopback()).expect("opens again");
    nic::close(a).expect("closes");
}

/// MB/s of plain TCP on 127.0.0.1: `messages` of `size` bytes written by one thread, read by another into a buffer.
fn tcp_bandwidth(size: usize, messages: usize) -> f64 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind(loopback()).expect("binds");
    let address = listener.local_addr().expect("an address");
    let reader = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accepts");
        let mut buffer = vec![0u8; size];
        for _ in 0..messages {
            stream.read_exact(&mut buffer).expect("reads");
        }
        stream.write_all(&[1]).expect("answers");
    });
    let mut stream = std::net::TcpStream::connect(address).expect("connects");
    stream.set_nodelay(true).expect("nodelay");
    let message = pattern(size, 1);
    let started = Instant::now();
    for _ in 0..messages {
        stream.write_all(&message).expect("writes");
    }
    let mut done = [0u8; 1];
    stream.read_exact(&mut done).expect("the reader is done");
    let took = started.elapsed();
    reader.join().expect("the reader ends");
    (size * messages) as f64 / took.as_secs_f64() / 1e6
}

/// Bandwidth of 1 MiB RDMA WRITEs between two twin NICs on 127.0.0.1 against plain TCP on the same link: rounds
/// alternating plain TCP, a QP with the default window and a QP with one request outstanding; medians printed. Run
/// with `cargo test --release -p cann-twin --test nic -- --ignored --nocapture bandwidth`.
#[test]
#[ignore = "a measurement: prints MB/s"]
fn bandwidth_of_1_mib_writes_against_plain_tcp() {
    let (a, b) = (8, 9);
    nic::open(a, loopback()).expect("opens");
    nic::open(b, loopback()).expect("opens");
    let size = 1usize << 20;
    let slots = 16usize;
    let (local, lkeys, _) = buffer(a, size * slots, 25, Access::default());
    let (remote, rkeys, _) = buffer(b, size * slots, 26, Access::REMOTE_ALL);
    let (mut windowed, _) = connect(a, b, QpConfig::default());
    let (mut serial, _) = connect(a, b, QpConfig { max_outstanding: 1, ..QpConfig::default() });
    let batch = 32usize;
    let per_round = 4usize;
    let run = |qp: &mut Driver| {
        let started = Instant::now();
        for _ in 0..per_round {
            for i in 0..batch {
                let at = (i % slots * size) as u64;
                qp.post(WRITE, size as u32, rkeys.rkey, remote + at, lkeys.lkey, local + at);
            }
            qp.ring();
            for _ in 0..batch {
                assert_eq!(qp.poll().status, status::SUCCESS);
            }
            qp.release();
        }
        (size * batch * per_round) as f64 / started.elapsed().as_secs_f64() / 1e6
    };
    run(&mut windowed);
    run(&mut serial);
    let (mut tcp, mut rdma, mut one) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        tcp.push(tcp_bandwidth(size, batch * per_round));
        rdma.push(run(&mut windowed));
        one.push(run(&mut serial));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (tcp, rdma, one) = (median(tcp), median(rdma), median(one));
    println!(
        "1 MiB WRITEs, medians of 7 rounds of 128 MiB: plain TCP {tcp:.0} MB/s; RDMA window {} {rdma:.0} MB/s \
         (ratio {:.2}); RDMA one outstanding {one:.0} MB/s (ratio {:.2})",
        nic::DEFAULT_OUTSTANDING,
        rdma / tcp,
        one / tcp
    );
    nic::close(a).expect("closes");
    nic::close(b).expect("closes");
}

#[test]
fn a_wake_block_is_signalled_after_every_cqe_and_only_then() {
    let (a, b) = shared_pair();
    // Blocks no kernel of this test binary runs: their activity moves only by this QP's CQEs.
    let (block, other) = (901, 902);
    let (local, lkeys, _) = buffer(a, 4096, 27, Access::default());
    let (remote, rkeys, _) = buffer(b, 4096, 28, Access::REMOTE_ALL);
    let (mut qp, _) = connect(a, b, QpConfig { wake_block: Some(block), ..QpConfig::default() });
    let (before, other_before) =
        (cann_twin::control::core_activity(a, block), cann_twin::control::core_activity(a, other));
    for i in 0..3 {
        qp.post(WRITE, 64, rkeys.rkey, remote + 64 * i, lkeys.lkey, local);
    }
    qp.ring();
    for _ in 0..3 {
        assert_eq!(qp.poll().status, status::SUCCESS);
    }
    qp.release();
    // The signal follows the CQE's write: wait for the last one.
    let started = Instant::now();
    while cann_twin::control::core_activity(a, block) - before < 3 {
        assert!(started.elapsed() < WAIT, "three CQEs, fewer signals");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(cann_twin::control::core_activity(a, block) - before, 3, "one signal per CQE");
    assert_eq!(cann_twin::control::core_activity(a, other), other_before, "another block is not signalled");
    assert_eq!(cann_twin::control::core_activity(b, block), 0, "nor the same block of the target's device");
}

#[test]
fn many_wqes_in_flight_complete_in_order_with_their_bytes() {
    let (a, b) = shared_pair();
    let (chunk, count) = (48usize << 10, 32usize);
    let (local, lkeys, local_content) = buffer(a, 2 * chunk * count, 29, Access::default());
    let (remote, rkeys, remote_content) = buffer(b, 2 * chunk * count, 30, Access::REMOTE_ALL);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    // WRITEs of the first half of the local buffer to the first half of the remote one, each followed by a READ
    // of the second remote half into the second local half, all behind one doorbell.
    for i in 0..count as u64 {
        let at = i * chunk as u64;
        qp.post(WRITE, chunk as u32, rkeys.rkey, remote + at, lkeys.lkey, local + at);
        let back = (count * chunk) as u64 + at;
        qp.post(READ, chunk as u32, rkeys.rkey, remote + back, lkeys.lkey, local + back);
    }
    qp.ring();
    for index in 0..2 * count as u32 {
        let cqe = qp.poll();
        let opcode = if index % 2 == 0 { WRITE } else { READ };
        assert_eq!((cqe.status, cqe.wqe_index, cqe.opcode, cqe.bytes), (status::SUCCESS, index, opcode, chunk as u32));
        qp.release();
    }
    let half = chunk * count;
    let target = download(api(), remote as *const c_void, 2 * half);
    assert!(target[..half] == local_content[..half], "every WRITE landed");
    assert!(target[half..] == remote_content[half..], "nothing else changed on the target");
    let initiator = download(api(), local as *const c_void, 2 * half);
    assert!(initiator[half..] == remote_content[half..], "every READ landed");
    assert_eq!(nic::qp_status(a, qp.info.qpn).expect("status").state, QpState::ReadyToSend);
}

#[test]
fn a_refused_wqe_inside_a_window_fails_alone_and_every_later_one_is_flushed_untouched() {
    let (a, b) = shared_pair();
    let (local, lkeys, local_content) = buffer(a, 8192, 31, Access::default());
    let (remote, rkeys, remote_content) = buffer(b, 8192, 32, Access::REMOTE_ALL);
    nic::deregister_memory(b, rkeys.lkey).expect("deregisters");
    let small = nic::register_memory(b, remote, 4096, Access::REMOTE_ALL).expect("registers");
    let (mut qp, _) = connect(a, b, QpConfig::default());
    qp.post(WRITE, 64, small.rkey, remote, lkeys.lkey, local);
    qp.post(WRITE, 64, small.rkey, remote + 64, lkeys.lkey, local + 64);
    // Past the registration's end: refused.
    qp.post(WRITE, 200, small.rkey, remote + 4000, lkeys.lkey, local + 128);
    // Valid on their own, sent in the same window: the target drops them after the refusal.
    qp.post(WRITE, 64, small.rkey, remote + 1024, lkeys.lkey, local + 1024);
    qp.post(READ, 64, small.rkey, remote + 2048, lkeys.lkey, local + 2048);
    qp.post(WRITE, 64, small.rkey, remote + 3072, lkeys.lkey, local + 3072);
    qp.ring();
    let statuses: Vec<(u32, u32)> = (0..6).map(|_| qp.poll()).map(|cqe| (cqe.wqe_index, cqe.status)).collect();
    qp.release();
    assert_eq!(
        statuses,
        [
            (0, status::SUCCESS),
            (1, status::SUCCESS),
            (2, status::REMOTE_ACCESS_ERR),
            (3, status::WR_FLUSH_ERR),
            (4, status::WR_FLUSH_ERR),
            (5, status::WR_FLUSH_ERR)
        ]
    );
    let mut expected = remote_content.clone();
    expected[..128].copy_from_slice(&local_content[..128]);
    assert!(
        download(api(), remote as *const c_void, 8192) == expected,
        "only the two WRITEs before the refusal landed"
    );
    assert!(download(api(), (local + 2048) as *const c_void, 64) == local_content[2048..2048 + 64], "no READ landed");
    let state = nic::qp_status(a, qp.info.qpn).expect("status");
    assert_eq!((state.state, state.first_error), (QpState::Error, Some((status::REMOTE_ACCESS_ERR, 2))));
}

#[test]
fn lost_responses_in_a_window_are_retransmitted_and_each_write_applied_once() {
    let (a, b) = (10, 11);
    nic::open(a, loopback()).expect("opens");
    nic::open(b, loopback()).expect("opens");
    let (local, lkeys, local_content) = buffer(a, 8 * 4096, 33, Access::default());
    let (remote, rkeys, _) = buffer(b, 8 * 4096, 34, Access::REMOTE_ALL);
    let config = QpConfig { timeout: Duration::from_millis(300), ..QpConfig::default() };
    let (mut qp, _) = connect(a, b, config);
    let before = (nic::counters(a).expect("counters"), nic::counters(b).expect("counters"));
    nic::drop_responses(b, 8).expect("the next eight responses are lost");
    for i in 0..8 {
        qp.post(WRITE, 4096, rkeys.rkey, remote + 4096 * i, lkeys.lkey, local + 4096 * i);
    }
    qp.ring();
    // All eight are applied before any response could have come back: they were outstanding together.
    let started = Instant::now();
    while nic::counters(b).expect("counters").writes_applied - before.1.writes_applied < 8 {
        assert!(started.elapsed() < config.timeout / 2, "the eight WRITEs did not reach the target together");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(download(api(), remote as *const c_void, 8 * 4096) == local_content, "each landed");
    // Overwritten by someone else before the retransmissions arrive: they must not land again.
    let marker = vec![0xA5; 8 * 4096];
    upload(api(), remote as *mut c_void, &marker);
    for index in 0..8 {
        let cqe = qp.poll();
        assert_eq!((cqe.wqe_index, cqe.status), (index, status::SUCCESS));
    }
    qp.release();
    assert!(download(api(), remote as *const c_void, 8 * 4096) == marker, "no retransmission was applied again");
    let after = (nic::counters(a).expect("counters"), nic::counters(b).expect("counters"));
    assert_eq!(after.1.writes_applied - before.1.writes_applied, 8, "each WRITE applied exactly once");
    assert!(after.1.duplicates_answered - before.1.duplicates_answered >= 8, "the retransmissions were answered");
    assert!(after.0.retries - before.0.retries >= 8, "the whole window went again");
    nic::close(a).expect("closes");
    nic::close(b).expect("closes");
}

#[test]
fn a_link_lost_mid_window_ends_in_retry_exceeded_then_flushes_within_the_bound() {
    let (a, b) = (12, 13);
    nic::open(a, loopback()).expect("opens");
    nic::open(b, loopback()).expect("opens");
    let (size, count) = (1usize << 20, 24u32);
    let (local, lkeys, local_content) = buffer(a, size * count as usize, 35, Access::default());
    let (remote, rkeys, _) = buffer(b, size * count as usize, 36, Access::REMOTE_ALL);
    let config = fast();
    let (mut qp, _) = connect(a, b, config);
    for i in 0..u64::from(count) {
        let at = i * size as u64;
        qp.post(WRITE, size as u32, rkeys.rkey, remote + at, lkeys.lkey, local + at);
    }
    qp.ring();
    // The first completion says the window is moving; the link drops with (most of) the rest outstanding.
    let first = qp.poll();
    nic::set_link_down(b, true).expect("the link drops");
    let dropped = Instant::now();
    let mut cqes = vec![first];
    let failed = loop {
        let cqe = qp.poll();
        cqes.push(cqe);
        if cqe.status != status::SUCCESS {
            break cqe;
        }
    };
    let took = dropped.elapsed();
    let attempts = u32::from(config.retry_count) + 1;
    assert_eq!(failed.status, status::TRANSPORT_RETRY_EXC_ERR, "{cqes:?}");
    assert!(took < config.timeout * attempts + Duration::from_millis(750), "bounded: {took:?}");
    while cqes.len() < count as usize {
        let cqe = qp.poll();
        assert_eq!(cqe.status, status::WR_FLUSH_ERR, "every WQE after the failed one is flushed");
        cqes.push(cqe);
    }
    qp.release();
    assert!(cqes.iter().enumerate().all(|(at, cqe)| cqe.wqe_index == at as u32), "in WQE order");
    let landed = cqes.iter().take_while(|cqe| cqe.status == status::SUCCESS).count();
    let target = download(api(), remote as *const c_void, landed * size);
    assert!(target == local_content[..landed * size], "every completed WRITE landed");
    let state = nic::qp_status(a, qp.info.qpn).expect("status");
    assert_eq!(
        (state.state, state.first_error),
        (QpState::Error, Some((status::TRANSPORT_RETRY_EXC_ERR, failed.wqe_index)))
    );
    nic::set_link_down(b, false).expect("the link is back");
    nic::close(a).expect("closes");
    nic::close(b).expect("closes");
}

#[test]
fn the_provenance_records_name_the_host_as_writer_and_reader_of_a_host_driven_qp() {
    // The records are process-wide; the other tests of this binary only add to their own QPs' logs.
    cann_twin::control::record_provenance(true);
    let (a, b) = shared_pair();
    let len = 64 << 10;
    let (local, lkeys, _) = buffer(a, len, 5, Access::default());
    let (remote, rkeys, _) = buffer(b, len, 6, Access::REMOTE_ALL);
    let (mut qp, _) = connect(a, b, QpConfig::default());
    assert_eq!(nic::qp_log_position(a, qp.info.qpn).expect("a log"), 0, "nothing taken yet");
    // Three WQEs written H2D, one doorbell through `register_write` (a caller the twin cannot name), CQEs read D2H.
    for k in 0..3u64 {
        qp.post(WRITE, 4096, rkeys.rkey, remote + k * 4096, lkeys.lkey, local + k * 4096);
    }
    qp.ring();
    let cqes = [qp.poll(), qp.poll(), qp.poll()];
    qp.release();
    assert!(cqes.iter().all(|cqe| cqe.status == status::SUCCESS), "{cqes:?}");
    let mut log = Vec::new();
    let (first, end) = nic::qp_log(a, qp.info.qpn, 0, &mut log).expect("the log");
    assert_eq!((first, end, log.len()), (0, 3, 3));
    let doorbell = log[0].doorbell;
    for entry in &log {
        assert_eq!(entry.writer, Doer::Host, "{entry:?}");
        assert_eq!(entry.ringers.iter().collect::<Vec<_>>(), [Doer::Unattributed], "{entry:?}");
        assert_eq!(entry.doorbell, doorbell, "one doorbell exposed all three: {entry:?}");
        assert_eq!(entry.flag, Some(FlagReader::Host), "each CQE was first read D2H: {entry:?}");
    }
    let seen = nic::qp_provenance(a, qp.info.qpn).expect("tallies");
    assert_eq!((seen.sqes_by_host, seen.sqes_unknown, seen.sqes_by_block.len()), (3, 0, 0), "{seen:?}");
    assert_eq!((seen.doorbells_unknown, seen.doorbells_by_host, seen.doorbells_by_block.len()), (1, 0, 0), "{seen:?}");
    assert_eq!((seen.flags_landed, seen.flags_seen_by_host, seen.flags_seen_by_core), (3, 3, 0), "{seen:?}");
    // An unsignaled WQE is logged without a CQE; the signaled one after it carries the CQE.
    let mut unsignaled = slot(WRITE, qp.pi, qp.info.sq_depth, 64, rkeys.rkey, remote, lkeys.lkey, local);
    unsignaled[1] &= !1; // byte4 bit 8: signaled
    qp.post_raw(unsignaled);
    qp.post(WRITE, 64, rkeys.rkey, remote + 64, lkeys.lkey, local + 64);
    qp.ring();
    assert_eq!(qp.poll().wqe_index, 4, "only the signaled WQE has a CQE");
    qp.release();
    let started = Instant::now();
    while nic::qp_log_position(a, qp.info.qpn).expect("a log") < 5 {
        assert!(started.elapsed() < WAIT, "the log holds both WQEs");
        std::thread::sleep(Duration::from_millis(1));
    }
    log.clear();
    nic::qp_log(a, qp.info.qpn, 3, &mut log).expect("the log");
    let flags: Vec<_> = log.iter().map(|entry| entry.flag).collect();
    assert_eq!(flags, [None, Some(FlagReader::Host)]);
    assert!(log[0].doorbell > doorbell, "a later doorbell");
}

/// WRITEs of at least 256 KiB travel the target's in-place path: the payload goes from the socket straight into the
/// registered memory once the request is checked. A duplicate (its ACK lost) is answered without being applied
/// again, a refused one touches nothing, and after each the connection still carries the next WRITE's bytes.
#[test]
fn large_writes_land_in_place_and_duplicate_or_refused_ones_touch_nothing() {
    let (a, b) = (14, 15);
    nic::open(a, loopback()).expect("opens");
    nic::open(b, loopback()).expect("opens");
    let size = 1usize << 20;
    let (local, lkeys, local_content) = buffer(a, 2 * size, 41, Access::default());
    let (remote, rkeys, _) = buffer(b, 2 * size, 42, Access::REMOTE_ALL);
    let config = QpConfig { timeout: Duration::from_millis(300), ..fast() };
    let (mut qp, _) = connect(a, b, config);

    // Applied in place, once; its ACK is lost, and the retransmission is answered without touching the target.
    nic::drop_responses(b, 1).expect("the next ACK is lost");
    let (served, applied) = {
        let counters = nic::counters(b).expect("counters");
        (counters.requests_served, counters.writes_applied)
    };
    qp.post(WRITE, size as u32, rkeys.rkey, remote, lkeys.lkey, local);
    qp.ring();
    let started = Instant::now();
    while nic::counters(b).expect("counters").requests_served == served {
        assert!(started.elapsed() < WAIT, "the target never saw the WRITE");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(download(api(), remote as *const c_void, size) == local_content[..size], "landed in place");
    let marker = vec![0xA5; size];
    upload(api(), remote as *mut c_void, &marker);
    assert_eq!(qp.poll().status, status::SUCCESS, "the retransmission was acknowledged");
    assert!(download(api(), remote as *const c_void, size) == marker, "the duplicate was not applied again");
    assert_eq!(nic::counters(b).expect("counters").writes_applied, applied + 1, "applied once");
    qp.release();

    // The next large WRITE, right behind the discarded duplicate payload: its bytes, at its place.
    let half = size / 2;
    let cqe = qp.one(WRITE, half as u32 + 3, rkeys.rkey, remote + size as u64 + 5, lkeys.lkey, local + 7);
    assert_eq!(cqe.status, status::SUCCESS);
    let landed = download(api(), (remote + size as u64 + 5) as *const c_void, half + 3);
    assert!(landed == local_content[7..7 + half + 3], "the bytes after a discarded payload are the next WRITE's");

    // A large WRITE that runs past the registration: refused, the target untouched, the QP in error.
    nic::deregister_memory(b, rkeys.lkey).expect("deregisters");
    let small = nic::register_memory(b, remote, size as u64, Access::REMOTE_ALL).expect("registers");
    let before = download(api(), remote as *const c_void, 2 * size);
    let cqe = qp.one(WRITE, size as u32, small.rkey, remote + 4096, lkeys.lkey, local);
    assert_eq!(cqe.status, status::REMOTE_ACCESS_ERR);
    assert!(download(api(), remote as *const c_void, 2 * size) == before, "the target is untouched");
    nic::close(a).expect("closes");
    nic::close(b).expect("closes");
}
