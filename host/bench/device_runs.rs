//! Runs over device memory: two devices of this process, another process's aiv target, and the aiv target side
//! serving device memory filled with a known pattern.

use std::sync::atomic::AtomicBool;

use super::host_runs::serve_until;
use super::initiator::{run_following, run_initiator};
use super::memcpy::memcpy_reference_on_host;
use super::observer::{observe_run, start_observer};
use super::outcome::BenchOutcome;
use super::params::BenchParams;
use super::report::LoopbackReport;
use crate::engine::{AivDevice, TransferEngine};
use crate::error::{EngineError, Result};

/// Runs the workload over a device path (`aiv`, `adxl`, `adxl-fabric`, `ubshmem`: `params.protocol`) between two devices of this process: the initiator engine (named
/// `config.local_hostname`, device `config.aiv.device_id`) and a target engine on the next device id, each with
/// `buffer_size` bytes of device memory registered; then the memcpy reference over the same two buffers.
pub fn run_aiv_pair(config: &crate::config::EngineConfig, params: &BenchParams) -> Result<LoopbackReport> {
    params.validate()?;
    let hbm = config.aiv.hbm_size;
    if params.buffer_size > hbm {
        return Err(EngineError::InvalidArgument {
            operation: "bench",
            reason: format!(
                "buffer_size {} does not fit the device memory of {hbm} bytes (aiv.hbm_size): lower --buffer_size or \
                 raise \"aiv\": {{\"hbm_size\": ...}} in mooncake.json",
                params.buffer_size
            ),
        });
    }
    // Before the engines open: their kernels launch inside the profiling session.
    let session = start_observer(config, params.protocol, &[config.aiv.device_id, config.aiv.device_id + 1]);
    let initiator = TransferEngine::new(config.clone())?;
    let target = TransferEngine::new(target_config(config))?;
    let (initiator_device, target_device) = (initiator.device()?, target.device()?);
    let allocation_error = |error: crate::device::DeviceError| EngineError::InvalidArgument {
        operation: "bench",
        reason: error.to_string(),
    };
    let local = initiator_device.allocate(params.buffer_size).map_err(allocation_error)?;
    let remote = target_device.allocate(params.buffer_size).map_err(allocation_error)?;
    // Touch the blocks the workload uses so that first-touch page faults are not part of the measurement. Device
    // memory is written through the device's copy path: the Host never dereferences a device address.
    let span = (params.batch_size as u64 * params.threads as u64 * params.block_size).min(params.buffer_size) as usize;
    let device_error = |error: crate::device::DeviceError| EngineError::InvalidArgument {
        operation: "bench: fill device memory",
        reason: error.to_string(),
    };
    fill_device(&initiator_device, local.addr(), span, |_| 0xA5).map_err(device_error)?;
    fill_device(&target_device, remote.addr(), span, |_| 0x5A).map_err(device_error)?;
    // SAFETY: the buffers outlive every batch (run_initiator waits for each) and both registrations are withdrawn
    // before they drop.
    unsafe {
        initiator.register_memory(local.addr(), local.len(), &initiator_device.location())?;
        target.register_memory(remote.addr(), remote.len(), &target_device.location())?;
    }
    let outcome = target_segment_run(&initiator, target.name(), params, local.addr(), remote.addr());
    initiator.unregister_memory(local.addr())?;
    target.unregister_memory(remote.addr())?;
    // The initiator goes first, so that its peer probe never finds the target's device gone (a false "peer lost").
    drop(local);
    drop(initiator_device);
    drop(initiator);
    // The target too, before the profiler stops: its kernels have ended by then.
    drop((remote, target_device, target));
    let outcome = outcome?;
    let memcpy_bytes_per_second = memcpy_reference_on_host(span, params)?;
    let mut report = LoopbackReport { outcome, memcpy_bytes_per_second };
    observe_run(&mut report, session);
    Ok(report)
}

/// The configuration of an in-process target engine for `config`'s initiator: the next device id. With P2P
/// handshake both engines are named after their own RPC port; with a metadata store the name is taken as given, so
/// the target gets Ascend's per-device form `host:port:npu_N`.
pub(crate) fn target_config(config: &crate::config::EngineConfig) -> crate::config::EngineConfig {
    let mut target = config.clone();
    if !config.metadata_server.eq_ignore_ascii_case("P2PHANDSHAKE") {
        target.local_hostname = format!("{}:npu_{}", config.local_hostname, config.aiv.device_id + 1);
    }
    target.aiv.device_id = config.aiv.device_id + 1;
    target
}

fn target_segment_run(
    initiator: &TransferEngine,
    target_name: &str,
    params: &BenchParams,
    local_base: u64,
    target_base: u64,
) -> Result<BenchOutcome> {
    let segment = initiator.open_segment(target_name)?;
    run_initiator(initiator, params, segment, local_base, target_base)
}

/// Writes `length` bytes of `byte(offset)` to device memory at `addr`, 4 MiB at a time, through the device's
/// copy path (H2D).
pub(crate) fn fill_device(
    device: &AivDevice,
    addr: u64,
    length: usize,
    byte: impl Fn(usize) -> u8,
) -> std::result::Result<(), crate::device::DeviceError> {
    const CHUNK: usize = 4 << 20;
    let mut chunk = Vec::with_capacity(CHUNK.min(length));
    let mut offset = 0;
    while offset < length {
        let n = CHUNK.min(length - offset);
        chunk.clear();
        chunk.extend((offset..offset + n).map(&byte));
        device.write(addr + offset as u64, &chunk)?;
        offset += n;
    }
    Ok(())
}

/// The byte a served aiv target holds at `offset` before any peer writes: lets a peer process check that what it
/// reads came from the target's device memory.
pub fn target_pattern(offset: u64) -> u8 {
    (offset.wrapping_mul(7).wrapping_add(13) % 251) as u8
}

/// The `aiv` target side for another process's initiator: allocates `buffer_size` bytes of device memory on this
/// engine's device, fills it with [`target_pattern`], registers it (the descriptor then advertises the device's
/// export endpoint), calls `ready` with its address, serves until `stop` is set or `params.duration` has passed,
/// then withdraws it.
pub fn serve_aiv_target(
    engine: &TransferEngine,
    params: &BenchParams,
    stop: &AtomicBool,
    ready: impl FnOnce(u64),
) -> Result<()> {
    let device = engine.device()?;
    let buffer = device.allocate(params.buffer_size).map_err(|error| EngineError::InvalidArgument {
        operation: "bench",
        reason: format!("{error} (lower --buffer_size or raise \"aiv\": {{\"hbm_size\": ...}})"),
    })?;
    let size = usize::try_from(buffer.len())
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    fill_device(&device, buffer.addr(), size, |offset| target_pattern(offset as u64)).map_err(|error| {
        EngineError::InvalidArgument { operation: "bench: fill device memory", reason: error.to_string() }
    })?;
    // SAFETY: the buffer outlives the registration, withdrawn below before it drops.
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location())? };
    ready(buffer.addr());
    serve_until(params, stop);
    engine.unregister_memory(buffer.addr())?;
    Ok(())
}

/// Runs the `aiv` initiator against `segment`, an aiv target of another process: `buffer_size` bytes of this
/// engine's device memory are registered, the workload targets the segment's first buffer, then the memcpy reference
/// over the local buffer and a host scratch buffer of the same size.
pub fn run_aiv_against_segment(engine: &TransferEngine, params: &BenchParams, segment: &str) -> Result<LoopbackReport> {
    params.validate()?;
    let device = engine.device()?;
    let local = device.allocate(params.buffer_size).map_err(|error| EngineError::InvalidArgument {
        operation: "bench",
        reason: format!("{error} (lower --buffer_size or raise \"aiv\": {{\"hbm_size\": ...}})"),
    })?;
    let size = usize::try_from(local.len())
        .map_err(|_| EngineError::InvalidArgument { operation: "bench", reason: "buffer_size exceeds usize".into() })?;
    let span = (params.batch_size as u64 * params.threads as u64 * params.block_size).min(params.buffer_size) as usize;
    fill_device(&device, local.addr(), span, |_| 0xA5).map_err(|error| EngineError::InvalidArgument {
        operation: "bench: fill device memory",
        reason: error.to_string(),
    })?;
    let target_base = engine.get_first_buffer_address(segment)?;
    // SAFETY: the buffer outlives every batch (run_following waits for each) and the registration is withdrawn before
    // it drops.
    unsafe { engine.register_memory(local.addr(), local.len(), &device.location())? };
    let outcome = run_following(engine, params, segment, local.addr(), target_base);
    engine.unregister_memory(local.addr())?;
    let outcome = outcome?;
    let memcpy_bytes_per_second = memcpy_reference_on_host(span.min(size), params)?;
    Ok(LoopbackReport { outcome, memcpy_bytes_per_second })
}
