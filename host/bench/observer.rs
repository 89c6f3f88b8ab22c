//! CANN's profiler as a run's independent device-side observer: started before the engines open, stopped after they
//! closed, what it saw set on the run's evidence.

use super::report::LoopbackReport;
use crate::transfer::Protocol;

/// CANN's profiler for a run of `protocol` on `devices` under `config`: started for aiv on `device_backend: "cann"`
/// (the vendor's runtime, or the twin's library loaded in its place), where the aiv transfers' device-side acts are
/// self-reported and the profiler is the run's independent device-side observer (docs/evidence.md, "The profiler");
/// `None` otherwise. Start it before the engines open (their kernels launch inside the session) and hand it to
/// [`observe_run`] after they closed. A profiler that cannot start is `Some(Err(why))`: the run goes on.
pub fn start_observer(
    config: &crate::config::EngineConfig,
    protocol: Protocol,
    devices: &[u32],
) -> Option<std::result::Result<crate::device::cann::profiler::ProfilerSession, String>> {
    (config.aiv.device_backend == crate::config::DeviceBackendKind::Cann && protocol == Protocol::Aiv)
        .then(|| crate::device::cann::profiler::ProfilerSession::start_vendor(devices))
}

/// Stops `session` (from [`start_observer`]) and sets what it saw in the run's window as the run's observer.
pub fn observe_run(
    report: &mut LoopbackReport,
    session: Option<std::result::Result<crate::device::cann::profiler::ProfilerSession, String>>,
) {
    if let Some(session) = session {
        let window = report.outcome.window;
        report.outcome.evidence.tally.observer = Some(crate::device::cann::profiler::observer(session, &[window]));
    }
}
