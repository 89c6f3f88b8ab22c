//! With feature `cann` and fake ACL/SHMEM libraries but no `libcann_hixl.so` (`AIV_HIXL_LIB` names a file that does
//! not exist), the cann device still opens and serves the other paths, and an `adxl` transfer fails with the loader's
//! error listing every path it tried; an `adxl-fabric` transfer fails saying the vendor has no FabricMem C API. Its own
//! test binary: the HiXL table is loaded once per process.
#![cfg(feature = "cann")]

#[path = "common/cann.rs"]
mod common;

use aiv_transport::transport::adxl::AdxlStatus;
use aiv_transport::{Opcode, Protocol, TransferState};
use common::*;

/// This binary points `AIV_HIXL_LIB` at nothing.
const WITH_FAKE_HIXL: bool = false;

#[test]
fn adxl_without_the_hixl_library_fails_naming_every_path_tried() {
    let _serial = serial();
    let a = node(0);
    let b = node(1);
    assert!(
        a.engine.local_descriptor().aiv.expect("aiv object").get("hixl_server").is_none(),
        "no server is advertised without the library"
    );
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let outcome =
        run(&a.engine, &[request(Protocol::Adxl, Opcode::Write, a.buffer.addr(), peer, b.buffer.addr(), 4096)]);
    assert_eq!(outcome.states, [TransferState::Failed]);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert_eq!(AdxlStatus::of_failure(outcome.failures[0].as_ref().expect("failure")), AdxlStatus::FAILED);
    assert!(
        reason.contains("the HiXL library: libcann_hixl.so could not be loaded; tried")
            && reason.contains(&missing_hixl().display().to_string())
            && reason.contains("(from AIV_HIXL_LIB): no such file"),
        "{reason}"
    );

    // The other baseline of the same device is unaffected.
    let data = pattern(1, 8192);
    a.write(0, &data);
    let outcome =
        run(&a.engine, &[request(Protocol::Ubshmem, Opcode::Write, a.buffer.addr(), peer, b.buffer.addr(), 8192)]);
    assert_eq!(outcome.states, [TransferState::Completed], "{:?}", outcome.reasons);
    assert_eq!(b.read(0, 8192), data);
}

/// On the vendor's runtime (the fakes) adxl-fabric is unavailable: no FabricMem engine is advertised, and a transfer
/// fails at once, FAILED, saying that the vendor's FabricMem is reached only through ADXL's C++ engine.
#[test]
fn adxl_fabric_on_the_vendor_runtime_fails_saying_why() {
    let _serial = serial();
    let a = node(0);
    let b = node(1);
    assert!(
        a.engine.local_descriptor().aiv.expect("aiv object").get("fabric_mem_server").is_none(),
        "no FabricMem engine is advertised on the vendor's runtime"
    );
    let peer = a.engine.open_segment(b.engine.name()).expect("peer segment");
    let outcome =
        run(&a.engine, &[request(Protocol::AdxlFabric, Opcode::Write, a.buffer.addr(), peer, b.buffer.addr(), 4096)]);
    assert_eq!(outcome.states, [TransferState::Failed]);
    assert_eq!(AdxlStatus::of_failure(outcome.failures[0].as_ref().expect("failure")), AdxlStatus::FAILED);
    let reason = outcome.reasons[0].clone().expect("reason");
    assert!(
        reason.starts_with("adxl-fabric: FAILED (503900)")
            && reason.contains("adxl::AdxlEngine")
            && reason.contains("EnableUseFabricMem")
            && reason.contains("twin runtime only"),
        "{reason}"
    );
}
