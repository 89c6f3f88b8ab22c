// RoCE v2 queue entries and doorbell words of the on-die NIC of Atlas A2/A3 (HNS RoCE v2), as an AIV kernel writes and
// reads them, and the queue-pair record the Host hands the kernel.
//
// Mirrored field by field in host/kernel_abi/roce.rs (zerocopy) and checked at compile time by aiv/roce_asserts.h
// (included at the end, generated from the Rust mirror by tests/layout_probe.rs). The hardware
// layouts and their sources are in docs/rdma.md: the WQE, its SGE and the doorbell words as CANN SHMEM's IN_DIE RDMA
// backend writes them from the AI cores, the CQE fields and status codes as the Linux hns_roce driver defines them.
// Nothing here has been run on an NPU: unverified on hardware.
#ifndef AIV_ROCE_H
#define AIV_ROCE_H

#include <stdint.h>

// ---- Send queue: WQE + one SGE per slot ----
#define AIV_ROCE_WQE_STRIDE 64u                 // bytes per SQ slot (this project's choice; the WQE and its SGE fit)
#define AIV_ROCE_OPCODE_RDMA_WRITE 3u
#define AIV_ROCE_OPCODE_RDMA_WRITE_WITH_IMM 4u
#define AIV_ROCE_OPCODE_RDMA_READ 5u
// Bits of `byte4`.
#define AIV_ROCE_WQE_OPCODE_MASK 0x1Fu          // [4:0]
#define AIV_ROCE_WQE_OWNER_BIT (1u << 7)        // [7]: the inverse of the SQ lap bit (producer index / depth) & 1
#define AIV_ROCE_WQE_SIGNALED_BIT (1u << 8)     // [8]: a CQE is written for this WQE
// `byte16` [31:24]: the number of SGEs; `byte20` [23:0]: the index of the first extended SGE (0: none).
#define AIV_ROCE_WQE_SGE_NUM_SHIFT 24u

typedef struct AivRoceWqe {
    uint32_t byte4;            // 0: opcode, owner, signaled
    uint32_t msg_len;          // 4: bytes of the message
    uint32_t immt_data;        // 8: immediate data (0: none)
    uint32_t byte16;           // 12: sge_num [31:24]
    uint32_t byte20;           // 16: start_sge_index [23:0]
    uint32_t rkey;             // 20: the remote registration's key
    uint64_t va;               // 24: the remote virtual address
} AivRoceWqe;

typedef struct AivRoceSge {
    uint32_t len;              // 0
    uint32_t lkey;             // 4: the local registration's key
    uint64_t addr;             // 8: the local virtual address
} AivRoceSge;

// ---- Doorbells: one 64-bit store each ----
// SQ: tag = QPN [23:0], command [27:24] = SQ (0), producer index % 65536 [47:32], service level [50:48].
// CQ (hardware doorbell mode): tag = CQN [23:0], command [27:24] = CQ_DB_PTR (3), consumer index [55:32], cmd_sn [56].
// CQ (software doorbell mode): one 32-bit store of the consumer index & 0xFFFFFF.
#define AIV_ROCE_DB_TAG_MASK 0xFFFFFFu
#define AIV_ROCE_DB_CMD_SHIFT 24u
#define AIV_ROCE_DB_CMD_SQ 0u
#define AIV_ROCE_DB_CMD_CQ_PTR 3u
#define AIV_ROCE_DB_INDEX_SHIFT 32u
#define AIV_ROCE_DB_SQ_INDEX_MASK 0xFFFFu
#define AIV_ROCE_DB_CQ_INDEX_MASK 0xFFFFFFu
#define AIV_ROCE_DB_SL_SHIFT 48u
#define AIV_ROCE_DB_SL_MASK 0x7u
#define AIV_ROCE_DB_CQ_CMD_SN_SHIFT 56u
#define AIV_ROCE_CQ_DB_MODE_HW 0u
#define AIV_ROCE_CQ_DB_MODE_SW 1u

// ---- Completion queue ----
typedef struct AivRoceCqe {
    uint32_t byte4;            // 0: opcode [4:0], s_r [6], owner [7], status [15:8], wqe_index [31:16]
    uint32_t immt_data;        // 4
    uint32_t byte12;           // 8
    uint32_t byte16;           // 12: local QPN [23:0], sub-status [31:24]
    uint32_t byte_cnt;         // 16
    uint32_t smac;             // 20
    uint32_t byte28;           // 24
    uint32_t byte32;           // 28
} AivRoceCqe;

#define AIV_ROCE_CQE_OPCODE_MASK 0x1Fu
#define AIV_ROCE_CQE_OWNER_BIT (1u << 7)        // valid when it differs from the CQ lap bit (consumer index / depth) & 1
#define AIV_ROCE_CQE_STATUS_SHIFT 8u
#define AIV_ROCE_CQE_STATUS_MASK 0xFFu
#define AIV_ROCE_CQE_WQE_INDEX_SHIFT 16u
#define AIV_ROCE_CQE_QPN_MASK 0xFFFFFFu
#define AIV_ROCE_CQE_SUB_STATUS_SHIFT 24u
// Status codes (0: success).
#define AIV_ROCE_STATUS_SUCCESS 0x00u
#define AIV_ROCE_STATUS_LOCAL_LENGTH_ERR 0x01u
#define AIV_ROCE_STATUS_LOCAL_QP_OP_ERR 0x02u
#define AIV_ROCE_STATUS_LOCAL_PROT_ERR 0x04u
#define AIV_ROCE_STATUS_WR_FLUSH_ERR 0x05u
#define AIV_ROCE_STATUS_MW_BIND_ERR 0x06u
#define AIV_ROCE_STATUS_BAD_RESP_ERR 0x10u
#define AIV_ROCE_STATUS_LOCAL_ACCESS_ERR 0x11u
#define AIV_ROCE_STATUS_REMOTE_INVAL_REQ_ERR 0x12u
#define AIV_ROCE_STATUS_REMOTE_ACCESS_ERR 0x13u
#define AIV_ROCE_STATUS_REMOTE_OP_ERR 0x14u
#define AIV_ROCE_STATUS_TRANSPORT_RETRY_EXC_ERR 0x15u
#define AIV_ROCE_STATUS_RNR_RETRY_EXC_ERR 0x16u
#define AIV_ROCE_STATUS_REMOTE_ABORT_ERR 0x22u

// ---- The queue-pair record (this project's own) ----
// What the Host hands a kernel block for one reliable-connected QP: where its queues and doorbells are, and the keys
// of the two registrations its transfers move between when a request names none (first line, Host-written; the
// Host writes qpn last and never rewrites a record the kernel may still use), and the kernel's progress (second
// line, kernel-written). Queue indices are free-running u32s; slot = index & (depth - 1). SQ slots are
// AIV_ROCE_WQE_STRIDE bytes, CQEs sizeof(AivRoceCqe).
typedef struct AivQpRecord {
    uint64_t sq_base;          // 0
    uint64_t sq_db_addr;       // 8: the 64-bit SQ doorbell register
    uint64_t cq_base;          // 16
    uint64_t cq_db_addr;       // 24: the CQ doorbell (64-bit in HW mode, 32-bit in SW mode)
    uint32_t qpn;              // 32
    uint32_t cqn;              // 36
    uint32_t sq_depth;         // 40: a power of two
    uint32_t cq_depth;         // 44: a power of two, at least sq_depth
    uint32_t sl;               // 48: service level for the SQ doorbell
    uint32_t cq_db_mode;       // 52: AIV_ROCE_CQ_DB_MODE_*
    uint32_t lkey;             // 56: the local registration's key
    uint32_t rkey;             // 60: the remote registration's key
    uint32_t sq_pi;            // 64: kernel -> Host: WQEs posted (producer index)
    uint32_t sq_ci;            // 68: kernel -> Host: WQEs whose CQE the kernel consumed
    uint32_t cq_ci;            // 72: kernel -> Host: CQEs consumed
    uint32_t error_status;     // 76: kernel -> Host: the status of the first error CQE (0: none); the QP is not reused
    uint32_t error_wqe_index;  // 80: kernel -> Host: that CQE's wqe_index
    uint32_t error_sub_status; // 84: kernel -> Host: that CQE's sub-status
    uint32_t qpn_seen;         // 88: kernel -> Host: the QPN the kernel's state (this line) is for; a record whose
                               //     qpn differs is adopted afresh (indices from 0, no error) when next used
    uint8_t pad[36];           // 92
} AivQpRecord;

// error_status values beyond the CQE statuses: the kernel gave up on the QP itself.
#define AIV_QP_ERROR_WAIT_BUDGET 0x100u  // a CQE did not arrive within the wait budget (WQEs may still be pending)
#define AIV_QP_ERROR_ABORTED 0x101u      // the Host raised the abort flag while the kernel waited for a CQE

#ifndef AIV_LAYOUT_ASSERTS_OFF
#include "aiv/roce_asserts.h"
#endif

#endif
