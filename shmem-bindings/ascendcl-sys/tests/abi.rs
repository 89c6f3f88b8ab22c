//! ABI conformance: the Rust declarations, rendered by `abi::AbiManifest::to_cpp`, compiled against C headers.
//!
//! Tiers:
//! - always run (needs only a C++ compiler): the generator and compiler accept a declaration set that matches a
//!   small header written here, and reject each kind of mismatch (prototype, struct layout, enum value, constant).
//! - vendor (`#[ignore]`d; `tests/run.sh` runs them with `--ignored`): the same against the real ACL headers from
//!   the `torch-npu` wheel. Set `AIV_CANN_INCLUDE` to the wheel's `torch_npu/include` directory to run them by hand:
//!   `AIV_CANN_INCLUDE=... cargo test -p ascendcl-sys --test abi -- --ignored`.

use std::path::PathBuf;

use ascendcl_sys::abi::{compile_check, AbiManifest, ConstDecl};
use ascendcl_sys::sys;

fn vendor_include_dirs() -> Vec<PathBuf> {
    ascendcl_sys::abi::vendor_include_dirs().unwrap_or_else(|reason| panic!("{reason}"))
}

#[test]
#[ignore = "needs the vendor headers: run through tests/run.sh, or set AIV_CANN_INCLUDE and pass --ignored"]
fn acl_declarations_match_the_vendor_headers() {
    let dirs = vendor_include_dirs();
    let manifest = sys::abi_manifest();
    let work = tempfile::tempdir().expect("temporary directory");
    if let Err(failure) = compile_check(&manifest.to_cpp(), "acl_abi.cpp", &dirs, work.path()) {
        panic!("{failure}");
    }
    println!("{}", manifest.summary("ACL"));
}

#[test]
#[ignore = "needs the vendor headers: run through tests/run.sh, or set AIV_CANN_INCLUDE and pass --ignored"]
fn profiling_declarations_match_the_vendor_headers() {
    let dirs = vendor_include_dirs();
    let manifest = ascendcl_sys::prof::abi_manifest();
    let work = tempfile::tempdir().expect("temporary directory");
    if let Err(failure) = compile_check(&manifest.to_cpp(), "prof_abi.cpp", &dirs, work.path()) {
        panic!("{failure}");
    }
    // A wrong one fails: the data types as a 32-bit word.
    let mut wrong = ascendcl_sys::prof::abi_manifest();
    let create = wrong.functions.iter_mut().find(|f| f.name == "aclprofCreateConfig").expect("declared");
    create.params[4] = "uint32_t".into();
    let failure = compile_check(&wrong.to_cpp(), "prof_wrong.cpp", &dirs, work.path())
        .expect_err("a wrong declaration must not compile");
    assert!(failure.stderr.contains("aclprofCreateConfig"), "{}", failure.stderr);
    println!("{}", manifest.summary("ACL profiling"));
}

#[test]
#[ignore = "needs the vendor headers: run through tests/run.sh, or set AIV_CANN_INCLUDE and pass --ignored"]
fn each_kind_of_wrong_acl_declaration_fails_against_the_vendor_headers() {
    let dirs = vendor_include_dirs();
    let work = tempfile::tempdir().expect("temporary directory");
    type Mutation = Box<dyn Fn(&mut AbiManifest)>;
    let mutations: Vec<(&str, Mutation)> = vec![
        (
            "aclrtMemcpy",
            Box::new(|m: &mut AbiManifest| {
                let memcpy = m.functions.iter_mut().find(|f| f.name == "aclrtMemcpy").expect("declared");
                memcpy.params[4] = "int32_t".into(); // the kind passed as a plain int
            }),
        ),
        (
            "aclrtMemcpyAsync",
            Box::new(|m: &mut AbiManifest| {
                let copy = m.functions.iter_mut().find(|f| f.name == "aclrtMemcpyAsync").expect("declared");
                copy.params[2] = "void *".into(); // const dropped from the source
            }),
        ),
        (
            "aclrtPhysicalMemProp",
            Box::new(|m: &mut AbiManifest| {
                let prop = m.structs.iter_mut().find(|s| s.name == "aclrtPhysicalMemProp").expect("declared");
                prop.fields[4].offset += 4;
            }),
        ),
        (
            "ACL_MEMCPY_DEVICE_TO_HOST",
            Box::new(|m: &mut AbiManifest| {
                let kind = m.enums.iter_mut().find(|e| e.name == "aclrtMemcpyKind").expect("declared");
                kind.values[2].1 = 1;
            }),
        ),
        (
            "ACL_ERROR_RT_MEMORY_ALLOCATION",
            Box::new(|m: &mut AbiManifest| {
                m.consts = vec![ConstDecl { name: "ACL_ERROR_RT_MEMORY_ALLOCATION", value: 207_002 }];
            }),
        ),
    ];
    for (index, (culprit, mutate)) in mutations.iter().enumerate() {
        let mut manifest = sys::abi_manifest();
        mutate(&mut manifest);
        let failure = compile_check(&manifest.to_cpp(), &format!("wrong_{index}.cpp"), &dirs, work.path())
            .expect_err("a wrong declaration must not compile");
        assert!(failure.stderr.contains(culprit), "the diagnostics should name {culprit}:\n{}", failure.stderr);
    }
}

/// A miniature "vendor" header and a Rust mirror of it written with the crate's own declaration macros, so the
/// whole path (macros -> manifest -> C++ -> compiler) is exercised in every `cargo test`.
mod miniature {
    ascendcl_sys::c_enum! {
        pub enum mini_kind_t: u32 {
            MINI_A = 1,
            MINI_B = 5,
        }
    }

    ascendcl_sys::c_struct! {
        pub struct mini_pair_t {
            pub first: u32,
            pub second: u64,
            pub kind: mini_kind_t,
        }
    }

    ascendcl_sys::c_consts! {
        pub table MINI_CONSTS: i32;
        MINI_LIMIT = 7;
    }

    ascendcl_sys::dynamic_library! {
        pub struct MiniApi;
        required {
            fn mini_copy(dst: *mut core::ffi::c_void, src: *const core::ffi::c_void, kind: mini_kind_t) -> i32;
        }
        optional {
            fn mini_pair(pair: *mut mini_pair_t);
        }
    }

    pub const HEADER: &str = "#include <stdint.h>\n\
        typedef enum { MINI_A = 1, MINI_B = 5 } mini_kind_t;\n\
        typedef struct { uint32_t first; uint64_t second; mini_kind_t kind; } mini_pair_t;\n\
        static const int MINI_LIMIT = 7;\n\
        extern \"C\" int mini_copy(void *dst, const void *src, mini_kind_t kind);\n\
        extern \"C\" void mini_pair(mini_pair_t *pair);\n";

    pub fn manifest() -> ascendcl_sys::abi::AbiManifest {
        ascendcl_sys::abi::AbiManifest {
            headers: vec!["mini.h"],
            functions: MiniApi::function_decls(),
            structs: vec![mini_pair_t::abi_decl()],
            enums: vec![mini_kind_t::abi_decl()],
            consts: MINI_CONSTS
                .iter()
                .map(|(name, value)| ascendcl_sys::abi::ConstDecl { name, value: i128::from(*value) })
                .collect(),
        }
    }
}

#[test]
fn the_generator_accepts_a_match_and_rejects_every_kind_of_mismatch() {
    let work = tempfile::tempdir().expect("temporary directory");
    std::fs::write(work.path().join("mini.h"), miniature::HEADER).expect("write header");
    let dirs = vec![work.path().to_path_buf()];

    let good = miniature::manifest();
    assert_eq!(good.functions.len(), 2);
    assert_eq!(good.functions[0].c_function_type(), "int32_t(void *, void const *, mini_kind_t)");
    assert!(good.functions[1].optional);
    if let Err(failure) = compile_check(&good.to_cpp(), "good.cpp", &dirs, work.path()) {
        panic!("the matching declarations must compile: {failure}");
    }

    let mut wrong_prototype = miniature::manifest();
    wrong_prototype.functions[0].params[1] = "void *".into();
    let mut wrong_offset = miniature::manifest();
    wrong_offset.structs[0].fields[1].offset = 4;
    let mut wrong_size = miniature::manifest();
    wrong_size.structs[0].size = 16;
    let mut wrong_field_type = miniature::manifest();
    wrong_field_type.structs[0].fields[0].c_type = "int32_t".into();
    let mut wrong_enum_value = miniature::manifest();
    wrong_enum_value.enums[0].values[1].1 = 4;
    let mut wrong_enum_repr = miniature::manifest();
    wrong_enum_repr.enums[0].repr = "int32_t".into();
    let mut wrong_const = miniature::manifest();
    wrong_const.consts[0].value = 8;
    for (index, (culprit, manifest)) in [
        ("mini_copy", wrong_prototype),
        ("mini_pair_t::second", wrong_offset),
        ("sizeof(mini_pair_t)", wrong_size),
        ("mini_pair_t::first", wrong_field_type),
        ("MINI_B", wrong_enum_value),
        ("underlying type of mini_kind_t", wrong_enum_repr),
        ("MINI_LIMIT", wrong_const),
    ]
    .into_iter()
    .enumerate()
    {
        let failure = compile_check(&manifest.to_cpp(), &format!("bad{index}.cpp"), &dirs, work.path())
            .expect_err("a mismatch must not compile");
        assert!(failure.stderr.contains(culprit), "diagnostics should name {culprit}:\n{}", failure.stderr);
    }
}
