//! What the docs point a reader to exists: every backticked path of this repository's files (`tests/...`,
//! `host/...`, `benches/...`, `kernels/...`, `shmem-bindings/...` with a file extension) in README.md and docs/ names a
//! file of the workspace root or of one of its crates (a crate's own `tests/...` is cited from inside it), and the
//! crate's module map (`host/lib.rs`) names every public module.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Where the cited file of a path's first segment may lie.
const PREFIXES: &[&str] = &["tests/", "host/", "benches/", "kernels/", "shmem-bindings/"];

/// The workspace root and every crate directory under it: a cited path resolves against any of them.
fn roots() -> Vec<PathBuf> {
    let root = PathBuf::from(ROOT);
    let mut roots = vec![root.clone(), root.join("host/capi"), root.join("host/python")];
    let bindings = std::fs::read_dir(root.join("shmem-bindings")).expect("shmem-bindings/");
    roots.extend(bindings.filter_map(|entry| entry.ok()).map(|entry| entry.path()).filter(|p| p.is_dir()));
    roots
}

/// The backticked spans of `text` that look like a path of this repository with a file extension.
fn cited_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for span in line.split('`').skip(1).step_by(2) {
            let is_path = span.chars().all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c));
            let has_extension = Path::new(span).extension().is_some_and(|e| e.to_str().is_some_and(|e| !e.is_empty()));
            if is_path && has_extension && PREFIXES.iter().any(|prefix| span.starts_with(prefix)) {
                found.push((number + 1, span.to_owned()));
            }
        }
    }
    found
}

fn missing_in(file: &Path, roots: &[PathBuf]) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    cited_paths(&text)
        .into_iter()
        .filter(|(_, path)| !roots.iter().any(|root| root.join(path).exists()))
        .map(|(line, path)| format!("{}:{line}: `{path}` does not exist", file.display()))
        .collect()
}

#[test]
fn every_path_the_docs_cite_exists() {
    let roots = roots();
    let root = Path::new(ROOT);
    let mut files = vec![root.join("README.md")];
    let docs = std::fs::read_dir(root.join("docs")).expect("docs/");
    files.extend(
        docs.filter_map(|entry| entry.ok())
            .map(|entry| entry.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    let missing: Vec<String> = files.iter().flat_map(|file| missing_in(file, &roots)).collect();
    assert!(missing.is_empty(), "paths cited that no longer exist:\n{}", missing.join("\n"));
}

#[test]
fn the_check_finds_a_path_that_is_not_there() {
    let dir = tempfile::tempdir().expect("temp dir");
    let doc = dir.path().join("doc.md");
    std::fs::write(&doc, "See `tests/audit.rs`, `tests/no_such_test.rs` and `host/lib.rs`; `tests/` is a folder.\n")
        .expect("written");
    assert_eq!(missing_in(&doc, &roots()), [format!("{}:1: `tests/no_such_test.rs` does not exist", doc.display())]);
}

/// Every `pub mod` of the library appears in the map at the top of `host/lib.rs` as a link (`[`name`]`).
#[test]
fn the_crate_map_names_every_public_module() {
    let lib = std::fs::read_to_string(Path::new(ROOT).join("host/lib.rs")).expect("host/lib.rs");
    let map: String = lib.lines().filter(|line| line.starts_with("//!")).collect::<Vec<_>>().join("\n");
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|rest| rest.trim_end_matches(';').trim())
        .collect();
    assert!(modules.len() > 10, "{modules:?}");
    let unnamed: Vec<&&str> = modules.iter().filter(|m| !map.contains(&format!("[`{m}`]"))).collect();
    assert!(unnamed.is_empty(), "host/lib.rs's map does not name {unnamed:?}");
}
