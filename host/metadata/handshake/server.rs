//! The handshake server on the RPC port.
//!
//! It accepts connections on the service runtime, reads one frame per connection (bounded), answers it with the
//! same form and type, shuts its write side (`SHUT_WR`) and waits, bounded, for the client to close. Anything that is
//! not a frame with a JSON payload (an HTTP request, a TLS ClientHello, garbage, an oversize length) is logged with
//! the reason and the connection is closed without a reply, as Mooncake does; the server keeps serving.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener as StdTcpListener, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use super::{Frame, FrameKind};
use crate::error::{EngineError, Result};
use crate::metadata::SegmentDescriptor;

/// Bound on reading a request and on writing a reply.
const IO_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on waiting for the client to close after the reply.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Connections served at once; more are closed on accept.
const MAX_CONNECTIONS: usize = 256;
/// Notifications kept until taken; older ones are dropped first.
const MAX_NOTIFICATIONS: usize = 1024;
/// Bound on waiting for the accept loop to stop.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// A Notify message a peer sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The sender's `name` field.
    pub name: String,
    /// The sender's `notify_msg` field.
    pub message: String,
}

/// What the server answers with: the descriptor it serves and the notifications it received.
#[derive(Debug, Default)]
pub struct HandshakeState {
    descriptor: RwLock<Option<SegmentDescriptor>>,
    notifications: Mutex<VecDeque<Notification>>,
}

impl HandshakeState {
    /// Sets (or clears) the descriptor Metadata requests are answered with.
    pub fn set_descriptor(&self, descriptor: Option<SegmentDescriptor>) {
        *self.descriptor.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = descriptor;
    }

    /// The descriptor Metadata requests are answered with.
    pub fn descriptor(&self) -> Option<SegmentDescriptor> {
        self.descriptor.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Takes the notifications received so far, oldest first.
    pub fn take_notifications(&self) -> Vec<Notification> {
        self.notifications.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).drain(..).collect()
    }

    fn push_notification(&self, notification: Notification) {
        let mut queue = self.notifications.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if queue.len() == MAX_NOTIFICATIONS {
            queue.pop_front();
        }
        queue.push_back(notification);
    }

    /// The reply payload to a request, or why the request is refused (then the connection closes with no reply).
    fn answer(&self, kind: FrameKind, request: &Value) -> std::result::Result<Value, String> {
        match kind {
            FrameKind::Metadata => {
                if let Some(peer) = request.get("name").and_then(Value::as_str) {
                    tracing::debug!(peer, "metadata handshake from peer");
                }
                // With nothing published (engine shutting down) the reply is `{}`, which no reader takes for a
                // descriptor.
                Ok(self.descriptor().map_or_else(|| json!({}), |descriptor| json!(descriptor)))
            }
            FrameKind::Probe => Ok(json!({"status": "success"})),
            FrameKind::Notify => {
                let field = |key: &str| request.get(key).and_then(Value::as_str).map(str::to_owned);
                let (Some(name), Some(message)) = (field("name"), field("notify_msg")) else {
                    return Err("a Notify payload needs string fields \"name\" and \"notify_msg\"".into());
                };
                self.push_notification(Notification { name, message });
                Ok(json!({"name": "", "notify_msg": "success"}))
            }
            // This engine has no transport that needs a connection handshake (no RDMA queue pairs): it answers as
            // a TCP-only Mooncake peer does, every field empty, which is acceptance (`reply_msg` empty).
            FrameKind::Connection => Ok(json!({
                "local_nic_path": "", "local_lid": 0, "local_gid": "", "peer_nic_path": "",
                "qp_num": [], "payload": "", "reply_msg": ""
            })),
        }
    }
}

/// A running handshake server; stops when dropped.
#[derive(Debug)]
pub struct HandshakeServer {
    local_addr: SocketAddr,
    state: Arc<HandshakeState>,
    stop: watch::Sender<bool>,
    stopped: Mutex<std::sync::mpsc::Receiver<()>>,
    is_stopped: AtomicBool,
}

impl HandshakeServer {
    /// Binds `host` on a random free port of `ports` (retrying on bind failure) and starts serving `state`.
    pub fn bind(host: &str, ports: RangeInclusive<u16>, state: Arc<HandshakeState>) -> Result<HandshakeServer> {
        let start_error = |reason: String| EngineError::Metadata { operation: "start handshake server", reason };
        let ip = (host, 0)
            .to_socket_addrs()
            .map_err(|error| start_error(format!("resolve local host {host:?}: {error}")))?
            .next()
            .ok_or_else(|| start_error(format!("local host {host:?} resolves to no address")))?
            .ip();
        let listener = bind_in_range(ip, &ports).map_err(start_error)?;
        listener
            .set_nonblocking(true)
            .map_err(|error| start_error(format!("make the listener non-blocking: {error}")))?;
        let local_addr = listener.local_addr().map_err(|error| start_error(error.to_string()))?;
        let runtime = crate::metadata::runtime::shared()?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener).map_err(|error| start_error(error.to_string()))?
        };
        let (stop, stop_requested) = watch::channel(false);
        let (stopped_sender, stopped) = std::sync::mpsc::sync_channel(1);
        let served = state.clone();
        runtime.spawn(async move {
            accept_loop(listener, served, stop_requested).await;
            let _ = stopped_sender.send(());
        });
        tracing::info!(address = %local_addr, "handshake server listening");
        Ok(HandshakeServer {
            local_addr,
            state,
            stop,
            stopped: Mutex::new(stopped),
            is_stopped: AtomicBool::new(false),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The state it serves.
    pub fn state(&self) -> &Arc<HandshakeState> {
        &self.state
    }

    /// Stops accepting and closes the listening socket; waits (bounded) until it is closed.
    pub fn stop(&self) {
        if self.is_stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.stop.send(true);
        let stopped = self.stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if stopped.recv_timeout(STOP_WAIT).is_err() {
            tracing::warn!(address = %self.local_addr, "handshake server did not stop within {STOP_WAIT:?}");
        }
    }
}

impl Drop for HandshakeServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn bind_in_range(ip: std::net::IpAddr, ports: &RangeInclusive<u16>) -> std::result::Result<StdTcpListener, String> {
    let (low, high) = (*ports.start(), *ports.end());
    if low > high {
        return Err(format!("the RPC port range {low}..={high} is empty"));
    }
    let span = u32::from(high - low) + 1;
    let attempts = span.min(64);
    let mut last_error = String::new();
    for _ in 0..attempts {
        let port = low + (random_u32() % span) as u16;
        match StdTcpListener::bind((ip, port)) {
            Ok(listener) => return Ok(listener),
            Err(error) => last_error = format!("{ip}:{port}: {error}"),
        }
    }
    Err(format!("no free port in {low}..={high} on {ip} after {attempts} random tries (last: {last_error})"))
}

/// A random number from the standard library's per-process hash keys and the clock (no extra dependency; ports need
/// spreading, not cryptographic quality).
fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish() as u32
}

async fn accept_loop(listener: TcpListener, state: Arc<HandshakeState>, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        tracing::warn!(%peer, limit = MAX_CONNECTIONS, "handshake connection refused: too many open");
                        continue;
                    };
                    let state = state.clone();
                    tokio::spawn(async move {
                        serve_connection(stream, peer, &state).await;
                        drop(slot);
                    });
                }
                Err(error) => {
                    // Out of descriptors and the like: pause instead of spinning.
                    tracing::warn!(%error, "handshake accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    tracing::debug!("handshake server stopped");
}

async fn serve_connection(mut stream: TcpStream, peer: SocketAddr, state: &HandshakeState) {
    if let Some(reply) = reply_to_request(&mut stream, peer, state).await {
        match tokio::time::timeout(IO_TIMEOUT, stream.write_all(&reply.encode())).await {
            Ok(Ok(())) => tracing::trace!(%peer, kind = ?reply.kind(), "handshake served"),
            Ok(Err(error)) => tracing::warn!(%peer, %error, "handshake reply not sent"),
            Err(_) => tracing::warn!(%peer, "handshake reply not sent in time"),
        }
    }
    // Half-close, then let the client close first (bounded), as Mooncake's server does. Draining what a refused
    // client still sends makes the close a FIN rather than a reset.
    if let Err(error) = stream.shutdown().await {
        tracing::debug!(%peer, %error, "handshake shutdown(SHUT_WR) failed");
        return;
    }
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        let mut drained = 0usize;
        // Stop at EOF, on error, or after a bounded amount of extra bytes.
        while drained < 64 * 1024 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// Reads one request and builds its reply; `None` (after logging why) when the request is refused.
async fn reply_to_request(stream: &mut TcpStream, peer: SocketAddr, state: &HandshakeState) -> Option<Frame> {
    let frame = match tokio::time::timeout(IO_TIMEOUT, Frame::read_from_async(stream)).await {
        Ok(Ok(frame)) => frame,
        Ok(Err(error)) => {
            tracing::warn!(%peer, %error, "handshake request refused");
            return None;
        }
        Err(_) => {
            tracing::warn!(%peer, timeout = ?IO_TIMEOUT, "handshake request refused: no complete frame in time");
            return None;
        }
    };
    let kind = frame.kind();
    let request: Value = match serde_json::from_slice(&frame.payload) {
        Ok(value) => value,
        Err(error) => {
            tracing::warn!(%peer, ?kind, %error, "handshake request refused: payload is not JSON");
            return None;
        }
    };
    match state.answer(kind, &request) {
        Ok(payload) => Some(frame.reply(payload.to_string().into_bytes())),
        Err(reason) => {
            tracing::warn!(%peer, ?kind, %reason, "handshake request refused");
            None
        }
    }
}
