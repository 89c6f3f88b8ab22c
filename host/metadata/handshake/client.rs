//! The blocking side of the handshake: one request, one reply, then close.
//!
//! Blocking on purpose: the engine's API is synchronous and may be called from any thread, including one inside a
//! tokio runtime, where blocking on a future would panic. Every step is bounded by the client's timeouts.

use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::{Frame, FrameKind};
use crate::error::{EngineError, Result};

/// Sends handshake requests with bounded waits.
#[derive(Clone, Copy, Debug)]
pub struct HandshakeClient {
    /// Bound on each TCP connect attempt.
    pub connect_timeout: Duration,
    /// Bound on each read and write.
    pub io_timeout: Duration,
}

impl Default for HandshakeClient {
    fn default() -> Self {
        HandshakeClient { connect_timeout: Duration::from_millis(1500), io_timeout: Duration::from_secs(3) }
    }
}

impl HandshakeClient {
    /// Sends `request` to the handshake server at `host:port` and returns its reply, which must have the request's
    /// form and type.
    pub fn exchange(&self, host: &str, port: u16, request: &Frame) -> Result<Frame> {
        let peer = super::super::SegmentName::with_port(host, port);
        let handshake_error =
            |operation: &'static str, reason: String| EngineError::Handshake { peer: peer.clone(), operation, reason };
        let addresses: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|error| handshake_error("resolve handshake peer", error.to_string()))?
            .collect();
        let mut last_error = None;
        let mut stream = None;
        for address in &addresses {
            match TcpStream::connect_timeout(address, self.connect_timeout) {
                Ok(connected) => {
                    stream = Some(connected);
                    break;
                }
                Err(error) => last_error = Some(format!("{address}: {error}")),
            }
        }
        let mut stream = stream.ok_or_else(|| {
            handshake_error(
                "connect to handshake server",
                last_error.unwrap_or_else(|| "the host resolves to no address".into()),
            )
        })?;
        let setup = stream
            .set_read_timeout(Some(self.io_timeout))
            .and_then(|()| stream.set_write_timeout(Some(self.io_timeout)))
            .and_then(|()| stream.set_nodelay(true));
        setup.map_err(|error| handshake_error("configure handshake socket", error.to_string()))?;
        stream
            .write_all(&request.encode())
            .map_err(|error| handshake_error("send handshake request", error.to_string()))?;
        let reply = Frame::read_from(&mut stream).map_err(|error| {
            let reason = match &error {
                super::FrameError::Io(io)
                    if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
                {
                    format!("timed out: no complete reply within {:?}", self.io_timeout)
                }
                _ => error.to_string(),
            };
            handshake_error("receive handshake reply", reason)
        })?;
        if reply.form != request.form {
            return Err(handshake_error(
                "receive handshake reply",
                format!("sent a {:?} frame, the reply is a {:?} frame", request.form, reply.form),
            ));
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
