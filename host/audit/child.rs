//! The audit's long-lived child processes: an `aiv bench --mode target` started and waited for (bounded) until it
//! prints its ready line ([`spawn_target`]). Every child is killed and reaped on every return ([`Peer`]'s `Drop`), and
//! gets SIGKILL from the kernel should this process die first ([`bounded::die_with_parent`], tied to the spawning
//! thread, which outlives the child's use). Used by the `killed_peer` round (`peer`) and the cross-host section
//! (`cross_host`), which runs its commands to their end with [`crate::bounded`].

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bounded;

/// How long a target may take to print its ready line.
pub(super) const READY_WITHIN: Duration = Duration::from_secs(20);
/// The most of a child's stderr kept for an error message.
pub(super) const STDERR_TAIL: usize = 2048;

/// A child process; killed and reaped on drop. For a target, the segment name and the buffer's address from its
/// ready line.
pub(super) struct Peer {
    pub(super) child: Child,
    stderr: Arc<Mutex<String>>,
    pub(super) name: String,
    pub(super) addr: u64,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Peer {
    /// What the child wrote on stderr, the last [`STDERR_TAIL`] bytes.
    pub(super) fn stderr(&self) -> String {
        self.stderr.lock().unwrap_or_else(|p| p.into_inner()).trim().to_owned()
    }

    /// Sends `signal` to the child (our own, not yet reaped).
    pub(super) fn signal(&self, signal: libc::c_int) -> std::result::Result<(), String> {
        let pid = libc::pid_t::try_from(self.child.id()).map_err(|_| "the peer's pid is out of range".to_owned())?;
        // SAFETY: signals our own child, which is not reaped before `Drop`, so the pid is still its.
        if unsafe { libc::kill(pid, signal) } == 0 {
            Ok(())
        } else {
            Err(format!("signal {signal} to the peer: {}", std::io::Error::last_os_error()))
        }
    }

    /// Stops the child and waits (at most 1 s) until the kernel says it is stopped.
    pub(super) fn stop(&self) -> std::result::Result<(), String> {
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

/// Starts `command` with piped stdout and stderr, dying with this process; the stderr is drained (its tail kept) so
/// that the child's logging never blocks on a full pipe. Returns the child and its stdout.
fn start(mut command: Command) -> std::result::Result<(Peer, std::process::ChildStdout), String> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    bounded::die_with_parent(&mut command);
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command.spawn().map_err(|e| format!("cannot start the peer {program}: {e}"))?;
    let stdout = child.stdout.take();
    let stderr_pipe = child.stderr.take();
    let stderr = Arc::new(Mutex::new(String::new()));
    // The child is ours from here: killed and reaped on every return below.
    let peer = Peer { child, stderr: stderr.clone(), name: String::new(), addr: 0 };
    let (stdout, stderr_pipe) = match (stdout, stderr_pipe) {
        (Some(out), Some(err)) => (out, err),
        _ => return Err("the child's stdout or stderr was not piped".into()),
    };
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
    Ok((peer, stdout))
}

/// Starts `command`, an `aiv bench --mode target`, and waits (at most [`READY_WITHIN`]) for its ready line: the
/// segment name and the buffer's address.
pub(super) fn spawn_target(command: Command) -> std::result::Result<Peer, String> {
    let (mut peer, stdout) = start(command)?;
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

/// The child's exit status as text, waiting at most `within`.
pub(super) fn wait_exit(child: &mut Child, within: Duration) -> String {
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
