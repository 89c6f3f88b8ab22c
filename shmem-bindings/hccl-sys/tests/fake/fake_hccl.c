/*
 * A fake libhccl.so for the binding tests: the HCCL entry points the project calls, with their C names. Calls are
 * logged (fake_take_log); fake_set_result makes a function return a chosen HcclResult. Written for this project;
 * not vendor code, and it forms no real communicator.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static char log_buffer[1 << 14];
static size_t log_len;

static void fake_log(const char *format, ...) {
    va_list args;
    va_start(args, format);
    int written = vsnprintf(log_buffer + log_len, sizeof log_buffer - log_len, format, args);
    va_end(args);
    if (written > 0 && log_len + (size_t)written + 1 < sizeof log_buffer) {
        log_len += (size_t)written;
        log_buffer[log_len++] = '\n';
        log_buffer[log_len] = '\0';
    }
}

EXPORT size_t fake_take_log(char *out, size_t capacity) {
    size_t n = log_len < capacity - 1 ? log_len : capacity - 1;
    memcpy(out, log_buffer, n);
    out[n] = '\0';
    log_len = 0;
    return n;
}

static struct { char name[64]; unsigned code; } overrides[16];

EXPORT int fake_set_result(const char *function, unsigned code) {
    for (int i = 0; i < 16; i++) {
        if (overrides[i].name[0] == '\0' || strcmp(overrides[i].name, function) == 0) {
            snprintf(overrides[i].name, sizeof overrides[i].name, "%s", function);
            overrides[i].code = code;
            return 0;
        }
    }
    return -1;
}

static unsigned injected(const char *function) {
    for (int i = 0; i < 16 && overrides[i].name[0] != '\0'; i++) {
        if (strcmp(overrides[i].name, function) == 0) return overrides[i].code;
    }
    return 0;
}

#define ENTER(...)                           \
    do {                                     \
        fake_log(__VA_ARGS__);               \
        unsigned code_ = injected(__func__); \
        if (code_ != 0) return code_;        \
    } while (0)

typedef struct { char internal[4108]; } root_info;
typedef struct { uint32_t rank, size; } communicator;
static communicator comms[4];
static int used;

EXPORT unsigned HcclGetRootInfo(root_info *root) {
    ENTER("HcclGetRootInfo");
    memset(root, 0, sizeof *root);
    snprintf(root->internal, sizeof root->internal, "fake-root");
    return 0;
}

EXPORT unsigned HcclCommInitRootInfo(uint32_t n_ranks, const root_info *root, uint32_t rank, void **comm) {
    ENTER("HcclCommInitRootInfo n_ranks=%u root=%s tail=%d rank=%u", n_ranks, root->internal, root->internal[4107], rank);
    if (rank >= n_ranks || strcmp(root->internal, "fake-root") != 0) return 1; /* HCCL_E_PARA */
    if (used == 4) return 3;                                                    /* HCCL_E_MEMORY */
    comms[used] = (communicator){rank, n_ranks};
    *comm = &comms[used++];
    return 0;
}

EXPORT unsigned HcclGetRankId(void *comm, uint32_t *rank) {
    ENTER("HcclGetRankId");
    *rank = ((communicator *)comm)->rank;
    return 0;
}

EXPORT unsigned HcclGetRankSize(void *comm, uint32_t *size) {
    ENTER("HcclGetRankSize");
    *size = ((communicator *)comm)->size;
    return 0;
}

EXPORT unsigned HcclCommDestroy(void *comm) {
    ENTER("HcclCommDestroy");
    return comm ? 0 : 2; /* HCCL_E_PTR */
}
