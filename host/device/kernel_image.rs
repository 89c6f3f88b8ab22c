//! The NPU transfer-kernel object, embedded when the build produced it (feature `cann` and a CANN toolkit found by
//! `shmem-bindings/ascendc-build`); the CANN backend loads it with `aclrtBinaryLoadFromData` and looks up
//! [`NPU_KERNEL_ENTRY`]. The CPU twin does not need it: its kernel is linked in as host code.

/// The object bytes, if this build compiled the NPU kernel.
#[cfg(aiv_npu_kernel)]
pub const NPU_KERNEL_OBJECT: Option<&[u8]> = Some(include_bytes!(env!("AIV_NPU_KERNEL_OBJECT")));
/// The object bytes, if this build compiled the NPU kernel.
#[cfg(not(aiv_npu_kernel))]
pub const NPU_KERNEL_OBJECT: Option<&[u8]> = None;

/// Name of the kernel entry point in the object (kernels/npu/entry.cpp).
pub const NPU_KERNEL_ENTRY: &str = "aiv_transfer_kernel";
