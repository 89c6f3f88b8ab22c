//! The client of an HTTP metadata server (`http://host:port/metadata`), Mooncake's REST form:
//! `GET|PUT|DELETE <url>?key=<url-escaped key>`, by default 1.5 s per connect and 3 s per request, as Mooncake's
//! client. The request timeout is one overall deadline (connect, send, the whole answer, body included), so a
//! server that answers a byte at a time cannot hold the caller longer.
//!
//! Owns: the HTTP client of one metadata server. It must not retry a request or cache values.

use std::io::Read;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::store::KeyValueStore;
use crate::error::{EngineError, Result};

/// Bytes escaped in the key, as curl_easy_escape does (all but ASCII letters, digits and `-._~`).
const KEY_ESCAPES: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
/// Largest value read back (a descriptor with many buffers is a few MiB at most).
const MAX_VALUE_BYTES: u64 = 64 << 20;
/// Largest error body quoted in a message.
const MAX_QUOTED_BYTES: u64 = 512;

/// A blocking client of one HTTP metadata server.
#[derive(Debug)]
pub struct HttpStore {
    url: String,
    agent: ureq::Agent,
    connect_timeout: Duration,
    total_timeout: Duration,
}

impl HttpStore {
    /// A client of the server at `url` (`http://host:port/metadata`) with Mooncake's timeouts.
    pub fn new(url: &str) -> HttpStore {
        HttpStore::with_timeouts(url, Duration::from_millis(1500), Duration::from_secs(3))
    }

    /// A client with explicit connect and per-request timeouts (`total` bounds the whole request).
    pub fn with_timeouts(url: &str, connect: Duration, total: Duration) -> HttpStore {
        let agent = ureq::AgentBuilder::new().timeout_connect(connect).timeout(total).build();
        HttpStore { url: url.trim_end_matches('?').to_owned(), agent, connect_timeout: connect, total_timeout: total }
    }

    fn key_url(&self, key: &str) -> String {
        format!("{}?key={}", self.url, utf8_percent_encode(key, KEY_ESCAPES))
    }

    fn failure(&self, operation: &'static str, key: &str, error: ureq::Error) -> EngineError {
        let reason = match error {
            ureq::Error::Status(code, response) => {
                let mut body = String::new();
                let _ = response.into_reader().take(MAX_QUOTED_BYTES).read_to_string(&mut body);
                format!("{} answered HTTP {code} for key {key:?}: {}", self.url, body.trim())
            }
            ureq::Error::Transport(transport) => {
                format!(
                    "no answer from {} for key {key:?} (connect {:?}, total {:?}): {transport}",
                    self.url, self.connect_timeout, self.total_timeout
                )
            }
        };
        EngineError::Metadata { operation, reason }
    }
}

impl KeyValueStore for HttpStore {
    fn endpoint(&self) -> String {
        self.url.clone()
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        match self.agent.get(&self.key_url(key)).call() {
            Ok(response) => {
                let mut value = Vec::new();
                response.into_reader().take(MAX_VALUE_BYTES).read_to_end(&mut value).map_err(|error| {
                    EngineError::Metadata {
                        operation: "http metadata get",
                        reason: format!(
                            "reading the value of key {key:?} from {} (deadline {:?}): {error}",
                            self.url, self.total_timeout
                        ),
                    }
                })?;
                Ok(Some(value))
            }
            Err(ureq::Error::Status(404, _)) => Ok(None),
            Err(error) => Err(self.failure("http metadata get", key, error)),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.agent
            .put(&self.key_url(key))
            .set("Content-Type", "application/json")
            .send_bytes(value)
            .map(drop)
            .map_err(|error| self.failure("http metadata put", key, error))
    }

    fn delete(&self, key: &str) -> Result<bool> {
        match self.agent.delete(&self.key_url(key)).call() {
            Ok(_) => Ok(true),
            Err(ureq::Error::Status(404, _)) => Ok(false),
            Err(error) => Err(self.failure("http metadata delete", key, error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_escaped_like_curl() {
        let store = HttpStore::new("http://127.0.0.1:1/metadata");
        assert_eq!(
            store.key_url("mooncake/ram/[::1]:15001"),
            "http://127.0.0.1:1/metadata?key=mooncake%2Fram%2F%5B%3A%3A1%5D%3A15001"
        );
        assert_eq!(store.key_url("a b&c=d~e"), "http://127.0.0.1:1/metadata?key=a%20b%26c%3Dd~e");
    }
}
