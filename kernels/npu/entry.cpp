// The transfer kernel compiled for the Ascend AI Vector cores (bisheng/ccec, see shmem-bindings/ascendc-build), and
// the data-cache probe, a test-only entry of the same object (aiv/cache_probe.h; no transfer launches it).
// UNVERIFIED ON HARDWARE: built only when the CANN toolkit is present; not yet run on an NPU by this project.
#include "platform/npu.h"
#include "aiv/transfer_kernel.h"
#include "aiv/cache_probe.h"

KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);

extern "C" __global__ __aicore__ void aiv_transfer_kernel(GM_ADDR kernel_args) {
    aiv::transfer_block(reinterpret_cast<const __gm__ AivKernelArgs*>(kernel_args), aiv_platform::block_idx());
}

// One block: launched with block_dim 1 by the hardware test of the data cache and its twin sibling.
extern "C" __global__ __aicore__ void aiv_cache_probe_kernel(GM_ADDR params) {
    aiv::cache_probe(reinterpret_cast<__gm__ AivCacheProbeParams*>(params));
}
