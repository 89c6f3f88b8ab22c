// The transfer kernel compiled for the Ascend AI Vector cores (bisheng/ccec, see shmem-bindings/ascendc-build).
// UNVERIFIED ON HARDWARE: built only when the CANN toolkit is present; not yet run on an NPU by this project.
#include "platform/npu.h"
#include "aiv/transfer_kernel.h"

KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);

extern "C" __global__ __aicore__ void aiv_transfer_kernel(GM_ADDR kernel_args) {
    aiv::transfer_block(reinterpret_cast<const __gm__ AivKernelArgs*>(kernel_args), aiv_platform::block_idx());
}
