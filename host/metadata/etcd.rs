//! The etcd backend's store, through etcd's v3 JSON gateway (`POST /v3/kv/put|range|deleterange`, keys and values
//! base64-encoded).
//!
//! Why the gateway and not gRPC: it is part of etcd's v3 API on the client port (etcd 3.4 and later), needs no
//! protobuf code generation (no system `protoc`) and no gRPC stack, and reuses the blocking HTTP client and bounded
//! timeouts of the HTTP backend. Keys are the same as Mooncake's, so Mooncake peers on the same etcd see them.
//!
//! One call has one overall deadline over all the endpoints it tries (connect, send, the whole answer).
//!
//! Owns: the client of an etcd cluster's JSON gateway. It must not retry a call beyond its endpoints once.

use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{json, Value};

use super::store::KeyValueStore;
use crate::error::{EngineError, Result};

/// A blocking client of an etcd cluster; endpoints are tried in order until one answers.
#[derive(Debug)]
pub struct EtcdStore {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    deadline: Duration,
}

impl EtcdStore {
    /// A client of `endpoints` (`host:port` each) with a 1.5 s connect timeout and a 3 s deadline per call.
    pub fn new(endpoints: Vec<String>) -> EtcdStore {
        EtcdStore::with_timeouts(endpoints, Duration::from_millis(1500), Duration::from_secs(3))
    }

    /// A client with explicit timeouts: `connect` per TCP connect, `deadline` per call over all endpoints.
    pub fn with_timeouts(endpoints: Vec<String>, connect: Duration, deadline: Duration) -> EtcdStore {
        let agent = ureq::AgentBuilder::new().timeout_connect(connect).timeout(deadline).build();
        EtcdStore { endpoints, agent, deadline }
    }

    /// Calls one gateway method; a transport failure moves on to the next endpoint, an answer from etcd (even an
    /// error) is final.
    fn call(&self, operation: &'static str, method: &str, key: &str, body: &Value) -> Result<Value> {
        let mut unreachable = Vec::new();
        let until = Instant::now() + self.deadline;
        for endpoint in &self.endpoints {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                unreachable
                    .push(format!("{endpoint}: not tried, the call's deadline of {:?} has passed", self.deadline));
                continue;
            }
            let url = format!("http://{endpoint}/v3/kv/{method}");
            let response = self
                .agent
                .post(&url)
                .timeout(left)
                .set("Content-Type", "application/json")
                .send_string(&body.to_string());
            let failure = |reason: String| EngineError::Metadata { operation, reason };
            match response {
                Ok(response) => {
                    let text = response.into_string().map_err(|error| {
                        failure(format!(
                            "reading etcd's answer from {url} for key {key:?} (deadline {:?}): {error}",
                            self.deadline
                        ))
                    })?;
                    return serde_json::from_str(&text)
                        .map_err(|error| failure(format!("etcd at {url} answered non-JSON for key {key:?}: {error}")));
                }
                Err(ureq::Error::Status(code, response)) => {
                    let text = response.into_string().unwrap_or_default();
                    let message = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|value| value.get("message").and_then(Value::as_str).map(str::to_owned))
                        .unwrap_or(text);
                    return Err(failure(format!("etcd at {url} answered HTTP {code} for key {key:?}: {message}")));
                }
                Err(ureq::Error::Transport(transport)) => {
                    unreachable.push(format!("{endpoint} (deadline {:?}): {transport}", self.deadline))
                }
            }
        }
        Err(EngineError::Metadata {
            operation,
            reason: format!("no etcd endpoint reachable for key {key:?}: {}", unreachable.join("; ")),
        })
    }
}

impl KeyValueStore for EtcdStore {
    fn endpoint(&self) -> String {
        format!("etcd://{}", self.endpoints.join(","))
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let answer = self.call("etcd get", "range", key, &json!({"key": BASE64.encode(key)}))?;
        let Some(value) = answer.get("kvs").and_then(|kvs| kvs.get(0)).and_then(|kv| kv.get("value")) else {
            return Ok(None);
        };
        // etcd omits empty values from the JSON answer.
        let encoded = value.as_str().unwrap_or_default();
        BASE64.decode(encoded).map(Some).map_err(|error| EngineError::Metadata {
            operation: "etcd get",
            reason: format!("value of key {key:?} at {} is not base64: {error}", self.endpoint()),
        })
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call("etcd put", "put", key, &json!({"key": BASE64.encode(key), "value": BASE64.encode(value)})).map(drop)
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let answer = self.call("etcd delete", "deleterange", key, &json!({"key": BASE64.encode(key)}))?;
        // int64 fields come as strings in the gateway's JSON, and are omitted when zero.
        let deleted = answer.get("deleted").map(|count| match count {
            Value::String(text) => text != "0",
            Value::Number(number) => number.as_u64() != Some(0),
            _ => false,
        });
        Ok(deleted.unwrap_or(false))
    }
}
