//! The blocking side of the handshake: one request, one reply, then close.
//!
//! Blocking on purpose: the engine's API is synchronous and may be called from any thread, including one inside a
//! tokio runtime, where blocking on a future would panic. One exchange (connect, send, receive the whole reply) has
//! one overall deadline, `deadline`: a peer that sends its reply a byte at a time cannot hold the caller longer.
//!
//! Retries: a server that is shedding load (the handshake server's admission evicts the oldest waiting connection of
//! a source, docs/metadata.md) closes a connection before it answers a single byte. Such an exchange is tried again,
//! within the same deadline, after 10 ms doubling to 80 ms, at most [`MAX_RETRIES`] times, but only for the requests
//! that read and change nothing (Probe, Metadata); Notify and Connection are never sent twice.
//!
//! Owns: the client side of one exchange and its deadline. It must not cache connections.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::{Frame, FrameKind};
use crate::error::{EngineError, Result};

/// Extra attempts of an idempotent exchange whose connection was closed before any byte of a reply.
pub const MAX_RETRIES: u32 = 3;

/// Why one attempt failed, and whether it may be tried again.
enum AttemptError {
    /// Closed (or reset) by the server before any byte of the reply.
    ClosedUnanswered(EngineError),
    /// Anything else.
    Final(EngineError),
}

/// Sends handshake requests with bounded waits.
#[derive(Clone, Copy, Debug)]
pub struct HandshakeClient {
    /// Bound on each TCP connect attempt (never beyond `deadline`).
    pub connect_timeout: Duration,
    /// Bound on the whole exchange: resolve, connect, send the request and receive the whole reply.
    pub deadline: Duration,
}

impl Default for HandshakeClient {
    fn default() -> Self {
        HandshakeClient { connect_timeout: Duration::from_millis(1500), deadline: Duration::from_secs(3) }
    }
}

/// A socket whose every read and write waits at most until one instant.
struct DeadlineStream<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl DeadlineStream<'_> {
    fn remaining(&self) -> io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        Ok(left)
    }
}

impl Read for DeadlineStream<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.remaining()?))?;
        (&mut &*self.stream).read(buffer)
    }
}

impl Write for DeadlineStream<'_> {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.remaining()?))?;
        (&mut &*self.stream).write(buffer)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn timed_out(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

impl HandshakeClient {
    /// Sends `request` to the handshake server at `host:port` and returns its reply, which must have the request's
    /// form and type.
    pub fn exchange(&self, host: &str, port: u16, request: &Frame) -> Result<Frame> {
        let until = Instant::now() + self.deadline;
        let idempotent = matches!(request.kind(), FrameKind::Probe | FrameKind::Metadata);
        let mut pause = Duration::from_millis(10);
        let mut retries = 0;
        loop {
            match self.attempt(host, port, request, until) {
                Ok(reply) => return Ok(reply),
                Err(AttemptError::Final(error)) => return Err(error),
                Err(AttemptError::ClosedUnanswered(error)) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if !idempotent || retries == MAX_RETRIES || left <= pause {
                        return Err(error);
                    }
                    tracing::debug!(host, port, retries, %error, "handshake closed unanswered; trying again");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(80));
                    retries += 1;
                }
            }
        }
    }

    fn attempt(
        &self,
        host: &str,
        port: u16,
        request: &Frame,
        until: Instant,
    ) -> std::result::Result<Frame, AttemptError> {
        let peer = super::super::SegmentName::with_port(host, port);
        let handshake_error =
            |operation: &'static str, reason: String| EngineError::Handshake { peer: peer.clone(), operation, reason };
        let addresses: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|error| AttemptError::Final(handshake_error("resolve handshake peer", error.to_string())))?
            .collect();
        let mut last_error = None;
        let mut stream = None;
        for address in &addresses {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                last_error = Some(format!("no connection within the deadline of {:?}", self.deadline));
                break;
            }
            match TcpStream::connect_timeout(address, self.connect_timeout.min(left)) {
                Ok(connected) => {
                    stream = Some(connected);
                    break;
                }
                Err(error) => last_error = Some(format!("{address}: {error}")),
            }
        }
        let stream = stream.ok_or_else(|| {
            AttemptError::Final(handshake_error(
                "connect to handshake server",
                last_error.unwrap_or_else(|| "the host resolves to no address".into()),
            ))
        })?;
        stream
            .set_nodelay(true)
            .map_err(|error| AttemptError::Final(handshake_error("configure handshake socket", error.to_string())))?;
        let mut bounded = DeadlineStream { stream: &stream, until };
        bounded.write_all(&request.encode()).map_err(|error| {
            let reason = if timed_out(&error) {
                format!("timed out: request not sent within the deadline of {:?}", self.deadline)
            } else {
                error.to_string()
            };
            AttemptError::Final(handshake_error("send handshake request", reason))
        })?;
        let reply = Frame::read_from(&mut bounded).map_err(|error| {
            let unanswered = match &error {
                super::FrameError::Truncated { received: 0, part, .. } => *part == "length field",
                super::FrameError::Io(io) => io.kind() == io::ErrorKind::ConnectionReset,
                _ => false,
            };
            let reason = match &error {
                super::FrameError::Io(io) if timed_out(io) => {
                    format!("timed out: no complete reply within the deadline of {:?}", self.deadline)
                }
                _ => error.to_string(),
            };
            let error = handshake_error("receive handshake reply", reason);
            if unanswered {
                AttemptError::ClosedUnanswered(error)
            } else {
                AttemptError::Final(error)
            }
        })?;
        if reply.form != request.form {
            return Err(AttemptError::Final(handshake_error(
                "receive handshake reply",
                format!("sent a {:?} frame, the reply is a {:?} frame", request.form, reply.form),
            )));
        }
        tracing::debug!(peer = %peer, kind = ?request.kind(), bytes = reply.payload.len(), "handshake exchanged");
        Ok(reply)
    }

    /// Asks whether a handshake server answers at `host:port` (Probe: `{}` -> `{"status":"success"}`).
    pub fn probe(&self, host: &str, port: u16) -> Result<()> {
        let reply = self.exchange(host, port, &Frame::typed(FrameKind::Probe, b"{}".to_vec()))?;
        let value: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap_or_default();
        if value.get("status").and_then(|status| status.as_str()) == Some("success") {
            Ok(())
        } else {
            Err(EngineError::Handshake {
                peer: super::super::SegmentName::with_port(host, port),
                operation: "probe handshake server",
                reason: format!("unexpected reply {:?}", String::from_utf8_lossy(&reply.payload)),
            })
        }
    }
}
