// The launch shim of the twin kernel object: how the twin runtime (shmem-bindings/cann-twin, module `kernel`) runs
// one block of a kernel on an emulated AIV core. It is part of the loadable object the runtime receives from
// aclrtBinaryLoadFromData (kernels/npu/entry.cpp + the CPU model of AscendC + this file), not of the kernel: it holds
// no kernel logic.
//
// An AIV core that raises an exception stops, and the runtime ends the whole launch with an error on its stream (the
// NPU reports a vector-core exception for the task). The model cannot stop a running C++ function by itself, so this
// shim wraps the runtime's ops: the first fault of the core, or any op call once the launch has been aborted (another
// core faulted), returns to the block's start with longjmp, the way a trap ends the core's work. The kernel holds no
// resources that need unwinding (no allocation, no locks: it is device code), so skipping its frames loses nothing
// but the interrupted access.
#include <setjmp.h>
#include <stdint.h>

#include "aiv_cpu_core.h"

namespace {

struct Trap {
    const AivCpuCoreOps* ops;
    void* context;
    const volatile uint32_t* abort;
    jmp_buf at_start;
};

// Each op receives the block's Trap as its context (aiv_twin_run_block installs the core with it): no thread-local
// lookup per call, which in this dlopen'ed object would be a __tls_get_addr call.
Trap& trap_of(void* context) { return *static_cast<Trap*>(context); }

[[noreturn]] void leave_block(Trap& trap) { longjmp(trap.at_start, 1); }

void check_abort(Trap& trap) {
    if (*trap.abort != 0) leave_block(trap);
}

void* trap_translate(void* context, uint64_t addr, uint64_t len) {
    Trap& trap = trap_of(context);
    check_abort(trap);
    return trap.ops->translate(trap.context, addr, len);
}

int trap_register_write(void* context, uint64_t addr, const void* data, uint32_t len) {
    Trap& trap = trap_of(context);
    check_abort(trap);
    if (!trap.ops->register_write) return AIV_CPU_REG_NOT_REGISTER;
    return trap.ops->register_write(trap.context, addr, data, len);
}

uint64_t trap_system_counter(void* context) {
    Trap& trap = trap_of(context);
    return trap.ops->system_counter(trap.context);
}

void trap_idle_hint(void* context, uint32_t unchanged_fills) {
    Trap& trap = trap_of(context);
    check_abort(trap);
    if (trap.ops->idle_hint) trap.ops->idle_hint(trap.context, unchanged_fills);
}

void trap_fault(void* context, uint32_t kind, uint64_t addr, uint64_t len) {
    Trap& trap = trap_of(context);
    if (trap.ops->fault) trap.ops->fault(trap.context, kind, addr, len);
    leave_block(trap);
}

// No abort check: the bytes are already in HBM (or the UB), so the record must be made.
void trap_gm_written(void* context, uint64_t addr, uint64_t len) {
    Trap& trap = trap_of(context);
    if (trap.ops->gm_written) trap.ops->gm_written(trap.context, addr, len);
}

void trap_gm_read(void* context, uint64_t addr, const void* data, uint64_t len) {
    Trap& trap = trap_of(context);
    if (trap.ops->gm_read) trap.ops->gm_read(trap.context, addr, data, len);
}

// The model's table; aiv_twin_run_block copies it per block with the runtime's records_on.
const AivCpuCoreOps kTrapOps = {
    AIV_CPU_ABI_VERSION, trap_translate, trap_register_write, trap_system_counter, trap_idle_hint, trap_fault,
    trap_gm_written,     trap_gm_read,        nullptr,
};

typedef void (*Entry1)(uint64_t);
typedef void (*Entry2)(uint64_t, uint64_t);
typedef void (*Entry3)(uint64_t, uint64_t, uint64_t);
typedef void (*Entry4)(uint64_t, uint64_t, uint64_t, uint64_t);

}  // namespace

extern "C" {

// What aiv_twin_run_block returns.
#define AIV_TWIN_BLOCK_RETURNED 0  // the kernel function returned
#define AIV_TWIN_BLOCK_TRAPPED 1   // the core faulted, or the launch was aborted: the block stopped where it was
#define AIV_TWIN_BLOCK_REFUSED -1  // the core could not be installed, or the arguments are not 1 to 4 words

// Runs block `block_idx` of `block_num` of `entry` (a kernel function of this object whose parameters are
// `nargs` 64-bit words: GM_ADDR pointers) with `args` on the calling thread, installed as an emulated core with
// `ops`/`context`. `*abort` non-zero stops the block at its next access. `*dirty` receives the number of dirty cache
// lines the core still held (scalar stores that never reached memory).
__attribute__((visibility("default"))) int aiv_twin_run_block(const AivCpuCoreOps* ops, void* context,
                                                              uint32_t block_idx, uint32_t block_num,
                                                              const volatile uint32_t* abort, void* entry,
                                                              const uint64_t* args, uint32_t nargs,
                                                              uint32_t* dirty) {
    *dirty = 0;
    if (ops == nullptr || ops->translate == nullptr || ops->system_counter == nullptr || entry == nullptr ||
        abort == nullptr || nargs < 1 || nargs > 4) {
        return AIV_TWIN_BLOCK_REFUSED;
    }
    // On this frame, which outlives every longjmp to it (they happen inside the call below).
    Trap trap;
    trap.ops = ops;
    trap.context = context;
    trap.abort = abort;
    // On this frame too: the model reads it for the whole block.
    AivCpuCoreOps model_ops = kTrapOps;
    model_ops.records_on = ops->records_on;
    if (aiv_cpu_core_enter(&model_ops, &trap, block_idx, block_num) != 0) {
        return AIV_TWIN_BLOCK_REFUSED;
    }
    int outcome = AIV_TWIN_BLOCK_RETURNED;
    if (setjmp(trap.at_start) == 0) {
        switch (nargs) {
            case 1: reinterpret_cast<Entry1>(entry)(args[0]); break;
            case 2: reinterpret_cast<Entry2>(entry)(args[0], args[1]); break;
            case 3: reinterpret_cast<Entry3>(entry)(args[0], args[1], args[2]); break;
            default: reinterpret_cast<Entry4>(entry)(args[0], args[1], args[2], args[3]); break;
        }
    } else {
        outcome = AIV_TWIN_BLOCK_TRAPPED;
    }
    *dirty = aiv_cpu_core_leave();
    return outcome;
}

}
