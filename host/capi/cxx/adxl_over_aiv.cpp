// libllm_datadist.so over aiv: adxl::AdxlEngine (the C++ interface Mooncake's Ascend wheel reaches the device
// through, docs/mooncake-npu-wheel.md section 5) implemented as this project's engine with protocol aiv, on the C ABI
// of libaiv_transport.so (host/capi/include/aiv_transport.h). Built by tests/support/mooncake_over_aiv.sh; described
// in docs/mooncake.md, "Mooncake's engine over aiv". Twin runtime only so far; unverified on hardware.
//
// One device runtime per process: the engine drives the ACL runtime this process already loaded (the libascendcl.so
// that defines aclrtMalloc, found with dladdr), through the engine's `cann` backend ("device_backend": "cann" and the
// C ABI's "cann_libraries"), so the buffers the host program allocates with aclrtMalloc are memory of the engine's
// device. When that library also defines SHMEM, HiXL and the profiler (the twin runtime is one file), the engine
// takes them from it too; otherwise its loaders find the vendor's files as usual.
//
// Members:
// - Initialize("ip:port", options): aiv_engine_create with {"local_hostname": ip, "rpc_port": port,
//   "metadata_server": "P2PHANDSHAKE", "protocol": "aiv", "aiv": {"device_id": <aclrtGetDevice of the calling
//   thread>, "device_backend": "cann", "transfer_timeout_ms": ASCEND_TRANSFER_TIMEOUT or 10000}}; the segment name is
//   "ip:port", the name peers pass. Option AutoConnect "1" makes a transfer to an unknown peer connect first;
//   EnableUseFabricMem "1" is refused (UNSUPPORTED); other options are accepted and ignored.
// - Finalize / the destructor: aiv_engine_destroy (bounded: running batches end by the transfer timeout).
// - RegisterMem / DeregisterMem: aiv_register (MEM_DEVICE -> AIV_MEM_DEVICE, MEM_HOST -> AIV_MEM_HOST: the engine
//   exports Host memory to peers' devices when the runtime can share it, e.g. Mooncake Store's aclrtMallocHost
//   segment) / aiv_deregister; the handle is an object of this library.
// - Connect / Disconnect: aiv_segment_open(name, timeout) / aiv_segment_close.
// - TransferSync: aiv_submit, aiv_batch_wait(timeout), aiv_batch_free. A wait that times out leaves the batch
//   running: it is kept and freed once it has finished (by a later call, or Finalize).
// - TransferAsync / GetTransferStatus: aiv_submit / aiv_batch_status (PENDING -> WAITING; COMPLETED, FAILED,
//   TIMEOUT map directly); a finished request is freed when its status is reported (reported once).
// - GetCapability: AUTO_CONNECT 1, CLIENT_SERVER_COMM 0.
// - MallocMem / FreeMem: aclrtMalloc / aclrtMallocHost of the loaded runtime, and their frees (the memory is then
//   registrable as device or Host memory).
// - ExportToShareableHandle: UNSUPPORTED (no fabric memory).
//
// Failures return ADXL's codes, each with one stderr line "adxl-over-aiv: <member>: <cause>": PARAM_INVALID (bad
// arguments, a range outside registered memory), TIMEOUT, NOT_CONNECTED, ALREADY_CONNECTED, UNSUPPORTED, FAILED
// (peer lost, the device or engine failing). No C++ exception leaves the library.
//
// Evidence: with AIV_ADXL_EVIDENCE_FILE set, the engine's evidence of every finished batch (aiv_batch_evidence),
// summed, is written to that file as one JSON object after each finished batch and at Finalize.
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "aiv_transport.h"
#include "twin_cann.h"

extern "C" {
// The ACL functions this library calls, from the libascendcl.so the process loaded (acl_rt.h's prototypes).
int aclrtGetDevice(int32_t *device_id);
int aclrtMalloc(void **dev_ptr, size_t size, int policy);
int aclrtFree(void *dev_ptr);
int aclrtMallocHost(void **host_ptr, size_t size);
int aclrtFreeHost(void *host_ptr);
}

namespace {

void log_line(const char *member, const char *format, ...) __attribute__((format(printf, 2, 3)));

void log_line(const char *member, const char *format, ...) {
    char text[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    // One line: a newline inside the cause (an engine message) becomes a space.
    for (char *c = text; *c != '\0'; ++c) {
        if (*c == '\n') {
            *c = ' ';
        }
    }
    fprintf(stderr, "adxl-over-aiv: %s: %s\n", member, text);
}

std::string json_string(const std::string &text) {
    std::string out = "\"";
    for (unsigned char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20) {
            char escaped[8];
            snprintf(escaped, sizeof escaped, "\\u%04x", c);
            out += escaped;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

// The file of the loaded object that defines `symbol` (an absolute path), or "".
std::string object_of(const void *symbol) {
    Dl_info info;
    std::memset(&info, 0, sizeof info);
    if (dladdr(symbol, &info) == 0 || info.dli_fname == nullptr || info.dli_fname[0] == '\0') {
        return "";
    }
    char resolved[PATH_MAX];
    if (realpath(info.dli_fname, resolved) == nullptr) {
        return info.dli_fname;
    }
    return resolved;
}

// Whether the loaded object `path` itself defines `symbol`.
bool defines(const std::string &path, const char *symbol) {
    void *handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) {
        return false;
    }
    void *address = dlsym(handle, symbol);
    bool own = address != nullptr && object_of(address) == path;
    dlclose(handle);
    return own;
}

// Splits "ip:port" or "[ipv6]:port"; false if malformed or the port is not 1..65535.
bool split_endpoint(const std::string &name, std::string &host, int &port) {
    size_t colon = name.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 >= name.size()) {
        return false;
    }
    host = name.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
    }
    const std::string digits = name.substr(colon + 1);
    if (digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos) {
        return false;
    }
    port = std::atoi(digits.c_str());
    return !host.empty() && port > 0 && port <= 65535;
}

// The engine's transfer timeout: ASCEND_TRANSFER_TIMEOUT (the variable Mooncake's transport reads, ms), else 10 s.
uint64_t transfer_timeout_ms() {
    const char *value = getenv("ASCEND_TRANSFER_TIMEOUT");
    if (value != nullptr && *value != '\0') {
        char *end = nullptr;
        unsigned long long parsed = strtoull(value, &end, 10);
        if (end != nullptr && *end == '\0' && parsed > 0) {
            return parsed;
        }
    }
    return 10000;
}

// The engine's message for the last failing call, in one string.
std::string last_error() {
    const char *message = aiv_last_error();
    return message != nullptr ? message : "";
}

// A batch's status message (NULL-safe), freed.
std::string take_message(char *message) {
    std::string out = message != nullptr ? message : "";
    if (message != nullptr) {
        aiv_string_free(message);
    }
    return out;
}

// Sums of the engine's evidence over finished batches.
struct EvidenceTotals {
    uint64_t batches = 0;
    uint64_t transfers = 0;
    aiv_act_counts_t descriptors_written{};
    aiv_act_counts_t doorbells_rung{};
    aiv_act_counts_t completion_seen{};
    double host_launches = 0.0;
    std::map<std::string, uint64_t> submitters;
};

void add_counts(aiv_act_counts_t &sum, const aiv_act_counts_t &more) {
    sum.by_aiv += more.by_aiv;
    sum.by_aicpu += more.by_aicpu;
    sum.by_host += more.by_host;
    sum.unattributed += more.unattributed;
}

std::string counts_json(const aiv_act_counts_t &counts) {
    char text[256];
    snprintf(text, sizeof text, "{\"by_aiv\": %llu, \"by_aicpu\": %llu, \"by_host\": %llu, \"unattributed\": %llu}",
             static_cast<unsigned long long>(counts.by_aiv), static_cast<unsigned long long>(counts.by_aicpu),
             static_cast<unsigned long long>(counts.by_host), static_cast<unsigned long long>(counts.unattributed));
    return text;
}

struct Registration {
    uint64_t addr;
};

struct Request {
    aiv_batch_t batch;
    std::string peer;
};

// Memory MallocMem handed out, by address: whether it is Host memory.
std::mutex g_malloc_mutex;
std::map<void *, bool> g_malloced;

}  // namespace

namespace adxl {

class AdxlEngineImpl {
public:
    std::string name;
    aiv_engine_t *engine = nullptr;
    bool auto_connect = false;
    std::mutex mutex;
    std::map<std::string, aiv_segment_t> peers;
    std::set<Registration *> registrations;
    std::set<Request *> requests;
    // Batches of TransferSync calls that timed out, still running: freed once finished.
    std::vector<aiv_batch_t> orphans;
    // The evidence totals (their own lock: noted with and without `mutex` held).
    std::mutex evidence_mutex;
    EvidenceTotals evidence;
    std::string evidence_file;

    Status Initialize(const std::string &local, const std::map<ge::AscendString, ge::AscendString> &options);
    void Finalize();
    Status Register(const MemDesc &mem, MemType type, MemHandle &handle);
    Status Deregister(MemHandle handle);
    Status Connect(const std::string &peer, int32_t timeout_ms, bool report_already);
    Status Disconnect(const std::string &peer);
    Status Submit(const char *member, const std::string &peer, TransferOp operation,
                  const std::vector<TransferOpDesc> &descs, aiv_batch_t &batch);
    Status Sync(const std::string &peer, TransferOp operation, const std::vector<TransferOpDesc> &descs,
                int32_t timeout_ms);
    Status Async(const std::string &peer, TransferOp operation, const std::vector<TransferOpDesc> &descs,
                 TransferReq &req);
    Status Query(const TransferReq &req, TransferStatus &status);

private:
    Status Finished(const char *member, const std::string &peer, aiv_batch_t batch, const aiv_batch_status_t &status,
                    const std::string &message);
    void ReapOrphans();
    void NoteEvidence(aiv_batch_t batch);
    void WriteEvidence();
};

Status AdxlEngineImpl::Initialize(const std::string &local,
                                  const std::map<ge::AscendString, ge::AscendString> &options) {
    std::string host;
    int port = 0;
    if (!split_endpoint(local, host, port)) {
        log_line("Initialize", "local engine %s is not \"ip:port\" with a port 1..65535", local.c_str());
        return PARAM_INVALID;
    }
    for (const auto &option : options) {
        const std::string key = option.first.GetString();
        const std::string value = option.second.GetString();
        if (key == "AutoConnect") {
            auto_connect = value == "1";
        } else if (key == "EnableUseFabricMem" && value == "1") {
            log_line("Initialize", "option EnableUseFabricMem=1: fabric memory is not supported over aiv");
            return UNSUPPORTED;
        }
    }
    if (aiv_abi_version() != AIV_ABI_VERSION) {
        log_line("Initialize", "libaiv_transport.so has ABI version %d, this library was built for %d",
                 aiv_abi_version(), AIV_ABI_VERSION);
        return FAILED;
    }
    int32_t device = -1;
    if (aclrtGetDevice(&device) != 0 || device < 0) {
        log_line("Initialize", "aclrtGetDevice failed on the calling thread: set the device (aclrtSetDevice) first");
        return FAILED;
    }
    const std::string acl = object_of(reinterpret_cast<const void *>(&aclrtMalloc));
    if (acl.empty()) {
        log_line("Initialize", "cannot find the loaded library that defines aclrtMalloc (dladdr failed)");
        return FAILED;
    }
    std::string libraries = "{\"ascendcl\": " + json_string(acl);
    // The twin runtime is one file holding SHMEM, HiXL and the profiler too: the engine must use that copy.
    if (defines(acl, "aclshmem_my_pe")) {
        libraries += ", \"shmem\": " + json_string(acl);
    }
    if (defines(acl, "HixlCSClientCreate")) {
        libraries += ", \"hixl\": " + json_string(acl);
    }
    if (defines(acl, "aclprofInit")) {
        libraries += ", \"msprofiler\": " + json_string(acl);
    }
    libraries += "}";
    const std::string config = "{\"local_hostname\": " + json_string(host) + ", \"rpc_port\": " +
                               std::to_string(port) +
                               ", \"metadata_server\": \"P2PHANDSHAKE\", \"protocol\": \"aiv\", \"aiv\": "
                               "{\"device_id\": " +
                               std::to_string(device) +
                               ", \"device_backend\": \"cann\", \"transfer_timeout_ms\": " +
                               std::to_string(transfer_timeout_ms()) + "}, \"cann_libraries\": " + libraries + "}";
    int code = aiv_engine_create(config.c_str(), &engine);
    if (code != AIV_OK) {
        engine = nullptr;
        log_line("Initialize", "engine %s on device %d (ACL runtime %s) not created: %s", local.c_str(), device,
                 acl.c_str(), last_error().c_str());
        return FAILED;
    }
    name = local;
    const char *file = getenv("AIV_ADXL_EVIDENCE_FILE");
    if (file != nullptr && *file != '\0') {
        evidence_file = file;
        WriteEvidence();
    }
    return SUCCESS;
}

void AdxlEngineImpl::Finalize() {
    if (engine == nullptr) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex);
        for (aiv_batch_t batch : orphans) {
            aiv_batch_status_t status{};
            // Bounded by the engine's transfer timeout.
            aiv_batch_wait(engine, batch, AIV_WAIT_DEFAULT, &status, nullptr);
            NoteEvidence(batch);
            aiv_batch_free(engine, batch);
        }
        orphans.clear();
        WriteEvidence();
        for (Registration *registration : registrations) {
            delete registration;
        }
        registrations.clear();
        for (Request *request : requests) {
            delete request;
        }
        requests.clear();
        peers.clear();
    }
    if (aiv_engine_destroy(engine) != AIV_OK) {
        log_line("Finalize", "engine %s: %s", name.c_str(), last_error().c_str());
    }
    engine = nullptr;
}

Status AdxlEngineImpl::Register(const MemDesc &mem, MemType type, MemHandle &handle) {
    handle = nullptr;
    if (type != MEM_DEVICE && type != MEM_HOST) {
        log_line("RegisterMem", "unknown memory type %d", static_cast<int>(type));
        return PARAM_INVALID;
    }
    const uint32_t kind = type == MEM_DEVICE ? AIV_MEM_DEVICE : AIV_MEM_HOST;
    int code = aiv_register(engine, mem.addr, mem.len, kind);
    if (code != AIV_OK) {
        log_line("RegisterMem", "%s memory [%#llx, +%zu): %s", type == MEM_DEVICE ? "device" : "Host",
                 static_cast<unsigned long long>(mem.addr), mem.len, last_error().c_str());
        return code == AIV_ERR_INVALID_ARGUMENT || code == AIV_ERR_ADDRESS_OVERLAPPED || code == AIV_ERR_DEVICE
                   ? PARAM_INVALID
                   : FAILED;
    }
    Registration *registration = new (std::nothrow) Registration{mem.addr};
    if (registration == nullptr) {
        aiv_deregister(engine, mem.addr);
        log_line("RegisterMem", "out of memory");
        return RESOURCE_EXHAUSTED;
    }
    std::lock_guard<std::mutex> lock(mutex);
    registrations.insert(registration);
    handle = registration;
    return SUCCESS;
}

Status AdxlEngineImpl::Deregister(MemHandle handle) {
    Registration *registration = static_cast<Registration *>(handle);
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (registrations.erase(registration) == 0) {
            log_line("DeregisterMem", "%p is not a handle RegisterMem returned to this engine", handle);
            return PARAM_INVALID;
        }
    }
    uint64_t addr = registration->addr;
    delete registration;
    if (aiv_deregister(engine, addr) != AIV_OK) {
        log_line("DeregisterMem", "%#llx: %s", static_cast<unsigned long long>(addr), last_error().c_str());
        return FAILED;
    }
    return SUCCESS;
}

Status AdxlEngineImpl::Connect(const std::string &peer, int32_t timeout_ms, bool report_already) {
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (peers.count(peer) != 0) {
            if (report_already) {
                log_line("Connect", "%s is connected already", peer.c_str());
                return ALREADY_CONNECTED;
            }
            return SUCCESS;
        }
    }
    aiv_segment_t segment = 0;
    uint64_t limit = timeout_ms > 0 ? static_cast<uint64_t>(timeout_ms) : 0;
    int code = aiv_segment_open(engine, peer.c_str(), limit, &segment);
    if (code != AIV_OK) {
        log_line("Connect", "%s: %s", peer.c_str(), last_error().c_str());
        return code == AIV_ERR_TIMEOUT ? TIMEOUT : code == AIV_ERR_INVALID_ARGUMENT ? PARAM_INVALID : FAILED;
    }
    std::lock_guard<std::mutex> lock(mutex);
    peers.emplace(peer, segment);
    return SUCCESS;
}

Status AdxlEngineImpl::Disconnect(const std::string &peer) {
    aiv_segment_t segment = 0;
    {
        std::lock_guard<std::mutex> lock(mutex);
        auto found = peers.find(peer);
        if (found == peers.end()) {
            log_line("Disconnect", "%s is not connected", peer.c_str());
            return NOT_CONNECTED;
        }
        segment = found->second;
        peers.erase(found);
    }
    aiv_segment_close(engine, segment);
    return SUCCESS;
}

Status AdxlEngineImpl::Submit(const char *member, const std::string &peer, TransferOp operation,
                              const std::vector<TransferOpDesc> &descs, aiv_batch_t &batch) {
    batch = 0;
    if (operation != READ && operation != WRITE) {
        log_line(member, "unknown operation %d", static_cast<int>(operation));
        return PARAM_INVALID;
    }
    if (descs.empty()) {
        log_line(member, "no descriptors");
        return PARAM_INVALID;
    }
    ReapOrphans();
    aiv_segment_t segment = 0;
    {
        std::lock_guard<std::mutex> lock(mutex);
        auto found = peers.find(peer);
        if (found != peers.end()) {
            segment = found->second;
        }
    }
    if (segment == 0) {
        if (!auto_connect) {
            log_line(member, "%s is not connected (Connect first, or AutoConnect=1)", peer.c_str());
            return NOT_CONNECTED;
        }
        Status connected = Connect(peer, 10000, false);
        if (connected != SUCCESS) {
            return connected == TIMEOUT ? TIMEOUT : NOT_CONNECTED;
        }
        std::lock_guard<std::mutex> lock(mutex);
        auto found = peers.find(peer);
        if (found == peers.end()) {
            log_line(member, "%s was disconnected meanwhile", peer.c_str());
            return NOT_CONNECTED;
        }
        segment = found->second;
    }
    std::vector<aiv_request_t> requests_(descs.size());
    for (size_t i = 0; i < descs.size(); ++i) {
        aiv_request_t &request = requests_[i];
        request.opcode = operation == READ ? AIV_OP_READ : AIV_OP_WRITE;
        request.reserved = 0;
        request.local_addr = descs[i].local_addr;
        request.segment = segment;
        request.remote_addr = descs[i].remote_addr;
        request.length = descs[i].len;
    }
    int code = aiv_submit(engine, requests_.data(), requests_.size(), nullptr, &batch);
    if (code != AIV_OK) {
        log_line(member, "to %s, %zu descriptors: %s", peer.c_str(), descs.size(), last_error().c_str());
        if (code == AIV_ERR_INVALID_HANDLE) {
            // The segment was closed meanwhile (Disconnect by another thread).
            return NOT_CONNECTED;
        }
        return code == AIV_ERR_INVALID_ARGUMENT ? PARAM_INVALID : FAILED;
    }
    return SUCCESS;
}

// A finished batch: its ADXL status (with a log line for a failure), its evidence noted, the batch freed.
Status AdxlEngineImpl::Finished(const char *member, const std::string &peer, aiv_batch_t batch,
                                const aiv_batch_status_t &status, const std::string &message) {
    NoteEvidence(batch);
    aiv_batch_free(engine, batch);
    switch (status.state) {
    case AIV_STATE_COMPLETED:
        return SUCCESS;
    case AIV_STATE_TIMEOUT:
        log_line(member, "to %s: timed out (transfer timeout): %s", peer.c_str(), message.c_str());
        return TIMEOUT;
    default:
        break;
    }
    if (status.error == AIV_ERR_ADDRESS_NOT_REGISTERED || status.error == AIV_ERR_INVALID_ARGUMENT) {
        log_line(member, "to %s: a range outside registered memory, or one aiv cannot reach: %s", peer.c_str(),
                 message.c_str());
        return PARAM_INVALID;
    }
    log_line(member, "to %s: failed (peer lost or the device refused): %s", peer.c_str(), message.c_str());
    // The link is dropped: the next transfer to this peer connects again (and fails if the peer is gone).
    aiv_segment_t segment = 0;
    {
        std::lock_guard<std::mutex> lock(mutex);
        auto found = peers.find(peer);
        if (found != peers.end()) {
            segment = found->second;
            peers.erase(found);
        }
    }
    if (segment != 0) {
        aiv_segment_close(engine, segment);
    }
    return FAILED;
}

Status AdxlEngineImpl::Sync(const std::string &peer, TransferOp operation, const std::vector<TransferOpDesc> &descs,
                            int32_t timeout_ms) {
    aiv_batch_t batch = 0;
    Status submitted = Submit("TransferSync", peer, operation, descs, batch);
    if (submitted != SUCCESS) {
        return submitted;
    }
    aiv_batch_status_t status{};
    char *message = nullptr;
    uint64_t limit = timeout_ms > 0 ? static_cast<uint64_t>(timeout_ms) : AIV_WAIT_DEFAULT;
    int code = aiv_batch_wait(engine, batch, limit, &status, &message);
    std::string text = take_message(message);
    if (code == AIV_ERR_TIMEOUT) {
        log_line("TransferSync", "to %s: %zu descriptors not finished within %d ms", peer.c_str(), descs.size(),
                 timeout_ms);
        std::lock_guard<std::mutex> lock(mutex);
        orphans.push_back(batch);
        return TIMEOUT;
    }
    if (code != AIV_OK) {
        log_line("TransferSync", "to %s: wait failed: %s", peer.c_str(), last_error().c_str());
        std::lock_guard<std::mutex> lock(mutex);
        orphans.push_back(batch);
        return FAILED;
    }
    return Finished("TransferSync", peer, batch, status, text);
}

Status AdxlEngineImpl::Async(const std::string &peer, TransferOp operation, const std::vector<TransferOpDesc> &descs,
                             TransferReq &req) {
    req = nullptr;
    Request *request = new (std::nothrow) Request{0, peer};
    if (request == nullptr) {
        log_line("TransferAsync", "out of memory");
        return RESOURCE_EXHAUSTED;
    }
    Status submitted = Submit("TransferAsync", peer, operation, descs, request->batch);
    if (submitted != SUCCESS) {
        delete request;
        return submitted;
    }
    std::lock_guard<std::mutex> lock(mutex);
    requests.insert(request);
    req = request;
    return SUCCESS;
}

Status AdxlEngineImpl::Query(const TransferReq &req, TransferStatus &status) {
    Request *request = static_cast<Request *>(req);
    aiv_batch_t batch = 0;
    std::string peer;
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (requests.count(request) == 0) {
            log_line("GetTransferStatus", "%p is not a pending request of this engine (or was reported already)", req);
            status = TransferStatus::FAILED;
            return PARAM_INVALID;
        }
        batch = request->batch;
        peer = request->peer;
    }
    aiv_batch_status_t batch_status{};
    char *message = nullptr;
    if (aiv_batch_status(engine, batch, &batch_status, &message) != AIV_OK) {
        log_line("GetTransferStatus", "%s", last_error().c_str());
        status = TransferStatus::FAILED;
        return FAILED;
    }
    std::string text = take_message(message);
    if (batch_status.state == AIV_STATE_PENDING) {
        status = TransferStatus::WAITING;
        return SUCCESS;
    }
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (requests.erase(request) == 0) {
            // Another thread reported it meanwhile.
            status = TransferStatus::FAILED;
            return PARAM_INVALID;
        }
    }
    delete request;
    Status outcome = Finished("GetTransferStatus", peer, batch, batch_status, text);
    status = outcome == SUCCESS   ? TransferStatus::COMPLETED
             : outcome == TIMEOUT ? TransferStatus::TIMEOUT
                                  : TransferStatus::FAILED;
    return SUCCESS;
}

void AdxlEngineImpl::ReapOrphans() {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = orphans.begin(); it != orphans.end();) {
        aiv_batch_status_t status{};
        if (aiv_batch_status(engine, *it, &status, nullptr) == AIV_OK && status.state == AIV_STATE_PENDING) {
            ++it;
            continue;
        }
        NoteEvidence(*it);
        aiv_batch_free(engine, *it);
        it = orphans.erase(it);
    }
}

void AdxlEngineImpl::NoteEvidence(aiv_batch_t batch) {
    if (evidence_file.empty()) {
        return;
    }
    aiv_evidence_t found{};
    if (aiv_batch_evidence(engine, batch, &found, nullptr) != AIV_OK) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(evidence_mutex);
        evidence.batches += 1;
        evidence.transfers += found.transfers;
        add_counts(evidence.descriptors_written, found.descriptors_written);
        add_counts(evidence.doorbells_rung, found.doorbells_rung);
        add_counts(evidence.completion_seen, found.completion_seen);
        evidence.host_launches += found.host_launches;
        found.submitter_word[sizeof found.submitter_word - 1] = '\0';
        evidence.submitters[found.submitter_word] += 1;
    }
    WriteEvidence();
}

// The evidence totals as one JSON object, written to a temporary file renamed over AIV_ADXL_EVIDENCE_FILE.
void AdxlEngineImpl::WriteEvidence() {
    if (evidence_file.empty()) {
        return;
    }
    std::lock_guard<std::mutex> lock(evidence_mutex);
    std::string submitters = "{";
    for (const auto &entry : evidence.submitters) {
        submitters += (submitters.size() > 1 ? ", " : "") + json_string(entry.first) + ": " +
                      std::to_string(entry.second);
    }
    submitters += "}";
    char launches[64];
    snprintf(launches, sizeof launches, "%.3f", evidence.host_launches);
    const std::string text = "{\"engine\": " + json_string(name) + ", \"batches\": " +
                             std::to_string(evidence.batches) + ", \"transfers\": " +
                             std::to_string(evidence.transfers) + ", \"submitters\": " + submitters +
                             ", \"descriptors_written\": " + counts_json(evidence.descriptors_written) +
                             ", \"doorbells_rung\": " + counts_json(evidence.doorbells_rung) +
                             ", \"completion_seen\": " + counts_json(evidence.completion_seen) +
                             ", \"host_launches\": " + launches + "}\n";
    const std::string temporary = evidence_file + ".tmp";
    FILE *file = fopen(temporary.c_str(), "w");
    if (file == nullptr) {
        log_line("evidence", "cannot write %s", temporary.c_str());
        return;
    }
    bool written = fwrite(text.data(), 1, text.size(), file) == text.size();
    written = fclose(file) == 0 && written;
    if (!written || rename(temporary.c_str(), evidence_file.c_str()) != 0) {
        log_line("evidence", "cannot write %s", evidence_file.c_str());
    }
}

// ----- The members the wheel imports. -----

namespace {

// Runs `body` on the engine, mapping a missing engine and any exception to FAILED with a log line.
template <typename Body>
Status with_engine(const char *member, const std::unique_ptr<AdxlEngineImpl> &impl, Body body) {
    try {
        if (!impl || impl->engine == nullptr) {
            log_line(member, "the engine is not initialized (Initialize first)");
            return FAILED;
        }
        return body(*impl);
    } catch (const std::exception &error) {
        log_line(member, "internal error: %s", error.what());
        return FAILED;
    } catch (...) {
        log_line(member, "internal error");
        return FAILED;
    }
}

}  // namespace

AdxlEngine::AdxlEngine() = default;

AdxlEngine::~AdxlEngine() {
    try {
        Finalize();
    } catch (...) {
    }
}

Status AdxlEngine::Initialize(const ge::AscendString &local_engine,
                              const std::map<ge::AscendString, ge::AscendString> &options) {
    try {
        if (impl_ && impl_->engine != nullptr) {
            log_line("Initialize", "engine %s is initialized already", impl_->name.c_str());
            return FAILED;
        }
        impl_.reset(new (std::nothrow) AdxlEngineImpl());
        if (!impl_) {
            log_line("Initialize", "out of memory");
            return RESOURCE_EXHAUSTED;
        }
        Status status = impl_->Initialize(local_engine.GetString(), options);
        if (status != SUCCESS) {
            impl_.reset();
        }
        return status;
    } catch (const std::exception &error) {
        log_line("Initialize", "internal error: %s", error.what());
    } catch (...) {
        log_line("Initialize", "internal error");
    }
    impl_.reset();
    return FAILED;
}

void AdxlEngine::Finalize() {
    try {
        if (impl_) {
            impl_->Finalize();
            impl_.reset();
        }
    } catch (...) {
        log_line("Finalize", "internal error");
    }
}

Status AdxlEngine::RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle) {
    mem_handle = nullptr;
    return with_engine("RegisterMem", impl_, [&](AdxlEngineImpl &e) { return e.Register(mem, type, mem_handle); });
}

Status AdxlEngine::DeregisterMem(MemHandle mem_handle) {
    return with_engine("DeregisterMem", impl_, [&](AdxlEngineImpl &e) { return e.Deregister(mem_handle); });
}

Status AdxlEngine::Connect(const ge::AscendString &remote_engine, int32_t timeout_in_millis) {
    return with_engine("Connect", impl_,
                       [&](AdxlEngineImpl &e) { return e.Connect(remote_engine.GetString(), timeout_in_millis, true); });
}

Status AdxlEngine::Disconnect(const ge::AscendString &remote_engine, int32_t timeout_in_millis) {
    (void)timeout_in_millis;
    return with_engine("Disconnect", impl_, [&](AdxlEngineImpl &e) { return e.Disconnect(remote_engine.GetString()); });
}

Status AdxlEngine::TransferSync(const ge::AscendString &remote_engine, TransferOp operation,
                                const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis) {
    return with_engine("TransferSync", impl_, [&](AdxlEngineImpl &e) {
        return e.Sync(remote_engine.GetString(), operation, op_descs, timeout_in_millis);
    });
}

Status AdxlEngine::TransferAsync(const ge::AscendString &remote_engine, TransferOp operation,
                                 const std::vector<TransferOpDesc> &op_descs, const TransferArgs &optional_args,
                                 TransferReq &req) {
    (void)optional_args;
    req = nullptr;
    return with_engine("TransferAsync", impl_,
                       [&](AdxlEngineImpl &e) { return e.Async(remote_engine.GetString(), operation, op_descs, req); });
}

Status AdxlEngine::GetTransferStatus(const TransferReq &req, TransferStatus &status) {
    status = TransferStatus::FAILED;
    return with_engine("GetTransferStatus", impl_, [&](AdxlEngineImpl &e) { return e.Query(req, status); });
}

Status AdxlEngine::GetCapability(FeatureType type, int32_t &value) {
    switch (type) {
    case AUTO_CONNECT:
        value = 1;
        return SUCCESS;
    case CLIENT_SERVER_COMM:
        value = 0;
        return SUCCESS;
    }
    value = 0;
    log_line("GetCapability", "unknown feature %d", static_cast<int>(type));
    return PARAM_INVALID;
}

Status AdxlEngine::MallocMem(MemType type, size_t size, void **ptr) {
    try {
        if (ptr == nullptr || size == 0 || (type != MEM_DEVICE && type != MEM_HOST)) {
            log_line("MallocMem", "needs a pointer, a size above 0 and MEM_DEVICE or MEM_HOST");
            return PARAM_INVALID;
        }
        *ptr = nullptr;
        int code = type == MEM_DEVICE ? aclrtMalloc(ptr, size, 0) : aclrtMallocHost(ptr, size);
        if (code != 0 || *ptr == nullptr) {
            log_line("MallocMem", "%s of %zu bytes failed with ACL code %d", type == MEM_DEVICE ? "aclrtMalloc"
                     : "aclrtMallocHost", size, code);
            *ptr = nullptr;
            return RESOURCE_EXHAUSTED;
        }
        std::lock_guard<std::mutex> lock(g_malloc_mutex);
        g_malloced[*ptr] = type == MEM_HOST;
        return SUCCESS;
    } catch (...) {
        log_line("MallocMem", "internal error");
        return FAILED;
    }
}

Status AdxlEngine::FreeMem(void *ptr) {
    try {
        bool host = false;
        {
            std::lock_guard<std::mutex> lock(g_malloc_mutex);
            auto found = g_malloced.find(ptr);
            if (found == g_malloced.end()) {
                log_line("FreeMem", "%p is not memory MallocMem returned", ptr);
                return PARAM_INVALID;
            }
            host = found->second;
            g_malloced.erase(found);
        }
        int code = host ? aclrtFreeHost(ptr) : aclrtFree(ptr);
        if (code != 0) {
            log_line("FreeMem", "%s(%p) failed with ACL code %d", host ? "aclrtFreeHost" : "aclrtFree", ptr, code);
            return FAILED;
        }
        return SUCCESS;
    } catch (...) {
        log_line("FreeMem", "internal error");
        return FAILED;
    }
}

Status AdxlEngine::ExportToShareableHandle(void *addr, aclrtMemFabricHandle &handle) {
    (void)addr;
    std::memset(&handle, 0, sizeof handle);
    log_line("ExportToShareableHandle", "fabric memory handles are not supported over aiv");
    return UNSUPPORTED;
}

}  // namespace adxl
