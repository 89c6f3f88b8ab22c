//! The engine a two-process device test runs in each process (included with `#[path]`): protocol aiv on device
//! `device_id` of `backend`, two persistent blocks, budgets long enough for a loaded 2-core machine.
#![allow(dead_code)]

use std::time::Duration;

use aiv_transport::config::{AivOptions, DeviceBackendKind, LaunchMode};
use aiv_transport::{EngineConfig, Protocol, TransferEngine};

pub fn engine(backend: DeviceBackendKind, device_id: u32) -> TransferEngine {
    let mut config = EngineConfig::new("127.0.0.1");
    config.protocol = Protocol::Aiv;
    config.aiv = AivOptions {
        device_backend: backend,
        device_id,
        aiv_blocks: 2,
        doorbell_batch: 8,
        launch_mode: LaunchMode::Persistent,
        transfer_timeout: Duration::from_secs(30),
        kernel_wait_budget: Duration::from_millis(500),
        hbm_size: 64 << 20,
        ..AivOptions::default()
    };
    TransferEngine::new(config).expect("engine starts")
}
