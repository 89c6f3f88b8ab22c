//! The table resolves every required symbol to the twin, and the cdylib exports each implemented function under
//! its unmangled C name.

mod common;
#[path = "../../../tests/common/skip.rs"]
mod skip;

use std::process::Command;

use common::cdylib;

#[test]
fn every_required_symbol_is_implemented() {
    let required: Vec<_> = ascendcl_sys::AclApi::function_decls()
        .into_iter()
        .filter(|decl| !decl.optional)
        .map(|decl| decl.name)
        .collect();
    for name in &required {
        assert!(cann_twin::EXPORTED.contains(name), "{name} is required but not implemented");
    }
    let declared: Vec<_> = ascendcl_sys::AclApi::function_decls().into_iter().map(|decl| decl.name).collect();
    for name in cann_twin::EXPORTED {
        assert!(declared.contains(name), "{name} is exported but not declared by ascendcl-sys");
        assert!(cann_twin::resolve(name).is_some());
    }
    assert!(cann_twin::resolve("aclrtCreateNotify").is_none(), "unimplemented optional symbols stay unresolved");
    let api = cann_twin::acl_api();
    assert!(api.is_resolved("aclrtMapMem") && api.is_resolved("aclrtHostRegister"));
    assert!(api.is_resolved("aclrtLaunchKernel") && !api.is_resolved("aclrtCreateNotify"));
}

#[test]
fn every_shmem_symbol_is_implemented() {
    let declared: Vec<_> = cann_shmem_sys::ShmemApi::function_decls().into_iter().map(|decl| decl.name).collect();
    for name in &declared {
        assert!(cann_twin::shmem::SHMEM_EXPORTED.contains(name), "{name} is declared but not implemented");
        assert!(cann_twin::resolve_shmem(name).is_some());
    }
    assert_eq!(cann_twin::shmem::SHMEM_EXPORTED.len(), declared.len());
    let api = cann_twin::shmem_api();
    assert!(
        api.g_state.is_some()
            && api.is_resolved("aclshmemx_init_status")
            && api.is_resolved("aclshmem_info_get_version")
    );
}

#[test]
fn the_cdylib_exports_the_functions_unmangled() {
    let Some(library) = cdylib() else {
        skip::skip("CARGO is not set (the test binary was not run by cargo), so the cdylib cannot be built");
        return;
    };
    let output = match Command::new("nm").args(["-D", "--defined-only"]).arg(&library).output() {
        Ok(output) if output.status.success() => output,
        _ => {
            skip::skip("nm (binutils) does not run here, so the cdylib's exports cannot be listed");
            return;
        }
    };
    let symbols = String::from_utf8_lossy(&output.stdout);
    let exported: Vec<&str> = symbols
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
            (kind == "T" || kind == "R" || kind == "D" || kind == "B").then_some(name)
        })
        .collect();
    let shmem = cann_twin::shmem::SHMEM_EXPORTED.iter().chain(cann_twin::hixl::HIXL_EXPORTED);
    // The twin-only functions of the twin's libllm_datadist.so (engine selection, FabricMem) and of the audit's
    // Mooncake driver (evidence, provenance records).
    let twin_only = cann_twin::hixl::fabric_mem::FABRIC_MEM_EXPORTED.iter().chain(&[
        "aiv_twin_register_write",
        "g_state",
        "cannTwinEvidence",
        "cannTwinEvidenceLayout",
        "cannTwinEvidenceNote",
        "cannTwinRecordProvenance",
        "cannTwinAdxlSelectEngine",
    ]);
    for name in cann_twin::EXPORTED.iter().chain(shmem).chain(twin_only) {
        assert!(exported.contains(name), "{name} is not exported unmangled by {}", library.display());
    }
}

#[test]
fn the_cdylib_loads_as_libascendcl_and_moves_data() {
    use ascendcl_sys::sys::*;
    let Some(library) = cdylib() else {
        skip::skip("CARGO is not set (the test binary was not run by cargo), so the cdylib cannot be built");
        return;
    };
    // The loader's override path, as a user pointing AIV_ASCENDCL_LIB at the twin would. The loaded copy has its
    // own runtime state, separate from the one linked into this test.
    let path = library.into_os_string();
    let env = move |name: &str| (name == "AIV_ASCENDCL_LIB").then(|| path.clone());
    let candidates = ASCENDCL_LIBRARY.candidates(&env);
    let api = ascendcl_sys::AclApi::load(&ASCENDCL_LIBRARY, &candidates).expect("the twin loads as libascendcl.so");
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; data.len()];
    let mut dev = core::ptr::null_mut();
    // SAFETY: live locals and Host buffers of the lengths passed; the device address is checked by the twin.
    unsafe {
        assert_eq!(api.aclInit(core::ptr::null()), ACL_SUCCESS);
        assert_eq!(api.aclrtSetDevice(0), ACL_SUCCESS);
        assert_eq!(api.aclrtMalloc(&mut dev, data.len(), ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
        let len = data.len();
        assert_eq!(api.aclrtMemcpy(dev, len, data.as_ptr().cast(), len, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
        assert_eq!(api.aclrtMemcpy(back.as_mut_ptr().cast(), len, dev, len, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
        assert_eq!(api.aclrtFree(dev), ACL_SUCCESS);
        assert_eq!(api.aclrtResetDevice(0), ACL_SUCCESS);
        assert_eq!(api.aclFinalize(), ACL_SUCCESS);
    }
    assert_eq!(back, data);
    assert!(api.is_resolved("aclrtMapMem") && !api.is_resolved("aclrtCreateNotify"));
}
