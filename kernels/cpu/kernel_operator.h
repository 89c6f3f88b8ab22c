// The CPU implementation of the AscendC / CCE subset the NPU platform layer (kernels/platform/npu.h) uses, so that the
// same npu.h and transfer_kernel.h compile with the host C++ compiler and run on an emulated AI Vector core.
//
// Names, parameter order and parameter types follow the public AscendC headers and documentation (docs/hardware.md
// section 9 lists every source); the behaviour is the strict model of docs/ascendc-cpu.md: a per-core, non-coherent,
// write-back data cache for scalar GM access; DMA (UB <-> GM) that bypasses it; register writes checked by the
// runtime. Nothing here has been compared with an NPU.
//
// On the Host, a `__gm__ T*` holds a DEVICE address: it is never dereferenced (device memory is not mapped at its
// device address), only passed to GlobalTensor / the intrinsics below, which reach HBM through the runtime's
// translate op (kernels/cpu/aiv_cpu_core.h). LocalTensor::GetPhyAddr, which a kernel casts to a `__ubuf__ T*` for
// scalar UB access through a pointer and passes to the intrinsics, gives the Host address of the bytes in the core's
// unified buffer (`__ubuf__` is empty here); the intrinsics' UB operands are such addresses or offsets into the UB.
#ifndef AIV_CPU_KERNEL_OPERATOR_H
#define AIV_CPU_KERNEL_OPERATOR_H

#include <stdint.h>
#include <string.h>

#include "aiv_cpu_core.h"

// ---- qualifiers and macros (mirror-cann/asc-devkit impl/basic_api/utils/kernel_utils_macros.h) ----
#define __gm__
#define __ubuf__
#define __aicore__
#define __global__
#define GM_ADDR __gm__ uint8_t*
#define KERNEL_TASK_TYPE_DEFAULT(value)

// ---- CCE enumerations ----
// Pipes, as the CCE builtins name them (the subset PipeBarrier / SetFlag use).
enum pipe_t { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_MTE4, PIPE_MTE5, PIPE_V2, PIPE_FIX };
enum event_t { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };
// dcci modes: values as AscendC's CacheLine / DcciDst (impl/basic_api/kernel_reg.h), which it casts to uint64_t.
enum cache_line_t : uint64_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE = 1 };
enum dcci_dst_t : uint64_t { CACHELINE_ALL = 0, CACHELINE_UB = 1, CACHELINE_OUT = 2, CACHELINE_ATOMIC = 3 };

// ---- CCE intrinsics (implemented by kernels/cpu/aiv_cpu_model.cpp) ----
// Clean (write back dirty data) and invalidate the data cache: the line holding `dst` from `dst` to the line's end
// (SINGLE_CACHE_LINE) or the whole cache (ENTIRE_DATA_CACHE, `dst` ignored).
void dcci(const void* dst, uint64_t entire, uint64_t dst_kind = CACHELINE_ALL);
// UB <-> GM DMA (MTE3 / MTE2): n_burst bursts of len_burst 32-byte blocks, gaps in 32-byte blocks. A UB operand is
// an offset into the core's UB or a LocalTensor::GetPhyAddr address.
void copy_ubuf_to_gm(void* dst, void* src, uint8_t sid, uint16_t n_burst, uint16_t len_burst, uint16_t src_gap,
                     uint16_t dst_gap);
void copy_gm_to_ubuf(void* dst, void* src, uint8_t sid, uint16_t n_burst, uint16_t len_burst, uint16_t src_gap,
                     uint16_t dst_gap);
// UB -> GM DMA with byte-granular bursts (what DataCopyPad uses): len_burst in BYTES, padding in elements, src_gap in
// 32-byte blocks, dst_gap in bytes.
void copy_ubuf_to_gm_align_b8(void* dst, void* src, uint8_t sid, uint16_t n_burst, uint32_t len_burst,
                              uint8_t left_padding, uint8_t right_padding, uint32_t src_gap, uint32_t dst_gap);
void copy_ubuf_to_gm_align_b16(void* dst, void* src, uint8_t sid, uint16_t n_burst, uint32_t len_burst,
                               uint8_t left_padding, uint8_t right_padding, uint32_t src_gap, uint32_t dst_gap);
void copy_ubuf_to_gm_align_b32(void* dst, void* src, uint8_t sid, uint16_t n_burst, uint32_t len_burst,
                               uint8_t left_padding, uint8_t right_padding, uint32_t src_gap, uint32_t dst_gap);
// Pipe synchronisation: DMA bursts run when their pipe is waited for; scalar UB writes must be ordered before the
// DMA that reads them (docs/ascendc-cpu.md).
void set_flag(pipe_t pipe, pipe_t tpipe, event_t event);
void wait_flag(pipe_t pipe, pipe_t tpipe, event_t event);
void pipe_barrier(pipe_t pipe);
int64_t get_block_idx();
int64_t get_block_num();
int64_t get_sys_cnt();

// Scalar access paths of the model (not CCE names): GM through the core's data cache, UB directly.
namespace aiv_cpu {
void gm_load(uint64_t device_addr, void* out, uint32_t n);
void gm_store(uint64_t device_addr, const void* in, uint32_t n);
void ub_load(uint64_t ub_addr, void* out, uint32_t n);
void ub_store(uint64_t ub_addr, const void* in, uint32_t n);
void ub_store_word(uint64_t ub_addr, uint64_t word);  // ub_store of one 8-byte word
// A Host pointer to the core's UB bytes [ub_addr, ub_addr + n) (LocalTensor::GetPhyAddr); a range outside UB
// raises AIV_CPU_FAULT_UB_RANGE and gives nullptr. Accesses through it are not checked against pending DMA: the
// platform gives such pointers only to UB that no DMA uses (the kernel's state area).
void* ub_scalar(uint64_t ub_addr, uint64_t n);

// The inline hit path of GetValue / SetValue. A scalar access within one line that the core's data cache holds
// WHOLLY VALID touches nothing but the cached bytes (as the model's out-of-line path does for such a line: no HBM
// read, no translate), so the header may do it itself. The model keeps `fast` exact: slot (line >> 6) % kFastSlots
// names a line only while that line is cached with every byte valid; every fill installs it, every dcci that
// invalidates any byte of it removes it. A line not named here may still be cached: the out-of-line path decides.
constexpr uint64_t kFastLine = 64;
constexpr uint32_t kFastSlots = 256;
struct FastLine {             // the head of the model's cache line
    uint8_t data[kFastLine];  // what the core holds
    uint64_t dirty;           // bit i: byte i written by this core and not yet cleaned
};
constexpr uint32_t kFastUbBytes = 192u * 1024u;  // TOTAL_UB_SIZE for dav-2201
constexpr uint32_t kUbGranule = 8;                // the unit in which inline UB stores are ordered (see UbArea)
struct FastCache {
    uint64_t tag[kFastSlots];    // line address | 1 (0: empty; a zeroed thread has no hit)
    FastLine* line[kFastSlots];
    uint64_t scalar_loads;       // AivCpuCoreStats counters, kept here so that hits count too
    uint64_t scalar_stores;
    uint32_t unchanged_fills;    // poll detection (model only; a scalar store since the last fill resets it)
};
// The core's unified buffer and the ordering record of the inline path of 8-byte-aligned 8-byte scalar UB stores
// (LocalTensor::SetValue). That path is taken only while no DMA burst is pending (a pending burst may read or write
// any UB byte: the model's out-of-line path checks those accesses), and it records each store for the pipe-order
// check of later bursts as the out-of-line path does: epoch[g] = the current epoch for the 8-byte granule g it wrote,
// where the epoch moves on at every point that orders earlier scalar UB writes before later DMA
// (WaitFlag<S_MTE3/S_MTE2>, PipeBarrier<PIPE_ALL>). A burst whose UB range holds a granule of the current epoch reads
// a store that nothing ordered before it.
// `stamped` is the epoch of the inline path's last store: a burst issued in another epoch finds no granule of its own
// epoch without looking (the kernel orders its stores before each burst, so that is the usual case). 16 bits, as the
// epochs are, and so of no type of the thread-local words below.
struct UbArea {
    uint8_t bytes[kFastUbBytes];
    uint16_t epoch[kFastUbBytes / kUbGranule];
    uint16_t stamped;
};
// The inline UB path's state, as initial-exec TLS words rather than fields behind a pointer: a store into the unified
// buffer cannot alias them (their types differ from the stores'), so the compiler keeps them in registers across the
// stores of an SQE instead of reloading them after each one. ub_area is the installed core's area (null with none);
// ub_inline_epoch is the current epoch (>= 1) while a core is installed and no DMA burst is pending, and 0 otherwise,
// when every UB store takes the out-of-line path.
extern __thread UbArea* ub_area __attribute__((tls_model("initial-exec")));
extern __thread uint32_t ub_inline_epoch __attribute__((tls_model("initial-exec")));
// kFastUbBytes while ub_inline_epoch is not 0, and 0 while it is: the inline path's whole test is ub_addr < limit.
extern __thread uint32_t ub_inline_limit __attribute__((tls_model("initial-exec")));
// The calling thread's table, through an initial-exec TLS pointer: no __tls_get_addr call (and its clobbered
// registers) per access, and only 8 bytes of static TLS, which a shared object loaded later (the twin runtime's
// kernel object, dlopen'ed) may still claim; the 4 KiB table itself is ordinary thread-local storage.
extern __thread FastCache* fast_cache __attribute__((tls_model("initial-exec")));
FastCache& fast_install();  // points fast_cache at this thread's table (out of line; once per thread)
inline FastCache& fast() {
    FastCache* cache = fast_cache;
    return cache ? *cache : fast_install();
}

// Whether [device_addr, device_addr + n) lies in one line named by the hit table; `slot` is its slot.
template <uint32_t n>
inline bool fast_hit(uint64_t device_addr, uint32_t& slot) {
    const uint64_t offset = device_addr & (kFastLine - 1);
    if (offset + n > kFastLine) return false;  // crosses a line: the out-of-line path splits it
    const uint64_t line = device_addr - offset;
    slot = static_cast<uint32_t>(line / kFastLine) & (kFastSlots - 1);
    return fast().tag[slot] == (line | 1);
}
template <typename T>
inline void load(uint64_t device_addr, T* out) {
    uint32_t slot;
    if (fast_hit<sizeof(T)>(device_addr, slot)) {
        memcpy(out, fast().line[slot]->data + (device_addr & (kFastLine - 1)), sizeof(T));
        fast().scalar_loads += 1;
        return;
    }
    gm_load(device_addr, out, sizeof(T));
}
// A scalar store of `in` at UB offset `ub_addr` (LocalTensor::SetValue).
template <typename T>
inline void ub_store_value(uint64_t ub_addr, const T& in) {
    if constexpr (sizeof(T) == kUbGranule) {
        // Read before the branch, so that one read serves every store of a straight-line sequence.
        const uint32_t epoch = ub_inline_epoch;
        const uint32_t limit = ub_inline_limit;
        UbArea* const area = ub_area;
        uint64_t word;
        memcpy(&word, &in, sizeof(T));
        // Expected: the kernel's UB stores are 8-byte words of its stages while no burst is pending, and the layout
        // keeps this path straight-line (the SQE stage is four or eight of them per SQE). One compare per store
        // (the alignment test folds away for the stage's constant offsets): the limit is 0 whenever the epoch is.
        if (__builtin_expect(ub_addr < limit && ub_addr % kUbGranule == 0, 1)) {
            // Stores of types that are neither of the state's (see UbArea). The unified buffer is only ever read
            // back with byte copies, which may alias anything.
            struct Word {
                uint64_t bits;
            };
            struct Stamp {
                uint16_t value;
            };
            reinterpret_cast<Word*>(area->bytes + ub_addr)->bits = word;
            reinterpret_cast<Stamp*>(area->epoch + ub_addr / kUbGranule)->value = static_cast<uint16_t>(epoch);
            area->stamped = static_cast<uint16_t>(epoch);
            return;
        }
        // By value: a word whose address the slow path took would be written to the stack on the fast path too.
        ub_store_word(ub_addr, word);
        return;
    }
    ub_store(ub_addr, &in, sizeof(T));
}
template <typename T>
inline void store(uint64_t device_addr, const T& in) {
    if constexpr (sizeof(T) <= 8) {
        uint32_t slot;
        if (fast_hit<sizeof(T)>(device_addr, slot)) {
            const uint64_t offset = device_addr & (kFastLine - 1);
            FastLine* hit = fast().line[slot];
            memcpy(hit->data + offset, &in, sizeof(T));
            hit->dirty |= ((uint64_t(1) << sizeof(T)) - 1) << offset;
            fast().scalar_stores += 1;  // also what tells the model's poll detection that the core made progress
            return;
        }
    }
    gm_store(device_addr, &in, sizeof(T));
}
}  // namespace aiv_cpu

namespace AscendC {

// impl/basic_api/kernel_event.h, same order.
enum class HardEvent : uint8_t {
    MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, MTE2_V, V_MTE2, MTE3_V, V_MTE3, M_V, V_M, V_V, MTE3_MTE1, MTE1_MTE3,
    MTE1_V, MTE2_M, M_MTE2, V_MTE1, M_FIX, FIX_M, MTE3_MTE2, MTE2_MTE3, S_V, V_S, S_MTE2, MTE2_S, S_MTE3, MTE3_S,
    MTE2_FIX, FIX_MTE2, FIX_S, M_S, FIX_MTE3, MTE1_FIX, FIX_MTE1, FIX_FIX, MAX,
};
// impl/basic_api/kernel_reg.h.
enum class CacheLine : uint64_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class DcciDst : uint64_t { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
// impl/basic_api/common_types.h (the prefix the platform layer needs).
enum class TPosition : uint8_t { GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC };

// The pipes each HardEvent orders (source, destination), for the intrinsic calls below.
constexpr pipe_t hard_event_src(HardEvent e) {
    return e == HardEvent::S_MTE3 || e == HardEvent::S_MTE2 || e == HardEvent::S_V ? PIPE_S
           : e == HardEvent::MTE3_S || e == HardEvent::MTE3_MTE2 || e == HardEvent::MTE3_V ? PIPE_MTE3
           : e == HardEvent::MTE2_S || e == HardEvent::MTE2_MTE3 || e == HardEvent::MTE2_V ? PIPE_MTE2
                                                                                           : PIPE_V;
}
constexpr pipe_t hard_event_dst(HardEvent e) {
    return e == HardEvent::MTE3_S || e == HardEvent::MTE2_S || e == HardEvent::V_S ? PIPE_S
           : e == HardEvent::S_MTE3 || e == HardEvent::MTE2_MTE3 || e == HardEvent::V_MTE3 ? PIPE_MTE3
           : e == HardEvent::S_MTE2 || e == HardEvent::MTE3_MTE2 || e == HardEvent::V_MTE2 ? PIPE_MTE2
                                                                                           : PIPE_V;
}

template <HardEvent event>
__aicore__ inline void SetFlag(int32_t eventID) {
    set_flag(hard_event_src(event), hard_event_dst(event), static_cast<event_t>(eventID));
}
template <HardEvent event>
__aicore__ inline void WaitFlag(int32_t eventID) {
    wait_flag(hard_event_src(event), hard_event_dst(event), static_cast<event_t>(eventID));
}
template <pipe_t pipe>
__aicore__ inline void PipeBarrier() {
    pipe_barrier(pipe);
}

__aicore__ inline int64_t GetBlockIdx() { return get_block_idx(); }
__aicore__ inline int64_t GetBlockNum() { return get_block_num(); }
__aicore__ inline int64_t GetSystemCycle() { return get_sys_cnt(); }

// include/basic_api/kernel_tensor.h: scalar GM access goes through the core's data cache (GetValue / SetValue).
template <typename T>
class GlobalTensor {
public:
    using PrimType = T;
    __aicore__ inline GlobalTensor() {}
    __aicore__ inline void SetGlobalBuffer(__gm__ PrimType* buffer, uint64_t bufferSize) {
        address_ = buffer;
        size_ = bufferSize;
    }
    __aicore__ inline void SetGlobalBuffer(__gm__ PrimType* buffer) { SetGlobalBuffer(buffer, 0); }
    __aicore__ inline const __gm__ PrimType* GetPhyAddr() const { return address_; }
    __aicore__ inline __gm__ PrimType* GetPhyAddr(const uint64_t offset) const { return address_ + offset; }
    __aicore__ inline PrimType GetValue(const uint64_t offset) const {
        PrimType value;
        aiv_cpu::load(device_addr(offset), &value);
        return value;
    }
    __aicore__ inline void SetValue(const uint64_t offset, PrimType value) {
        aiv_cpu::store(device_addr(offset), value);
    }
    __aicore__ inline uint64_t GetSize() const { return size_; }
    __aicore__ inline GlobalTensor operator[](const uint64_t offset) const {
        GlobalTensor t;
        t.SetGlobalBuffer(address_ + offset, size_ > offset ? size_ - offset : 0);
        return t;
    }

private:
    uint64_t device_addr(uint64_t offset) const {
        return reinterpret_cast<uintptr_t>(address_) + offset * sizeof(PrimType);
    }
    __gm__ PrimType* address_ = nullptr;
    uint64_t size_ = 0;
};

// impl/basic_api/kernel_tensor_base.h: a LocalTensor is an address in a local buffer; its `address_` is public and
// SHMEM fills it directly for UB scratch (hicann/shmem src/device/gm2gm/engine/shmem_device_mte.hpp).
struct TBuffAddr {
    uint32_t dataLen;
    uint32_t bufferAddr;
    uint64_t bufferHandle;
    uint8_t logicPos;
};

template <typename T>
class LocalTensor {
public:
    using PrimType = T;
    __aicore__ inline LocalTensor() : address_{} {}
    template <typename S>
    __aicore__ inline void SetValue(const uint32_t index, const S value) const {
        aiv_cpu::ub_store_value(ub_addr(index), static_cast<PrimType>(value));
    }
    __aicore__ inline PrimType GetValue(const uint32_t index) const {
        PrimType v;
        aiv_cpu::ub_load(ub_addr(index), &v, sizeof(PrimType));
        return v;
    }
    // uint64_t, as AscendC's (impl/basic_api/kernel_tensor_impl.h, outside its CPU debug mode), whose GetValue and
    // SetValue dereference it as a `__ubuf__ PrimType*`: here the Host address of the bytes in the core's UB.
    __aicore__ inline uint64_t GetPhyAddr() const {
        return reinterpret_cast<uintptr_t>(aiv_cpu::ub_scalar(address_.bufferAddr, address_.dataLen));
    }

    TBuffAddr address_;

private:
    uint64_t ub_addr(uint32_t index) const { return uint64_t(address_.bufferAddr) + uint64_t(index) * sizeof(PrimType); }
};

// include/basic_api/kernel_struct_data_copy.h (A2/A3 field types): lengths and strides in bytes.
struct DataCopyExtParams {
    __aicore__ DataCopyExtParams() {}
    __aicore__ DataCopyExtParams(const uint16_t count, const uint32_t len, const uint32_t srcStrideIn,
                                 const uint32_t dstStrideIn, const uint32_t rsvIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;
    uint32_t srcStride = 0;
    uint32_t dstStride = 0;
    uint32_t rsv = 0;
};

// UB -> GM with a byte length (DataCopyPad; on dav_c220 it issues copy_ubuf_to_gm_align_b8/b16/b32 by element size,
// impl/basic_api/dav_c220/kernel_operator_data_copy_impl.h).
template <typename T>
__aicore__ inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                                   const DataCopyExtParams& intriParams) {
    void* gm = const_cast<void*>(static_cast<const void*>(dst.GetPhyAddr()));
    void* ub = reinterpret_cast<void*>(static_cast<uintptr_t>(src.GetPhyAddr()));
    static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "DataCopyPad element size");
    if (sizeof(T) == 1) {
        copy_ubuf_to_gm_align_b8(gm, ub, 0, intriParams.blockCount, intriParams.blockLen, 0, 0, intriParams.srcStride,
                                 intriParams.dstStride);
    } else if (sizeof(T) == 2) {
        copy_ubuf_to_gm_align_b16(gm, ub, 0, intriParams.blockCount, intriParams.blockLen, 0, 0, intriParams.srcStride,
                                  intriParams.dstStride);
    } else {
        copy_ubuf_to_gm_align_b32(gm, ub, 0, intriParams.blockCount, intriParams.blockLen, 0, 0, intriParams.srcStride,
                                  intriParams.dstStride);
    }
}

// include/basic_api/kernel_operator_cache_intf.h, DcciGMImpl in impl/basic_api/kernel_reg.h.
template <typename T, CacheLine entireType, DcciDst dcciDst>
__aicore__ inline void DataCacheCleanAndInvalid(const GlobalTensor<T>& dst) {
    dcci(static_cast<const void*>(dst.GetPhyAddr()), static_cast<uint64_t>(entireType), static_cast<uint64_t>(dcciDst));
}
template <typename T, CacheLine entireType>
__aicore__ inline void DataCacheCleanAndInvalid(const GlobalTensor<T>& dst) {
    dcci(static_cast<const void*>(dst.GetPhyAddr()), static_cast<uint64_t>(entireType));
}

}  // namespace AscendC

#endif
