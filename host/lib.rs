//! aiv-transport: a Mooncake-compatible transfer engine for Ascend NPUs with an AIV direct-drive path.
//!
//! The crate is the Host runtime. Its map (see `docs/ARCHITECTURE.md` for the data flow):
//! - [`config`]: mooncake.json and this project's `"aiv"` options;
//! - [`error`]: the engine's error enum and Mooncake's numeric codes;
//! - [`engine`]: [`TransferEngine`], memory registration, segments, batches and request routing;
//! - [`transport`]: the [`transport::Transport`] trait and the transports behind it (`aiv`, `adxl`, `adxl-fabric`, `ubshmem`, `tcp`,
//!   and the in-process copy);
//! - [`metadata`]: segment descriptors and where they are published (P2P handshake, HTTP, etcd);
//! - [`evidence`]: what every transfer records about who did the work;
//! - [`log_limit`]: rate-limited, aggregated warnings;
//! - [`bounded`]: a program run to its end within a wall-time bound, its process group killed past it;
//! - [`cpu_time`]: Host CPU accounting (section clocks, the thread CPU clock, the carry of uncharged time);
//! - [`occupancy`]: per run, AIV core executing/polling and SDMA busy time (twin) and Host thread CPU by role;
//! - [`bench`](mod@bench): the `aiv bench` workload, shaped like Mooncake's `transfer_engine_bench`;
//! - [`doctor`]: what `aiv doctor` probes;
//! - [`device`]: the device backend behind the device paths (`aiv`, `adxl`, `adxl-fabric`, `ubshmem`): CANN, on the twin runtime
//!   (the default) or the vendor's libraries (feature `cann`);
//! - [`kernel_abi`]: what the Host shares with the AIV transfer kernel (`kernels/`): layouts, ring index rules,
//!   the typed ring views, the chunking rule;
//! - [`transfer`]: the vocabulary every path and the engine share: requests, task slots, failures, completion
//!   waits, segment and buffer descriptors, the bounds rule;
//! - [`trace`]: per-stage traces (Host, AIV blocks, SDMA engines) and their Chrome trace file;
//! - [`audit`]: `aiv audit`, the comparative audit of every path: workloads, rounds, error recovery, the report.

pub mod audit;
pub mod bench;
pub mod bounded;
pub mod config;
pub mod cpu_time;
pub mod device;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod evidence;
pub mod kernel_abi;
pub mod log_limit;
pub mod metadata;
pub mod occupancy;
pub mod trace;
pub mod transfer;
pub mod transport;

pub use config::EngineConfig;
pub use engine::TransferEngine;
pub use error::{EngineError, Result};
pub use transfer::{BatchId, Opcode, Protocol, SegmentId, TransferRequest, TransferState, TransferStatus};
