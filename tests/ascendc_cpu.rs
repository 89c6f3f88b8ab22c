//! The CPU model of the AscendC subset (`kernels/cpu/`) and the NPU kernel (`kernels/npu/entry.cpp`, i.e.
//! `transfer_kernel.h` + `platform/npu.h`) compiled with the host C++ compiler against it: builds
//! `tests/cpp/ascendc_cpu_test.cpp` (`$CXX`, else `c++`) and runs each of its cases. Then the mutation tests: each
//! removes one cache-maintenance or pipe-ordering step of the kernel, or restores the 32-byte doorbell, in a copy of
//! `kernels/`, and shows that the kernel case fails with the expected symptom.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles the test program against the kernel sources under `kernels` into `out`.
fn build(kernels: &Path, out: &Path) -> Result<(), String> {
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let output = Command::new(&compiler)
        .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror"])
        // GCC cannot see that read_bytes fills the structs it reads (a word loop through GlobalTensor::GetValue).
        .arg("-Wno-maybe-uninitialized")
        .arg(format!("-I{}", kernels.join("cpu").display()))
        .arg(format!("-I{}", kernels.join("include").display()))
        .arg(format!("-I{}", kernels.display()))
        .arg(kernels.join("npu/entry.cpp"))
        .arg(kernels.join("cpu/aiv_cpu_model.cpp"))
        .arg(root().join("tests/cpp/ascendc_cpu_test.cpp"))
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|error| format!("cannot run the C++ compiler {compiler:?}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("does not compile:\n{}", String::from_utf8_lossy(&output.stderr)))
    }
}

/// The test program built from this tree's `kernels/`, once per test process.
fn program() -> &'static Path {
    static PROGRAM: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = PROGRAM.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ascendc_cpu_test");
        build(&root().join("kernels"), &path).unwrap_or_else(|error| panic!("{error}"));
        (dir, path)
    });
    path
}

fn run(program: &Path, case: &str) -> Output {
    Command::new(program).arg(case).output().expect("the test program runs")
}

fn assert_passes(case: &str) {
    let output = run(program(), case);
    assert!(
        output.status.success(),
        "{case} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn store_not_cleaned_is_invisible() {
    assert_passes("store_not_cleaned_is_invisible");
}

#[test]
fn load_is_stale_until_invalidated() {
    assert_passes("load_is_stale_until_invalidated");
}

#[test]
fn dma_bypasses_the_cache() {
    assert_passes("dma_bypasses_the_cache");
}

#[test]
fn burst_lengths_count_32_byte_blocks() {
    assert_passes("burst_lengths_count_32_byte_blocks");
}

#[test]
fn wide_dma_onto_a_register_is_refused() {
    assert_passes("wide_dma_onto_a_register_is_refused");
}

#[test]
fn unaligned_single_line_dcci_covers_only_the_tail() {
    assert_passes("unaligned_single_line_dcci_covers_only_the_tail");
}

#[test]
fn polling_unchanged_memory_hints_idle() {
    assert_passes("polling_unchanged_memory_hints_idle");
}

#[test]
fn a_flag_landing_during_an_idle_hint_is_what_the_load_returns() {
    assert_passes("a_flag_landing_during_an_idle_hint_is_what_the_load_returns");
}

#[test]
fn dma_waits_for_its_pipe_flags() {
    assert_passes("dma_waits_for_its_pipe_flags");
}

#[test]
fn wide_ub_stores_and_completion_order() {
    assert_passes("wide_ub_stores_and_completion_order");
}

#[test]
fn npu_kernel_publishes_completions_and_rings_4_byte_doorbells() {
    assert_passes("npu_kernel_publishes_completions_and_rings_4_byte_doorbells");
}

#[test]
fn npu_kernel_dcq_wraps() {
    assert_passes("npu_kernel_dcq_wraps");
}

#[test]
fn npu_kernel_rdma_posts_wqes_and_polls_cqes() {
    assert_passes("npu_kernel_rdma_posts_wqes_and_polls_cqes");
}

#[test]
fn npu_kernel_rdma_error_cqe_fails_what_it_covers() {
    assert_passes("npu_kernel_rdma_error_cqe_fails_what_it_covers");
}

#[test]
fn every_case_is_run() {
    let output = Command::new(program()).arg("--list").output().expect("the test program runs");
    let listed: Vec<String> = String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect();
    let source = std::fs::read_to_string(root().join("tests/ascendc_cpu.rs")).expect("this file");
    for case in &listed {
        assert!(source.contains(&format!("assert_passes(\"{case}\")")), "case {case} has no #[test] here");
    }
    assert!(listed.len() >= 10, "only {} cases", listed.len());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Builds the test program from a copy of `kernels/` with `old` replaced by `new` in `file`, runs the SDMA kernel case
/// and asserts that it fails with `symptom` in its report.
fn assert_mutation_caught(file: &str, old: &str, new: &str, symptom: &str) {
    assert_mutation_caught_by("npu_kernel_publishes_completions_and_rings_4_byte_doorbells", file, old, new, symptom);
}

/// [`assert_mutation_caught`] with the kernel case `case`.
fn assert_mutation_caught_by(case: &str, file: &str, old: &str, new: &str, symptom: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let kernels = dir.path().join("kernels");
    copy_dir(&root().join("kernels"), &kernels);
    let path = kernels.join(file);
    let text = std::fs::read_to_string(&path).expect("kernel source");
    assert_eq!(text.matches(old).count(), 1, "the mutation's text must occur exactly once in {file}: {old:?}");
    std::fs::write(&path, text.replace(old, new)).expect("write the mutant");
    let program = dir.path().join("mutant");
    build(&kernels, &program).unwrap_or_else(|error| panic!("the mutant {error}"));
    let output = run(&program, case);
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the kernel test passed with the mutation in {file}: {old:?} -> {new:?}");
    assert!(report.contains(symptom), "the mutant failed, but not with {symptom:?}:\n{report}");
}

#[test]
fn uncleaned_dcq_entries_are_caught() {
    assert_mutation_caught(
        "include/aiv/transfer_kernel.h",
        "    flush_completions(b, dcq_tail, tail);\n",
        "",
        "DCQ entry 0: status 0",
    );
}

#[test]
fn a_32_byte_doorbell_is_caught() {
    assert_mutation_caught(
        "platform/npu.h",
        "AscendC::DataCopyPad(reg, ub, AscendC::DataCopyExtParams{1, sizeof(uint32_t), 0, 0, 0});",
        "copy_ubuf_to_gm(reg.GetPhyAddr(0), reinterpret_cast<__ubuf__ void*>(ub.GetPhyAddr()), 0, 1, 1, 0, 0);",
        "refused register write at offset 0x8, 32 bytes",
    );
}

#[test]
fn a_load_without_invalidation_is_caught() {
    assert_mutation_caught(
        "platform/npu.h",
        "AIV_DEVICE_FN uint64_t load_u64(const __gm__ uint64_t* p) {\n    dcci_line(p);\n",
        "AIV_DEVICE_FN uint64_t load_u64(const __gm__ uint64_t* p) {\n",
        // The completion flag is read stale until the wait budget runs out.
        "status 3",
    );
}

#[test]
fn a_store_without_cleaning_is_caught() {
    assert_mutation_caught(
        "platform/npu.h",
        "    gm_tensor(p).SetValue(0, v);\n    dcci_line(p);\n}\nAIV_DEVICE_FN void store_u64",
        "    gm_tensor(p).SetValue(0, v);\n}\nAIV_DEVICE_FN void store_u64",
        "dirty lines",
    );
}

#[test]
fn sqes_not_landed_before_the_doorbell_are_caught() {
    // The doorbell rings without the kernel having waited for the DMA that lands its SQEs.
    assert_mutation_caught(
        "platform/npu.h",
        "    AscendC::SetFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID1);\n    AscendC::WaitFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID1);\n",
        "",
        "rang before SQE 0 was in HBM",
    );
}

#[test]
fn sqes_landed_without_scalar_to_mte3_ordering_are_caught() {
    assert_mutation_caught(
        "platform/npu.h",
        "    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID1);\n    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID1);\n",
        "",
        // AIV_CPU_FAULT_PIPE_ORDER: the DMA reads the stage before the scalar stores that built it are ordered.
        "fault kind 6",
    );
}

#[test]
fn sqes_never_landed_are_caught() {
    assert_mutation_caught(
        "include/aiv/transfer_kernel.h",
        "    land(b);\n    // The doorbell",
        "    // The doorbell",
        "rang before SQE 0 was in HBM",
    );
}

#[test]
fn a_doorbell_without_scalar_to_mte3_ordering_is_caught() {
    assert_mutation_caught(
        "platform/npu.h",
        "    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID0);\n    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID0);\n",
        "",
        // AIV_CPU_FAULT_PIPE_ORDER: the DMA reads the UB word before the scalar store of the tail is ordered before it.
        "fault kind 6",
    );
}

// ---- The RDMA route (the fake NIC of tests/cpp/ascendc_cpu_test.cpp) ----

const RDMA_CASE: &str = "npu_kernel_rdma_posts_wqes_and_polls_cqes";
const RDMA_ERROR_CASE: &str = "npu_kernel_rdma_error_cqe_fails_what_it_covers";

#[test]
fn a_64_bit_doorbell_written_as_a_32_byte_burst_is_caught() {
    assert_mutation_caught_by(
        RDMA_CASE,
        "platform/npu.h",
        "AscendC::DataCopyPad(doorbell, ub, AscendC::DataCopyExtParams{1, sizeof(uint64_t), 0, 0, 0});",
        "copy_ubuf_to_gm(doorbell.GetPhyAddr(0), reinterpret_cast<__ubuf__ void*>(ub.GetPhyAddr()), 0, 1, 1, 0, 0);",
        "refused register write at offset 0x0, 32 bytes (NIC register)",
    );
}

#[test]
fn a_64_bit_doorbell_without_scalar_to_mte3_ordering_is_caught() {
    assert_mutation_caught_by(
        RDMA_CASE,
        "platform/npu.h",
        "    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID3);\n    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID3);\n",
        "",
        "fault kind 6",
    );
}

#[test]
fn wqes_landed_without_scalar_to_mte3_ordering_are_caught() {
    assert_mutation_caught_by(
        RDMA_CASE,
        "platform/npu.h",
        "    AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID2);\n    AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(EVENT_ID2);\n",
        "",
        "fault kind 6 at 0x4000, 64 bytes",
    );
}

#[test]
fn a_wqe_stage_rebuilt_before_its_dma_completed_is_caught() {
    // Without the wait, the next WQE's scalar UB stores overwrite the stage the previous WQE's DMA still reads.
    assert_mutation_caught_by(
        RDMA_CASE,
        "platform/npu.h",
        "    AscendC::SetFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID2);\n    AscendC::WaitFlag<AscendC::HardEvent::MTE3_S>(EVENT_ID2);\n",
        "",
        "fault kind 6 at 0x4000, 8 bytes",
    );
}

#[test]
fn a_wqe_owner_bit_that_ignores_the_lap_is_caught() {
    assert_mutation_caught_by(
        RDMA_CASE,
        "include/aiv/transfer_kernel.h",
        "((q.pi & q.sq_depth) == 0 ? AIV_ROCE_WQE_OWNER_BIT : 0u)",
        "AIV_ROCE_WQE_OWNER_BIT",
        "rang before WQE 8 was in HBM (owner bit 1",
    );
}

#[test]
fn a_full_sq_without_a_signaled_wqe_in_each_half_is_caught() {
    // Only the last WQE of a transfer signaled: a transfer longer than the SQ waits for a CQE that never comes.
    assert_mutation_caught_by(
        RDMA_CASE,
        "include/aiv/transfer_kernel.h",
        " || q.pi + 1 - q.last_signaled >= q.sq_depth >> 1",
        "",
        "DCQ entry 3: status 3",
    );
}

#[test]
fn cqes_never_released_by_the_cq_doorbell_are_caught() {
    assert_mutation_caught_by(
        RDMA_CASE,
        "include/aiv/transfer_kernel.h",
        "    aiv_platform::ring_doorbell_64(q.cq_db_addr, word);\n",
        "    (void)word;\n",
        "CQEs never released",
    );
}

#[test]
fn a_cqe_whose_status_is_not_checked_is_caught() {
    // The mandatory status check: an error CQE taken as a success completes the refused transfer.
    assert_mutation_caught_by(
        RDMA_ERROR_CASE,
        "include/aiv/transfer_kernel.h",
        "    if (status == AIV_ROCE_STATUS_SUCCESS) {\n        q.done = index + 1;",
        "    if (true) {\n        q.done = index + 1;",
        "DCQ entry 1: status 1, syndrome 0x0 (expected 2, 0x10013)",
    );
}

#[test]
fn a_qp_error_not_written_to_the_record_is_caught() {
    assert_mutation_caught_by(
        RDMA_ERROR_CASE,
        "include/aiv/transfer_kernel.h",
        "        if (b.qps[slot].dirty) qp_save(b, slot);\n",
        "",
        "record kernel line: qpn_seen 0x11, error 0x0",
    );
}
