//! The text a human reads: [`InspectReport::render`], per component the verdict, the reason and the evidence grouped
//! by check, then the components without evidence, the files not inspected and the caveat.

use std::fmt::Write as _;

use super::schema::{Check, Component, Evidence, InspectReport, Stance};
use super::{INSPECT_SCHEMA, MAX_EVIDENCE};

/// Evidence lines shown per check and component in [`InspectReport::render`] (the JSON has them all).
const RENDER_PER_CHECK: usize = 12;
/// One finding in one file, as [`InspectReport::render`] groups items: stance, in a comment, what, file.
type Finding<'a> = (Stance, bool, &'a str, &'a str);

/// Line numbers shown per finding and file.
const RENDER_LINES: usize = 8;

impl InspectReport {
    /// The component of that name, if any.
    pub fn component(&self, name: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.name == name)
    }

    /// The report as Markdown: per component the verdict, the reason and the evidence grouped by check; components
    /// with no evidence in one line; the problems; the caveat.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# aiv audit --inspect ({INSPECT_SCHEMA})\n");
        let _ = writeln!(out, "Inputs: {}\n", self.inputs.join(", "));
        if self.components.is_empty() {
            let _ = writeln!(out, "No components found.\n");
        }
        let mut empty = Vec::new();
        for component in &self.components {
            if component.evidence.is_empty() {
                empty.push(component.name.as_str());
                continue;
            }
            let _ = writeln!(out, "## {} ({}): {}\n", component.name, component.kind.label(), component.verdict);
            let _ = writeln!(out, "Reason: {}.", component.reason);
            if component.files_read > 0 {
                let _ = writeln!(out, "Files read: {}.", component.files_read);
            }
            for check in Check::ALL {
                let mut items: Vec<&Evidence> = component.evidence.iter().filter(|e| e.check == check).collect();
                if items.is_empty() {
                    continue;
                }
                // Counted items first, then context, then names, then comments; the same finding in one file on one
                // line.
                items.sort_by_key(|e| {
                    (e.in_comment, matches!(e.for_or_against, Stance::Neutral | Stance::Mentions), e.for_or_against)
                });
                let mut groups: Vec<(Finding, Vec<&str>)> = Vec::new();
                for item in &items {
                    let (file, line) = match item.location.rsplit_once(':') {
                        Some((file, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => {
                            (file, Some(line))
                        }
                        _ => (item.location.as_str(), None),
                    };
                    let key = (item.for_or_against, item.in_comment, item.what.as_str(), file);
                    match groups.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, lines)) => lines.extend(line),
                        None => groups.push((key, line.into_iter().collect())),
                    }
                }
                let _ = writeln!(out, "\n### {}\n", check.title());
                for ((stance, in_comment, what, file), lines) in groups.iter().take(RENDER_PER_CHECK) {
                    let stance = match stance {
                        Stance::For => "for",
                        Stance::Against => "against",
                        Stance::Neutral => "context (not counted)",
                        Stance::Mentions => "mentions only (a name, not counted)",
                    };
                    let comment = if *in_comment { ", comment only (not counted)" } else { "" };
                    let mut at = file.to_string();
                    if !lines.is_empty() {
                        let shown: Vec<&str> = lines.iter().take(RENDER_LINES).copied().collect();
                        let _ = write!(at, ":{}", shown.join(", "));
                        if lines.len() > RENDER_LINES {
                            let _ = write!(at, " and {} more lines", lines.len() - RENDER_LINES);
                        }
                    }
                    let _ = writeln!(out, "- {stance}{comment}: {what} at {at}");
                }
                if groups.len() > RENDER_PER_CHECK {
                    let _ = writeln!(out, "- ... and {} more (--json lists them all)", groups.len() - RENDER_PER_CHECK);
                }
            }
            if component.evidence_dropped > 0 {
                let _ = writeln!(
                    out,
                    "\n{} more evidence items were dropped past the limit of {MAX_EVIDENCE} per component.",
                    component.evidence_dropped
                );
            }
            out.push('\n');
        }
        if !empty.is_empty() {
            let _ = writeln!(out, "## No evidence either way (unknown)\n\n{}\n", empty.join(", "));
        }
        if !self.problems.is_empty() {
            let _ = writeln!(out, "## Not inspected\n");
            for p in &self.problems {
                let _ = writeln!(out, "- {}: {}", p.path, p.problem);
            }
            out.push('\n');
        }
        let _ = writeln!(out, "## Caveat\n\n{}", self.caveat);
        out
    }
}
