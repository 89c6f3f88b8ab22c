//! Errors of the HCCL bindings.

use core::fmt;

use crate::sys::{HcclResult, HCCL_SUCCESS};

/// A failed call's message: the code's `Debug` (which names documented codes, e.g. `HCCL_E_TIMEOUT`) and its number,
/// e.g. `HCCL_E_PARA (1)`.
impl fmt::Display for HcclResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?} ({})", self.0)
    }
}

/// An HCCL operation failed: the shared [`ascendcl_sys::Error`] over [`HcclResult`].
pub type Error = ascendcl_sys::Error<HcclResult>;

/// Maps a return code of `function` to `Result`.
pub fn check(function: &'static str, code: HcclResult) -> Result<(), Error> {
    if code == HCCL_SUCCESS {
        Ok(())
    } else {
        Err(Error::Call { function, code })
    }
}
