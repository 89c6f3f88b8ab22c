//! VMM export/import through the table: within one process (two devices), across processes (a child re-exec of
//! this binary exports), the exporter's exit, freed exports, forged handles and hostile bytes on the service socket.
//!
//! The tests of this binary share one process-wide export service, so they run one at a time (`SERIAL`).

mod common;

use core::ffi::c_void;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ascendcl_sys::sys::*;
use ascendcl_sys::AclApi;
use cann_twin::vmm_share;
use common::{api, download, pattern, upload};
use proptest::prelude::*;

const MIB2: usize = 2 << 20;
const ROLE: &str = "CANN_TWIN_SHARE_CHILD";

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn prop(device: u32) -> aclrtPhysicalMemProp {
    aclrtPhysicalMemProp {
        handleType: ACL_MEM_HANDLE_TYPE_NONE,
        allocationType: ACL_MEM_ALLOCATION_TYPE_PINNED,
        memAttr: ACL_HBM_MEM_HUGE,
        location: aclrtMemLocation { id: device, r#type: ACL_MEM_LOCATION_TYPE_DEVICE },
        reserve: 0,
    }
}

fn physical(api: &AclApi, size: usize, device: u32) -> aclrtDrvMemHandle {
    let mut handle = core::ptr::null_mut();
    // SAFETY: live locals.
    assert_eq!(unsafe { api.aclrtMallocPhysical(&mut handle, size, &prop(device), 0).expect("resolved") }, ACL_SUCCESS);
    handle
}

/// Reserves `size` bytes and maps all of `handle` there.
fn map(api: &AclApi, handle: aclrtDrvMemHandle, size: usize) -> *mut c_void {
    let mut va = core::ptr::null_mut();
    // SAFETY: live locals; the twin checks the handle and addresses.
    unsafe {
        assert_eq!(api.aclrtReserveMemAddress(&mut va, size, 0, core::ptr::null_mut(), 0).expect("resolved"), 0);
        assert_eq!(api.aclrtMapMem(va, size, 0, handle, 0).expect("resolved"), ACL_SUCCESS);
    }
    va
}

fn unmap(api: &AclApi, va: *mut c_void) {
    // SAFETY: the twin checks the address.
    unsafe {
        assert_eq!(api.aclrtUnmapMem(va).expect("resolved"), ACL_SUCCESS);
        assert_eq!(api.aclrtReleaseMemAddress(va).expect("resolved"), ACL_SUCCESS);
    }
}

fn free(api: &AclApi, handle: aclrtDrvMemHandle) {
    // SAFETY: the twin checks the handle.
    assert_eq!(unsafe { api.aclrtFreePhysical(handle).expect("resolved") }, ACL_SUCCESS);
}

fn export(api: &AclApi, handle: aclrtDrvMemHandle, flags: u64) -> Result<u64, aclError> {
    let mut shareable = 0u64;
    // SAFETY: a live out-pointer; the twin checks the handle.
    let code = unsafe {
        api.aclrtMemExportToShareableHandle(handle, ACL_MEM_HANDLE_TYPE_NONE, flags, &mut shareable).expect("resolved")
    };
    if code == ACL_SUCCESS {
        Ok(shareable)
    } else {
        Err(code)
    }
}

fn import(api: &AclApi, shareable: u64, device: i32) -> Result<aclrtDrvMemHandle, aclError> {
    let mut handle = core::ptr::null_mut();
    // SAFETY: a live out-pointer.
    let code = unsafe { api.aclrtMemImportFromShareableHandle(shareable, device, &mut handle).expect("resolved") };
    if code == ACL_SUCCESS {
        Ok(handle)
    } else {
        Err(code)
    }
}

#[test]
fn in_process_two_devices_see_the_same_pages() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _serial = serial();
    let api = api();
    let size = 2 * MIB2;
    let exported = physical(api, size, 0);
    let shareable = export(api, exported, ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION).expect("export");
    assert_eq!(vmm_share::handle_pid(shareable), std::process::id());
    assert!(vmm_share::service_running());
    // One shareable handle per physical handle.
    assert_eq!(export(api, exported, 1), Err(ACL_ERROR_RT_PARAM_INVALID));

    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtSetDevice(1) }, ACL_SUCCESS);
    let imported = import(api, shareable, 1).expect("import on device 1");
    assert_eq!(import(api, shareable, 1), Err(ACL_ERROR_RT_PARAM_INVALID), "one import per process");
    // An imported handle is not exported again.
    assert_eq!(export(api, imported, 1), Err(ACL_ERROR_RT_INVALID_HANDLE));
    let va_import = map(api, imported, size);
    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtSetDevice(0) }, ACL_SUCCESS);
    let va_export = map(api, exported, size);

    let first = pattern(size, 3);
    upload(api, va_export, &first);
    assert_eq!(download(api, va_import, size), first, "written through device 0's mapping, read through device 1's");
    let second = pattern(4096, 11);
    // SAFETY: inside the mapping.
    let tail = unsafe { va_import.cast::<u8>().add(size - 4096) }.cast::<c_void>();
    upload(api, tail, &second);
    // SAFETY: inside the mapping.
    let tail_export = unsafe { va_export.cast::<u8>().add(size - 4096) }.cast::<c_void>();
    assert_eq!(download(api, tail_export, 4096), second);

    unmap(api, va_import);
    unmap(api, va_export);
    free(api, imported);
    free(api, exported);
    assert!(!vmm_share::service_running(), "the service stops with the last export");
    // SAFETY: plain value arguments.
    unsafe {
        assert_eq!(api.aclrtResetDevice(1), ACL_SUCCESS);
        assert_eq!(api.aclrtResetDevice(0), ACL_SUCCESS);
    }
}

#[test]
fn argument_codes() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _serial = serial();
    let api = api();
    let exported = physical(api, MIB2, 0);
    let mut out = 0u64;
    // SAFETY: live locals or null pointers the twin checks.
    unsafe {
        assert_eq!(
            api.aclrtMemExportToShareableHandle(core::ptr::null_mut(), ACL_MEM_HANDLE_TYPE_NONE, 1, &mut out)
                .expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtMemExportToShareableHandle(exported, ACL_MEM_HANDLE_TYPE_POSIX, 1, &mut out).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtMemExportToShareableHandle(exported, ACL_MEM_HANDLE_TYPE_NONE, 1, core::ptr::null_mut())
                .expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtMemExportToShareableHandle(exported, ACL_MEM_HANDLE_TYPE_NONE, 2, &mut out).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtMemExportToShareableHandle(0x1234 as aclrtDrvMemHandle, ACL_MEM_HANDLE_TYPE_NONE, 1, &mut out)
                .expect("resolved"),
            ACL_ERROR_RT_INVALID_HANDLE
        );
        assert_eq!(
            api.aclrtMemImportFromShareableHandle(1, 0, core::ptr::null_mut()).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
    }
    let shareable = export(api, exported, ACL_RT_VMM_EXPORT_FLAG_DEFAULT).expect("export with flags 0");
    assert_eq!(import(api, shareable, 4096), Err(ACL_ERROR_RT_INVALID_DEVICEID));
    assert_eq!(import(api, 0, 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
    assert_eq!(import(api, shareable & !((1 << vmm_share::TOKEN_BITS) - 1), 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
    // Flags 0: the exporting process itself may import (the pid whitelist is not declared; see the docs).
    let imported = import(api, shareable, 0).expect("in-process import of a flags-0 export");
    free(api, imported);
    free(api, exported);
    assert!(!vmm_share::service_running());
}

#[test]
fn v2_fabric_and_default_handles() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _serial = serial();
    let api = api();
    let a = physical(api, MIB2, 0);
    let b = physical(api, MIB2, 0);
    let mut fabric = aclrtMemFabricHandle { data: [0; 128] };
    let mut default = 0u64;
    let mut out = core::ptr::null_mut();
    // SAFETY: live locals of the sizes the types imply, or null pointers the twin checks.
    unsafe {
        let fabric_ptr = (&mut fabric as *mut aclrtMemFabricHandle).cast::<c_void>();
        let default_ptr = (&mut default as *mut u64).cast::<c_void>();
        assert_eq!(
            api.aclrtMemExportToShareableHandleV2(a, 1, aclrtMemSharedHandleType(3), fabric_ptr).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtMemExportToShareableHandleV2(a, 1, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, core::ptr::null_mut())
                .expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtMemExportToShareableHandleV2(a, 1, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, fabric_ptr)
                .expect("resolved"),
            ACL_SUCCESS
        );
        assert_eq!(&fabric.data[8..24], &vmm_share::FABRIC_MAGIC);
        assert_eq!(
            api.aclrtMemExportToShareableHandleV2(b, 1, ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT, default_ptr)
                .expect("resolved"),
            ACL_SUCCESS
        );
        assert_eq!(vmm_share::handle_pid(default), std::process::id());

        assert_eq!(
            api.aclrtMemImportFromShareableHandleV2(fabric_ptr, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, 1, &mut out)
                .expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtMemImportFromShareableHandleV2(fabric_ptr, aclrtMemSharedHandleType(7), 0, &mut out)
                .expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        let mut corrupt = fabric;
        corrupt.data[100] = 1;
        let corrupt_ptr = (&mut corrupt as *mut aclrtMemFabricHandle).cast::<c_void>();
        assert_eq!(
            api.aclrtMemImportFromShareableHandleV2(corrupt_ptr, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, 0, &mut out)
                .expect("resolved"),
            ACL_ERROR_RT_INVALID_HANDLE
        );
        corrupt = fabric;
        corrupt.data[9] ^= 0xff;
        let corrupt_ptr = (&mut corrupt as *mut aclrtMemFabricHandle).cast::<c_void>();
        assert_eq!(
            api.aclrtMemImportFromShareableHandleV2(corrupt_ptr, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, 0, &mut out)
                .expect("resolved"),
            ACL_ERROR_RT_INVALID_HANDLE
        );

        let mut from_fabric = core::ptr::null_mut();
        assert_eq!(
            api.aclrtMemImportFromShareableHandleV2(fabric_ptr, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, 0, &mut from_fabric)
                .expect("resolved"),
            ACL_SUCCESS
        );
        let mut from_default = core::ptr::null_mut();
        assert_eq!(
            api.aclrtMemImportFromShareableHandleV2(
                default_ptr,
                ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT,
                0,
                &mut from_default
            )
            .expect("resolved"),
            ACL_SUCCESS
        );
        for (exported, imported, seed) in [(a, from_fabric, 5), (b, from_default, 6)] {
            let va_export = map(api, exported, MIB2);
            let va_import = map(api, imported, MIB2);
            let data = pattern(MIB2, seed);
            upload(api, va_import, &data);
            assert_eq!(download(api, va_export, MIB2), data);
            unmap(api, va_import);
            unmap(api, va_export);
            free(api, imported);
            free(api, exported);
        }
    }
    assert!(!vmm_share::service_running());
}

#[test]
fn freed_export_is_refused_and_mappings_survive() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _serial = serial();
    let api = api();
    let exported = physical(api, MIB2, 0);
    let other = physical(api, MIB2, 0);
    let shareable = export(api, exported, 1).expect("export");
    let kept = export(api, other, 1).expect("export");
    let imported = import(api, shareable, 0).expect("import");
    let va_import = map(api, imported, MIB2);
    let va_export = map(api, exported, MIB2);
    let data = pattern(MIB2, 9);
    upload(api, va_export, &data);
    unmap(api, va_export);
    free(api, exported);
    // The import's mapping keeps the pages.
    assert_eq!(download(api, va_import, MIB2), data);
    unmap(api, va_import);
    free(api, imported);
    // The freed export is gone for new imports, as an unknown handle (the same code as a forged one).
    assert_eq!(import(api, shareable, 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
    // Through the socket too.
    assert_eq!(raw_request(&request(shareable)).map(|(status, _, _)| status), Some(1));
    assert!(vmm_share::service_running(), "another export is still live");
    let (status, size, fd) = raw_request(&request(kept)).expect("reply");
    assert_eq!((status, size), (0, MIB2 as u64));
    assert!(fd.is_some(), "the memfd is attached");
    free(api, other);
    assert!(!vmm_share::service_running());
    assert!(
        UnixStream::connect_addr(&own_address()).is_err(),
        "nothing listens on the name once the last export is withdrawn"
    );
    // Joined by the last free; the kernel may list a joined thread in /proc for a moment longer (its task is released
    // just after the join returns), so the look is repeated for up to a second.
    let service_threads = || {
        let threads = std::fs::read_dir("/proc/self/task").expect("tasks");
        threads
            .flatten()
            .filter(|task| {
                std::fs::read_to_string(task.path().join("comm")).unwrap_or_default().trim() == "cann-twin-vmm"
            })
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while service_threads() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(service_threads(), 0, "the service thread has ended");
}

fn own_address() -> SocketAddr {
    SocketAddr::from_abstract_name(vmm_share::socket_name(std::process::id())).expect("name")
}

fn request(shareable: u64) -> Vec<u8> {
    let mut bytes = vmm_share::REQUEST_MAGIC.to_vec();
    bytes.extend_from_slice(&vmm_share::OP_IMPORT.to_le_bytes());
    bytes.extend_from_slice(&shareable.to_le_bytes());
    bytes
}

/// Sends `bytes` to this process's service and reads one reply (status, size, attached fd); `None` when the
/// service closed without a whole reply. Panics if nothing comes back within 3 s (the service would have hung).
fn raw_request(bytes: &[u8]) -> Option<(u32, u64, Option<OwnedFd>)> {
    let stream = UnixStream::connect_addr(&own_address()).expect("the service listens");
    stream.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    stream.set_write_timeout(Some(Duration::from_secs(3))).expect("timeout");
    let mut writer = &stream;
    let _ = writer.write_all(bytes);
    // No more bytes: a short request ends at once instead of at the service's deadline.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut reply = [0u8; vmm_share::REPLY_LEN];
    let mut got = 0;
    let mut fd = None;
    let started = Instant::now();
    while got < reply.len() {
        let mut iov = libc::iovec { iov_base: reply[got..].as_mut_ptr().cast(), iov_len: reply.len() - got };
        let mut control = [0u64; 8];
        // SAFETY: a zeroed msghdr is valid; it points at live locals for the call.
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
                error.kind() != std::io::ErrorKind::WouldBlock || started.elapsed() < Duration::from_secs(3),
                "no reply within 3 s"
            );
            if error.kind() == std::io::ErrorKind::WouldBlock {
                panic!("the service did not answer or close within 3 s");
            }
            return None;
        }
        if read == 0 {
            return None;
        }
        got += read as usize;
    }
    assert_eq!(&reply[..4], &vmm_share::REPLY_MAGIC);
    let status = u32::from_le_bytes([reply[4], reply[5], reply[6], reply[7]]);
    let mut size = [0u8; 8];
    size.copy_from_slice(&reply[8..16]);
    Some((status, u64::from_le_bytes(size), fd))
}

#[test]
fn hostile_connections_are_bounded() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _serial = serial();
    let api = api();
    let exported = physical(api, MIB2, 0);
    let shareable = export(api, exported, 1).expect("export");

    // Idle connections: past the per-pid limit the service answers "busy" at once; every idle one is answered
    // "timeout" and closed after the request deadline.
    let started = Instant::now();
    let idle: Vec<UnixStream> =
        (0..vmm_share::MAX_PER_PID + 4).map(|_| UnixStream::connect_addr(&own_address()).expect("connect")).collect();
    let mut statuses = Vec::new();
    for stream in &idle {
        stream.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
        let mut reply = [0u8; vmm_share::REPLY_LEN];
        let mut reader = stream;
        reader.read_exact(&mut reply).expect("every connection is answered within 3 s");
        statuses.push(u32::from_le_bytes([reply[4], reply[5], reply[6], reply[7]]));
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(statuses.iter().filter(|&&s| s == vmm_share::Status::Busy as u32).count(), 4);
    assert_eq!(statuses.iter().filter(|&&s| s == vmm_share::Status::Timeout as u32).count(), vmm_share::MAX_PER_PID);
    drop(idle);

    // A request of the wrong op or magic; a short request followed by a close; then the real one still works.
    let mut wrong_op = request(shareable);
    wrong_op[4] = 4;
    assert_eq!(raw_request(&wrong_op).map(|r| r.0), Some(vmm_share::Status::BadRequest as u32));
    assert_eq!(raw_request(b"GET / HTTP/1.0\r\n").map(|r| r.0), Some(vmm_share::Status::BadRequest as u32));
    {
        let mut short = UnixStream::connect_addr(&own_address()).expect("connect");
        short.write_all(&request(shareable)[..7]).expect("write");
    }
    let (status, size, fd) = raw_request(&request(shareable)).expect("reply");
    assert_eq!((status, size, fd.is_some()), (0, MIB2 as u64, true));

    // Random bytes: never a crash or a hang; only the exact live handle ever gets a memfd.
    proptest!(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() }, |(
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
        token in any::<u64>(),
    )| {
        if let Some((status, _, fd)) = raw_request(&bytes) {
            prop_assert!(status != 0 || bytes.get(..16) == Some(&request(shareable)[..]));
            prop_assert!(fd.is_none() || status == 0);
        }
        let forged = (shareable & !((1 << vmm_share::TOKEN_BITS) - 1)) | (token & ((1 << vmm_share::TOKEN_BITS) - 1));
        if forged != shareable {
            let reply = raw_request(&request(forged)).expect("reply");
            prop_assert_eq!(reply.0, vmm_share::Status::Unknown as u32);
            prop_assert!(reply.2.is_none());
            prop_assert_eq!(import(api, forged, 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
        }
        // The same value as an IPC key is unknown too (the VMM export is not an IPC export).
        let mut ipc = request(forged);
        ipc[4..8].copy_from_slice(&vmm_share::OP_IPC_IMPORT.to_le_bytes());
        let reply = raw_request(&ipc).expect("reply");
        prop_assert_eq!(reply.0, vmm_share::Status::Unknown as u32);
        prop_assert!(reply.2.is_none());
    });
    let (status, _, fd) = raw_request(&request(shareable)).expect("the service still serves");
    assert_eq!((status, fd.is_some()), (0, true));
    free(api, exported);
    assert!(!vmm_share::service_running());
}

fn ipc_key(api: &AclApi, ptr: *mut c_void, size: usize, flags: u64) -> Result<String, aclError> {
    let mut key = [0 as core::ffi::c_char; 65];
    // SAFETY: `key` is writable for its length; the twin checks the device range.
    let code = unsafe { api.aclrtIpcMemGetExportKey(ptr, size, key.as_mut_ptr(), key.len(), flags).expect("resolved") };
    if code != ACL_SUCCESS {
        return Err(code);
    }
    let bytes: Vec<u8> = key.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    Ok(String::from_utf8(bytes).expect("text"))
}

fn ipc_import(api: &AclApi, key: &str, flags: u64) -> Result<*mut c_void, aclError> {
    let key = std::ffi::CString::new(key).expect("key");
    let mut ptr = core::ptr::null_mut();
    // SAFETY: live locals.
    let code = unsafe { api.aclrtIpcMemImportByKey(&mut ptr, key.as_ptr(), flags).expect("resolved") };
    if code == ACL_SUCCESS {
        Ok(ptr)
    } else {
        Err(code)
    }
}

fn ipc_close(api: &AclApi, key: &str) -> aclError {
    let key = std::ffi::CString::new(key).expect("key");
    // SAFETY: a live NUL-terminated string.
    unsafe { api.aclrtIpcMemClose(key.as_ptr()).expect("resolved") }
}

#[test]
fn ipc_keys_in_process() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _serial = serial();
    let api = api();
    let size = 1 << 20;
    let exported = common::malloc(api, size);
    // SAFETY: null pointers and short buffers the twin checks.
    unsafe {
        let mut short = [0 as core::ffi::c_char; 16];
        assert_eq!(
            api.aclrtIpcMemGetExportKey(core::ptr::null_mut(), size, short.as_mut_ptr(), 65, 1).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtIpcMemGetExportKey(exported, size, core::ptr::null_mut(), 65, 1).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(
            api.aclrtIpcMemGetExportKey(exported, size, short.as_mut_ptr(), short.len(), 1).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        let mut out = core::ptr::null_mut();
        assert_eq!(
            api.aclrtIpcMemImportByKey(&mut out, core::ptr::null(), 0).expect("resolved"),
            ACL_ERROR_INVALID_PARAM
        );
        assert_eq!(api.aclrtIpcMemClose(core::ptr::null()).expect("resolved"), ACL_ERROR_INVALID_PARAM);
    }
    assert_eq!(ipc_key(api, exported, size, 2), Err(ACL_ERROR_INVALID_PARAM));
    assert_eq!(ipc_key(api, exported, size + 1, 1), Err(ACL_ERROR_RT_PARAM_INVALID), "past the allocation");
    let whole = ipc_key(api, exported, size, 1).expect("key");
    assert_eq!(whole.len(), vmm_share::IPC_KEY_LEN);
    assert!(whole.starts_with(vmm_share::IPC_KEY_PREFIX));
    // SAFETY: inside the allocation.
    let inner_ptr = unsafe { exported.cast::<u8>().add(100) }.cast::<c_void>();
    let inner = ipc_key(api, inner_ptr, 5000, 0).expect("key of a sub-range");

    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtSetDevice(1) }, ACL_SUCCESS);
    let imported = ipc_import(api, &whole, 0).expect("import");
    assert_ne!(imported, exported);
    assert_eq!(ipc_import(api, &whole, 0), Err(ACL_ERROR_RT_PARAM_INVALID), "one import of a key per process");
    assert_eq!(ipc_import(api, &whole, 2), Err(ACL_ERROR_INVALID_PARAM));
    assert_eq!(ipc_import(api, "cann-twin-ipc-zz", 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
    assert_eq!(ipc_import(api, &whole.replace("cann", "CANN"), 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
    let data = pattern(size, 13);
    upload(api, exported, &data);
    assert_eq!(download(api, imported, size), data, "written at the exporter's address, read at the importer's");
    let back = pattern(4096, 17);
    upload(api, imported, &back);
    assert_eq!(download(api, exported, 4096), back);
    // The sub-range starts at byte 100 and is bounded by its 5000 bytes.
    let sub = ipc_import(api, &inner, 0).expect("import of a sub-range");
    assert_eq!(download(api, sub, 16), download(api, inner_ptr, 16));
    let mut past = vec![0u8; 5001];
    assert_eq!(
        common::memcpy(api, past.as_mut_ptr().cast(), past.len(), sub, past.len(), ACL_MEMCPY_DEVICE_TO_HOST),
        ACL_ERROR_RT_PARAM_INVALID
    );
    assert_eq!(ipc_close(api, &inner), ACL_SUCCESS, "closes the import");
    assert_eq!(ipc_close(api, &inner), ACL_SUCCESS, "closes the export");
    assert_eq!(ipc_close(api, &inner), ACL_ERROR_RT_INVALID_HANDLE);
    assert_eq!(ipc_close(api, &whole), ACL_SUCCESS, "closes the import");
    assert!(vmm_share::service_running(), "the whole-allocation key is still exported");
    // Freeing the allocation withdraws its keys.
    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtSetDevice(0) }, ACL_SUCCESS);
    // SAFETY: what aclrtMalloc returned.
    assert_eq!(unsafe { api.aclrtFree(exported) }, ACL_SUCCESS);
    assert_eq!(ipc_import(api, &whole, 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
    assert!(!vmm_share::service_running());
    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtResetDevice(1) }, ACL_SUCCESS);
}

#[test]
fn ipc_key_of_a_host_window_onto_malloc_host_memory_maps_the_same_pages() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _serial = serial();
    let api = api();
    let size = 64 << 10;
    let mut host = core::ptr::null_mut();
    // SAFETY: a live local; the twin checks the size.
    assert_eq!(unsafe { api.aclrtMallocHost(&mut host, size) }, ACL_SUCCESS);
    let data = pattern(size, 29);
    // SAFETY: `host` is `size` bytes of Host memory aclrtMallocHost returned, not used by anything else.
    unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), host.cast::<u8>(), size) };
    let mut window = core::ptr::null_mut();
    // SAFETY: live locals; `host` stays allocated until the end of the test.
    let code = unsafe { api.aclrtHostRegister(host, size as u64, ACL_HOST_REGISTER_MAPPED, &mut window) };
    assert_eq!(code.expect("resolved"), ACL_SUCCESS);
    let key = ipc_key(api, window, size, 1).expect("a key of the Host window");
    // Host memory that is not aclrtMallocHost's has no pages another process could map.
    let mut plain = vec![0u8; 2 * 4096];
    // SAFETY: a page inside the live vector.
    let page = unsafe { plain.as_mut_ptr().add(4096 - plain.as_ptr() as usize % 4096) }.cast::<c_void>();
    let mut plain_window = core::ptr::null_mut();
    // SAFETY: live locals; `plain` outlives the registration.
    let code = unsafe { api.aclrtHostRegister(page, 4096, ACL_HOST_REGISTER_MAPPED, &mut plain_window) };
    assert_eq!(code.expect("resolved"), ACL_SUCCESS);
    assert_eq!(ipc_key(api, plain_window, 4096, 1), Err(ACL_ERROR_RT_PARAM_INVALID));
    // SAFETY: registered above.
    assert_eq!(unsafe { api.aclrtHostUnregister(page).expect("resolved") }, ACL_SUCCESS);

    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtSetDevice(1) }, ACL_SUCCESS);
    let imported = ipc_import(api, &key, 0).expect("import");
    assert_eq!(download(api, imported, size), data, "written at the Host address, read through the import");
    let back = pattern(4096, 31);
    upload(api, imported, &back);
    // SAFETY: the first 4096 bytes of the live allocation; no copy is running.
    let seen = unsafe { core::slice::from_raw_parts(host.cast::<u8>(), 4096) };
    assert_eq!(seen, back.as_slice(), "written through the import, seen at the Host address");
    assert_eq!(ipc_close(api, &key), ACL_SUCCESS, "closes the import");
    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtSetDevice(0) }, ACL_SUCCESS);
    // SAFETY: registered above.
    assert_eq!(unsafe { api.aclrtHostUnregister(host).expect("resolved") }, ACL_SUCCESS);
    // Freeing the Host memory withdraws its key.
    // SAFETY: what aclrtMallocHost returned.
    assert_eq!(unsafe { api.aclrtFreeHost(host) }, ACL_SUCCESS);
    assert_eq!(ipc_import(api, &key, 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
    assert!(!vmm_share::service_running());
    // SAFETY: plain value argument.
    assert_eq!(unsafe { api.aclrtResetDevice(1) }, ACL_SUCCESS);
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a live array of two ints.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: two fresh descriptors owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Reads exactly `buf.len()` bytes from `fd` within 5 s; false on timeout or end of file.
fn read_within(fd: &OwnedFd, buf: &mut [u8]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now()).as_millis() as i32;
        let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd; then a read into the rest of a live buffer.
        unsafe {
            if left <= 0 || libc::poll(&mut poll, 1, left) <= 0 {
                return false;
            }
            let read = libc::read(fd.as_raw_fd(), buf[got..].as_mut_ptr().cast(), buf.len() - got);
            if read <= 0 {
                return false;
            }
            got += read as usize;
        }
    }
    true
}

#[test]
fn a_forked_child_keeps_neither_the_name_nor_the_service() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _serial = serial();
    let api = api();
    let parent_export = physical(api, MIB2, 0);
    let for_child = physical(api, MIB2, 0);
    export(api, parent_export, 1).expect("export");
    let (from_child, to_parent) = pipe();
    let (from_parent, to_child) = pipe();
    // SAFETY: the child only makes twin calls (the other test threads wait on `SERIAL`, holding no twin lock) and
    // ends with `_exit`.
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        drop((from_child, to_child));
        let mut message = [0u8; 9];
        if let Ok(handle) = export(api, for_child, 1) {
            message[0] = u8::from(vmm_share::service_running());
            message[1..].copy_from_slice(&handle.to_le_bytes());
        }
        // SAFETY: writes a live local to a pipe; `_exit` ends the child without running the parent's destructors.
        unsafe {
            libc::write(to_parent.as_raw_fd(), message.as_ptr().cast(), message.len());
            let mut done = [0u8; 1];
            read_within(&from_parent, &mut done);
            libc::_exit(0);
        }
    }
    drop((to_parent, from_parent));
    let mut message = [0u8; 9];
    assert!(read_within(&from_child, &mut message), "the child answers");
    assert_eq!(message[0], 1, "the child exports with a service of its own");
    let child_handle = u64::from_le_bytes(message[1..].try_into().expect("8 bytes"));
    assert_eq!(vmm_share::handle_pid(child_handle), child as u32);
    let imported = import(api, child_handle, 0).expect("import from the forked child");
    free(api, imported);
    // The parent withdraws its only export: its name is free although the child (alive) inherited the listener.
    free(api, parent_export);
    assert!(!vmm_share::service_running());
    assert!(UnixStream::connect_addr(&own_address()).is_err(), "the child closed its copy of the listener");
    let again = physical(api, MIB2, 0);
    export(api, again, 1).expect("the parent's service starts again on its name");
    free(api, again);
    drop(to_child);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut status = 0;
    // SAFETY: waits for our own child without blocking.
    while unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == 0 {
        assert!(Instant::now() < deadline, "the child did not exit");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    free(api, for_child);
}

// ---------------------------------------------------------------------------------------------------------------
// Across processes: the child exports, the parent imports.

/// The child role: runs only when `ROLE` is set (the parent re-executes this binary with it).
#[test]
fn child_exporter() {
    if std::env::var(ROLE).as_deref() != Ok("exporter") {
        return;
    }
    // A watchdog: the child never outlives a stuck parent by long.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(3);
    });
    let api = api();
    let open = physical(api, MIB2, 0);
    let checked = physical(api, MIB2, 0);
    let va = map(api, open, MIB2);
    upload(api, va, &pattern(MIB2, 7));
    let open_handle = export(api, open, ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION).expect("export");
    let checked_handle = export(api, checked, ACL_RT_VMM_EXPORT_FLAG_DEFAULT).expect("export");
    let heap = common::malloc(api, 1 << 20);
    upload(api, heap, &pattern(1 << 20, 21));
    let key = ipc_key(api, heap, 1 << 20, ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION).expect("key");
    let checked_key = ipc_key(api, heap, 4096, ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT).expect("key");
    println!("READY {open_handle:x} {checked_handle:x} {key} {checked_key}");
    let _ = std::io::stdout().flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["check", seed] => {
                let seed: u8 = seed.parse().expect("seed");
                let verdict = if download(api, va, MIB2) == pattern(MIB2, seed) { "CHECK MATCH" } else { "CHECK DIFF" };
                println!("{verdict}");
                let _ = std::io::stdout().flush();
            }
            ["checkipc", seed] => {
                let seed: u8 = seed.parse().expect("seed");
                let ok = download(api, heap, 1 << 20) == pattern(1 << 20, seed);
                println!("{}", if ok { "CHECK MATCH" } else { "CHECK DIFF" });
                let _ = std::io::stdout().flush();
            }
            ["free"] => {
                unmap(api, va);
                free(api, open);
                free(api, checked);
                // SAFETY: what aclrtMalloc returned; its free withdraws its IPC keys.
                assert_eq!(unsafe { api.aclrtFree(heap) }, ACL_SUCCESS);
                println!("FREED {}", vmm_share::service_running());
                let _ = std::io::stdout().flush();
            }
            _ => break,
        }
    }
    std::process::exit(0);
}

struct Child {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Child {
    fn spawn() -> Child {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "child_exporter", "--nocapture", "--test-threads", "1"])
            .env(ROLE, "exporter")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Child { child, stdin, lines }
    }

    /// The next line containing `prefix` within 20 s, from `prefix` on (the harness prints its own words first).
    fn expect_line(&self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("no {prefix:?} line from the child"));
            if let Some(at) = line.find(prefix) {
                return line[at..].to_owned();
            }
        }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to the child");
        self.stdin.flush().expect("flush");
    }

    /// Tells the child to exit and waits at most 10 s.
    fn finish(mut self) {
        self.say("exit");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "the child failed: {status}");
                return;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("the child did not exit");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Waits (at most 5 s) until every thread of `pid` is stopped (state `T`).
fn wait_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks");
        let all_stopped = tasks.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        });
        if all_stopped {
            return;
        }
        assert!(Instant::now() < deadline, "the child did not stop");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn cross_process_export_import_and_exporter_exit() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _serial = serial();
    let api = api();
    let mut child = Child::spawn();
    let ready = child.expect_line("READY ");
    let words: Vec<&str> = ready.split_whitespace().collect();
    let open = u64::from_str_radix(words[1], 16).expect("handle");
    let checked = u64::from_str_radix(words[2], 16).expect("handle");
    let child_pid = child.child.id();
    assert_eq!(vmm_share::handle_pid(open), child_pid);

    let imported = import(api, open, 0).expect("cross-process import");
    // A second import while the first lives: refused, after the exporter has answered (it still grants it).
    assert_eq!(import(api, open, 0), Err(ACL_ERROR_RT_PARAM_INVALID));
    let va = map(api, imported, MIB2);
    assert_eq!(download(api, va, MIB2), pattern(MIB2, 7), "the child's data, read in the parent");
    upload(api, va, &pattern(MIB2, 9));
    child.say("check 9");
    assert_eq!(child.expect_line("CHECK "), "CHECK MATCH", "the parent's data, read in the child");

    // Flags 0: another process is never whitelisted (the whitelist call is not declared).
    assert_eq!(import(api, checked, 0), Err(ACL_ERROR_RT_NO_PERMISSION));

    // IPC keys across processes, data both ways.
    let (key, checked_key) = (words[3], words[4]);
    let window = ipc_import(api, key, 0).expect("cross-process IPC import");
    assert_eq!(download(api, window, 1 << 20), pattern(1 << 20, 21));
    upload(api, window, &pattern(1 << 20, 22));
    child.say("checkipc 22");
    assert_eq!(child.expect_line("CHECK "), "CHECK MATCH");
    assert_eq!(ipc_import(api, checked_key, 0), Err(ACL_ERROR_RT_NO_PERMISSION));
    assert_eq!(ipc_close(api, key), ACL_SUCCESS);
    // Forged tokens with the child's pid.
    let pid_bits = open & !((1 << vmm_share::TOKEN_BITS) - 1);
    for token in [1u64, 2, 0x3ff_ffff_ffff, (open + 1) & ((1 << vmm_share::TOKEN_BITS) - 1)] {
        if pid_bits | token != open && pid_bits | token != checked {
            assert_eq!(import(api, pid_bits | token, 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
        }
    }

    // A stopped exporter (SIGSTOP): the kernel still queues the connection, nobody answers; the import gives up at
    // its deadline.
    // SAFETY: signals to our own child.
    assert_eq!(unsafe { libc::kill(child_pid as i32, libc::SIGSTOP) }, 0);
    wait_stopped(child_pid);
    let started = Instant::now();
    let result = import(api, pid_bits | 5, 0);
    let waited = started.elapsed();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(child_pid as i32, libc::SIGCONT) }, 0);
    assert_eq!(result, Err(ACL_ERROR_RT_TIMEOUT));
    assert!(waited >= Duration::from_millis(1900) && waited < Duration::from_secs(4), "waited {waited:?}");

    // The child frees its exports (its service stops): the live exporter has no such export any more.
    child.say("free");
    assert_eq!(child.expect_line("FREED "), "FREED false");
    assert_eq!(import(api, checked, 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
    assert_eq!(download(api, va, MIB2), pattern(MIB2, 9), "the import's mapping outlives the exporter's free");

    child.finish();
    // The exporter is gone: import fails fast with its own code; the mapping made before keeps the pages.
    let started = Instant::now();
    assert_eq!(import(api, checked, 0), Err(ACL_ERROR_RT_IPC_ERROR));
    assert!(started.elapsed() < Duration::from_millis(500), "took {:?}", started.elapsed());
    // Also for the handle imported (and still mapped) here: the gone exporter takes precedence over the duplicate.
    assert_eq!(import(api, open, 0), Err(ACL_ERROR_RT_IPC_ERROR));
    assert_eq!(download(api, va, MIB2), pattern(MIB2, 9));
    unmap(api, va);
    free(api, imported);
}

#[test]
fn a_listener_that_is_not_the_exporter_is_refused() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _serial = serial();
    let api = api();
    // A live process that exports nothing; this process binds the name its service would have.
    let mut bystander = Command::new("sleep").arg("30").spawn().expect("spawn sleep");
    let pid = bystander.id();
    let name = SocketAddr::from_abstract_name(vmm_share::socket_name(pid)).expect("name");
    let squatter = std::os::unix::net::UnixListener::bind_addr(&name).expect("bind");
    let handle = (u64::from(pid) << vmm_share::TOKEN_BITS) | 77;
    let started = Instant::now();
    assert_eq!(import(api, handle, 0), Err(ACL_ERROR_RT_INTERNAL_ERROR), "SO_PEERCRED shows another pid");
    assert!(started.elapsed() < Duration::from_millis(500));
    drop(squatter);
    // Nobody listens now, and the process lives: no such export.
    assert_eq!(import(api, handle, 0), Err(ACL_ERROR_RT_INVALID_HANDLE));
    let _ = bystander.kill();
    let _ = bystander.wait();
    // Gone (reaped): the peer-loss code.
    assert_eq!(import(api, handle, 0), Err(ACL_ERROR_RT_IPC_ERROR));
}
