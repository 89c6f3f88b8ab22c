//! A whole engine under fuzz: random bytes and frames on its RPC (handshake) port and its tcp data port at once,
//! then a legitimate transfer. Memory next to its registered buffer is checked untouched.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use aiv_transport::{EngineConfig, Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState};
use proptest::prelude::*;

/// Registered bytes, with an unregistered guard of the same size on each side.
const REGISTERED: usize = 8192;

struct Target {
    engine: TransferEngine,
    memory: Box<[u8]>,
    data_port: u16,
}

impl Target {
    fn registered_addr(&self) -> u64 {
        self.memory.as_ptr() as u64 + REGISTERED as u64
    }

    fn guards(&self) -> Vec<u8> {
        let read = |range: std::ops::Range<usize>| -> Vec<u8> {
            // SAFETY: reads inside our own allocation; volatile, as the engine's server threads may write nearby.
            range.map(|i| unsafe { std::ptr::read_volatile(self.memory.as_ptr().add(i)) }).collect()
        };
        let mut bytes = read(0..REGISTERED);
        bytes.extend(read(2 * REGISTERED..3 * REGISTERED));
        bytes
    }
}

fn target() -> &'static Target {
    static TARGET: std::sync::OnceLock<Target> = std::sync::OnceLock::new();
    TARGET.get_or_init(|| {
        let engine = TransferEngine::new(EngineConfig::new("127.0.0.1")).expect("tcp engine starts");
        let memory: Box<[u8]> = (0..3 * REGISTERED).map(|i| (i % 253) as u8).collect();
        let addr = memory.as_ptr() as u64 + REGISTERED as u64;
        // SAFETY: the memory lives in the same static as the engine, for the rest of the process.
        unsafe { engine.register_memory(addr, REGISTERED as u64, "cpu:0") }.expect("register");
        let data_port =
            engine.segment(SegmentId::LOCAL).expect("local").descriptor.tcp_data_port.expect("tcp data port");
        Target { engine, memory, data_port }
    })
}

fn send(port: u16, bytes: &[u8]) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(3)));
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 16 << 10];
    let started = Instant::now();
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) && started.elapsed() < Duration::from_secs(5) {}
}

/// Bytes for either port: a header-shaped prefix (a size, then an address in the guard before the buffer or in the
/// buffer itself, an opcode byte, padding) and a payload; or noise.
fn hostile_bytes(guard_addr: u64) -> impl Strategy<Value = Vec<u8>> {
    let aimed = (0u64..2 * REGISTERED as u64, 1u64..4096, any::<u8>(), prop::collection::vec(any::<u8>(), 0..512))
        .prop_map(move |(offset, size, opcode, payload)| {
            let mut out = size.to_le_bytes().to_vec();
            out.extend_from_slice(&(guard_addr + offset).to_le_bytes());
            out.push(opcode);
            out.extend_from_slice(&[0; 7]);
            out.extend_from_slice(&payload);
            out
        });
    // Across the buffer's start or end, with the whole payload the header promises.
    let r = REGISTERED as u64;
    let across =
        (prop_oneof![Just(r), Just(2 * r)], 0u64..128, 0u64..96, prop_oneof![Just(0x01u8), Just(0x81), any::<u8>()])
            .prop_map(move |(edge, before, over, opcode)| {
                let size = before + over;
                let mut out = size.to_le_bytes().to_vec();
                out.extend_from_slice(&(guard_addr + edge - before).to_le_bytes());
                out.push(opcode);
                out.extend_from_slice(&[0; 7]);
                out.extend(std::iter::repeat_n(0xEE, size as usize));
                out
            });
    prop_oneof![2 => aimed, 2 => across, 1 => prop::collection::vec(any::<u8>(), 0..256)]
}

proptest! {
    #![proptest_config(crate::fuzz_config(96))]

    /// The same hostile bytes on the RPC port and the data port, concurrently: the guards around the registered
    /// buffer never change, and another engine's write and read through the tcp transport still complete.
    #[test]
    fn an_engine_under_fuzz_on_both_ports_keeps_its_neighbours_and_serves(
        aimed in hostile_bytes(target().memory.as_ptr() as u64),
    ) {
        let target = target();
        let guard = target.guards();
        let rpc_port = target.engine.rpc_port();
        let data_port = target.data_port;
        let other = aimed.clone();
        let rpc = std::thread::spawn(move || send(rpc_port, &other));
        send(data_port, &aimed);
        rpc.join().expect("rpc sender");
        prop_assert!(target.guards() == guard, "memory next to the registered buffer changed");
    }
}

#[test]
fn after_the_fuzz_a_real_transfer_completes() {
    let target = target();
    let guard = target.guards();
    let initiator = TransferEngine::new(EngineConfig::new("127.0.0.1")).expect("initiator");
    let mut local = vec![0x5Au8; 4096];
    let addr = local.as_mut_ptr() as u64;
    // SAFETY: `local` outlives the initiator (dropped first below).
    unsafe { initiator.register_memory(addr, 4096, "cpu:0") }.expect("register");
    let segment = initiator.open_segment(target.engine.name()).expect("open the fuzzed engine");
    let request = TransferRequest {
        opcode: Opcode::Write,
        source: addr,
        target_id: segment,
        target_offset: target.registered_addr() + 1024,
        length: 4096,
        protocol: Some(Protocol::Tcp),
    };
    let batch = initiator.allocate_batch(1).expect("batch");
    initiator.submit_transfer(batch, &[request]).expect("submit");
    let _ = initiator.wait_batch(batch);
    assert_eq!(initiator.transfer_status(batch, 0).expect("status").state, TransferState::Completed);
    initiator.free_batch(batch).expect("free");
    drop(initiator);
    drop(local);
    assert_eq!(target.guards(), guard);
}

/// A tcp engine named after its RPC port, which is `rpc_port` when given, with `length` zeroed bytes registered.
fn tcp_target(rpc_port: Option<u16>, length: usize) -> (TransferEngine, Box<[u8]>) {
    let mut options = aiv_transport::metadata::MetadataOptions::default();
    if let Some(port) = rpc_port {
        options.rpc_ports = port..=port;
    }
    let engine = TransferEngine::with_metadata_options(EngineConfig::new("127.0.0.1"), &options).expect("target");
    let memory: Box<[u8]> = vec![0u8; length].into_boxed_slice();
    // SAFETY: the caller keeps the memory alive until after the engine is dropped.
    unsafe { engine.register_memory(memory.as_ptr() as u64, length as u64, "cpu:0") }.expect("register");
    (engine, memory)
}

/// The bench initiator (`aiv bench --mode initiator --segment_id ...`, tcp) follows a target that restarts on the
/// same RPC port with another data port and another buffer: its later batches land in the new target's buffer.
#[test]
fn the_bench_initiator_follows_a_target_restarted_on_its_rpc_port() {
    const LENGTH: usize = 64 << 10;
    let (first, first_memory) = tcp_target(None, LENGTH);
    let (rpc_port, name) = (first.rpc_port(), first.name().to_owned());
    let initiator = TransferEngine::new(EngineConfig::new("127.0.0.1")).expect("initiator");
    let params = aiv_transport::bench::BenchParams {
        operation: Opcode::Write,
        protocol: Protocol::Tcp,
        buffer_size: LENGTH as u64,
        batch_size: 1,
        block_size: 4096,
        duration: Duration::from_millis(1600),
        threads: 1,
        report_unit: "GB".parse().expect("unit"),
        report_precision: 2,
    };
    std::thread::scope(|scope| {
        let run = scope.spawn(|| aiv_transport::bench::run_against_segment(&initiator, &params, &name));
        std::thread::sleep(Duration::from_millis(400));
        drop(first);
        drop(first_memory);
        let (second, second_memory) = tcp_target(Some(rpc_port), LENGTH);
        assert_eq!(second.name(), name, "the new target has the old one's name");
        let restarted = Instant::now();
        // SAFETY: reads our own live allocation; volatile, as the engine's server threads write it.
        let written = || unsafe { std::ptr::read_volatile(second_memory.as_ptr()) } == 0xA5;
        while !written() && restarted.elapsed() < Duration::from_millis(1500) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let recovered = restarted.elapsed();
        let report = run.join().expect("the bench thread").expect("the bench run");
        eprintln!(
            "bench across a target restart: {} batches completed, {} failed, first batch into the new target \
             {recovered:?} after it registered",
            report.outcome.completed_batches, report.outcome.failed_batches
        );
        assert!(written(), "no batch reached the restarted target ({:?})", report.outcome.first_failure);
        drop(second);
        drop(second_memory);
    });
}

/// Kills and reaps a child process when dropped (also when the test fails).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The bench initiator against an `aiv bench --mode target` process that is SIGSTOPped mid-run: no batch hangs past
/// the transfer timeout (1 s here); the run ends with the failed batches counted and the cause named, within the
/// run's duration plus one transfer timeout and one metadata deadline.
#[test]
fn the_bench_initiator_reports_a_stopped_target_as_timed_out_with_the_cause() {
    use std::io::BufRead;
    let mut target = Reaped(
        std::process::Command::new(env!("CARGO_BIN_EXE_aiv"))
            .args(["bench", "--mode", "target", "--protocol", "tcp", "--buffer_size", "1mb", "--duration", "30"])
            .args(["--metadata_server", "P2PHANDSHAKE", "--local_server_name", "127.0.0.1"])
            .env_remove("MOONCAKE_CONFIG_PATH")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("aiv runs"),
    );
    let stdout = target.0.stdout.take().expect("stdout");
    let (lines, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let line = ready.recv_timeout(Duration::from_secs(20)).expect("the target's ready line");
    let name = line.split_whitespace().nth(4).expect("aiv bench target: segment NAME ...").to_owned();
    let mut config = EngineConfig::new("127.0.0.1");
    config.aiv.transfer_timeout = Duration::from_secs(1);
    config.aiv.metadata_deadline = Some(Duration::from_millis(500));
    let initiator = TransferEngine::new(config).expect("initiator");
    let params = aiv_transport::bench::BenchParams {
        operation: Opcode::Write,
        protocol: Protocol::Tcp,
        buffer_size: 64 << 10,
        batch_size: 1,
        block_size: 4096,
        duration: Duration::from_millis(1200),
        threads: 1,
        report_unit: "GB".parse().expect("unit"),
        report_precision: 2,
    };
    let started = Instant::now();
    let report = std::thread::scope(|scope| {
        let run = scope.spawn(|| aiv_transport::bench::run_against_segment(&initiator, &params, &name));
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(target.0.id() as libc::pid_t, libc::SIGSTOP) }, 0, "SIGSTOP");
        run.join().expect("the bench thread").expect("the bench run")
    });
    // The run's duration, then the memcpy reference (as long, at most 2 s); the stall adds at most one transfer
    // timeout and one metadata deadline.
    let took = started.elapsed();
    let outcome = &report.outcome;
    eprintln!(
        "bench against a stopped target: {} completed, {} failed in {took:?}; first failure: {:?}",
        outcome.completed_batches, outcome.failed_batches, outcome.first_failure
    );
    assert!(outcome.completed_batches > 0 && outcome.failed_batches > 0, "completed before the stop, failed after");
    let cause = outcome.first_failure.as_deref().unwrap_or("");
    assert!(
        cause.contains("timed out") && cause.contains(&name) && cause.contains("1000 ms"),
        "the failure names the timeout and the peer: {cause:?}"
    );
    assert!(took < Duration::from_millis(2 * 1200 + 1000 + 500 + 1500), "the run took {took:?}");
}
