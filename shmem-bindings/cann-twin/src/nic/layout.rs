//! The layout a kernel and the twin NIC share: the WQE, CQE and doorbell-word fields, the opcodes and the CQE status
//! codes of kernels/include/aiv/roce.h (`AIV_ROCE_*`), re-declared here (the test below checks them against the
//! header), and where the two doorbells sit in a QP's register page (this project's choice).
//!
//! Constants only: the code that reads and writes these fields is the QP's (`nic/qp.rs`: doorbells, CQEs) and the
//! engine's (`nic/engine.rs`: WQEs). A value here must never differ from roce.h's; the public ones are re-exported
//! as `nic::X`.

// The layout constants of kernels/include/aiv/roce.h (AIV_ROCE_*), re-declared: the twin does not depend on the
// root crate's kernel_abi.
/// Bytes of one SQ slot (`AIV_ROCE_WQE_STRIDE`).
pub const WQE_STRIDE: u64 = 64;
/// Bytes of one CQE (`sizeof(AivRoceCqe)`).
pub const CQE_BYTES: u64 = 32;
const _: () = assert!(CQE_BYTES == crate::provenance::qp::CQE_BYTES, "the provenance records read CQEs of this size");
/// RDMA WRITE (`AIV_ROCE_OPCODE_RDMA_WRITE`).
pub const OPCODE_RDMA_WRITE: u32 = 3;
/// RDMA READ (`AIV_ROCE_OPCODE_RDMA_READ`).
pub const OPCODE_RDMA_READ: u32 = 5;
pub(super) const WQE_OPCODE_MASK: u32 = 0x1F;
pub(super) const WQE_OWNER_BIT: u32 = 1 << 7;
pub(super) const WQE_SIGNALED_BIT: u32 = 1 << 8;
pub(super) const WQE_SGE_NUM_SHIFT: u32 = 24;
pub(super) const DB_TAG_MASK: u64 = 0xFF_FFFF;
pub(super) const DB_CMD_SHIFT: u32 = 24;
pub(super) const DB_CMD_SQ: u64 = 0;
pub(super) const DB_CMD_CQ_PTR: u64 = 3;
pub(super) const DB_INDEX_SHIFT: u32 = 32;
pub(super) const DB_SQ_INDEX_MASK: u64 = 0xFFFF;
pub(super) const DB_CQ_INDEX_MASK: u64 = 0xFF_FFFF;
pub(super) const CQE_OPCODE_MASK: u32 = 0x1F;
pub(super) const CQE_OWNER_BIT: u32 = 1 << 7;
pub(super) const CQE_STATUS_SHIFT: u32 = 8;
pub(super) const CQE_WQE_INDEX_SHIFT: u32 = 16;
pub(super) const CQE_QPN_MASK: u32 = 0xFF_FFFF;

/// CQE status codes (`AIV_ROCE_STATUS_*`, the Linux hns_roce driver's `HNS_ROCE_CQE_V2_*`): the ones the twin NIC
/// writes.
pub mod status {
    pub const SUCCESS: u32 = 0x00;
    pub const LOCAL_LENGTH_ERR: u32 = 0x01;
    pub const LOCAL_QP_OP_ERR: u32 = 0x02;
    pub const LOCAL_PROT_ERR: u32 = 0x04;
    pub const WR_FLUSH_ERR: u32 = 0x05;
    pub const REMOTE_ACCESS_ERR: u32 = 0x13;
    pub const TRANSPORT_RETRY_EXC_ERR: u32 = 0x15;
}

/// Offset of the SQ doorbell in a QP's register page (this project's choice).
pub const SQ_DOORBELL_OFFSET: u64 = 0x0;
/// Offset of the CQ doorbell (hardware mode) in a QP's register page (this project's choice).
pub const CQ_DOORBELL_OFFSET: u64 = 0x8;
/// Width of both doorbells, bytes.
pub const DOORBELL_WIDTH: usize = 8;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// The `#define AIV_ROCE_*` integer constants of kernels/include/aiv/roce.h, evaluated (`N`, `0xN`, `(1u << N)`).
    fn header_constants() -> HashMap<String, u64> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels/include/aiv/roce.h");
        let text = std::fs::read_to_string(path).expect("roce.h is in the repository");
        let number = |token: &str| {
            let token = token.trim().trim_end_matches('u');
            match token.strip_prefix("0x").or_else(|| token.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => token.parse().ok(),
            }
        };
        let mut out = HashMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("#define AIV_ROCE_") else { continue };
            let rest = rest.split("//").next().unwrap_or("");
            let Some((name, value)) = rest.trim().split_once(char::is_whitespace) else { continue };
            let value = value.trim().trim_start_matches('(').trim_end_matches(')');
            let evaluated = match value.split_once("<<") {
                Some((base, shift)) => number(base).zip(number(shift)).map(|(base, shift)| base << shift),
                None => number(value),
            };
            if let Some(evaluated) = evaluated {
                out.insert(name.to_string(), evaluated);
            }
        }
        out
    }

    #[test]
    fn the_redeclared_constants_are_roce_h_s() {
        let header = header_constants();
        let twin: [(&str, u64); 28] = [
            ("WQE_STRIDE", WQE_STRIDE),
            ("OPCODE_RDMA_WRITE", OPCODE_RDMA_WRITE.into()),
            ("OPCODE_RDMA_READ", OPCODE_RDMA_READ.into()),
            ("WQE_OPCODE_MASK", WQE_OPCODE_MASK.into()),
            ("WQE_OWNER_BIT", WQE_OWNER_BIT.into()),
            ("WQE_SIGNALED_BIT", WQE_SIGNALED_BIT.into()),
            ("WQE_SGE_NUM_SHIFT", WQE_SGE_NUM_SHIFT.into()),
            ("DB_TAG_MASK", DB_TAG_MASK),
            ("DB_CMD_SHIFT", DB_CMD_SHIFT.into()),
            ("DB_CMD_SQ", DB_CMD_SQ),
            ("DB_CMD_CQ_PTR", DB_CMD_CQ_PTR),
            ("DB_INDEX_SHIFT", DB_INDEX_SHIFT.into()),
            ("DB_SQ_INDEX_MASK", DB_SQ_INDEX_MASK),
            ("DB_CQ_INDEX_MASK", DB_CQ_INDEX_MASK),
            ("CQE_OPCODE_MASK", CQE_OPCODE_MASK.into()),
            ("CQE_OWNER_BIT", CQE_OWNER_BIT.into()),
            ("CQE_STATUS_SHIFT", CQE_STATUS_SHIFT.into()),
            ("CQE_WQE_INDEX_SHIFT", CQE_WQE_INDEX_SHIFT.into()),
            ("CQE_QPN_MASK", CQE_QPN_MASK.into()),
            ("STATUS_SUCCESS", status::SUCCESS.into()),
            ("STATUS_LOCAL_LENGTH_ERR", status::LOCAL_LENGTH_ERR.into()),
            ("STATUS_LOCAL_QP_OP_ERR", status::LOCAL_QP_OP_ERR.into()),
            ("STATUS_LOCAL_PROT_ERR", status::LOCAL_PROT_ERR.into()),
            ("STATUS_WR_FLUSH_ERR", status::WR_FLUSH_ERR.into()),
            ("STATUS_REMOTE_ACCESS_ERR", status::REMOTE_ACCESS_ERR.into()),
            ("STATUS_TRANSPORT_RETRY_EXC_ERR", status::TRANSPORT_RETRY_EXC_ERR.into()),
            ("CQ_DB_MODE_HW", 0),
            ("CQE_STATUS_MASK", 0xFF),
        ];
        for (name, value) in twin {
            assert_eq!(header.get(name), Some(&value), "AIV_ROCE_{name}");
        }
        assert_eq!(CQE_BYTES, 32, "sizeof(AivRoceCqe): eight u32 words");
    }
}
