//! IPC keys: a range of `aclrtMalloc` memory shared on the same mechanism as VMM exports. The key is the text
//! `cann-twin-ipc-<16 hex digits>`, the digits a value laid out as a shareable handle (pid and token); the service
//! passes the exporter's heap memfd with the range's offset and size, and the importer maps that range and gives it
//! a device address of its own (a device window, as for registered Host memory).

use std::os::fd::OwnedFd;
use std::sync::Arc;

use ascendcl_sys::sys::*;

use super::importer::fetch;
use super::range::map_range;
use super::{
    check_export_flags, dup, forget_inherited, handle_pid, lock, own_pid, random_token, with_exports, IpcExport,
    IpcImport, Service, IPC_KEY_LEN, IPC_KEY_PREFIX, OP_IPC_IMPORT, PID_BITS, SERVICE, TOKEN_BITS, TOKEN_MASK,
};
use crate::entry::not_null;
use crate::runtime::runtime;

fn ipc_key(value: u64) -> String {
    format!("{IPC_KEY_PREFIX}{value:016x}")
}

fn parse_ipc_key(key: &[u8]) -> Result<u64, aclError> {
    let digits = key.strip_prefix(IPC_KEY_PREFIX.as_bytes()).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
    if digits.len() != 16 || !digits.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) {
        return Err(ACL_ERROR_RT_INVALID_HANDLE);
    }
    let text = core::str::from_utf8(digits).map_err(|_| ACL_ERROR_RT_INVALID_HANDLE)?;
    u64::from_str_radix(text, 16).map_err(|_| ACL_ERROR_RT_INVALID_HANDLE)
}

/// The `aclrtMalloc` allocation at `allocation` is being freed (under the space's write lock): its IPC keys are
/// withdrawn. Mappings importers made keep the memfd range, whose pages the free punches out (they read zero, and
/// a later allocation may reuse them: the vendor calls use after the exporter's free undefined).
pub(crate) fn heap_released(allocation: usize) {
    let mut service = lock(&SERVICE);
    let now_empty = with_exports(|exports| {
        let before = exports.ipc.len();
        exports.ipc.retain(|_, export| export.allocation != allocation);
        before != exports.ipc.len() && exports.is_empty()
    });
    if now_empty {
        if let Some(running) = service.take() {
            running.stop();
        }
    }
}

fn ipc_export(address: usize, size: usize, flags: u64) -> Result<String, aclError> {
    // Before the first key exists: freeing its allocation withdraws it.
    crate::memory::on_heap_released(heap_released);
    let check_pid = check_export_flags(flags)?;
    let runtime = runtime();
    runtime.current_device()?;
    let (fd, offset, allocation) = {
        let space = crate::space::space();
        let space = space.as_ref().filter(|space| space.contains(address)).ok_or(ACL_ERROR_RT_PARAM_INVALID)?;
        match space.heap_range(address, size) {
            Ok((fd, offset, allocation)) => (Arc::new(dup(fd)?), offset, allocation),
            // A Host window (`aclrtHostRegister`) onto `aclrtMallocHost` memory: the allocation's own memfd.
            Err(code) => {
                let host = space.registered_host(address, size).ok_or(code)?;
                let (&start, allocation) = runtime
                    .host
                    .iter()
                    .find(|(&start, allocation)| host >= start && host + size <= start + allocation.length)
                    .ok_or(code)?;
                (allocation.fd.clone(), host - start, start)
            }
        }
    };
    let pid = u64::from(own_pid());
    if pid >> PID_BITS != 0 {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    let mut service = lock(&SERVICE);
    forget_inherited(&mut service);
    let value = with_exports(|exports| -> Result<u64, aclError> {
        let value = loop {
            let token = random_token()?;
            let candidate = (pid << TOKEN_BITS) | token;
            if token != 0 && !exports.ipc.contains_key(&candidate) {
                break candidate;
            }
        };
        exports.ipc.insert(value, IpcExport { fd, offset, size, check_pid, allocation });
        Ok(value)
    })?;
    if service.is_none() {
        match Service::start() {
            Ok(started) => *service = Some(started),
            Err(code) => {
                with_exports(|exports| exports.ipc.remove(&value));
                return Err(code);
            }
        }
    }
    Ok(ipc_key(value))
}

fn ipc_import(value: u64) -> Result<usize, aclError> {
    let pid = handle_pid(value);
    if pid == 0 || value & TOKEN_MASK == 0 {
        return Err(ACL_ERROR_RT_INVALID_HANDLE);
    }
    runtime().current_device()?;
    // One import of a key per process, checked once the exporter has answered (as for VMM imports).
    let (fd, size, offset) = if pid == own_pid() {
        with_exports(|exports| -> Result<(OwnedFd, usize, usize), aclError> {
            let export = exports.ipc.get(&value).ok_or(ACL_ERROR_RT_INVALID_HANDLE)?;
            Ok((dup(&export.fd)?, export.size, export.offset))
        })?
    } else {
        fetch(pid, OP_IPC_IMPORT, value)?
    };
    if with_exports(|exports| exports.ipc_imported.contains_key(&value)) {
        return Err(ACL_ERROR_RT_PARAM_INVALID);
    }
    // Unmapped when dropped, until the import is recorded.
    let mapping = map_range(&fd, offset, size)?;
    let host = mapping.host;
    let address = crate::space::with_space_mut(|space| space.register(host, size, false))?;
    let recorded = with_exports(|exports| {
        if exports.ipc_imported.contains_key(&value) {
            return false;
        }
        exports.ipc_imported.insert(value, IpcImport { view: mapping.view, map_len: mapping.map_len, host });
        true
    });
    if !recorded {
        let _ = crate::space::with_space_mut(|space| space.unregister(host));
        return Err(ACL_ERROR_RT_PARAM_INVALID);
    }
    // The import owns the mapping now (`ipc_close` unmaps it).
    std::mem::forget(mapping);
    Ok(address)
}

fn ipc_close(value: u64) -> Result<(), aclError> {
    runtime().ready()?;
    if let Some(import) = with_exports(|exports| exports.ipc_imported.remove(&value)) {
        crate::space::with_space_mut(|space| space.unregister(import.host))?;
        // SAFETY: the import's mapping, no longer registered: nothing translates to it any more (unregistering
        // took the space's write lock).
        unsafe { libc::munmap(import.view as *mut libc::c_void, import.map_len) };
        return Ok(());
    }
    let mut service = lock(&SERVICE);
    let (found, now_empty) = with_exports(|exports| {
        let found = exports.ipc.remove(&value).is_some();
        (found, found && exports.is_empty())
    });
    if now_empty {
        if let Some(running) = service.take() {
            running.stop();
        }
    }
    if found {
        Ok(())
    } else {
        Err(ACL_ERROR_RT_INVALID_HANDLE)
    }
}

fn key_bytes<'a>(key: *const core::ffi::c_char) -> &'a [u8] {
    // SAFETY: a non-null key is a NUL-terminated string (C contract); the callers checked non-null.
    unsafe { core::ffi::CStr::from_ptr(key) }.to_bytes()
}

/// Shares `[dev_ptr, dev_ptr + size)`, inside one `aclrtMalloc` allocation or inside one Host window
/// (`aclrtHostRegister`) onto `aclrtMallocHost` memory, under a key written to `key` (the
/// text `cann-twin-ipc-` and 16 hex digits, NUL-terminated; `len` must hold it: the vendor's is 65). `flags` as
/// for VMM exports (`ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION` admits other processes; the default
/// whitelist call is not declared, so 0 refuses them). Freeing the allocation or `aclrtIpcMemClose` withdraws it.
/// The Host window case is a guess: CANN documents the key for `aclrtMalloc` memory; the twin lets the importer map
/// the Host pages as a device window of its own, as it does device memory.
///
/// # Safety
///
/// `key` is null or writable for `len` bytes (C contract).
#[no_mangle]
pub unsafe extern "C" fn aclrtIpcMemGetExportKey(
    dev_ptr: *mut core::ffi::c_void,
    size: usize,
    key: *mut core::ffi::c_char,
    len: usize,
    flags: u64,
) -> aclError {
    crate::entry::guard("aclrtIpcMemGetExportKey", move || {
        not_null(dev_ptr)?;
        not_null(key)?;
        if size == 0 || len <= IPC_KEY_LEN {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let text = ipc_export(dev_ptr as usize, size, flags)?;
        // SAFETY: `key` is writable for `len > IPC_KEY_LEN` bytes; the text and its NUL fit.
        unsafe {
            core::ptr::copy_nonoverlapping(text.as_ptr().cast::<core::ffi::c_char>(), key, text.len());
            key.add(text.len()).write(0);
        }
        Ok(())
    })
}

/// Maps the memory an IPC key names (of this or another process) at a new device address of the current
/// device, written to `dev_ptr`. `flags` 0 or `ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS` (accepted, not
/// modelled). Codes as for VMM imports; one import of a key per process until `aclrtIpcMemClose`.
///
/// # Safety
///
/// `dev_ptr` is null or writable; `key` is null or a NUL-terminated string (C contract).
#[no_mangle]
pub unsafe extern "C" fn aclrtIpcMemImportByKey(
    dev_ptr: *mut *mut core::ffi::c_void,
    key: *const core::ffi::c_char,
    flags: u64,
) -> aclError {
    crate::entry::guard("aclrtIpcMemImportByKey", move || {
        not_null(dev_ptr)?;
        not_null(key)?;
        if flags != ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT && flags != ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS {
            return Err(ACL_ERROR_INVALID_PARAM);
        }
        let address = ipc_import(parse_ipc_key(key_bytes(key))?)?;
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { dev_ptr.write(address as *mut core::ffi::c_void) };
        Ok(())
    })
}

/// Closes a key: in an importer, unmaps its device window; in the exporter, withdraws the key (mappings already
/// made stay valid while the allocation lives).
///
/// # Safety
///
/// `key` is null or a NUL-terminated string (C contract).
#[no_mangle]
pub unsafe extern "C" fn aclrtIpcMemClose(key: *const core::ffi::c_char) -> aclError {
    crate::entry::guard("aclrtIpcMemClose", move || {
        not_null(key)?;
        ipc_close(parse_ipc_key(key_bytes(key))?)
    })
}
