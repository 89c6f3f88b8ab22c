// Prints every size, field offset and constant of kernels/include/aiv/layouts.h as "name value" lines.
// tests/layout_probe.rs compiles this with the host C++ compiler and compares each line with the Rust mirror.
#include <cstddef>
#include <cstdio>

#include "aiv/layouts.h"

#define SIZE(T) std::printf("size.%s %zu\n", #T, sizeof(T))
#define OFF(T, f) std::printf("offset.%s.%s %zu\n", #T, #f, offsetof(T, f))
#define CONST(c) std::printf("const.%s %llu\n", #c, static_cast<unsigned long long>(c))

#include "roce_probe.h"

int main() {
    SIZE(AivSdmaSqe);
    OFF(AivSdmaSqe, type_word); OFF(AivSdmaSqe, block_dim); OFF(AivSdmaSqe, rt_stream_id); OFF(AivSdmaSqe, task_id);
    OFF(AivSdmaSqe, reserved0); OFF(AivSdmaSqe, reserved1); OFF(AivSdmaSqe, kernel_credit); OFF(AivSdmaSqe, ptr_mode);
    OFF(AivSdmaSqe, opcode_word); OFF(AivSdmaSqe, src_stream_id); OFF(AivSdmaSqe, src_sub_stream_id);
    OFF(AivSdmaSqe, dst_stream_id); OFF(AivSdmaSqe, dst_sub_stream_id); OFF(AivSdmaSqe, length);
    OFF(AivSdmaSqe, src_addr_low); OFF(AivSdmaSqe, src_addr_high); OFF(AivSdmaSqe, dst_addr_low);
    OFF(AivSdmaSqe, dst_addr_high); OFF(AivSdmaSqe, link_type); OFF(AivSdmaSqe, reserved2); OFF(AivSdmaSqe, reserved3);

    SIZE(AivChannelRecord);
    OFF(AivChannelRecord, sq_head); OFF(AivChannelRecord, sq_tail); OFF(AivChannelRecord, sq_base);
    OFF(AivChannelRecord, sq_reg_base); OFF(AivChannelRecord, sq_depth); OFF(AivChannelRecord, sq_id);
    OFF(AivChannelRecord, cq_id); OFF(AivChannelRecord, logic_cq_id); OFF(AivChannelRecord, cqe_addr);
    OFF(AivChannelRecord, report_cqe_num); OFF(AivChannelRecord, stream_id); OFF(AivChannelRecord, dev_id);
    OFF(AivChannelRecord, reserved);

    SIZE(AivRingHeader);
    OFF(AivRingHeader, head); OFF(AivRingHeader, tail);

    SIZE(AivRequestEntry);
    OFF(AivRequestEntry, transfer_id); OFF(AivRequestEntry, src_addr); OFF(AivRequestEntry, dst_addr);
    OFF(AivRequestEntry, length); OFF(AivRequestEntry, opcode); OFF(AivRequestEntry, flags);
    OFF(AivRequestEntry, lkey); OFF(AivRequestEntry, rkey); OFF(AivRequestEntry, reserved);

    SIZE(AivDcqEntry);
    OFF(AivDcqEntry, transfer_id); OFF(AivDcqEntry, bytes); OFF(AivDcqEntry, status); OFF(AivDcqEntry, syndrome);
    OFF(AivDcqEntry, sqes); OFF(AivDcqEntry, doorbells);

    SIZE(AivControlBlock);
    OFF(AivControlBlock, stop); OFF(AivControlBlock, abort_epoch); OFF(AivControlBlock, resume_count);
    OFF(AivControlBlock, halt_count); OFF(AivControlBlock, running); OFF(AivControlBlock, groups);
    OFF(AivControlBlock, trace_ring_seen);

    SIZE(AivFlagArea);
    OFF(AivFlagArea, source); OFF(AivFlagArea, receive);

    SIZE(AivBlockArgs);
    OFF(AivBlockArgs, request_ring); OFF(AivBlockArgs, dcq); OFF(AivBlockArgs, channel_record);
    OFF(AivBlockArgs, flag_area); OFF(AivBlockArgs, control); OFF(AivBlockArgs, platform_context);
    OFF(AivBlockArgs, wait_budget); OFF(AivBlockArgs, request_depth); OFF(AivBlockArgs, dcq_depth);
    OFF(AivBlockArgs, doorbell_batch); OFF(AivBlockArgs, max_sqe_bytes); OFF(AivBlockArgs, launch_mode);
    OFF(AivBlockArgs, group_limit); OFF(AivBlockArgs, trace_ring); OFF(AivBlockArgs, trace_depth);
    OFF(AivBlockArgs, qp_count); OFF(AivBlockArgs, qp_table);
    OFF(AivBlockArgs, max_wqe_bytes); OFF(AivBlockArgs, reserved1); OFF(AivBlockArgs, reserved);

    SIZE(AivTraceHeader);
    OFF(AivTraceHeader, head); OFF(AivTraceHeader, tail); OFF(AivTraceHeader, dropped);

    SIZE(AivTraceEntry);
    OFF(AivTraceEntry, cycles); OFF(AivTraceEntry, transfer_id); OFF(AivTraceEntry, stage); OFF(AivTraceEntry, count);
    OFF(AivTraceEntry, aux); OFF(AivTraceEntry, reserved);

    SIZE(AivKernelArgs);
    OFF(AivKernelArgs, blocks); OFF(AivKernelArgs, block_count); OFF(AivKernelArgs, layout_version);

    CONST(AIV_CACHE_LINE); CONST(AIV_SQE_BYTES); CONST(AIV_SQE_TYPE_SDMA); CONST(AIV_SQE_TYPE_MASK);
    CONST(AIV_SQE_KERNEL_CREDIT_SDMA); CONST(AIV_SQE_LINK_TYPE_NONE); CONST(AIV_SDMA_MAX_SQE_BYTES);
    CONST(AIV_SDMA_DOORBELL_OFFSET); CONST(AIV_SQE_OPCODE_COPY); CONST(AIV_SQE_BIT_SSSV); CONST(AIV_SQE_BIT_DSSV);
    CONST(AIV_SQE_BIT_SNS); CONST(AIV_SQE_BIT_DNS); CONST(AIV_SQE_QOS_SHIFT); CONST(AIV_SQE_QOS_COPY);
    CONST(AIV_RING_HEADER_BYTES); CONST(AIV_REQUEST_OPCODE_READ); CONST(AIV_REQUEST_OPCODE_WRITE);
    CONST(AIV_DCQ_STATUS_COMPLETED); CONST(AIV_DCQ_STATUS_FAILED); CONST(AIV_DCQ_STATUS_TIMEOUT);
    CONST(AIV_DCQ_STATUS_ABORTED); CONST(AIV_SYNDROME_NONE); CONST(AIV_SYNDROME_BAD_REQUEST);
    CONST(AIV_SYNDROME_WAIT_BUDGET); CONST(AIV_SYNDROME_ABORTED);
    CONST(AIV_SYNDROME_RDMA_BAD_QP); CONST(AIV_SYNDROME_RDMA_QP_ERROR); CONST(AIV_SYNDROME_RDMA_CQE);
    CONST(AIV_REQUEST_ROUTE_MASK); CONST(AIV_REQUEST_ROUTE_SDMA); CONST(AIV_REQUEST_ROUTE_RDMA);
    CONST(AIV_REQUEST_QP_SHIFT); CONST(AIV_QP_TABLE_SLOTS); CONST(AIV_RDMA_MAX_WQE_BYTES); CONST(AIV_LAUNCH_PER_BATCH);
    CONST(AIV_LAUNCH_PERSISTENT); CONST(AIV_GROUP_MAX_TRANSFERS); CONST(AIV_LAYOUT_VERSION); CONST(AIV_FLAG_SOURCE_SLOTS);
    CONST(AIV_TRACE_STAGE_REQUEST_SEEN); CONST(AIV_TRACE_STAGE_SQES_POSTED); CONST(AIV_TRACE_STAGE_DOORBELL);
    CONST(AIV_TRACE_STAGE_COMPLETION_OBSERVED); CONST(AIV_TRACE_STAGE_DCQ_PUBLISHED);
    print_roce_facts();
    return 0;
}
