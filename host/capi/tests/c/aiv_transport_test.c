/*
 * The C test program of libaiv_transport.so (built and run by tests/capi.rs). One case per run:
 *
 *   aiv_transport_test transfers <seed>    two processes (this one and a forked target, each with its own engine
 *                                          and device, P2P handshake on 127.0.0.1): reads and writes of random
 *                                          sizes and offsets between device buffers over protocol aiv, each checked
 *                                          by checksum on both sides, and each batch's evidence (AIV-direct)
 *   aiv_transport_test errors              the documented codes and messages of wrong calls
 *   aiv_transport_test peer-killed         the target is SIGKILLed with a batch in flight: the batch, and a batch
 *                                          submitted after, finish as failed or timed out within the transfer
 *                                          timeout
 *   aiv_transport_test host-target         a transfer whose remote range is Host memory the target registered
 *                                          (AIV_MEM_HOST) but could not export (the twin device backend exports
 *                                          no Host memory) fails with AIV_ERR_INVALID_ARGUMENT naming the cause,
 *                                          and the next transfer to the target's device memory completes
 *
 * The target is forked before any library call, so no thread of the library crosses the fork. The two processes
 * talk over a pair of pipes, one line per command and reply. Exit status 0: the case passed; otherwise a message
 * on stderr says which check failed.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "aiv_transport.h"

#define BUFFER_BYTES (16u << 20)
#define TRANSFER_TIMEOUT_MS 5000

static const char *role = "initiator";

static void fail(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fprintf(stderr, "FAILED (%s): ", role);
    vfprintf(stderr, format, args);
    fprintf(stderr, "\n");
    va_end(args);
    exit(1);
}

/* Asserts that a call returned `expected`; on failure prints the call, both codes and the last error. */
#define EXPECT(expected, call)                                                                                    \
    do {                                                                                                          \
        int got_ = (call);                                                                                        \
        if (got_ != (expected)) {                                                                                 \
            fail("%s:%d: %s returned %d, expected %d (last error: %s)", __FILE__, __LINE__, #call, got_,        \
                 (expected), aiv_last_error());                                                                   \
        }                                                                                                         \
    } while (0)
#define CHECK(call) EXPECT(AIV_OK, call)

/* Asserts that the last error mentions `text`. */
static void expect_message(const char *text, int line) {
    if (strstr(aiv_last_error(), text) == NULL) {
        fail("line %d: the last error does not mention \"%s\": %s", line, text, aiv_last_error());
    }
}
#define EXPECT_MESSAGE(text) expect_message((text), __LINE__)

/* xorshift64*: the test's random numbers and data, reproducible from a seed. */
static uint64_t next_random(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static void fill_random(uint8_t *bytes, size_t length, uint64_t seed) {
    uint64_t state = seed | 1;
    for (size_t i = 0; i < length; i++) {
        bytes[i] = (uint8_t)(next_random(&state) >> 56);
    }
}

/* FNV-1a, 64 bits. */
static uint64_t checksum(const uint8_t *bytes, size_t length) {
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < length; i++) {
        hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
    }
    return hash;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *xmalloc(size_t length) {
    void *p = malloc(length ? length : 1);
    if (p == NULL) {
        fail("out of Host memory (%zu bytes)", length);
    }
    return p;
}

static aiv_engine_t *create_engine(void) {
    char config[512];
    snprintf(config, sizeof config,
             "{\"local_hostname\": \"127.0.0.1\", \"metadata_server\": \"P2PHANDSHAKE\", "
             "\"aiv\": {\"device_id\": 0, \"transfer_timeout_ms\": %d, \"hbm_size\": \"64MiB\"}}",
             TRANSFER_TIMEOUT_MS);
    aiv_engine_t *engine = NULL;
    CHECK(aiv_engine_create(config, &engine));
    if (engine == NULL) {
        fail("aiv_engine_create returned AIV_OK and no engine");
    }
    return engine;
}

/* A device buffer of BUFFER_BYTES, registered as device memory. */
static uint64_t device_buffer(aiv_engine_t *engine) {
    uint64_t addr = 0;
    CHECK(aiv_device_alloc(engine, BUFFER_BYTES, &addr));
    CHECK(aiv_register(engine, addr, BUFFER_BYTES, AIV_MEM_DEVICE));
    return addr;
}

/* ----- The target process ----- */

static FILE *commands_in, *replies_out;

static void reply(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vfprintf(replies_out, format, args);
    va_end(args);
    fflush(replies_out);
}

/* Serves the initiator's commands until it closes the pipe or says quit:
 *   fill <offset> <length> <seed>   writes seeded random bytes into the buffer; replies "ok <checksum>"
 *   sum <offset> <length>           replies "ok <checksum>" of the buffer's bytes
 *   host                            registers a page of Host memory (AIV_MEM_HOST); replies "ok <address>" */
static int target_main(int command_fd, int reply_fd) {
    role = "target";
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    commands_in = fdopen(command_fd, "r");
    replies_out = fdopen(reply_fd, "w");
    if (commands_in == NULL || replies_out == NULL) {
        fail("fdopen: %s", strerror(errno));
    }
    aiv_engine_t *engine = create_engine();
    uint64_t buffer = device_buffer(engine);
    uint8_t *host = xmalloc(BUFFER_BYTES);
    fill_random(host, BUFFER_BYTES, 0xdecafbad);
    CHECK(aiv_copy_to_device(engine, buffer, host, BUFFER_BYTES));
    char *name = NULL;
    CHECK(aiv_engine_segment_name(engine, &name));
    reply("ready %s %" PRIu64 " %u\n", name, buffer, BUFFER_BYTES);
    CHECK(aiv_string_free(name));

    char line[256];
    while (fgets(line, sizeof line, commands_in) != NULL) {
        uint64_t offset, length, seed;
        if (sscanf(line, "fill %" SCNu64 " %" SCNu64 " %" SCNu64, &offset, &length, &seed) == 3) {
            if (offset + length > BUFFER_BYTES) {
                fail("fill out of range: %s", line);
            }
            fill_random(host, length, seed);
            CHECK(aiv_copy_to_device(engine, buffer + offset, host, length));
            reply("ok %" PRIu64 "\n", checksum(host, length));
        } else if (sscanf(line, "sum %" SCNu64 " %" SCNu64, &offset, &length) == 2) {
            if (offset + length > BUFFER_BYTES) {
                fail("sum out of range: %s", line);
            }
            CHECK(aiv_copy_from_device(engine, host, buffer + offset, length));
            reply("ok %" PRIu64 "\n", checksum(host, length));
        } else if (strncmp(line, "host", 4) == 0) {
            static uint8_t page[4096] __attribute__((aligned(4096)));
            CHECK(aiv_register(engine, (uint64_t)(uintptr_t)page, sizeof page, AIV_MEM_HOST));
            reply("ok %" PRIu64 "\n", (uint64_t)(uintptr_t)page);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        } else {
            fail("unknown command: %s", line);
        }
    }
    free(host);
    CHECK(aiv_engine_destroy(engine));
    return 0;
}

/* ----- The initiator's side of the pair ----- */

typedef struct peer {
    pid_t pid;
    FILE *commands;
    FILE *replies;
    char name[128];
    uint64_t addr;
} peer;

/* Forks the target; returns in the initiator once the target is ready. */
static peer start_target(void) {
    int to_target[2], from_target[2];
    if (pipe(to_target) != 0 || pipe(from_target) != 0) {
        fail("pipe: %s", strerror(errno));
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fail("fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(to_target[1]);
        close(from_target[0]);
        exit(target_main(to_target[0], from_target[1]));
    }
    close(to_target[0]);
    close(from_target[1]);
    signal(SIGPIPE, SIG_IGN);
    peer target = {.pid = pid};
    target.commands = fdopen(to_target[1], "w");
    target.replies = fdopen(from_target[0], "r");
    char line[256];
    unsigned size = 0;
    if (fgets(line, sizeof line, target.replies) == NULL ||
        sscanf(line, "ready %127s %" SCNu64 " %u", target.name, &target.addr, &size) != 3 || size != BUFFER_BYTES) {
        fail("the target did not start (its line: %s)", line);
    }
    return target;
}

/* Sends one command and returns the checksum of its "ok <checksum>" reply. */
static uint64_t ask(peer *target, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vfprintf(target->commands, format, args);
    va_end(args);
    fflush(target->commands);
    char line[256];
    uint64_t sum = 0;
    if (fgets(line, sizeof line, target->replies) == NULL || sscanf(line, "ok %" SCNu64, &sum) != 1) {
        fail("the target did not answer");
    }
    return sum;
}

static void stop_target(peer *target) {
    fprintf(target->commands, "quit\n");
    fclose(target->commands);
    fclose(target->replies);
    int status = 0;
    if (waitpid(target->pid, &status, 0) != target->pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fail("the target did not exit cleanly (status %#x)", status);
    }
}

/* Waits for a batch (AIV_OK and a finished state) and returns its status. */
static aiv_batch_status_t wait_batch(aiv_engine_t *engine, aiv_batch_t batch) {
    aiv_batch_status_t status;
    char *message = NULL;
    int result = aiv_batch_wait(engine, batch, AIV_WAIT_DEFAULT, &status, &message);
    if (result != AIV_OK) {
        fail("aiv_batch_wait returned %d: %s", result, aiv_last_error());
    }
    if (status.state != AIV_STATE_COMPLETED && message == NULL) {
        fail("batch in state %d without a message", status.state);
    }
    if (status.state == AIV_STATE_COMPLETED && message != NULL) {
        fail("a completed batch has a message: %s", message);
    }
    if (message != NULL) {
        fprintf(stderr, "batch %" PRIu64 ": state %d, error %d: %s\n", batch, status.state, status.error, message);
    }
    CHECK(aiv_string_free(message));
    return status;
}

/* The batch's evidence says AIV-direct: AIV cores did every act, the Host none. */
static void expect_aiv_direct(aiv_engine_t *engine, aiv_batch_t batch, uint32_t transfers, int print) {
    aiv_evidence_t evidence;
    char *verdict = NULL;
    CHECK(aiv_batch_evidence(engine, batch, &evidence, &verdict));
    if (print) {
        printf("evidence verdict:\n%s\n", verdict);
    }
    if (evidence.transfers != transfers || evidence.submitter != AIV_SUBMITTER_AIV_DIRECT ||
        strcmp(evidence.submitter_word, "AIV-direct") != 0) {
        fail("evidence of %u transfers: %u records, submitter %d (%s); verdict:\n%s", transfers, evidence.transfers,
             evidence.submitter, evidence.submitter_word, verdict);
    }
    const aiv_act_counts_t *acts[3] = {&evidence.descriptors_written, &evidence.doorbells_rung,
                                     &evidence.completion_seen};
    for (int i = 0; i < 3; i++) {
        if (acts[i]->by_aiv == 0 || acts[i]->by_host != 0 || acts[i]->by_aicpu != 0) {
            fail("act %d: %" PRIu64 " by AIV, %" PRIu64 " by AI CPU, %" PRIu64 " by Host; verdict:\n%s", i,
                 acts[i]->by_aiv, acts[i]->by_aicpu, acts[i]->by_host, verdict);
        }
    }
    if (strncmp(verdict, "submitted by: AIV-direct", 24) != 0) {
        fail("verdict: %s", verdict);
    }
    CHECK(aiv_string_free(verdict));
    char *json = NULL;
    CHECK(aiv_batch_evidence_json(engine, batch, &json));
    if (strstr(json, "\"submitter\":\"AIV-direct\"") == NULL || strstr(json, "\"path\":\"aiv\"") == NULL) {
        fail("evidence JSON: %s", json);
    }
    CHECK(aiv_string_free(json));
}

/* Slots: the buffer split into four; each transfer of a batch stays in its own slot on both sides. */
#define SLOTS 4
#define SLOT_BYTES (BUFFER_BYTES / SLOTS)

static int transfers_main(uint64_t seed) {
    peer target = start_target();
    aiv_engine_t *engine = create_engine();
    uint64_t local = device_buffer(engine);
    aiv_segment_t segment = 0;
    CHECK(aiv_segment_open(engine, target.name, 10000, &segment));
    aiv_segment_t again = 0;
    CHECK(aiv_segment_open(engine, target.name, 0, &again));
    if (segment == 0 || again != segment) {
        fail("segment handles %" PRIu64 " and %" PRIu64 " for one name", segment, again);
    }

    uint64_t state = seed | 1;
    uint8_t *host = xmalloc(SLOT_BYTES);
    uint64_t moved = 0;
    int rounds = 10;
    for (int round = 0; round < rounds; round++) {
        uint32_t count = 1 + (uint32_t)(next_random(&state) % SLOTS);
        aiv_request_t requests[SLOTS];
        uint64_t expected[SLOTS];
        memset(requests, 0, sizeof requests);
        for (uint32_t i = 0; i < count; i++) {
            /* 1 byte to 2.5 MiB, random offsets in the slot on both sides. */
            uint64_t length = 1 + next_random(&state) % (5u << 19);
            uint64_t local_offset = i * SLOT_BYTES + next_random(&state) % (SLOT_BYTES - length + 1);
            uint64_t remote_offset = i * SLOT_BYTES + next_random(&state) % (SLOT_BYTES - length + 1);
            int write = (int)(next_random(&state) & 1);
            uint64_t data_seed = next_random(&state);
            if (write) {
                fill_random(host, length, data_seed);
                CHECK(aiv_copy_to_device(engine, local + local_offset, host, length));
                expected[i] = checksum(host, length);
            } else {
                expected[i] = ask(&target, "fill %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", remote_offset, length,
                                  data_seed);
            }
            requests[i] = (aiv_request_t){
                .opcode = write ? AIV_OP_WRITE : AIV_OP_READ,
                .local_addr = local + local_offset,
                .segment = segment,
                .remote_addr = target.addr + remote_offset,
                .length = length,
            };
        }
        aiv_batch_t batch = 0;
        /* Every other round names the protocol; the others use the engine's (aiv). */
        CHECK(aiv_submit(engine, requests, count, round % 2 ? "aiv" : NULL, &batch));
        aiv_batch_status_t status = wait_batch(engine, batch);
        if (status.state != AIV_STATE_COMPLETED || status.error != AIV_OK || status.tasks != count ||
            status.completed != count || status.failed != 0) {
            fail("round %d: state %d, error %d, %u/%u completed", round, status.state, status.error,
                 status.completed, status.tasks);
        }
        uint64_t bytes = 0;
        for (uint32_t i = 0; i < count; i++) {
            const aiv_request_t *r = &requests[i];
            bytes += r->length;
            uint64_t got;
            if (r->opcode == AIV_OP_WRITE) {
                got = ask(&target, "sum %" PRIu64 " %" PRIu64 "\n", r->remote_addr - target.addr, r->length);
            } else {
                CHECK(aiv_copy_from_device(engine, host, r->local_addr, r->length));
                got = checksum(host, r->length);
            }
            if (got != expected[i]) {
                fail("round %d transfer %u (%s of %" PRIu64 " bytes): checksum %" PRIx64 ", expected %" PRIx64,
                     round, i, r->opcode == AIV_OP_WRITE ? "write" : "read", r->length, got, expected[i]);
            }
        }
        if (status.transferred_bytes != bytes) {
            fail("round %d: %" PRIu64 " bytes transferred, %" PRIu64 " requested", round, status.transferred_bytes,
                 bytes);
        }
        expect_aiv_direct(engine, batch, count, round == 0);
        CHECK(aiv_batch_free(engine, batch));
        EXPECT(AIV_ERR_INVALID_HANDLE, aiv_batch_free(engine, batch));
        moved += bytes;
    }
    printf("moved %" PRIu64 " bytes in %d batches, every checksum equal on both sides\n", moved, rounds);

    /* Host memory registered in one call, then deregistered. */
    uint8_t *a = xmalloc(8192), *b = xmalloc(8192);
    aiv_mem_region_t regions[2] = {{(uint64_t)(uintptr_t)a, 8192, AIV_MEM_HOST, 0},
                                 {(uint64_t)(uintptr_t)b, 8192, AIV_MEM_HOST, 0}};
    CHECK(aiv_register_batch(engine, regions, 2));
    CHECK(aiv_deregister(engine, regions[0].addr));
    CHECK(aiv_deregister(engine, regions[1].addr));
    free(a);
    free(b);

    free(host);
    CHECK(aiv_segment_close(engine, segment));
    EXPECT(AIV_ERR_INVALID_HANDLE, aiv_segment_close(engine, segment));
    CHECK(aiv_deregister(engine, local));
    CHECK(aiv_device_free(engine, local));
    CHECK(aiv_engine_destroy(engine));
    stop_target(&target);
    return 0;
}

static int peer_killed_main(void) {
    peer target = start_target();
    aiv_engine_t *engine = create_engine();
    uint64_t local = device_buffer(engine);
    aiv_segment_t segment = 0;
    CHECK(aiv_segment_open(engine, target.name, 10000, &segment));
    /* The peer's memory is imported on first use: one small transfer before the kill. */
    aiv_request_t first = {.opcode = AIV_OP_READ, .local_addr = local, .segment = segment,
                         .remote_addr = target.addr, .length = 4096};
    aiv_batch_t batch = 0;
    CHECK(aiv_submit(engine, &first, 1, NULL, &batch));
    if (wait_batch(engine, batch).state != AIV_STATE_COMPLETED) {
        fail("the first transfer did not complete");
    }
    CHECK(aiv_batch_free(engine, batch));

    /* 512 writes of 256 KiB (the 16 MiB buffer eight times over), and the target killed right after the
     * submission: the aiv transport's peer probe finds the loss and fails what is still pending. Writes that ran
     * before it did completed, into pages the dead process no longer owns. */
    enum { COUNT = 512, SLICE = 256u << 10, SLICES = BUFFER_BYTES / SLICE };
    static aiv_request_t requests[COUNT];
    for (int i = 0; i < COUNT; i++) {
        uint64_t offset = (uint64_t)(i % SLICES) * SLICE;
        requests[i] = (aiv_request_t){.opcode = AIV_OP_WRITE, .local_addr = local + offset, .segment = segment,
                                      .remote_addr = target.addr + offset, .length = SLICE};
    }
    CHECK(aiv_submit(engine, requests, COUNT, NULL, &batch));
    if (kill(target.pid, SIGKILL) != 0) {
        fail("kill: %s", strerror(errno));
    }
    double killed_at = now_ms();
    aiv_batch_status_t status;
    CHECK(aiv_batch_status(engine, batch, &status, NULL));
    printf("at the kill: %u of %u transfers completed\n", status.completed, status.tasks);
    waitpid(target.pid, NULL, 0);
    status = wait_batch(engine, batch);
    double waited = now_ms() - killed_at;
    printf("the batch in flight: state %d, %u completed, %u failed, %.0f ms after the kill\n", status.state,
           status.completed, status.failed, waited);
    if (status.state == AIV_STATE_PENDING || waited > TRANSFER_TIMEOUT_MS + 1000) {
        fail("the batch in flight: state %d after %.0f ms", status.state, waited);
    }
    if (status.completed + status.failed != status.tasks ||
        (status.completed < status.tasks && status.state != AIV_STATE_FAILED && status.state != AIV_STATE_TIMEOUT)) {
        fail("the batch in flight: state %d with %u completed and %u failed of %u", status.state, status.completed,
             status.failed, status.tasks);
    }
    if (status.failed > 0 && status.error != AIV_ERR_TRANSFER_FAILED && status.error != AIV_ERR_TIMEOUT) {
        fail("the batch in flight: error %d", status.error);
    }
    CHECK(aiv_batch_free(engine, batch));

    /* Within the transfer timeout of the kill, a batch to the dead target fails, naming the loss. */
    for (;;) {
        CHECK(aiv_submit(engine, requests, 4, NULL, &batch));
        char *message = NULL;
        CHECK(aiv_batch_wait(engine, batch, AIV_WAIT_DEFAULT, &status, &message));
        CHECK(aiv_batch_free(engine, batch));
        waited = now_ms() - killed_at;
        if (status.state != AIV_STATE_COMPLETED) {
            printf("a batch to the dead target: state %d, error %d, %.0f ms after the kill: %s\n", status.state,
                   status.error, waited, message);
            if (status.state != AIV_STATE_FAILED || strstr(message, "lost") == NULL) {
                fail("a batch to the dead target: state %d: %s", status.state, message);
            }
            CHECK(aiv_string_free(message));
            break;
        }
        if (waited > TRANSFER_TIMEOUT_MS) {
            fail("batches to the dead target still complete %.0f ms after the kill", waited);
        }
        usleep(10000);
    }
    fclose(target.commands);
    fclose(target.replies);
    CHECK(aiv_engine_destroy(engine));
    return 0;
}

static int host_target_main(void) {
    peer target = start_target();
    uint64_t host = ask(&target, "host\n");
    aiv_engine_t *engine = create_engine();
    uint64_t local = device_buffer(engine);
    aiv_segment_t segment = 0;
    CHECK(aiv_segment_open(engine, target.name, 10000, &segment));
    aiv_request_t to_host = {.opcode = AIV_OP_WRITE, .local_addr = local, .segment = segment,
                             .remote_addr = host, .length = 4096};
    aiv_batch_t batch = 0;
    double started = now_ms();
    CHECK(aiv_submit(engine, &to_host, 1, NULL, &batch));
    aiv_batch_status_t status;
    char *message = NULL;
    CHECK(aiv_batch_wait(engine, batch, AIV_WAIT_DEFAULT, &status, &message));
    double waited = now_ms() - started;
    printf("a write into the target's Host memory: state %d, error %d, %.0f ms: %s\n", status.state, status.error,
           waited, message != NULL ? message : "");
    if (status.state != AIV_STATE_FAILED || status.error != AIV_ERR_INVALID_ARGUMENT || message == NULL ||
        strstr(message, "registered without exporting it") == NULL || waited > TRANSFER_TIMEOUT_MS) {
        fail("a write into the target's Host memory: state %d, error %d: %s", status.state, status.error,
             message != NULL ? message : "(no message)");
    }
    CHECK(aiv_string_free(message));
    CHECK(aiv_batch_free(engine, batch));
    /* The peer is not lost: its device memory is reached as before. */
    aiv_request_t to_device = {.opcode = AIV_OP_WRITE, .local_addr = local, .segment = segment,
                               .remote_addr = target.addr, .length = 4096};
    CHECK(aiv_submit(engine, &to_device, 1, NULL, &batch));
    if (wait_batch(engine, batch).state != AIV_STATE_COMPLETED) {
        fail("the write into the target's device memory after it did not complete");
    }
    CHECK(aiv_batch_free(engine, batch));
    stop_target(&target);
    CHECK(aiv_engine_destroy(engine));
    return 0;
}

static int errors_main(void) {
    if (aiv_abi_version() != AIV_ABI_VERSION) {
        fail("library ABI %d, header %d", aiv_abi_version(), AIV_ABI_VERSION);
    }
    aiv_engine_t *engine = NULL;
    /* Configuration. */
    EXPECT(AIV_ERR_CONFIG, aiv_engine_create("{not json", &engine));
    EXPECT_MESSAGE("aiv_engine_create");
    EXPECT(AIV_ERR_CONFIG, aiv_engine_create("{\"local_hostname\": \"127.0.0.1\", \"protocol\": \"rdma\"}", &engine));
    EXPECT_MESSAGE("rdma");
    EXPECT(AIV_ERR_CONFIG, aiv_engine_create("{\"local_hostname\": \"127.0.0.1\", \"rpc_port\": 70000}", &engine));
    EXPECT_MESSAGE("rpc_port");
    EXPECT(AIV_ERR_CONFIG, aiv_engine_create("{\"local_hostname\": \"127.0.0.1\", \"cann_libraries\": 5}", &engine));
    EXPECT_MESSAGE("cann_libraries: expected an object");
    EXPECT(AIV_ERR_CONFIG,
           aiv_engine_create("{\"local_hostname\": \"127.0.0.1\", \"cann_libraries\": {\"hccl\": \"x.so\"}}", &engine));
    EXPECT_MESSAGE("cann_libraries: unknown key \"hccl\"");
    EXPECT(AIV_ERR_CONFIG,
           aiv_engine_create("{\"local_hostname\": \"127.0.0.1\", \"cann_libraries\": {\"ascendcl\": \"\"}}", &engine));
    EXPECT_MESSAGE("cann_libraries.ascendcl: expected a file path");
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_engine_create("{}", NULL));
    if (engine != NULL) {
        fail("a failed aiv_engine_create left an engine");
    }

    engine = create_engine();
    /* One engine per device in a process. */
    aiv_engine_t *second = NULL;
    EXPECT(AIV_ERR_DEVICE, aiv_engine_create("{\"local_hostname\": \"127.0.0.1\"}", &second));
    EXPECT_MESSAGE("already driven by another engine");
    uint64_t buffer = device_buffer(engine);

    /* Handles. */
    EXPECT(AIV_ERR_INVALID_HANDLE, aiv_register(NULL, buffer, 16, AIV_MEM_DEVICE));
    EXPECT_MESSAGE("NULL");
    EXPECT(AIV_ERR_INVALID_HANDLE, aiv_register((aiv_engine_t *)(uintptr_t)0x123456, buffer, 16, AIV_MEM_DEVICE));
    EXPECT_MESSAGE("not a live engine");
    aiv_batch_status_t status;
    EXPECT(AIV_ERR_INVALID_HANDLE, aiv_batch_status(engine, 987654, &status, NULL));
    EXPECT_MESSAGE("not a live batch");
    EXPECT(AIV_ERR_INVALID_HANDLE, aiv_segment_close(engine, 0));

    /* Segments: the engine's own, and one nobody answers for. */
    char *name = NULL;
    CHECK(aiv_engine_segment_name(engine, &name));
    aiv_segment_t own = 0, unknown = 0;
    CHECK(aiv_segment_open(engine, name, 5000, &own));
    CHECK(aiv_string_free(name));
    double started = now_ms();
    EXPECT(AIV_ERR_SEGMENT_NOT_FOUND, aiv_segment_open(engine, "127.0.0.1:1", 5000, &unknown));
    EXPECT_MESSAGE("127.0.0.1:1");
    if (unknown != 0 || now_ms() - started > 5000) {
        fail("opening an unknown segment: handle %" PRIu64 " after %.0f ms", unknown, now_ms() - started);
    }
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_segment_open(engine, NULL, 0, &unknown));
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_segment_open(engine, "127.0.0.1:1", 0, NULL));

    /* Requests the call refuses. */
    aiv_request_t request = {.opcode = AIV_OP_WRITE, .local_addr = buffer, .segment = own,
                           .remote_addr = buffer + 8192, .length = 4096};
    aiv_batch_t batch = 0;
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_submit(engine, NULL, 1, NULL, &batch));
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_submit(engine, &request, 0, NULL, &batch));
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_submit(engine, &request, 1, NULL, NULL));
    aiv_request_t bad = request;
    bad.opcode = 7;
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_submit(engine, &bad, 1, NULL, &batch));
    EXPECT_MESSAGE("opcode 7");
    bad = request;
    bad.segment = 0;
    EXPECT(AIV_ERR_INVALID_HANDLE, aiv_submit(engine, &bad, 1, NULL, &batch));
    bad.segment = 4242;
    EXPECT(AIV_ERR_INVALID_HANDLE, aiv_submit(engine, &bad, 1, NULL, &batch));
    EXPECT_MESSAGE("not open");
    EXPECT(AIV_ERR_NOT_SUPPORTED, aiv_submit(engine, &request, 1, "rdma", &batch));
    if (batch != 0) {
        fail("a refused submission returned batch %" PRIu64, batch);
    }

    /* Requests submitted as failed transfers: a local range, then a remote range, outside registered memory. */
    aiv_request_t outside[2] = {request, request};
    outside[0].local_addr = buffer + BUFFER_BYTES;
    outside[1].remote_addr = buffer + BUFFER_BYTES - 100;
    CHECK(aiv_submit(engine, outside, 2, NULL, &batch));
    char *message = NULL;
    CHECK(aiv_batch_wait(engine, batch, AIV_WAIT_DEFAULT, &status, &message));
    if (status.state != AIV_STATE_FAILED || status.error != AIV_ERR_ADDRESS_NOT_REGISTERED || status.failed != 2 ||
        message == NULL || strstr(message, "task 0") == NULL || strstr(message, "registered local buffer") == NULL) {
        fail("outside registered memory: state %d, error %d, %u failed, message %s", status.state, status.error,
             status.failed, message ? message : "(none)");
    }
    CHECK(aiv_string_free(message));
    CHECK(aiv_batch_free(engine, batch));

    /* A transfer within the engine's own segment completes. */
    CHECK(aiv_submit(engine, &request, 1, NULL, &batch));
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_batch_wait(engine, batch, 1000, NULL, NULL));
    CHECK(aiv_batch_wait(engine, batch, 10000, &status, NULL));
    if (status.state != AIV_STATE_COMPLETED) {
        fail("a transfer within the engine's own segment: state %d", status.state);
    }
    CHECK(aiv_batch_free(engine, batch));

    /* Registration. */
    EXPECT(AIV_ERR_ADDRESS_OVERLAPPED, aiv_register(engine, buffer + 4096, 4096, AIV_MEM_DEVICE));
    EXPECT(AIV_ERR_ADDRESS_NOT_REGISTERED, aiv_deregister(engine, buffer + 1));
    uint8_t host[64];
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_register(engine, (uint64_t)(uintptr_t)host, sizeof host, AIV_MEM_DEVICE));
    EXPECT_MESSAGE("not memory of this engine's device");
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_register(engine, (uint64_t)(uintptr_t)host, sizeof host, 9));
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_register(engine, (uint64_t)(uintptr_t)host, 0, AIV_MEM_HOST));
    aiv_mem_region_t regions[2] = {{(uint64_t)(uintptr_t)host, 32, AIV_MEM_HOST, 0}, {buffer, 4096, AIV_MEM_DEVICE, 0}};
    EXPECT(AIV_ERR_ADDRESS_OVERLAPPED, aiv_register_batch(engine, regions, 2));
    EXPECT_MESSAGE("regions[1]");
    /* All or none: the first region was deregistered again. */
    EXPECT(AIV_ERR_ADDRESS_NOT_REGISTERED, aiv_deregister(engine, (uint64_t)(uintptr_t)host));
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_register_batch(engine, NULL, 2));

    /* Device memory. */
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_copy_to_device(engine, buffer, NULL, 16));
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_copy_from_device(engine, NULL, buffer, 16));
    EXPECT(AIV_ERR_DEVICE, aiv_copy_to_device(engine, (uint64_t)(uintptr_t)host, host, sizeof host));
    EXPECT_MESSAGE("not device memory");
    EXPECT(AIV_ERR_DEVICE, aiv_copy_from_device(engine, host, (uint64_t)(uintptr_t)host, sizeof host));
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_device_free(engine, buffer + 64));
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_device_alloc(engine, 0, &buffer));

    /* Strings. */
    char *foreign = malloc(8);
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_string_free(foreign));
    EXPECT_MESSAGE("not a string this library returned");
    free(foreign);
    CHECK(aiv_string_free(NULL));
    CHECK(aiv_engine_segment_name(engine, &name));
    CHECK(aiv_string_free(name));
    EXPECT(AIV_ERR_INVALID_ARGUMENT, aiv_string_free(name));

    /* A destroyed engine's handle stays invalid. */
    CHECK(aiv_engine_destroy(engine));
    EXPECT(AIV_ERR_INVALID_HANDLE, aiv_engine_destroy(engine));
    EXPECT(AIV_ERR_INVALID_HANDLE, aiv_device_alloc(engine, 4096, &buffer));
    EXPECT_MESSAGE("destroyed");
    /* Its device is free again. */
    engine = create_engine();
    CHECK(aiv_engine_destroy(engine));
    printf("every wrong call returned its documented code\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "transfers") == 0) {
        return transfers_main(strtoull(argv[2], NULL, 0));
    }
    if (argc >= 2 && strcmp(argv[1], "errors") == 0) {
        return errors_main();
    }
    if (argc >= 2 && strcmp(argv[1], "peer-killed") == 0) {
        return peer_killed_main();
    }
    if (argc >= 2 && strcmp(argv[1], "host-target") == 0) {
        return host_target_main();
    }
    fprintf(stderr, "usage: %s transfers <seed> | errors | peer-killed | host-target\n", argv[0]);
    return 2;
}
