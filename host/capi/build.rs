//! Links libaiv_transport.so so that it exports only the `aiv_*` functions of the header: `--exclude-libs,ALL`
//! keeps the C functions of the crates linked into it (the rlib archives) local. Without it the library would also
//! export the twin runtime's (`aclrtMemcpy`, `aclInit`, `HixlCSClientCreate`, ...), which would interpose on the
//! vendor's libraries in a process that loads both.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs,ALL");
}
