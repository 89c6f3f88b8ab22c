// The transfer kernel compiled for the CPU twin: entry points called by the twin's emulated AIV cores.
#include "platform/twin.h"
#include "aiv/transfer_kernel.h"

extern "C" {

// Runs block `block_idx` of a launch of `block_num` blocks (the emulated core's GetBlockIdx/GetBlockNum).
void aiv_twin_transfer_kernel(uint64_t kernel_args, uint32_t block_idx, uint32_t block_num) {
    if (block_idx >= block_num) return;
    aiv::transfer_block(reinterpret_cast<const AivKernelArgs*>(kernel_args), block_idx);
}

// The kernel's own chunking, exported so host tests can check it against the Rust mirror.
uint64_t aiv_kernel_piece_count(uint64_t length, uint32_t max_piece) { return aiv::piece_count(length, max_piece); }
uint32_t aiv_kernel_piece_length(uint64_t length, uint32_t max_piece, uint64_t index) {
    return aiv::piece_length(length, max_piece, index);
}

// Microbenchmark hook (benches/kernel.rs): posts `count` copy SQEs of `length` bytes from `src` to `dst` through the
// kernel's real post path (SQE write + doorbell every doorbell_batch SQEs), draining with flag SQEs whenever the SQ
// would fill. Returns the cycles spent inside the post path only (SQE writes and doorbells), excluding the drains;
// *total_cycles receives the whole time. Returns UINT64_MAX if a drain failed.
uint64_t aiv_twin_bench_post(uint64_t kernel_args, uint32_t block_idx, uint64_t src, uint64_t dst, uint32_t length,
                             uint32_t count, uint64_t* total_cycles) {
    const AivKernelArgs* kargs = reinterpret_cast<const AivKernelArgs*>(kernel_args);
    if (block_idx >= kargs->block_count) return UINT64_MAX;
    aiv::Block b;
    b.args = reinterpret_cast<const AivBlockArgs*>(kargs->blocks)[block_idx];
    b.record = reinterpret_cast<AivChannelRecord*>(b.args.channel_record);
    b.flag = reinterpret_cast<AivFlagArea*>(b.args.flag_area);
    b.control = reinterpret_cast<AivControlBlock*>(b.args.control);
    b.flag_seq = aiv_platform::load_u64(&b.flag->source);
    aiv::load_channel(b);
    b.doorbells = 0;
    b.abort_epoch = aiv_platform::load_u32(&b.control->abort_epoch);
    const uint64_t start = aiv_platform::cycles();
    uint64_t posting = 0;
    uint64_t section = start;
    for (uint32_t i = 0; i < count; ++i) {
        if (b.outstanding + 2 > b.sq_depth - 1) {
            aiv::ring(b);
            posting += aiv_platform::cycles() - section;
            if (aiv::drain(b) != aiv::WAIT_OK) return UINT64_MAX;
            section = aiv_platform::cycles();
        }
        aiv::post_copy(b, src, dst, length);
    }
    aiv::ring(b);
    posting += aiv_platform::cycles() - section;
    if (aiv::drain(b) != aiv::WAIT_OK) return UINT64_MAX;
    *total_cycles = aiv_platform::cycles() - start;
    return posting;
}

}
