// The AIV transfer kernel: portable logic, one source for the NPU and the CPU twin.
//
// Include the platform layer (platform/npu.h) first. Per block:
//   take the request-ring entries of this block (up to group_limit at a time), split each into pieces of at most
//   max_sqe_bytes (a power of two), build one SDMA SQE per piece in the platform's UB stage and land the stage in
//   this block's channel (before each doorbell, and when the stage fills or the tail wraps), ring the doorbell
//   every doorbell_batch SQEs, then append a flag SQE (copy an 8-byte sequence number into the block's receive
//   area), ring, and spin on the flag within wait_budget (abort flag checked); write one DCQ entry per transfer and
//   publish the DCQ tail.
// A failed group (budget exhausted or aborted) halts the block until the Host has looked at the channel and reset it
// (control.resume_count == control.halt_count). The SQ is never overrun: when it would fill, the kernel drains it
// with a flag SQE first, so the kernel never needs the hardware head register.
// A request on the RDMA route (docs/rdma.md section 7) goes to a QP of the block's QP table instead: split into
// WQEs of at most max_wqe_bytes (a power of two), each built in UB and landed in the QP's SQ, the SQ doorbell rung
// every doorbell_batch WQEs and at the end of the group; its completion is the CQE of its last (signaled) WQE,
// polled by owner bit with its status checked. An error CQE fails the transfers it covers with the CQE's status, the
// later ones on that QP with WR_FLUSH_ERR, and records the error in the QP record's kernel line: the QP is never
// used again (the Host replaces it). RDMA failures do not halt the block; a group with RDMA requests and no SDMA SQE
// posts no flag SQE.
#ifndef AIV_TRANSFER_KERNEL_H
#define AIV_TRANSFER_KERNEL_H

#include "aiv/layouts.h"
#include "aiv/platform.h"
#include "aiv/roce.h"

namespace aiv {

// No division or modulo by a variable anywhere in the kernel: the AIV scalar unit has no divider, so a 64-bit (and
// likely a 32-bit) one is a library call. Ring depths are powers of two (index & (depth - 1)), and so are the piece
// sizes max_sqe_bytes and max_wqe_bytes: a transfer is split with a shift and a mask (tests/kernel_code.rs checks
// the host build of the kernel has no division instruction).

AIV_DEVICE_FN bool power_of_two(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// log2 of a power of two `v`, by a loop (once per launch; no count-trailing-zeros instruction assumed); 32 when `v`
// is not a power of two.
AIV_DEVICE_FN uint32_t log2_exact(uint32_t v) {
    if (!power_of_two(v)) return 32;
    uint32_t shift = 0;
    while ((v >> shift) != 1u) ++shift;
    return shift;
}

// Number of pieces of at most 1 << `shift` bytes a transfer of `length` bytes needs (0 for length 0).
AIV_DEVICE_FN uint64_t piece_count(uint64_t length, uint32_t shift) {
    return (length >> shift) + ((length & ((uint64_t(1) << shift) - 1)) != 0 ? 1u : 0u);
}

// Length of piece `index` of a transfer in pieces of at most 1 << `shift` bytes (the last holds the remainder).
AIV_DEVICE_FN uint32_t piece_length(uint64_t length, uint32_t shift, uint64_t index) {
    const uint64_t max_piece = uint64_t(1) << shift;
    const uint64_t rest = length - (index << shift);
    return static_cast<uint32_t>(rest < max_piece ? rest : max_piece);
}

// Next SQ tail with the hardware's wrapped index (docs/hardware.md section 4: tail = (tail + 1) % depth).
AIV_DEVICE_FN uint32_t sq_next(uint32_t tail, uint32_t depth) { return tail + 1 == depth ? 0 : tail + 1; }

enum WaitResult : uint32_t { WAIT_OK = 0, WAIT_TIMEOUT = 1, WAIT_ABORTED = 2 };

// The kernel's state of one QP of the block's QP table (docs/rdma.md section 7): the Host line of its record as
// adopted, and the kernel's indices. Indices are free-running u32s.
struct QpState {
    uint32_t qpn;            // the QP adopted (0: none yet in this launch)
    uint32_t cqn;
    uint64_t sq_base;
    uint64_t sq_db_addr;
    uint64_t cq_base;
    uint64_t cq_db_addr;
    uint32_t sq_depth;
    uint32_t cq_depth;
    uint32_t sl;
    uint32_t lkey;           // the record's keys, for requests that name none
    uint32_t rkey;
    uint32_t pi;             // WQEs posted
    uint32_t done;           // WQEs known to have completed (up to the last CQE consumed)
    uint32_t cq_ci;          // CQEs consumed
    uint32_t unrung;         // WQEs posted since the last SQ doorbell
    uint32_t doorbells;      // SQ doorbells rung (free-running)
    uint32_t last_signaled;  // pi right after the last signaled WQE
    uint32_t error_status;   // 0, a CQE status, or AIV_QP_ERROR_*: the QP is not posted to again
    uint32_t error_index;    // the failed WQE's index (free-running)
    uint32_t error_sub_status;
    bool dirty;              // indices changed since the record's kernel line was last written
};

struct Block {
    AivBlockArgs args;
    AIV_GM AivRingHeader* requests;
    AIV_GM AivRequestEntry* request_entries;
    AIV_GM AivRingHeader* dcq;
    AIV_GM AivDcqEntry* dcq_entries;
    AIV_GM AivChannelRecord* record;
    AIV_GM AivFlagArea* flag;
    AIV_GM AivControlBlock* control;
    uint32_t sqe_shift;      // log2 of args.max_sqe_bytes
    uint32_t wqe_shift;      // log2 of args.max_wqe_bytes (RDMA route only)
    uint64_t sq_base;
    uint64_t sq_reg_base;
    uint32_t sq_depth;
    uint32_t sq_head_seen;   // the record's head when the block started (for task_id)
    uint32_t sq_tail;        // software tail, wrapped
    uint64_t sqes_posted;    // SQEs written since the channel was loaded
    uint64_t sqes_retired;   // of those, SQEs known to have executed (up to the last completed flag)
    uint32_t unrung;         // SQEs written since the last doorbell
    uint32_t staged;         // SQEs built in the UB stage and not yet landed in the SQ (the last `staged` before tail)
    uint32_t stage_primed;   // stage slots [0, stage_primed) hold a whole copy SQE since load_channel (post_copy)
    uint32_t doorbells;      // doorbells rung in the current group
    uint16_t stream_id;
    uint64_t flag_seq;       // last flag value posted
    uint32_t abort_epoch;    // abort epoch when the current group started
    // The optional trace ring (null: off; then the kernel only tests `trace` once per stage of a group).
    const AIV_GM AivBlockArgs* args_gm;  // this block's arguments in GM, re-read for the trace switch
    uint64_t trace_ring;     // the ring's address as last read from the arguments
    AIV_GM AivTraceHeader* trace;
    AIV_GM AivTraceEntry* trace_entries;
    uint32_t trace_depth;
    uint32_t trace_tail;       // entries written (free-running)
    uint32_t trace_published;  // the tail as last published
    uint32_t trace_head_seen;  // the Host's head as last read
    uint32_t trace_dropped;    // entries dropped, as counted here
    uint32_t trace_dropped_published;
    uint64_t trace_group;      // first transfer id of the group being posted
    // The RDMA route: the block's QP table (null: no RDMA route) and the kernel's state of each QP in it.
    AIV_GM AivQpRecord* qp_table;
    uint32_t qp_count;
    AIV_UB QpState* qps;     // AIV_QP_TABLE_SLOTS of them, in the UB state area (state_layout below)
};

// ---- The trace ring (docs/trace.md): the DCQ's discipline, never a wait ----

// Writes one trace entry (in the data cache until trace_publish); a full ring drops it and counts the drop.
AIV_DEVICE_FN void trace_record(Block& b, uint32_t stage, uint64_t cycles, uint32_t count, uint64_t transfer_id,
                                uint32_t aux) {
    if (b.trace_tail - b.trace_head_seen >= b.trace_depth) {
        b.trace_head_seen = aiv_platform::load_u32(&b.trace->head);
        if (b.trace_tail - b.trace_head_seen >= b.trace_depth) {
            b.trace_dropped += 1;
            return;
        }
    }
    AivTraceEntry entry;
    entry.cycles = cycles;
    entry.transfer_id = transfer_id;
    entry.stage = stage;
    entry.count = count;
    entry.aux = aux;
    entry.reserved = 0;
    aiv_platform::write_bytes(&b.trace_entries[b.trace_tail & (b.trace_depth - 1)], &entry, sizeof(AivTraceEntry));
    b.trace_tail += 1;
}

// Makes the entries written since the last publication visible to the Host: cleaned to HBM first (one range, or two
// when they wrap), then the tail, as flush_completions and publish_groups do for the DCQ; then the drop count.
AIV_DEVICE_FN void trace_publish(Block& b) {
    if (b.trace == nullptr) return;
    if (b.trace_tail != b.trace_published) {
        const uint32_t first = b.trace_published & (b.trace_depth - 1);
        const uint32_t count = b.trace_tail - b.trace_published;
        const uint32_t run = count < b.trace_depth - first ? count : b.trace_depth - first;
        if (run > 0) aiv_platform::flush_for_device(&b.trace_entries[first], run * sizeof(AivTraceEntry));
        if (count > run) aiv_platform::flush_for_device(&b.trace_entries[0], (count - run) * sizeof(AivTraceEntry));
        // Release: the entries cleaned above are visible to a Host that acquires the new tail.
        aiv_platform::store_u32(&b.trace->tail, b.trace_tail);
        b.trace_published = b.trace_tail;
    }
    if (b.trace_dropped != b.trace_dropped_published) {
        aiv_platform::store_u32(&b.trace->dropped, b.trace_dropped);
        b.trace_dropped_published = b.trace_dropped;
    }
}

// Reads the trace switch from the block's arguments (at the start of a launch, and when a persistent launch is idle:
// never on the data path). A changed ring is adopted with its indices as the Host left them, and acknowledged in the
// control block (the Host's set_trace waits for that).
AIV_DEVICE_FN void trace_refresh(Block& b) {
    const uint64_t ring = aiv_platform::load_u64(&b.args_gm->trace_ring);
    if (ring == b.trace_ring) return;
    trace_publish(b);
    b.trace_ring = ring;
    aiv_platform::store_u64(&b.control->trace_ring_seen, ring);
    const uint32_t depth = aiv_platform::load_u32(&b.args_gm->trace_depth);
    if (ring == 0 || depth < 2 || (depth & (depth - 1)) != 0) {
        b.trace = nullptr;
        return;
    }
    b.trace = reinterpret_cast<AIV_GM AivTraceHeader*>(ring);
    b.trace_entries = reinterpret_cast<AIV_GM AivTraceEntry*>(ring + AIV_RING_HEADER_BYTES);
    b.trace_depth = depth;
    b.trace_tail = aiv_platform::load_u32(&b.trace->tail);
    b.trace_published = b.trace_tail;
    b.trace_head_seen = aiv_platform::load_u32(&b.trace->head);
    b.trace_dropped = aiv_platform::load_u32(&b.trace->dropped);
    b.trace_dropped_published = b.trace_dropped;
}

// Lands the staged SQEs in the SQ (they are contiguous: the stage is landed whenever the tail wraps).
AIV_DEVICE_FN void land(Block& b) {
    if (b.staged == 0) return;
    const uint32_t first = (b.sq_tail == 0 ? b.sq_depth : b.sq_tail) - b.staged;
    aiv_platform::land_sqes(reinterpret_cast<AIV_GM void*>(b.sq_base + uint64_t(first) * AIV_SQE_BYTES), b.staged);
    b.staged = 0;
}

// `Trace`: a compile-time copy of the posting path that records each doorbell; the kernel picks the copy once per
// group, so an untraced group runs the same code as before traces existed.
template <bool Trace>
AIV_DEVICE_FN void ring(Block& b) {
    if (b.unrung == 0) return;
    land(b);
    // The doorbell, and the software copy of the tail in the channel record (docs/hardware.md section 4, last post
    // step).
    aiv_platform::ring_doorbell(b.args.platform_context, b.sq_reg_base, b.sq_tail, &b.record->sq_tail);
    if (Trace) trace_record(b, AIV_TRACE_STAGE_DOORBELL, aiv_platform::cycles(), b.sq_tail, b.trace_group, b.unrung);
    b.doorbells += 1;
    b.unrung = 0;
}

// SQEs in the ring not yet known to have executed.
AIV_DEVICE_FN uint64_t outstanding(const Block& b) { return b.sqes_posted - b.sqes_retired; }

// Writes one copy SQE at the tail (built in the UB stage, landed in the SQ when the stage fills, the tail wraps or a
// doorbell is rung); rings when doorbell_batch SQEs are pending. The caller guarantees space.
template <bool Trace>
AIV_DEVICE_FN void post_copy(Block& b, uint64_t src, uint64_t dst, uint32_t length) {
    // Value-initialised (every byte zero) and written field by field; stage_sqe copies it out word by word without
    // type punning (reading the u16 fields back through a wider pointer is undefined, and an optimising compiler
    // did reorder such a read: the CPU model caught SQEs whose 16-bit fields reached memory as zeros).
    AivSdmaSqe sqe = {};
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
    // Every SQE staged here differs from the others only in words 0, 3, 4 and 5 (task_id and the stream id, length,
    // the addresses): a slot staged since the channel was loaded keeps words 1, 2, 6 and 7, and only the four are
    // rewritten (half the scalar UB stores per SQE).
    const bool whole = b.staged >= b.stage_primed;
    aiv_platform::stage_sqe(b.staged, sqe, whole);
    if (whole) b.stage_primed = b.staged + 1;
    b.staged += 1;
    b.sq_tail = sq_next(b.sq_tail, b.sq_depth);
    b.sqes_posted += 1;
    b.unrung += 1;
    if (b.staged == AIV_SQE_STAGE_SLOTS || b.sq_tail == 0) land(b);
    if (b.unrung >= b.args.doorbell_batch) ring<Trace>(b);
}

// Appends a flag SQE (copy the next sequence number into the receive area) and rings; returns its sequence number.
// At most two flag SQEs are ever unexecuted (an older group's and the newer group's, or a drain's), so slot
// `seq % AIV_FLAG_SOURCE_SLOTS` is never rewritten before the flag SQE that reads it has executed.
template <bool Trace>
AIV_DEVICE_FN uint64_t post_flag(Block& b) {
    static_assert((AIV_FLAG_SOURCE_SLOTS & (AIV_FLAG_SOURCE_SLOTS - 1)) == 0, "the flag slot is taken with a mask");
    b.flag_seq += 1;
    AIV_GM uint64_t* source = &b.flag->source[b.flag_seq & (AIV_FLAG_SOURCE_SLOTS - 1)];
    aiv_platform::store_u64(source, b.flag_seq);
    aiv_platform::flush_for_device(source, 8);
    post_copy<Trace>(b, reinterpret_cast<uint64_t>(source), reinterpret_cast<uint64_t>(&b.flag->receive), 8);
    ring<Trace>(b);
    return b.flag_seq;
}

// Whether the flag with sequence number `seq` (or a later one) has landed: the channel runs in order, so every SQE
// written before that flag SQE has executed.
AIV_DEVICE_FN bool flag_reached(Block& b, uint64_t seq) { return aiv_platform::load_u64(&b.flag->receive) >= seq; }

// Spins on flag `seq` within the budget; gives up when the abort epoch moves away from `abort_epoch` or on stop.
AIV_DEVICE_FN WaitResult wait_flag(Block& b, uint64_t seq, uint32_t abort_epoch) {
    const uint64_t start = aiv_platform::cycles();
    for (uint32_t spins = 0;; ++spins) {
        const uint32_t token = aiv_platform::wait_token(b.args.platform_context, AIV_WAIT_COMPLETION);
        if (flag_reached(b, seq)) return WAIT_OK;
        // The abort flag, and a stop request (shutdown must never wait out a long budget).
        if (aiv_platform::load_u32(&b.control->abort_epoch) != abort_epoch) return WAIT_ABORTED;
        if (aiv_platform::load_u32(&b.control->stop) != 0) return WAIT_ABORTED;
        if (aiv_platform::cycles() - start >= b.args.wait_budget) return WAIT_TIMEOUT;
        aiv_platform::idle(b.args.platform_context, AIV_WAIT_COMPLETION, token, spins);
    }
}

// Appends a flag SQE and waits for it: on success the whole SQ is free again.
template <bool Trace>
AIV_DEVICE_FN WaitResult drain(Block& b) {
    const uint64_t seq = post_flag<Trace>(b);
    const uint64_t mark = b.sqes_posted;
    const WaitResult result = wait_flag(b, seq, b.abort_epoch);
    if (result == WAIT_OK) b.sqes_retired = mark;
    return result;
}

struct Tally {
    uint64_t transfer_id;
    uint64_t bytes;
    uint32_t status;
    uint32_t syndrome;
    uint32_t sqes;          // SDMA: its SQEs and share of the flag SQE; RDMA: its WQEs
    uint32_t doorbells;
    uint32_t rdma;          // 1: its WQEs are on QP rdma_slot, completed by CQEs (not by the group's flag)
    uint32_t rdma_slot;
    uint32_t rdma_first;    // index of its first WQE
    uint32_t rdma_end;      // index after its last WQE
    uint32_t first_doorbell;  // SDMA, while posting: the group's doorbell count at its first SQE
    uint32_t last_doorbell;   // SDMA, while posting: the doorbell that covers its last SQE
};

// A group of requests taken together: its SDMA SQEs end with one flag SQE.
struct Group {
    uint32_t head;          // ring index of its first request
    uint32_t count;         // requests in it
    uint32_t rdma;          // of them, transfers with WQEs posted on the RDMA route
    uint64_t flag_seq;      // its flag's sequence number (0 if posting failed before the flag, or no flag)
    uint64_t retire_mark;   // sqes_posted right after its flag SQE: all of them have executed once the flag lands
    uint32_t abort_epoch;   // abort epoch when it was posted
    WaitResult posted;      // result of any drain needed while posting it
    Tally tally[AIV_GROUP_MAX_TRANSFERS];
};

// ---- The block's state in UB ----
// The large per-block state (the two groups in flight with a tally per transfer, and the state of each QP) lives in
// the platform's UB state area (aiv_platform::state_area, AIV_UB_STATE_BYTES), not on the stack: the kernel's frame
// stays small (docs/ascendc-cpu.md, "The kernel's stack"). Scalar accesses only; no DMA reads or writes it.
namespace state_layout {
constexpr uint32_t align32(uint32_t n) { return (n + 31u) & ~31u; }
constexpr uint32_t kGroupsOffset = 0;                                                  // Group[2]
constexpr uint32_t kQpsOffset = align32(kGroupsOffset + 2u * sizeof(Group));           // QpState[AIV_QP_TABLE_SLOTS]
constexpr uint32_t kBytes = align32(kQpsOffset + AIV_QP_TABLE_SLOTS * sizeof(QpState));
static_assert(kBytes <= AIV_UB_STATE_BYTES, "the block's state fits the platform's UB state area");
static_assert(alignof(Group) <= 32 && alignof(QpState) <= 32, "32-byte offsets align both arrays");
}  // namespace state_layout

// ---- The RDMA route (docs/rdma.md section 7) ----

// Writes the kernel line of QP record `slot`: the indices and the error, then the QPN they are about, last (the
// Host trusts error_status only when qpn_seen is the record's qpn).
AIV_DEVICE_FN void qp_save(Block& b, uint32_t slot) {
    AIV_UB QpState& q = b.qps[slot];
    AIV_GM AivQpRecord* rec = &b.qp_table[slot];
    aiv_platform::store_u32(&rec->sq_pi, q.pi);
    aiv_platform::store_u32(&rec->sq_ci, q.done);
    aiv_platform::store_u32(&rec->cq_ci, q.cq_ci);
    aiv_platform::store_u32(&rec->error_status, q.error_status);
    aiv_platform::store_u32(&rec->error_wqe_index, q.error_index & 0xFFFFu);
    aiv_platform::store_u32(&rec->error_sub_status, q.error_sub_status);
    aiv_platform::store_u32(&rec->qpn_seen, q.qpn);
    q.dirty = false;
}

// The QP in table slot `slot`, adopted from its record the first time this launch uses it or when the Host has put
// another QP there; null when the slot holds no usable QP (RDMA_BAD_QP).
AIV_DEVICE_FN AIV_UB QpState* qp_attach(Block& b, uint32_t slot) {
    if (b.qp_table == nullptr || slot >= b.qp_count) return nullptr;
    AIV_GM AivQpRecord* rec = &b.qp_table[slot];
    // Acquire: the Host writes the record's first line, then its qpn.
    const uint32_t qpn = aiv_platform::load_u32(&rec->qpn);
    if (qpn == 0) return nullptr;
    AIV_UB QpState& q = b.qps[slot];
    if (q.qpn == qpn) return &q;
    q.qpn = 0;
    q.cqn = aiv_platform::load_u32(&rec->cqn);
    q.sq_base = aiv_platform::load_u64(&rec->sq_base);
    q.sq_db_addr = aiv_platform::load_u64(&rec->sq_db_addr);
    q.cq_base = aiv_platform::load_u64(&rec->cq_base);
    q.cq_db_addr = aiv_platform::load_u64(&rec->cq_db_addr);
    q.sq_depth = aiv_platform::load_u32(&rec->sq_depth);
    q.cq_depth = aiv_platform::load_u32(&rec->cq_depth);
    q.sl = aiv_platform::load_u32(&rec->sl);
    q.lkey = aiv_platform::load_u32(&rec->lkey);
    q.rkey = aiv_platform::load_u32(&rec->rkey);
    // The SQ doorbell carries the producer index modulo 65536: at most 32768 WQEs may be outstanding. Only the
    // hardware CQ doorbell mode (one 64-bit word) is driven.
    if (!power_of_two(q.sq_depth) || q.sq_depth > 32768u || !power_of_two(q.cq_depth) || q.cq_depth < q.sq_depth ||
        q.sq_base == 0 || q.cq_base == 0 || q.sq_db_addr == 0 || q.cq_db_addr == 0 ||
        aiv_platform::load_u32(&rec->cq_db_mode) != AIV_ROCE_CQ_DB_MODE_HW) {
        return nullptr;
    }
    q.unrung = 0;
    q.doorbells = 0;
    q.dirty = false;
    if (aiv_platform::load_u32(&rec->qpn_seen) == qpn) {
        // An earlier launch of this block used this QP: go on from its indices (and its error, if any).
        q.pi = aiv_platform::load_u32(&rec->sq_pi);
        q.done = aiv_platform::load_u32(&rec->sq_ci);
        q.cq_ci = aiv_platform::load_u32(&rec->cq_ci);
        q.error_status = aiv_platform::load_u32(&rec->error_status);
        q.error_index = aiv_platform::load_u32(&rec->error_wqe_index);
        q.error_sub_status = aiv_platform::load_u32(&rec->error_sub_status);
        q.last_signaled = q.pi;
        q.qpn = qpn;
    } else {
        // A QP the kernel has not used: its queues are empty.
        q.pi = 0;
        q.done = 0;
        q.cq_ci = 0;
        q.error_status = 0;
        q.error_index = 0;
        q.error_sub_status = 0;
        q.last_signaled = 0;
        q.qpn = qpn;
        qp_save(b, slot);
    }
    return &q;
}

// Rings q's SQ doorbell for the WQEs posted since the last one: one 64-bit word {QPN, SQ command, producer index
// modulo 65536, service level}. The WQEs are in HBM already (post_wqe waits for its DMA).
template <bool Trace>
AIV_DEVICE_FN void qp_ring(Block& b, AIV_UB QpState& q) {
    if (q.unrung == 0) return;
    const uint64_t word = uint64_t(q.qpn & AIV_ROCE_DB_TAG_MASK) |
                          uint64_t(AIV_ROCE_DB_CMD_SQ) << AIV_ROCE_DB_CMD_SHIFT |
                          uint64_t(q.pi & AIV_ROCE_DB_SQ_INDEX_MASK) << AIV_ROCE_DB_INDEX_SHIFT |
                          uint64_t(q.sl & AIV_ROCE_DB_SL_MASK) << AIV_ROCE_DB_SL_SHIFT;
    aiv_platform::ring_doorbell_64(q.sq_db_addr, word);
    if (Trace) trace_record(b, AIV_TRACE_STAGE_DOORBELL, aiv_platform::cycles(), q.pi, b.trace_group, q.unrung);
    q.doorbells += 1;
    q.unrung = 0;
    q.dirty = true;
}

// Learns from one consumed CQE. RC completes in order: a successful CQE for WQE w completes every WQE up to w
// (unsignaled ones included); an error CQE fails w (the WQEs before it completed) and every later WQE is flushed.
// A CQE that names another QP or a WQE not outstanding is a bad response: the QP is put in error at its oldest WQE.
AIV_DEVICE_FN void qp_consume(AIV_UB QpState& q, const AivRoceCqe& cqe) {
    if (q.error_status != 0) return;  // after the first error: flushes, nothing more to learn
    const uint32_t status = (cqe.byte4 >> AIV_ROCE_CQE_STATUS_SHIFT) & AIV_ROCE_CQE_STATUS_MASK;
    const uint16_t wqe_index = static_cast<uint16_t>(cqe.byte4 >> AIV_ROCE_CQE_WQE_INDEX_SHIFT);
    // The free-running index: at most sq_depth <= 32768 WQEs are outstanding, so 16 bits name one unambiguously.
    const uint32_t index = q.done + static_cast<uint16_t>(wqe_index - static_cast<uint16_t>(q.done));
    const bool ours = (cqe.byte16 & AIV_ROCE_CQE_QPN_MASK) == (q.qpn & AIV_ROCE_CQE_QPN_MASK) &&
                      index - q.done < q.pi - q.done;
    if (!ours) {
        q.error_status = AIV_ROCE_STATUS_BAD_RESP_ERR;
        q.error_index = q.done;
        q.error_sub_status = 0;
        return;
    }
    if (status == AIV_ROCE_STATUS_SUCCESS) {
        q.done = index + 1;
        return;
    }
    q.done = index;
    q.error_status = status;
    q.error_index = index;
    q.error_sub_status = cqe.byte16 >> AIV_ROCE_CQE_SUB_STATUS_SHIFT;
}

// Consumes every CQE the NIC has written on q, then releases them with one CQ doorbell {CQN, CQ_DB_PTR command,
// consumer index}; returns whether there was any. A CQE is new when its owner bit differs from the CQ's lap bit;
// the NIC writes its first word last, so that word is read first (after an invalidate), then the whole CQE.
AIV_DEVICE_FN bool qp_poll(AIV_UB QpState& q) {
    uint32_t consumed = 0;
    while (consumed < q.cq_depth) {
        const AIV_GM AivRoceCqe* cqe = reinterpret_cast<const AIV_GM AivRoceCqe*>(
            q.cq_base + uint64_t(q.cq_ci & (q.cq_depth - 1)) * sizeof(AivRoceCqe));
        const uint32_t byte4 = aiv_platform::load_u32(&cqe->byte4);
        if (((byte4 & AIV_ROCE_CQE_OWNER_BIT) != 0) == ((q.cq_ci & q.cq_depth) != 0)) break;
        AivRoceCqe entry;
        aiv_platform::read_bytes(&entry, cqe, sizeof(AivRoceCqe));
        q.cq_ci += 1;
        consumed += 1;
        qp_consume(q, entry);
    }
    if (consumed == 0) return false;
    // Never more than the CQEs consumed above, which the NIC wrote.
    const uint64_t word = uint64_t(q.cqn & AIV_ROCE_DB_TAG_MASK) |
                          uint64_t(AIV_ROCE_DB_CMD_CQ_PTR) << AIV_ROCE_DB_CMD_SHIFT |
                          uint64_t(q.cq_ci & AIV_ROCE_DB_CQ_INDEX_MASK) << AIV_ROCE_DB_INDEX_SHIFT |
                          uint64_t(1) << AIV_ROCE_DB_CQ_CMD_SN_SHIFT;
    aiv_platform::ring_doorbell_64(q.cq_db_addr, word);
    q.dirty = true;
    return true;
}

// Polls q until the WQEs before `end` have completed or the QP is in error, within the budget counted from
// `start`; giving up puts the QP in error (AIV_QP_ERROR_WAIT_BUDGET, or _ABORTED on the abort flag or a stop).
AIV_DEVICE_FN void qp_wait(Block& b, AIV_UB QpState& q, uint32_t end, uint64_t start, uint32_t abort_epoch) {
    for (uint32_t spins = 0;; ++spins) {
        const uint32_t token = aiv_platform::wait_token(b.args.platform_context, AIV_WAIT_COMPLETION);
        if (q.error_status != 0 || static_cast<int32_t>(q.done - end) >= 0) return;
        if (qp_poll(q)) continue;
        uint32_t gave_up = 0;
        if (aiv_platform::load_u32(&b.control->abort_epoch) != abort_epoch ||
            aiv_platform::load_u32(&b.control->stop) != 0) {
            gave_up = AIV_QP_ERROR_ABORTED;
        } else if (aiv_platform::cycles() - start >= b.args.wait_budget) {
            gave_up = AIV_QP_ERROR_WAIT_BUDGET;
        }
        if (gave_up != 0) {
            q.error_status = gave_up;
            q.error_index = q.done;
            q.error_sub_status = 0;
            q.dirty = true;
            return;
        }
        aiv_platform::idle(b.args.platform_context, AIV_WAIT_COMPLETION, token, spins);
    }
}

// The outcome of RDMA transfer `t` (WQEs [rdma_first, rdma_end) on q) once q has completed them or is in error.
AIV_DEVICE_FN void rdma_settle(AIV_UB Tally& t, const AIV_UB QpState& q) {
    if (static_cast<int32_t>(q.done - t.rdma_end) >= 0) return;  // completed: status stays COMPLETED
    t.bytes = 0;
    if (q.error_status == AIV_QP_ERROR_WAIT_BUDGET) {
        t.status = AIV_DCQ_STATUS_TIMEOUT;
        t.syndrome = AIV_SYNDROME_WAIT_BUDGET;
        return;
    }
    if (q.error_status == AIV_QP_ERROR_ABORTED) {
        t.status = AIV_DCQ_STATUS_ABORTED;
        t.syndrome = AIV_SYNDROME_ABORTED;
        return;
    }
    // An error CQE at error_index: this transfer's own when it falls in its WQEs, else it was flushed.
    const bool covers = static_cast<int32_t>(q.error_index - t.rdma_first) >= 0;
    const uint32_t status = covers ? q.error_status : AIV_ROCE_STATUS_WR_FLUSH_ERR;
    const uint32_t sub_status = covers ? q.error_sub_status : 0;
    t.status = AIV_DCQ_STATUS_FAILED;
    t.syndrome = AIV_SYNDROME_RDMA_CQE | (sub_status & 0xFFu) << 8 | (status & 0xFFu);
}

// Posts request `e` (route RDMA) as WQEs on its QP: pieces of at most max_wqe_bytes, the last one signaled and at
// least every sq_depth/2 one (so that a full SQ always holds a signaled WQE to wait for); the SQ doorbell every
// doorbell_batch WQEs (the group's end rings the rest). A full SQ waits for CQEs within the budget.
template <bool Trace>
AIV_DEVICE_FN void post_rdma(Block& b, AIV_UB Group& g, const AivRequestEntry& e, AIV_UB Tally& t) {
    const uint32_t slot = e.flags >> AIV_REQUEST_QP_SHIFT;
    AIV_UB QpState* qp = qp_attach(b, slot);
    t.bytes = 0;
    t.status = AIV_DCQ_STATUS_FAILED;
    if (qp == nullptr) {
        t.syndrome = AIV_SYNDROME_RDMA_BAD_QP;
        return;
    }
    AIV_UB QpState& q = *qp;
    if (q.error_status != 0) {
        // Never posted on a QP in error: the Host replaces it.
        t.syndrome = AIV_SYNDROME_RDMA_QP_ERROR;
        return;
    }
    const bool write = e.opcode == AIV_REQUEST_OPCODE_WRITE;
    const uint64_t local = write ? e.src_addr : e.dst_addr;
    const uint64_t remote = write ? e.dst_addr : e.src_addr;
    const uint32_t lkey = e.lkey != 0 ? e.lkey : q.lkey;
    const uint32_t rkey = e.rkey != 0 ? e.rkey : q.rkey;
    const uint32_t shift = b.wqe_shift;
    const uint64_t pieces = piece_count(e.length, shift);
    const uint32_t first_doorbell = q.doorbells;
    t.rdma_first = q.pi;
    bool posted = true;
    for (uint64_t p = 0; p < pieces; ++p) {
        if (q.pi - q.done >= q.sq_depth) {
            qp_ring<Trace>(b, q);
            qp_wait(b, q, q.pi - q.sq_depth + 1, aiv_platform::cycles(), g.abort_epoch);
            if (q.error_status != 0) {
                posted = false;
                break;
            }
        }
        const uint64_t offset = p << shift;
        const uint32_t length = piece_length(e.length, shift, p);
        const bool signaled = p + 1 == pieces || q.pi + 1 - q.last_signaled >= q.sq_depth >> 1;
        AivRoceWqe wqe = {};
        wqe.byte4 = (write ? AIV_ROCE_OPCODE_RDMA_WRITE : AIV_ROCE_OPCODE_RDMA_READ) |
                    ((q.pi & q.sq_depth) == 0 ? AIV_ROCE_WQE_OWNER_BIT : 0u) |
                    (signaled ? AIV_ROCE_WQE_SIGNALED_BIT : 0u);
        wqe.msg_len = length;
        wqe.byte16 = 1u << AIV_ROCE_WQE_SGE_NUM_SHIFT;
        wqe.rkey = rkey;
        wqe.va = remote + offset;
        AivRoceSge sge = {};
        sge.len = length;
        sge.lkey = lkey;
        sge.addr = local + offset;
        aiv_platform::post_wqe(
            reinterpret_cast<AIV_GM void*>(q.sq_base + uint64_t(q.pi & (q.sq_depth - 1)) * AIV_ROCE_WQE_STRIDE), wqe,
            sge);
        q.pi += 1;
        q.unrung += 1;
        q.dirty = true;
        if (signaled) q.last_signaled = q.pi;
        t.sqes += 1;
        if (q.unrung >= b.args.doorbell_batch) qp_ring<Trace>(b, q);
    }
    t.status = AIV_DCQ_STATUS_COMPLETED;
    t.bytes = e.length;
    t.rdma_slot = slot;
    // The doorbell that covers the last WQE: the one just rung, or the next one.
    t.doorbells = (q.unrung == 0 ? q.doorbells - 1 : q.doorbells) - first_doorbell + 1;
    if (!posted) {
        // The SQ stayed full: the transfer cannot complete (its WQEs so far may still run).
        t.rdma_end = q.pi + 1;
        rdma_settle(t, q);
        return;
    }
    t.rdma_end = q.pi;
    t.rdma = 1;
    g.rdma += 1;
}

// Rings the SQ doorbell of every QP with WQEs not yet announced.
template <bool Trace>
AIV_DEVICE_FN void ring_qps(Block& b) {
    for (uint32_t slot = 0; slot < b.qp_count; ++slot) {
        if (b.qps[slot].unrung != 0) qp_ring<Trace>(b, b.qps[slot]);
    }
}

// Completes the group's RDMA transfers: waits for the CQEs that cover them (one budget for the group, from now),
// settles each, and writes the kernel line of every QP record whose state changed.
AIV_DEVICE_FN void finish_rdma(Block& b, AIV_UB Group& g) {
    if (g.rdma == 0) return;
    const uint64_t start = aiv_platform::cycles();
    for (uint32_t i = 0; i < g.count; ++i) {
        AIV_UB Tally& t = g.tally[i];
        if (t.rdma == 0) continue;
        AIV_UB QpState& q = b.qps[t.rdma_slot];
        qp_wait(b, q, t.rdma_end, start, g.abort_epoch);
        rdma_settle(t, q);
    }
    for (uint32_t slot = 0; slot < b.qp_count; ++slot) {
        if (b.qps[slot].dirty) qp_save(b, slot);
    }
}

AIV_DEVICE_FN bool request_is_valid(const AivRequestEntry& e) {
    if (e.length == 0) return false;
    if (e.opcode != AIV_REQUEST_OPCODE_READ && e.opcode != AIV_REQUEST_OPCODE_WRITE) return false;
    // SDMA or RDMA; an unknown route is refused, never run as a local copy of its remote address.
    const uint32_t route = e.flags & AIV_REQUEST_ROUTE_MASK;
    if (route != AIV_REQUEST_ROUTE_SDMA && route != AIV_REQUEST_ROUTE_RDMA) return false;
    if (e.src_addr + e.length < e.src_addr || e.dst_addr + e.length < e.dst_addr) return false;
    return true;
}

// Posts the SQEs of `g.count` requests starting at ring index `g.head`, then the group's flag SQE; does not wait
// for the flag (so the SDMA engine can run this group while the kernel completes the previous one).
template <bool Trace>
AIV_DEVICE_FN void post_group(Block& b, AIV_UB Group& g) {
    const uint32_t mask = b.args.request_depth - 1;
    const uint32_t shift = b.sqe_shift;
    const uint64_t data_sqes_before = b.sqes_posted;
    if (Trace) {
        const uint64_t seen = aiv_platform::cycles();
        b.trace_group = aiv_platform::load_u64(&b.request_entries[g.head & mask].transfer_id);
        trace_record(b, AIV_TRACE_STAGE_REQUEST_SEEN, seen, g.count, b.trace_group, 0);
    }
    b.doorbells = 0;
    b.abort_epoch = aiv_platform::load_u32(&b.control->abort_epoch);
    g.abort_epoch = b.abort_epoch;
    g.posted = WAIT_OK;
    g.flag_seq = 0;
    g.rdma = 0;
    bool any_rdma = false;
    for (uint32_t i = 0; i < g.count; ++i) {
        AivRequestEntry e;
        aiv_platform::read_bytes(&e, &b.request_entries[(g.head + i) & mask], sizeof(AivRequestEntry));
        AIV_UB Tally& t = g.tally[i];
        t.transfer_id = e.transfer_id;
        t.bytes = e.length;
        t.status = AIV_DCQ_STATUS_COMPLETED;
        t.syndrome = AIV_SYNDROME_NONE;
        t.sqes = 0;
        t.doorbells = 0;
        t.rdma = 0;
        if (!request_is_valid(e)) {
            t.status = AIV_DCQ_STATUS_FAILED;
            t.syndrome = AIV_SYNDROME_BAD_REQUEST;
            t.bytes = 0;
            continue;
        }
        if (g.posted != WAIT_OK) continue;
        if ((e.flags & AIV_REQUEST_ROUTE_MASK) == AIV_REQUEST_ROUTE_RDMA) {
            any_rdma = true;
            post_rdma<Trace>(b, g, e, t);
            continue;
        }
        const uint64_t pieces = piece_count(e.length, shift);
        for (uint64_t p = 0; p < pieces; ++p) {
            // Keep one slot for the flag SQE; a full ring holds depth - 1 entries.
            if (outstanding(b) + 2 > b.sq_depth - 1) {
                g.posted = drain<Trace>(b);
                if (g.posted != WAIT_OK) break;
            }
            if (p == 0) t.first_doorbell = b.doorbells;
            const uint64_t offset = p << shift;
            post_copy<Trace>(b, e.src_addr + offset, e.dst_addr + offset, piece_length(e.length, shift, p));
            t.sqes += 1;
        }
        // The doorbell that covers the last SQE: the one just rung, or the next one.
        t.last_doorbell = b.unrung == 0 ? b.doorbells - 1 : b.doorbells;
    }
    // The RDMA side of the group is announced whatever happened to its SDMA side.
    if (any_rdma) ring_qps<Trace>(b);
    if (g.posted != WAIT_OK) return;
    // The flag's doorbell is the next one: it also covers any data SQEs still unrung.
    const uint32_t flag_doorbell = b.doorbells;
    if (Trace) {
        trace_record(b, AIV_TRACE_STAGE_SQES_POSTED, aiv_platform::cycles(),
                     static_cast<uint32_t>(b.sqes_posted - data_sqes_before), b.trace_group, 0);
    }
    g.retire_mark = b.sqes_posted;
    // A group whose requests all went to the RDMA route (or failed) has no SDMA SQE to cover: no flag.
    if (any_rdma && b.sqes_posted == data_sqes_before) return;
    g.flag_seq = post_flag<Trace>(b);
    g.retire_mark = b.sqes_posted;
    for (uint32_t i = 0; i < g.count; ++i) {
        AIV_UB Tally& t = g.tally[i];
        if (t.status != AIV_DCQ_STATUS_COMPLETED || t.rdma != 0) continue;
        // Its share of the flag SQE, and of the flag's doorbell unless that doorbell also covered its last SQE.
        t.sqes += 1;
        t.doorbells = t.last_doorbell - t.first_doorbell + 1 + (flag_doorbell != t.last_doorbell ? 1u : 0u);
    }
}

// Records that the wait for group `g`'s flag ended with `result` (one test per group when tracing is off).
AIV_DEVICE_FN void trace_completion(Block& b, const AIV_UB Group& g, WaitResult result) {
    if (b.trace == nullptr) return;
    trace_record(b, AIV_TRACE_STAGE_COMPLETION_OBSERVED, aiv_platform::cycles(), g.count, g.tally[0].transfer_id,
                 result);
}

// Sets the statuses of the group's SDMA transfers from the outcome of its flag wait (its RDMA transfers are settled
// by their CQEs, finish_rdma).
AIV_DEVICE_FN void settle_group(AIV_UB Group& g, WaitResult result) {
    for (uint32_t i = 0; i < g.count; ++i) {
        AIV_UB Tally& t = g.tally[i];
        if (t.status != AIV_DCQ_STATUS_COMPLETED || t.rdma != 0 || result == WAIT_OK) continue;
        t.status = result == WAIT_TIMEOUT ? AIV_DCQ_STATUS_TIMEOUT : AIV_DCQ_STATUS_ABORTED;
        t.syndrome = result == WAIT_TIMEOUT ? AIV_SYNDROME_WAIT_BUDGET : AIV_SYNDROME_ABORTED;
        t.bytes = 0;
    }
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

// Writes the DCQ entries of a group at `dcq_tail`; returns the new tail (published by the caller).
AIV_DEVICE_FN uint32_t write_completions(Block& b, uint32_t dcq_tail, const AIV_UB Group& g) {
    const uint32_t mask = b.args.dcq_depth - 1;
    for (uint32_t i = 0; i < g.count; ++i) {
        const AIV_UB Tally& t = g.tally[i];
        AivDcqEntry entry;
        entry.transfer_id = t.transfer_id;
        entry.bytes = t.bytes;
        entry.status = t.status;
        entry.syndrome = t.syndrome;
        entry.sqes = t.sqes;
        entry.doorbells = t.doorbells;
        aiv_platform::write_bytes(&b.dcq_entries[(dcq_tail + i) & mask], &entry, sizeof(AivDcqEntry));
    }
    return dcq_tail + g.count;
}

// Makes the DCQ entries [from, to) visible to the Host (one range, or two when they wrap).
AIV_DEVICE_FN void flush_completions(Block& b, uint32_t from, uint32_t to) {
    const uint32_t first = from & (b.args.dcq_depth - 1);
    const uint32_t count = to - from;
    const uint32_t run = count < b.args.dcq_depth - first ? count : b.args.dcq_depth - first;
    if (run > 0) aiv_platform::flush_for_device(&b.dcq_entries[first], run * sizeof(AivDcqEntry));
    if (count > run) aiv_platform::flush_for_device(&b.dcq_entries[0], (count - run) * sizeof(AivDcqEntry));
}

// Publishes the completions of one group, or two (the older first), with one DCQ tail store; advances the request
// head past them. A failed outcome halts the block first, so a Host that sees the entries also sees the halt.
// The groups' RDMA transfers are completed first (finish_rdma).
AIV_DEVICE_FN void publish_groups(Block& b, AIV_UB Group& first, AIV_UB Group* second, bool failed) {
    finish_rdma(b, first);
    if (second) finish_rdma(b, *second);
    const uint32_t count = first.count + (second ? second->count : 0);
    // The kernel is the only producer of the DCQ: its tail is read without racing anyone.
    const uint32_t dcq_tail = aiv_platform::load_u32(&b.dcq->tail);
    if (!wait_dcq_space(b, dcq_tail, count)) return;
    if (failed) {
        aiv_platform::store_u32(&b.control->halt_count, aiv_platform::load_u32(&b.control->halt_count) + 1);
    }
    uint32_t tail = write_completions(b, dcq_tail, first);
    if (second) tail = write_completions(b, tail, *second);
    // The entries must reach memory before the tail that covers them (a non-coherent data cache holds them).
    flush_completions(b, dcq_tail, tail);
    // Taken before the tail store, so that a Host that has seen the tail saw it after this moment.
    const uint64_t published = b.trace != nullptr ? aiv_platform::cycles() : 0;
    // Release: the entries written above are visible to a Host that acquires the new tail.
    aiv_platform::store_u32(&b.dcq->tail, tail);
    const AIV_UB Group& last = second ? *second : first;
    // Release: the Host may reuse the request slots once it sees the new head.
    aiv_platform::store_u32(&b.requests->head, last.head + last.count);
    aiv_platform::store_u64(&b.control->groups, aiv_platform::load_u64(&b.control->groups) + (second ? 2 : 1));
    if (b.trace != nullptr) {
        // After the DCQ's publication: the trace never delays a completion.
        trace_record(b, AIV_TRACE_STAGE_DCQ_PUBLISHED, published, first.count, first.tally[0].transfer_id, failed);
        if (second) {
            trace_record(b, AIV_TRACE_STAGE_DCQ_PUBLISHED, published, second->count, second->tally[0].transfer_id,
                         failed);
        }
        trace_publish(b);
    }
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
    // Through the platform's loads (never a plain dereference: on the NPU it would read a stale cached record).
    b.sq_base = aiv_platform::load_u64(&b.record->sq_base);
    b.sq_reg_base = aiv_platform::load_u64(&b.record->sq_reg_base);
    b.sq_depth = aiv_platform::load_u32(&b.record->sq_depth);
    b.stream_id = static_cast<uint16_t>(aiv_platform::load_u32(&b.record->stream_id));
    b.sq_head_seen = aiv_platform::load_u32(&b.record->sq_head);
    b.sq_tail = aiv_platform::load_u32(&b.record->sq_tail);
    b.sqes_posted = 0;
    b.sqes_retired = 0;
    b.unrung = 0;
    b.staged = 0;
    b.stage_primed = 0;
}

// The last flag sequence number posted on this block (by an earlier launch, too).
AIV_DEVICE_FN uint64_t last_flag_seq(Block& b) {
    uint64_t last = 0;
    for (uint32_t i = 0; i < AIV_FLAG_SOURCE_SLOTS; ++i) {
        const uint64_t seq = aiv_platform::load_u64(&b.flag->source[i]);
        if (seq > last) last = seq;
    }
    return last;
}

// Kernel body of block `block_idx`.
AIV_DEVICE_FN void transfer_block(const AIV_GM AivKernelArgs* kernel_args, uint32_t block_idx) {
    AivKernelArgs kargs;
    aiv_platform::read_bytes(&kargs, kernel_args, sizeof(AivKernelArgs));
    if (kargs.layout_version != AIV_LAYOUT_VERSION || block_idx >= kargs.block_count) return;
    Block b;
    aiv_platform::read_bytes(&b.args, reinterpret_cast<const AIV_GM AivBlockArgs*>(kargs.blocks) + block_idx,
                             sizeof(AivBlockArgs));
    // Arguments the kernel cannot run with (the Host never passes them): no launch at all. max_sqe_bytes must be a
    // power of two (pieces are cut with shifts).
    b.sqe_shift = log2_exact(b.args.max_sqe_bytes);
    if (b.args.doorbell_batch == 0 || b.sqe_shift == 32 || b.args.max_sqe_bytes > AIV_SDMA_MAX_SQE_BYTES ||
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
    b.flag_seq = last_flag_seq(b);
    b.args_gm = reinterpret_cast<const AIV_GM AivBlockArgs*>(kargs.blocks) + block_idx;
    b.trace_ring = 0;
    b.trace = nullptr;
    b.trace_group = 0;
    if (b.args.trace_ring != 0) trace_refresh(b);
    // What this launch runs with, whatever an earlier launch acknowledged.
    if (b.trace_ring == 0) aiv_platform::store_u64(&b.control->trace_ring_seen, 0);
    // The RDMA route, when the Host set a QP table up with a power-of-two max_wqe_bytes (requests on it fail with
    // RDMA_BAD_QP otherwise).
    b.qp_table = nullptr;
    b.qp_count = 0;
    b.wqe_shift = log2_exact(b.args.max_wqe_bytes);
    if (b.args.qp_table != 0 && b.args.qp_count > 0 && b.args.qp_count <= AIV_QP_TABLE_SLOTS &&
        b.wqe_shift != 32 && b.args.max_wqe_bytes <= AIV_RDMA_MAX_WQE_BYTES) {
        b.qp_table = reinterpret_cast<AIV_GM AivQpRecord*>(b.args.qp_table);
        b.qp_count = b.args.qp_count;
    }
    AIV_UB uint8_t* const state = aiv_platform::state_area();
    b.qps = reinterpret_cast<AIV_UB QpState*>(state + state_layout::kQpsOffset);
    for (uint32_t slot = 0; slot < AIV_QP_TABLE_SLOTS; ++slot) {
        b.qps[slot].qpn = 0;
        b.qps[slot].unrung = 0;
        b.qps[slot].dirty = false;
    }
    const bool persistent = b.args.launch_mode == AIV_LAUNCH_PERSISTENT;

    aiv_platform::store_u32(&b.control->running, 1);
    // At most two groups are in flight: the engine runs group N+1 while the kernel completes group N.
    AIV_UB Group* const groups = reinterpret_cast<AIV_UB Group*>(state + state_layout::kGroupsOffset);
    int pending = -1;  // index into groups of the group posted and not yet completed
    // The kernel is the only consumer of the request ring: `next` is the first request not yet taken.
    uint32_t next = aiv_platform::load_u32(&b.requests->head);
    bool halted = aiv_platform::load_u32(&b.control->resume_count) != aiv_platform::load_u32(&b.control->halt_count);
    bool channel_loaded = false;
    for (uint32_t spins = 0;;) {
        if (halted) {
            if (!persistent || !wait_resume(b)) break;
            halted = false;
            channel_loaded = false;
        }
        if (!channel_loaded) {
            // After a reset the Host dropped every pending SQE: start from the channel record again.
            load_channel(b);
            channel_loaded = true;
        }
        const uint32_t token = aiv_platform::wait_token(b.args.platform_context, AIV_WAIT_REQUEST);
        if (aiv_platform::load_u32(&b.control->stop) != 0) break;
        // Acquire: the entries up to tail were written before the Host's release store of tail.
        const uint32_t tail = aiv_platform::load_u32(&b.requests->tail);
        if (tail != next) {
            spins = 0;
            const int slot = pending == 0 ? 1 : 0;
            AIV_UB Group& g = groups[slot];
            g.head = next;
            g.count = tail - next < b.args.group_limit ? tail - next : b.args.group_limit;
            if (b.trace != nullptr) {
                post_group<true>(b, g);
            } else {
                post_group<false>(b, g);
            }
            next += g.count;
            if (pending < 0) {
                if (g.posted == WAIT_OK) {
                    pending = slot;
                    continue;
                }
                settle_group(g, g.posted);
                publish_groups(b, g, nullptr, true);
                halted = true;
                continue;
            }
            // Complete the older group while the engine works on the new one.
            AIV_UB Group& older = groups[pending];
            WaitResult older_result;
            if (g.posted == WAIT_OK) {
                older_result = wait_flag(b, older.flag_seq, older.abort_epoch);
            } else {
                // A drain while posting the new group waited on everything before it and failed.
                older_result = flag_reached(b, older.flag_seq) ? WAIT_OK : g.posted;
            }
            trace_completion(b, older, older_result);
            if (older_result == WAIT_OK && older.retire_mark > b.sqes_retired) b.sqes_retired = older.retire_mark;
            settle_group(older, older_result);
            if (older_result == WAIT_OK && g.posted == WAIT_OK) {
                publish_groups(b, older, nullptr, false);
                pending = slot;
                continue;
            }
            // The channel runs in order: the newer group cannot complete when the older did not.
            settle_group(g, g.posted != WAIT_OK ? g.posted : older_result);
            publish_groups(b, older, &g, true);
            pending = -1;
            halted = true;
            continue;
        }
        if (pending >= 0) {
            AIV_UB Group& older = groups[pending];
            const WaitResult result = wait_flag(b, older.flag_seq, older.abort_epoch);
            trace_completion(b, older, result);
            if (result == WAIT_OK && older.retire_mark > b.sqes_retired) b.sqes_retired = older.retire_mark;
            settle_group(older, result);
            publish_groups(b, older, nullptr, result != WAIT_OK);
            halted = result != WAIT_OK;
            pending = -1;
            continue;
        }
        if (!persistent) break;
        // Idle: the Host may have switched the trace on or off. Looked at when the block goes idle and every 16th idle
        // poll after, so that the poll for new requests stays short.
        if ((spins & 15u) == 0) trace_refresh(b);
        aiv_platform::idle(b.args.platform_context, AIV_WAIT_REQUEST, token, spins++);
    }
    trace_publish(b);
    aiv_platform::store_u32(&b.control->running, 0);
}

}  // namespace aiv

#endif
