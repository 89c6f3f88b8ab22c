//! The CANN libraries' side of readiness: each library found by its `-sys` crate's loader rules (override
//! variable, install roots, the dynamic loader), with its version where a version source exists, and the device
//! count the loaded runtime reports beside the `/dev/davinci<N>` nodes.
//!
//! A library that exports `cannTwinEvidence` is the twin runtime's (a twin-only C function): it is reported as such
//! and never counted as the vendor's.

use ascendcl_sys::loader::{LibrarySpec, LoadError};

use super::item::Item;
use super::DoctorReport;
use crate::device::cann::CannRuntime;

/// Where `libllm_datadist.so` (ADXL's `adxl::AdxlEngine`, which Mooncake's Ascend wheel loads) is looked for by the
/// doctor: `AIV_LLM_DATADIST_LIB`, else the toolkit's library directories, else the dynamic loader. Nothing else in
/// this project loads it.
pub const LLM_DATADIST_LIBRARY: LibrarySpec = LibrarySpec {
    file_name: "libllm_datadist.so",
    override_var: "AIV_LLM_DATADIST_LIB",
    roots: &[("ASCEND_HOME_PATH", ascendcl_sys::loader::ASCEND_HOME_LIBRARY_DIRS)],
};

/// What opening one library showed.
struct Opened {
    path: String,
    twin: bool,
}

fn open(spec: &LibrarySpec) -> Result<Opened, String> {
    let candidates = spec.candidates_from_process_env();
    match spec.open(&candidates) {
        Ok((library, path)) => {
            // SAFETY: only the symbol's presence is asked; nothing is called or read through it.
            let twin = unsafe { library.get::<*const ()>(b"cannTwinEvidence\0") }.is_ok();
            Ok(Opened { path: path.display().to_string(), twin })
        }
        Err(LoadError::NotFound { attempts, .. }) => Err(attempts
            .iter()
            .map(|attempt| {
                format!("{} (from {}: {})", attempt.candidate.path.display(), attempt.candidate.origin, attempt.reason)
            })
            .collect::<Vec<_>>()
            .join(", ")),
        Err(other) => Err(other.to_string()),
    }
}

/// One library's item. `required`: missing when absent, else warn. `version` gives its version text for the path
/// it was found at.
fn library(
    name: &'static str,
    spec: &LibrarySpec,
    required: bool,
    why: &str,
    version: &dyn Fn(&str) -> String,
) -> Item {
    let fix = format!(
        "{why}: source the CANN set_env.sh (ASCEND_HOME_PATH), or set {} to the library's full path",
        spec.override_var
    );
    let absent = |found: Option<String>, looked_for: String| {
        if required {
            Item::missing(name, found, looked_for, &fix)
        } else {
            Item::warn(name, found, looked_for, &fix)
        }
    };
    match open(spec) {
        Err(tried) => absent(None, tried),
        Ok(opened) if opened.twin => absent(
            Some(format!("{}: the twin runtime's library, not the vendor's", opened.path)),
            format!("{} by the loader's rules", spec.file_name),
        ),
        Ok(opened) => Item::ok(
            name,
            format!("{} ({})", opened.path, version(&opened.path)),
            format!("{} by the loader's rules", spec.file_name),
        ),
    }
}

/// The four library items, in order.
pub fn libraries(report: &DoctorReport) -> Vec<Item> {
    let runtime = report.runtime.as_ref();
    let acl_version = |path: &str| match runtime.filter(|runtime| runtime.loaded_from == path) {
        Some(runtime) => {
            let interface = match &runtime.acl_interface {
                Ok((a, b, c)) => format!("ACL {a}.{b}.{c}"),
                Err(error) => format!("aclrtGetVersion failed: {error}"),
            };
            let cann = match runtime.packages.iter().find(|(package, _)| *package == "CANN") {
                Some((_, Ok(version))) => format!("CANN {version}"),
                Some((_, Err(error))) => format!("aclsysGetCANNVersion failed: {error}"),
                None => "CANN version not queried".into(),
            };
            format!("{interface}, {cann}")
        }
        None => "version not queried: the loaded ACL table is another file".into(),
    };
    let shmem_version = |_: &str| match runtime.and_then(|runtime| runtime.shmem_version.clone()) {
        Some(Ok((major, minor))) => format!("SHMEM {major}.{minor}"),
        Some(Err(error)) => format!("aclshmem_info_get_version failed: {error}"),
        None => "version not queried: the SHMEM table did not load".into(),
    };
    let unknown = |_: &str| "version unknown: the library has no version query this project knows".to_string();
    vec![
        library(
            "libascendcl.so",
            &ascendcl_sys::sys::ASCENDCL_LIBRARY,
            true,
            "the cann backend needs it",
            &acl_version,
        ),
        library(
            "libshmem.so",
            &cann_shmem_sys::sys::SHMEM_LIBRARY,
            true,
            "the cann backend needs it (CANN SHMEM, SHMEM_HOME_PATH)",
            &shmem_version,
        ),
        library(
            "libcann_hixl.so",
            &ascendcl_sys::hixl::HIXL_LIBRARY,
            false,
            "only the adxl baseline needs it",
            &unknown,
        ),
        library(
            "libllm_datadist.so",
            &LLM_DATADIST_LIBRARY,
            false,
            "only Mooncake's Ascend wheel (the mooncake-ascend audit path) needs it",
            &unknown,
        ),
    ]
}

/// `device count`: `aclrtGetDeviceCount` of the vendor's runtime beside the number of `/dev/davinci<N>` nodes.
pub fn device_count(report: &DoctorReport, nodes: usize) -> Item {
    let looked_for = format!("aclrtGetDeviceCount of the loaded runtime; {nodes} /dev/davinci<N> nodes");
    let fix = "make libascendcl.so of the vendor's CANN loadable (see the libascendcl.so line) and the NPUs visible \
               (see the device nodes line)";
    let Some(runtime) = report.runtime.as_ref() else {
        return Item::missing(
            "device count",
            Some(format!("no runtime loaded; {nodes} device nodes")),
            looked_for,
            fix,
        );
    };
    if runtime.identity == Ok(CannRuntime::LoadedTwin) {
        return Item::missing(
            "device count",
            Some(format!("the loaded runtime is the twin runtime's library; {nodes} device nodes")),
            looked_for,
            fix,
        );
    }
    match &runtime.devices {
        Ok(0) => Item::missing(
            "device count",
            Some(format!("the runtime reports 0 NPUs; {nodes} device nodes")),
            looked_for,
            fix,
        ),
        Ok(count) if *count as usize == nodes => {
            Item::ok("device count", format!("{count} NPUs (runtime and device nodes agree)"), looked_for)
        }
        Ok(count) => Item::warn(
            "device count",
            Some(format!("the runtime reports {count} NPUs, /dev has {nodes} davinci<N> nodes: they differ")),
            looked_for,
            "check ASCEND_RT_VISIBLE_DEVICES and the container's --device list",
        ),
        Err(error) => {
            Item::missing("device count", Some(format!("aclrtGetDeviceCount failed: {error}")), looked_for, fix)
        }
    }
}

/// `this aiv binary`: built with feature `cann` and the NPU kernel object embedded. A warning, not a missing item:
/// it is about the build, not the machine, and the machine's own items say whether a build here can embed it.
pub fn binary(report: &DoctorReport) -> Item {
    let looked_for = "feature `cann` and the NPU kernel object in this binary".to_string();
    let fix = "AIV_REQUIRE_NPU_KERNEL=1 cargo build --release --features cann (needs the compiler and headers above)";
    match (report.cann_feature, report.npu_kernel_embedded) {
        (true, true) => Item::ok("this aiv binary", "feature cann, NPU kernel object embedded".into(), looked_for),
        (true, false) => {
            Item::warn("this aiv binary", Some("feature cann, NPU kernel object NOT embedded".into()), looked_for, fix)
        }
        (false, _) => Item::warn("this aiv binary", Some("built without feature cann".into()), looked_for, fix),
    }
}
