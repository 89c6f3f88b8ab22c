/*
 * A fake libcann_hixl.so for the tests: HiXL's client/server ("CS") entry points with their C names, acting on host
 * memory (in the fakes "device memory" is host memory). Servers live in a table of this process; a client connects
 * to a listening server of the same ip:port whose endpoint list holds the client's remote endpoint; a batch is
 * checked (every remote range inside memory the server registered, every local range inside memory the client
 * registered) and copied with memcpy when it is submitted. Every call is logged (fake_common.h); any call can be
 * made to return a chosen status with fake_set_result(); fake_hixl_set_completion() makes the batches submitted
 * from then on report a chosen HixlCompleteStatus (WAITING = never completes, FAILED, TIMEOUT) without copying.
 * Written for this project from the prototypes in ascendcl_sys::hixl; not vendor code, nothing here is a network.
 */
#define FAKE_CODE_TYPE unsigned int
#include <stdint.h>
#include <stdlib.h>

#include "fake_common.h"

enum { SUCCESS = 0, PARAM_INVALID = 103900, TIMEOUT = 103901, RESOURCE_EXHAUSTED = 203900, FAILED = 503900 };
enum { WAITING = 0, COMPLETED = 1, STATUS_TIMEOUT = 2, STATUS_FAILED = 3 };

typedef struct { int32_t type; uint8_t raws[36]; } comm_addr;
typedef struct { int32_t loc_type; uint8_t raws[60]; } endpoint_loc;
typedef struct { int32_t protocol; comm_addr addr; endpoint_loc loc; uint8_t raws[52]; } endpoint_desc;
typedef struct { int32_t type; void *addr; uint64_t size; } comm_mem;
typedef struct { const char *global_resource_config; uint8_t reserved[120]; } config_t;
typedef struct {
    const endpoint_desc *local_endpoint;
    const endpoint_desc *remote_endpoint;
    const char *server_ip;
    uint32_t server_port;
    uint8_t tc, sl, reserved[98];
} client_desc;
typedef struct {
    const endpoint_desc *endpoint_list;
    const char *server_ip;
    uint32_t server_port;
    uint32_t endpoint_list_num;
    uint8_t reserved[104];
} server_desc;
typedef struct { void *remote_buf; void *local_buf; uint64_t len; } op_desc;

_Static_assert(sizeof(endpoint_desc) == 160, "EndpointDesc layout");
_Static_assert(sizeof(comm_mem) == 24, "CommMem layout");
_Static_assert(sizeof(client_desc) == 128 && sizeof(server_desc) == 128, "desc layouts");
_Static_assert(sizeof(config_t) == 128 && sizeof(op_desc) == 24, "config / op layouts");

#define MAX_MEMS 16
typedef struct { uintptr_t addr; uint64_t size; int live; } region;

static uint32_t phy_id(const endpoint_desc *endpoint) {
    uint32_t id;
    memcpy(&id, endpoint->loc.raws, 4);
    return id;
}

static int inside(const region *mems, uintptr_t addr, uint64_t len) {
    for (int i = 0; i < MAX_MEMS; i++)
        if (mems[i].live && addr >= mems[i].addr && len <= mems[i].size && addr - mems[i].addr <= mems[i].size - len)
            return 1;
    return 0;
}

static int add_region(region *mems, const comm_mem *mem) {
    for (int i = 0; i < MAX_MEMS; i++) {
        if (!mems[i].live) {
            mems[i].addr = (uintptr_t)mem->addr;
            mems[i].size = mem->size;
            mems[i].live = 1;
            return i;
        }
    }
    return -1;
}

#define MAX_SERVERS 8
static struct {
    int live, listening;
    char ip[64];
    uint32_t port;
    uint32_t endpoints[8];
    uint32_t n_endpoints;
    region mems[MAX_MEMS];
} servers[MAX_SERVERS];

#define MAX_CLIENTS 16
static struct {
    int live, connected, server;
    char ip[64];
    uint32_t port, remote_phy_id;
    region mems[MAX_MEMS];
} clients[MAX_CLIENTS];

#define MAX_BATCHES 4096
static struct { int live, client; uint32_t status; } batches[MAX_BATCHES];
static uint32_t next_completion = COMPLETED;

/* Batches submitted from now on report `status` (1 = COMPLETED, the default, copies; others copy nothing). */
EXPORT void fake_hixl_set_completion(uint32_t status) { next_completion = status; }

/* Batches submitted and not yet seen in a final state. */
EXPORT int fake_hixl_pending_batches(void) {
    int n = 0;
    for (int i = 0; i < MAX_BATCHES; i++) n += batches[i].live;
    return n;
}

/* Live clients (created and not destroyed). */
EXPORT int fake_hixl_live_clients(void) {
    int n = 0;
    for (int i = 0; i < MAX_CLIENTS; i++) n += clients[i].live;
    return n;
}

/* Handles are 1-based table indices (never NULL), tagged per kind. */
#define SERVER_HANDLE(i) ((void *)(uintptr_t)(0x51000 + (i)))
#define CLIENT_HANDLE(i) ((void *)(uintptr_t)(0xC1000 + (i)))
#define MEM_HANDLE(owner, i) ((void *)(uintptr_t)(0x3E000000 + (owner) * 0x100 + (i)))
static int server_index(void *h) {
    uintptr_t v = (uintptr_t)h - 0x51000;
    return v < MAX_SERVERS && servers[v].live ? (int)v : -1;
}
static int client_index(void *h) {
    uintptr_t v = (uintptr_t)h - 0xC1000;
    return v < MAX_CLIENTS && clients[v].live ? (int)v : -1;
}

EXPORT uint32_t HixlCSServerCreate(const server_desc *desc, const config_t *config, void **handle) {
    ENTER("HixlCSServerCreate ip=%s port=%u endpoints=%u", desc && desc->server_ip ? desc->server_ip : "null",
          desc ? desc->server_port : 0, desc ? desc->endpoint_list_num : 0);
    if (!desc || !desc->server_ip || !config || !handle || desc->endpoint_list_num == 0 || desc->endpoint_list_num > 8)
        return PARAM_INVALID;
    for (int i = 0; i < MAX_SERVERS; i++) {
        if (!servers[i].live) {
            memset(&servers[i], 0, sizeof servers[i]);
            servers[i].live = 1;
            snprintf(servers[i].ip, sizeof servers[i].ip, "%s", desc->server_ip);
            servers[i].port = desc->server_port;
            servers[i].n_endpoints = desc->endpoint_list_num;
            for (uint32_t e = 0; e < desc->endpoint_list_num; e++) servers[i].endpoints[e] = phy_id(&desc->endpoint_list[e]);
            *handle = SERVER_HANDLE(i);
            return SUCCESS;
        }
    }
    return RESOURCE_EXHAUSTED;
}

EXPORT uint32_t HixlCSServerRegMem(void *server, const char *tag, const comm_mem *mem, void **handle) {
    ENTER("HixlCSServerRegMem tag=%s type=%d size=%llu", tag ? tag : "null", mem ? mem->type : -9,
          mem ? (unsigned long long)mem->size : 0ull);
    int s = server_index(server);
    if (s < 0 || !mem || !mem->addr || mem->size == 0 || !handle) return PARAM_INVALID;
    if (servers[s].listening) return FAILED; /* memory is registered before listening */
    int r = add_region(servers[s].mems, mem);
    if (r < 0) return RESOURCE_EXHAUSTED;
    *handle = MEM_HANDLE(s, r);
    return SUCCESS;
}

EXPORT uint32_t HixlCSServerListen(void *server, uint32_t backlog) {
    ENTER("HixlCSServerListen backlog=%u", backlog);
    int s = server_index(server);
    if (s < 0) return PARAM_INVALID;
    servers[s].listening = 1;
    return SUCCESS;
}

EXPORT uint32_t HixlCSServerUnregMem(void *server, void *mem) {
    ENTER("HixlCSServerUnregMem");
    int s = server_index(server);
    uintptr_t r = (uintptr_t)mem - 0x3E000000 - (uintptr_t)s * 0x100;
    if (s < 0 || r >= MAX_MEMS || !servers[s].mems[r].live) return PARAM_INVALID;
    servers[s].mems[r].live = 0;
    return SUCCESS;
}

EXPORT uint32_t HixlCSServerDestroy(void *server) {
    ENTER("HixlCSServerDestroy");
    int s = server_index(server);
    if (s < 0) return PARAM_INVALID;
    servers[s].live = 0;
    return SUCCESS;
}

EXPORT uint32_t HixlCSClientCreate(const client_desc *desc, const config_t *config, void **handle) {
    ENTER("HixlCSClientCreate ip=%s port=%u local=%u remote=%u", desc && desc->server_ip ? desc->server_ip : "null",
          desc ? desc->server_port : 0, desc && desc->local_endpoint ? phy_id(desc->local_endpoint) : 999,
          desc && desc->remote_endpoint ? phy_id(desc->remote_endpoint) : 999);
    if (!desc || !desc->server_ip || !desc->local_endpoint || !desc->remote_endpoint || !config || !handle)
        return PARAM_INVALID;
    for (int i = 0; i < MAX_CLIENTS; i++) {
        if (!clients[i].live) {
            memset(&clients[i], 0, sizeof clients[i]);
            clients[i].live = 1;
            clients[i].server = -1;
            snprintf(clients[i].ip, sizeof clients[i].ip, "%s", desc->server_ip);
            clients[i].port = desc->server_port;
            clients[i].remote_phy_id = phy_id(desc->remote_endpoint);
            *handle = CLIENT_HANDLE(i);
            return SUCCESS;
        }
    }
    return RESOURCE_EXHAUSTED;
}

EXPORT uint32_t HixlCSClientRegMem(void *client, const char *tag, const comm_mem *mem, void **handle) {
    ENTER("HixlCSClientRegMem tag=%s type=%d size=%llu", tag ? tag : "null", mem ? mem->type : -9,
          mem ? (unsigned long long)mem->size : 0ull);
    int c = client_index(client);
    if (c < 0 || !mem || !mem->addr || mem->size == 0 || !handle) return PARAM_INVALID;
    if (clients[c].connected) return FAILED; /* local memory is registered before connecting */
    int r = add_region(clients[c].mems, mem);
    if (r < 0) return RESOURCE_EXHAUSTED;
    *handle = MEM_HANDLE(MAX_SERVERS + c, r);
    return SUCCESS;
}

EXPORT uint32_t HixlCSClientUnregMem(void *client, void *mem) {
    ENTER("HixlCSClientUnregMem");
    int c = client_index(client);
    uintptr_t r = (uintptr_t)mem - 0x3E000000 - (uintptr_t)(MAX_SERVERS + c) * 0x100;
    if (c < 0 || r >= MAX_MEMS || !clients[c].mems[r].live) return PARAM_INVALID;
    clients[c].mems[r].live = 0;
    return SUCCESS;
}

EXPORT uint32_t HixlCSClientConnect(void *client, uint32_t timeout_ms) {
    ENTER("HixlCSClientConnect timeout=%u", timeout_ms);
    int c = client_index(client);
    if (c < 0) return PARAM_INVALID;
    for (int s = 0; s < MAX_SERVERS; s++) {
        if (!servers[s].live || !servers[s].listening || servers[s].port != clients[c].port ||
            strcmp(servers[s].ip, clients[c].ip) != 0)
            continue;
        for (uint32_t e = 0; e < servers[s].n_endpoints; e++) {
            if (servers[s].endpoints[e] == clients[c].remote_phy_id) {
                clients[c].server = s;
                clients[c].connected = 1;
                return SUCCESS;
            }
        }
    }
    return TIMEOUT; /* nobody listening there: a real client would wait out timeout_ms */
}

static uint32_t batch(const char *what, void *client, uint32_t n, const op_desc *list, void **handle, int put) {
    int c = client_index(client);
    if (c < 0 || !clients[c].connected || n == 0 || !list || !handle) return PARAM_INVALID;
    int s = clients[c].server;
    if (!servers[s].live) return FAILED;
    for (uint32_t i = 0; i < n; i++) {
        if (!inside(servers[s].mems, (uintptr_t)list[i].remote_buf, list[i].len) ||
            !inside(clients[c].mems, (uintptr_t)list[i].local_buf, list[i].len)) {
            fake_log("%s entry %u outside registered memory", what, i);
            return PARAM_INVALID;
        }
    }
    for (int b = 0; b < MAX_BATCHES; b++) {
        if (!batches[b].live) {
            batches[b].live = 1;
            batches[b].client = c;
            batches[b].status = next_completion;
            if (next_completion == COMPLETED) {
                for (uint32_t i = 0; i < n; i++) {
                    if (put) memmove(list[i].remote_buf, list[i].local_buf, list[i].len);
                    else memmove(list[i].local_buf, list[i].remote_buf, list[i].len);
                }
            }
            *handle = (void *)(uintptr_t)(0xB0000000u + (uint32_t)b);
            return SUCCESS;
        }
    }
    return RESOURCE_EXHAUSTED;
}

static unsigned long long total(uint32_t n, const op_desc *list) {
    unsigned long long bytes = 0;
    for (uint32_t i = 0; list && i < n; i++) bytes += list[i].len;
    return bytes;
}

EXPORT uint32_t HixlCSClientBatchPutAsync(void *client, uint32_t n, const op_desc *list, void **handle) {
    ENTER("HixlCSClientBatchPutAsync list_num=%u bytes=%llu", n, total(n, list));
    return batch("HixlCSClientBatchPutAsync", client, n, list, handle, 1);
}

EXPORT uint32_t HixlCSClientBatchGetAsync(void *client, uint32_t n, const op_desc *list, void **handle) {
    ENTER("HixlCSClientBatchGetAsync list_num=%u bytes=%llu", n, total(n, list));
    return batch("HixlCSClientBatchGetAsync", client, n, list, handle, 0);
}

EXPORT uint32_t HixlCSClientQueryCompleteStatus(void *client, void *complete, uint32_t *status) {
    uintptr_t b = (uintptr_t)complete - 0xB0000000u;
    int c = client_index(client);
    if (c < 0 || b >= MAX_BATCHES || !batches[b].live || batches[b].client != c || !status) {
        fake_log("HixlCSClientQueryCompleteStatus bad handle");
        return PARAM_INVALID;
    }
    /* Only final answers are logged: a poll loop would flood the log. */
    if (batches[b].status != WAITING) fake_log("HixlCSClientQueryCompleteStatus status=%u", batches[b].status);
    FAKE_CODE_TYPE code = injected(__func__);
    if (code != 0) return code;
    *status = batches[b].status;
    if (*status != WAITING) batches[b].live = 0; /* a final state releases the handle */
    return SUCCESS;
}

EXPORT uint32_t HixlCSClientDestroy(void *client) {
    ENTER("HixlCSClientDestroy");
    int c = client_index(client);
    if (c < 0) return PARAM_INVALID;
    for (int b = 0; b < MAX_BATCHES; b++)
        if (batches[b].live && batches[b].client == c) batches[b].live = 0;
    clients[c].live = 0;
    return SUCCESS;
}

/* HixlCSClientBatchPutSync / GetSync (optional) are deliberately absent: the missing-optional path. */
