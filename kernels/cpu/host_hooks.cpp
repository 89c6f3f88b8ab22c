// Entry points the Host's tests and benchmarks call on an emulated core of the twin (not part of the transfer path and
// not built for the NPU): the kernel's own chunking, exported so host tests can check it against the Rust mirror, and
// the post-path microbenchmark. They run the NPU platform layer on the CPU model (kernels/cpu), like the kernel: the
// caller installs an emulated core on its thread first (aiv_cpu_core_enter).
#include <time.h>

#include "platform/npu.h"
#include "aiv/transfer_kernel.h"

extern "C" {

// The kernel's own chunking, exported so host tests can check it against the Rust mirror. The kernel cuts pieces of
// a power-of-two size only: 0 pieces (and length 0) for any other `max_piece`.
uint64_t aiv_kernel_piece_count(uint64_t length, uint32_t max_piece) {
    const uint32_t shift = aiv::log2_exact(max_piece);
    return shift == 32 ? 0 : aiv::piece_count(length, shift);
}
uint32_t aiv_kernel_piece_length(uint64_t length, uint32_t max_piece, uint64_t index) {
    const uint32_t shift = aiv::log2_exact(max_piece);
    return shift == 32 ? 0 : aiv::piece_length(length, shift, index);
}

// Microbenchmark hook (benches/kernel.rs): posts `count` copy SQEs of `length` bytes from `src` to `dst` through the
// kernel's real post path (SQE write + doorbell every doorbell_batch SQEs), draining with flag SQEs whenever the SQ
// would fill. Reports, for the post path only (SQE writes and doorbells, drains excluded): *posting_wall_ns (wall
// clock) and *posting_cpu_ns (CPU time of this emulated core's thread, so preemption by other threads of the 2-core
// machine is not counted as cost); *total_ns is the wall time of everything. Returns 0, or 1 if a drain failed.
static uint64_t thread_cpu_ns() {
    struct timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
}

uint32_t aiv_twin_bench_post(uint64_t kernel_args, uint32_t block_idx, uint64_t src, uint64_t dst, uint32_t length,
                             uint32_t count, uint64_t* posting_wall_ns, uint64_t* posting_cpu_ns,
                             uint64_t* total_ns) {
    // Read as the kernel reads them: through the core's platform layer (kernels/cpu), never by dereference.
    AivKernelArgs kargs;
    aiv_platform::read_bytes(&kargs, reinterpret_cast<const __gm__ AivKernelArgs*>(kernel_args), sizeof(AivKernelArgs));
    if (block_idx >= kargs.block_count) return 1;
    aiv::Block b;
    aiv_platform::read_bytes(&b.args, reinterpret_cast<const __gm__ AivBlockArgs*>(kargs.blocks) + block_idx,
                             sizeof(AivBlockArgs));
    b.sqe_shift = aiv::log2_exact(b.args.max_sqe_bytes);
    b.record = reinterpret_cast<__gm__ AivChannelRecord*>(b.args.channel_record);
    b.flag = reinterpret_cast<__gm__ AivFlagArea*>(b.args.flag_area);
    b.control = reinterpret_cast<__gm__ AivControlBlock*>(b.args.control);
    b.flag_seq = aiv::last_flag_seq(b);
    aiv::load_channel(b);
    b.doorbells = 0;
    b.abort_epoch = aiv_platform::load_u32(&b.control->abort_epoch);
    const uint64_t start = aiv_platform::cycles();
    uint64_t wall = 0, cpu = 0;
    uint64_t section_wall = start, section_cpu = thread_cpu_ns();
    for (uint32_t i = 0; i < count; ++i) {
        if (aiv::outstanding(b) + 2 > b.sq_depth - 1) {
            aiv::ring<false>(b);
            wall += aiv_platform::cycles() - section_wall;
            cpu += thread_cpu_ns() - section_cpu;
            if (aiv::drain<false>(b) != aiv::WAIT_OK) return 1;
            section_wall = aiv_platform::cycles();
            section_cpu = thread_cpu_ns();
        }
        aiv::post_copy<false>(b, src, dst, length);
    }
    aiv::ring<false>(b);
    wall += aiv_platform::cycles() - section_wall;
    cpu += thread_cpu_ns() - section_cpu;
    if (aiv::drain<false>(b) != aiv::WAIT_OK) return 1;
    *posting_wall_ns = wall;
    *posting_cpu_ns = cpu;
    *total_ns = aiv_platform::cycles() - start;
    return 0;
}

}

// The post-path microbenchmark as a kernel of the twin runtime's kernel object: the runtime runs it on an emulated
// core as it runs any launch (benches/kernel.rs launches it by name through the cann backend). Its parameters and
// results live in device memory, read and written through the platform layer like the kernel's own.
struct AivBenchPostParams {
    uint64_t kernel_args;
    uint64_t src;
    uint64_t dst;
    uint32_t block_idx;
    uint32_t length;
    uint32_t count;
    uint32_t status;  // out: 0, or 1 when a drain failed
    uint64_t posting_wall;  // out: system counter cycles in the post path
    uint64_t posting_cpu;   // out: CPU ns of the core's thread in the post path
    uint64_t total;         // out: system counter cycles of the whole run
};
static_assert(sizeof(AivBenchPostParams) == 64, "the Rust side writes and reads 64 bytes");

extern "C" __global__ __aicore__ void aiv_bench_post_kernel(GM_ADDR params) {
    AivBenchPostParams p;
    aiv_platform::read_bytes(&p, reinterpret_cast<const __gm__ AivBenchPostParams*>(params), sizeof(p));
    p.status = aiv_twin_bench_post(p.kernel_args, p.block_idx, p.src, p.dst, p.length, p.count, &p.posting_wall,
                                   &p.posting_cpu, &p.total);
    aiv_platform::write_bytes(reinterpret_cast<__gm__ AivBenchPostParams*>(params), &p, sizeof(p));
    aiv_platform::flush_for_device(reinterpret_cast<__gm__ AivBenchPostParams*>(params), sizeof(p));
}
