//! The results pages (docs/RESULTS.md, docs/BASELINES.md) are what the recorded reports in docs/results/ render, and
//! read as results, not as a lab notebook.
//!
//! - `the_pages_are_rendered_from_the_recorded_reports`: each page equals what `aiv audit --results-pages
//!   docs/results` renders from its template and the reports; `AIV_BLESS=1 cargo test --test results_pages` rewrites
//!   them.
//! - `the_pages_hold_no_dated_narration`: no page or template names an issue, a session, a time of day, a date other
//!   than a report's "recorded on" field, a re-measurement or a "before this change".
//! - `the_narration_check_finds_each_kind`, `a_changed_page_is_found`: each check fails on a page made to fail it.
//! - `a_kernel_report_renders_its_tables`: a sample kernel microbenchmark report renders its source line and the
//!   figures of each kernel table, and an audit generator refuses it.

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

/// A kernel report as `cargo bench --bench kernel` writes it, with two block sizes and one thread kind.
fn sample_kernel_report() -> serde_json::Value {
    let estimate = |id: &str, median: f64, bytes: Option<u64>| {
        serde_json::json!({
            "id": id, "median_ns": median, "lower_ns": median * 0.9, "upper_ns": median * 1.1,
            "confidence_level": 0.95, "bytes_per_iteration": bytes,
        })
    };
    serde_json::json!({
        "schema": "aiv-kernel-bench/1",
        "command": ["cargo", "bench", "--bench", "kernel"],
        "started_utc": "2026-12-07T19:20:00Z",
        "elapsed_s": 301.4,
        "environment": {
            "version": "0.1.0", "source_commit": "abc123", "device_backend": "twin", "runtime": null, "cpus": 2,
            "cpu_model": "Sample CPU", "memory_bytes": 8589934592u64, "os": "linux 6.1", "load_average": [0.42, 0.6, 0.7],
        },
        "benchmarks": [
            estimate("post_cost/doorbell_batch/1", 23.4, None),
            estimate("post_cost/doorbell_batch/32", 11.2, None),
            estimate("request_to_dcq/64B", 40_000.0, Some(64)),
            estimate("throughput/aiv/1048576", 2_500_000.0, Some(32 << 20)),
            estimate("throughput/memcpy/1048576", 2_600_000.0, Some(32 << 20)),
        ],
        "paired": [
            { "block": 1048576, "rounds": 201, "aiv_bytes_per_second": 13.1e9, "memcpy_bytes_per_second": 13.4e9,
              "ratio_median": 0.977, "ratio_min": 0.91, "ratio_max": 1.04 },
            { "block": 4194304, "rounds": 201, "aiv_bytes_per_second": 13.4e9, "memcpy_bytes_per_second": 13.5e9,
              "ratio_median": 0.993, "ratio_min": 0.95, "ratio_max": 1.03 },
        ],
        "idle": {
            "devices": 2, "settle_s": 3.0, "window_s": 10.0, "cpu_ns": 812_000_000u64, "share_of_core": 0.0812,
            "threads": [{ "kind": "twin device model: aiv cores", "threads": 4, "cpu_ns": 640_000_000u64 }],
        },
    })
}

#[test]
fn a_kernel_report_renders_its_tables() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let results = dir.path().join("results");
    std::fs::create_dir(&results).expect("created");
    std::fs::write(results.join("kernel.json"), sample_kernel_report().to_string()).expect("written");
    let template = "# Kernel\n\n{{runs}}\n\n{{kernel-post kernel}}\n\n{{kernel-request kernel}}\n\n\
                    {{kernel-throughput kernel}}\n\n{{idle kernel}}\n";
    std::fs::write(results.join("KERNEL.template.md"), template).expect("written");
    let page = pages::render(&results).expect("the page renders").into_iter().next().expect("a page");
    assert_eq!(page.file, "KERNEL.md");
    let text = page.text;
    let source = "From `docs/results/kernel.json`: `cargo bench --bench kernel`, commit `abc123`, recorded on \
                  2026-12-07T19:20:00Z, 301 s; 2 CPUs (Sample CPU), 8.0 GiB, linux 6.1; load average at the start \
                  0.42 / 0.60 / 0.70 (1 / 5 / 15 min); twin runtime: a model's figures, unverified on hardware.";
    assert_eq!(text.matches(source).count(), 4, "a source line beside each table:\n{text}");
    assert!(text.contains("| `docs/results/kernel.json` | `cargo bench --bench kernel` | `abc123` |"), "{text}");
    for expected in [
        "| 1 | 23.4 | 21.1-25.7 (95%) |",
        "| 32 | 11.2 | 10.1-12.3 (95%) |",
        "| `request_to_dcq/64B` | 40.0 | 36.0-44.0 (95%) |",
        "| 1 MiB | 13.42 (12.20-14.91) | 12.91 (11.73-14.34) | 13.10 | 13.40 | **0.977** (0.910-1.040) |",
        "| 4 MiB | - | - | 13.40 | 13.50 | **0.993** (0.950-1.030) |",
        "The paired columns: 201 rounds per block size.",
        "812.0 ms of CPU over a window of 10 s after 3 s of settling, **8.1% of one core**",
        "| twin device model: aiv cores | 4 | 640.0 | 6.40% |",
        "| whole process | | 812.0 | 8.12% |",
    ] {
        assert!(text.contains(expected), "{expected:?} not in the rendering:\n{text}");
    }
    assert_eq!(narrating_lines(&text), Vec::<String>::new(), "the rendering narrates");
    // An audit's generator on the kernel report, and a kernel generator on a missing report, are refused.
    std::fs::write(results.join("KERNEL.template.md"), "{{verdicts kernel}}\n").expect("written");
    let error = pages::render(&results).expect_err("verdicts of a kernel report");
    assert!(error.contains("kernel report"), "{error}");
    std::fs::write(results.join("KERNEL.template.md"), "{{idle none}}\n").expect("written");
    let error = pages::render(&results).expect_err("no such report");
    assert!(error.contains("no report none.json"), "{error}");
}
