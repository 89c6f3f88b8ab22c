//! The twin runtime's export service (`cann_twin::vmm_share`: an abstract Unix socket per exporting process, one
//! 16-byte request, one 24-byte reply with the memfd attached on success) against structured requests: the right
//! magic with any op, any handle, key or range token and any length around 16, and the wrong magic. Random raw bytes
//! and forged handles of the one op are the runtime's own test (`shmem-bindings/cann-twin/tests/vmm_share.rs`); here
//! every op, the IPC and range ones included, is thrown. Whatever arrives: a reply or a close within 3 s, a memfd
//! only for the exact live export, and the live export still imported afterwards.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;
use cann_twin::vmm_share;
use proptest::prelude::*;

const SIZE: usize = 2 << 20;

fn api() -> &'static AclApi {
    static INIT: std::sync::Once = std::sync::Once::new();
    let api = cann_twin::acl_api();
    INIT.call_once(|| {
        // SAFETY: a null config path is allowed.
        assert_eq!(unsafe { api.aclInit(core::ptr::null()) }, ACL_SUCCESS);
    });
    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtSetDevice(0) }, ACL_SUCCESS);
    api
}

/// A physical allocation of `SIZE` bytes on device 0, exported for any same-uid process; (handle, shareable).
fn exported(api: &AclApi) -> (aclrtDrvMemHandle, u64) {
    let prop = aclrtPhysicalMemProp {
        handleType: ACL_MEM_HANDLE_TYPE_NONE,
        allocationType: ACL_MEM_ALLOCATION_TYPE_PINNED,
        memAttr: ACL_HBM_MEM_HUGE,
        location: aclrtMemLocation { id: 0, r#type: ACL_MEM_LOCATION_TYPE_DEVICE },
        reserve: 0,
    };
    let mut handle = core::ptr::null_mut();
    // SAFETY: live locals.
    assert_eq!(unsafe { api.aclrtMallocPhysical(&mut handle, SIZE, &prop, 0).expect("resolved") }, ACL_SUCCESS);
    let mut shareable = 0u64;
    // SAFETY: a live out-pointer; the twin checks the handle. Flag 1: no pid whitelist.
    let code = unsafe {
        api.aclrtMemExportToShareableHandle(handle, ACL_MEM_HANDLE_TYPE_NONE, 1, &mut shareable).expect("resolved")
    };
    assert_eq!(code, ACL_SUCCESS);
    (handle, shareable)
}

fn request(op: u32, value: u64) -> Vec<u8> {
    let mut bytes = vmm_share::REQUEST_MAGIC.to_vec();
    bytes.extend_from_slice(&op.to_le_bytes());
    bytes.extend_from_slice(&value.to_le_bytes());
    bytes
}

/// Sends `bytes` to this process's service, half-closes, and reads one reply (status, attached descriptor); `None`
/// when the service closed without a whole reply. Fails the test if nothing comes back within 3 s.
fn exchange(bytes: &[u8]) -> Option<(u32, Option<OwnedFd>)> {
    let address = SocketAddr::from_abstract_name(vmm_share::socket_name(std::process::id())).expect("name");
    let stream = UnixStream::connect_addr(&address).expect("the service listens");
    stream.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    stream.set_write_timeout(Some(Duration::from_secs(3))).expect("timeout");
    let _ = (&stream).write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut reply = [0u8; vmm_share::REPLY_LEN];
    let mut got = 0;
    let mut fd = None;
    let started = Instant::now();
    while got < reply.len() {
        let mut iov = libc::iovec { iov_base: reply[got..].as_mut_ptr().cast(), iov_len: reply.len() - got };
        let mut control = [0u64; 8];
        // SAFETY: a zeroed msghdr is valid; it points at live locals for the call, and a descriptor the kernel
        // attached is new and ours alone.
        let read = unsafe {
            let mut message: libc::msghdr = core::mem::zeroed();
            message.msg_iov = &mut iov;
            message.msg_iovlen = 1;
            message.msg_control = control.as_mut_ptr().cast();
            message.msg_controllen = core::mem::size_of_val(&control);
            let read = libc::recvmsg(stream.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC);
            let header = libc::CMSG_FIRSTHDR(&message);
            if read > 0 && !header.is_null() && (*header).cmsg_type == libc::SCM_RIGHTS {
                fd = Some(OwnedFd::from_raw_fd(core::ptr::read_unaligned(libc::CMSG_DATA(header).cast())));
            }
            read
        };
        if read < 0 {
            let error = std::io::Error::last_os_error();
            assert!(
                error.kind() != std::io::ErrorKind::WouldBlock && started.elapsed() < Duration::from_secs(3),
                "the service neither answered nor closed within 3 s"
            );
            return None;
        }
        if read == 0 {
            return None;
        }
        got += read as usize;
    }
    assert_eq!(reply[..4], vmm_share::REPLY_MAGIC, "a reply of the service's form");
    Some((u32::from_le_bytes([reply[4], reply[5], reply[6], reply[7]]), fd))
}

/// A request as the fuzzer builds it: the magic (or not), an op, a value, then cut or extended.
fn structured() -> impl Strategy<Value = Vec<u8>> {
    let op = prop_oneof![
        Just(vmm_share::OP_IMPORT),
        Just(vmm_share::OP_IPC_IMPORT),
        Just(vmm_share::OP_RANGE_IMPORT),
        0u32..8,
        any::<u32>(),
    ];
    let magic = prop_oneof![4 => Just(vmm_share::REQUEST_MAGIC), 1 => any::<[u8; 4]>()];
    let length = prop_oneof![4 => Just(vmm_share::REQUEST_LEN), 1 => 0usize..40];
    (magic, op, any::<u64>(), length, any::<u8>()).prop_map(|(magic, op, value, length, filler)| {
        let mut bytes = magic.to_vec();
        bytes.extend_from_slice(&op.to_le_bytes());
        bytes.extend_from_slice(&value.to_le_bytes());
        bytes.resize(length, filler);
        bytes
    })
}

#[test]
fn the_export_service_answers_every_structured_request_and_hands_out_only_the_live_export() {
    let api = api();
    let (handle, shareable) = exported(api);
    let live = request(vmm_share::OP_IMPORT, shareable);
    let mut runner = proptest::test_runner::TestRunner::new(crate::fuzz_config(200));
    let outcome = runner.run(&structured(), |bytes| {
        let answered = exchange(&bytes);
        if let Some((status, fd)) = &answered {
            prop_assert!(fd.is_none() || *status == vmm_share::Status::Ok as u32, "a descriptor with status {status}");
            prop_assert!(
                *status != vmm_share::Status::Ok as u32 || bytes.get(..vmm_share::REQUEST_LEN) == Some(&live[..]),
                "status Ok for {bytes:?}"
            );
        }
        Ok(())
    });
    let after = exchange(&live);
    // SAFETY: the handle is ours and no longer used.
    let freed = unsafe { api.aclrtFreePhysical(handle).expect("resolved") };
    outcome.expect("every structured request answered or closed, no descriptor handed out wrongly");
    let (status, fd) = after.expect("the live export is still served");
    assert_eq!((status, fd.is_some()), (vmm_share::Status::Ok as u32, true));
    assert_eq!(freed, ACL_SUCCESS);
}
