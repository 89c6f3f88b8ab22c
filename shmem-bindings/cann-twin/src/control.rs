//! Fault injection and observation for tests: an explicit control API. Nothing here is part of the CANN interface,
//! and nothing in the model calls it; a test reaches the device only through it or through the C ABI.
//!
//! Channels are named by `(device, channel)`: the device whose SHMEM initialisation created the SDMA engines and
//! the channel's index in the workspace (0 to [`crate::sdma::MAX_CHANNELS`] - 1).

pub use crate::occupancy::StreamOccupancy;
pub use crate::occupancy::{AiCpuOccupancy, ChannelOccupancy, CoreOccupancy, DeviceOccupancy};
pub use crate::provenance::{Doer, FlagReader, LoggedSqe, Provenance, Ringers, LOG_CAPACITY};
pub use crate::sdma::{ChannelException, RegisterAccess, Syndrome};

/// Why a control request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlError {
    /// No engines on that device (SHMEM not initialised with SDMA there), or no such channel.
    NoSuchChannel { device: i32, channel: u32 },
    /// The engine did not complete a reset in time (it is in a copy of at most 1 MiB, or wedged).
    Timeout { device: i32, channel: u32, waited: std::time::Duration },
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlError::NoSuchChannel { device, channel } => {
                write!(f, "device {device} has no SDMA channel {channel}")
            }
            ControlError::Timeout { device, channel, waited } => {
                write!(f, "device {device} channel {channel}: the reset was not done after {waited:?}")
            }
        }
    }
}

impl std::error::Error for ControlError {}

fn channel(device: i32, channel: u32) -> Result<std::sync::Arc<crate::sdma::Channel>, ControlError> {
    crate::sdma::find_channel(device, channel).ok_or(ControlError::NoSuchChannel { device, channel })
}

/// The exception that stopped the channel, if it is stopped.
pub fn channel_exception(device: i32, index: u32) -> Result<Option<ChannelException>, ControlError> {
    Ok(channel(device, index)?.exception())
}

/// Stalls (`true`) or releases the channel's engine. A stalled engine finishes the SQE it is executing, then executes
/// nothing (doorbells still set the tail and are counted) until released; resets and shutdown still work.
pub fn set_stalled(device: i32, index: u32, stalled: bool) -> Result<(), ControlError> {
    channel(device, index)?.set_stalled(stalled);
    Ok(())
}

/// Resets the channel: drops every pending SQE (head := the doorbell's tail, published in the record) and clears
/// the exception. Waits for the engine at most [`crate::sdma::RESET_WAIT`]. A stall stays as it was.
pub fn reset_channel(device: i32, index: u32) -> Result<(), ControlError> {
    channel(device, index)?.reset().map_err(|waited| ControlError::Timeout { device, channel: index, waited })
}

/// SQEs the channel has executed (copied) since its creation.
pub fn sqes_executed(device: i32, index: u32) -> Result<u64, ControlError> {
    Ok(channel(device, index)?.progress.executed.load(std::sync::atomic::Ordering::Relaxed))
}

/// The occupancy of `device`'s emulated AIV cores and SDMA channel engines, cumulative since the device's counters
/// were created (its first block, SDMA engine or occupancy snapshot in this process): per block index, nanoseconds
/// executing and polling (summed over every launch that ran the block; running blocks count up to now); per SDMA
/// channel, nanoseconds busy, runs and SQEs. Diff two snapshots for an interval (`taken_at_ns` gives its wall time).
///
/// Polling is a run of the model's idle hints (the core re-read unchanged memory 16 times in a row, and on), from the
/// first hint to the end of the last; executing is the rest of the block's time; busy is an engine's time from
/// taking a tail after a doorbell to the end of that run. The figures are a CPU model's (docs/occupancy.md); a
/// device never seen is reported empty (and its counters start now).
pub fn occupancy(device: i32) -> DeviceOccupancy {
    crate::occupancy::snapshot(device)
}

/// Doorbell writes the channel accepted since its creation (refused register writes are not counted).
pub fn doorbells_rung(device: i32, index: u32) -> Result<u64, ControlError> {
    Ok(channel(device, index)?.doorbell.count.load(std::sync::atomic::Ordering::Relaxed))
}

/// Holds every stream's worker before its next task (`true`) or lets them go on (`false`): tasks queued meanwhile
/// stay queued, so a test can change what they will find (free their memory, say) before they run.
pub fn hold_streams(held: bool) {
    crate::stream::hold_all(held);
}

/// Every fault the emulated AIV cores raised in this process, oldest first (the last 1024): the device, the block,
/// the kind (`AIV_CPU_FAULT_*`), the address and length.
pub fn kernel_faults() -> Vec<crate::kernel::KernelFault> {
    crate::kernel::faults()
}

/// The next `count` SQEs the SDMA engines of `device` execute, or stream copies of the device, fail as if their
/// destination range did not translate (an SQE: syndrome 0x14, the channel stops until reset; a stream copy: the
/// stream reports `ACL_ERROR_RT_PARAM_INVALID` at its synchronisation): a device-side fault for tests, as a bad
/// address from a buggy relocation would be.
pub fn fail_next_destinations(device: i32, count: u32) {
    crate::sdma::inject_destination_faults(device, count);
}

/// Holds (`true`) or releases the stream workers of `device` only, as [`hold_streams`] does for every stream: a
/// stalled copy engine, whose queued copies wait and whose synchronisations time out.
pub fn hold_device_streams(device: i32, held: bool) {
    crate::stream::hold_device(device, held);
}

/// Stalls (`true`) or releases the HiXL server listening at `address` (`"ip:port"`, as its endpoint names it): each
/// request it receives on the wire path waits unanswered until the release, so clients see their own deadlines pass,
/// as with a stalled NPU. The device path's batches never reach the server (its memory is imported): stall the
/// client's AI CPU for them ([`set_aicpu_stalled`]). `false` if `address` is not an `ip:port`.
pub fn stall_hixl_server(address: &str, stalled: bool) -> bool {
    match address.parse::<std::net::SocketAddr>() {
        Ok(address) => {
            crate::hixl::set_stalled(address, stalled);
            true
        }
        Err(_) => false,
    }
}

/// Stalls (`true`) or releases the AI CPU's SDMA channels of `device` (made now if the device's AI CPU has none
/// yet): their engines execute nothing (doorbells still set the tail), so an AI-CPU task waits for its completion word
/// until released, its deadline, or its batch's link is revoked. The AI CPU's channels are `AICPU_CHANNEL_BASE +
/// n` (`sdma::AICPU_CHANNEL_BASE`); [`set_stalled`] reaches one of them. Channels made anew after the device's reset
/// are not stalled.
pub fn set_aicpu_stalled(device: i32, stalled: bool) -> Result<(), ControlError> {
    let channels = crate::sdma::aicpu_channels(device)
        .map_err(|_| ControlError::NoSuchChannel { device, channel: crate::sdma::AICPU_CHANNEL_BASE })?;
    channels.iter().for_each(|channel| channel.set_stalled(stalled));
    Ok(())
}

/// The AI CPU's SDMA channels of `device` that exist now (indices from `sdma::AICPU_CHANNEL_BASE`), for the
/// provenance records ([`provenance`], [`sqe_log`]): empty before the device's first AI-CPU task.
pub fn aicpu_channels(device: i32) -> Vec<u32> {
    (crate::sdma::AICPU_CHANNEL_BASE..crate::sdma::AICPU_CHANNEL_BASE + crate::sdma::AICPU_CHANNELS)
        .filter(|&index| crate::sdma::find_channel(device, index).is_some())
        .collect()
}

/// **Test-only, deliberately mis-wired**: while `on`, the twin's HiXL clients on `device` move every batch over the
/// wire path, with Host runtime copies on both sides, instead of the AI CPU's SDMA channels they use for device
/// memory: the records then name the Host. Nothing in the model, the CANN interface or any configuration reaches it.
pub fn hixl_host_copies(device: i32, on: bool) {
    crate::hixl::set_host_copies(device, on);
}

/// **Test-only, deliberately mis-wired**: while `on`, the twin's FabricMem engines with AI-CPU unfold on `device`
/// move every batch with synchronous Host runtime copies instead of AI-CPU launches: their records then name the
/// Host. Nothing in the model, the CANN interface or any configuration reaches it.
pub fn fabric_mem_host_copies(device: i32, on: bool) {
    crate::hixl::fabric_mem::set_host_copies(device, on);
}

/// Withholds (`true`) or grants again an export of this process (its `u64` shareable handle): while withheld, every
/// import of it, from this process or another, is answered as one of an unknown handle (`ACL_ERROR_RT_INVALID_HANDLE`)
/// as if the exporter's memory were gone; mappings already made keep working. A fault for tests of peer loss and
/// recovery.
pub fn withhold_export(shareable: u64, withheld: bool) {
    crate::vmm_share::set_withheld(shareable, withheld);
}

/// Turns the provenance records on or off for the whole process (off by default: they cost the post path, see
/// docs/twin-runtime.md, "Provenance records"). Turn them on before the SQEs to be attributed are written: turning
/// them on when they were off forgets who wrote each SQ slot, so a slot not written since is attributed to nobody
/// (`sqes_unknown`), and so is a doorbell rung while they were off.
pub fn record_provenance(on: bool) {
    crate::provenance::set_recording(on);
}

/// Whether the provenance records are on ([`record_provenance`]).
pub fn provenance_recorded() -> bool {
    crate::provenance::recording()
}

/// The provenance records of channel `(device, index)` since its creation or its last [`reset_provenance`]: who
/// wrote each SQE its engine executed, who rang each doorbell it accepted, and who first read each completion flag
/// it landed, each recorded where the act happened (docs/twin-runtime.md, "Provenance records"):
///
/// - `sqes_by_block` / `sqes_by_host` / `sqes_by_aicpu` / `sqes_unknown`: per executed SQE, the last writer of its
///   64-byte slot, as marked by the write itself (an emulated core's DMA landing or cache-line write-back; a write
///   through the device address space by a Host thread or an AI-CPU thread: a runtime copy, a memset, any other Host
///   path of the twin). Unknown: the slot was not written since the channel was created (or its records were reset,
///   or turned on), or an SDMA engine's copy wrote it, or two writers each wrote part of it.
/// - `doorbells_by_block` / `doorbells_by_host` / `doorbells_by_aicpu` / `doorbells_unknown`: per accepted doorbell
///   write, the ringing core's block, the Host's test-only [`host_ring_doorbell`], the AI CPU's register path, or
///   [`crate::register_write`] (caller unknown).
/// - `flags_landed` / `flags_seen_by_core` / `flags_seen_by_host` / `flags_seen_by_aicpu` / `flags_unseen`: per 8-byte
///   flag copy the engine executed, whether the first read that covered the word and returned the landed value was a
///   core's (line fill or GM -> UB DMA), a Host thread's or an AI-CPU thread's (a runtime copy into Host memory), or
///   none (overwritten by a later flag first, still unread, or more than four pending on the channel).
pub fn provenance(device: i32, index: u32) -> Result<Provenance, ControlError> {
    Ok(channel(device, index)?.provenance.snapshot())
}

/// Zeroes the channel's provenance tallies, forgets its pending flags (they count as neither seen nor unseen) and
/// forgets who wrote each SQ slot: a slot written before the reset and not written again before the engine executes
/// it is attributed to nobody (`sqes_unknown`).
pub fn reset_provenance(device: i32, index: u32) -> Result<(), ControlError> {
    channel(device, index)?.provenance.reset();
    Ok(())
}

/// **Test-only, deliberately mis-wired**: the Host rings channel `(device, index)`'s doorbell with `tail`, as no
/// Host can on this runtime (the register page is not Host memory). It exists so that a test can show the doorbell
/// tally turn to the Host; nothing in the model, the CANN interface or any configuration reaches it. The write is
/// accepted as a core's would be (a tail outside the ring stops the channel, as then).
pub fn host_ring_doorbell(device: i32, index: u32, tail: u32) -> Result<(), ControlError> {
    channel(device, index)?.ring(tail, crate::provenance::WRITER_HOST);
    Ok(())
}

/// **Test-only**: the AI CPU rings channel `(device, index)`'s doorbell with `tail`, through the register path an
/// AI-CPU kernel's doorbell takes (the channel's register page, as a core's write): tallied as the AI CPU's
/// ([`Provenance::doorbells_by_aicpu`]). It stands in for the twin's AI-CPU emulation in tests of the records. A tail
/// outside the ring stops the channel, as a core's would.
pub fn aicpu_ring_doorbell(device: i32, index: u32, tail: u32) -> Result<(), ControlError> {
    let register = channel(device, index)?.reg_base + crate::sdma::DOORBELL_OFFSET;
    crate::sdma::aicpu_register_write(register, &tail.to_le_bytes())
        .map_err(|_| ControlError::NoSuchChannel { device, channel: index })
}

/// **Test-only**: marks the calling thread as the AI CPU's, for good: its writes through the device address space
/// (runtime copies and memsets into device memory, also when a stream runs them) are the AI CPU's
/// ([`Provenance::sqes_by_aicpu`]), never the Host's, and so are the completion flags and CQEs its runtime copies
/// read first ([`Provenance::flags_seen_by_aicpu`]). It stands in for the twin's AI-CPU emulation in tests of the
/// records; call it on a thread of the test's own.
pub fn mark_aicpu_thread() {
    crate::provenance::mark_aicpu_thread();
}

/// **Test-only, deliberately mis-wired**: while `diverted`, an emulated core's accepted doorbell write to channel
/// `(device, index)` does not reach the register (it is neither rung nor counted); its tail is parked for
/// [`diverted_doorbell`], so that a test can forward it with [`host_ring_doorbell`]: SQEs a core wrote, rung by the
/// Host. Nothing in the model or any configuration reaches it.
pub fn divert_core_doorbells(device: i32, index: u32, diverted: bool) -> Result<(), ControlError> {
    channel(device, index)?.doorbell.divert.store(diverted, std::sync::atomic::Ordering::Release);
    Ok(())
}

/// The doorbell writes diverted so far on the channel and the last diverted tail ([`divert_core_doorbells`]).
pub fn diverted_doorbell(device: i32, index: u32) -> Result<(u32, u32), ControlError> {
    let parked = channel(device, index)?.doorbell.diverted.load(std::sync::atomic::Ordering::Acquire);
    Ok(((parked >> 32) as u32, parked as u32))
}

/// **Test-only**: holds (`true`) or releases the emulated cores of `device` that poll: a core that reaches an idle
/// hint (it re-read unchanged memory 16 times in a row) while its device is held parks there, reading nothing,
/// until the release (or 10 s). A test can so let the Host act on device memory before a polling kernel looks.
pub fn hold_cores(device: i32, held: bool) {
    crate::kernel::hold_cores(device, held);
}

/// The blocks of `device` parked by [`hold_cores`] now.
pub fn parked_cores(device: i32) -> Vec<u32> {
    crate::kernel::parked_cores(device)
}

/// The channel's submission queue as its engine sees it: the SQ's device address, its depth in SQEs, the engine's
/// head (the next slot it executes) and the doorbell's tail. Slots `head..tail` (mod depth) are rung and not yet
/// executed (while the engine is stalled, they stay so). For tests that act on pending SQEs.
pub fn sq_window(device: i32, index: u32) -> Result<SqWindow, ControlError> {
    let channel = channel(device, index)?;
    Ok(SqWindow {
        sq_base: channel.sq_base,
        depth: channel.depth,
        head: channel.progress.head.load(std::sync::atomic::Ordering::Acquire),
        tail: channel.doorbell.tail.load(std::sync::atomic::Ordering::Acquire),
    })
}

/// What [`sq_window`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqWindow {
    /// Device address of slot 0.
    pub sq_base: u64,
    /// Slots in the ring.
    pub depth: u32,
    /// The next slot the engine executes.
    pub head: u32,
    /// The doorbell register's tail.
    pub tail: u32,
}

/// The consumption log of channel `(device, index)`: every SQE its engine executed while the provenance records were
/// on, in execution order, each with its writer, the ringers of the doorbell that exposed it (every accepted
/// doorbell write since the engine's previous take of the tail), that doorbell's count,
/// and for a flag SQE who read the flag first ([`LoggedSqe`]). Appends to `out` the entries from log position `from`
/// on that are still kept (the log keeps the last [`LOG_CAPACITY`]); returns the position of the first entry
/// appended (greater than `from` when older ones were lost) and the position after the last. A flag's reader is
/// looked up when the entry is read: `Unread` then may still turn into a read later.
pub fn sqe_log(device: i32, index: u32, from: u64, out: &mut Vec<LoggedSqe>) -> Result<(u64, u64), ControlError> {
    Ok(channel(device, index)?.provenance.read_log(from, out))
}

/// The channel's consumption log position: where the next SQE executed with the records on is logged.
pub fn sqe_log_position(device: i32, index: u32) -> Result<u64, ControlError> {
    Ok(channel(device, index)?.provenance.log_position())
}

/// Device addresses of the completion flags channel `(device, index)` landed that no read has claimed yet.
pub fn pending_flags(device: i32, index: u32) -> Result<Vec<u64>, ControlError> {
    Ok(channel(device, index)?.provenance.pending_flags())
}

pub use crate::occupancy::{EngineRun, ENGINE_RUN_CAPACITY};

/// Turns the record of `device`'s SDMA engine runs on or off (off by default). While no device records, an engine
/// pays one relaxed atomic load per run.
pub fn record_engine_runs(device: i32, on: bool) {
    crate::occupancy::record_engine_runs(device, on);
}

/// `device`'s engine runs recorded since the last call for it (in the order they ended), and how many were dropped
/// because [`ENGINE_RUN_CAPACITY`] was reached; other devices' runs are kept for their own calls.
pub fn take_engine_runs(device: i32) -> (Vec<EngineRun>, u64) {
    crate::occupancy::take_engine_runs(device)
}

/// The twin's monotonic clock in nanoseconds: the clock of [`EngineRun`]s; the cores' system counter
/// (`GetSystemCycle`) is this clock divided by 20 (50 MHz, `kernel::SYSTEM_COUNTER_HZ`).
pub fn clock_ns() -> u64 {
    crate::occupancy::monotonic_ns()
}

/// Drops (`true`) or restores the link of `device`'s twin NIC ([`crate::nic::set_link_down`]): while down it
/// answers nothing and sends nothing, as with `ip link down`.
pub fn nic_link_down(device: i32, down: bool) -> Result<(), crate::nic::NicError> {
    crate::nic::set_link_down(device, down)
}

/// The counters of `device`'s twin NIC: QPs created, WQEs executed, CQEs written, retransmissions, requests served
/// and refused as target ([`crate::nic::counters`]).
pub fn nic_counters(device: i32) -> Result<crate::nic::NicCounters, crate::nic::NicError> {
    crate::nic::counters(device)
}

/// The progress count of the device-internal activity record of `block` of `device`: what an SDMA channel's engine
/// and a twin NIC QP's engine (its `wake_block`) bump so that the emulated core of that block stops napping in a
/// poll. It only grows; 0 until the first signal.
pub fn core_activity(device: i32, block: u32) -> u64 {
    crate::activity::Activity::of(device, block).progress()
}
