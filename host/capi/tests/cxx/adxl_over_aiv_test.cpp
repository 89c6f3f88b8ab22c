// The failure paths of libllm_datadist.so over aiv (host/capi/cxx/adxl_over_aiv.cpp), run by
// tests/mooncake_over_aiv.rs. Prints "case <name> passed" at the end; any failed check prints "FAIL line <n>: ..." and
// exits 1.
//
//   adxl_over_aiv_test unusable PORT   linked with a libascendcl.so that is not a usable runtime (a stub with only the
//                                      few functions this program and the library call): the members' answers before
//                                      and without an engine, the static members, and Initialize failing with FAILED
//   adxl_over_aiv_test twin PORT       on the twin runtime: an engine on 127.0.0.1:PORT with a registered aclrtMalloc
//                                      buffer, connected to its own segment: a transfer within it, ranges outside
//                                      registered memory (refused, and no byte of the allocation, registered or not,
//                                      changes), Connect/Disconnect states, an unreachable peer
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "twin_cann.h"

extern "C" {
int aclInit(const char *config);
int aclrtSetDevice(int32_t device_id);
int aclrtMalloc(void **dev_ptr, size_t size, int policy);
int aclrtFree(void *dev_ptr);
int aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind);
}

// aclrtMemcpyKind (acl_rt.h).
constexpr int kHostToDevice = 1;
constexpr int kDeviceToHost = 2;

namespace {

int failures = 0;

void check(bool ok, int line, const char *what) {
    if (!ok) {
        fprintf(stdout, "FAIL line %d: %s\n", line, what);
        fflush(stdout);
        ++failures;
    }
}

#define CHECK(condition) check((condition), __LINE__, #condition)

using Options = std::map<ge::AscendString, ge::AscendString>;

void unusable(const std::string &port) {
    adxl::AdxlEngine engine;
    adxl::MemHandle handle = reinterpret_cast<adxl::MemHandle>(0x1);
    adxl::MemDesc mem{};
    mem.addr = 0x1000;
    mem.len = 64;
    // Without an engine: FAILED, nothing written but the out-parameters' defaults.
    CHECK(engine.RegisterMem(mem, adxl::MEM_DEVICE, handle) == adxl::FAILED);
    CHECK(handle == nullptr);
    std::vector<adxl::TransferOpDesc> descs{{0x1000, 0x2000, 64}};
    CHECK(engine.TransferSync("127.0.0.1:1", adxl::WRITE, descs, 100) == adxl::FAILED);
    adxl::TransferReq req = reinterpret_cast<adxl::TransferReq>(0x1);
    CHECK(engine.TransferAsync("127.0.0.1:1", adxl::READ, descs, adxl::TransferArgs{}, req) == adxl::FAILED);
    CHECK(req == nullptr);
    adxl::TransferStatus status = adxl::TransferStatus::COMPLETED;
    CHECK(engine.GetTransferStatus(req, status) == adxl::FAILED);
    CHECK(status == adxl::TransferStatus::FAILED);
    CHECK(engine.Connect("127.0.0.1:1", 100) == adxl::FAILED);
    CHECK(engine.Disconnect("127.0.0.1:1", 100) == adxl::FAILED);
    CHECK(engine.DeregisterMem(nullptr) == adxl::FAILED);
    engine.Finalize();  // nothing to finalize: no effect

    // Malformed names.
    CHECK(engine.Initialize("no-port", Options{}) == adxl::PARAM_INVALID);
    CHECK(engine.Initialize("127.0.0.1:0", Options{}) == adxl::PARAM_INVALID);
    CHECK(engine.Initialize("127.0.0.1:99999", Options{}) == adxl::PARAM_INVALID);
    CHECK(engine.Initialize(":1234", Options{}) == adxl::PARAM_INVALID);
    // Fabric memory is refused.
    Options fabric{{"EnableUseFabricMem", "1"}};
    CHECK(engine.Initialize(("127.0.0.1:" + port).c_str(), fabric) == adxl::UNSUPPORTED);
    // The loaded ACL library cannot be opened as a device runtime: FAILED (and one log line), no crash.
    Options options{{"AutoConnect", "1"}, {"adxl.BufferPool", "0:0"}};
    CHECK(engine.Initialize(("127.0.0.1:" + port).c_str(), options) == adxl::FAILED);
    CHECK(engine.RegisterMem(mem, adxl::MEM_HOST, handle) == adxl::FAILED);

    // Static members.
    int32_t value = -1;
    CHECK(adxl::AdxlEngine::GetCapability(adxl::AUTO_CONNECT, value) == adxl::SUCCESS && value == 1);
    CHECK(adxl::AdxlEngine::GetCapability(adxl::CLIENT_SERVER_COMM, value) == adxl::SUCCESS && value == 0);
    CHECK(adxl::AdxlEngine::GetCapability(static_cast<adxl::FeatureType>(7), value) == adxl::PARAM_INVALID);
    aclrtMemFabricHandle fabric_handle;
    std::memset(&fabric_handle, 0xff, sizeof fabric_handle);
    CHECK(adxl::AdxlEngine::ExportToShareableHandle(reinterpret_cast<void *>(0x1000), fabric_handle) ==
          adxl::UNSUPPORTED);
    CHECK(fabric_handle.data[0] == 0 && fabric_handle.data[127] == 0);
    void *memory = nullptr;
    CHECK(adxl::AdxlEngine::MallocMem(adxl::MEM_HOST, 0, &memory) == adxl::PARAM_INVALID);
    CHECK(adxl::AdxlEngine::MallocMem(adxl::MEM_HOST, 64, nullptr) == adxl::PARAM_INVALID);
    CHECK(adxl::AdxlEngine::MallocMem(adxl::MEM_HOST, 4096, &memory) == adxl::SUCCESS && memory != nullptr);
    CHECK(adxl::AdxlEngine::FreeMem(memory) == adxl::SUCCESS);
    CHECK(adxl::AdxlEngine::FreeMem(memory) == adxl::PARAM_INVALID);
    CHECK(adxl::AdxlEngine::FreeMem(reinterpret_cast<void *>(0x1234)) == adxl::PARAM_INVALID);
}

void twin(const std::string &port) {
    CHECK(aclInit(nullptr) == 0);
    CHECK(aclrtSetDevice(0) == 0);
    // Twice what is registered: the second half is device memory outside the registration.
    const size_t size = 1 << 20;
    void *buffer = nullptr;
    CHECK(aclrtMalloc(&buffer, 2 * size, 0) == 0 && buffer != nullptr);
    const uintptr_t base = reinterpret_cast<uintptr_t>(buffer);
    const std::string self = "127.0.0.1:" + port;

    adxl::AdxlEngine engine;
    CHECK(engine.Initialize(self.c_str(), Options{}) == adxl::SUCCESS);  // no AutoConnect
    CHECK(engine.Initialize(self.c_str(), Options{}) == adxl::FAILED);   // twice
    adxl::MemDesc mem{};
    mem.addr = base;
    mem.len = size;
    adxl::MemHandle handle = nullptr;
    CHECK(engine.RegisterMem(mem, adxl::MEM_DEVICE, handle) == adxl::SUCCESS && handle != nullptr);
    adxl::MemHandle overlapping = nullptr;
    CHECK(engine.RegisterMem(mem, adxl::MEM_DEVICE, overlapping) == adxl::PARAM_INVALID && overlapping == nullptr);

    std::vector<adxl::TransferOpDesc> inside{{base, base + size / 2, 4096}};
    // Not connected, no AutoConnect.
    CHECK(engine.TransferSync(self.c_str(), adxl::WRITE, inside, 1000) == adxl::NOT_CONNECTED);
    CHECK(engine.Disconnect(self.c_str(), 100) == adxl::NOT_CONNECTED);
    CHECK(engine.Connect(self.c_str(), 5000) == adxl::SUCCESS);
    CHECK(engine.Connect(self.c_str(), 5000) == adxl::ALREADY_CONNECTED);
    // A transfer within registered memory (its own segment).
    CHECK(engine.TransferSync(self.c_str(), adxl::WRITE, inside, 10000) == adxl::SUCCESS);
    CHECK(engine.TransferSync(self.c_str(), adxl::READ, inside, 10000) == adxl::SUCCESS);
    // Ranges outside registered memory: PARAM_INVALID from the transfer's status, and no byte moves.
    std::vector<unsigned char> pattern(2 * size);
    for (size_t i = 0; i < pattern.size(); ++i) {
        pattern[i] = static_cast<unsigned char>(i * 131 + i / 4093);
    }
    CHECK(aclrtMemcpy(buffer, 2 * size, pattern.data(), 2 * size, kHostToDevice) == 0);
    std::vector<adxl::TransferOpDesc> remote_outside{{base, base + size - 100, 4096}};
    CHECK(engine.TransferSync(self.c_str(), adxl::WRITE, remote_outside, 10000) == adxl::PARAM_INVALID);
    std::vector<adxl::TransferOpDesc> local_outside{{base + size, base, 4096}};
    CHECK(engine.TransferSync(self.c_str(), adxl::READ, local_outside, 10000) == adxl::PARAM_INVALID);
    CHECK(engine.TransferSync(self.c_str(), adxl::READ, std::vector<adxl::TransferOpDesc>{}, 1000) ==
          adxl::PARAM_INVALID);
    // Asynchronous: the request is reported once.
    adxl::TransferReq req = nullptr;
    CHECK(engine.TransferAsync(self.c_str(), adxl::WRITE, inside, adxl::TransferArgs{}, req) == adxl::SUCCESS);
    adxl::TransferStatus status = adxl::TransferStatus::WAITING;
    for (int i = 0; i < 10000 && status == adxl::TransferStatus::WAITING; ++i) {
        CHECK(engine.GetTransferStatus(req, status) == adxl::SUCCESS);
    }
    CHECK(status == adxl::TransferStatus::COMPLETED);
    CHECK(engine.GetTransferStatus(req, status) == adxl::PARAM_INVALID && status == adxl::TransferStatus::FAILED);
    adxl::TransferReq bogus = reinterpret_cast<adxl::TransferReq>(0x10);
    CHECK(engine.GetTransferStatus(bogus, status) == adxl::PARAM_INVALID);
    req = nullptr;
    CHECK(engine.TransferAsync(self.c_str(), adxl::WRITE, remote_outside, adxl::TransferArgs{}, req) ==
          adxl::SUCCESS);
    status = adxl::TransferStatus::WAITING;
    for (int i = 0; i < 10000 && status == adxl::TransferStatus::WAITING; ++i) {
        CHECK(engine.GetTransferStatus(req, status) == adxl::SUCCESS);
    }
    CHECK(status == adxl::TransferStatus::FAILED);
    std::vector<unsigned char> after(2 * size);
    CHECK(aclrtMemcpy(after.data(), 2 * size, buffer, 2 * size, kDeviceToHost) == 0);
    // The one transfer inside (the asynchronous WRITE) moved its 4096 bytes; nothing else changed.
    std::vector<unsigned char> expected = pattern;
    std::memcpy(expected.data() + size / 2, pattern.data(), 4096);
    CHECK(after == expected);
    CHECK(engine.Disconnect(self.c_str(), 100) == adxl::SUCCESS);
    CHECK(engine.TransferSync(self.c_str(), adxl::WRITE, inside, 1000) == adxl::NOT_CONNECTED);
    // A peer nobody answers for.
    CHECK(engine.Connect("127.0.0.1:1", 2000) == adxl::FAILED);
    CHECK(engine.DeregisterMem(handle) == adxl::SUCCESS);
    CHECK(engine.DeregisterMem(handle) == adxl::PARAM_INVALID);
    engine.Finalize();
    CHECK(engine.Connect(self.c_str(), 100) == adxl::FAILED);  // finalized
    CHECK(aclrtFree(buffer) == 0);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s unusable|twin PORT\n", argv[0]);
        return 2;
    }
    const std::string mode = argv[1];
    if (mode == "unusable") {
        unusable(argv[2]);
    } else if (mode == "twin") {
        twin(argv[2]);
    } else {
        fprintf(stderr, "unknown case %s\n", argv[1]);
        return 2;
    }
    if (failures != 0) {
        return 1;
    }
    printf("case %s passed\n", argv[1]);
    return 0;
}
