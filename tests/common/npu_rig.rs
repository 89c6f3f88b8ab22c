//! The two-process rig of the hardware assumption tests (included with `#[path]`): this process is engine A (SHMEM
//! PE 0, device `AIV_NPU_DEVICE_A`, default 0), a copy of the test binary running the peer test is engine B (PE 1,
//! `AIV_NPU_DEVICE_B`, default 1) with a 16 MiB buffer of a known pattern registered. The same steps as
//! `tests/npu_hardware.rs`, on the vendor's runtime (`cann`) or the twin runtime (`twin`).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use aiv_transport::config::DeviceBackendKind;
use aiv_transport::device::DeviceBuffer;
use aiv_transport::engine::AivDevice;
use aiv_transport::{Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState};

use crate::peer_engine::engine;

/// Bytes of each side's buffer.
pub const BUFFER: u64 = 16 << 20;

/// The pattern seed of the peer's buffer.
pub const PEER_SEED: u8 = 2;

/// The device id in `name`, else `default`.
pub fn device_env(name: &str, default: u32) -> u32 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// Deterministic bytes of `seed` at `offset`.
pub fn pattern(seed: u8, offset: u64, length: u64) -> Vec<u8> {
    (offset..offset + length).map(|i| (i.wrapping_mul(131) as u8) ^ seed.wrapping_mul(29) ^ ((i >> 12) as u8)).collect()
}

/// The peer half: run by the test named by the rig with `AIV_NPU_ROLE=peer`; serves until stdin closes.
pub fn serve_as_peer() {
    let backend = match std::env::var("AIV_NPU_TEST_BACKEND").as_deref() {
        Ok("cann") => DeviceBackendKind::Cann,
        _ => DeviceBackendKind::Twin,
    };
    let engine = engine(backend, device_env("AIV_NPU_DEVICE_B", 1));
    let device = engine.device().expect("PE 1 device");
    let buffer = device.allocate(BUFFER).expect("HBM");
    device.write(buffer.addr(), &pattern(PEER_SEED, 0, BUFFER)).expect("H2D copy");
    // SAFETY: the buffer outlives the engine's use of it: this process waits for the parent before dropping.
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }.expect("register");
    println!("PEER_READY {} {} {}", engine.name(), buffer.addr(), buffer.len());
    std::io::stdout().flush().expect("flush");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop((buffer, device, engine));
}

/// One rig at a time per process: SHMEM takes one PE per process, and the rig sets this process's PE variables.
static ONE_RIG: Mutex<()> = Mutex::new(());

/// For a test with one engine and no peer: holds the rig lock (no rig runs meanwhile) with this process as the only
/// SHMEM PE (`AIV_SHMEM_PE=0`, `AIV_SHMEM_N_PES=1`) until the guard drops.
pub fn one_pe() -> MutexGuard<'static, ()> {
    let one = ONE_RIG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    std::env::set_var("AIV_SHMEM_PE", "0");
    std::env::set_var("AIV_SHMEM_N_PES", "1");
    one
}

pub struct Rig {
    pub backend: DeviceBackendKind,
    pub engine: TransferEngine,
    pub device: Arc<AivDevice>,
    pub buffer: DeviceBuffer,
    pub segment: SegmentId,
    pub peer_addr: u64,
    peer: Child,
    _one: MutexGuard<'static, ()>,
}

impl Rig {
    /// Starts A here and B as `peer_test` of this test binary.
    pub fn start(backend: DeviceBackendKind, peer_test: &str) -> Rig {
        let one = ONE_RIG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::env::set_var("AIV_SHMEM_PE", "0");
        std::env::set_var("AIV_SHMEM_N_PES", "2");
        let engine = engine(backend, device_env("AIV_NPU_DEVICE_A", 0));
        let mut peer = Command::new(std::env::current_exe().expect("test binary"))
            .args([peer_test, "--exact", "--ignored", "--nocapture"])
            .env("AIV_NPU_ROLE", "peer")
            .env("AIV_NPU_TEST_BACKEND", if backend == DeviceBackendKind::Cann { "cann" } else { "twin" })
            .env("AIV_SHMEM_PE", "1")
            .env("AIV_SHMEM_N_PES", "2")
            .env("AIV_SHMEM_ROOT_SEGMENT", engine.name())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the peer process");
        let device = engine.device().expect("PE 0 device (SHMEM bootstrap with PE 1)");
        let buffer = device.allocate(BUFFER).expect("HBM");
        // SAFETY: the buffer outlives every batch of the rig, each waited for.
        unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }.expect("register");
        let mut stdout = BufReader::new(peer.stdout.take().expect("peer stdout"));
        let mut ready = String::new();
        while !ready.starts_with("PEER_READY") {
            ready.clear();
            assert_ne!(stdout.read_line(&mut ready).expect("peer output"), 0, "peer exited before it was ready");
        }
        let fields: Vec<&str> = ready.split_whitespace().collect();
        let peer_addr = fields[2].parse::<u64>().expect("peer address");
        let segment = engine.open_segment(fields[1]).expect("peer segment");
        Rig { backend, engine, device, buffer, segment, peer_addr, peer, _one: one }
    }

    /// The request `opcode` of `length` bytes between local offset `local` and the peer's offset `remote`.
    pub fn request(
        &self,
        opcode: Opcode,
        local: u64,
        remote: u64,
        length: u64,
        protocol: Option<Protocol>,
    ) -> TransferRequest {
        TransferRequest {
            opcode,
            source: self.buffer.addr() + local,
            target_id: self.segment,
            target_offset: self.peer_addr + remote,
            length,
            protocol,
        }
    }

    /// Submits `requests` as one batch and waits: `Err` names the first task that did not complete.
    pub fn run(&self, requests: &[TransferRequest]) -> Result<(), String> {
        let batch = self.engine.allocate_batch(requests.len()).map_err(|e| e.to_string())?;
        let result = self.engine.submit_transfer(batch, requests).map_err(|e| e.to_string()).and_then(|()| {
            self.engine.wait_batch(batch).map_err(|e| e.to_string())?;
            for task in 0..requests.len() {
                let state = self.engine.transfer_status(batch, task).map_err(|e| e.to_string())?.state;
                if state != TransferState::Completed {
                    let reason = self.engine.task_reason(batch, task).map_err(|e| e.to_string())?;
                    return Err(format!("task {task} ended {state:?}: {}", reason.unwrap_or_default()));
                }
            }
            Ok(())
        });
        let _ = self.engine.free_batch(batch);
        result
    }

    pub fn write_local(&self, offset: u64, data: &[u8]) {
        self.device.write(self.buffer.addr() + offset, data).expect("H2D copy");
    }

    pub fn read_local(&self, offset: u64, length: u64) -> Vec<u8> {
        let mut out = vec![0u8; length as usize];
        self.device.read(self.buffer.addr() + offset, &mut out).expect("D2H copy");
        out
    }

    /// Kills the peer process (for the peer-loss test); the rig is then only good for dropping.
    pub fn kill_peer(&mut self) {
        let _ = self.peer.kill();
        let _ = self.peer.wait();
    }

    /// Tears A down and waits (bounded, 120 s) for B to exit.
    pub fn finish(mut self) {
        drop(self.peer.stdin.take());
        let Rig { engine, device, buffer, mut peer, _one, .. } = self;
        drop((buffer, device, engine));
        let deadline = Instant::now() + Duration::from_secs(120);
        while peer.try_wait().expect("peer status").is_none() {
            if Instant::now() > deadline {
                let _ = peer.kill();
                panic!("the peer process did not exit within 120 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
