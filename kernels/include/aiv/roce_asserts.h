// roce_asserts.h: GENERATED from the Rust mirror of aiv/roce.h (host/kernel_abi, layout_facts) by
// tests/layout_probe.rs. Do not edit; regenerate with `AIV_BLESS=1 cargo test --test layout_probe`.
//
// Every size, field offset and constant of aiv/roce.h as the Host sees them, checked when aiv/roce.h
// is compiled (it includes this file at its end): the NPU and the CPU twin builds of the kernel fail with
// the name of a field or constant that differs. Only static_assert, sizeof and __builtin_offsetof.
#ifndef AIV_ROCE_ASSERTS_H
#define AIV_ROCE_ASSERTS_H

static_assert(sizeof(AivRoceWqe) == 32ull, "AivRoceWqe: size 32 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceWqe, byte4) == 0ull, "AivRoceWqe.byte4: offset 0 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceWqe, msg_len) == 4ull, "AivRoceWqe.msg_len: offset 4 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceWqe, immt_data) == 8ull, "AivRoceWqe.immt_data: offset 8 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceWqe, byte16) == 12ull, "AivRoceWqe.byte16: offset 12 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceWqe, byte20) == 16ull, "AivRoceWqe.byte20: offset 16 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceWqe, rkey) == 20ull, "AivRoceWqe.rkey: offset 20 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceWqe, va) == 24ull, "AivRoceWqe.va: offset 24 in host/kernel_abi");
static_assert(sizeof(AivRoceSge) == 16ull, "AivRoceSge: size 16 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceSge, len) == 0ull, "AivRoceSge.len: offset 0 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceSge, lkey) == 4ull, "AivRoceSge.lkey: offset 4 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceSge, addr) == 8ull, "AivRoceSge.addr: offset 8 in host/kernel_abi");
static_assert(sizeof(AivRoceCqe) == 32ull, "AivRoceCqe: size 32 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceCqe, byte4) == 0ull, "AivRoceCqe.byte4: offset 0 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceCqe, immt_data) == 4ull, "AivRoceCqe.immt_data: offset 4 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceCqe, byte12) == 8ull, "AivRoceCqe.byte12: offset 8 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceCqe, byte16) == 12ull, "AivRoceCqe.byte16: offset 12 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceCqe, byte_cnt) == 16ull, "AivRoceCqe.byte_cnt: offset 16 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceCqe, smac) == 20ull, "AivRoceCqe.smac: offset 20 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceCqe, byte28) == 24ull, "AivRoceCqe.byte28: offset 24 in host/kernel_abi");
static_assert(__builtin_offsetof(AivRoceCqe, byte32) == 28ull, "AivRoceCqe.byte32: offset 28 in host/kernel_abi");
static_assert(sizeof(AivQpRecord) == 128ull, "AivQpRecord: size 128 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, sq_base) == 0ull, "AivQpRecord.sq_base: offset 0 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, sq_db_addr) == 8ull, "AivQpRecord.sq_db_addr: offset 8 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, cq_base) == 16ull, "AivQpRecord.cq_base: offset 16 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, cq_db_addr) == 24ull, "AivQpRecord.cq_db_addr: offset 24 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, qpn) == 32ull, "AivQpRecord.qpn: offset 32 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, cqn) == 36ull, "AivQpRecord.cqn: offset 36 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, sq_depth) == 40ull, "AivQpRecord.sq_depth: offset 40 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, cq_depth) == 44ull, "AivQpRecord.cq_depth: offset 44 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, sl) == 48ull, "AivQpRecord.sl: offset 48 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, cq_db_mode) == 52ull, "AivQpRecord.cq_db_mode: offset 52 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, lkey) == 56ull, "AivQpRecord.lkey: offset 56 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, rkey) == 60ull, "AivQpRecord.rkey: offset 60 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, sq_pi) == 64ull, "AivQpRecord.sq_pi: offset 64 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, sq_ci) == 68ull, "AivQpRecord.sq_ci: offset 68 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, cq_ci) == 72ull, "AivQpRecord.cq_ci: offset 72 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, error_status) == 76ull, "AivQpRecord.error_status: offset 76 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, error_wqe_index) == 80ull, "AivQpRecord.error_wqe_index: offset 80 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, error_sub_status) == 84ull, "AivQpRecord.error_sub_status: offset 84 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, qpn_seen) == 88ull, "AivQpRecord.qpn_seen: offset 88 in host/kernel_abi");
static_assert(__builtin_offsetof(AivQpRecord, pad) == 92ull, "AivQpRecord.pad: offset 92 in host/kernel_abi");
static_assert(AIV_ROCE_WQE_STRIDE == 64ull, "AIV_ROCE_WQE_STRIDE: value 64 in host/kernel_abi");
static_assert(AIV_QP_ERROR_WAIT_BUDGET == 256ull, "AIV_QP_ERROR_WAIT_BUDGET: value 256 in host/kernel_abi");
static_assert(AIV_QP_ERROR_ABORTED == 257ull, "AIV_QP_ERROR_ABORTED: value 257 in host/kernel_abi");
static_assert(AIV_ROCE_OPCODE_RDMA_WRITE == 3ull, "AIV_ROCE_OPCODE_RDMA_WRITE: value 3 in host/kernel_abi");
static_assert(AIV_ROCE_OPCODE_RDMA_WRITE_WITH_IMM == 4ull, "AIV_ROCE_OPCODE_RDMA_WRITE_WITH_IMM: value 4 in host/kernel_abi");
static_assert(AIV_ROCE_OPCODE_RDMA_READ == 5ull, "AIV_ROCE_OPCODE_RDMA_READ: value 5 in host/kernel_abi");
static_assert(AIV_ROCE_WQE_OPCODE_MASK == 31ull, "AIV_ROCE_WQE_OPCODE_MASK: value 31 in host/kernel_abi");
static_assert(AIV_ROCE_WQE_OWNER_BIT == 128ull, "AIV_ROCE_WQE_OWNER_BIT: value 128 in host/kernel_abi");
static_assert(AIV_ROCE_WQE_SIGNALED_BIT == 256ull, "AIV_ROCE_WQE_SIGNALED_BIT: value 256 in host/kernel_abi");
static_assert(AIV_ROCE_WQE_SGE_NUM_SHIFT == 24ull, "AIV_ROCE_WQE_SGE_NUM_SHIFT: value 24 in host/kernel_abi");
static_assert(AIV_ROCE_DB_TAG_MASK == 16777215ull, "AIV_ROCE_DB_TAG_MASK: value 16777215 in host/kernel_abi");
static_assert(AIV_ROCE_DB_CMD_SHIFT == 24ull, "AIV_ROCE_DB_CMD_SHIFT: value 24 in host/kernel_abi");
static_assert(AIV_ROCE_DB_CMD_SQ == 0ull, "AIV_ROCE_DB_CMD_SQ: value 0 in host/kernel_abi");
static_assert(AIV_ROCE_DB_CMD_CQ_PTR == 3ull, "AIV_ROCE_DB_CMD_CQ_PTR: value 3 in host/kernel_abi");
static_assert(AIV_ROCE_DB_INDEX_SHIFT == 32ull, "AIV_ROCE_DB_INDEX_SHIFT: value 32 in host/kernel_abi");
static_assert(AIV_ROCE_DB_SQ_INDEX_MASK == 65535ull, "AIV_ROCE_DB_SQ_INDEX_MASK: value 65535 in host/kernel_abi");
static_assert(AIV_ROCE_DB_CQ_INDEX_MASK == 16777215ull, "AIV_ROCE_DB_CQ_INDEX_MASK: value 16777215 in host/kernel_abi");
static_assert(AIV_ROCE_DB_SL_SHIFT == 48ull, "AIV_ROCE_DB_SL_SHIFT: value 48 in host/kernel_abi");
static_assert(AIV_ROCE_DB_SL_MASK == 7ull, "AIV_ROCE_DB_SL_MASK: value 7 in host/kernel_abi");
static_assert(AIV_ROCE_DB_CQ_CMD_SN_SHIFT == 56ull, "AIV_ROCE_DB_CQ_CMD_SN_SHIFT: value 56 in host/kernel_abi");
static_assert(AIV_ROCE_CQ_DB_MODE_HW == 0ull, "AIV_ROCE_CQ_DB_MODE_HW: value 0 in host/kernel_abi");
static_assert(AIV_ROCE_CQ_DB_MODE_SW == 1ull, "AIV_ROCE_CQ_DB_MODE_SW: value 1 in host/kernel_abi");
static_assert(AIV_ROCE_CQE_OPCODE_MASK == 31ull, "AIV_ROCE_CQE_OPCODE_MASK: value 31 in host/kernel_abi");
static_assert(AIV_ROCE_CQE_OWNER_BIT == 128ull, "AIV_ROCE_CQE_OWNER_BIT: value 128 in host/kernel_abi");
static_assert(AIV_ROCE_CQE_STATUS_SHIFT == 8ull, "AIV_ROCE_CQE_STATUS_SHIFT: value 8 in host/kernel_abi");
static_assert(AIV_ROCE_CQE_STATUS_MASK == 255ull, "AIV_ROCE_CQE_STATUS_MASK: value 255 in host/kernel_abi");
static_assert(AIV_ROCE_CQE_WQE_INDEX_SHIFT == 16ull, "AIV_ROCE_CQE_WQE_INDEX_SHIFT: value 16 in host/kernel_abi");
static_assert(AIV_ROCE_CQE_QPN_MASK == 16777215ull, "AIV_ROCE_CQE_QPN_MASK: value 16777215 in host/kernel_abi");
static_assert(AIV_ROCE_CQE_SUB_STATUS_SHIFT == 24ull, "AIV_ROCE_CQE_SUB_STATUS_SHIFT: value 24 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_SUCCESS == 0ull, "AIV_ROCE_STATUS_SUCCESS: value 0 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_LOCAL_LENGTH_ERR == 1ull, "AIV_ROCE_STATUS_LOCAL_LENGTH_ERR: value 1 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_LOCAL_QP_OP_ERR == 2ull, "AIV_ROCE_STATUS_LOCAL_QP_OP_ERR: value 2 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_LOCAL_PROT_ERR == 4ull, "AIV_ROCE_STATUS_LOCAL_PROT_ERR: value 4 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_WR_FLUSH_ERR == 5ull, "AIV_ROCE_STATUS_WR_FLUSH_ERR: value 5 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_MW_BIND_ERR == 6ull, "AIV_ROCE_STATUS_MW_BIND_ERR: value 6 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_BAD_RESP_ERR == 16ull, "AIV_ROCE_STATUS_BAD_RESP_ERR: value 16 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_LOCAL_ACCESS_ERR == 17ull, "AIV_ROCE_STATUS_LOCAL_ACCESS_ERR: value 17 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_REMOTE_INVAL_REQ_ERR == 18ull, "AIV_ROCE_STATUS_REMOTE_INVAL_REQ_ERR: value 18 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_REMOTE_ACCESS_ERR == 19ull, "AIV_ROCE_STATUS_REMOTE_ACCESS_ERR: value 19 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_REMOTE_OP_ERR == 20ull, "AIV_ROCE_STATUS_REMOTE_OP_ERR: value 20 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_TRANSPORT_RETRY_EXC_ERR == 21ull, "AIV_ROCE_STATUS_TRANSPORT_RETRY_EXC_ERR: value 21 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_RNR_RETRY_EXC_ERR == 22ull, "AIV_ROCE_STATUS_RNR_RETRY_EXC_ERR: value 22 in host/kernel_abi");
static_assert(AIV_ROCE_STATUS_REMOTE_ABORT_ERR == 34ull, "AIV_ROCE_STATUS_REMOTE_ABORT_ERR: value 34 in host/kernel_abi");

#endif
