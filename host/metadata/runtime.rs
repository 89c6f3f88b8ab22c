//! The tokio runtime the metadata services (handshake server, embedded HTTP metadata server) run on.
//!
//! One per process, started on first use with two worker threads and never shut down: servers are tasks on it and
//! stop through their own handles. Callers never block on it from the engine's synchronous API.

use std::sync::OnceLock;

use tokio::runtime::Runtime;

use crate::error::{EngineError, Result};

/// The process's metadata service runtime.
pub fn shared() -> Result<&'static Runtime> {
    static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();
    let built = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("aiv-metadata")
            .enable_all()
            .build()
            .map_err(|error| error.to_string())
    });
    built
        .as_ref()
        .map_err(|reason| EngineError::Metadata { operation: "start metadata service runtime", reason: reason.clone() })
}
