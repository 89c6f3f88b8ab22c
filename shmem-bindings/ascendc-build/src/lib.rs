//! `ascendc-build`: the build-script helper that compiles this project's AscendC kernels.
//!
//! It will hold, for the root `build.rs`:
//! - the CPU-twin build: the kernel sources under `kernels/` compiled with the host C++ compiler and the twin
//!   platform header, into a static library linked into the runtime;
//! - the NPU build: discovery of the CANN toolkit (an explicit environment variable, then `ASCEND_HOME_PATH`, then
//!   `PATH`), `bisheng`/`ccec` invocations with the documented AIV flags, the `ld.lld` step, and embedding the
//!   resulting object so the runtime can load it with `aclrtBinaryLoadFromData`;
//! - `cargo:rerun-if-*` bookkeeping for every file and variable read, and the single `cargo:warning` printed when
//!   CANN is absent (a default build never fails for that reason).
