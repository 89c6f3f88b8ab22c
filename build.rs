//! Builds the transfer kernels (see `shmem-bindings/ascendc-build`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
