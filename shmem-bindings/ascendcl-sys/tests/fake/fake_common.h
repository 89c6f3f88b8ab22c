/*
 * What every fake vendor library of the binding tests shares: the in-memory call log a test reads back with
 * fake_take_log(), the per-function result overrides a test sets with fake_set_result(), and ENTER(...), which logs
 * a call and returns the injected code, if any. Each fake includes this once; FAKE_CODE_TYPE (default int) is the
 * return type of its functions (HCCL's HcclResult is unsigned). Written for this project; not vendor code.
 */
#ifndef AIV_FAKE_COMMON_H
#define AIV_FAKE_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifndef FAKE_CODE_TYPE
#define FAKE_CODE_TYPE int
#endif

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

#define FAKE_MAX_OVERRIDES 32
static struct {
    char name[64];
    FAKE_CODE_TYPE code;
} fake_overrides[FAKE_MAX_OVERRIDES];

/* Makes `function` return `code` from now on (0 restores success); -1 when the table is full. */
EXPORT int fake_set_result(const char *function, FAKE_CODE_TYPE code) {
    for (int i = 0; i < FAKE_MAX_OVERRIDES; i++) {
        if (fake_overrides[i].name[0] == '\0' || strcmp(fake_overrides[i].name, function) == 0) {
            snprintf(fake_overrides[i].name, sizeof fake_overrides[i].name, "%s", function);
            fake_overrides[i].code = code;
            return 0;
        }
    }
    return -1;
}

static FAKE_CODE_TYPE injected(const char *function) {
    for (int i = 0; i < FAKE_MAX_OVERRIDES && fake_overrides[i].name[0] != '\0'; i++) {
        if (strcmp(fake_overrides[i].name, function) == 0) return fake_overrides[i].code;
    }
    return 0;
}

#define ENTER(...)                                   \
    do {                                             \
        fake_log(__VA_ARGS__);                       \
        FAKE_CODE_TYPE code_ = injected(__func__);   \
        if (code_ != 0) return code_;                \
    } while (0)

#endif
