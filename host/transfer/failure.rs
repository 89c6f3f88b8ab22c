//! Why a task did not complete: a typed failure every path writes into its task slot.
//!
//! A failure carries the terminal state it puts the task in, what kind of failure it is, the path that saw it, the
//! path's own numeric code where it has one (an ADXL status, an ACL return code, the kernel's DCQ status and
//! syndrome), Mooncake's numeric code where one applies, and the error that caused it. The human-readable reason is
//! rendered from these ([`TransferFailure::report`]); nothing parses it back.
//!
//! Must not name a transport's or a device's types: codes are plain numbers with their family and name.

use std::fmt;
use std::sync::Arc;

use super::request::TransferState;

/// What kind of failure ended a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureKind {
    /// The engine refused the request before any transport saw it (segment, bounds, protocol).
    Rejected,
    /// The path refused the request (an argument it cannot carry).
    InvalidRequest,
    /// No completion within a budget (the engine's watchdog, the kernel's wait budget, a stream or flag wait).
    Timeout,
    /// The target's memory could not be reached (not imported, not advertised).
    Unreachable,
    /// The peer was found gone while the transfer was pending or before it started.
    PeerLost,
    /// The device or its runtime reported an error (a channel exception, a failed runtime call).
    Device,
    /// The transfer kernel reported the failure in its completion entry.
    Kernel,
    /// The network connection to the peer failed.
    Network,
    /// The peer answered that it could not carry the transfer.
    Remote,
    /// A resource the path needs was not free in time (streams, pool slots).
    Resources,
    /// The transfer was aborted on request.
    Aborted,
    /// The path shut down with the transfer still pending.
    Shutdown,
}

/// Which numbering a [`PathCode`] belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CodeFamily {
    /// ADXL's `Status` (`adxl_types.h`).
    Adxl,
    /// An ACL runtime return code (`acl_base.h`).
    Acl,
    /// The transfer kernel's DCQ status word.
    DcqStatus,
}

/// A path's own numeric code for a failure.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct PathCode {
    /// The numbering.
    pub family: CodeFamily,
    /// The value.
    pub value: i64,
    /// The value's name in its family (e.g. `PARAM_INVALID`).
    pub name: String,
}

impl fmt::Display for PathCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.value)
    }
}

/// The error a failure came from.
pub type FailureSource = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why one task failed or timed out.
#[derive(Clone)]
pub struct TransferFailure {
    kind: FailureKind,
    path: &'static str,
    message: String,
    code: Option<PathCode>,
    mooncake_code: Option<i32>,
    source: Option<FailureSource>,
}

impl TransferFailure {
    /// A failure of `kind` seen by `path` (`"aiv"`, `"tcp"`, `"engine"`, ...), described by `message`.
    pub fn new(path: &'static str, kind: FailureKind, message: impl Into<String>) -> Self {
        TransferFailure { kind, path, message: message.into(), code: None, mooncake_code: None, source: None }
    }

    /// The engine's watchdog found the task pending at its deadline.
    pub fn watchdog() -> Self {
        TransferFailure::new(
            "engine",
            FailureKind::Timeout,
            "no completion within the transfer timeout (host watchdog)",
        )
    }

    /// With the path's own code.
    pub fn with_code(mut self, family: CodeFamily, value: i64, name: impl Into<String>) -> Self {
        self.code = Some(PathCode { family, value, name: name.into() });
        self
    }

    /// With Mooncake's numeric code (the magnitude of its `ERR_*` value).
    pub fn with_mooncake_code(mut self, code: i32) -> Self {
        self.mooncake_code = Some(code);
        self
    }

    /// With the error that caused it.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The terminal state the failure puts the task in: TIMEOUT for a timeout, FAILED otherwise.
    pub fn state(&self) -> TransferState {
        match self.kind {
            FailureKind::Timeout => TransferState::Timeout,
            _ => TransferState::Failed,
        }
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// The path that saw it.
    pub fn path(&self) -> &'static str {
        self.path
    }

    /// The description, without the path and the source.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The path's own code, if it has one.
    pub fn code(&self) -> Option<&PathCode> {
        self.code.as_ref()
    }

    /// The path's code of `family`, if it has one of that family.
    pub fn code_of(&self, family: CodeFamily) -> Option<i64> {
        self.code.as_ref().filter(|code| code.family == family).map(|code| code.value)
    }

    /// Mooncake's numeric code, where one applies.
    pub fn mooncake_code(&self) -> Option<i32> {
        self.mooncake_code
    }

    /// The whole reason: `path: [code: ]message[: source[: source ...]]`.
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut next = std::error::Error::source(self);
        while let Some(error) = next {
            out.push_str(": ");
            out.push_str(&error.to_string());
            next = error.source();
        }
        out
    }
}

impl fmt::Display for TransferFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.path)?;
        if let Some(code) = &self.code {
            write!(f, "{code}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl fmt::Debug for TransferFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransferFailure")
            .field("kind", &self.kind)
            .field("path", &self.path)
            .field("message", &self.message)
            .field("code", &self.code)
            .field("mooncake_code", &self.mooncake_code)
            .field("source", &self.source.as_ref().map(|source| source.to_string()))
            .finish()
    }
}

impl PartialEq for TransferFailure {
    /// Equal when everything but the source is (sources are compared by their text).
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.path == other.path
            && self.message == other.message
            && self.code == other.code
            && self.mooncake_code == other.mooncake_code
            && self.source.as_ref().map(|s| s.to_string()) == other.source.as_ref().map(|s| s.to_string())
    }
}

impl std::error::Error for TransferFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|source| source as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner;

    #[test]
    fn the_reason_is_rendered_from_the_fields_and_the_source_chain() {
        let failure = TransferFailure::new("adxl", FailureKind::Device, "channel 0 stopped")
            .with_code(CodeFamily::Adxl, 503_900, "FAILED")
            .with_source(Outer(Inner));
        assert_eq!(failure.to_string(), "adxl: FAILED (503900): channel 0 stopped");
        assert_eq!(failure.report(), "adxl: FAILED (503900): channel 0 stopped: outer: inner");
        assert_eq!(failure.code_of(CodeFamily::Adxl), Some(503_900));
        assert_eq!(failure.code_of(CodeFamily::Acl), None);
        assert_eq!(failure.state(), TransferState::Failed);
    }

    #[test]
    fn only_a_timeout_times_a_task_out() {
        assert_eq!(TransferFailure::watchdog().state(), TransferState::Timeout);
        for kind in [FailureKind::Rejected, FailureKind::PeerLost, FailureKind::Network, FailureKind::Shutdown] {
            assert_eq!(TransferFailure::new("x", kind, "m").state(), TransferState::Failed);
        }
    }
}
