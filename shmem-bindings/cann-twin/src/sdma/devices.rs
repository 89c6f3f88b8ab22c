//! The SDMA engines of each device: building and tearing down a device's channels (SHMEM's and the AI CPU's), the
//! registries that find a channel by device and index or by its register page, injected destination faults, and
//! the register writes that ring a doorbell (`register_write`, the exported `aiv_twin_register_write`).

use crossbeam_utils::CachePadded;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, RwLock};
use std::thread::JoinHandle;

use ascendcl_sys::sys::*;

use super::engine::{lock, Channel, Doorbell, Progress, State};
use super::layout::ChannelRecord;
use super::{
    RegisterAccess, RegisterFault, Syndrome, AICPU_CHANNELS, AICPU_CHANNEL_BASE, AICPU_SLOT_BYTES,
    CHANNEL_RECORDS_OFFSET, CHANNEL_RECORD_BYTES, DOORBELL_OFFSET, DOORBELL_WIDTH, SQE_BYTES, SQ_DEPTH,
    WORKSPACE_BYTES, WORKSPACE_FLAG_FILLED,
};
use crate::memory::{page, Segment};
use crate::provenance;
use crate::space::{perform_copy, space, with_space_mut};

/// The SDMA engines of one device.
#[derive(Debug)]
pub(crate) struct Engines {
    pub channels: Vec<Arc<Channel>>,
    threads: Vec<JoinHandle<()>>,
    /// Device allocations to free: the workspace and the rings.
    allocations: Vec<usize>,
    register_pages: Vec<usize>,
}

/// Engines by device.
static ENGINES: LazyLock<Mutex<HashMap<i32, Engines>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// The AI CPU's channels by device ([`aicpu_channels`]).
static AICPU_ENGINES: LazyLock<Mutex<HashMap<i32, Engines>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// Register pages by device address: the channel whose doorbell each holds.
static REGISTERS: LazyLock<RwLock<HashMap<u64, Arc<Channel>>>> = LazyLock::new(|| RwLock::new(HashMap::new()));
/// Bumped, under [`REGISTERS`]' write lock, by every change of it: a [`RegisterCache`] filled before is stale.
static REGISTERS_GENERATION: AtomicU64 = AtomicU64::new(0);

/// A register write to a page that is no SDMA channel's: `None` if the page is none of that engine's either.
pub(crate) type OtherRegisters = fn(u64, &[u8], u32) -> Option<Result<(), RegisterFault>>;

/// Where a register write goes when its page is no SDMA channel's: the other engine with register pages (the twin
/// NIC's QP doorbells), which registers it before it maps its first page ([`on_other_register_write`]).
static OTHER_REGISTERS: std::sync::OnceLock<OtherRegisters> = std::sync::OnceLock::new();

/// Registers where register writes to pages of no SDMA channel go (see [`OTHER_REGISTERS`]); the first one holds.
pub(crate) fn on_other_register_write(other: OtherRegisters) {
    let _ = OTHER_REGISTERS.set(other);
}

/// The register page an emulated core rang last, so that its doorbells (one page, thousands of times) skip the
/// registry: valid while [`REGISTERS_GENERATION`] has not moved.
#[derive(Debug, Default)]
pub(crate) struct RegisterCache(std::cell::RefCell<Option<(u64, Arc<Channel>, u64)>>);

/// The channel `(device, channel)`, if that device has engines: one of SHMEM's (index below [`MAX_CHANNELS`](super::MAX_CHANNELS)) or
/// one of the AI CPU's (index [`AICPU_CHANNEL_BASE`] and up).
pub(crate) fn find_channel(device: i32, channel: u32) -> Option<Arc<Channel>> {
    let of = |map: &Mutex<HashMap<i32, Engines>>| {
        lock(map)
            .get(&device)
            .and_then(|engines| engines.channels.iter().find(|candidate| candidate.index == channel).cloned())
    };
    if channel >= AICPU_CHANNEL_BASE {
        of(&AICPU_ENGINES)
    } else {
        lock(&ENGINES).get(&device).and_then(|engines| engines.channels.get(channel as usize).cloned())
    }
}

/// Every live channel of every device, SHMEM's and the AI CPU's (for the twin-only evidence counts,
/// [`crate::evidence`]).
pub(crate) fn all_channels() -> Vec<Arc<Channel>> {
    let mut all: Vec<Arc<Channel>> =
        lock(&ENGINES).values().flat_map(|engines| engines.channels.iter().cloned()).collect();
    all.extend(lock(&AICPU_ENGINES).values().flat_map(|engines| engines.channels.iter().cloned()));
    all
}

/// Writes `bytes` at `address` through the device view (the space read-locked).
pub(crate) fn write_device(address: u64, bytes: &[u8]) -> Result<(), aclError> {
    let guard = space();
    let space = guard.as_ref().ok_or(ACL_ERROR_RT_INTERNAL_ERROR)?;
    let to = space.translate(address as usize, bytes.len(), true)?;
    let from = [Segment { ptr: bytes.as_ptr().cast_mut(), len: bytes.len() }];
    // SAFETY: `to` was translated under the read lock held here; `from` is a live buffer only read.
    unsafe { perform_copy(&to, &from) };
    Ok(())
}

/// Where a group's channel records live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Records {
    /// SHMEM's SDMA workspace: the flag info, then one record per channel from [`CHANNEL_RECORDS_OFFSET`].
    Workspace,
    /// The AI CPU's block: per channel [`AICPU_SLOT_BYTES`], the record first, then its completion word and flag
    /// source ([`AICPU_COMPLETION_OFFSET`](super::AICPU_COMPLETION_OFFSET), [`AICPU_FLAG_SOURCE_OFFSET`](super::AICPU_FLAG_SOURCE_OFFSET)).
    AiCpu,
}

impl Records {
    fn block_bytes(self, count: u32) -> usize {
        match self {
            Records::Workspace => WORKSPACE_BYTES,
            Records::AiCpu => (count as usize * AICPU_SLOT_BYTES).max(page()),
        }
    }

    fn offset(self, n: u32) -> usize {
        match self {
            Records::Workspace => CHANNEL_RECORDS_OFFSET + n as usize * CHANNEL_RECORD_BYTES,
            Records::AiCpu => n as usize * AICPU_SLOT_BYTES,
        }
    }
}

/// Makes `count` channels of `depth` SQEs on `device`, numbered from `first`, with their records block, rings,
/// register pages and one engine thread each, registered for doorbells and watched by the provenance records.
fn build(device: i32, first: u32, count: u32, depth: u32, records: Records) -> Result<Engines, aclError> {
    let block_bytes = records.block_bytes(count);
    if records == Records::Workspace && CHANNEL_RECORDS_OFFSET + count as usize * CHANNEL_RECORD_BYTES > block_bytes {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    let ring_bytes = depth as usize * SQE_BYTES;
    let mut allocations = Vec::new();
    let mut register_pages = Vec::new();
    let made = with_space_mut(|space| {
        allocations.push(space.malloc(block_bytes, device)?);
        for _ in 0..count {
            allocations.push(space.malloc(ring_bytes, device)?);
            register_pages.push(space.take_register_page()?);
        }
        Ok(())
    });
    let undo = |allocations: &[usize], register_pages: &[usize]| {
        let _ = with_space_mut(|space| {
            allocations.iter().for_each(|&address| {
                let _ = space.free(address);
            });
            register_pages.iter().for_each(|&address| space.give_register_page(address));
            Ok(())
        });
    };
    if let Err(code) = made {
        undo(&allocations, &register_pages);
        return Err(code);
    }
    let base = allocations[0] as u64;
    let mut image = vec![0u8; block_bytes];
    if records == Records::Workspace {
        image[0..4].copy_from_slice(&WORKSPACE_FLAG_FILLED.to_le_bytes());
        image[4..8].copy_from_slice(&count.to_le_bytes());
    }
    let mut channels = Vec::new();
    for n in 0..count {
        let index = first + n;
        let record_at = records.offset(n);
        let record = ChannelRecord {
            sq_base: allocations[1 + n as usize] as u64,
            sq_reg_base: register_pages[n as usize] as u64,
            sq_depth: depth,
            sq_id: index,
            cq_id: index,
            logic_cq_id: index,
            stream_id: index,
            dev_id: device as u32,
            ..ChannelRecord::default()
        };
        image[record_at..record_at + CHANNEL_RECORD_BYTES].copy_from_slice(&record.to_bytes());
        channels.push(Arc::new(Channel {
            device,
            index,
            sq_id: index,
            record: base + record_at as u64,
            sq_base: record.sq_base,
            depth,
            reg_base: record.sq_reg_base,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            reset: Condvar::new(),
            interrupt: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            progress: CachePadded::new(Progress::default()),
            doorbell: CachePadded::new(Doorbell::default()),
            activity: crate::activity::Activity::of(device, index),
            provenance: Arc::new(provenance::ChannelProvenance::new(device, record.sq_base, depth)),
            busy: crate::occupancy::channel_counters(device, index),
        }));
    }
    let zero_ring = vec![0u8; ring_bytes];
    let written = write_device(base, &image)
        .and_then(|()| allocations[1..].iter().try_for_each(|&ring| write_device(ring as u64, &zero_ring)));
    if let Err(code) = written {
        undo(&allocations, &register_pages);
        return Err(code);
    }
    let mut threads = Vec::new();
    for channel in &channels {
        let engine = Arc::clone(channel);
        let spawned =
            std::thread::Builder::new().name(format!("cann-twin-sdma-d{device}c{}", channel.index)).spawn(move || {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.run()));
            });
        match spawned {
            Ok(handle) => threads.push(handle),
            Err(_) => {
                channels.iter().for_each(|channel| channel.shut_down());
                threads.into_iter().for_each(|handle: JoinHandle<()>| drop(handle.join()));
                undo(&allocations, &register_pages);
                return Err(ACL_ERROR_RT_NO_STREAM_RESOURCE);
            }
        }
    }
    {
        let mut registers = REGISTERS.write().unwrap_or_else(|p| p.into_inner());
        for channel in &channels {
            registers.insert(channel.reg_base, Arc::clone(channel));
        }
        REGISTERS_GENERATION.fetch_add(1, Ordering::AcqRel);
    }
    provenance::watch_channels(&channels.iter().map(|channel| Arc::clone(&channel.provenance)).collect::<Vec<_>>());
    Ok(Engines { channels, threads, allocations, register_pages })
}

/// Creates the SDMA workspace and `count` channels of `depth` SQEs on `device`, with one engine thread each;
/// returns the workspace's device address.
pub(crate) fn create(device: i32, count: u32, depth: u32) -> Result<u64, aclError> {
    let mut engines = lock(&ENGINES);
    if engines.contains_key(&device) {
        return Err(ACL_ERROR_RT_INTERNAL_ERROR);
    }
    let made = build(device, 0, count, depth, Records::Workspace)?;
    let workspace = made.allocations[0] as u64;
    engines.insert(device, made);
    Ok(workspace)
}

/// The AI CPU's channels on `device` ([`AICPU_CHANNELS`] of [`SQ_DEPTH`] SQEs, numbered from
/// [`AICPU_CHANNEL_BASE`]), created on first use: an RTSQ per AI-CPU thread, separate from SHMEM's channels and with
/// no record in SHMEM's workspace. Each channel's record lies in a block of its own, followed by the channel's
/// completion word and flag source. Destroyed with the device's last `aclrtResetDevice` ([`destroy_aicpu`]).
pub(crate) fn aicpu_channels(device: i32) -> Result<Vec<Arc<Channel>>, aclError> {
    let mut engines = lock(&AICPU_ENGINES);
    if let Some(made) = engines.get(&device) {
        return Ok(made.channels.clone());
    }
    let made = build(device, AICPU_CHANNEL_BASE, AICPU_CHANNELS, SQ_DEPTH, Records::AiCpu)?;
    let channels = made.channels.clone();
    engines.insert(device, made);
    Ok(channels)
}

/// Stops and joins the engines of a group, then frees its records block, rings and register pages. Memory already
/// freed is skipped.
fn tear_down(engines: Engines) {
    // Its SDMA channels only: the device's NIC QPs keep their watches until they are destroyed.
    let channels: Vec<_> = engines.channels.iter().map(|channel| Arc::clone(&channel.provenance)).collect();
    provenance::unwatch_channels(&channels);
    {
        let mut registers = REGISTERS.write().unwrap_or_else(|p| p.into_inner());
        for channel in &engines.channels {
            registers.remove(&channel.reg_base);
        }
        REGISTERS_GENERATION.fetch_add(1, Ordering::AcqRel);
    }
    engines.channels.iter().for_each(|channel| channel.shut_down());
    for handle in engines.threads {
        let _ = handle.join();
    }
    let _ = with_space_mut(|space| {
        engines.allocations.iter().for_each(|&address| {
            let _ = space.free(address);
        });
        engines.register_pages.iter().for_each(|&address| space.give_register_page(address));
        Ok(())
    });
}

/// Stops and joins `device`'s engines, then frees its workspace, rings and register pages. Memory the device's
/// last `aclrtResetDevice` already freed is skipped.
pub(crate) fn destroy(device: i32) {
    let Some(engines) = lock(&ENGINES).remove(&device) else { return };
    tear_down(engines);
}

/// Stops and joins the AI CPU's channels of `device` and frees their memory (the device's last `aclrtResetDevice`,
/// before the device's memory goes, or `aclFinalize`); the next AI-CPU task on the device makes new ones.
pub(crate) fn destroy_aicpu(device: i32) {
    let Some(engines) = lock(&AICPU_ENGINES).remove(&device) else { return };
    tear_down(engines);
}

/// A write of `bytes` by the device (an AIV core's `copy_ubuf_to_gm` whose destination is a register page) to
/// device address `device_va`. The doorbell accepts exactly a 4-byte little-endian write at offset 0x8 of its page:
/// it sets the SQ tail and wakes the engine. Any other width or offset writes nothing, raises a
/// [`Syndrome::REGISTER_ACCESS`] exception on the page's channel (which stops it until reset) and returns
/// [`RegisterFault::Refused`]; an address in no register page returns [`RegisterFault::NotARegister`].
///
/// The twin cannot tell who calls this (a CPU AscendC layer of its own): the doorbell's origin is recorded as
/// unknown ([`crate::control::Provenance::doorbells_unknown`]).
pub fn register_write(device_va: u64, bytes: &[u8]) -> Result<(), RegisterFault> {
    register_write_through(&RegisterCache::default(), device_va, bytes, provenance::WRITER_OTHER)
}

/// [`register_write`] by the AI CPU: the path of an AI-CPU kernel's doorbell (an SDMA channel's tail, a twin NIC QP's
/// SQ doorbell), recorded with the AI CPU as its origin ([`crate::control::Provenance::doorbells_by_aicpu`]).
pub(crate) fn aicpu_register_write(device_va: u64, bytes: &[u8]) -> Result<(), RegisterFault> {
    register_write_through(&RegisterCache::default(), device_va, bytes, provenance::WRITER_AICPU)
}

/// [`register_write`] through a core's [`RegisterCache`], by `origin` (a `provenance::WRITER_*` id: the ringing
/// core's block, or the AI CPU).
pub(crate) fn register_write_through(
    cache: &RegisterCache,
    device_va: u64,
    bytes: &[u8],
    origin: u32,
) -> Result<(), RegisterFault> {
    let page = page() as u64;
    let base = device_va - device_va % page;
    // Read before the registry: a change after this read moves the generation, so what is cached under it is
    // looked up again next time.
    let generation = REGISTERS_GENERATION.load(Ordering::Acquire);
    let hit = matches!(&*cache.0.borrow(), Some((cached, _, cached_generation)) if *cached == base && *cached_generation == generation);
    if !hit {
        let found = REGISTERS.read().unwrap_or_else(|p| p.into_inner()).get(&base).cloned();
        let Some(channel) = found else {
            // Not an SDMA page: perhaps a twin NIC QP's doorbell page (never cached here).
            return OTHER_REGISTERS
                .get()
                .and_then(|other| other(device_va, bytes, origin))
                .unwrap_or(Err(RegisterFault::NotARegister { va: device_va }));
        };
        *cache.0.borrow_mut() = Some((base, channel, generation));
    }
    let cached = cache.0.borrow();
    let Some((_, channel, _)) = &*cached else { return Err(RegisterFault::NotARegister { va: device_va }) };
    let offset = device_va - base;
    if offset != DOORBELL_OFFSET || bytes.len() != DOORBELL_WIDTH {
        let width = bytes.len();
        let tail = channel.doorbell.tail.load(Ordering::SeqCst);
        let head = channel.progress.head.load(Ordering::Relaxed);
        let mut exception = channel.exception_at(head, tail, Syndrome::REGISTER_ACCESS, [0; SQE_BYTES]);
        exception.register = Some(RegisterAccess { offset, width });
        channel.raise(exception);
        return Err(RegisterFault::Refused { device: channel.device, channel: channel.index, offset, width });
    }
    let tail = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if origin >= provenance::WRITER_BLOCK0 && channel.doorbell.divert.load(Ordering::Acquire) {
        // The test-only mis-wiring: the core's write is parked, not rung.
        let count = (channel.doorbell.diverted.load(Ordering::Acquire) >> 32) + 1;
        channel.doorbell.diverted.store((count << 32) | u64::from(tail), Ordering::Release);
        return Ok(());
    }
    channel.ring(tail, origin);
    Ok(())
}

/// [`register_write`] for C (the CPU AscendC layer's `copy_ubuf_to_gm` to a register page): 0 when accepted, -1
/// when `va` is in no register page, -2 when refused (the channel raised a register-access exception), -3 when
/// `src` is null with `len > 0`.
///
/// # Safety
///
/// `src` is null or valid for reading `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn aiv_twin_register_write(va: u64, src: *const u8, len: u32) -> i32 {
    if src.is_null() && len > 0 {
        return -3;
    }
    let bytes = if len == 0 {
        &[][..]
    } else {
        // SAFETY: non-null and valid for `len` bytes (the caller's contract).
        unsafe { std::slice::from_raw_parts(src, len as usize) }
    };
    match std::panic::catch_unwind(|| register_write(va, bytes)) {
        Ok(Ok(())) => 0,
        Ok(Err(RegisterFault::NotARegister { .. })) => -1,
        Ok(Err(RegisterFault::Refused { .. } | RegisterFault::QpRefused { .. })) => -2,
        Err(_) => -3,
    }
}
