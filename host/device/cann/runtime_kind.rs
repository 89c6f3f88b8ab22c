//! Which CANN runtime a device's tables are resolved to ([`CannRuntime`]): the vendor's libraries, the twin runtime
//! loaded in their place, or the twin runtime linked in; how a loaded ACL library is told apart
//! ([`identify_runtime`], by the CANN version string it reports), whether two tables come from one loaded object, and
//! the runtime label records carry.
//!
//! Asks the loaded library and the dynamic loader only; must not open a device or choose settings (opening does, from
//! what this module says).

use std::ffi::c_void;

use ascendcl_sys::result as acl;
use ascendcl_sys::sys::ACL_PKG_NAME_CANN;
use ascendcl_sys::AclApi;

use crate::evidence::{RuntimeKind, RuntimeLabel};

/// Which CANN runtime a device's tables are resolved to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CannRuntime {
    /// The vendor's libraries (`libascendcl.so`, `libshmem.so`, `libcann_hixl.so`), loaded by the `-sys` crates'
    /// loaders, on an NPU.
    Vendor,
    /// The twin runtime's shared library (the `cann-twin` cdylib) loaded by the same loaders in place of the vendor's,
    /// identified by what it reports ([`identify_runtime`]). Driven exactly as the vendor's runtime (stream
    /// exceptions, no channel reset, HiXL from the loaded library) except for the kernel object and counter rate,
    /// which are the twin's.
    LoadedTwin,
    /// The twin runtime (`cann_twin`) linked into this process.
    Twin,
}

/// Whether two functions lie in one loaded object (the dynamic loader's base address of each, by `dladdr`): one copy
/// of a library however it was named. When the loader cannot say, they are taken to be.
pub(super) fn same_loaded_object(a: *const c_void, b: *const c_void) -> bool {
    let base = |address: *const c_void| {
        // SAFETY: all-zero is a valid `Dl_info` (null pointers); dladdr only reads the loader's tables and fills it.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a live out-pointer; any address may be asked about.
        (unsafe { libc::dladdr(address, &mut info) } != 0).then_some(info.dli_fbase as usize)
    };
    match (base(a), base(b)) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// What a loaded ACL library says it is, by the one rule the backend uses to choose its kernel object: the version
/// string `aclsysGetCANNVersion` reports for the CANN package. Exactly [`cann_twin::TWIN_VERSION_STRING`]: the twin
/// runtime of this build ([`CannRuntime::LoadedTwin`], which runs the twin kernel object embedded in this binary).
/// Any other answer, or no answer (the call missing or failing): the vendor's runtime ([`CannRuntime::Vendor`],
/// which runs the NPU kernel object). The twin runtime of another version (`cann-twin <other>`) is refused: the twin
/// kernel object and the runtime that runs it are built from one tree. File names are never looked at.
pub fn identify_runtime(acl: &AclApi) -> Result<CannRuntime, String> {
    let Ok(version) = acl::version::package(acl, ACL_PKG_NAME_CANN) else {
        return Ok(CannRuntime::Vendor);
    };
    // Kept for the records' runtime label (the process loads one vendor ACL): no second call to ask again.
    let _ = REPORTED_VERSION.set(version.clone());
    if version == cann_twin::TWIN_VERSION_STRING {
        return Ok(CannRuntime::LoadedTwin);
    }
    match version.strip_prefix(cann_twin::RUNTIME_NAME).filter(|rest| rest.is_empty() || rest.starts_with(' ')) {
        Some(_) => Err(format!(
            "{} is the twin runtime {version:?}, but this binary's twin kernel object is for {:?}: load the twin \
             runtime built with this binary (tests/support/twin_cann_libs.sh)",
            acl.path().display(),
            cann_twin::TWIN_VERSION_STRING
        )),
        None => Ok(CannRuntime::Vendor),
    }
}

/// The label of `runtime`: the twin's version string for either twin, or what the vendor's ACL reported for the CANN
/// package when [`identify_runtime`] asked (`"unknown"` when it reported nothing).
pub(super) fn runtime_label(runtime: CannRuntime) -> RuntimeLabel {
    match runtime {
        CannRuntime::Twin | CannRuntime::LoadedTwin => {
            RuntimeLabel::new(RuntimeKind::Twin, cann_twin::TWIN_VERSION_STRING)
        }
        CannRuntime::Vendor => {
            RuntimeLabel::new(RuntimeKind::Npu, REPORTED_VERSION.get().map_or("unknown", String::as_str))
        }
    }
}

/// The CANN package version the loaded ACL reported to [`identify_runtime`].
static REPORTED_VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
