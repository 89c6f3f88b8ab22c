//! The results pages (docs/RESULTS.md, docs/BASELINES.md) are what the recorded reports in docs/results/ render, and
//! read as results, not as a lab notebook.
//!
//! - `the_pages_are_rendered_from_the_recorded_reports`: each page equals what `aiv audit --results-pages
//!   docs/results` renders from its template and the reports; `AIV_BLESS=1 cargo test --test results_pages` rewrites
//!   them.
//! - `the_pages_hold_no_dated_narration`: no page or template names an issue, a session, a time of day, a date other
//!   than a report's "recorded on" field, a re-measurement or a "before this change".
//! - `the_narration_check_finds_each_kind`, `a_changed_page_is_found`: each check fails on a page made to fail it.

use std::path::{Path, PathBuf};

use aiv_transport::audit::pages;

const BLESS: &str = "AIV_BLESS=1 cargo test --test results_pages";

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")
}

/// What a page must not say, each with the reason a reader gets.
fn narration() -> Vec<(regex::Regex, &'static str)> {
    let rules = [
        (r"(?i)\bissues?\s*#?\d", "an issue reference"),
        (r"(?i)\bsessions?\b", "a session"),
        (r"(^|[^\d.:])[0-2]?\d:[0-5]\d([^\d]|$)", "a time of day"),
        (r"(?i)\butc\b", "a time of day"),
        (r"\b\d{4}-\d{2}-\d{2}\b", "a date outside a \"recorded on\" field"),
        (r"(?i)re-?measured", "a re-measurement"),
        (r"(?i)before (this|the|that) (change|session)", "a before-and-after story"),
    ];
    rules.into_iter().map(|(pattern, why)| (regex::Regex::new(pattern).expect("a valid pattern"), why)).collect()
}

/// Every line of `text` that narrates, as `line N: why: the line`. The generated "recorded on <time>" fields are the
/// one place a date may stand.
fn narrating_lines(text: &str) -> Vec<String> {
    let recorded = regex::Regex::new(r"recorded on \d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z").expect("a valid pattern");
    let table_date = regex::Regex::new(r"\| \d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z \|").expect("a valid pattern");
    let rules = narration();
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = recorded.replace_all(line, "recorded on");
        let line_without_fields = table_date.replace_all(&line, "| |");
        for (rule, why) in &rules {
            if rule.is_match(&line_without_fields) {
                found.push(format!("line {}: {why}: {}", number + 1, text.lines().nth(number).unwrap_or_default()));
            }
        }
    }
    found
}

#[test]
fn the_pages_are_rendered_from_the_recorded_reports() {
    let rendered = pages::render(&docs().join("results")).unwrap_or_else(|e| panic!("rendering the pages: {e}"));
    let names: Vec<&str> = rendered.iter().map(|page| page.file.as_str()).collect();
    assert_eq!(names, ["BASELINES.md", "RESULTS.md"], "the templates of docs/results/");
    let bless = std::env::var("AIV_BLESS").as_deref() == Ok("1");
    let mut stale = Vec::new();
    for page in rendered {
        let path = docs().join(&page.file);
        if bless {
            std::fs::write(&path, &page.text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            continue;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if on_disk != page.text {
            let first = on_disk
                .lines()
                .zip(page.text.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(on_disk.lines().count().min(page.text.lines().count()));
            stale.push(format!("docs/{} differs from its rendering from line {}", page.file, first + 1));
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nthe pages are rendered from docs/results/ (edit the templates there, or record the reports again with \
         `bash docs/results/regenerate.sh --record`); to take the rendering: {BLESS}",
        stale.join("\n")
    );
}

#[test]
fn the_pages_hold_no_dated_narration() {
    let results = docs().join("results");
    let mut files = vec![docs().join("RESULTS.md"), docs().join("BASELINES.md")];
    let mut templates: Vec<PathBuf> = std::fs::read_dir(&results)
        .expect("docs/results/")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.to_string_lossy().ends_with(".template.md"))
        .collect();
    templates.sort();
    files.extend(templates);
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        found.extend(narrating_lines(&text).into_iter().map(|line| format!("{}: {line}", file.display())));
    }
    assert!(found.is_empty(), "dated narration on a results page (history stays in git):\n{}", found.join("\n"));
}

#[test]
fn the_narration_check_finds_each_kind() {
    let clean = "From `docs/results/audit.json`: commit `abc`, recorded on 2026-12-07T17:40:05Z, 90 s.\n\
                 | `docs/results/audit.json` | `aiv audit` | `abc` | 2026-12-07T17:40:05Z | 2 CPUs | 0.50 |\n\
                 | aiv | 0.09 (0.07-0.11) | 18.5 | 10.234.18.1:40000 |\n";
    assert_eq!(narrating_lines(clean), Vec::<String>::new());
    for (mutated, why) in [
        ("As issue 14 asked, the target is met.", "an issue reference"),
        ("Before this session's change the figure was higher.", "a session"),
        ("Measured from 13:30 UTC on the VM.", "a time of day"),
        ("Runs at 18:25-18:35.", "a time of day"),
        ("The post cost target side by side (2026-12-06).", "a date outside"),
        ("Re-measured on the merged code.", "a re-measurement"),
        ("The figure before this change was 20 ns.", "a before-and-after story"),
    ] {
        let found = narrating_lines(&format!("{clean}{mutated}\n"));
        assert!(found.iter().any(|line| line.contains(why)), "{mutated:?} not found as {why}: {found:?}");
    }
}

#[test]
fn a_changed_page_is_found() {
    let results = docs().join("results");
    let page = pages::render(&results).expect("the pages render").into_iter().next().expect("a page");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let copy = dir.path().join("results");
    std::fs::create_dir(&copy).expect("created");
    for entry in std::fs::read_dir(&results).expect("docs/results/").filter_map(|entry| entry.ok()) {
        std::fs::copy(entry.path(), copy.join(entry.file_name())).expect("copied");
    }
    // A template's prose changed: the page rendered from it is no longer the one on disk.
    let template = copy.join(page.file.replace(".md", ".template.md"));
    let text = std::fs::read_to_string(&template).expect("the template");
    std::fs::write(&template, text.replacen("\n\n", "\n\nA sentence the page does not have.\n\n", 1)).expect("written");
    let again = pages::render(&copy).expect("the pages render").into_iter().find(|p| p.file == page.file);
    assert_ne!(again.map(|p| p.text), Some(page.text), "a changed template must change its page");
    // A report's figure changed: the tables rendered from it change.
    let report = copy.join("audit.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("audit.json")).expect("JSON");
    json["verdicts"][0]["aiv_direct"] = serde_json::Value::from("mutated");
    std::fs::write(&report, json.to_string()).expect("written");
    let before = pages::render(&results).expect("the pages render");
    let after = pages::render(&copy).expect("the pages render");
    let changed = before.iter().zip(&after).filter(|(a, b)| a.text != b.text).count();
    assert!(changed >= 1, "a changed report must change the pages rendered from it");
}
