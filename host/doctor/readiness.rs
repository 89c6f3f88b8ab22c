//! `aiv doctor`'s readiness checklist: is this Ascend machine ready for this project? Each item ok, missing (the
//! machine is not ready) or warn (optional: only some paths need it), with what was found or looked for and a
//! one-line fix; as text for people and as JSON for the hardware report; and the exit code of `aiv doctor --npu`
//! (0 when no item is missing, 2 otherwise).
//!
//! Only files, programs and the loaded runtime's answers are checked: nothing moves data, so "ready" means the
//! prerequisites are there, not that a transfer works. The checks' knowledge of the vendor's layout is cited where
//! it is used ([`super::system`], [`super::toolkit`]); none of it has been run on an NPU.

use std::fmt::Write as _;

use super::inputs::{Inputs, SYSROOT_ENV};
use super::item::{Item, Status};
use super::{libraries, system, toolkit, DoctorReport};

/// Exit code of `aiv doctor --npu` when an item is missing.
pub const NOT_READY_EXIT: u8 = 2;

/// The checklist.
#[derive(Clone, Debug)]
pub struct Readiness {
    /// The items, in the order printed.
    pub items: Vec<Item>,
    /// `AIV_DOCTOR_SYSROOT`, when the system paths were read below it.
    pub sysroot: Option<std::path::PathBuf>,
}

impl Readiness {
    /// Checks every item, reading what `inputs` names; the runtime's answers come from `report`.
    pub fn check(inputs: &Inputs, report: &DoctorReport) -> Readiness {
        let runtime_cann = report.runtime.as_ref().and_then(|runtime| {
            runtime
                .packages
                .iter()
                .find(|(package, _)| *package == "CANN")
                .and_then(|(_, version)| version.clone().ok())
        });
        let mut items = vec![
            system::driver(inputs),
            system::device_nodes(inputs),
            system::npu_smi(inputs),
            toolkit::cann_version(inputs, runtime_cann.as_deref()),
            toolkit::compiler(inputs),
            toolkit::headers(inputs),
        ];
        items.extend(libraries::libraries(report));
        items.push(libraries::device_count(report, system::davinci_nodes(inputs).len()));
        items.push(system::hccn(inputs));
        items.push(system::memlock());
        items.push(libraries::binary(report));
        Readiness { items, sysroot: inputs.sysroot.clone() }
    }

    /// Whether no item is missing.
    pub fn ready(&self) -> bool {
        self.items.iter().all(|item| item.status != Status::Missing)
    }

    /// The exit code of `aiv doctor --npu`.
    pub fn exit_code(&self) -> u8 {
        if self.ready() {
            0
        } else {
            NOT_READY_EXIT
        }
    }

    /// The note printed when the system paths were redirected.
    fn fake_tree_note(&self) -> Option<String> {
        self.sysroot.as_ref().map(|root| {
            format!(
                "system paths read below {} ({SYSROOT_ENV}): a fake tree proves only the doctor's logic, not that a \
                 machine is ready",
                root.display()
            )
        })
    }

    /// One line per item, an indented fix line under each item that is not ok, then the verdict.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "readiness for an Ascend NPU (files, programs and the runtime's answers; nothing moved data; unverified \
             on hardware):"
        );
        if let Some(note) = self.fake_tree_note() {
            let _ = writeln!(out, "  note: {note}");
        }
        for item in &self.items {
            let detail = match (&item.status, &item.found) {
                (Status::Ok, Some(found)) => found.clone(),
                (_, Some(found)) => format!("{found}; looked for {}", item.looked_for),
                (_, None) => format!("looked for {}", item.looked_for),
            };
            let _ = writeln!(out, "  {:<8} {:<19} {detail}", item.status.word(), item.item);
            if let Some(fix) = &item.fix {
                let _ = writeln!(out, "  {:<8} fix: {fix}", "");
            }
        }
        let missing: Vec<&str> =
            self.items.iter().filter(|item| item.status == Status::Missing).map(|item| item.item).collect();
        if missing.is_empty() {
            let _ = writeln!(out, "ready: yes (no required item missing; warnings name what only some paths need)");
        } else {
            let _ = writeln!(out, "ready: no ({} missing: {})", missing.len(), missing.join(", "));
        }
        out
    }

    /// `{"items": [{"item", "status", "found", "looked_for", "fix"}...], "ready": bool}`, plus `"note"` when the
    /// system paths were redirected.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::json!({ "items": self.items, "ready": self.ready() });
        if let Some(note) = self.fake_tree_note() {
            value["note"] = note.into();
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_item_makes_the_machine_unready() {
        let ok = Item::ok("a", "there".into(), "here".into());
        let warn = Item::warn("b", None, "there".into(), "do b");
        let mut readiness = Readiness { items: vec![ok, warn], sysroot: None };
        assert_eq!((readiness.ready(), readiness.exit_code()), (true, 0));
        assert!(readiness.render().contains("ready: yes"), "{}", readiness.render());
        readiness.items.push(Item::missing("c", None, "nowhere".into(), "install c"));
        assert_eq!((readiness.ready(), readiness.exit_code()), (false, NOT_READY_EXIT));
        let text = readiness.render();
        assert!(text.contains("ready: no (1 missing: c)") && text.contains("fix: install c"), "{text}");
        let json = readiness.to_json();
        assert_eq!(json["ready"], false);
        assert_eq!(json["items"][2]["status"], "missing");
        assert_eq!(json["items"][1]["found"], serde_json::Value::Null);
    }
}
