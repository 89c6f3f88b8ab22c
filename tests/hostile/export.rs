//! The twin export service (device memory shared between processes over an abstract Unix socket) against random
//! request lines, wrong and missing secrets, silence, a flood of another uid and idle connections of this uid.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use aiv_transport::config::{ExportLimits, LaunchMode};
use aiv_transport::device::twin::export_service::{self, ExportService, Offer};
use aiv_transport::{Opcode, SegmentId, TransferRequest, TransferState};
use proptest::prelude::*;
use rand::RngCore;

use crate::aiv::{node, options, Node};
use crate::flood;

/// Bytes of the fuzzed service's memfd: an offered region in the middle, unoffered bytes on both sides.
const MEMFD_BYTES: u64 = 3 * 4096;
const OFFER: (u64, u64) = (4096, 4096);
const EXPORT_ID: u64 = 7;

struct Fuzzed {
    service: ExportService,
    memfd: Arc<OwnedFd>,
}

fn fuzzed_service() -> &'static Fuzzed {
    static SERVICE: OnceLock<Fuzzed> = OnceLock::new();
    SERVICE.get_or_init(|| {
        // SAFETY: memfd_create reads one NUL-terminated name; a non-negative result is a descriptor nothing owns.
        let fd = unsafe { libc::memfd_create(c"hostile-export".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: just created, owned by nothing else.
        let memfd = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        // SAFETY: resizes our own memfd.
        assert_eq!(unsafe { libc::ftruncate(memfd.as_raw_fd(), MEMFD_BYTES as libc::off_t) }, 0);
        let limits = ExportLimits { first_request_timeout: Duration::from_millis(200), ..ExportLimits::default() };
        let service = ExportService::start_with("hostile", limits).expect("export service starts");
        service.offer(EXPORT_ID, Offer { fd: memfd.clone(), offset: OFFER.0, length: OFFER.1 });
        Fuzzed { service, memfd }
    })
}

/// Sends `bytes` on a fresh connection to `endpoint`, half-closes, and returns the reply and how many descriptors
/// came with it (they are closed here).
fn exchange_raw(endpoint: &str, bytes: &[u8]) -> (Vec<u8>, usize) {
    let name = endpoint.strip_prefix('@').expect("an abstract endpoint");
    let address = SocketAddr::from_abstract_name(name.as_bytes()).expect("address");
    let mut stream = UnixStream::connect_addr(&address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let (mut reply, mut fds) = (Vec::new(), 0usize);
    let started = Instant::now();
    loop {
        let mut data = [0u8; 2048];
        // Room for a few descriptors' control message.
        let mut control = [0u64; 16];
        let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
        // SAFETY: an all-zero msghdr is a valid empty header; the pointers set below live across the call.
        let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
        header.msg_iov = &mut iov;
        header.msg_iovlen = 1;
        header.msg_control = control.as_mut_ptr().cast();
        header.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: recvmsg writes into `data` and `control` within the lengths given in `header`.
        let got = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC) };
        if got <= 0 {
            break;
        }
        reply.extend_from_slice(&data[..got as usize]);
        // SAFETY: walks the control messages recvmsg wrote, within msg_controllen.
        unsafe {
            let mut message = libc::CMSG_FIRSTHDR(&header);
            while !message.is_null() {
                if (*message).cmsg_level == libc::SOL_SOCKET && (*message).cmsg_type == libc::SCM_RIGHTS {
                    let count = ((*message).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                    let first = libc::CMSG_DATA(message).cast::<libc::c_int>();
                    for index in 0..count {
                        drop(OwnedFd::from_raw_fd(first.add(index).read_unaligned()));
                    }
                    fds += count;
                }
                message = libc::CMSG_NXTHDR(&header, message);
            }
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the service kept the connection open past 5 s");
    }
    (reply, fds)
}

/// A request line as a fuzzer builds it: JSON with any op, export id and secret (the right one sometimes), with or
/// without its newline; over-long lines; printable garbage; raw bytes; a secret of the wrong type.
fn request_line(secret: String) -> impl Strategy<Value = Vec<u8>> {
    let op = prop_oneof![Just("import"), Just("ping"), Just("IMPORT"), Just(""), Just("delete")];
    let id = prop_oneof![
        Just(Some(EXPORT_ID as i128)),
        Just(None),
        (0i128..20).prop_map(Some),
        Just(Some(-1)),
        Just(Some(i128::from(u64::MAX) + 1)),
    ];
    let chosen_secret = prop_oneof![
        2 => Just(Some(secret.clone())),
        1 => Just(None),
        1 => Just(Some(String::new())),
        1 => "[0-9a-f]{64}".prop_map(Some),
        1 => Just(Some(format!("{}0", &secret[..secret.len() - 1]))),
        1 => Just(Some(secret[..secret.len() - 1].to_owned())),
        1 => Just(Some(format!("{secret}0"))),
        1 => Just(Some(secret.to_uppercase())),
    ];
    let json = (op, id, chosen_secret, any::<bool>()).prop_map(|(op, id, secret, newline)| {
        let mut fields = vec![format!("\"op\":\"{op}\"")];
        if let Some(id) = id {
            fields.push(format!("\"export_id\":{id}"));
        }
        if let Some(secret) = &secret {
            fields.push(format!("\"secret\":\"{secret}\""));
        }
        let mut line = format!("{{{}}}", fields.join(",")).into_bytes();
        if newline {
            line.push(b'\n');
        }
        line
    });
    prop_oneof![
        6 => json,
        1 => Just(format!("{{\"op\":\"import\",\"pad\":\"{}\"}}\n", "x".repeat(2000)).into_bytes()),
        1 => "[ -~]{0,80}\n".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..200),
        1 => Just(b"{\"op\":\"import\",\"export_id\":7,\"secret\":[1,2]}\n".to_vec()),
    ]
}

/// What the service must do with a line.
#[derive(Debug, PartialEq, Eq)]
enum Expect {
    /// A descriptor and `ok: true` (an import of the offered id with the right secret).
    Grant,
    /// `ok: true` and no descriptor (a ping with the right secret).
    Pong,
    /// No descriptor; `ok: false` or a close.
    Refuse,
}

fn expected(line: &[u8], secret: &str) -> (Expect, bool) {
    let text = std::str::from_utf8(line).unwrap_or("");
    let complete = text.ends_with('\n');
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text.trim_end_matches('\n')) else {
        return (Expect::Refuse, complete);
    };
    // The request's schema: `export_id`, when present, a u64; `secret` a string.
    let id_ok = value.get("export_id").is_none_or(|id| id.as_u64().is_some());
    let right_secret = value["secret"] == secret && id_ok;
    let expect = match value["op"].as_str() {
        Some("import") if right_secret && value["export_id"] == EXPORT_ID => Expect::Grant,
        Some("ping") if right_secret => Expect::Pong,
        _ => Expect::Refuse,
    };
    (expect, complete)
}

proptest! {
    #![proptest_config(crate::fuzz_config(200))]

    /// Whatever line arrives, the service answers with one JSON line or closes, promptly; a descriptor comes back
    /// only for an import of the offered id with the right secret; the memfd's bytes are never changed by the
    /// service; a real import still succeeds after each case.
    #[test]
    fn the_export_service_grants_memory_only_to_a_valid_request(
        line in request_line(fuzzed_service().service.secret().to_owned()),
    ) {
        let fuzzed = fuzzed_service();
        let secret = fuzzed.service.secret().to_owned();
        let before = read_memfd(&fuzzed.memfd);
        let started = Instant::now();
        let (reply, fds) = exchange_raw(fuzzed.service.endpoint(), &line);
        prop_assert!(started.elapsed() < Duration::from_secs(2), "answered after {:?}", started.elapsed());
        let (expect, complete) = expected(&line, &secret);
        let shown = String::from_utf8_lossy(&line);
        let ok = if reply.is_empty() {
            None
        } else {
            let text = String::from_utf8_lossy(&reply);
            let reply: serde_json::Value = serde_json::from_str(text.trim_end())
                .map_err(|error| TestCaseError::fail(format!("not one JSON line: {text:?}: {error}")))?;
            reply["ok"].as_bool()
        };
        match expect {
            // A request cut off by the close (no newline) may be served or refused; nothing else may differ.
            Expect::Grant if complete => prop_assert!(fds == 1 && ok == Some(true), "{shown}: {fds} fds, ok {ok:?}"),
            Expect::Pong if complete => prop_assert!(fds == 0 && ok == Some(true), "{shown}: {fds} fds, ok {ok:?}"),
            Expect::Grant => prop_assert!(fds <= 1, "{shown}: {fds} fds"),
            Expect::Pong => prop_assert!(fds == 0, "{shown}: {fds} fds"),
            Expect::Refuse => prop_assert!(fds == 0 && ok != Some(true), "{shown}: {fds} fds, ok {ok:?}"),
        }
        prop_assert!(read_memfd(&fuzzed.memfd) == before, "the service wrote the exported memory");
        let imported = export_service::import(fuzzed.service.endpoint(), &secret, EXPORT_ID, Duration::from_secs(2));
        prop_assert!(imported.is_ok(), "a real import after the case: {:?}", imported.err());
    }
}

fn read_memfd(memfd: &OwnedFd) -> Vec<u8> {
    let mut bytes = vec![0u8; MEMFD_BYTES as usize];
    // SAFETY: pread writes at most `bytes.len()` bytes into the live buffer.
    let got = unsafe { libc::pread(memfd.as_raw_fd(), bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    assert_eq!(got, MEMFD_BYTES as isize);
    bytes
}

/// A connection that sends half a request and then nothing is answered and closed at the first-request deadline,
/// and meanwhile others are served.
#[test]
fn a_silent_or_slow_export_client_is_closed_at_the_first_request_deadline() {
    let fuzzed = fuzzed_service();
    let name = fuzzed.service.endpoint().strip_prefix('@').expect("abstract");
    let address = SocketAddr::from_abstract_name(name.as_bytes()).expect("address");
    let mut slow = UnixStream::connect_addr(&address).expect("connect");
    slow.write_all(b"{\"op\":\"imp").expect("half a request");
    let started = Instant::now();
    for _ in 0..20 {
        export_service::import(fuzzed.service.endpoint(), fuzzed.service.secret(), EXPORT_ID, Duration::from_secs(2))
            .expect("served while a slow client waits");
    }
    let served = started.elapsed();
    slow.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    let mut rest = Vec::new();
    let read = slow.read_to_end(&mut rest);
    let took = started.elapsed();
    eprintln!("served in {served:?}, closed after {took:?}: {read:?} {:?}", String::from_utf8_lossy(&rest));
    assert!(took >= Duration::from_millis(150) && took < Duration::from_secs(2), "closed after {took:?}");
}

/// A round trip between two nodes: random bytes written to `remote`, read back to another offset, compared.
fn round_trip(initiator: &Node, segment: SegmentId, remote: u64, length: u64) -> Result<(), String> {
    let mut random = vec![0u8; length as usize];
    rand::thread_rng().fill_bytes(&mut random);
    initiator.write(0, &random);
    let local = initiator.buffer.addr();
    for (opcode, source) in [(Opcode::Write, local), (Opcode::Read, local + (1 << 19))] {
        let request =
            TransferRequest { opcode, source, target_id: segment, target_offset: remote, length, protocol: None };
        let batch = initiator.engine.allocate_batch(1).map_err(|error| error.to_string())?;
        initiator.engine.submit_transfer(batch, &[request]).map_err(|error| error.to_string())?;
        let _ = initiator.engine.wait_batch(batch);
        let status = initiator.engine.transfer_status(batch, 0).map_err(|error| error.to_string())?;
        let reason = initiator.engine.task_failure(batch, 0).ok().flatten().map(|failure| failure.message().to_owned());
        let _ = initiator.engine.free_batch(batch);
        if status.state != TransferState::Completed {
            return Err(format!("{opcode:?}: {:?} {}", status.state, reason.unwrap_or_default()));
        }
    }
    if initiator.read(1 << 19..(1 << 19) + length as usize) != random {
        return Err("the data read back differs".into());
    }
    Ok(())
}

/// Nodes on the legacy in-process twin backend, whose export service these tests flood (the twin runtime's own
/// export service, for VMM shareable handles, has its hostile-input tests in `shmem-bindings/cann-twin/tests/
/// vmm_share.rs`).
fn export_options(device_id: u32, export: ExportLimits) -> aiv_transport::config::AivOptions {
    aiv_transport::config::AivOptions {
        device_backend: aiv_transport::config::DeviceBackendKind::TwinLegacy,
        export,
        transfer_timeout: Duration::from_secs(20),
        kernel_wait_budget: Duration::from_secs(15),
        ..options(device_id, LaunchMode::Persistent, 8)
    }
}

/// Another uid floods the export socket with connections while a peer imports and transfers: they are refused at
/// accept, before anything is counted (with limits of 4, a counted flood would evict or keep out everything), so
/// no connection of this uid is evicted, a fresh importer imports, and the live peer is never marked lost.
#[test]
fn another_uids_connection_flood_holds_nothing_and_a_live_peer_stays_reachable() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped another_uids_connection_flood...: needs root to fork a flooder that runs as nobody");
        return;
    }
    let tight = ExportLimits {
        max_connections: 4,
        max_per_uid: 4,
        max_per_process: 4,
        first_request_timeout: Duration::from_secs(10),
        ..ExportLimits::default()
    };
    let exporter = node(export_options(0, tight), 1 << 20);
    let importer = node(export_options(1, ExportLimits::default()), 1 << 20);
    let segment = importer.engine.open_segment(exporter.engine.name()).expect("open");
    let remote = exporter.buffer.addr();
    round_trip(&importer, segment, remote, 4096).expect("before the flood");
    let twin = exporter.device.twin().expect("twin device");

    let flood = flood::SocketFlood::start(twin.export_endpoint(), 256, Duration::from_secs(3), true);
    let started = Instant::now();
    while twin.export_stats().refused_credentials < 200 && started.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut rounds = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        round_trip(&importer, segment, remote, 4096).unwrap_or_else(|reason| panic!("under the flood: {reason}"));
        rounds += 1;
    }
    // An importer that arrives during the flood imports (and probes) for the first time.
    let late = node(export_options(2, ExportLimits::default()), 1 << 20);
    let late_segment = late.engine.open_segment(exporter.engine.name()).expect("open");
    round_trip(&late, late_segment, remote, 4096).expect("a fresh import during the flood");
    let stats = twin.export_stats();
    let connections = flood.finish().expect("the flooder ran as nobody");
    eprintln!("another uid's flood: {connections} connections, {rounds} round trips meanwhile, {stats:?}");
    assert!(stats.refused_credentials >= 200, "{stats:?}");
    assert_eq!(stats.evicted, 0, "another uid's connections count against no limit: {stats:?}");
    round_trip(&importer, segment, remote, 4096).expect("after the flood");
}

/// A process of this uid holds idle connections to the export socket (more than every limit), and the first-request
/// deadline is long (30 s), so only the eviction of the oldest waiting connection makes room: imports of another
/// process still succeed at once.
#[test]
fn a_process_holding_idle_export_connections_does_not_make_imports_fail() {
    let patient = ExportLimits { first_request_timeout: Duration::from_secs(30), ..ExportLimits::default() };
    let exporter = node(export_options(0, patient), 1 << 20);
    let twin = exporter.device.twin().expect("twin device");
    let holder = flood::SocketFlood::start(twin.export_endpoint(), 80, Duration::from_secs(3), false);
    let started = Instant::now();
    while twin.export_stats().evicted < 20 && started.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let importer = node(export_options(1, ExportLimits::default()), 1 << 20);
    let segment = importer.engine.open_segment(exporter.engine.name()).expect("open");
    let importing = Instant::now();
    round_trip(&importer, segment, exporter.buffer.addr(), 64 << 10).expect("import despite the idle connections");
    let took = importing.elapsed();
    let stats = twin.export_stats();
    drop(holder);
    assert!(took < Duration::from_secs(2), "the first transfer (with its import) took {took:?}");
    assert!(stats.evicted >= 20 && stats.timed_out == 0, "{stats:?}");
}
