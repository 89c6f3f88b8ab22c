//! Multi-host tests: engines in network namespaces the tests create themselves (tests/common/netns.rs: one namespace
//! per host, veth pairs to a bridge in a switch namespace, a private /24), so metadata and data cross a real (virtual)
//! link between hosts. The tcp path under the P2P handshake and under etcd running in a third host; a target host
//! whose link goes down (its pending transfers fail within the transfer timeout, another target's keep completing,
//! and after the link is back transfers to it complete again); a target process SIGKILLed with transfers pending;
//! one initiator interleaving batches to two targets. Every engine is a child process in its host: this test binary
//! re-executed as a role (`role_child`, driven by `AIV_MH_ROLE`), talking to the test over stdin and stdout lines
//! that start with `MH `; every read from a child is bounded. Skipped (a `SKIPPED: <test>: <reason>` line,
//! tests/common/skip.rs) where namespaces cannot be created, failing instead under `CI=true`. docs/multihost.md.

use std::io::BufRead;
use std::time::{Duration, Instant};

use std::sync::Arc;

use aiv_transport::bench::target_pattern;
use aiv_transport::config::RouteMode;
use aiv_transport::device::DeviceBuffer;
use aiv_transport::engine::AivDevice;
use aiv_transport::{
    BatchId, EngineConfig, Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState,
};
use rand::{Rng, RngCore, SeedableRng};

#[path = "common/netns.rs"]
mod netns;

use netns::{Hosts, NsChild};

/// Bytes each target serves: [0, 4 MiB) keeps `target_pattern` (READs check it), [4, 6) MiB takes `verify`'s
/// WRITEs, [6, 8) MiB the WRITEs of `submit`.
const TARGET_BYTES: u64 = 8 << 20;
const PATTERN_END: u64 = 4 << 20;
const VERIFY_AREA: u64 = 4 << 20;
const SUBMIT_AREA: u64 = 6 << 20;
/// The initiator's registered buffer: [0, 2 MiB) sources and sinks of `verify`'s first batch, [2, 4) MiB its
/// read-backs, [8, 12) MiB the sinks of `submit`'s READs, [12, 16) MiB the sources of its WRITEs (pending batches'
/// data is not checked).
const LOCAL_BYTES: u64 = 16 << 20;
const LOCAL_SUBMIT: u64 = 8 << 20;
/// `verify`'s slot per request: up to 8 requests a batch, each inside its own 256 KiB.
const SLOT: u64 = 256 << 10;
/// The transfer timeout of every engine here: the budget in which a transfer to a lost host must end.
const TRANSFER_TIMEOUT_MS: u64 = 2000;
/// How long the test waits for any one reply of a child (beyond a transfer's budget).
const REPLY: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------------------------
// Roles: this binary re-executed inside a host.

/// The entry point of the child processes (a no-op when run as a test: `AIV_MH_ROLE` is unset).
#[test]
fn role_child() {
    // libtest has printed "test role_child ... " without a newline: the protocol's lines start on lines of their own.
    if std::env::var_os("AIV_MH_ROLE").is_some() {
        println!();
    }
    match std::env::var("AIV_MH_ROLE").as_deref() {
        Ok("target") => target_role(),
        Ok("initiator") => initiator_role(),
        _ => {}
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set for a role"))
}

/// Whether the role runs the aiv protocol (`AIV_MH_PROTOCOL=aiv`: twin device memory on both sides, the RDMA route
/// between hosts) or tcp (Host memory).
fn aiv_role() -> bool {
    std::env::var("AIV_MH_PROTOCOL").as_deref() == Ok("aiv")
}

fn engine_config(name: &str) -> EngineConfig {
    let mut config = EngineConfig::new(name);
    config.metadata_server = env("AIV_MH_METADATA");
    config.aiv.transfer_timeout = Duration::from_millis(TRANSFER_TIMEOUT_MS);
    config.aiv.tcp_connect_timeout = Duration::from_millis(1000);
    config.aiv.tcp_reconnect_backoff_max = Duration::from_millis(200);
    if aiv_role() {
        config.protocol = Protocol::Aiv;
        // Each host is its own process with its own twin device 0; the route is chosen by where the peer is (each
        // namespace is another host identity): "auto" must pick RDMA here.
        config.aiv.route = RouteMode::Auto;
        config.aiv.hbm_size = 64 << 20;
        config.aiv.rdma_sq_depth = 64;
    }
    config
}

/// A role's registered memory: a Host vector (tcp) or twin HBM (aiv), reached only through the device's copies.
enum Memory {
    Host(Vec<u8>),
    Device { device: Arc<AivDevice>, buffer: DeviceBuffer },
}

impl Memory {
    /// `len` bytes for `engine`'s protocol, filled by `fill(offset)`; registered with the engine.
    fn new(engine: &TransferEngine, len: u64, fill: impl Fn(u64) -> u8) -> Result<Memory, String> {
        let memory = if aiv_role() {
            let device = engine.device().map_err(|e| format!("device: {e}"))?;
            let buffer = device.allocate(len).map_err(|e| format!("HBM: {e}"))?;
            let bytes: Vec<u8> = (0..len).map(&fill).collect();
            device.write(buffer.addr(), &bytes).map_err(|e| format!("H2D: {e}"))?;
            Memory::Device { device, buffer }
        } else {
            Memory::Host((0..len).map(&fill).collect())
        };
        let location = match &memory {
            Memory::Host(_) => "cpu:0".to_owned(),
            Memory::Device { device, .. } => device.location(),
        };
        // SAFETY: the memory lives in the role next to the engine and is unregistered before it drops; while
        // transfers run, the role touches it only between batches.
        unsafe { engine.register_memory(memory.addr(), len, &location) }.map_err(|e| format!("register: {e}"))?;
        Ok(memory)
    }

    fn addr(&self) -> u64 {
        match self {
            Memory::Host(bytes) => bytes.as_ptr() as u64,
            Memory::Device { buffer, .. } => buffer.addr(),
        }
    }

    fn read(&self, offset: u64, len: u64) -> Vec<u8> {
        match self {
            Memory::Host(bytes) => bytes[offset as usize..(offset + len) as usize].to_vec(),
            Memory::Device { device, buffer } => {
                let mut out = vec![0u8; len as usize];
                device.read(buffer.addr() + offset, &mut out).expect("D2H copy");
                out
            }
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        match self {
            Memory::Host(bytes) => bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data),
            Memory::Device { device, buffer } => device.write(buffer.addr() + offset, data).expect("H2D copy"),
        }
    }
}

/// Where a descriptor says its data path is reached, `("-", 0)` if nowhere: the tcp data server, or for aiv the
/// twin NIC its `aiv.rdma` object advertises.
fn data_endpoint(descriptor: &aiv_transport::transfer::SegmentDescriptor) -> (String, u16) {
    let nic = descriptor.aiv.as_ref().and_then(|aiv| aiv.pointer("/rdma/nic")).and_then(|nic| nic.as_str());
    match (aiv_role(), nic.and_then(|nic| nic.parse::<std::net::SocketAddr>().ok())) {
        (true, Some(nic)) => (nic.ip().to_string(), nic.port()),
        (true, None) => ("-".into(), 0),
        (false, _) => {
            (descriptor.tcp_data_host.clone().unwrap_or_else(|| "-".into()), descriptor.tcp_data_port.unwrap_or(0))
        }
    }
}

/// Lines read from stdin until it closes (the test closes it, or dies).
fn commands() -> impl Iterator<Item = String> {
    std::io::stdin().lock().lines().map_while(Result::ok)
}

/// A target: an engine named `AIV_MH_NAME` serving `TARGET_BYTES` filled with `target_pattern` over tcp; prints
/// `MH ready <segment> <addr> <tcp_data_host> <tcp_data_port>` and serves until stdin closes.
fn target_role() {
    let engine = match TransferEngine::new(engine_config(&env("AIV_MH_NAME"))) {
        Ok(engine) => engine,
        Err(error) => {
            println!("MH error engine: {error}");
            return;
        }
    };
    let buffer = match Memory::new(&engine, TARGET_BYTES, target_pattern) {
        Ok(buffer) => buffer,
        Err(error) => {
            println!("MH error {error}");
            return;
        }
    };
    let addr = buffer.addr();
    let (host, port) = data_endpoint(&engine.local_descriptor());
    println!("MH ready {} {addr:#x} {host} {port}", engine.name());
    for _ in commands() {}
    let _ = engine.unregister_memory(addr);
    drop(engine);
    drop(buffer);
}

/// A segment the initiator opened: its id, its first buffer.
struct Remote {
    segment: SegmentId,
    base: u64,
}

/// A batch submitted and not yet waited for.
struct Pending {
    batch: BatchId,
    submitted: Instant,
    count: usize,
}

/// The initiator's state between commands.
struct Initiator {
    engine: TransferEngine,
    local: Memory,
    remotes: Vec<Remote>,
    pending: Vec<Option<Pending>>,
}

impl Initiator {
    fn addr(&self) -> u64 {
        self.local.addr()
    }

    fn request(&self, opcode: Opcode, local: u64, target: usize, offset: u64, length: u64) -> TransferRequest {
        let remote = &self.remotes[target];
        TransferRequest {
            opcode,
            source: self.addr() + local,
            target_id: remote.segment,
            target_offset: remote.base + offset,
            length,
            protocol: None,
        }
    }

    /// Runs one batch to its end; `Err` names the first task that did not complete.
    fn run(&self, requests: &[TransferRequest]) -> Result<(), String> {
        let engine = &self.engine;
        let batch = engine.allocate_batch(requests.len()).map_err(|e| format!("allocate: {e}"))?;
        let outcome = engine
            .submit_transfer(batch, requests)
            .map_err(|e| format!("submit: {e}"))
            .and_then(|()| engine.wait_batch(batch).map_err(|e| format!("wait: {e}")))
            .and_then(|_| {
                for task in 0..requests.len() {
                    let state = engine.transfer_status(batch, task).map_err(|e| e.to_string())?.state;
                    if state != TransferState::Completed {
                        let reason = engine.task_reason(batch, task).ok().flatten().unwrap_or_default();
                        return Err(format!("task {task}: {state:?}: {reason}"));
                    }
                }
                Ok(())
            });
        let _ = engine.free_batch(batch);
        outcome
    }

    fn open(&mut self, name: &str) -> Result<String, String> {
        let segment = self.engine.open_segment(name).map_err(|e| format!("open {name}: {e}"))?;
        let opened = self.engine.segment(segment).map_err(|e| e.to_string())?;
        let descriptor = &opened.descriptor;
        let base = descriptor.buffers.first().map(|b| b.addr).ok_or("no buffer")?;
        self.remotes.push(Remote { segment, base });
        let (host, port) = data_endpoint(descriptor);
        Ok(format!("{} {host} {port}", self.remotes.len() - 1))
    }

    /// `rounds` rounds over `targets`: a batch of 2..=8 requests, each to a random one of them, READs of random
    /// pattern ranges and WRITEs of random bytes at random offsets of the verify area; then a batch READing the
    /// written ranges back; every byte checked.
    fn verify(&mut self, rounds: u64, seed: u64, targets: &[usize]) -> Result<u64, String> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut bytes = 0u64;
        for round in 0..rounds {
            let count = rng.gen_range(2..=8usize);
            let mut first = Vec::new();
            let mut reads = Vec::new(); // (slot, target, remote offset, length)
            let mut writes = Vec::new(); // (slot, target, remote offset, bytes)
            for slot in 0..count {
                let target = targets[rng.gen_range(0..targets.len())];
                let length = rng.gen_range(1..=SLOT / 2);
                let local = slot as u64 * SLOT;
                if rng.gen_bool(0.5) {
                    let offset = rng.gen_range(0..PATTERN_END - length);
                    first.push(self.request(Opcode::Read, local, target, offset, length));
                    reads.push((slot, target, offset, length));
                } else {
                    let offset = VERIFY_AREA + slot as u64 * SLOT + rng.gen_range(0..SLOT - length);
                    let mut data = vec![0u8; length as usize];
                    rng.fill_bytes(&mut data);
                    self.local.write(local, &data);
                    first.push(self.request(Opcode::Write, local, target, offset, length));
                    writes.push((slot, target, offset, data));
                }
                bytes += length;
            }
            self.run(&first).map_err(|e| format!("round {round}: {e}"))?;
            for &(slot, target, offset, length) in &reads {
                let got = self.local.read(slot as u64 * SLOT, length);
                if let Some(i) = (0..got.len()).find(|&i| got[i] != target_pattern(offset + i as u64)) {
                    return Err(format!("round {round}: READ of target {target} at {offset}: byte {i} differs"));
                }
            }
            let backs: Vec<TransferRequest> = writes
                .iter()
                .map(|(slot, target, offset, data)| {
                    self.request(Opcode::Read, (2 << 20) + *slot as u64 * SLOT, *target, *offset, data.len() as u64)
                })
                .collect();
            if !backs.is_empty() {
                self.run(&backs).map_err(|e| format!("round {round} read-back: {e}"))?;
            }
            for (slot, target, offset, data) in &writes {
                let local = (2 << 20) + *slot as u64 * SLOT;
                if self.local.read(local, data.len() as u64) != data[..] {
                    return Err(format!("round {round}: WRITE to target {target} at {offset} read back differs"));
                }
            }
        }
        Ok(bytes)
    }

    /// Submits `count` transfers of `length` bytes to `target` without waiting: READs of the pattern area or
    /// WRITEs into the submit area.
    fn submit(&mut self, target: usize, opcode: Opcode, count: u64, length: u64) -> Result<usize, String> {
        let area = if opcode == Opcode::Read { 0 } else { SUBMIT_AREA };
        let room = if opcode == Opcode::Read { PATTERN_END } else { TARGET_BYTES - SUBMIT_AREA };
        let local = if opcode == Opcode::Read { LOCAL_SUBMIT } else { LOCAL_SUBMIT + (4 << 20) };
        if count.checked_mul(length).is_none_or(|bytes| bytes > room.min(4 << 20)) {
            return Err("too many bytes for the submit areas".into());
        }
        let requests: Vec<TransferRequest> =
            (0..count).map(|i| self.request(opcode, local + i * length, target, area + i * length, length)).collect();
        let batch = self.engine.allocate_batch(requests.len()).map_err(|e| format!("allocate: {e}"))?;
        let submitted = Instant::now();
        self.engine.submit_transfer(batch, &requests).map_err(|e| format!("submit: {e}"))?;
        self.pending.push(Some(Pending { batch, submitted, count: requests.len() }));
        Ok(self.pending.len() - 1)
    }

    /// `<pending> <completed> <failed> <timeout>` of a submitted batch.
    fn status(&self, index: usize) -> Result<String, String> {
        let pending = self.pending.get(index).and_then(Option::as_ref).ok_or("no such batch")?;
        let mut counts = [0usize; 4];
        for task in 0..pending.count {
            let state = self.engine.transfer_status(pending.batch, task).map_err(|e| e.to_string())?.state;
            counts[match state {
                TransferState::Completed => 1,
                TransferState::Failed => 2,
                TransferState::Timeout => 3,
                _ => 0,
            }] += 1;
        }
        Ok(format!("{} {} {} {}", counts[0], counts[1], counts[2], counts[3]))
    }

    /// Waits for a submitted batch: `<ms since submit> <pending> <completed> <failed> <timeout> <first reason>`.
    fn wait(&mut self, index: usize) -> Result<String, String> {
        let pending = self.pending.get(index).and_then(Option::as_ref).ok_or("no such batch")?;
        self.engine.wait_batch(pending.batch).map_err(|e| format!("wait: {e}"))?;
        let elapsed = pending.submitted.elapsed().as_millis();
        let reason = (0..pending.count)
            .find_map(|task| self.engine.task_reason(pending.batch, task).ok().flatten())
            .unwrap_or_else(|| "-".into());
        let counts = self.status(index)?;
        if let Some(done) = self.pending[index].take() {
            let _ = self.engine.free_batch(done.batch);
        }
        Ok(format!("{elapsed} {counts} {}", reason.replace('\n', " ")))
    }

    fn command(&mut self, line: &str) -> Result<String, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| -> Result<u64, String> {
            words.get(i).ok_or(format!("{line}: argument {i} missing"))?.parse().map_err(|e| format!("{line}: {e}"))
        };
        match words.first().copied() {
            Some("open") => self.open(words.get(1).ok_or("open NAME")?),
            Some("verify") => {
                let targets: Result<Vec<usize>, String> =
                    (3..words.len()).map(|i| number(i).map(|n| n as usize)).collect();
                let targets = targets?;
                if targets.is_empty() || targets.iter().any(|&t| t >= self.remotes.len()) {
                    return Err(format!("{line}: bad targets"));
                }
                let started = Instant::now();
                let bytes = self.verify(number(1)?, number(2)?, &targets)?;
                Ok(format!("{bytes} {}", started.elapsed().as_millis()))
            }
            Some("submit") => {
                let opcode = if words.get(2) == Some(&"write") { Opcode::Write } else { Opcode::Read };
                let target = number(1)? as usize;
                if target >= self.remotes.len() {
                    return Err(format!("{line}: no target {target}"));
                }
                self.submit(target, opcode, number(3)?, number(4)?).map(|index| index.to_string())
            }
            Some("status") => self.status(number(1)? as usize),
            Some("wait") => self.wait(number(1)? as usize),
            _ => Err(format!("unknown command {line:?}")),
        }
    }
}

/// The initiator: an engine named `AIV_MH_NAME` with `LOCAL_BYTES` registered; runs one command per stdin line and
/// answers each with `MH ok <result>` or `MH error <reason>` (see `Initiator::command`).
fn initiator_role() {
    let engine = match TransferEngine::new(engine_config(&env("AIV_MH_NAME"))) {
        Ok(engine) => engine,
        Err(error) => {
            println!("MH error engine: {error}");
            return;
        }
    };
    let local = match Memory::new(&engine, LOCAL_BYTES, |_| 0) {
        Ok(local) => local,
        Err(error) => {
            println!("MH error {error}");
            return;
        }
    };
    let mut initiator = Initiator { engine, local, remotes: Vec::new(), pending: Vec::new() };
    println!("MH ready {}", initiator.engine.name());
    for line in commands() {
        match initiator.command(&line) {
            Ok(result) => println!("MH ok {result}"),
            Err(reason) => println!("MH error {}", reason.replace('\n', " ")),
        }
    }
    for index in 0..initiator.pending.len() {
        if initiator.pending[index].is_some() {
            let _ = initiator.wait(index);
        }
    }
    let addr = initiator.addr();
    let _ = initiator.engine.unregister_memory(addr);
}

// ---------------------------------------------------------------------------------------------------------------
// The test side.

/// Starts a role in host `host` of `hosts`, named `name`, under `metadata`.
/// The protocol a test's roles run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Tcp,
    Aiv,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Aiv => "aiv",
        }
    }
}

fn spawn_role(hosts: &Hosts, host: usize, role: &str, name: &str, metadata: &str, proto: Proto) -> NsChild {
    let exe = std::env::current_exe().expect("the test binary");
    let exe = exe.to_str().expect("a UTF-8 path");
    let mut command = hosts.command(host, exe, &["--exact", "role_child", "--nocapture", "--test-threads", "1"]);
    command
        .env("AIV_MH_ROLE", role)
        .env("AIV_MH_NAME", name)
        .env("AIV_MH_METADATA", metadata)
        .env("AIV_MH_PROTOCOL", proto.name())
        .env("RUST_BACKTRACE", "1")
        .env_remove("MOONCAKE_CONFIG_PATH")
        .env_remove("MOONCAKE_LOCAL_HOSTNAME")
        .env_remove("MC_TCP_BIND_ADDRESS")
        .env_remove("MC_TRANSFER_TIMEOUT")
        .env_remove("MC_METADATA_CLUSTER_ID")
        .env_remove("AIV_TCP_LANES");
    hosts.spawn(&format!("{role}@h{host}"), command)
}

/// A target process and what its ready line said.
struct Target {
    child: NsChild,
    segment: String,
    data_host: String,
}

fn start_target(hosts: &Hosts, host: usize, name: &str, metadata: &str, proto: Proto) -> Target {
    let mut child = spawn_role(hosts, host, "target", name, metadata, proto);
    let line = child.expect_line("MH ", REPLY).unwrap_or_else(|e| panic!("target in h{host}: {e}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert!(words.len() == 6 && words[1] == "ready", "target in h{host}: {line}");
    let target = Target { child, segment: words[2].to_owned(), data_host: words[4].to_owned() };
    // What the engine publishes must be the host's own address, reachable from the other hosts.
    assert_eq!(target.data_host, hosts.addr(host), "tcp_data_host of the target in h{host}: {line}");
    assert!(target.segment.starts_with(&format!("{}:", hosts.addr(host))), "segment name: {line}");
    target
}

/// The initiator process, driven by commands.
struct Driver {
    child: NsChild,
}

impl Driver {
    fn start(hosts: &Hosts, host: usize, name: &str, metadata: &str, proto: Proto) -> Driver {
        let mut child = spawn_role(hosts, host, "initiator", name, metadata, proto);
        let line = child.expect_line("MH ", REPLY).unwrap_or_else(|e| panic!("initiator in h{host}: {e}"));
        assert!(line.starts_with("MH ready "), "initiator in h{host}: {line}");
        Driver { child }
    }

    /// Sends a command; its `MH ok` result or `Err` with the reason (`MH error`).
    fn try_call(&mut self, command: &str) -> Result<String, String> {
        self.child.send(command);
        let line = self.child.expect_line("MH ", REPLY).unwrap_or_else(|e| panic!("{command}: {e}"));
        match line.strip_prefix("MH ok ") {
            Some(result) => Ok(result.to_owned()),
            None => Err(line.trim_start_matches("MH error ").to_owned()),
        }
    }

    fn call(&mut self, command: &str) -> String {
        self.try_call(command).unwrap_or_else(|reason| panic!("{command}: {reason}"))
    }

    /// Opens `target`'s segment; its index. Checks the descriptor the initiator fetched names the target's host.
    fn open(&mut self, target: &Target) -> usize {
        let reply = self.call(&format!("open {}", target.segment));
        let words: Vec<&str> = reply.split_whitespace().collect();
        assert_eq!(words.get(1).copied(), Some(target.data_host.as_str()), "fetched tcp_data_host: {reply}");
        words[0].parse().expect("an index")
    }

    /// Runs `verify`; the bytes moved.
    fn verify(&mut self, rounds: u64, seed: u64, targets: &[usize]) -> u64 {
        let list: Vec<String> = targets.iter().map(usize::to_string).collect();
        let reply = self.call(&format!("verify {rounds} {seed} {}", list.join(" ")));
        reply.split_whitespace().next().and_then(|b| b.parse().ok()).expect("bytes")
    }

    /// `[pending, completed, failed, timeout]` of a submitted batch.
    fn status(&mut self, batch: &str) -> [usize; 4] {
        let reply = self.call(&format!("status {batch}"));
        let n: Vec<usize> = reply.split_whitespace().map(|w| w.parse().expect("a count")).collect();
        [n[0], n[1], n[2], n[3]]
    }

    /// Waits for a submitted batch: (ms since its submit, `[pending, completed, failed, timeout]`, first reason).
    fn wait(&mut self, batch: &str) -> (u64, [usize; 4], String) {
        let reply = self.call(&format!("wait {batch}"));
        let mut words = reply.splitn(6, ' ');
        let mut next = || words.next().unwrap_or_default().to_owned();
        let ms = next().parse().expect("ms");
        let counts = [0; 4].map(|_| next().parse().expect("a count"));
        (ms, counts, next())
    }
}

/// Seeds differ per run, printed so a failure can be replayed.
fn seed() -> u64 {
    let seed = rand::thread_rng().gen();
    eprintln!("seed {seed}");
    seed
}

/// The budget a transfer to a lost host must end within: the transfer timeout plus scheduling slack on a loaded
/// 2-core machine.
fn budget() -> Duration {
    Duration::from_millis(TRANSFER_TIMEOUT_MS + 1500)
}

fn two_hosts_under_the_p2p_handshake(proto: Proto) {
    let Some(hosts) = Hosts::create(2) else { return };
    let target = start_target(&hosts, 1, hosts.addr(1), "P2PHANDSHAKE", proto);
    let mut initiator = Driver::start(&hosts, 0, hosts.addr(0), "P2PHANDSHAKE", proto);
    let t = initiator.open(&target);
    let bytes = initiator.verify(24, seed(), &[t]);
    assert!(bytes > 0);
}

/// A private etcd in a host: the process, then its data dir (fields drop in order: the process is killed first).
struct Etcd {
    _child: NsChild,
    _dir: tempfile::TempDir,
    url: String,
}

/// Starts a private etcd in host `host` on its address (client port 2379) with a temporary data dir; `None` (after
/// a `SKIPPED` line) when there is no etcd binary and this is not CI.
fn start_etcd(hosts: &Hosts, host: usize) -> Option<Etcd> {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join("etcd").is_file()))
        .unwrap_or(false);
    if !found {
        netns::skip("no etcd on PATH (tests/support/etcd.sh installs Debian's etcd-server)");
        return None;
    }
    let dir = tempfile::tempdir().expect("a temporary data dir");
    let addr = hosts.addr(host);
    let client = format!("http://{addr}:2379");
    let peer = format!("http://{addr}:2380");
    let data = dir.path().join("data");
    let data = data.to_str().expect("UTF-8");
    let cluster = format!("mh={peer}");
    let command = hosts.command(
        host,
        "etcd",
        &[
            "--name",
            "mh",
            "--data-dir",
            data,
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &cluster,
            "--initial-cluster-state",
            "new",
        ],
    );
    let mut etcd = hosts.spawn(&format!("etcd@h{host}"), command);
    if let Err(reason) = hosts.wait_listening(host, addr, 2379, Duration::from_secs(15)) {
        let status = etcd.wait_exit(Duration::ZERO);
        panic!("etcd in h{host}: {reason} (exited: {status:?})");
    }
    Some(Etcd { _child: etcd, _dir: dir, url: format!("etcd://{addr}:2379") })
}

fn two_hosts_with_etcd_metadata_on_a_third(proto: Proto) {
    let Some(hosts) = Hosts::create(3) else { return };
    let Some(etcd) = start_etcd(&hosts, 2) else { return };
    let url = etcd.url.clone();
    // With a store the segment is named as given (host:port), not after the RPC port.
    let target = start_target(&hosts, 1, &format!("{}:17001", hosts.addr(1)), &url, proto);
    assert_eq!(target.segment, format!("{}:17001", hosts.addr(1)));
    let mut initiator = Driver::start(&hosts, 0, &format!("{}:17002", hosts.addr(0)), &url, proto);
    let t = initiator.open(&target);
    initiator.verify(16, seed(), &[t]);
}

fn three_hosts_one_initiator_interleaving_batches_to_two_targets(proto: Proto) {
    let Some(hosts) = Hosts::create(3) else {
        return;
    };
    let first = start_target(&hosts, 1, hosts.addr(1), "P2PHANDSHAKE", proto);
    let second = start_target(&hosts, 2, hosts.addr(2), "P2PHANDSHAKE", proto);
    let mut initiator = Driver::start(&hosts, 0, hosts.addr(0), "P2PHANDSHAKE", proto);
    let a = initiator.open(&first);
    let b = initiator.open(&second);
    let seed = seed();
    initiator.verify(30, seed, &[a, b]);
    // Pending batches to both at once, then each waited for.
    let to_a = initiator.call(&format!("submit {a} read 16 {}", 128 << 10));
    let to_b = initiator.call(&format!("submit {b} write 8 {}", 128 << 10));
    let (_, counts, reason) = initiator.wait(&to_a);
    assert_eq!(counts, [0, 16, 0, 0], "{reason}");
    let (_, counts, reason) = initiator.wait(&to_b);
    assert_eq!(counts, [0, 8, 0, 0], "{reason}");
    initiator.verify(10, seed ^ 1, &[b, a]);
}

fn a_target_host_whose_link_goes_down_fails_its_transfers_in_budget_while_another_continues(proto: Proto) {
    let Some(hosts) = Hosts::create(3) else { return };
    let cut = start_target(&hosts, 1, hosts.addr(1), "P2PHANDSHAKE", proto);
    let other = start_target(&hosts, 2, hosts.addr(2), "P2PHANDSHAKE", proto);
    let mut initiator = Driver::start(&hosts, 0, hosts.addr(0), "P2PHANDSHAKE", proto);
    let a = initiator.open(&cut);
    let b = initiator.open(&other);
    let seed = seed();
    initiator.verify(4, seed, &[a, b]);

    // Pending at the moment the link goes down: the target is stopped while the batch is submitted (so nothing of
    // it completes), the link goes down, the target runs again behind a dead link.
    cut.child.stop();
    let before = initiator.call(&format!("submit {a} read 8 {}", 256 << 10));
    std::thread::sleep(Duration::from_millis(100));
    let counts = initiator.status(&before);
    assert_eq!(counts[0], 8, "pending before the link goes down: {counts:?}");
    hosts.link_down(1);
    let down_at = Instant::now();
    cut.child.signal(libc::SIGCONT);
    // Issued during the outage.
    let during = initiator.call(&format!("submit {a} write 4 {}", 64 << 10));
    // The other target keeps completing, data checked.
    initiator.verify(6, seed ^ 2, &[b]);
    for (batch, count) in [(&before, 8usize), (&during, 4)] {
        let (ms, counts, reason) = initiator.wait(batch);
        eprintln!("batch {batch} to the cut host: {counts:?} after {ms} ms: {reason}");
        assert_eq!(counts[0] + counts[1], 0, "nothing completes or stays pending behind a dead link: {counts:?}");
        assert_eq!(counts[2] + counts[3], count, "{counts:?}");
        assert!(Duration::from_millis(ms) <= budget(), "ended {ms} ms after its submit; budget {:?}", budget());
    }
    assert!(down_at.elapsed() <= budget() + Duration::from_secs(2), "{:?}", down_at.elapsed());
    initiator.verify(2, seed ^ 3, &[b]);

    // Link up: transfers to the host complete again (the lanes reconnect), without reopening.
    hosts.link_up(1);
    let up_at = Instant::now();
    let failed = loop {
        match initiator.try_call(&format!("verify 1 {} {a}", seed ^ 4)) {
            Ok(_) => break None,
            Err(reason) if up_at.elapsed() > Duration::from_secs(15) => break Some(reason),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(failed, None, "no transfer to the host completed within 15 s of link up");
    eprintln!("transfers to the host complete again {:?} after link up", up_at.elapsed());
    initiator.verify(6, seed ^ 5, &[a, b]);
}

fn a_killed_target_process_fails_its_pending_transfers_in_budget_while_another_continues(proto: Proto) {
    let Some(hosts) = Hosts::create(3) else { return };
    let mut doomed = start_target(&hosts, 1, hosts.addr(1), "P2PHANDSHAKE", proto);
    let survivor = start_target(&hosts, 2, hosts.addr(2), "P2PHANDSHAKE", proto);
    let mut initiator = Driver::start(&hosts, 0, hosts.addr(0), "P2PHANDSHAKE", proto);
    let a = initiator.open(&doomed);
    let b = initiator.open(&survivor);
    let seed = seed();
    initiator.verify(4, seed, &[a, b]);

    // Stopped, so the transfers stay pending until the kill.
    doomed.child.stop();
    let reads = initiator.call(&format!("submit {a} read 8 {}", 256 << 10));
    let writes = initiator.call(&format!("submit {a} write 8 {}", 256 << 10));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(initiator.status(&reads)[0], 8, "pending before the kill");
    assert_eq!(initiator.status(&writes)[0], 8, "pending before the kill");
    let killed_at = Instant::now();
    doomed.child.kill();
    initiator.verify(4, seed ^ 1, &[b]);
    for (batch, count) in [(&reads, 8usize), (&writes, 8)] {
        let (ms, counts, reason) = initiator.wait(batch);
        eprintln!("batch {batch} to the killed target: {counts:?} after {ms} ms: {reason}");
        assert_eq!(counts[2] + counts[3], count, "every transfer to the killed target fails: {counts:?}: {reason}");
        assert!(reason.starts_with(proto.name()), "{reason}");
    }
    let detected = killed_at.elapsed();
    assert!(detected <= budget(), "pending transfers ended {detected:?} after the kill; budget {:?}", budget());
    // New transfers to it fail too (nothing listens on the host any more), quickly.
    let started = Instant::now();
    let refused = initiator.try_call(&format!("verify 1 {} {a}", seed ^ 2));
    assert!(refused.is_err(), "a transfer to the killed target completed");
    assert!(started.elapsed() <= budget(), "{:?}", started.elapsed());
    initiator.verify(8, seed ^ 3, &[b]);
}

#[test]
fn tcp_between_two_hosts_under_the_p2p_handshake() {
    two_hosts_under_the_p2p_handshake(Proto::Tcp);
}

#[test]
fn aiv_two_hosts_under_the_p2p_handshake() {
    two_hosts_under_the_p2p_handshake(Proto::Aiv);
}

#[test]
fn tcp_between_two_hosts_with_etcd_metadata_on_a_third() {
    two_hosts_with_etcd_metadata_on_a_third(Proto::Tcp);
}

#[test]
fn aiv_two_hosts_with_etcd_metadata_on_a_third() {
    two_hosts_with_etcd_metadata_on_a_third(Proto::Aiv);
}

#[test]
fn tcp_three_hosts_one_initiator_interleaving_batches_to_two_targets() {
    three_hosts_one_initiator_interleaving_batches_to_two_targets(Proto::Tcp);
}

#[test]
fn aiv_three_hosts_one_initiator_interleaving_batches_to_two_targets() {
    three_hosts_one_initiator_interleaving_batches_to_two_targets(Proto::Aiv);
}

#[test]
fn tcp_a_target_host_whose_link_goes_down_fails_its_transfers_in_budget_while_another_continues() {
    a_target_host_whose_link_goes_down_fails_its_transfers_in_budget_while_another_continues(Proto::Tcp);
}

#[test]
fn aiv_a_target_host_whose_link_goes_down_fails_its_transfers_in_budget_while_another_continues() {
    a_target_host_whose_link_goes_down_fails_its_transfers_in_budget_while_another_continues(Proto::Aiv);
}

#[test]
fn tcp_a_killed_target_process_fails_its_pending_transfers_in_budget_while_another_continues() {
    a_killed_target_process_fails_its_pending_transfers_in_budget_while_another_continues(Proto::Tcp);
}

#[test]
fn aiv_a_killed_target_process_fails_its_pending_transfers_in_budget_while_another_continues() {
    a_killed_target_process_fails_its_pending_transfers_in_budget_while_another_continues(Proto::Aiv);
}

/// The harness itself: a test that panics with hosts built and a process running in one of them leaves neither the
/// process nor any namespace behind (the link helpers run on the way).
#[test]
fn the_harness_deletes_its_namespaces_and_kills_its_children_when_a_test_panics() {
    // Created outside the closure, so that a skip's panic under CI=true is not taken for the one on purpose; moved
    // into it, so that the unwinding drops them.
    let Some(hosts) = Hosts::create(2) else { return };
    let created = std::sync::Mutex::new(None);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let hosts = hosts;
        let sleeper = hosts.spawn("sleeper@h1", hosts.command(1, "sleep", &["60"]));
        hosts.link_down(1);
        hosts.link_up(1);
        *created.lock().expect("lock") = Some((hosts.namespaces(), sleeper.pid()));
        panic!("on purpose, with hosts and a child alive");
    }));
    let Some((namespaces, pid)) = created.into_inner().expect("lock") else {
        // It failed before the child was made: that failure is the test's.
        std::panic::resume_unwind(outcome.expect_err("the closure always panics"));
    };
    assert!(outcome.is_err(), "the closure panicked");
    let list = netns::ip(&["netns", "list"]).expect("ip netns list");
    for namespace in &namespaces {
        assert!(!list.lines().any(|line| line.split_whitespace().next() == Some(namespace)), "{namespace} is left");
    }
    // Reaped, not a zombie: no such process any more.
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the child {pid} is left");
}
