//! Mooncake's P2P handshake on the RPC port (docs/mooncake.md section 3): the frame codec, a blocking client and
//! the server.
//!
//! One request and one reply per TCP connection. A frame is a little-endian `u64` length counting the type byte and
//! the payload, a `u8` type (0 Connection, 1 Metadata, 2 Notify, 3 Probe) and a JSON payload. When the byte after the
//! length is above 3 the frame is the legacy form, with no type byte, and means Connection; its reply is legacy too.
//! A length of 0 or above 1 MiB is refused. This module owns the wire; what a Metadata reply contains is set by the
//! metadata service through [`HandshakeState`].

mod client;
mod server;

pub use client::HandshakeClient;
pub use server::{
    ConnectionHandler, HandshakeLimits, HandshakeServer, HandshakeState, Notification, CONNECTION_HANDLER_WAIT,
};

use std::io;

/// The largest length a frame may declare (type byte plus payload).
pub const MAX_FRAME_LENGTH: u64 = 1 << 20;

/// What a typed frame asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// A transport's connection handshake (RDMA QP exchange in Mooncake); TCP-only peers answer with empty fields.
    Connection = 0,
    /// The sender's segment descriptor; the reply is the receiver's.
    Metadata = 1,
    /// `{"name", "notify_msg"}`, answered with `{"name": "", "notify_msg": "success"}`.
    Notify = 2,
    /// `{}`, answered with `{"status": "success"}`: is a handshake server there?
    Probe = 3,
}

impl FrameKind {
    /// The kind of a type byte, if it is one.
    pub fn from_byte(byte: u8) -> Option<FrameKind> {
        match byte {
            0 => Some(FrameKind::Connection),
            1 => Some(FrameKind::Metadata),
            2 => Some(FrameKind::Notify),
            3 => Some(FrameKind::Probe),
            _ => None,
        }
    }
}

/// Whether a frame carries a type byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameForm {
    /// Current form: length, type byte, payload.
    Typed(FrameKind),
    /// Legacy form: length, payload (first byte above 3); means Connection.
    Legacy,
}

/// One handshake message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Typed or legacy.
    pub form: FrameForm,
    /// The JSON text.
    pub payload: Vec<u8>,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length field is zero.
    #[error("read handshake frame: declared length is 0")]
    ZeroLength,
    /// The length field is above [`MAX_FRAME_LENGTH`] (an HTTP request or TLS ClientHello read as a length lands here).
    #[error("read handshake frame: declared length {length} is above the {MAX_FRAME_LENGTH}-byte limit")]
    TooLong {
        /// The declared length.
        length: u64,
    },
    /// The peer closed the connection mid-frame.
    #[error("read handshake frame: the peer closed after {received} of {expected} bytes of the {part}")]
    Truncated {
        /// `length field` or `frame body`.
        part: &'static str,
        /// Bytes the part needs.
        expected: usize,
        /// Bytes that arrived.
        received: usize,
    },
    /// The socket failed (including a read timeout).
    #[error("read handshake frame: {0}")]
    Io(#[from] io::Error),
}

impl Frame {
    /// A typed frame of `kind` carrying `payload`.
    pub fn typed(kind: FrameKind, payload: impl Into<Vec<u8>>) -> Frame {
        Frame { form: FrameForm::Typed(kind), payload: payload.into() }
    }

    /// What the frame asks for; legacy frames are Connection handshakes.
    pub fn kind(&self) -> FrameKind {
        match self.form {
            FrameForm::Typed(kind) => kind,
            FrameForm::Legacy => FrameKind::Connection,
        }
    }

    /// A reply to this frame: same form and type, new payload.
    pub fn reply(&self, payload: impl Into<Vec<u8>>) -> Frame {
        Frame { form: self.form, payload: payload.into() }
    }

    /// The frame's bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let type_bytes = match self.form {
            FrameForm::Typed(_) => 1,
            FrameForm::Legacy => 0,
        };
        let mut bytes = Vec::with_capacity(8 + type_bytes + self.payload.len());
        bytes.extend_from_slice(&((self.payload.len() + type_bytes) as u64).to_le_bytes());
        if let FrameForm::Typed(kind) = self.form {
            bytes.push(kind as u8);
        }
        bytes.extend_from_slice(&self.payload);
        bytes
    }

    /// Checks a declared length and returns it as a body size.
    pub fn check_length(length: u64) -> Result<usize, FrameError> {
        match length {
            0 => Err(FrameError::ZeroLength),
            length if length > MAX_FRAME_LENGTH => Err(FrameError::TooLong { length }),
            // At most 1 MiB: fits usize everywhere.
            length => Ok(length as usize),
        }
    }

    /// Splits a body (the `length` bytes after the length field, non-empty) into form and payload.
    pub fn from_body(mut body: Vec<u8>) -> Frame {
        match body.first().copied().and_then(FrameKind::from_byte) {
            Some(kind) => {
                body.remove(0);
                Frame { form: FrameForm::Typed(kind), payload: body }
            }
            None => Frame { form: FrameForm::Legacy, payload: body },
        }
    }

    /// Decodes one frame from the start of `bytes`; returns it and the bytes it used.
    pub fn decode(bytes: &[u8]) -> Result<(Frame, usize), FrameError> {
        let Some(length_field) = bytes.get(..8) else {
            return Err(FrameError::Truncated { part: "length field", expected: 8, received: bytes.len() });
        };
        let mut length = [0u8; 8];
        length.copy_from_slice(length_field);
        let body_length = Frame::check_length(u64::from_le_bytes(length))?;
        let body = &bytes[8..];
        if body.len() < body_length {
            return Err(FrameError::Truncated { part: "frame body", expected: body_length, received: body.len() });
        }
        Ok((Frame::from_body(body[..body_length].to_vec()), 8 + body_length))
    }

    /// Reads one frame from a blocking reader (whose timeouts bound the wait).
    pub fn read_from(reader: &mut impl io::Read) -> Result<Frame, FrameError> {
        let mut length = [0u8; 8];
        read_full_blocking(reader, &mut length, "length field")?;
        let mut body = vec![0u8; Frame::check_length(u64::from_le_bytes(length))?];
        read_full_blocking(reader, &mut body, "frame body")?;
        Ok(Frame::from_body(body))
    }

    /// Reads one frame from an async reader; the caller bounds the wait with a timeout.
    pub async fn read_from_async(reader: &mut (impl tokio::io::AsyncRead + Unpin)) -> Result<Frame, FrameError> {
        let mut length = [0u8; 8];
        read_full_async(reader, &mut length, "length field").await?;
        let mut body = vec![0u8; Frame::check_length(u64::from_le_bytes(length))?];
        read_full_async(reader, &mut body, "frame body").await?;
        Ok(Frame::from_body(body))
    }
}

fn read_full_blocking(reader: &mut impl io::Read, buffer: &mut [u8], part: &'static str) -> Result<(), FrameError> {
    let mut received = 0;
    while received < buffer.len() {
        match reader.read(&mut buffer[received..]) {
            Ok(0) => return Err(FrameError::Truncated { part, expected: buffer.len(), received }),
            Ok(n) => received += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(FrameError::Io(error)),
        }
    }
    Ok(())
}

async fn read_full_async(
    reader: &mut (impl tokio::io::AsyncRead + Unpin),
    buffer: &mut [u8],
    part: &'static str,
) -> Result<(), FrameError> {
    use tokio::io::AsyncReadExt;
    let mut received = 0;
    while received < buffer.len() {
        match reader.read(&mut buffer[received..]).await? {
            0 => return Err(FrameError::Truncated { part, expected: buffer.len(), received }),
            n => received += n,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind_strategy() -> impl Strategy<Value = FrameKind> {
        prop_oneof![
            Just(FrameKind::Connection),
            Just(FrameKind::Metadata),
            Just(FrameKind::Notify),
            Just(FrameKind::Probe)
        ]
    }

    proptest! {
        #[test]
        fn typed_frames_round_trip(kind in kind_strategy(), payload in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let frame = Frame::typed(kind, payload);
            let bytes = frame.encode();
            let (decoded, used) = Frame::decode(&bytes).expect("decodes");
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(&decoded, &frame);
            let read = Frame::read_from(&mut bytes.as_slice()).expect("reads");
            prop_assert_eq!(read, frame);
        }

        #[test]
        fn legacy_frames_round_trip(first in 4u8.., rest in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut payload = vec![first];
            payload.extend(rest);
            let frame = Frame { form: FrameForm::Legacy, payload };
            let bytes = frame.encode();
            prop_assert_eq!(u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")), frame.payload.len() as u64);
            let (decoded, _) = Frame::decode(&bytes).expect("decodes");
            prop_assert_eq!(decoded.kind(), FrameKind::Connection);
            prop_assert_eq!(decoded, frame);
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            // Whatever arrives, decoding returns (never panics), and a success never claims more than it was given.
            if let Ok((_, used)) = Frame::decode(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }
    }

    #[test]
    fn the_wire_layout_is_mooncakes() {
        let bytes = Frame::typed(FrameKind::Probe, b"{}".to_vec()).encode();
        assert_eq!(bytes, [3, 0, 0, 0, 0, 0, 0, 0, 3, b'{', b'}']);
        let legacy = Frame { form: FrameForm::Legacy, payload: b"{}".to_vec() }.encode();
        assert_eq!(legacy, [2, 0, 0, 0, 0, 0, 0, 0, b'{', b'}']);
    }

    #[test]
    fn bad_lengths_and_truncation_are_named() {
        let zero = Frame::decode(&[0u8; 8]).expect_err("zero length");
        assert!(matches!(zero, FrameError::ZeroLength), "{zero}");
        let mut big = (MAX_FRAME_LENGTH + 1).to_le_bytes().to_vec();
        big.push(1);
        assert!(matches!(Frame::decode(&big), Err(FrameError::TooLong { length }) if length == MAX_FRAME_LENGTH + 1));
        let mut exactly_max = MAX_FRAME_LENGTH.to_le_bytes().to_vec();
        exactly_max.push(1);
        exactly_max.resize(8 + MAX_FRAME_LENGTH as usize, b' ');
        assert!(Frame::decode(&exactly_max).is_ok(), "1 MiB itself is allowed");
        let short = Frame::read_from(&mut [5u8, 0, 0, 0, 0, 0, 0, 0, 1, b'{'].as_slice()).expect_err("short body");
        assert!(short.to_string().contains("after 2 of 5 bytes of the frame body"), "{short}");
        let tiny = Frame::read_from(&mut [1u8, 2].as_slice()).expect_err("short length");
        assert!(tiny.to_string().contains("length field"), "{tiny}");
    }

    #[test]
    fn http_and_tls_openings_are_refused_as_lengths() {
        for probe in
            [&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], &[0x16, 0x03, 0x01, 0x05, 0xc2, 0x01, 0x00, 0x05, 0x03]]
        {
            let error = Frame::decode(probe).expect_err("not a frame");
            assert!(matches!(error, FrameError::TooLong { .. }), "{error}");
        }
    }
}
