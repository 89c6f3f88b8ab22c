//! Per-stage tracing (docs/trace.md): switched on and off, the aiv trace rings' depth, and everything recorded
//! collected (Host events, the aiv kernels' stages, the twin's SDMA engine runs on the Host's clock).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{lock, TransferEngine};
use crate::error::{EngineError, Result};
use crate::transfer::Protocol;

impl TransferEngine {
    /// Switches per-stage tracing on or off (docs/trace.md; off by default). On: every batch submitted from now on
    /// records its Host events (submit, completion seen, wait and caller woken), the aiv path's blocks record their
    /// kernel stages into trace rings (allocated now, or when the device opens), and on the twin runtime linked into
    /// this process the SDMA engines record their runs (switched per device). [`Self::take_trace`]
    /// collects what was recorded.
    pub fn set_trace(&self, on: bool) -> Result<()> {
        self.tracer.set_enabled(on);
        let device = lock(&self.device).clone();
        if self.twin_in_process() {
            cann_twin::control::record_engine_runs(self.config.aiv.device_id as i32, on);
        }
        if let Some(device) = device {
            device
                .transport()
                .set_trace(&self.tracer, on, self.trace_depth.load(Ordering::Relaxed))
                .map_err(|error| EngineError::TransportStart { protocol: Protocol::Aiv, reason: error.to_string() })?;
        }
        Ok(())
    }

    /// Entries of each aiv block's trace ring (a power of two >= 2), used when tracing first allocates them (default
    /// [`crate::transport::aiv::DEFAULT_TRACE_DEPTH`]).
    pub fn set_trace_ring_depth(&self, depth: u32) {
        self.trace_depth.store(depth, Ordering::Relaxed);
    }

    /// Whether the device backend is the twin runtime linked into this process (its control API reaches it).
    fn twin_in_process(&self) -> bool {
        self.config.aiv.device_backend == crate::config::DeviceBackendKind::Twin
    }

    /// Everything traced since the last call: the Host events, the aiv kernels' stages (each block's trace ring
    /// drained until it stays empty for 2 ms, at most 100 ms: the kernel publishes its trace just after the DCQ), and
    /// on the twin runtime in this process the SDMA engine runs of this engine's device, put on the Host's clock
    /// with a pair of readings of both clocks.
    pub fn take_trace(&self) -> crate::trace::TraceLog {
        let device = lock(&self.device).clone();
        if let Some(device) = &device {
            let deadline = Instant::now() + Duration::from_millis(100);
            loop {
                std::thread::sleep(Duration::from_millis(2));
                if device.transport().drain_traces() == 0 || Instant::now() >= deadline {
                    break;
                }
            }
        }
        if self.twin_in_process() {
            let before = crate::trace::now_ns();
            let twin = cann_twin::control::clock_ns();
            let after = crate::trace::now_ns();
            let offset = (before / 2 + after / 2) as i128 - i128::from(twin);
            let (runs, dropped) = cann_twin::control::take_engine_runs(self.config.aiv.device_id as i32);
            let to_host = |ns: u64| (i128::from(ns) + offset).max(0) as u64;
            self.tracer.engine_runs(
                runs.into_iter().map(|run| crate::trace::EngineRunEvent {
                    device: run.device,
                    channel: run.channel,
                    start_ns: to_host(run.start_ns),
                    end_ns: to_host(run.end_ns),
                    sqes: run.sqes,
                }),
                dropped,
            );
            self.tracer.note(
                "engine_track",
                format!(
                    "twin runtime: SDMA engine runs from cann_twin::control, on the Host clock by one pair of \
                     readings (error at most {} ns)",
                    after - before
                ),
            );
            self.tracer.note("runtime", "twin runtime (a CPU model; device timestamps unverified on hardware)");
        } else {
            self.tracer.note("engine_track", "not recorded: the vendor's runtime exposes no SDMA engine runs");
            self.tracer.note("runtime", "vendor runtime");
        }
        self.tracer.take()
    }
}
