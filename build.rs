//! Builds the transfer kernel (see `shmem-bindings/ascendc-build`): always for the CPU twin (linked in, and as the
//! kernel object the twin runtime loads); also for the NPU when feature `cann` is on and the CANN toolkit is found.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let kernels = manifest.join("kernels");
    ascendc_build::rerun_on_kernel_sources(&kernels);
    ascendc_build::build_twin(&kernels);
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let twin_object = ascendc_build::build_twin_object(&kernels, &out_dir);
    println!("cargo:rustc-env=AIV_TWIN_KERNEL_OBJECT={}", twin_object.display());
    println!("cargo:rustc-check-cfg=cfg(aiv_npu_kernel)");
    if env::var_os("CARGO_FEATURE_CANN").is_some() {
        build_npu_kernel(&kernels);
    }
}

/// The NPU object, embedded by `host/device/kernel_image.rs` when present (cfg `aiv_npu_kernel`). The outcome is
/// printed either way: which recipe ran and why, or why there is no NPU object.
fn build_npu_kernel(kernels: &std::path::Path) {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let required = ascendc_build::npu_required();
    let environment = ascendc_build::Environment::from_process();
    match ascendc_build::build_npu_kernel(kernels, &out_dir, &environment) {
        Ok(kernel) => {
            println!("cargo:warning=NPU kernel built (unverified on hardware): {}", kernel.summary);
            println!("cargo:rustc-cfg=aiv_npu_kernel");
            println!("cargo:rustc-env=AIV_NPU_KERNEL_OBJECT={}", kernel.object.display());
        }
        Err(reason) if required => {
            panic!("the NPU kernel was required ({}=1) but cannot be built: {reason}", ascendc_build::REQUIRE_NPU_ENV)
        }
        Err(reason) => {
            println!("cargo:warning=NPU kernel not built (CPU twin kernel only): {reason}");
        }
    }
}
