//! Kernel-level microbenchmark hooks of the twin (used by `benches/kernel.rs`; not part of the transfer path).

use std::time::Duration;

extern "C" {
    fn aiv_twin_bench_post(
        kernel_args: u64,
        block_idx: u32,
        src: u64,
        dst: u64,
        length: u32,
        count: u32,
        posting_wall_ns: *mut u64,
        posting_cpu_ns: *mut u64,
        total_ns: *mut u64,
    ) -> u32;
}

/// Time spent posting, and the whole time including drains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostTiming {
    /// Wall time inside the kernel's post path: SQE writes and doorbells.
    pub posting: Duration,
    /// CPU time of the emulated core's thread inside the post path (excludes preemption by other threads).
    pub posting_cpu: Duration,
    /// Everything, including the flag drains that wait for the SDMA engine.
    pub total: Duration,
}

/// Posts `count` copy SQEs of `length` bytes from `src` to `dst` on block `block` through the kernel's real post path
/// (the block's configured doorbell batch applies), with the channel's SDMA engine running. `None` if a drain failed
/// or `block` is not below `blocks`.
///
/// `kernel_args` and `blocks` are an aiv transport's kernel arguments (`AivTransport::kernel_args`). The transport
/// must run in per-batch mode with no launch in flight (nothing else may post to the channel), and `src`/`dst` must
/// be device memory of its device.
pub fn post_sqes(
    device: &super::TwinDevice,
    (kernel_args, blocks): (u64, u32),
    block: u32,
    src: u64,
    dst: u64,
    length: u32,
    count: u32,
) -> Option<PostTiming> {
    let args = kernel_args;
    if block >= blocks {
        return None;
    }
    let context = device.block_context(block)?;
    let (mut wall, mut cpu, mut total) = (0u64, 0u64, 0u64);
    // The post path runs as the kernel does: on an emulated core of the block, through the CPU model of AscendC.
    let (failed, _) = super::core_ops::on_core(context, block, blocks, || {
        // SAFETY: `args` is the transport's live kernel-argument block; the caller guarantees no kernel launch posts
        // to this channel concurrently, and the SDMA engine checks src/dst against the device's windows. The
        // out-parameters are valid locals.
        unsafe { aiv_twin_bench_post(args, block, src, dst, length, count, &mut wall, &mut cpu, &mut total) }
    })?;
    (failed == 0).then(|| PostTiming {
        posting: Duration::from_nanos(wall),
        posting_cpu: Duration::from_nanos(cpu),
        total: Duration::from_nanos(total),
    })
}
