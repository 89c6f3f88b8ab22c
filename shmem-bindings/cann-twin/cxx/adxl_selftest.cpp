// Checks of the twin's libllm_datadist.so / libmetadef.so through their C++ ABI, in one process with engines
// talking over loopback TCP; driven by tests/adxl_twin.rs. Prints "ok: N checks" and exits 0, or names the first
// failed check and exits 1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "twin_cann.h"

extern "C" {
int aclInit(const char *config);
int aclrtSetDevice(int32_t device);
int aclrtMalloc(void **ptr, size_t size, int policy);
int aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind);
}

using namespace adxl;

namespace {
int checks = 0;

void expect(bool ok, const char *what, int line) {
    ++checks;
    if (!ok) {
        std::fprintf(stderr, "FAIL (line %d): %s\n", line, what);
        std::exit(1);
    }
}
#define EXPECT(cond) expect((cond), #cond, __LINE__)

// A port nothing listens on right now (bound and closed), and a listener that never answers.
int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

int silent_listener(int &port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a));
    ::listen(fd, 4);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
    port = ntohs(a.sin_port);
    return fd;
}

std::string endpoint(int port) {
    return "127.0.0.1:" + std::to_string(port);
}

std::map<ge::AscendString, ge::AscendString> options(bool auto_connect) {
    std::map<ge::AscendString, ge::AscendString> o;
    o[ge::AscendString("adxl.BufferPool")] = ge::AscendString("0:0");
    if (auto_connect) {
        o[ge::AscendString("AutoConnect")] = ge::AscendString("1");
    }
    return o;
}

void *device(size_t size) {
    void *p = nullptr;
    EXPECT(aclrtMalloc(&p, size, 0) == 0);
    return p;
}

void upload(void *dev, const std::vector<uint8_t> &data) {
    EXPECT(aclrtMemcpy(dev, data.size(), data.data(), data.size(), 1) == 0);
}

std::vector<uint8_t> download(const void *dev, size_t size) {
    std::vector<uint8_t> out(size);
    EXPECT(aclrtMemcpy(out.data(), size, dev, size, 2) == 0);
    return out;
}

std::vector<uint8_t> pattern(size_t size, unsigned seed) {
    std::vector<uint8_t> out(size);
    for (size_t i = 0; i < size; ++i) {
        out[i] = static_cast<uint8_t>(i * 131 + seed * 7 + (i >> 11));
    }
    return out;
}

long elapsed_ms(std::chrono::steady_clock::time_point since) {
    return static_cast<long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since).count());
}
}  // namespace

int main() {
    EXPECT(aclInit(nullptr) == 0);
    EXPECT(aclrtSetDevice(0) == 0);

    // ge::AscendString: a real shared_ptr<std::string>, ordered by content, usable as a std::map key.
    {
        ge::AscendString a("alpha"), b("beta"), empty, null_name(nullptr);
        EXPECT(a < b && !(b < a) && !(a < a));
        EXPECT(empty < a && !(a < empty) && !(empty < null_name));
        EXPECT(std::string(empty.GetString()).empty() && null_name.GetLength() == 0);
        ge::AscendString copy = a;
        EXPECT(copy == a && std::strcmp(copy.GetString(), "alpha") == 0);
    }

    const size_t size = 3 << 20;  // three ADXL chunks
    void *mem_b = device(size);
    void *mem_a = device(size);
    upload(mem_b, pattern(size, 1));
    upload(mem_a, pattern(size, 2));

    // Names and repeated initialisation.
    {
        AdxlEngine bad;
        EXPECT(bad.Initialize(ge::AscendString("no-port"), options(false)) == PARAM_INVALID);
        EXPECT(bad.Initialize(ge::AscendString("127.0.0.1:70000"), options(false)) == PARAM_INVALID);
        EXPECT(bad.Initialize(ge::AscendString("[::1]:"), options(false)) == PARAM_INVALID);
        EXPECT(bad.Initialize(ge::AscendString(":5"), options(false)) == PARAM_INVALID);
    }

    const int port_b = free_port();
    AdxlEngine b;
    EXPECT(b.Initialize(ge::AscendString(endpoint(port_b).c_str()), options(false)) == SUCCESS);
    EXPECT(b.Initialize(ge::AscendString(endpoint(port_b).c_str()), options(false)) == FAILED);
    const ge::AscendString name_b(endpoint(port_b).c_str());

    AdxlEngine a;  // a client only: port 0 does not listen
    EXPECT(a.Initialize(ge::AscendString("127.0.0.1:0"), options(false)) == SUCCESS);

    MemDesc desc_b{};
    desc_b.addr = reinterpret_cast<uintptr_t>(mem_b);
    desc_b.len = size;
    MemHandle handle_b = nullptr;
    EXPECT(b.RegisterMem(desc_b, MEM_DEVICE, handle_b) == SUCCESS && handle_b != nullptr);
    MemDesc desc_a{};
    desc_a.addr = reinterpret_cast<uintptr_t>(mem_a);
    desc_a.len = size;
    MemHandle handle_a = nullptr;
    EXPECT(a.RegisterMem(desc_a, MEM_DEVICE, handle_a) == SUCCESS);
    MemDesc zero{};
    MemHandle unused = nullptr;
    EXPECT(a.RegisterMem(zero, MEM_DEVICE, unused) == PARAM_INVALID);
    EXPECT(a.DeregisterMem(reinterpret_cast<void *>(0x1234)) == PARAM_INVALID);

    const uintptr_t la = reinterpret_cast<uintptr_t>(mem_a);
    const uintptr_t rb = reinterpret_cast<uintptr_t>(mem_b);
    std::vector<TransferOpDesc> one{{la, rb, 4096}};

    // Without AutoConnect a transfer needs Connect first.
    EXPECT(a.TransferSync(name_b, WRITE, one, 1000) == NOT_CONNECTED);
    EXPECT(a.Connect(name_b, 2000) == SUCCESS);
    EXPECT(a.Connect(name_b, 2000) == ALREADY_CONNECTED);

    // A write of more than two chunks at odd offsets, then a read into another place; both verified.
    {
        const size_t off_a = 13, off_b = 1000003, len = (2 << 20) + 777;
        std::vector<TransferOpDesc> w{{la + off_a, rb + off_b, len}, {la, rb, 1}};
        EXPECT(a.TransferSync(name_b, WRITE, w, 5000) == SUCCESS);
        auto expected = pattern(size, 1);
        auto source = pattern(size, 2);
        std::memcpy(expected.data() + off_b, source.data() + off_a, len);
        expected[0] = source[0];
        EXPECT(download(mem_b, size) == expected);
        std::vector<TransferOpDesc> r{{la + 5, rb + off_b, len}};
        EXPECT(a.TransferSync(name_b, READ, r, 5000) == SUCCESS);
        auto got = download(mem_a, size);
        EXPECT(std::memcmp(got.data() + 5, expected.data() + off_b, len) == 0);
    }

    // Out of bounds on either side, or an overflowing range: refused, nothing moved, the connection still works.
    {
        auto before = download(mem_b, size);
        std::vector<TransferOpDesc> past_remote{{la, rb + size - 10, 20}};
        EXPECT(a.TransferSync(name_b, WRITE, past_remote, 2000) == PARAM_INVALID);
        std::vector<TransferOpDesc> mixed{{la, rb, 64}, {la, rb + size, 1}};
        EXPECT(a.TransferSync(name_b, WRITE, mixed, 2000) == PARAM_INVALID);
        std::vector<TransferOpDesc> wrap{{la, UINTPTR_MAX - 3, 16}};
        EXPECT(a.TransferSync(name_b, READ, wrap, 2000) == PARAM_INVALID);
        std::vector<TransferOpDesc> past_local{{la + size - 1, rb, 2}};
        EXPECT(a.TransferSync(name_b, READ, past_local, 2000) == PARAM_INVALID);
        std::vector<TransferOpDesc> unregistered{{la, 0x1000, 8}};
        EXPECT(a.TransferSync(name_b, READ, unregistered, 2000) == PARAM_INVALID);
        EXPECT(download(mem_b, size) == before);
        EXPECT(a.TransferSync(name_b, READ, one, 2000) == SUCCESS);
        EXPECT(a.TransferSync(name_b, static_cast<TransferOp>(7), one, 2000) == PARAM_INVALID);
        EXPECT(a.TransferSync(name_b, READ, {}, 2000) == SUCCESS);
    }

    // TransferAsync: the status is reported once.
    {
        TransferArgs args{};
        TransferReq req = nullptr;
        EXPECT(a.TransferAsync(name_b, READ, one, args, req) == SUCCESS && req != nullptr);
        TransferStatus status = TransferStatus::WAITING;
        EXPECT(a.GetTransferStatus(req, status) == SUCCESS && status == TransferStatus::COMPLETED);
        EXPECT(a.GetTransferStatus(req, status) == PARAM_INVALID);
        std::vector<TransferOpDesc> past_remote{{la, rb + size - 10, 20}};
        EXPECT(a.TransferAsync(name_b, WRITE, past_remote, args, req) == SUCCESS);
        EXPECT(a.GetTransferStatus(req, status) == SUCCESS && status == TransferStatus::FAILED);
    }

    // A peer that speaks something else is dropped; the engine keeps serving others.
    {
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(port_b));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT(::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
        timeval bound{5, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
        const char junk[] = "GET / HTTP/1.0\r\n\r\n";
        EXPECT(::send(fd, junk, sizeof(junk), MSG_NOSIGNAL) > 0);
        char reply[8];
        EXPECT(::recv(fd, reply, sizeof(reply), 0) == 0);  // closed by the engine, not timed out
        ::close(fd);
        EXPECT(a.TransferSync(name_b, READ, one, 2000) == SUCCESS);
    }

    // Deregistered memory is no longer reachable.
    EXPECT(b.DeregisterMem(handle_b) == SUCCESS);
    EXPECT(b.DeregisterMem(handle_b) == PARAM_INVALID);
    EXPECT(a.TransferSync(name_b, READ, one, 2000) == PARAM_INVALID);
    EXPECT(b.RegisterMem(desc_b, MEM_DEVICE, handle_b) == SUCCESS);

    EXPECT(a.Disconnect(name_b, 1000) == SUCCESS);
    EXPECT(a.Disconnect(name_b, 1000) == NOT_CONNECTED);

    // AutoConnect=1: the first transfer dials.
    {
        AdxlEngine c;
        EXPECT(c.Initialize(ge::AscendString(endpoint(free_port()).c_str()), options(true)) == SUCCESS);
        MemHandle handle_c = nullptr;
        EXPECT(c.RegisterMem(desc_a, MEM_DEVICE, handle_c) == SUCCESS);
        EXPECT(c.TransferSync(name_b, READ, one, 2000) == SUCCESS);
        EXPECT(c.Connect(name_b, 1000) == ALREADY_CONNECTED);
        c.Finalize();
    }

    // Nobody listening: fails at once. A listener that never answers: TIMEOUT within the bound.
    {
        const ge::AscendString nobody(endpoint(free_port()).c_str());
        auto start = std::chrono::steady_clock::now();
        EXPECT(a.Connect(nobody, 2000) == FAILED);
        EXPECT(elapsed_ms(start) < 1500);
        int port = 0;
        int fd = silent_listener(port);
        start = std::chrono::steady_clock::now();
        EXPECT(a.Connect(ge::AscendString(endpoint(port).c_str()), 300) == TIMEOUT);
        long took = elapsed_ms(start);
        EXPECT(took >= 250 && took < 2000);
        ::close(fd);
        EXPECT(a.Connect(ge::AscendString("not-an-endpoint"), 300) == PARAM_INVALID);
    }

    // The peer goes away: the next transfer fails within its bound instead of hanging.
    {
        EXPECT(a.Connect(name_b, 2000) == SUCCESS);
        b.Finalize();
        b.Finalize();
        auto start = std::chrono::steady_clock::now();
        Status status = a.TransferSync(name_b, READ, one, 1000);
        EXPECT(status == FAILED || status == TIMEOUT);
        EXPECT(elapsed_ms(start) < 3000);
        EXPECT(a.TransferSync(name_b, READ, one, 1000) == NOT_CONNECTED);  // dropped after the failure
    }

    // Static members.
    {
        int32_t value = -1;
        EXPECT(AdxlEngine::GetCapability(AUTO_CONNECT, value) == SUCCESS && value == 1);
        EXPECT(AdxlEngine::GetCapability(CLIENT_SERVER_COMM, value) == SUCCESS && value == 0);
        EXPECT(AdxlEngine::GetCapability(static_cast<FeatureType>(9), value) == UNSUPPORTED);
        void *p = nullptr;
        EXPECT(AdxlEngine::MallocMem(MEM_DEVICE, 4096, &p) == SUCCESS && p != nullptr);
        upload(p, pattern(4096, 5));
        EXPECT(download(p, 4096) == pattern(4096, 5));
        EXPECT(AdxlEngine::FreeMem(p) == SUCCESS);
        EXPECT(AdxlEngine::FreeMem(p) == PARAM_INVALID);
        EXPECT(AdxlEngine::MallocMem(MEM_HOST, 4096, &p) == SUCCESS);
        static_cast<char *>(p)[4095] = 1;  // Host memory is the Host's
        EXPECT(AdxlEngine::FreeMem(p) == SUCCESS);
        EXPECT(AdxlEngine::MallocMem(MEM_DEVICE, 0, &p) == PARAM_INVALID);
        EXPECT(AdxlEngine::MallocMem(MEM_DEVICE, 16, nullptr) == PARAM_INVALID);
        aclrtMemFabricHandle fabric{};
        EXPECT(AdxlEngine::ExportToShareableHandle(mem_a, fabric) == UNSUPPORTED);
    }

    a.Finalize();
    std::printf("ok: %d checks\n", checks);
    return 0;
}
