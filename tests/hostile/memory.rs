//! Registered memory that is not memory: ranges unmapped after registration, the null page, and a large batch of
//! registrations.
//!
//! Every copy the Host code makes into or out of a registered Host range must fail with an error when a page of it
//! is not mapped, at any size: the tcp data server (a peer's WRITE into it, a peer's READ from it), the tcp client
//! (a READ reply into a local buffer, a WRITE from one) and the in-process path. A CPU copy there would kill the
//! process (SIGSEGV), so the scenarios run in a child process (this test binary again, one test selected by an
//! environment variable): a signal is a failure of the test, not of the test harness. Each scenario runs twice, with
//! the default copy (`process_vm_readv`) and with the pipe fallback forced (`AIV_HOST_COPY=pipe`).

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

use aiv_transport::{EngineConfig, TransferEngine};

/// The environment variable that makes [`scenario_in_child`] run a scenario (only in the child).
const SCENARIO: &str = "AIV_HOSTILE_MEMORY_SCENARIO";
const PAGE: usize = 4096;

/// An anonymous mapping of our own, unmapped when dropped (or earlier, by [`Mapping::unmap`]).
struct Mapping {
    addr: u64,
    len: usize,
    mapped: bool,
}

impl Mapping {
    fn new(len: usize, fill: u8) -> Mapping {
        // SAFETY: a fresh anonymous mapping; the kernel picks the address.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED, "mmap");
        // SAFETY: the mapping just made is `len` writable bytes.
        unsafe { std::ptr::write_bytes(addr.cast::<u8>(), fill, len) };
        Mapping { addr: addr as u64, len, mapped: true }
    }

    fn unmap(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        assert_eq!(unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) }, 0, "munmap");
        self.mapped = false;
    }

    /// Asserts that the unmapped range is still unmapped (nothing else was mapped there meanwhile, which would make
    /// the scenario test nothing): `mincore(2)` fails with ENOMEM for it.
    fn assert_still_unmapped(&self) {
        assert!(!self.mapped);
        let mut pages = vec![0u8; self.len.div_ceil(PAGE)];
        // SAFETY: mincore only reads page tables and writes one byte per page into `pages`.
        let result = unsafe { libc::mincore(self.addr as *mut libc::c_void, self.len, pages.as_mut_ptr()) };
        let error = std::io::Error::last_os_error();
        assert!(result != 0 && error.raw_os_error() == Some(libc::ENOMEM), "the hole was mapped again meanwhile");
    }

    fn bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(self.mapped && offset + len <= self.len);
        // SAFETY: inside our live mapping; volatile, as engine threads may have written it.
        (offset..offset + len).map(|i| unsafe { std::ptr::read_volatile((self.addr as *const u8).add(i)) }).collect()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: our own mapping.
            unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
        }
    }
}

fn engine() -> TransferEngine {
    let mut config = EngineConfig::new("127.0.0.1");
    // Every transfer here ends at once (an error or a completion); a bug that hangs fails within this.
    config.aiv.transfer_timeout = Duration::from_secs(5);
    TransferEngine::new(config).expect("tcp engine starts")
}

const SMALL: u64 = 16;
const LARGE: u64 = 64 * 1024;
const REGION: usize = 128 * 1024;

/// The scenario of the child: returns normally when every step behaved; panics (exit code 101) when one did not. A
/// SIGSEGV ends it by the signal.
fn run_scenario(name: &str) {
    let started = Instant::now();
    match name {
        "target" => target_scenario(),
        "initiator" => initiator_scenario(),
        "local" => local_scenario(),
        other => panic!("unknown scenario {other}"),
    }
    eprintln!("scenario {name}: {:?}", started.elapsed());
}

/// A target whose registered buffer is unmapped after registration gets WRITEs and READs of 16 B and 64 KiB from a
/// peer: each fails at the peer, and the target stays alive and serves its mapped buffer afterwards.
fn target_scenario() {
    let target = engine();
    let mut gone = Mapping::new(REGION, 0x11);
    let kept = Mapping::new(REGION, 0x22);
    // SAFETY: both mappings outlive the engine's use of them (the unmapped one is the point of the test).
    unsafe { target.register_memory(gone.addr, REGION as u64, "cpu:0") }.expect("register the doomed buffer");
    // SAFETY: as above.
    unsafe { target.register_memory(kept.addr, REGION as u64, "cpu:0") }.expect("register the kept buffer");
    let initiator = engine();
    let local = Mapping::new(REGION, 0x33);
    // SAFETY: `local` outlives the initiator's transfers.
    unsafe { initiator.register_memory(local.addr, REGION as u64, "cpu:0") }.expect("register local");
    let name = target.name().to_owned();
    // Unmapped last, so that no mapping made for the engines lands in the hole.
    gone.unmap();
    for length in [SMALL, LARGE] {
        let write = initiator
            .transfer_sync_write(&name, local.addr, gone.addr + 100, length)
            .expect_err("a WRITE into unmapped target memory reported success");
        let read = initiator
            .transfer_sync_read(&name, local.addr, gone.addr + 100, length)
            .expect_err("a READ of unmapped target memory reported success");
        eprintln!("{length} B: write: {write}; read: {read}");
        assert!(write.to_string().contains("rejected"), "the target answered REJECTED: {write}");
    }
    // The target is alive and serves its mapped buffer.
    initiator.transfer_sync_write(&name, local.addr, kept.addr + 64, LARGE).expect("WRITE into the kept buffer");
    assert_eq!(kept.bytes(64, LARGE as usize), vec![0x33; LARGE as usize]);
    initiator.transfer_sync_read(&name, local.addr + LARGE, kept.addr, SMALL).expect("READ of the kept buffer");
    assert_eq!(local.bytes(LARGE as usize, SMALL as usize), vec![0x22; SMALL as usize]);
    gone.assert_still_unmapped();
}

/// An initiator whose registered local buffer is unmapped after registration: READs into it and WRITEs from it, 16
/// B and 64 KiB, fail; the target's memory is unchanged, and a transfer from a mapped buffer still completes.
fn initiator_scenario() {
    let target = engine();
    let remote = Mapping::new(REGION, 0x44);
    // SAFETY: `remote` outlives the engines.
    unsafe { target.register_memory(remote.addr, REGION as u64, "cpu:0") }.expect("register remote");
    let initiator = engine();
    let mut gone = Mapping::new(REGION, 0x55);
    let kept = Mapping::new(REGION, 0x66);
    // SAFETY: as above.
    unsafe { initiator.register_memory(gone.addr, REGION as u64, "cpu:0") }.expect("register the doomed buffer");
    // SAFETY: as above.
    unsafe { initiator.register_memory(kept.addr, REGION as u64, "cpu:0") }.expect("register the kept buffer");
    gone.unmap();
    let name = target.name().to_owned();
    for length in [SMALL, LARGE] {
        let read = initiator
            .transfer_sync_read(&name, gone.addr + 100, remote.addr, length)
            .expect_err("a READ into an unmapped local buffer reported success");
        let write = initiator
            .transfer_sync_write(&name, gone.addr + 100, remote.addr, length)
            .expect_err("a WRITE from an unmapped local buffer reported success");
        eprintln!("{length} B: read: {read}; write: {write}");
        for error in [read.to_string(), write.to_string()] {
            assert!(error.contains("not mapped"), "the failure names the unmapped local memory: {error}");
        }
    }
    assert_eq!(remote.bytes(0, REGION), vec![0x44; REGION], "the target's memory changed");
    initiator.transfer_sync_read(&name, kept.addr, remote.addr, LARGE).expect("READ into the kept buffer");
    assert_eq!(kept.bytes(0, LARGE as usize), vec![0x44; LARGE as usize]);
    initiator.transfer_sync_write(&name, kept.addr + LARGE, remote.addr + LARGE, SMALL).expect("WRITE from kept");
    assert_eq!(remote.bytes(LARGE as usize, SMALL as usize), vec![0x66; SMALL as usize]);
    gone.assert_still_unmapped();
}

/// The in-process path (a tcp transfer to the engine's own segment) from and to an unmapped registered range fails.
fn local_scenario() {
    let engine = engine();
    let mut gone = Mapping::new(REGION, 0x77);
    let kept = Mapping::new(REGION, 0x88);
    // SAFETY: both outlive the engine's use of them.
    unsafe { engine.register_memory(gone.addr, REGION as u64, "cpu:0") }.expect("register the doomed buffer");
    // SAFETY: as above.
    unsafe { engine.register_memory(kept.addr, REGION as u64, "cpu:0") }.expect("register the kept buffer");
    gone.unmap();
    let own = engine.name().to_owned();
    for length in [SMALL, LARGE] {
        assert!(engine.transfer_sync_read(&own, kept.addr, gone.addr, length).is_err(), "READ from unmapped");
        assert!(engine.transfer_sync_write(&own, kept.addr, gone.addr, length).is_err(), "WRITE to unmapped");
        assert!(engine.transfer_sync_write(&own, gone.addr, kept.addr, length).is_err(), "WRITE from unmapped");
    }
    assert_eq!(kept.bytes(0, REGION), vec![0x88; REGION]);
    engine.transfer_sync_write(&own, kept.addr, kept.addr + 8, LARGE).expect("overlapping local copy");
    assert_eq!(kept.bytes(0, REGION), vec![0x88; REGION]);
    gone.assert_still_unmapped();
}

/// Runs the scenario named by [`SCENARIO`] when this binary is the child; does nothing in a normal run.
#[test]
fn scenario_in_child() {
    if let Ok(name) = std::env::var(SCENARIO) {
        run_scenario(&name);
    }
}

/// Runs `scenario` in a child process (this test binary, only [`scenario_in_child`]), with the pipe copy forced
/// or not; a signal or a failed step fails the test with the child's output.
fn in_child(scenario: &str, pipe: bool) {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command.args(["--exact", "memory::scenario_in_child", "--nocapture", "--test-threads=1"]).env(SCENARIO, scenario);
    if pipe {
        command.env("AIV_HOST_COPY", "pipe");
    } else {
        command.env_remove("AIV_HOST_COPY");
    }
    let output = command.output().expect("run the child");
    let log = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if let Some(signal) = output.status.signal() {
        panic!("scenario {scenario} (pipe copy: {pipe}) killed by signal {signal}:\n{log}");
    }
    assert!(output.status.success(), "scenario {scenario} (pipe copy: {pipe}) failed: {}\n{log}", output.status);
    assert!(log.contains(&format!("scenario {scenario}:")), "the child ran no scenario:\n{log}");
}

#[test]
fn a_target_whose_registered_memory_was_unmapped_survives_peers_transfers() {
    in_child("target", false);
}

#[test]
fn an_initiator_whose_registered_memory_was_unmapped_fails_its_transfers() {
    in_child("initiator", false);
}

#[test]
fn the_local_path_fails_on_unmapped_registered_memory() {
    in_child("local", false);
}

#[test]
fn the_pipe_copy_fails_cleanly_too() {
    for scenario in ["target", "initiator", "local"] {
        in_child(scenario, true);
    }
}

/// Address 0, the null page, a range that was never mapped and one that wraps are refused at registration.
#[test]
fn ranges_that_cannot_be_memory_are_refused_at_registration() {
    let engine = engine();
    for (addr, length) in [(0u64, 4096u64), (0, 1), (0x800, 16), (0x1000, 4096), (u64::MAX - 10, 100)] {
        // SAFETY: every call is refused (asserted), so nothing is ever copied there.
        let result = unsafe { engine.register_memory(addr, length, "*") };
        let error = result.expect_err(&format!("[{addr:#x}, +{length}) registered"));
        let text = error.to_string();
        assert!(text.contains(&format!("{addr:#x}")), "the error names the range: {text}");
    }
    // A mapped range with an unmapped page in its middle.
    let mut holed = Mapping::new(3 * PAGE, 0);
    // SAFETY: the middle page of our own mapping.
    assert_eq!(unsafe { libc::munmap((holed.addr + PAGE as u64) as *mut libc::c_void, PAGE) }, 0);
    // SAFETY: refused (asserted).
    let result = unsafe { engine.register_memory(holed.addr, 3 * PAGE as u64, "cpu:0") };
    assert!(result.is_err(), "a range with an unmapped page registered");
    holed.unmap();
    assert!(engine.local_descriptor().buffers.is_empty(), "nothing was registered");
}

/// `count` regions of 256 bytes, 256 bytes apart, in one mapping, registered in one batch: the time it took.
fn register_batch(engine: &TransferEngine, base: u64, count: usize) -> Duration {
    let regions: Vec<(u64, u64, &str)> = (0..count).map(|i| (base + 512 * i as u64, 256, "cpu:0")).collect();
    let started = Instant::now();
    // SAFETY: every region lies in a mapping that outlives the engine's registration of it.
    unsafe { engine.register_memory_batch(&regions) }
        .map_err(|(index, error)| format!("{index}: {error}"))
        .expect("batch");
    started.elapsed()
}

fn unregister_batch(engine: &TransferEngine, base: u64, count: usize) -> Duration {
    let addrs: Vec<u64> = (0..count).map(|i| base + 512 * i as u64).collect();
    let started = Instant::now();
    engine.unregister_memory_batch(&addrs).expect("unregister batch");
    started.elapsed()
}

/// Registering and unregistering a batch of regions takes time linear in their number: 2,000 regions take at most
/// about four times as long as 500 (a descriptor published per region makes it quadratic: seconds for 2,000), and
/// 10,000 regions register and unregister within a few seconds.
#[test]
fn batch_registration_is_linear() {
    let engine = engine();
    let mapping = Mapping::new(10_000 * 512, 0);
    // Small counts first, so that a quadratic cost fails the test within seconds.
    let small = register_batch(&engine, mapping.addr, 500);
    let small_off = unregister_batch(&engine, mapping.addr, 500);
    let large = register_batch(&engine, mapping.addr, 2_000);
    let large_off = unregister_batch(&engine, mapping.addr, 2_000);
    eprintln!("register 500: {small:?}, 2,000: {large:?}; unregister 500: {small_off:?}, 2,000: {large_off:?}");
    let slack = Duration::from_millis(250);
    assert!(large <= small * 6 + slack, "registering 2,000 took {large:?}, 500 took {small:?}: not linear");
    assert!(large_off <= small_off * 6 + slack, "unregistering 2,000 took {large_off:?}, 500 {small_off:?}");
    let all = register_batch(&engine, mapping.addr, 10_000);
    assert_eq!(engine.local_descriptor().buffers.len(), 10_000);
    let all_off = unregister_batch(&engine, mapping.addr, 10_000);
    eprintln!("register 10,000: {all:?}; unregister 10,000: {all_off:?}");
    assert!(all < Duration::from_secs(3) && all_off < Duration::from_secs(3), "{all:?}, {all_off:?}");
    assert!(engine.local_descriptor().buffers.is_empty());
    // All or nothing: a batch with one bad region leaves none of it registered.
    let regions = [(mapping.addr, 256, "cpu:0"), (0, 256, "cpu:0"), (mapping.addr + 512, 256, "cpu:0")];
    // SAFETY: refused (asserted); the mapped regions outlive the engine anyway.
    let refused = unsafe { engine.register_memory_batch(&regions) }.expect_err("address 0 in the batch");
    assert_eq!(refused.0, 1, "the refused region's index");
    assert!(engine.local_descriptor().buffers.is_empty(), "the regions before the refused one were rolled back");
}
