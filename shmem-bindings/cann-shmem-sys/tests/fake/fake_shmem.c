/*
 * A fake libshmem.so for the binding tests: the ACLSHMEM host entry points the project calls, with their C names,
 * over a small host-memory arena standing in for the symmetric heap. Calls are logged (fake_take_log) and any
 * int-returning function can be made to fail (fake_set_result). It also exports the host copy of SHMEM's internal
 * state, g_state, with the real member offsets: an initialisation fills mype, npes and (with the SDMA engine) the
 * workspace address set by fake_set_sdma_workspace. Written for this project from the layouts the bindings declare;
 * not vendor code, and it simulates no device, network or peer.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    int version;
    uint32_t data_op_engine_type;
    uint32_t shm_init_timeout;
    uint32_t shm_create_timeout;
    uint32_t control_operation_timeout;
    int32_t sockFd;
} optional_attr;

typedef struct {
    int my_pe;
    int n_pes;
    char ip_port[64];
    uint64_t local_mem_size;
    optional_attr option_attr;
    void *comm_args;
    uint64_t instance_id;
} init_attr;

typedef struct {
    int32_t version;
    int my_pe;
    int n_pes;
    char internal[124];
} unique_id;

_Static_assert(sizeof(init_attr) == 120, "init_attr layout");
_Static_assert(offsetof(init_attr, comm_args) == 104, "init_attr layout");
_Static_assert(sizeof(unique_id) == 136, "unique id layout");

/* SHMEM's internal state struct with the members' C types (see the bindings' device_state module): the fake exports
 * its host copy as `g_state`, as libshmem.so does, unless built with -DFAKE_NO_STATE. */
typedef struct {
    int64_t ub;
    uint32_t ub_size;
    uint32_t sync_id;
} ub_config;

typedef struct {
    int version;
    int mype;
    int npes;
    void *heap_base;
    void *host_heap_base;
    void **heap_base_arrays[6];
    uint8_t topo_list[16384];
    size_t heap_size;
    void *team_pools[2048];
    uint64_t sync_words[4];
    _Bool is_initialized;
    _Bool is_created;
    ub_config engine_configs[4];
    uint64_t qp_info;
    uint64_t sdma_workspace_addr;
    void *profs;
    uint64_t signal_addr;
} device_host_state;

_Static_assert(sizeof(device_host_state) == 32992, "state layout");
_Static_assert(offsetof(device_host_state, npes) == 8, "state layout");
_Static_assert(offsetof(device_host_state, sdma_workspace_addr) == 32968, "state layout");

#include "../../../ascendcl-sys/tests/fake/fake_common.h"

enum { SUCCESS = 0, INVALID_PARAM = -1, INVALID_VALUE = -2, NOT_INITED = -5 };

#define ARENA_BYTES (1 << 20)
#define PE_STRIDE ((uintptr_t)1 << 32) /* where a peer's copy of the heap "lives" in this fake */
static _Alignas(4096) unsigned char arena[ARENA_BYTES];
static size_t arena_used;
static int initialized, my_pe = -1, n_pes;
static unique_id shared_uid;

#define STATE_VERSION ((1 << 16) + (int)sizeof(device_host_state))
#ifndef FAKE_NO_STATE
EXPORT
#endif
device_host_state g_state = {.version = STATE_VERSION, .mype = -1, .npes = -1};
static uint64_t sdma_workspace; /* what an init with the SDMA engine publishes in g_state */

/* The workspace address the next initialisation with the SDMA engine stores in g_state.sdma_workspace_addr (the
 * fake ACL's fake_sdma_workspace builds one). */
EXPORT void fake_set_sdma_workspace(uint64_t address) { sdma_workspace = address; }

/* Overwrites g_state's version word (0 restores the real one), to make the layout look foreign. */
EXPORT void fake_set_state_version(int version) { g_state.version = version ? version : STATE_VERSION; }

/* Overwrites g_state's mype, as if the state belonged to another PE. */
EXPORT void fake_set_state_mype(int mype) { g_state.mype = mype; }

EXPORT int aclshmemx_get_uniqueid(unique_id *uid) {
    ENTER("aclshmemx_get_uniqueid version=%d", uid->version);
    memset(uid->internal, 0, sizeof uid->internal);
    snprintf(uid->internal, sizeof uid->internal, "fake-uid");
    return SUCCESS;
}

EXPORT int aclshmemx_set_attr_uniqueid_args(int pe, int pes, int64_t size, unique_id *uid, init_attr *attr) {
    ENTER("aclshmemx_set_attr_uniqueid_args pe=%d n_pes=%d size=%lld uid=%s attr_version=%d engine=%u timeouts=%u,%u,%u "
          "comm_args=%s instance=%llu",
          pe, pes, (long long)size, uid->internal, attr->option_attr.version, attr->option_attr.data_op_engine_type,
          attr->option_attr.shm_init_timeout, attr->option_attr.shm_create_timeout,
          attr->option_attr.control_operation_timeout, attr->comm_args ? "set" : "null",
          (unsigned long long)attr->instance_id);
    if (pe < 0 || pe >= pes || size <= 0) return INVALID_VALUE;
    shared_uid = *uid;
    attr->my_pe = pe;
    attr->n_pes = pes;
    attr->local_mem_size = (uint64_t)size;
    attr->comm_args = &shared_uid;
    return SUCCESS;
}

EXPORT int aclshmemx_init_attr(unsigned int flags, init_attr *attr) {
    ENTER("aclshmemx_init_attr flags=%u pe=%d n_pes=%d size=%llu comm_args=%s engine=%u", flags, attr->my_pe,
          attr->n_pes, (unsigned long long)attr->local_mem_size, attr->comm_args == &shared_uid ? "uid" : "other",
          attr->option_attr.data_op_engine_type);
    if (flags != (1u << 3) || attr->comm_args != &shared_uid) return INVALID_PARAM;
    initialized = 1;
    my_pe = attr->my_pe;
    n_pes = attr->n_pes;
    arena_used = 0;
    g_state.mype = my_pe;
    g_state.npes = n_pes;
    g_state.is_initialized = 1;
    g_state.sdma_workspace_addr = (attr->option_attr.data_op_engine_type & 0x2) ? sdma_workspace : 0;
    return SUCCESS;
}

static void *bump(size_t alignment, size_t size) {
    if (!initialized || size == 0) return NULL;
    size_t start = (arena_used + alignment - 1) & ~(alignment - 1);
    if (start + size > ARENA_BYTES) return NULL;
    arena_used = start + size;
    return arena + start;
}

EXPORT void *aclshmem_malloc(size_t size) {
    fake_log("aclshmem_malloc size=%zu", size);
    return bump(16, size);
}

EXPORT void *aclshmem_calloc(size_t count, size_t size) {
    fake_log("aclshmem_calloc count=%zu size=%zu", count, size);
    void *p = bump(16, count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

EXPORT void *aclshmem_align(size_t alignment, size_t size) {
    fake_log("aclshmem_align alignment=%zu size=%zu", alignment, size);
    return bump(alignment, size);
}

EXPORT void aclshmem_free(void *ptr) { fake_log("aclshmem_free offset=%td", (unsigned char *)ptr - arena); }

EXPORT void *aclshmem_ptr(void *ptr, int pe) {
    fake_log("aclshmem_ptr offset=%td pe=%d", (unsigned char *)ptr - arena, pe);
    if (!initialized || pe < 0 || pe >= n_pes) return NULL;
    return (void *)((uintptr_t)ptr + (uintptr_t)(pe - my_pe) * PE_STRIDE);
}

EXPORT int aclshmem_my_pe(void) { return initialized ? my_pe : -1; }

EXPORT int aclshmem_n_pes(void) { return initialized ? n_pes : -1; }

EXPORT int aclshmem_finalize(void) {
    ENTER("aclshmem_finalize");
    if (!initialized) return NOT_INITED;
    initialized = 0;
    g_state.is_initialized = 0;
    g_state.sdma_workspace_addr = 0;
    return SUCCESS;
}
