/*
 * A fake libascendcl.so for the binding tests: the ACL entry points the project calls, with their C names, acting
 * on host memory. Each call is appended to an in-memory log that the test reads back with fake_take_log(); a test
 * makes any function return a chosen code with fake_set_result(). It is written for this project from the
 * prototypes the bindings declare; it is not vendor code and does nothing an NPU does.
 *
 * Deliberately absent: aclrtHostRegister / aclrtHostUnregister (optional symbols, to test the "missing optional"
 * path). Built with -DFAKE_OMIT_MALLOC, aclrtMalloc is absent too (a required symbol, to test that load fails).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static char fake_log_buffer[1 << 16];
static size_t fake_log_len;

static void fake_log(const char *format, ...) {
    va_list args;
    va_start(args, format);
    int written = vsnprintf(fake_log_buffer + fake_log_len, sizeof fake_log_buffer - fake_log_len, format, args);
    va_end(args);
    if (written > 0 && fake_log_len + (size_t)written + 1 < sizeof fake_log_buffer) {
        fake_log_len += (size_t)written;
        fake_log_buffer[fake_log_len++] = '\n';
        fake_log_buffer[fake_log_len] = '\0';
    }
}

/* Copies the log (NUL-terminated, truncated to capacity) and clears it; returns the bytes copied. */
EXPORT size_t fake_take_log(char *out, size_t capacity) {
    size_t n = fake_log_len < capacity - 1 ? fake_log_len : capacity - 1;
    memcpy(out, fake_log_buffer, n);
    out[n] = '\0';
    fake_log_len = 0;
    fake_log_buffer[0] = '\0';
    return n;
}

#define MAX_OVERRIDES 32
static struct { char name[64]; int code; } overrides[MAX_OVERRIDES];

/* Makes `function` return `code` from now on (0 restores success). */
EXPORT int fake_set_result(const char *function, int code) {
    for (int i = 0; i < MAX_OVERRIDES; i++) {
        if (overrides[i].name[0] == '\0' || strcmp(overrides[i].name, function) == 0) {
            snprintf(overrides[i].name, sizeof overrides[i].name, "%s", function);
            overrides[i].code = code;
            return 0;
        }
    }
    return -1;
}

static int injected(const char *function) {
    for (int i = 0; i < MAX_OVERRIDES && overrides[i].name[0] != '\0'; i++) {
        if (strcmp(overrides[i].name, function) == 0) return overrides[i].code;
    }
    return 0;
}

#define ENTER(...)                                  \
    do {                                            \
        fake_log(__VA_ARGS__);                      \
        int code_ = injected(__func__);             \
        if (code_ != 0) return code_;               \
    } while (0)

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

EXPORT int aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, uint32_t kind) {
    ENTER("aclrtMemcpy dest_max=%zu count=%zu kind=%u", dest_max, count, kind);
    if (count > dest_max || kind > 7) return INVALID_PARAM;
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
