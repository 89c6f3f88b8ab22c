//! INTERIM — a minimal HTTP metadata client, only so the tcp transport can be tested against real Mooncake peers
//! before the shared metadata layer lands. To be replaced by the HTTP backend of `crate::metadata` (the metadata
//! engineer's work): delete this file and its one use in `TransferEngine::new` then.
//!
//! What it does (MOONCAKE_COMPAT.md section 2): `GET|PUT|DELETE <url>?key=<escaped key>` against a Mooncake HTTP
//! metadata server; publishes `mooncake/[cluster/]ram/<name>` (the descriptor) and, once per name,
//! `mooncake/[cluster/]rpc_meta/<name>` (`{"ip_or_host_name", "rpc_port"}` — Mooncake's tcp initiator looks the
//! peer's host up there). It serves no RPC/handshake port: the `rpc_port` published is the port of the segment
//! name, and nothing listens there. Plain HTTP/1.1 over `std::net`, one request per connection, 3 s budget.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{EngineError, Result};
use crate::metadata::{MetadataBackend, SegmentDescriptor};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
const TOTAL_TIMEOUT: Duration = Duration::from_secs(3);

/// A Mooncake HTTP metadata server, reached at `http://host:port/path`.
#[derive(Debug)]
pub struct InterimHttpMetadata {
    authority: String,
    path: String,
    cluster_prefix: String,
    rpc_published: Mutex<HashSet<String>>,
}

impl InterimHttpMetadata {
    /// Parses `http://host:port/path`; `cluster_id` is `MC_METADATA_CLUSTER_ID` (empty: none).
    pub fn new(url: &str, cluster_id: &str) -> Result<Self> {
        let invalid =
            |reason: &str| EngineError::Metadata { operation: "connect", reason: format!("{url:?}: {reason}") };
        let rest = url.strip_prefix("http://").ok_or_else(|| invalid("only http:// is supported"))?;
        let (authority, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => (rest, "/metadata"),
        };
        if authority.is_empty() {
            return Err(invalid("no host"));
        }
        let cluster_prefix = if cluster_id.is_empty() { String::new() } else { format!("{cluster_id}/") };
        Ok(InterimHttpMetadata {
            authority: authority.to_owned(),
            path: path.to_owned(),
            cluster_prefix,
            rpc_published: Mutex::new(HashSet::new()),
        })
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("mooncake/{}{kind}/{name}", self.cluster_prefix)
    }

    /// One request; returns the status code and body.
    fn request(&self, operation: &'static str, method: &str, key: &str, body: &[u8]) -> Result<(u16, Vec<u8>)> {
        let error = |reason: String| EngineError::Metadata { operation, reason: format!("{method} {key}: {reason}") };
        let started = Instant::now();
        let address = self
            .authority
            .to_socket_addrs()
            .map_err(|e| error(format!("resolve {}: {e}", self.authority)))?
            .next()
            .ok_or_else(|| error(format!("{} resolves to no address", self.authority)))?;
        let mut stream = TcpStream::connect_timeout(&address, CONNECT_TIMEOUT).map_err(|e| error(e.to_string()))?;
        let left = TOTAL_TIMEOUT.saturating_sub(started.elapsed()).max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).map_err(|e| error(e.to_string()))?;
        stream.set_write_timeout(Some(left)).map_err(|e| error(e.to_string()))?;
        let head = format!(
            "{method} {}?key={} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.path,
            escape(key),
            self.authority,
            body.len()
        );
        stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body)).map_err(|e| error(e.to_string()))?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).map_err(|e| error(format!("reading the reply: {e}")))?;
        let split = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| error("reply has no header end".into()))?;
        let head = String::from_utf8_lossy(&response[..split]).to_string();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or_else(|| error(format!("bad status line in {head:?}")))?;
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            return Err(error("chunked replies are not supported by this interim client".into()));
        }
        Ok((status, response[split + 4..].to_vec()))
    }
}

/// Percent-escapes everything but unreserved characters.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl MetadataBackend for InterimHttpMetadata {
    fn publish(&self, descriptor: &SegmentDescriptor) -> Result<()> {
        let body = serde_json::to_vec(descriptor)
            .map_err(|e| EngineError::Metadata { operation: "publish", reason: e.to_string() })?;
        let (status, reply) = self.request("publish", "PUT", &self.key("ram", &descriptor.name), &body)?;
        if status != 200 {
            return Err(EngineError::Metadata {
                operation: "publish",
                reason: format!("HTTP {status}: {}", String::from_utf8_lossy(&reply)),
            });
        }
        let mut published = self.rpc_published.lock().unwrap_or_else(|p| p.into_inner());
        if !published.contains(&descriptor.name) {
            let host = crate::transport::tcp::host_of_segment_name(&descriptor.name);
            let port = descriptor.name.rsplit_once(':').and_then(|(_, port)| port.parse::<u16>().ok()).unwrap_or(0);
            let rpc_meta = serde_json::json!({ "ip_or_host_name": host, "rpc_port": port });
            let (status, reply) = self.request(
                "publish",
                "PUT",
                &self.key("rpc_meta", &descriptor.name),
                rpc_meta.to_string().as_bytes(),
            )?;
            if status != 200 {
                return Err(EngineError::Metadata {
                    operation: "publish rpc_meta",
                    reason: format!("HTTP {status}: {}", String::from_utf8_lossy(&reply)),
                });
            }
            published.insert(descriptor.name.clone());
        }
        Ok(())
    }

    fn fetch(&self, name: &str) -> Result<SegmentDescriptor> {
        let (status, body) = self.request("fetch", "GET", &self.key("ram", name), &[])?;
        if status != 200 {
            return Err(EngineError::SegmentNotFound {
                name: name.to_owned(),
                reason: format!("HTTP metadata server answered {status}"),
            });
        }
        serde_json::from_slice(&body)
            .map_err(|e| EngineError::SegmentNotFound { name: name.to_owned(), reason: format!("descriptor: {e}") })
    }

    fn remove(&self, name: &str) -> Result<()> {
        self.request("remove", "DELETE", &self.key("ram", name), &[])?;
        if self.rpc_published.lock().unwrap_or_else(|p| p.into_inner()).remove(name) {
            self.request("remove", "DELETE", &self.key("rpc_meta", name), &[])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_keys() {
        let client = InterimHttpMetadata::new("http://127.0.0.1:8080/metadata", "").expect("url");
        assert_eq!((client.authority.as_str(), client.path.as_str()), ("127.0.0.1:8080", "/metadata"));
        assert_eq!(client.key("ram", "127.0.0.1:12345"), "mooncake/ram/127.0.0.1:12345");
        let cluster = InterimHttpMetadata::new("http://h:1", "c7").expect("url");
        assert_eq!(cluster.key("rpc_meta", "n"), "mooncake/c7/rpc_meta/n");
        assert_eq!(cluster.path, "/metadata");
        assert_eq!(escape("mooncake/ram/127.0.0.1:12"), "mooncake%2Fram%2F127.0.0.1%3A12");
        assert!(InterimHttpMetadata::new("etcd://h:1", "").is_err());
    }
}
