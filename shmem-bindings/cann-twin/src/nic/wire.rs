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

use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Largest message one WQE may carry (bytes): no MTU segmentation is modelled, so a message travels in one frame.
pub const MAX_MESSAGE: u32 = 16 << 20;
/// Largest frame body accepted from the wire: a message and its header.
pub const MAX_FRAME: usize = MAX_MESSAGE as usize + 64;
/// Longest a large WRITE's payload may take to arrive once its fixed fields are in (its connection is given up
/// after that, the WRITE unexecuted).
pub(crate) const PAYLOAD_WAIT: Duration = Duration::from_secs(2);
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
    Hello {
        qpn: u32,
        from: u32,
    },
    HelloAck {
        status: u8,
    },
    Write {
        psn: u32,
        rkey: u32,
        va: u64,
        bytes: Vec<u8>,
    },
    Read {
        psn: u32,
        rkey: u32,
        va: u64,
        len: u32,
    },
    Ack {
        psn: u32,
        status: u8,
    },
    ReadResponse {
        psn: u32,
        status: u8,
        bytes: Vec<u8>,
    },
    /// A WRITE of `len` bytes whose payload is not held here: the head a sender sends before lending the payload
    /// in place ([`Conn::send_lent`]), and what [`Conn::receive`] returns for a large WRITE when the connection lands
    /// payloads in place (the payload then waits in the connection for [`Conn::receive_payload`]). Never decoded
    /// from a body.
    WriteHead {
        psn: u32,
        rkey: u32,
        va: u64,
        len: u32,
    },
}

/// A payload a sender reads in place: `lend(offset, send)` calls `send` with slices holding the payload from byte
/// `offset` on (to its end, or less) and returns what `send` returned; `None` when the payload cannot be read.
pub(crate) type Lend<'a> =
    dyn FnMut(usize, &mut dyn FnMut(&[IoSlice<'_>]) -> std::io::Result<usize>) -> Option<std::io::Result<usize>> + 'a;

/// Where a receiver lands a payload in place: `land(offset, fill)` calls `fill` with the destination of the payload
/// from byte `offset` on (one contiguous piece, to the payload's end or less) and returns what `fill` returned (the
/// bytes it filled); `None` when the destination cannot be written.
pub(crate) type Land<'a> =
    dyn FnMut(usize, &mut dyn FnMut(&mut [u8]) -> std::io::Result<usize>) -> Option<std::io::Result<usize>> + 'a;

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
    /// The frame with its length prefix, in one buffer.
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let (mut head, payload) = self.parts();
        head.extend_from_slice(payload);
        head
    }

    /// The frame as its length prefix and fixed fields (`head`) and its payload (WRITE and READ_RESPONSE bytes,
    /// else empty), so that a payload goes to the socket without being copied into a frame buffer.
    pub(crate) fn parts(&self) -> (Vec<u8>, &[u8]) {
        let mut head = Vec::with_capacity(32);
        head.extend_from_slice(&[0; 4]);
        let payload: &[u8] = match self {
            Frame::Hello { qpn, from } => {
                head.push(HELLO);
                head.extend_from_slice(&qpn.to_le_bytes());
                head.extend_from_slice(&from.to_le_bytes());
                &[]
            }
            Frame::HelloAck { status } => {
                head.extend_from_slice(&[HELLO_ACK, *status]);
                &[]
            }
            Frame::Write { psn, rkey, va, bytes } => {
                head.push(WRITE);
                head.extend_from_slice(&psn.to_le_bytes());
                head.extend_from_slice(&rkey.to_le_bytes());
                head.extend_from_slice(&va.to_le_bytes());
                head.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                bytes
            }
            Frame::Read { psn, rkey, va, len } => {
                head.push(READ);
                head.extend_from_slice(&psn.to_le_bytes());
                head.extend_from_slice(&rkey.to_le_bytes());
                head.extend_from_slice(&va.to_le_bytes());
                head.extend_from_slice(&len.to_le_bytes());
                &[]
            }
            Frame::Ack { psn, status } => {
                head.push(ACK);
                head.extend_from_slice(&psn.to_le_bytes());
                head.push(*status);
                &[]
            }
            Frame::WriteHead { psn, rkey, va, len } => {
                head.push(WRITE);
                head.extend_from_slice(&psn.to_le_bytes());
                head.extend_from_slice(&rkey.to_le_bytes());
                head.extend_from_slice(&va.to_le_bytes());
                head.extend_from_slice(&len.to_le_bytes());
                let body = (head.len() - 4) as u32 + *len;
                head[..4].copy_from_slice(&body.to_le_bytes());
                return (head, &[]);
            }
            Frame::ReadResponse { psn, status, bytes } => {
                head.push(READ_RESPONSE);
                head.extend_from_slice(&psn.to_le_bytes());
                head.push(*status);
                head.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                bytes
            }
        };
        let body = (head.len() - 4 + payload.len()) as u32;
        head[..4].copy_from_slice(&body.to_le_bytes());
        (head, payload)
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
    /// Received bytes: `buffer[start..end]` are not yet decoded; the rest is room (initialised once, reused).
    buffer: Vec<u8>,
    start: usize,
    end: usize,
    /// The socket's timeouts as last set (each change is a system call).
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    /// A large frame whose fixed fields have arrived: its payload is read straight into its own buffer.
    partial: Option<Partial>,
    /// Large WRITEs are returned as [`Frame::WriteHead`] with their payload left to [`Conn::receive_payload`].
    in_place: bool,
    /// Bytes of a returned [`Frame::WriteHead`]'s payload not yet taken (first from `buffer`, then the socket).
    payload_left: usize,
}

/// A WRITE or READ_RESPONSE frame of at least [`DIRECT_PAYLOAD`] bytes, its payload still arriving.
#[derive(Debug)]
struct Partial {
    /// The frame with an empty payload (its fixed fields).
    frame: Frame,
    payload: Vec<u8>,
    len: usize,
}

/// Payloads from this size on are read into a buffer of their own (no copy out of the receive buffer).
const DIRECT_PAYLOAD: usize = 256 << 10;

/// Bytes of a WRITE's fixed fields (kind, psn, rkey, va, len) and of a READ_RESPONSE's (kind, psn, status, len).
const WRITE_FIELDS: usize = 21;
const READ_RESPONSE_FIELDS: usize = 10;

impl Frame {
    /// From `head`, the bytes of a frame body of `body_len` bytes received so far: the frame's fixed fields (with an
    /// empty payload) and its payload's length, if it is a WRITE or READ_RESPONSE with a payload of at least
    /// [`DIRECT_PAYLOAD`] bytes and its fixed fields are all in; `Err` when its length field disagrees with the
    /// frame's.
    fn large_head(head: &[u8], body_len: usize) -> Result<Option<(Frame, usize)>, WireError> {
        let mut at = Cursor(head);
        let (frame, fields, len) = match at.u8() {
            Some(WRITE) if head.len() >= WRITE_FIELDS => {
                let (psn, rkey, va, len) = (at.u32(), at.u32(), at.u64(), at.u32());
                let (Some(psn), Some(rkey), Some(va), Some(len)) = (psn, rkey, va, len) else { return Ok(None) };
                (Frame::Write { psn, rkey, va, bytes: Vec::new() }, WRITE_FIELDS, len)
            }
            Some(READ_RESPONSE) if head.len() >= READ_RESPONSE_FIELDS => {
                let (psn, status, len) = (at.u32(), at.u8(), at.u32());
                let (Some(psn), Some(status), Some(len)) = (psn, status, len) else { return Ok(None) };
                (Frame::ReadResponse { psn, status, bytes: Vec::new() }, READ_RESPONSE_FIELDS, len)
            }
            _ => return Ok(None),
        };
        if len > MAX_MESSAGE || fields + len as usize != body_len {
            return Err(WireError::Malformed);
        }
        Ok((len as usize >= DIRECT_PAYLOAD).then_some((frame, len as usize)))
    }

    fn with_payload(self, payload: Vec<u8>) -> Frame {
        match self {
            Frame::Write { psn, rkey, va, .. } => Frame::Write { psn, rkey, va, bytes: payload },
            Frame::ReadResponse { psn, status, .. } => Frame::ReadResponse { psn, status, bytes: payload },
            other => other,
        }
    }
}

/// Bytes one read asks for when no frame larger than that is known to be arriving.
const READ_CHUNK: usize = 64 << 10;

/// Writes `head` then `payload` with vectored writes (one system call per frame when the socket takes it all).
fn write_parts(stream: &mut TcpStream, mut head: &[u8], mut payload: &[u8]) -> std::io::Result<()> {
    while !head.is_empty() || !payload.is_empty() {
        let written = if head.is_empty() {
            stream.write(payload)
        } else {
            stream.write_vectored(&[IoSlice::new(head), IoSlice::new(payload)])
        };
        let written = match written {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(written) => written,
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        let from_head = written.min(head.len());
        head = &head[from_head..];
        payload = &payload[(written - from_head).min(payload.len())..];
    }
    Ok(())
}

impl Conn {
    pub(crate) fn new(stream: TcpStream) -> Conn {
        // No Nagle: a request or an acknowledgement leaves at once.
        let _ = stream.set_nodelay(true);
        let _ = stream.set_nonblocking(false);
        Conn {
            stream,
            buffer: Vec::new(),
            start: 0,
            end: 0,
            read_timeout: None,
            write_timeout: None,
            partial: None,
            in_place: false,
            payload_left: 0,
        }
    }

    /// From now on, a WRITE of at least [`DIRECT_PAYLOAD`] bytes is returned as [`Frame::WriteHead`] as soon as its
    /// fixed fields are in, and its payload waits for [`Conn::receive_payload`] (a target lands it in device memory
    /// without a copy in between).
    pub(crate) fn land_writes_in_place(&mut self) {
        self.in_place = true;
    }

    fn set_read_wait(&mut self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let wait = Some((deadline - now).min(READ_TICK).max(Duration::from_millis(1)));
        if self.read_timeout != wait {
            let _ = self.stream.set_read_timeout(wait);
            self.read_timeout = wait;
        }
        true
    }

    /// Takes the payload of the [`Frame::WriteHead`] just returned: into `land` (`None`: discarded), reading the
    /// socket in slices of at most [`READ_TICK`] until `deadline`. `Ok(true)`: all of it landed; `Ok(false)`: it was
    /// taken, but the destination refused it from some byte on (the rest discarded). An error leaves the connection
    /// unusable (the payload did not all arrive by `deadline`, or the peer closed it).
    pub(crate) fn receive_payload(
        &mut self,
        mut land: Option<&mut Land<'_>>,
        deadline: Instant,
        stop: &dyn Fn() -> bool,
    ) -> Result<bool, WireError> {
        let total = std::mem::take(&mut self.payload_left);
        let mut at = 0;
        let mut landed = true;
        // The part that arrived with the fixed fields.
        while at < total && self.start < self.end {
            let take = (self.end - self.start).min(total - at);
            let held = &self.buffer[self.start..self.start + take];
            let filled = match land.as_mut().filter(|_| landed) {
                Some(land) => land(at, &mut |dst: &mut [u8]| {
                    let n = dst.len().min(held.len());
                    dst[..n].copy_from_slice(&held[..n]);
                    Ok(n)
                }),
                None => Some(Ok(take)),
            };
            let n = match filled {
                Some(Ok(n)) if n > 0 => n,
                _ => {
                    landed = false;
                    take
                }
            };
            self.start += n;
            at += n;
        }
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        // The rest, from the socket.
        while at < total {
            if stop() {
                return Err(WireError::Stopped);
            }
            if !self.set_read_wait(deadline) {
                return Err(WireError::Closed);
            }
            let want = total - at;
            let stream = &mut self.stream;
            let read = match land.as_mut().filter(|_| landed) {
                Some(land) => land(at, &mut |dst: &mut [u8]| {
                    let n = dst.len().min(want);
                    stream.read(&mut dst[..n])
                }),
                None => None,
            };
            let read = match read {
                Some(read) => read,
                None => {
                    landed &= land.is_none();
                    if self.buffer.len() < READ_CHUNK {
                        self.buffer.resize(READ_CHUNK, 0);
                    }
                    let n = want.min(self.buffer.len());
                    self.stream.read(&mut self.buffer[..n])
                }
            };
            match read {
                Ok(0) => return Err(WireError::Closed),
                Ok(n) => at += n,
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                }
                Err(_) => return Err(WireError::Closed),
            }
        }
        Ok(landed)
    }

    /// Sends `head` (a [`Frame::WriteHead`]'s, from [`Frame::parts`]) and then `len` payload bytes that `lend`
    /// lends in place, one vectored write per loan, each waiting at most [`READ_TICK`] for the socket, until
    /// `deadline`. A payload `lend` cannot read, or a frame cut short, leaves the connection unusable.
    pub(crate) fn send_lent(
        &mut self,
        head: &[u8],
        len: usize,
        lend: &mut Lend<'_>,
        deadline: Instant,
    ) -> Result<(), WireError> {
        let (mut head_at, mut at) = (0, 0);
        while head_at < head.len() || at < len {
            let now = Instant::now();
            if now >= deadline {
                return Err(WireError::Closed);
            }
            let wait = Some((deadline - now).min(READ_TICK).max(Duration::from_millis(1)));
            if self.write_timeout != wait {
                let _ = self.stream.set_write_timeout(wait);
                self.write_timeout = wait;
            }
            let stream = &mut self.stream;
            let rest = &head[head_at..];
            let written = if at < len {
                lend(at, &mut |slices: &[IoSlice<'_>]| {
                    if rest.is_empty() {
                        stream.write_vectored(slices)
                    } else {
                        let mut all = Vec::with_capacity(slices.len() + 1);
                        all.push(IoSlice::new(rest));
                        all.extend_from_slice(slices);
                        stream.write_vectored(&all)
                    }
                })
                .ok_or(WireError::Closed)?
            } else {
                stream.write(rest)
            };
            let written = match written {
                Ok(0) => return Err(WireError::Closed),
                Ok(written) => written,
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) =>
                {
                    continue
                }
                Err(_) => return Err(WireError::Closed),
            };
            let from_head = written.min(head.len() - head_at);
            head_at += from_head;
            at += written - from_head;
        }
        Ok(())
    }

    /// A second handle on the same connection (for a reader thread beside a sender), with a buffer of its own.
    pub(crate) fn try_clone(&self) -> Option<Conn> {
        self.stream.try_clone().ok().map(Conn::new)
    }

    /// Sends `frame`, waiting at most `limit` for the socket. A frame cut short by the limit leaves the connection
    /// unusable (the caller closes it).
    pub(crate) fn send(&mut self, frame: &Frame, limit: Duration) -> Result<(), WireError> {
        let limit = Some(limit.max(Duration::from_millis(1)));
        if self.write_timeout != limit {
            let _ = self.stream.set_write_timeout(limit);
            self.write_timeout = limit;
        }
        let (head, payload) = frame.parts();
        write_parts(&mut self.stream, &head, payload).map_err(|_| WireError::Closed)
    }

    /// The next frame, waiting until `deadline` (`Ok(None)`: none complete by then); `stop` is looked at every
    /// [`READ_TICK`]. Bytes of an incomplete frame are kept for the next call.
    pub(crate) fn receive(&mut self, deadline: Instant, stop: &dyn Fn() -> bool) -> Result<Option<Frame>, WireError> {
        if self.payload_left > 0 {
            // The caller did not take the last WriteHead's payload: it is discarded, never read as frames.
            self.receive_payload(None, deadline.max(Instant::now() + PAYLOAD_WAIT), stop)?;
        }
        loop {
            if let Some(partial) = self.partial.as_mut() {
                if partial.payload.len() == partial.len {
                    let Partial { frame, payload, .. } = self.partial.take().ok_or(WireError::Malformed)?;
                    return Ok(Some(frame.with_payload(payload)));
                }
                if stop() {
                    return Err(WireError::Stopped);
                }
                let now = Instant::now();
                if now >= deadline {
                    return Ok(None);
                }
                let wait = Some((deadline - now).min(READ_TICK).max(Duration::from_millis(1)));
                if self.read_timeout != wait {
                    let _ = self.stream.set_read_timeout(wait);
                    self.read_timeout = wait;
                }
                let rest = (partial.len - partial.payload.len()) as u64;
                // Into the payload's own buffer, without initialising it first; on a timeout the bytes read so far
                // stay in it.
                match (&mut self.stream).take(rest).read_to_end(&mut partial.payload) {
                    Ok(read) if read as u64 == rest => {}
                    Ok(_) => return Err(WireError::Closed),
                    Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => return Err(WireError::Closed),
                }
                continue;
            }
            let held = self.end - self.start;
            let mut need = 4 - held.min(4);
            if held >= 4 {
                let at = self.start;
                let len = u32::from_le_bytes([
                    self.buffer[at],
                    self.buffer[at + 1],
                    self.buffer[at + 2],
                    self.buffer[at + 3],
                ]) as usize;
                if len > MAX_FRAME {
                    return Err(WireError::Malformed);
                }
                if held >= 4 + len {
                    let frame = Frame::decode(&self.buffer[at + 4..at + 4 + len]).ok_or(WireError::Malformed)?;
                    self.start += 4 + len;
                    if self.start == self.end {
                        (self.start, self.end) = (0, 0);
                    }
                    return Ok(Some(frame));
                }
                let head = &self.buffer[at + 4..self.end];
                if let Some((frame, payload_len)) = Frame::large_head(head, len)? {
                    let fields = len - payload_len;
                    if let (true, Frame::Write { psn, rkey, va, .. }) = (self.in_place, &frame) {
                        // The payload's first bytes stay in the buffer, the rest in the socket.
                        let frame = Frame::WriteHead { psn: *psn, rkey: *rkey, va: *va, len: payload_len as u32 };
                        self.start = at + 4 + fields;
                        self.payload_left = payload_len;
                        return Ok(Some(frame));
                    }
                    let mut payload = Vec::with_capacity(payload_len);
                    payload.extend_from_slice(&head[fields..]);
                    (self.start, self.end) = (0, 0);
                    self.partial = Some(Partial { frame, payload, len: payload_len });
                    continue;
                }
                need = 4 + len - held;
            }
            if stop() {
                return Err(WireError::Stopped);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            // A large frame's rest is read into place exactly (no bytes of the next frame to move afterwards);
            // otherwise a chunk, which may hold several small frames.
            let want = need.max(READ_CHUNK);
            if self.end + want > self.buffer.len() {
                self.buffer.copy_within(self.start..self.end, 0);
                (self.start, self.end) = (0, held);
                if held + want > self.buffer.len() {
                    self.buffer.resize(held + want, 0);
                }
            }
            let wait = Some((deadline - now).min(READ_TICK).max(Duration::from_millis(1)));
            if self.read_timeout != wait {
                let _ = self.stream.set_read_timeout(wait);
                self.read_timeout = wait;
            }
            let end = self.end;
            match self.stream.read(&mut self.buffer[end..end + want]) {
                Ok(0) => return Err(WireError::Closed),
                Ok(n) => self.end += n,
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
