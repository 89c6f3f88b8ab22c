//! The CANN SHMEM host C ABI (`libshmem.so`, ACLSHMEM) on the twin: the prototypes of
//! `cann_shmem_sys::sys::ShmemApi`, resolved in-process by [`resolve_shmem`] ([`shmem_api`]).
//!
//! What is modelled:
//! - the unique-id bootstrap of one process: [`aclshmemx_get_uniqueid`] makes a 136-byte id whose opaque part names
//!   this twin, the process and a nonce; [`aclshmemx_init_attr`] with `ACLSHMEMX_INIT_WITH_UNIQUEID` accepts only
//!   such an id. With `n_pes > 1` every process sets up its own PE only: there is no exchange, no barrier and no
//!   check that the other PEs exist or hold the same id (cross-process bootstrap is not modelled);
//! - with `data_op_engine_type` including SDMA: the device's SDMA workspace (16 KiB of device memory: the flag info
//!   `{u32 flag; u32 total_queue_num}` then 48 channel records of 64 bytes at offset 64) and its 48 channels with
//!   their engines ([`crate::sdma`]); the notify ids at workspace offset 14 KiB are not written (notifies are not
//!   modelled);
//! - the heap: `aclshmem_malloc`/`calloc`/`align`/`free` allocate device memory of the initialising device, at most
//!   `local_mem_size` bytes in all. Symmetry across PEs is **not** modelled: addresses are not the same on every PE,
//!   and `aclshmem_ptr` gives the address itself for the own PE and null for every other PE;
//! - `g_state`: a process-wide buffer laid out as `cann_shmem_sys::device_state` reads SHMEM's state (version word
//!   `(1 << 16) + STATE_SIZE`, `mype`, `npes`, `sdma_workspace_addr`; every other field stays zero). The device copy
//!   SHMEM keeps at a fixed device address is not modelled (the twin's device addresses are not SHMEM's).
//!
//! Return codes are SHMEM's (`aclshmem_error_code_t`, `hicann/shmem` `include/host/shmem_host_def.h`), chosen
//! per case as its `src/host/init/shmem_init.cpp` does where that file shows it; the crate docs list each case.

use core::ffi::c_void;
use std::cell::UnsafeCell;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

use cann_shmem_sys::device_state::{
    EXPECTED_VERSION, MYPE_OFFSET, NPES_OFFSET, SDMA_WORKSPACE_ADDR_OFFSET, STATE_SIZE, VERSION_OFFSET,
};
use cann_shmem_sys::sys::*;

use crate::runtime::runtime;
use crate::sdma;
use crate::space::{space, with_space_mut};

/// What [`cann_shmem_sys::ShmemApi::path`] reports for [`shmem_api`].
pub const IN_PROCESS_SHMEM_PATH: &str = "cann-twin SHMEM (in-process)";
/// `ACLSHMEM_MAX_PES` (`include/host_device/shmem_common_types.h`).
pub const ACLSHMEM_MAX_PES: i32 = 16384;
/// `ACLSHMEM_MAX_LOCAL_SIZE`, 40 GiB (`shmem_common_types.h`).
pub const ACLSHMEM_MAX_LOCAL_SIZE: u64 = 40 << 30;
/// `aclshmemx_init_status_t` (`shmem_host_def.h`): not initialised.
pub const ACLSHMEM_STATUS_NOT_INITIALIZED: i32 = 0;
/// `aclshmemx_init_status_t`: the heap exists, initialisation is under way (never observable on the twin).
pub const ACLSHMEM_STATUS_SHM_CREATED: i32 = 1;
/// `aclshmemx_init_status_t`: initialised.
pub const ACLSHMEM_STATUS_IS_INITIALIZED: i32 = 2;
/// The interface version `aclshmem_info_get_version` reports: `ACLSHMEM_MAJOR_VERSION`/`ACLSHMEM_MINOR_VERSION` of
/// the header the twin implements (`shmem_host_def.h`: 1.1). It names the API, not a SHMEM release.
pub const SHMEM_INTERFACE_VERSION: (i32, i32) = (1, 1);
/// The opening of the opaque part of every unique id this twin makes.
pub const UNIQUEID_MAGIC: &[u8; 16] = b"cann-twin-uid\0\0\0";

/// The process-wide SHMEM host state buffer, exported as the data symbol `g_state`.
#[repr(C, align(8))]
#[derive(Debug)]
pub struct HostState(UnsafeCell<[u8; STATE_SIZE]>);

// SAFETY: written only under the SHMEM mutex, word by word through raw pointers; readers (through the data symbol)
// copy bytes, as C readers of SHMEM's `g_state` do.
unsafe impl Sync for HostState {}

const fn initial_state() -> [u8; STATE_SIZE] {
    let mut bytes = [0u8; STATE_SIZE];
    let version = EXPECTED_VERSION.to_ne_bytes();
    let minus_one = (-1i32).to_ne_bytes();
    let mut i = 0;
    while i < 4 {
        bytes[VERSION_OFFSET + i] = version[i];
        // SHMEM's initializer: mype and npes -1 until initialisation (`src/host/init/shmem_init.cpp`).
        bytes[MYPE_OFFSET + i] = minus_one[i];
        bytes[NPES_OFFSET + i] = minus_one[i];
        i += 1;
    }
    bytes
}

/// SHMEM's host state as `cann_shmem_sys::device_state` lays it out.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static g_state: HostState = HostState(UnsafeCell::new(initial_state()));

fn state_write(instance: usize, offset: usize, bytes: &[u8]) {
    debug_assert!(offset + bytes.len() <= STATE_SIZE);
    let buffer = state(instance).0.get().cast::<u8>();
    // SAFETY: inside the buffer (offsets from `device_state`, checked against STATE_SIZE there); the caller holds
    // the instance's SHMEM mutex, the only writer.
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.add(offset), bytes.len()) };
}

fn state_read_i32(instance: usize, offset: usize) -> i32 {
    let mut word = [0u8; 4];
    // SAFETY: inside the buffer; a plain byte copy.
    unsafe { core::ptr::copy_nonoverlapping(state(instance).0.get().cast::<u8>().add(offset), word.as_mut_ptr(), 4) };
    i32::from_ne_bytes(word)
}

#[derive(Debug, Default)]
struct Shmem {
    initialized: bool,
    device: i32,
    mype: i32,
    sdma: bool,
    local_mem_size: u64,
    used: u64,
    /// Heap allocations: address -> size.
    allocations: BTreeMap<usize, usize>,
    uid_counter: u32,
}

/// Instances of the SHMEM library in this process: instance 0 is the one the C names export (with `g_state`);
/// instance `i` is what [`shmem_api_instance`]`(i)` resolves to, as if `libshmem.so` were loaded once per device into
/// a namespace of its own. Real SHMEM has one PE per process; the twin gives each device of a process an instance of
/// its own so that one test process can hold several devices, each one PE.
pub const SHMEM_INSTANCES: usize = 8;

const EMPTY: Shmem = Shmem {
    initialized: false,
    device: 0,
    mype: -1,
    sdma: false,
    local_mem_size: 0,
    used: 0,
    allocations: BTreeMap::new(),
    uid_counter: 0,
};

static SHMEM: [Mutex<Shmem>; SHMEM_INSTANCES] = [const { Mutex::new(EMPTY) }; SHMEM_INSTANCES];
/// The state buffers of instances 1 and up (instance 0's is `g_state`).
static STATES: [HostState; SHMEM_INSTANCES - 1] =
    [const { HostState(UnsafeCell::new(initial_state())) }; SHMEM_INSTANCES - 1];

fn shmem(instance: usize) -> MutexGuard<'static, Shmem> {
    SHMEM[instance].lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn state(instance: usize) -> &'static HostState {
    if instance == 0 {
        &g_state
    } else {
        &STATES[instance - 1]
    }
}

fn code(body: impl FnOnce() -> Result<(), i32>) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => ACLSHMEM_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => ACLSHMEM_INNER_ERROR,
    }
}

fn pointer(body: impl FnOnce() -> Option<usize>) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(body)).ok().flatten().unwrap_or(0) as *mut c_void
}

/// Makes a unique id: version `ACLSHMEM_UNIQUEID_VERSION`, `my_pe` and `n_pes` 0, and in the opaque part
/// [`UNIQUEID_MAGIC`], the process id (u32), a nanosecond clock reading (u64) and a per-process counter (u32),
/// little-endian. `ACLSHMEM_INVALID_PARAM` for a null `uid` (a guess: SHMEM dereferences it).
///
/// # Safety
///
/// `uid` is null or writable for 136 bytes.
#[no_mangle]
pub unsafe extern "C" fn aclshmemx_get_uniqueid(uid: *mut aclshmemx_uniqueid_t) -> i32 {
    // SAFETY: the caller's contract, passed on.
    unsafe { get_uniqueid::<0>(uid) }
}

/// [`aclshmemx_get_uniqueid`] of instance `I`.
///
/// # Safety
///
/// As [`aclshmemx_get_uniqueid`].
unsafe extern "C" fn get_uniqueid<const I: usize>(uid: *mut aclshmemx_uniqueid_t) -> i32 {
    code(|| {
        if uid.is_null() {
            return Err(ACLSHMEM_INVALID_PARAM);
        }
        let counter = {
            let mut shmem = shmem(I);
            shmem.uid_counter = shmem.uid_counter.wrapping_add(1);
            shmem.uid_counter
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64)
            .unwrap_or(0);
        let mut opaque = Vec::with_capacity(ACLSHMEM_UNIQUE_ID_INNER_LEN);
        opaque.extend_from_slice(UNIQUEID_MAGIC);
        opaque.extend_from_slice(&std::process::id().to_le_bytes());
        opaque.extend_from_slice(&nanos.to_le_bytes());
        opaque.extend_from_slice(&counter.to_le_bytes());
        let mut made = aclshmemx_uniqueid_t::default();
        for (slot, byte) in made.internal.iter_mut().zip(opaque) {
            *slot = byte as core::ffi::c_char;
        }
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { uid.write(made) };
        Ok(())
    })
}

/// Fills `attr` for a unique-id bootstrap: `my_pe`, `n_pes`, `local_mem_size`, and `comm_args = uid`. Codes as
/// SHMEM's: `ACLSHMEM_INVALID_VALUE` when `local_mem_size` exceeds 40 GiB, `n_pes` exceeds `ACLSHMEM_MAX_PES` or
/// `my_pe` is not below it; `ACLSHMEM_INVALID_PARAM` for a null `uid` or `attr` (a guess).
///
/// # Safety
///
/// `attr` is null or a writable `aclshmemx_init_attr_t`; `uid` stays valid until `aclshmemx_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn aclshmemx_set_attr_uniqueid_args(
    my_pe: i32,
    n_pes: i32,
    local_mem_size: i64,
    uid: *mut aclshmemx_uniqueid_t,
    attr: *mut aclshmemx_init_attr_t,
) -> i32 {
    code(|| {
        if local_mem_size > ACLSHMEM_MAX_LOCAL_SIZE as i64 || n_pes > ACLSHMEM_MAX_PES || my_pe >= ACLSHMEM_MAX_PES {
            return Err(ACLSHMEM_INVALID_VALUE);
        }
        if uid.is_null() || attr.is_null() {
            return Err(ACLSHMEM_INVALID_PARAM);
        }
        // SAFETY: checked non-null; a writable struct by the C contract (fields written one by one, the caller's
        // other fields kept).
        unsafe {
            (*attr).comm_args = uid.cast();
            (*attr).my_pe = my_pe;
            (*attr).n_pes = n_pes;
            (*attr).local_mem_size = local_mem_size as u64;
        }
        Ok(())
    })
}

fn check_attr(attr: &aclshmemx_init_attr_t) -> Result<(), i32> {
    // The order and codes of SHMEM's `check_attr` (`src/host/init/shmem_init.cpp`).
    if attr.my_pe < 0 || attr.n_pes <= 0 || attr.n_pes > ACLSHMEM_MAX_PES {
        return Err(ACLSHMEM_INVALID_VALUE);
    }
    if attr.my_pe >= attr.n_pes {
        return Err(ACLSHMEM_INVALID_PARAM);
    }
    if attr.local_mem_size == 0 || attr.local_mem_size > ACLSHMEM_MAX_LOCAL_SIZE {
        return Err(ACLSHMEM_INVALID_VALUE);
    }
    let option = &attr.option_attr;
    if option.shm_init_timeout == 0 || option.control_operation_timeout == 0 {
        return Err(ACLSHMEM_INVALID_VALUE);
    }
    let engines = option.data_op_engine_type.0;
    let valid = (ACLSHMEM_DATA_OP_UDMA.0 << 1) - 1;
    if engines == 0 || engines & !valid != 0 {
        return Err(ACLSHMEM_INVALID_VALUE);
    }
    Ok(())
}

/// Initialises this process's PE. Needs `aclInit` and a current device on the calling thread (else
/// `ACLSHMEM_NOT_INITED`, a guess); only `ACLSHMEMX_INIT_WITH_UNIQUEID` with an id from
/// [`aclshmemx_get_uniqueid`] is modelled (other flags: `ACLSHMEM_NOT_SUPPORTED`; an id not made by the twin:
/// `ACLSHMEM_BOOTSTRAP_ERROR`, both guesses). With the SDMA engine it creates the device's SDMA workspace and 48
/// channels. A second initialisation before `aclshmem_finalize`: `ACLSHMEM_INNER_ERROR` (as SHMEM).
///
/// # Safety
///
/// `attributes` is null or a readable `aclshmemx_init_attr_t` whose `comm_args` is null or a readable unique id.
#[no_mangle]
pub unsafe extern "C" fn aclshmemx_init_attr(
    bootstrap_flags: aclshmemx_bootstrap_t,
    attributes: *mut aclshmemx_init_attr_t,
) -> i32 {
    // SAFETY: the caller's contract, passed on.
    unsafe { init_attr::<0>(bootstrap_flags, attributes) }
}

/// [`aclshmemx_init_attr`] of instance `I`.
///
/// # Safety
///
/// As [`aclshmemx_init_attr`].
unsafe extern "C" fn init_attr<const I: usize>(
    bootstrap_flags: aclshmemx_bootstrap_t,
    attributes: *mut aclshmemx_init_attr_t,
) -> i32 {
    code(|| {
        if attributes.is_null() {
            return Err(ACLSHMEM_INVALID_PARAM);
        }
        let mut shmem = shmem(I);
        if shmem.initialized {
            return Err(ACLSHMEM_INNER_ERROR);
        }
        // SAFETY: checked non-null; readable by the C contract.
        let attr = unsafe { attributes.read() };
        check_attr(&attr)?;
        if bootstrap_flags != ACLSHMEMX_INIT_WITH_UNIQUEID {
            return Err(ACLSHMEM_NOT_SUPPORTED);
        }
        if attr.comm_args.is_null() {
            return Err(ACLSHMEM_BOOTSTRAP_ERROR);
        }
        // SAFETY: a non-null `comm_args` is the unique id `aclshmemx_set_attr_uniqueid_args` stored (C contract).
        let uid = unsafe { attr.comm_args.cast::<aclshmemx_uniqueid_t>().read() };
        let bytes = uid.to_bytes();
        if uid.version != ACLSHMEM_UNIQUEID_VERSION || &bytes[12..12 + UNIQUEID_MAGIC.len()] != UNIQUEID_MAGIC {
            return Err(ACLSHMEM_BOOTSTRAP_ERROR);
        }
        let device = runtime().current_device().map_err(|_| ACLSHMEM_NOT_INITED)?;
        let sdma = attr.option_attr.data_op_engine_type.0 & ACLSHMEM_DATA_OP_SDMA.0 != 0;
        let workspace = if sdma {
            sdma::create(device, sdma::MAX_CHANNELS, sdma::SQ_DEPTH).map_err(|_| ACLSHMEM_INNER_ERROR)?
        } else {
            0
        };
        *shmem = Shmem {
            initialized: true,
            device,
            mype: attr.my_pe,
            sdma,
            local_mem_size: attr.local_mem_size,
            used: 0,
            allocations: BTreeMap::new(),
            uid_counter: shmem.uid_counter,
        };
        state_write(I, MYPE_OFFSET, &attr.my_pe.to_ne_bytes());
        state_write(I, NPES_OFFSET, &attr.n_pes.to_ne_bytes());
        state_write(I, SDMA_WORKSPACE_ADDR_OFFSET, &workspace.to_ne_bytes());
        Ok(())
    })
}

/// Stops the SDMA engines and frees the workspace, the rings and every heap allocation; `sdma_workspace_addr`
/// returns to 0 (stricter than SHMEM, which leaves the freed address in its state). Succeeds when not initialised
/// (as SHMEM). Finalise before the device's last `aclrtResetDevice`, which frees the memory under the engines.
#[no_mangle]
pub extern "C" fn aclshmem_finalize() -> i32 {
    finalize::<0>()
}

extern "C" fn finalize<const I: usize>() -> i32 {
    code(|| {
        let mut shmem = shmem(I);
        if !shmem.initialized {
            return Ok(());
        }
        if shmem.sdma {
            sdma::destroy(shmem.device);
        }
        let allocations = std::mem::take(&mut shmem.allocations);
        let _ = with_space_mut(|space| {
            allocations.keys().for_each(|&address| {
                let _ = space.free(address);
            });
            Ok(())
        });
        shmem.initialized = false;
        shmem.sdma = false;
        shmem.used = 0;
        state_write(I, SDMA_WORKSPACE_ADDR_OFFSET, &0u64.to_ne_bytes());
        Ok(())
    })
}

/// `ACLSHMEM_STATUS_IS_INITIALIZED` (2) after a successful `aclshmemx_init_attr`, else
/// `ACLSHMEM_STATUS_NOT_INITIALIZED` (0).
#[no_mangle]
pub extern "C" fn aclshmemx_init_status() -> i32 {
    init_status::<0>()
}

extern "C" fn init_status<const I: usize>() -> i32 {
    if shmem(I).initialized {
        ACLSHMEM_STATUS_IS_INITIALIZED
    } else {
        ACLSHMEM_STATUS_NOT_INITIALIZED
    }
}

/// `g_state.mype`: -1 before the first initialisation (SHMEM's initializer), then the PE.
#[no_mangle]
pub extern "C" fn aclshmem_my_pe() -> i32 {
    my_pe::<0>()
}

extern "C" fn my_pe<const I: usize>() -> i32 {
    let _shmem = shmem(I);
    state_read_i32(I, MYPE_OFFSET)
}

/// `g_state.npes`: -1 before the first initialisation, then the PE count.
#[no_mangle]
pub extern "C" fn aclshmem_n_pes() -> i32 {
    n_pes::<0>()
}

extern "C" fn n_pes<const I: usize>() -> i32 {
    let _shmem = shmem(I);
    state_read_i32(I, NPES_OFFSET)
}

/// [`SHMEM_INTERFACE_VERSION`]; with a null pointer writes nothing (as SHMEM).
///
/// # Safety
///
/// Each pointer is null or writable.
#[no_mangle]
pub unsafe extern "C" fn aclshmem_info_get_version(major: *mut i32, minor: *mut i32) {
    if major.is_null() || minor.is_null() {
        return;
    }
    // SAFETY: both checked non-null; writable by the C contract.
    unsafe {
        major.write(SHMEM_INTERFACE_VERSION.0);
        minor.write(SHMEM_INTERFACE_VERSION.1);
    }
}

fn heap_alloc(instance: usize, size: usize, align: usize, zero: bool) -> Option<usize> {
    let mut shmem = shmem(instance);
    if !shmem.initialized || size == 0 || !align.is_power_of_two() {
        return None;
    }
    let total = shmem.used.checked_add(size as u64)?;
    if total > shmem.local_mem_size {
        return None;
    }
    let device = shmem.device;
    let address = with_space_mut(|space| space.malloc_aligned(size, device, align)).ok()?;
    if zero {
        let guard = space();
        let segments = guard.as_ref()?.translate(address, size, true).ok()?;
        for segment in segments.iter() {
            // SAFETY: translated under the read lock still held, for `size` bytes in all.
            unsafe { core::ptr::write_bytes(segment.ptr, 0, segment.len) };
        }
    }
    shmem.used = total;
    shmem.allocations.insert(address, size);
    Some(address)
}

/// `size` bytes of the PE's heap (device memory of the initialising device); null when not initialised, for size 0,
/// or past `local_mem_size` in all.
#[no_mangle]
pub extern "C" fn aclshmem_malloc(size: usize) -> *mut c_void {
    malloc::<0>(size)
}

extern "C" fn malloc<const I: usize>(size: usize) -> *mut c_void {
    pointer(|| heap_alloc(I, size, crate::memory::page(), false))
}

/// `nmemb * size` zeroed bytes of the heap; null as [`aclshmem_malloc`], or when the product overflows.
#[no_mangle]
pub extern "C" fn aclshmem_calloc(nmemb: usize, size: usize) -> *mut c_void {
    calloc::<0>(nmemb, size)
}

extern "C" fn calloc<const I: usize>(nmemb: usize, size: usize) -> *mut c_void {
    pointer(|| heap_alloc(I, nmemb.checked_mul(size)?, crate::memory::page(), true))
}

/// `size` bytes of the heap aligned to `alignment` (a power of two; else null).
#[no_mangle]
pub extern "C" fn aclshmem_align(alignment: usize, size: usize) -> *mut c_void {
    align::<0>(alignment, size)
}

extern "C" fn align<const I: usize>(alignment: usize, size: usize) -> *mut c_void {
    pointer(|| heap_alloc(I, size, alignment, false))
}

/// Frees a heap allocation (its exact address); null and unknown addresses are ignored.
#[no_mangle]
pub extern "C" fn aclshmem_free(ptr: *mut c_void) {
    free::<0>(ptr)
}

extern "C" fn free<const I: usize>(ptr: *mut c_void) {
    let _ = catch_unwind(|| {
        let mut shmem = shmem(I);
        if let Some(size) = shmem.allocations.remove(&(ptr as usize)) {
            shmem.used -= size as u64;
            let _ = with_space_mut(|space| space.free(ptr as usize));
        }
    });
}

/// The address of `ptr` on `pe`: `ptr` itself for the own PE when it lies in a heap allocation, null otherwise
/// (other PEs' heaps are not modelled).
#[no_mangle]
pub extern "C" fn aclshmem_ptr(ptr: *mut c_void, pe: i32) -> *mut c_void {
    shmem_ptr::<0>(ptr, pe)
}

extern "C" fn shmem_ptr<const I: usize>(ptr: *mut c_void, pe: i32) -> *mut c_void {
    pointer(|| {
        let shmem = shmem(I);
        if !shmem.initialized || pe != shmem.mype {
            return None;
        }
        let address = ptr as usize;
        let (&start, &size) = shmem.allocations.range(..=address).next_back()?;
        (address - start < size).then_some(address)
    })
}

macro_rules! shmem_exports {
    ($($name:ident => $generic:ident),* $(,)?) => {
        /// The C names of every SHMEM function this runtime implements and exports.
        pub const SHMEM_EXPORTED: &[&str] = &[$(stringify!($name)),*];

        /// The address of the SHMEM function or data symbol called `name`, or `None`: the resolver for
        /// [`cann_shmem_sys::ShmemApi::from_resolver`] (instance 0, the exported C names). Each function has exactly
        /// the prototype of `cann_shmem_sys::sys`; `g_state` is [`static@g_state`].
        pub fn resolve_shmem(name: &str) -> Option<*const c_void> {
            resolve_shmem_instance(0, name)
        }

        /// As [`resolve_shmem`], for instance `instance` (below [`SHMEM_INSTANCES`]) of the library.
        pub fn resolve_shmem_instance(instance: usize, name: &str) -> Option<*const c_void> {
            macro_rules! pick {
                ($function:ident) => {
                    match instance {
                        0 => $function::<0> as *const c_void,
                        1 => $function::<1> as *const c_void,
                        2 => $function::<2> as *const c_void,
                        3 => $function::<3> as *const c_void,
                        4 => $function::<4> as *const c_void,
                        5 => $function::<5> as *const c_void,
                        6 => $function::<6> as *const c_void,
                        7 => $function::<7> as *const c_void,
                        _ => return None,
                    }
                };
            }
            if instance >= SHMEM_INSTANCES {
                return None;
            }
            match name {
                $(stringify!($name) => Some(pick!($generic)),)*
                "g_state" => Some(state(instance).0.get().cast_const().cast()),
                _ => None,
            }
        }
    };
}

/// Functions without per-instance state, as generic wrappers so every instance resolves them alike.
extern "C" fn same_set_attr<const I: usize>(
    my_pe: i32,
    n_pes: i32,
    local_mem_size: i64,
    uid: *mut aclshmemx_uniqueid_t,
    attr: *mut aclshmemx_init_attr_t,
) -> i32 {
    // SAFETY: the C contract of `aclshmemx_set_attr_uniqueid_args`, which the caller of this table entry holds to.
    unsafe { aclshmemx_set_attr_uniqueid_args(my_pe, n_pes, local_mem_size, uid, attr) }
}

extern "C" fn same_version<const I: usize>(major: *mut i32, minor: *mut i32) {
    // SAFETY: the C contract of `aclshmem_info_get_version`, which the caller of this table entry holds to.
    unsafe { aclshmem_info_get_version(major, minor) }
}

shmem_exports! {
    aclshmemx_get_uniqueid => get_uniqueid,
    aclshmemx_set_attr_uniqueid_args => same_set_attr,
    aclshmemx_init_attr => init_attr,
    aclshmem_malloc => malloc,
    aclshmem_calloc => calloc,
    aclshmem_align => align,
    aclshmem_free => free,
    aclshmem_ptr => shmem_ptr,
    aclshmem_my_pe => my_pe,
    aclshmem_n_pes => n_pes,
    aclshmem_finalize => finalize,
    aclshmemx_init_status => init_status,
    aclshmem_info_get_version => same_version,
}

/// The process-wide SHMEM table resolved to this runtime (instance 0, the exported C names), built once.
pub fn shmem_api() -> &'static ShmemApi {
    shmem_api_instance(0).unwrap_or_else(|| unreachable!("instance 0 exists"))
}

/// The SHMEM table of instance `instance` of the library (one per device of a process: see [`SHMEM_INSTANCES`]),
/// built once; `None` past the last instance.
pub fn shmem_api_instance(instance: usize) -> Option<&'static ShmemApi> {
    static APIS: [OnceLock<ShmemApi>; SHMEM_INSTANCES] = [const { OnceLock::new() }; SHMEM_INSTANCES];
    let slot = APIS.get(instance)?;
    Some(slot.get_or_init(|| {
        let resolve = |name: &str| resolve_shmem_instance(instance, name);
        // SAFETY: `resolve_shmem_instance` returns only functions of this module declared with the prototypes of
        // the table's fields of the same names, and for `g_state` the address of a process-wide static.
        match unsafe { ShmemApi::from_resolver(PathBuf::from(IN_PROCESS_SHMEM_PATH), &resolve) } {
            Ok(api) => api,
            Err(error) => panic!("cann-twin does not implement a required SHMEM symbol: {error}"),
        }
    }))
}
