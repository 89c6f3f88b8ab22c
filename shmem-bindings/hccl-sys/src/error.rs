//! Errors of the HCCL bindings.

use ascendcl_sys::loader::{LoadError, MissingSymbol};

use crate::sys::{HcclResult, HCCL_SUCCESS};

/// An HCCL operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `libhccl.so` could not be loaded (every candidate is listed).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The loaded library lacks a function only newer HCCL versions have.
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A call returned an error code; its `Debug` names documented codes (e.g. `HCCL_E_TIMEOUT`).
    #[error("{function} failed: {code:?} ({})", code.0)]
    Call {
        /// The C function that failed.
        function: &'static str,
        /// Its return code.
        code: HcclResult,
    },
}

impl Error {
    /// The HCCL code, when a call failed.
    pub fn code(&self) -> Option<HcclResult> {
        match self {
            Error::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Maps a return code of `function` to `Result`.
pub fn check(function: &'static str, code: HcclResult) -> Result<(), Error> {
    if code == HCCL_SUCCESS {
        Ok(())
    } else {
        Err(Error::Call { function, code })
    }
}
