//! The `cann` device backend on the twin runtime (`"device_backend": "twin"`): the bring-up, SHMEM's SDMA
//! workspace, the VMM heap, the kernel binary loaded with `aclrtBinaryLoadFromData` and launched with
//! `aclrtLaunchKernelWithHostArgs`, and the aiv transport moving data through them, with every byte checked through
//! the runtime's copies. SHMEM is process-wide, so each test that opens a device runs in its own process: this
//! binary re-runs itself with `AIV_CANN_TWIN_CASE` naming the case.

#[path = "common/aiv.rs"]
mod aiv;

use std::process::Command;
use std::time::{Duration, Instant};

use aiv_transport::config::{AivOptions, DeviceBackendKind, LaunchMode};
use aiv_transport::device::cann::{CannDevice, CannRuntime};
use aiv_transport::evidence::{Check, Source, TransferEvidence};
use aiv_transport::{Opcode, TransferRequest, TransferState};
use rand::{RngCore, SeedableRng};

const CASE: &str = "AIV_CANN_TWIN_CASE";

fn options(mode: LaunchMode) -> AivOptions {
    AivOptions { device_backend: DeviceBackendKind::Twin, ..aiv::options(0, mode, 8) }
}

/// Runs `case` of this binary in a child process and checks it passed.
fn in_child(case: &str) {
    let exe = std::env::current_exe().expect("test binary");
    let output = Command::new(exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CASE, case)
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(&format!("case {case} passed")),
        "case {case} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

/// The child's entry: runs the case `AIV_CANN_TWIN_CASE` names (nothing when run directly).
#[test]
fn child() {
    let Ok(case) = std::env::var(CASE) else { return };
    match case.as_str() {
        "local_transfers" => local_transfers(LaunchMode::Persistent),
        "local_transfers_per_batch" => local_transfers(LaunchMode::PerBatch),
        "bring_up" => bring_up(),
        "kernel_api" => kernel_api(),
        "stall_recovers" => stall_recovers(),
        "two_devices" => two_devices(),
        "host_memory" => host_memory(),
        "provenance_aiv" => provenance_aiv(),
        "provenance_host_rings" => provenance_host_rings(),
        "provenance_host_reads_flag" => provenance_host_reads_flag(),
        "provenance_host_writes_sqes" => provenance_host_writes_sqes(),
        "provenance_written_while_off" => provenance_written_while_off(),
        "provenance_host_rings_too" => provenance_host_rings_too(),
        "occupancy" => occupancy(),
        other => panic!("unknown case {other}"),
    }
    println!("case {case} passed");
}

#[test]
fn the_backend_comes_up_on_the_twin_runtime_with_its_kernel_loaded() {
    in_child("bring_up");
}

#[test]
fn kernel_binaries_load_launch_and_a_core_fault_aborts_the_launch_with_a_vector_core_exception() {
    in_child("kernel_api");
}

#[test]
fn a_stalled_sdma_engine_times_out_within_the_kernel_budget_and_the_channels_are_reset_and_serve_again() {
    in_child("stall_recovers");
}

#[test]
fn two_devices_of_one_process_each_with_its_shmem_instance_move_data_between_them() {
    in_child("two_devices");
}

#[test]
fn registered_host_memory_of_the_runtime_is_reached_by_a_peer_devices_kernel_and_from_its_own() {
    in_child("host_memory");
}

#[test]
fn the_persistent_kernel_moves_random_ranges_within_one_device() {
    in_child("local_transfers");
}

#[test]
fn per_batch_launches_move_random_ranges_within_one_device() {
    in_child("local_transfers_per_batch");
}

#[test]
fn an_idle_persistent_kernel_mostly_polls_and_a_transfer_makes_the_sdma_channels_busy() {
    in_child("occupancy");
}

fn bring_up() {
    let options = options(LaunchMode::Persistent);
    let device = CannDevice::open_on_twin(&options, None).expect("the cann backend opens on the twin runtime");
    assert_eq!(device.runtime(), CannRuntime::Twin);
    // Device memory is not Host memory: a buffer's address is a device address, reached only through copies.
    use aiv_transport::device::{DeviceMemory, KernelChannels};
    let buffer = device.allocate(1 << 20).expect("HBM");
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    device.copy_to_device(buffer.addr() + 8192, &data).expect("H2D");
    let mut back = vec![0u8; data.len()];
    device.copy_from_device(buffer.addr() + 8192, &mut back).expect("D2H");
    assert_eq!(back, data);
    let channels = device.open_channels(2, 64).expect("channels from SHMEM's SDMA workspace");
    assert_eq!(channels.len(), 2);
    assert!(channels.iter().all(|channel| channel.record_addr != 0 && channel.platform_context == 0));
}

fn local_transfers(mode: LaunchMode) {
    let mut node = aiv::node(options(mode), 8 << 20);
    let half = 4u64 << 20;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    node.modify(|bytes| rng.fill_bytes(&mut bytes[..half as usize]));
    let local = node.engine.open_segment(node.engine.name()).expect("own segment");
    let mut expected = node.bytes();
    for round in 0..4 {
        let count = 1 + rng.next_u32() as usize % 16;
        let mut requests = Vec::new();
        for _ in 0..count {
            let length = 1 + u64::from(rng.next_u32()) % (256 << 10);
            let source = u64::from(rng.next_u32()) % (half - length);
            let target = half + u64::from(rng.next_u32()) % (half - length);
            let opcode = if rng.next_u32() % 2 == 0 { Opcode::Write } else { Opcode::Read };
            // A READ copies from the target segment's range into the local one: swap the ranges for the model.
            let (from, to) = match opcode {
                Opcode::Write => (source, target),
                Opcode::Read => (target, source),
            };
            // Keep the ranges of one batch disjoint so the expected image does not depend on their order.
            if requests.iter().any(|(_, f, t, l): &(Opcode, u64, u64, u64)| {
                let overlaps = |a: u64, b: u64| a < b + *l && b < a + length;
                overlaps(from, *f) || overlaps(from, *t) || overlaps(to, *f) || overlaps(to, *t)
            }) {
                continue;
            }
            requests.push((opcode, from, to, length));
        }
        let batch = node.engine.allocate_batch(requests.len()).expect("batch");
        let submitted: Vec<TransferRequest> = requests
            .iter()
            .map(|&(opcode, from, to, length)| {
                // The local side is where a READ lands and where a WRITE starts.
                let (local_at, remote_at) = if opcode == Opcode::Write { (from, to) } else { (to, from) };
                TransferRequest {
                    opcode,
                    source: node.buffer.addr() + local_at,
                    target_id: local,
                    target_offset: node.buffer.addr() + remote_at,
                    length,
                    protocol: None,
                }
            })
            .collect();
        node.engine.submit_transfer(batch, &submitted).expect("submit");
        let status = node.engine.wait_batch(batch).expect("wait");
        assert_eq!(status.state, TransferState::Completed, "round {round}: {:?}", node.engine.task_reason(batch, 0));
        for &(_, from, to, length) in &requests {
            let (from, to, length) = (from as usize, to as usize, length as usize);
            let copied = expected[from..from + length].to_vec();
            expected[to..to + length].copy_from_slice(&copied);
        }
        assert!(node.bytes() == expected, "round {round}: the device memory differs from the model");
        let evidence = node.engine.task_evidence(batch, 0).expect("task").expect("evidence");
        assert_eq!(evidence.path, "aiv");
    }
    // The SQEs were executed by the twin runtime's SDMA engines after doorbells the kernel rang through the register
    // pages: the device side did the work, not a Host copy.
    let executed: u64 = (0..2).map(|channel| cann_twin::control::sqes_executed(0, channel).expect("channel")).sum();
    let rung: u64 = (0..2).map(|channel| cann_twin::control::doorbells_rung(0, channel).expect("channel")).sum();
    assert!(executed > 0 && rung > 0, "SQEs executed {executed}, doorbells rung {rung}");
    assert!(cann_twin::control::kernel_faults().is_empty(), "{:?}", cann_twin::control::kernel_faults());
    drop(node);
}

/// The kernel API of the twin runtime on its own: what it refuses, and a launch whose kernel faults.
fn kernel_api() {
    use ascendcl_sys::result as acl;
    use ascendcl_sys::sys::*;
    use ascendcl_sys::AclError;
    let api = cann_twin::acl_api();
    acl::runtime::init(api, None).expect("aclInit");
    acl::device::set(api, 0).expect("set device 0");
    let code = |error: ascendcl_sys::Error| error.code().map(|AclError(code)| code);
    // Not an object for this host (an NPU object or anything else): refused.
    let npu_like = [0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0x29, 0x10];
    let mut padded = npu_like.to_vec();
    padded.resize(128, 0);
    // SAFETY: the bytes outlive the call; no options.
    let refused = unsafe { acl::kernel::load_from_data(api, &padded, None) }.expect_err("not a host object");
    assert_eq!(code(refused), Some(ACL_ERROR_INVALID_PARAM));
    let object = aiv_transport::device::kernel_image::TWIN_KERNEL_OBJECT;
    // SAFETY: the object is 'static.
    let binary = unsafe { acl::kernel::load_from_data(api, object, None) }.expect("the twin kernel object loads");
    // SAFETY: the binary is live.
    let missing = unsafe { acl::kernel::get_function(api, binary, c"no_such_kernel") }.expect_err("unknown name");
    assert_eq!(code(missing), Some(ACL_ERROR_RT_SYMBOL_NOT_FOUND));
    // SAFETY: the binary is live.
    let function = unsafe { acl::kernel::get_function(api, binary, c"aiv_transfer_kernel") }.expect("entry");
    let stream = acl::stream::create_with_config(api, 0, 0).expect("stream");
    // The kernel's first access reads its KernelArgs at an address that is no device memory: the core faults, the
    // launch ends, and the stream reports a vector-core exception.
    let mut engine = aclrtLaunchKernelAttr {
        id: ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE,
        value: aclrtLaunchKernelAttrValue { engineType: ACL_RT_ENGINE_TYPE_AIV },
    };
    let mut config = aclrtLaunchKernelCfg { attrs: &mut engine, numAttrs: 1 };
    let mut args = 0x40u64.to_le_bytes();
    let faults_before = cann_twin::control::kernel_faults().len();
    // SAFETY: function and stream are live; the argument is copied at launch.
    unsafe { acl::kernel::launch_with_host_args(api, function, 3, stream, Some(&mut config), &mut args[..]) }
        .expect("launch queued");
    // SAFETY: the stream is live.
    let ended = unsafe { acl::stream::synchronize_with_timeout(api, stream, 10_000) }.expect_err("the kernel faulted");
    assert_eq!(code(ended), Some(ACL_ERROR_RT_VECTOR_CORE_EXCEPTION));
    let faults = cann_twin::control::kernel_faults();
    assert!(faults.len() > faults_before, "no fault recorded");
    assert!(faults[faults_before..].iter().all(|fault| fault.device == 0 && fault.kind == 1 && fault.block < 3));
    // An AIC engine type is not modelled.
    let mut aic = aclrtLaunchKernelAttr {
        id: ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE,
        value: aclrtLaunchKernelAttrValue { engineType: ACL_RT_ENGINE_TYPE_AIC },
    };
    let mut config = aclrtLaunchKernelCfg { attrs: &mut aic, numAttrs: 1 };
    // SAFETY: as above.
    let aic = unsafe { acl::kernel::launch_with_host_args(api, function, 1, stream, Some(&mut config), &mut args[..]) }
        .expect_err("AIC");
    assert_eq!(code(aic), Some(ACL_ERROR_RT_FEATURE_NOT_SUPPORT));
    // SAFETY: no launch of the binary is queued or running any more.
    unsafe { acl::kernel::unload(api, binary) }.expect("unload");
    // SAFETY: the handle is gone: refused, not a crash.
    let gone = unsafe { acl::kernel::get_function(api, binary, c"aiv_transfer_kernel") }.expect_err("unloaded");
    assert_eq!(code(gone), Some(ACL_ERROR_RT_INVALID_HANDLE));
}

#[test]
fn the_runtime_names_its_threads_with_the_prefix_host_cpu_accounting_leaves_out() {
    assert!(aiv_transport::device::DEVICE_THREAD_PREFIXES.contains(&cann_twin::THREAD_PREFIX));
    assert!(cann_twin::kernel::CORE_THREAD_PREFIX.starts_with(cann_twin::THREAD_PREFIX));
}

/// WRITEs of `length` bytes from the first half of the node's buffer to the second, `count` of them.
fn local_writes(node: &aiv::Node, count: u64, length: u64) -> Vec<TransferRequest> {
    let local = node.engine.open_segment(node.engine.name()).expect("own segment");
    let half = node.buffer.len() / 2;
    (0..count)
        .map(|i| TransferRequest {
            opcode: Opcode::Write,
            source: node.buffer.addr() + i * length,
            target_id: local,
            target_offset: node.buffer.addr() + half + i * length,
            length,
            protocol: None,
        })
        .collect()
}

fn run(node: &aiv::Node, requests: &[TransferRequest]) -> (Vec<TransferState>, Vec<Option<String>>) {
    let (states, reasons, _) = run_with_evidence(node, requests);
    (states, reasons)
}

/// [`run`], with each task's evidence record.
fn run_with_evidence(
    node: &aiv::Node,
    requests: &[TransferRequest],
) -> (Vec<TransferState>, Vec<Option<String>>, Vec<TransferEvidence>) {
    let batch = node.engine.allocate_batch(requests.len()).expect("batch");
    node.engine.submit_transfer(batch, requests).expect("submit");
    node.engine.wait_batch(batch).expect("wait");
    let states = (0..requests.len()).map(|t| node.engine.transfer_status(batch, t).expect("status").state).collect();
    let reasons = (0..requests.len()).map(|t| node.engine.task_reason(batch, t).expect("reason")).collect();
    let evidence = (0..requests.len())
        .map(|t| node.engine.task_evidence(batch, t).expect("task").expect("evidence recorded"))
        .collect();
    node.engine.free_batch(batch).expect("free");
    (states, reasons, evidence)
}

/// Asserts that every record's four checks, derived from what the engine observed, are `expected`, and that the
/// acts came from the twin's device model.
fn assert_checks(evidence: &[TransferEvidence], expected: [Check; 4]) {
    assert!(!evidence.is_empty());
    for record in evidence {
        assert_eq!(record.checks().as_array(), expected, "{record:?}");
        for act in [&record.descriptors_written, &record.doorbells_rung, &record.completion_seen] {
            assert_eq!(act.source, Source::TwinModel, "{record:?}");
        }
    }
}

/// A stalled engine: the kernel's flag waits end at its budget (TIMEOUT), the backend resets both channels through
/// the runtime, and once the engines run again the device serves new transfers with their data.
fn stall_recovers() {
    let mut node = aiv::node(options(LaunchMode::Persistent), 4 << 20);
    node.modify(|bytes| bytes[..1 << 20].fill(9));
    for channel in 0..2 {
        cann_twin::control::set_stalled(0, channel, true).expect("stall");
    }
    let started = std::time::Instant::now();
    let (states, reasons) = run(&node, &local_writes(&node, 2, 4096));
    let waited = started.elapsed();
    assert_eq!(states, [TransferState::Timeout, TransferState::Timeout], "{reasons:?}");
    let reason = reasons[0].clone().expect("reason");
    assert!(reason.contains("wait budget"), "{reason}");
    // Kernel budget 300 ms, transfer timeout 10 s: the kernel's budget decided.
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "{waited:?}");
    assert!(node.device.transport().counters().channel_resets >= 1, "the backend reset no channel");
    for channel in 0..2 {
        cann_twin::control::set_stalled(0, channel, false).expect("release");
    }
    let (states, reasons) = run(&node, &local_writes(&node, 4, 200_000));
    assert!(states.iter().all(|state| *state == TransferState::Completed), "{states:?} {reasons:?}");
    assert!(node.read(0..800_000) == node.read(2 << 20..(2 << 20) + 800_000));
}

/// Two devices in one process, each one PE of its own SHMEM instance: aiv WRITEs and READs between them.
/// `size` bytes of the runtime's Host memory (`aclrtMallocHost`), filled with `seed`'s bytes.
fn malloc_host(size: usize, seed: u64) -> *mut u8 {
    let mut host = std::ptr::null_mut();
    // SAFETY: a live local; the twin checks the size.
    assert_eq!(unsafe { cann_twin::acl::aclrtMallocHost(&mut host, size) }, 0, "aclrtMallocHost");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // SAFETY: `size` bytes the runtime just returned, used by nothing else yet.
    rng.fill_bytes(unsafe { std::slice::from_raw_parts_mut(host.cast::<u8>(), size) });
    host.cast()
}

/// The bytes at `host` (Host memory of this process), copied.
fn host_bytes(host: *const u8, range: std::ops::Range<usize>) -> Vec<u8> {
    // SAFETY: callers pass ranges inside a live aclrtMallocHost allocation no transfer is writing.
    unsafe { std::slice::from_raw_parts(host.add(range.start), range.len()) }.to_vec()
}

fn host_memory() {
    let a = aiv::node(AivOptions { device_id: 0, ..options(LaunchMode::Persistent) }, 1 << 20);
    let b = aiv::node(AivOptions { device_id: 1, ..options(LaunchMode::Persistent) }, 1 << 20);
    let size = 256 << 10;
    let (host_a, host_b) = (malloc_host(size, 7), malloc_host(size, 8));
    let peer_b = b.bytes();
    // SAFETY: both allocations stay live until after they are unregistered below, and every transfer has finished.
    unsafe {
        a.engine.register_memory(host_a as u64, size as u64, "cpu:0").expect("register a's Host memory");
        b.engine.register_memory(host_b as u64, size as u64, "cpu:0").expect("register b's Host memory");
    }
    let before_b = host_bytes(host_b, 0..size);
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let request = |opcode, source: u64, target_offset: u64, length: u64| TransferRequest {
        opcode,
        source,
        target_id: peer,
        target_offset,
        length,
        protocol: None,
    };
    let slice = 64 << 10;
    let requests = [
        // a's device memory into b's Host memory, b's Host memory into a's device memory.
        request(Opcode::Write, a.buffer.addr(), host_b as u64, slice),
        request(Opcode::Read, a.buffer.addr() + slice, host_b as u64 + slice, slice),
        // a's Host memory (through its device's window) into b's device memory.
        request(Opcode::Write, host_a as u64, b.buffer.addr(), slice),
    ];
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    let status = a.engine.wait_batch(batch).expect("wait");
    assert_eq!(status.state, TransferState::Completed, "{:?}", a.engine.task_reason(batch, 0));
    let slice = slice as usize;
    assert!(host_bytes(host_b, 0..slice) == a.read(0..slice), "b's Host memory does not hold what a wrote");
    assert!(host_bytes(host_b, slice..size) == before_b[slice..], "b's Host memory changed past the write");
    assert!(a.read(slice..2 * slice) == before_b[slice..2 * slice], "a read something else from b's Host memory");
    assert!(b.read(0..slice) == host_bytes(host_a, 0..slice), "b's device memory does not hold a's Host bytes");
    assert!(b.read(slice..1 << 20) == peer_b[slice..], "b's device memory changed past the write");
    a.engine.unregister_memory(host_a as u64).expect("unregister");
    b.engine.unregister_memory(host_b as u64).expect("unregister");
    for host in [host_a, host_b] {
        // SAFETY: what aclrtMallocHost returned, unregistered, no transfer running.
        assert_eq!(unsafe { cann_twin::acl::aclrtFreeHost(host.cast()) }, 0, "aclrtFreeHost");
    }
}

fn two_devices() {
    let mut a = aiv::node(AivOptions { device_id: 0, ..options(LaunchMode::Persistent) }, 4 << 20);
    let mut b = aiv::node(AivOptions { device_id: 1, ..options(LaunchMode::Persistent) }, 4 << 20);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    a.modify(|bytes| rng.fill_bytes(bytes));
    b.modify(|bytes| rng.fill_bytes(bytes));
    let requests = aiv::writes(&a, &b, 4, 300_000);
    let batch = a.engine.allocate_batch(requests.len()).expect("batch");
    a.engine.submit_transfer(batch, &requests).expect("submit");
    let status = a.engine.wait_batch(batch).expect("wait");
    assert_eq!(status.state, TransferState::Completed, "{:?}", a.engine.task_reason(batch, 0));
    assert!(a.read(0..1_200_000) == b.read(0..1_200_000), "device 1 does not hold what device 0 wrote");
    let executed: u64 = (0..2).map(|channel| cann_twin::control::sqes_executed(0, channel).expect("channel")).sum();
    assert!(executed > 0, "device 0's engines executed nothing");
}

#[test]
fn an_aiv_transfer_is_attributed_to_the_aiv_blocks_its_sqes_doorbells_and_flag_reads() {
    in_child("provenance_aiv");
}

#[test]
fn core_written_sqes_rung_by_the_host_turn_only_the_doorbell_tally_to_the_host() {
    in_child("provenance_host_rings");
}

#[test]
fn a_flag_the_host_reads_before_the_kernel_turns_only_the_flag_tally_to_the_host() {
    in_child("provenance_host_reads_flag");
}

#[test]
fn sqes_the_host_rewrites_before_they_execute_turn_only_the_descriptor_check_to_no() {
    in_child("provenance_host_writes_sqes");
}

#[test]
fn sqes_rewritten_while_the_records_are_off_are_not_credited_to_the_kernel_that_wrote_them_before() {
    in_child("provenance_written_while_off");
}

#[test]
fn a_host_ring_of_sqes_the_kernel_rang_too_counts_both_ringers_and_turns_only_the_doorbell_check_to_no() {
    in_child("provenance_host_rings_too");
}

/// The provenance records of channels 0 and 1 of device 0 (the two blocks' channels), reset first.
fn provenance_reset() {
    for channel in 0..2 {
        cann_twin::control::reset_provenance(0, channel).expect("channel");
    }
}

fn provenance_of(channel: u32) -> cann_twin::control::Provenance {
    cann_twin::control::provenance(0, channel).expect("channel")
}

fn total(by_block: &[(u32, u64)]) -> u64 {
    by_block.iter().map(|&(_, count)| count).sum()
}

/// Executed SQEs and accepted doorbells of both channels.
fn executed_and_rung() -> (u64, u64) {
    let executed = (0..2).map(|channel| cann_twin::control::sqes_executed(0, channel).expect("channel")).sum();
    let rung = (0..2).map(|channel| cann_twin::control::doorbells_rung(0, channel).expect("channel")).sum();
    (executed, rung)
}

fn provenance_options() -> AivOptions {
    // Off by default (they cost the post path); on before the device's first SQE is written.
    cann_twin::control::record_provenance(true);
    // A long kernel budget: the variants below hold the engine or the cores for a few milliseconds.
    AivOptions { kernel_wait_budget: Duration::from_secs(5), ..options(LaunchMode::Persistent) }
}

/// A normal aiv transfer: every SQE its engines executed was written by the block of its channel (the channel's
/// index), every doorbell rung by that block, every flag read first by a core (flags a later flag overwrote before
/// any read are unseen, never the Host's).
fn provenance_aiv() {
    let mut node = aiv::node(provenance_options(), 8 << 20);
    node.modify(|bytes| bytes[..4 << 20].fill(3));
    provenance_reset();
    let (executed_before, rung_before) = executed_and_rung();
    let (states, reasons, evidence) = run_with_evidence(&node, &local_writes(&node, 16, 200_000));
    assert!(states.iter().all(|state| *state == TransferState::Completed), "{states:?} {reasons:?}");
    // The engine's own records of each transfer say the same: every check yes.
    assert_checks(&evidence, [Check::Yes; 4]);
    let (executed, rung) = executed_and_rung();
    let (mut sqes, mut doorbells, mut flags) = (0, 0, 0);
    for channel in 0..2 {
        let seen = provenance_of(channel);
        eprintln!("channel {channel}: {seen:?}");
        assert!(seen.sqes_by_block.iter().all(|&(block, _)| block == channel), "{seen:?}");
        assert!(seen.doorbells_by_block.iter().all(|&(block, _)| block == channel), "{seen:?}");
        assert_eq!((seen.sqes_by_host, seen.sqes_unknown), (0, 0), "{seen:?}");
        assert_eq!((seen.doorbells_by_host, seen.doorbells_unknown), (0, 0), "{seen:?}");
        assert_eq!(seen.flags_seen_by_host, 0, "{seen:?}");
        assert!(seen.flags_seen_by_core > 0, "{seen:?}");
        assert_eq!(seen.flags_seen_by_core + seen.flags_unseen, seen.flags_landed, "{seen:?}");
        sqes += total(&seen.sqes_by_block);
        doorbells += total(&seen.doorbells_by_block);
        flags += seen.flags_seen_by_core;
    }
    assert_eq!(sqes, executed - executed_before, "every executed SQE is attributed to a block");
    // The engine's records, per transfer, account for exactly the SQEs executed: each once, to its own transfer.
    let taken: u64 = evidence.iter().map(|record| record.descriptors_written.total()).sum();
    assert_eq!(taken, executed - executed_before, "{evidence:?}");
    assert_eq!(doorbells, rung - rung_before, "every accepted doorbell is attributed to a block");
    assert!(sqes > 16 && flags > 0, "SQEs {sqes}, flags seen by a core {flags}");
    assert!(node.read(0..3_200_000) == node.read(4 << 20..(4 << 20) + 3_200_000));
}

/// Variant (b): the kernel's doorbell writes are diverted (test-only) and a Host thread rings them instead. The
/// SQEs are still the blocks'; the doorbells are all the Host's; the flags are still read by the cores.
fn provenance_host_rings() {
    let mut node = aiv::node(provenance_options(), 8 << 20);
    node.modify(|bytes| bytes[..4 << 20].fill(5));
    provenance_reset();
    for channel in 0..2 {
        cann_twin::control::divert_core_doorbells(0, channel, true).expect("divert");
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let forwarder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut forwarded = [0u32; 2];
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                for channel in 0..2u32 {
                    let (count, tail) = cann_twin::control::diverted_doorbell(0, channel).expect("channel");
                    if count != forwarded[channel as usize] {
                        forwarded[channel as usize] = count;
                        cann_twin::control::host_ring_doorbell(0, channel, tail).expect("ring");
                    }
                }
                std::thread::yield_now();
            }
        })
    };
    let (states, reasons, evidence) = run_with_evidence(&node, &local_writes(&node, 16, 200_000));
    stop.store(true, std::sync::atomic::Ordering::Release);
    forwarder.join().expect("forwarder");
    assert!(states.iter().all(|state| *state == TransferState::Completed), "{states:?} {reasons:?}");
    // Exactly the doorbell check turns to no in each transfer's record.
    assert_checks(&evidence, [Check::Yes, Check::Yes, Check::No, Check::Yes]);
    let (mut sqes, mut host_doorbells) = (0, 0);
    for channel in 0..2 {
        cann_twin::control::divert_core_doorbells(0, channel, false).expect("undivert");
        let seen = provenance_of(channel);
        eprintln!("channel {channel}: {seen:?}");
        assert!(seen.doorbells_by_block.is_empty(), "no core's doorbell reached a register: {seen:?}");
        assert_eq!((seen.sqes_by_host, seen.sqes_unknown, seen.flags_seen_by_host), (0, 0, 0), "{seen:?}");
        assert!(seen.sqes_by_block.iter().all(|&(block, _)| block == channel), "{seen:?}");
        assert!(seen.flags_seen_by_core > 0, "the cores still read the flags: {seen:?}");
        sqes += total(&seen.sqes_by_block);
        host_doorbells += seen.doorbells_by_host;
    }
    assert!(sqes > 16 && host_doorbells > 0, "SQEs by blocks {sqes}, doorbells by the Host {host_doorbells}");
    assert!(node.read(0..3_200_000) == node.read(4 << 20..(4 << 20) + 3_200_000));
}

/// One WRITE of 4 KiB submitted while both channels' engines are stalled, once its block rang ([`stalled_write`]).
struct StalledWrite {
    batch: aiv_transport::BatchId,
    /// The channel whose block took it.
    channel: u32,
    started: std::time::Instant,
}

/// Resets the provenance records, stalls both engines, submits one 4 KiB WRITE and waits (at most 4 s) until its
/// block has rung and `ready(channel)` holds.
fn stalled_write(node: &aiv::Node, ready: impl Fn(u32) -> bool) -> StalledWrite {
    provenance_reset();
    for channel in 0..2 {
        cann_twin::control::set_stalled(0, channel, true).expect("stall");
    }
    let requests = local_writes(node, 1, 4096);
    let batch = node.engine.allocate_batch(1).expect("batch");
    let (_, rung_before) = executed_and_rung();
    node.engine.submit_transfer(batch, &requests).expect("submit");
    let started = std::time::Instant::now();
    loop {
        let rung: Vec<u64> = (0..2).map(|c| cann_twin::control::doorbells_rung(0, c).expect("channel")).collect();
        if rung.iter().sum::<u64>() > rung_before {
            let channel = if rung[0] > 0 { 0 } else { 1 };
            if ready(channel) {
                return StalledWrite { batch, channel, started };
            }
        }
        assert!(started.elapsed() < Duration::from_secs(4), "waited too long for the kernel's doorbell");
        std::thread::yield_now();
    }
}

/// The Host's runtime copy of device memory at `address` into `out` (`aclrtMemcpy` D2H, as any Host path would
/// make it); the runtime's return code.
fn host_read(address: u64, out: &mut [u8]) -> i32 {
    // SAFETY: `out` is live and writable for its length; the device side is checked by the runtime.
    unsafe {
        cann_twin::acl::aclrtMemcpy(
            out.as_mut_ptr().cast(),
            out.len(),
            address as *const core::ffi::c_void,
            out.len(),
            ascendcl_sys::sys::ACL_MEMCPY_DEVICE_TO_HOST,
        )
    }
}

/// The Host's runtime copy of `data` to device memory at `address` (`aclrtMemcpy` H2D); the return code.
fn host_write(address: u64, data: &[u8]) -> i32 {
    // SAFETY: `data` is live and readable for its length; the device side is checked by the runtime.
    unsafe {
        cann_twin::acl::aclrtMemcpy(
            address as *mut core::ffi::c_void,
            data.len(),
            data.as_ptr().cast(),
            data.len(),
            ascendcl_sys::sys::ACL_MEMCPY_HOST_TO_DEVICE,
        )
    }
}

/// Variant (c): the engines are stalled while the kernel posts and rings; once its cores poll they are held
/// (test-only), the engines run, and the Host reads the landed flag (D2H) before the cores are released. That flag
/// is the Host's; the SQEs and doorbells stay the block's.
fn provenance_host_reads_flag() {
    let mut node = aiv::node(provenance_options(), 8 << 20);
    node.modify(|bytes| bytes[..1 << 20].fill(6));
    // The kernel took the request and rang: its block now polls the flag.
    let StalledWrite { batch, channel, started } = stalled_write(&node, |_| true);
    let waited = |what: &str| assert!(started.elapsed() < Duration::from_secs(4), "waited too long for {what}");
    cann_twin::control::hold_cores(0, true);
    while !cann_twin::control::parked_cores(0).contains(&channel) {
        waited("the polling core to park");
        std::thread::yield_now();
    }
    for c in 0..2 {
        cann_twin::control::set_stalled(0, c, false).expect("release the engine");
    }
    let flag = loop {
        if let Some(&flag) = cann_twin::control::pending_flags(0, channel).expect("channel").first() {
            break flag;
        }
        waited("the flag to land");
        std::thread::yield_now();
    };
    let mut word = [0u8; 8];
    assert_eq!(host_read(flag, &mut word), 0, "the Host reads the flag D2H");
    cann_twin::control::hold_cores(0, false);
    let status = node.engine.wait_batch(batch).expect("wait");
    assert_eq!(status.state, TransferState::Completed, "{:?}", node.engine.task_reason(batch, 0));
    // Exactly the completion check turns to no in the transfer's record.
    let evidence = node.engine.task_evidence(batch, 0).expect("task").expect("evidence recorded");
    assert_checks(&[evidence], [Check::Yes, Check::Yes, Check::Yes, Check::No]);
    let seen = provenance_of(channel);
    eprintln!("channel {channel}: {seen:?}");
    assert_eq!((seen.flags_landed, seen.flags_seen_by_host, seen.flags_seen_by_core), (1, 1, 0), "{seen:?}");
    assert_eq!((seen.sqes_by_host, seen.sqes_unknown, seen.doorbells_by_host), (0, 0, 0), "{seen:?}");
    assert_eq!(seen.sqes_by_block, [(channel, 2)], "the data SQE and the flag SQE: {seen:?}");
    assert!(!seen.doorbells_by_block.is_empty(), "{seen:?}");
    assert!(seen.doorbells_by_block.iter().all(|&(block, _)| block == channel), "{seen:?}");
    assert!(node.read(0..4096) == node.read(4 << 20..(4 << 20) + 4096));
}

/// Whether the kernel took the request, wrote its SQEs (one data SQE and the flag SQE) and rang them on `channel`.
fn two_pending(channel: u32) -> bool {
    let window = cann_twin::control::sq_window(0, channel).expect("channel");
    window.tail.wrapping_sub(window.head) % window.depth >= 2
}

/// A Host thread rewrites the rung, unexecuted SQE slots of `channel` through the runtime: the same bytes, read D2H
/// and written back H2D.
fn host_rewrites_pending_sqes(channel: u32) {
    let window = cann_twin::control::sq_window(0, channel).expect("channel");
    let mut slot = window.head;
    while slot != window.tail {
        let address = window.sq_base + u64::from(slot) * 64;
        let mut sqe = [0u8; 64];
        let (read, write) = (host_read(address, &mut sqe), host_write(address, &sqe));
        assert_eq!((read, write), (0, 0), "the Host reads and rewrites SQ slot {slot}");
        slot = (slot + 1) % window.depth;
    }
}

/// Variant (a): the engines are stalled while the kernel posts and rings one transfer; a Host thread then rewrites
/// the rung, unexecuted SQE slots through the runtime (the same bytes, read D2H and written back H2D), and the
/// engines run. The SQEs the engine consumes are the Host's; the doorbell stays the block's, the flag is read by the
/// core: exactly the descriptor check turns to no.
fn provenance_host_writes_sqes() {
    let mut node = aiv::node(provenance_options(), 8 << 20);
    node.modify(|bytes| bytes[..1 << 20].fill(7));
    let StalledWrite { batch, channel, .. } = stalled_write(&node, two_pending);
    host_rewrites_pending_sqes(channel);
    for c in 0..2 {
        cann_twin::control::set_stalled(0, c, false).expect("release the engine");
    }
    let status = node.engine.wait_batch(batch).expect("wait");
    assert_eq!(status.state, TransferState::Completed, "{:?}", node.engine.task_reason(batch, 0));
    let evidence = node.engine.task_evidence(batch, 0).expect("task").expect("evidence recorded");
    assert_checks(std::slice::from_ref(&evidence), [Check::Yes, Check::No, Check::Yes, Check::Yes]);
    assert_eq!((evidence.descriptors_written.by_aiv, evidence.descriptors_written.by_host), (0, 2), "{evidence:?}");
    let seen = provenance_of(channel);
    eprintln!("channel {channel}: {seen:?}");
    assert_eq!((seen.sqes_by_host, total(&seen.sqes_by_block)), (2, 0), "{seen:?}");
    assert!(node.read(0..4096) == node.read(4 << 20..(4 << 20) + 4096));
}

/// The kernel writes and rings one transfer's SQEs while the engines are stalled; the records are turned off, a Host
/// thread rewrites those slots (not recorded), and the records are turned on again before the engines run. The slots
/// were written while nobody recorded: their writer is unknown, not the kernel that wrote them before. The doorbell
/// (rung while the records were on) stays the block's and the flag is read by the core.
fn provenance_written_while_off() {
    let mut node = aiv::node(provenance_options(), 8 << 20);
    node.modify(|bytes| bytes[..1 << 20].fill(8));
    let StalledWrite { batch, channel, .. } = stalled_write(&node, two_pending);
    cann_twin::control::record_provenance(false);
    host_rewrites_pending_sqes(channel);
    cann_twin::control::record_provenance(true);
    for c in 0..2 {
        cann_twin::control::set_stalled(0, c, false).expect("release the engine");
    }
    let status = node.engine.wait_batch(batch).expect("wait");
    assert_eq!(status.state, TransferState::Completed, "{:?}", node.engine.task_reason(batch, 0));
    let evidence = node.engine.task_evidence(batch, 0).expect("task").expect("evidence recorded");
    let written = &evidence.descriptors_written;
    assert_eq!((written.by_aiv, written.by_host, written.unattributed), (0, 0, 2), "{evidence:?}");
    assert_checks(std::slice::from_ref(&evidence), [Check::Yes, Check::No, Check::Yes, Check::Yes]);
    let seen = provenance_of(channel);
    eprintln!("channel {channel}: {seen:?}");
    assert_eq!((seen.sqes_unknown, total(&seen.sqes_by_block)), (2, 0), "{seen:?}");
    assert!(node.read(0..4096) == node.read(4 << 20..(4 << 20) + 4096));
}

/// The kernel writes and rings one transfer's SQEs while the engines are stalled, and a Host thread rings the same
/// tail again (test-only) before the engines run. The engine takes one doorbell that both rang: the transfer's
/// doorbell act counts each ringer once (1 by AIV, 1 by the Host), so exactly the doorbell check turns to no.
fn provenance_host_rings_too() {
    let mut node = aiv::node(provenance_options(), 8 << 20);
    node.modify(|bytes| bytes[..1 << 20].fill(4));
    let StalledWrite { batch, channel, .. } = stalled_write(&node, two_pending);
    let window = cann_twin::control::sq_window(0, channel).expect("channel");
    cann_twin::control::host_ring_doorbell(0, channel, window.tail).expect("the test-only Host doorbell");
    for c in 0..2 {
        cann_twin::control::set_stalled(0, c, false).expect("release the engine");
    }
    let status = node.engine.wait_batch(batch).expect("wait");
    assert_eq!(status.state, TransferState::Completed, "{:?}", node.engine.task_reason(batch, 0));
    let evidence = node.engine.task_evidence(batch, 0).expect("task").expect("evidence recorded");
    let rung = &evidence.doorbells_rung;
    assert_eq!((rung.by_aiv, rung.by_host, rung.unattributed), (1, 1, 0), "{evidence:?}");
    assert_eq!(rung.aiv_blocks, Some([channel, channel]), "{evidence:?}");
    assert_checks(std::slice::from_ref(&evidence), [Check::Yes, Check::Yes, Check::No, Check::Yes]);
    let seen = provenance_of(channel);
    eprintln!("channel {channel}: {seen:?}");
    assert_eq!((seen.doorbells_by_host, seen.doorbells_unknown), (1, 0), "{seen:?}");
    assert!(!seen.doorbells_by_block.is_empty(), "{seen:?}");
    assert!(seen.doorbells_by_block.iter().all(|&(block, _)| block == channel), "{seen:?}");
    assert!(node.read(0..4096) == node.read(4 << 20..(4 << 20) + 4096));
}

/// The occupancy figures with the real kernel (host/occupancy.rs over `cann_twin::control::occupancy`): while the
/// persistent kernel has nothing to do its cores mostly poll and no channel is busy; transfers make channels busy
/// with their SQEs; the Host's drain is a role of its own and the twin's threads are never Host CPU.
fn occupancy() {
    use aiv_transport::occupancy::{DeviceFigures, DeviceReport, OccupancySnapshot, ThreadRole};
    let node = aiv::node(options(LaunchMode::Persistent), 4 << 20);
    let device = node.device.backend().device_id() as i32;
    let figures = |occupancy: &aiv_transport::occupancy::Occupancy| -> DeviceFigures {
        let DeviceReport::TwinModel { devices } = &occupancy.device else { panic!("no twin figures: {occupancy:?}") };
        assert_eq!(devices.len(), 1);
        devices[0].clone()
    };
    // Let the kernel settle into its wait first: the window below starts once every block is in the poll that
    // follows its last work. A core held by the twin parks at its next idle hint (a hint comes only from the 16th
    // unchanged read of memory on), so every block parked means every block polls; once released, a core counts the
    // time it was parked as polling of the same poll, so the window starts when each block's polling time has moved
    // past its value while parked (parked, nothing is added).
    let (_, _) = run(&node, &local_writes(&node, 1, 4096));
    let blocks: Vec<u32> = cann_twin::control::occupancy(device)
        .cores
        .iter()
        .filter(|core| core.running > 0)
        .map(|core| core.block)
        .collect();
    assert!(!blocks.is_empty(), "the persistent kernel's blocks run");
    cann_twin::control::hold_cores(device, true);
    aiv::wait_until(Duration::from_secs(5), || {
        let mut parked = cann_twin::control::parked_cores(device);
        parked.sort_unstable();
        parked.dedup();
        if parked == blocks {
            Ok(())
        } else {
            Err(format!("every block of the kernel ({blocks:?}) parked at an idle hint; parked: {parked:?}"))
        }
    });
    let polling = |occupancy: &cann_twin::control::DeviceOccupancy| -> Vec<u64> {
        blocks
            .iter()
            .map(|&block| occupancy.cores.iter().find(|core| core.block == block).map_or(0, |core| core.polling_ns))
            .collect()
    };
    let parked = polling(&cann_twin::control::occupancy(device));
    cann_twin::control::hold_cores(device, false);
    aiv::wait_until(Duration::from_secs(5), || {
        let now = polling(&cann_twin::control::occupancy(device));
        if now.iter().zip(&parked).all(|(now, parked)| now > parked) {
            Ok(())
        } else {
            Err(format!("every block polling again after its release: polling ns {now:?}, parked at {parked:?}"))
        }
    });
    let before = OccupancySnapshot::take(&[device], true);
    std::thread::sleep(Duration::from_millis(100));
    let idle = OccupancySnapshot::take(&[device], true).since(&before);
    println!("{idle}");
    let quiet = figures(&idle);
    assert!(!quiet.cores.is_empty(), "the persistent kernel's blocks ran: {quiet:?}");
    let executing: u64 = quiet.cores.iter().map(|core| core.executing_ns).sum();
    let polling: u64 = quiet.cores.iter().map(|core| core.polling_ns).sum();
    assert!(polling > 4 * executing, "an idle kernel mostly polls: executing {executing} ns, polling {polling} ns");
    // Every block was on its core the whole time (within 20% of the wall time between the snapshots).
    for core in &quiet.cores {
        let total = core.executing_ns + core.polling_ns;
        assert!(total * 10 >= quiet.wall_ns * 8 && total <= quiet.wall_ns + quiet.wall_ns / 5, "{core:?} {quiet:?}");
    }
    assert!(quiet.channels.iter().all(|channel| channel.busy_ns == 0 && channel.sqes == 0), "{quiet:?}");
    // Transfers: the channels that carried them were busy.
    let before = OccupancySnapshot::take(&[device], true);
    let (states, reasons) = run(&node, &local_writes(&node, 4, 1 << 19));
    assert!(states.iter().all(|state| *state == TransferState::Completed), "{states:?} {reasons:?}");
    // A channel counts its run's SQEs when the run ends, which can be just after the Host saw the last completion
    // flag: the snapshot is taken again (for at most 1 s) until the runs that carried the transfers have ended.
    let settle = Instant::now() + Duration::from_secs(1);
    let mut moved = OccupancySnapshot::take(&[device], true).since(&before);
    while figures(&moved).channels.iter().map(|channel| channel.sqes).sum::<u64>() < 4 && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(5));
        moved = OccupancySnapshot::take(&[device], true).since(&before);
    }
    println!("{moved}");
    let busy = figures(&moved);
    let sqes: u64 = busy.channels.iter().map(|channel| channel.sqes).sum();
    let busy_ns: u64 = busy.channels.iter().map(|channel| channel.busy_ns).sum();
    assert!(sqes >= 4 && busy_ns > 0, "{busy:?}");
    assert!(busy.channels.iter().all(|channel| channel.busy_ns <= busy.wall_ns), "{busy:?}");
    // Host CPU by role: the drain thread is its own role; the twin's cores are device model, not Host.
    let host = moved.host_cpu.as_ref().expect("the process's threads are readable");
    let model = moved.device_model_cpu.as_ref().expect("the process's threads are readable");
    assert!(host.iter().any(|role| role.role == ThreadRole::AivDrain && role.threads >= 1), "{host:?}");
    assert!(host.iter().all(|role| !role.role.is_device_model()), "{host:?}");
    let cores = model.iter().find(|role| role.role == ThreadRole::DeviceModelAivCores).expect("the cores' threads");
    assert!(cores.cpu_ns > 0 && cores.threads >= 1, "{model:?}");
}
