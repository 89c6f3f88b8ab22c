//! `aiv_transport._native`: the Python binding of aiv-transport, a drop-in for `mooncake.engine.TransferEngine`
//! (docs/python.md).
//!
//! Owns: Mooncake's Python calling conventions (names, positional order, defaults, ints for results) on top of
//! [`aiv_transport::TransferEngine`], the GIL released during every call that can block, and the guarantee that no
//! input panics or aborts the process. It must not move bytes itself: the engine's transports do, and device memory
//! is reached only through the device's copies.

/// Logs at `$level` (`warn`, `error`) through a rate limiter of its own call site: at most 5 lines a second, each
/// with the field `suppressed`, how many lines of that call site were left out in the second before. Every warning
/// and error of the binding goes through it: one is logged per failed call, and a Python program may repeat a failing
/// call in a tight loop (a retry loop against a dead peer makes thousands a second).
macro_rules! limited {
    ($level:ident, $($arg:tt)+) => {{
        static LIMITER: aiv_transport::log_limit::LogLimiter = aiv_transport::log_limit::LogLimiter::per_second(5);
        if let Some(suppressed) = LIMITER.admit() {
            tracing::$level!(suppressed, $($arg)+);
        }
    }};
}

mod config;
mod engine;
mod inner;
mod memory;

use pyo3::prelude::*;

/// Logs to stderr, filtered by `RUST_LOG` (default `warn`), once per process; a subscriber the embedding process
/// installed already wins.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).try_init();
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add_class::<engine::TransferOpcode>()?;
    m.add_class::<engine::TransferNotify>()?;
    m.add_class::<engine::TransferEngine>()?;
    // Mooncake exports the opcode values at module level too (`mooncake.engine.Read`).
    let opcode = m.getattr("TransferOpcode")?;
    m.add("Read", opcode.getattr("Read")?)?;
    m.add("Write", opcode.getattr("Write")?)?;
    // Mooncake's build flags: none of its optional transports exist here.
    for flag in ["SUPPORT_CUDA", "SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_INTRA_NVLINK", "SUPPORT_MUSA"]
    {
        m.add(flag, false)?;
    }
    m.add("ASCEND_PROTOCOL_ENV", aiv_transport::config::ASCEND_PROTOCOL_ENV)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
