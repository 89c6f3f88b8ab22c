//! A source tree given as a path: walked (bounded depth, symlinks and build directories skipped), its source files
//! and AI-CPU op registrations grouped into components by their first path segments.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::aicpu::{parse_registrations, registration_evidence, AiCpuOps, Registration};
use super::read::{extension_of, problem, read_source};
use super::schema::{ComponentKind, InspectReport};
use super::source::{device_macros, scan_source, SourceFile};
use super::verdict::Sink;
use super::{MAX_DEPTH, REGISTRATION_EXTENSIONS, SOURCE_EXTENSIONS};

/// A source tree: files grouped by their first three path segments relative to the root.
pub(super) fn inspect_tree(root: &Path, given: &AiCpuOps, report: &mut InspectReport) {
    let shown_root = root.display().to_string();
    let mut groups: BTreeMap<String, Vec<SourceFile>> = BTreeMap::new();
    // AI-CPU op registrations, by group: (file shown, its entries).
    let mut registrations: BTreeMap<String, Vec<(String, Vec<Registration>)>> = BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) => {
                problem(report, dir.display().to_string(), format!("unreadable directory: {e}"));
                continue;
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_symlink() {
                continue;
            }
            if kind.is_dir() {
                let skipped = matches!(name.as_str(), "target" | ".git" | "node_modules") || name.contains("venv");
                if !skipped && depth < MAX_DEPTH {
                    stack.push((path, depth + 1));
                }
                continue;
            }
            let extension = extension_of(&path);
            let source = SOURCE_EXTENSIONS.contains(&extension.as_str());
            let registration = REGISTRATION_EXTENSIONS.contains(&extension.as_str());
            if !kind.is_file() || !(source || registration) {
                continue;
            }
            let relative = path.strip_prefix(root).unwrap_or(&path);
            let segments: Vec<String> =
                relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            let text = match read_source(&path, len) {
                Ok(Some(text)) => text,
                Ok(None) => continue,
                Err(e) => {
                    problem(report, path.display().to_string(), format!("unreadable: {e}"));
                    continue;
                }
            };
            let group = segments.iter().take(3).cloned().collect::<Vec<_>>().join("/");
            let shown = segments.join("/");
            if source {
                groups.entry(group).or_default().push(SourceFile { shown, extension, text });
            } else {
                let found = parse_registrations(&shown, &extension, &text);
                if !found.is_empty() {
                    registrations.entry(group).or_default().push((shown, found));
                }
            }
        }
    }
    // Device-qualifier macros and AI-CPU op registrations are taken from the whole tree: a kernel uses the qualifier
    // its platform header defines, and a Host file launches the ops another directory registers.
    let mut macros = HashMap::new();
    for files in groups.values() {
        for (name, at) in device_macros(files) {
            macros.entry(name).or_insert(at);
        }
    }
    let mut ops = given.clone();
    for entries in registrations.values() {
        for (shown, found) in entries {
            ops.add(shown, found.clone());
        }
    }
    for group in registrations.keys() {
        groups.entry(group.clone()).or_default();
    }
    for (group, mut files) in groups {
        files.sort_by(|a, b| a.shown.cmp(&b.shown));
        let mut sink = Sink::default();
        let mut read = files.len();
        for (_, found) in registrations.get(&group).map(Vec::as_slice).unwrap_or_default() {
            read += 1;
            for registration in found {
                sink.push(registration_evidence(registration, &ops));
            }
        }
        for file in &files {
            scan_source(file, &macros, &ops, &mut sink);
        }
        report.components.push(sink.finish(group, ComponentKind::SourceTree, &shown_root, read));
    }
}
