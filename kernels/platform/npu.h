// Platform layer for the Ascend AI Vector cores (AscendC, dav-c220-vec / dav-2201). UNVERIFIED ON HARDWARE: this
// file follows docs/hardware.md sections 2-4 (scalar GM access through the data cache with manual dcci, the doorbell as a
// UB->GM DMA of the tail to sq_reg_base + 0x8, pipe ordering around it) but has not been compiled with bisheng/ccec
// or run on an NPU by this project yet.
#ifndef AIV_PLATFORM_NPU_H
#define AIV_PLATFORM_NPU_H

#include "kernel_operator.h"

#include "aiv/layouts.h"
#include "aiv/platform.h"

#define AIV_GM __gm__
#define AIV_DEVICE_FN __aicore__ static inline
#define AIV_PLATFORM_NAME "npu"

// Scratch in the unified buffer for the doorbell DMA, kept below SHMEM's reserved top of UB (docs/hardware.md section 2).
#define AIV_NPU_UB_DOORBELL_OFFSET (180u * 1024u)

namespace aiv_platform {

AIV_DEVICE_FN void invalidate_line(const __gm__ void* p) {
    dcci(reinterpret_cast<__gm__ uint64_t*>(const_cast<__gm__ void*>(p)), cache_line_t::SINGLE_CACHE_LINE);
}

AIV_DEVICE_FN uint32_t load_u32(const __gm__ uint32_t* p) {
    invalidate_line(p);
    return *reinterpret_cast<const volatile __gm__ uint32_t*>(p);
}
AIV_DEVICE_FN uint64_t load_u64(const __gm__ uint64_t* p) {
    invalidate_line(p);
    return *reinterpret_cast<const volatile __gm__ uint64_t*>(p);
}
AIV_DEVICE_FN void store_u32(__gm__ uint32_t* p, uint32_t v) {
    *reinterpret_cast<volatile __gm__ uint32_t*>(p) = v;
    dcci(reinterpret_cast<__gm__ uint64_t*>(p), cache_line_t::SINGLE_CACHE_LINE);
}
AIV_DEVICE_FN void store_u64(__gm__ uint64_t* p, uint64_t v) {
    *reinterpret_cast<volatile __gm__ uint64_t*>(p) = v;
    dcci(reinterpret_cast<__gm__ uint64_t*>(p), cache_line_t::SINGLE_CACHE_LINE);
}

AIV_DEVICE_FN void read_bytes(void* dst, const __gm__ void* src, uint32_t n) {
    const __gm__ uint8_t* s = reinterpret_cast<const __gm__ uint8_t*>(src);
    for (uint32_t line = 0; line < n; line += AIV_CACHE_LINE) invalidate_line(s + line);
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    for (uint32_t i = 0; i < n / 4; ++i) d[i] = reinterpret_cast<const volatile __gm__ uint32_t*>(s)[i];
}
AIV_DEVICE_FN void write_bytes(__gm__ void* dst, const void* src, uint32_t n) {
    const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
    for (uint32_t i = 0; i < n / 4; ++i) reinterpret_cast<volatile __gm__ uint32_t*>(dst)[i] = s[i];
}
// SDMA reads HBM, not the AIV data cache: clean what the scalar unit wrote (SHMEM cleans the whole cache).
AIV_DEVICE_FN void flush_for_device(__gm__ void* p, uint32_t) {
    dcci(reinterpret_cast<__gm__ uint64_t*>(p), cache_line_t::ENTIRE_DATA_CACHE);
}

AIV_DEVICE_FN void ring_doorbell(uint64_t, uint64_t sq_reg_base, uint32_t tail) {
    // The register write is a UB->GM DMA (MTE3), not a scalar store (docs/hardware.md section 4).
    __ubuf__ uint32_t* ub = reinterpret_cast<__ubuf__ uint32_t*>(static_cast<uintptr_t>(AIV_NPU_UB_DOORBELL_OFFSET));
    *ub = tail;
    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID0);
    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID0);
    copy_ubuf_to_gm(reinterpret_cast<__gm__ uint32_t*>(sq_reg_base + AIV_SDMA_DOORBELL_OFFSET), ub, 0, 1, 1, 0, 0);
    AscendC::SetFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID0);
    AscendC::WaitFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID0);
    AscendC::PipeBarrier<PIPE_ALL>();
}

AIV_DEVICE_FN uint64_t cycles() { return static_cast<uint64_t>(AscendC::GetSystemCycle()); }

// The NPU core has nothing better to do than poll: waits are plain spins bounded by the caller's budget.
AIV_DEVICE_FN uint32_t wait_token(uint64_t, uint32_t) { return 0; }
AIV_DEVICE_FN void idle(uint64_t, uint32_t, uint32_t, uint32_t) {}

AIV_DEVICE_FN uint32_t block_idx() { return static_cast<uint32_t>(AscendC::GetBlockIdx()); }
AIV_DEVICE_FN uint32_t block_num() { return static_cast<uint32_t>(AscendC::GetBlockNum()); }

}  // namespace aiv_platform

#endif
