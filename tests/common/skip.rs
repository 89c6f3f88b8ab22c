//! Skipping a test whose prerequisite is missing (included with `#[path]` by every test file that can skip, in
//! `tests/` and in `shmem-bindings/*/tests`; not a test target of its own).
//!
//! [`skip`] writes one line, `SKIPPED: <test>: <reason>`, to the process's stderr and the test then returns (and
//! passes). The line goes to the stderr handle itself, not through `eprintln!`: the test harness captures what
//! `eprintln!` prints and shows it only for a failing test, so a skipped test's line would never be seen. Written
//! directly, it appears in `cargo test`'s output beside the test's `ok` (`grep 'SKIPPED: '` finds every one).
//!
//! Under `CI=true` [`skip`] panics with the same reason instead (and no `SKIPPED` line): CI installs every
//! prerequisite (`tests/run.sh`), so a missing one there is a failure, never a pass.
//!
//! Not skips, and so not reported through here: the `#[ignore]`d hardware tier (selected by `AIV_NPU_TESTS=1`, see
//! docs/HARDWARE_TESTING.md), `#[ignore]`d measurements, and the child halves of two-process tests (a test that
//! does nothing unless its parent started it with a role variable set).
#![allow(dead_code)]

use std::io::Write as _;

/// Whether this run is CI's (`CI=true`), where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The running test's name: the harness names each test's thread after the test.
pub fn test_name() -> String {
    std::thread::current().name().unwrap_or("this test").to_owned()
}

/// Reports that the running test is skipped because of `reason` (what is missing, and how to provide it); the caller
/// returns next. Panics instead under `CI=true`.
pub fn skip(reason: &str) {
    let test = test_name();
    assert!(!in_ci(), "{test} cannot run here, and under CI=true a missing prerequisite fails the test: {reason}");
    write_line(&format!("SKIPPED: {test}: {reason}"));
}

/// Writes the running test's `SKIPPED` line without the CI check: for a tier selected by hand (the hardware tier),
/// where a test that was not selected is no failure anywhere.
pub fn not_selected(reason: &str) {
    write_line(&format!("SKIPPED: {}: {reason}", test_name()));
}

/// `line` on stderr past the harness's capture, in one write (lines of tests running in parallel do not interleave).
fn write_line(line: &str) {
    let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
}
