// Platform layer for the CPU twin: the kernel runs on an emulated AIV core (a Host thread).
//
// Shared words are accessed with acquire/release atomics (GCC/Clang builtins); the SDMA engine thread, the Host
// runtime and the kernel are separate threads of one process. The doorbell is a release store of the new tail into
// the channel's register page at sq_reg_base + AIV_SDMA_DOORBELL_OFFSET, followed by a call into the twin (Rust)
// that wakes the channel's engine thread; the engine reads the tail from the register, as STARS would.
#ifndef AIV_PLATFORM_TWIN_H
#define AIV_PLATFORM_TWIN_H

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "aiv/layouts.h"
#include "aiv/platform.h"

#define AIV_GM
#define AIV_DEVICE_FN static inline
#define AIV_PLATFORM_NAME "twin"

extern "C" {
// Implemented by the twin device (host/device/twin/hooks.rs).
void aiv_twin_doorbell_rung(uint64_t context, uint64_t sq_reg_base);
uint32_t aiv_twin_wait_token(uint64_t context, uint32_t kind);
void aiv_twin_idle(uint64_t context, uint32_t kind, uint32_t token, uint32_t spins);
}

namespace aiv_platform {

AIV_DEVICE_FN uint32_t load_u32(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
AIV_DEVICE_FN uint64_t load_u64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
AIV_DEVICE_FN void store_u32(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
AIV_DEVICE_FN void store_u64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

// Entries are read only after an acquire load of the producer's index, which orders these plain reads after it.
AIV_DEVICE_FN void read_bytes(void* dst, const void* src, uint32_t n) { memcpy(dst, src, n); }
// Entries are written before a release store of the producer index (or the doorbell), which publishes them.
AIV_DEVICE_FN void write_bytes(void* dst, const void* src, uint32_t n) { memcpy(dst, src, n); }
// The twin's DMA engine is a thread of the same coherent process: ordering comes from the doorbell's release store.
AIV_DEVICE_FN void flush_for_device(void*, uint32_t) {}

AIV_DEVICE_FN void ring_doorbell(uint64_t context, uint64_t sq_reg_base, uint32_t tail) {
    // Release: the SQEs written before this store are visible to the engine thread that acquires the tail.
    __atomic_store_n(reinterpret_cast<uint32_t*>(sq_reg_base + AIV_SDMA_DOORBELL_OFFSET), tail, __ATOMIC_RELEASE);
    aiv_twin_doorbell_rung(context, sq_reg_base);
}

// Nanoseconds of CLOCK_MONOTONIC: the twin's cycle counter runs at 1 GHz.
AIV_DEVICE_FN uint64_t cycles() {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
}

AIV_DEVICE_FN uint32_t wait_token(uint64_t context, uint32_t kind) { return aiv_twin_wait_token(context, kind); }
AIV_DEVICE_FN void idle(uint64_t context, uint32_t kind, uint32_t token, uint32_t spins) {
    aiv_twin_idle(context, kind, token, spins);
}

}  // namespace aiv_platform

#endif
