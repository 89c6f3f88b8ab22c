// The RoCE part of the layout probe (kernels/probe/layout_probe.cpp includes it after its own macros).
#include "aiv/roce.h"

static void print_roce_facts() {
    SIZE(AivRoceWqe);
    OFF(AivRoceWqe, byte4); OFF(AivRoceWqe, msg_len); OFF(AivRoceWqe, immt_data); OFF(AivRoceWqe, byte16);
    OFF(AivRoceWqe, byte20); OFF(AivRoceWqe, rkey); OFF(AivRoceWqe, va);
    SIZE(AivRoceSge);
    OFF(AivRoceSge, len); OFF(AivRoceSge, lkey); OFF(AivRoceSge, addr);
    SIZE(AivRoceCqe);
    OFF(AivRoceCqe, byte4); OFF(AivRoceCqe, immt_data); OFF(AivRoceCqe, byte12); OFF(AivRoceCqe, byte16);
    OFF(AivRoceCqe, byte_cnt); OFF(AivRoceCqe, smac); OFF(AivRoceCqe, byte28); OFF(AivRoceCqe, byte32);
    SIZE(AivQpRecord);
    OFF(AivQpRecord, sq_base); OFF(AivQpRecord, sq_db_addr); OFF(AivQpRecord, cq_base); OFF(AivQpRecord, cq_db_addr);
    OFF(AivQpRecord, qpn); OFF(AivQpRecord, cqn); OFF(AivQpRecord, sq_depth); OFF(AivQpRecord, cq_depth);
    OFF(AivQpRecord, sl); OFF(AivQpRecord, cq_db_mode); OFF(AivQpRecord, lkey); OFF(AivQpRecord, rkey);
    OFF(AivQpRecord, sq_pi); OFF(AivQpRecord, sq_ci); OFF(AivQpRecord, cq_ci); OFF(AivQpRecord, error_status);
    OFF(AivQpRecord, error_wqe_index); OFF(AivQpRecord, error_sub_status); OFF(AivQpRecord, qpn_seen);
    OFF(AivQpRecord, pad);

    CONST(AIV_ROCE_WQE_STRIDE); CONST(AIV_ROCE_OPCODE_RDMA_WRITE); CONST(AIV_ROCE_OPCODE_RDMA_WRITE_WITH_IMM);
    CONST(AIV_ROCE_OPCODE_RDMA_READ); CONST(AIV_ROCE_WQE_OPCODE_MASK); CONST(AIV_ROCE_WQE_OWNER_BIT);
    CONST(AIV_ROCE_WQE_SIGNALED_BIT); CONST(AIV_ROCE_WQE_SGE_NUM_SHIFT); CONST(AIV_ROCE_DB_TAG_MASK);
    CONST(AIV_ROCE_DB_CMD_SHIFT); CONST(AIV_ROCE_DB_CMD_SQ); CONST(AIV_ROCE_DB_CMD_CQ_PTR);
    CONST(AIV_ROCE_DB_INDEX_SHIFT); CONST(AIV_ROCE_DB_SQ_INDEX_MASK); CONST(AIV_ROCE_DB_CQ_INDEX_MASK);
    CONST(AIV_ROCE_DB_SL_SHIFT); CONST(AIV_ROCE_DB_SL_MASK); CONST(AIV_ROCE_DB_CQ_CMD_SN_SHIFT);
    CONST(AIV_ROCE_CQ_DB_MODE_HW); CONST(AIV_ROCE_CQ_DB_MODE_SW); CONST(AIV_ROCE_CQE_OPCODE_MASK);
    CONST(AIV_ROCE_CQE_OWNER_BIT); CONST(AIV_ROCE_CQE_STATUS_SHIFT); CONST(AIV_ROCE_CQE_STATUS_MASK);
    CONST(AIV_ROCE_CQE_WQE_INDEX_SHIFT); CONST(AIV_ROCE_CQE_QPN_MASK); CONST(AIV_ROCE_CQE_SUB_STATUS_SHIFT);
    CONST(AIV_QP_ERROR_WAIT_BUDGET); CONST(AIV_QP_ERROR_ABORTED);
    CONST(AIV_ROCE_STATUS_SUCCESS); CONST(AIV_ROCE_STATUS_LOCAL_LENGTH_ERR); CONST(AIV_ROCE_STATUS_LOCAL_QP_OP_ERR);
    CONST(AIV_ROCE_STATUS_LOCAL_PROT_ERR); CONST(AIV_ROCE_STATUS_WR_FLUSH_ERR); CONST(AIV_ROCE_STATUS_MW_BIND_ERR);
    CONST(AIV_ROCE_STATUS_BAD_RESP_ERR); CONST(AIV_ROCE_STATUS_LOCAL_ACCESS_ERR);
    CONST(AIV_ROCE_STATUS_REMOTE_INVAL_REQ_ERR); CONST(AIV_ROCE_STATUS_REMOTE_ACCESS_ERR);
    CONST(AIV_ROCE_STATUS_REMOTE_OP_ERR); CONST(AIV_ROCE_STATUS_TRANSPORT_RETRY_EXC_ERR);
    CONST(AIV_ROCE_STATUS_RNR_RETRY_EXC_ERR); CONST(AIV_ROCE_STATUS_REMOTE_ABORT_ERR);
}
