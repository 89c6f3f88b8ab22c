//! What one observation of the hardware tier says about its assumption, and the line a test prints for it
//! (included with `#[path]` by `tests/npu_assumptions.rs` and `tests/npu_doctor_assumptions.rs`).
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
