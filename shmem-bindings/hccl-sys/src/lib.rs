//! `hccl-sys`: runtime-loaded bindings to the Huawei Collective Communication Library (`libhccl.so`).
//!
//! The few entry points a transfer engine uses to bootstrap a communicator by root info (exchanging handles between
//! ranks), in three layers like `ascendcl-sys` (whose loader and declaration macros it uses): [`sys`] (exact C
//! names, [`sys::HcclApi`]), [`result`] (`comm::{get_root_info, init_root_info, rank_id, rank_size, name,
//! destroy}`), [`safe`] ([`safe::Communicator`]). [`api()`] loads `libhccl.so` once per process from
//! `AIV_HCCL_LIB`, `ASCEND_HOME_PATH`'s library directories, then the loader's search path. The declarations are
//! checked against the `torch-npu` wheel's `hccl.h` by `tests/abi.rs`.

pub mod error;
pub mod result;
pub mod safe;
pub mod sys;

use std::sync::OnceLock;

use ascendcl_sys::loader::LoadError;

pub use error::Error;
pub use sys::HcclApi;

/// The process-wide HCCL table, loaded on first use; a failed load is remembered.
pub fn api() -> Result<&'static HcclApi, Error> {
    static API: OnceLock<Result<HcclApi, LoadError>> = OnceLock::new();
    API.get_or_init(|| HcclApi::load(&sys::HCCL_LIBRARY, &sys::HCCL_LIBRARY.candidates_from_process_env()))
        .as_ref()
        .map_err(|error| Error::Load(error.clone()))
}
