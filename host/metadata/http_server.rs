//! The embedded HTTP metadata server (`aiv metadata-server`), following Mooncake's REST rules exactly
//! (docs/mooncake.md section 2):
//!
//! - `GET /metadata?key=K`: 200 with the stored body, or 404;
//! - `PUT /metadata?key=K`: stores the raw body, 200; a PUT to an existing key containing `rpc_meta` is refused with
//!   400 "Duplicate rpc_meta key not allowed";
//! - `DELETE /metadata?key=K`: 200, or 404;
//! - a missing or blank key: 400 (checked first, whatever the method); any other method: 405; any other path: 404.
//!
//! Keys are trimmed of surrounding whitespace and every reply is labelled `application/json`, with the texts of
//! Mooncake's `http_metadata_server.py`. Values live in memory for the life of the process. Reads of a request are bounded in time and size, so a slow or
//! broken client cannot hold the server. The store is bounded ([`StoreLimits`]): a body above `max_body_bytes` is
//! refused with 413, a PUT that would take the store past `max_total_bytes` (keys and values together) or past
//! `max_keys` keys with 507, each with a body naming the limit; replacing a key counts only the difference.
//! Refused PUTs are logged as warnings through a rate limiter
//! ([`crate::log_limit`]): a few lines per second, with the count of the lines left out.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::{EngineError, Result};
use crate::log_limit::LogLimiter;

/// Budget of the refusal warnings.
static REFUSED: LogLimiter = LogLimiter::per_second(5);

/// Largest request body accepted by default.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Bounds of the server's in-memory store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// Largest body of one PUT (default 16 MiB); above it: 413.
    pub max_body_bytes: usize,
    /// Largest total of stored keys and values (default 256 MiB); a PUT past it: 507.
    pub max_total_bytes: u64,
    /// Most keys stored (default 65,536); a PUT of a new key past it: 507.
    pub max_keys: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits { max_body_bytes: MAX_BODY_BYTES, max_total_bytes: 256 << 20, max_keys: 65_536 }
    }
}

/// Accepted range of each store limit.
const LIMIT_RANGE: std::ops::RangeInclusive<u64> = 1..=(1 << 40);

impl StoreLimits {
    /// Checks every limit lies in 1..=2^40; the error names the limit, its value and the accepted range.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let limits = [
            ("max_body_bytes", self.max_body_bytes as u64),
            ("max_total_bytes", self.max_total_bytes),
            ("max_keys", self.max_keys as u64),
        ];
        for (name, value) in limits {
            if !LIMIT_RANGE.contains(&value) {
                return Err(format!(
                    "metadata store limit {name} = {value} is outside {}..={}",
                    LIMIT_RANGE.start(),
                    LIMIT_RANGE.end()
                ));
            }
        }
        Ok(())
    }
}

/// The stored values and their accounted size.
#[derive(Debug, Default)]
struct Values {
    map: HashMap<String, Bytes>,
    /// Sum of key and value lengths.
    total_bytes: u64,
}

fn entry_bytes(key: &str, value: &Bytes) -> u64 {
    (key.len() + value.len()) as u64
}
/// Bound on receiving a request's headers, and separately its body.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on waiting for the accept loop to stop.
const STOP_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct StoreState {
    values: Mutex<Values>,
    limits: StoreLimits,
}

type Store = Arc<StoreState>;

/// A running metadata server; stops when dropped.
#[derive(Debug)]
pub struct MetadataHttpServer {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    stopped: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl MetadataHttpServer {
    /// Binds `address` (port 0 picks a free port) and serves on the metadata service runtime, with the default
    /// [`StoreLimits`].
    pub fn start(address: SocketAddr) -> Result<MetadataHttpServer> {
        MetadataHttpServer::start_with_limits(address, StoreLimits::default())
    }

    /// As [`MetadataHttpServer::start`], with explicit store limits (checked by [`StoreLimits::validate`]).
    pub fn start_with_limits(address: SocketAddr, limits: StoreLimits) -> Result<MetadataHttpServer> {
        let start_error = |reason: String| EngineError::Metadata { operation: "start HTTP metadata server", reason };
        limits.validate().map_err(start_error)?;
        let listener =
            std::net::TcpListener::bind(address).map_err(|error| start_error(format!("bind {address}: {error}")))?;
        listener.set_nonblocking(true).map_err(|error| start_error(error.to_string()))?;
        let local_addr = listener.local_addr().map_err(|error| start_error(error.to_string()))?;
        let runtime = super::runtime::shared()?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener).map_err(|error| start_error(error.to_string()))?
        };
        let (stop, stop_requested) = watch::channel(false);
        let (stopped_sender, stopped) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let store = Arc::new(StoreState { values: Mutex::new(Values::default()), limits });
            accept_loop(listener, store, stop_requested).await;
            let _ = stopped_sender.send(());
        });
        tracing::info!(address = %local_addr, "HTTP metadata server listening");
        Ok(MetadataHttpServer { local_addr, stop, stopped: Mutex::new(Some(stopped)) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The connection string engines use to reach it.
    pub fn url(&self) -> String {
        format!("http://{}/metadata", self.local_addr)
    }

    /// Blocks the calling thread until the server stops (for the CLI, which runs until killed).
    pub fn wait(&self) {
        let stopped = self.stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(stopped) = stopped {
            let _ = stopped.recv();
        }
    }

    /// Stops accepting and closes the listening socket; waits (bounded) until it is closed.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
        let stopped = self.stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(stopped) = stopped {
            if stopped.recv_timeout(STOP_WAIT).is_err() {
                tracing::warn!(address = %self.local_addr, "HTTP metadata server did not stop within {STOP_WAIT:?}");
            }
        }
    }
}

impl Drop for MetadataHttpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn accept_loop(listener: TcpListener, store: Store, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let store = store.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            let store = store.clone();
                            async move { Ok::<_, Infallible>(handle(request, &store).await) }
                        });
                        let served = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(REQUEST_TIMEOUT)
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                        if let Err(error) = served {
                            tracing::debug!(%peer, %error, "HTTP metadata connection ended with an error");
                        }
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "HTTP metadata accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}

/// A refusal of a PUT: logged (rate-limited) and answered with `status` and `body`.
fn refuse(status: StatusCode, key: &str, body: String) -> Response<Full<Bytes>> {
    if let Some(suppressed) = REFUSED.admit() {
        tracing::warn!(
            status = status.as_u16(),
            key,
            reason = %body,
            suppressed,
            "HTTP metadata PUT refused ({suppressed} more like this in the last second)"
        );
    }
    reply(status, body)
}

/// The `key` query parameter, percent-decoded (`+` is a space, as in form encoding); `None` when absent.
fn key_of(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (name == "key").then(|| {
            let spaced = value.replace('+', " ");
            percent_encoding::percent_decode_str(&spaced).decode_utf8_lossy().into_owned()
        })
    })
}

async fn handle(request: Request<Incoming>, store: &Store) -> Response<Full<Bytes>> {
    if request.uri().path() != "/metadata" {
        return reply(StatusCode::NOT_FOUND, "404: Not Found");
    }
    let key = match key_of(request.uri().query()) {
        Some(key) if !key.trim().is_empty() => key.trim().to_owned(),
        _ => return reply(StatusCode::BAD_REQUEST, "metadata key is required"),
    };
    let method = request.method().clone();
    if !matches!(method, Method::GET | Method::PUT | Method::DELETE) {
        let mut response = reply(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed");
        response.headers_mut().insert(ALLOW, hyper::header::HeaderValue::from_static("GET, PUT, DELETE"));
        return response;
    }
    let lock = || store.values.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let limits = store.limits;
    match method {
        Method::GET => match lock().map.get(&key).cloned() {
            Some(value) => reply(StatusCode::OK, value),
            None => reply(StatusCode::NOT_FOUND, "metadata not found"),
        },
        Method::PUT => {
            let body = Limited::new(request.into_body(), limits.max_body_bytes).collect();
            let body = match tokio::time::timeout(REQUEST_TIMEOUT, body).await {
                Ok(Ok(collected)) => collected.to_bytes(),
                Ok(Err(error)) => {
                    let too_large = error.downcast_ref::<http_body_util::LengthLimitError>().is_some();
                    return if too_large {
                        refuse(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            &key,
                            format!("body above the limit of {} bytes (max_body_bytes)", limits.max_body_bytes),
                        )
                    } else {
                        refuse(StatusCode::BAD_REQUEST, &key, format!("could not read the body: {error}"))
                    };
                }
                Err(_) => {
                    return refuse(StatusCode::REQUEST_TIMEOUT, &key, "the body did not arrive in time".to_owned())
                }
            };
            let mut values = lock();
            let old = values.map.get(&key).map(|old| entry_bytes(&key, old));
            if key.contains("rpc_meta") && old.is_some() {
                return refuse(StatusCode::BAD_REQUEST, &key, "Duplicate rpc_meta key not allowed".to_owned());
            }
            if old.is_none() && values.map.len() >= limits.max_keys {
                let reason = format!("store full: it holds {} keys, the limit (max_keys)", limits.max_keys);
                return refuse(StatusCode::INSUFFICIENT_STORAGE, &key, reason);
            }
            let total = values.total_bytes - old.unwrap_or(0) + entry_bytes(&key, &body);
            if total > limits.max_total_bytes {
                let reason = format!(
                    "store full: this value would take it to {total} bytes, above the limit of {} bytes \
                     (max_total_bytes)",
                    limits.max_total_bytes
                );
                return refuse(StatusCode::INSUFFICIENT_STORAGE, &key, reason);
            }
            values.total_bytes = total;
            values.map.insert(key, body);
            reply(StatusCode::OK, "metadata updated")
        }
        _ => {
            let mut values = lock();
            match values.map.remove(&key) {
                Some(old) => {
                    values.total_bytes -= entry_bytes(&key, &old);
                    reply(StatusCode::OK, "metadata deleted")
                }
                None => reply(StatusCode::NOT_FOUND, "metadata not found"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::key_of;

    #[test]
    fn key_parameter_is_decoded() {
        assert_eq!(key_of(Some("key=mooncake%2Fram%2Fa%3A1")).as_deref(), Some("mooncake/ram/a:1"));
        assert_eq!(key_of(Some("x=1&key=a+b%20c")).as_deref(), Some("a b c"));
        assert_eq!(key_of(Some("key=")).as_deref(), Some(""));
        assert_eq!(key_of(Some("key")).as_deref(), Some(""));
        assert_eq!(key_of(Some("other=1")), None);
        assert_eq!(key_of(None), None);
    }
}
