//! With feature `cann` but no CANN libraries, choosing the `cann` device backend fails with the loader's error
//! listing every path it tried (its own test binary: the library tables are loaded once per process).
#![cfg(feature = "cann")]

use aiv_transport::config::{AivOptions, DeviceBackendKind};

#[test]
fn no_libraries_means_an_error_listing_every_candidate() {
    let missing = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir/libascendcl.so");
    std::env::set_var("AIV_ASCENDCL_LIB", &missing);
    let options = AivOptions { device_backend: DeviceBackendKind::Cann, ..AivOptions::default() };
    let error = aiv_transport::device::open(&options).expect_err("nothing to load");
    let message = error.to_string();
    assert!(message.contains("load the ACL runtime"), "{message}");
    assert!(message.contains(&missing.display().to_string()) && message.contains("AIV_ASCENDCL_LIB"), "{message}");
}
