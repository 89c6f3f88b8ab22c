//! The cdylib loaded as `libcann_hixl` through `HixlApi::load`, in a process of its own, moving data.

use std::ffi::CString;
use std::process::Command;
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::*;
use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;

use super::{free_port, mem, op, ROLE};
use crate::common::{cdylib, pattern};
use crate::skip;

#[test]
fn the_cdylib_loads_as_libcann_hixl_and_moves_data() {
    let Some(library) = cdylib() else {
        skip::skip("CARGO is not set (the test binary was not run by cargo), so the cdylib cannot be built");
        return;
    };
    match std::env::var(ROLE).ok().as_deref() {
        // In a process of its own: two copies of the runtime in one process cannot both run the VMM export service,
        // which the device path of each copy's HiXL server uses (the other tests' servers here are the linked copy's).
        None => {
            let status = Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", "cdylib::the_cdylib_loads_as_libcann_hixl_and_moves_data", "--nocapture"])
                .env(ROLE, "cdylib")
                .status()
                .expect("run the child");
            assert!(status.success(), "the child failed: {status}");
            return;
        }
        Some("cdylib") => {}
        Some(_) => return,
    }
    // Both tables from the one library, as a user pointing AIV_ASCENDCL_LIB and AIV_HIXL_LIB at the twin would: the
    // loaded copy has its own runtime, separate from the one linked into this test.
    let path = library.into_os_string();
    let env = move |name: &str| (name == "AIV_ASCENDCL_LIB" || name == "AIV_HIXL_LIB").then(|| path.clone());
    let acl = AclApi::load(&ASCENDCL_LIBRARY, &ASCENDCL_LIBRARY.candidates(&env)).expect("loads as libascendcl.so");
    let hx = HixlApi::load(&HIXL_LIBRARY, &HIXL_LIBRARY.candidates(&env)).expect("loads as libcann_hixl.so");
    assert!(hx.is_resolved("HixlCSClientBatchPutSync"));
    let len = 100_000usize;
    let data = pattern(len, 3);
    let mut back = vec![0u8; len];
    let (mut remote, mut local) = (core::ptr::null_mut(), core::ptr::null_mut());
    let ip = CString::new("127.0.0.1").expect("ip");
    let mut port = free_port();
    let endpoint = EndpointDesc::device(COMM_PROTOCOL_HCCS, 0);
    let (mut server, mut client, mut mem_handle, mut batch) =
        (core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut());
    // SAFETY: live locals and Host buffers of the lengths passed; device addresses and handles are checked by the
    // loaded twin.
    unsafe {
        assert_eq!(acl.aclInit(core::ptr::null()), ACL_SUCCESS);
        assert_eq!(acl.aclrtSetDevice(0), ACL_SUCCESS);
        assert_eq!(acl.aclrtMalloc(&mut remote, len, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
        assert_eq!(acl.aclrtMalloc(&mut local, len, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
        assert_eq!(acl.aclrtMemcpy(local, len, data.as_ptr().cast(), len, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
        // A new port when another socket took the one the OS reported free (see `Server::start`).
        for attempt in 1..=8 {
            let sdesc = HixlServerDesc {
                endpoint_list: &endpoint,
                server_ip: ip.as_ptr(),
                server_port: port,
                endpoint_list_num: 1,
                reserved: [0; 104],
            };
            assert_eq!(hx.HixlCSServerCreate(&sdesc, &HixlServerConfig::new(), &mut server), HIXL_SUCCESS);
            assert_eq!(hx.HixlCSServerRegMem(server, ip.as_ptr(), &mem(remote, len), &mut mem_handle), HIXL_SUCCESS);
            let code = hx.HixlCSServerListen(server, 4);
            if code == HIXL_SUCCESS {
                break;
            }
            assert!(attempt < 8, "HixlCSServerListen failed on 8 free ports, the last with {code}");
            assert_eq!(hx.HixlCSServerDestroy(server), HIXL_SUCCESS);
            port = free_port();
        }
        let cdesc = HixlClientDesc {
            local_endpoint: &endpoint,
            remote_endpoint: &endpoint,
            server_ip: ip.as_ptr(),
            server_port: port,
            tc: 0,
            sl: 0,
            reserved: [0; 98],
        };
        assert_eq!(hx.HixlCSClientCreate(&cdesc, &HixlClientConfig::new(), &mut client), HIXL_SUCCESS);
        assert_eq!(hx.HixlCSClientRegMem(client, ip.as_ptr(), &mem(local, len), &mut mem_handle), HIXL_SUCCESS);
        assert_eq!(hx.HixlCSClientConnect(client, 2000), HIXL_SUCCESS);
        let list = [op(remote, 0, local, 0, len)];
        assert_eq!(hx.HixlCSClientBatchPutAsync(client, 1, list.as_ptr(), &mut batch), HIXL_SUCCESS);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut status = HIXL_COMPLETE_STATUS_WAITING;
        while status == HIXL_COMPLETE_STATUS_WAITING && Instant::now() < deadline {
            assert_eq!(hx.HixlCSClientQueryCompleteStatus(client, batch, &mut status), HIXL_SUCCESS);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(status, HIXL_COMPLETE_STATUS_COMPLETED);
        assert_eq!(acl.aclrtMemcpy(back.as_mut_ptr().cast(), len, remote, len, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
        assert_eq!(hx.HixlCSClientDestroy(client), HIXL_SUCCESS);
        assert_eq!(hx.HixlCSServerDestroy(server), HIXL_SUCCESS);
        assert_eq!(acl.aclrtResetDevice(0), ACL_SUCCESS);
    }
    assert!(back == data, "the server's memory holds what the client put");
}
