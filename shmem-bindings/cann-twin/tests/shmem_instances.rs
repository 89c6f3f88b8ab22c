//! Instances of the SHMEM library, one per device of a process (`shmem_api_instance`): each its own PE, state
//! (`g_state`), SDMA workspace and heap, independent of the others.

mod common;

use ascendcl_sys::sys::*;
use cann_shmem_sys::result::state::host_state;
use cann_shmem_sys::sys::*;
use cann_shmem_sys::ShmemApi;

/// Initialises `shmem` as PE 0 of 1 with the SDMA engine on `device` (made current on this thread); returns the code.
fn init(shmem: &ShmemApi, device: i32) -> i32 {
    let api = common::api();
    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtSetDevice(device) }, ACL_SUCCESS);
    let mut uid = aclshmemx_uniqueid_t::default();
    let mut attr = aclshmemx_init_attr_t::new(0, 0, 0);
    // SAFETY: live locals; `uid` outlives the initialisation below.
    unsafe {
        assert_eq!(shmem.aclshmemx_get_uniqueid(&mut uid), ACLSHMEM_SUCCESS);
        assert_eq!(shmem.aclshmemx_set_attr_uniqueid_args(0, 1, 1 << 20, &mut uid, &mut attr), ACLSHMEM_SUCCESS);
        attr.option_attr.data_op_engine_type = ACLSHMEM_DATA_OP_SDMA;
        shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut attr)
    }
}

#[test]
fn each_instance_is_a_pe_of_its_own_with_its_own_state_and_workspace() {
    let one = cann_twin::shmem_api_instance(1).expect("instance 1");
    let two = cann_twin::shmem_api_instance(2).expect("instance 2");
    assert!(cann_twin::shmem_api_instance(cann_twin::SHMEM_INSTANCES).is_none(), "no instance past the last");
    assert_eq!(init(one, 1), ACLSHMEM_SUCCESS);
    assert_eq!(init(one, 1), ACLSHMEM_INNER_ERROR, "an instance initialises once, as SHMEM does");
    assert_eq!(init(two, 2), ACLSHMEM_SUCCESS, "another instance on another device");
    let state_one = host_state(one).expect("instance 1's g_state");
    let state_two = host_state(two).expect("instance 2's g_state");
    assert_eq!((state_one.header.mype, state_one.header.npes), (0, 1));
    assert!(state_one.sdma_workspace_addr != 0 && state_two.sdma_workspace_addr != 0);
    assert_ne!(state_one.sdma_workspace_addr, state_two.sdma_workspace_addr, "one workspace per device");
    // Instance 0 (the exported C names) was never initialised here.
    let zero = cann_twin::shmem_api();
    assert_eq!(host_state(zero).expect("g_state").header.mype, -1);
    // SAFETY: no arguments.
    unsafe {
        assert_eq!(one.aclshmem_finalize(), ACLSHMEM_SUCCESS);
        assert_eq!(host_state(one).expect("state").sdma_workspace_addr, 0);
        assert_eq!(host_state(two).expect("state").sdma_workspace_addr, state_two.sdma_workspace_addr);
        assert_eq!(two.aclshmem_finalize(), ACLSHMEM_SUCCESS);
    }
}
