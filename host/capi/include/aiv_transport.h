/*
 * aiv_transport.h: the C ABI of aiv-transport (libaiv_transport.so).
 *
 * A Mooncake-compatible transfer engine for Ascend NPUs whose default path (protocol "aiv") has a kernel on the AI
 * Vector cores write the copy descriptors and ring the doorbells itself. By default the device is the CPU twin of
 * the CANN runtime, in this process; "aiv": {"device_backend": "cann"} selects the vendor's libraries (a library
 * built with feature `cann`; unverified on hardware). docs/c-api.md describes the library in full.
 *
 * Conventions, for every function below unless its comment says otherwise:
 *  - The return value is a status: AIV_OK (0), or one of the negative AIV_ERR_* codes. On failure,
 *    aiv_last_error() returns a message naming the function and what was wrong; out-parameters are then left
 *    zeroed (NULL, 0) where the function could write them.
 *  - No argument makes the library crash: NULL or misaligned pointers, handles that were never valid or were
 *    destroyed/closed/freed, and out-of-range values are reported as errors. (The memory behind a pointer that is
 *    not NULL, and the memory a registration names, is the caller's to keep valid, as documented per function.)
 *  - Handles: an aiv_engine pointer is opaque (never dereference it); segment and batch handles are integers, 0 is
 *    never valid. Handles are never reused within a process.
 *  - Threads: every function may be called from any thread, concurrently, on the same engine. A call that blocks
 *    (engine creation, aiv_segment_open, aiv_batch_wait) holds no lock other calls need.
 *  - Strings the library returns (char ** out-parameters) are NUL-terminated UTF-8, owned by the caller, and freed
 *    with aiv_string_free.
 *  - Addresses are 64-bit integers: the absolute addresses of this process's memory (local) or of the peer's
 *    (remote, as the peer's segment lists its registered buffers).
 */
#ifndef AIV_TRANSPORT_H
#define AIV_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this header declares; aiv_abi_version() returns the library's. */
#define AIV_ABI_VERSION 1

/* ----- Status codes ----- */

#define AIV_OK 0
/* A NULL or misaligned pointer, a bad enumeration value, a zero length or count, a nonzero reserved field, a
 * request the engine refused as malformed; in aiv_batch_status.error, a transfer its path cannot carry (a remote
 * range in no memory the peer exports, e.g. Host memory the peer registered). */
#define AIV_ERR_INVALID_ARGUMENT (-1)
/* An engine, segment or batch handle that is not live: never returned, or destroyed/closed/freed. */
#define AIV_ERR_INVALID_HANDLE (-2)
/* The configuration JSON of aiv_engine_create: not JSON, not an object, or a key with an invalid value. */
#define AIV_ERR_CONFIG (-3)
/* A range outside every registered buffer (deregister of an address that starts none; a transfer's local range
 * outside this engine's buffers or its remote range outside the peer's). */
#define AIV_ERR_ADDRESS_NOT_REGISTERED (-4)
/* A registration overlapping a registered buffer. */
#define AIV_ERR_ADDRESS_OVERLAPPED (-5)
/* A segment name nobody answers for (no handshake server there, no metadata entry). */
#define AIV_ERR_SEGMENT_NOT_FOUND (-6)
/* A bounded call ran out of time: aiv_batch_wait with transfers still pending, aiv_segment_open past its limit;
 * in aiv_batch_status.error, a transfer that timed out. */
#define AIV_ERR_TIMEOUT (-7)
/* aiv_batch_free of a batch with transfers still pending. */
#define AIV_ERR_BATCH_BUSY (-8)
/* In aiv_batch_status.error: a transfer failed (the peer was lost, the device refused the copy, ...). */
#define AIV_ERR_TRANSFER_FAILED (-9)
/* The device could not be opened (or is driven by another engine of this process), or refused an allocation or
 * a copy (an address that is not its memory, a range past a buffer's end). */
#define AIV_ERR_DEVICE (-10)
/* A transport or the metadata service could not start or failed (listener bind, handshake, publish). */
#define AIV_ERR_TRANSPORT (-11)
/* A protocol this engine does not provide. */
#define AIV_ERR_NOT_SUPPORTED (-12)
/* A bug in the library (a caught panic); the message says where. */
#define AIV_ERR_INTERNAL (-13)

/* ----- Types ----- */

/* An engine: opaque. */
typedef struct aiv_engine aiv_engine_t;

/* An open segment of an engine (a peer's, or the engine's own); 0 is never valid. */
typedef uint64_t aiv_segment_t;

/* A submitted batch of an engine; 0 is never valid. */
typedef uint64_t aiv_batch_t;

/* Where registered memory is (aiv_register's kind). */
typedef enum aiv_mem_kind {
    /* Find out: memory of the engine's device (once the device is open) is device memory, the rest Host memory. */
    AIV_MEM_AUTO = 0,
    /* Host memory (Mooncake's location "cpu:0"): reachable by the Host paths (protocol tcp). */
    AIV_MEM_HOST = 1,
    /* Memory of the engine's device ("npu:<id>"), e.g. from aiv_device_alloc or, with the "cann" backend, the
     * runtime's own allocations on that device (aclrtMalloc); anything else is refused. */
    AIV_MEM_DEVICE = 2
} aiv_mem_kind_t;

/* Direction of a transfer, seen from the engine that submits it. */
typedef enum aiv_opcode {
    /* From the remote range into the local range. */
    AIV_OP_READ = 0,
    /* From the local range into the remote range. */
    AIV_OP_WRITE = 1
} aiv_opcode_t;

/* A batch's state (aiv_batch_status.state). */
typedef enum aiv_state {
    /* Some transfer is still running. */
    AIV_STATE_PENDING = 0,
    /* Every transfer completed. */
    AIV_STATE_COMPLETED = 1,
    /* Every transfer is finished and some failed (or were refused at submission). */
    AIV_STATE_FAILED = 2,
    /* Every transfer is finished, none failed, and some timed out (the engine's transfer timeout). */
    AIV_STATE_TIMEOUT = 3
} aiv_state_t;

/* Who submitted a batch's work, from its transfers' evidence (docs/evidence.md, "Who submitted"). */
typedef enum aiv_submitter {
    /* No transfer recorded evidence yet, or a submission act was not observed. */
    AIV_SUBMITTER_UNKNOWN = 0,
    /* Descriptors written, doorbells rung and completions seen by AI Vector cores only. */
    AIV_SUBMITTER_AIV_DIRECT = 1,
    /* Descriptors written and doorbells rung by AI-CPU tasks only. */
    AIV_SUBMITTER_AI_CPU = 2,
    /* Descriptors written and doorbells rung by the Host only. */
    AIV_SUBMITTER_HOST = 3,
    /* By more than one kind of doer. */
    AIV_SUBMITTER_MIXED = 4
} aiv_submitter_t;

/* One range for aiv_register_batch. */
typedef struct aiv_mem_region {
    uint64_t addr;
    uint64_t length;
    uint32_t kind; /* an aiv_mem_kind */
    uint32_t reserved; /* must be 0 */
} aiv_mem_region_t;

/* One transfer of a batch. */
typedef struct aiv_request {
    uint32_t opcode; /* an aiv_opcode */
    uint32_t reserved; /* must be 0 */
    uint64_t local_addr; /* inside one buffer registered with this engine, with length */
    aiv_segment_t segment; /* from aiv_segment_open of this engine */
    uint64_t remote_addr; /* absolute address inside one buffer of the segment, with length */
    uint64_t length; /* bytes; 0 is refused (the transfer fails) */
} aiv_request_t;

/* A batch's status. */
typedef struct aiv_batch_status {
    int32_t state; /* an aiv_state */
    int32_t error; /* AIV_OK, or the code of the first transfer that failed or timed out */
    uint32_t tasks; /* transfers in the batch */
    uint32_t completed; /* transfers completed */
    uint32_t failed; /* transfers failed or timed out */
    uint32_t reserved;
    uint64_t transferred_bytes; /* bytes of the transfers completed */
} aiv_batch_status_t;

/* How many times each kind of doer did one act (write descriptors, ring doorbells, see completions). */
typedef struct aiv_act_counts {
    uint64_t by_aiv; /* an AI Vector core (on the twin: an emulated core running the kernel) */
    uint64_t by_aicpu; /* an AI-CPU task */
    uint64_t by_host; /* the Host (a Host thread, or a runtime library on its behalf) */
    uint64_t unattributed; /* nobody one can name */
} aiv_act_counts_t;

/* The evidence of a batch's finished transfers, summed (docs/evidence.md). */
typedef struct aiv_evidence {
    uint32_t transfers; /* transfers that recorded evidence (the finished ones) */
    int32_t submitter; /* an aiv_submitter */
    aiv_act_counts_t descriptors_written;
    aiv_act_counts_t doorbells_rung;
    aiv_act_counts_t completion_seen;
    double host_launches; /* kernel launches the Host made for these transfers (shares of shared launches) */
    char submitter_word[24]; /* "AIV-direct", "AI-CPU-submitted", "Host-submitted", "mixed" or "unknown" */
} aiv_evidence_t;

/* The layout the library was built with; a mismatch fails the build of any program that includes this header. */
#if defined(__cplusplus)
#define AIV_STATIC_ASSERT(condition, message) static_assert(condition, message)
#else
#define AIV_STATIC_ASSERT(condition, message) _Static_assert(condition, message)
#endif
AIV_STATIC_ASSERT(sizeof(aiv_mem_region_t) == 24, "aiv_mem_region size");
AIV_STATIC_ASSERT(offsetof(aiv_mem_region_t, addr) == 0, "aiv_mem_region.addr");
AIV_STATIC_ASSERT(offsetof(aiv_mem_region_t, length) == 8, "aiv_mem_region.length");
AIV_STATIC_ASSERT(offsetof(aiv_mem_region_t, kind) == 16, "aiv_mem_region.kind");
AIV_STATIC_ASSERT(offsetof(aiv_mem_region_t, reserved) == 20, "aiv_mem_region.reserved");
AIV_STATIC_ASSERT(sizeof(aiv_request_t) == 40, "aiv_request size");
AIV_STATIC_ASSERT(offsetof(aiv_request_t, opcode) == 0, "aiv_request.opcode");
AIV_STATIC_ASSERT(offsetof(aiv_request_t, reserved) == 4, "aiv_request.reserved");
AIV_STATIC_ASSERT(offsetof(aiv_request_t, local_addr) == 8, "aiv_request.local_addr");
AIV_STATIC_ASSERT(offsetof(aiv_request_t, segment) == 16, "aiv_request.segment");
AIV_STATIC_ASSERT(offsetof(aiv_request_t, remote_addr) == 24, "aiv_request.remote_addr");
AIV_STATIC_ASSERT(offsetof(aiv_request_t, length) == 32, "aiv_request.length");
AIV_STATIC_ASSERT(sizeof(aiv_batch_status_t) == 32, "aiv_batch_status size");
AIV_STATIC_ASSERT(offsetof(aiv_batch_status_t, state) == 0, "aiv_batch_status.state");
AIV_STATIC_ASSERT(offsetof(aiv_batch_status_t, error) == 4, "aiv_batch_status.error");
AIV_STATIC_ASSERT(offsetof(aiv_batch_status_t, tasks) == 8, "aiv_batch_status.tasks");
AIV_STATIC_ASSERT(offsetof(aiv_batch_status_t, completed) == 12, "aiv_batch_status.completed");
AIV_STATIC_ASSERT(offsetof(aiv_batch_status_t, failed) == 16, "aiv_batch_status.failed");
AIV_STATIC_ASSERT(offsetof(aiv_batch_status_t, reserved) == 20, "aiv_batch_status.reserved");
AIV_STATIC_ASSERT(offsetof(aiv_batch_status_t, transferred_bytes) == 24, "aiv_batch_status.transferred_bytes");
AIV_STATIC_ASSERT(sizeof(aiv_act_counts_t) == 32, "aiv_act_counts size");
AIV_STATIC_ASSERT(offsetof(aiv_act_counts_t, by_aiv) == 0, "aiv_act_counts.by_aiv");
AIV_STATIC_ASSERT(offsetof(aiv_act_counts_t, by_aicpu) == 8, "aiv_act_counts.by_aicpu");
AIV_STATIC_ASSERT(offsetof(aiv_act_counts_t, by_host) == 16, "aiv_act_counts.by_host");
AIV_STATIC_ASSERT(offsetof(aiv_act_counts_t, unattributed) == 24, "aiv_act_counts.unattributed");
AIV_STATIC_ASSERT(sizeof(aiv_evidence_t) == 136, "aiv_evidence size");
AIV_STATIC_ASSERT(offsetof(aiv_evidence_t, transfers) == 0, "aiv_evidence.transfers");
AIV_STATIC_ASSERT(offsetof(aiv_evidence_t, submitter) == 4, "aiv_evidence.submitter");
AIV_STATIC_ASSERT(offsetof(aiv_evidence_t, descriptors_written) == 8, "aiv_evidence.descriptors_written");
AIV_STATIC_ASSERT(offsetof(aiv_evidence_t, doorbells_rung) == 40, "aiv_evidence.doorbells_rung");
AIV_STATIC_ASSERT(offsetof(aiv_evidence_t, completion_seen) == 72, "aiv_evidence.completion_seen");
AIV_STATIC_ASSERT(offsetof(aiv_evidence_t, host_launches) == 104, "aiv_evidence.host_launches");
AIV_STATIC_ASSERT(offsetof(aiv_evidence_t, submitter_word) == 112, "aiv_evidence.submitter_word");

/* ----- Version, errors, strings ----- */

/* The library's ABI version (AIV_ABI_VERSION of the header it was built with), a positive number: compare it with
 * the header's before any other call. The one function that returns no status. */
int aiv_abi_version(void);

/* This thread's last error message ("" before any failure): "<function>: <what was wrong>". Valid until this
 * thread's next failing call; successful calls leave it unchanged. Never NULL; not a status. */
const char *aiv_last_error(void);

/* Frees a string the library returned. NULL is accepted (no-op). AIV_ERR_INVALID_ARGUMENT for a pointer that is
 * not a live string of the library (another allocator's, or one freed already): nothing is freed. */
int aiv_string_free(char *string);

/* ----- Engines ----- */

/* Starts an engine from a JSON configuration, mooncake.json's shape (docs/c-api.md lists the keys):
 *   {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "protocol": "aiv",
 *    "aiv": {"device_id": 0, "transfer_timeout_ms": 30000, ...}}
 * "protocol" defaults to "aiv" (not Mooncake's "tcp"); "local_hostname" is required unless MOONCAKE_LOCAL_HOSTNAME
 * is set; "aiv.device_id" names the device this engine drives (one engine per device in a process). One key is
 * this library's own: "rpc_port", the port of the engine's handshake server (default: a free one of
 * MC_MIN_RPC_PORT..MC_MAX_RPC_PORT); with P2PHANDSHAKE the segment name is "<host>:<rpc port>". Another is the
 * library's own too: "cann_libraries": {"ascendcl": path, "shmem": path, "hixl": path, "msprofiler": path} (each
 * optional), the files the "cann" backend loads, as AIV_ASCENDCL_LIB, AIV_SHMEM_LIB, AIV_HIXL_LIB and
 * AIV_MSPROFILER_LIB would name them, without touching the environment: a host program that loaded libascendcl.so
 * itself passes that file, so that the engine drives the runtime the program's own allocations belong to. The
 * libraries are loaded once per process: with "device_backend": "cann", an "ascendcl" that differs from the file
 * loaded already is AIV_ERR_CONFIG. config_json NULL
 * or "" is "{}". With a device protocol the device is opened here (AIV_ERR_DEVICE if it cannot be).
 * On success *engine is the new handle; on failure NULL. */
int aiv_engine_create(const char *config_json, aiv_engine_t **engine);

/* Shuts the engine down: its segment is withdrawn from the metadata service, its handshake server stops, the
 * device buffers aiv_device_alloc returned are freed, its batches forgotten. The handle is invalid from now on.
 * Bounded: a call of another thread still running on this engine (a wait, an open) delays the shutdown until it
 * returns, within that call's own bound. */
int aiv_engine_destroy(aiv_engine_t *engine);

/* The engine's segment name: what peers pass to aiv_segment_open ("<host>:<rpc port>" with P2PHANDSHAKE). */
int aiv_engine_segment_name(aiv_engine_t *engine, char **name);

/* ----- Device memory (through the engine's device backend: the twin runtime or the vendor's) ----- */

/* Allocates length bytes of the engine's device memory (HBM); *addr is its device address. Opens the device if
 * it is not open. Freed by aiv_device_free or aiv_engine_destroy. Not registered: call aiv_register. */
int aiv_device_alloc(aiv_engine_t *engine, uint64_t length, uint64_t *addr);

/* Frees device memory aiv_device_alloc returned to this engine (deregistering it if it is registered).
 * AIV_ERR_INVALID_ARGUMENT for any other address. No transfer may still use it. */
int aiv_device_free(aiv_engine_t *engine, uint64_t addr);

/* Copies length bytes of Host memory at src to device memory at device_addr (the runtime's Host-to-device copy;
 * the Host never writes device memory itself). src must be readable for length bytes. length 0 does nothing. */
int aiv_copy_to_device(aiv_engine_t *engine, uint64_t device_addr, const void *src, uint64_t length);

/* Copies length bytes of device memory at device_addr to Host memory at dst, which must be writable for length
 * bytes. length 0 does nothing. */
int aiv_copy_from_device(aiv_engine_t *engine, void *dst, uint64_t device_addr, uint64_t length);

/* ----- Registration ----- */

/* Registers [addr, addr + length) as a buffer transfers may read and write (kind: an aiv_mem_kind), and publishes
 * it in the engine's segment. The memory must stay valid, and not be accessed in conflict with transfers, until
 * it is deregistered and every transfer using it has finished. Refuses length 0, ranges that wrap, overlaps
 * (AIV_ERR_ADDRESS_OVERLAPPED), and AIV_MEM_DEVICE for memory that is not the device's. */
int aiv_register(aiv_engine_t *engine, uint64_t addr, uint64_t length, uint32_t kind);

/* Registers count regions, all or none: on failure the regions registered by this call are deregistered again and
 * the message names the region that failed ("regions[i]: ..."). */
int aiv_register_batch(aiv_engine_t *engine, const aiv_mem_region_t *regions, size_t count);

/* Deregisters the buffer that starts at addr (AIV_ERR_ADDRESS_NOT_REGISTERED if none does). Transfers already
 * submitted keep their checks. */
int aiv_deregister(aiv_engine_t *engine, uint64_t addr);

/* ----- Segments ----- */

/* Opens a segment by name (a peer's "ip:port" under P2PHANDSHAKE; the engine's own name opens its own segment)
 * and fetches its descriptor. An already-open name returns its handle again. Bounded by the engine's metadata
 * deadlines and, when timeout_ms is neither 0 nor UINT64_MAX, by timeout_ms (AIV_ERR_TIMEOUT). A name nobody
 * answers for: AIV_ERR_SEGMENT_NOT_FOUND. */
int aiv_segment_open(aiv_engine_t *engine, const char *name, uint64_t timeout_ms, aiv_segment_t *segment);

/* Forgets an open segment (its handle is invalid from now on). Closing the engine's own segment does nothing. */
int aiv_segment_close(aiv_engine_t *engine, aiv_segment_t segment);

/* ----- Transfers ----- */

/* AIV_WAIT_DEFAULT as aiv_batch_wait's timeout: bounded by the engine's transfer timeout only. */
#define AIV_WAIT_DEFAULT UINT64_MAX

/* Submits count transfers as one new batch and returns at once; *batch is its handle. protocol NULL or "" uses
 * the engine's protocol; otherwise "aiv", "adxl", "ubshmem", "tcp", or "ascend" (as aiv.ascend_protocol maps it)
 * for every transfer of the batch (AIV_ERR_NOT_SUPPORTED for other names). The call itself fails for malformed
 * requests (bad opcode, nonzero reserved, a segment handle that is not open: nothing is submitted); a transfer
 * whose ranges are not inside registered buffers is submitted as a failed transfer whose status names the reason
 * (AIV_ERR_ADDRESS_NOT_REGISTERED). Every batch must be freed with aiv_batch_free. */
int aiv_submit(aiv_engine_t *engine, const aiv_request_t *requests, size_t count, const char *protocol,
               aiv_batch_t *batch);

/* The batch's status now (never blocks). message may be NULL; otherwise *message is NULL, or (when a transfer
 * failed or timed out) the first one's reason "task <i>: <reason>", freed with aiv_string_free. */
int aiv_batch_status(aiv_engine_t *engine, aiv_batch_t batch, aiv_batch_status_t *status, char **message);

/* Waits until every transfer of the batch has finished, at most timeout_ms (AIV_WAIT_DEFAULT: until the engine's
 * transfer timeout has passed for every transfer, which turns the unfinished ones to timed out), then fills status
 * and message as aiv_batch_status does. AIV_OK once every transfer has finished, whatever the state (look at
 * status->state); AIV_ERR_TIMEOUT, with status filled (state AIV_STATE_PENDING), if transfers are still running
 * at timeout_ms. */
int aiv_batch_wait(aiv_engine_t *engine, aiv_batch_t batch, uint64_t timeout_ms, aiv_batch_status_t *status,
                   char **message);

/* Frees a batch whose transfers have all finished (AIV_ERR_BATCH_BUSY otherwise: wait first). */
int aiv_batch_free(aiv_engine_t *engine, aiv_batch_t batch);

/* ----- Evidence (docs/evidence.md) ----- */

/* The evidence of the batch's finished transfers, summed: who wrote the descriptors, rang the doorbells and saw
 * the completions, and the verdict. verdict may be NULL; otherwise *verdict is the verdict for people (one line
 * "submitted by: <word> (<runtime>; ...)", then one line per check), freed with aiv_string_free. */
int aiv_batch_evidence(aiv_engine_t *engine, aiv_batch_t batch, aiv_evidence_t *evidence, char **verdict);

/* The same as a JSON object, freed with aiv_string_free: {"transfers", "submitter", "verdict": [lines], "tally":
 * the sums and per-check counts, "records": [each transfer's record as docs/evidence.md describes it, or null for
 * a transfer without one]}. */
int aiv_batch_evidence_json(aiv_engine_t *engine, aiv_batch_t batch, char **json);

#ifdef __cplusplus
}
#endif

#endif /* AIV_TRANSPORT_H */
