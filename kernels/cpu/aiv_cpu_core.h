/* The C ABI between the CPU model of an AI Vector core (kernels/cpu/aiv_cpu_model.cpp) and the runtime that runs it.
 *
 * The runtime owns device memory (HBM), the register pages and the system counter; the model owns the per-core state
 * (data cache, unified buffer, block index). Each emulated core is one Host thread: before it calls the kernel entry it
 * installs its ops and context with aiv_cpu_core_enter, and it calls aiv_cpu_core_leave when the kernel returns. The
 * installation is thread-local; nothing here is shared between cores except what the runtime shares behind the ops.
 *
 * Device addresses are never dereferenced by the model: every access goes through translate (HBM) or register_write.
 * See docs/ascendc-cpu.md for the semantics and which of them come from public sources.
 */
#ifndef AIV_CPU_CORE_H
#define AIV_CPU_CORE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AIV_CPU_ABI_VERSION 3u

/* What register_write answers. */
#define AIV_CPU_REG_ACCEPTED 0      /* a register took the write */
#define AIV_CPU_REG_REFUSED 1       /* a register page refused it (wrong width or offset); the runtime recorded a
                                       channel exception; the model drops the write */
#define AIV_CPU_REG_NOT_REGISTER 2  /* no register there: the model raises AIV_CPU_FAULT_UNMAPPED */

/* Faults the model raises through ops->fault (the access is then dropped; a load returns zeros). */
#define AIV_CPU_FAULT_UNMAPPED 1       /* a scalar or DMA access outside HBM (and, for DMA writes, outside registers) */
#define AIV_CPU_FAULT_BAD_ARGUMENT 2   /* an intrinsic's argument out of its documented range (burst counts, lengths) */
#define AIV_CPU_FAULT_MISALIGNED 3     /* a documented alignment rule broken (UB operand of a DMA not 32-byte aligned) */
#define AIV_CPU_FAULT_UB_RANGE 4       /* a unified-buffer access outside the core's UB */
#define AIV_CPU_FAULT_UNSUPPORTED 5    /* a mode the modelled chip does not support (dcci CACHELINE_ATOMIC on A2/A3) */
#define AIV_CPU_FAULT_PIPE_ORDER 6     /* a DMA reads UB the scalar unit wrote without a flag or barrier ordering the two,
                                          a scalar access touches UB a pending DMA uses, or a WaitFlag has no SetFlag */

typedef struct AivCpuCoreOps {
    uint32_t abi_version; /* AIV_CPU_ABI_VERSION */
    /* A Host pointer to the HBM backing [device_addr, device_addr + len), or NULL when the range is not wholly device
     * memory. Called for every cache-line fill and write-back and for every DMA burst. */
    void* (*translate)(void* context, uint64_t device_addr, uint64_t len);
    /* A DMA write (UB -> GM) to a range translate refused. The runtime decides whether it is a register and whether
     * the width and offset are right; returns AIV_CPU_REG_*. May be NULL (no registers). */
    int (*register_write)(void* context, uint64_t device_addr, const void* data, uint32_t len);
    /* The system counter (GetSystemCycle). */
    uint64_t (*system_counter)(void* context);
    /* The core has re-read unchanged memory `unchanged_fills` times in a row (it is polling): the runtime may sleep
     * briefly (bounded). May be NULL. */
    void (*idle_hint)(void* context, uint32_t unchanged_fills);
    /* A fault (AIV_CPU_FAULT_*) at device_addr, len bytes. May be NULL. */
    void (*fault)(void* context, uint32_t kind, uint64_t device_addr, uint64_t len);
    /* (ABI 2) The model wrote [device_addr, device_addr + len) of HBM: a UB -> GM burst landed (when its pipe's wait
     * completes it) or a dirty cache line was written back (the bytes written, first to last). Called after the
     * bytes are in HBM and before anything the core does next, so a doorbell rung after it follows it. The twin
     * records from it who wrote each SQ slot. May be NULL. */
    void (*gm_written)(void* context, uint64_t device_addr, uint64_t len);
    /* (ABI 2) The model read `len` bytes of HBM at device_addr, which are now at `data`: a cache-line fill (of a
     * scalar load, or of a store's write-allocate) or a GM -> UB burst. The twin records from it which core first
     * read a completion flag. May be NULL. */
    void (*gm_read)(void* context, uint64_t device_addr, const void* data, uint64_t len);
    /* (ABI 3) A byte the runtime keeps non-zero while it records what gm_written and gm_read report: while it is
     * zero the model makes neither call (they cost the post path). Read with a relaxed atomic load. May be NULL:
     * both are always called. */
    const uint8_t* records_on;
} AivCpuCoreOps;

/* Counters of the calling thread's core since aiv_cpu_core_enter. */
typedef struct AivCpuCoreStats {
    uint64_t scalar_loads;
    uint64_t scalar_stores;
    uint64_t line_fills;          /* cache lines (or their missing bytes) read from HBM */
    uint64_t line_write_backs;    /* dirty cache lines written to HBM by dcci */
    uint64_t dcci_single;
    uint64_t dcci_entire;
    uint64_t dma_bursts_out;      /* UB -> GM bursts (registers included) */
    uint64_t dma_bursts_in;       /* GM -> UB bursts */
    uint64_t faults;
    uint64_t idle_hints;
} AivCpuCoreStats;

/* Installs the calling thread as an emulated core running block `block_idx` of `block_num`: an empty data cache and a
 * zeroed unified buffer. Returns 0, or -1 if ops is NULL, of another ABI version, or lacks translate or
 * system_counter. */
int aiv_cpu_core_enter(const AivCpuCoreOps* ops, void* context, uint32_t block_idx, uint32_t block_num);

/* Uninstalls the calling thread's core. Dirty lines still in its data cache are discarded, not written back (nothing
 * says the hardware writes them back at kernel end); returns how many there were, so a runtime or test can report
 * scalar stores that never reached HBM. */
uint32_t aiv_cpu_core_leave(void);

/* The calling thread's counters (zeros when no core is installed). */
AivCpuCoreStats aiv_cpu_core_stats(void);

/* Number of dirty lines in the calling thread's data cache. */
uint32_t aiv_cpu_core_dirty_lines(void);

#ifdef __cplusplus
}
#endif

#endif
