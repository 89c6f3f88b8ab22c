// Declarations of the CANN C++ classes Mooncake's Ascend wheel imports (docs/mooncake-npu-wheel.md sections 5
// and 6), written for the twin from the public facts of hicann/hixl include/adxl/adxl_engine.h, adxl_types.h and
// hicann/metadef inc/external/graph/ascend_string.h: namespaces, member signatures, enum values and the object
// layouts (AdxlEngine: one unique_ptr, 8 bytes; AscendString: one shared_ptr<std::string>, 16 bytes). Compiled
// with g++ and libstdc++'s cxx11 ABI, as the wheel was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ge {
class AscendString {
public:
    AscendString() = default;
    ~AscendString() = default;
    AscendString(const char *name);
    const char *GetString() const;
    size_t GetLength() const;
    bool operator<(const AscendString &other) const;
    bool operator==(const AscendString &other) const;

private:
    std::shared_ptr<std::string> name_;
};
}  // namespace ge

extern "C" {
typedef struct {
    uint8_t data[128];
} aclrtMemFabricHandle;
}

namespace adxl {
using Status = uint32_t;
constexpr Status SUCCESS = 0U;
constexpr Status PARAM_INVALID = 103900U;
constexpr Status TIMEOUT = 103901U;
constexpr Status NOT_CONNECTED = 103902U;
constexpr Status ALREADY_CONNECTED = 103903U;
constexpr Status NOTIFY_FAILED = 103904U;
constexpr Status UNSUPPORTED = 103905U;
constexpr Status RESOURCE_EXHAUSTED = 203900U;
constexpr Status FAILED = 503900U;

enum MemType { MEM_DEVICE = 0, MEM_HOST = 1 };
enum TransferOp { READ = 0, WRITE = 1 };
enum class TransferStatus { WAITING = 0, COMPLETED = 1, TIMEOUT = 2, FAILED = 3 };
enum FeatureType : int32_t { AUTO_CONNECT = 0, CLIENT_SERVER_COMM = 1 };

struct MemDesc {
    uintptr_t addr;
    size_t len;
    uint8_t reserved[128];
};

struct TransferOpDesc {
    uintptr_t local_addr;
    uintptr_t remote_addr;
    size_t len;
};

struct TransferArgs {
    uint8_t reserved[128];
};

using MemHandle = void *;
using TransferReq = void *;

class AdxlEngineImpl;

class AdxlEngine {
public:
    AdxlEngine();
    ~AdxlEngine();
    Status Initialize(const ge::AscendString &local_engine,
                      const std::map<ge::AscendString, ge::AscendString> &options);
    void Finalize();
    Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle);
    Status DeregisterMem(MemHandle mem_handle);
    Status Connect(const ge::AscendString &remote_engine, int32_t timeout_in_millis = 1000);
    Status Disconnect(const ge::AscendString &remote_engine, int32_t timeout_in_millis = 1000);
    Status TransferSync(const ge::AscendString &remote_engine, TransferOp operation,
                        const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis = 1000);
    Status TransferAsync(const ge::AscendString &remote_engine, TransferOp operation,
                         const std::vector<TransferOpDesc> &op_descs, const TransferArgs &optional_args,
                         TransferReq &req);
    Status GetTransferStatus(const TransferReq &req, TransferStatus &status);
    static Status GetCapability(FeatureType type, int32_t &value);
    static Status MallocMem(MemType type, size_t size, void **ptr);
    static Status FreeMem(void *ptr);
    static Status ExportToShareableHandle(void *addr, aclrtMemFabricHandle &handle);

private:
    std::unique_ptr<AdxlEngineImpl> impl_;
};
}  // namespace adxl

static_assert(sizeof(ge::AscendString) == 16, "ge::AscendString is one shared_ptr");
static_assert(sizeof(adxl::AdxlEngine) == 8 && alignof(adxl::AdxlEngine) == 8, "AdxlEngine is one unique_ptr");
static_assert(sizeof(adxl::MemDesc) == 144, "MemDesc layout");
static_assert(sizeof(adxl::TransferOpDesc) == 24, "TransferOpDesc layout");
