//! The names of the threads the twin runs for the device.
//!
//! Owns: the thread-name prefixes of the emulated AIV cores, the SDMA engines, the copy streams and the export
//! service, and the list of them that Host CPU accounting leaves out (`crate::cpu_time`, the bench). Each part of the
//! twin that spawns such a thread names it from here. It must not import anything: it is names only, below every
//! other file of the twin.

/// Name prefixes of the threads the twin runs for the device (emulated AIV cores, SDMA engines, copy streams, the
/// export service standing in for the driver): Device time, which Host CPU figures leave out by these names.
pub const CORE_THREAD_PREFIX: &str = "aiv-core-";
/// See [`CORE_THREAD_PREFIX`].
pub const SDMA_THREAD_PREFIX: &str = "aiv-sdma-";
/// See [`CORE_THREAD_PREFIX`].
pub const STREAM_THREAD_PREFIX: &str = "aiv-stream-";
/// See [`CORE_THREAD_PREFIX`].
pub const EXPORT_THREAD_PREFIX: &str = "aiv-twin-export";
/// The prefix of every thread the twin runtime (`cann_twin::THREAD_PREFIX`: its emulated cores, SDMA engines and
/// stream workers) runs for a device on the `cann-twin` backend; repeated here because this file imports nothing.
pub const TWIN_RUNTIME_THREAD_PREFIX: &str = "cann-twin-";
/// Every prefix above.
pub const DEVICE_THREAD_PREFIXES: [&str; 5] =
    [CORE_THREAD_PREFIX, SDMA_THREAD_PREFIX, STREAM_THREAD_PREFIX, EXPORT_THREAD_PREFIX, TWIN_RUNTIME_THREAD_PREFIX];
