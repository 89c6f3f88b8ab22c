//! The evidence counts have one definition (`src/evidence.rs`) that every reader reads: the cdylib exports its layout
//! (`cannTwinEvidenceLayout`), the support scripts' ctypes reader (`tests/support/twin_evidence.py`) builds its
//! structure from that export and reads every count of `CannTwinEvidenceV2::count_names()`, and no Python reader of the
//! counts keeps a list of the names.
//!
//! Needs python3 (the support scripts' interpreter) and cargo (to build the cdylib); without them the test that runs
//! the reader is skipped with a `SKIPPED` line (a failure under `CI=true`).

mod common;
#[path = "../../../tests/common/skip.rs"]
mod skip;

use std::path::PathBuf;
use std::process::Command;

use cann_twin::evidence::CannTwinEvidenceV2;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_support_scripts_reader_builds_its_structure_from_the_library_s_layout() {
    let Some(library) = common::cdylib() else {
        skip::skip("CARGO is not set (the test binary was not run by cargo), so the cdylib cannot be built");
        return;
    };
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let output = match Command::new(&python).arg(repo().join("tests/support/twin_evidence.py")).arg(&library).output() {
        Ok(output) => output,
        Err(error) => {
            skip::skip(&format!("{python} does not run here ({error}), so the ctypes reader cannot be run"));
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "twin_evidence.py failed ({}):\n{stderr}", output.status);
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    let names: Vec<&str> = CannTwinEvidenceV2::count_names().collect();
    let counts: Vec<&str> = answer["counts"].as_array().expect("counts").iter().filter_map(|n| n.as_str()).collect();
    assert_eq!(counts, names, "the reader's names are the definition's, in layout order");
    assert_eq!(answer["size"].as_u64(), Some(std::mem::size_of::<CannTwinEvidenceV2>() as u64), "{answer}");
    assert_eq!(answer["version"].as_u64(), Some(u64::from(cann_twin::evidence::EVIDENCE_VERSION)), "{answer}");
    let read = answer["read"].as_object().expect("a reading");
    for name in &names {
        assert!(read.get(*name).and_then(|n| n.as_u64()).is_some(), "no count {name} read: {answer}");
    }
    assert_eq!(read.len(), names.len(), "{answer}");
    // The reading went through the structure: the header the library wrote names the runtime.
    assert!(answer["runtime"].as_str().is_some_and(|r| r.starts_with("cann-twin ")), "{answer}");
}

#[test]
fn no_python_reader_of_the_counts_keeps_a_list_of_their_names() {
    let readers = [
        "tests/support/twin_evidence.py",
        "tests/support/mooncake_over_aiv.py",
        "tests/support/mooncake_store_over_aiv.py",
        "host/audit/mooncake/driver.py",
    ];
    for reader in readers {
        let path = repo().join(reader);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()));
        assert!(text.contains("cannTwinEvidence"), "{reader} does not read the counts any more: update this list");
        // A rule of the script's own may name one count (a state count); a list of them names many.
        let named: Vec<&str> = CannTwinEvidenceV2::count_names()
            .filter(|name| text.contains(&format!("\"{name}\"")) || text.contains(&format!("'{name}'")))
            .collect();
        assert!(named.len() <= 1, "{reader} names the counts {named:?}: build the list from cannTwinEvidenceLayout");
    }
}
