//! The Rust mirror of `kernels/include/aiv/roce.h`: RoCE v2 WQEs, SGEs and CQEs of the on-die NIC of Atlas A2/A3 (HNS
//! RoCE v2), the two doorbell words, and the queue-pair record the Host hands a kernel block.
//!
//! The hardware layouts and where they come from are in docs/rdma.md (CANN SHMEM's IN_DIE RDMA backend for what the AI
//! cores write; the Linux hns_roce driver for the CQE fields and status codes). Unverified on hardware. Values a NIC
//! writes decode totally: [`CqeStatus`] is a newtype with a name for every known code and a text for the others.
//! [`roce_facts`] lists every size, offset and constant here; `tests/layout_probe.rs` renders it as the
//! `static_assert`s of `kernels/include/aiv/roce_asserts.h`, which `roce.h` includes.

use std::mem::{offset_of, size_of};

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::layout::facts;

/// Bytes of one send-queue slot: the WQE and its one SGE, padded.
pub const WQE_STRIDE: u64 = 64;
/// RDMA WRITE (local -> remote).
pub const OPCODE_RDMA_WRITE: u32 = 3;
/// RDMA WRITE with immediate data.
pub const OPCODE_RDMA_WRITE_WITH_IMM: u32 = 4;
/// RDMA READ (remote -> local).
pub const OPCODE_RDMA_READ: u32 = 5;
/// Opcode bits of the WQE's `byte4`.
pub const WQE_OPCODE_MASK: u32 = 0x1F;
/// Owner bit of the WQE's `byte4`: the inverse of the SQ lap bit.
pub const WQE_OWNER_BIT: u32 = 1 << 7;
/// Signaled bit of the WQE's `byte4`: the NIC writes a CQE for it.
pub const WQE_SIGNALED_BIT: u32 = 1 << 8;
/// Shift of the SGE count in the WQE's `byte16`.
pub const WQE_SGE_NUM_SHIFT: u32 = 24;
/// Doorbell tag bits (QPN or CQN).
pub const DB_TAG_MASK: u32 = 0xFF_FFFF;
/// Shift of the doorbell command.
pub const DB_CMD_SHIFT: u32 = 24;
/// Doorbell command: SQ producer index.
pub const DB_CMD_SQ: u32 = 0;
/// Doorbell command: CQ consumer index (hardware doorbell mode).
pub const DB_CMD_CQ_PTR: u32 = 3;
/// Shift of the index in a doorbell word.
pub const DB_INDEX_SHIFT: u32 = 32;
/// Bits of the SQ producer index in the SQ doorbell (it carries the index modulo 65536).
pub const DB_SQ_INDEX_MASK: u32 = 0xFFFF;
/// Bits of the CQ consumer index in the CQ doorbell.
pub const DB_CQ_INDEX_MASK: u32 = 0xFF_FFFF;
/// Shift of the service level in the SQ doorbell.
pub const DB_SL_SHIFT: u32 = 48;
/// Bits of the service level.
pub const DB_SL_MASK: u32 = 0x7;
/// Shift of the CQ doorbell's command sequence bit.
pub const DB_CQ_CMD_SN_SHIFT: u32 = 56;
/// The CQ doorbell is the 64-bit hardware word.
pub const CQ_DB_MODE_HW: u32 = 0;
/// The CQ doorbell is a 32-bit store of the consumer index.
pub const CQ_DB_MODE_SW: u32 = 1;
/// Opcode bits of the CQE's `byte4`.
pub const CQE_OPCODE_MASK: u32 = 0x1F;
/// Owner bit of the CQE's `byte4`: the CQE is new when it differs from the CQ lap bit.
pub const CQE_OWNER_BIT: u32 = 1 << 7;
/// Shift of the status in the CQE's `byte4`.
pub const CQE_STATUS_SHIFT: u32 = 8;
/// Bits of the status.
pub const CQE_STATUS_MASK: u32 = 0xFF;
/// Shift of the completed WQE's index in the CQE's `byte4` (16 bits).
pub const CQE_WQE_INDEX_SHIFT: u32 = 16;
/// Local QPN bits of the CQE's `byte16`.
pub const CQE_QPN_MASK: u32 = 0xFF_FFFF;
/// Shift of the sub-status in the CQE's `byte16`.
pub const CQE_SUB_STATUS_SHIFT: u32 = 24;

/// The RDMA WRITE/READ WQE (32 bytes; its SGE follows it in the slot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RoceWqe {
    /// `opcode[4:0] owner[7] signaled[8]`.
    pub byte4: U32,
    pub msg_len: U32,
    pub immt_data: U32,
    /// `sge_num[31:24]`.
    pub byte16: U32,
    /// `start_sge_index[23:0]`.
    pub byte20: U32,
    pub rkey: U32,
    pub va: U64,
}

/// The scatter-gather element after the WQE: the local side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RoceSge {
    pub len: U32,
    pub lkey: U32,
    pub addr: U64,
}

/// One send-queue slot as the kernel writes it: the WQE, its one SGE, and padding to [`WQE_STRIDE`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RoceSlot {
    pub wqe: RoceWqe,
    pub sge: RoceSge,
    pub pad: [u8; 16],
}

/// The completion-queue entry (32 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RoceCqe {
    /// `opcode[4:0] s_r[6] owner[7] status[15:8] wqe_index[31:16]`.
    pub byte4: U32,
    pub immt_data: U32,
    pub byte12: U32,
    /// `local_qpn[23:0] sub_status[31:24]`.
    pub byte16: U32,
    pub byte_cnt: U32,
    pub smac: U32,
    pub byte28: U32,
    pub byte32: U32,
}

/// The queue-pair record: Host-written on its first cache line, kernel-written on its second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct QpRecord {
    pub sq_base: U64,
    pub sq_db_addr: U64,
    pub cq_base: U64,
    pub cq_db_addr: U64,
    pub qpn: U32,
    pub cqn: U32,
    pub sq_depth: U32,
    pub cq_depth: U32,
    pub sl: U32,
    pub cq_db_mode: U32,
    pub lkey: U32,
    pub rkey: U32,
    pub sq_pi: U32,
    pub sq_ci: U32,
    pub cq_ci: U32,
    pub error_status: U32,
    pub error_wqe_index: U32,
    pub error_sub_status: U32,
    /// Kernel -> Host: the QPN the kernel's state (this line) is for; a record whose `qpn` differs is adopted afresh
    /// (indices from 0, no error) when a request next uses it.
    pub qpn_seen: U32,
    pub pad: [u8; 36],
}

/// `error_status` of a QP the kernel gave up on itself: a CQE did not arrive within the wait budget.
pub const QP_ERROR_WAIT_BUDGET: u32 = 0x100;
/// `error_status` of a QP the kernel gave up on itself: the Host raised the abort flag during a CQE wait.
pub const QP_ERROR_ABORTED: u32 = 0x101;

/// An RDMA operation the kernel posts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdmaOp {
    Write,
    Read,
}

/// The lap bit of free-running index `index` on a ring of `depth` (a power of two) slots.
pub fn lap_bit(index: u32, depth: u32) -> bool {
    index & depth != 0
}

impl RoceSlot {
    /// The slot for `op` of `len` bytes between local `(lkey, local_va)` and remote `(rkey, remote_va)`, posted at
    /// producer index `pi` of an SQ of `depth` slots: signaled, one SGE, the owner bit the inverse of the lap bit.
    #[allow(clippy::too_many_arguments)]
    pub fn rdma(
        op: RdmaOp,
        pi: u32,
        depth: u32,
        len: u32,
        rkey: u32,
        remote_va: u64,
        lkey: u32,
        local_va: u64,
    ) -> Self {
        let opcode = match op {
            RdmaOp::Write => OPCODE_RDMA_WRITE,
            RdmaOp::Read => OPCODE_RDMA_READ,
        };
        let owner = if lap_bit(pi, depth) { 0 } else { WQE_OWNER_BIT };
        RoceSlot {
            wqe: RoceWqe {
                byte4: (opcode & WQE_OPCODE_MASK | owner | WQE_SIGNALED_BIT).into(),
                msg_len: len.into(),
                immt_data: 0.into(),
                byte16: (1 << WQE_SGE_NUM_SHIFT).into(),
                byte20: 0.into(),
                rkey: rkey.into(),
                va: remote_va.into(),
            },
            sge: RoceSge { len: len.into(), lkey: lkey.into(), addr: local_va.into() },
            pad: [0; 16],
        }
    }
}

impl RoceWqe {
    pub fn opcode(&self) -> u32 {
        self.byte4.get() & WQE_OPCODE_MASK
    }

    pub fn owner(&self) -> bool {
        self.byte4.get() & WQE_OWNER_BIT != 0
    }

    pub fn signaled(&self) -> bool {
        self.byte4.get() & WQE_SIGNALED_BIT != 0
    }

    pub fn sge_count(&self) -> u32 {
        self.byte16.get() >> WQE_SGE_NUM_SHIFT
    }

    /// Whether a NIC consuming producer index `pi` of an SQ of `depth` slots finds this WQE written for this lap.
    pub fn is_posted_for(&self, pi: u32, depth: u32) -> bool {
        self.owner() != lap_bit(pi, depth)
    }
}

/// The SQ doorbell word for `qpn` with producer index `pi` (carried modulo 65536) and service level `sl`.
pub fn sq_doorbell(qpn: u32, pi: u32, sl: u32) -> u64 {
    u64::from(qpn & DB_TAG_MASK)
        | u64::from(DB_CMD_SQ) << DB_CMD_SHIFT
        | u64::from(pi & DB_SQ_INDEX_MASK) << DB_INDEX_SHIFT
        | u64::from(sl & DB_SL_MASK) << DB_SL_SHIFT
}

/// The CQ doorbell word (hardware mode) for `cqn` with consumer index `ci`.
pub fn cq_doorbell(cqn: u32, ci: u32) -> u64 {
    u64::from(cqn & DB_TAG_MASK)
        | u64::from(DB_CMD_CQ_PTR) << DB_CMD_SHIFT
        | u64::from(ci & DB_CQ_INDEX_MASK) << DB_INDEX_SHIFT
        | 1 << DB_CQ_CMD_SN_SHIFT
}

/// A doorbell word taken apart (what a NIC reads from its doorbell register).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Doorbell {
    pub tag: u32,
    pub command: u32,
    pub index: u32,
    pub sl: u32,
    pub cmd_sn: bool,
}

impl Doorbell {
    /// Decodes any 64-bit word; bits no field covers are ignored, as a NIC ignores them.
    pub fn decode(word: u64) -> Doorbell {
        let command = (word >> DB_CMD_SHIFT) as u32 & 0xF;
        let index_mask = if command == DB_CMD_SQ { DB_SQ_INDEX_MASK } else { DB_CQ_INDEX_MASK };
        Doorbell {
            tag: word as u32 & DB_TAG_MASK,
            command,
            index: (word >> DB_INDEX_SHIFT) as u32 & index_mask,
            sl: if command == DB_CMD_SQ { (word >> DB_SL_SHIFT) as u32 & DB_SL_MASK } else { 0 },
            cmd_sn: command != DB_CMD_SQ && word >> DB_CQ_CMD_SN_SHIFT & 1 == 1,
        }
    }
}

/// A CQE's status code (0: success); every other value is an error that fails the WQE it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CqeStatus(pub u32);

impl CqeStatus {
    pub const SUCCESS: CqeStatus = CqeStatus(0x00);
    pub const LOCAL_LENGTH_ERR: CqeStatus = CqeStatus(0x01);
    pub const LOCAL_QP_OP_ERR: CqeStatus = CqeStatus(0x02);
    pub const LOCAL_PROT_ERR: CqeStatus = CqeStatus(0x04);
    pub const WR_FLUSH_ERR: CqeStatus = CqeStatus(0x05);
    pub const MW_BIND_ERR: CqeStatus = CqeStatus(0x06);
    pub const BAD_RESP_ERR: CqeStatus = CqeStatus(0x10);
    pub const LOCAL_ACCESS_ERR: CqeStatus = CqeStatus(0x11);
    pub const REMOTE_INVAL_REQ_ERR: CqeStatus = CqeStatus(0x12);
    pub const REMOTE_ACCESS_ERR: CqeStatus = CqeStatus(0x13);
    pub const REMOTE_OP_ERR: CqeStatus = CqeStatus(0x14);
    pub const TRANSPORT_RETRY_EXC_ERR: CqeStatus = CqeStatus(0x15);
    pub const RNR_RETRY_EXC_ERR: CqeStatus = CqeStatus(0x16);
    pub const REMOTE_ABORT_ERR: CqeStatus = CqeStatus(0x22);

    /// Every code with a name, as (code, name).
    pub const KNOWN: [(CqeStatus, &'static str); 14] = [
        (CqeStatus::SUCCESS, "success"),
        (CqeStatus::LOCAL_LENGTH_ERR, "local length error"),
        (CqeStatus::LOCAL_QP_OP_ERR, "local QP operation error"),
        (CqeStatus::LOCAL_PROT_ERR, "local protection error"),
        (CqeStatus::WR_FLUSH_ERR, "work request flushed"),
        (CqeStatus::MW_BIND_ERR, "memory window bind error"),
        (CqeStatus::BAD_RESP_ERR, "bad response"),
        (CqeStatus::LOCAL_ACCESS_ERR, "local access error"),
        (CqeStatus::REMOTE_INVAL_REQ_ERR, "remote invalid request"),
        (CqeStatus::REMOTE_ACCESS_ERR, "remote access error"),
        (CqeStatus::REMOTE_OP_ERR, "remote operation error"),
        (CqeStatus::TRANSPORT_RETRY_EXC_ERR, "transport retry count exceeded"),
        (CqeStatus::RNR_RETRY_EXC_ERR, "receiver-not-ready retry count exceeded"),
        (CqeStatus::REMOTE_ABORT_ERR, "remote aborted"),
    ];

    pub fn is_success(self) -> bool {
        self == CqeStatus::SUCCESS
    }

    /// Its name, or "unknown status 0x.." for a code the table does not hold.
    pub fn describe(self) -> String {
        match CqeStatus::KNOWN.iter().find(|(code, _)| *code == self) {
            Some((_, name)) => format!("{name} (0x{:02x})", self.0),
            None => format!("unknown status 0x{:02x}", self.0),
        }
    }
}

impl RoceCqe {
    pub fn opcode(&self) -> u32 {
        self.byte4.get() & CQE_OPCODE_MASK
    }

    pub fn owner(&self) -> bool {
        self.byte4.get() & CQE_OWNER_BIT != 0
    }

    pub fn status(&self) -> CqeStatus {
        CqeStatus(self.byte4.get() >> CQE_STATUS_SHIFT & CQE_STATUS_MASK)
    }

    /// The index (modulo 65536) of the WQE this CQE completes.
    pub fn wqe_index(&self) -> u32 {
        self.byte4.get() >> CQE_WQE_INDEX_SHIFT
    }

    pub fn qpn(&self) -> u32 {
        self.byte16.get() & CQE_QPN_MASK
    }

    pub fn sub_status(&self) -> u32 {
        self.byte16.get() >> CQE_SUB_STATUS_SHIFT
    }

    /// Whether a consumer at index `ci` of a CQ of `depth` entries finds this CQE new (written in this lap).
    pub fn is_new_for(&self, ci: u32, depth: u32) -> bool {
        self.owner() != lap_bit(ci, depth)
    }

    /// The CQE a NIC writes at producer index `pi` of a CQ of `depth` entries for WQE `wqe_index` of QP `qpn`.
    pub fn written(pi: u32, depth: u32, opcode: u32, status: CqeStatus, wqe_index: u32, qpn: u32, bytes: u32) -> Self {
        let owner = if lap_bit(pi, depth) { 0 } else { CQE_OWNER_BIT };
        RoceCqe {
            byte4: (opcode & CQE_OPCODE_MASK
                | owner
                | (status.0 & CQE_STATUS_MASK) << CQE_STATUS_SHIFT
                | (wqe_index & 0xFFFF) << CQE_WQE_INDEX_SHIFT)
                .into(),
            byte16: (qpn & CQE_QPN_MASK).into(),
            byte_cnt: bytes.into(),
            ..RoceCqe::default()
        }
    }
}

/// Every size, field offset and constant of `kernels/include/aiv/roce.h`, named after the C side.
pub fn roce_facts() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    facts!(out; size RoceWqe as "AivRoceWqe");
    facts!(out; offsets RoceWqe as "AivRoceWqe" { byte4, msg_len, immt_data, byte16, byte20, rkey, va });
    facts!(out; size RoceSge as "AivRoceSge");
    facts!(out; offsets RoceSge as "AivRoceSge" { len, lkey, addr });
    facts!(out; size RoceCqe as "AivRoceCqe");
    facts!(out; offsets RoceCqe as "AivRoceCqe" { byte4, immt_data, byte12, byte16, byte_cnt, smac, byte28, byte32 });
    facts!(out; size QpRecord as "AivQpRecord");
    facts!(out; offsets QpRecord as "AivQpRecord" { sq_base, sq_db_addr, cq_base, cq_db_addr, qpn, cqn, sq_depth,
        cq_depth, sl, cq_db_mode, lkey, rkey, sq_pi, sq_ci, cq_ci, error_status, error_wqe_index, error_sub_status,
        qpn_seen, pad });
    let constants: [(&str, u64); 28] = [
        ("AIV_ROCE_WQE_STRIDE", WQE_STRIDE),
        ("AIV_QP_ERROR_WAIT_BUDGET", QP_ERROR_WAIT_BUDGET.into()),
        ("AIV_QP_ERROR_ABORTED", QP_ERROR_ABORTED.into()),
        ("AIV_ROCE_OPCODE_RDMA_WRITE", OPCODE_RDMA_WRITE.into()),
        ("AIV_ROCE_OPCODE_RDMA_WRITE_WITH_IMM", OPCODE_RDMA_WRITE_WITH_IMM.into()),
        ("AIV_ROCE_OPCODE_RDMA_READ", OPCODE_RDMA_READ.into()),
        ("AIV_ROCE_WQE_OPCODE_MASK", WQE_OPCODE_MASK.into()),
        ("AIV_ROCE_WQE_OWNER_BIT", WQE_OWNER_BIT.into()),
        ("AIV_ROCE_WQE_SIGNALED_BIT", WQE_SIGNALED_BIT.into()),
        ("AIV_ROCE_WQE_SGE_NUM_SHIFT", WQE_SGE_NUM_SHIFT.into()),
        ("AIV_ROCE_DB_TAG_MASK", DB_TAG_MASK.into()),
        ("AIV_ROCE_DB_CMD_SHIFT", DB_CMD_SHIFT.into()),
        ("AIV_ROCE_DB_CMD_SQ", DB_CMD_SQ.into()),
        ("AIV_ROCE_DB_CMD_CQ_PTR", DB_CMD_CQ_PTR.into()),
        ("AIV_ROCE_DB_INDEX_SHIFT", DB_INDEX_SHIFT.into()),
        ("AIV_ROCE_DB_SQ_INDEX_MASK", DB_SQ_INDEX_MASK.into()),
        ("AIV_ROCE_DB_CQ_INDEX_MASK", DB_CQ_INDEX_MASK.into()),
        ("AIV_ROCE_DB_SL_SHIFT", DB_SL_SHIFT.into()),
        ("AIV_ROCE_DB_SL_MASK", DB_SL_MASK.into()),
        ("AIV_ROCE_DB_CQ_CMD_SN_SHIFT", DB_CQ_CMD_SN_SHIFT.into()),
        ("AIV_ROCE_CQ_DB_MODE_HW", CQ_DB_MODE_HW.into()),
        ("AIV_ROCE_CQ_DB_MODE_SW", CQ_DB_MODE_SW.into()),
        ("AIV_ROCE_CQE_OPCODE_MASK", CQE_OPCODE_MASK.into()),
        ("AIV_ROCE_CQE_OWNER_BIT", CQE_OWNER_BIT.into()),
        ("AIV_ROCE_CQE_STATUS_SHIFT", CQE_STATUS_SHIFT.into()),
        ("AIV_ROCE_CQE_STATUS_MASK", CQE_STATUS_MASK.into()),
        ("AIV_ROCE_CQE_WQE_INDEX_SHIFT", CQE_WQE_INDEX_SHIFT.into()),
        ("AIV_ROCE_CQE_QPN_MASK", CQE_QPN_MASK.into()),
    ];
    out.extend(constants.iter().map(|(name, value)| (format!("const.{name}"), *value)));
    out.push(("const.AIV_ROCE_CQE_SUB_STATUS_SHIFT".into(), CQE_SUB_STATUS_SHIFT.into()));
    let statuses: [(&str, CqeStatus); 14] = [
        ("SUCCESS", CqeStatus::SUCCESS),
        ("LOCAL_LENGTH_ERR", CqeStatus::LOCAL_LENGTH_ERR),
        ("LOCAL_QP_OP_ERR", CqeStatus::LOCAL_QP_OP_ERR),
        ("LOCAL_PROT_ERR", CqeStatus::LOCAL_PROT_ERR),
        ("WR_FLUSH_ERR", CqeStatus::WR_FLUSH_ERR),
        ("MW_BIND_ERR", CqeStatus::MW_BIND_ERR),
        ("BAD_RESP_ERR", CqeStatus::BAD_RESP_ERR),
        ("LOCAL_ACCESS_ERR", CqeStatus::LOCAL_ACCESS_ERR),
        ("REMOTE_INVAL_REQ_ERR", CqeStatus::REMOTE_INVAL_REQ_ERR),
        ("REMOTE_ACCESS_ERR", CqeStatus::REMOTE_ACCESS_ERR),
        ("REMOTE_OP_ERR", CqeStatus::REMOTE_OP_ERR),
        ("TRANSPORT_RETRY_EXC_ERR", CqeStatus::TRANSPORT_RETRY_EXC_ERR),
        ("RNR_RETRY_EXC_ERR", CqeStatus::RNR_RETRY_EXC_ERR),
        ("REMOTE_ABORT_ERR", CqeStatus::REMOTE_ABORT_ERR),
    ];
    out.extend(statuses.iter().map(|(name, code)| (format!("const.AIV_ROCE_STATUS_{name}"), u64::from(code.0))));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_slot_is_one_stride() {
        assert_eq!(size_of::<RoceSlot>() as u64, WQE_STRIDE);
        assert_eq!(offset_of!(RoceSlot, sge), size_of::<RoceWqe>());
        assert_eq!(size_of::<QpRecord>(), 128);
        assert_eq!(offset_of!(QpRecord, sq_pi), 64, "the kernel's words start the second cache line");
    }

    #[test]
    fn a_write_wqe_has_the_fields_the_in_die_backend_writes() {
        let slot = RoceSlot::rdma(RdmaOp::Write, 0, 8192, 4096, 0x77, 0x1000_2000_3000, 0x55, 0x4000_5000);
        let bytes = slot.as_bytes();
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        assert_eq!(word(0) & 0x1F, 3, "opcode RDMA WRITE");
        assert_eq!(word(0) >> 7 & 1, 1, "owner: the inverse of lap 0");
        assert_eq!(word(0) >> 8 & 1, 1, "signaled");
        assert_eq!((word(4), word(12) >> 24, word(16), word(20)), (4096, 1, 0, 0x77));
        assert_eq!(u64::from_le_bytes(bytes[24..32].try_into().expect("8 bytes")), 0x1000_2000_3000);
        assert_eq!((word(32), word(36)), (4096, 0x55), "SGE length and lkey");
        assert_eq!(u64::from_le_bytes(bytes[40..48].try_into().expect("8 bytes")), 0x4000_5000);
        let second_lap = RoceSlot::rdma(RdmaOp::Read, 8192, 8192, 1, 0, 0, 0, 0);
        assert_eq!(second_lap.wqe.opcode(), OPCODE_RDMA_READ);
        assert!(!second_lap.wqe.owner(), "lap 1 writes owner 0");
        assert!(slot.wqe.is_posted_for(0, 8192) && !slot.wqe.is_posted_for(8192, 8192), "a stale lap is not posted");
    }

    #[test]
    fn doorbell_words_place_each_field() {
        let word = sq_doorbell(0x12_3456, 70_000, 5);
        assert_eq!(word & 0xFF_FFFF, 0x12_3456);
        assert_eq!(word >> 24 & 0xF, 0, "SQ command");
        assert_eq!(word >> 32 & 0xFFFF, 70_000 % 65_536, "the producer index modulo 65536");
        assert_eq!(word >> 48 & 0x7, 5);
        let word = cq_doorbell(9, 0x0123_4567);
        assert_eq!((word & 0xFF_FFFF, word >> 24 & 0xF, word >> 32 & 0xFF_FFFF, word >> 56), (9, 3, 0x23_4567, 1));
    }

    #[test]
    fn a_cqe_is_new_only_in_its_lap_and_carries_its_status() {
        let cqe = RoceCqe::written(3, 16, OPCODE_RDMA_WRITE, CqeStatus::REMOTE_ACCESS_ERR, 40_000, 0xABCDEF, 0);
        assert!(cqe.is_new_for(3, 16) && !cqe.is_new_for(19, 16), "lap 0's CQE is stale in lap 1");
        assert_eq!((cqe.status(), cqe.wqe_index(), cqe.qpn()), (CqeStatus::REMOTE_ACCESS_ERR, 40_000, 0xABCDEF));
        assert_eq!(cqe.status().describe(), "remote access error (0x13)");
        assert_eq!(CqeStatus(0x99).describe(), "unknown status 0x99");
        assert!(!cqe.status().is_success() && CqeStatus(0).is_success());
        // A zeroed CQ: nothing is new in lap 0 (owner 0 equals the lap bit 0), as the NIC writes owner 1 first.
        assert!(!RoceCqe::default().is_new_for(0, 16));
    }

    proptest! {
        #[test]
        fn doorbells_decode_to_what_was_encoded(qpn in 0u32..1 << 24, pi: u32, sl in 0u32..8, ci: u32) {
            let sq = Doorbell::decode(sq_doorbell(qpn, pi, sl));
            prop_assert_eq!(sq, Doorbell { tag: qpn, command: DB_CMD_SQ, index: pi & 0xFFFF, sl, cmd_sn: false });
            let cq = Doorbell::decode(cq_doorbell(qpn, ci));
            prop_assert_eq!(cq, Doorbell { tag: qpn, command: DB_CMD_CQ_PTR, index: ci & 0xFF_FFFF, sl: 0, cmd_sn: true });
        }

        #[test]
        fn any_cqe_bytes_decode(bytes: [u8; 32]) {
            let cqe = RoceCqe::read_from_bytes(&bytes).expect("32 bytes");
            prop_assert!(cqe.status().0 <= 0xFF && cqe.wqe_index() <= 0xFFFF && cqe.qpn() < 1 << 24);
            prop_assert!(!cqe.status().describe().is_empty());
        }
    }
}
