// The per-core model behind kernels/cpu/kernel_operator.h: data cache, unified buffer, DMA and the C ABI of
// kernels/cpu/aiv_cpu_core.h. The semantics, and which parts come from public sources, are in docs/ascendc-cpu.md.
#include <stdint.h>
#include <string.h>

#include <unordered_map>
#include <vector>

#include "aiv_cpu_core.h"
#include "kernel_operator.h"

namespace {

constexpr uint64_t kLine = 64;                 // data cache line (CACHE_LINE_SIZE for dav-2201)
constexpr uint64_t kAllBytes = ~uint64_t(0);   // a 64-bit byte mask covering a whole line
constexpr uint64_t kBlock = 32;                // DMA data block
constexpr uint32_t kUbBytes = 192u * 1024u;    // TOTAL_UB_SIZE for dav-2201
constexpr uint32_t kPollThreshold = 16;        // unchanged refills before the first idle hint

struct Line {
    uint8_t data[kLine];
    uint64_t valid;  // bit i: byte i holds a copy taken from HBM (or written by this core)
    uint64_t dirty;  // bit i: byte i written by this core and not yet cleaned
    uint8_t last_fill[kLine];  // what HBM held at the last fill of an invalidated line (poll detection)
    bool has_last_fill;
};

// What HBM held at the last fill of a line that has since been invalidated (poll detection).
struct LastFill {
    uint8_t bytes[kLine];
};

// A DMA burst issued and not yet known complete (the kernel has not waited for its pipe).
struct DmaOp {
    bool out;        // UB -> GM (MTE3), else GM -> UB (MTE2)
    uint64_t gm;
    uint64_t ub;
    uint64_t len;
    uint64_t seq;
};

struct Range {
    uint64_t from;
    uint64_t len;
};

constexpr uint32_t kEvents = 8;

struct Core {
    const AivCpuCoreOps* ops = nullptr;
    void* context = nullptr;
    uint32_t block_idx = 0;
    uint32_t block_num = 0;
    std::unordered_map<uint64_t, Line> lines;
    // Lines dropped by an invalidation keep their last fill here, so a refill can tell whether HBM changed.
    std::unordered_map<uint64_t, LastFill> history;
    // The line the last scalar access used (unordered_map nodes stay put until erased; every erase clears this).
    uint64_t hot_addr = ~uint64_t(0);
    Line* hot_line = nullptr;
    uint32_t unchanged_fills = 0;
    // Pipe ordering: DMA runs when the kernel waits for it; scalar UB writes reach a DMA only once ordered before it.
    std::vector<DmaOp> pending;           // issue order
    uint64_t next_seq = 1;
    uint64_t out_mark[kEvents] = {};      // SetFlag<MTE3_*>(id): ops up to this seq complete at the WaitFlag
    uint64_t in_mark[kEvents] = {};       // SetFlag<MTE2_*>(id)
    bool scalar_set[kEvents] = {};        // SetFlag<S_MTE3/S_MTE2>(id) not yet waited
    std::vector<Range> unordered_writes;  // scalar UB writes not yet ordered before later DMA
    AivCpuCoreStats stats;
    uint8_t ub[kUbBytes];
};

thread_local Core* g_core = nullptr;

uint64_t mask_of(uint64_t from, uint64_t to) {  // bytes [from, to) of a line
    const uint64_t hi = to >= 64 ? kAllBytes : ((uint64_t(1) << to) - 1);
    const uint64_t lo = from >= 64 ? kAllBytes : ((uint64_t(1) << from) - 1);
    return hi & ~lo;
}

void raise(Core& c, uint32_t kind, uint64_t addr, uint64_t len) {
    c.stats.faults += 1;
    if (c.ops->fault) c.ops->fault(c.context, kind, addr, len);
}

void progress(Core& c) { c.unchanged_fills = 0; }

// Writes the valid bytes of `mask` of a dirty line back to HBM (the line is the unit of write-back: SetValue's
// documentation says data goes out in cache lines, so clean bytes a core holds stale are written too).
void write_back(Core& c, uint64_t line_addr, Line& line, uint64_t mask) {
    if ((line.dirty & mask) == 0) return;
    uint8_t* hbm = static_cast<uint8_t*>(c.ops->translate(c.context, line_addr, kLine));
    if (!hbm) {
        raise(c, AIV_CPU_FAULT_UNMAPPED, line_addr, kLine);
    } else {
        for (uint64_t i = 0; i < kLine; ++i) {
            if ((mask >> i) & 1 && (line.valid >> i) & 1) hbm[i] = line.data[i];
        }
    }
    line.dirty &= ~mask;
    c.stats.line_write_backs += 1;
}

// The line holding `line_addr`, every byte valid: bytes not yet held are read from HBM, bytes held are kept (stale
// or not). nullptr if the line is not device memory.
Line* fill(Core& c, uint64_t line_addr) {
    if (c.hot_line && c.hot_addr == line_addr && c.hot_line->valid == kAllBytes) return c.hot_line;
    auto it = c.lines.find(line_addr);
    if (it != c.lines.end() && it->second.valid == kAllBytes) {
        c.hot_addr = line_addr;
        c.hot_line = &it->second;
        return &it->second;
    }
    const uint8_t* hbm = static_cast<const uint8_t*>(c.ops->translate(c.context, line_addr, kLine));
    if (!hbm) return nullptr;
    c.stats.line_fills += 1;
    if (it == c.lines.end()) {
        Line fresh;
        memset(&fresh, 0, sizeof(fresh));
        it = c.lines.emplace(line_addr, fresh).first;
        // Poll detection: a refill of a line that was invalidated, with the same HBM content as its last fill.
        auto old = c.history.find(line_addr);
        if (old != c.history.end() && memcmp(old->second.bytes, hbm, kLine) == 0) {
            c.unchanged_fills += 1;
            if (c.unchanged_fills >= kPollThreshold && c.ops->idle_hint) {
                c.stats.idle_hints += 1;
                c.ops->idle_hint(c.context, c.unchanged_fills);
            }
        } else {
            progress(c);
        }
    }
    Line& line = it->second;
    for (uint64_t i = 0; i < kLine; ++i) {
        if (!((line.valid >> i) & 1)) line.data[i] = hbm[i];
    }
    memcpy(line.last_fill, hbm, kLine);
    line.has_last_fill = true;
    line.valid = kAllBytes;
    c.hot_addr = line_addr;
    c.hot_line = &line;
    return &line;
}

// Cleans and invalidates bytes [from, 64) of one line.
void dcci_line(Core& c, uint64_t addr) {
    const uint64_t line_addr = addr & ~(kLine - 1);
    const uint64_t mask = mask_of(addr - line_addr, kLine);
    c.stats.dcci_single += 1;
    auto it = c.lines.find(line_addr);
    if (it == c.lines.end()) return;
    write_back(c, line_addr, it->second, mask);
    it->second.valid &= ~mask;
    if (it->second.valid == 0) {
        if (it->second.has_last_fill) memcpy(c.history[line_addr].bytes, it->second.last_fill, kLine);
        c.hot_line = nullptr;
        c.lines.erase(it);
    }
}

void dcci_all(Core& c) {
    c.stats.dcci_entire += 1;
    for (auto& entry : c.lines) {
        write_back(c, entry.first, entry.second, kAllBytes);
        if (entry.second.has_last_fill) memcpy(c.history[entry.first].bytes, entry.second.last_fill, kLine);
    }
    c.hot_line = nullptr;
    c.lines.clear();
}

Core* core() {
    // Every entry point of the model needs an installed core; without one there is nothing sane to do.
    if (!g_core) __builtin_trap();
    return g_core;
}

uint8_t* ub_range(Core& c, uint64_t ub_addr, uint64_t len) {
    if (ub_addr > kUbBytes || len > kUbBytes - ub_addr) {
        raise(c, AIV_CPU_FAULT_UB_RANGE, ub_addr, len);
        return nullptr;
    }
    return c.ub + ub_addr;
}

bool overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) { return a < b + blen && b < a + alen; }

// Runs one burst: UB -> GM to HBM if translate accepts it, else to the runtime's register page; GM -> UB from HBM.
void execute(Core& c, const DmaOp& op) {
    uint8_t* local = c.ub + op.ub;
    if (op.out) {
        if (void* hbm = c.ops->translate(c.context, op.gm, op.len)) {
            memcpy(hbm, local, op.len);
            return;
        }
        const int answer = c.ops->register_write
                               ? c.ops->register_write(c.context, op.gm, local, static_cast<uint32_t>(op.len))
                               : AIV_CPU_REG_NOT_REGISTER;
        if (answer == AIV_CPU_REG_NOT_REGISTER) raise(c, AIV_CPU_FAULT_UNMAPPED, op.gm, op.len);
        return;
    }
    const void* hbm = c.ops->translate(c.context, op.gm, op.len);
    if (!hbm) {
        raise(c, AIV_CPU_FAULT_UNMAPPED, op.gm, op.len);
        memset(local, 0, op.len);
        return;
    }
    memcpy(local, hbm, op.len);
}

// Completes, in issue order, the pending bursts of one direction up to sequence number `upto`.
void complete(Core& c, bool out, uint64_t upto) {
    std::vector<DmaOp> rest;
    for (const DmaOp& op : c.pending) {
        if (op.out == out && op.seq <= upto) {
            execute(c, op);
        } else {
            rest.push_back(op);
        }
    }
    c.pending.swap(rest);
}

void complete_all(Core& c) {
    for (const DmaOp& op : c.pending) execute(c, op);
    c.pending.clear();
}

// Issues one burst. Its UB range must not hold scalar writes not yet ordered before it (SetFlag/WaitFlag<S_MTE3> or
// <S_MTE2>, or PipeBarrier<PIPE_ALL>).
void issue(Core& c, bool out, uint64_t gm, uint64_t ub, uint64_t len) {
    if (!ub_range(c, ub, len)) return;
    for (const Range& w : c.unordered_writes) {
        if (overlaps(w.from, w.len, ub, len)) {
            raise(c, AIV_CPU_FAULT_PIPE_ORDER, ub, len);
            break;
        }
    }
    if (out) {
        c.stats.dma_bursts_out += 1;
    } else {
        c.stats.dma_bursts_in += 1;
    }
    progress(c);
    c.pending.push_back(DmaOp{out, gm, ub, len, c.next_seq++});
}

// A scalar access of UB: it must not touch what a pending burst reads (UB -> GM, for a write) or writes (GM -> UB).
void check_scalar_ub(Core& c, uint64_t ub, uint64_t len, bool write) {
    for (const DmaOp& op : c.pending) {
        if ((write || !op.out) && overlaps(op.ub, op.len, ub, len)) {
            raise(c, AIV_CPU_FAULT_PIPE_ORDER, ub, len);
            return;
        }
    }
}

uint64_t addr_of(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

void copy_out_aligned(void* dst, void* src, uint16_t n_burst, uint32_t len_burst, uint32_t src_gap,
                      uint32_t dst_gap, uint32_t element) {
    Core& c = *core();
    const uint64_t gm = addr_of(dst);
    const uint64_t ub = addr_of(src);
    if (n_burst < 1 || n_burst > 4095 || len_burst < 1 || len_burst > 2097151) {
        raise(c, AIV_CPU_FAULT_BAD_ARGUMENT, gm, len_burst);
        return;
    }
    if (ub % kBlock != 0 || gm % element != 0) {
        raise(c, AIV_CPU_FAULT_MISALIGNED, ub % kBlock != 0 ? ub : gm, len_burst);
        return;
    }
    // Each burst occupies whole 32-byte blocks in UB.
    const uint64_t ub_step = (uint64_t(len_burst) + kBlock - 1) / kBlock * kBlock + uint64_t(src_gap) * kBlock;
    const uint64_t gm_step = uint64_t(len_burst) + dst_gap;
    for (uint64_t i = 0; i < n_burst; ++i) {
        issue(c, true, gm + i * gm_step, ub + i * ub_step, len_burst);
    }
}

}  // namespace

// ---- C ABI ----
extern "C" int aiv_cpu_core_enter(const AivCpuCoreOps* ops, void* context, uint32_t block_idx, uint32_t block_num) {
    if (!ops || ops->abi_version != AIV_CPU_ABI_VERSION || !ops->translate || !ops->system_counter) return -1;
    delete g_core;
    g_core = new Core();
    g_core->ops = ops;
    g_core->context = context;
    g_core->block_idx = block_idx;
    g_core->block_num = block_num;
    memset(&g_core->stats, 0, sizeof(g_core->stats));
    memset(g_core->ub, 0, sizeof(g_core->ub));
    // A kernel touches a few hundred lines between full cleans: no rehash on the hot path.
    g_core->lines.reserve(512);
    g_core->history.reserve(4096);
    return 0;
}

extern "C" uint32_t aiv_cpu_core_dirty_lines(void) {
    if (!g_core) return 0;
    uint32_t dirty = 0;
    for (const auto& entry : g_core->lines) dirty += entry.second.dirty != 0 ? 1u : 0u;
    return dirty;
}

extern "C" uint32_t aiv_cpu_core_leave(void) {
    if (g_core) complete_all(*g_core);  // issued DMA still happens
    const uint32_t dirty = aiv_cpu_core_dirty_lines();
    delete g_core;
    g_core = nullptr;
    return dirty;
}

extern "C" AivCpuCoreStats aiv_cpu_core_stats(void) {
    AivCpuCoreStats none;
    memset(&none, 0, sizeof(none));
    return g_core ? g_core->stats : none;
}

// ---- scalar paths ----
namespace aiv_cpu {

void gm_load(uint64_t device_addr, void* out, uint32_t n) {
    Core& c = *core();
    c.stats.scalar_loads += 1;
    uint8_t* o = static_cast<uint8_t*>(out);
    for (uint32_t done = 0; done < n;) {
        const uint64_t addr = device_addr + done;
        const uint64_t line_addr = addr & ~(kLine - 1);
        const uint64_t offset = addr - line_addr;
        const uint32_t chunk = static_cast<uint32_t>(kLine - offset < n - done ? kLine - offset : n - done);
        Line* line = fill(c, line_addr);
        if (!line) {
            raise(c, AIV_CPU_FAULT_UNMAPPED, addr, chunk);
            memset(o + done, 0, chunk);
        } else {
            memcpy(o + done, line->data + offset, chunk);
        }
        done += chunk;
    }
}

void gm_store(uint64_t device_addr, const void* in, uint32_t n) {
    Core& c = *core();
    c.stats.scalar_stores += 1;
    progress(c);
    const uint8_t* s = static_cast<const uint8_t*>(in);
    for (uint32_t done = 0; done < n;) {
        const uint64_t addr = device_addr + done;
        const uint64_t line_addr = addr & ~(kLine - 1);
        const uint64_t offset = addr - line_addr;
        const uint32_t chunk = static_cast<uint32_t>(kLine - offset < n - done ? kLine - offset : n - done);
        // Write-allocate: the rest of the line is read now and may be stale by the time the line is cleaned.
        Line* line = fill(c, line_addr);
        if (!line) {
            raise(c, AIV_CPU_FAULT_UNMAPPED, addr, chunk);
        } else {
            memcpy(line->data + offset, s + done, chunk);
            line->dirty |= mask_of(offset, offset + chunk);
        }
        done += chunk;
    }
}

void ub_load(uint64_t ub_addr, void* out, uint32_t n) {
    Core& c = *core();
    check_scalar_ub(c, ub_addr, n, false);
    const uint8_t* p = ub_range(c, ub_addr, n);
    if (p) {
        memcpy(out, p, n);
    } else {
        memset(out, 0, n);
    }
}

void ub_store(uint64_t ub_addr, const void* in, uint32_t n) {
    Core& c = *core();
    check_scalar_ub(c, ub_addr, n, true);
    uint8_t* p = ub_range(c, ub_addr, n);
    if (!p) return;
    memcpy(p, in, n);
    c.unordered_writes.push_back(Range{ub_addr, n});
}

}  // namespace aiv_cpu

// ---- CCE intrinsics ----
void dcci(const void* dst, uint64_t entire, uint64_t dst_kind) {
    Core& c = *core();
    if (dst_kind == CACHELINE_UB) return;  // the UB side: scalar UB access is not cached in this model
    if (dst_kind == CACHELINE_ATOMIC) {    // documented as not supported on A2/A3
        raise(c, AIV_CPU_FAULT_UNSUPPORTED, addr_of(dst), 0);
        return;
    }
    if (entire == ENTIRE_DATA_CACHE) {
        dcci_all(c);
    } else {
        dcci_line(c, addr_of(dst));
    }
}

// The 32-byte-unit copies between UB and GM: `n_burst` bursts of `len_burst` blocks, gaps in blocks too.
static void block_copy(bool out, uint64_t gm, uint64_t ub, uint16_t n_burst, uint16_t len_burst, uint16_t gm_gap,
                       uint16_t ub_gap) {
    Core& c = *core();
    if (n_burst < 1 || n_burst > 4095 || len_burst < 1) {
        raise(c, AIV_CPU_FAULT_BAD_ARGUMENT, gm, len_burst);
        return;
    }
    if (ub % kBlock != 0) {  // the UB operand must be 32-byte aligned; the GM one need not be
        raise(c, AIV_CPU_FAULT_MISALIGNED, ub, uint64_t(len_burst) * kBlock);
        return;
    }
    const uint64_t len = uint64_t(len_burst) * kBlock;
    for (uint64_t i = 0; i < n_burst; ++i) {
        issue(c, out, gm + i * (len + uint64_t(gm_gap) * kBlock), ub + i * (len + uint64_t(ub_gap) * kBlock), len);
    }
}

void copy_ubuf_to_gm(void* dst, void* src, uint8_t, uint16_t n_burst, uint16_t len_burst, uint16_t src_gap,
                     uint16_t dst_gap) {
    block_copy(true, addr_of(dst), addr_of(src), n_burst, len_burst, dst_gap, src_gap);
}

void copy_gm_to_ubuf(void* dst, void* src, uint8_t, uint16_t n_burst, uint16_t len_burst, uint16_t src_gap,
                     uint16_t dst_gap) {
    block_copy(false, addr_of(src), addr_of(dst), n_burst, len_burst, src_gap, dst_gap);
}

void copy_ubuf_to_gm_align_b8(void* dst, void* src, uint8_t, uint16_t n_burst, uint32_t len_burst, uint8_t, uint8_t,
                              uint32_t src_gap, uint32_t dst_gap) {
    copy_out_aligned(dst, src, n_burst, len_burst, src_gap, dst_gap, 1);
}
void copy_ubuf_to_gm_align_b16(void* dst, void* src, uint8_t, uint16_t n_burst, uint32_t len_burst, uint8_t, uint8_t,
                               uint32_t src_gap, uint32_t dst_gap) {
    copy_out_aligned(dst, src, n_burst, len_burst, src_gap, dst_gap, 2);
}
void copy_ubuf_to_gm_align_b32(void* dst, void* src, uint8_t, uint16_t n_burst, uint32_t len_burst, uint8_t, uint8_t,
                               uint32_t src_gap, uint32_t dst_gap) {
    copy_out_aligned(dst, src, n_burst, len_burst, src_gap, dst_gap, 4);
}

// Flags between the scalar pipe and the DMA pipes (MTE3 out, MTE2 in). Other pipes have nothing to order here.
void set_flag(pipe_t pipe, pipe_t tpipe, event_t event) {
    Core& c = *core();
    const uint32_t id = static_cast<uint32_t>(event) % kEvents;
    if (pipe == PIPE_S && (tpipe == PIPE_MTE3 || tpipe == PIPE_MTE2)) c.scalar_set[id] = true;
    if (pipe == PIPE_MTE3) c.out_mark[id] = c.next_seq - 1;
    if (pipe == PIPE_MTE2) c.in_mark[id] = c.next_seq - 1;
}

void wait_flag(pipe_t pipe, pipe_t tpipe, event_t event) {
    Core& c = *core();
    const uint32_t id = static_cast<uint32_t>(event) % kEvents;
    if (pipe == PIPE_S && (tpipe == PIPE_MTE3 || tpipe == PIPE_MTE2)) {
        if (!c.scalar_set[id]) raise(c, AIV_CPU_FAULT_PIPE_ORDER, 0, 0);  // a wait with no set: hangs on hardware
        c.scalar_set[id] = false;
        c.unordered_writes.clear();
    }
    if (pipe == PIPE_MTE3) complete(c, true, c.out_mark[id]);
    if (pipe == PIPE_MTE2) complete(c, false, c.in_mark[id]);
}

void pipe_barrier(pipe_t pipe) {
    Core& c = *core();
    if (pipe != PIPE_ALL) return;
    complete_all(c);
    c.unordered_writes.clear();
}

int64_t get_block_idx() { return core()->block_idx; }
int64_t get_block_num() { return core()->block_num; }
int64_t get_sys_cnt() {
    Core& c = *core();
    return static_cast<int64_t>(c.ops->system_counter(c.context));
}
