//! The shared layouts, checked at compile time from one source. The Rust mirror (`aiv_transport::kernel_abi`,
//! [`layout_facts`]) is the list of every size, field offset and constant the Host and the kernel share; this test
//! renders it as `static_assert`s into `kernels/include/aiv/layout_asserts.h` (the facts of `layouts.h`) and
//! `kernels/include/aiv/roce_asserts.h` (those of `roce.h`), which the two headers include, so every build of the
//! kernel (the NPU object and the CPU twin) fails when C and Rust disagree.
//!
//! - `generated_asserts_are_up_to_date`: the checked-in headers equal what the Rust side renders now;
//!   `AIV_BLESS=1 cargo test --test layout_probe` rewrites them.
//! - `the_headers_compile_with_their_asserts`: the host C++ compiler accepts `layouts.h` and `roce.h` with them.
//! - `a_changed_offset_fails_the_build_naming_the_field`: mutations (an offset in the generated header, a field's
//!   type in `layouts.h`, a constant in `roce.h`) in a copy of `kernels/include` fail to compile with the name.
//! - `hardware_layouts_are_as_documented`: the hardware layouts have the offsets docs/hardware.md section 4 and
//!   docs/rdma.md give, independently of both mirrors.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use aiv_transport::kernel_abi::{layout_facts, roce::roce_facts};

const BLESS: &str = "AIV_BLESS=1 cargo test --test layout_probe";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `static_assert` for one fact (`size.<type>`, `offset.<type>.<field>`, `const.<macro>`); the message names it.
fn assert_line(name: &str, value: u64) -> String {
    let (check, what) = if let Some(ty) = name.strip_prefix("size.") {
        (format!("sizeof({ty})"), format!("{ty}: size"))
    } else if let Some(rest) = name.strip_prefix("offset.") {
        let (ty, field) = rest.split_once('.').unwrap_or_else(|| panic!("malformed fact {name}"));
        (format!("__builtin_offsetof({ty}, {field})"), format!("{ty}.{field}: offset"))
    } else if let Some(constant) = name.strip_prefix("const.") {
        (constant.to_owned(), format!("{constant}: value"))
    } else {
        panic!("unknown kind of fact {name}");
    };
    format!("static_assert({check} == {value}ull, \"{what} {value} in host/kernel_abi\");\n")
}

/// The generated header for `header` (`layouts.h` or `roce.h`) from `facts`.
fn render(file: &str, header: &str, guard: &str, facts: &[(String, u64)]) -> String {
    let mut out = format!(
        "// {file}: GENERATED from the Rust mirror of aiv/{header} (host/kernel_abi, layout_facts) by\n\
         // tests/layout_probe.rs. Do not edit; regenerate with `{BLESS}`.\n\
         //\n\
         // Every size, field offset and constant of aiv/{header} as the Host sees them, checked when aiv/{header}\n\
         // is compiled (it includes this file at its end): the NPU and the CPU twin builds of the kernel fail with\n\
         // the name of a field or constant that differs. Only static_assert, sizeof and __builtin_offsetof.\n\
         #ifndef {guard}\n#define {guard}\n\n"
    );
    for (name, value) in facts {
        out.push_str(&assert_line(name, *value));
    }
    out.push_str("\n#endif\n");
    out
}

/// The two generated headers: (path under kernels/include/aiv, contents).
fn generated() -> [(&'static str, String); 2] {
    let roce = roce_facts();
    let roce_names: BTreeSet<&str> = roce.iter().map(|(name, _)| name.as_str()).collect();
    let layouts: Vec<(String, u64)> =
        layout_facts().into_iter().filter(|(name, _)| !roce_names.contains(name.as_str())).collect();
    [
        ("layout_asserts.h", render("layout_asserts.h", "layouts.h", "AIV_LAYOUT_ASSERTS_H", &layouts)),
        ("roce_asserts.h", render("roce_asserts.h", "roce.h", "AIV_ROCE_ASSERTS_H", &roce)),
    ]
}

/// With `AIV_BLESS=1`, rewrites the generated headers, once and before any test of this file reads them. (The twin
/// build leaves the asserts out under `AIV_BLESS=1`, so the crate builds even while they are stale.)
fn bless_if_asked() {
    static BLESSED: std::sync::Once = std::sync::Once::new();
    BLESSED.call_once(|| {
        if std::env::var("AIV_BLESS").as_deref() != Ok("1") {
            return;
        }
        for (file, text) in generated() {
            let path = root().join("kernels/include/aiv").join(file);
            std::fs::write(&path, &text).unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
        }
    });
}

#[test]
fn generated_asserts_are_up_to_date() {
    bless_if_asked();
    let dir = root().join("kernels/include/aiv");
    let mut stale = Vec::new();
    for (file, text) in generated() {
        let path = dir.join(file);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current != text {
            stale.push(format!("kernels/include/aiv/{file}"));
        }
    }
    assert!(
        stale.is_empty(),
        "{} differ from the Rust mirror (host/kernel_abi): regenerate with `{BLESS}` and commit the result",
        stale.join(" and ")
    );
}

/// Compiles a translation unit that includes `layouts.h` and `roce.h` from `include`; the compiler's error output on
/// failure.
fn compile_headers(include: &Path) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("headers.cpp");
    std::fs::write(&source, "#include \"aiv/layouts.h\"\n#include \"aiv/roce.h\"\n").expect("write source");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let output = Command::new(&compiler)
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"])
        .arg(format!("-I{}", include.display()))
        .arg(&source)
        .output()
        .unwrap_or_else(|error| panic!("cannot run the C++ compiler {compiler:?}: {error}"));
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[test]
fn the_headers_compile_with_their_asserts() {
    bless_if_asked();
    if let Err(errors) = compile_headers(&root().join("kernels/include")) {
        panic!("layouts.h / roce.h do not compile with their generated asserts:\n{errors}");
    }
    // The asserts are there, one per fact.
    let mut count = 0;
    for (file, _) in generated() {
        let text = std::fs::read_to_string(root().join("kernels/include/aiv").join(file)).expect("generated header");
        count += text.matches("static_assert(").count();
    }
    assert_eq!(count, layout_facts().len(), "one static_assert per fact of layout_facts()");
}

/// A copy of `kernels/include` with `edit` applied to `file` (which must change it).
fn mutated_include(file: &str, edit: impl Fn(&str) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let aiv = dir.path().join("aiv");
    std::fs::create_dir_all(&aiv).expect("mkdir");
    for entry in std::fs::read_dir(root().join("kernels/include/aiv")).expect("include dir") {
        let path = entry.expect("entry").path();
        let mut text = std::fs::read_to_string(&path).expect("read header");
        if path.file_name().and_then(|name| name.to_str()) == Some(file) {
            let edited = edit(&text);
            assert_ne!(edited, text, "the mutation of {file} changed nothing");
            text = edited;
        }
        std::fs::write(aiv.join(path.file_name().expect("name")), text).expect("write header");
    }
    dir
}

#[test]
fn a_changed_offset_fails_the_build_naming_the_field() {
    bless_if_asked();
    // (file, text, its replacement, what the compiler's error must name)
    let cases = [
        (
            "layout_asserts.h",
            "__builtin_offsetof(AivSdmaSqe, length) == 28ull",
            "__builtin_offsetof(AivSdmaSqe, length) == 29ull",
            "AivSdmaSqe.length: offset",
        ),
        ("layouts.h", "uint32_t doorbells;        // 28", "uint64_t doorbells;        // 28", "AivDcqEntry: size"),
        ("layouts.h", "    uint32_t lkey;             // 40: RDMA only\n", "", "AivRequestEntry.rkey: offset"),
        ("roce.h", "#define AIV_ROCE_WQE_STRIDE 64u", "#define AIV_ROCE_WQE_STRIDE 128u", "AIV_ROCE_WQE_STRIDE: value"),
    ];
    for (file, from, to, expected) in cases {
        let include = mutated_include(file, |text| text.replace(from, to));
        match compile_headers(include.path()) {
            Ok(()) => panic!("the mutation of {file} compiled; expected an error naming {expected}"),
            Err(errors) => assert!(errors.contains(expected), "the error does not name {expected}:\n{errors}"),
        }
    }
}

#[test]
fn hardware_layouts_are_as_documented() {
    let facts: std::collections::BTreeMap<String, u64> = layout_facts().into_iter().collect();
    // docs/hardware.md section 4: the SDMA SQE and the channel record.
    for (name, expected) in [
        ("size.AivSdmaSqe", 64),
        ("offset.AivSdmaSqe.kernel_credit", 14),
        ("offset.AivSdmaSqe.opcode_word", 16),
        ("offset.AivSdmaSqe.length", 28),
        ("offset.AivSdmaSqe.src_addr_low", 32),
        ("offset.AivSdmaSqe.dst_addr_high", 44),
        ("offset.AivSdmaSqe.link_type", 48),
        ("size.AivChannelRecord", 64),
        ("offset.AivChannelRecord.sq_reg_base", 16),
        ("offset.AivChannelRecord.cqe_addr", 40),
        ("offset.AivChannelRecord.dev_id", 56),
        ("offset.AivRingHeader.tail", 64),
        // docs/rdma.md: the RoCE WQE, SGE and CQE.
        ("size.AivRoceWqe", 32),
        ("offset.AivRoceWqe.byte16", 12),
        ("offset.AivRoceWqe.rkey", 20),
        ("offset.AivRoceWqe.va", 24),
        ("size.AivRoceSge", 16),
        ("offset.AivRoceSge.addr", 8),
        ("size.AivRoceCqe", 32),
        ("offset.AivRoceCqe.byte16", 12),
        ("offset.AivRoceCqe.byte_cnt", 16),
        ("const.AIV_ROCE_STATUS_REMOTE_ACCESS_ERR", 0x13),
        ("const.AIV_ROCE_STATUS_TRANSPORT_RETRY_EXC_ERR", 0x15),
        ("size.AivQpRecord", 128),
        ("offset.AivQpRecord.sq_pi", 64),
    ] {
        assert_eq!(facts.get(name), Some(&expected), "{name}");
    }
    assert!(facts.len() > 100, "layout_facts() lists only {} facts", facts.len());
}
