//! The tcp data server on the wire, driven by a hand-written client over loopback.
//!
//! Speaks raw bytes so every rule of docs/mooncake.md section 4 is checked as a peer sees it: v1 and v2 framing,
//! status frames, persistent connections, the one-buffer bounds rule (exact fit, inside, partial overlap,
//! adjacent buffers, zero size, overflow), rejection without touching memory, unregistration between requests, and
//! closing every connection when dropped. Malformed frames, stalled and flooding clients: the hostile tier
//! (`tests/hostile/tcp_data.rs`).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use aiv_transport::transport::tcp::wire::{Status, WireOpcode, WireVersion};

#[path = "common/tcp_wire.rs"]
mod tcp_wire;

use tcp_wire::{closed, header, status, Fixture, BUFFER};

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
    let guard = fixture.unregistered();
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
            assert_eq!(fixture.unregistered(), guard, "[{addr:#x}, +{size}) touched unregistered memory");
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
