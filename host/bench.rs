//! `aiv bench`: Mooncake's `transfer_engine_bench` workload (docs/mooncake.md section 6).
//!
//! Thread `t`, request `i` of every batch moves `block_size` bytes from `local_base + block_size * (i * threads + t)`
//! to `target_base + block_size * (i * threads + t)`; each thread submits a batch, waits for it, frees it, and
//! repeats until the duration ends. Throughput = completed batches x batch_size x block_size / wall seconds.
//!
//! The parts: the flags and [`BenchParams`] (`params.rs`), what a run measured and its result line
//! ([`BenchOutcome`], `outcome.rs`), the initiator's threads and the measuring frame around them (`initiator.rs`),
//! Host buffers and the memcpy reference (`memcpy.rs`), the runs over Host memory and the tcp target
//! (`host_runs.rs`), the runs over device memory and the aiv target (`device_runs.rs`), CANN's profiler as the run's
//! observer (`observer.rs`), and the JSON document of a run (`report.rs`).

mod device_runs;
mod host_runs;
mod initiator;
mod memcpy;
mod observer;
mod outcome;
mod params;
mod report;

pub(crate) use device_runs::{fill_device, target_config};
pub use device_runs::{run_aiv_against_segment, run_aiv_pair, serve_aiv_target, target_pattern};
pub use host_runs::{run_against_segment, run_loopback, run_two_engines, serve_target};
pub use initiator::{run_following, run_initiator, run_layerwise, run_request_lists};
pub(crate) use memcpy::filled_buffer;
pub use memcpy::memcpy_reference;
pub use observer::{observe_run, start_observer};
pub use outcome::{latency_histogram, BenchOutcome, EvidenceSummary};
pub use params::{
    parse_batch_size, parse_buffer_size, parse_duration, parse_report_precision, parse_threads, physical_memory,
    BenchParams, ReportUnit, MAX_BATCH_SIZE, MAX_DURATION_SECS, MAX_REPORT_PRECISION, MAX_THREADS, MIN_DURATION_SECS,
};
pub use report::{report_json, LoopbackReport, REPORT_SCHEMA};
