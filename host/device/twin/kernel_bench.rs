//! Kernel-level microbenchmark hooks of the twin (used by `benches/kernel.rs`; not part of the transfer path).

use std::time::Duration;

use crate::transport::aiv::AivTransport;

extern "C" {
    fn aiv_twin_bench_post(
        kernel_args: u64,
        block_idx: u32,
        src: u64,
        dst: u64,
        length: u32,
        count: u32,
        total_cycles: *mut u64,
    ) -> u64;
}

/// Time spent posting, and the whole time including drains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostTiming {
    /// Cycles (ns on the twin) inside the kernel's post path: SQE writes and doorbells.
    pub posting: Duration,
    /// Everything, including the flag drains that wait for the SDMA engine.
    pub total: Duration,
}

/// Posts `count` copy SQEs of `length` bytes from `src` to `dst` on block `block` through the kernel's real post path
/// (the block's configured doorbell batch applies), with the channel's SDMA engine running. `None` if a drain failed.
///
/// The transport must run in per-batch mode with no launch in flight (nothing else may post to the channel), and
/// `src`/`dst` must be device memory of its device.
pub fn post_sqes(
    transport: &AivTransport,
    block: u32,
    src: u64,
    dst: u64,
    length: u32,
    count: u32,
) -> Option<PostTiming> {
    let (args, blocks) = transport.kernel_args();
    if block >= blocks {
        return None;
    }
    let mut total = 0u64;
    // SAFETY: `args` is the transport's live kernel-argument block; the caller guarantees no kernel launch posts to
    // this channel concurrently, and the SDMA engine checks src/dst against the device's windows.
    let posting = unsafe { aiv_twin_bench_post(args, block, src, dst, length, count, &mut total) };
    (posting != u64::MAX)
        .then(|| PostTiming { posting: Duration::from_nanos(posting), total: Duration::from_nanos(total) })
}
