//! `cann-shmem-sys`: runtime-loaded bindings to CANN SHMEM (`libshmem.so`, library name ACLSHMEM).
//!
//! Three layers like `ascendcl-sys` (whose loader and declaration macros it uses), and one module of SHMEM internals:
//! - [`sys`]: the host API with exact C names in [`sys::ShmemApi`], and Rust mirrors of `aclshmemx_init_attr_t`
//!   (120 bytes) and `aclshmemx_uniqueid_t` (136 bytes). No header package exists to check them against, so their
//!   documented sizes and offsets are compile-time assertions, and [`sys::aclshmemx_init_attr_t::new`] reproduces
//!   the C++ default member initialisers.
//! - [`result`]: `bootstrap::{get_uniqueid, set_attr_uniqueid_args, init_attr, finalize}` and
//!   `heap::{malloc, calloc, align, free, ptr, my_pe, n_pes}` returning `Result<_, `[`Error`]`>`.
//! - [`safe`]: [`safe::SymmetricAllocation`], freed on drop.
//! - [`device_state`]: the offsets of SHMEM's internal state struct that hold the SDMA workspace address, and where
//!   its host (`g_state`, an optional data symbol of the table) and device copies live; read by
//!   [`result::state::host_state`]. Inferred from SHMEM's source, *unverified on hardware*.
//!
//! [`api()`] loads `libshmem.so` once per process: `AIV_SHMEM_LIB` (a full path, the only candidate when set), then
//! `SHMEM_HOME_PATH`, then `ASCEND_HOME_PATH`, then the loader's search path (see [`sys::SHMEM_LIBRARY`]).

pub mod device_state;
pub mod error;
pub mod result;
pub mod safe;
pub mod sys;

use std::sync::OnceLock;

use ascendcl_sys::loader::LoadError;

pub use error::{Error, ShmemError};
pub use sys::ShmemApi;

/// The process-wide SHMEM table, loaded on first use; a failed load is remembered.
pub fn api() -> Result<&'static ShmemApi, Error> {
    static API: OnceLock<Result<ShmemApi, LoadError>> = OnceLock::new();
    API.get_or_init(|| ShmemApi::load(&sys::SHMEM_LIBRARY, &sys::SHMEM_LIBRARY.candidates_from_process_env()))
        .as_ref()
        .map_err(|error| Error::Load(error.clone()))
}
