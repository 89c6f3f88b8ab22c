//! Segment names as Mooncake writes them: `host`, `host:port`, `[v6]:port` and Ascend's `ip:port:npu_N`.
//!
//! In P2P mode a segment name is the address of its owner's handshake server, so this module is how a name becomes
//! something to connect to. It owns parsing and printing only; it never resolves or connects.

use std::fmt;
use std::net::Ipv6Addr;

/// A parsed segment name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentName {
    /// Host name or IP address, without IPv6 brackets.
    pub host: String,
    /// Port, when the name has one.
    pub port: Option<u16>,
    /// The NPU of Ascend's `ip:port:npu_N` form.
    pub npu: Option<u32>,
}

/// Why a string is not a segment name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parse segment name {name:?}: {reason}")]
pub struct SegmentNameError {
    /// The string as given.
    pub name: String,
    /// What is wrong with it.
    pub reason: String,
}

impl SegmentName {
    /// Parses `host`, `host:port`, `[v6]`, `[v6]:port`, a bare IPv6 address, or any of these followed by `:npu_N`.
    pub fn parse(text: &str) -> Result<Self, SegmentNameError> {
        let error = |reason: &str| SegmentNameError { name: text.to_owned(), reason: reason.to_owned() };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(error("the name is empty"));
        }
        let (rest, npu) = match trimmed.rsplit_once(":npu_") {
            Some((rest, id)) => {
                let id = id.parse::<u32>().map_err(|_| error("the text after \":npu_\" is not an NPU number"))?;
                (rest, Some(id))
            }
            None => (trimmed, None),
        };
        let (host, port) = if let Some(after_bracket) = rest.strip_prefix('[') {
            let (host, tail) =
                after_bracket.split_once(']').ok_or_else(|| error("an IPv6 address opened with '[' is not closed"))?;
            let port = match tail {
                "" => None,
                _ => Some(tail.strip_prefix(':').ok_or_else(|| error("expected ':port' after ']'"))?),
            };
            (host, port)
        } else if rest.parse::<Ipv6Addr>().is_ok() {
            (rest, None)
        } else {
            match rest.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            }
        };
        if host.is_empty() {
            return Err(error("the host part is empty"));
        }
        if host.contains(':') && host.parse::<Ipv6Addr>().is_err() {
            return Err(error("the host part has ':' but is not an IPv6 address (write IPv6 as [addr]:port)"));
        }
        let port = match port {
            None => None,
            Some(port) => Some(port.parse::<u16>().map_err(|_| error("the port is not a number from 0 to 65535"))?),
        };
        Ok(SegmentName { host: host.to_owned(), port, npu })
    }

    /// `host:port` with IPv6 hosts in brackets, as Mooncake names P2P segments.
    pub fn with_port(host: &str, port: u16) -> String {
        format!("{}:{port}", bracket_ipv6(host))
    }
}

impl fmt::Display for SegmentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&bracket_ipv6(&self.host))?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        if let Some(npu) = self.npu {
            write!(f, ":npu_{npu}")?;
        }
        Ok(())
    }
}

fn bracket_ipv6(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> (String, Option<u16>, Option<u32>) {
        let name = SegmentName::parse(text).unwrap_or_else(|error| panic!("{error}"));
        (name.host, name.port, name.npu)
    }

    #[test]
    fn parses_the_forms_mooncake_writes() {
        assert_eq!(parsed("127.0.0.1:15001"), ("127.0.0.1".into(), Some(15001), None));
        assert_eq!(parsed("node-7"), ("node-7".into(), None, None));
        assert_eq!(parsed("[::1]:16000"), ("::1".into(), Some(16000), None));
        assert_eq!(parsed("[fe80::1]"), ("fe80::1".into(), None, None));
        assert_eq!(parsed("::1"), ("::1".into(), None, None));
        assert_eq!(parsed("10.0.0.1:12345:npu_2"), ("10.0.0.1".into(), Some(12345), Some(2)));
        assert_eq!(parsed("[::1]:12345:npu_7"), ("::1".into(), Some(12345), Some(7)));
    }

    #[test]
    fn prints_what_it_parsed() {
        for text in ["127.0.0.1:15001", "node-7", "[::1]:16000", "[fe80::1]", "10.0.0.1:12345:npu_2"] {
            assert_eq!(SegmentName::parse(text).expect(text).to_string(), text);
        }
        assert_eq!(SegmentName::with_port("::1", 15000), "[::1]:15000");
        assert_eq!(SegmentName::with_port("127.0.0.1", 15000), "127.0.0.1:15000");
    }

    #[test]
    fn rejects_what_is_not_a_name() {
        let cases = [
            ("", "empty"),
            ("host:70000", "port"),
            ("host:abc", "port"),
            ("[::1", "not closed"),
            ("[::1]x", "':port'"),
            (":15000", "host part is empty"),
            ("a:b:c", "not an IPv6"),
            ("10.0.0.1:1:npu_x", "NPU number"),
        ];
        for (text, expected) in cases {
            let error = SegmentName::parse(text).expect_err(text);
            assert!(error.to_string().contains(expected), "{text}: {error}");
        }
    }
}
