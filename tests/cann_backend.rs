//! The CANN device backend's call sequences against fake CANN libraries (feature `cann`).
//!
//! The fakes are `shmem-bindings/ascendcl-sys/tests/fake/fake_acl.c` (built with `FAKE_BACKEND`) and
//! `shmem-bindings/cann-shmem-sys/tests/fake/fake_shmem.c`, compiled once per test process and found by the real
//! loader through `AIV_ASCENDCL_LIB` / `AIV_SHMEM_LIB`. They log every call with its arguments and can make any call
//! fail. "Device memory" is host memory there, so D2H reads and VMM aliasing are real; kernels are never run, so
//! nothing here shows the aiv data path works on an NPU (that is `tests/npu_hardware.rs`).
#![cfg(feature = "cann")]

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use aiv_transport::config::{AivOptions, DeviceBackendKind, LaunchMode};
use aiv_transport::device::cann::{CannDevice, CannSettings};
use aiv_transport::device::{DeviceError, DeviceMemory, KernelChannels, MemorySharing, SdmaSyndrome, UniqueIdExchange};

#[path = "common/cann.rs"]
mod common;

use common::{
    acl_log, calls, control, fake_kernel_object, fakes, new_workspace, set_published_workspace, set_result, shmem_log,
    BLOCKS, KERNEL_OBJECT, SQ_DEPTH,
};

/// This binary has no HiXL fake (see `common::fakes`).
const WITH_FAKE_HIXL: bool = false;

const HBM: u64 = 1 << 20;

/// Sets the fake SHMEM's `g_state` version word (0 restores the real one; an initialisation does not).
fn set_host_state_version(version: i32) {
    // SAFETY: the fake exports `void fake_set_state_version(int)`; a value argument only.
    unsafe { control::<unsafe extern "C" fn(i32)>(&fakes().shmem, "fake_set_state_version")(version) }
}

/// Sets the fake SHMEM's `g_state.mype` (the next initialisation sets it again).
fn set_host_state_mype(mype: i32) {
    // SAFETY: the fake exports `void fake_set_state_mype(int)`; a value argument only.
    unsafe { control::<unsafe extern "C" fn(i32)>(&fakes().shmem, "fake_set_state_mype")(mype) }
}

/// Fills the fake ACL's device copy of SHMEM's state (all zero: never written).
fn set_device_state(version: i32, mype: i32, npes: i32, workspace: u64) {
    // SAFETY: the fake exports `void fake_device_state(int32_t, int32_t, int32_t, uint64_t)`.
    unsafe {
        control::<unsafe extern "C" fn(i32, i32, i32, u64)>(&fakes().acl, "fake_device_state")(
            version, mype, npes, workspace,
        )
    }
}

/// Tests share the fakes' global state: one at a time; logs cleared and the state copies reset at the start (the
/// host state's version real, the device copy never written), so a failed test leaves nothing behind.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    set_host_state_version(0);
    set_published_workspace(fakes().workspace);
    set_device_state(0, 0, 0, 0);
    acl_log();
    shmem_log();
    guard
}

fn options(device_id: u32) -> AivOptions {
    AivOptions {
        device_backend: DeviceBackendKind::Cann,
        device_id,
        aiv_blocks: BLOCKS,
        sq_depth: SQ_DEPTH,
        hbm_size: HBM,
        launch_mode: LaunchMode::Persistent,
        ..AivOptions::default()
    }
}

fn settings(pe: i32, pes: i32) -> CannSettings {
    CannSettings {
        shmem_pe: pe,
        shmem_pes: pes,
        workspace_addr: None,
        kernel_object: Some(KERNEL_OBJECT),
        counter_hz: 50_000_000,
    }
}

fn open(device_id: u32) -> Arc<CannDevice> {
    CannDevice::open(&options(device_id), settings(0, 1), None).expect("fake device opens")
}

#[test]
fn bring_up_and_teardown_make_the_documented_calls_in_order() {
    let _serial = serial();
    let device = open(0);
    let acl = acl_log();
    let expected = [
        // Which runtime this is (the fake answers a version of the vendor's, so the NPU kernel object is loaded).
        "aclsysGetCANNVersion name=0".to_string(),
        "aclInit config=null".into(),
        "aclrtSetDevice device=0".into(),
        "aclrtCreateStreamWithConfig priority=0 flag=0".into(),
        "aclrtMallocPhysical size=1048576 mem_attr=4 location=0:1 flags=0".into(),
        "aclrtReserveMemAddress size=1048576 alignment=0 expect=null flags=0".into(),
        "aclrtMapMem size=1048576 offset=0 flags=0".into(),
        "aclrtMemSetAccess size=1048576 count=1 flags=3 location=0:1".into(),
        "aclrtMemExportToShareableHandle type=0 flags=1".into(),
        format!("aclrtBinaryLoadFromData length={} options=null", KERNEL_OBJECT.len()),
        "aclrtBinaryGetFunction name=aiv_transfer_kernel".into(),
    ];
    // aclInit reports a repeated initialisation after the first test of the process; the backend accepts that.
    assert_eq!(acl, expected, "ACL bring-up");
    // Records drawn from this device name the vendor's runtime and the version it reported (asked once, above).
    let label = aiv_transport::device::Device::runtime_label(&*device);
    assert_eq!((label.kind, label.version), (aiv_transport::evidence::RuntimeKind::Npu, "8.5.0-fake"));
    assert_eq!(label.to_string(), "NPU, CANN 8.5.0-fake");
    let shmem = shmem_log();
    assert_eq!(calls(&shmem), ["aclshmemx_get_uniqueid", "aclshmemx_set_attr_uniqueid_args", "aclshmemx_init_attr"]);
    assert!(shmem[1].starts_with("aclshmemx_set_attr_uniqueid_args pe=0 n_pes=1 size=33554432 uid=fake-uid"));
    assert_eq!(shmem[2], "aclshmemx_init_attr flags=8 pe=0 n_pes=1 size=33554432 comm_args=uid engine=2");
    let advertisement = device.advertisement();
    assert_eq!((advertisement.backend.as_str(), advertisement.regions.len()), ("cann", 1));
    assert_eq!(advertisement.regions[0].length, HBM);
    assert!(device.is_own_memory(advertisement.regions[0].addr, HBM));

    drop(device);
    let teardown = acl_log();
    assert_eq!(
        calls(&teardown),
        [
            "aclrtSynchronizeStreamWithTimeout",
            "aclrtBinaryUnLoad",
            "aclrtUnmapMem",
            "aclrtReleaseMemAddress",
            "aclrtFreePhysical",
            "aclrtDestroyStream",
            "aclrtResetDevice",
        ],
        "{teardown:?}"
    );
    assert_eq!(teardown[0], "aclrtSynchronizeStreamWithTimeout timeout=1000", "teardown waits are bounded");
    assert_eq!(shmem_log(), ["aclshmem_finalize"]);
}

#[derive(Default)]
struct InMemoryExchange {
    uid: Mutex<Option<[u8; 136]>>,
}

impl UniqueIdExchange for InMemoryExchange {
    fn publish(&self, uid: &[u8; 136]) -> Result<(), String> {
        *self.uid.lock().unwrap_or_else(|p| p.into_inner()) = Some(*uid);
        Ok(())
    }
    fn fetch(&self, _timeout: Duration) -> Result<[u8; 136], String> {
        self.uid.lock().unwrap_or_else(|p| p.into_inner()).ok_or_else(|| "nothing published".to_string())
    }
}

#[test]
fn shmem_bootstrap_carries_pe0s_unique_id_to_pe1_through_the_exchange() {
    let _serial = serial();
    let exchange = InMemoryExchange::default();
    let error = CannDevice::open(&options(1), settings(1, 2), Some(&exchange)).expect_err("nothing published yet");
    assert!(error.to_string().contains("fetch the SHMEM unique id from PE 0: nothing published"), "{error}");
    let error = CannDevice::open(&options(1), settings(1, 2), None).expect_err("no exchange");
    assert!(error.to_string().contains("unique-id exchange over the metadata channel"), "{error}");
    shmem_log();

    let pe0 = CannDevice::open(&options(0), settings(0, 2), Some(&exchange)).expect("PE 0");
    let published = exchange.uid.lock().unwrap_or_else(|p| p.into_inner()).expect("PE 0 published its id");
    assert_eq!(&published[12..20], b"fake-uid", "the 136 bytes after version, my_pe, n_pes");
    let log = shmem_log();
    assert_eq!(calls(&log), ["aclshmemx_get_uniqueid", "aclshmemx_set_attr_uniqueid_args", "aclshmemx_init_attr"]);
    assert_eq!(log[2], "aclshmemx_init_attr flags=8 pe=0 n_pes=2 size=33554432 comm_args=uid engine=2");
    drop(pe0);
    shmem_log();

    let pe1 = CannDevice::open(&options(1), settings(1, 2), Some(&exchange)).expect("PE 1");
    let log = shmem_log();
    assert_eq!(calls(&log), ["aclshmemx_set_attr_uniqueid_args", "aclshmemx_init_attr"], "PE 1 creates no id");
    assert!(log[0].starts_with("aclshmemx_set_attr_uniqueid_args pe=1 n_pes=2 size=33554432 uid=fake-uid"), "{log:?}");
    assert_eq!(log[1], "aclshmemx_init_attr flags=8 pe=1 n_pes=2 size=33554432 comm_args=uid engine=2");
    drop(pe1);
}

#[test]
fn channels_come_from_the_sdma_workspace_records() {
    let _serial = serial();
    let device = open(0);
    acl_log();
    let workspace = fakes().workspace;
    let channels = device.open_channels(BLOCKS, SQ_DEPTH).expect("channels");
    assert_eq!(channels.len(), 2);
    for (index, channel) in channels.iter().enumerate() {
        assert_eq!(channel.index, index as u32);
        assert_eq!(channel.record_addr, workspace + 64 + 64 * index as u64, "one 64-byte record per block at 64");
        assert!(device.is_own_memory(channel.flag_area_addr, 128), "flag areas live in the device heap");
        assert_eq!(channel.platform_context, 0);
    }
    assert_eq!(
        acl_log(),
        [
            "aclrtMemcpy dest_max=192 count=192 kind=2",
            "aclrtMemset max=128 value=0 count=128",
            "aclrtMemset max=128 value=0 count=128",
        ],
        "flag info + two records read D2H in one copy, then the flag areas cleared"
    );

    let error = device.open_channels(BLOCKS + 1, SQ_DEPTH).expect_err("the workspace has two queues");
    assert!(
        error.to_string().contains("(from g_state) reports flag 1 and 2 queues; 3 channel records are needed"),
        "{error}"
    );
    set_result(&fakes().acl, "aclrtMemcpy", 507899);
    let error = device.open_channels(BLOCKS, SQ_DEPTH).expect_err("injected D2H failure");
    set_result(&fakes().acl, "aclrtMemcpy", 0);
    assert!(error.to_string().contains("read the SDMA workspace: aclrtMemcpy failed: AclError(507899"), "{error}");
}

/// The device copy of SHMEM's state, as the backend reads it: 16 header bytes at 0x17ffbe010000, then the 8-byte
/// workspace address at offset 32968.
const DEVICE_STATE_READS: [&str; 2] =
    ["aclrtMemcpy dest_max=16 count=16 kind=2", "aclrtMemcpy dest_max=8 count=8 kind=2"];
/// `(1 << 16) + 32992`: the version word of the mirrored state layout.
const STATE_VERSION: i32 = 0x1_80e0;

#[test]
fn a_foreign_g_state_layout_falls_back_to_the_device_copy_of_the_state() {
    let _serial = serial();
    let device = open(0);
    let device_copy_workspace = new_workspace(&fakes().acl);
    assert_ne!(device_copy_workspace, fakes().workspace);
    set_host_state_version((1 << 16) + 40_000);
    set_device_state(STATE_VERSION, 0, 1, device_copy_workspace);
    acl_log();
    let channels = device.open_channels(BLOCKS, SQ_DEPTH).expect("channels through the device copy");
    assert_eq!(channels[1].record_addr, device_copy_workspace + 128, "records of the device copy's workspace");
    let log = acl_log();
    assert_eq!(log[..2], DEVICE_STATE_READS, "header, then the address word");
    assert_eq!(log[2], "aclrtMemcpy dest_max=192 count=192 kind=2", "then the workspace itself");

    // The device copy is checked like g_state: another PE's state is refused.
    set_device_state(STATE_VERSION, 1, 2, device_copy_workspace);
    let error = device.open_channels(BLOCKS, SQ_DEPTH).expect_err("state of PE 1 of 2");
    assert!(
        error.to_string().contains("device state at 0x17ffbe010000: mype 1 of npes 2 is not this process's PE 0 of 1"),
        "{error}"
    );
}

#[test]
fn when_every_source_fails_the_error_names_each_and_why() {
    let _serial = serial();
    let device = open(0);
    set_host_state_version((2 << 16) + 32_992);
    acl_log();
    let error = device.open_channels(BLOCKS, SQ_DEPTH).expect_err("no source works");
    let message = error.to_string();
    assert!(matches!(error, DeviceError::Unavailable { .. }), "{message}");
    for part in [
        "device 0: the address of SHMEM's SDMA workspace was not found; tried ",
        "AIV_SDMA_WORKSPACE_ADDR: not set; ",
        "g_state: version 0x280e0 is not layout 1/32992 (it names layout 2/32992); ",
        "device state at 0x17ffbe010000: version 0x0 is not layout 1/32992 (it names layout 0/0)",
        "Set AIV_SDMA_WORKSPACE_ADDR (hex)",
    ] {
        assert!(message.contains(part), "{part:?} missing: {message}");
    }
    assert_eq!(acl_log(), DEVICE_STATE_READS[..1], "the device copy's header only: its version was refused");

    // The right layout but another PE's values, and a failing D2H copy, are named too.
    set_host_state_version(0);
    set_host_state_mype(3);
    set_result(&fakes().acl, "aclrtMemcpy", 507899);
    let error = device.open_channels(BLOCKS, SQ_DEPTH).expect_err("no source works");
    set_result(&fakes().acl, "aclrtMemcpy", 0);
    let message = error.to_string();
    for part in [
        "g_state: mype 3 of npes 1 is not this process's PE 0 of 1",
        "device state at 0x17ffbe010000: aclrtMemcpy failed: AclError(507899",
    ] {
        assert!(message.contains(part), "{part:?} missing: {message}");
    }
}

#[test]
fn a_state_without_a_workspace_address_is_refused() {
    let _serial = serial();
    // SHMEM stores the address only once its SDMA transport is set up; here the fake publishes none.
    set_published_workspace(0);
    let device = open(0);
    let error = device.open_channels(BLOCKS, SQ_DEPTH).expect_err("no workspace in g_state");
    assert!(
        error.to_string().contains("g_state: sdma_workspace_addr is 0 (SHMEM set up no SDMA transport)"),
        "{error}"
    );
}

#[test]
fn the_environment_override_wins_over_shmems_state() {
    let _serial = serial();
    let override_workspace = new_workspace(&fakes().acl);
    std::env::set_var("AIV_SDMA_WORKSPACE_ADDR", format!("{override_workspace:#x}"));
    let from_env = CannSettings::from_env(0);
    std::env::remove_var("AIV_SDMA_WORKSPACE_ADDR");
    let mut settings = from_env.expect("settings");
    assert_eq!(settings.workspace_addr, Some(override_workspace));
    settings.kernel_object = Some(KERNEL_OBJECT);
    let device = CannDevice::open(&options(0), settings, None).expect("device");
    set_device_state(STATE_VERSION, 0, 1, fakes().workspace);
    acl_log();
    let channels = device.open_channels(BLOCKS, SQ_DEPTH).expect("channels");
    assert_eq!(channels[0].record_addr, override_workspace + 64, "the override, not g_state's workspace");
    assert_eq!(acl_log()[0], "aclrtMemcpy dest_max=192 count=192 kind=2", "no state copy was read");

    std::env::set_var("AIV_SDMA_WORKSPACE_ADDR", "0xnot-hex");
    let error = CannSettings::from_env(0).expect_err("malformed");
    std::env::remove_var("AIV_SDMA_WORKSPACE_ADDR");
    assert!(
        error.to_string().contains("AIV_SDMA_WORKSPACE_ADDR=\"0xnot-hex\" is not a hexadecimal address"),
        "{error}"
    );
}

/// Persistent mode: nothing waits for the resident kernel's launch, so an exception that ended it must be found when
/// the transport asks for a channel's exception (it did not: only a launch wait looked at the stream).
#[test]
fn a_stream_exception_is_found_without_a_launch_wait() {
    let _serial = serial();
    let device = open(0);
    device.open_channels(BLOCKS, SQ_DEPTH).expect("channels");
    let _launch = device.launch(0x1234_5000, BLOCKS).expect("launch");
    set_result(&fakes().acl, "aclrtSynchronizeStreamWithTimeout", 507046);
    assert!(device.channel_exception(0).is_none(), "a kernel still running is no exception");
    set_result(&fakes().acl, "aclrtSynchronizeStreamWithTimeout", 507035);
    let exception = device.channel_exception(0).expect("the kernel's exception, seen without a launch wait");
    set_result(&fakes().acl, "aclrtSynchronizeStreamWithTimeout", 0);
    assert_eq!(exception.syndrome, SdmaSyndrome::STREAM_EXCEPTION);
    assert!(exception.to_string().contains("507035"), "{exception}");
}

#[test]
fn the_kernel_is_launched_on_aiv_with_its_argument_and_waited_for_with_a_bound() {
    let _serial = serial();
    let device = open(0);
    device.open_channels(BLOCKS, SQ_DEPTH).expect("channels");
    acl_log();
    let launch = device.launch(0x1234_5000, BLOCKS).expect("launch");
    // attr0=3: ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE, value0=1: ACL_RT_ENGINE_TYPE_AIV.
    assert_eq!(
        acl_log(),
        ["aclrtLaunchKernelWithHostArgs blocks=2 attrs=1 attr0=3 value0=1 args_size=8 arg=kernel_args placeholders=0"]
    );
    assert!(launch.wait(Duration::from_millis(250)), "the fake's stream is idle");
    assert_eq!(acl_log(), ["aclrtSynchronizeStreamWithTimeout timeout=250"]);

    set_result(&fakes().acl, "aclrtSynchronizeStreamWithTimeout", 507046);
    assert!(!launch.wait(Duration::from_millis(5)), "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT is 'not yet'");
    assert!(device.channel_exception(0).is_none(), "a timeout is no exception");

    set_result(&fakes().acl, "aclrtSynchronizeStreamWithTimeout", 507015);
    assert!(launch.wait(Duration::from_millis(5)), "a stream exception ends the kernel");
    set_result(&fakes().acl, "aclrtSynchronizeStreamWithTimeout", 0);
    assert!(device.stream_error().expect("recorded").contains("aclrtSynchronizeStreamWithTimeout failed"));
    acl_log();
    let exception = device.channel_exception(1).expect("exception reported per channel");
    assert_eq!((exception.channel, exception.sq_id, exception.head, exception.tail), (1, 33, 0, 0));
    assert_eq!(exception.syndrome, SdmaSyndrome::STREAM_EXCEPTION);
    assert_eq!(
        acl_log(),
        [
            "aclrtSynchronizeStreamWithTimeout timeout=1",
            "aclrtMemcpy dest_max=64 count=64 kind=2",
            "aclrtMemcpy dest_max=64 count=64 kind=2"
        ],
        "a 1 ms look at the stream, then the channel record, then the SQE at its head, read back"
    );
    let error = device.reset_channel(1).expect_err("no known recovery call");
    assert!(error.to_string().contains("not implemented on CANN"), "{error}");

    set_result(&fakes().acl, "aclrtLaunchKernelWithHostArgs", 507899);
    let error = device.launch(0x1234_5000, BLOCKS).expect_err("injected launch failure");
    set_result(&fakes().acl, "aclrtLaunchKernelWithHostArgs", 0);
    assert!(error.to_string().contains("launch aiv_transfer_kernel: aclrtLaunchKernelWithHostArgs failed"), "{error}");
}

#[test]
fn dcq_and_rings_live_in_host_memory_registered_for_the_device() {
    let _serial = serial();
    let device = open(0);
    acl_log();
    let shared = device.allocate_shared(100).expect("registered");
    assert_eq!(acl_log(), ["aclrtHostRegister size=4096 kind=0"]);
    assert_eq!(shared.len(), 4096);
    assert_eq!(shared.device_addr(), shared.host_ptr() as u64, "the fake maps Host memory at the same address");
    drop(shared);
    assert_eq!(acl_log(), ["aclrtHostUnregister"]);

    set_result(&fakes().acl, "aclrtHostRegister", 107000);
    let error = device.allocate_shared(100).expect_err("injected");
    set_result(&fakes().acl, "aclrtHostRegister", 0);
    assert!(
        error.to_string().contains("register Host memory for the device (DCQ, rings): aclrtHostRegister failed"),
        "{error}"
    );
}

#[test]
fn a_peer_heap_is_imported_through_vmm_and_aliases_the_exporters_bytes() {
    let _serial = serial();
    let device = open(0);
    let mut exporter = device.advertisement();
    exporter.device = "another-device".into();
    let region = exporter.regions[0].clone();
    let buffer = device.allocate(4096).expect("HBM");
    device.copy_to_device(buffer.addr(), b"written by the exporter").expect("H2D");
    acl_log();
    let window = device.import(&exporter, &region).expect("import");
    assert_eq!(
        acl_log(),
        [
            "aclrtMemImportFromShareableHandle device=0",
            "aclrtReserveMemAddress size=1048576 alignment=0 expect=null flags=0",
            "aclrtMapMem size=1048576 offset=0 flags=0",
        ]
    );
    assert_eq!(device.import(&exporter, &region).expect("again"), window, "imported once per region");
    assert!(acl_log().is_empty());
    let local = window.translate(buffer.addr(), 23).expect("inside the window");
    assert_ne!(local, buffer.addr(), "a second mapping of the same memory");
    assert!(device.is_mapped(local, 23) && !device.is_own_memory(local, 23));
    let mut seen = [0u8; 23];
    device.copy_from_device(local, &mut seen).expect("D2H through the import");
    assert_eq!(&seen, b"written by the exporter");
    assert!(device.copy_from_device(8, &mut seen).is_err(), "unmapped addresses are refused before any call");

    drop(buffer);
    drop(device);
    let teardown = calls(&acl_log()).join(" ");
    assert!(
        teardown.contains(
            "aclrtUnmapMem aclrtReleaseMemAddress aclrtFreePhysical aclrtUnmapMem aclrtReleaseMemAddress \
             aclrtFreePhysical aclrtDestroyStream"
        ),
        "import unmapped before the own heap: {teardown}"
    );
}

#[test]
fn every_bring_up_failure_names_its_step_and_code_and_undoes_what_was_done() {
    let _serial = serial();
    let acl = &fakes().acl;
    let shmem = &fakes().shmem;
    let cases: [(&libloading::Library, &str, i32, &str); 12] = [
        (acl, "aclrtSetDevice", 107001, "set the device"),
        (acl, "aclrtCreateStreamWithConfig", 207000, "create the kernel stream"),
        (shmem, "aclshmemx_get_uniqueid", -1, "get the SHMEM unique id"),
        (shmem, "aclshmemx_set_attr_uniqueid_args", -2, "set the SHMEM attributes"),
        (shmem, "aclshmemx_init_attr", -1, "initialise SHMEM with the SDMA engine"),
        (acl, "aclrtMallocPhysical", 207001, "allocate physical HBM"),
        (acl, "aclrtReserveMemAddress", 207001, "reserve device addresses"),
        (acl, "aclrtMapMem", 207001, "map HBM"),
        (acl, "aclrtMemSetAccess", 100000, "grant access to HBM"),
        (acl, "aclrtMemExportToShareableHandle", 100000, "export the HBM heap"),
        (acl, "aclrtBinaryLoadFromData", 100000, "load the kernel binary"),
        (acl, "aclrtBinaryGetFunction", 107000, "find the kernel entry aiv_transfer_kernel"),
    ];
    for (library, function, code, step) in cases {
        acl_log();
        shmem_log();
        set_result(library, function, code);
        let error = CannDevice::open(&options(0), settings(0, 1), None).expect_err(function);
        set_result(library, function, 0);
        let message = error.to_string();
        assert!(matches!(error, DeviceError::Runtime { .. }), "{message}");
        assert!(
            message.starts_with(&format!("device 0: {step}: {function} failed: "))
                && message.contains(&code.to_string()),
            "{function}: {message}"
        );
        let log = acl_log();
        let undo = calls(&log).into_iter().rev().take_while(|call| *call != function).collect::<Vec<_>>();
        let expected_last = "aclrtResetDevice";
        if function != "aclrtSetDevice" {
            assert_eq!(undo.first(), Some(&expected_last), "{function}: device released last ({undo:?})");
        }
    }
    // The deepest failure undoes everything in reverse order.
    set_result(acl, "aclrtBinaryGetFunction", 107000);
    acl_log();
    shmem_log();
    CannDevice::open(&options(0), settings(0, 1), None).expect_err("lookup fails");
    set_result(acl, "aclrtBinaryGetFunction", 0);
    let log = acl_log();
    let after =
        calls(&log).into_iter().skip_while(|call| *call != "aclrtBinaryGetFunction").skip(1).collect::<Vec<_>>();
    assert_eq!(
        after,
        [
            "aclrtBinaryUnLoad",
            "aclrtUnmapMem",
            "aclrtReleaseMemAddress",
            "aclrtFreePhysical",
            "aclrtDestroyStream",
            "aclrtResetDevice"
        ]
    );
    assert_eq!(calls(&shmem_log()).last(), Some(&"aclshmem_finalize"));
}

#[test]
fn a_build_without_the_npu_kernel_object_says_how_to_get_one() {
    let _serial = serial();
    let mut without = settings(0, 1);
    without.kernel_object = None;
    let error = CannDevice::open(&options(0), without, None).expect_err("no object");
    let message = error.to_string();
    assert!(message.contains("no NPU kernel object") && message.contains("bisheng or ccec"), "{message}");
}

#[test]
fn two_engines_bootstrap_shmem_over_the_metadata_channel_and_start_the_aiv_transport() {
    use aiv_transport::{EngineConfig, Protocol, TransferEngine};
    let _serial = serial();
    std::env::set_var("AIV_NPU_KERNEL_OBJECT", fake_kernel_object());
    std::env::set_var("AIV_SHMEM_N_PES", "2");
    let engine = |device_id: u32| {
        let mut config = EngineConfig::new("127.0.0.1");
        config.protocol = Protocol::Aiv;
        config.aiv = options(device_id);
        TransferEngine::new(config).expect("engine starts")
    };

    std::env::set_var("AIV_SHMEM_PE", "0");
    let root = engine(0);
    let root_device = root.device().expect("PE 0 device");
    let root_aiv = root.local_descriptor().aiv.expect("aiv object");
    assert!(root_aiv.get("shmem_uid").and_then(|uid| uid.as_str()).is_some_and(|uid| !uid.is_empty()), "{root_aiv}");
    assert_eq!(root_aiv["backend"], "cann");

    std::env::set_var("AIV_SHMEM_PE", "1");
    std::env::set_var("AIV_SHMEM_ROOT_SEGMENT", root.name());
    shmem_log();
    let peer = engine(1);
    let peer_device = peer.device().expect("PE 1 device, id fetched from PE 0's descriptor");
    let log = shmem_log();
    assert!(log[0].starts_with("aclshmemx_set_attr_uniqueid_args pe=1 n_pes=2 size=33554432 uid=fake-uid"), "{log:?}");
    assert_eq!(peer_device.backend().backend_name(), "cann");
    peer.open_segment(root.name()).expect("PE 0's segment, with its advertised heap");

    for name in ["AIV_NPU_KERNEL_OBJECT", "AIV_SHMEM_N_PES", "AIV_SHMEM_PE", "AIV_SHMEM_ROOT_SEGMENT"] {
        std::env::remove_var(name);
    }
    drop((peer_device, peer, root_device, root));
}

#[test]
fn doctor_prints_versions_devices_and_shmem_when_the_libraries_load() {
    let _serial = serial();
    let report = aiv_transport::doctor::diagnose();
    let text = report.render();
    println!("{text}");
    let runtime = report.runtime.as_ref().expect("libascendcl.so loaded, so the runtime was queried");
    assert_eq!(runtime.acl_interface, Ok((1, 17, 0)));
    assert_eq!(runtime.devices, Ok(8));
    assert!(runtime.packages.iter().any(|(name, version)| *name == "driver" && version.as_deref() == Ok("8.5.0-fake")));
    for line in ["ACL interface     1.17.0", "driver            8.5.0-fake", "devices           8", "SHMEM engines"] {
        assert!(text.contains(line), "{line:?} missing:\n{text}");
    }
    assert!(text.contains("aclshmem_info_get_version"), "the fake SHMEM lacks the optional version call:\n{text}");
    let log = acl_log();
    assert!(calls(&log).contains(&"aclsysGetCANNVersion") && calls(&log).contains(&"aclrtGetDeviceCount"), "{log:?}");
}
