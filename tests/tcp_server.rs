//! The tcp data server on the wire, driven by a hand-written client over loopback.
//!
//! Speaks raw bytes so every rule of docs/mooncake.md section 4 is checked as a peer sees it: v1 and v2 framing,
//! status frames, persistent connections, the one-buffer bounds rule (exact fit, inside, partial overlap,
//! adjacent buffers, zero size, overflow), rejection without touching memory, isolation from stalled clients, and a
//! flood of idle connections that must keep no client out and hold no thread.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use aiv_transport::transfer::{BufferSet, RegisteredBuffer};
use aiv_transport::transport::tcp::wire::{RequestHeader, Status, WireOpcode, WireVersion};
use aiv_transport::transport::tcp::{ServerLimits, SharedMemory, TcpDataServer};

#[path = "common/flood.rs"]
mod flood;

/// Two adjacent registered buffers carved out of one allocation, plus an unregistered tail.
struct Fixture {
    memory: Box<[u8]>,
    shared: SharedMemory,
    server: TcpDataServer,
}

const BUFFER: u64 = 4096;

impl Fixture {
    fn new() -> Fixture {
        Fixture::with_limits(ServerLimits::default())
    }

    fn with_limits(limits: ServerLimits) -> Fixture {
        let mut memory: Box<[u8]> = (0..3 * BUFFER as usize).map(|i| (i % 251) as u8).collect();
        let base = memory.as_mut_ptr() as u64;
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

    fn base(&self) -> u64 {
        self.memory.as_ptr() as u64
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.server.address()).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        stream
    }

    /// Reads memory the server may be writing on another thread, without forming a reference across the write.
    fn snapshot(&self) -> Vec<u8> {
        // SAFETY: reads within our own allocation; volatile so each call really reads what the server wrote.
        (0..self.memory.len()).map(|i| unsafe { std::ptr::read_volatile(self.memory.as_ptr().add(i)) }).collect()
    }
}

fn header(opcode: WireOpcode, version: WireVersion, addr: u64, size: u64) -> [u8; 24] {
    RequestHeader { size, addr, opcode, version }.encode()
}

fn status(stream: &mut TcpStream) -> Status {
    let mut frame = [0u8; 8];
    stream.read_exact(&mut frame).expect("status frame");
    Status::decode(frame)
}

/// True if the server closed the connection (EOF) with nothing more to say.
fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte), Ok(0))
}

#[test]
fn v2_write_then_read_on_one_persistent_connection() {
    let fixture = Fixture::new();
    let mut stream = fixture.connect();
    let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    let target = fixture.base() + 100;
    stream.write_all(&header(WireOpcode::Write, WireVersion::V2, target, 1000)).expect("send");
    stream.write_all(&payload).expect("send payload");
    assert_eq!(status(&mut stream), Status::OK, "OK after the data is in memory");
    assert_eq!(&fixture.snapshot()[100..1100], &payload[..]);
    // Same connection: READ it back (status first, then data).
    stream.write_all(&header(WireOpcode::Read, WireVersion::V2, target, 1000)).expect("send");
    assert_eq!(status(&mut stream), Status::OK);
    let mut back = vec![0u8; 1000];
    stream.read_exact(&mut back).expect("data");
    assert_eq!(back, payload);
    assert_eq!((fixture.server.served(), fixture.server.served_with(WireVersion::V2)), (2, 2));
}

#[test]
fn v1_has_no_status_frames() {
    let fixture = Fixture::new();
    let mut stream = fixture.connect();
    let payload = vec![0xEEu8; 300];
    stream.write_all(&header(WireOpcode::Write, WireVersion::V1, fixture.base() + BUFFER, 300)).expect("send");
    stream.write_all(&payload).expect("payload");
    // The next bytes on the stream are the READ's data, with no status before them.
    stream.write_all(&header(WireOpcode::Read, WireVersion::V1, fixture.base() + BUFFER, 300)).expect("send");
    let mut back = vec![0u8; 300];
    stream.read_exact(&mut back).expect("data");
    assert_eq!(back, payload);
    assert_eq!((fixture.server.served_with(WireVersion::V1), fixture.server.served_with(WireVersion::V2)), (2, 0));
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let fixture = Fixture::new();
    let mut stream = fixture.connect();
    let mut burst = Vec::new();
    for i in 0..50u64 {
        burst.extend_from_slice(&header(WireOpcode::Write, WireVersion::V2, fixture.base() + i * 8, 8));
        burst.extend_from_slice(&i.to_le_bytes());
    }
    burst.extend_from_slice(&header(WireOpcode::Read, WireVersion::V2, fixture.base(), 400));
    stream.write_all(&burst).expect("one burst of 51 requests");
    for _ in 0..50 {
        assert_eq!(status(&mut stream), Status::OK);
    }
    assert_eq!(status(&mut stream), Status::OK);
    let mut back = vec![0u8; 400];
    stream.read_exact(&mut back).expect("data");
    for (i, word) in back.chunks(8).enumerate() {
        assert_eq!(word, (i as u64).to_le_bytes(), "word {i}: the READ saw every earlier WRITE");
    }
}

#[test]
fn unknown_opcodes_are_served_as_read() {
    let fixture = Fixture::new();
    let mut stream = fixture.connect();
    let mut raw = header(WireOpcode::Read, WireVersion::V2, fixture.base(), 16);
    raw[16] = 0x80 | 0x05;
    raw[17..].copy_from_slice(&[0x11; 7]); // non-zero padding is ignored
    stream.write_all(&raw).expect("send");
    assert_eq!(status(&mut stream), Status::OK);
    let mut back = [0u8; 16];
    stream.read_exact(&mut back).expect("data");
    assert_eq!(&back[..], &fixture.snapshot()[..16]);
}

#[test]
fn bounds_rules() {
    let fixture = Fixture::new();
    let base = fixture.base();
    // Accepted: exact fit of either buffer, strictly inside, last byte.
    for (addr, size) in [(base, BUFFER), (base + BUFFER, BUFFER), (base + 10, 20), (base + 2 * BUFFER - 1, 1)] {
        let mut stream = fixture.connect();
        stream.write_all(&header(WireOpcode::Read, WireVersion::V2, addr, size)).expect("send");
        assert_eq!(status(&mut stream), Status::OK, "[{addr:#x}, +{size}) is inside one buffer");
        let mut data = vec![0u8; size as usize];
        stream.read_exact(&mut data).expect("data");
    }
    // Rejected: partial overlap past the end of the second buffer, spanning the two adjacent buffers, starting
    // before the first, zero size, overflow, entirely unregistered, oversize.
    let rejected = [
        (base + 2 * BUFFER - 10, 20),
        (base + BUFFER - 8, 16),
        (base - 8, 16),
        (base + 64, 0),
        (u64::MAX - 4, 16),
        (base + 2 * BUFFER, 8),
        (base, u64::MAX),
    ];
    for (addr, size) in rejected {
        for version in [WireVersion::V2, WireVersion::V1] {
            let before = fixture.snapshot();
            let mut stream = fixture.connect();
            stream.write_all(&header(WireOpcode::Write, version, addr, size)).expect("send");
            // A would-be payload: must never reach memory.
            let _ = stream.write_all(&[0xFFu8; 64]);
            if version == WireVersion::V2 {
                assert_eq!(status(&mut stream), Status::REJECTED, "[{addr:#x}, +{size}) must be rejected");
            }
            assert!(closed(&mut stream), "the server closes after a rejection ({version:?})");
            assert_eq!(fixture.snapshot(), before, "[{addr:#x}, +{size}) touched memory");
        }
    }
    assert_eq!(fixture.server.rejected(), 2 * rejected.len() as u64);
}

#[test]
fn only_memory_registered_at_the_time_of_the_request_is_served() {
    let fixture = Fixture::new();
    let base = fixture.base();
    let mut stream = fixture.connect();
    stream.write_all(&header(WireOpcode::Read, WireVersion::V2, base + BUFFER, 8)).expect("send");
    assert_eq!(status(&mut stream), Status::OK);
    let mut data = [0u8; 8];
    stream.read_exact(&mut data).expect("data");
    fixture.shared.write().expect("lock").remove(base + BUFFER).expect("registered");
    stream.write_all(&header(WireOpcode::Read, WireVersion::V2, base + BUFFER, 8)).expect("send");
    assert_eq!(status(&mut stream), Status::REJECTED, "unregistered since the last request");
    assert!(closed(&mut stream));
}

#[test]
fn truncated_headers_and_payloads_close_without_touching_memory() {
    let fixture = Fixture::new();
    let before = fixture.snapshot();
    {
        let mut stream = fixture.connect();
        stream.write_all(&header(WireOpcode::Write, WireVersion::V2, fixture.base(), 64)[..13]).expect("half");
    }
    {
        let mut stream = fixture.connect();
        stream.write_all(&header(WireOpcode::Write, WireVersion::V2, fixture.base() + 512, 64)).expect("header");
        stream.write_all(&[0xABu8; 10]).expect("10 of 64 payload bytes");
        stream.shutdown(std::net::Shutdown::Write).expect("shutdown");
        assert!(closed(&mut stream), "no OK for an incomplete payload");
    }
    let after = fixture.snapshot();
    // The 10 bytes that did arrive may have landed (they were inside the checked range); nothing else changed.
    assert_eq!(after[..512], before[..512]);
    assert_eq!(after[522..], before[522..]);
}

#[test]
fn stalled_clients_do_not_stall_others_and_are_dropped_in_bounded_time() {
    let io_timeout = Duration::from_secs(2);
    let first_request_timeout = Duration::from_millis(500);
    let limits =
        ServerLimits { io_timeout, first_request_timeout, tick: Duration::from_millis(50), ..Default::default() };
    let fixture = Fixture::with_limits(limits);
    // Half a first header, then silence: closed at the first-request deadline, counted from the accept.
    let mut stalled_first = fixture.connect();
    stalled_first.write_all(&[1, 2, 3]).expect("partial header");
    let first_at = Instant::now();
    // One request served, then half a header and silence: closed once the in-request timeout has passed.
    let mut stalled_later = fixture.connect();
    stalled_later.write_all(&header(WireOpcode::Read, WireVersion::V2, fixture.base(), 64)).expect("send");
    assert_eq!(status(&mut stalled_later), Status::OK);
    let mut data = [0u8; 64];
    stalled_later.read_exact(&mut data).expect("data");
    stalled_later.write_all(&[1, 2, 3]).expect("partial header");
    let later_at = Instant::now();
    // A client that asks for data and never reads it: its socket buffers fill.
    let mut hog = fixture.connect();
    for _ in 0..64 {
        hog.write_all(&header(WireOpcode::Read, WireVersion::V2, fixture.base(), BUFFER)).expect("send");
    }
    for _ in 0..100 {
        let mut stream = fixture.connect();
        stream.write_all(&header(WireOpcode::Read, WireVersion::V2, fixture.base(), 64)).expect("send");
        assert_eq!(status(&mut stream), Status::OK);
        stream.read_exact(&mut data).expect("data");
    }
    // All 100 were served while the stalled connection was still being waited on (it cannot be dropped before
    // `io_timeout` has passed since its last byte).
    assert!(later_at.elapsed() < io_timeout, "others served within the stalled client's timeout");
    stalled_first.set_read_timeout(Some(io_timeout * 3)).expect("timeout");
    assert!(closed(&mut stalled_first), "stalled first request dropped");
    let waited = first_at.elapsed();
    assert!(waited >= first_request_timeout && waited < io_timeout, "first request dropped after {waited:?}");
    // The stalled connection is closed once the in-request timeout passes, not later than a few ticks after it.
    stalled_later.set_read_timeout(Some(io_timeout * 3)).expect("timeout");
    assert!(closed(&mut stalled_later), "stalled client dropped");
    let waited = later_at.elapsed();
    assert!(waited >= io_timeout && waited < io_timeout * 2, "dropped after {waited:?}");
    assert!(fixture.server.expired() >= 2);
}

/// 1,100 idle connections from ten source addresses (one of them the legitimate client's own, 127.0.0.1), each
/// replaced as soon as the server closes it: they hold no serving thread, the server holds at most
/// `max_connections`, and a client that opens a new connection per request (as Mooncake's does) is served every
/// time, promptly, while the flood goes on.
#[test]
fn a_flood_of_idle_connections_holds_no_thread_and_keeps_no_client_out() {
    let fd_budget = flood::raise_fd_limit();
    // The flood's descriptors and the server's side of them, with room for the rest of the test process.
    let flood_size = 1100.min(fd_budget.saturating_sub(512) as usize / 2);
    let limits = ServerLimits::default();
    let fixture = Fixture::with_limits(limits.clone());
    let sources: Vec<_> = (0..10).map(flood::loopback_source).collect();
    let flood = flood::TcpFlood::start(fixture.server.address(), &sources, flood_size / sources.len());
    flood.wait_for(flood_size.min(limits.max_connections), Duration::from_secs(10));
    assert_eq!(fixture.server.serving_threads(), 0, "idle connections hold no thread");

    let started = Instant::now();
    for round in 0..200u64 {
        let offset = (round % 32) * 64;
        let payload: Vec<u8> = (0..64).map(|i| (i as u64 * 7 + round) as u8).collect();
        let mut stream = fixture.connect();
        stream.write_all(&header(WireOpcode::Write, WireVersion::V2, fixture.base() + offset, 64)).expect("header");
        stream.write_all(&payload).expect("payload");
        assert_eq!(status(&mut stream), Status::OK, "round {round}");
        drop(stream);
        let mut stream = fixture.connect();
        stream.write_all(&header(WireOpcode::Read, WireVersion::V2, fixture.base() + offset, 64)).expect("header");
        assert_eq!(status(&mut stream), Status::OK, "round {round}");
        let mut data = [0u8; 64];
        stream.read_exact(&mut data).expect("data");
        assert_eq!(data[..], payload[..], "round {round}");
    }
    let took = started.elapsed();
    let held = fixture.server.connections();
    let threads = fixture.server.serving_threads();
    let (evicted, expired) = (fixture.server.evicted(), fixture.server.expired());
    let replaced = flood.closed_by_server.load(std::sync::atomic::Ordering::Relaxed);
    drop(flood);
    eprintln!(
        "flood of {flood_size}: 400 requests in {took:?}; server held {held}, {threads} serving threads, {evicted} \
         evicted, {expired} expired; the flood replaced {replaced}"
    );
    assert!(took < Duration::from_secs(10), "400 requests took {took:?} under the flood");
    assert!(held <= limits.max_connections, "{held} connections held");
    assert!(
        threads < 8,
        "{threads} serving threads (the flood sends nothing; the client uses one connection at a time)"
    );
    assert!(evicted + expired > 0 && replaced > 0, "the flood met the limits: {evicted} evicted, {expired} expired");
}

#[test]
fn dropping_the_server_closes_every_connection() {
    let fixture = Fixture::new();
    let mut idle = fixture.connect();
    let deadline = Instant::now() + Duration::from_secs(2);
    while fixture.server.connections() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(fixture.server.connections(), 1);
    let Fixture { memory, shared, server } = fixture;
    drop(server);
    assert!(closed(&mut idle), "idle connection closed by the stop");
    drop((memory, shared));
}
