// The platform layer's byte copies (aiv_platform::read_bytes / write_bytes of kernels/platform/npu.h) on the CPU
// model of AscendC (kernels/cpu/): every length 0 to 67 at every GM alignment 0 to 7 and local alignment 0 to 3,
// each byte checked, and the guard bytes on both sides of the copy checked untouched, in GM and in local memory.
// Run by tests/ascendc_cpu.rs; prints each failure and exits 1, or exits 0.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "platform/npu.h"

namespace {

constexpr uint64_t kHbmBytes = 4096;
constexpr uint32_t kMaxLength = 67;
constexpr uint32_t kGuard = 16;  // guard bytes checked on each side of a copy
constexpr uint32_t kBase = 256;  // GM offset of the copies: 64-byte aligned, guards inside HBM on both sides

struct Hbm {
    uint8_t* bytes = new uint8_t[kHbmBytes]();
    uint64_t dev = 0;  // device address of bytes[0]: a PROT_NONE range, so a dereference faults
    uint32_t faults = 0;
    ~Hbm() { delete[] bytes; }
};

void* op_translate(void* context, uint64_t addr, uint64_t len) {
    Hbm& hbm = *static_cast<Hbm*>(context);
    if (addr < hbm.dev || len > kHbmBytes || addr - hbm.dev > kHbmBytes - len) return nullptr;
    return hbm.bytes + (addr - hbm.dev);
}
uint64_t op_counter(void*) { return 0; }
void op_fault(void* context, uint32_t kind, uint64_t addr, uint64_t len) {
    static_cast<Hbm*>(context)->faults += 1;
    fprintf(stderr, "fault %u at 0x%llx, %llu bytes\n", kind, static_cast<unsigned long long>(addr),
            static_cast<unsigned long long>(len));
}

uint8_t pattern(uint32_t i, uint32_t length, uint32_t alignment) {
    return static_cast<uint8_t>(i * 37u + length * 11u + alignment * 5u + 1u);
}

int failures = 0;
void fail(const char* what, uint32_t length, uint32_t gm_align, uint32_t local_align, uint32_t at) {
    if (failures < 20) {
        fprintf(stderr, "%s: length %u, GM alignment %u, local alignment %u: byte %u\n", what, length, gm_align,
                local_align, at);
    }
    failures += 1;
}

}  // namespace

int main() {
    Hbm hbm;
    void* mapping = mmap(nullptr, kHbmBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) return 2;
    hbm.dev = reinterpret_cast<uintptr_t>(mapping);
    AivCpuCoreOps ops = {};
    ops.abi_version = AIV_CPU_ABI_VERSION;
    ops.translate = op_translate;
    ops.system_counter = op_counter;
    ops.fault = op_fault;
    if (aiv_cpu_core_enter(&ops, &hbm, 0, 1) != 0) return 2;
    // Local memory: 8-byte aligned, the copy at local_align inside it, guards around.
    alignas(8) uint8_t local[kGuard + 8 + kMaxLength + kGuard];
    uint32_t copies = 0;
    for (uint32_t length = 0; length <= kMaxLength; ++length) {
        for (uint32_t gm_align = 0; gm_align < 8; ++gm_align) {
            for (uint32_t local_align = 0; local_align < 4; ++local_align) {
                const uint32_t gm = kBase + gm_align;
                uint8_t* here = local + kGuard + local_align;
                // GM -> local.
                memset(hbm.bytes, 0xEE, kHbmBytes);
                for (uint32_t i = 0; i < length; ++i) hbm.bytes[gm + i] = pattern(i, length, gm_align);
                memset(local, 0xA5, sizeof(local));
                aiv_platform::read_bytes(here, reinterpret_cast<const __gm__ void*>(hbm.dev + gm), length);
                for (uint32_t i = 0; i < length; ++i) {
                    if (here[i] != pattern(i, length, gm_align)) {
                        fail("read_bytes: wrong byte", length, gm_align, local_align, i);
                    }
                }
                for (uint8_t* p = local; p < here; ++p) {
                    if (*p != 0xA5) {
                        fail("read_bytes: guard before", length, gm_align, local_align, uint32_t(p - local));
                    }
                }
                for (uint8_t* p = here + length; p < local + sizeof(local); ++p) {
                    if (*p != 0xA5) fail("read_bytes: guard after", length, gm_align, local_align, uint32_t(p - here));
                }
                // local -> GM, made visible by the platform's flush. The core first drops the lines the read left
                // cached: a line goes out whole, so a stale copy of the guards would be written back with the copy.
                aiv_platform::flush_for_device(reinterpret_cast<__gm__ void*>(hbm.dev + gm), length);
                memset(hbm.bytes, 0x5A, kHbmBytes);
                for (uint32_t i = 0; i < length; ++i) here[i] = pattern(i, length, local_align);
                aiv_platform::write_bytes(reinterpret_cast<__gm__ void*>(hbm.dev + gm), here, length);
                aiv_platform::flush_for_device(reinterpret_cast<__gm__ void*>(hbm.dev + gm), length);
                for (uint32_t i = 0; i < length; ++i) {
                    if (hbm.bytes[gm + i] != pattern(i, length, local_align)) {
                        fail("write_bytes: wrong byte", length, gm_align, local_align, i);
                    }
                }
                for (uint32_t i = gm - kGuard; i < gm; ++i) {
                    if (hbm.bytes[i] != 0x5A) fail("write_bytes: guard before", length, gm_align, local_align, i - gm);
                }
                for (uint32_t i = gm + length; i < gm + length + kGuard; ++i) {
                    if (hbm.bytes[i] != 0x5A) fail("write_bytes: guard after", length, gm_align, local_align, i - gm);
                }
                copies += 2;
            }
        }
    }
    const uint32_t dirty = aiv_cpu_core_leave();
    munmap(mapping, kHbmBytes);
    if (dirty != 0) {
        fprintf(stderr, "%u dirty lines left after the flushes\n", dirty);
        failures += 1;
    }
    if (hbm.faults != 0) failures += 1;
    if (failures != 0) {
        fprintf(stderr, "%d failures in %u copies\n", failures, copies);
        return 1;
    }
    printf("ok: %u copies exact, guards intact\n", copies);
    return 0;
}
