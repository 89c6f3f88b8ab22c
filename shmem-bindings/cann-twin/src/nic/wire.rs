//! The twin NIC's wire protocol (this project's own, not RoCE's): length-prefixed frames over one TCP connection
//! per initiator QP. A frame is a little-endian u32 body length, then the body: a kind byte and its fields, all
//! little-endian. A frame longer than [`MAX_FRAME`], an unknown kind or fields that do not fill the body exactly are
//! malformed: the reader closes that connection, nothing else happens.
//!
//! | kind | frame | fields |
//! |---|---|---|
//! | 0 | HELLO | target QPN u32, initiator QPN u32 |
//! | 5 | HELLO_ACK | status u8 (0: the QP exists) |
//! | 1 | WRITE | psn u32, rkey u32, va u64, len u32, `len` bytes |
//! | 2 | READ | psn u32, rkey u32, va u64, len u32 |
//! | 3 | ACK | psn u32, status u8 |
//! | 4 | READ_RESPONSE | psn u32, status u8, len u32, `len` bytes |

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Largest message one WQE may carry (bytes): no MTU segmentation is modelled, so a message travels in one frame.
pub const MAX_MESSAGE: u32 = 16 << 20;
/// Largest frame body accepted from the wire: a message and its header.
pub const MAX_FRAME: usize = MAX_MESSAGE as usize + 64;
/// Longest a blocking read waits before its caller looks at its stop conditions again.
pub(crate) const READ_TICK: Duration = Duration::from_millis(20);

const HELLO: u8 = 0;
const WRITE: u8 = 1;
const READ: u8 = 2;
const ACK: u8 = 3;
const READ_RESPONSE: u8 = 4;
const HELLO_ACK: u8 = 5;

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    Hello { qpn: u32, from: u32 },
    HelloAck { status: u8 },
    Write { psn: u32, rkey: u32, va: u64, bytes: Vec<u8> },
    Read { psn: u32, rkey: u32, va: u64, len: u32 },
    Ack { psn: u32, status: u8 },
    ReadResponse { psn: u32, status: u8, bytes: Vec<u8> },
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
    }
}

impl Frame {
    /// The frame with its length prefix.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(32);
        match self {
            Frame::Hello { qpn, from } => {
                body.push(HELLO);
                body.extend_from_slice(&qpn.to_le_bytes());
                body.extend_from_slice(&from.to_le_bytes());
            }
            Frame::HelloAck { status } => body.extend_from_slice(&[HELLO_ACK, *status]),
            Frame::Write { psn, rkey, va, bytes } => {
                body.reserve(bytes.len());
                body.push(WRITE);
                body.extend_from_slice(&psn.to_le_bytes());
                body.extend_from_slice(&rkey.to_le_bytes());
                body.extend_from_slice(&va.to_le_bytes());
                body.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                body.extend_from_slice(bytes);
            }
            Frame::Read { psn, rkey, va, len } => {
                body.push(READ);
                body.extend_from_slice(&psn.to_le_bytes());
                body.extend_from_slice(&rkey.to_le_bytes());
                body.extend_from_slice(&va.to_le_bytes());
                body.extend_from_slice(&len.to_le_bytes());
            }
            Frame::Ack { psn, status } => {
                body.push(ACK);
                body.extend_from_slice(&psn.to_le_bytes());
                body.push(*status);
            }
            Frame::ReadResponse { psn, status, bytes } => {
                body.reserve(bytes.len());
                body.push(READ_RESPONSE);
                body.extend_from_slice(&psn.to_le_bytes());
                body.push(*status);
                body.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                body.extend_from_slice(bytes);
            }
        }
        let mut out = Vec::with_capacity(4 + body.len());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes one frame body; `None` when it is malformed (any input: never panics).
    pub(crate) fn decode(body: &[u8]) -> Option<Frame> {
        let mut at = Cursor(body);
        let frame = match at.u8()? {
            HELLO => Frame::Hello { qpn: at.u32()?, from: at.u32()? },
            HELLO_ACK => Frame::HelloAck { status: at.u8()? },
            WRITE => {
                let (psn, rkey, va, len) = (at.u32()?, at.u32()?, at.u64()?, at.u32()?);
                if len > MAX_MESSAGE {
                    return None;
                }
                Frame::Write { psn, rkey, va, bytes: at.take(len as usize)?.to_vec() }
            }
            READ => Frame::Read { psn: at.u32()?, rkey: at.u32()?, va: at.u64()?, len: at.u32()? },
            ACK => Frame::Ack { psn: at.u32()?, status: at.u8()? },
            READ_RESPONSE => {
                let (psn, status, len) = (at.u32()?, at.u8()?, at.u32()?);
                if len > MAX_MESSAGE {
                    return None;
                }
                Frame::ReadResponse { psn, status, bytes: at.take(len as usize)?.to_vec() }
            }
            _ => return None,
        };
        at.0.is_empty().then_some(frame)
    }
}

/// Why a connection is no longer usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WireError {
    /// The peer closed it, or a read or write failed.
    Closed,
    /// The peer sent a malformed or oversized frame.
    Malformed,
    /// The caller's stop condition (shutdown) held.
    Stopped,
}

/// One TCP connection with the bytes of a frame not yet complete.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl Conn {
    pub(crate) fn new(stream: TcpStream) -> Conn {
        let _ = stream.set_nodelay(true);
        let _ = stream.set_nonblocking(false);
        Conn { stream, buffer: Vec::new() }
    }

    /// Sends `frame`, waiting at most `limit` for the socket.
    pub(crate) fn send(&mut self, frame: &Frame, limit: Duration) -> Result<(), WireError> {
        let _ = self.stream.set_write_timeout(Some(limit.max(Duration::from_millis(1))));
        self.stream.write_all(&frame.encode()).map_err(|_| WireError::Closed)
    }

    /// The next frame, waiting until `deadline` (`Ok(None)`: none complete by then); `stop` is looked at every
    /// [`READ_TICK`]. Bytes of an incomplete frame are kept for the next call.
    pub(crate) fn receive(&mut self, deadline: Instant, stop: &dyn Fn() -> bool) -> Result<Option<Frame>, WireError> {
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            if self.buffer.len() >= 4 {
                let len = u32::from_le_bytes([self.buffer[0], self.buffer[1], self.buffer[2], self.buffer[3]]) as usize;
                if len > MAX_FRAME {
                    return Err(WireError::Malformed);
                }
                if self.buffer.len() >= 4 + len {
                    let frame = Frame::decode(&self.buffer[4..4 + len]).ok_or(WireError::Malformed)?;
                    self.buffer.drain(..4 + len);
                    return Ok(Some(frame));
                }
                self.buffer.reserve(4 + len - self.buffer.len());
            }
            if stop() {
                return Err(WireError::Stopped);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let wait = (deadline - now).min(READ_TICK).max(Duration::from_millis(1));
            let _ = self.stream.set_read_timeout(Some(wait));
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(WireError::Closed),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                }
                Err(_) => return Err(WireError::Closed),
            }
        }
    }

    /// Closes both directions (the peer's reads end).
    pub(crate) fn close(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::Hello { qpn: 7, from: 9 },
            Frame::HelloAck { status: 1 },
            Frame::Write { psn: 3, rkey: 0xdead_beef, va: 1 << 40, bytes: vec![1, 2, 3] },
            Frame::Read { psn: 4, rkey: 5, va: 6, len: 7 },
            Frame::Ack { psn: 8, status: 0x13 },
            Frame::ReadResponse { psn: 9, status: 0, bytes: vec![9; 10] },
        ];
        for frame in frames {
            let wire = frame.encode();
            assert_eq!(u32::from_le_bytes(wire[..4].try_into().expect("4 bytes")) as usize, wire.len() - 4);
            assert_eq!(Frame::decode(&wire[4..]), Some(frame));
        }
    }

    #[test]
    fn short_long_and_unknown_bodies_are_malformed() {
        let write = Frame::Write { psn: 1, rkey: 2, va: 3, bytes: vec![0; 8] }.encode();
        assert_eq!(Frame::decode(&write[4..write.len() - 1]), None, "a short payload");
        let mut long = write[4..].to_vec();
        long.push(0);
        assert_eq!(Frame::decode(&long), None, "a byte past the fields");
        assert_eq!(Frame::decode(&[0x77]), None);
        assert_eq!(Frame::decode(&[]), None);
        let mut huge = vec![READ_RESPONSE, 0, 0, 0, 0, 0];
        huge.extend_from_slice(&(MAX_MESSAGE + 1).to_le_bytes());
        assert_eq!(Frame::decode(&huge), None, "a length past the cap");
    }

    proptest! {
        #[test]
        fn any_body_decodes_or_is_refused(body in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Frame::decode(&body);
        }
    }
}
