// The AIV transfer kernel: portable logic, one source for the NPU and the CPU twin.
//
// Include the platform layer (platform/npu.h) first. Per block:
//   take the request-ring entries of this block (up to group_limit at a time), split each into pieces of at most
//   max_sqe_bytes, build one SDMA SQE per piece in the platform's UB stage and land the stage in this block's channel
//   (before each doorbell, and when the stage fills or the tail wraps), ring the doorbell every doorbell_batch
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

// Next SQ tail with the hardware's wrapped index (docs/hardware.md section 4: tail = (tail + 1) % depth).
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
    uint64_t sqes_posted;    // SQEs written since the channel was loaded
    uint64_t sqes_retired;   // of those, SQEs known to have executed (up to the last completed flag)
    uint32_t unrung;         // SQEs written since the last doorbell
    uint32_t staged;         // SQEs built in the UB stage and not yet landed in the SQ (the last `staged` before tail)
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
// never on the data path). A changed ring is adopted with its indices as the Host left them.
AIV_DEVICE_FN void trace_refresh(Block& b) {
    const uint64_t ring = aiv_platform::load_u64(&b.args_gm->trace_ring);
    if (ring == b.trace_ring) return;
    trace_publish(b);
    b.trace_ring = ring;
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
    aiv_platform::stage_sqe(b.staged, sqe);
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
    b.flag_seq += 1;
    AIV_GM uint64_t* source = &b.flag->source[b.flag_seq % AIV_FLAG_SOURCE_SLOTS];
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
    uint32_t sqes;
    uint32_t doorbells;
};

// A group of requests taken together: its SQEs end with one flag SQE.
struct Group {
    uint32_t head;          // ring index of its first request
    uint32_t count;         // requests in it
    uint64_t flag_seq;      // its flag's sequence number (0 if posting failed before the flag)
    uint64_t retire_mark;   // sqes_posted right after its flag SQE: all of them have executed once the flag lands
    uint32_t abort_epoch;   // abort epoch when it was posted
    WaitResult posted;      // result of any drain needed while posting it
    Tally tally[AIV_GROUP_MAX_TRANSFERS];
};

AIV_DEVICE_FN bool request_is_valid(const AivRequestEntry& e) {
    if (e.length == 0) return false;
    if (e.opcode != AIV_REQUEST_OPCODE_READ && e.opcode != AIV_REQUEST_OPCODE_WRITE) return false;
    // This kernel drives SDMA only: a request for any other route (the RDMA route of docs/rdma.md section 7 included,
    // whose WQE posting is not built yet) is refused, never run as a local copy of its remote address.
    if ((e.flags & AIV_REQUEST_ROUTE_MASK) != AIV_REQUEST_ROUTE_SDMA) return false;
    if (e.src_addr + e.length < e.src_addr || e.dst_addr + e.length < e.dst_addr) return false;
    return true;
}

// Posts the SQEs of `g.count` requests starting at ring index `g.head`, then the group's flag SQE; does not wait
// for the flag (so the SDMA engine can run this group while the kernel completes the previous one).
template <bool Trace>
AIV_DEVICE_FN void post_group(Block& b, Group& g) {
    const uint32_t mask = b.args.request_depth - 1;
    const uint32_t max_piece = b.args.max_sqe_bytes;
    const uint64_t data_sqes_before = b.sqes_posted;
    if (Trace) {
        const uint64_t seen = aiv_platform::cycles();
        b.trace_group = aiv_platform::load_u64(&b.request_entries[g.head & mask].transfer_id);
        trace_record(b, AIV_TRACE_STAGE_REQUEST_SEEN, seen, g.count, b.trace_group, 0);
    }
    uint32_t first_doorbell[AIV_GROUP_MAX_TRANSFERS];
    uint32_t last_doorbell[AIV_GROUP_MAX_TRANSFERS];
    b.doorbells = 0;
    b.abort_epoch = aiv_platform::load_u32(&b.control->abort_epoch);
    g.abort_epoch = b.abort_epoch;
    g.posted = WAIT_OK;
    g.flag_seq = 0;
    for (uint32_t i = 0; i < g.count; ++i) {
        AivRequestEntry e;
        aiv_platform::read_bytes(&e, &b.request_entries[(g.head + i) & mask], sizeof(AivRequestEntry));
        Tally& t = g.tally[i];
        t.transfer_id = e.transfer_id;
        t.bytes = e.length;
        t.status = AIV_DCQ_STATUS_COMPLETED;
        t.syndrome = AIV_SYNDROME_NONE;
        t.sqes = 0;
        t.doorbells = 0;
        if (!request_is_valid(e)) {
            t.status = AIV_DCQ_STATUS_FAILED;
            t.syndrome = AIV_SYNDROME_BAD_REQUEST;
            t.bytes = 0;
            continue;
        }
        if (g.posted != WAIT_OK) continue;
        const uint64_t pieces = piece_count(e.length, max_piece);
        for (uint64_t p = 0; p < pieces; ++p) {
            // Keep one slot for the flag SQE; a full ring holds depth - 1 entries.
            if (outstanding(b) + 2 > b.sq_depth - 1) {
                g.posted = drain<Trace>(b);
                if (g.posted != WAIT_OK) break;
            }
            if (p == 0) first_doorbell[i] = b.doorbells;
            const uint64_t offset = p * max_piece;
            post_copy<Trace>(b, e.src_addr + offset, e.dst_addr + offset, piece_length(e.length, max_piece, p));
            t.sqes += 1;
        }
        // The doorbell that covers the last SQE: the one just rung, or the next one.
        last_doorbell[i] = b.unrung == 0 ? b.doorbells - 1 : b.doorbells;
    }
    if (g.posted != WAIT_OK) return;
    // The flag's doorbell is the next one: it also covers any data SQEs still unrung.
    const uint32_t flag_doorbell = b.doorbells;
    if (Trace) {
        trace_record(b, AIV_TRACE_STAGE_SQES_POSTED, aiv_platform::cycles(),
                     static_cast<uint32_t>(b.sqes_posted - data_sqes_before), b.trace_group, 0);
    }
    g.flag_seq = post_flag<Trace>(b);
    g.retire_mark = b.sqes_posted;
    for (uint32_t i = 0; i < g.count; ++i) {
        Tally& t = g.tally[i];
        if (t.status != AIV_DCQ_STATUS_COMPLETED) continue;
        // Its share of the flag SQE, and of the flag's doorbell unless that doorbell also covered its last SQE.
        t.sqes += 1;
        t.doorbells = last_doorbell[i] - first_doorbell[i] + 1 + (flag_doorbell != last_doorbell[i] ? 1u : 0u);
    }
}

// Records that the wait for group `g`'s flag ended with `result` (one test per group when tracing is off).
AIV_DEVICE_FN void trace_completion(Block& b, const Group& g, WaitResult result) {
    if (b.trace == nullptr) return;
    trace_record(b, AIV_TRACE_STAGE_COMPLETION_OBSERVED, aiv_platform::cycles(), g.count, g.tally[0].transfer_id,
                 result);
}

// Sets the group's statuses from the outcome of its wait.
AIV_DEVICE_FN void settle_group(Group& g, WaitResult result) {
    for (uint32_t i = 0; i < g.count; ++i) {
        Tally& t = g.tally[i];
        if (t.status != AIV_DCQ_STATUS_COMPLETED || result == WAIT_OK) continue;
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
AIV_DEVICE_FN uint32_t write_completions(Block& b, uint32_t dcq_tail, const Group& g) {
    const uint32_t mask = b.args.dcq_depth - 1;
    for (uint32_t i = 0; i < g.count; ++i) {
        const Tally& t = g.tally[i];
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
AIV_DEVICE_FN void publish_groups(Block& b, const Group& first, const Group* second, bool failed) {
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
    const Group& last = second ? *second : first;
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
    b.flag_seq = last_flag_seq(b);
    b.args_gm = reinterpret_cast<const AIV_GM AivBlockArgs*>(kargs.blocks) + block_idx;
    b.trace_ring = 0;
    b.trace = nullptr;
    b.trace_group = 0;
    if (b.args.trace_ring != 0) trace_refresh(b);
    const bool persistent = b.args.launch_mode == AIV_LAUNCH_PERSISTENT;

    aiv_platform::store_u32(&b.control->running, 1);
    // At most two groups are in flight: the engine runs group N+1 while the kernel completes group N.
    Group groups[2];
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
            Group& g = groups[slot];
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
            Group& older = groups[pending];
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
            Group& older = groups[pending];
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
