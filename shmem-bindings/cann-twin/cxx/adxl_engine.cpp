// libllm_datadist.so of the twin: adxl::AdxlEngine (docs/mooncake-npu-wheel.md section 5) over TCP between twin
// processes, each side reaching its own memory only through its own process's ACL runtime (libascendcl.so, the
// cann-twin cdylib). The real ADXL wire protocol is not public; this one is the twin's own, so both ends must be
// the twin.
//
// Model: Initialize("ip:port", options) listens on exactly ip:port (port > 0). A transfer to a remote engine
// ("ip:port" of its Initialize) runs on one TCP connection to it, opened by Connect or, with the option
// AutoConnect=1, by the first transfer. Every local range must lie inside memory this engine registered with
// RegisterMem and every remote range inside memory the peer registered: the peer checks all ranges of a request
// before any byte moves; a range outside is refused with PARAM_INVALID. Each socket wait is bounded: a transfer by
// its timeout (10 s when not positive), the peer's side of a request by 60 s per 1 MiB chunk, a connect by its
// timeout. No C++ exception leaves the library: a member that meets one (say, out of memory) returns FAILED.
// TransferAsync runs the transfer before it returns and GetTransferStatus reports the outcome once.
// ExportToShareableHandle returns UNSUPPORTED.
//
// Wire format (little-endian, the twin's own): hello {u32 magic, u32 version} answered by {u32 magic, u32 status};
// request {u32 magic, u32 op, u64 count, count x {u64 remote_addr, u64 len}} answered by {u32 status}; when that is
// SUCCESS the data follows (WRITE: client to peer, READ: peer to client, the ranges' bytes in order), then the peer
// sends {u32 status} of the copies on its side.
#include <arpa/inet.h>
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
// Twin-only, not a CANN function (shmem-bindings/cann-twin/src/evidence.rs): counts ADXL work for cannTwinEvidence.
// Weak, so that this library still loads against a libascendcl.so without it.
int cannTwinEvidenceNote(unsigned int what, unsigned long long count) __attribute__((weak));
aclError aclrtGetCurrentContext(aclrtContext *context);
aclError aclrtSetCurrentContext(aclrtContext context);
}

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

class AdxlEngineImpl {
public:
    ~AdxlEngineImpl() { Finalize(); }

    Status Initialize(const std::string &local, const std::map<std::string, std::string> &options);
    void Finalize();
    Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &handle);
    Status DeregisterMem(MemHandle handle);
    Status Connect(const std::string &remote, int32_t timeout_ms);
    Status Disconnect(const std::string &remote, int32_t timeout_ms);
    Status Transfer(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                    int32_t timeout_ms);
    Status Submit(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                  TransferReq &req);
    Status Status_(const TransferReq &req, TransferStatus &status);

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

Status AdxlEngineImpl::Initialize(const std::string &local, const std::map<std::string, std::string> &options) {
    std::lock_guard<std::mutex> lock(mu_);
    if (initialized_) {
        log_error("Initialize", "already initialised as " + local_);
        return FAILED;
    }
    std::string host;
    int port = 0;
    if (!split_endpoint(local, host, port)) {
        log_error("Initialize", "engine name is not ip:port: " + local);
        return PARAM_INVALID;
    }
    auto it = options.find("AutoConnect");
    auto_connect_ = it != options.end() && it->second == "1";
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

void AdxlEngineImpl::Finalize() {
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

bool AdxlEngineImpl::contains(uintptr_t addr, size_t len) const {
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

Status AdxlEngineImpl::RegisterMem(const MemDesc &mem, MemType type, MemHandle &handle) {
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

Status AdxlEngineImpl::DeregisterMem(MemHandle handle) {
    std::unique_lock<std::shared_mutex> lock(regions_mu_);
    auto it = regions_.find(static_cast<Region *>(handle));
    if (it == regions_.end()) {
        return PARAM_INVALID;
    }
    regions_.erase(it);
    return SUCCESS;
}

Status AdxlEngineImpl::dial(const std::string &remote, int32_t timeout_ms, std::shared_ptr<Connection> &out) {
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

Status AdxlEngineImpl::Connect(const std::string &remote, int32_t timeout_ms) {
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

Status AdxlEngineImpl::Disconnect(const std::string &remote, int32_t) {
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

Status AdxlEngineImpl::exchange(Connection &conn, TransferOp op, const std::vector<TransferOpDesc> &descs,
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

Status AdxlEngineImpl::Transfer(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
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

Status AdxlEngineImpl::Submit(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                              TransferReq &req) {
    Status status = Transfer(remote, op, descs, DEFAULT_TIMEOUT_MS);
    std::lock_guard<std::mutex> lock(requests_mu_);
    next_request_ += 16;
    void *key = reinterpret_cast<void *>(0x5e9e000000000000ULL + next_request_);
    requests_.emplace(key, status);
    req = key;
    return SUCCESS;
}

Status AdxlEngineImpl::Status_(const TransferReq &req, TransferStatus &status) {
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

void AdxlEngineImpl::accept_loop() {
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

void AdxlEngineImpl::serve(ServerConnection *conn) {
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

void AdxlEngineImpl::serve_connection(int fd) {
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
Status AdxlEngineImpl::serve_request(int fd, uint32_t op, uint64_t count) {
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
}  // namespace

// A failed allocation leaves impl_ null: every member then returns FAILED.
AdxlEngine::AdxlEngine() : impl_(new (std::nothrow) AdxlEngineImpl()) {}

AdxlEngine::~AdxlEngine() = default;

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
    return guarded("RegisterMem", [&]() -> Status { return impl_ ? impl_->RegisterMem(mem, type, mem_handle) : FAILED; });
}

Status AdxlEngine::DeregisterMem(MemHandle mem_handle) {
    return guarded("DeregisterMem", [&]() -> Status { return impl_ ? impl_->DeregisterMem(mem_handle) : FAILED; });
}

Status AdxlEngine::Connect(const ge::AscendString &remote_engine, int32_t timeout_in_millis) {
    return guarded("Connect", [&]() -> Status { return impl_ ? impl_->Connect(text(remote_engine), timeout_in_millis) : FAILED; });
}

Status AdxlEngine::Disconnect(const ge::AscendString &remote_engine, int32_t timeout_in_millis) {
    return guarded("Disconnect", [&]() -> Status { return impl_ ? impl_->Disconnect(text(remote_engine), timeout_in_millis) : FAILED; });
}

Status AdxlEngine::TransferSync(const ge::AscendString &remote_engine, TransferOp operation,
                                const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis) {
    if (cannTwinEvidenceNote != nullptr) {
        cannTwinEvidenceNote(1, op_descs.size());
    }
    return guarded("TransferSync", [&]() -> Status { return impl_ ? impl_->Transfer(text(remote_engine), operation, op_descs, timeout_in_millis) : FAILED; });
}

Status AdxlEngine::TransferAsync(const ge::AscendString &remote_engine, TransferOp operation,
                                 const std::vector<TransferOpDesc> &op_descs, const TransferArgs &,
                                 TransferReq &req) {
    if (cannTwinEvidenceNote != nullptr) {
        cannTwinEvidenceNote(1, op_descs.size());
    }
    return guarded("TransferAsync", [&]() -> Status { return impl_ ? impl_->Submit(text(remote_engine), operation, op_descs, req) : FAILED; });
}

Status AdxlEngine::GetTransferStatus(const TransferReq &req, TransferStatus &status) {
    return guarded("GetTransferStatus", [&]() -> Status { return impl_ ? impl_->Status_(req, status) : FAILED; });
}

Status AdxlEngine::GetCapability(FeatureType type, int32_t &value) {
    switch (type) {
        case AUTO_CONNECT:
            value = 1;
            return SUCCESS;
        case CLIENT_SERVER_COMM:
            value = 0;
            return SUCCESS;
        default:
            return UNSUPPORTED;
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
