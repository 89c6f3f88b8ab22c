//! The provenance records of the SDMA channels (docs/twin-runtime.md, "Provenance records") for the Host-side
//! paths, with no kernel: SQEs the Host writes with `aclrtMemcpy` H2D, doorbells rung through the test-only Host
//! path, an SQE slot written by an SDMA engine's copy, a doorbell through `register_write`, and completion flags
//! the Host reads D2H (or nobody reads). The core-side attributions need a kernel: `tests/cann_on_twin.rs` of the
//! root crate. The ACL and SHMEM entry points are called directly (the twin's C exports), not through the tables.

mod common;

use core::ffi::c_void;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;
use cann_shmem_sys::sys::*;
use cann_twin::acl::{aclInit, aclrtMalloc, aclrtMemcpy, aclrtSetDevice};
use cann_twin::control::{self, Doer, Provenance};
use cann_twin::shmem::{aclshmemx_get_uniqueid, aclshmemx_init_attr, aclshmemx_set_attr_uniqueid_args};
use common::copy_sqe;

const WAIT: Duration = Duration::from_secs(10);

/// SHMEM initialised with SDMA on device 0 (once); returns the workspace address.
fn workspace() -> u64 {
    // Off by default (they cost the post path); on before the first SQE is written.
    control::record_provenance(true);
    static WORKSPACE: OnceLock<u64> = OnceLock::new();
    let workspace = *WORKSPACE.get_or_init(|| {
        // SAFETY: a null config path is allowed; every other pointer is a live local.
        unsafe {
            assert_eq!(aclInit(core::ptr::null()), ACL_SUCCESS);
            assert_eq!(aclrtSetDevice(0), ACL_SUCCESS);
            let mut uid = aclshmemx_uniqueid_t::default();
            let mut attr = aclshmemx_init_attr_t::new(0, 1, 64 << 20);
            assert_eq!(aclshmemx_get_uniqueid(&mut uid), ACLSHMEM_SUCCESS);
            assert_eq!(aclshmemx_set_attr_uniqueid_args(0, 1, 64 << 20, &mut uid, &mut attr), 0);
            attr.option_attr.data_op_engine_type = ACLSHMEM_DATA_OP_SDMA;
            assert_eq!(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut attr), ACLSHMEM_SUCCESS);
        }
        let state = cann_shmem_sys::result::state::host_state(cann_twin::shmem_api()).expect("g_state reads back");
        state.sdma_workspace_addr
    });
    // SAFETY: plain value argument.
    assert_eq!(unsafe { aclrtSetDevice(0) }, ACL_SUCCESS);
    workspace
}

fn malloc(size: usize) -> u64 {
    let mut ptr = core::ptr::null_mut();
    // SAFETY: `ptr` is writable.
    assert_eq!(unsafe { aclrtMalloc(&mut ptr, size, ACL_MEM_MALLOC_HUGE_FIRST) }, ACL_SUCCESS);
    ptr as u64
}

fn upload(dev: u64, data: &[u8]) {
    // SAFETY: `data` is live for its length; the device side is checked by the twin.
    let code = unsafe {
        aclrtMemcpy(dev as *mut c_void, data.len(), data.as_ptr().cast(), data.len(), ACL_MEMCPY_HOST_TO_DEVICE)
    };
    assert_eq!(code, ACL_SUCCESS);
}

fn download(dev: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: `out` is live for `len` bytes; the device side is checked by the twin.
    let code =
        unsafe { aclrtMemcpy(out.as_mut_ptr().cast(), len, dev as *const c_void, len, ACL_MEMCPY_DEVICE_TO_HOST) };
    assert_eq!(code, ACL_SUCCESS);
    out
}

/// The channel's SQ base, register page and head, from its record (D2H).
fn record(channel: u32) -> (u64, u64, u32) {
    let bytes = download(workspace() + 64 + 64 * u64::from(channel), 64);
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    (u64_at(8), u64_at(16), u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")))
}

fn wait_head(channel: u32, head: u32) {
    let started = Instant::now();
    while record(channel).2 != head {
        assert!(started.elapsed() < WAIT, "channel {channel}: head never reached {head}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn provenance(channel: u32) -> Provenance {
    control::provenance(0, channel).expect("the channel exists")
}

/// The Host writes two copy SQEs and a flag SQE with `aclrtMemcpy` H2D and rings through the test-only Host path:
/// every SQE and the doorbell are the Host's; the flag lands unseen until the Host reads it D2H, and a read of the
/// word before it landed (the old value) sees nothing.
#[test]
fn host_written_sqes_rung_by_the_host_and_a_flag_the_host_reads_are_tallied_to_the_host() {
    let channel = 40;
    workspace();
    let (sq, _, head) = record(channel);
    assert_eq!(head, 0);
    assert_eq!(provenance(channel), Provenance::default(), "nothing recorded before any act");
    let (src, dst, flags) = (malloc(8192), malloc(8192), malloc(64));
    upload(src, &[7u8; 8192]);
    upload(flags, &41u64.to_le_bytes());
    upload(flags + 8, &0u64.to_le_bytes());
    let sqes = [copy_sqe(src, dst, 4096), copy_sqe(src + 4096, dst + 4096, 4096), copy_sqe(flags, flags + 8, 8)];
    upload(sq, &sqes.concat());
    // The engine is stalled while the Host polls the flag word: the Host's read of the old value is no observation.
    control::set_stalled(0, channel, true).expect("stall");
    control::host_ring_doorbell(0, channel, 3).expect("the test-only Host doorbell");
    assert_eq!(download(flags + 8, 8), 0u64.to_le_bytes());
    control::set_stalled(0, channel, false).expect("release");
    wait_head(channel, 3);
    let landed = provenance(channel);
    assert_eq!(landed.sqes_by_host, 3, "{landed:?}");
    assert!(landed.sqes_by_block.is_empty() && landed.sqes_unknown == 0, "{landed:?}");
    assert_eq!((landed.doorbells_by_host, landed.doorbells_unknown), (1, 0), "{landed:?}");
    assert!(landed.doorbells_by_block.is_empty(), "{landed:?}");
    assert_eq!((landed.flags_landed, landed.flags_seen_by_host, landed.flags_unseen), (1, 0, 1), "{landed:?}");
    // A D2H read not covering the whole word sees nothing; one covering it claims the flag, once.
    download(flags + 12, 4);
    assert_eq!(provenance(channel).flags_seen_by_host, 0);
    assert_eq!(download(flags, 16)[8..], 41u64.to_le_bytes());
    download(flags + 8, 8);
    let seen = provenance(channel);
    assert_eq!((seen.flags_seen_by_host, seen.flags_seen_by_core, seen.flags_unseen), (1, 0, 0), "{seen:?}");
    control::reset_provenance(0, channel).expect("reset");
    assert_eq!(provenance(channel), Provenance::default());
}

/// An SQE slot an SDMA engine's copy wrote is not attributable (unknown), a doorbell through `register_write` has no
/// named origin, and a flag nobody reads stays unseen.
#[test]
fn an_engine_written_slot_and_an_anonymous_doorbell_are_unknown_and_an_unread_flag_is_unseen() {
    let channel = 41;
    workspace();
    let (sq, reg, _) = record(channel);
    let (src, dst, flags) = (malloc(4096), malloc(4096), malloc(64));
    upload(flags, &9u64.to_le_bytes());
    // Slot 1's SQE is written by slot 0's copy (from a Host buffer): the engine, not the Host, wrote slot 1.
    let staged = malloc(64);
    upload(staged, &copy_sqe(src, dst, 4096));
    upload(sq, &copy_sqe(staged, sq + 64, 64));
    cann_twin::register_write(reg + 8, &2u32.to_le_bytes()).expect("accepted");
    wait_head(channel, 2);
    upload(sq + 128, &copy_sqe(flags, flags + 8, 8));
    control::host_ring_doorbell(0, channel, 3).expect("ring");
    wait_head(channel, 3);
    let seen = provenance(channel);
    assert_eq!((seen.sqes_by_host, seen.sqes_unknown), (2, 1), "{seen:?}");
    assert_eq!((seen.doorbells_unknown, seen.doorbells_by_host), (1, 1), "{seen:?}");
    assert_eq!((seen.flags_landed, seen.flags_unseen, seen.flags_seen_by_host), (1, 1, 0), "{seen:?}");
}

/// A reset of the records forgets who wrote each SQ slot: an SQE the Host wrote before the reset and the engine
/// executes after it is unattributed; one the Host wrote again after the reset is the Host's.
#[test]
fn a_reset_forgets_who_wrote_each_slot() {
    let channel = 42;
    workspace();
    let (sq, _, head) = record(channel);
    assert_eq!(head, 0);
    let from = control::sqe_log_position(0, channel).expect("the channel exists");
    let (src, dst) = (malloc(8192), malloc(8192));
    upload(sq, &[copy_sqe(src, dst, 4096), copy_sqe(src + 4096, dst + 4096, 4096)].concat());
    control::reset_provenance(0, channel).expect("reset");
    upload(sq + 64, &copy_sqe(src + 4096, dst + 4096, 4096));
    control::host_ring_doorbell(0, channel, 2).expect("ring");
    wait_head(channel, 2);
    let seen = provenance(channel);
    assert_eq!((seen.sqes_unknown, seen.sqes_by_host), (1, 1), "{seen:?}");
    let mut log = Vec::new();
    control::sqe_log(0, channel, from, &mut log).expect("the log");
    let writers: Vec<Doer> = log.iter().map(|sqe| sqe.writer).collect();
    assert_eq!(writers, [Doer::Unattributed, Doer::Host]);
}

/// SQEs exposed by two doorbell writes before the engine took the tail (the Host's test-only ring, then a
/// `register_write` whose caller the twin cannot name) name both ringers, each SQE; each ring is tallied once.
#[test]
fn sqes_exposed_by_two_rings_before_the_engine_took_the_tail_name_both_ringers() {
    let channel = 43;
    workspace();
    let (sq, reg, head) = record(channel);
    assert_eq!(head, 0);
    let from = control::sqe_log_position(0, channel).expect("the channel exists");
    let (src, dst) = (malloc(8192), malloc(8192));
    upload(sq, &[copy_sqe(src, dst, 4096), copy_sqe(src + 4096, dst + 4096, 4096)].concat());
    control::set_stalled(0, channel, true).expect("stall");
    control::host_ring_doorbell(0, channel, 2).expect("the test-only Host doorbell");
    cann_twin::register_write(reg + 8, &2u32.to_le_bytes()).expect("accepted");
    control::set_stalled(0, channel, false).expect("release");
    wait_head(channel, 2);
    let seen = provenance(channel);
    assert_eq!((seen.doorbells_by_host, seen.doorbells_unknown), (1, 1), "{seen:?}");
    let mut log = Vec::new();
    control::sqe_log(0, channel, from, &mut log).expect("the log");
    assert_eq!(log.len(), 2);
    for sqe in &log {
        assert_eq!(sqe.ringers.iter().collect::<Vec<_>>(), [Doer::Host, Doer::Unattributed], "{sqe:?}");
        assert_eq!(sqe.doorbell, log[0].doorbell, "one take of the tail: {sqe:?}");
    }
}

/// An AI-CPU thread (marked by the test-only hook) writes a data SQE with `aclrtMemcpy` H2D and the flag SQE with a
/// stream copy it queues, rings through the AI CPU's register path and reads the landed flag D2H: every act is the
/// AI CPU's, none a core's or the Host's, and the version-2 evidence counts them.
#[test]
fn sqes_a_doorbell_and_a_flag_of_an_ai_cpu_thread_are_the_ai_cpus() {
    let channel = 44;
    workspace();
    let (sq, _, head) = record(channel);
    assert_eq!(head, 0);
    let from = control::sqe_log_position(0, channel).expect("the channel exists");
    let (src, dst, flags) = (malloc(4096), malloc(4096), malloc(64));
    upload(flags, &5u64.to_le_bytes());
    upload(flags + 8, &0u64.to_le_bytes());
    let before = cann_twin::evidence::snapshot_v2();
    std::thread::spawn(move || {
        control::mark_aicpu_thread();
        // SAFETY: plain value argument.
        assert_eq!(unsafe { aclrtSetDevice(0) }, ACL_SUCCESS);
        upload(sq, &copy_sqe(src, dst, 4096));
        let flag_sqe = copy_sqe(flags, flags + 8, 8);
        let api = cann_twin::acl_api();
        let mut stream = core::ptr::null_mut();
        // SAFETY: `stream` is writable; `flag_sqe` stays alive until the stream is synchronised below.
        unsafe {
            assert_eq!(api.aclrtCreateStream(&mut stream), ACL_SUCCESS);
            let code = api.aclrtMemcpyAsync(
                (sq + 64) as *mut c_void,
                64,
                flag_sqe.as_ptr().cast(),
                64,
                ACL_MEMCPY_HOST_TO_DEVICE,
                stream,
            );
            assert_eq!(code, ACL_SUCCESS);
            assert_eq!(api.aclrtSynchronizeStream(stream), ACL_SUCCESS);
            assert_eq!(api.aclrtDestroyStream(stream), ACL_SUCCESS);
        }
        control::aicpu_ring_doorbell(0, channel, 2).expect("the AI CPU's doorbell");
        wait_head(channel, 2);
        assert_eq!(download(flags + 8, 8), 5u64.to_le_bytes(), "the flag landed and the AI CPU read it");
    })
    .join()
    .expect("the AI-CPU thread");
    let seen = provenance(channel);
    let sqes = (seen.sqes_by_aicpu, seen.sqes_by_host, seen.sqes_unknown, seen.sqes_by_block.len());
    assert_eq!(sqes, (2, 0, 0, 0), "{seen:?}");
    let doorbells = (seen.doorbells_by_aicpu, seen.doorbells_by_host, seen.doorbells_unknown);
    assert_eq!((doorbells, seen.doorbells_by_block.len()), ((1, 0, 0), 0), "{seen:?}");
    let flags_seen = (seen.flags_seen_by_aicpu, seen.flags_seen_by_host, seen.flags_seen_by_core, seen.flags_unseen);
    assert_eq!((seen.flags_landed, flags_seen), (1, (1, 0, 0, 0)), "{seen:?}");
    let mut log = Vec::new();
    control::sqe_log(0, channel, from, &mut log).expect("the log");
    let who: Vec<_> = log.iter().map(|sqe| (sqe.writer, sqe.ringers.iter().collect::<Vec<_>>(), sqe.flag)).collect();
    let aicpu = Doer::AiCpu;
    assert_eq!(who, [(aicpu, vec![aicpu], None), (aicpu, vec![aicpu], Some(control::FlagReader::AiCpu))]);
    // Version 2 of the evidence counts them (no other test of this binary acts as the AI CPU).
    let after = cann_twin::evidence::snapshot_v2();
    let sqes = after.sqes_by_aicpu - before.sqes_by_aicpu;
    let doorbells = after.doorbells_by_aicpu - before.doorbells_by_aicpu;
    let flags_seen = after.flags_seen_by_aicpu - before.flags_seen_by_aicpu;
    assert_eq!((sqes, doorbells, flags_seen), (2, 1, 1), "{after:?}");
}
