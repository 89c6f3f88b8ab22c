//! `cann-shmem-sys`: runtime-loaded bindings to CANN SHMEM (`libshmem.so`, library name ACLSHMEM).
//!
//! It will hold the host API this project calls (bootstrap by unique id, `aclshmemx_init_attr`, heap allocation,
//! `aclshmem_ptr`, finalize) and Rust mirrors of its C structs (`aclshmemx_init_attr_t`, the unique id), with their
//! documented sizes and offsets asserted and the C++ default member initialisers reproduced by constructors, since
//! no C header package exists to check them against.
