//! Helpers shared by the aiv twin end-to-end tests (included with `#[path]`, not a test target of its own).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use aiv_transport::config::{AivOptions, LaunchMode};
use aiv_transport::device::DeviceBuffer;
use aiv_transport::engine::AivDevice;
use aiv_transport::{EngineConfig, Opcode, Protocol, TransferEngine, TransferRequest};

#[path = "lease.rs"]
mod lease;
pub use lease::DeviceLease;

/// One engine with its twin device and one registered HBM buffer. Fields drop in order: the engine and the device
/// (which releases the twin runtime's device, its SHMEM instance and engines), then the lease on the device id.
#[derive(Debug)]
pub struct Node {
    pub engine: TransferEngine,
    pub device: Arc<AivDevice>,
    pub buffer: DeviceBuffer,
    _lease: DeviceLease,
}

/// Fault-injection and observation controls of a node's device on the twin runtime (`cann_twin::control`).
#[derive(Debug)]
pub struct TwinControls {
    device: i32,
}

impl TwinControls {
    /// Stalls (or releases) SDMA channel `channel` of the device.
    pub fn stall_channel(&self, channel: u32, stalled: bool) {
        cann_twin::control::set_stalled(self.device, channel, stalled).expect("the runtime's channel");
    }
    /// SQEs channel `channel` executed so far.
    pub fn executed_sqes(&self, channel: u32) -> u64 {
        cann_twin::control::sqes_executed(self.device, channel).expect("the runtime's channel")
    }
    /// SQEs rung on channel `channel` and not executed yet (its doorbell's tail past its engine's head).
    pub fn rung_sqes(&self, channel: u32) -> u32 {
        let window = cann_twin::control::sq_window(self.device, channel).expect("the runtime's channel");
        (window.tail + window.depth - window.head) % window.depth
    }
    /// Stalls (or releases) every copy stream of the device: queued copies wait, synchronisations time out.
    pub fn stall_streams(&self, stalled: bool) {
        cann_twin::control::hold_device_streams(self.device, stalled);
    }
    /// The next `count` SQEs (or stream copies) of the device fail as if their destination did not translate.
    pub fn fail_next_destinations(&self, count: u32) {
        cann_twin::control::fail_next_destinations(self.device, count);
    }
    /// Test-only mis-wiring: the cores' SQ doorbells on the device's NIC QPs are parked, not applied
    /// (`cann_twin::nic::divert`), until restored.
    pub fn divert_sq_doorbells(&self, diverted: bool) {
        cann_twin::nic::divert::divert_core_sq_doorbells(self.device, diverted);
    }
    /// Rings, as the Host, each QP's last parked SQ doorbell that is newer than `forwarded` (per QPN); returns how
    /// many it rang.
    pub fn forward_sq_doorbells(&self, forwarded: &mut std::collections::HashMap<u32, u32>) -> usize {
        let mut rung = 0;
        for (qpn, count, word) in cann_twin::nic::divert::diverted_sq_doorbells(self.device) {
            if forwarded.insert(qpn, count) != Some(count) {
                cann_twin::nic::divert::host_ring_sq_doorbell(self.device, qpn, word).expect("the Host's ring");
                rung += 1;
            }
        }
        rung
    }
}

impl Node {
    /// The controls for this node's device.
    pub fn twin(&self) -> TwinControls {
        TwinControls { device: self._lease.0 as i32 }
    }

    /// A copy of `range` of the buffer, read through the device (D2H): tests never dereference device memory.
    pub fn read(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        assert!(range.end as u64 <= self.buffer.len(), "{range:?} is outside the buffer");
        let mut out = vec![0u8; range.len()];
        self.device.read(self.buffer.addr() + range.start as u64, &mut out).expect("D2H copy");
        out
    }

    /// A copy of the whole buffer.
    pub fn bytes(&self) -> Vec<u8> {
        self.read(0..self.buffer.len() as usize)
    }

    /// Writes `data` at `offset` of the buffer through the device (H2D).
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.device.write(self.buffer.addr() + offset as u64, data).expect("H2D copy");
    }

    /// Reads the whole buffer, lets `change` edit the copy, and writes it back (only while no transfer on the buffer
    /// is in flight).
    pub fn modify(&mut self, change: impl FnOnce(&mut [u8])) {
        let mut bytes = self.bytes();
        change(&mut bytes);
        self.write(0, &bytes);
    }
}

pub fn options(device_id: u32, mode: LaunchMode, doorbell_batch: u32) -> AivOptions {
    AivOptions {
        device_id,
        aiv_blocks: 2,
        doorbell_batch,
        launch_mode: mode,
        transfer_timeout: Duration::from_secs(10),
        kernel_wait_budget: Duration::from_millis(300),
        request_ring_depth: 128,
        sq_depth: 64,
        hbm_size: 64 << 20,
        ..AivOptions::default()
    }
}

/// Starts an engine on a fresh twin device with `buffer_len` bytes of registered HBM.
pub fn node(options: AivOptions, buffer_len: u64) -> Node {
    // The device id the test asked for only tells its devices apart; each node takes a free one of this process.
    let lease = DeviceLease::acquire();
    // P2P handshake names the engine `127.0.0.1:<its rpc port>`: unique without help, found through the real handshake.
    let mut config = EngineConfig::new("127.0.0.1");
    config.protocol = Protocol::Aiv;
    config.aiv = AivOptions { device_id: lease.0, ..options };
    let engine = TransferEngine::new(config).expect("engine starts");
    let device = engine.device().expect("twin device opens");
    let buffer = device.allocate(buffer_len).expect("HBM allocation");
    // SAFETY: the buffer lives in the returned Node next to the engine; transfers finish before it drops (tests wait
    // for every batch).
    unsafe { engine.register_memory(buffer.addr(), buffer.len(), &device.location()) }.expect("register HBM");
    Node { engine, device, buffer, _lease: lease }
}

/// `count` WRITEs of `length` bytes from `from`'s buffer to the same offsets of `to`'s buffer, one after the other
/// (opens `to`'s segment on `from`).
pub fn writes(from: &Node, to: &Node, count: u64, length: u64) -> Vec<TransferRequest> {
    let peer = from.engine.open_segment(to.engine.name()).expect("peer segment");
    (0..count)
        .map(|i| TransferRequest {
            opcode: Opcode::Write,
            source: from.buffer.addr() + i * length,
            target_id: peer,
            target_offset: to.buffer.addr() + i * length,
            length,
            protocol: None,
        })
        .collect()
}

/// Polls `check` (every millisecond) until it returns `Ok`; past `within`, panics with its last `Err`, which says what
/// has not happened. For tests that wait for a state of the engine or the twin instead of sleeping for a guessed time.
pub fn wait_until(within: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return,
            Err(what) if Instant::now() >= deadline => panic!("not within {within:?}: {what}"),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}
