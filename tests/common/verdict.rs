//! What one observation of the hardware tier says about its assumption, the line a test prints for it, and how a
//! hardware test is selected and which device it opens (included with `#[path]` by the `tests/npu_*assumptions.rs`
//! files, which also include `common/skip.rs` as `skip`).
#![allow(dead_code)]

/// What one observation says about its assumption.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Confirmed(String),
    Refuted(String),
    Inconclusive(String),
}

/// The line printed for `outcome`: `CONFIRMED: <assumption>: <observed values>` (or `REFUTED:`, `INCONCLUSIVE:`).
pub fn line(assumption: &str, outcome: &Outcome) -> String {
    match outcome {
        Outcome::Confirmed(what) => format!("CONFIRMED: {assumption}: {what}"),
        Outcome::Refuted(what) => format!("REFUTED: {assumption}: {what}"),
        Outcome::Inconclusive(what) => format!("INCONCLUSIVE: {assumption}: {what}"),
    }
}

/// Prints the outcome's line and fails the test unless it is CONFIRMED.
pub fn report(assumption: &str, outcome: Outcome) {
    let line = line(assumption, &outcome);
    println!("{line}");
    assert!(matches!(outcome, Outcome::Confirmed(_)), "{line}");
}

/// Whether the hardware tests run: `AIV_NPU_TESTS=1` on an Ascend machine; otherwise a `SKIPPED:` line (a failure
/// under `CI=true`, see `common/skip.rs`).
pub fn selected() -> bool {
    if std::env::var("AIV_NPU_TESTS").as_deref() == Ok("1") {
        return true;
    }
    super::skip::not_selected("hardware test; set AIV_NPU_TESTS=1 on an Ascend machine (docs/HARDWARE_TESTING.md)");
    false
}

/// The device a one-device test opens (`AIV_NPU_DEVICE_A`, default 0).
pub fn device_id() -> u32 {
    std::env::var("AIV_NPU_DEVICE_A").ok().and_then(|value| value.parse().ok()).unwrap_or(0)
}
