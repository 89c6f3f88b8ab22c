/*
 * A fake libascendcl.so for the binding tests: the ACL entry points the project calls, with their C names, acting
 * on host memory. Each call is appended to an in-memory log that the test reads back with fake_take_log(); a test
 * makes any function return a chosen code with fake_set_result(). It is written for this project from the
 * prototypes the bindings declare; it is not vendor code and does nothing an NPU does.
 *
 * Deliberately absent: aclrtHostRegister / aclrtHostUnregister (optional symbols, to test the "missing optional"
 * path). Built with -DFAKE_OMIT_MALLOC, aclrtMalloc is absent too (a required symbol, to test that load fails).
 * Built with -DFAKE_BACKEND (the root crate's tests/cann_backend.rs), it also has what the CANN device backend calls:
 * Host registration, binary load and launch (logged, never executed: no kernel runs here), and VMM physical memory
 * as memfds mapped into reserved ranges, so an import really aliases the exporter's bytes; fake_sdma_workspace()
 * builds a synthetic SDMA workspace (docs/hardware.md section 4 layout) in host memory, and fake_device_state() fills the
 * device copy of SHMEM's state that D2H reads of its fixed device address return.
 */
#ifdef FAKE_BACKEND
#define _GNU_SOURCE /* memfd_create */
#endif
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FAKE_BACKEND
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

#include "fake_common.h"

enum { OK = 0, INVALID_PARAM = 100000, CONTEXT_NULL = 107002, BAD_ALLOC = 200000 };

static int initialized;
static int current_device = -1;
static int live_streams;
static int next_handle = 1;

EXPORT int aclInit(const char *config) {
    ENTER("aclInit config=%s", config ? config : "null");
    if (initialized) return 100002; /* ACL_ERROR_REPEAT_INITIALIZE */
    initialized = 1;
    return OK;
}

EXPORT int aclFinalize(void) {
    ENTER("aclFinalize");
    initialized = 0;
    return OK;
}

EXPORT int aclrtSetDevice(int32_t device) {
    ENTER("aclrtSetDevice device=%d", device);
    if (!initialized) return 100001; /* ACL_ERROR_UNINITIALIZE */
    if (device < 0 || device > 7) return 107001; /* ACL_ERROR_RT_INVALID_DEVICEID */
    current_device = device;
    return OK;
}

EXPORT int aclrtResetDevice(int32_t device) {
    ENTER("aclrtResetDevice device=%d", device);
    if (device != current_device) return 107001;
    current_device = -1;
    return OK;
}

EXPORT int aclrtGetDevice(int32_t *device) {
    ENTER("aclrtGetDevice");
    if (current_device < 0) return CONTEXT_NULL;
    *device = current_device;
    return OK;
}

EXPORT int aclrtGetDeviceCount(uint32_t *count) {
    ENTER("aclrtGetDeviceCount");
    *count = 8;
    return OK;
}

static int new_stream(void **stream) {
    if (current_device < 0) return CONTEXT_NULL;
    *stream = (void *)(uintptr_t)(0x5000 + next_handle++);
    live_streams++;
    return OK;
}

EXPORT int aclrtCreateStream(void **stream) {
    ENTER("aclrtCreateStream");
    return new_stream(stream);
}

EXPORT int aclrtCreateStreamWithConfig(void **stream, uint32_t priority, uint32_t flag) {
    ENTER("aclrtCreateStreamWithConfig priority=%u flag=%u", priority, flag);
    return new_stream(stream);
}

EXPORT int aclrtSynchronizeStream(void *stream) {
    ENTER("aclrtSynchronizeStream");
    return stream ? OK : INVALID_PARAM;
}

EXPORT int aclrtSynchronizeStreamWithTimeout(void *stream, int32_t timeout) {
    ENTER("aclrtSynchronizeStreamWithTimeout timeout=%d", timeout);
    return stream ? OK : INVALID_PARAM;
}

EXPORT int aclrtDestroyStream(void *stream) {
    ENTER("aclrtDestroyStream");
    if (!stream || live_streams == 0) return INVALID_PARAM;
    live_streams--;
    return OK;
}

#ifndef FAKE_OMIT_MALLOC
EXPORT int aclrtMalloc(void **ptr, size_t size, uint32_t policy) {
    ENTER("aclrtMalloc size=%zu policy=%u", size, policy);
    if (current_device < 0) return CONTEXT_NULL;
    if (size == 0) return INVALID_PARAM;
    *ptr = malloc(size);
    return *ptr ? OK : BAD_ALLOC;
}
#endif

EXPORT int aclrtFree(void *ptr) {
    ENTER("aclrtFree");
    free(ptr);
    return OK;
}

EXPORT int aclrtMallocHost(void **ptr, size_t size) {
    ENTER("aclrtMallocHost size=%zu", size);
    *ptr = malloc(size);
    return *ptr ? OK : BAD_ALLOC;
}

EXPORT int aclrtFreeHost(void *ptr) {
    ENTER("aclrtFreeHost");
    free(ptr);
    return OK;
}

EXPORT int aclrtMemset(void *ptr, size_t max_count, int32_t value, size_t count) {
    ENTER("aclrtMemset max=%zu value=%d count=%zu", max_count, value, count);
    if (count > max_count) return INVALID_PARAM;
    memset(ptr, value, count);
    return OK;
}

#ifdef FAKE_BACKEND
/* The device copy of SHMEM's state lives at a fixed device address (0x17ffbe010000, one 64 KiB context) that is not
 * mapped in a test process; D2H reads of that range are served from this buffer, set by fake_device_state(). */
#define DEVICE_STATE_ADDR 0x17ffbe010000ull
#define DEVICE_STATE_BYTES 65536u
static unsigned char device_state[DEVICE_STATE_BYTES];

/* Fills the device state copy: version, mype, npes at 0, 4, 8 and the SDMA workspace address at 32968 (the
 * offsets of aclshmem_device_host_state_t); everything else zero. All zero: nothing written there yet. */
EXPORT void fake_device_state(int32_t version, int32_t mype, int32_t npes, uint64_t workspace) {
    memset(device_state, 0, sizeof device_state);
    memcpy(device_state, &version, 4);
    memcpy(device_state + 4, &mype, 4);
    memcpy(device_state + 8, &npes, 4);
    memcpy(device_state + 32968, &workspace, 8);
}

/* Where a D2H copy from `src` really reads: the state buffer for the fixed range, else `src` itself; NULL when the
 * copy would cross the end of the fixed range. */
static const void *device_source(const void *src, size_t count, uint32_t kind) {
    uint64_t address = (uint64_t)(uintptr_t)src;
    if (kind != 2 || address < DEVICE_STATE_ADDR || address >= DEVICE_STATE_ADDR + DEVICE_STATE_BYTES) return src;
    if (address - DEVICE_STATE_ADDR + count > DEVICE_STATE_BYTES) return NULL;
    return device_state + (address - DEVICE_STATE_ADDR);
}
#else
static const void *device_source(const void *src, size_t count, uint32_t kind) {
    (void)count;
    (void)kind;
    return src;
}
#endif

EXPORT int aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, uint32_t kind) {
    ENTER("aclrtMemcpy dest_max=%zu count=%zu kind=%u", dest_max, count, kind);
    if (count > dest_max || kind > 7) return INVALID_PARAM;
    src = device_source(src, count, kind);
    if (!src) return INVALID_PARAM;
    memmove(dst, src, count);
    return OK;
}

EXPORT int aclrtMemcpyAsync(void *dst, size_t dest_max, const void *src, size_t count, uint32_t kind, void *stream) {
    ENTER("aclrtMemcpyAsync dest_max=%zu count=%zu kind=%u", dest_max, count, kind);
    if (count > dest_max || kind > 7 || !stream) return INVALID_PARAM;
    memmove(dst, src, count); /* "completes" at once; the test still synchronises as real code must */
    return OK;
}

EXPORT int aclrtGetVersion(int32_t *major, int32_t *minor, int32_t *patch) {
    ENTER("aclrtGetVersion");
    *major = 1;
    *minor = 17;
    *patch = 0;
    return OK;
}

/* Optional symbols present in this fake. */

EXPORT int aclrtCreateNotify(void **notify, uint64_t flag) {
    ENTER("aclrtCreateNotify flag=%llu", (unsigned long long)flag);
    *notify = (void *)(uintptr_t)(0x7000 + next_handle++);
    return OK;
}

EXPORT int aclrtDestroyNotify(void *notify) {
    ENTER("aclrtDestroyNotify");
    return notify ? OK : INVALID_PARAM;
}

EXPORT int aclrtGetNotifyId(void *notify, uint32_t *id) {
    ENTER("aclrtGetNotifyId");
    *id = (uint32_t)((uintptr_t)notify - 0x7000);
    return OK;
}

EXPORT int aclrtIpcMemGetExportKey(void *ptr, size_t size, char *key, size_t len, uint64_t flags) {
    ENTER("aclrtIpcMemGetExportKey size=%zu len=%zu flags=%llu", size, len, (unsigned long long)flags);
    snprintf(key, len, "fake-ipc-%zu", size);
    return ptr ? OK : INVALID_PARAM;
}

EXPORT int aclsysGetCANNVersion(uint32_t name, char *version /* aclCANNPackageVersion: version[128] first */) {
    ENTER("aclsysGetCANNVersion name=%u", name);
    snprintf(version, 128, "8.5.0-fake");
    return OK;
}

#ifdef FAKE_BACKEND
EXPORT int aclrtHostRegister(void *ptr, uint64_t size, uint32_t kind, void **dev_ptr) {
    ENTER("aclrtHostRegister size=%llu kind=%u", (unsigned long long)size, kind);
    if (!ptr || size == 0) return INVALID_PARAM;
    *dev_ptr = ptr; /* the fake's "device" sees host memory at the same address */
    return OK;
}

EXPORT int aclrtHostUnregister(void *ptr) {
    ENTER("aclrtHostUnregister");
    return ptr ? OK : INVALID_PARAM;
}

EXPORT int aclrtBinaryLoadFromData(const void *data, size_t length, const void *options, void **handle) {
    ENTER("aclrtBinaryLoadFromData length=%zu options=%s", length, options ? "set" : "null");
    if (!data || length == 0) return INVALID_PARAM;
    *handle = (void *)(uintptr_t)(0x9000 + next_handle++);
    return OK;
}

EXPORT int aclrtBinaryGetFunction(void *binary, const char *name, void **function) {
    ENTER("aclrtBinaryGetFunction name=%s", name);
    if (!binary || strcmp(name, "aiv_transfer_kernel") != 0) return 107000; /* ACL_ERROR_RT_PARAM_INVALID */
    *function = (void *)(uintptr_t)(0xA000 + next_handle++);
    return OK;
}

typedef struct { uint32_t id; uint32_t value[4]; } launch_attr; /* aclrtLaunchKernelAttr: 20 bytes, value at 4 */
typedef struct { launch_attr *attrs; size_t count; } launch_cfg;

EXPORT int aclrtLaunchKernelWithHostArgs(void *function, uint32_t blocks, void *stream, launch_cfg *cfg, void *args,
                                         size_t args_size, void *placeholders, size_t placeholder_count) {
    unsigned long long arg = 0;
    if (args && args_size >= 8) memcpy(&arg, args, 8);
    uint32_t attr_id = cfg && cfg->count ? cfg->attrs[0].id : 0xffffffffu;
    uint32_t attr_value = cfg && cfg->count ? cfg->attrs[0].value[0] : 0;
    ENTER("aclrtLaunchKernelWithHostArgs blocks=%u attrs=%zu attr0=%u value0=%u args_size=%zu arg=%s placeholders=%zu",
          blocks, cfg ? cfg->count : 0, attr_id, attr_value, args_size, arg ? "kernel_args" : "zero",
          placeholder_count);
    (void)placeholders;
    return function && stream ? OK : INVALID_PARAM;
}

EXPORT int aclrtBinaryUnLoad(void *binary) {
    ENTER("aclrtBinaryUnLoad");
    return binary ? OK : INVALID_PARAM;
}

typedef struct { int fd; size_t size; } physical;
#define MAX_RANGES 64
static struct { void *addr; size_t size; } ranges[MAX_RANGES];

EXPORT int aclrtMallocPhysical(void **handle, size_t size, const uint32_t *prop, uint64_t flags) {
    /* prop: handleType, allocationType, memAttr, location {id, type}, reserve */
    ENTER("aclrtMallocPhysical size=%zu mem_attr=%u location=%u:%u flags=%llu", size, prop[2], prop[3], prop[4],
          (unsigned long long)flags);
    if (current_device < 0) return CONTEXT_NULL;
    int fd = memfd_create("fake-hbm", 0);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) return BAD_ALLOC;
    physical *p = malloc(sizeof *p);
    p->fd = fd;
    p->size = size;
    *handle = p;
    return OK;
}

EXPORT int aclrtFreePhysical(void *handle) {
    ENTER("aclrtFreePhysical");
    physical *p = handle;
    if (!p) return INVALID_PARAM;
    close(p->fd);
    free(p);
    return OK;
}

EXPORT int aclrtReserveMemAddress(void **addr, size_t size, size_t alignment, void *expect, uint64_t flags) {
    ENTER("aclrtReserveMemAddress size=%zu alignment=%zu expect=%s flags=%llu", size, alignment,
          expect ? "set" : "null", (unsigned long long)flags);
    void *range = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (range == MAP_FAILED) return BAD_ALLOC;
    for (int i = 0; i < MAX_RANGES; i++) {
        if (!ranges[i].addr) {
            ranges[i].addr = range;
            ranges[i].size = size;
            *addr = range;
            return OK;
        }
    }
    munmap(range, size);
    return BAD_ALLOC;
}

static int range_index(void *addr) {
    for (int i = 0; i < MAX_RANGES; i++)
        if (ranges[i].addr == addr) return i;
    return -1;
}

EXPORT int aclrtReleaseMemAddress(void *addr) {
    ENTER("aclrtReleaseMemAddress");
    int i = range_index(addr);
    if (i < 0) return INVALID_PARAM;
    munmap(addr, ranges[i].size);
    ranges[i].addr = NULL;
    return OK;
}

EXPORT int aclrtMapMem(void *addr, size_t size, size_t offset, void *handle, uint64_t flags) {
    ENTER("aclrtMapMem size=%zu offset=%zu flags=%llu", size, offset, (unsigned long long)flags);
    physical *p = handle;
    if (!p || range_index(addr) < 0 || offset + size > p->size) return INVALID_PARAM;
    void *mapped = mmap(addr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset);
    return mapped == addr ? OK : BAD_ALLOC;
}

EXPORT int aclrtUnmapMem(void *addr) {
    ENTER("aclrtUnmapMem");
    int i = range_index(addr);
    if (i < 0) return INVALID_PARAM;
    void *again = mmap(addr, ranges[i].size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    return again == addr ? OK : INVALID_PARAM;
}

EXPORT int aclrtMemSetAccess(void *addr, size_t size, const uint32_t *desc, size_t count) {
    /* desc: flags, location {id, type}, rsv[12] */
    ENTER("aclrtMemSetAccess size=%zu count=%zu flags=%u location=%u:%u", size, count, desc[0], desc[1], desc[2]);
    return addr && count ? OK : INVALID_PARAM;
}

EXPORT int aclrtMemExportToShareableHandle(void *handle, uint32_t type, uint64_t flags, uint64_t *shareable) {
    ENTER("aclrtMemExportToShareableHandle type=%u flags=%llu", type, (unsigned long long)flags);
    physical *p = handle;
    if (!p) return INVALID_PARAM;
    *shareable = (uint64_t)p->fd; /* in-process only: the memfd number */
    return OK;
}

EXPORT int aclrtMemImportFromShareableHandle(uint64_t shareable, int32_t device, void **handle) {
    ENTER("aclrtMemImportFromShareableHandle device=%d", device);
    struct stat st;
    int fd = dup((int)shareable);
    if (fd < 0 || fstat(fd, &st) != 0) return INVALID_PARAM;
    physical *p = malloc(sizeof *p);
    p->fd = fd;
    p->size = (size_t)st.st_size;
    *handle = p;
    return OK;
}

/* A synthetic 16 KiB SDMA workspace: flag info {1, blocks}, then one 64-byte channel record per block whose SQ ring
 * is host memory and whose doorbell base is a made-up value nobody dereferences. */
EXPORT void *fake_sdma_workspace(uint32_t blocks, uint32_t depth) {
    unsigned char *workspace = aligned_alloc(4096, 16384);
    memset(workspace, 0, 16384);
    uint32_t flag = 1;
    memcpy(workspace, &flag, 4);
    memcpy(workspace + 4, &blocks, 4);
    for (uint32_t i = 0; i < blocks && i < 48; i++) {
        unsigned char *record = workspace + 64 + 64 * i;
        uint64_t sq_base = (uint64_t)(uintptr_t)calloc(depth, 64);
        uint64_t reg_base = 0xD0000000ull + 0x1000ull * i;
        uint32_t sq_id = 32 + i, cq_id = 64 + i, stream_id = 1000 + i, dev = 0;
        memcpy(record + 8, &sq_base, 8);
        memcpy(record + 16, &reg_base, 8);
        memcpy(record + 24, &depth, 4);
        memcpy(record + 28, &sq_id, 4);
        memcpy(record + 32, &cq_id, 4);
        memcpy(record + 52, &stream_id, 4);
        memcpy(record + 56, &dev, 4);
    }
    return workspace;
}
#endif
