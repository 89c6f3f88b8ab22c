// libllm_datadist.so of the twin: adxl::AdxlEngine (docs/mooncake-npu-wheel.md section 5), a thin C++ shim that
// selects its engine as the vendor's does and runs it on the twin runtime (libascendcl.so, the cann-twin cdylib).
// Twin runtime, unverified on hardware.
//
// Selection: Initialize(local_engine, options) asks the runtime's twin-only cannTwinAdxlSelectEngine
// (shmem-bindings/cann-twin/src/adxl_options.rs), which parses and checks the options and picks the engine in the
// order of HiXL's EngineFactory::CreateEngine (hicann/hixl src/hixl/engine/engine_factory.cc, called by the vendor's
// AdxlEngine::Initialize in src/llm_datadist/api/adxl_engine_impl.cc): EnableUseFabricMem "1" -> FabricMem;
// LocalCommRes JSON with version "1.3", or a GlobalResourceConfig comm_resource_config.protocol_desc -> the
// client-server engine; otherwise the communication-domain engine. The choice is logged to stderr as the vendor's
// LogSelectedEngine event ("adxl-twin: selected engine:<name>, reason:<why>, local_engine:<name>").
//
// - hixl_cs (CsEngine): HiXL's plain C client-server API of the runtime (HixlCS*, shmem-bindings/cann-twin/src/hixl.rs),
//   as HixlEngine and its DirectClientHandler drive it (src/hixl/engine/hixl_engine.cc, direct_client_handler.cc): a
//   server on the engine's own ip:port holding every registration, a client per remote engine (its registrations,
//   then Connect), TransferSync -> HixlCSClientBatchPutSync / GetSync, TransferAsync -> ...PutAsync / GetAsync, and
//   GetTransferStatus -> HixlCSClientQueryCompleteStatus. HiXL's codes are ADXL's (the handler casts them); complete
//   statuses map as ToTransferStatus (src/hixl/engine/client_handler.h). On the twin a batch between device memory
//   runs on the emulated AI CPU.
// - fabric_mem (FabricEngine): the runtime's twin-only cannTwinFabricMem* functions
//   (shmem-bindings/cann-twin/src/hixl/fabric_mem.rs), AI-CPU or Host unfold.
// - comm (TcpEngine): the twin's stand-in for the HCCL communication-domain engine, which the twin does not model:
//   its own TCP protocol between twin processes, each side reaching its own memory only with its own aclrtMemcpy
//   (Host-submitted).
//
// The HiXL and twin-only functions are resolved at run time from the libascendcl.so this library links (dlsym on the
// object that defines aclrtMemcpy), so the library loads against a runtime without them; Initialize then fails with
// FAILED and a log line naming the missing function. No C++ exception leaves the library: a member that meets one
// returns FAILED.
//
// TcpEngine's model: Initialize("ip:port") listens on exactly ip:port (port > 0). A transfer to a remote engine
// ("ip:port" of its Initialize) runs on one TCP connection to it, opened by Connect or, with AutoConnect=1, by the
// first transfer. Every local range must lie inside memory this engine registered with RegisterMem and every remote
// range inside memory the peer registered: the peer checks all ranges of a request before any byte moves; a range
// outside is refused with PARAM_INVALID. Each socket wait is bounded: a transfer by its timeout (10 s when not
// positive), the peer's side of a request by 60 s per 1 MiB chunk, a connect by its timeout. TransferAsync runs the
// transfer before it returns and GetTransferStatus reports the outcome once.
//
// TcpEngine's wire format (little-endian, the twin's own): hello {u32 magic, u32 version} answered by {u32 magic, u32
// status}; request {u32 magic, u32 op, u64 count, count x {u64 remote_addr, u64 len}} answered by {u32 status}; when
// that is SUCCESS the data follows (WRITE: client to peer, READ: peer to client, the ranges' bytes in order), then the
// peer sends {u32 status} of the copies on its side.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <mutex>
#include <new>
#include <set>
#include <shared_mutex>
#include <thread>

#include "twin_cann.h"

extern "C" {
typedef int aclError;
typedef void *aclrtContext;
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind);
aclError aclrtMalloc(void **devPtr, size_t size, int policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMallocHost(void **hostPtr, size_t size);
aclError aclrtFreeHost(void *hostPtr);
aclError aclrtGetDevice(int32_t *deviceId);
// Twin-only, not a CANN function (shmem-bindings/cann-twin/src/evidence.rs): counts ADXL work for cannTwinEvidence.
// Weak, so that this library still loads against a libascendcl.so without it.
int cannTwinEvidenceNote(unsigned int what, unsigned long long count) __attribute__((weak));
aclError aclrtGetCurrentContext(aclrtContext *context);
aclError aclrtSetCurrentContext(aclrtContext context);

// HiXL's C client-server API (hicann/hixl include/cs/hixl_cs.h and the hcomm types it includes; layouts as
// ascendcl_sys::hixl pins them).
typedef uint32_t HixlStatus;
typedef void *HixlServerHandle;
typedef void *HixlClientHandle;
typedef void *CompleteHandle;
typedef void *HixlMemHandle;
struct EndpointDesc {
    int32_t protocol;
    int32_t addr_type;
    uint8_t addr[36];
    int32_t loc_type;
    uint8_t loc[60];
    uint8_t raws[52];
};
struct CommMem {
    int32_t type;
    void *addr;
    uint64_t size;
};
struct HixlServerConfig {
    const char *global_resource_config;
    uint8_t reserved[120];
};
struct HixlClientConfig {
    const char *global_resource_config;
    uint8_t reserved[120];
};
struct HixlServerDesc {
    const EndpointDesc *endpoint_list;
    const char *server_ip;
    uint32_t server_port;
    uint32_t endpoint_list_num;
    uint8_t reserved[104];
};
struct HixlClientDesc {
    const EndpointDesc *local_endpoint;
    const EndpointDesc *remote_endpoint;
    const char *server_ip;
    uint32_t server_port;
    uint8_t tc;
    uint8_t sl;
    uint8_t reserved[98];
};
struct HixlOneSideOpDesc {
    void *remote_buf;
    void *local_buf;
    uint64_t len;
};

// The twin-only engine selection (shmem-bindings/cann-twin/src/adxl_options.rs, CannTwinAdxlSelection).
struct CannTwinAdxlSelection {
    uint32_t version;
    uint32_t engine;
    int32_t auto_connect;
    uint32_t aicpu_unfold;
    uint32_t task_stream_num;
    uint32_t reserved;
    char reason[96];
    char error[256];
};
}

static_assert(sizeof(EndpointDesc) == 160, "EndpointDesc layout");
static_assert(sizeof(CommMem) == 24, "CommMem layout");
static_assert(sizeof(HixlServerDesc) == 128 && sizeof(HixlClientDesc) == 128, "HiXL descriptions");
static_assert(sizeof(HixlServerConfig) == 128 && sizeof(HixlClientConfig) == 128, "HiXL configurations");
static_assert(sizeof(HixlOneSideOpDesc) == 24, "HixlOneSideOpDesc layout");
static_assert(sizeof(CannTwinAdxlSelection) == 376, "CannTwinAdxlSelection layout");

namespace adxl {
namespace {

constexpr int ACL_MEMCPY_DEFAULT = 4;
constexpr uint32_t MAGIC = 0x54584441U;  // "ADXT"
constexpr uint32_t VERSION = 1U;
constexpr uint64_t MAX_DESCS = 1U << 20;
constexpr size_t CHUNK = 1U << 20;
constexpr int DEFAULT_TIMEOUT_MS = 10000;
constexpr int PEER_REQUEST_TIMEOUT_MS = 60000;
constexpr int IDLE_POLL_MS = 200;

using Clock = std::chrono::steady_clock;

void log_error(const char *what, const std::string &detail) {
    std::fprintf(stderr, "adxl-twin: %s: %s\n", what, detail.c_str());
}

Clock::time_point deadline_after(int ms) {
    return Clock::now() + std::chrono::milliseconds(ms > 0 ? ms : DEFAULT_TIMEOUT_MS);
}

// Waits until `fd` is ready for `events` or the deadline passes: 1 ready, 0 timed out, -1 error.
int wait_fd(int fd, short events, Clock::time_point deadline) {
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) {
            return 0;
        }
        pollfd p{fd, events, 0};
        int r = ::poll(&p, 1, static_cast<int>(left > 1000 ? 1000 : left));
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return -1;
        }
        if (r > 0) {
            return (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & events) ? -1 : 1;
        }
    }
}

// Sends or receives exactly n bytes before the deadline: SUCCESS, TIMEOUT or FAILED (error or peer closed).
Status send_all(int fd, const void *data, size_t n, Clock::time_point deadline) {
    const char *p = static_cast<const char *>(data);
    while (n > 0) {
        ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= static_cast<size_t>(w);
            continue;
        }
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int r = wait_fd(fd, POLLOUT, deadline);
            if (r == 0) {
                return TIMEOUT;
            }
            if (r < 0) {
                return FAILED;
            }
            continue;
        }
        return FAILED;
    }
    return SUCCESS;
}

Status recv_all(int fd, void *data, size_t n, Clock::time_point deadline) {
    char *p = static_cast<char *>(data);
    while (n > 0) {
        ssize_t r = ::recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= static_cast<size_t>(r);
            continue;
        }
        if (r == 0) {
            return FAILED;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int w = wait_fd(fd, POLLIN, deadline);
            if (w == 0) {
                return TIMEOUT;
            }
            if (w < 0) {
                return FAILED;
            }
            continue;
        }
        return FAILED;
    }
    return SUCCESS;
}

void set_nonblocking(int fd) {
    int flags = ::fcntl(fd, F_GETFL, 0);
    if (flags >= 0) {
        ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    }
}

// "ip:port" or "[ip]:port" into host and port; false when malformed.
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
    port = std::stoi(digits);
    return port >= 0 && port <= 65535 && !host.empty();
}

addrinfo *resolve(const std::string &host, int port, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    addrinfo *out = nullptr;
    const std::string service = std::to_string(port);
    if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &out) != 0) {
        return nullptr;
    }
    return out;
}

struct WireRange {
    uint64_t addr;
    uint64_t len;
};

struct Region {
    uintptr_t addr;
    size_t len;
    MemType type;
};

struct Connection {
    std::mutex mu;  // one transfer at a time on the socket
    int fd = -1;
    ~Connection() {
        if (fd >= 0) {
            ::close(fd);
        }
    }
};

struct ServerConnection {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
};

std::mutex g_alloc_mu;
std::map<void *, MemType> g_allocations;  // MallocMem's allocations

}  // namespace

// What every engine does for AdxlEngine (the vendor's hixl::Engine, src/hixl/engine/engine.h).
class Engine {
public:
    virtual ~Engine() = default;
    virtual void Finalize() = 0;
    virtual Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &handle) = 0;
    virtual Status DeregisterMem(MemHandle handle) = 0;
    virtual Status Connect(const std::string &remote, int32_t timeout_ms) = 0;
    virtual Status Disconnect(const std::string &remote, int32_t timeout_ms) = 0;
    virtual Status Transfer(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                            int32_t timeout_ms) = 0;
    virtual Status Submit(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                          TransferReq &req) = 0;
    virtual Status Status_(const TransferReq &req, TransferStatus &status) = 0;
};


class TcpEngine final : public Engine {
public:
    ~TcpEngine() override { Finalize(); }

    Status Initialize(const std::string &local, bool auto_connect);
    void Finalize() override;
    Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &handle) override;
    Status DeregisterMem(MemHandle handle) override;
    Status Connect(const std::string &remote, int32_t timeout_ms) override;
    Status Disconnect(const std::string &remote, int32_t timeout_ms) override;
    Status Transfer(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                    int32_t timeout_ms) override;
    Status Submit(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                  TransferReq &req) override;
    Status Status_(const TransferReq &req, TransferStatus &status) override;

private:
    bool contains(uintptr_t addr, size_t len) const;  // callers hold regions_mu
    Status dial(const std::string &remote, int32_t timeout_ms, std::shared_ptr<Connection> &out);
    Status exchange(Connection &conn, TransferOp op, const std::vector<TransferOpDesc> &descs,
                    Clock::time_point deadline);
    void accept_loop();
    void serve(ServerConnection *conn);
    void serve_connection(int fd);
    Status serve_request(int fd, uint32_t op, uint64_t count);

    std::mutex mu_;
    bool initialized_ = false;
    std::string local_;
    bool auto_connect_ = false;
    aclrtContext context_ = nullptr;

    mutable std::shared_mutex regions_mu_;
    std::map<Region *, std::unique_ptr<Region>> regions_;

    std::mutex peers_mu_;
    std::map<std::string, std::shared_ptr<Connection>> peers_;

    int listen_fd_ = -1;
    std::atomic<bool> stopping_{false};
    std::thread acceptor_;
    std::mutex servers_mu_;
    std::list<std::unique_ptr<ServerConnection>> servers_;

    std::mutex requests_mu_;
    std::map<void *, Status> requests_;
    uintptr_t next_request_ = 0;
};

Status TcpEngine::Initialize(const std::string &local, bool auto_connect) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string host;
    int port = 0;
    if (!split_endpoint(local, host, port)) {
        log_error("Initialize", "engine name is not ip:port: " + local);
        return PARAM_INVALID;
    }
    auto_connect_ = auto_connect;
    aclrtContext context = nullptr;
    if (aclrtGetCurrentContext(&context) == 0) {
        context_ = context;
    }
    if (port > 0) {
        addrinfo *addrs = resolve(host, port, true);
        if (addrs == nullptr) {
            log_error("Initialize", "cannot resolve " + host);
            return PARAM_INVALID;
        }
        int fd = -1;
        for (addrinfo *a = addrs; a != nullptr && fd < 0; a = a->ai_next) {
            fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) {
                continue;
            }
            int one = 1;
            ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
            if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
                ::close(fd);
                fd = -1;
            }
        }
        int bind_errno = errno;
        ::freeaddrinfo(addrs);
        if (fd < 0) {
            log_error("Initialize", "cannot listen on " + local + ": " + std::strerror(bind_errno));
            return FAILED;
        }
        set_nonblocking(fd);
        listen_fd_ = fd;
        stopping_ = false;
        try {
            acceptor_ = std::thread([this] { accept_loop(); });
        } catch (const std::exception &error) {
            log_error("Initialize", error.what());
            ::close(fd);
            listen_fd_ = -1;
            return FAILED;
        }
    }
    local_ = local;
    initialized_ = true;
    return SUCCESS;
}

void TcpEngine::Finalize() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (acceptor_.joinable()) {
        acceptor_.join();
    }
    if (listen_fd_ >= 0) {
        ::close(listen_fd_);
        listen_fd_ = -1;
    }
    std::list<std::unique_ptr<ServerConnection>> servers;
    {
        std::lock_guard<std::mutex> guard(servers_mu_);
        servers.swap(servers_);
        for (auto &server : servers) {
            ::shutdown(server->fd, SHUT_RDWR);
        }
    }
    for (auto &server : servers) {
        if (server->thread.joinable()) {
            server->thread.join();
        }
        ::close(server->fd);
    }
    {
        std::lock_guard<std::mutex> guard(peers_mu_);
        peers_.clear();
    }
    initialized_ = false;
}

bool TcpEngine::contains(uintptr_t addr, size_t len) const {
    if (len == 0) {
        return true;
    }
    if (addr + len < addr) {
        return false;
    }
    for (const auto &entry : regions_) {
        const Region &r = *entry.second;
        if (addr >= r.addr && addr + len <= r.addr + r.len) {
            return true;
        }
    }
    return false;
}

Status TcpEngine::RegisterMem(const MemDesc &mem, MemType type, MemHandle &handle) {
    if (mem.addr == 0 || mem.len == 0 || mem.addr + mem.len < mem.addr || (type != MEM_DEVICE && type != MEM_HOST)) {
        return PARAM_INVALID;
    }
    auto region = std::make_unique<Region>(Region{mem.addr, mem.len, type});
    Region *key = region.get();
    std::unique_lock<std::shared_mutex> lock(regions_mu_);
    regions_.emplace(key, std::move(region));
    handle = key;
    return SUCCESS;
}

Status TcpEngine::DeregisterMem(MemHandle handle) {
    std::unique_lock<std::shared_mutex> lock(regions_mu_);
    auto it = regions_.find(static_cast<Region *>(handle));
    if (it == regions_.end()) {
        return PARAM_INVALID;
    }
    regions_.erase(it);
    return SUCCESS;
}

Status TcpEngine::dial(const std::string &remote, int32_t timeout_ms, std::shared_ptr<Connection> &out) {
    std::string host;
    int port = 0;
    if (!split_endpoint(remote, host, port) || port == 0) {
        log_error("Connect", "remote engine name is not ip:port: " + remote);
        return PARAM_INVALID;
    }
    auto deadline = deadline_after(timeout_ms);
    addrinfo *addrs = resolve(host, port, false);
    if (addrs == nullptr) {
        log_error("Connect", "cannot resolve " + host);
        return FAILED;
    }
    Status status = FAILED;
    int fd = -1;
    for (addrinfo *a = addrs; a != nullptr && fd < 0; a = a->ai_next) {
        fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            continue;
        }
        set_nonblocking(fd);
        int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline);
            int error = 0;
            socklen_t len = sizeof(error);
            if (w == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0) {
                r = 0;
            } else if (w == 0) {
                status = TIMEOUT;
            }
        }
        if (r != 0) {
            ::close(fd);
            fd = -1;
        }
    }
    ::freeaddrinfo(addrs);
    if (fd < 0) {
        log_error("Connect", "cannot connect to " + remote + (status == TIMEOUT ? " (timed out)" : ""));
        return status;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto conn = std::make_shared<Connection>();
    conn->fd = fd;
    uint32_t hello[2] = {MAGIC, VERSION};
    uint32_t answer[2] = {0, 0};
    status = send_all(fd, hello, sizeof(hello), deadline);
    if (status == SUCCESS) {
        status = recv_all(fd, answer, sizeof(answer), deadline);
    }
    if (status == SUCCESS && (answer[0] != MAGIC || answer[1] != SUCCESS)) {
        status = FAILED;
    }
    if (status != SUCCESS) {
        log_error("Connect", "no twin ADXL engine answered at " + remote);
        return status;
    }
    out = std::move(conn);
    return SUCCESS;
}

Status TcpEngine::Connect(const std::string &remote, int32_t timeout_ms) {
    {
        std::lock_guard<std::mutex> lock(peers_mu_);
        if (peers_.count(remote) != 0) {
            return ALREADY_CONNECTED;
        }
    }
    std::shared_ptr<Connection> conn;
    Status status = dial(remote, timeout_ms, conn);
    if (status != SUCCESS) {
        return status;
    }
    std::lock_guard<std::mutex> lock(peers_mu_);
    if (!peers_.emplace(remote, conn).second) {
        return ALREADY_CONNECTED;
    }
    return SUCCESS;
}

Status TcpEngine::Disconnect(const std::string &remote, int32_t) {
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(peers_mu_);
        auto it = peers_.find(remote);
        if (it == peers_.end()) {
            return NOT_CONNECTED;
        }
        conn = it->second;
        peers_.erase(it);
    }
    // A transfer still running on it keeps the connection alive until it ends (bounded by its timeout).
    return SUCCESS;
}

Status TcpEngine::exchange(Connection &conn, TransferOp op, const std::vector<TransferOpDesc> &descs,
                                Clock::time_point deadline) {
    const int fd = conn.fd;
    std::vector<char> header(16 + descs.size() * sizeof(WireRange));
    uint32_t head[2] = {MAGIC, static_cast<uint32_t>(op)};
    uint64_t count = descs.size();
    std::memcpy(header.data(), head, 8);
    std::memcpy(header.data() + 8, &count, 8);
    for (size_t i = 0; i < descs.size(); ++i) {
        WireRange range{descs[i].remote_addr, descs[i].len};
        std::memcpy(header.data() + 16 + i * sizeof(WireRange), &range, sizeof(range));
    }
    Status status = send_all(fd, header.data(), header.size(), deadline);
    uint32_t peer_status = 0;
    if (status == SUCCESS) {
        status = recv_all(fd, &peer_status, sizeof(peer_status), deadline);
    }
    if (status != SUCCESS) {
        return status;
    }
    if (peer_status != SUCCESS) {
        return peer_status == PARAM_INVALID ? PARAM_INVALID : FAILED;  // the connection stays in step
    }
    std::vector<char> chunk(CHUNK);
    Status local = SUCCESS;
    for (const auto &desc : descs) {
        for (size_t off = 0; off < desc.len; off += CHUNK) {
            size_t n = desc.len - off < CHUNK ? desc.len - off : CHUNK;
            void *local_addr = reinterpret_cast<void *>(desc.local_addr + off);
            if (op == WRITE) {
                if (aclrtMemcpy(chunk.data(), n, local_addr, n, ACL_MEMCPY_DEFAULT) != 0) {
                    local = FAILED;  // keep the stream in step; the bytes sent are garbage, reported as failure
                }
                status = send_all(fd, chunk.data(), n, deadline);
            } else {
                status = recv_all(fd, chunk.data(), n, deadline);
                if (status == SUCCESS && local == SUCCESS &&
                    aclrtMemcpy(local_addr, n, chunk.data(), n, ACL_MEMCPY_DEFAULT) != 0) {
                    local = FAILED;
                }
            }
            if (status != SUCCESS) {
                return status;
            }
        }
    }
    status = recv_all(fd, &peer_status, sizeof(peer_status), deadline);
    if (status != SUCCESS) {
        return status;
    }
    if (local != SUCCESS) {
        log_error("Transfer", "a copy through the local ACL runtime failed");
        return FAILED;
    }
    return peer_status == SUCCESS ? SUCCESS : FAILED;
}

Status TcpEngine::Transfer(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                                int32_t timeout_ms) {
    if (op != READ && op != WRITE) {
        return PARAM_INVALID;
    }
    if (descs.size() > MAX_DESCS) {
        return PARAM_INVALID;
    }
    auto deadline = deadline_after(timeout_ms);
    std::shared_lock<std::shared_mutex> regions(regions_mu_);
    for (const auto &desc : descs) {
        if (!contains(desc.local_addr, desc.len) || desc.remote_addr + desc.len < desc.remote_addr) {
            log_error("Transfer", "a local range is not inside memory registered with this engine");
            return PARAM_INVALID;
        }
    }
    if (descs.empty()) {
        return SUCCESS;
    }
    std::shared_ptr<Connection> conn;
    {
        std::lock_guard<std::mutex> lock(peers_mu_);
        auto it = peers_.find(remote);
        if (it != peers_.end()) {
            conn = it->second;
        }
    }
    if (!conn) {
        if (!auto_connect_) {
            return NOT_CONNECTED;
        }
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        Status status = dial(remote, static_cast<int32_t>(left > 0 ? left : 1), conn);
        if (status != SUCCESS) {
            return status;
        }
        std::lock_guard<std::mutex> lock(peers_mu_);
        auto inserted = peers_.emplace(remote, conn);
        conn = inserted.first->second;
    }
    std::lock_guard<std::mutex> lock(conn->mu);
    Status status = exchange(*conn, op, descs, deadline);
    if (status != SUCCESS && status != PARAM_INVALID) {
        // Out of step or gone: drop the connection; a later transfer dials again.
        std::lock_guard<std::mutex> guard(peers_mu_);
        auto it = peers_.find(remote);
        if (it != peers_.end() && it->second == conn) {
            peers_.erase(it);
        }
        if (status == TIMEOUT) {
            log_error("Transfer", "timed out with " + remote);
        }
    }
    if (status == PARAM_INVALID) {
        log_error("Transfer", "the peer " + remote + " refused a range outside its registered memory");
    }
    return status;
}

Status TcpEngine::Submit(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                              TransferReq &req) {
    Status status = Transfer(remote, op, descs, DEFAULT_TIMEOUT_MS);
    std::lock_guard<std::mutex> lock(requests_mu_);
    next_request_ += 16;
    void *key = reinterpret_cast<void *>(0x5e9e000000000000ULL + next_request_);
    requests_.emplace(key, status);
    req = key;
    return SUCCESS;
}

Status TcpEngine::Status_(const TransferReq &req, TransferStatus &status) {
    std::lock_guard<std::mutex> lock(requests_mu_);
    auto it = requests_.find(req);
    if (it == requests_.end()) {
        return PARAM_INVALID;
    }
    status = it->second == SUCCESS ? TransferStatus::COMPLETED
             : it->second == TIMEOUT ? TransferStatus::TIMEOUT
                                     : TransferStatus::FAILED;
    requests_.erase(it);
    return SUCCESS;
}

void TcpEngine::accept_loop() {
    while (!stopping_) {
        int r = wait_fd(listen_fd_, POLLIN, Clock::now() + std::chrono::milliseconds(IDLE_POLL_MS));
        if (r != 1) {
            continue;
        }
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            continue;
        }
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        std::lock_guard<std::mutex> lock(servers_mu_);
        for (auto it = servers_.begin(); it != servers_.end();) {
            if ((*it)->done) {
                (*it)->thread.join();
                ::close((*it)->fd);
                it = servers_.erase(it);
            } else {
                ++it;
            }
        }
        try {
            auto server = std::make_unique<ServerConnection>();
            server->fd = fd;
            ServerConnection *raw = server.get();
            server->thread = std::thread([this, raw] { serve(raw); });
            servers_.push_back(std::move(server));
        } catch (const std::exception &error) {
            log_error("accept", error.what());
            ::close(fd);
        }
    }
}

void TcpEngine::serve(ServerConnection *conn) {
    try {
        serve_connection(conn->fd);
    } catch (const std::exception &error) {
        log_error("serve", error.what());
    }
    // The peer sees the end at once; the descriptor itself is closed when the connection is reaped or at Finalize
    // (closing it here could let Finalize shut down a reused descriptor number).
    ::shutdown(conn->fd, SHUT_RDWR);
    conn->done = true;
}

void TcpEngine::serve_connection(int fd) {
    if (context_ != nullptr) {
        aclrtSetCurrentContext(context_);
    }
    auto deadline = Clock::now() + std::chrono::milliseconds(PEER_REQUEST_TIMEOUT_MS);
    uint32_t hello[2] = {0, 0};
    if (recv_all(fd, hello, sizeof(hello), deadline) == SUCCESS && hello[0] == MAGIC) {
        uint32_t answer[2] = {MAGIC, hello[1] == VERSION ? SUCCESS : UNSUPPORTED};
        if (send_all(fd, answer, sizeof(answer), deadline) == SUCCESS && answer[1] == SUCCESS) {
            while (!stopping_) {
                int r = wait_fd(fd, POLLIN, Clock::now() + std::chrono::milliseconds(IDLE_POLL_MS));
                if (r == 0) {
                    continue;
                }
                if (r < 0) {
                    break;
                }
                uint32_t head[2] = {0, 0};
                uint64_t count = 0;
                deadline = Clock::now() + std::chrono::milliseconds(PEER_REQUEST_TIMEOUT_MS);
                if (recv_all(fd, head, sizeof(head), deadline) != SUCCESS ||
                    recv_all(fd, &count, sizeof(count), deadline) != SUCCESS || head[0] != MAGIC ||
                    (head[1] != READ && head[1] != WRITE) || count > MAX_DESCS) {
                    break;
                }
                if (serve_request(fd, head[1], count) != SUCCESS) {
                    break;
                }
            }
        }
    }
}

// One request after its header; anything but SUCCESS means the connection is out of step and is dropped.
Status TcpEngine::serve_request(int fd, uint32_t op, uint64_t count) {
    auto deadline = Clock::now() + std::chrono::milliseconds(PEER_REQUEST_TIMEOUT_MS);
    std::vector<WireRange> ranges(count);
    Status status = recv_all(fd, ranges.data(), count * sizeof(WireRange), deadline);
    if (status != SUCCESS) {
        return status;
    }
    std::shared_lock<std::shared_mutex> regions(regions_mu_);
    uint32_t verdict = SUCCESS;
    for (const auto &range : ranges) {
        if (range.len > SIZE_MAX || !contains(static_cast<uintptr_t>(range.addr), static_cast<size_t>(range.len))) {
            verdict = PARAM_INVALID;
            break;
        }
    }
    status = send_all(fd, &verdict, sizeof(verdict), deadline);
    if (status != SUCCESS || verdict != SUCCESS) {
        return status;
    }
    if (cannTwinEvidenceNote != nullptr) {
        cannTwinEvidenceNote(2, count);
    }
    std::vector<char> chunk(CHUNK);
    uint32_t copies = SUCCESS;
    for (const auto &range : ranges) {
        for (uint64_t off = 0; off < range.len; off += CHUNK) {
            // Each chunk gets its own bound: a large request is limited by progress, not by its total size.
            deadline = Clock::now() + std::chrono::milliseconds(PEER_REQUEST_TIMEOUT_MS);
            size_t n = static_cast<size_t>(range.len - off < CHUNK ? range.len - off : CHUNK);
            void *addr = reinterpret_cast<void *>(static_cast<uintptr_t>(range.addr + off));
            if (op == WRITE) {
                status = recv_all(fd, chunk.data(), n, deadline);
                if (status == SUCCESS && copies == SUCCESS &&
                    aclrtMemcpy(addr, n, chunk.data(), n, ACL_MEMCPY_DEFAULT) != 0) {
                    copies = FAILED;
                }
            } else {
                if (copies != SUCCESS || aclrtMemcpy(chunk.data(), n, addr, n, ACL_MEMCPY_DEFAULT) != 0) {
                    copies = FAILED;
                    std::memset(chunk.data(), 0, n);
                }
                status = send_all(fd, chunk.data(), n, deadline);
            }
            if (status != SUCCESS) {
                return status;
            }
        }
    }
    if (copies != SUCCESS) {
        log_error("serve", "a copy through the local ACL runtime failed");
    }
    deadline = Clock::now() + std::chrono::milliseconds(PEER_REQUEST_TIMEOUT_MS);
    return send_all(fd, &copies, sizeof(copies), deadline);
}

namespace {
// The functions of the runtime this library linked, found at run time: the object that defines aclrtMemcpy, looked up
// with dlsym (a runtime without one of them leaves it null).
void *runtime_symbol(const char *name) {
    static void *handle = [] {
        Dl_info info{};
        void *found = nullptr;
        if (::dladdr(reinterpret_cast<void *>(&aclrtMemcpy), &info) != 0 && info.dli_fname != nullptr) {
            found = ::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
        }
        return found != nullptr ? found : ::dlopen("libascendcl.so", RTLD_NOW | RTLD_NOLOAD);
    }();
    return handle == nullptr ? nullptr : ::dlsym(handle, name);
}

template <typename F>
bool resolve_all(std::initializer_list<std::pair<F *, const char *>> wanted, std::string &missing) {
    bool all = true;
    for (const auto &entry : wanted) {
        *entry.first = reinterpret_cast<F>(runtime_symbol(entry.second));
        if (*entry.first == nullptr) {
            missing += (missing.empty() ? "" : ", ") + std::string(entry.second);
            all = false;
        }
    }
    return all;
}

// Makes the engine's context current on the calling thread for a call (as the vendor's GetContextGuard), then
// restores the caller's.
class ContextGuard {
public:
    explicit ContextGuard(aclrtContext context) {
        if (context != nullptr && aclrtGetCurrentContext(&saved_) == 0 && saved_ != context) {
            switched_ = aclrtSetCurrentContext(context) == 0;
        }
    }
    ~ContextGuard() {
        if (switched_ && saved_ != nullptr) {
            aclrtSetCurrentContext(saved_);
        }
    }
    ContextGuard(const ContextGuard &) = delete;
    ContextGuard &operator=(const ContextGuard &) = delete;

private:
    aclrtContext saved_ = nullptr;
    bool switched_ = false;
};

void *request_key(uintptr_t &counter) {
    counter += 16;
    return reinterpret_cast<void *>(0x5e9e000000000000ULL + counter);
}

EndpointDesc device_endpoint(int32_t device) {
    EndpointDesc endpoint{};
    endpoint.protocol = 0;   // COMM_PROTOCOL_HCCS
    endpoint.addr_type = 2;  // COMM_ADDR_TYPE_ID
    std::memcpy(endpoint.addr, &device, sizeof(device));
    endpoint.loc_type = 0;  // ENDPOINT_LOC_TYPE_DEVICE
    std::memcpy(endpoint.loc, &device, sizeof(device));
    return endpoint;
}

// hixl::ToTransferStatus (src/hixl/engine/client_handler.h).
TransferStatus to_transfer_status(uint32_t complete) {
    switch (complete) {
        case 0:
            return TransferStatus::WAITING;
        case 1:
            return TransferStatus::COMPLETED;
        case 2:
            return TransferStatus::TIMEOUT;
        default:
            return TransferStatus::FAILED;
    }
}
}  // namespace

// The client-server engine (HixlEngine with DirectClientHandler) over the runtime's HiXL C API.
class CsEngine final : public Engine {
public:
    ~CsEngine() override { Finalize(); }
    Status Initialize(const std::string &local, bool auto_connect);
    void Finalize() override;
    Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &handle) override;
    Status DeregisterMem(MemHandle handle) override;
    Status Connect(const std::string &remote, int32_t timeout_ms) override;
    Status Disconnect(const std::string &remote, int32_t timeout_ms) override;
    Status Transfer(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                    int32_t timeout_ms) override;
    Status Submit(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                  TransferReq &req) override;
    Status Status_(const TransferReq &req, TransferStatus &status) override;

private:
    struct Client {
        std::mutex mu;  // one call on the handle at a time, as the handler's mutex_
        HixlClientHandle handle = nullptr;
        std::vector<HixlMemHandle> mems;
        std::string ip;
        EndpointDesc local{};
        EndpointDesc remote{};
    };
    struct Registration {
        MemDesc mem;
        MemType type;
    };
    struct Request {
        std::string remote;
        std::shared_ptr<Client> client;
        CompleteHandle complete;
    };

    Status client_for(const std::string &remote, int32_t timeout_ms, std::shared_ptr<Client> &out);
    Status create_client(const std::string &remote, int32_t timeout_ms, std::shared_ptr<Client> &out);
    void destroy_client(Client &client);
    void auto_disconnect(const std::string &remote);
    static std::vector<HixlOneSideOpDesc> hixl_list(const std::vector<TransferOpDesc> &descs);

    HixlStatus (*server_create_)(const HixlServerDesc *, const HixlServerConfig *, HixlServerHandle *) = nullptr;
    HixlStatus (*server_reg_mem_)(HixlServerHandle, const char *, const CommMem *, HixlMemHandle *) = nullptr;
    HixlStatus (*server_listen_)(HixlServerHandle, uint32_t) = nullptr;
    HixlStatus (*server_unreg_mem_)(HixlServerHandle, HixlMemHandle) = nullptr;
    HixlStatus (*server_destroy_)(HixlServerHandle) = nullptr;
    HixlStatus (*client_create_)(const HixlClientDesc *, const HixlClientConfig *, HixlClientHandle *) = nullptr;
    HixlStatus (*client_connect_)(HixlClientHandle, uint32_t) = nullptr;
    HixlStatus (*client_reg_mem_)(HixlClientHandle, const char *, const CommMem *, HixlMemHandle *) = nullptr;
    HixlStatus (*client_unreg_mem_)(HixlClientHandle, HixlMemHandle) = nullptr;
    HixlStatus (*put_async_)(HixlClientHandle, uint32_t, const HixlOneSideOpDesc *, CompleteHandle *) = nullptr;
    HixlStatus (*get_async_)(HixlClientHandle, uint32_t, const HixlOneSideOpDesc *, CompleteHandle *) = nullptr;
    HixlStatus (*put_sync_)(HixlClientHandle, uint32_t, const HixlOneSideOpDesc *, uint32_t) = nullptr;
    HixlStatus (*get_sync_)(HixlClientHandle, uint32_t, const HixlOneSideOpDesc *, uint32_t) = nullptr;
    HixlStatus (*query_)(HixlClientHandle, CompleteHandle, uint32_t *) = nullptr;
    HixlStatus (*client_destroy_)(HixlClientHandle) = nullptr;

    std::mutex mu_;
    std::string local_;
    bool auto_connect_ = false;
    int32_t device_ = 0;
    aclrtContext context_ = nullptr;
    HixlServerHandle server_ = nullptr;
    EndpointDesc endpoint_{};
    std::map<HixlMemHandle, Registration> mems_;
    std::map<std::string, std::shared_ptr<Client>> clients_;
    std::map<void *, Request> requests_;
    uintptr_t next_request_ = 0;
};

Status CsEngine::Initialize(const std::string &local, bool auto_connect) {
    std::string missing;
    bool found = resolve_all<void *>(
        {
            {reinterpret_cast<void **>(&server_create_), "HixlCSServerCreate"},
            {reinterpret_cast<void **>(&server_reg_mem_), "HixlCSServerRegMem"},
            {reinterpret_cast<void **>(&server_listen_), "HixlCSServerListen"},
            {reinterpret_cast<void **>(&server_unreg_mem_), "HixlCSServerUnregMem"},
            {reinterpret_cast<void **>(&server_destroy_), "HixlCSServerDestroy"},
            {reinterpret_cast<void **>(&client_create_), "HixlCSClientCreate"},
            {reinterpret_cast<void **>(&client_connect_), "HixlCSClientConnect"},
            {reinterpret_cast<void **>(&client_reg_mem_), "HixlCSClientRegMem"},
            {reinterpret_cast<void **>(&client_unreg_mem_), "HixlCSClientUnregMem"},
            {reinterpret_cast<void **>(&put_async_), "HixlCSClientBatchPutAsync"},
            {reinterpret_cast<void **>(&get_async_), "HixlCSClientBatchGetAsync"},
            {reinterpret_cast<void **>(&put_sync_), "HixlCSClientBatchPutSync"},
            {reinterpret_cast<void **>(&get_sync_), "HixlCSClientBatchGetSync"},
            {reinterpret_cast<void **>(&query_), "HixlCSClientQueryCompleteStatus"},
            {reinterpret_cast<void **>(&client_destroy_), "HixlCSClientDestroy"},
        },
        missing);
    if (!found) {
        log_error("Initialize", "the client-server engine needs HiXL's C API, which the loaded libascendcl.so lacks: " +
                                    missing);
        return FAILED;
    }
    std::string ip;
    int port = 0;
    if (!split_endpoint(local, ip, port)) {
        log_error("Initialize", "engine name is not ip:port: " + local);
        return PARAM_INVALID;
    }
    if (aclrtGetDevice(&device_) != 0) {
        log_error("Initialize", "the client-server engine needs a current device (aclrtSetDevice)");
        return FAILED;
    }
    aclrtGetCurrentContext(&context_);
    endpoint_ = device_endpoint(device_);
    HixlServerDesc desc{};
    desc.endpoint_list = &endpoint_;
    desc.endpoint_list_num = 1;
    desc.server_ip = ip.c_str();
    desc.server_port = static_cast<uint32_t>(port);
    HixlServerConfig config{};
    HixlStatus status = server_create_(&desc, &config, &server_);
    if (status == SUCCESS && port > 0) {
        status = server_listen_(server_, 64);
    }
    if (status != SUCCESS) {
        log_error("Initialize", "HiXL server at " + local + " failed with " + std::to_string(status));
        if (server_ != nullptr) {
            server_destroy_(server_);
            server_ = nullptr;
        }
        return status;
    }
    local_ = local;
    auto_connect_ = auto_connect;
    return SUCCESS;
}

void CsEngine::Finalize() {
    std::map<std::string, std::shared_ptr<Client>> clients;
    HixlServerHandle server = nullptr;
    {
        std::lock_guard<std::mutex> lock(mu_);
        clients.swap(clients_);
        requests_.clear();
        mems_.clear();
        server = server_;
        server_ = nullptr;
    }
    ContextGuard context(context_);
    for (auto &entry : clients) {
        destroy_client(*entry.second);
    }
    if (server != nullptr) {
        server_destroy_(server);
    }
}

Status CsEngine::RegisterMem(const MemDesc &mem, MemType type, MemHandle &handle) {
    if (mem.addr == 0 || (type != MEM_DEVICE && type != MEM_HOST)) {
        return PARAM_INVALID;
    }
    ContextGuard context(context_);
    std::lock_guard<std::mutex> lock(mu_);
    if (server_ == nullptr) {
        return FAILED;
    }
    for (const auto &entry : mems_) {
        if (entry.second.mem.addr == mem.addr && entry.second.mem.len == mem.len) {
            handle = entry.first;  // HixlServer::RegisterMem hands back the registration a duplicate names
            return SUCCESS;
        }
    }
    CommMem comm{type == MEM_DEVICE ? 0 : 1, reinterpret_cast<void *>(mem.addr), mem.len};
    HixlMemHandle registered = nullptr;
    HixlStatus status = server_reg_mem_(server_, nullptr, &comm, &registered);
    if (status != SUCCESS) {
        return status;
    }
    mems_[registered] = Registration{mem, type};
    // Clients made before it know it too (the client's local ranges).
    for (auto &entry : clients_) {
        std::lock_guard<std::mutex> guard(entry.second->mu);
        HixlMemHandle mine = nullptr;
        if (client_reg_mem_(entry.second->handle, nullptr, &comm, &mine) == SUCCESS) {
            entry.second->mems.push_back(mine);
        }
    }
    handle = registered;
    return SUCCESS;
}

Status CsEngine::DeregisterMem(MemHandle handle) {
    ContextGuard context(context_);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mems_.find(handle);
    if (it == mems_.end()) {
        return SUCCESS;  // HixlEngine::DeregisterMem: "not registered" is a warning
    }
    if (!clients_.empty()) {
        log_error("DeregisterMem", "all clients must be disconnected before deregistration (" + local_ + ")");
        return FAILED;
    }
    HixlStatus status = server_unreg_mem_(server_, handle);
    if (status != SUCCESS) {
        return status;
    }
    mems_.erase(it);
    return SUCCESS;
}

Status CsEngine::create_client(const std::string &remote, int32_t timeout_ms, std::shared_ptr<Client> &out) {
    std::string ip;
    int port = 0;
    if (!split_endpoint(remote, ip, port) || port == 0) {
        log_error("Connect", "remote engine name is not ip:port: " + remote);
        return PARAM_INVALID;
    }
    auto client = std::make_shared<Client>();
    client->ip = ip;
    client->local = endpoint_;
    client->remote = device_endpoint(0);
    HixlClientDesc desc{};
    desc.local_endpoint = &client->local;
    desc.remote_endpoint = &client->remote;
    desc.server_ip = client->ip.c_str();
    desc.server_port = static_cast<uint32_t>(port);
    HixlClientConfig config{};
    HixlStatus status = client_create_(&desc, &config, &client->handle);
    if (status != SUCCESS) {
        return status;
    }
    std::vector<Registration> mems;
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto &entry : mems_) {
            mems.push_back(entry.second);
        }
    }
    for (const auto &registration : mems) {
        CommMem comm{registration.type == MEM_DEVICE ? 0 : 1, reinterpret_cast<void *>(registration.mem.addr),
                     registration.mem.len};
        HixlMemHandle mine = nullptr;
        status = client_reg_mem_(client->handle, nullptr, &comm, &mine);
        if (status != SUCCESS) {
            destroy_client(*client);
            return status;
        }
        client->mems.push_back(mine);
    }
    status = client_connect_(client->handle, static_cast<uint32_t>(timeout_ms > 0 ? timeout_ms : 1000));
    if (status != SUCCESS) {
        log_error("Connect", "HiXL client to " + remote + " failed with " + std::to_string(status));
        destroy_client(*client);
        return status;
    }
    out = std::move(client);
    return SUCCESS;
}

void CsEngine::destroy_client(Client &client) {
    std::lock_guard<std::mutex> lock(client.mu);
    if (client.handle == nullptr) {
        return;
    }
    for (HixlMemHandle mem : client.mems) {
        client_unreg_mem_(client.handle, mem);
    }
    client.mems.clear();
    client_destroy_(client.handle);
    client.handle = nullptr;
}

Status CsEngine::Connect(const std::string &remote, int32_t timeout_ms) {
    if (remote == local_) {
        log_error("Connect", "connection with self is not supported: " + remote);
        return PARAM_INVALID;
    }
    ContextGuard context(context_);
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (clients_.count(remote) != 0) {
            return ALREADY_CONNECTED;
        }
    }
    std::shared_ptr<Client> client;
    Status status = create_client(remote, timeout_ms, client);
    if (status != SUCCESS) {
        return status;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!clients_.emplace(remote, client).second) {
        destroy_client(*client);
        return ALREADY_CONNECTED;
    }
    return SUCCESS;
}

Status CsEngine::Disconnect(const std::string &remote, int32_t) {
    std::shared_ptr<Client> client;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = clients_.find(remote);
        if (it == clients_.end()) {
            return NOT_CONNECTED;
        }
        client = it->second;
        clients_.erase(it);
        for (auto req = requests_.begin(); req != requests_.end();) {
            req = req->second.client == client ? requests_.erase(req) : std::next(req);
        }
    }
    ContextGuard context(context_);
    destroy_client(*client);
    return SUCCESS;
}

// HixlEngine::AutoDisconnect: with auto-connect, a failed transfer ends its client (the next transfer connects again).
void CsEngine::auto_disconnect(const std::string &remote) {
    if (auto_connect_) {
        Disconnect(remote, 0);
    }
}

// HixlEngine::AutoConnect: the client of `remote`, made now when auto-connect is on.
Status CsEngine::client_for(const std::string &remote, int32_t timeout_ms, std::shared_ptr<Client> &out) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = clients_.find(remote);
        if (it != clients_.end()) {
            out = it->second;
            return SUCCESS;
        }
    }
    if (!auto_connect_) {
        return NOT_CONNECTED;
    }
    Status status = Connect(remote, timeout_ms);
    if (status != SUCCESS && status != ALREADY_CONNECTED) {
        return status;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = clients_.find(remote);
    if (it == clients_.end()) {
        return NOT_CONNECTED;
    }
    out = it->second;
    return SUCCESS;
}

std::vector<HixlOneSideOpDesc> CsEngine::hixl_list(const std::vector<TransferOpDesc> &descs) {
    std::vector<HixlOneSideOpDesc> list(descs.size());
    for (size_t i = 0; i < descs.size(); ++i) {
        list[i].remote_buf = reinterpret_cast<void *>(descs[i].remote_addr);
        list[i].local_buf = reinterpret_cast<void *>(descs[i].local_addr);
        list[i].len = descs[i].len;
    }
    return list;
}

Status CsEngine::Transfer(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                          int32_t timeout_ms) {
    if (op != READ && op != WRITE) {
        return PARAM_INVALID;
    }
    if (descs.empty()) {
        return SUCCESS;
    }
    if (descs.size() > UINT32_MAX) {
        return PARAM_INVALID;
    }
    ContextGuard context(context_);
    std::shared_ptr<Client> client;
    Status status = client_for(remote, timeout_ms, client);
    if (status != SUCCESS) {
        return status;
    }
    auto list = hixl_list(descs);
    const auto timeout = static_cast<uint32_t>(timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS);
    {
        std::lock_guard<std::mutex> lock(client->mu);
        if (client->handle == nullptr) {
            return NOT_CONNECTED;
        }
        const auto count = static_cast<uint32_t>(list.size());
        status = op == WRITE ? put_sync_(client->handle, count, list.data(), timeout)
                             : get_sync_(client->handle, count, list.data(), timeout);
    }
    if (status != SUCCESS) {
        log_error("Transfer", "HiXL batch to " + remote + " returned " + std::to_string(status) +
                                  (status == PARAM_INVALID ? ": HiXL refused a range outside the registered memory"
                                                           : ""));
        auto_disconnect(remote);
    }
    return status;
}

Status CsEngine::Submit(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                        TransferReq &req) {
    if ((op != READ && op != WRITE) || descs.empty() || descs.size() > UINT32_MAX) {
        return PARAM_INVALID;
    }
    ContextGuard context(context_);
    std::shared_ptr<Client> client;
    Status status = client_for(remote, 3000, client);  // kAutoConnectTimeout of hixl_engine.cc
    if (status != SUCCESS) {
        return status;
    }
    auto list = hixl_list(descs);
    CompleteHandle complete = nullptr;
    {
        std::lock_guard<std::mutex> lock(client->mu);
        if (client->handle == nullptr) {
            return NOT_CONNECTED;
        }
        const auto count = static_cast<uint32_t>(list.size());
        status = op == WRITE ? put_async_(client->handle, count, list.data(), &complete)
                             : get_async_(client->handle, count, list.data(), &complete);
    }
    if (status != SUCCESS) {
        log_error("Transfer", "HiXL async batch to " + remote + " returned " + std::to_string(status) +
                                  (status == PARAM_INVALID ? ": HiXL refused a range outside the registered memory"
                                                           : ""));
        auto_disconnect(remote);
        return status;
    }
    std::lock_guard<std::mutex> lock(mu_);
    void *key = request_key(next_request_);
    requests_[key] = Request{remote, client, complete};
    req = key;
    return SUCCESS;
}

Status CsEngine::Status_(const TransferReq &req, TransferStatus &status) {
    Request request;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = requests_.find(req);
        if (it == requests_.end()) {
            status = TransferStatus::FAILED;
            return PARAM_INVALID;
        }
        request = it->second;
    }
    ContextGuard context(context_);
    uint32_t complete = 0;
    HixlStatus code = FAILED;
    {
        std::lock_guard<std::mutex> lock(request.client->mu);
        if (request.client->handle != nullptr) {
            code = query_(request.client->handle, request.complete, &complete);
        }
    }
    if (code != SUCCESS) {
        status = TransferStatus::FAILED;
        {
            std::lock_guard<std::mutex> lock(mu_);
            requests_.erase(req);
        }
        auto_disconnect(request.remote);
        return code;
    }
    status = to_transfer_status(complete);
    if (status != TransferStatus::WAITING) {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.erase(req);
    }
    return SUCCESS;
}

// The FabricMem engine over the runtime's twin-only cannTwinFabricMem* functions.
class FabricEngine final : public Engine {
public:
    ~FabricEngine() override { Finalize(); }
    Status Initialize(const std::string &local, bool auto_connect, bool aicpu_unfold, uint32_t task_streams);
    void Finalize() override;
    Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &handle) override;
    Status DeregisterMem(MemHandle handle) override;
    Status Connect(const std::string &remote, int32_t timeout_ms) override;
    Status Disconnect(const std::string &remote, int32_t timeout_ms) override;
    Status Transfer(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                    int32_t timeout_ms) override;
    Status Submit(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                  TransferReq &req) override;
    Status Status_(const TransferReq &req, TransferStatus &status) override;

private:
    Status run(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs, int32_t timeout_ms,
               uint64_t *request);

    uint32_t (*create_)(const char *, uint32_t, uint32_t, uint64_t *) = nullptr;
    uint32_t (*register_)(uint64_t, uint64_t, uint64_t, int32_t, uint64_t *) = nullptr;
    uint32_t (*deregister_)(uint64_t, uint64_t) = nullptr;
    uint32_t (*connect_)(uint64_t, const char *, uint32_t) = nullptr;
    uint32_t (*disconnect_)(uint64_t, const char *) = nullptr;
    uint32_t (*transfer_)(uint64_t, const char *, int32_t, const uint64_t *, uint64_t, int32_t, uint64_t *) = nullptr;
    uint32_t (*query_)(uint64_t, uint64_t, int32_t *) = nullptr;
    uint32_t (*destroy_)(uint64_t) = nullptr;

    std::mutex mu_;
    std::string local_;
    bool auto_connect_ = false;
    aclrtContext context_ = nullptr;
    uint64_t engine_ = 0;
    std::map<void *, uint64_t> requests_;
    uintptr_t next_request_ = 0;
};

Status FabricEngine::Initialize(const std::string &local, bool auto_connect, bool aicpu_unfold,
                                uint32_t task_streams) {
    std::string missing;
    bool found = resolve_all<void *>(
        {
            {reinterpret_cast<void **>(&create_), "cannTwinFabricMemCreate"},
            {reinterpret_cast<void **>(&register_), "cannTwinFabricMemRegister"},
            {reinterpret_cast<void **>(&deregister_), "cannTwinFabricMemDeregister"},
            {reinterpret_cast<void **>(&connect_), "cannTwinFabricMemConnect"},
            {reinterpret_cast<void **>(&disconnect_), "cannTwinFabricMemDisconnect"},
            {reinterpret_cast<void **>(&transfer_), "cannTwinFabricMemTransfer"},
            {reinterpret_cast<void **>(&query_), "cannTwinFabricMemQuery"},
            {reinterpret_cast<void **>(&destroy_), "cannTwinFabricMemDestroy"},
        },
        missing);
    if (!found) {
        log_error("Initialize", "the FabricMem engine needs the twin runtime's FabricMem functions, which the loaded "
                                "libascendcl.so lacks: " + missing);
        return FAILED;
    }
    std::string ip;
    int port = 0;
    if (!split_endpoint(local, ip, port)) {
        log_error("Initialize", "engine name is not ip:port: " + local);
        return PARAM_INVALID;
    }
    aclrtGetCurrentContext(&context_);
    Status status = create_(local.c_str(), aicpu_unfold ? 1 : 0, task_streams, &engine_);
    if (status != SUCCESS) {
        log_error("Initialize", "FabricMem engine at " + local + " failed with " + std::to_string(status));
        engine_ = 0;
        return status;
    }
    local_ = local;
    auto_connect_ = auto_connect;
    return SUCCESS;
}

void FabricEngine::Finalize() {
    uint64_t engine = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        std::swap(engine, engine_);
        requests_.clear();
    }
    if (engine != 0) {
        ContextGuard context(context_);
        destroy_(engine);
    }
}

Status FabricEngine::RegisterMem(const MemDesc &mem, MemType type, MemHandle &handle) {
    if (mem.addr == 0 || (type != MEM_DEVICE && type != MEM_HOST)) {
        return PARAM_INVALID;
    }
    ContextGuard context(context_);
    uint64_t registered = 0;
    Status status = register_(engine_, mem.addr, mem.len, type == MEM_DEVICE ? 0 : 1, &registered);
    if (status == SUCCESS) {
        handle = reinterpret_cast<MemHandle>(static_cast<uintptr_t>(registered));
    }
    return status;
}

Status FabricEngine::DeregisterMem(MemHandle handle) {
    ContextGuard context(context_);
    return deregister_(engine_, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle)));
}

Status FabricEngine::Connect(const std::string &remote, int32_t timeout_ms) {
    if (remote == local_) {
        log_error("Connect", "connection with self is not supported: " + remote);
        return PARAM_INVALID;
    }
    ContextGuard context(context_);
    return connect_(engine_, remote.c_str(), static_cast<uint32_t>(timeout_ms > 0 ? timeout_ms : 1000));
}

Status FabricEngine::Disconnect(const std::string &remote, int32_t) {
    ContextGuard context(context_);
    return disconnect_(engine_, remote.c_str());
}

Status FabricEngine::run(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                         int32_t timeout_ms, uint64_t *request) {
    if (op != READ && op != WRITE) {
        return PARAM_INVALID;
    }
    ContextGuard context(context_);
    std::vector<uint64_t> ops;
    ops.reserve(descs.size() * 3);
    for (const auto &desc : descs) {
        ops.push_back(desc.local_addr);
        ops.push_back(desc.remote_addr);
        ops.push_back(desc.len);
    }
    const int32_t kind = op == WRITE ? 1 : 0;
    Status status = transfer_(engine_, remote.c_str(), kind, ops.data(), descs.size(), timeout_ms, request);
    if (status == NOT_CONNECTED && auto_connect_) {
        status = Connect(remote, timeout_ms > 0 ? timeout_ms : 3000);
        if (status == SUCCESS || status == ALREADY_CONNECTED) {
            status = transfer_(engine_, remote.c_str(), kind, ops.data(), descs.size(), timeout_ms, request);
        }
    }
    if (status != SUCCESS) {
        log_error("Transfer", "FabricMem transfer to " + remote + " returned " + std::to_string(status) +
                                  (status == PARAM_INVALID ? ": a range outside the registered memory" : ""));
        if (auto_connect_) {
            disconnect_(engine_, remote.c_str());
        }
    }
    return status;
}

Status FabricEngine::Transfer(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                              int32_t timeout_ms) {
    return run(remote, op, descs, timeout_ms, nullptr);
}

Status FabricEngine::Submit(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                            TransferReq &req) {
    uint64_t request = 0;
    Status status = run(remote, op, descs, DEFAULT_TIMEOUT_MS, &request);
    if (status != SUCCESS) {
        return status;
    }
    std::lock_guard<std::mutex> lock(mu_);
    void *key = request_key(next_request_);
    requests_[key] = request;
    req = key;
    return SUCCESS;
}

Status FabricEngine::Status_(const TransferReq &req, TransferStatus &status) {
    uint64_t request = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = requests_.find(req);
        if (it == requests_.end()) {
            status = TransferStatus::FAILED;
            return PARAM_INVALID;
        }
        request = it->second;
    }
    int32_t value = 3;
    Status code = query_(engine_, request, &value);
    status = code == SUCCESS ? to_transfer_status(static_cast<uint32_t>(value)) : TransferStatus::FAILED;
    if (code != SUCCESS || status != TransferStatus::WAITING) {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.erase(req);
    }
    return code;
}

// AdxlEngine's state: the engine Initialize selected (the vendor's AdxlEngineImpl holding a hixl::Engine).
class AdxlEngineImpl {
public:
    Status Initialize(const std::string &local, const std::map<std::string, std::string> &options);
    void Finalize();
    // The engine, kept alive for the caller's call even if another thread finalises meanwhile.
    std::shared_ptr<Engine> engine() {
        std::lock_guard<std::mutex> lock(mu_);
        return engine_;
    }

private:
    std::mutex mu_;
    std::shared_ptr<Engine> engine_;
};

Status AdxlEngineImpl::Initialize(const std::string &local, const std::map<std::string, std::string> &options) {
    std::lock_guard<std::mutex> lock(mu_);
    if (engine_) {
        log_error("Initialize", "already initialised");
        return FAILED;
    }
    std::string ignored_host;
    int ignored_port = 0;
    if (!split_endpoint(local, ignored_host, ignored_port)) {
        log_error("Initialize", "engine name is not ip:port: " + local);
        return PARAM_INVALID;
    }
    using Select = uint32_t (*)(const char *const *, const char *const *, uint32_t, CannTwinAdxlSelection *);
    auto select = reinterpret_cast<Select>(runtime_symbol("cannTwinAdxlSelectEngine"));
    if (select == nullptr) {
        log_error("Initialize", "the loaded libascendcl.so lacks cannTwinAdxlSelectEngine (the twin's ADXL runs only "
                                "on the cann-twin runtime)");
        return FAILED;
    }
    std::vector<const char *> keys, values;
    for (const auto &option : options) {
        keys.push_back(option.first.c_str());
        values.push_back(option.second.c_str());
    }
    CannTwinAdxlSelection selection{};
    selection.version = 1;
    Status status = select(keys.data(), values.data(), static_cast<uint32_t>(keys.size()), &selection);
    if (status != SUCCESS) {
        selection.error[sizeof(selection.error) - 1] = '\0';
        log_error("Initialize", std::string("options refused: ") + selection.error);
        return status;
    }
    selection.reason[sizeof(selection.reason) - 1] = '\0';
    static const char *const names[] = {"comm", "hixl_cs", "fabric_mem"};
    const char *name = selection.engine < 3 ? names[selection.engine] : "unknown";
    std::fprintf(stderr, "adxl-twin: selected engine:%s, reason:%s, local_engine:%s\n", name, selection.reason,
                 local.c_str());
    const bool auto_connect = selection.auto_connect == 1;
    std::shared_ptr<Engine> engine;
    if (selection.engine == 1) {
        auto cs = std::make_shared<CsEngine>();
        status = cs->Initialize(local, auto_connect);
        engine = std::move(cs);
    } else if (selection.engine == 2) {
        auto fabric = std::make_shared<FabricEngine>();
        status = fabric->Initialize(local, auto_connect, selection.aicpu_unfold != 0, selection.task_stream_num);
        engine = std::move(fabric);
    } else {
        auto tcp = std::make_shared<TcpEngine>();
        status = tcp->Initialize(local, auto_connect);
        engine = std::move(tcp);
    }
    if (status == SUCCESS) {
        engine_ = std::move(engine);
    }
    return status;
}

void AdxlEngineImpl::Finalize() {
    std::shared_ptr<Engine> engine;
    {
        std::lock_guard<std::mutex> lock(mu_);
        engine.swap(engine_);
    }
    if (engine) {
        engine->Finalize();
    }
}

namespace {
std::string text(const ge::AscendString &s) {
    return std::string(s.GetString(), s.GetLength());
}

// Runs a member's body; a C++ exception (out of memory, no thread) becomes FAILED instead of leaving the library.
template <typename Body>
Status guarded(const char *name, Body body) {
    try {
        return body();
    } catch (const std::exception &error) {
        log_error(name, error.what());
    } catch (...) {
        log_error(name, "unknown exception");
    }
    return FAILED;
}

// Runs `body` on the initialised engine; FAILED when there is none (the vendor's "AdxlEngine is not initialized").
template <typename Body>
Status with_engine(const char *name, const std::unique_ptr<AdxlEngineImpl> &impl, Body body) {
    return guarded(name, [&]() -> Status {
        std::shared_ptr<Engine> engine = impl ? impl->engine() : nullptr;
        if (!engine) {
            return FAILED;
        }
        return body(*engine);
    });
}
}  // namespace

// A failed allocation leaves impl_ null: every member then returns FAILED.
AdxlEngine::AdxlEngine() : impl_(new (std::nothrow) AdxlEngineImpl()) {}

AdxlEngine::~AdxlEngine() {
    guarded("~AdxlEngine", [&]() -> Status {
        if (impl_) {
            impl_->Finalize();
        }
        return SUCCESS;
    });
}

Status AdxlEngine::Initialize(const ge::AscendString &local_engine,
                              const std::map<ge::AscendString, ge::AscendString> &options) {
    return guarded("Initialize", [&]() -> Status {
        if (!impl_) {
            return FAILED;
        }
        std::map<std::string, std::string> plain;
        for (const auto &option : options) {
            plain[text(option.first)] = text(option.second);
        }
        return impl_->Initialize(text(local_engine), plain);
    });
}

void AdxlEngine::Finalize() {
    guarded("Finalize", [&]() -> Status {
        if (impl_) {
            impl_->Finalize();
        }
        return SUCCESS;
    });
}

Status AdxlEngine::RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle) {
    return with_engine("RegisterMem", impl_, [&](Engine &e) { return e.RegisterMem(mem, type, mem_handle); });
}

Status AdxlEngine::DeregisterMem(MemHandle mem_handle) {
    return with_engine("DeregisterMem", impl_, [&](Engine &e) { return e.DeregisterMem(mem_handle); });
}

Status AdxlEngine::Connect(const ge::AscendString &remote_engine, int32_t timeout_in_millis) {
    return with_engine("Connect", impl_, [&](Engine &e) { return e.Connect(text(remote_engine), timeout_in_millis); });
}

Status AdxlEngine::Disconnect(const ge::AscendString &remote_engine, int32_t timeout_in_millis) {
    return with_engine("Disconnect", impl_,
                       [&](Engine &e) { return e.Disconnect(text(remote_engine), timeout_in_millis); });
}

Status AdxlEngine::TransferSync(const ge::AscendString &remote_engine, TransferOp operation,
                                const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis) {
    if (cannTwinEvidenceNote != nullptr) {
        cannTwinEvidenceNote(1, op_descs.size());
    }
    return with_engine("TransferSync", impl_, [&](Engine &e) {
        return e.Transfer(text(remote_engine), operation, op_descs, timeout_in_millis);
    });
}

Status AdxlEngine::TransferAsync(const ge::AscendString &remote_engine, TransferOp operation,
                                 const std::vector<TransferOpDesc> &op_descs, const TransferArgs &,
                                 TransferReq &req) {
    if (cannTwinEvidenceNote != nullptr) {
        cannTwinEvidenceNote(1, op_descs.size());
    }
    return with_engine("TransferAsync", impl_,
                       [&](Engine &e) { return e.Submit(text(remote_engine), operation, op_descs, req); });
}

Status AdxlEngine::GetTransferStatus(const TransferReq &req, TransferStatus &status) {
    return with_engine("GetTransferStatus", impl_, [&](Engine &e) { return e.Status_(req, status); });
}

// Hixl::GetCapability (src/hixl/engine/hixl_impl.cc), which AdxlEngine::GetCapability calls: AUTO_CONNECT and
// CLIENT_SERVER_COMM supported, unconditionally; another feature not supported (value 0); a negative one refused.
Status AdxlEngine::GetCapability(FeatureType type, int32_t &value) {
    if (static_cast<int32_t>(type) < 0) {
        return PARAM_INVALID;
    }
    switch (type) {
        case AUTO_CONNECT:
        case CLIENT_SERVER_COMM:
            value = 1;
            return SUCCESS;
        default:
            value = 0;
            return SUCCESS;
    }
}

Status AdxlEngine::MallocMem(MemType type, size_t size, void **ptr) {
    if (ptr == nullptr || size == 0 || (type != MEM_DEVICE && type != MEM_HOST)) {
        return PARAM_INVALID;
    }
    void *out = nullptr;
    aclError error = type == MEM_DEVICE ? aclrtMalloc(&out, size, 0) : aclrtMallocHost(&out, size);
    if (error != 0) {
        return error == 207001 ? RESOURCE_EXHAUSTED : FAILED;
    }
    try {
        std::lock_guard<std::mutex> lock(g_alloc_mu);
        g_allocations[out] = type;
    } catch (const std::exception &error) {
        log_error("MallocMem", error.what());
        (type == MEM_DEVICE ? aclrtFree(out) : aclrtFreeHost(out));
        return FAILED;
    }
    *ptr = out;
    return SUCCESS;
}

Status AdxlEngine::FreeMem(void *ptr) {
    MemType type;
    {
        std::lock_guard<std::mutex> lock(g_alloc_mu);
        auto it = g_allocations.find(ptr);
        if (it == g_allocations.end()) {
            return PARAM_INVALID;
        }
        type = it->second;
        g_allocations.erase(it);
    }
    return (type == MEM_DEVICE ? aclrtFree(ptr) : aclrtFreeHost(ptr)) == 0 ? SUCCESS : FAILED;
}

Status AdxlEngine::ExportToShareableHandle(void *, aclrtMemFabricHandle &) {
    return UNSUPPORTED;
}
}  // namespace adxl
