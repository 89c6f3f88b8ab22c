//! `hccl-sys`: runtime-loaded bindings to the Huawei Collective Communication Library (`libhccl.so`).
//!
//! It will hold the few HCCL entry points and types this project uses (communicator bootstrap by root info, used to
//! exchange device handles between ranks), loaded at run time like `ascendcl-sys` and checked against the vendor's
//! headers by the ABI conformance test.
