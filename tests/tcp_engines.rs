//! The tcp transport between engines of one process, over real loopback sockets.
//!
//! Each engine's data server listens on 127.0.0.1; engine A opens engine B's segment by name through the
//! P2P handshake on loopback and every byte crosses the wire. Covers v2 and v1 in both directions (a v1-only
//! client against a v2 server, a v2 client against a server that advertises v1), data verification, the bounds
//! rules as seen from a peer, isolation from a dead peer, and an initiator that keeps working while the target's
//! data port is flooded with idle connections.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aiv_transport::config::EngineConfig;
use aiv_transport::evidence::{Act, Check, Source, TransferEvidence};
use aiv_transport::transfer::SegmentId;
use std::sync::Arc;

use aiv_transport::metadata::handshake::{HandshakeServer, HandshakeState};
use aiv_transport::metadata::{BufferDescriptor, SegmentDescriptor};
use aiv_transport::transport::tcp::{TcpOptions, WireVersion};
use aiv_transport::{Opcode, Protocol, TransferEngine, TransferRequest, TransferState};

#[path = "common/flood.rs"]
mod flood;

fn unique_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("127.0.0.1:{}", 20000 + NEXT.fetch_add(1, Ordering::Relaxed))
}

/// An engine serving tcp with the framing `version` (v2 is what `new` starts by default).
fn engine(version: WireVersion, timeout: Duration) -> TransferEngine {
    let mut config = EngineConfig::new(unique_name());
    config.aiv.transfer_timeout = timeout;
    if version == WireVersion::V2 {
        return TransferEngine::new(config).expect("engine with tcp starts");
    }
    // A v1-only engine: started without tcp, then given a transport whose highest version is 1.
    config.protocol = Protocol::Adxl;
    let engine = TransferEngine::new(config).expect("engine starts");
    let mut options = TcpOptions::from_config(engine.config()).expect("options");
    options.max_version = WireVersion::V1;
    engine.enable_tcp_transport_with(options).expect("v1 tcp starts");
    engine
}

/// A buffer registered with `engine`, filled with `seed`-derived bytes.
struct Region {
    bytes: Vec<u8>,
}

impl Region {
    fn new(engine: &TransferEngine, length: usize, seed: u8) -> Region {
        let mut bytes: Vec<u8> = (0..length).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        let addr = bytes.as_mut_ptr() as u64;
        // SAFETY: the vector outlives every transfer of the test (each test waits for its batches) and is only
        // read by the test after those waits.
        unsafe { engine.register_memory(addr, length as u64, "cpu:0").expect("register") };
        Region { bytes }
    }

    fn addr(&self) -> u64 {
        self.bytes.as_ptr() as u64
    }
}

fn request(opcode: Opcode, source: u64, target: SegmentId, target_offset: u64, length: u64) -> TransferRequest {
    TransferRequest { opcode, source, target_id: target, target_offset, length, protocol: Some(Protocol::Tcp) }
}

/// Runs one batch and returns the state of each task.
fn run(engine: &TransferEngine, requests: &[TransferRequest]) -> Vec<TransferState> {
    let batch = engine.allocate_batch(requests.len()).expect("batch");
    engine.submit_transfer(batch, requests).expect("submit");
    engine.wait_batch(batch).expect("wait");
    let states = (0..requests.len()).map(|task| engine.transfer_status(batch, task).expect("status").state).collect();
    engine.free_batch(batch).expect("free");
    states
}

/// Asserts two byte ranges are equal, naming the first difference instead of printing megabytes.
fn assert_same(left: &[u8], right: &[u8], what: &str) {
    assert_eq!(left.len(), right.len(), "{what}: lengths differ");
    if let Some(index) = left.iter().zip(right).position(|(l, r)| l != r) {
        panic!("{what}: first difference at byte {index} of {} ({} vs {})", left.len(), left[index], right[index]);
    }
}

/// v1 WRITE has no acknowledgement (docs/mooncake.md section 4): the initiator's task completes when the bytes
/// have left, so a v1 test waits, bounded, for them to land before comparing.
fn wait_until_same(left: &[u8], right: &[u8], version: WireVersion, what: &str) {
    if version == WireVersion::V1 {
        let deadline = Instant::now() + Duration::from_secs(5);
        // black_box keeps the comparison from being hoisted: memory is written by the server thread meanwhile.
        while std::hint::black_box(left) != std::hint::black_box(right) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    assert_same(left, right, what);
}

fn exchange(client_version: WireVersion, server_version: WireVersion) {
    let a = engine(client_version, Duration::from_secs(10));
    let b = engine(server_version, Duration::from_secs(10));
    let descriptor = b.local_descriptor();
    assert!(descriptor.tcp_data_port.is_some_and(|port| port != 0), "B publishes its data port");
    assert_eq!(descriptor.tcp_proto_version, Some(server_version.number()));
    assert_eq!(descriptor.tcp_data_host.as_deref(), Some("127.0.0.1"));
    let local = Region::new(&a, 1 << 20, 1);
    let remote = Region::new(&b, 1 << 20, 2);
    let target = a.open_segment(b.name()).expect("A opens B");
    // WRITE blocks of several sizes (tiny, 4 KiB, 64 KiB, 300 KiB: larger than the receive buffers), then READ them
    // back into another part of A's buffer.
    let sizes = [1u64, 4096, 65536, 300 * 1024];
    let mut offset = 0u64;
    let mut writes = Vec::new();
    for &size in &sizes {
        writes.push(request(Opcode::Write, local.addr() + offset, target, remote.addr() + offset, size));
        offset += size;
    }
    assert!(run(&a, &writes).iter().all(|&s| s == TransferState::Completed), "writes complete");
    let span = offset as usize;
    let wire = if client_version == WireVersion::V1 || server_version == WireVersion::V1 {
        WireVersion::V1
    } else {
        WireVersion::V2
    };
    wait_until_same(&remote.bytes[..span], &local.bytes[..span], wire, "B's memory holds what A wrote");
    let back = 512 * 1024u64;
    let reads: Vec<_> =
        writes.iter().map(|w| request(Opcode::Read, w.source + back, target, w.target_offset, w.length)).collect();
    assert!(run(&a, &reads).iter().all(|&s| s == TransferState::Completed), "reads complete");
    assert_same(&local.bytes[back as usize..back as usize + span], &remote.bytes[..span], "A read B's bytes back");
    // Mixed directions in one pipelined batch.
    let mixed = vec![
        request(Opcode::Read, local.addr() + 900_000, target, remote.addr() + 700_000, 40_000),
        request(Opcode::Write, local.addr() + 10, target, remote.addr() + 800_000, 100_000),
        request(Opcode::Read, local.addr() + 950_000, target, remote.addr() + 10, 50_000),
    ];
    assert!(run(&a, &mixed).iter().all(|&s| s == TransferState::Completed));
    assert_same(&local.bytes[900_000..940_000], &remote.bytes[700_000..740_000], "mixed read 1");
    wait_until_same(&remote.bytes[800_000..900_000], &local.bytes[10..100_010], wire, "mixed write");
    assert_same(&local.bytes[950_000..1_000_000], &remote.bytes[10..50_010], "mixed read 2");
}

#[test]
fn v2_client_against_v2_server() {
    exchange(WireVersion::V2, WireVersion::V2);
}

#[test]
fn v1_client_against_v2_server() {
    exchange(WireVersion::V1, WireVersion::V2);
}

#[test]
fn v2_client_against_v1_server() {
    exchange(WireVersion::V2, WireVersion::V1);
}

/// Runs one batch and returns each task's evidence (every task must complete).
fn run_evidence(engine: &TransferEngine, requests: &[TransferRequest]) -> Vec<TransferEvidence> {
    let batch = engine.allocate_batch(requests.len()).expect("batch");
    engine.submit_transfer(batch, requests).expect("submit");
    assert_eq!(engine.wait_batch(batch).expect("wait").state, TransferState::Completed);
    let evidence =
        (0..requests.len()).map(|task| engine.task_evidence(batch, task).expect("task").expect("evidence")).collect();
    engine.free_batch(batch).expect("free");
    evidence
}

/// The acts of a tcp transfer are what its lane did for it, counted where it happened: one request header encoded,
/// the sends that carried its request (at least one; one call carrying several requests counts for each), one reply
/// read (v2 status, v1 READ payload) or, for a v1 WRITE, the writer seeing its send return. No device runtime.
fn assert_tcp_acts(evidence: &TransferEvidence) {
    assert_eq!(evidence.path, "tcp");
    assert_eq!(evidence.runtime, aiv_transport::evidence::RuntimeLabel::NONE, "a Host path: no device runtime");
    assert_eq!(evidence.window, 1);
    assert_eq!(evidence.descriptors_written, Act::host(Source::HostCode, 1), "one header: {evidence:?}");
    assert_eq!(evidence.completion_seen, Act::host(Source::HostCode, 1), "one reply: {evidence:?}");
    let sends = evidence.doorbells_rung;
    assert!(sends.source == Source::HostCode && sends.by_aiv == 0 && sends.by_host >= 1, "{evidence:?}");
    assert_eq!((evidence.descriptors, evidence.doorbells, evidence.host_device_api_calls), (1, sends.by_host, 0));
    assert_eq!(evidence.checks().as_array(), [Check::No; 4], "{evidence:?}");
}

#[test]
fn evidence_of_a_wire_transfer() {
    let a = engine(WireVersion::V2, Duration::from_secs(10));
    let b = engine(WireVersion::V2, Duration::from_secs(10));
    let local = Region::new(&a, 8192, 3);
    let remote = Region::new(&b, 8192, 4);
    let target = a.open_segment(b.name()).expect("open");
    let evidence = run_evidence(&a, &[request(Opcode::Write, local.addr(), target, remote.addr(), 8192)]);
    assert_tcp_acts(&evidence[0]);
    assert_eq!(evidence[0].doorbells_rung.by_host, 1, "8 KiB and a header fit one send on loopback");
    assert!(evidence[0].host_cpu_ns > 0, "the lane threads used some CPU");
    assert_same(&remote.bytes, &local.bytes, "written block");
}

/// Many small requests pipelined on the lanes, both directions, on v2 and v1: each transfer's own counts.
#[test]
fn evidence_of_pipelined_transfers_counts_each_transfers_acts() {
    for version in [WireVersion::V2, WireVersion::V1] {
        let a = engine(version, Duration::from_secs(10));
        let b = engine(WireVersion::V2, Duration::from_secs(10));
        let local = Region::new(&a, 1 << 16, 5);
        let remote = Region::new(&b, 1 << 16, 6);
        let target = a.open_segment(b.name()).expect("open");
        let requests: Vec<_> = (0..64u64)
            .map(|i| {
                let opcode = if i % 3 == 0 { Opcode::Read } else { Opcode::Write };
                request(opcode, local.addr() + i * 1024, target, remote.addr() + i * 1024, 1000)
            })
            .collect();
        for evidence in run_evidence(&a, &requests) {
            assert_tcp_acts(&evidence);
        }
    }
}

/// A tcp transfer into the engine's own segment is copied in place: no header, no send, the copy seen ending.
#[test]
fn evidence_of_an_in_process_copy() {
    let a = engine(WireVersion::V2, Duration::from_secs(10));
    let region = Region::new(&a, 8192, 7);
    let evidence =
        run_evidence(&a, &[request(Opcode::Write, region.addr(), SegmentId::LOCAL, region.addr() + 4096, 4096)]);
    let evidence = &evidence[0];
    assert_eq!(evidence.path, "local");
    assert_eq!(evidence.runtime, aiv_transport::evidence::RuntimeLabel::NONE);
    assert_eq!(evidence.descriptors_written, Act::host(Source::HostCode, 0));
    assert_eq!(evidence.doorbells_rung, Act::host(Source::HostCode, 0));
    assert_eq!(evidence.completion_seen, Act::host(Source::HostCode, 1));
    assert_eq!(
        (evidence.window, evidence.descriptors, evidence.doorbells, evidence.host_device_api_calls),
        (1, 0, 0, 0)
    );
    assert_eq!(evidence.checks().as_array(), [Check::No; 4]);
    let (first, second) = region.bytes.split_at(4096);
    assert_same(first, second, "copied in place");
}

#[test]
fn out_of_bounds_requests_fail_before_the_wire_and_leave_memory_alone() {
    let a = engine(WireVersion::V2, Duration::from_secs(10));
    let b = engine(WireVersion::V2, Duration::from_secs(10));
    let local = Region::new(&a, 8192, 5);
    let first = Region::new(&b, 4096, 6);
    let before = first.bytes.clone();
    let target = a.open_segment(b.name()).expect("open");
    let base = first.addr();
    let cases = [
        (base + 4000, 200u64), // partial overlap past the end
        (base - 16, 32),       // starts before the buffer
        (base, 0),             // zero length
        (u64::MAX - 8, 64),    // wraps the address space
        (base, 4097),          // one byte past an exact fit
    ];
    for (addr, length) in cases {
        let states = run(&a, &[request(Opcode::Write, local.addr(), target, addr, length)]);
        assert_eq!(states, vec![TransferState::Failed], "[{addr:#x}, +{length}) must fail");
    }
    assert_same(&first.bytes, &before, "no rejected request touched B's memory");
    // Exact fit works.
    assert_eq!(run(&a, &[request(Opcode::Write, local.addr(), target, base, 4096)]), vec![TransferState::Completed]);
    assert_same(&first.bytes, &local.bytes[..4096], "exact fit");
}

/// A peer that registers memory after the initiator opened its segment (or restarts under the same name with other
/// buffers): a request into the new buffer fetches the descriptor again instead of failing on the stale one; a
/// request into no buffer still fails, and does not fetch again within the refresh interval.
#[test]
fn memory_the_peer_registered_after_the_open_is_found_by_fetching_the_descriptor_again() {
    let a = engine(WireVersion::V2, Duration::from_secs(10));
    let b = engine(WireVersion::V2, Duration::from_secs(10));
    let local = Region::new(&a, 8192, 5);
    let _first = Region::new(&b, 4096, 6);
    let target = a.open_segment(b.name()).expect("open");
    assert_eq!(a.segment(target).expect("open").buffers.len(), 1, "the descriptor as it was at the open");
    let later = Region::new(&b, 8192, 7);
    let states = run(&a, &[request(Opcode::Write, local.addr(), target, later.addr(), 8192)]);
    assert_eq!(states, vec![TransferState::Completed], "the buffer registered after the open is reached");
    wait_until_same(&later.bytes, &local.bytes, WireVersion::V2, "written into the later buffer");
    assert_eq!(a.segment(target).expect("open").buffers.len(), 2, "the cached descriptor was replaced");
    // Nowhere registered: refused, and the descriptor is not fetched again at once.
    let nowhere = later.addr() + (1 << 30);
    let started = Instant::now();
    for _ in 0..20 {
        assert_eq!(run(&a, &[request(Opcode::Write, local.addr(), target, nowhere, 64)]), vec![TransferState::Failed]);
    }
    assert!(started.elapsed() < Duration::from_secs(2), "20 refusals took {:?}", started.elapsed());
}

#[test]
fn a_dead_peer_does_not_stall_transfers_to_others() {
    let a = engine(WireVersion::V2, Duration::from_secs(2));
    let b = engine(WireVersion::V2, Duration::from_secs(2));
    // A "peer" that accepts connections and never answers: its listener backlog completes the handshake.
    let dead = TcpListener::bind("127.0.0.1:0").expect("bind");
    // Its descriptor is served by a handshake server of its own, as a remote peer's would be.
    let handshake_state = Arc::new(HandshakeState::default());
    let handshake = HandshakeServer::bind("127.0.0.1", 15000..=17000, handshake_state.clone()).expect("handshake");
    let dead_name = format!("127.0.0.1:{}", handshake.local_addr().port());
    let mut dead_descriptor = SegmentDescriptor::new(dead_name.clone(), vec!["tcp".into()]);
    dead_descriptor.tcp_data_port = Some(dead.local_addr().expect("addr").port());
    dead_descriptor.tcp_proto_version = Some(2);
    dead_descriptor.buffers = vec![BufferDescriptor::new(dead_name.clone(), 0x10_0000, 1 << 20)];
    handshake_state.set_descriptor(Some(dead_descriptor));
    let local = Region::new(&a, 1 << 20, 7);
    let remote = Region::new(&b, 1 << 20, 8);
    let dead_segment = a.open_segment(&dead_name).expect("open dead");
    let live_segment = a.open_segment(b.name()).expect("open live");
    // Stuff the dead peer's socket with more than its buffers hold, so its lanes block in send.
    let stuck = a.allocate_batch(16).expect("batch");
    let to_dead: Vec<_> =
        (0..16).map(|_| request(Opcode::Write, local.addr(), dead_segment, 0x10_0000, 1 << 20)).collect();
    a.submit_transfer(stuck, &to_dead).expect("submit to dead");
    let started = Instant::now();
    for _ in 0..20 {
        let states = run(&a, &[request(Opcode::Write, local.addr(), live_segment, remote.addr(), 65536)]);
        assert_eq!(states, vec![TransferState::Completed]);
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "live peer served while the dead one hangs: {:?}",
        started.elapsed()
    );
    assert_same(&remote.bytes[..65536], &local.bytes[..65536], "live peer's memory");
    // The dead peer's transfers end, bounded by the timeout.
    let status = a.wait_batch(stuck).expect("wait dead");
    assert!(matches!(status.state, TransferState::Failed | TransferState::Timeout), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(6), "bounded: {:?}", started.elapsed());
    let _ = a.free_batch(stuck);
    handshake.stop();
    drop(dead);
}

/// The target's data port under a flood of 1,100 idle connections from ten loopback addresses (127.0.0.1, the
/// initiator's own, among them), each replaced as soon as the server closes it: the initiator, whose lanes connect
/// after the flood began, completes every batch, with its data.
#[test]
fn a_flood_of_idle_connections_does_not_starve_an_initiator() {
    let fd_budget = flood::raise_fd_limit();
    // The flood's descriptors and the server's side of them, with room for the engines.
    let flood_size = 1100.min(fd_budget.saturating_sub(768) as usize / 2);
    let a = engine(WireVersion::V2, Duration::from_secs(10));
    let b = engine(WireVersion::V2, Duration::from_secs(10));
    let mut local = Region::new(&a, 1 << 20, 5);
    let remote = Region::new(&b, 1 << 20, 6);
    let target = a.open_segment(b.name()).expect("A opens B");
    let port = b.local_descriptor().tcp_data_port.expect("data port");
    let sources: Vec<_> = (0..10).map(flood::loopback_source).collect();
    let flood = flood::TcpFlood::start(std::net::SocketAddr::from(([127, 0, 0, 1], port)), &sources, flood_size / 10);
    flood.wait_for(flood_size.min(1024), Duration::from_secs(10));

    let started = Instant::now();
    let (block, count) = (32u64 << 10, 16u64);
    let span = (block * count) as usize;
    for round in 0..20u8 {
        for (i, byte) in local.bytes[..span].iter_mut().enumerate() {
            *byte = (i as u8).wrapping_mul(13).wrapping_add(round);
        }
        let writes: Vec<_> = (0..count)
            .map(|i| request(Opcode::Write, local.addr() + i * block, target, remote.addr() + i * block, block))
            .collect();
        let states = run(&a, &writes);
        assert!(states.iter().all(|&s| s == TransferState::Completed), "round {round} writes: {states:?}");
        let back = span as u64;
        let reads: Vec<_> =
            writes.iter().map(|w| request(Opcode::Read, w.source + back, target, w.target_offset, w.length)).collect();
        let states = run(&a, &reads);
        assert!(states.iter().all(|&s| s == TransferState::Completed), "round {round} reads: {states:?}");
        assert_same(&local.bytes[span..2 * span], &local.bytes[..span], "round trip through B under the flood");
    }
    let took = started.elapsed();
    let closed = flood.closed_by_server.load(Ordering::Relaxed);
    drop(flood);
    eprintln!("flood of {flood_size}: 40 batches in {took:?}; the server closed {closed} flood connections");
    assert!(closed > 0, "the flood met the server's limits");
    assert!(took < Duration::from_secs(20), "40 batches took {took:?}");
}
