// Device-visible layouts shared by the transfer kernel, the CPU twin and the Host runtime.
//
// Defined once here and mirrored field by field in host/kernel_abi/ (Rust, zerocopy). Every size, field offset and
// constant the Rust side knows is checked at compile time by aiv/layout_asserts.h (included at the end), which
// tests/layout_probe.rs generates from the Rust mirror and keeps up to date.
// All layouts are little-endian. The SDMA SQE and the channel record follow docs/hardware.md section 4 exactly; the
// other layouts (request ring, device completion queue, control block, kernel arguments) are this project's own.
#ifndef AIV_LAYOUTS_H
#define AIV_LAYOUTS_H

#include <stdint.h>

#define AIV_CACHE_LINE 64u

// ---- SDMA through STARS SQEs (docs/hardware.md section 4) ----
#define AIV_SQE_BYTES 64u
#define AIV_SQE_TYPE_SDMA 11u
#define AIV_SQE_TYPE_MASK 0x3Fu
#define AIV_SQE_KERNEL_CREDIT_SDMA 240u
#define AIV_SQE_LINK_TYPE_NONE 255u
#define AIV_SDMA_MAX_SQE_BYTES (1u << 20)
#define AIV_SDMA_DOORBELL_OFFSET 0x8u       // A2/A3; Ascend 950 uses offset 0x0
// Bits of the SQE word at offset 16.
#define AIV_SQE_OPCODE_COPY 0u
#define AIV_SQE_BIT_SSSV (1u << 9)
#define AIV_SQE_BIT_DSSV (1u << 10)
#define AIV_SQE_BIT_SNS (1u << 11)
#define AIV_SQE_BIT_DNS (1u << 12)
#define AIV_SQE_QOS_SHIFT 13u
#define AIV_SQE_QOS_COPY 6u

typedef struct AivSdmaSqe {
    uint16_t type_word;        // 0: type in bits 0-5
    uint16_t block_dim;        // 2
    uint16_t rt_stream_id;     // 4
    uint16_t task_id;          // 6: sq_tail - sq_head
    uint32_t reserved0;        // 8
    uint16_t reserved1;        // 12
    uint8_t kernel_credit;     // 14
    uint8_t ptr_mode;          // 15: bit 0
    uint32_t opcode_word;      // 16: opcode[7:0] ie2[8] sssv[9] dssv[10] sns[11] dns[12] qos[16:13] ...
    uint16_t src_stream_id;    // 20
    uint16_t src_sub_stream_id;// 22
    uint16_t dst_stream_id;    // 24
    uint16_t dst_sub_stream_id;// 26
    uint32_t length;           // 28: at most 1 MiB
    uint32_t src_addr_low;     // 32
    uint32_t src_addr_high;    // 36
    uint32_t dst_addr_low;     // 40
    uint32_t dst_addr_high;    // 44
    uint8_t link_type;         // 48
    uint8_t reserved2[3];      // 49
    uint32_t reserved3[3];     // 52
} AivSdmaSqe;

typedef struct AivChannelRecord {
    uint32_t sq_head;          // 0
    uint32_t sq_tail;          // 4: software copy kept by the kernel
    uint64_t sq_base;          // 8: ring of 64-byte SQEs
    uint64_t sq_reg_base;      // 16: doorbell register base
    uint32_t sq_depth;         // 24
    uint32_t sq_id;            // 28
    uint32_t cq_id;            // 32
    uint32_t logic_cq_id;      // 36
    uint64_t cqe_addr;         // 40: unused by the device path
    uint32_t report_cqe_num;   // 48
    uint32_t stream_id;        // 52
    uint32_t dev_id;           // 56
    uint8_t reserved[4];       // 60
} AivChannelRecord;

// ---- Rings (this project's own) ----
// Single producer, single consumer, power-of-two depth, free-running u32 indices (slot = index & (depth - 1)).
// head (consumer) and tail (producer) live on separate cache lines. Entries start at AIV_RING_HEADER_BYTES.
#define AIV_RING_HEADER_BYTES 128u
typedef struct AivRingHeader {
    uint32_t head;             // 0: consumer index
    uint8_t pad0[60];
    uint32_t tail;             // 64: producer index
    uint8_t pad1[60];
} AivRingHeader;

#define AIV_REQUEST_OPCODE_READ 0u
#define AIV_REQUEST_OPCODE_WRITE 1u

// Bits of a request's `flags`: the route [7:0] and, for RDMA, the index of the QP in the block's QP table [31:16].
#define AIV_REQUEST_ROUTE_MASK 0xFFu
#define AIV_REQUEST_ROUTE_SDMA 0u               // SDMA SQEs on the block's channel (same host)
#define AIV_REQUEST_ROUTE_RDMA 1u               // RoCE WQEs on a QP of the block's QP table (another host)
#define AIV_REQUEST_QP_SHIFT 16u

// One transfer request, Host -> kernel. Addresses are already in the executing device's view; on the RDMA route the
// remote side is the target's virtual address (dst_addr for a WRITE, src_addr for a READ), the local side this
// device's, and lkey/rkey are the keys of the registrations they lie in (0: the QP record's keys).
typedef struct AivRequestEntry {
    uint64_t transfer_id;      // 0
    uint64_t src_addr;         // 8
    uint64_t dst_addr;         // 16
    uint64_t length;           // 24
    uint32_t opcode;           // 32: AIV_REQUEST_OPCODE_*
    uint32_t flags;            // 36: route and QP index (AIV_REQUEST_ROUTE_*, AIV_REQUEST_QP_SHIFT); 0: SDMA
    uint32_t lkey;             // 40: RDMA only
    uint32_t rkey;             // 44: RDMA only
    uint64_t reserved[2];      // 48
} AivRequestEntry;

// Status of a device completion queue entry. Zero is never written, so a torn or stale entry is recognisable.
#define AIV_DCQ_STATUS_COMPLETED 1u
#define AIV_DCQ_STATUS_FAILED 2u
#define AIV_DCQ_STATUS_TIMEOUT 3u
#define AIV_DCQ_STATUS_ABORTED 4u

// Syndromes (why a transfer did not complete).
#define AIV_SYNDROME_NONE 0u
#define AIV_SYNDROME_BAD_REQUEST 1u        // zero length, unknown opcode or src/dst range overflow
#define AIV_SYNDROME_WAIT_BUDGET 2u        // the completion flag did not arrive within the wait budget
#define AIV_SYNDROME_ABORTED 3u            // the Host raised the abort flag while the kernel waited
#define AIV_SYNDROME_RDMA_BAD_QP 4u        // RDMA route: QP index outside the table, or its record not set up
#define AIV_SYNDROME_RDMA_QP_ERROR 5u      // RDMA route: the QP was already in error (not posted; the Host replaces it)
// RDMA route: an error CQE covered this transfer: AIV_SYNDROME_RDMA_CQE | (sub-status << 8) | status, with the
// status and sub-status of the CQE (AIV_ROCE_STATUS_*; WR_FLUSH_ERR for transfers flushed after the first error).
#define AIV_SYNDROME_RDMA_CQE 0x10000u

// One completion, kernel -> Host.
typedef struct AivDcqEntry {
    uint64_t transfer_id;      // 0
    uint64_t bytes;            // 8
    uint32_t status;           // 16: AIV_DCQ_STATUS_*
    uint32_t syndrome;         // 20: AIV_SYNDROME_*
    uint32_t sqes;             // 24: SQEs written for this transfer, its share of the flag SQE included
    uint32_t doorbells;        // 28: doorbells that covered its SQEs (a shared doorbell counts for each)
} AivDcqEntry;

// Per-block control words. Host-written words and kernel-written words sit on different cache lines.
typedef struct AivControlBlock {
    uint32_t stop;             // 0: Host -> kernel: leave the persistent loop
    uint32_t abort_epoch;      // 4: Host -> kernel: a change aborts the current wait
    uint32_t resume_count;     // 8: Host -> kernel: equals halt_count once the Host has reset the channel
    uint8_t pad0[52];
    uint32_t halt_count;       // 64: kernel -> Host: incremented when a group fails and the block halts
    uint32_t running;          // 68: kernel -> Host: 1 while a launch of this block runs
    uint64_t groups;           // 72: kernel -> Host: groups completed (progress counter)
    uint64_t trace_ring_seen;  // 80: kernel -> Host: the trace ring address the launch last read from its arguments
                               //     (stored at launch and whenever it reads a changed one)
    uint8_t pad1[40];
} AivControlBlock;

// The per-block flag area in device memory: flag SQE number `seq` copies `source[seq % AIV_FLAG_SOURCE_SLOTS]` into
// `receive`. Several source slots, because the kernel writes the next flag's value before the engine has executed
// the previous flag SQE (two groups in flight): one shared source word would let an older flag SQE deliver a newer
// sequence number and signal a group that has not executed yet.
#define AIV_FLAG_SOURCE_SLOTS 4u
typedef struct AivFlagArea {
    uint64_t source[AIV_FLAG_SOURCE_SLOTS];  // 0
    uint8_t pad0[32];
    uint64_t receive;          // 64
    uint8_t pad1[56];
} AivFlagArea;

#define AIV_LAUNCH_PER_BATCH 0u
#define AIV_LAUNCH_PERSISTENT 1u
#define AIV_GROUP_MAX_TRANSFERS 64u   // requests taken per completion flag

// Arguments of one block (an array indexed by block index).
typedef struct AivBlockArgs {
    uint64_t request_ring;     // 0: AivRingHeader + AivRequestEntry[request_depth]
    uint64_t dcq;              // 8: AivRingHeader + AivDcqEntry[dcq_depth]
    uint64_t channel_record;   // 16: AivChannelRecord
    uint64_t flag_area;        // 24: AivFlagArea (device memory)
    uint64_t control;          // 32: AivControlBlock
    uint64_t platform_context; // 40: opaque to the kernel; the twin platform layer's handle (0 on the NPU)
    uint64_t wait_budget;      // 48: completion wait budget in platform cycles
    uint32_t request_depth;    // 56
    uint32_t dcq_depth;        // 60
    uint32_t doorbell_batch;   // 64: SQEs per doorbell, >= 1
    uint32_t max_sqe_bytes;    // 68: <= AIV_SDMA_MAX_SQE_BYTES
    uint32_t launch_mode;      // 72: AIV_LAUNCH_*
    uint32_t group_limit;      // 76: <= AIV_GROUP_MAX_TRANSFERS
    uint64_t trace_ring;       // 80: AivTraceHeader + AivTraceEntry[trace_depth], or 0: no trace (re-read by a
                               //     persistent launch when idle, so the Host may switch it while the kernel runs)
    uint32_t trace_depth;      // 88: power of two >= 2 when trace_ring is set
    uint32_t qp_count;         // 92: entries of qp_table (<= AIV_QP_TABLE_SLOTS); 0: no RDMA route
    uint64_t qp_table;         // 96: AivQpRecord[qp_count] (aiv/roce.h), Host memory registered for the device
    uint32_t max_wqe_bytes;    // 104: largest message of one WQE (<= AIV_RDMA_MAX_WQE_BYTES); 0 with qp_count 0
    uint32_t reserved1;        // 108
    uint64_t reserved[2];      // 112
} AivBlockArgs;

// The RDMA route: QP records per block, and the largest message of one WQE.
#define AIV_QP_TABLE_SLOTS 16u
#define AIV_RDMA_MAX_WQE_BYTES (16u << 20)

// ---- The per-block trace ring (optional; docs/trace.md) ----
// Kernel -> Host, the DCQ's discipline: entries written with scalar stores, cleaned to HBM, then the tail published.
// A full ring drops the entry and counts it in `dropped`; the kernel never waits for the Host here.
#define AIV_TRACE_STAGE_REQUEST_SEEN 1u        // a group taken from the request ring (count: requests)
#define AIV_TRACE_STAGE_SQES_POSTED 2u         // the group's data SQEs written (count: SQEs), before its flag SQE
#define AIV_TRACE_STAGE_DOORBELL 3u            // a doorbell rung (count: the SQ tail written, aux: SQEs it covers)
#define AIV_TRACE_STAGE_COMPLETION_OBSERVED 4u // the group's completion flag seen, or the wait ended (aux: result)
#define AIV_TRACE_STAGE_DCQ_PUBLISHED 5u       // the group's DCQ entries published (count: entries, aux: failed)
typedef struct AivTraceHeader {
    uint32_t head;             // 0: Host -> kernel: entries consumed
    uint8_t pad0[60];
    uint32_t tail;             // 64: kernel -> Host: entries published
    uint32_t dropped;          // 68: kernel -> Host: entries dropped because the ring was full
    uint8_t pad1[56];
} AivTraceHeader;

typedef struct AivTraceEntry {
    uint64_t cycles;           // 0: the system counter (aiv_platform::cycles) at the stage
    uint64_t transfer_id;      // 8: the group's first transfer id
    uint32_t stage;            // 16: AIV_TRACE_STAGE_* (0 is never written)
    uint32_t count;            // 20
    uint32_t aux;              // 24
    uint32_t reserved;         // 28
} AivTraceEntry;

typedef struct AivKernelArgs {
    uint64_t blocks;           // 0: AivBlockArgs[block_count]
    uint32_t block_count;      // 8
    uint32_t layout_version;   // 12: AIV_LAYOUT_VERSION
} AivKernelArgs;

#define AIV_LAYOUT_VERSION 2u

// Off only in the twin build that tests/layout_probe.rs regenerates the asserts with (AIV_BLESS=1, see there).
#ifndef AIV_LAYOUT_ASSERTS_OFF
#include "aiv/layout_asserts.h"
#endif

#endif
