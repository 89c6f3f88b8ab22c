//! What every ACL entry point shares: the guard that turns a panic into `ACL_ERROR_RT_INTERNAL_ERROR` and records a
//! failure for `aclGetRecentErrMsg` (the calling thread's most recent one), the argument checks, and the `acl_entry!`
//! declaration of an exported function. Used by the faces (`acl`, `acl_compat`, `vmm_share`).

use core::ffi::c_char;
use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ascendcl_sys::sys::*;

thread_local! {
    /// The message of the calling thread's most recent failed ACL call (kept until the next failure).
    static RECENT: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Records a failure of `name` with `code` for `aclGetRecentErrMsg`.
pub(crate) fn record_error(name: &str, code: aclError) {
    let message = format!("cann-twin: {name} failed with error code {code}");
    let message = CString::new(message).unwrap_or_default();
    let _ = RECENT.try_with(|recent| *recent.borrow_mut() = Some(message));
}

/// Runs an entry point's body, turning a panic into `ACL_ERROR_RT_INTERNAL_ERROR`; a failure is recorded for
/// `aclGetRecentErrMsg` under the function's `name`.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Result<(), aclError>) -> aclError {
    let code = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => ACL_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => ACL_ERROR_RT_INTERNAL_ERROR,
    };
    if code != ACL_SUCCESS {
        record_error(name, code);
    }
    code
}

pub(crate) fn not_null<T>(pointer: *const T) -> Result<(), aclError> {
    if pointer.is_null() {
        Err(ACL_ERROR_INVALID_PARAM)
    } else {
        Ok(())
    }
}

macro_rules! acl_entry {
    ($(#[$meta:meta])* fn $name:ident($($param:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        ///
        /// # Safety
        ///
        /// The C contract of the ACL function of this name: output pointers are null or writable; Host pointers
        /// are valid for the bytes the call names. Device addresses are checked by the runtime.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($param: $ty),*) -> aclError {
            $crate::entry::guard(stringify!($name), move || $body)
        }
    };
}
/// For the modules of entry points (`acl`, `acl_compat`).
pub(crate) use acl_entry;

/// The message of the calling thread's most recent failed ACL call (see [`record_error`]), or the empty string; never
/// null, valid until the thread's next failing call.
pub(crate) fn recent_error() -> *const c_char {
    RECENT
        .try_with(|recent| recent.borrow().as_ref().map_or(c"".as_ptr(), |message| message.as_ptr()))
        .unwrap_or(c"".as_ptr())
}
