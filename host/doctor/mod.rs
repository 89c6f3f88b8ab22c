//! `aiv doctor`: is this Ascend machine ready for this project ([`readiness`]: the driver, device nodes, `npu-smi`,
//! the toolkit and compiler, the CANN libraries, the device count, the RoCE link configuration, the memlock limit),
//! which device backends are usable here, for `cann` exactly what was looked for, and what each CANN runtime (the
//! twin runtime in this binary, and the one the loaders find: the vendor's, or the twin runtime's shared library in
//! its place) says about itself, and which of the two the loaded one is
//! ([`crate::device::cann::identify_runtime`], the rule that picks the kernel object).

pub mod cli;
pub mod inputs;
pub mod item;
pub mod libraries;
pub mod readiness;
pub mod system;
pub mod toolkit;

use std::fmt::Write as _;
use std::path::PathBuf;

use ascendcl_sys::loader::{LibrarySpec, LoadError};

use crate::device::cann::CannRuntime;

/// One thing the doctor looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// What was looked for.
    pub what: String,
    /// Where it was found, or `None`.
    pub found: Option<String>,
    /// Every place that was tried.
    pub tried: Vec<String>,
}

/// What `aiv doctor` found.
#[derive(Clone, Debug)]
pub struct DoctorReport {
    /// The CPU twin is compiled into every build.
    pub twin_usable: bool,
    /// Whether this binary was built with feature `cann`.
    pub cann_feature: bool,
    /// The CANN probes, in order.
    pub cann_probes: Vec<Probe>,
    /// What the loaded ACL runtime and SHMEM say about themselves, when their libraries load.
    pub runtime: Option<RuntimeReport>,
    /// Whether this binary embeds the NPU transfer-kernel object.
    pub npu_kernel_embedded: bool,
    /// What the twin runtime (the CANN runtime the `cann-twin` backend resolves its tables to) says about itself.
    pub twin_runtime: RuntimeReport,
}

/// Answers of the loaded CANN libraries (each query's own error when it failed).
#[derive(Clone, Debug)]
pub struct RuntimeReport {
    /// Where the ACL table's functions come from (the library's path, or the in-process twin).
    pub loaded_from: String,
    /// Which runtime it is: for a loaded library, by [`crate::device::cann::identify_runtime`] (the vendor's, or the
    /// twin runtime's library); [`CannRuntime::Twin`] for the one in this binary.
    pub identity: Result<CannRuntime, String>,
    /// `aclrtGetVersion`.
    pub acl_interface: Result<(i32, i32, i32), String>,
    /// `aclsysGetCANNVersion` for the CANN, runtime, toolkit and driver packages.
    pub packages: Vec<(&'static str, Result<String, String>)>,
    /// `aclrtGetDeviceCount` (after `aclInit`).
    pub devices: Result<u32, String>,
    /// `aclshmem_info_get_version`, when libshmem.so loads (`None`: it did not).
    pub shmem_version: Option<Result<(i32, i32), String>>,
}

impl DoctorReport {
    /// Whether everything the `cann` backend needs was found: on the vendor's runtime every probe but HiXL's (which
    /// only `adxl` needs); on the twin runtime's library, `libascendcl.so` and `libshmem.so` (the twin kernel object
    /// is in every build; no toolkit, compiler or HCCL is used).
    pub fn cann_usable(&self) -> bool {
        let found = |what: &str| self.cann_probes.iter().any(|probe| probe.what == what && probe.found.is_some());
        let loaded_twin = self.runtime.as_ref().is_some_and(|runtime| runtime.identity == Ok(CannRuntime::LoadedTwin));
        self.cann_feature
            && if loaded_twin {
                found("libascendcl.so") && found("libshmem.so")
            } else {
                self.cann_probes
                    .iter()
                    .filter(|probe| probe.what != ascendcl_sys::hixl::HIXL_LIBRARY.file_name)
                    .all(|probe| probe.found.is_some())
            }
    }

    /// The report as text for the terminal.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "device backends:");
        let _ =
            writeln!(out, "  twin  usable   (the cann backend on the twin runtime, a CPU model of the NPU, built in)");
        let cann_state = if self.cann_usable() { "usable" } else { "NOT usable" };
        let _ = writeln!(
            out,
            "  cann  {cann_state}{}",
            if self.cann_feature { "" } else { " (this binary was built without feature `cann`)" }
        );
        for probe in &self.cann_probes {
            match &probe.found {
                Some(at) => {
                    let _ = writeln!(out, "    found     {:<16} {at}", probe.what);
                }
                None => {
                    let _ = writeln!(out, "    missing   {:<16} tried: {}", probe.what, probe.tried.join(", "));
                }
            }
        }
        let kernel = if self.npu_kernel_embedded { "embedded" } else { "NOT embedded (no bisheng/ccec at build time)" };
        let _ = writeln!(out, "    NPU kernel object {kernel}");
        let _ = writeln!(out, "aiv routes:");
        let _ = writeln!(out, "  sdma  between devices of one host (same boot id and network namespace)");
        let _ = writeln!(
            out,
            "  rdma  to devices on other hosts: available on the twin runtime (its twin NIC, aiv.route \"auto\" or \
             \"rdma\"); on the vendor's runtime NOT implemented (it would need HCCP's RaQpAiCreate in libra.so; \
             unverified on hardware)"
        );

        let _ = writeln!(out, "  twin runtime: loaded from {}", self.twin_runtime.loaded_from);
        render_runtime(&mut out, &self.twin_runtime);
        match &self.runtime {
            None => {
                let _ = writeln!(out, "  loaded runtime: not queried (libascendcl.so did not load)");
            }
            Some(runtime) => {
                let _ = writeln!(out, "  loaded runtime: {}", runtime.loaded_from);
                render_runtime(&mut out, runtime);
            }
        }
        out
    }
}

fn render_runtime(out: &mut String, runtime: &RuntimeReport) {
    let show = |result: &Result<String, String>| match result {
        Ok(value) => value.clone(),
        Err(error) => format!("unknown ({error})"),
    };
    let identity = match &runtime.identity {
        Ok(CannRuntime::Vendor) => "the vendor's runtime (the cann backend loads the NPU kernel object)".to_string(),
        Ok(CannRuntime::LoadedTwin) => format!(
            "the twin runtime ({}): the cann backend loads the twin kernel object",
            cann_twin::TWIN_VERSION_STRING
        ),
        Ok(CannRuntime::Twin) => "the twin runtime linked into this binary".to_string(),
        Err(error) => format!("refused: {error}"),
    };
    let _ = writeln!(out, "    identified as     {identity}");
    let interface = runtime.acl_interface.clone().map(|(a, b, c)| format!("{a}.{b}.{c}"));
    let _ = writeln!(out, "    ACL interface     {}", show(&interface));
    for (package, version) in &runtime.packages {
        let _ = writeln!(out, "    {package:<17} {}", show(version));
    }
    let _ = writeln!(out, "    devices           {}", show(&runtime.devices.clone().map(|n| n.to_string())));
    match &runtime.shmem_version {
        None => {
            let _ = writeln!(out, "    SHMEM             not loaded");
        }
        Some(version) => {
            let version = version.clone().map(|(major, minor)| format!("{major}.{minor}"));
            let _ = writeln!(out, "    SHMEM             {}", show(&version));
            // SHMEM has no query for the engines a device supports; they are known only after the collective
            // aclshmemx_init_attr, which a diagnostic must not start.
            let _ = writeln!(
                out,
                "    SHMEM engines     MTE, SDMA, ROCE, UDMA defined by the host API; the cann backend asks for SDMA \
                 (support is known only after initialisation)"
            );
        }
    }
}

/// Looks for the CANN toolkit pieces the `cann` backend needs, reading the process environment.
pub fn diagnose() -> DoctorReport {
    let home = std::env::var_os("ASCEND_HOME_PATH").map(PathBuf::from);
    let mut probes = vec![Probe {
        what: "ASCEND_HOME_PATH".into(),
        found: home.as_ref().filter(|path| path.is_dir()).map(|path| path.display().to_string()),
        tried: vec![match &home {
            Some(path) => format!("{} (set, not a directory)", path.display()),
            None => "environment variable (not set)".into(),
        }],
    }];
    probes.push(find_library(&ascendcl_sys::sys::ASCENDCL_LIBRARY));
    probes.push(find_library(&cann_shmem_sys::sys::SHMEM_LIBRARY));
    probes.push(find_library(&hccl_sys::sys::HCCL_LIBRARY));
    probes.push(find_library(&ascendcl_sys::hixl::HIXL_LIBRARY));
    probes.push(find_compiler());
    let runtime = probes[1]
        .found
        .is_some()
        .then(|| {
            ascendcl_sys::api().ok().map(|acl| {
                let identity = crate::device::cann::identify_runtime(acl);
                query_runtime(acl, identity, cann_shmem_sys::api().ok())
            })
        })
        .flatten();
    DoctorReport {
        twin_usable: true,
        cann_feature: cfg!(feature = "cann"),
        cann_probes: probes,
        runtime,
        npu_kernel_embedded: crate::device::kernel_image::NPU_KERNEL_OBJECT.is_some(),
        twin_runtime: query_runtime(cann_twin::acl_api(), Ok(CannRuntime::Twin), Some(cann_twin::shmem_api())),
    }
}

/// Asks the loaded ACL runtime (and SHMEM, if it loads) for versions and the device count.
fn query_runtime(
    acl: &ascendcl_sys::AclApi,
    identity: Result<CannRuntime, String>,
    shmem: Option<&cann_shmem_sys::ShmemApi>,
) -> RuntimeReport {
    use ascendcl_sys::result::{device, runtime, version};
    use ascendcl_sys::sys::*;
    let packages = [
        ("CANN", ACL_PKG_NAME_CANN),
        ("runtime", ACL_PKG_NAME_RUNTIME),
        ("toolkit", ACL_PKG_NAME_TOOLKIT),
        ("driver", ACL_PKG_NAME_DRIVER),
    ]
    .into_iter()
    .map(|(name, package)| (name, version::package(acl, package).map_err(|error| error.to_string())))
    .collect();
    let initialised = match runtime::init(acl, None) {
        Ok(()) => Ok(()),
        Err(error) if error.code() == Some(ascendcl_sys::AclError(ACL_ERROR_REPEAT_INITIALIZE)) => Ok(()),
        Err(error) => Err(error.to_string()),
    };
    let devices = initialised.and_then(|()| device::count(acl).map_err(|error| error.to_string()));
    let shmem_version = shmem.map(|shmem| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two live out-pointers, the prototype's only arguments.
        unsafe { shmem.aclshmem_info_get_version(&mut major, &mut minor) }.map_err(|error| error.to_string())?;
        Ok((major, minor))
    });
    RuntimeReport {
        loaded_from: acl.path().display().to_string(),
        identity,
        acl_interface: version::runtime(acl).map_err(|error| error.to_string()),
        packages,
        devices,
        shmem_version,
    }
}

/// Looks for a vendor library exactly as its `-sys` crate's loader will at run time (override variable, install
/// roots, then the dynamic loader), by trying to open it.
fn find_library(spec: &LibrarySpec) -> Probe {
    let candidates = spec.candidates_from_process_env();
    match spec.open(&candidates) {
        Ok((_library, path)) => {
            Probe { what: spec.file_name.into(), found: Some(path.display().to_string()), tried: Vec::new() }
        }
        Err(LoadError::NotFound { attempts, .. }) => {
            let mut tried: Vec<String> = attempts
                .iter()
                .map(|attempt| {
                    format!(
                        "{} (from {}: {})",
                        attempt.candidate.path.display(),
                        attempt.candidate.origin,
                        attempt.reason
                    )
                })
                .collect();
            if std::env::var_os(spec.override_var).is_none() {
                tried.push(format!("{} not set (a full path there overrides the search)", spec.override_var));
            }
            Probe { what: spec.file_name.into(), found: None, tried }
        }
        Err(other) => Probe { what: spec.file_name.into(), found: None, tried: vec![other.to_string()] },
    }
}

/// The AscendC compiler by the rule the build uses ([`toolkit::find_compiler`]), the same as the readiness item's.
fn find_compiler() -> Probe {
    // The command bound is not needed to look for a file; a bad value of it is reported by the readiness check.
    let env = |name: &str| (name != inputs::COMMAND_TIMEOUT_ENV).then(|| std::env::var_os(name)).flatten();
    let found = inputs::Inputs::from_env(&env).and_then(|inputs| toolkit::find_compiler(&inputs));
    match found {
        Ok(toolkit) => Probe {
            what: "bisheng/ccec".into(),
            found: Some(toolkit.compiler.display().to_string()),
            tried: Vec::new(),
        },
        Err(error) => Probe { what: "bisheng/ccec".into(), found: None, tried: vec![error] },
    }
}
