// Platform layer for the Ascend AI Vector cores (AscendC, dav-c220-vec / dav-2201). UNVERIFIED ON HARDWARE: this
// file follows docs/hardware.md sections 2-4 and 9 but has not been compiled with bisheng/ccec or run on an NPU by this
// project yet. The host compiler builds this same file against kernels/cpu/ (the CPU model of the AscendC subset,
// docs/ascendc-cpu.md), so every GM access here goes through an AscendC API, never a raw pointer dereference:
//   scalar GM access   GlobalTensor<T>::GetValue / SetValue (through the core's data cache)
//   cache maintenance  DataCacheCleanAndInvalid<T, CacheLine::..., DcciDst::CACHELINE_OUT> (dcci)
//   UB scratch         a LocalTensor over a fixed UB offset, filled with SetValue (as SHMEM builds its UB scratch)
//   register writes    DataCopyPad UB -> GM with a byte length (as SHMEM rings the STARS doorbell)
//   SQEs               built in a UB stage with scalar UB stores, landed in the SQ with one DataCopyPad per doorbell
//                      (as SHMEM lands its UDMA WQEs; docs/hardware.md section 4)
//   RoCE WQEs          built in UB, one DataCopyPad per WQE; the 64-bit SQ/CQ doorbells one 8-byte DataCopyPad each
//                      (docs/rdma.md)
#ifndef AIV_PLATFORM_NPU_H
#define AIV_PLATFORM_NPU_H

#include "kernel_operator.h"

#include "aiv/layouts.h"
#include "aiv/platform.h"
#include "aiv/roce.h"

#define AIV_GM __gm__
#define AIV_UB __ubuf__
#define AIV_DEVICE_FN __aicore__ static inline
#define AIV_PLATFORM_NAME "npu"

// Scratch in the unified buffer for the doorbell DMA, 32-byte aligned and below SHMEM's reserved top of UB
// (docs/hardware.md section 2).
#define AIV_NPU_UB_DOORBELL_OFFSET (180u * 1024u)
// The SQE stage: AIV_SQE_STAGE_SLOTS SQEs built in UB and landed in the SQ with one UB -> GM DMA (16 KiB at the bottom
// of UB, which nothing else of the kernel uses).
#define AIV_NPU_UB_SQE_STAGE_OFFSET 0u
#define AIV_SQE_STAGE_SLOTS 256u
// The WQE stage of the RDMA route: one 64-byte SQ slot, right above the SQE stage.
#define AIV_NPU_UB_WQE_STAGE_OFFSET (AIV_NPU_UB_SQE_STAGE_OFFSET + AIV_SQE_STAGE_SLOTS * AIV_SQE_BYTES)
// The 64-bit doorbell word of the RDMA route, on its own 32-byte block above the SDMA doorbell's.
#define AIV_NPU_UB_DOORBELL64_OFFSET (AIV_NPU_UB_DOORBELL_OFFSET + 32u)
// The kernel's per-block state (state_area): scalar loads and stores only, never a DMA operand.
#define AIV_NPU_UB_STATE_OFFSET (32u * 1024u)
#define AIV_UB_STATE_BYTES (16u * 1024u)
// UB of an A2/A3 AIV core (TOTAL_UB_SIZE for dav-2201, mirror-cann/asc-devkit
// impl/basic_api/utils/kernel_utils_constants.h), and where CANN SHMEM's own UB buffers begin
// (ACLSHMEM_INTERNAL_UB_BUF_START_ADDR, hicann/shmem include/device/shmem_def.h): the kernel stays below it.
#define AIV_NPU_UB_BYTES (192u * 1024u)
#define AIV_NPU_UB_SHMEM_START (188u * 1024u)
// The UB map (docs/ascendc-cpu.md, "The kernel's UB"): in this order, none overlapping, all below SHMEM's part.
static_assert(AIV_NPU_UB_SQE_STAGE_OFFSET + AIV_SQE_STAGE_SLOTS * AIV_SQE_BYTES <= AIV_NPU_UB_WQE_STAGE_OFFSET,
              "the SQE stage ends before the WQE stage");
static_assert(AIV_NPU_UB_WQE_STAGE_OFFSET + AIV_ROCE_WQE_STRIDE <= AIV_NPU_UB_STATE_OFFSET,
              "the WQE stage ends before the state area");
static_assert(AIV_NPU_UB_STATE_OFFSET + AIV_UB_STATE_BYTES <= AIV_NPU_UB_DOORBELL_OFFSET,
              "the state area ends before the doorbell words");
static_assert(AIV_NPU_UB_DOORBELL64_OFFSET + 32u <= AIV_NPU_UB_SHMEM_START && AIV_NPU_UB_SHMEM_START <= AIV_NPU_UB_BYTES,
              "the doorbell words end below SHMEM's UB buffers, inside UB");
static_assert(AIV_NPU_UB_WQE_STAGE_OFFSET % 32u == 0 && AIV_NPU_UB_STATE_OFFSET % 32u == 0 &&
                  AIV_NPU_UB_DOORBELL_OFFSET % 32u == 0 && AIV_NPU_UB_DOORBELL64_OFFSET % 32u == 0,
              "UB operands of DMA are 32-byte aligned");

namespace aiv_platform {

template <typename T>
AIV_DEVICE_FN AscendC::GlobalTensor<T> gm_tensor(const __gm__ T* p) {
    AscendC::GlobalTensor<T> tensor;
    tensor.SetGlobalBuffer(const_cast<__gm__ T*>(p));
    return tensor;
}

// Clean and invalidate from `p` to the end of its cache line (SINGLE_CACHE_LINE covers only that part of an unaligned
// line, docs/hardware.md section 9).
AIV_DEVICE_FN void dcci_line(const __gm__ void* p) {
    AscendC::DataCacheCleanAndInvalid<uint8_t, AscendC::CacheLine::SINGLE_CACHE_LINE, AscendC::DcciDst::CACHELINE_OUT>(
        gm_tensor(reinterpret_cast<const __gm__ uint8_t*>(p)));
}
// Every line of [p, p + n), the first from p itself.
AIV_DEVICE_FN void dcci_range(const __gm__ void* p, uint32_t n) {
    const uint64_t start = reinterpret_cast<uint64_t>(p);
    dcci_line(p);
    for (uint64_t line = (start & ~uint64_t(AIV_CACHE_LINE - 1)) + AIV_CACHE_LINE; line < start + n;
         line += AIV_CACHE_LINE) {
        dcci_line(reinterpret_cast<const __gm__ void*>(line));
    }
}

AIV_DEVICE_FN uint32_t load_u32(const __gm__ uint32_t* p) {
    dcci_line(p);
    return gm_tensor(p).GetValue(0);
}
// A scalar load through the data cache with no invalidate first: the core's cached copy when it holds the line, else
// a fill from GM. Only the cache probe (aiv/cache_probe.h) reads this way; everything else reads what another agent
// writes with load_u32 / load_u64.
AIV_DEVICE_FN uint32_t load_u32_cached(const __gm__ uint32_t* p) { return gm_tensor(p).GetValue(0); }
AIV_DEVICE_FN uint64_t load_u64(const __gm__ uint64_t* p) {
    dcci_line(p);
    return gm_tensor(p).GetValue(0);
}
AIV_DEVICE_FN void store_u32(__gm__ uint32_t* p, uint32_t v) {
    gm_tensor(p).SetValue(0, v);
    dcci_line(p);
}
AIV_DEVICE_FN void store_u64(__gm__ uint64_t* p, uint64_t v) {
    gm_tensor(p).SetValue(0, v);
    dcci_line(p);
}

// Byte copies between GM and the core's own memory, exact for every length and every GM alignment: the bytes before
// the first 4-byte-aligned GM word and after the last whole one move one scalar byte access each, the words between
// one aligned scalar word access each; never an unaligned word access. The local side is filled and read with byte
// stores and loads (char may alias anything: the words land in the caller's struct without type punning, which an
// optimising compiler is free to reorder around the struct's own field accesses). Every length, rather than lengths
// refused at compile time unless a multiple of 4: the callers' structs are word-aligned and word-sized, where the
// head and the tail cost one test each, and a caller copying anything else gets its bytes instead of a build error
// it has to work around.
AIV_DEVICE_FN uint32_t gm_word_head(const __gm__ void* p, uint32_t n) {
    const uint32_t head = static_cast<uint32_t>(-reinterpret_cast<uint64_t>(p)) & 3u;
    return head < n ? head : n;
}
AIV_DEVICE_FN void read_bytes(void* dst, const __gm__ void* src, uint32_t n) {
    if (n == 0) return;
    dcci_range(src, n);
    const __gm__ uint8_t* s = reinterpret_cast<const __gm__ uint8_t*>(src);
    AscendC::GlobalTensor<uint8_t> bytes = gm_tensor(s);
    uint8_t* d = reinterpret_cast<uint8_t*>(dst);
    const uint32_t head = gm_word_head(src, n);
    const uint32_t words = (n - head) >> 2;
    for (uint32_t i = 0; i < head; ++i) d[i] = bytes.GetValue(i);
    AscendC::GlobalTensor<uint32_t> w = gm_tensor(reinterpret_cast<const __gm__ uint32_t*>(s + head));
    uint8_t* out = d + head;
    for (uint32_t i = 0; i < words; ++i) {
        const uint32_t v = w.GetValue(i);
        for (uint32_t k = 0; k < 4; ++k) out[4 * i + k] = static_cast<uint8_t>(v >> (8 * k));
    }
    for (uint32_t i = head + (words << 2); i < n; ++i) d[i] = bytes.GetValue(i);
}
// Stays in the data cache until flush_for_device (or a dcci of its lines).
AIV_DEVICE_FN void write_bytes(__gm__ void* dst, const void* src, uint32_t n) {
    if (n == 0) return;
    __gm__ uint8_t* d = reinterpret_cast<__gm__ uint8_t*>(dst);
    AscendC::GlobalTensor<uint8_t> bytes = gm_tensor(d);
    // Little-endian words, as the AIV core and the layouts are.
    const uint8_t* s = reinterpret_cast<const uint8_t*>(src);
    const uint32_t head = gm_word_head(dst, n);
    const uint32_t words = (n - head) >> 2;
    for (uint32_t i = 0; i < head; ++i) bytes.SetValue(i, s[i]);
    AscendC::GlobalTensor<uint32_t> w = gm_tensor(reinterpret_cast<const __gm__ uint32_t*>(d + head));
    const uint8_t* in = s + head;
    for (uint32_t i = 0; i < words; ++i) {
        uint32_t v = 0;
        for (uint32_t k = 0; k < 4; ++k) v |= static_cast<uint32_t>(in[4 * i + k]) << (8 * k);
        w.SetValue(i, v);
    }
    for (uint32_t i = head + (words << 2); i < n; ++i) bytes.SetValue(i, s[i]);
}
// SDMA and the Host read HBM, not the AIV data cache: clean what the scalar unit wrote. SHMEM cleans the whole data
// cache before ringing (docs/hardware.md section 4, post step 3).
AIV_DEVICE_FN void flush_for_device(__gm__ void* p, uint32_t) {
    AscendC::DataCacheCleanAndInvalid<uint8_t, AscendC::CacheLine::ENTIRE_DATA_CACHE, AscendC::DcciDst::CACHELINE_OUT>(
        gm_tensor(reinterpret_cast<const __gm__ uint8_t*>(p)));
}

// Builds SQE `sqe` in slot `slot` (< AIV_SQE_STAGE_SLOTS) of the UB stage with scalar UB stores. The stage must not
// be rewritten while a land_sqes DMA reads it: land_sqes waits for its DMA before it returns. With `whole` false only
// the words holding task_id, length and the two addresses (0, 3, 4 and 5) are written: the caller knows the slot
// already holds an SQE whose other words (1, 2, 6 and 7) equal this one's.
AIV_DEVICE_FN void stage_sqe(uint32_t slot, const AivSdmaSqe& sqe, bool whole) {
    AscendC::LocalTensor<uint64_t> ub;
    ub.address_.logicPos = static_cast<uint8_t>(AscendC::TPosition::VECIN);
    ub.address_.bufferAddr = AIV_NPU_UB_SQE_STAGE_OFFSET + slot * AIV_SQE_BYTES;
    ub.address_.dataLen = AIV_SQE_BYTES;
    // The eight little-endian words of the layout, composed from the fields (the offsets are checked below and by
    // the layout probe): a word read back from the struct in memory would be type punning, and a byte copy of it
    // stalls on the narrower stores that built it.
    const uint64_t words[AIV_SQE_BYTES / 8] = {
        uint64_t(sqe.type_word) | uint64_t(sqe.block_dim) << 16 | uint64_t(sqe.rt_stream_id) << 32 |
            uint64_t(sqe.task_id) << 48,
        uint64_t(sqe.reserved0) | uint64_t(sqe.reserved1) << 32 | uint64_t(sqe.kernel_credit) << 48 |
            uint64_t(sqe.ptr_mode) << 56,
        uint64_t(sqe.opcode_word) | uint64_t(sqe.src_stream_id) << 32 | uint64_t(sqe.src_sub_stream_id) << 48,
        uint64_t(sqe.dst_stream_id) | uint64_t(sqe.dst_sub_stream_id) << 16 | uint64_t(sqe.length) << 32,
        uint64_t(sqe.src_addr_low) | uint64_t(sqe.src_addr_high) << 32,
        uint64_t(sqe.dst_addr_low) | uint64_t(sqe.dst_addr_high) << 32,
        uint64_t(sqe.link_type) | uint64_t(sqe.reserved2[0]) << 8 | uint64_t(sqe.reserved2[1]) << 16 |
            uint64_t(sqe.reserved2[2]) << 24 | uint64_t(sqe.reserved3[0]) << 32,
        uint64_t(sqe.reserved3[1]) | uint64_t(sqe.reserved3[2]) << 32,
    };
    static_assert(__builtin_offsetof(AivSdmaSqe, task_id) == 6 && __builtin_offsetof(AivSdmaSqe, ptr_mode) == 15 &&
                      __builtin_offsetof(AivSdmaSqe, src_sub_stream_id) == 22 && __builtin_offsetof(AivSdmaSqe, length) == 28 &&
                      __builtin_offsetof(AivSdmaSqe, dst_addr_high) == 44 && __builtin_offsetof(AivSdmaSqe, reserved3) == 52 &&
                      sizeof(AivSdmaSqe) == AIV_SQE_BYTES,
                  "stage_sqe composes the words of this layout");
    // Separate statements, not a loop: the words stay in registers.
    ub.SetValue(0, words[0]);
    ub.SetValue(3, words[3]);
    ub.SetValue(4, words[4]);
    ub.SetValue(5, words[5]);
    if (whole) {
        ub.SetValue(1, words[1]);
        ub.SetValue(2, words[2]);
        ub.SetValue(6, words[6]);
        ub.SetValue(7, words[7]);
    }
}

// Lands stage slots [0, count) in the SQ at `dst` with one UB -> GM DMA, ordered after the scalar stores that built
// them, and waits for it: the SQEs are in HBM before anything the kernel issues next (the doorbell above all) and the
// stage may be rebuilt. DMA does not go through the data cache, so no cache maintenance is needed for the SQ.
AIV_DEVICE_FN void land_sqes(AIV_GM void* dst, uint32_t count) {
    AscendC::LocalTensor<uint32_t> ub;
    ub.address_.logicPos = static_cast<uint8_t>(AscendC::TPosition::VECIN);
    ub.address_.bufferAddr = AIV_NPU_UB_SQE_STAGE_OFFSET;
    ub.address_.dataLen = count * AIV_SQE_BYTES;
    AscendC::GlobalTensor<uint32_t> sq;
    sq.SetGlobalBuffer(reinterpret_cast<__gm__ uint32_t*>(dst));
    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID1);
    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID1);
    AscendC::DataCopyPad(sq, ub, AscendC::DataCopyExtParams{1, count * AIV_SQE_BYTES, 0, 0, 0});
    AscendC::SetFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID1);
    AscendC::WaitFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID1);
}

// The doorbell: one 4-byte UB -> GM DMA of the tail to sq_reg_base + 0x8, as SHMEM's aclshmemi_set_value does it
// (DataCopyPad with DataCopyExtParams{1, sizeof(uint32_t), 0, 0, 0}: one burst of 4 BYTES; docs/hardware.md section 9).
// The same UB word then lands in the channel record's software tail (`record_tail`) with a second 4-byte DMA, so
// that the record line never enters the data cache dirty.
AIV_DEVICE_FN void ring_doorbell(uint64_t, uint64_t sq_reg_base, uint32_t tail, AIV_GM uint32_t* record_tail) {
    AscendC::LocalTensor<uint32_t> ub;
    ub.address_.logicPos = static_cast<uint8_t>(AscendC::TPosition::VECIN);
    ub.address_.bufferAddr = AIV_NPU_UB_DOORBELL_OFFSET;
    ub.address_.dataLen = sizeof(uint32_t);
    AscendC::GlobalTensor<uint32_t> reg;
    reg.SetGlobalBuffer(reinterpret_cast<__gm__ uint32_t*>(sq_reg_base + AIV_SDMA_DOORBELL_OFFSET));
    ub.SetValue(0, tail);
    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID0);
    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID0);
    AscendC::DataCopyPad(reg, ub, AscendC::DataCopyExtParams{1, sizeof(uint32_t), 0, 0, 0});
    AscendC::GlobalTensor<uint32_t> record;
    record.SetGlobalBuffer(record_tail);
    AscendC::DataCopyPad(record, ub, AscendC::DataCopyExtParams{1, sizeof(uint32_t), 0, 0, 0});
    // The UB word is rewritten by the next doorbell: the copy must have read it first.
    AscendC::SetFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID0);
    AscendC::WaitFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID0);
    AscendC::PipeBarrier<PIPE_ALL>();
}

// Writes one RoCE SQ slot (AIV_ROCE_WQE_STRIDE bytes: the WQE, its SGE, zeros) at `slot`: built in the UB WQE stage
// with scalar UB stores, landed with one UB -> GM DMA ordered after them, and waited for, so the WQE is in HBM
// before the doorbell that announces it (as SHMEM's on-die RDMA backend builds its WQEs in UB; docs/rdma.md).
AIV_DEVICE_FN void post_wqe(AIV_GM void* slot, const AivRoceWqe& wqe, const AivRoceSge& sge) {
    AscendC::LocalTensor<uint64_t> ub;
    ub.address_.logicPos = static_cast<uint8_t>(AscendC::TPosition::VECIN);
    ub.address_.bufferAddr = AIV_NPU_UB_WQE_STAGE_OFFSET;
    ub.address_.dataLen = AIV_ROCE_WQE_STRIDE;
    static_assert(__builtin_offsetof(AivRoceWqe, msg_len) == 4 && __builtin_offsetof(AivRoceWqe, byte16) == 12 &&
                      __builtin_offsetof(AivRoceWqe, rkey) == 20 && __builtin_offsetof(AivRoceWqe, va) == 24 &&
                      sizeof(AivRoceWqe) == 32 && __builtin_offsetof(AivRoceSge, lkey) == 4 &&
                      __builtin_offsetof(AivRoceSge, addr) == 8 && sizeof(AivRoceSge) == 16 &&
                      AIV_ROCE_WQE_STRIDE == 64,
                  "post_wqe composes the words of these layouts");
    ub.SetValue(0, uint64_t(wqe.byte4) | uint64_t(wqe.msg_len) << 32);
    ub.SetValue(1, uint64_t(wqe.immt_data) | uint64_t(wqe.byte16) << 32);
    ub.SetValue(2, uint64_t(wqe.byte20) | uint64_t(wqe.rkey) << 32);
    ub.SetValue(3, wqe.va);
    ub.SetValue(4, uint64_t(sge.len) | uint64_t(sge.lkey) << 32);
    ub.SetValue(5, sge.addr);
    ub.SetValue(6, uint64_t(0));
    ub.SetValue(7, uint64_t(0));
    AscendC::GlobalTensor<uint64_t> sq;
    sq.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(slot));
    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID2);
    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID2);
    AscendC::DataCopyPad(sq, ub, AscendC::DataCopyExtParams{1, AIV_ROCE_WQE_STRIDE, 0, 0, 0});
    AscendC::SetFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID2);
    AscendC::WaitFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID2);
}

// A 64-bit doorbell (the RoCE SQ and CQ doorbells): one 8-byte UB -> GM DMA of `word` to the register at `reg`,
// ordered after the scalar UB store of the word and waited for (the UB word is rewritten by the next one).
AIV_DEVICE_FN void ring_doorbell_64(uint64_t reg, uint64_t word) {
    AscendC::LocalTensor<uint64_t> ub;
    ub.address_.logicPos = static_cast<uint8_t>(AscendC::TPosition::VECIN);
    ub.address_.bufferAddr = AIV_NPU_UB_DOORBELL64_OFFSET;
    ub.address_.dataLen = sizeof(uint64_t);
    AscendC::GlobalTensor<uint64_t> doorbell;
    doorbell.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(reg));
    ub.SetValue(0, word);
    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID3);
    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID3);
    AscendC::DataCopyPad(doorbell, ub, AscendC::DataCopyExtParams{1, sizeof(uint64_t), 0, 0, 0});
    AscendC::SetFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID3);
    AscendC::WaitFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID3);
}

// The kernel's per-block state area: AIV_UB_STATE_BYTES of UB at AIV_NPU_UB_STATE_OFFSET, for scalar loads and stores
// through the pointer, as AscendC's own LocalTensor::GetValue / SetValue reach UB: a `__ubuf__` pointer cast from
// GetPhyAddr() (mirror-cann/asc-devkit impl/basic_api/kernel_tensor_impl.h). Uninitialised: the kernel writes what it
// reads. Unverified on hardware.
AIV_DEVICE_FN AIV_UB uint8_t* state_area() {
    AscendC::LocalTensor<uint8_t> ub;
    ub.address_.logicPos = static_cast<uint8_t>(AscendC::TPosition::VECCALC);
    ub.address_.bufferAddr = AIV_NPU_UB_STATE_OFFSET;
    ub.address_.dataLen = AIV_UB_STATE_BYTES;
    return reinterpret_cast<AIV_UB uint8_t*>(ub.GetPhyAddr());
}

AIV_DEVICE_FN uint64_t cycles() { return static_cast<uint64_t>(AscendC::GetSystemCycle()); }

// The NPU core has nothing better to do than poll: waits are plain spins bounded by the caller's budget. (On the CPU
// model the back-off lives in the model: repeated refills of unchanged lines call the runtime's idle hint.)
AIV_DEVICE_FN uint32_t wait_token(uint64_t, uint32_t) { return 0; }
AIV_DEVICE_FN void idle(uint64_t, uint32_t, uint32_t, uint32_t) {}

AIV_DEVICE_FN uint32_t block_idx() { return static_cast<uint32_t>(AscendC::GetBlockIdx()); }
AIV_DEVICE_FN uint32_t block_num() { return static_cast<uint32_t>(AscendC::GetBlockNum()); }

}  // namespace aiv_platform

#endif
