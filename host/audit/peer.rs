//! The audit's `killed_peer` fault round: a target engine in another process (the `aiv` binary as
//! `aiv bench --mode target`), reached from the rig's initiator, is SIGKILLed while a batch to it is pending. The
//! round records how many transfers were pending at the kill, the time from the kill to the end of the batch's wait
//! (the time to detect), each transfer's fate, what a new transfer to the dead segment does, and whether the next
//! batch to the rig's in-process target is served.
//!
//! The batch is held pending by the engine that carries the path's copies: aiv's SDMA channels and ubshmem's stream
//! copies of the initiator's device (the twin runtime's control API, as `stalled_engine`), and for adxl and tcp,
//! whose copies the peer serves (the twin's HiXL server, the tcp data server), by stopping the peer (SIGSTOP) first.
//! The child is always killed and reaped, also on every error path ([`Peer`]'s `Drop`); should this process die
//! first, the child gets SIGKILL from the kernel (`PR_SET_PDEATHSIG`, tied to the spawning thread, which outlives the
//! round), and it serves at most 60 s anyway.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::faults::{self, Site};
use super::report::FaultRound;
use crate::config::{DeviceBackendKind, EngineConfig};
use crate::error::Result;
use crate::transfer::{Opcode, Protocol, SegmentId, TransferRequest, TransferState};

/// The fault's name in the report.
pub(super) const FAULT: &str = "killed_peer";
/// How long the peer may take to print its ready line.
const READY_WITHIN: Duration = Duration::from_secs(20);
/// Bytes the peer serves.
const PEER_BYTES: u64 = 4 << 20;
/// How long the batch is left to settle before the pending transfers are counted and the peer killed.
const SETTLE: Duration = Duration::from_millis(50);
/// The most of the peer's stderr kept for an error message.
const STDERR_TAIL: usize = 2048;

/// A peer process; killed and reaped on drop.
struct Peer {
    child: Child,
    stderr: Arc<Mutex<String>>,
    name: String,
    addr: u64,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Peer {
    /// What the peer wrote on stderr, the last [`STDERR_TAIL`] bytes.
    fn stderr(&self) -> String {
        self.stderr.lock().unwrap_or_else(|p| p.into_inner()).trim().to_owned()
    }

    /// Sends `signal` to the peer (our own child, not yet reaped).
    fn signal(&self, signal: libc::c_int) -> std::result::Result<(), String> {
        let pid = libc::pid_t::try_from(self.child.id()).map_err(|_| "the peer's pid is out of range".to_owned())?;
        // SAFETY: signals our own child, which is not reaped before `Drop`, so the pid is still its.
        if unsafe { libc::kill(pid, signal) } == 0 {
            Ok(())
        } else {
            Err(format!("signal {signal} to the peer: {}", std::io::Error::last_os_error()))
        }
    }

    /// Stops the peer and waits (at most 1 s) until the kernel says it is stopped.
    fn stop(&self) -> std::result::Result<(), String> {
        self.signal(libc::SIGSTOP)?;
        let stat = format!("/proc/{}/stat", self.child.id());
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(1) {
            // The state is the field after the parenthesised command name.
            match std::fs::read_to_string(&stat) {
                Ok(text) if text.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T')) => {
                    return Ok(())
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(2)),
                // No procfs: give the signal a moment.
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(20));
                    return Ok(());
                }
            }
        }
        Err("the peer was not stopped within 1 s of SIGSTOP".into())
    }
}

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
        .env_remove("MOONCAKE_CONFIG_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Should this process die before it kills the peer, the peer dies with it (and it serves at most 60 s anyway).
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command.spawn().map_err(|e| format!("cannot start the peer {}: {e}", program.display()))?;
    let stdout = child.stdout.take();
    let stderr_pipe = child.stderr.take();
    let stderr = Arc::new(Mutex::new(String::new()));
    // The peer is ours from here: killed and reaped on every return below.
    let mut peer = Peer { child, stderr: stderr.clone(), name: String::new(), addr: 0 };
    let (stdout, stderr_pipe) = match (stdout, stderr_pipe) {
        (Some(out), Some(err)) => (out, err),
        _ => return Err("the peer's stdout or stderr was not piped".into()),
    };
    // Drained until the peer exits, keeping the tail, so that its logging never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stderr_pipe);
        let mut chunk = [0u8; 1024];
        while let Ok(n) = reader.read(&mut chunk) {
            if n == 0 {
                break;
            }
            let mut text = stderr.lock().unwrap_or_else(|p| p.into_inner());
            text.push_str(&String::from_utf8_lossy(&chunk[..n]));
            if text.len() > STDERR_TAIL {
                let cut = text.len() - STDERR_TAIL;
                let cut = (cut..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
                text.drain(..cut);
            }
        }
    });
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = send.send(line);
    });
    let started = Instant::now();
    let line = loop {
        match receive.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if !line.is_empty() => break line,
            Ok(_) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Stdout closed without a line: the peer exited (or is exiting).
                let status = wait_exit(&mut peer.child, Duration::from_secs(2));
                return Err(format!("the peer exited before it was ready ({status}): {}", peer.stderr()));
            }
            Err(mpsc::RecvTimeoutError::Timeout) if started.elapsed() > READY_WITHIN => {
                return Err(format!(
                    "the peer printed no ready line within {} s: {}",
                    READY_WITHIN.as_secs(),
                    peer.stderr()
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| words.iter().position(|w| *w == key).and_then(|i| words.get(i + 1)).copied();
    peer.name = after("segment").ok_or_else(|| format!("no segment name in the peer's ready line {line:?}"))?.into();
    let addr = after("at").ok_or_else(|| format!("no address in the peer's ready line {line:?}"))?;
    let hex = addr.trim_end_matches(',').trim_start_matches("0x");
    peer.addr = u64::from_str_radix(hex, 16).map_err(|_| format!("the peer's address {addr:?} is not hex"))?;
    Ok(peer)
}

/// The child's exit status, waiting at most `within`.
fn wait_exit(child: &mut Child, within: Duration) -> String {
    let started = Instant::now();
    while started.elapsed() < within {
        match child.try_wait() {
            Ok(Some(status)) => return status.to_string(),
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return format!("status unknown: {e}"),
        }
    }
    "still running".into()
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
        Protocol::Aiv | Protocol::Ubshmem => match faults::stall(config, path, site, true) {
            Ok(()) => Hold { release: Some(Box::new(move || drop(faults::stall(config, path, site, false)))) },
            Err(reason) => return not_injected(format!("cannot hold the batch pending: {reason}")),
        },
        Protocol::Adxl | Protocol::Tcp => match peer.stop() {
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
