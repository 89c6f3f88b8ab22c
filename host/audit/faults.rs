//! The audit's error-recovery rounds: per path, a fault is injected while one batch runs, and the round records how
//! long the batch took to end, what became of its transfers, and whether the next, fault-free batch was served.
//!
//! Faults: `out_of_bounds` (one request of the batch runs past the target's registered buffer; every path), and
//! `stalled_engine` (the engine that carries the path's copies stops: the aiv SDMA channels of the initiator's
//! device, the ubshmem stream copies of that device, the SDMA channels of that device's AI CPU for adxl, whose
//! HiXL runs its batches on AI-CPU tasks, and for adxl-fabric those of the AI CPU with AI-CPU unfold, the device's
//! streams with Host unfold), injected through the twin runtime's control API; a path or runtime without
//! that control says so instead.
//! The third round, `killed_peer` (a peer in another process SIGKILLed with the batch pending), is [`super::peer`].

use std::time::{Duration, Instant};

use super::report::FaultRound;
use super::warnings::Expected;
use crate::config::{DeviceBackendKind, EngineConfig};
use crate::error::Result;
use crate::transfer::{Opcode, Protocol, SegmentId, TransferRequest, TransferState};
use crate::TransferEngine;

/// The error-recovery rounds, in the order each path runs them (the last is [`super::peer`]'s).
pub const FAULTS: [&str; 3] = ["out_of_bounds", "stalled_engine", KILLED_PEER];
/// The round that kills the peer process ([`super::peer`]).
pub const KILLED_PEER: &str = "killed_peer";

/// The requests of a fault round: 4 of 64 KiB.
pub(super) const REQUESTS: u64 = 4;
pub(super) const LENGTH: u64 = 64 << 10;

/// Where the rounds run: the rig's engines and one path's buffers.
pub(super) struct Site<'a> {
    pub initiator: &'a TransferEngine,
    pub segment: SegmentId,
    pub local: u64,
    pub remote: u64,
    /// Bytes of each buffer.
    pub size: u64,
}

/// The warnings the `out_of_bounds` round provokes: the engine rejects the request before any path sees it.
pub(super) const OUT_OF_BOUNDS_WARNINGS: &[Expected] = &[Expected {
    target: "aiv_transport::engine",
    message: "request rejected",
    what: "out-of-bounds request rejected",
}];

/// The warnings the `stalled_engine` round provokes: none (the stalled transfers time out, which the round records).
pub(super) const STALLED_ENGINE_WARNINGS: &[Expected] = &[];

/// The `out_of_bounds` round for `path`: one request's target range runs 4 KiB past the end of the target's buffer.
pub(super) fn out_of_bounds(path: Protocol, site: &Site<'_>) -> Result<FaultRound> {
    let mut requests = batch(path, site);
    requests[1].target_offset = site.remote + site.size - 4096;
    round(path, "out_of_bounds", site, &requests, None)
}

/// The `stalled_engine` round for `path`, or why it cannot be injected.
pub(super) fn stalled_engine(config: &EngineConfig, path: Protocol, site: &Site<'_>) -> Result<FaultRound> {
    match stall(config, path, true) {
        Ok(()) => {
            let result = round(path, "stalled_engine", site, &batch(path, site), Some(&|| stall(config, path, false)));
            // Released even if the round failed.
            let _ = stall(config, path, false);
            result
        }
        Err(reason) => Ok(FaultRound::not_injected(path.as_str(), "stalled_engine", reason)),
    }
}

pub(super) fn batch(path: Protocol, site: &Site<'_>) -> Vec<TransferRequest> {
    (0..REQUESTS)
        .map(|i| TransferRequest {
            opcode: Opcode::Write,
            source: site.local + i * LENGTH,
            target_id: site.segment,
            target_offset: site.remote + i * LENGTH,
            length: LENGTH,
            protocol: Some(path),
        })
        .collect()
}

/// Runs the faulty batch, then (after `release`, if any) a fault-free one.
fn round(
    path: Protocol,
    fault: &str,
    site: &Site<'_>,
    requests: &[TransferRequest],
    release: Option<&dyn Fn() -> std::result::Result<(), String>>,
) -> Result<FaultRound> {
    let engine = site.initiator;
    let batch = engine.allocate_batch(requests.len())?;
    let started = Instant::now();
    engine.submit_transfer(batch, requests)?;
    engine.wait_batch(batch)?;
    let detected = started.elapsed();
    let mut states = Vec::new();
    let mut reason = None;
    let mut reasons = Vec::new();
    for task in 0..requests.len() {
        let state = engine.transfer_status(batch, task)?.state;
        let task_reason = if state == TransferState::Completed { None } else { engine.task_reason(batch, task)? };
        if reason.is_none() {
            reason = task_reason.clone();
        }
        reasons.push(task_reason.unwrap_or_default());
        states.push(format!("{state:?}").to_lowercase());
    }
    engine.free_batch(batch)?;
    if let Some(release) = release {
        let _ = release();
    }
    // The next batch, fault-free, within a bound.
    let started = Instant::now();
    let next = engine.allocate_batch(REQUESTS as usize)?;
    engine.submit_transfer(next, &self::batch(path, site))?;
    let status = engine.wait_batch(next)?;
    let recovered = started.elapsed();
    engine.free_batch(next)?;
    Ok(FaultRound {
        path: path.as_str().into(),
        fault: fault.into(),
        injected: true,
        not_injected_reason: None,
        ended_after_ms: Some(ms(detected)),
        states,
        first_reason: reason,
        reasons,
        next_batch_served: Some(status.state == TransferState::Completed),
        next_batch_ms: Some(ms(recovered)),
        ..FaultRound::not_injected(path.as_str(), fault, String::new())
    })
}

pub(super) fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Stalls (`true`) or releases the engine that carries `path`'s copies, through the twin runtime's control API.
pub(super) fn stall(config: &EngineConfig, path: Protocol, stalled: bool) -> std::result::Result<(), String> {
    if config.aiv.device_backend != DeviceBackendKind::Twin {
        return Err(
            "the vendor's runtime has no fault control: only the twin runtime's control API can stall an engine".into(),
        );
    }
    let device = i32::try_from(config.aiv.device_id).map_err(|_| "device id out of range".to_owned())?;
    match path {
        Protocol::Aiv => {
            for channel in 0..config.aiv.aiv_blocks {
                cann_twin::control::set_stalled(device, channel, stalled).map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        Protocol::Ubshmem => {
            cann_twin::control::hold_device_streams(device, stalled);
            Ok(())
        }
        Protocol::Adxl => {
            // The twin's HiXL runs the initiator's batches on its device's AI CPU, whose SDMA channels copy.
            cann_twin::control::set_aicpu_stalled(device, stalled).map_err(|e| e.to_string())
        }
        Protocol::AdxlFabric if config.aiv.fabric_memory.enable_aicpu_unfold => {
            // AI-CPU unfold: the twin's FabricMem runs the initiator's batches on its device's AI CPU, as adxl.
            cann_twin::control::set_aicpu_stalled(device, stalled).map_err(|e| e.to_string())
        }
        Protocol::AdxlFabric => {
            // Host unfold: the engine's aclrtMemcpyAsync copies run on the device's streams.
            cann_twin::control::hold_device_streams(device, stalled);
            Ok(())
        }
        Protocol::Tcp => Err("tcp moves Host memory over sockets: the twin runtime has no engine of it to stall (a \
                              killed peer process, the killed_peer round, is the fault that applies)"
            .into()),
    }
}
