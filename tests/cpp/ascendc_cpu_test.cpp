// Tests of the CPU model of the AscendC subset (kernels/cpu/) and of the NPU kernel (kernels/npu/entry.cpp:
// transfer_kernel.h + platform/npu.h) compiled with the host compiler against it. Run by tests/ascendc_cpu.rs:
// `ascendc_cpu_test <case>` prints what failed and exits 1, or exits 0.
//
// The fake runtime: device memory is a Host buffer reached only through translate; device addresses are those of a
// PROT_NONE mapping, so a Host (or kernel) dereference of a device address faults. One register page, whose doorbell
// at offset 0x8 accepts only 4-byte writes; a write there makes a fake SDMA engine execute the SQEs it finds in HBM,
// two system-counter reads later (so the kernel has begun polling its completion flag when the flag lands).
// A second register page is a fake RoCE NIC's (one QP): 8-byte doorbells only, the SQ's at 0x0 and the CQ's at 0x8;
// an SQ doorbell checks that the WQEs it announces are in HBM with the lap's owner bit, and two counter reads later
// the NIC executes them (HBM to HBM) and writes CQEs (the first word last) for the signaled and the failed ones.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <string>
#include <vector>

#include "aiv/layouts.h"
#include "aiv/roce.h"
#include "aiv_cpu_core.h"
#include "kernel_operator.h"

extern "C" void aiv_transfer_kernel(GM_ADDR kernel_args);

namespace {

int g_failures = 0;
#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
            g_failures += 1;                                              \
        }                                                                 \
    } while (0)

constexpr uint64_t kHbmBytes = 1u << 20;
constexpr uint64_t kRegBytes = 4096;

struct RegWrite {
    uint64_t offset;
    uint32_t len;
    bool accepted;
};

// The fake NIC's one QP.
struct FakeQp {
    uint64_t record = 0;         // device address of its AivQpRecord (in HBM)
    uint32_t producer = 0;       // WQEs announced by SQ doorbells (free-running)
    uint32_t head = 0;           // WQEs executed
    uint32_t cq_producer = 0;    // CQEs written
    uint32_t cq_consumer = 0;    // CQEs released by CQ doorbells
    bool error = false;          // after the first error CQE: every later WQE is flushed
    uint64_t refused_remote = 0; // a remote address the target refuses (REMOTE_ACCESS_ERR), 0: none
    bool pending = false;
    uint32_t delay = 0;
    uint32_t wqes_executed = 0;
    uint32_t sq_doorbells = 0;
    uint32_t cq_doorbells = 0;
};

struct Runtime {
    uint8_t* hbm = nullptr;   // Host backing of device memory
    uint64_t dev = 0;         // device address of hbm[0] (a PROT_NONE range)
    uint64_t reg = 0;         // device address of the register page (PROT_NONE)
    uint64_t counter = 0;
    std::vector<RegWrite> reg_writes;
    std::vector<std::string> faults;
    std::vector<std::string> engine_errors;
    uint32_t idle_hints = 0;
    uint32_t last_unchanged = 0;
    uint64_t land_on_hint = 0;  // device address of a u64 the next idle hint sets to land_value (0: none)
    uint64_t land_value = 0;
    uint32_t doorbell_value = 0;
    bool engine = false;       // run the fake SDMA engine on doorbells
    bool engine_pending = false;  // a doorbell the engine has not acted on yet
    uint32_t engine_tail = 0;
    uint32_t engine_delay = 0;    // system-counter reads before it does
    uint64_t record = 0;       // device address of the channel record the engine serves
    uint32_t engine_head = 0;
    uint32_t sqes_executed = 0;
    uint32_t announced = 0;    // the tail of the last doorbell: SQEs before it were checked when it rang
    uint64_t nic_reg = 0;      // device address of the fake NIC's register page (PROT_NONE)
    std::vector<RegWrite> nic_writes;
    std::vector<std::string> nic_errors;
    FakeQp qp;

    Runtime() {
        hbm = new uint8_t[kHbmBytes]();
        void* d = mmap(nullptr, kHbmBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        void* r = mmap(nullptr, kRegBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        void* n = mmap(nullptr, kRegBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (d == MAP_FAILED || r == MAP_FAILED || n == MAP_FAILED) __builtin_trap();
        dev = reinterpret_cast<uintptr_t>(d);
        reg = reinterpret_cast<uintptr_t>(r);
        nic_reg = reinterpret_cast<uintptr_t>(n);
    }
    ~Runtime() {
        munmap(reinterpret_cast<void*>(dev), kHbmBytes);
        munmap(reinterpret_cast<void*>(reg), kRegBytes);
        munmap(reinterpret_cast<void*>(nic_reg), kRegBytes);
        delete[] hbm;
    }
    bool in_hbm(uint64_t addr, uint64_t len) const { return addr >= dev && len <= kHbmBytes && addr - dev <= kHbmBytes - len; }

    // The WQE in SQ slot `index` as the NIC reads it from HBM; false (and why) when it is not one for this lap.
    bool wqe_at(const AivQpRecord& rec, uint32_t index, AivRoceWqe* wqe, AivRoceSge* sge, std::string* why) {
        const uint64_t slot = rec.sq_base + uint64_t(index & (rec.sq_depth - 1)) * AIV_ROCE_WQE_STRIDE;
        memcpy(wqe, host(slot), sizeof(*wqe));
        memcpy(sge, host(slot + sizeof(AivRoceWqe)), sizeof(*sge));
        const bool owner = (wqe->byte4 & AIV_ROCE_WQE_OWNER_BIT) != 0;
        const uint32_t opcode = wqe->byte4 & AIV_ROCE_WQE_OPCODE_MASK;
        if (owner != ((index & rec.sq_depth) == 0) ||
            (opcode != AIV_ROCE_OPCODE_RDMA_WRITE && opcode != AIV_ROCE_OPCODE_RDMA_READ) || wqe->msg_len == 0) {
            *why = "owner bit " + std::to_string(owner) + ", opcode " + std::to_string(opcode) + ", length " +
                   std::to_string(wqe->msg_len);
            return false;
        }
        return true;
    }

    void write_cqe(const AivQpRecord& rec, uint32_t index, uint32_t opcode, uint32_t status, uint32_t bytes) {
        if (qp.cq_producer - qp.cq_consumer >= rec.cq_depth) {
            nic_errors.push_back("CQ overrun at WQE " + std::to_string(index) + " (the kernel released too few CQEs)");
            return;
        }
        const uint64_t at = rec.cq_base + uint64_t(qp.cq_producer & (rec.cq_depth - 1)) * sizeof(AivRoceCqe);
        AivRoceCqe cqe;
        memset(&cqe, 0, sizeof(cqe));
        cqe.byte16 = rec.qpn & AIV_ROCE_CQE_QPN_MASK;
        cqe.byte_cnt = bytes;
        memcpy(host(at) + 4, reinterpret_cast<uint8_t*>(&cqe) + 4, sizeof(cqe) - 4);
        const uint32_t byte4 = opcode | ((qp.cq_producer & rec.cq_depth) == 0 ? AIV_ROCE_CQE_OWNER_BIT : 0u) |
                               status << AIV_ROCE_CQE_STATUS_SHIFT | (index & 0xFFFFu) << AIV_ROCE_CQE_WQE_INDEX_SHIFT;
        write<uint32_t>(at, byte4);  // the first word last
        qp.cq_producer += 1;
    }

    // Executes the announced WQEs in order: RC semantics, one SGE, HBM to HBM.
    void run_nic() {
        const AivQpRecord rec = read<AivQpRecord>(qp.record);
        while (qp.head != qp.producer) {
            const uint32_t index = qp.head;
            AivRoceWqe wqe;
            AivRoceSge sge;
            std::string why;
            if (!wqe_at(rec, index, &wqe, &sge, &why)) {
                nic_errors.push_back("WQE " + std::to_string(index) + " is not a WQE of its lap: " + why);
                return;
            }
            const uint32_t opcode = wqe.byte4 & AIV_ROCE_WQE_OPCODE_MASK;
            uint32_t status = AIV_ROCE_STATUS_SUCCESS;
            if (qp.error) {
                status = AIV_ROCE_STATUS_WR_FLUSH_ERR;
            } else if (wqe.va == qp.refused_remote) {
                status = AIV_ROCE_STATUS_REMOTE_ACCESS_ERR;
            } else if (sge.len != wqe.msg_len || sge.lkey != rec.lkey || wqe.rkey != rec.rkey ||
                       !in_hbm(sge.addr, sge.len) || !in_hbm(wqe.va, wqe.msg_len) ||
                       (wqe.byte16 >> AIV_ROCE_WQE_SGE_NUM_SHIFT) != 1) {
                status = AIV_ROCE_STATUS_LOCAL_PROT_ERR;
            }
            if (status == AIV_ROCE_STATUS_SUCCESS) {
                if (opcode == AIV_ROCE_OPCODE_RDMA_WRITE) {
                    memmove(host(wqe.va), host(sge.addr), wqe.msg_len);
                } else {
                    memmove(host(sge.addr), host(wqe.va), wqe.msg_len);
                }
                qp.wqes_executed += 1;
            } else {
                qp.error = true;
            }
            if (status != AIV_ROCE_STATUS_SUCCESS || (wqe.byte4 & AIV_ROCE_WQE_SIGNALED_BIT) != 0) {
                write_cqe(rec, index, opcode, status, status == 0 ? wqe.msg_len : 0);
            }
            qp.head += 1;
        }
    }

    int nic_doorbell(uint64_t offset, const void* data, uint32_t len) {
        const bool ok = (offset == 0x0 || offset == 0x8) && len == 8;
        nic_writes.push_back(RegWrite{offset, len, ok});
        if (!ok) return AIV_CPU_REG_REFUSED;
        uint64_t word;
        memcpy(&word, data, 8);
        const AivQpRecord rec = read<AivQpRecord>(qp.record);
        const uint32_t tag = word & AIV_ROCE_DB_TAG_MASK;
        const uint32_t command = (word >> AIV_ROCE_DB_CMD_SHIFT) & 0xFu;
        if (offset == 0x0) {
            if (tag != rec.qpn || command != AIV_ROCE_DB_CMD_SQ) {
                nic_errors.push_back("SQ doorbell with tag " + std::to_string(tag) + ", command " + std::to_string(command));
                return AIV_CPU_REG_ACCEPTED;
            }
            const uint16_t index = static_cast<uint16_t>(word >> AIV_ROCE_DB_INDEX_SHIFT);
            const uint32_t producer = qp.producer + static_cast<uint16_t>(index - static_cast<uint16_t>(qp.producer));
            if (producer - qp.head > rec.sq_depth) {
                nic_errors.push_back("SQ doorbell to " + std::to_string(producer) + " overruns the SQ (head " +
                                     std::to_string(qp.head) + ")");
                return AIV_CPU_REG_ACCEPTED;
            }
            // The WQEs it announces must be in HBM when it rings, even though the NIC acts on them later.
            for (uint32_t i = qp.producer; i != producer; ++i) {
                AivRoceWqe wqe;
                AivRoceSge sge;
                std::string why;
                if (!wqe_at(rec, i, &wqe, &sge, &why)) {
                    nic_errors.push_back("the SQ doorbell to " + std::to_string(producer) + " rang before WQE " +
                                         std::to_string(i) + " was in HBM (" + why + ")");
                    break;
                }
            }
            qp.producer = producer;
            qp.sq_doorbells += 1;
            qp.pending = true;
            qp.delay = 2;
        } else {
            const uint32_t consumer = static_cast<uint32_t>(word >> AIV_ROCE_DB_INDEX_SHIFT) & AIV_ROCE_DB_CQ_INDEX_MASK;
            if (tag != rec.cqn || command != AIV_ROCE_DB_CMD_CQ_PTR) {
                nic_errors.push_back("CQ doorbell with tag " + std::to_string(tag) + ", command " + std::to_string(command));
            } else if (consumer - (qp.cq_consumer & AIV_ROCE_DB_CQ_INDEX_MASK) >
                       qp.cq_producer - qp.cq_consumer) {
                nic_errors.push_back("CQ doorbell released CQEs up to " + std::to_string(consumer) + ", only " +
                                     std::to_string(qp.cq_producer) + " written");
            } else {
                qp.cq_consumer = consumer;
                qp.cq_doorbells += 1;
            }
        }
        return AIV_CPU_REG_ACCEPTED;
    }
    uint8_t* host(uint64_t device_addr) { return hbm + (device_addr - dev); }
    template <typename T>
    T read(uint64_t device_addr) {
        T v;
        memcpy(&v, host(device_addr), sizeof(T));
        return v;
    }
    template <typename T>
    void write(uint64_t device_addr, const T& v) {
        memcpy(host(device_addr), &v, sizeof(T));
    }

    void run_engine(uint32_t tail) {
        const AivChannelRecord rec = read<AivChannelRecord>(record);
        while (engine_head != tail) {
            AivSdmaSqe sqe;
            memcpy(&sqe, host(rec.sq_base + uint64_t(engine_head) * AIV_SQE_BYTES), sizeof(sqe));
            if ((sqe.type_word & AIV_SQE_TYPE_MASK) != AIV_SQE_TYPE_SDMA || sqe.length == 0) {
                engine_errors.push_back("SQE " + std::to_string(engine_head) + " is not a copy SQE in HBM (type " +
                                        std::to_string(sqe.type_word) + ", length " + std::to_string(sqe.length) +
                                        ")");
                return;
            }
            const uint64_t src = (uint64_t(sqe.src_addr_high) << 32) | sqe.src_addr_low;
            const uint64_t dst = (uint64_t(sqe.dst_addr_high) << 32) | sqe.dst_addr_low;
            if (src < dev || src + sqe.length > dev + kHbmBytes || dst < dev || dst + sqe.length > dev + kHbmBytes) {
                engine_errors.push_back("SQE " + std::to_string(engine_head) + " addresses outside HBM");
                return;
            }
            memmove(host(dst), host(src), sqe.length);  // SDMA: HBM to HBM, no core's cache involved
            engine_head = engine_head + 1 == rec.sq_depth ? 0 : engine_head + 1;
            sqes_executed += 1;
            write<uint32_t>(record + offsetof(AivChannelRecord, sq_head), engine_head);
        }
    }
};

void* op_translate(void* ctx, uint64_t addr, uint64_t len) {
    Runtime& rt = *static_cast<Runtime*>(ctx);
    if (addr < rt.dev || len > kHbmBytes || addr - rt.dev > kHbmBytes - len) return nullptr;
    return rt.host(addr);
}

int op_register_write(void* ctx, uint64_t addr, const void* data, uint32_t len) {
    Runtime& rt = *static_cast<Runtime*>(ctx);
    if (addr >= rt.nic_reg && addr < rt.nic_reg + kRegBytes) return rt.nic_doorbell(addr - rt.nic_reg, data, len);
    if (addr < rt.reg || addr >= rt.reg + kRegBytes) return AIV_CPU_REG_NOT_REGISTER;
    const uint64_t offset = addr - rt.reg;
    const bool ok = offset == AIV_SDMA_DOORBELL_OFFSET && len == 4;
    rt.reg_writes.push_back(RegWrite{offset, len, ok});
    if (!ok) return AIV_CPU_REG_REFUSED;
    memcpy(&rt.doorbell_value, data, 4);
    // The SQEs a doorbell announces must be in HBM when it rings (a kernel that rings before its SQE DMA completed
    // races the engine), even though this engine acts on them only later.
    if (rt.engine && rt.record != 0) {
        const AivChannelRecord rec = rt.read<AivChannelRecord>(rt.record);
        for (uint32_t slot = rt.announced; rec.sq_depth != 0 && slot != rt.doorbell_value;
             slot = slot + 1 == rec.sq_depth ? 0 : slot + 1) {
            AivSdmaSqe sqe;
            memcpy(&sqe, rt.host(rec.sq_base + uint64_t(slot) * AIV_SQE_BYTES), sizeof(sqe));
            if ((sqe.type_word & AIV_SQE_TYPE_MASK) != AIV_SQE_TYPE_SDMA || sqe.length == 0) {
                rt.engine_errors.push_back("the doorbell to tail " + std::to_string(rt.doorbell_value) +
                                           " rang before SQE " + std::to_string(slot) + " was in HBM");
                break;
            }
        }
        rt.announced = rt.doorbell_value;
    }
    // The engine acts a little later, as hardware would: after the kernel has started polling.
    if (rt.engine) {
        rt.engine_pending = true;
        rt.engine_tail = rt.doorbell_value;
        rt.engine_delay = 2;
    }
    return AIV_CPU_REG_ACCEPTED;
}

uint64_t op_counter(void* ctx) {
    Runtime& rt = *static_cast<Runtime*>(ctx);
    if (rt.engine_pending && --rt.engine_delay == 0) {
        rt.engine_pending = false;
        rt.run_engine(rt.engine_tail);
    }
    if (rt.qp.pending && --rt.qp.delay == 0) {
        rt.qp.pending = false;
        rt.run_nic();
    }
    return rt.counter += 1000;
}

void op_idle(void* ctx, uint32_t unchanged) {
    Runtime& rt = *static_cast<Runtime*>(ctx);
    rt.idle_hints += 1;
    rt.last_unchanged = unchanged;
    if (rt.land_on_hint != 0) {
        // Another agent's write landing while the core sleeps in the hint.
        rt.write<uint64_t>(rt.land_on_hint, rt.land_value);
        rt.land_on_hint = 0;
    }
}

void op_fault(void* ctx, uint32_t kind, uint64_t addr, uint64_t len) {
    char text[128];
    snprintf(text, sizeof(text), "fault kind %u at 0x%llx, %llu bytes", kind, (unsigned long long)addr,
             (unsigned long long)len);
    static_cast<Runtime*>(ctx)->faults.push_back(text);
}

const AivCpuCoreOps kOps = {AIV_CPU_ABI_VERSION, op_translate, op_register_write, op_counter, op_idle, op_fault,
                           nullptr,             nullptr,           nullptr};

struct Core {
    explicit Core(Runtime& rt, uint32_t idx = 0, uint32_t num = 1) {
        if (aiv_cpu_core_enter(&kOps, &rt, idx, num) != 0) __builtin_trap();
    }
    ~Core() { aiv_cpu_core_leave(); }
};

template <typename T>
AscendC::GlobalTensor<T> tensor(uint64_t device_addr) {
    AscendC::GlobalTensor<T> t;
    t.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(device_addr));
    return t;
}
void* gm(uint64_t device_addr) { return reinterpret_cast<void*>(device_addr); }
void* ub(uint64_t offset) { return reinterpret_cast<void*>(offset); }
void dcci_single(uint64_t device_addr) {
    AscendC::DataCacheCleanAndInvalid<uint8_t, AscendC::CacheLine::SINGLE_CACHE_LINE, AscendC::DcciDst::CACHELINE_OUT>(
        tensor<uint8_t>(device_addr));
}
void dcci_entire() {
    AscendC::DataCacheCleanAndInvalid<uint8_t, AscendC::CacheLine::ENTIRE_DATA_CACHE, AscendC::DcciDst::CACHELINE_OUT>(
        tensor<uint8_t>(0));
}
// Every pending DMA done, every scalar UB write ordered before later DMA.
void barrier() { AscendC::PipeBarrier<PIPE_ALL>(); }
// Scalar writes into UB, then a barrier so that DMA may read them.
void ub_fill(uint64_t offset, uint8_t byte, uint32_t n) {
    AscendC::LocalTensor<uint8_t> t;
    t.address_.bufferAddr = static_cast<uint32_t>(offset);
    for (uint32_t i = 0; i < n; ++i) t.SetValue(i, static_cast<uint8_t>(byte + i));
    barrier();
}

// ---- the model ----

void store_not_cleaned_is_invisible() {
    Runtime rt;
    Core core(rt);
    const uint64_t x = rt.dev + 0x100;
    tensor<uint32_t>(x).SetValue(0, 0xabcd1234u);
    CHECK(rt.read<uint32_t>(x) == 0, "HBM saw an uncleaned scalar store: 0x%x", rt.read<uint32_t>(x));
    CHECK(aiv_cpu_core_dirty_lines() == 1, "dirty lines %u", aiv_cpu_core_dirty_lines());
    CHECK(tensor<uint32_t>(x).GetValue(0) == 0xabcd1234u, "the core does not read its own store");
    dcci_single(x);
    CHECK(rt.read<uint32_t>(x) == 0xabcd1234u, "dcci did not write the line back: 0x%x", rt.read<uint32_t>(x));
    CHECK(aiv_cpu_core_dirty_lines() == 0, "dirty lines after dcci %u", aiv_cpu_core_dirty_lines());
}

void load_is_stale_until_invalidated() {
    Runtime rt;
    Core core(rt);
    const uint64_t x = rt.dev + 0x200;
    rt.write<uint64_t>(x, 1);
    CHECK(tensor<uint64_t>(x).GetValue(0) == 1, "first load");
    rt.write<uint64_t>(x, 2);  // another agent changes HBM
    rt.write<uint64_t>(x + 8, 3);
    CHECK(tensor<uint64_t>(x).GetValue(0) == 1, "a cached line must stay stale");
    CHECK(tensor<uint64_t>(x).GetValue(1) == 0, "the whole line was cached at the first fill");
    dcci_single(x);
    CHECK(tensor<uint64_t>(x).GetValue(0) == 2, "after dcci the load must see HBM");
    CHECK(tensor<uint64_t>(x).GetValue(1) == 3, "after dcci the line is refilled");
}

void dma_bypasses_the_cache() {
    Runtime rt;
    Core core(rt);
    const uint64_t x = rt.dev + 0x400;  // 32-byte aligned
    tensor<uint32_t>(x).SetValue(0, 7);  // dirty in the cache
    ub_fill(0, 0x10, 32);
    copy_ubuf_to_gm(gm(x), ub(0), 0, 1, 1, 0, 0);
    barrier();
    CHECK(rt.read<uint8_t>(x) == 0x10, "DMA out must write HBM");
    CHECK(tensor<uint32_t>(x).GetValue(0) == 7, "DMA out must not update the core's cached line");
    rt.write<uint32_t>(x + 4, 0x55);
    copy_gm_to_ubuf(ub(64), gm(x), 0, 1, 1, 0, 0);
    barrier();
    AscendC::LocalTensor<uint32_t> in;
    in.address_.bufferAddr = 64;
    CHECK(in.GetValue(0) == 0x13121110u, "DMA in must read HBM, not the dirty line: 0x%x", in.GetValue(0));
    CHECK(in.GetValue(1) == 0x55u, "DMA in reads HBM");
    // Cleaning writes the whole cached line back: the line's other bytes, cached (as zeros) before the DMA and the
    // Host wrote them, overwrite what they wrote (the documented "random overwrite" when two agents write one line).
    dcci_single(x);
    CHECK(rt.read<uint32_t>(x) == 7, "write-back of the dirty word");
    CHECK(rt.read<uint32_t>(x + 4) == 0, "the write-back is line-granular: 0x%x", rt.read<uint32_t>(x + 4));
    CHECK(rt.read<uint32_t>(x + 8) == 0, "the write-back is line-granular: 0x%x", rt.read<uint32_t>(x + 8));
}

void burst_lengths_count_32_byte_blocks() {
    Runtime rt;
    Core core(rt);
    const uint64_t x = rt.dev + 0x800;
    ub_fill(0, 1, 128);
    copy_ubuf_to_gm(gm(x), ub(0), 0, 1, 1, 0, 0);
    barrier();
    CHECK(rt.read<uint8_t>(x + 31) == 32, "len_burst 1 writes 32 bytes");
    CHECK(rt.read<uint8_t>(x + 32) == 0, "len_burst 1 writes no more than 32 bytes");
    // Two bursts of one block, one block of gap on each side.
    const uint64_t y = rt.dev + 0x900;
    copy_ubuf_to_gm(gm(y), ub(0), 0, 2, 1, 1, 1);
    barrier();
    CHECK(rt.read<uint8_t>(y) == 1 && rt.read<uint8_t>(y + 31) == 32, "first burst");
    CHECK(rt.read<uint8_t>(y + 32) == 0 && rt.read<uint8_t>(y + 63) == 0, "the destination gap is skipped");
    CHECK(rt.read<uint8_t>(y + 64) == 65, "second burst starts after a 32-byte source gap: %u", rt.read<uint8_t>(y + 64));
    // The byte-length variant (DataCopyPad) writes exactly len_burst bytes.
    const uint64_t z = rt.dev + 0xa00;
    copy_ubuf_to_gm_align_b32(gm(z), ub(0), 0, 1, 4, 0, 0, 0, 0);
    barrier();
    CHECK(rt.read<uint32_t>(z) == 0x04030201u && rt.read<uint8_t>(z + 4) == 0, "align_b32 with 4 bytes");
    CHECK(rt.faults.empty(), "%s", rt.faults.empty() ? "" : rt.faults[0].c_str());
    copy_ubuf_to_gm(gm(x), ub(4), 0, 1, 1, 0, 0);
    CHECK(rt.faults.size() == 1, "a UB operand not 32-byte aligned must fault");
}

void wide_dma_onto_a_register_is_refused() {
    Runtime rt;
    Core core(rt);
    AscendC::LocalTensor<uint32_t> t;
    t.address_.bufferAddr = 0;
    t.SetValue(0, 5u);
    barrier();
    copy_ubuf_to_gm(gm(rt.reg + AIV_SDMA_DOORBELL_OFFSET), ub(0), 0, 1, 1, 0, 0);  // 32 bytes onto a 4-byte register
    barrier();
    CHECK(rt.reg_writes.size() == 1 && !rt.reg_writes[0].accepted && rt.reg_writes[0].len == 32,
          "the 32-byte doorbell must reach the register page as one refused 32-byte write");
    CHECK(rt.doorbell_value == 0, "a refused write must not ring");
    AscendC::DataCopyPad(tensor<uint32_t>(rt.reg + AIV_SDMA_DOORBELL_OFFSET), t,
                         AscendC::DataCopyExtParams{1, sizeof(uint32_t), 0, 0, 0});
    barrier();
    CHECK(rt.reg_writes.size() == 2 && rt.reg_writes[1].accepted && rt.reg_writes[1].len == 4, "a 4-byte write");
    CHECK(rt.doorbell_value == 5, "doorbell value %u", rt.doorbell_value);
    copy_ubuf_to_gm(gm(rt.reg + kRegBytes * 4), ub(0), 0, 1, 1, 0, 0);
    barrier();
    CHECK(rt.faults.size() == 1, "a DMA write to neither HBM nor a register must fault");
}

void unaligned_single_line_dcci_covers_only_the_tail() {
    Runtime rt;
    Core core(rt);
    const uint64_t line = rt.dev + 0x1000;
    tensor<uint32_t>(line).SetValue(0, 1);
    tensor<uint32_t>(line + 40).SetValue(0, 2);
    dcci_single(line + 32);
    CHECK(rt.read<uint32_t>(line + 40) == 2, "bytes from the address to the line end are cleaned");
    CHECK(rt.read<uint32_t>(line) == 0, "bytes before the address are not");
    CHECK(aiv_cpu_core_dirty_lines() == 1, "the line's head is still dirty");
    dcci_entire();
    CHECK(rt.read<uint32_t>(line) == 1, "the entire-cache dcci cleans every line");
    CHECK(aiv_cpu_core_dirty_lines() == 0, "nothing dirty after the entire-cache dcci");
}

void polling_unchanged_memory_hints_idle() {
    Runtime rt;
    Core core(rt);
    const uint64_t flag = rt.dev + 0x2000;
    for (int i = 0; i < 100; ++i) {
        dcci_single(flag);
        (void)tensor<uint64_t>(flag).GetValue(0);
    }
    CHECK(rt.idle_hints > 50, "polling an unchanged line must hint idle (%u hints)", rt.idle_hints);
    const uint32_t before = rt.idle_hints;
    rt.write<uint64_t>(flag, 9);
    dcci_single(flag);
    CHECK(tensor<uint64_t>(flag).GetValue(0) == 9, "the change is seen");
    CHECK(rt.idle_hints == before, "a changed line is progress, not idling");
    dcci_single(flag);
    (void)tensor<uint64_t>(flag).GetValue(0);
    CHECK(rt.idle_hints == before, "the count restarts after progress");
}

// The hint stands for the time the core spins on the line: a flag that lands meanwhile is what that very load returns
// (the fill completes at the hint's end), not one poll later.
void a_flag_landing_during_an_idle_hint_is_what_the_load_returns() {
    Runtime rt;
    Core core(rt);
    const uint64_t flag = rt.dev + 0x2000;
    for (int i = 0; i < 40; ++i) {
        dcci_single(flag);
        (void)tensor<uint64_t>(flag).GetValue(0);
    }
    CHECK(rt.idle_hints > 0, "the poll reached its idle hints (%u)", rt.idle_hints);
    const uint32_t before = rt.idle_hints;
    rt.land_on_hint = flag;
    rt.land_value = 7;
    dcci_single(flag);
    const uint64_t seen = tensor<uint64_t>(flag).GetValue(0);
    CHECK(rt.idle_hints == before + 1, "one more hint, during which the flag landed (%u)", rt.idle_hints - before);
    CHECK(seen == 7, "the load that hinted returns the flag that landed during the hint (got %llu)",
          (unsigned long long)seen);
    dcci_single(flag);
    (void)tensor<uint64_t>(flag).GetValue(0);
    CHECK(rt.idle_hints == before + 1, "the landed flag was progress: the count restarted");
}

void dma_waits_for_its_pipe_flags() {
    Runtime rt;
    Core core(rt);
    const uint64_t x = rt.dev + 0x3000;
    AscendC::LocalTensor<uint32_t> t;
    t.address_.bufferAddr = 0;
    // A DMA reading UB the scalar unit wrote with nothing ordering the two.
    t.SetValue(0, 1u);
    copy_ubuf_to_gm(gm(x), ub(0), 0, 1, 1, 0, 0);
    CHECK(rt.faults.size() == 1, "a DMA of unordered scalar UB writes must fault (%zu faults)", rt.faults.size());
    barrier();
    rt.faults.clear();
    // Ordered by S_MTE3; the copy lands only when the kernel waits for MTE3.
    t.SetValue(0, 2u);
    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID0);
    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID0);
    copy_ubuf_to_gm(gm(x), ub(0), 0, 1, 1, 0, 0);
    CHECK(rt.faults.empty(), "an ordered DMA must not fault");
    CHECK(rt.read<uint32_t>(x) == 1, "the DMA is not complete before its pipe is waited for");
    // Rewriting the UB word while the DMA may still read it.
    t.SetValue(0, 3u);
    CHECK(rt.faults.size() == 1, "a scalar write to UB a pending DMA reads must fault");
    rt.faults.clear();
    AscendC::SetFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID0);
    AscendC::WaitFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID0);
    CHECK(rt.read<uint32_t>(x) == 3, "the DMA completes at the wait (reading UB then): %u", rt.read<uint32_t>(x));
    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID1);
    CHECK(rt.faults.size() == 1, "a wait with no set must fault");
}

// The same rules for 8-byte UB stores (the model's inline path), exact to the byte: a DMA of bytes next to an
// unordered store is fine. And a wait that completes a data DMA and a register write lands the register first.
void wide_ub_stores_and_completion_order() {
    Runtime rt;
    Core core(rt);
    const uint64_t x = rt.dev + 0x3000;
    AscendC::LocalTensor<uint64_t> t;
    t.address_.bufferAddr = 64;
    t.SetValue(1, 0x1111111111111111ull);  // UB bytes [72, 80), unordered
    copy_ubuf_to_gm(gm(x), ub(32), 0, 1, 1, 0, 0);  // UB [32, 64): not the stored bytes
    CHECK(rt.faults.empty(), "a DMA beside an unordered store must not fault (%zu faults)", rt.faults.size());
    copy_ubuf_to_gm(gm(x), ub(64), 0, 1, 1, 0, 0);  // UB [64, 96) holds it
    CHECK(rt.faults.size() == 1, "a DMA of an unordered 8-byte UB store must fault (%zu faults)", rt.faults.size());
    barrier();
    rt.faults.clear();
    t.SetValue(0, 0x2222222222222222ull);
    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID0);
    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID0);
    copy_ubuf_to_gm(gm(x), ub(64), 0, 1, 1, 0, 0);
    CHECK(rt.faults.empty(), "an ordered DMA must not fault");
    t.SetValue(0, 0x3333333333333333ull);  // while the DMA may still read it
    CHECK(rt.faults.size() == 1, "an 8-byte scalar write to UB a pending DMA reads must fault");
    rt.faults.clear();
    barrier();
    CHECK(rt.read<uint64_t>(x) == 0x3333333333333333ull, "the DMA read UB at its wait");
    // A data DMA, then a 4-byte register write, completed by one wait: the register sees the data not yet landed.
    rt.engine = true;
    rt.record = rt.dev + 0x4000;
    AivChannelRecord rec;
    memset(&rec, 0, sizeof(rec));
    rec.sq_base = rt.dev + 0x5000;
    rec.sq_depth = 4;
    rt.write(rt.record, rec);
    AscendC::LocalTensor<uint32_t> sqe;
    sqe.address_.bufferAddr = 256;
    sqe.SetValue(0, AIV_SQE_TYPE_SDMA);
    sqe.SetValue(7, 64u);  // length
    sqe.SetValue(32, 1u);  // the doorbell's tail, at UB 384
    barrier();
    copy_ubuf_to_gm(gm(rec.sq_base), ub(256), 0, 1, 2, 0, 0);
    copy_ubuf_to_gm_align_b32(gm(rt.reg + AIV_SDMA_DOORBELL_OFFSET), ub(384), 0, 1, 4, 0, 0, 0, 0);
    barrier();
    CHECK(rt.engine_errors.size() == 1, "the register write must land before the data (%zu errors)",
          rt.engine_errors.size());
    CHECK(rt.read<uint16_t>(rec.sq_base) == AIV_SQE_TYPE_SDMA, "the data DMA landed after it");
}

// ---- the NPU kernel on the model ----

constexpr uint64_t kArgs = 0x0;
constexpr uint64_t kBlocks = 0x40;
constexpr uint64_t kRequests = 0x1000;
constexpr uint64_t kDcq = 0x2000;
constexpr uint64_t kRecord = 0x3000;
constexpr uint64_t kFlag = 0x3040;
constexpr uint64_t kControl = 0x3100;
constexpr uint64_t kSq = 0x4000;
constexpr uint64_t kSrc = 0x10000;
constexpr uint64_t kDst = 0x40000;
constexpr uint32_t kRequestDepth = 16;
constexpr uint32_t kDcqDepth = 4;
constexpr uint32_t kSqDepth = 64;

void setup_kernel(Runtime& rt) {
    rt.engine = true;
    rt.record = rt.dev + kRecord;
    AivKernelArgs args;
    memset(&args, 0, sizeof(args));
    args.blocks = rt.dev + kBlocks;
    args.block_count = 1;
    args.layout_version = AIV_LAYOUT_VERSION;
    rt.write(rt.dev + kArgs, args);
    AivBlockArgs b;
    memset(&b, 0, sizeof(b));
    b.request_ring = rt.dev + kRequests;
    b.dcq = rt.dev + kDcq;
    b.channel_record = rt.dev + kRecord;
    b.flag_area = rt.dev + kFlag;
    b.control = rt.dev + kControl;
    b.wait_budget = 100000000;  // 100,000 polls of the fake counter
    b.request_depth = kRequestDepth;
    b.dcq_depth = kDcqDepth;
    b.doorbell_batch = 2;
    b.max_sqe_bytes = 4096;
    b.launch_mode = AIV_LAUNCH_PER_BATCH;
    b.group_limit = 8;
    rt.write(rt.dev + kBlocks, b);
    AivChannelRecord rec;
    memset(&rec, 0, sizeof(rec));
    rec.sq_base = rt.dev + kSq;
    rec.sq_reg_base = rt.reg;
    rec.sq_depth = kSqDepth;
    rec.stream_id = 3;
    rt.write(rt.dev + kRecord, rec);
    for (uint32_t i = 0; i < 0x20000; ++i) rt.hbm[kSrc + i] = static_cast<uint8_t>(i * 7 + 1);
}

// The Host appends `count` transfers of `length` bytes each (ids from `first_id`) and publishes the request tail.
void post_requests(Runtime& rt, uint32_t first, uint32_t count, uint64_t length) {
    for (uint32_t i = first; i < first + count; ++i) {
        AivRequestEntry e;
        memset(&e, 0, sizeof(e));
        e.transfer_id = 100 + i;
        e.src_addr = rt.dev + kSrc + i * 0x2000;
        e.dst_addr = rt.dev + kDst + i * 0x2000;
        e.length = length;
        e.opcode = AIV_REQUEST_OPCODE_WRITE;
        rt.write(rt.dev + kRequests + AIV_RING_HEADER_BYTES + uint64_t(i % kRequestDepth) * sizeof(e), e);
    }
    rt.write<uint32_t>(rt.dev + kRequests + offsetof(AivRingHeader, tail), first + count);
}

// One launch on an emulated core; then checks, from the Host's view of HBM only, what it published.
void launch_and_check(Runtime& rt, uint32_t first, uint32_t count, uint64_t length) {
    {
        Core core(rt);
        aiv_transfer_kernel(reinterpret_cast<GM_ADDR>(rt.dev + kArgs));
        const uint32_t dirty = aiv_cpu_core_dirty_lines();
        CHECK(dirty == 0, "the kernel left %u dirty lines in its data cache (scalar stores that never reached HBM)",
              dirty);
    }
    for (const RegWrite& w : rt.reg_writes) {
        CHECK(w.accepted, "refused register write at offset 0x%llx, %u bytes (channel exception)",
              (unsigned long long)w.offset, w.len);
    }
    for (const std::string& f : rt.faults) CHECK(false, "%s", f.c_str());
    for (const std::string& e : rt.engine_errors) CHECK(false, "SDMA engine: %s", e.c_str());
    const uint32_t tail = rt.read<uint32_t>(rt.dev + kDcq + offsetof(AivRingHeader, tail));
    CHECK(tail == first + count, "DCQ tail %u, expected %u", tail, first + count);
    for (uint32_t i = first; i < first + count && i < tail; ++i) {
        const AivDcqEntry e =
            rt.read<AivDcqEntry>(rt.dev + kDcq + AIV_RING_HEADER_BYTES + uint64_t(i % kDcqDepth) * sizeof(AivDcqEntry));
        CHECK(e.status == AIV_DCQ_STATUS_COMPLETED, "DCQ entry %u: status %u (the Host saw the tail before the entry)",
              i, e.status);
        CHECK(e.transfer_id == 100 + i, "DCQ entry %u: transfer id %llu", i, (unsigned long long)e.transfer_id);
        CHECK(e.bytes == length, "DCQ entry %u: bytes %llu", i, (unsigned long long)e.bytes);
        CHECK(memcmp(rt.host(rt.dev + kDst + i * 0x2000), rt.host(rt.dev + kSrc + i * 0x2000), length) == 0,
              "transfer %u: destination differs from source", i);
    }
    const uint32_t head = rt.read<uint32_t>(rt.dev + kRequests + offsetof(AivRingHeader, head));
    CHECK(head == first + count, "request head %u", head);
    CHECK(rt.read<uint32_t>(rt.dev + kControl + offsetof(AivControlBlock, running)) == 0, "running still set");
    // The engine publishes its head in the record's first word, on the line of the kernel's sq_tail: the kernel must
    // never write that line back over it.
    CHECK(rt.read<uint32_t>(rt.dev + kRecord + offsetof(AivChannelRecord, sq_head)) == rt.engine_head,
          "record sq_head %u, engine head %u (overwritten by a write-back of the record's line)",
          rt.read<uint32_t>(rt.dev + kRecord + offsetof(AivChannelRecord, sq_head)), rt.engine_head);
    CHECK(rt.read<uint32_t>(rt.dev + kRecord + offsetof(AivChannelRecord, sq_tail)) == rt.engine_head,
          "record sq_tail %u, engine head %u", rt.read<uint32_t>(rt.dev + kRecord + offsetof(AivChannelRecord, sq_tail)),
          rt.engine_head);
}

void npu_kernel_publishes_completions_and_rings_4_byte_doorbells() {
    Runtime rt;
    setup_kernel(rt);
    post_requests(rt, 0, 3, 5000);  // 2 pieces each at 4 KiB per SQE
    launch_and_check(rt, 0, 3, 5000);
    CHECK(rt.sqes_executed == 3 * 2 + 1, "SQEs executed %u", rt.sqes_executed);
    CHECK(!rt.reg_writes.empty(), "no doorbell");
}

void npu_kernel_dcq_wraps() {
    Runtime rt;
    setup_kernel(rt);
    post_requests(rt, 0, 3, 256);
    launch_and_check(rt, 0, 3, 256);
    rt.write<uint32_t>(rt.dev + kDcq + offsetof(AivRingHeader, head), 3);  // the Host consumed them
    post_requests(rt, 3, 3, 256);  // DCQ slots 3, 0, 1
    launch_and_check(rt, 3, 3, 256);
}

// ---- the RDMA route on the model (the fake NIC) ----

constexpr uint64_t kQpTable = 0x3200;  // one AivQpRecord
constexpr uint64_t kWqSq = 0x6000;     // 8 slots of 64 bytes
constexpr uint64_t kWqCq = 0x6400;     // 8 CQEs of 32 bytes
constexpr uint64_t kRemote = 0x80000;  // the "remote" buffer (the same HBM: the NIC copies HBM to HBM)
constexpr uint32_t kQpn = 0x11;
constexpr uint32_t kCqn = 0x22;
constexpr uint32_t kWqDepth = 8;

void setup_rdma(Runtime& rt) {
    setup_kernel(rt);
    AivBlockArgs b = rt.read<AivBlockArgs>(rt.dev + kBlocks);
    b.qp_count = 1;
    b.qp_table = rt.dev + kQpTable;
    b.max_wqe_bytes = 4096;
    rt.write(rt.dev + kBlocks, b);
    AivQpRecord rec;
    memset(&rec, 0, sizeof(rec));
    rec.sq_base = rt.dev + kWqSq;
    rec.sq_db_addr = rt.nic_reg + 0x0;
    rec.cq_base = rt.dev + kWqCq;
    rec.cq_db_addr = rt.nic_reg + 0x8;
    rec.qpn = kQpn;
    rec.cqn = kCqn;
    rec.sq_depth = kWqDepth;
    rec.cq_depth = kWqDepth;
    rec.cq_db_mode = AIV_ROCE_CQ_DB_MODE_HW;
    rec.lkey = 5;
    rec.rkey = 6;
    rt.write(rt.dev + kQpTable, rec);
    rt.qp.record = rt.dev + kQpTable;
    for (uint32_t i = 0; i < 0x20000; ++i) rt.hbm[kRemote + i] = static_cast<uint8_t>(i * 13 + 5);
}

struct Req {
    uint32_t route;
    uint32_t opcode;
    uint64_t length;
};

// Request i moves `length` bytes between kSrc + i * 0x4000 (local) and kRemote + i * 0x4000 (remote) on the RDMA
// route, or from kSrc + i * 0x4000 to kDst + i * 0x4000 on SDMA.
void post_mixed(Runtime& rt, uint32_t first, const std::vector<Req>& reqs) {
    for (uint32_t k = 0; k < reqs.size(); ++k) {
        const uint32_t i = first + k;
        AivRequestEntry e;
        memset(&e, 0, sizeof(e));
        e.transfer_id = 100 + i;
        const uint64_t local = rt.dev + kSrc + (i % 8) * 0x4000;
        const uint64_t other = rt.dev + (reqs[k].route == AIV_REQUEST_ROUTE_RDMA ? kRemote : kDst) + (i % 8) * 0x4000;
        const bool write = reqs[k].opcode == AIV_REQUEST_OPCODE_WRITE;
        e.src_addr = write ? local : other;
        e.dst_addr = write ? other : local;
        e.length = reqs[k].length;
        e.opcode = reqs[k].opcode;
        e.flags = reqs[k].route;  // QP index 0
        rt.write(rt.dev + kRequests + AIV_RING_HEADER_BYTES + uint64_t(i % kRequestDepth) * sizeof(e), e);
    }
    rt.write<uint32_t>(rt.dev + kRequests + offsetof(AivRingHeader, tail), first + uint32_t(reqs.size()));
}

void launch_rdma(Runtime& rt) {
    Core core(rt);
    aiv_transfer_kernel(reinterpret_cast<GM_ADDR>(rt.dev + kArgs));
    const uint32_t dirty = aiv_cpu_core_dirty_lines();
    CHECK(dirty == 0, "the kernel left %u dirty lines in its data cache", dirty);
}

void check_registers_and_faults(Runtime& rt) {
    for (const RegWrite& w : rt.reg_writes) {
        CHECK(w.accepted, "refused register write at offset 0x%llx, %u bytes (channel exception)",
              (unsigned long long)w.offset, w.len);
    }
    for (const RegWrite& w : rt.nic_writes) {
        CHECK(w.accepted, "refused register write at offset 0x%llx, %u bytes (NIC register)",
              (unsigned long long)w.offset, w.len);
    }
    for (const std::string& f : rt.faults) CHECK(false, "%s", f.c_str());
    for (const std::string& e : rt.engine_errors) CHECK(false, "SDMA engine: %s", e.c_str());
    for (const std::string& e : rt.nic_errors) CHECK(false, "NIC: %s", e.c_str());
}

AivDcqEntry dcq_entry(Runtime& rt, uint32_t i) {
    return rt.read<AivDcqEntry>(rt.dev + kDcq + AIV_RING_HEADER_BYTES + uint64_t(i % kDcqDepth) * sizeof(AivDcqEntry));
}

// SDMA and RDMA requests in one group: the RDMA ones as WRITE and READ WQEs of 4 KiB pieces on the QP, one transfer
// with more WQEs than the SQ holds (the kernel signals one WQE in every half SQ and waits for CQEs to reuse slots),
// every CQE consumed and released.
void npu_kernel_rdma_posts_wqes_and_polls_cqes() {
    Runtime rt;
    setup_rdma(rt);
    const std::vector<Req> reqs = {
        {AIV_REQUEST_ROUTE_RDMA, AIV_REQUEST_OPCODE_WRITE, 5000},   // 2 WQEs
        {AIV_REQUEST_ROUTE_SDMA, AIV_REQUEST_OPCODE_WRITE, 3000},
        {AIV_REQUEST_ROUTE_RDMA, AIV_REQUEST_OPCODE_READ, 9000},    // 3 WQEs
        {AIV_REQUEST_ROUTE_RDMA, AIV_REQUEST_OPCODE_WRITE, 40000},  // 10 WQEs, more than the SQ's 8 slots
    };
    post_mixed(rt, 0, reqs);
    launch_rdma(rt);
    check_registers_and_faults(rt);
    const uint32_t tail = rt.read<uint32_t>(rt.dev + kDcq + offsetof(AivRingHeader, tail));
    CHECK(tail == 4, "DCQ tail %u, expected 4", tail);
    for (uint32_t i = 0; i < 4 && i < tail; ++i) {
        const AivDcqEntry e = dcq_entry(rt, i);
        CHECK(e.status == AIV_DCQ_STATUS_COMPLETED, "DCQ entry %u: status %u, syndrome 0x%x", i, e.status, e.syndrome);
        CHECK(e.bytes == reqs[i].length, "DCQ entry %u: bytes %llu", i, (unsigned long long)e.bytes);
        const uint64_t other = (reqs[i].route == AIV_REQUEST_ROUTE_RDMA ? kRemote : kDst) + i * 0x4000;
        CHECK(memcmp(rt.host(rt.dev + other), rt.host(rt.dev + kSrc + i * 0x4000), reqs[i].length) == 0,
              "transfer %u: the two sides differ", i);
    }
    CHECK(dcq_entry(rt, 0).sqes == 2 && dcq_entry(rt, 2).sqes == 3 && dcq_entry(rt, 3).sqes == 10,
          "WQEs per transfer %u %u %u", dcq_entry(rt, 0).sqes, dcq_entry(rt, 2).sqes, dcq_entry(rt, 3).sqes);
    CHECK(rt.qp.wqes_executed == 15, "WQEs executed %u", rt.qp.wqes_executed);
    CHECK(rt.qp.cq_consumer == rt.qp.cq_producer && rt.qp.cq_producer > 0,
          "CQ consumer %u, producer %u (CQEs never released)", rt.qp.cq_consumer, rt.qp.cq_producer);
    const AivQpRecord rec = rt.read<AivQpRecord>(rt.dev + kQpTable);
    CHECK(rec.qpn_seen == kQpn && rec.sq_pi == 15 && rec.sq_ci == 15 && rec.cq_ci == rt.qp.cq_producer &&
              rec.error_status == 0,
          "record kernel line: qpn_seen 0x%x, sq_pi %u, sq_ci %u, cq_ci %u, error 0x%x", rec.qpn_seen, rec.sq_pi,
          rec.sq_ci, rec.cq_ci, rec.error_status);
    CHECK(rt.read<uint32_t>(rt.dev + kControl + offsetof(AivControlBlock, halt_count)) == 0, "the block halted");
    // A second launch goes on from the record's kernel line: the next WQE is the 16th, on the second lap.
    post_mixed(rt, 4, {{AIV_REQUEST_ROUTE_RDMA, AIV_REQUEST_OPCODE_WRITE, 100}});
    rt.write<uint32_t>(rt.dev + kDcq + offsetof(AivRingHeader, head), 4);
    launch_rdma(rt);
    check_registers_and_faults(rt);
    CHECK(dcq_entry(rt, 4).status == AIV_DCQ_STATUS_COMPLETED, "second launch: status %u, syndrome 0x%x",
          dcq_entry(rt, 4).status, dcq_entry(rt, 4).syndrome);
    CHECK(rt.qp.wqes_executed == 16, "WQEs executed %u", rt.qp.wqes_executed);
}

// An error CQE fails exactly the transfer it covers with its status, flushes the later ones on the QP, leaves SDMA
// transfers and earlier RDMA ones complete, does not halt the block, and records the error: the QP is not used
// again (a later request fails with RDMA_QP_ERROR, not posted).
void npu_kernel_rdma_error_cqe_fails_what_it_covers() {
    Runtime rt;
    setup_rdma(rt);
    rt.qp.refused_remote = rt.dev + kRemote + 1 * 0x4000 + 4096;  // the second WQE of transfer 1
    post_mixed(rt, 0, {{AIV_REQUEST_ROUTE_RDMA, AIV_REQUEST_OPCODE_WRITE, 4096},
                       {AIV_REQUEST_ROUTE_RDMA, AIV_REQUEST_OPCODE_WRITE, 8192},
                       {AIV_REQUEST_ROUTE_RDMA, AIV_REQUEST_OPCODE_READ, 4096},
                       {AIV_REQUEST_ROUTE_SDMA, AIV_REQUEST_OPCODE_WRITE, 4096}});
    launch_rdma(rt);
    check_registers_and_faults(rt);
    const uint32_t tail = rt.read<uint32_t>(rt.dev + kDcq + offsetof(AivRingHeader, tail));
    CHECK(tail == 4, "DCQ tail %u, expected 4", tail);
    const uint32_t expected[4] = {AIV_DCQ_STATUS_COMPLETED, AIV_DCQ_STATUS_FAILED, AIV_DCQ_STATUS_FAILED,
                                  AIV_DCQ_STATUS_COMPLETED};
    const uint32_t syndromes[4] = {AIV_SYNDROME_NONE, AIV_SYNDROME_RDMA_CQE | AIV_ROCE_STATUS_REMOTE_ACCESS_ERR,
                                   AIV_SYNDROME_RDMA_CQE | AIV_ROCE_STATUS_WR_FLUSH_ERR, AIV_SYNDROME_NONE};
    for (uint32_t i = 0; i < 4; ++i) {
        const AivDcqEntry e = dcq_entry(rt, i);
        CHECK(e.status == expected[i] && e.syndrome == syndromes[i],
              "DCQ entry %u: status %u, syndrome 0x%x (expected %u, 0x%x)", i, e.status, e.syndrome, expected[i],
              syndromes[i]);
    }
    const AivQpRecord rec = rt.read<AivQpRecord>(rt.dev + kQpTable);
    CHECK(rec.qpn_seen == kQpn && rec.error_status == AIV_ROCE_STATUS_REMOTE_ACCESS_ERR && rec.error_wqe_index == 2,
          "record kernel line: qpn_seen 0x%x, error 0x%x at WQE %u", rec.qpn_seen, rec.error_status,
          rec.error_wqe_index);
    CHECK(rt.read<uint32_t>(rt.dev + kControl + offsetof(AivControlBlock, halt_count)) == 0,
          "an RDMA failure halted the block");
    // The next launch resumes the QP's state from the record: in error, so nothing is posted.
    const uint32_t doorbells = rt.qp.sq_doorbells;
    rt.write<uint32_t>(rt.dev + kDcq + offsetof(AivRingHeader, head), 4);
    post_mixed(rt, 4, {{AIV_REQUEST_ROUTE_RDMA, AIV_REQUEST_OPCODE_WRITE, 64}});
    launch_rdma(rt);
    check_registers_and_faults(rt);
    CHECK(dcq_entry(rt, 4).status == AIV_DCQ_STATUS_FAILED && dcq_entry(rt, 4).syndrome == AIV_SYNDROME_RDMA_QP_ERROR,
          "a request on the QP in error: status %u, syndrome 0x%x", dcq_entry(rt, 4).status, dcq_entry(rt, 4).syndrome);
    CHECK(rt.qp.sq_doorbells == doorbells, "a WQE was posted on the QP in error");
}

struct Case {
    const char* name;
    void (*run)();
};
const Case kCases[] = {
    {"store_not_cleaned_is_invisible", store_not_cleaned_is_invisible},
    {"load_is_stale_until_invalidated", load_is_stale_until_invalidated},
    {"dma_bypasses_the_cache", dma_bypasses_the_cache},
    {"burst_lengths_count_32_byte_blocks", burst_lengths_count_32_byte_blocks},
    {"wide_dma_onto_a_register_is_refused", wide_dma_onto_a_register_is_refused},
    {"unaligned_single_line_dcci_covers_only_the_tail", unaligned_single_line_dcci_covers_only_the_tail},
    {"polling_unchanged_memory_hints_idle", polling_unchanged_memory_hints_idle},
    {"a_flag_landing_during_an_idle_hint_is_what_the_load_returns",
     a_flag_landing_during_an_idle_hint_is_what_the_load_returns},
    {"dma_waits_for_its_pipe_flags", dma_waits_for_its_pipe_flags},
    {"wide_ub_stores_and_completion_order", wide_ub_stores_and_completion_order},
    {"npu_kernel_publishes_completions_and_rings_4_byte_doorbells",
     npu_kernel_publishes_completions_and_rings_4_byte_doorbells},
    {"npu_kernel_dcq_wraps", npu_kernel_dcq_wraps},
    {"npu_kernel_rdma_posts_wqes_and_polls_cqes", npu_kernel_rdma_posts_wqes_and_polls_cqes},
    {"npu_kernel_rdma_error_cqe_fails_what_it_covers", npu_kernel_rdma_error_cqe_fails_what_it_covers},
};

}  // namespace

int main(int argc, char** argv) {
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (const Case& c : kCases) printf("%s\n", c.name);
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: %s <case>|--list\n", argv[0]);
        return 2;
    }
    for (const Case& c : kCases) {
        if (strcmp(argv[1], c.name) != 0) continue;
        c.run();
        if (g_failures == 0) printf("ok %s\n", c.name);
        return g_failures == 0 ? 0 : 1;
    }
    fprintf(stderr, "unknown case %s\n", argv[1]);
    return 2;
}
