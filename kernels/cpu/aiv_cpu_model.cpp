// The per-core model behind kernels/cpu/kernel_operator.h: data cache, unified buffer, DMA and the C ABI of
// kernels/cpu/aiv_cpu_core.h. The semantics, and which parts come from public sources, are in docs/ascendc-cpu.md.
#include <stdint.h>
#include <string.h>

#include <memory>
#include <vector>

#include "aiv_cpu_core.h"
#include "kernel_operator.h"

// The inline hit path's state (kernel_operator.h); zero (no hit) on a thread with no core installed.
// The table is on the heap, not in TLS: a shared object with initial-exec TLS gets its whole TLS block from the
// static TLS surplus when it is dlopen'ed, which has room for a few pointers, not 4 KiB. Installed by
// aiv_cpu_core_enter (or by the first access of a thread without a core) and freed by aiv_cpu_core_leave.
__thread aiv_cpu::FastCache* aiv_cpu::fast_cache __attribute__((tls_model("initial-exec"))) = nullptr;
__thread aiv_cpu::UbArea* aiv_cpu::ub_area __attribute__((tls_model("initial-exec"))) = nullptr;
__thread uint32_t aiv_cpu::ub_inline_epoch __attribute__((tls_model("initial-exec"))) = 0;
__thread uint32_t aiv_cpu::ub_inline_limit __attribute__((tls_model("initial-exec"))) = 0;
aiv_cpu::FastCache& aiv_cpu::fast_install() {
    if (!fast_cache) fast_cache = new aiv_cpu::FastCache();
    return *fast_cache;
}

namespace {

constexpr uint64_t kLine = aiv_cpu::kFastLine;  // data cache line (CACHE_LINE_SIZE for dav-2201)
constexpr uint64_t kAllBytes = ~uint64_t(0);    // a 64-bit byte mask covering a whole line
constexpr uint64_t kBlock = 32;                 // DMA data block
constexpr uint32_t kUbBytes = aiv_cpu::kFastUbBytes;
constexpr uint32_t kGranule = aiv_cpu::kUbGranule;
constexpr uint32_t kPollThreshold = 16;         // unchanged refills before the first idle hint
constexpr uint32_t kNotResident = ~uint32_t(0);

// One line of the data cache. A line, once known, is never freed while the core lives: when every byte of it has
// been invalidated it stays as the record of its last fill (poll detection) and is simply not resident.
struct Line {
    aiv_cpu::FastLine head;    // data and dirty bits (the inline hit path reads and writes these)
    uint64_t valid;            // bit i: byte i holds a copy taken from HBM (or written by this core)
    uint64_t addr;             // the line's device address
    uint32_t resident;         // index in Core::resident while any byte is valid, else kNotResident
    bool has_last_fill;
    uint8_t last_fill[kLine];  // what HBM held at the line's last fill (poll detection)
};

// A DMA burst issued and not yet known complete (the kernel has not waited for its pipe).
struct DmaOp {
    bool out;        // UB -> GM (MTE3), else GM -> UB (MTE2)
    uint64_t gm;
    uint64_t ub;
    uint64_t len;
    uint64_t seq;
    void* hbm;       // at completion: translate's answer for a UB -> GM burst
};

struct Range {
    uint64_t from;
    uint64_t len;
};

constexpr uint32_t kEvents = 8;

// Every line the core has ever cached, by address: open addressing over a power-of-two table of pointers into
// chunks that never move (lines are never removed, so no tombstones).
class LineTable {
public:
    LineTable() : slots_(1024, nullptr), mask_(1023) {}
    Line* find(uint64_t addr) const {
        for (size_t i = hash(addr) & mask_;; i = (i + 1) & mask_) {
            Line* line = slots_[i];
            if (!line || line->addr == addr) return line;
        }
    }
    // A new, wholly invalid line (the caller found none at `addr`).
    Line* insert(uint64_t addr) {
        if ((count_ + 1) * 2 > slots_.size()) grow();
        if (chunks_.empty() || used_ == kChunk) {
            chunks_.emplace_back(new Line[kChunk]);
            used_ = 0;
        }
        Line* line = &chunks_.back()[used_++];
        memset(line, 0, sizeof(Line));
        line->addr = addr;
        line->resident = kNotResident;
        place(line);
        count_ += 1;
        return line;
    }

private:
    static constexpr size_t kChunk = 256;
    static size_t hash(uint64_t addr) { return static_cast<size_t>((addr / kLine) * 0x9E3779B97F4A7C15ull >> 20); }
    void place(Line* line) {
        size_t i = hash(line->addr) & mask_;
        while (slots_[i]) i = (i + 1) & mask_;
        slots_[i] = line;
    }
    void grow() {
        std::vector<Line*> old(slots_.size() * 2, nullptr);
        old.swap(slots_);
        mask_ = slots_.size() - 1;
        for (Line* line : old) {
            if (line) place(line);
        }
    }
    std::vector<Line*> slots_;
    size_t mask_;
    size_t count_ = 0;
    std::vector<std::unique_ptr<Line[]>> chunks_;
    size_t used_ = 0;
};

struct Core {
    const AivCpuCoreOps* ops = nullptr;
    void* context = nullptr;
    uint32_t block_idx = 0;
    uint32_t block_num = 0;
    LineTable lines;
    std::vector<Line*> resident;  // the lines holding any valid byte (what dcci of the entire cache operates on)
    // Pipe ordering: DMA runs when the kernel waits for it; scalar UB writes reach a DMA only once ordered before it.
    std::vector<DmaOp> pending;           // issue order
    uint64_t next_seq = 1;
    uint64_t out_mark[kEvents] = {};      // SetFlag<MTE3_*>(id): ops up to this seq complete at the WaitFlag
    uint64_t in_mark[kEvents] = {};       // SetFlag<MTE2_*>(id)
    bool scalar_set[kEvents] = {};        // SetFlag<S_MTE3/S_MTE2>(id) not yet waited
    std::vector<Range> unordered_writes;  // scalar UB writes not yet ordered before later DMA
    AivCpuCoreStats stats;                // scalar_loads / scalar_stores live in aiv_cpu::fast
    uint64_t stores_at_fill = 0;          // aiv_cpu::fast().scalar_stores at the last fill that read HBM
    uint16_t epoch = 1;                   // the UB ordering epoch (aiv_cpu::UbArea): >= 1
    aiv_cpu::UbArea ub;                   // the unified buffer and its ordering record
};

// Whether the runtime records what gm_written / gm_read report (ABI 3): skipped while it does not.
inline bool records_on(const Core& c) {
    return c.ops->records_on == nullptr || __atomic_load_n(c.ops->records_on, __ATOMIC_RELAXED) != 0;
}

// Initial-exec, like fast_cache: no __tls_get_addr call per intrinsic in the dlopen'ed kernel object (8 bytes of
// static TLS).
__thread Core* g_core __attribute__((tls_model("initial-exec"))) = nullptr;

uint64_t mask_of(uint64_t from, uint64_t to) {  // bytes [from, to) of a line
    const uint64_t hi = to >= 64 ? kAllBytes : ((uint64_t(1) << to) - 1);
    const uint64_t lo = from >= 64 ? kAllBytes : ((uint64_t(1) << from) - 1);
    return hi & ~lo;
}

void raise(Core& c, uint32_t kind, uint64_t addr, uint64_t len) {
    c.stats.faults += 1;
    if (c.ops->fault) c.ops->fault(c.context, kind, addr, len);
}

void progress(Core&) { aiv_cpu::fast().unchanged_fills = 0; }

uint32_t fast_slot(uint64_t line_addr) {
    return static_cast<uint32_t>(line_addr / kLine) & (aiv_cpu::kFastSlots - 1);
}
// The inline path may use `line` (every byte valid).
void fast_install(Line& line) {
    const uint32_t slot = fast_slot(line.addr);
    aiv_cpu::fast().tag[slot] = line.addr | 1;
    aiv_cpu::fast().line[slot] = &line.head;
}
// `line` lost a valid byte: the inline path must not use it any more.
void fast_remove(const Line& line) {
    const uint32_t slot = fast_slot(line.addr);
    if (aiv_cpu::fast().tag[slot] == (line.addr | 1)) aiv_cpu::fast().tag[slot] = 0;
}

// Copies bytes i of a line for which bit i of `mask` is set, one memcpy per run of set bits.
void copy_bytes(uint8_t* dst, const uint8_t* src, uint64_t mask) {
    if (mask == kAllBytes) {
        memcpy(dst, src, kLine);
        return;
    }
    while (mask != 0) {
        const unsigned from = static_cast<unsigned>(__builtin_ctzll(mask));
        const uint64_t rest = ~(mask >> from);  // zero bits here are the run
        const unsigned run = rest == 0 ? 64 - from : static_cast<unsigned>(__builtin_ctzll(rest));
        memcpy(dst + from, src + from, run);
        mask &= ~mask_of(from, from + run);
    }
}

// Writes the valid bytes of `mask` of a dirty line back to HBM (the line is the unit of write-back: SetValue's
// documentation says data goes out in cache lines, so clean bytes a core holds stale are written too).
void write_back(Core& c, Line& line, uint64_t mask) {
    if ((line.head.dirty & mask) == 0) return;
    uint8_t* hbm = static_cast<uint8_t*>(c.ops->translate(c.context, line.addr, kLine));
    if (!hbm) {
        raise(c, AIV_CPU_FAULT_UNMAPPED, line.addr, kLine);
    } else {
        const uint64_t written = mask & line.valid;
        copy_bytes(hbm, line.head.data, written);
        if (written != 0 && c.ops->gm_written && records_on(c)) {
            const uint64_t from = static_cast<uint64_t>(__builtin_ctzll(written));
            const uint64_t to = 64 - static_cast<uint64_t>(__builtin_clzll(written));
            c.ops->gm_written(c.context, line.addr + from, to - from);
        }
    }
    line.head.dirty &= ~mask;
    c.stats.line_write_backs += 1;
}

// The line holding `line_addr`, every byte valid: bytes not yet held are read from HBM, bytes held are kept (stale
// or not). nullptr if the line is not device memory.
Line* fill(Core& c, uint64_t line_addr) {
    Line* line = c.lines.find(line_addr);
    if (line && line->valid == kAllBytes) {
        fast_install(*line);
        return line;
    }
    const uint8_t* hbm = static_cast<const uint8_t*>(c.ops->translate(c.context, line_addr, kLine));
    if (!hbm) return nullptr;
    c.stats.line_fills += 1;
    // A scalar store since the previous fill (the inline path only counts it) is progress.
    if (aiv_cpu::fast().scalar_stores != c.stores_at_fill) {
        c.stores_at_fill = aiv_cpu::fast().scalar_stores;
        progress(c);
    }
    uint8_t now[kLine];
    memcpy(now, hbm, kLine);  // one read of HBM: what this fill sees
    if (!line) {
        line = c.lines.insert(line_addr);
        progress(c);
    }
    if (line->valid == 0) {
        // Poll detection: a refill of a line that was wholly invalidated, with the same HBM content as its last fill.
        if (line->has_last_fill && memcmp(line->last_fill, now, kLine) == 0) {
            aiv_cpu::fast().unchanged_fills += 1;
            if (aiv_cpu::fast().unchanged_fills >= kPollThreshold && c.ops->idle_hint) {
                c.stats.idle_hints += 1;
                c.ops->idle_hint(c.context, aiv_cpu::fast().unchanged_fills);
                // The hint stood for the time an NPU core spends spinning on this line (the twin may have yielded or
                // napped): the fill completes at its end, with what HBM holds then. A flag that landed during the
                // nap is returned now, not one poll (and one more nap) later. Translated again: the wait may have
                // outlived the mapping (then the fill keeps what it read before).
                const uint8_t* after = static_cast<const uint8_t*>(c.ops->translate(c.context, line_addr, kLine));
                if (after) memcpy(now, after, kLine);
                if (memcmp(line->last_fill, now, kLine) != 0) progress(c);
            }
        } else if (line->has_last_fill) {
            progress(c);
        }
        memcpy(line->head.data, now, kLine);
    } else {
        copy_bytes(line->head.data, now, ~line->valid);
    }
    if (c.ops->gm_read && records_on(c)) c.ops->gm_read(c.context, line_addr, now, kLine);
    memcpy(line->last_fill, now, kLine);
    line->has_last_fill = true;
    line->valid = kAllBytes;
    if (line->resident == kNotResident) {
        line->resident = static_cast<uint32_t>(c.resident.size());
        c.resident.push_back(line);
    }
    fast_install(*line);
    return line;
}

// `line` holds no valid byte any more: it leaves the resident set (and keeps its last fill).
void evict_invalid(Core& c, Line& line) {
    Line* last = c.resident.back();
    c.resident[line.resident] = last;
    last->resident = line.resident;
    c.resident.pop_back();
    line.resident = kNotResident;
}

// Cleans and invalidates bytes [from, 64) of one line.
void dcci_line(Core& c, uint64_t addr) {
    const uint64_t line_addr = addr & ~(kLine - 1);
    const uint64_t mask = mask_of(addr - line_addr, kLine);
    c.stats.dcci_single += 1;
    Line* line = c.lines.find(line_addr);
    if (!line || line->valid == 0) return;
    write_back(c, *line, mask);
    line->valid &= ~mask;
    fast_remove(*line);
    if (line->valid == 0) evict_invalid(c, *line);
}

void dcci_all(Core& c) {
    c.stats.dcci_entire += 1;
    for (Line* line : c.resident) {
        write_back(c, *line, kAllBytes);
        line->valid = 0;
        line->resident = kNotResident;
        fast_remove(*line);
    }
    c.resident.clear();
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
    return c.ub.bytes + ub_addr;
}

bool overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) { return a < b + blen && b < a + alen; }

// The inline UB path's epoch (kernel_operator.h), derived from the core's: 0 while a burst is pending. Called
// whenever the epoch or the pending bursts change.
void inline_state_changed(const Core& c) {
    aiv_cpu::ub_inline_epoch = c.pending.empty() ? c.epoch : 0;
    aiv_cpu::ub_inline_limit = c.pending.empty() ? aiv_cpu::kFastUbBytes : 0;
}

// Every scalar UB write so far is ordered before DMA issued from now on.
void order_scalar_ub(Core& c) {
    c.unordered_writes.clear();
    if (++c.epoch == 0) {  // wrapped: no granule may keep a stale epoch equal to a future one
        memset(c.ub.epoch, 0, sizeof(c.ub.epoch));
        c.epoch = 1;
    }
    inline_state_changed(c);
}

// Asks the CPU for write ownership of the `len` bytes after a UB -> GM burst to `hbm`, where a ring's next burst
// goes: the lines the SDMA engine's thread read on the ring's last lap then move to this thread while the core
// builds the next burst, not while the model copies it. Speed only (a prefetch changes no memory and cannot fault).
void prefetch_next(uint8_t* hbm, uint64_t len) {
#if defined(__x86_64__)
    if (len < 256) return;
    for (uint64_t at = 0; at < len; at += kLine) __asm__ volatile("prefetchw (%0)" : : "r"(hbm + len + at));
#else
    (void)hbm;
    (void)len;
#endif
}

// Runs one burst: UB -> GM to `hbm` (translate's answer for it) if not null, else to the runtime's register page;
// GM -> UB from HBM.
void execute(Core& c, const DmaOp& op, void* hbm) {
    uint8_t* local = c.ub.bytes + op.ub;
    if (op.out) {
        if (hbm) {
            memcpy(hbm, local, op.len);
            if (c.ops->gm_written && records_on(c)) c.ops->gm_written(c.context, op.gm, op.len);
            prefetch_next(static_cast<uint8_t*>(hbm), op.len);
            return;
        }
        const int answer = c.ops->register_write
                               ? c.ops->register_write(c.context, op.gm, local, static_cast<uint32_t>(op.len))
                               : AIV_CPU_REG_NOT_REGISTER;
        if (answer == AIV_CPU_REG_NOT_REGISTER) raise(c, AIV_CPU_FAULT_UNMAPPED, op.gm, op.len);
        return;
    }
    if (!hbm) {
        raise(c, AIV_CPU_FAULT_UNMAPPED, op.gm, op.len);
        memset(local, 0, op.len);
        return;
    }
    memcpy(local, hbm, op.len);
    if (c.ops->gm_read && records_on(c)) c.ops->gm_read(c.context, op.gm, local, op.len);
}

// Completes the pending bursts of one direction up to sequence number `upto` (every pending burst with `all`).
// Nothing documents in which order bursts completed by one wait reach their targets, so the model takes the order
// that exposes a missing wait: UB -> GM bursts to registers land first (a doorbell overtakes the data it announces
// unless the kernel waited for that data before issuing the doorbell), then the rest in issue order.
void complete(Core& c, bool out, uint64_t upto, bool all = false) {
    const auto due = [&](const DmaOp& op) { return all || (op.out == out && op.seq <= upto); };
    for (DmaOp& op : c.pending) {
        if (!due(op) || !op.out) continue;
        op.hbm = c.ops->translate(c.context, op.gm, op.len);
        if (!op.hbm) execute(c, op, nullptr);
    }
    size_t kept = 0;
    for (size_t i = 0; i < c.pending.size(); ++i) {
        const DmaOp op = c.pending[i];
        if (!due(op)) {
            c.pending[kept++] = op;
        } else if (!op.out) {
            execute(c, op, c.ops->translate(c.context, op.gm, op.len));
        } else if (op.hbm) {
            execute(c, op, op.hbm);
        }
    }
    c.pending.resize(kept);
    inline_state_changed(c);
}

void complete_all(Core& c) { complete(c, false, 0, true); }

// Issues one burst. Its UB range must not hold scalar writes not yet ordered before it (SetFlag/WaitFlag<S_MTE3> or
// <S_MTE2>, or PipeBarrier<PIPE_ALL>).
void issue(Core& c, bool out, uint64_t gm, uint64_t ub, uint64_t len) {
    if (!ub_range(c, ub, len)) return;
    bool unordered = false;
    for (const Range& w : c.unordered_writes) unordered = unordered || overlaps(w.from, w.len, ub, len);
    const uint16_t epoch = c.epoch;
    uint32_t current = 0;
    // Only the inline path stamps granules, and only with the epoch it last stored in: no store in this epoch, no
    // granule of it. Otherwise no early exit: the loop vectorises (a 2 KiB burst is 256 granules).
    if (c.ub.stamped == epoch) {
        for (uint64_t g = ub / kGranule, last = (ub + len + kGranule - 1) / kGranule; g < last; ++g) {
            current |= c.ub.epoch[g] == epoch ? 1u : 0u;
        }
    }
    unordered = unordered || current != 0;
    if (unordered) raise(c, AIV_CPU_FAULT_PIPE_ORDER, ub, len);
    if (out) {
        c.stats.dma_bursts_out += 1;
    } else {
        c.stats.dma_bursts_in += 1;
    }
    progress(c);
    c.pending.push_back(DmaOp{out, gm, ub, len, c.next_seq++, nullptr});
    inline_state_changed(c);
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
// A UB operand: an offset into the core's UB, or what LocalTensor::GetPhyAddr gave, the Host address of a byte of
// the core's UB (offsets are below 192 KiB, Host addresses of the core's heap-allocated UB far above).
uint64_t ub_addr_of(Core& c, const void* p) {
    const uint64_t at = addr_of(p);
    const uint64_t base = addr_of(c.ub.bytes);
    return at >= base && at - base <= kUbBytes ? at - base : at;
}

void copy_out_aligned(void* dst, void* src, uint16_t n_burst, uint32_t len_burst, uint32_t src_gap,
                      uint32_t dst_gap, uint32_t element) {
    Core& c = *core();
    const uint64_t gm = addr_of(dst);
    const uint64_t ub = ub_addr_of(c, src);
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
    memset(&g_core->stats, 0, sizeof(g_core->stats));  // the unified buffer: zeroed by Core()'s value-initialisation
    memset(&aiv_cpu::fast(), 0, sizeof(aiv_cpu::FastCache));
    aiv_cpu::ub_area = &g_core->ub;
    inline_state_changed(*g_core);
    g_core->resident.reserve(512);
    g_core->pending.reserve(64);
    return 0;
}

extern "C" uint32_t aiv_cpu_core_dirty_lines(void) {
    if (!g_core) return 0;
    uint32_t dirty = 0;
    for (const Line* line : g_core->resident) dirty += line->head.dirty != 0 ? 1u : 0u;
    return dirty;
}

extern "C" uint32_t aiv_cpu_core_leave(void) {
    if (g_core) complete_all(*g_core);  // issued DMA still happens
    const uint32_t dirty = aiv_cpu_core_dirty_lines();
    delete g_core;
    g_core = nullptr;
    aiv_cpu::ub_area = nullptr;
    aiv_cpu::ub_inline_epoch = 0;
    aiv_cpu::ub_inline_limit = 0;
    delete aiv_cpu::fast_cache;
    aiv_cpu::fast_cache = nullptr;
    return dirty;
}

extern "C" AivCpuCoreStats aiv_cpu_core_stats(void) {
    AivCpuCoreStats none;
    memset(&none, 0, sizeof(none));
    if (!g_core) return none;
    AivCpuCoreStats stats = g_core->stats;
    stats.scalar_loads = aiv_cpu::fast().scalar_loads;
    stats.scalar_stores = aiv_cpu::fast().scalar_stores;
    return stats;
}

// ---- scalar paths ----
namespace aiv_cpu {

void gm_load(uint64_t device_addr, void* out, uint32_t n) {
    Core& c = *core();
    aiv_cpu::fast().scalar_loads += 1;
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
            memcpy(o + done, line->head.data + offset, chunk);
        }
        done += chunk;
    }
}

void gm_store(uint64_t device_addr, const void* in, uint32_t n) {
    Core& c = *core();
    aiv_cpu::fast().scalar_stores += 1;
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
            memcpy(line->head.data + offset, s + done, chunk);
            line->head.dirty |= mask_of(offset, offset + chunk);
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

void ub_store_word(uint64_t ub_addr, uint64_t word) { ub_store(ub_addr, &word, sizeof(word)); }

void* ub_scalar(uint64_t ub_addr, uint64_t n) { return ub_range(*core(), ub_addr, n); }

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
    block_copy(true, addr_of(dst), ub_addr_of(*core(), src), n_burst, len_burst, dst_gap, src_gap);
}

void copy_gm_to_ubuf(void* dst, void* src, uint8_t, uint16_t n_burst, uint16_t len_burst, uint16_t src_gap,
                     uint16_t dst_gap) {
    block_copy(false, addr_of(src), ub_addr_of(*core(), dst), n_burst, len_burst, src_gap, dst_gap);
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
        order_scalar_ub(c);
    }
    if (pipe == PIPE_MTE3) complete(c, true, c.out_mark[id]);
    if (pipe == PIPE_MTE2) complete(c, false, c.in_mark[id]);
}

void pipe_barrier(pipe_t pipe) {
    Core& c = *core();
    if (pipe != PIPE_ALL) return;
    complete_all(c);
    order_scalar_ub(c);
}

int64_t get_block_idx() { return core()->block_idx; }
int64_t get_block_num() { return core()->block_num; }
int64_t get_sys_cnt() {
    Core& c = *core();
    return static_cast<int64_t>(c.ops->system_counter(c.context));
}
