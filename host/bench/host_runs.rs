//! Runs over Host memory: one engine's own segment, two engines of this process, another process's segment, and
//! the target side serving a Host buffer to another process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::initiator::{run_following, run_initiator};
use super::memcpy::{host_buffer, memcpy_reference};
use super::params::BenchParams;
use super::report::LoopbackReport;
use crate::engine::TransferEngine;
use crate::error::{EngineError, Result};
use crate::transfer::SegmentId;

/// Runs initiator and target in this process: one engine whose own segment is the target, two buffers of
/// `buffer_size` bytes registered with it, then the memcpy reference over the same buffers.
pub fn run_loopback(engine: &TransferEngine, params: &BenchParams) -> Result<LoopbackReport> {
    params.validate()?;
    let size = usize::try_from(params.buffer_size)
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    // Filled (not merely zeroed) so that first-touch page faults are not part of the measurement.
    let mut local = host_buffer(size, 0xA5)?;
    let mut target = host_buffer(size, 0x5A)?;
    let local_addr = local.as_mut_ptr() as u64;
    let target_addr = target.as_mut_ptr() as u64;
    // SAFETY: both vectors live until the end of this function, after every batch has finished (run_initiator
    // waits for each batch) and after both registrations are withdrawn below.
    unsafe {
        engine.register_memory(local_addr, params.buffer_size, "cpu:0")?;
        engine.register_memory(target_addr, params.buffer_size, "cpu:0")?;
    }
    let outcome = run_initiator(engine, params, SegmentId::LOCAL, local_addr, target_addr);
    engine.unregister_memory(local_addr)?;
    engine.unregister_memory(target_addr)?;
    let outcome = outcome?;
    let reference_time = params.duration.min(Duration::from_secs(2));
    let memcpy_bytes_per_second = memcpy_reference(&local, &mut target, params, reference_time);
    Ok(LoopbackReport { outcome, memcpy_bytes_per_second })
}

/// Runs initiator and target as two engines of this process: `target` serves a buffer of `buffer_size` bytes,
/// `initiator` opens `target`'s segment by name and moves the workload to it through its transport for
/// `params.protocol` (for `tcp`: over loopback sockets, every byte through the wire). Then the memcpy reference
/// over the same two buffers.
pub fn run_two_engines(
    initiator: &TransferEngine,
    target: &TransferEngine,
    params: &BenchParams,
) -> Result<LoopbackReport> {
    params.validate()?;
    let size = usize::try_from(params.buffer_size)
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    let mut local = host_buffer(size, 0xA5)?;
    let mut remote = host_buffer(size, 0x5A)?;
    let local_addr = local.as_mut_ptr() as u64;
    let remote_addr = remote.as_mut_ptr() as u64;
    // SAFETY: both vectors live until the end of this function, after every batch has finished (run_initiator
    // waits for each batch) and after both registrations are withdrawn below.
    unsafe {
        initiator.register_memory(local_addr, params.buffer_size, "cpu:0")?;
        target.register_memory(remote_addr, params.buffer_size, "cpu:0")?;
    }
    let outcome = initiator
        .open_segment(target.name())
        .and_then(|segment| run_initiator(initiator, params, segment, local_addr, remote_addr));
    initiator.unregister_memory(local_addr)?;
    target.unregister_memory(remote_addr)?;
    let outcome = outcome?;
    let reference_time = params.duration.min(Duration::from_secs(2));
    let memcpy_bytes_per_second = memcpy_reference(&local, &mut remote, params, reference_time);
    Ok(LoopbackReport { outcome, memcpy_bytes_per_second })
}

/// Runs the initiator against `segment`, a segment of another process found through `engine`'s metadata: a local
/// buffer of `buffer_size` bytes is registered, the workload targets the segment's first buffer. Then the memcpy
/// reference over the local buffer and a scratch buffer of the same size.
pub fn run_against_segment(engine: &TransferEngine, params: &BenchParams, segment: &str) -> Result<LoopbackReport> {
    params.validate()?;
    let size = usize::try_from(params.buffer_size)
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    let target_base = engine.get_first_buffer_address(segment)?;
    let mut local = host_buffer(size, 0xA5)?;
    let local_addr = local.as_mut_ptr() as u64;
    // SAFETY: the vector lives until the end of this function, after every batch has finished (run_initiator waits
    // for each batch) and after the registration is withdrawn below.
    unsafe { engine.register_memory(local_addr, params.buffer_size, "cpu:0")? };
    let outcome = run_following(engine, params, segment, local_addr, target_base);
    engine.unregister_memory(local_addr)?;
    let outcome = outcome?;
    let mut scratch = host_buffer(size, 0x5A)?;
    let reference_time = params.duration.min(Duration::from_secs(2));
    let memcpy_bytes_per_second = memcpy_reference(&local, &mut scratch, params, reference_time);
    Ok(LoopbackReport { outcome, memcpy_bytes_per_second })
}

/// Serves until `stop` is set or `params.duration` has passed, checking `stop` every 20 ms.
pub(super) fn serve_until(params: &BenchParams, stop: &AtomicBool) {
    let started = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let Some(left) = params.duration.checked_sub(started.elapsed()).filter(|left| !left.is_zero()) else {
            break;
        };
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

/// The target side for another process's initiator: registers a buffer of `buffer_size` bytes with `engine`
/// (published through its metadata), calls `ready` with its address, serves until `stop` is set or
/// `params.duration` has passed, then withdraws it.
pub fn serve_target(
    engine: &TransferEngine,
    params: &BenchParams,
    stop: &AtomicBool,
    ready: impl FnOnce(u64),
) -> Result<()> {
    let size = usize::try_from(params.buffer_size)
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    let mut buffer = host_buffer(size, 0x5A)?;
    let addr = buffer.as_mut_ptr() as u64;
    // SAFETY: the vector outlives the registration, withdrawn below before it is dropped; peers only reach it
    // through the engine's transports while it is registered.
    unsafe { engine.register_memory(addr, params.buffer_size, "cpu:0")? };
    ready(addr);
    serve_until(params, stop);
    engine.unregister_memory(addr)?;
    drop(buffer);
    Ok(())
}
