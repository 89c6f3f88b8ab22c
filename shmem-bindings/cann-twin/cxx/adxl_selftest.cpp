// Checks of the twin's libllm_datadist.so / libmetadef.so through their C++ ABI, in one process with engines
// talking over loopback; driven by tests/adxl_twin.rs, which passes the size of the runtime's cannTwinEvidence
// version 2 and the offsets of the counts read here ("SIZE name=offset ...", from cann_twin::evidence). Each option
// path must pick its engine, shown by what the runtime did: the client-server engine and FabricMem's AI-CPU unfold
// launch AI-CPU kernels whose SQEs the AI CPU wrote, FabricMem's Host unfold queues Host stream copies, the
// communication-domain stand-in serves requests with Host copies. Prints "ok: N checks" and exits 0, or names the
// first failed check and exits 1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <thread>
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
// Twin-only (shmem-bindings/cann-twin/src/evidence.rs).
int cannTwinEvidence(void *out);
int cannTwinRecordProvenance(unsigned int on);
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

// The runtime's counts by name, at the offsets tests/adxl_twin.rs passes.
size_t evidence_size = 0;
std::map<std::string, size_t> evidence_offsets;

uint64_t count(const char *name) {
    auto it = evidence_offsets.find(name);
    EXPECT(it != evidence_offsets.end() && evidence_size >= 48);
    std::vector<uint64_t> buffer(evidence_size / 8 + 1, 0);
    uint32_t header[2] = {2, static_cast<uint32_t>(evidence_size)};
    std::memcpy(buffer.data(), header, sizeof(header));
    EXPECT(cannTwinEvidence(buffer.data()) == 0);
    uint64_t value = 0;
    std::memcpy(&value, reinterpret_cast<const char *>(buffer.data()) + it->second, sizeof(value));
    return value;
}

// How much each count grew while `body` ran.
template <typename Body>
std::map<std::string, uint64_t> grew(Body body) {
    std::map<std::string, uint64_t> before;
    for (const auto &entry : evidence_offsets) {
        before[entry.first] = count(entry.first.c_str());
    }
    body();
    std::map<std::string, uint64_t> delta;
    for (const auto &entry : before) {
        delta[entry.first] = count(entry.first.c_str()) - entry.second;
    }
    return delta;
}

std::map<ge::AscendString, ge::AscendString> with(std::vector<std::pair<const char *, const char *>> list) {
    std::map<ge::AscendString, ge::AscendString> o;
    for (const auto &entry : list) {
        o[ge::AscendString(entry.first)] = ge::AscendString(entry.second);
    }
    return o;
}

// Two engines made with `opts` (a listening target, an auto-connecting initiator), a verified write and read between
// device buffers at 64-byte-aligned offsets, and an out-of-bounds write refused; what the runtime counted meanwhile.
std::map<std::string, uint64_t> round_trip(const std::map<ge::AscendString, ge::AscendString> &opts, bool async) {
    const size_t size = 1 << 20;
    void *remote = device(size);
    void *local = device(size);
    upload(remote, pattern(size, 3));
    upload(local, pattern(size, 4));
    AdxlEngine target, initiator;
    const std::string name = endpoint(free_port());
    EXPECT(target.Initialize(ge::AscendString(name.c_str()), opts) == SUCCESS);
    EXPECT(initiator.Initialize(ge::AscendString(endpoint(free_port()).c_str()), opts) == SUCCESS);
    MemDesc rd{};
    rd.addr = reinterpret_cast<uintptr_t>(remote);
    rd.len = size;
    MemDesc ld{};
    ld.addr = reinterpret_cast<uintptr_t>(local);
    ld.len = size;
    MemHandle rh = nullptr, lh = nullptr;
    EXPECT(target.RegisterMem(rd, MEM_DEVICE, rh) == SUCCESS);
    EXPECT(initiator.RegisterMem(ld, MEM_DEVICE, lh) == SUCCESS);
    const ge::AscendString peer(name.c_str());
    const uintptr_t l = ld.addr, r = rd.addr;
    std::vector<TransferOpDesc> write{{l + 64, r + 4096, 300000}, {l, r + 640, 64}};
    std::vector<TransferOpDesc> read{{l + 512000, r + 4096, 300000}};
    auto delta = grew([&] {
        if (!async) {
            EXPECT(initiator.TransferSync(peer, WRITE, write, 5000) == SUCCESS);
            EXPECT(initiator.TransferSync(peer, READ, read, 5000) == SUCCESS);
            return;
        }
        for (auto *list : {&write, &read}) {
            TransferArgs args{};
            TransferReq req = nullptr;
            EXPECT(initiator.TransferAsync(peer, list == &write ? WRITE : READ, *list, args, req) == SUCCESS);
            TransferStatus status = TransferStatus::WAITING;
            auto start = std::chrono::steady_clock::now();
            while (status == TransferStatus::WAITING && elapsed_ms(start) < 10000) {
                EXPECT(initiator.GetTransferStatus(req, status) == SUCCESS);
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
            EXPECT(status == TransferStatus::COMPLETED);
            EXPECT(initiator.GetTransferStatus(req, status) == PARAM_INVALID);
        }
    });
    auto expected = pattern(size, 3);
    auto source = pattern(size, 4);
    std::memcpy(expected.data() + 4096, source.data() + 64, 300000);
    std::memcpy(expected.data() + 640, source.data(), 64);
    EXPECT(download(remote, size) == expected);
    auto got = download(local, size);
    EXPECT(std::memcmp(got.data() + 512000, expected.data() + 4096, 300000) == 0);
    std::vector<TransferOpDesc> past{{l, r + size - 64, 128}};
    EXPECT(initiator.TransferSync(peer, WRITE, past, 2000) == PARAM_INVALID);
    EXPECT(download(remote, size) == expected);
    EXPECT(initiator.TransferSync(peer, READ, read, 5000) == SUCCESS);  // connects again if it had to
    initiator.Finalize();
    target.Finalize();
    return delta;
}

}  // namespace

int main(int argc, char **argv) {
    EXPECT(argc >= 2);
    evidence_size = static_cast<size_t>(std::strtoull(argv[1], nullptr, 10));
    for (int i = 2; i < argc; ++i) {
        const char *eq = std::strchr(argv[i], '=');
        EXPECT(eq != nullptr);
        evidence_offsets[std::string(argv[i], static_cast<size_t>(eq - argv[i]))] = static_cast<size_t>(std::strtoull(eq + 1, nullptr, 10));
    }
    EXPECT(aclInit(nullptr) == 0);
    EXPECT(aclrtSetDevice(0) == 0);
    // The records on before anything runs, as the audit's Mooncake driver turns them on: who did each act is counted.
    EXPECT(cannTwinRecordProvenance(1) == 1);

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

    // The engine selection (the vendor's EngineFactory order), shown by what the runtime did for each option path.
    {
        const char *cs = "{\"version\":\"1.3\"}";
        // adxl.LocalCommRes version 1.3 (what Mooncake passes when CLIENT_SERVER_COMM is reported): client-server,
        // its batches on the AI CPU: AI-CPU launches, SQEs and doorbells by the AI CPU, no Host copy, nothing served
        // by the communication-domain stand-in.
        auto mooncake = with({{"adxl.LocalCommRes", cs}, {"AutoConnect", "1"}, {"adxl.BufferPool", "0:0"}});
        for (bool async : {false, true}) {
            auto d = round_trip(mooncake, async);
            EXPECT(d["aicpu_kernels_launched"] >= 2 && d["sqes_by_aicpu"] >= 3 && d["doorbells_by_aicpu"] >= 2);
            EXPECT(d["host_sync_copies"] == 0 && d["host_stream_copies"] == 0 && d["adxl_requests_served"] == 0);
            EXPECT(d["sqes_by_host"] == 0 && d["sqes_unknown"] == 0);
        }
        // GlobalResourceConfig comm_resource_config.protocol_desc: client-server too.
        auto desc = with({{"GlobalResourceConfig", "{\"comm_resource_config.protocol_desc\":[\"hccs:device\"]}"},
                          {"AutoConnect", "1"}});
        auto d = round_trip(desc, false);
        EXPECT(d["aicpu_kernels_launched"] >= 2 && d["adxl_requests_served"] == 0);
        // Another LocalCommRes version: the communication-domain stand-in (TCP, Host copies on both sides).
        auto comm = with({{"adxl.LocalCommRes", "{\"version\":\"1.2\"}"}, {"AutoConnect", "1"}});
        d = round_trip(comm, false);
        EXPECT(d["aicpu_kernels_launched"] == 0 && d["adxl_requests_served"] >= 2 && d["host_sync_copies"] > 0);
        // EnableUseFabricMem=1 wins over LocalCommRes: FabricMem, AI-CPU unfold by default.
        auto fabric = with({{"EnableUseFabricMem", "1"}, {"adxl.LocalCommRes", cs}, {"AutoConnect", "1"}});
        for (bool async : {false, true}) {
            d = round_trip(fabric, async);
            EXPECT(d["aicpu_kernels_launched"] >= 2 && d["sqes_by_aicpu"] >= 3 && d["host_stream_copies"] == 0);
            EXPECT(d["host_sync_copies"] == 0 && d["adxl_requests_served"] == 0);
        }
        // fabric_memory.enable_aicpu_unfold false: Host unfold, one aclrtMemcpyAsync per operation over 2 streams.
        auto host = with({{"EnableUseFabricMem", "1"},
                          {"GlobalResourceConfig",
                           "{\"fabric_memory\":{\"enable_aicpu_unfold\":false},\"fabric_memory.task_stream_num\":2}"},
                          {"AutoConnect", "1"}});
        for (bool async : {false, true}) {
            d = round_trip(host, async);
            EXPECT(d["aicpu_kernels_launched"] == 0 && d["sqes_by_aicpu"] == 0 && d["host_stream_copies"] >= 3);
            EXPECT(d["host_stream_syncs"] >= 2);
        }
        // Refused: a BufferPool other than 0:0 for client-server and FabricMem, an option they do not know, text
        // that is no JSON, more than one stream with AI-CPU unfold, a non-bool unfold switch.
        AdxlEngine bad;
        const std::string name = endpoint(free_port());
        const ge::AscendString bad_name(name.c_str());
        EXPECT(bad.Initialize(bad_name, with({{"adxl.LocalCommRes", cs}, {"adxl.BufferPool", "4:8"}})) ==
               PARAM_INVALID);
        EXPECT(bad.Initialize(bad_name, with({{"EnableUseFabricMem", "1"}, {"BufferPool", "1:1"}})) ==
               PARAM_INVALID);
        EXPECT(bad.Initialize(bad_name, with({{"adxl.LocalCommRes", cs}, {"Unknown", "1"}})) == PARAM_INVALID);
        EXPECT(bad.Initialize(bad_name, with({{"adxl.LocalCommRes", "{"}})) == PARAM_INVALID);
        EXPECT(bad.Initialize(bad_name, with({{"EnableUseFabricMem", "1"},
                                              {"GlobalResourceConfig", "{\"fabric_memory.task_stream_num\":2}"}})) ==
               PARAM_INVALID);
        EXPECT(bad.Initialize(bad_name, with({{"EnableUseFabricMem", "1"},
                                              {"GlobalResourceConfig",
                                               "{\"fabric_memory.enable_aicpu_unfold\":\"false\"}"}})) ==
               PARAM_INVALID);
        EXPECT(bad.Initialize(bad_name, with({{"EnableUseFabricMem", "2"}})) == PARAM_INVALID);
        // A refused Initialize leaves no engine: members fail, a correct Initialize then works.
        MemHandle none = nullptr;
        MemDesc some{};
        some.addr = 4096;
        some.len = 64;
        EXPECT(bad.RegisterMem(some, MEM_DEVICE, none) == FAILED);
        EXPECT(bad.Initialize(bad_name, mooncake) == SUCCESS);
        bad.Finalize();
    }

    // Static members.
    {
        int32_t value = -1;
        // As the vendor's (hixl_impl.cc Hixl::GetCapability): both features supported unconditionally, another one
        // not supported (value 0), a negative one refused.
        EXPECT(AdxlEngine::GetCapability(AUTO_CONNECT, value) == SUCCESS && value == 1);
        EXPECT(AdxlEngine::GetCapability(CLIENT_SERVER_COMM, value) == SUCCESS && value == 1);
        EXPECT(AdxlEngine::GetCapability(static_cast<FeatureType>(9), value) == SUCCESS && value == 0);
        EXPECT(AdxlEngine::GetCapability(static_cast<FeatureType>(-1), value) == PARAM_INVALID);
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
