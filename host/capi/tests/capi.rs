//! The C ABI from C: builds `libaiv_transport.so` (`cargo build -p aiv-transport-capi`, the cargo running this
//! test), compiles `tests/c/aiv_transport_test.c` against `include/aiv_transport.h` with the system's C compiler
//! (`$CC`, else `cc`), and runs its cases: transfers between two processes with data checked on both sides and the
//! evidence AIV-direct, the documented codes of wrong calls, and a peer killed with a batch in flight. The header is
//! also compiled as C++ (`$CXX`, else `c++`), as the C++ consumers include it, and its layouts, status codes and
//! enumeration values are compared with the library's Rust definitions.
//!
//! A missing compiler skips the C cases with a `SKIPPED` line (a failure under `CI=true`).

#[path = "../../../tests/common/skip.rs"]
mod skip;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Builds the library with the cargo that runs this test (its profile and target directory); the library's path.
fn build_library() -> Result<PathBuf, String> {
    let mut command = Command::new(env!("CARGO"));
    command.args(["build", "--quiet", "-p", "aiv-transport-capi", "--message-format=json"]);
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let output = command.current_dir(crate_dir()).output().map_err(|error| format!("run cargo: {error}"))?;
    if !output.status.success() {
        return Err(format!("cargo build -p aiv-transport-capi failed:\n{}", String::from_utf8_lossy(&output.stderr)));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact" && message["target"]["name"] == "aiv_transport")
        .filter(|message| message["target"]["kind"].as_array().is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib")))
        .find_map(|message| {
            message["filenames"]
                .as_array()?
                .iter()
                .filter_map(|name| name.as_str())
                .find(|name| name.ends_with(".so"))
                .map(PathBuf::from)
        })
        .ok_or_else(|| "cargo built no libaiv_transport.so".to_owned())
}

/// Whether `compiler` runs.
fn available(compiler: &str) -> bool {
    Command::new(compiler).arg("--version").output().is_ok_and(|output| output.status.success())
}

/// The test program, built once per test process; `Err` with the reason to skip when there is no C compiler.
fn program() -> Result<&'static Path, String> {
    static PROGRAM: OnceLock<Result<(tempfile::TempDir, PathBuf), String>> = OnceLock::new();
    let built = PROGRAM.get_or_init(|| {
        let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        if !available(&compiler) {
            return Err(format!("no C compiler ({compiler:?} does not run; set CC or install one, e.g. gcc)"));
        }
        let library = build_library().unwrap_or_else(|error| panic!("{error}"));
        let library_dir = library.parent().expect("the library's directory");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("aiv_transport_test");
        let output = Command::new(&compiler)
            .args(["-std=c11", "-D_GNU_SOURCE", "-O1", "-Wall", "-Wextra", "-Werror", "-pedantic"])
            .arg(format!("-I{}", crate_dir().join("include").display()))
            .arg(crate_dir().join("tests/c/aiv_transport_test.c"))
            .arg(format!("-L{}", library_dir.display()))
            .arg("-laiv_transport")
            .arg(format!("-Wl,-rpath,{}", library_dir.display()))
            .arg("-o")
            .arg(&path)
            .output()
            .expect("the C compiler runs");
        assert!(
            output.status.success(),
            "the C test program does not compile:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok((dir, path))
    });
    built.as_ref().map(|(_, path)| path.as_path()).map_err(Clone::clone)
}

/// Runs one case of the test program and asserts that it passed; its output.
fn run_case(args: &[&str]) -> Option<Output> {
    let program = match program() {
        Ok(program) => program,
        Err(reason) => {
            skip::skip(&reason);
            return None;
        }
    };
    let output = Command::new(program)
        .args(args)
        .env_remove("MOONCAKE_CONFIG_PATH")
        .env_remove("MOONCAKE_PROTOCOL")
        .output()
        .expect("the test program runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "case {args:?} failed ({}):\n{stdout}\n{stderr}", output.status);
    eprintln!("{stdout}");
    Some(output)
}

#[test]
fn two_processes_move_random_ranges_between_device_buffers_over_aiv_and_the_evidence_says_aiv_direct() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    eprintln!("seed {seed}");
    let Some(output) = run_case(&["transfers", &seed.to_string()]) else { return };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("submitted by: AIV-direct"), "{stdout}");
    assert!(stdout.contains("every checksum equal on both sides"), "{stdout}");
}

#[test]
fn wrong_calls_return_their_documented_codes_and_messages() {
    run_case(&["errors"]);
}

#[test]
fn a_peer_killed_with_a_batch_in_flight_fails_it_within_the_transfer_timeout() {
    let Some(output) = run_case(&["peer-killed"]) else { return };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("a batch to the dead target: state 2"), "{stdout}");
}

#[test]
fn a_transfer_into_host_memory_the_peer_registered_is_refused_as_an_invalid_argument_and_the_peer_stays_usable() {
    let Some(output) = run_case(&["host-target"]) else { return };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("a write into the target's Host memory: state 2, error -1"), "{stdout}");
}

#[test]
fn the_header_compiles_as_cpp() {
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if !available(&compiler) {
        skip::skip(&format!("no C++ compiler ({compiler:?} does not run; set CXX or install one, e.g. g++)"));
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("include.cpp");
    std::fs::write(&source, "#include \"aiv_transport.h\"\nint main() {\n    aiv_request_t request{};\n    return static_cast<int>(request.length);\n}\n")
        .expect("write");
    let output = Command::new(&compiler)
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only"])
        .arg(format!("-I{}", crate_dir().join("include").display()))
        .arg(&source)
        .output()
        .expect("the C++ compiler runs");
    assert!(
        output.status.success(),
        "the header does not compile as C++:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `aiv_mem_region_t` for `AivMemRegion`.
fn c_name(rust: &str) -> String {
    let mut name = String::new();
    for (i, c) in rust.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_lowercase());
    }
    name + "_t"
}

/// The numbers between `prefix` and `suffix` on each line of `text` that has both, keyed by what `key` makes of
/// the text before the number.
fn numbers(text: &str, prefix: &str, key: impl Fn(&str) -> Option<String>) -> BTreeMap<String, i64> {
    let mut found = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix(prefix) else { continue };
        let Some((what, number)) = rest.rsplit_once("==") else { continue };
        let number: String = number.trim().chars().take_while(|c| c.is_ascii_digit()).collect();
        if let (Some(what), Ok(number)) = (key(what.trim()), number.parse()) {
            found.insert(what, number);
        }
    }
    found
}

/// The fields of every struct of `text` (C or Rust) opened by a line starting with `opener`, as `type.field` (the
/// type as `name_of` makes its C name), in order.
fn struct_fields(text: &str, opener: &str, name_of: impl Fn(&str) -> String) -> Vec<String> {
    let mut fields = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix(opener) {
            if let Some(name) = rest.strip_suffix('{').map(str::trim).filter(|name| !name.is_empty()) {
                current = Some(name_of(name));
                continue;
            }
        }
        if line.starts_with('}') {
            current = None;
            continue;
        }
        let Some(name) = &current else { continue };
        let declaration = line.split("/*").next().unwrap_or("").trim().trim_start_matches("pub ");
        let Some(declaration) = declaration.strip_suffix(';').or_else(|| declaration.strip_suffix(',')) else {
            continue;
        };
        // Rust: `field: Type`; C: `type field` or `type field[N]`.
        let field = match declaration.split_once(':') {
            Some((field, _)) => field.trim().to_owned(),
            None => declaration.rsplit(' ').next().unwrap_or("").split('[').next().unwrap_or("").to_owned(),
        };
        if !field.is_empty() && !field.starts_with('_') {
            fields.push(format!("{name}.{field}"));
        }
    }
    fields
}

#[test]
fn the_header_and_the_library_agree_on_layouts_codes_and_enumerations() {
    let header = std::fs::read_to_string(crate_dir().join("include/aiv_transport.h")).expect("the header");
    let lib = std::fs::read_to_string(crate_dir().join("src/lib.rs")).expect("lib.rs");
    let status = std::fs::read_to_string(crate_dir().join("src/status.rs")).expect("status.rs");

    // Layouts: each side asserts its real layout against its numbers (static_assert, const assert!); the numbers
    // must be the same, for every field of every shared struct.
    let rust_layout = numbers(&lib, "assert!(", |what| {
        if let Some(ty) = what.strip_prefix("size_of::<").and_then(|rest| rest.strip_suffix(">()")) {
            return Some(format!("{}.size", c_name(ty)));
        }
        let (ty, field) = what.strip_prefix("offset_of!(")?.strip_suffix(')')?.split_once(',')?;
        Some(format!("{}.{}", c_name(ty.trim()), field.trim()))
    });
    let c_layout = numbers(&header, "AIV_STATIC_ASSERT(", |what| {
        if let Some(ty) = what.strip_prefix("sizeof(").and_then(|rest| rest.strip_suffix(')')) {
            return Some(format!("{ty}.size"));
        }
        let (ty, field) = what.strip_prefix("offsetof(")?.strip_suffix(')')?.split_once(',')?;
        Some(format!("{}.{}", ty.trim(), field.trim()))
    });
    assert!(!rust_layout.is_empty());
    assert_eq!(rust_layout, c_layout, "layouts asserted in src/lib.rs (left) and include/aiv_transport.h (right)");
    let rust_fields = struct_fields(&lib, "pub struct ", c_name);
    let c_fields = struct_fields(&header, "typedef struct ", |name| format!("{name}_t"));
    assert_eq!(rust_fields, c_fields, "the fields of the shared structs, in order (Rust left, C right)");
    for field in &rust_fields {
        assert!(rust_layout.contains_key(field), "no offset asserted for {field}");
    }

    // Status codes: `#define AIV_ERR_X (-N)` and `pub const X: c_int = -N;`.
    let mut c_codes = BTreeMap::new();
    for line in header.lines() {
        let Some(rest) = line.strip_prefix("#define AIV_") else { continue };
        let Some((name, value)) = rest.split_once(' ') else { continue };
        let value = value.trim().trim_start_matches('(').trim_end_matches(')');
        if let (Some(name), Ok(value)) =
            (name.strip_prefix("ERR_").or((name == "OK").then_some("OK")), value.parse::<i64>())
        {
            c_codes.insert(name.to_owned(), value);
        }
    }
    let mut rust_codes = BTreeMap::new();
    for line in status.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("pub const ") else { continue };
        let Some((name, value)) = rest.split_once(": c_int = ") else { continue };
        if let Ok(value) = value.trim_end_matches(';').parse::<i64>() {
            rust_codes.insert(name.to_owned(), value);
        }
    }
    assert!(c_codes.len() >= 14, "{c_codes:?}");
    assert_eq!(rust_codes, c_codes, "status codes of src/status.rs (left) and the header (right)");

    // Enumeration values: `AIV_X = N` and `const X: u32|i32 = N;`.
    let mut c_values = BTreeMap::new();
    for line in header.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("AIV_") else { continue };
        let Some((name, value)) = rest.split_once(" = ") else { continue };
        if let Ok(value) = value.trim_end_matches(',').parse::<i64>() {
            c_values.insert(name.to_owned(), value);
        }
    }
    let mut rust_values = BTreeMap::new();
    for line in lib.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("const ") else { continue };
        let Some((name, value)) = rest.split_once(": u32 = ").or_else(|| rest.split_once(": i32 = ")) else { continue };
        if let Ok(value) = value.trim_end_matches(';').parse::<i64>() {
            rust_values.insert(name.to_owned(), value);
        }
    }
    assert_eq!(rust_values, c_values, "enumeration values of src/lib.rs (left) and the header (right)");
    let version = format!("#define AIV_ABI_VERSION {}", lib_abi_version(&lib));
    assert!(header.contains(&version), "the header does not say {version:?}");
}

/// `ABI_VERSION` of src/lib.rs.
fn lib_abi_version(lib: &str) -> i64 {
    lib.lines()
        .find_map(|line| line.trim().strip_prefix("pub const ABI_VERSION: c_int = "))
        .and_then(|value| value.trim_end_matches(';').parse().ok())
        .expect("ABI_VERSION in src/lib.rs")
}
