//! The audit's `killed_peer` fault round: a target engine in another process (the `aiv` binary as
//! `aiv bench --mode target`), reached from the rig's initiator, is SIGKILLed while a batch to it is pending. The
//! round records how many transfers were pending at the kill, the time from the kill to the end of the batch's wait
//! (the time to detect), each transfer's fate, what a new transfer to the dead segment does, and whether the next
//! batch to the rig's in-process target is served.
//!
//! The batch is held pending by the engine that carries the path's copies: aiv's SDMA channels, ubshmem's stream
//! copies and adxl's AI-CPU SDMA channels of the initiator's device (the twin runtime's control API, as
//! `stalled_engine`), and for tcp, whose copies the peer's data server serves, by stopping the peer (SIGSTOP) first.
//! The child is always killed and reaped, also on every error path ([`Peer`]'s `Drop`); should this process die
//! first, the child gets SIGKILL from the kernel (`PR_SET_PDEATHSIG`, tied to the spawning thread, which outlives the
//! round), and it serves at most 60 s anyway.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::child::{self, Peer};
use super::faults::{self, Site};
use super::report::FaultRound;
use super::warnings::Expected;
use crate::config::{DeviceBackendKind, EngineConfig};
use crate::error::Result;
use crate::transfer::{Opcode, Protocol, SegmentId, TransferRequest, TransferState};

/// The fault's name in the report.
pub(super) const FAULT: &str = faults::KILLED_PEER;
/// Bytes the peer serves.
const PEER_BYTES: u64 = 4 << 20;
/// How long the batch is left to settle before the pending transfers are counted and the peer killed.
const SETTLE: Duration = Duration::from_millis(50);

/// The warnings the round provokes: the aiv transport's peer probe, which watches every peer the aiv transport has
/// imported, finds the peer's device gone and fails what was pending to it; the tcp client's connect to the dead
/// peer's data port is refused.
pub(super) const WARNINGS: &[Expected] = &[
    Expected { target: "aiv_transport::transport::aiv::probe", message: "aiv peer lost", what: "peer found lost" },
    Expected {
        target: "aiv_transport::transport::aiv::probe",
        message: "pending transfers to a lost peer failed",
        what: "pending transfers to the lost peer failed",
    },
    Expected {
        target: "aiv_transport::transport::tcp::client",
        message: "tcp: connect failed",
        what: "connect to the killed peer refused",
    },
    Expected {
        target: "aiv_transport::transport::tcp::client",
        message: "tcp: send failed",
        what: "send on a connection to the killed peer failed (broken pipe or reset)",
    },
];

/// The protocol the peer is started with: aiv's target (device memory, exported) serves the device paths, which
/// reach it through the same import; tcp's serves Host memory on its data port.
fn peer_protocol(path: Protocol) -> &'static str {
    if path.is_device_path() {
        "aiv"
    } else {
        "tcp"
    }
}

/// Starts `program` as a target of `path` and waits (bounded) for its ready line: the segment name and the buffer's
/// address.
fn spawn(program: &Path, path: Protocol) -> std::result::Result<Peer, String> {
    let mut command = Command::new(program);
    command
        .args(["bench", "--mode", "target", "--protocol", peer_protocol(path), "--duration", "60"])
        .args(["--buffer_size", &PEER_BYTES.to_string(), "--metadata_server", "P2PHANDSHAKE"])
        .args(["--local_server_name", "127.0.0.1"])
        .env_remove("MOONCAKE_CONFIG_PATH");
    // Should this process die before it kills the peer, the peer dies with it (and it serves at most 60 s anyway).
    child::spawn_target(command)
}

/// Releases a hold on the path's engine when dropped.
struct Hold<'a> {
    release: Option<Box<dyn FnOnce() + 'a>>,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// The `killed_peer` round for `path`. `program` is the `aiv` binary to run as the peer (`None`: not injected).
/// A failure before the kill makes the round "not injected" with the reason; an engine error after it is the
/// audit's error.
pub(super) fn killed_peer(
    config: &EngineConfig,
    program: Option<&Path>,
    path: Protocol,
    site: &Site<'_>,
) -> Result<FaultRound> {
    let not_injected = |reason: String| Ok(FaultRound::not_injected(path.as_str(), FAULT, reason));
    let Some(program) = program else {
        return not_injected(
            "no peer program to run (AuditOptions::peer_program is unset; `aiv audit` sets it to \
                             its own binary)"
                .into(),
        );
    };
    if config.metadata_server != "P2PHANDSHAKE" {
        return not_injected(format!(
            "the peer process is started under P2P handshake only, and this audit's metadata server is {:?}",
            config.metadata_server
        ));
    }
    if path.is_device_path() && config.aiv.device_backend != DeviceBackendKind::Twin {
        return not_injected(
            "the peer process runs on the embedded twin runtime, and this audit's device backend is not the twin: \
             the two could not share memory"
                .into(),
        );
    }
    let peer = match spawn(program, path) {
        Ok(peer) => peer,
        Err(reason) => return not_injected(reason),
    };
    let engine = site.initiator;
    let dead = match engine.open_segment(&peer.name) {
        Ok(segment) => segment,
        Err(e) => return not_injected(format!("cannot open the peer's segment {}: {e}", peer.name)),
    };
    let round = with_peer(config, path, site, peer, dead);
    let _ = engine.close_segment(dead);
    round
}

fn with_peer(
    config: &EngineConfig,
    path: Protocol,
    site: &Site<'_>,
    mut peer: Peer,
    dead: SegmentId,
) -> Result<FaultRound> {
    let not_injected = |reason: String| Ok(FaultRound::not_injected(path.as_str(), FAULT, reason));
    let engine = site.initiator;
    let requests = |count: u64, length: u64| -> Vec<TransferRequest> {
        (0..count)
            .map(|i| TransferRequest {
                opcode: Opcode::Write,
                source: site.local + i * length,
                target_id: dead,
                target_offset: peer.addr + i * length,
                length,
                protocol: Some(path),
            })
            .collect()
    };
    // One transfer first: imports and connections are made on first use, before the fault.
    let (state, reason, _) = run(engine, &requests(1, 4096))?;
    if state != TransferState::Completed {
        return not_injected(format!(
            "the peer could not be reached before the fault ({state:?}): {}",
            reason.unwrap_or_default()
        ));
    }
    // Hold the batch pending.
    let hold = match path {
        Protocol::Aiv | Protocol::Ubshmem | Protocol::Adxl | Protocol::AdxlFabric => {
            match faults::stall(config, path, true) {
                Ok(()) => Hold { release: Some(Box::new(move || drop(faults::stall(config, path, false)))) },
                Err(reason) => return not_injected(format!("cannot hold the batch pending: {reason}")),
            }
        }
        Protocol::Tcp => match peer.stop() {
            Ok(()) => Hold { release: None },
            Err(reason) => return not_injected(format!("cannot hold the batch pending: {reason}")),
        },
    };
    let batch_requests = requests(faults::REQUESTS, faults::LENGTH);
    let batch = engine.allocate_batch(batch_requests.len())?;
    engine.submit_transfer(batch, &batch_requests)?;
    std::thread::sleep(SETTLE);
    let mut pending = 0;
    for task in 0..batch_requests.len() {
        if engine.transfer_status(batch, task)?.state == TransferState::Pending {
            pending += 1;
        }
    }
    let killed_at = Instant::now();
    if let Err(e) = peer.child.kill() {
        drop(hold);
        let _ = engine.wait_batch(batch);
        let _ = engine.free_batch(batch);
        return not_injected(format!("cannot kill the peer: {e}"));
    }
    let _ = peer.child.wait();
    engine.wait_batch(batch)?;
    let detected = killed_at.elapsed();
    let mut states = Vec::new();
    let mut first_reason = None;
    let mut reasons = Vec::new();
    for task in 0..batch_requests.len() {
        let state = engine.transfer_status(batch, task)?.state;
        let reason = if state == TransferState::Completed { None } else { engine.task_reason(batch, task)? };
        if first_reason.is_none() {
            first_reason = reason.clone();
        }
        reasons.push(reason.unwrap_or_default());
        states.push(format!("{state:?}").to_lowercase());
    }
    engine.free_batch(batch)?;
    drop(hold);
    // A new transfer to the dead peer: it must fail at once, naming the loss.
    let (dead_state, dead_reason, dead_took) = run(engine, &requests(1, 4096))?;
    // The next batch, to the rig's in-process target.
    let (next_state, _, next_took) = run(engine, &faults::batch(path, site))?;
    Ok(FaultRound {
        path: path.as_str().into(),
        fault: FAULT.into(),
        injected: true,
        not_injected_reason: None,
        ended_after_ms: Some(faults::ms(detected)),
        states,
        first_reason,
        reasons,
        next_batch_served: Some(next_state == TransferState::Completed),
        next_batch_ms: Some(faults::ms(next_took)),
        pending_at_fault: Some(pending),
        dead_peer_state: Some(format!("{dead_state:?}").to_lowercase()),
        dead_peer_ms: Some(faults::ms(dead_took)),
        dead_peer_reason: dead_reason,
        ..FaultRound::injected(path.as_str(), FAULT)
    })
}

/// Runs one batch to its end: the batch's state, the first failed transfer's reason, and how long it took.
fn run(
    engine: &crate::TransferEngine,
    requests: &[TransferRequest],
) -> Result<(TransferState, Option<String>, Duration)> {
    let started = Instant::now();
    let batch = engine.allocate_batch(requests.len())?;
    engine.submit_transfer(batch, requests)?;
    let status = engine.wait_batch(batch);
    let took = started.elapsed();
    let mut reason = None;
    for task in 0..requests.len() {
        if engine.transfer_status(batch, task)?.state != TransferState::Completed {
            reason = engine.task_reason(batch, task)?;
            break;
        }
    }
    engine.free_batch(batch)?;
    Ok((status?.state, reason, took))
}
