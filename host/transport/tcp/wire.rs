//! Mooncake's TCP data wire: the 24-byte request header and the v2 status frame (docs/mooncake.md section 4).
//!
//! Owns encoding and decoding only; it never touches memory or sockets. Everything is little-endian.
//!
//! Header: `u64 size; u64 addr; u8 opcode; 7 bytes`. Opcode 0 is READ (the target sends its memory), 1 is WRITE
//! (the target receives into its memory), any other value is served as READ; bit 0x80 marks protocol v2. The seven
//! trailing bytes are written as zero and ignored when read: Mooncake's client sends a C struct whose padding it
//! does not initialise, so rejecting non-zero padding would reject real Mooncake initiators.

/// Bytes of one request header.
pub const HEADER_LEN: usize = 24;
/// Bytes of one v2 status frame.
pub const STATUS_LEN: usize = 8;
/// The opcode bit that marks a v2 request (status frames on).
pub const V2_FLAG: u8 = 0x80;

/// Which framing a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireVersion {
    /// No status frames: a rejected request just closes the connection.
    V1,
    /// Status frames: READ gets status then data, WRITE gets an OK status after the data is in memory.
    V2,
}

impl WireVersion {
    /// The version to use with a peer whose descriptor says `tcp_proto_version` (missing means 1).
    pub fn from_descriptor(tcp_proto_version: Option<u64>) -> Self {
        match tcp_proto_version {
            Some(version) if version >= 2 => WireVersion::V2,
            _ => WireVersion::V1,
        }
    }

    /// The number published as `tcp_proto_version`.
    pub fn number(self) -> u64 {
        match self {
            WireVersion::V1 => 1,
            WireVersion::V2 => 2,
        }
    }
}

/// What a request asks the target to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireOpcode {
    /// The target sends `size` bytes from `addr`.
    Read,
    /// The target receives `size` bytes into `addr`.
    Write,
}

/// One decoded request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// Bytes to move.
    pub size: u64,
    /// Absolute address in the target process.
    pub addr: u64,
    /// READ or WRITE (unknown opcodes decode as READ, as Mooncake's server serves them).
    pub opcode: WireOpcode,
    /// Framing the request asked for.
    pub version: WireVersion,
}

impl RequestHeader {
    /// Encodes the header; the padding is zero.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut bytes = [0u8; HEADER_LEN];
        bytes[0..8].copy_from_slice(&self.size.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.addr.to_le_bytes());
        let opcode = match self.opcode {
            WireOpcode::Read => 0u8,
            WireOpcode::Write => 1u8,
        };
        bytes[16] = match self.version {
            WireVersion::V1 => opcode,
            WireVersion::V2 => opcode | V2_FLAG,
        };
        bytes
    }

    /// Decodes a header. Total: every 24-byte string is a header; whether its range may be served is the server's
    /// bounds check, not the codec's.
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Self {
        let word = |range: std::ops::Range<usize>| {
            let mut buffer = [0u8; 8];
            buffer.copy_from_slice(&bytes[range]);
            u64::from_le_bytes(buffer)
        };
        let raw = bytes[16];
        RequestHeader {
            size: word(0..8),
            addr: word(8..16),
            opcode: if raw & !V2_FLAG == 1 { WireOpcode::Write } else { WireOpcode::Read },
            version: if raw & V2_FLAG != 0 { WireVersion::V2 } else { WireVersion::V1 },
        }
    }
}

/// A v2 status frame. A total decode: any u64 is a `Status`; only the two known values mean something.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Status(pub u64);

impl Status {
    /// "MCTV" in the top 32 bits, 0 below: the request was accepted (READ: data follows; WRITE: data is in memory).
    pub const OK: Status = Status(0x4D43_5456_0000_0000);
    /// The address range was rejected; the server closes the connection after sending it.
    pub const REJECTED: Status = Status(0x4D43_5456_0000_0001);

    /// Encodes the frame.
    pub const fn encode(self) -> [u8; STATUS_LEN] {
        self.0.to_le_bytes()
    }

    /// Decodes a frame.
    pub fn decode(bytes: [u8; STATUS_LEN]) -> Self {
        Status(u64::from_le_bytes(bytes))
    }
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Status::OK => f.write_str("Status::OK"),
            Status::REJECTED => f.write_str("Status::REJECTED"),
            Status(other) => write!(f, "Status({other:#018x})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_layout_is_mooncakes() {
        let header =
            RequestHeader { size: 0x0102, addr: 0x7f00_0000_1000, opcode: WireOpcode::Write, version: WireVersion::V2 };
        let bytes = header.encode();
        assert_eq!(&bytes[0..8], &[0x02, 0x01, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&bytes[8..16], &[0x00, 0x10, 0, 0, 0x00, 0x7f, 0, 0]);
        assert_eq!(bytes[16], 0x81);
        assert_eq!(&bytes[17..], &[0u8; 7]);
        let v1_read = RequestHeader { opcode: WireOpcode::Read, version: WireVersion::V1, ..header };
        assert_eq!(v1_read.encode()[16], 0x00);
    }

    #[test]
    fn unknown_opcodes_are_reads_and_padding_is_ignored() {
        let mut bytes = [0u8; HEADER_LEN];
        for (raw, opcode, version) in [
            (0x00, WireOpcode::Read, WireVersion::V1),
            (0x01, WireOpcode::Write, WireVersion::V1),
            (0x80, WireOpcode::Read, WireVersion::V2),
            (0x81, WireOpcode::Write, WireVersion::V2),
            (0x02, WireOpcode::Read, WireVersion::V1),
            (0x7f, WireOpcode::Read, WireVersion::V1),
            (0xff, WireOpcode::Read, WireVersion::V2),
            (0x83, WireOpcode::Read, WireVersion::V2),
        ] {
            bytes[16] = raw;
            bytes[17..].copy_from_slice(&[0xAB; 7]);
            let header = RequestHeader::decode(&bytes);
            assert_eq!((header.opcode, header.version), (opcode, version), "opcode byte {raw:#x}");
        }
    }

    #[test]
    fn status_frames() {
        assert_eq!(Status::OK.encode(), [0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4D]);
        assert_eq!(&Status::OK.encode()[4..], b"VTCM");
        assert_eq!(Status::REJECTED.encode()[0], 1);
        assert_eq!(Status::decode(Status::REJECTED.encode()), Status::REJECTED);
        assert_eq!(format!("{:?}", Status(7)), "Status(0x0000000000000007)");
        assert_eq!(WireVersion::from_descriptor(None), WireVersion::V1);
        assert_eq!(WireVersion::from_descriptor(Some(1)), WireVersion::V1);
        assert_eq!(WireVersion::from_descriptor(Some(2)), WireVersion::V2);
        assert_eq!(WireVersion::from_descriptor(Some(3)), WireVersion::V2);
    }

    proptest! {
        #[test]
        fn header_round_trips(size: u64, addr: u64, write: bool, v2: bool) {
            let header = RequestHeader {
                size,
                addr,
                opcode: if write { WireOpcode::Write } else { WireOpcode::Read },
                version: if v2 { WireVersion::V2 } else { WireVersion::V1 },
            };
            prop_assert_eq!(RequestHeader::decode(&header.encode()), header);
        }
    }
}
