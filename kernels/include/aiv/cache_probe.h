// The data-cache probe: a test-only kernel entry of the kernel object (aiv_cache_probe_kernel, kernels/npu/entry.cpp)
// that asks whether a GM line, once in the AIV core's scalar data cache, stays there until invalidated
// (docs/hardware.md section 9; docs/HARDWARE_TESTING.md, "Assumptions and the hardware tests"). Not part of the
// transfer path: nothing of the engine launches it; the hardware test tests/npu_cache_assumptions.rs and its twin
// sibling do. Unverified on hardware.
//
// One block, with the platform layer's primitives only (include platform/npu.h first):
//   1. reads the probe word with an invalidating load (load_u32), which leaves its line in the data cache;
//   2. publishes `cached` (store_u32: stored and cleaned);
//   3. waits, bounded by a spin count and by wait_budget cycles, for the Host to rewrite the probe word by DMA and
//      raise `rewritten` (read with load_u32, so with dcci); gives up with AIV_CACHE_PROBE_NO_REWRITE;
//   4. for K = 0, then 1, 2, 4, ... up to scratch_lines: loads the first word of scratch lines [0, K), then (after a
//      dcci of the `cached` flag's line, an ordering point for the compiler) the probe word, all without
//      invalidating (load_u32_cached), and records the probe value seen after K loads;
//   5. writes the results, cleans the data cache, then sets `done` (store_u32).
// The old value at every K: the line stayed. The Host's new value from some K on: the line was evicted after K loads
// of other lines. The new value at K = 0: the line was not cached at all, or the DMA updated the cache.
//
// Lines are 64 bytes (AIV_CACHE_LINE: CACHE_LINE_SIZE for dav-2201, mirror-cann/asc-devkit
// impl/basic_api/utils/kernel_utils_constants.h). The data cache's size is not documented: the largest K,
// AIV_CACHE_PROBE_MAX_LINES lines (4 MiB), is far past any plausible scalar data cache.
#ifndef AIV_CACHE_PROBE_H
#define AIV_CACHE_PROBE_H

#include "aiv/layouts.h"
#include "aiv/platform.h"

#define AIV_CACHE_PROBE_MAX_LINES 65536u
// K = 0, then every power of two up to AIV_CACHE_PROBE_MAX_LINES.
#define AIV_CACHE_PROBE_ROUNDS 18u
// The wait for `rewritten` also ends after this many polls, whatever the counter says.
#define AIV_CACHE_PROBE_MAX_SPINS (1u << 30)

// What `status` says once `done` is set.
#define AIV_CACHE_PROBE_FINISHED 1u     // every round ran: seen[0 .. rounds) hold the values
#define AIV_CACHE_PROBE_NO_REWRITE 2u   // `rewritten` was not raised within the budget; no round ran
#define AIV_CACHE_PROBE_BAD_PARAMS 3u   // the first line's fields are not as described; nothing was read

// In GM the Host reads and writes while the kernel runs (Host memory registered for the device). Each line has one
// writer while the kernel runs, so a clean of one never writes back stale bytes of another agent's.
struct AivCacheProbeParams {
    // Line 0, written by the Host before the launch.
    uint64_t probe;          // device address of the probe word: 64-byte aligned; nothing else uses its line
    uint64_t scratch;        // device address of scratch_lines * 64 bytes: 64-byte aligned, not holding the probe
    uint64_t wait_budget;    // cycles the kernel waits for `rewritten`
    uint32_t scratch_lines;  // the largest K: a power of two, 1 to AIV_CACHE_PROBE_MAX_LINES
    uint32_t reserved0[9];
    // Line 1, written by the kernel: non-zero once the probe word's line is cached.
    uint32_t cached;
    uint32_t reserved1[15];
    // Line 2, written by the Host: non-zero once its DMA rewrite of the probe word has completed.
    uint32_t rewritten;
    uint32_t reserved2[15];
    // Line 3, written by the kernel; `done` last.
    uint32_t done;
    uint32_t status;         // AIV_CACHE_PROBE_*
    uint32_t first;          // the probe word at the caching load (step 1)
    uint32_t rounds;         // entries of `seen` written
    uint64_t wait_cycles;    // cycles spent waiting for `rewritten`
    uint64_t round_cycles;   // cycles the rounds took
    uint32_t sink;           // XOR of every scratch word loaded (keeps the loads)
    uint32_t reserved3[7];
    // Lines 4-5, written by the kernel: seen[r], the probe word after K_r = (r == 0 ? 0 : 1 << (r - 1)) other loads.
    uint32_t seen[AIV_CACHE_PROBE_ROUNDS];
    uint32_t reserved4[14];
};
// The Host side (tests/npu_cache_assumptions.rs) reads and writes these offsets.
static_assert(__builtin_offsetof(AivCacheProbeParams, probe) == 0 &&
                  __builtin_offsetof(AivCacheProbeParams, scratch) == 8 &&
                  __builtin_offsetof(AivCacheProbeParams, wait_budget) == 16 &&
                  __builtin_offsetof(AivCacheProbeParams, scratch_lines) == 24 &&
                  __builtin_offsetof(AivCacheProbeParams, cached) == 64 &&
                  __builtin_offsetof(AivCacheProbeParams, rewritten) == 128 &&
                  __builtin_offsetof(AivCacheProbeParams, done) == 192 &&
                  __builtin_offsetof(AivCacheProbeParams, status) == 196 &&
                  __builtin_offsetof(AivCacheProbeParams, first) == 200 &&
                  __builtin_offsetof(AivCacheProbeParams, rounds) == 204 &&
                  __builtin_offsetof(AivCacheProbeParams, wait_cycles) == 208 &&
                  __builtin_offsetof(AivCacheProbeParams, round_cycles) == 216 &&
                  __builtin_offsetof(AivCacheProbeParams, sink) == 224 &&
                  __builtin_offsetof(AivCacheProbeParams, seen) == 256 && sizeof(AivCacheProbeParams) == 384,
              "the cache probe's parameter layout, as its Host side reads and writes it");
static_assert(AIV_CACHE_LINE == 64u && (AIV_CACHE_PROBE_MAX_LINES >> (AIV_CACHE_PROBE_ROUNDS - 2)) == 1u,
              "the rounds end at AIV_CACHE_PROBE_MAX_LINES");

namespace aiv {

// The results of line 3 and lines 4-5, built on the core and written out at once.
struct CacheProbeResults {
    uint32_t status;
    uint32_t first;
    uint32_t rounds;
    uint64_t wait_cycles;
    uint64_t round_cycles;
    uint32_t sink;
    uint32_t seen[AIV_CACHE_PROBE_ROUNDS];
};

AIV_DEVICE_FN bool cache_probe_params_ok(uint64_t probe, uint64_t scratch, uint32_t lines) {
    const uint64_t line_mask = AIV_CACHE_LINE - 1;
    if (probe == 0 || scratch == 0 || (probe & line_mask) != 0 || (scratch & line_mask) != 0) return false;
    if (probe > ~uint64_t(0) - AIV_CACHE_LINE) return false;
    if (lines == 0 || lines > AIV_CACHE_PROBE_MAX_LINES || (lines & (lines - 1)) != 0) return false;
    const uint64_t scratch_end = scratch + uint64_t(lines) * AIV_CACHE_LINE;
    return scratch_end > scratch && (probe + AIV_CACHE_LINE <= scratch || probe >= scratch_end);
}

// Writes the results, cleans the data cache (the results reach GM), then sets `done`.
AIV_DEVICE_FN void cache_probe_finish(AIV_GM AivCacheProbeParams* p, const CacheProbeResults& r) {
    aiv_platform::write_bytes(&p->status, &r.status, sizeof(uint32_t));
    aiv_platform::write_bytes(&p->first, &r.first, sizeof(uint32_t));
    aiv_platform::write_bytes(&p->rounds, &r.rounds, sizeof(uint32_t));
    aiv_platform::write_bytes(&p->wait_cycles, &r.wait_cycles, sizeof(uint64_t));
    aiv_platform::write_bytes(&p->round_cycles, &r.round_cycles, sizeof(uint64_t));
    aiv_platform::write_bytes(&p->sink, &r.sink, sizeof(uint32_t));
    aiv_platform::write_bytes(p->seen, r.seen, sizeof(r.seen));
    aiv_platform::flush_for_device(p, sizeof(AivCacheProbeParams));
    aiv_platform::store_u32(&p->done, 1u);
}

AIV_DEVICE_FN void cache_probe(AIV_GM AivCacheProbeParams* p) {
    CacheProbeResults r = {};
    const uint64_t probe_addr = aiv_platform::load_u64(&p->probe);
    const uint64_t scratch_addr = aiv_platform::load_u64(&p->scratch);
    const uint64_t budget = aiv_platform::load_u64(&p->wait_budget);
    const uint32_t lines = aiv_platform::load_u32(&p->scratch_lines);
    if (!cache_probe_params_ok(probe_addr, scratch_addr, lines)) {
        r.status = AIV_CACHE_PROBE_BAD_PARAMS;
        cache_probe_finish(p, r);
        return;
    }
    const AIV_GM uint32_t* probe = reinterpret_cast<const AIV_GM uint32_t*>(probe_addr);
    // 1-2: the caching load, then the flag.
    r.first = aiv_platform::load_u32(probe);
    aiv_platform::store_u32(&p->cached, 1u);
    // 3: the Host's rewrite, bounded by the budget and the spin count.
    const uint64_t wait_start = aiv_platform::cycles();
    bool rewritten = false;
    for (uint32_t spins = 0; spins < AIV_CACHE_PROBE_MAX_SPINS; ++spins) {
        if (aiv_platform::load_u32(&p->rewritten) != 0) {
            rewritten = true;
            break;
        }
        if (aiv_platform::cycles() - wait_start > budget) break;
    }
    r.wait_cycles = aiv_platform::cycles() - wait_start;
    if (!rewritten) {
        r.status = AIV_CACHE_PROBE_NO_REWRITE;
        cache_probe_finish(p, r);
        return;
    }
    // 4: K loads of other lines, then the probe word, nothing invalidated.
    const uint64_t round_start = aiv_platform::cycles();
    uint32_t sink = 0;
    for (uint32_t round = 0; round < AIV_CACHE_PROBE_ROUNDS; ++round) {
        const uint32_t k = round == 0 ? 0u : 1u << (round - 1);
        if (k > lines) break;
        for (uint32_t i = 0; i < k; ++i) {
            sink ^= aiv_platform::load_u32_cached(
                reinterpret_cast<const AIV_GM uint32_t*>(scratch_addr + uint64_t(i) * AIV_CACHE_LINE));
        }
        // The ordering point: a dcci of the `cached` flag's line, which the probe never reads again. A compiler may
        // not move loads across it (as the transfer kernel's polling relies on), so the re-read below is a fresh
        // load issued after the K loads above, not the previous round's value nor a load hoisted above them.
        aiv_platform::dcci_line(&p->cached);
        r.seen[round] = aiv_platform::load_u32_cached(probe);
        r.rounds = round + 1;
    }
    r.round_cycles = aiv_platform::cycles() - round_start;
    r.sink = sink;
    r.status = AIV_CACHE_PROBE_FINISHED;
    cache_probe_finish(p, r);
}

}  // namespace aiv

#endif
