//! Finding what a Mooncake path runs on: the virtualenv with Mooncake's Ascend wheel and the directory of CANN
//! libraries its processes load ([`discover`] for `mooncake-ascend`, the twin's libraries from
//! tests/support/twin_cann_libs.sh; [`discover_over_aiv`] for `mooncake-ascend+aiv`, the directory of
//! tests/support/mooncake_over_aiv.sh). Owns [`MooncakeSetup`] and the skip reasons that say how to install what is
//! missing. Nothing here starts a process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Variant;
use crate::config::DeviceBackendKind;

/// Where the wheel and the libraries of one Mooncake path are.
#[derive(Clone, Debug)]
pub struct MooncakeSetup {
    /// Which path this is: which `libllm_datadist.so` the directory holds.
    pub variant: Variant,
    /// The virtualenv holding `mooncake-transfer-engine-npu` (its `bin/python` runs the driver).
    pub venv: PathBuf,
    /// The directory with `libascendcl.so` (the twin runtime), `libllm_datadist.so` and `libmetadef.so`, put first on
    /// the processes' `LD_LIBRARY_PATH`.
    pub libs: PathBuf,
    /// How long past a command's own duration an answer may take before the process counts as hung (45 s: the
    /// wheel's transfer timeout is 10 s per batch, its import and start a few seconds).
    pub reply_margin: Duration,
    /// `ASCEND_GLOBAL_RESOURCE_CONFIG` for both processes (`None`: removed from their environment, so the wheel runs
    /// with its defaults). A `fabric_memory` key in it makes the wheel pass `EnableUseFabricMem=1` and the JSON as
    /// `GlobalResourceConfig` (`kvcache-ai/Mooncake` `mooncake-transfer-engine/src/transport/ascend_transport/
    /// ascend_direct_transport/ascend_direct_transport.cpp`, `utils.cpp`), which selects FabricMem;
    /// `fabric_memory.enable_aicpu_unfold` false its Host unfold.
    pub global_resource_config: Option<String>,
}

/// How to install what `mooncake-ascend` needs, for skip reasons.
pub const INSTALL_HINT: &str = "install them with `AIV_MOONCAKE_NPU_VENV=$PWD/target/mooncake-npu-venv bash \
     tests/support/mooncake_npu.sh` and `AIV_MOONCAKE_NPU_VENV=$PWD/target/mooncake-npu-venv bash \
     tests/support/twin_cann_libs.sh` (the defaults --mooncake-npu-venv target/mooncake-npu-venv and \
     --twin-cann-libs target/twin-cann-libs), or name them with --mooncake-npu-venv and --twin-cann-libs";

/// How to build what `mooncake-ascend+aiv` needs, for skip reasons and the error of `--paths mooncake-ascend+aiv`.
pub const OVER_AIV_HINT: &str = "build it with `bash tests/support/mooncake_over_aiv.sh` (into the default \
     --mooncake-over-aiv-libs target/mooncake-over-aiv; AIV_MOONCAKE_OVER_AIV_LIBS=DIR for another directory) and \
     install the wheel with `AIV_MOONCAKE_NPU_VENV=$PWD/target/mooncake-npu-venv bash tests/support/mooncake_npu.sh`, \
     or name them with --mooncake-over-aiv-libs and --mooncake-npu-venv";

/// The three libraries the wheel links (docs/mooncake-npu-wheel.md section 2).
const CANN_LIBRARIES: [&str; 3] = ["libascendcl.so", "libllm_datadist.so", "libmetadef.so"];

/// What tests/support/mooncake_over_aiv.sh's directory holds besides: the engine's C ABI its `libllm_datadist.so`
/// links.
const OVER_AIV_LIBRARY: &str = "libaiv_transport.so";

/// Finds `mooncake-ascend`'s virtualenv and the twin's libraries: the given directories, else
/// `target/mooncake-npu-venv` and `target/twin-cann-libs` under the current directory. The error is the reason the
/// path is skipped.
pub fn discover(
    venv: Option<PathBuf>,
    libs: Option<PathBuf>,
    backend: DeviceBackendKind,
) -> std::result::Result<MooncakeSetup, String> {
    discover_variant(Variant::TwinHixl, venv, libs, backend)
}

/// Finds `mooncake-ascend+aiv`'s virtualenv and library directory: the given directories, else
/// `target/mooncake-npu-venv` and `target/mooncake-over-aiv` (tests/support/mooncake_over_aiv.sh's default) under
/// the current directory. The directory must hold the three CANN libraries and `libaiv_transport.so`; which
/// `libllm_datadist.so` it is, is not checked here (the verdict comes from what the runtime counts in the processes,
/// whatever the directory holds). The error is the reason the path is skipped.
pub fn discover_over_aiv(
    venv: Option<PathBuf>,
    libs: Option<PathBuf>,
    backend: DeviceBackendKind,
) -> std::result::Result<MooncakeSetup, String> {
    discover_variant(Variant::OverAiv, venv, libs, backend)
}

/// [`discover`] or [`discover_over_aiv`], by `variant`.
pub fn discover_variant(
    variant: Variant,
    venv: Option<PathBuf>,
    libs: Option<PathBuf>,
    backend: DeviceBackendKind,
) -> std::result::Result<MooncakeSetup, String> {
    if backend != DeviceBackendKind::Twin {
        return Err("runs only on the twin device backend: on `cann` the other paths use the vendor's runtime, \
                    while the Mooncake processes would load the twin's libraries, so the two would not share a \
                    device model"
            .into());
    }
    let (default_libs, hint, what) = match variant {
        Variant::TwinHixl => ("target/twin-cann-libs", INSTALL_HINT, "the twin runtime's CANN libraries"),
        Variant::OverAiv => (
            "target/mooncake-over-aiv",
            OVER_AIV_HINT,
            "libllm_datadist.so over aiv with the twin runtime's libascendcl.so and libmetadef.so",
        ),
    };
    let venv = venv.unwrap_or_else(|| PathBuf::from("target/mooncake-npu-venv"));
    let libs = libs.unwrap_or_else(|| PathBuf::from(default_libs));
    let python = venv.join("bin/python");
    if !python.exists() {
        return Err(format!(
            "no virtualenv with Mooncake's Ascend wheel at {} (no bin/python): {hint}",
            venv.display()
        ));
    }
    if !has_wheel(&venv) {
        return Err(format!(
            "the virtualenv {} has no mooncake/engine.so (mooncake-transfer-engine-npu is not installed): {hint}",
            venv.display()
        ));
    }
    let needed: &[&str] = match variant {
        Variant::TwinHixl => &CANN_LIBRARIES,
        Variant::OverAiv => &[CANN_LIBRARIES[0], CANN_LIBRARIES[1], CANN_LIBRARIES[2], OVER_AIV_LIBRARY],
    };
    if let Some(missing) = needed.iter().find(|name| !libs.join(name).exists()) {
        return Err(format!("no {missing} in {} ({what}): {hint}", libs.display()));
    }
    let absolute = |path: PathBuf| std::path::absolute(&path).unwrap_or(path);
    Ok(MooncakeSetup {
        variant,
        venv: absolute(venv),
        libs: absolute(libs),
        reply_margin: Duration::from_secs(45),
        global_resource_config: None,
    })
}

/// Whether `venv/lib/python*/site-packages/mooncake/engine.so` exists.
fn has_wheel(venv: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(venv.join("lib")) else { return false };
    entries.flatten().any(|entry| {
        entry.file_name().to_string_lossy().starts_with("python")
            && entry.path().join("site-packages/mooncake/engine.so").exists()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_virtualenv_is_skipped_with_how_to_install() {
        let dir = std::env::temp_dir().join(format!("aiv-mooncake-none-{}", std::process::id()));
        let reason =
            discover(Some(dir.clone()), Some(dir.clone()), DeviceBackendKind::Twin).expect_err("nothing there");
        assert!(reason.contains("tests/support/mooncake_npu.sh") && reason.contains("twin_cann_libs.sh"), "{reason}");
        let reason =
            discover_over_aiv(Some(dir.clone()), Some(dir.clone()), DeviceBackendKind::Twin).expect_err("nothing");
        assert!(reason.contains("tests/support/mooncake_over_aiv.sh"), "{reason}");
        let reason = discover(Some(dir.clone()), Some(dir), DeviceBackendKind::Cann).expect_err("not the twin");
        assert!(reason.contains("twin device backend"), "{reason}");
    }

    #[test]
    fn the_over_aiv_directory_needs_the_engine_library_too() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let venv = dir.path().join("venv");
        let libs = dir.path().join("libs");
        std::fs::create_dir_all(venv.join("bin")).expect("mkdir");
        std::fs::create_dir_all(venv.join("lib/python3.11/site-packages/mooncake")).expect("mkdir");
        std::fs::write(venv.join("bin/python"), b"").expect("write");
        std::fs::write(venv.join("lib/python3.11/site-packages/mooncake/engine.so"), b"").expect("write");
        std::fs::create_dir_all(&libs).expect("mkdir");
        for name in CANN_LIBRARIES {
            std::fs::write(libs.join(name), b"").expect("write");
        }
        // The twin's directory (three libraries): enough for mooncake-ascend, not for mooncake-ascend+aiv.
        let twin = discover(Some(venv.clone()), Some(libs.clone()), DeviceBackendKind::Twin).expect("found");
        assert_eq!(twin.variant, Variant::TwinHixl);
        let reason = discover_over_aiv(Some(venv.clone()), Some(libs.clone()), DeviceBackendKind::Twin)
            .expect_err("no libaiv_transport.so");
        assert!(reason.contains("no libaiv_transport.so") && reason.contains("mooncake_over_aiv.sh"), "{reason}");
        std::fs::write(libs.join(OVER_AIV_LIBRARY), b"").expect("write");
        let over = discover_over_aiv(Some(venv), Some(libs), DeviceBackendKind::Twin).expect("found");
        assert_eq!((over.variant, over.variant.path()), (Variant::OverAiv, "mooncake-ascend+aiv"));
        assert!(over.libs.is_absolute() && over.global_resource_config.is_none());
    }
}
