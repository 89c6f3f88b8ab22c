//! The twin's `libllm_datadist.so` and `libmetadef.so` (`cxx/`) through their C++ ABI: `cxx/adxl_selftest.cpp`,
//! compiled here with the system's C++ compiler against the libraries `tests/support/twin_cann_libs.sh` built, runs
//! engines over loopback in one process (names, connect and its bounds, verified transfers across chunk sizes,
//! out-of-bounds and overflowing ranges refused, a peer speaking something else, a peer that goes away, async
//! status, the static members; the engine each option path selects, shown by the runtime's evidence counts: AI-CPU
//! acts for the client-server engine and FabricMem's AI-CPU unfold, Host stream copies for its Host unfold, Host
//! copies for the communication-domain stand-in; options the vendor refuses refused).
//!
//!     export AIV_TEST_TWIN_CANN_LIBS="$(tests/support/twin_cann_libs.sh)"
//!     cargo test -p cann-twin --test adxl_twin

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../../tests/common/skip.rs"]
mod skip;

fn libs() -> Option<PathBuf> {
    match std::env::var_os("AIV_TEST_TWIN_CANN_LIBS") {
        Some(dir) => Some(PathBuf::from(dir)),
        None => {
            skip::skip(
                "set AIV_TEST_TWIN_CANN_LIBS=\"$(tests/support/twin_cann_libs.sh)\" to check the twin's ADXL and \
                 AscendString libraries (tests/run.sh does)",
            );
            None
        }
    }
}

#[test]
fn the_adxl_engine_passes_its_self_test() {
    let Some(libs) = libs() else {
        return;
    };
    let cxx_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cxx");
    let exe = std::env::temp_dir().join(format!("adxl_selftest-{}", std::process::id()));
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "g++".to_owned());
    let status = Command::new(&compiler)
        .args(["-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-I"])
        .arg(&cxx_dir)
        .arg("-o")
        .arg(&exe)
        .arg(cxx_dir.join("adxl_selftest.cpp"))
        .arg("-L")
        .arg(&libs)
        .args(["-lllm_datadist", "-lmetadef", "-lascendcl"])
        .status()
        .unwrap_or_else(|error| panic!("run {compiler}: {error}"));
    assert!(status.success(), "compiling adxl_selftest.cpp failed: {status}");
    // The evidence layout from its one definition: the version-2 size, then each count's offset after the header.
    use cann_twin::evidence::CannTwinEvidenceV2;
    let mut args = vec![std::mem::size_of::<CannTwinEvidenceV2>().to_string()];
    args.extend(CannTwinEvidenceV2::count_offsets().map(|(name, offset)| format!("{name}={offset}")));
    let mut child = Command::new(&exe)
        .args(&args)
        .env("LD_LIBRARY_PATH", &libs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the self test");
    let deadline = Instant::now() + Duration::from_secs(120);
    let finished = loop {
        match child.try_wait() {
            Ok(Some(_)) => break true,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => break false,
        }
    };
    if !finished {
        let _ = child.kill();
    }
    let output = child.wait_with_output().expect("self test output");
    let _ = std::fs::remove_file(&exe);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(finished, "the self test did not finish within 120 s\n{stdout}\n{stderr}");
    assert!(output.status.success() && stdout.starts_with("ok: "), "the self test failed\n{stdout}\n{stderr}");
}
