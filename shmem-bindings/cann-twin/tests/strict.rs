//! Device memory is not Host memory: a Host load through a device address dies of SIGSEGV (in a forked child, so
//! this process survives), while the same address works through the runtime's copies.

mod common;

use ascendcl_sys::sys::*;
use common::{api, download, malloc, upload};

/// Forks; the child reads one byte at `address` and exits 0 if it survives. Returns the child's wait status.
fn read_in_child(address: usize) -> libc::c_int {
    // SAFETY: the child only performs a volatile read and `_exit`, both async-signal-safe.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: deliberately unsound: this dereference is the test (it must fault). Only the child runs it.
        let byte = unsafe { core::ptr::read_volatile(address as *const u8) };
        // SAFETY: `_exit` has no preconditions.
        unsafe { libc::_exit(i32::from(byte == 0)) };
    }
    let mut status = 0;
    // SAFETY: `pid` is our child; `status` is writable.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

#[test]
fn a_host_dereference_of_a_device_address_faults() {
    let api = api();
    let dev = malloc(api, 4096);
    upload(api, dev, &[42u8; 4096]);
    assert_eq!(download(api, dev, 1), [42], "the runtime reaches the memory");
    let status = read_in_child(dev as usize);
    assert!(libc::WIFSIGNALED(status), "the child survived a Host read of a device address: status {status}");
    assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);

    // A Host-registered window's device address is not the Host's either.
    let mut host = vec![7u8; 4096];
    let mut mapped = core::ptr::null_mut();
    // SAFETY: `host` outlives the registration.
    let code = unsafe { api.aclrtHostRegister(host.as_mut_ptr().cast(), 4096, ACL_HOST_REGISTER_MAPPED, &mut mapped) };
    assert_eq!(code.expect("resolved"), ACL_SUCCESS);
    let status = read_in_child(mapped as usize);
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV, "status {status}");
    // The control: a Host address read in a child survives.
    let status = read_in_child(host.as_ptr() as usize);
    assert!(libc::WIFEXITED(status), "status {status}");
    // SAFETY: registered above.
    assert_eq!(unsafe { api.aclrtHostUnregister(host.as_mut_ptr().cast()).expect("resolved") }, ACL_SUCCESS);
    // SAFETY: from aclrtMalloc.
    assert_eq!(unsafe { api.aclrtFree(dev) }, ACL_SUCCESS);
}
