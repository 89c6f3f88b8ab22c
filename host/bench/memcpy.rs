//! Host buffers of a run, and the same-run memcpy reference its throughput is compared with.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::params::BenchParams;
use crate::error::{EngineError, Result};

/// A host buffer of `size` bytes filled with `fill`, or an error (not an abort) where the allocation fails.
pub(super) fn host_buffer(size: usize, fill: u8) -> Result<Vec<u8>> {
    filled_buffer(size, fill).map_err(|error| EngineError::InvalidArgument {
        operation: "bench",
        reason: format!("cannot allocate a host buffer of {size} bytes ({error}): lower --buffer_size"),
    })
}

/// `size` bytes of `fill` in Host memory, or the allocator's refusal (not an abort).
pub(crate) fn filled_buffer(size: usize, fill: u8) -> std::result::Result<Vec<u8>, std::collections::TryReserveError> {
    let mut buffer = Vec::new();
    buffer.try_reserve_exact(size)?;
    buffer.resize(size, fill);
    Ok(buffer)
}

/// Copies the workload's own blocks with plain `memcpy` on `threads` threads for `duration`: thread `t` copies the
/// blocks at `block_size * (i * threads + t)` for every `i` below `batch_size`, exactly the addresses the engine
/// workload moves, so the ratio compares paths and not cache footprints. Returns bytes per second.
pub fn memcpy_reference(src: &[u8], dst: &mut [u8], params: &BenchParams, duration: Duration) -> f64 {
    let block = params.block_size as usize;
    let threads = params.threads;
    let blocks = params.batch_size * threads;
    let span = (blocks * block).min(src.len()).min(dst.len());
    let started = Instant::now();
    let moved = AtomicU64::new(0);
    let src_addr = src.as_ptr() as usize;
    let dst_addr = dst.as_mut_ptr() as usize;
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let moved = &moved;
            scope.spawn(move || {
                let mut bytes = 0u64;
                while started.elapsed() < duration {
                    for i in 0..params.batch_size {
                        let offset = block * (i * threads + thread);
                        if offset + block > span {
                            break;
                        }
                        // SAFETY: `offset + block <= span`, which lies inside both buffers; threads copy disjoint
                        // blocks (block index i * threads + t is unique per thread), and the buffers outlive the scope.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                (src_addr + offset) as *const u8,
                                (dst_addr + offset) as *mut u8,
                                block,
                            );
                        }
                        bytes += block as u64;
                    }
                }
                moved.fetch_add(bytes, Ordering::Relaxed);
            });
        }
    });
    std::hint::black_box(&mut *dst);
    moved.into_inner() as f64 / started.elapsed().as_secs_f64()
}

/// The memcpy reference of a run: the same blocks copied between two Host buffers of `span` bytes (device memory is
/// not the Host's to copy with memcpy), for at most two seconds.
pub(super) fn memcpy_reference_on_host(span: usize, params: &BenchParams) -> Result<f64> {
    let source = host_buffer(span, 0xA5)?;
    let mut destination = host_buffer(span, 0x5A)?;
    let reference_time = params.duration.min(Duration::from_secs(2));
    Ok(memcpy_reference(&source, &mut destination, params, reference_time))
}
