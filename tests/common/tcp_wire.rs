//! The tcp data server's test fixture, shared by `tests/tcp_server.rs` and the hostile tier (included with `#[path]`,
//! not a test target of its own): registered memory with unregistered neighbours, a server over it, and raw-frame
//! helpers.
#![allow(dead_code)]

use std::io::Read;
use std::net::TcpStream;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use aiv_transport::transfer::{BufferSet, RegisteredBuffer};
use aiv_transport::transport::tcp::wire::{RequestHeader, Status, WireOpcode, WireVersion};
use aiv_transport::transport::tcp::{ServerLimits, SharedMemory, TcpDataServer};

/// Two adjacent registered buffers carved out of one allocation, between an unregistered guard before them and an
/// unregistered tail after them: `[guard][buffer 0][buffer 1][tail]`, `BUFFER` bytes each.
pub struct Fixture {
    pub memory: Box<[u8]>,
    pub shared: SharedMemory,
    pub server: TcpDataServer,
}

pub const BUFFER: u64 = 4096;

impl Fixture {
    pub fn new() -> Fixture {
        Fixture::with_limits(ServerLimits::default())
    }

    pub fn with_limits(limits: ServerLimits) -> Fixture {
        let mut memory: Box<[u8]> = (0..4 * BUFFER as usize).map(|i| (i % 251) as u8).collect();
        let base = memory.as_mut_ptr() as u64 + BUFFER;
        let mut set = BufferSet::new();
        for index in 0..2 {
            let buffer = RegisteredBuffer { addr: base + index * BUFFER, length: BUFFER, location: "cpu:0".into() };
            set.insert(buffer).expect("adjacent buffers do not overlap");
        }
        let shared = Arc::new(RwLock::new(set));
        let server =
            TcpDataServer::start("127.0.0.1:0".parse().expect("address"), shared.clone(), limits).expect("server");
        Fixture { memory, shared, server }
    }

    /// The first byte of buffer 0.
    pub fn base(&self) -> u64 {
        self.memory.as_ptr() as u64 + BUFFER
    }

    pub fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.server.address()).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        stream
    }

    /// The two buffers and the tail, from [`Fixture::base`]; read without forming a reference across the server's
    /// writes on another thread.
    pub fn snapshot(&self) -> Vec<u8> {
        self.read(BUFFER as usize..self.memory.len())
    }

    /// The unregistered bytes: the guard before the buffers, then the tail after them.
    pub fn unregistered(&self) -> Vec<u8> {
        let mut bytes = self.read(0..BUFFER as usize);
        bytes.extend(self.read(3 * BUFFER as usize..self.memory.len()));
        bytes
    }

    fn read(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        assert!(range.end <= self.memory.len());
        // SAFETY: reads within our own allocation; volatile so each call really reads what the server wrote.
        range.map(|i| unsafe { std::ptr::read_volatile(self.memory.as_ptr().add(i)) }).collect()
    }
}

pub fn header(opcode: WireOpcode, version: WireVersion, addr: u64, size: u64) -> [u8; 24] {
    RequestHeader { size, addr, opcode, version }.encode()
}

pub fn status(stream: &mut TcpStream) -> Status {
    let mut frame = [0u8; 8];
    stream.read_exact(&mut frame).expect("status frame");
    Status::decode(frame)
}

/// True if the server closed the connection (EOF) with nothing more to say.
pub fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte), Ok(0))
}
