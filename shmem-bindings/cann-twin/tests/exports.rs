//! The table resolves every required symbol to the twin, and the cdylib exports each implemented function under
//! its unmangled C name.

use std::path::PathBuf;
use std::process::Command;

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
    assert!(api.aclrtMapMem.is_some() && api.aclrtHostRegister.is_some());
    assert!(api.aclrtLaunchKernel.is_none() && api.aclrtMemExportToShareableHandle.is_none());
}

#[test]
fn the_cdylib_exports_the_functions_unmangled() {
    // The test binary lives in <target>/<profile>/deps; the cdylib in <target>/<profile>.
    let exe = std::env::current_exe().expect("current exe");
    let library: Option<PathBuf> = exe.parent().and_then(|deps| deps.parent()).map(|dir| dir.join("libcann_twin.so"));
    let Some(library) = library.filter(|path| path.exists()) else {
        eprintln!("skipped: libcann_twin.so not found next to the test binary");
        return;
    };
    let output = match Command::new("nm").args(["-D", "--defined-only"]).arg(&library).output() {
        Ok(output) if output.status.success() => output,
        _ => {
            eprintln!("skipped: nm is not available");
            return;
        }
    };
    let symbols = String::from_utf8_lossy(&output.stdout);
    let exported: Vec<&str> = symbols
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
            (kind == "T").then_some(name)
        })
        .collect();
    for name in cann_twin::EXPORTED {
        assert!(exported.contains(name), "{name} is not exported unmangled by {}", library.display());
    }
}
