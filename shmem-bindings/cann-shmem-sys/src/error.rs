//! Errors of the SHMEM bindings.

use crate::sys::ACLSHMEM_ERROR_CODES;

ascendcl_sys::error_code!(
    /// A raw SHMEM return code other than success, e.g. `ShmemError(-6 ACLSHMEM_BOOTSTRAP_ERROR)`.
    ShmemError(i32),
    ACLSHMEM_ERROR_CODES
);

/// A SHMEM operation failed: the shared [`ascendcl_sys::Error`] over [`ShmemError`]. Besides load, missing-symbol
/// and call failures, SHMEM produces [`AllocationFailed`](ascendcl_sys::Error::AllocationFailed) (a heap call
/// returned NULL) and [`StateLayout`](ascendcl_sys::Error::StateLayout) (a copy of its internal state does not have
/// the layout [`crate::device_state`] mirrors).
pub type Error = ascendcl_sys::Error<ShmemError>;

/// Maps a return code of `function` to `Result`.
pub fn check(function: &'static str, code: i32) -> Result<(), Error> {
    if code == crate::sys::ACLSHMEM_SUCCESS {
        Ok(())
    } else {
        Err(Error::Call { function, code: ShmemError(code) })
    }
}
