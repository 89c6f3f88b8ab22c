//! Errors of the SHMEM bindings.

use ascendcl_sys::loader::{LoadError, MissingSymbol};

use crate::sys::ACLSHMEM_ERROR_CODES;

ascendcl_sys::error_code!(
    /// A raw SHMEM return code other than success, e.g. `ShmemError(-6 ACLSHMEM_BOOTSTRAP_ERROR)`.
    ShmemError(i32),
    ACLSHMEM_ERROR_CODES
);

/// A SHMEM operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `libshmem.so` could not be loaded (every candidate is listed).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The loaded library lacks a function only newer SHMEM versions have.
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A call returned an error code.
    #[error("{function} failed: {code}")]
    Call {
        /// The C function that failed.
        function: &'static str,
        /// Its return code.
        code: ShmemError,
    },
    /// A copy of SHMEM's internal state does not have the layout [`crate::device_state`] mirrors.
    #[error("{symbol}: {detail}")]
    StateLayout {
        /// Which copy was read (the host symbol's C name).
        symbol: &'static str,
        /// What was wrong, e.g. the version word and the layout it names.
        detail: String,
    },
    /// An allocation returned NULL (SHMEM reports no code for it).
    #[error("{function} returned NULL for {size} bytes")]
    AllocationFailed {
        /// The C function that failed.
        function: &'static str,
        /// The bytes asked for.
        size: usize,
    },
}

impl Error {
    /// The SHMEM code, when a call failed.
    pub fn code(&self) -> Option<ShmemError> {
        match self {
            Error::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Maps a return code of `function` to `Result`.
pub fn check(function: &'static str, code: i32) -> Result<(), Error> {
    if code == crate::sys::ACLSHMEM_SUCCESS {
        Ok(())
    } else {
        Err(Error::Call { function, code: ShmemError(code) })
    }
}
