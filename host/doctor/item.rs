//! One line of the readiness checklist: what was checked, whether it is there, what was found or looked for, and the
//! one-line fix.

use serde::Serialize;

/// Whether an item is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Found and usable.
    Ok,
    /// Optional and absent or doubtful: only some paths need it. Does not make the machine unready.
    Warn,
    /// Required and absent: the machine is not ready.
    Missing,
}

impl Status {
    /// The word printed for it.
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Missing => "missing",
        }
    }
}

/// One checked item, serialised as `{"item", "status", "found", "looked_for", "fix"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Item {
    /// What was checked, e.g. `NPU driver`.
    pub item: &'static str,
    /// Its status.
    pub status: Status,
    /// What was found (path, version), when anything was.
    pub found: Option<String>,
    /// Where it was looked for.
    pub looked_for: String,
    /// The fix, one line (a command or a setting), when the status is not `ok`.
    pub fix: Option<String>,
}

impl Item {
    /// An item found.
    pub fn ok(item: &'static str, found: String, looked_for: String) -> Item {
        Item { item, status: Status::Ok, found: Some(found), looked_for, fix: None }
    }

    /// An item not found (or not usable), with what was found of it, if anything.
    pub fn missing(item: &'static str, found: Option<String>, looked_for: String, fix: &str) -> Item {
        Item { item, status: Status::Missing, found, looked_for, fix: Some(fix.to_string()) }
    }

    /// An optional item absent or doubtful.
    pub fn warn(item: &'static str, found: Option<String>, looked_for: String, fix: &str) -> Item {
        Item { item, status: Status::Warn, found, looked_for, fix: Some(fix.to_string()) }
    }
}
