//! Errors of the ACL bindings: the raw code newtype and the crate's error enum.

use crate::loader::{LoadError, MissingSymbol};
use crate::sys::{aclError, ACL_ERROR_CODES};

crate::error_code!(
    /// A raw ACL return code other than success. `Debug` and `Display` name documented codes, e.g.
    /// `AclError(207001 ACL_ERROR_RT_MEMORY_ALLOCATION)`.
    AclError(aclError),
    ACL_ERROR_CODES
);

impl AclError {
    /// `Ok(())` for success, else the code.
    pub fn check(code: aclError) -> Result<(), AclError> {
        if code == crate::sys::ACL_SUCCESS {
            Ok(())
        } else {
            Err(AclError(code))
        }
    }
}

/// An ACL operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `libascendcl.so` could not be loaded (every candidate is listed).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The loaded runtime lacks a function only newer CANN versions have.
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A call returned an error code.
    #[error("{function} failed: {code}")]
    Call {
        /// The C function that failed.
        function: &'static str,
        /// Its return code.
        code: AclError,
    },
    /// An argument cannot be passed to C (e.g. a string with an interior NUL, a key longer than the buffer).
    #[error("{function}: {reason}")]
    InvalidArgument {
        /// The C function that was not called.
        function: &'static str,
        /// Why.
        reason: String,
    },
}

impl Error {
    /// The ACL code, when a call failed.
    pub fn code(&self) -> Option<AclError> {
        match self {
            Error::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Maps a return code of `function` to `Result`.
pub fn check(function: &'static str, code: aclError) -> Result<(), Error> {
    AclError::check(code).map_err(|code| Error::Call { function, code })
}
