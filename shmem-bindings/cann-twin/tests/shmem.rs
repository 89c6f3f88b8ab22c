//! The SHMEM C ABI through its table: bootstrap codes, initialisation with and without SDMA, the heap, `g_state`,
//! finalisation. One test: SHMEM is process-wide state, so nothing may run beside it.

mod common;

use core::ffi::c_void;

use ascendcl_sys::sys::*;
use cann_shmem_sys::device_state::EXPECTED_VERSION;
use cann_shmem_sys::result::state::host_state;
use cann_shmem_sys::sys::*;
use cann_twin::control::{self, ControlError};
use cann_twin::shmem::{ACLSHMEM_STATUS_IS_INITIALIZED, ACLSHMEM_STATUS_NOT_INITIALIZED, UNIQUEID_MAGIC};
use cann_twin::{register_write, RegisterFault};
use common::{api, download, upload};

const MIB: i64 = 1 << 20;

fn attributes(uid: &mut aclshmemx_uniqueid_t, my_pe: i32, n_pes: i32, size: i64) -> aclshmemx_init_attr_t {
    let shmem = cann_twin::shmem_api();
    let mut attr = aclshmemx_init_attr_t::new(0, 0, 0);
    // SAFETY: live locals.
    assert_eq!(unsafe { shmem.aclshmemx_set_attr_uniqueid_args(my_pe, n_pes, size, uid, &mut attr) }, 0);
    attr
}

#[test]
fn shmem_bootstrap_heap_state_and_finalize() {
    let shmem = cann_twin::shmem_api();
    assert_eq!(shmem.path(), std::path::Path::new(cann_twin::shmem::IN_PROCESS_SHMEM_PATH));
    // SAFETY: for the whole test, every pointer passed is a live local or what the twin returned; device addresses
    // are only passed back to the twin.
    unsafe {
        // Before initialisation: SHMEM's initial state.
        assert_eq!(shmem.aclshmemx_init_status().expect("resolved"), ACLSHMEM_STATUS_NOT_INITIALIZED);
        assert_eq!((shmem.aclshmem_my_pe(), shmem.aclshmem_n_pes()), (-1, -1));
        assert!(shmem.aclshmem_malloc(64).is_null());
        assert_eq!(shmem.aclshmem_finalize(), ACLSHMEM_SUCCESS, "finalize without init succeeds");
        let state = host_state(shmem).expect("g_state");
        assert_eq!((state.header.version, state.header.mype, state.sdma_workspace_addr), (EXPECTED_VERSION, -1, 0));
        let (mut major, mut minor) = (0, 0);
        shmem.aclshmem_info_get_version(&mut major, &mut minor).expect("resolved");
        assert_eq!((major, minor), (1, 1));

        // Unique id.
        assert_eq!(shmem.aclshmemx_get_uniqueid(core::ptr::null_mut()), ACLSHMEM_INVALID_PARAM);
        let mut uid = aclshmemx_uniqueid_t::default();
        assert_eq!(shmem.aclshmemx_get_uniqueid(&mut uid), ACLSHMEM_SUCCESS);
        let bytes = uid.to_bytes();
        assert_eq!(uid.version, ACLSHMEM_UNIQUEID_VERSION);
        assert_eq!(&bytes[12..28], UNIQUEID_MAGIC);
        assert_eq!(&bytes[28..32], &std::process::id().to_le_bytes());
        let mut other = aclshmemx_uniqueid_t::default();
        assert_eq!(shmem.aclshmemx_get_uniqueid(&mut other), ACLSHMEM_SUCCESS);
        assert_ne!(other.to_bytes(), bytes, "each id is distinct");

        // set_attr_uniqueid_args range checks.
        let mut attr = aclshmemx_init_attr_t::new(0, 0, 0);
        assert_eq!(
            shmem.aclshmemx_set_attr_uniqueid_args(0, 1, (40 << 30) + 1, &mut uid, &mut attr),
            ACLSHMEM_INVALID_VALUE
        );
        assert_eq!(shmem.aclshmemx_set_attr_uniqueid_args(0, 16385, MIB, &mut uid, &mut attr), ACLSHMEM_INVALID_VALUE);
        assert_eq!(shmem.aclshmemx_set_attr_uniqueid_args(16384, 1, MIB, &mut uid, &mut attr), ACLSHMEM_INVALID_VALUE);
        assert_eq!(
            shmem.aclshmemx_set_attr_uniqueid_args(0, 1, MIB, &mut uid, core::ptr::null_mut()),
            ACLSHMEM_INVALID_PARAM
        );

        // init_attr argument checks, in SHMEM's order.
        assert_eq!(
            shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, core::ptr::null_mut()),
            ACLSHMEM_INVALID_PARAM
        );
        let mut bad = attributes(&mut uid, 0, 1, 64 * MIB);
        bad.my_pe = -1;
        assert_eq!(shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut bad), ACLSHMEM_INVALID_VALUE);
        let mut bad = attributes(&mut uid, 2, 2, 64 * MIB);
        assert_eq!(
            shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut bad),
            ACLSHMEM_INVALID_PARAM,
            "my_pe >= n_pes"
        );
        let mut bad = attributes(&mut uid, 0, 1, 64 * MIB);
        bad.local_mem_size = 0;
        assert_eq!(shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut bad), ACLSHMEM_INVALID_VALUE);
        for engines in [0, 0x10] {
            let mut bad = attributes(&mut uid, 0, 1, 64 * MIB);
            bad.option_attr.data_op_engine_type = data_op_engine_type_t(engines);
            assert_eq!(
                shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut bad),
                ACLSHMEM_INVALID_VALUE,
                "engines {engines:#x}"
            );
        }
        let mut good = attributes(&mut uid, 1, 2, 64 * MIB);
        assert_eq!(shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_DEFAULT, &mut good), ACLSHMEM_NOT_SUPPORTED);
        let mut foreign = aclshmemx_uniqueid_t::default();
        let mut with_foreign = attributes(&mut foreign, 1, 2, 64 * MIB);
        assert_eq!(
            shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut with_foreign),
            ACLSHMEM_BOOTSTRAP_ERROR
        );

        // Needs aclInit and a current device on the calling thread.
        // On a fresh thread: bootstrap and init one PE, returning init's code.
        let init_on_new_thread = || {
            std::thread::spawn(|| {
                let shmem = cann_twin::shmem_api();
                let mut uid = aclshmemx_uniqueid_t::default();
                let mut attr = aclshmemx_init_attr_t::new(0, 0, 0);
                shmem.aclshmemx_get_uniqueid(&mut uid);
                shmem.aclshmemx_set_attr_uniqueid_args(0, 1, 1 << 20, &mut uid, &mut attr);
                shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut attr)
            })
            .join()
            .expect("thread")
        };
        assert_eq!(init_on_new_thread(), ACLSHMEM_NOT_INITED, "before aclInit");
        let acl = api();
        assert_eq!(init_on_new_thread(), ACLSHMEM_NOT_INITED, "no device on the thread");
        assert_eq!(shmem.aclshmemx_init_status().expect("resolved"), ACLSHMEM_STATUS_NOT_INITIALIZED);

        // PE 1 of 2 with MTE only: no SDMA workspace.
        assert_eq!(shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut good), ACLSHMEM_SUCCESS);
        assert_eq!(shmem.aclshmemx_init_status().expect("resolved"), ACLSHMEM_STATUS_IS_INITIALIZED);
        assert_eq!(
            shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut good),
            ACLSHMEM_INNER_ERROR,
            "initialised twice"
        );
        assert_eq!((shmem.aclshmem_my_pe(), shmem.aclshmem_n_pes()), (1, 2));
        let state = host_state(shmem).expect("g_state");
        assert_eq!((state.header.mype, state.header.npes, state.sdma_workspace_addr), (1, 2, 0));
        assert_eq!(control::sqes_executed(0, 0), Err(ControlError::NoSuchChannel { device: 0, channel: 0 }));

        // The heap.
        assert!(shmem.aclshmem_malloc(0).is_null());
        let block = shmem.aclshmem_malloc(4096);
        assert!(!block.is_null());
        let data = common::pattern(4096, 5);
        upload(acl, block, &data);
        assert_eq!(download(acl, block, 4096), data, "heap memory is device memory");
        assert_eq!(shmem.aclshmem_ptr(block, 1), block, "own PE: identity");
        let inside = (block as usize + 100) as *mut c_void;
        assert_eq!(shmem.aclshmem_ptr(inside, 1), inside);
        assert!(shmem.aclshmem_ptr(block, 0).is_null(), "other PEs are not modelled");
        assert!(shmem.aclshmem_ptr((block as usize + 4096) as *mut c_void, 1).is_null(), "past the allocation");
        let zeroed = shmem.aclshmem_calloc(16, 256);
        assert!(!zeroed.is_null());
        assert_eq!(download(acl, zeroed, 4096), vec![0; 4096]);
        assert!(shmem.aclshmem_calloc(usize::MAX, 2).is_null());
        let aligned = shmem.aclshmem_align(2 << 20, 100);
        assert!(!aligned.is_null() && aligned as usize % (2 << 20) == 0);
        assert!(shmem.aclshmem_align(3, 100).is_null());
        assert!(shmem.aclshmem_malloc(64 << 20).is_null(), "past local_mem_size");
        shmem.aclshmem_free(aligned);
        shmem.aclshmem_free(core::ptr::null_mut());
        assert!(shmem.aclshmem_ptr(aligned, 1).is_null(), "freed");
        let mut probe = [0u8; 1];
        let code = acl.aclrtMemcpy(probe.as_mut_ptr().cast(), 1, aligned, 1, ACL_MEMCPY_DEVICE_TO_HOST);
        assert_ne!(code, ACL_SUCCESS, "freed heap memory is gone");
        assert_eq!(shmem.aclshmem_finalize(), ACLSHMEM_SUCCESS);
        assert_eq!(shmem.aclshmemx_init_status().expect("resolved"), ACLSHMEM_STATUS_NOT_INITIALIZED);
        let code = acl.aclrtMemcpy(probe.as_mut_ptr().cast(), 1, block, 1, ACL_MEMCPY_DEVICE_TO_HOST);
        assert_ne!(code, ACL_SUCCESS, "finalize frees the heap");

        // PE 0 of 1 with SDMA: the workspace, then finalize stops and frees it.
        let mut sdma = attributes(&mut uid, 0, 1, 64 * MIB);
        sdma.option_attr.data_op_engine_type = ACLSHMEM_DATA_OP_SDMA;
        assert_eq!(shmem.aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &mut sdma), ACLSHMEM_SUCCESS);
        let state = host_state(shmem).expect("g_state");
        assert_eq!((state.header.mype, state.header.npes), (0, 1));
        let workspace = state.sdma_workspace_addr;
        assert_ne!(workspace, 0);
        let header = download(acl, workspace as *const c_void, 8);
        assert_eq!(&header[4..8], &48u32.to_le_bytes());
        let record = download(acl, (workspace + 64) as *const c_void, 64);
        let reg_base = u64::from_le_bytes(record[16..24].try_into().expect("8 bytes"));
        register_write(reg_base + 8, &0u32.to_le_bytes()).expect("the doorbell rings");
        assert_eq!(control::doorbells_rung(0, 0), Ok(1));
        assert_eq!(shmem.aclshmem_finalize(), ACLSHMEM_SUCCESS);
        assert_eq!(host_state(shmem).expect("g_state").sdma_workspace_addr, 0);
        assert_eq!(control::doorbells_rung(0, 0), Err(ControlError::NoSuchChannel { device: 0, channel: 0 }));
        assert_eq!(
            register_write(reg_base + 8, &0u32.to_le_bytes()),
            Err(RegisterFault::NotARegister { va: reg_base + 8 })
        );
        let mut word = [0u8; 8];
        let code =
            acl.aclrtMemcpy(word.as_mut_ptr().cast(), 8, workspace as *const c_void, 8, ACL_MEMCPY_DEVICE_TO_HOST);
        assert_ne!(code, ACL_SUCCESS, "finalize frees the workspace");
    }
}
