//! The NPU transfer-kernel object, embedded when the build produced it (feature `cann` and a CANN toolkit found by
//! `shmem-bindings/ascendc-build`); the CANN backend loads it with `aclrtBinaryLoadFromData` and looks up
//! [`NPU_KERNEL_ENTRY`]. On the twin runtime the same backend loads [`TWIN_KERNEL_OBJECT`] instead: the same kernel
//! source compiled for the host against the CPU model of AscendC, as a shared object (`ascendc_build::build_twin_object`).

/// The object bytes, if this build compiled the NPU kernel.
#[cfg(aiv_npu_kernel)]
pub const NPU_KERNEL_OBJECT: Option<&[u8]> = Some(include_bytes!(env!("AIV_NPU_KERNEL_OBJECT")));
/// The object bytes, if this build compiled the NPU kernel.
#[cfg(not(aiv_npu_kernel))]
pub const NPU_KERNEL_OBJECT: Option<&[u8]> = None;

/// Name of the kernel entry point in the object (kernels/npu/entry.cpp).
pub const NPU_KERNEL_ENTRY: &str = "aiv_transfer_kernel";

/// The kernel object of the twin runtime, always built: what `aclrtBinaryLoadFromData` receives there.
pub const TWIN_KERNEL_OBJECT: &[u8] = include_bytes!(env!("AIV_TWIN_KERNEL_OBJECT"));
