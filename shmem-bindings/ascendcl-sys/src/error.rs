//! Errors of the CANN bindings: the one error enum every `-sys` crate uses, generic over the library's raw
//! return-code type, and ACL's code newtype.

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

/// An operation of a runtime-loaded CANN library failed. `C` is that library's raw return-code type: [`AclError`]
/// (the default, so `ascendcl_sys::Error` is ACL's error), [`HixlError`](crate::hixl::HixlError),
/// `cann_shmem_sys::ShmemError`, `hccl_sys::sys::HcclResult`. Each crate names its instance `Error`.
///
/// Every library can fail to load, lack an optional symbol, return a code or be handed an argument C cannot take;
/// [`AllocationFailed`](Error::AllocationFailed) and [`StateLayout`](Error::StateLayout) are for libraries that
/// allocate without a code or whose internal data symbols are read (today SHMEM's).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error<C = AclError> {
    /// The library could not be loaded (every candidate is listed).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The loaded library lacks a function (or data symbol) only newer versions have.
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A call returned an error code.
    #[error("{function} failed: {code}")]
    Call {
        /// The C function that failed.
        function: &'static str,
        /// Its return code.
        code: C,
    },
    /// An argument cannot be passed to C (e.g. a string with an interior NUL, a key longer than the buffer).
    #[error("{function}: {reason}")]
    InvalidArgument {
        /// The C function that was not called.
        function: &'static str,
        /// Why.
        reason: String,
    },
    /// An allocation returned NULL (the library reports no code for it).
    #[error("{function} returned NULL for {size} bytes")]
    AllocationFailed {
        /// The C function that failed.
        function: &'static str,
        /// The bytes asked for.
        size: usize,
    },
    /// A copy of a library's internal state (read through a data symbol) does not have the layout the bindings
    /// mirror.
    #[error("{symbol}: {detail}")]
    StateLayout {
        /// Which copy was read (the host symbol's C name).
        symbol: &'static str,
        /// What was wrong, e.g. the version word and the layout it names.
        detail: String,
    },
}

impl<C: Copy> Error<C> {
    /// The library's code, when a call failed.
    pub fn code(&self) -> Option<C> {
        match self {
            Error::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Maps an ACL return code of `function` to `Result`.
pub fn check(function: &'static str, code: aclError) -> Result<(), Error> {
    AclError::check(code).map_err(|code| Error::Call { function, code })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hixl::{HixlError, HIXL_TIMEOUT};

    #[test]
    fn a_call_error_names_the_function_and_the_code_of_any_library() {
        let acl: Error = check("aclrtMalloc", 207_001).expect_err("not success");
        assert_eq!(acl.to_string(), "aclrtMalloc failed: AclError(207001 ACL_ERROR_RT_MEMORY_ALLOCATION)");
        assert_eq!(acl.code(), Some(AclError(207_001)));
        assert_eq!(check("aclrtMalloc", crate::sys::ACL_SUCCESS), Ok(()));

        let hixl = Error::Call { function: "HixlCSClientConnect", code: HixlError(HIXL_TIMEOUT) };
        assert_eq!(hixl.to_string(), "HixlCSClientConnect failed: HixlError(103901 HIXL_TIMEOUT)");
        assert_eq!(hixl.code(), Some(HixlError(103_901)));
    }

    #[test]
    fn errors_without_a_code_keep_their_messages() {
        let invalid: Error = Error::InvalidArgument { function: "aclrtIpcMemGetExportKey", reason: "too long".into() };
        assert_eq!(invalid.to_string(), "aclrtIpcMemGetExportKey: too long");
        assert_eq!(invalid.code(), None);
        let allocation: Error = Error::AllocationFailed { function: "aclshmem_malloc", size: 64 };
        assert_eq!(allocation.to_string(), "aclshmem_malloc returned NULL for 64 bytes");
        let layout: Error = Error::StateLayout { symbol: "g_state", detail: "version 0".into() };
        assert_eq!(layout.to_string(), "g_state: version 0");
        assert_eq!(layout.code(), None);
    }
}
