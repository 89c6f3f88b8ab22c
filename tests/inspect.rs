//! `aiv audit --inspect`: every verdict from fixtures the test builds itself (shared libraries with the C and C++
//! compilers, a source tree, a wheel), this project's own tree, and files that cannot be inspected.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use aiv_transport::audit::inspect::{
    inspect, Check, Component, ComponentKind, EvidenceClass, InspectReport, Stance, Verdict, CAVEAT, INSPECT_SCHEMA,
    MAX_EVIDENCE,
};

#[path = "common/skip.rs"]
mod skip;

/// The compiler named by `var` (CC, CXX), else `fallback`, if it runs.
fn compiler(var: &str, fallback: &str) -> Option<String> {
    let name = std::env::var(var).unwrap_or_else(|_| fallback.to_owned());
    let runs = Command::new(&name).arg("--version").output().is_ok_and(|o| o.status.success());
    runs.then_some(name)
}

/// Builds `source` (written to `dir/name`) into `dir/lib<stem>.so`; `None` (the test skipped, [`skip::skip`]) when
/// there is no compiler.
fn shared_library(dir: &Path, name: &str, source: &str, cxx: bool) -> Option<PathBuf> {
    let Some(cc) = (if cxx { compiler("CXX", "c++") } else { compiler("CC", "cc") }) else {
        let (language, variable, fallback) = if cxx { ("C++", "CXX", "c++") } else { ("C", "CC", "cc") };
        skip::skip(&format!("no {language} compiler runs (${variable}, else {fallback}) to build the fixture {name}"));
        return None;
    };
    let src = dir.join(name);
    std::fs::write(&src, source).expect("writes the source");
    let stem = Path::new(name).file_stem().expect("a stem").to_string_lossy().into_owned();
    let lib = dir.join(format!("lib{stem}.so"));
    let status = Command::new(cc).args(["-shared", "-fPIC", "-O1", "-o"]).arg(&lib).arg(&src).status().expect("runs");
    assert!(status.success(), "{name} builds");
    Some(lib)
}

const HOST_COPY_C: &str =
    "extern int aclrtMemcpyAsync(void*, unsigned long, const void*, unsigned long, int, void*);\n\
int copy(void* dst, const void* src, unsigned long n, void* stream) {\n\
    return aclrtMemcpyAsync(dst, n, src, n, 1, stream);\n\
}\n";

const LAUNCH_C: &str = "extern int aclrtBinaryLoadFromData(const void*, unsigned long, const void*, void**);\n\
extern int aclrtLaunchKernelWithConfig(void*, unsigned int, void*, void*, void*, void*);\n\
int launch(const void* image, unsigned long size, void* stream) {\n\
    void* binary = 0;\n\
    if (aclrtBinaryLoadFromData(image, size, 0, &binary) != 0) return -1;\n\
    return aclrtLaunchKernelWithConfig(binary, 8, stream, 0, 0, 0);\n\
}\n";

const ADXL_CPP: &str = "namespace adxl {\n\
struct AdxlEngine {\n\
    int TransferSync(const char* remote, int op, void* descs, unsigned long count, int timeout_ms);\n\
};\n\
}\n\
int transfer(adxl::AdxlEngine& engine, void* descs, unsigned long count) {\n\
    return engine.TransferSync(\"peer\", 0, descs, count, 1000);\n\
}\n";

const KERNEL_CPP: &str = "#include \"kernel_operator.h\"\n\
\n\
// A copy kernel that writes its own SDMA descriptors and rings the doorbell.\n\
struct CopySqe {\n\
    unsigned int words[16];\n\
};\n\
\n\
__aicore__ inline void ring_tail(__gm__ volatile unsigned int* doorbell, unsigned int tail) {\n\
    *doorbell = tail;\n\
}\n\
\n\
__aicore__ inline void wait_flag(__gm__ volatile unsigned long* flag, unsigned long seq) {\n\
    while (*flag < seq) {\n\
    }\n\
}\n\
\n\
extern \"C\" __global__ __aicore__ void copy_kernel(__gm__ CopySqe* sq, __gm__ unsigned int* db, \
__gm__ unsigned long* flag) {\n\
    AscendC::GlobalTensor<unsigned int> tensor;\n\
    CopySqe sqe = {};\n\
    sq[AscendC::GetBlockIdx()] = sqe;\n\
    ring_tail(db, 1);\n\
    wait_flag(flag, 1);\n\
}\n";

const HOST_CPP: &str = "#include \"acl/acl.h\"\n\
int stage(void* dst, const void* src, unsigned long n, void* stream) {\n\
    return aclrtMemcpyAsync(dst, n, src, n, ACL_MEMCPY_HOST_TO_DEVICE, stream);\n\
}\n";

fn component<'a>(report: &'a InspectReport, name: &str) -> &'a Component {
    report.component(name).unwrap_or_else(|| {
        let names: Vec<&str> = report.components.iter().map(|c| c.name.as_str()).collect();
        panic!("no component {name}: {names:?}; problems {:?}", report.problems)
    })
}

fn has(component: &Component, class: EvidenceClass, what: &str) -> bool {
    component.evidence.iter().any(|e| e.class == class && e.what.contains(what) && !e.in_comment)
}

#[test]
fn host_copy_library_is_host_submitted_with_the_import() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(lib) = shared_library(dir.path(), "hostcopy.c", HOST_COPY_C, false) else { return };
    let report = inspect(std::slice::from_ref(&lib));
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let c = component(&report, &lib.display().to_string());
    assert_eq!(c.kind, ComponentKind::Elf);
    assert_eq!(c.verdict, Verdict::HostSubmitted, "{}", report.render());
    let import = c
        .evidence
        .iter()
        .find(|e| e.class == EvidenceClass::HostSubmission && e.what.contains("aclrtMemcpyAsync"))
        .expect("the import is evidence");
    assert_eq!(import.check, Check::HostSubmission);
    assert_eq!(import.for_or_against, Stance::Against);
    assert!(import.location.contains("aclrtMemcpyAsync") && import.location.contains("undefined"), "{import:?}");
    let text = report.render();
    assert!(text.contains("Host-submitted") && text.contains(CAVEAT), "{text}");
}

#[test]
fn a_launch_alone_is_device_kernel_evidence_and_undetermined() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(lib) = shared_library(dir.path(), "launch.c", LAUNCH_C, false) else { return };
    let report = inspect(std::slice::from_ref(&lib));
    let c = component(&report, &lib.display().to_string());
    assert!(has(c, EvidenceClass::KernelLaunch, "aclrtLaunchKernelWithConfig"), "{}", report.render());
    assert!(has(c, EvidenceClass::KernelLaunch, "aclrtBinaryLoadFromData"), "{}", report.render());
    assert!(c.evidence.iter().all(|e| e.class != EvidenceClass::HostSubmission));
    assert_eq!(c.verdict, Verdict::Undetermined);
    assert!(c.reason.contains("nothing shows who writes the descriptors"), "{}", c.reason);
}

#[test]
fn adxl_transfer_sync_is_found_demangled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(lib) = shared_library(dir.path(), "adxl.cpp", ADXL_CPP, true) else { return };
    let report = inspect(std::slice::from_ref(&lib));
    let c = component(&report, &lib.display().to_string());
    let item = c
        .evidence
        .iter()
        .find(|e| e.what.contains("adxl::AdxlEngine::TransferSync"))
        .unwrap_or_else(|| panic!("the demangled name is evidence: {}", report.render()));
    assert_eq!(item.class, EvidenceClass::HostSubmission);
    assert!(item.location.contains("_ZN4adxl10AdxlEngine12TransferSync"), "the mangled symbol is named: {item:?}");
    assert_eq!(c.verdict, Verdict::HostSubmitted);
}

#[test]
fn a_kernel_that_writes_descriptors_is_aiv_direct_until_a_host_copy_joins_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let aiv = dir.path().join("op/kernel/aiv");
    std::fs::create_dir_all(&aiv).expect("mkdir");
    std::fs::write(aiv.join("copy_kernel.cpp"), KERNEL_CPP).expect("writes");
    // Skipped: a build directory, and a file of another extension.
    std::fs::create_dir_all(dir.path().join("target")).expect("mkdir");
    std::fs::write(dir.path().join("target/host.cpp"), HOST_CPP).expect("writes");
    std::fs::write(aiv.join("notes.txt"), HOST_CPP).expect("writes");

    let report = inspect(&[dir.path().to_path_buf()]);
    let c = component(&report, "op/kernel/aiv");
    assert_eq!(c.kind, ComponentKind::SourceTree);
    assert_eq!(c.files_read, 1);
    assert_eq!(c.verdict, Verdict::AivDirect, "{}", report.render());
    for (class, what) in [
        (EvidenceClass::DeviceKernel, "__aicore__"),
        (EvidenceClass::DeviceKernel, "AscendC::"),
        (EvidenceClass::DeviceKernel, "kernel_operator.h"),
        (EvidenceClass::Descriptor, "CopySqe"),
        (EvidenceClass::Doorbell, "doorbell"),
        (EvidenceClass::DeviceCompletion, "wait_flag"),
    ] {
        assert!(has(c, class, what), "{what}: {}", report.render());
    }
    let sqe = c.evidence.iter().find(|e| e.what.contains("CopySqe")).expect("CopySqe");
    assert_eq!(sqe.location, "op/kernel/aiv/copy_kernel.cpp:4");
    assert!(sqe.in_device_code && sqe.for_or_against == Stance::For);
    // The comment line is reported as such.
    assert!(c.evidence.iter().any(|e| e.in_comment && e.location.ends_with(":3")), "{:?}", c.evidence);
    assert!(report.components.iter().all(|c| !c.name.starts_with("target")), "target/ is skipped");

    std::fs::write(aiv.join("host.cpp"), HOST_CPP).expect("writes");
    let report = inspect(&[dir.path().to_path_buf()]);
    let c = component(&report, "op/kernel/aiv");
    assert_eq!(c.files_read, 2);
    assert_eq!(c.verdict, Verdict::Undetermined);
    assert_eq!(c.reason, "both Host-submission and device-descriptor evidence");
    let copy = c.evidence.iter().find(|e| e.class == EvidenceClass::HostSubmission).expect("the host copy");
    assert_eq!(copy.location, "op/kernel/aiv/host.cpp:3");
}

#[test]
fn comments_alone_never_decide_a_verdict() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("notes.py");
    std::fs::write(&file, "# this used to call aclrtMemcpyAsync and ring_doorbell\nx = 1\n").expect("writes");
    let report = inspect(std::slice::from_ref(&file));
    let c = component(&report, &file.display().to_string());
    assert!(c.evidence.len() >= 2 && c.evidence.iter().all(|e| e.in_comment), "{:?}", c.evidence);
    assert_eq!(c.verdict, Verdict::Undetermined);
    assert!(c.reason.contains("comments alone never decide"), "{}", c.reason);
}

#[test]
fn wheel_components_are_named_inside_the_wheel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(lib) = shared_library(dir.path(), "hostcopy.c", HOST_COPY_C, false) else { return };
    let wheel = dir.path().join("fixture-0.1-py3-none-any.whl");
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&wheel).expect("creates"));
    let options = zip::write::SimpleFileOptions::default();
    zip.start_file("fixture/libhostcopy.so", options).expect("entry");
    zip.write_all(&std::fs::read(&lib).expect("reads")).expect("writes");
    zip.start_file("fixture/__init__.py", options).expect("entry");
    zip.write_all(b"import ctypes\n\ndef load(path):\n    return ctypes.CDLL(path)\n").expect("writes");
    zip.finish().expect("finishes");

    let report = inspect(std::slice::from_ref(&wheel));
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let elf = component(&report, "fixture-0.1-py3-none-any.whl!fixture/libhostcopy.so");
    assert_eq!(elf.kind, ComponentKind::WheelElf);
    assert_eq!(elf.verdict, Verdict::HostSubmitted);
    assert!(has(elf, EvidenceClass::HostSubmission, "aclrtMemcpyAsync"));
    let sources = component(&report, "fixture-0.1-py3-none-any.whl!sources");
    assert_eq!(sources.kind, ComponentKind::WheelSources);
    assert_eq!(sources.files_read, 1);
    assert_eq!(sources.verdict, Verdict::Undetermined);
    assert_eq!(sources.reason, "no evidence either way");
}

#[test]
fn this_project_tree() {
    let report = inspect(&[PathBuf::from(env!("CARGO_MANIFEST_DIR"))]);
    let kernels = component(&report, "kernels/include/aiv");
    assert_eq!(kernels.verdict, Verdict::AivDirect, "{}", kernels.reason);
    // The kernel's qualifier macro is resolved through the platform header that defines it.
    assert!(kernels.evidence.iter().any(|e| e.what.contains("AIV_DEVICE_FN")), "AIV_DEVICE_FN is a device marker");
    for name in ["host/transport/adxl", "host/transport/ubshmem.rs"] {
        let c = component(&report, name);
        assert_eq!(c.verdict, Verdict::HostSubmitted, "{name}: {}", c.reason);
    }
    assert!(report.components.iter().all(|c| !c.name.starts_with("target/") && !c.name.starts_with(".git/")));
}

#[test]
fn unreadable_and_malformed_inputs_are_reported_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("does-not-exist.so");
    let truncated = dir.path().join("truncated.so");
    let not_zip = dir.path().join("broken-0.1-py3-none-any.whl");
    std::fs::write(&not_zip, "this is not a zip archive\n").expect("writes");
    // A real library cut short where a C compiler runs; else an ELF header's first bytes alone (nothing skipped).
    let mut elf = b"\x7fELF\x02\x01\x01\0".to_vec();
    if compiler("CC", "cc").is_some() {
        let lib = shared_library(dir.path(), "hostcopy.c", HOST_COPY_C, false).expect("a C compiler runs");
        elf = std::fs::read(lib).expect("reads");
        elf.truncate(200);
    }
    std::fs::write(&truncated, &elf).expect("writes");

    let report = inspect(&[missing.clone(), truncated.clone(), not_zip.clone()]);
    assert!(report.components.is_empty(), "{:?}", report.components);
    for (path, problem) in [(&missing, "does not exist"), (&truncated, "malformed ELF"), (&not_zip, "zip")] {
        let shown = path.display().to_string();
        let found = report.problems.iter().find(|p| p.path == shown).expect("reported by name");
        assert!(found.problem.contains(problem), "{found:?}");
    }
    let text = report.render();
    assert!(text.contains(&truncated.display().to_string()) && text.contains(CAVEAT));
}

#[test]
fn evidence_is_bounded_per_component() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("many.c");
    let mut text = String::new();
    for k in 0..MAX_EVIDENCE + 25 {
        text.push_str(&format!("int doorbell_{k};\n"));
    }
    std::fs::write(&file, text).expect("writes");
    let report = inspect(std::slice::from_ref(&file));
    let c = component(&report, &file.display().to_string());
    assert_eq!(c.evidence.len(), MAX_EVIDENCE);
    assert_eq!(c.evidence_dropped, 25);
    assert!(report.render().contains("25 more evidence items were dropped"));
}

#[test]
fn the_json_has_the_schema_and_reads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("kernel.cpp");
    std::fs::write(&file, KERNEL_CPP).expect("writes");
    let report = inspect(std::slice::from_ref(&file));
    let json = serde_json::to_value(&report).expect("serializes");
    assert_eq!(json["schema"], INSPECT_SCHEMA);
    assert_eq!(json["caveat"], CAVEAT);
    let c = &json["components"][0];
    assert_eq!(c["kind"], "source-tree");
    assert_eq!(c["verdict"], "AIV-direct");
    let checks: Vec<&serde_json::Value> =
        c["evidence"].as_array().expect("evidence").iter().map(|e| &e["check"]).collect();
    assert!(checks.iter().any(|c| c.as_u64() == Some(1)) && checks.iter().any(|c| c.as_u64() == Some(2)));
    let host = inspect(&[dir.path().join("kernel.cpp")]);
    let back = serde_json::from_str::<InspectReport>(&serde_json::to_string(&host).expect("text")).expect("reads back");
    assert_eq!(back.components[0].verdict, Verdict::AivDirect);
    assert_eq!(back.components[0].evidence, host.components[0].evidence);
}

/// A Host library carrying a device object: a section named like one, holding a kernel's names, and an ELF image for
/// another machine in its read-only data.
const DEVICE_OBJECT_C: &str = "__attribute__((section(\".ascend.kernel\"), used))\n\
static const char kernel_names[] = \"CopySqe\\0ring_doorbell\\0wait_flag\\0\";\n\
__attribute__((used))\n\
static const unsigned char device_image[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0,\n\
    1, 0, 0xef, 0xbe, 1, 0, 0, 0};\n\
int probe(void) { return kernel_names[0] + device_image[1]; }\n";

#[test]
fn an_embedded_device_object_with_descriptors_is_aiv_direct() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(lib) = shared_library(dir.path(), "devobj.c", DEVICE_OBJECT_C, false) else { return };
    let report = inspect(std::slice::from_ref(&lib));
    let c = component(&report, &lib.display().to_string());
    assert!(has(c, EvidenceClass::DeviceKernel, ".ascend.kernel"), "{}", report.render());
    assert!(has(c, EvidenceClass::DeviceKernel, "e_machine 48879"), "{}", report.render());
    let sqe = c.evidence.iter().find(|e| e.what.contains("CopySqe")).expect("the descriptor name");
    assert!(sqe.in_device_code && sqe.location.starts_with("section .ascend.kernel"), "{sqe:?}");
    assert!(has(c, EvidenceClass::Doorbell, "ring_doorbell"));
    assert_eq!(c.verdict, Verdict::AivDirect, "{}", report.render());
}
