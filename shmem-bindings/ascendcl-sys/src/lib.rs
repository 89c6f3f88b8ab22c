//! `ascendcl-sys`: runtime-loaded bindings to the Ascend Computing Language runtime (`libascendcl.so`).
//!
//! It will hold hand-written declarations of exactly the ACL entry points this project calls (devices, streams,
//! notify, memory, VMM, IPC, copies, binary load and kernel launch), resolved at run time into one function table
//! per library (candidate names under an explicit override, then `ASCEND_HOME_PATH`, then the loader path; a load
//! error lists every path tried; symbols only newer CANN versions have are optional). Nothing here links against
//! CANN at build time, so the default build needs nothing installed. Its declarations are checked against the
//! vendor's real headers by the ABI conformance test.
