//! ABI conformance of the HCCL declarations against the `torch-npu` wheel's `hccl/hccl.h` (`#[ignore]`d: run by
//! `tests/run.sh`, or by hand with `AIV_CANN_INCLUDE=<wheel>/torch_npu/include cargo test -p hccl-sys --test abi
//! -- --ignored`). The generator itself is exercised without vendor headers in `ascendcl-sys`'s `tests/abi.rs`.

use std::path::PathBuf;

use ascendcl_sys::abi::compile_check;

fn vendor_include_dirs() -> Vec<PathBuf> {
    ascendcl_sys::abi::vendor_include_dirs().unwrap_or_else(|reason| panic!("{reason}"))
}

#[test]
#[ignore = "needs the vendor headers: run through tests/run.sh, or set AIV_CANN_INCLUDE and pass --ignored"]
fn hccl_declarations_match_the_vendor_headers() {
    let dirs = vendor_include_dirs();
    let manifest = hccl_sys::sys::abi_manifest();
    let work = tempfile::tempdir().expect("temporary directory");
    if let Err(failure) = compile_check(&manifest.to_cpp(), "hccl_abi.cpp", &dirs, work.path()) {
        panic!("{failure}");
    }
    println!("{}", manifest.summary("HCCL"));
}

#[test]
#[ignore = "needs the vendor headers: run through tests/run.sh, or set AIV_CANN_INCLUDE and pass --ignored"]
fn a_wrong_hccl_declaration_fails_against_the_vendor_headers() {
    let dirs = vendor_include_dirs();
    let work = tempfile::tempdir().expect("temporary directory");
    let mut manifest = hccl_sys::sys::abi_manifest();
    let init = manifest.functions.iter_mut().find(|f| f.name == "HcclCommInitRootInfo").expect("declared");
    init.params[1] = "HcclRootInfo *".into(); // const dropped
    let failure = compile_check(&manifest.to_cpp(), "wrong.cpp", &dirs, work.path()).expect_err("must not compile");
    assert!(failure.stderr.contains("HcclCommInitRootInfo"), "{}", failure.stderr);

    let mut manifest = hccl_sys::sys::abi_manifest();
    manifest.structs[0].size = 4096;
    let failure = compile_check(&manifest.to_cpp(), "wrong2.cpp", &dirs, work.path()).expect_err("must not compile");
    assert!(failure.stderr.contains("sizeof(HcclRootInfo)"), "{}", failure.stderr);
}
