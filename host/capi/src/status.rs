//! Status codes, the thread-local last error, the panic guard every entry point runs in, and the strings handed to
//! the caller.

use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use engine::EngineError;

/// The status codes of `aiv_transport.h` (`AIV_OK`, `AIV_ERR_*`).
pub mod code {
    use std::ffi::c_int;

    pub const OK: c_int = 0;
    pub const INVALID_ARGUMENT: c_int = -1;
    pub const INVALID_HANDLE: c_int = -2;
    pub const CONFIG: c_int = -3;
    pub const ADDRESS_NOT_REGISTERED: c_int = -4;
    pub const ADDRESS_OVERLAPPED: c_int = -5;
    pub const SEGMENT_NOT_FOUND: c_int = -6;
    pub const TIMEOUT: c_int = -7;
    pub const BATCH_BUSY: c_int = -8;
    pub const TRANSFER_FAILED: c_int = -9;
    pub const DEVICE: c_int = -10;
    pub const TRANSPORT: c_int = -11;
    pub const NOT_SUPPORTED: c_int = -12;
    pub const INTERNAL: c_int = -13;
}

/// Why a call failed: its status code and the message `aiv_last_error` returns.
#[derive(Debug)]
pub struct Failure {
    pub code: c_int,
    pub message: String,
}

impl Failure {
    pub fn new(code: c_int, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(code::INVALID_ARGUMENT, message)
    }

    pub fn device(message: impl Into<String>) -> Failure {
        Failure::new(code::DEVICE, message)
    }
}

impl From<EngineError> for Failure {
    fn from(error: EngineError) -> Failure {
        Failure::new(engine_code(&error), error.to_string())
    }
}

/// The status code of an engine error.
pub fn engine_code(error: &EngineError) -> c_int {
    match error {
        EngineError::Config(_) => code::CONFIG,
        EngineError::InvalidRegistration { .. }
        | EngineError::InvalidArgument { .. }
        | EngineError::TooManyRequests { .. } => code::INVALID_ARGUMENT,
        EngineError::AddressOverlapped { .. } => code::ADDRESS_OVERLAPPED,
        EngineError::AddressNotRegistered { .. } => code::ADDRESS_NOT_REGISTERED,
        EngineError::SegmentNotFound { .. } | EngineError::MalformedDescriptor { .. } => code::SEGMENT_NOT_FOUND,
        EngineError::UnknownSegment { .. } | EngineError::UnknownBatch { .. } | EngineError::UnknownTask { .. } => {
            code::INVALID_HANDLE
        }
        EngineError::BatchBusy { .. } => code::BATCH_BUSY,
        EngineError::NotSupportedTransport { .. } => code::NOT_SUPPORTED,
        EngineError::TransferFailed { .. } => code::TRANSFER_FAILED,
        EngineError::TransportStart { .. }
        | EngineError::Io { .. }
        | EngineError::Metadata { .. }
        | EngineError::Handshake { .. } => code::TRANSPORT,
        _ => code::INTERNAL,
    }
}

thread_local! {
    /// The message of this thread's last failed call.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error (NUL bytes replaced).
fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// This thread's last error message; valid until this thread's next failing call.
pub fn last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Runs one entry point: its result as a status code, its failure (or a panic) recorded as the thread's last error,
/// prefixed with the function's name.
pub fn guard(function: &'static str, body: impl FnOnce() -> Result<(), Failure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => code::OK,
        Ok(Err(failure)) => {
            tracing::debug!(function, code = failure.code, message = %failure.message, "call failed");
            set_last_error(&format!("{function}: {}", failure.message));
            failure.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            set_last_error(&format!("{function}: internal error (a panic was caught): {what}"));
            code::INTERNAL
        }
    }
}

/// Strings handed to the caller and not yet freed, by address: `aiv_string_free` frees only these.
static STRINGS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Hands `text` to the caller as a NUL-terminated string it frees with `aiv_string_free`.
pub fn give_string(text: &str) -> *mut c_char {
    let raw = CString::new(text.replace('\0', "\\0")).unwrap_or_default().into_raw();
    crate::lock(&STRINGS).get_or_insert_with(HashSet::new).insert(raw as usize);
    raw
}

/// Frees a string [`give_string`] handed out; refuses any other pointer.
pub fn free_string(raw: *mut c_char) -> Result<(), Failure> {
    if raw.is_null() {
        return Ok(());
    }
    if !crate::lock(&STRINGS).get_or_insert_with(HashSet::new).remove(&(raw as usize)) {
        return Err(Failure::invalid(format!(
            "{raw:p} is not a string this library returned, or it was freed already"
        )));
    }
    // SAFETY: `raw` came from `CString::into_raw` in `give_string` and was removed from the live set just now, so it
    // is reclaimed exactly once.
    drop(unsafe { CString::from_raw(raw) });
    Ok(())
}
