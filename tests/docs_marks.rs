//! Every *inferred* or *unverified* mark of docs/hardware.md has a row in docs/HARDWARE_TESTING.md's table
//! "Assumptions and the hardware tests" (the row names the mark's section and a phrase of the marked line), every
//! row's phrase is still in that section, and every test a row names is an `#[ignore]`d test of the hardware tier
//! (`tests/npu_hardware.rs`, `tests/npu_assumptions.rs`, `tests/npu_doctor_assumptions.rs`,
//! `tests/npu_build_assumptions.rs`); a row without a test says why ("none (source)", "none (not relied on)", "none
//! yet") after a colon. A mark is `*inferred`, `*unverified`, `inferred*` or `unverified*` in any case (`*Inferred*`
//! opening a sentence is one).

use std::path::Path;

const TABLE_HEADING: &str = "## Assumptions and the hardware tests";
const HARDWARE_TIER: [&str; 5] = [
    "tests/npu_hardware.rs",
    "tests/npu_assumptions.rs",
    "tests/npu_doctor_assumptions.rs",
    "tests/npu_build_assumptions.rs",
    "tests/npu_cache_assumptions.rs",
];

/// A marked line of hardware.md: its section number, its line number and text.
#[derive(Debug)]
struct Mark {
    section: u32,
    line: usize,
    text: String,
}

fn is_marked(line: &str) -> bool {
    let line = line.to_ascii_lowercase();
    ["*unverified", "*inferred", "unverified*", "inferred*"].iter().any(|mark| line.contains(mark))
}

/// The marks of the numbered sections (the grading legend above them is no mark).
fn marks(hardware: &str) -> Vec<Mark> {
    let mut section = None;
    let mut out = Vec::new();
    for (index, line) in hardware.lines().enumerate() {
        if let Some(rest) = line.strip_prefix("## ") {
            section = rest.split('.').next().and_then(|n| n.trim().parse().ok());
        } else if let Some(section) = section.filter(|_| is_marked(line)) {
            out.push(Mark { section, line: index + 1, text: line.to_owned() });
        }
    }
    out
}

/// The lines of each numbered section of hardware.md.
fn section_text(hardware: &str, wanted: u32) -> String {
    let mut section = None;
    let mut out = String::new();
    for line in hardware.lines() {
        if let Some(rest) = line.strip_prefix("## ") {
            section = rest.split('.').next().and_then(|n| n.trim().parse::<u32>().ok());
        } else if section == Some(wanted) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The cells of a table row, split at `|` not escaped as `\|`.
fn cells(row: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut previous = ' ';
    for c in row.trim().trim_start_matches('|').trim_end_matches('|').chars() {
        if c == '|' && previous != '\\' {
            out.push(String::new());
        } else {
            out.last_mut().expect("a cell").push(c);
        }
        previous = c;
    }
    out.into_iter().map(|cell| cell.trim().to_owned()).collect()
}

/// A row of the table: the hardware.md reference (section, phrase) if any, and the test column.
#[derive(Debug)]
struct Row {
    assumption: String,
    reference: Option<(u32, String)>,
    test: String,
}

fn rows(testing: &str) -> Result<Vec<Row>, String> {
    let start = testing.find(TABLE_HEADING).ok_or_else(|| format!("no section {TABLE_HEADING:?}"))?;
    let mut out = Vec::new();
    for line in testing[start..].lines().skip(1).skip_while(|l| !l.starts_with('|')) {
        if line.starts_with("## ") {
            break;
        }
        if !line.starts_with('|') || line.starts_with("|---") || line.starts_with("| assumption ") {
            continue;
        }
        let cells = cells(line);
        if cells.len() != 5 {
            return Err(format!("a row of {} cells, not 5: {line}", cells.len()));
        }
        let reference = if cells[1] == "—" {
            None
        } else {
            let (section, phrase) = cells[1]
                .strip_prefix("section ")
                .and_then(|rest| rest.split_once(", \""))
                .and_then(|(n, phrase)| Some((n.parse::<u32>().ok()?, phrase.strip_suffix('"')?.to_owned())))
                .ok_or_else(|| format!("hardware.md cell is neither — nor section N, \"phrase\": {}", cells[1]))?;
            Some((section, phrase))
        };
        out.push(Row { assumption: cells[0].clone(), reference, test: cells[3].clone() });
    }
    if out.is_empty() {
        return Err(format!("no rows under {TABLE_HEADING:?}"));
    }
    Ok(out)
}

/// The backticked test names of a test cell (lower-case identifiers; paths and commands are not names).
fn named_tests(cell: &str) -> Vec<&str> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter(|token| {
            token.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') && token.contains('_')
        })
        .collect()
}

/// Whether `name` is an `#[ignore]`d test function in one of `sources`.
fn is_hardware_test(name: &str, sources: &[String]) -> bool {
    sources.iter().any(|source| {
        let Some(at) = source.find(&format!("fn {name}()")) else { return false };
        // The attributes and doc comments right above the function.
        let above: Vec<&str> = source[..at]
            .lines()
            .rev()
            .take_while(|line| line.trim_start().starts_with("#[") || line.trim_start().starts_with("///"))
            .collect();
        above.iter().any(|line| line.trim_start().starts_with("#[ignore"))
            && above.iter().any(|l| l.contains("#[test]"))
    })
}

/// Everything wrong, one line each.
fn check(hardware: &str, testing: &str, sources: &[String]) -> Vec<String> {
    let rows = match rows(testing) {
        Ok(rows) => rows,
        Err(e) => return vec![e],
    };
    let mut wrong = Vec::new();
    for mark in marks(hardware) {
        let covered = rows.iter().any(|row| {
            row.reference
                .as_ref()
                .is_some_and(|(section, phrase)| *section == mark.section && mark.text.contains(phrase))
        });
        if !covered {
            wrong.push(format!("hardware.md line {} (section {}) has no row: {}", mark.line, mark.section, mark.text));
        }
    }
    for row in &rows {
        if let Some((section, phrase)) = &row.reference {
            if !section_text(hardware, *section).contains(phrase.as_str()) {
                wrong.push(format!("row {:?}: section {section} of hardware.md has no {phrase:?}", row.assumption));
            }
        }
        let reasoned = ["none (source):", "none (not relied on):", "none yet:"].iter().any(|p| row.test.starts_with(p));
        if row.test.starts_with("none") {
            if !reasoned {
                wrong.push(format!(
                    "row {:?}: a row without a test gives its kind and reason: {}",
                    row.assumption, row.test
                ));
            }
            continue;
        }
        let names = named_tests(&row.test);
        if names.is_empty() {
            wrong.push(format!("row {:?} names no test: {}", row.assumption, row.test));
        }
        for name in names {
            if !is_hardware_test(name, sources) {
                wrong.push(format!(
                    "row {:?} names `{name}`, which is no #[ignore]d test of {}",
                    row.assumption,
                    HARDWARE_TIER.join(" or ")
                ));
            }
        }
    }
    wrong
}

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn every_mark_of_hardware_md_has_a_row_naming_a_hardware_test() {
    let sources: Vec<String> = HARDWARE_TIER.iter().map(|path| read(path)).collect();
    let hardware = read("docs/hardware.md");
    assert!(marks(&hardware).len() >= 20, "the marks were not found: {:?}", marks(&hardware));
    let wrong = check(&hardware, &read("docs/HARDWARE_TESTING.md"), &sources);
    assert!(wrong.is_empty(), "docs/HARDWARE_TESTING.md's table is out of step:\n{}", wrong.join("\n"));
}

/// The check finds a mark without a row, a stale phrase, a test that does not exist and a row with no reason.
#[test]
fn the_check_finds_what_is_missing() {
    let hardware = "legend: *inferred* means...\n## 1. One\nthe counter is 50 MHz (*inferred*).\n## 2. Two\n\
                    the ring holds depth - 1 (*unverified*).\n";
    let table = |rows: &str| {
        format!(
            "{TABLE_HEADING}\n\n| assumption | hardware.md | twin | hardware test | CONFIRMED / REFUTED |\n\
             |---|---|---|---|---|\n{rows}"
        )
    };
    let sources =
        vec!["#[test]\n#[ignore = \"hardware\"]\nfn counter_two_npus() {}\n#[test]\nfn twin_only() {}\n".to_owned()];
    let good = table(
        "| counter | section 1, \"is 50 MHz\" | 50 MHz | `counter_two_npus` | ok |\n\
         | ring | section 2, \"depth - 1\" | — | none yet: needs a probe | — |\n",
    );
    assert_eq!(check(hardware, &good, &sources), Vec::<String>::new());
    let one_row = table("| counter | section 1, \"is 50 MHz\" | 50 MHz | `counter_two_npus` | ok |\n");
    let wrong = check(hardware, &one_row, &sources);
    assert!(wrong.len() == 1 && wrong[0].contains("line 5 (section 2) has no row"), "{wrong:?}");
    let stale = table(
        "| counter | section 2, \"is 50 MHz\" | 50 MHz | `counter_two_npus` | ok |\n\
         | ring | section 2, \"depth - 1\" | — | `ring_two_npus`, `twin_only` | — |\n\
         | other | — | — | none: no reason kind | — |\n",
    );
    let wrong = check(hardware, &stale, &sources).join("\n");
    for expected in [
        "line 3 (section 1) has no row",
        "section 2 of hardware.md has no \"is 50 MHz\"",
        "names `ring_two_npus`, which is no #[ignore]d test",
        "names `twin_only`, which is no #[ignore]d test",
        "gives its kind and reason",
    ] {
        assert!(wrong.contains(expected), "{expected:?} not in:\n{wrong}");
    }
    assert_eq!(check(hardware, "no table", &sources), vec![format!("no section {TABLE_HEADING:?}")]);
    // A mark in another case is a mark: `*Inferred*` opening a sentence, `*UNVERIFIED*`.
    let capitals =
        format!("{hardware}## 3. Three\n- *Inferred*, not stated by any source: the flag.\nit is *UNVERIFIED*.\n");
    let wrong = check(&capitals, &good, &sources).join("\n");
    for expected in ["line 7 (section 3) has no row", "line 8 (section 3) has no row"] {
        assert!(wrong.contains(expected), "{expected:?} not in:\n{wrong}");
    }
}
