// The AIV transfer kernel: portable logic, one source for the NPU and the CPU twin.
//
// Include a platform layer (platform/twin.h or platform/npu.h) first. Per block:
//   take the request-ring entries of this block (up to group_limit at a time), split each into pieces of at most
//   max_sqe_bytes, write one SDMA SQE per piece into this block's channel, ring the doorbell every doorbell_batch
//   SQEs, then append a flag SQE (copy an 8-byte sequence number into the block's receive area), ring, and spin on
//   the flag within wait_budget (abort flag checked); write one DCQ entry per transfer and publish the DCQ tail.
// A failed group (budget exhausted or aborted) halts the block until the Host has looked at the channel and reset it
// (control.resume_count == control.halt_count). The SQ is never overrun: when it would fill, the kernel drains it
// with a flag SQE first, so the kernel never needs the hardware head register.
#ifndef AIV_TRANSFER_KERNEL_H
#define AIV_TRANSFER_KERNEL_H

#include "aiv/layouts.h"
#include "aiv/platform.h"

namespace aiv {

// Number of SQEs a transfer of `length` bytes needs with pieces of at most `max_piece` bytes (0 for length 0).
AIV_DEVICE_FN uint64_t piece_count(uint64_t length, uint32_t max_piece) {
    if (length == 0 || max_piece == 0) return 0;
    return length / max_piece + (length % max_piece != 0 ? 1u : 0u);
}

// Length of piece `index` of a transfer (the last piece holds the remainder).
AIV_DEVICE_FN uint32_t piece_length(uint64_t length, uint32_t max_piece, uint64_t index) {
    uint64_t offset = index * max_piece;
    uint64_t rest = length - offset;
    return static_cast<uint32_t>(rest < max_piece ? rest : max_piece);
}

// Next SQ tail with the hardware's wrapped index (HARDWARE.md section 4: tail = (tail + 1) % depth).
AIV_DEVICE_FN uint32_t sq_next(uint32_t tail, uint32_t depth) { return tail + 1 == depth ? 0 : tail + 1; }

enum WaitResult : uint32_t { WAIT_OK = 0, WAIT_TIMEOUT = 1, WAIT_ABORTED = 2 };

struct Block {
    AivBlockArgs args;
    AIV_GM AivRingHeader* requests;
    AIV_GM AivRequestEntry* request_entries;
    AIV_GM AivRingHeader* dcq;
    AIV_GM AivDcqEntry* dcq_entries;
    AIV_GM AivChannelRecord* record;
    AIV_GM AivFlagArea* flag;
    AIV_GM AivControlBlock* control;
    uint64_t sq_base;
    uint64_t sq_reg_base;
    uint32_t sq_depth;
    uint32_t sq_head_seen;   // the record's head when the block started (for task_id)
    uint32_t sq_tail;        // software tail, wrapped
    uint32_t outstanding;    // SQEs written since the last completed flag
    uint32_t unrung;         // SQEs written since the last doorbell
    uint32_t doorbells;      // doorbells rung in the current group
    uint16_t stream_id;
    uint64_t flag_seq;       // last flag value posted
    uint32_t abort_epoch;    // abort epoch when the current group started
};

AIV_DEVICE_FN void ring(Block& b) {
    if (b.unrung == 0) return;
    aiv_platform::flush_for_device(reinterpret_cast<AIV_GM void*>(b.sq_base), b.sq_depth * AIV_SQE_BYTES);
    aiv_platform::ring_doorbell(b.args.platform_context, b.sq_reg_base, b.sq_tail);
    // The software copy of the tail lives in the channel record (HARDWARE.md section 4, last post step).
    aiv_platform::store_u32(&b.record->sq_tail, b.sq_tail);
    b.doorbells += 1;
    b.unrung = 0;
}

// Writes one copy SQE at the tail; rings when doorbell_batch SQEs are pending. The caller guarantees space.
AIV_DEVICE_FN void post_copy(Block& b, uint64_t src, uint64_t dst, uint32_t length) {
    AivSdmaSqe sqe;
    uint32_t* words = reinterpret_cast<uint32_t*>(&sqe);
    for (uint32_t i = 0; i < AIV_SQE_BYTES / 4; ++i) words[i] = 0;
    sqe.type_word = AIV_SQE_TYPE_SDMA;
    sqe.rt_stream_id = b.stream_id;
    sqe.task_id = static_cast<uint16_t>(b.sq_tail - b.sq_head_seen);
    sqe.kernel_credit = AIV_SQE_KERNEL_CREDIT_SDMA;
    sqe.opcode_word = AIV_SQE_OPCODE_COPY | AIV_SQE_BIT_SSSV | AIV_SQE_BIT_DSSV | AIV_SQE_BIT_SNS | AIV_SQE_BIT_DNS |
                      (AIV_SQE_QOS_COPY << AIV_SQE_QOS_SHIFT);
    sqe.length = length;
    sqe.src_addr_low = static_cast<uint32_t>(src);
    sqe.src_addr_high = static_cast<uint32_t>(src >> 32);
    sqe.dst_addr_low = static_cast<uint32_t>(dst);
    sqe.dst_addr_high = static_cast<uint32_t>(dst >> 32);
    sqe.link_type = AIV_SQE_LINK_TYPE_NONE;
    aiv_platform::write_bytes(reinterpret_cast<AIV_GM void*>(b.sq_base + uint64_t(b.sq_tail) * AIV_SQE_BYTES), &sqe,
                              AIV_SQE_BYTES);
    b.sq_tail = sq_next(b.sq_tail, b.sq_depth);
    b.outstanding += 1;
    b.unrung += 1;
    if (b.unrung >= b.args.doorbell_batch) ring(b);
}

// Appends the flag SQE, rings, and waits for the flag within the budget. On success every SQE written before it has
// executed (the channel runs in order), so the whole SQ is free again.
AIV_DEVICE_FN WaitResult drain(Block& b) {
    b.flag_seq += 1;
    aiv_platform::store_u64(&b.flag->source, b.flag_seq);
    aiv_platform::flush_for_device(&b.flag->source, 8);
    post_copy(b, reinterpret_cast<uint64_t>(&b.flag->source), reinterpret_cast<uint64_t>(&b.flag->receive), 8);
    ring(b);
    const uint64_t start = aiv_platform::cycles();
    for (uint32_t spins = 0;; ++spins) {
        const uint32_t token = aiv_platform::wait_token(b.args.platform_context, AIV_WAIT_COMPLETION);
        if (aiv_platform::load_u64(&b.flag->receive) == b.flag_seq) {
            b.outstanding = 0;
            return WAIT_OK;
        }
        // The abort flag, and a stop request (shutdown must never wait out a long budget).
        if (aiv_platform::load_u32(&b.control->abort_epoch) != b.abort_epoch) return WAIT_ABORTED;
        if (aiv_platform::load_u32(&b.control->stop) != 0) return WAIT_ABORTED;
        if (aiv_platform::cycles() - start >= b.args.wait_budget) return WAIT_TIMEOUT;
        aiv_platform::idle(b.args.platform_context, AIV_WAIT_COMPLETION, token, spins);
    }
}

struct Tally {
    uint64_t transfer_id;
    uint64_t bytes;
    uint32_t status;
    uint32_t syndrome;
    uint32_t sqes;
    uint32_t first_doorbell;
    uint32_t last_doorbell;
    uint32_t posted;
};

AIV_DEVICE_FN bool request_is_valid(const AivRequestEntry& e) {
    if (e.length == 0) return false;
    if (e.opcode != AIV_REQUEST_OPCODE_READ && e.opcode != AIV_REQUEST_OPCODE_WRITE) return false;
    if (e.src_addr + e.length < e.src_addr || e.dst_addr + e.length < e.dst_addr) return false;
    return true;
}

// Runs `count` requests starting at ring index `head`; returns the wait result of the group.
AIV_DEVICE_FN WaitResult run_group(Block& b, uint32_t head, uint32_t count, Tally* tally) {
    const uint32_t mask = b.args.request_depth - 1;
    const uint32_t max_piece = b.args.max_sqe_bytes;
    b.doorbells = 0;
    b.abort_epoch = aiv_platform::load_u32(&b.control->abort_epoch);
    WaitResult result = WAIT_OK;
    for (uint32_t i = 0; i < count; ++i) {
        AivRequestEntry e;
        aiv_platform::read_bytes(&e, &b.request_entries[(head + i) & mask], sizeof(AivRequestEntry));
        Tally& t = tally[i];
        t.transfer_id = e.transfer_id;
        t.bytes = e.length;
        t.status = AIV_DCQ_STATUS_COMPLETED;
        t.syndrome = AIV_SYNDROME_NONE;
        t.sqes = 0;
        t.first_doorbell = 0;
        t.last_doorbell = 0;
        t.posted = 0;
        if (!request_is_valid(e)) {
            t.status = AIV_DCQ_STATUS_FAILED;
            t.syndrome = AIV_SYNDROME_BAD_REQUEST;
            t.bytes = 0;
            continue;
        }
        if (result != WAIT_OK) continue;
        const uint64_t pieces = piece_count(e.length, max_piece);
        for (uint64_t p = 0; p < pieces && result == WAIT_OK; ++p) {
            // Keep one slot for the flag SQE; a full ring holds depth - 1 entries.
            if (b.outstanding + 2 > b.sq_depth - 1) {
                result = drain(b);
                if (result != WAIT_OK) break;
            }
            if (p == 0) t.first_doorbell = b.doorbells;
            const uint64_t offset = p * max_piece;
            post_copy(b, e.src_addr + offset, e.dst_addr + offset, piece_length(e.length, max_piece, p));
            t.sqes += 1;
        }
        // The doorbell that covers the last SQE: the one just rung, or the next one.
        t.last_doorbell = b.unrung == 0 ? b.doorbells - 1 : b.doorbells;
        t.posted = 1;
    }
    // The flag's doorbell is the next one: it also covers any data SQEs still unrung.
    const uint32_t flag_doorbell = b.doorbells;
    if (result == WAIT_OK) result = drain(b);
    for (uint32_t i = 0; i < count; ++i) {
        Tally& t = tally[i];
        if (t.status != AIV_DCQ_STATUS_COMPLETED) continue;
        // Its share of the flag SQE, and of the flag's doorbell unless that doorbell also covered its last SQE.
        if (t.posted) t.sqes += 1;
        uint32_t doorbells = t.posted ? t.last_doorbell - t.first_doorbell + 1 : 0;
        if (flag_doorbell != t.last_doorbell) doorbells += 1;
        t.first_doorbell = doorbells;  // reused as the count
        if (result == WAIT_TIMEOUT) {
            t.status = AIV_DCQ_STATUS_TIMEOUT;
            t.syndrome = AIV_SYNDROME_WAIT_BUDGET;
            t.bytes = 0;
        } else if (result == WAIT_ABORTED) {
            t.status = AIV_DCQ_STATUS_ABORTED;
            t.syndrome = AIV_SYNDROME_ABORTED;
            t.bytes = 0;
        }
    }
    return result;
}

// Waits until the Host drains enough DCQ entries; false if told to stop.
AIV_DEVICE_FN bool wait_dcq_space(Block& b, uint32_t dcq_tail, uint32_t count) {
    for (uint32_t spins = 0;; ++spins) {
        const uint32_t token = aiv_platform::wait_token(b.args.platform_context, AIV_WAIT_DCQ_SPACE);
        const uint32_t dcq_head = aiv_platform::load_u32(&b.dcq->head);
        if (dcq_tail - dcq_head + count <= b.args.dcq_depth) return true;
        if (aiv_platform::load_u32(&b.control->stop) != 0) return false;
        aiv_platform::idle(b.args.platform_context, AIV_WAIT_DCQ_SPACE, token, spins);
    }
}

AIV_DEVICE_FN void publish_completions(Block& b, uint32_t count, const Tally* tally) {
    const uint32_t mask = b.args.dcq_depth - 1;
    // The kernel is the only producer of the DCQ: its tail is read once, without racing anyone.
    const uint32_t dcq_tail = aiv_platform::load_u32(&b.dcq->tail);
    if (!wait_dcq_space(b, dcq_tail, count)) return;
    for (uint32_t i = 0; i < count; ++i) {
        AivDcqEntry entry;
        entry.transfer_id = tally[i].transfer_id;
        entry.bytes = tally[i].bytes;
        entry.status = tally[i].status;
        entry.syndrome = tally[i].syndrome;
        entry.sqes = tally[i].status == AIV_DCQ_STATUS_FAILED ? 0 : tally[i].sqes;
        entry.doorbells = tally[i].status == AIV_DCQ_STATUS_FAILED ? 0 : tally[i].first_doorbell;
        aiv_platform::write_bytes(&b.dcq_entries[(dcq_tail + i) & mask], &entry, sizeof(AivDcqEntry));
    }
    // Release: the entries written above are visible to a Host that acquires the new tail.
    aiv_platform::store_u32(&b.dcq->tail, dcq_tail + count);
    aiv_platform::notify_host(b.args.platform_context);
}

// Waits (persistent launches) until the Host has reset the channel after a failed group; false if told to stop.
AIV_DEVICE_FN bool wait_resume(Block& b) {
    for (uint32_t spins = 0;; ++spins) {
        const uint32_t token = aiv_platform::wait_token(b.args.platform_context, AIV_WAIT_REQUEST);
        if (aiv_platform::load_u32(&b.control->resume_count) == aiv_platform::load_u32(&b.control->halt_count)) {
            return true;
        }
        if (aiv_platform::load_u32(&b.control->stop) != 0) return false;
        aiv_platform::idle(b.args.platform_context, AIV_WAIT_REQUEST, token, spins);
    }
}

AIV_DEVICE_FN void load_channel(Block& b) {
    b.sq_base = b.record->sq_base;
    b.sq_reg_base = b.record->sq_reg_base;
    b.sq_depth = b.record->sq_depth;
    b.stream_id = static_cast<uint16_t>(b.record->stream_id);
    b.sq_head_seen = aiv_platform::load_u32(&b.record->sq_head);
    b.sq_tail = aiv_platform::load_u32(&b.record->sq_tail);
    b.outstanding = 0;
    b.unrung = 0;
}

// Kernel body of block `block_idx`.
AIV_DEVICE_FN void transfer_block(const AIV_GM AivKernelArgs* kernel_args, uint32_t block_idx) {
    AivKernelArgs kargs;
    aiv_platform::read_bytes(&kargs, kernel_args, sizeof(AivKernelArgs));
    if (kargs.layout_version != AIV_LAYOUT_VERSION || block_idx >= kargs.block_count) return;
    Block b;
    aiv_platform::read_bytes(&b.args, reinterpret_cast<const AIV_GM AivBlockArgs*>(kargs.blocks) + block_idx,
                             sizeof(AivBlockArgs));
    if (b.args.doorbell_batch == 0 || b.args.max_sqe_bytes == 0 || b.args.max_sqe_bytes > AIV_SDMA_MAX_SQE_BYTES ||
        b.args.group_limit == 0 || b.args.group_limit > AIV_GROUP_MAX_TRANSFERS) {
        return;
    }
    b.requests = reinterpret_cast<AIV_GM AivRingHeader*>(b.args.request_ring);
    b.request_entries = reinterpret_cast<AIV_GM AivRequestEntry*>(b.args.request_ring + AIV_RING_HEADER_BYTES);
    b.dcq = reinterpret_cast<AIV_GM AivRingHeader*>(b.args.dcq);
    b.dcq_entries = reinterpret_cast<AIV_GM AivDcqEntry*>(b.args.dcq + AIV_RING_HEADER_BYTES);
    b.record = reinterpret_cast<AIV_GM AivChannelRecord*>(b.args.channel_record);
    b.flag = reinterpret_cast<AIV_GM AivFlagArea*>(b.args.flag_area);
    b.control = reinterpret_cast<AIV_GM AivControlBlock*>(b.args.control);
    b.flag_seq = aiv_platform::load_u64(&b.flag->source);
    const bool persistent = b.args.launch_mode == AIV_LAUNCH_PERSISTENT;

    aiv_platform::store_u32(&b.control->running, 1);
    Tally tally[AIV_GROUP_MAX_TRANSFERS];
    // The kernel is the only consumer of the request ring: it owns head.
    uint32_t head = aiv_platform::load_u32(&b.requests->head);
    bool halted = aiv_platform::load_u32(&b.control->resume_count) != aiv_platform::load_u32(&b.control->halt_count);
    for (uint32_t spins = 0;;) {
        if (halted) {
            if (!persistent || !wait_resume(b)) break;
            halted = false;
        }
        load_channel(b);
        const uint32_t token = aiv_platform::wait_token(b.args.platform_context, AIV_WAIT_REQUEST);
        if (aiv_platform::load_u32(&b.control->stop) != 0) break;
        // Acquire: the entries up to tail were written before the Host's release store of tail.
        const uint32_t tail = aiv_platform::load_u32(&b.requests->tail);
        if (tail == head) {
            if (!persistent) break;
            aiv_platform::idle(b.args.platform_context, AIV_WAIT_REQUEST, token, spins++);
            continue;
        }
        spins = 0;
        uint32_t count = tail - head;
        if (count > b.args.group_limit) count = b.args.group_limit;
        const WaitResult result = run_group(b, head, count, tally);
        if (result != WAIT_OK) {
            // Halt before publishing: a Host that sees the failed entries also sees the halt.
            aiv_platform::store_u32(&b.control->halt_count, aiv_platform::load_u32(&b.control->halt_count) + 1);
            halted = true;
        }
        publish_completions(b, count, tally);
        head += count;
        // Release: the Host may reuse the slots once it sees the new head.
        aiv_platform::store_u32(&b.requests->head, head);
        aiv_platform::store_u64(&b.control->groups, aiv_platform::load_u64(&b.control->groups) + 1);
    }
    aiv_platform::store_u32(&b.control->running, 0);
}

}  // namespace aiv

#endif
