//! The `aiv` transport: the Host side of AIV direct-drive.
//!
//! Data path of one transfer: the engine's validated [`Transfer`] -> this transport translates both addresses into
//! the executing device's view (a peer's HBM through an imported window) -> one [`RequestEntry`] in the request ring
//! of a block (requests are spread round-robin over blocks) -> the transfer kernel on that AIV block builds the SDMA
//! SQEs, rings the doorbell and watches the completion flag -> one [`DcqEntry`] in the block's device completion queue
//! -> the Host collects the entry and sets the task's status and evidence: the thread waiting for the batch does
//! it itself ([`CompletionPoller`]), else the drain thread here.
//!
//! Owns: the rings, control blocks and kernel arguments of its device, the drain thread and the recovery after a
//! failed group (read the channel's exception, reset the channel, resume the block). It must not touch engine state
//! other than the task slots of the transfers it accepted.
//!
//! Nothing hangs: the kernel gives up a completion wait after `kernel_wait_budget` (DCQ status TIMEOUT) or when the
//! abort flag changes ([`AivTransport::abort`]); the engine's watchdog turns any slot still pending at its deadline
//! into TIMEOUT; every wait of the drain thread and of shutdown is bounded.
//!
//! Peer loss (docs/ARCHITECTURE.md, "aiv between processes"): a probe thread calls [`PeerWindows::probe_all`], which
//! asks every imported peer's device whether it still serves its memory ([`DeviceBackend::probe_peer`], every
//! `peer_probe_interval_ms`, default 50 ms). A peer found gone is marked lost there: this transport fails its pending
//! transfers at once, and new ones (on every path of the device, the windows being shared) fail until the segment is
//! refreshed or reopened. On the twin a dead exporter's pages stay mapped here, so without this check transfers to it
//! would "complete" into orphaned memory; a real NPU would see a link or HBM error instead.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use super::window::{Peer, PeerWindows, Resolved};
use super::Transport;
use crate::config::{AivOptions, LaunchMode};
use crate::cpu_time::{thread_cpu_time_ns, CpuCarry, Section};
use crate::device::{DeviceBackend, DeviceError, Launch, SharedMemory};
use crate::evidence::{Actor, TransferEvidence};
use crate::queue::ring::{atomic_word, load_peer, publish};
use crate::queue::{
    BlockArgs, ControlBlock, DcqEntry, DcqStatus, KernelArgs, RequestEntry, RingHeader, SpscIndex, Syndrome,
    GROUP_MAX_TRANSFERS, LAUNCH_PERSISTENT, LAUNCH_PER_BATCH, LAYOUT_VERSION, REQUEST_OPCODE_READ,
    REQUEST_OPCODE_WRITE, RING_HEADER_BYTES, SDMA_MAX_SQE_BYTES,
};
use crate::transfer::{CompletionPoller, Opcode, TaskSlot, Transfer, TransferState};

/// Counters of the transport as a whole (not per transfer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AivCounters {
    /// Kernel launches (per-batch mode: one per submit; plus the persistent launch and relaunches after recovery).
    pub launches: u64,
    /// Channel resets after a failed group.
    pub channel_resets: u64,
    /// DCQ entries drained.
    pub completions: u64,
}

/// How long the drain thread leaves completions to waiting threads after the last one stopped waiting; it checks the
/// DCQs every such interval meanwhile (a safety net for transfers nobody waits for).
const DRAIN_BACKOFF: Duration = Duration::from_millis(2);

/// The longest nap of the drain thread while threads keep waiting: its naps double from [`DRAIN_BACKOFF`] up to this
/// while every look finds waiters and nothing to drain (each wake-up is Host CPU charged to aiv). Completions of
/// transfers that nobody waits for or polls are collected at most this long after the last waiter left.
const DRAIN_BACKOFF_MAX: Duration = Duration::from_millis(16);

/// The aiv transport.
#[derive(Debug)]
pub struct AivTransport {
    inner: Arc<Inner>,
    drain_thread: Mutex<Option<JoinHandle<()>>>,
    probe_thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Inner {
    device: Arc<dyn DeviceBackend>,
    launch_mode: LaunchMode,
    blocks: Vec<HostBlock>,
    kernel_args: SharedMemory,
    /// Turns among the non-home blocks for submits whose home block is busy.
    next_block: AtomicUsize,
    /// The next submitting thread's home block (see `home_block`).
    next_home: AtomicUsize,
    next_transfer_id: AtomicU64,
    stop: AtomicBool,
    launches_in_flight: Mutex<Vec<Arc<dyn Launch>>>,
    launches: AtomicU64,
    channel_resets: AtomicU64,
    /// Peer segments' imported windows and lost state (shared with the baselines of the device).
    windows: Arc<PeerWindows>,
    /// Wakes the peer probe thread and a napping drain thread early (at shutdown).
    shutdown_wake: (Mutex<()>, std::sync::Condvar),
    probe_interval: Duration,
    /// Host CPU spent on completion collection that drained nothing yet (idle checks, wake-ups of the drain thread):
    /// charged to the next transfers drained, by whichever thread drains them.
    unattributed_cpu: CpuCarry,
    /// Threads waiting through the [`CompletionPoller`].
    attached_waiters: AtomicU32,
    /// When the last of them detached.
    last_detach: Mutex<Option<Instant>>,
}

#[derive(Debug)]
struct HostBlock {
    index: u32,
    requests: SharedMemory,
    dcq: SharedMemory,
    control: SharedMemory,
    ring: SpscIndex,
    producer: Mutex<Producer>,
    inflight: Mutex<InFlightTable>,
    /// DCQ entries drained so far (free-running); requests in flight = producer tail - drained.
    drained: AtomicU32,
    /// DCQ entries drained so far (the block's share of [`AivCounters::completions`]).
    completions: AtomicU64,
    /// Held while one thread drains this block's DCQ (the drain thread or a waiting thread).
    drain_lock: Mutex<DrainScratch>,
}

/// The transfers in flight on one block, by request-ring slot. The kernel completes a block's requests in ring order
/// (DCQ position p belongs to request position p), so a completion finds its transfer without a search; the
/// transfer id in the DCQ entry confirms it.
#[derive(Debug)]
struct InFlightTable {
    slots: Vec<Option<(u64, InFlight)>>,
}

impl InFlightTable {
    fn new(depth: usize) -> Self {
        InFlightTable { slots: (0..depth).map(|_| None).collect() }
    }

    fn insert(&mut self, slot: usize, transfer_id: u64, inflight: InFlight) {
        if let Some((stale, _)) = self.slots[slot].replace((transfer_id, inflight)) {
            // Cannot happen while the ring's flow control holds (a slot is reused only after its entry drained).
            tracing::error!(slot, stale, transfer_id, "request-ring slot reused while its transfer was in flight");
        }
    }

    /// The transfer `transfer_id`, expected in `slot`; searched for if a completion ever arrives out of order.
    fn take(&mut self, slot: usize, transfer_id: u64) -> Option<InFlight> {
        let position = if self.slots[slot].as_ref().is_some_and(|(id, _)| *id == transfer_id) {
            slot
        } else {
            self.slots.iter().position(|entry| entry.as_ref().is_some_and(|(id, _)| *id == transfer_id))?
        };
        self.slots[position].take().map(|(_, inflight)| inflight)
    }

    fn iter(&self) -> impl Iterator<Item = &InFlight> {
        self.slots.iter().filter_map(|entry| entry.as_ref().map(|(_, inflight)| inflight))
    }

    fn drain(&mut self) -> impl Iterator<Item = InFlight> + '_ {
        self.slots.iter_mut().filter_map(|entry| entry.take().map(|(_, inflight)| inflight))
    }
}

/// The calling thread's home block (before taking it modulo the block count): assigned round-robin from `next` the
/// first time the thread submits, then kept. Per thread, not per transport: with several aiv transports in one
/// process a thread has the same index on each.
fn home_block(next: &AtomicUsize) -> usize {
    std::thread_local! {
        static HOME: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    }
    HOME.with(|home| match home.get() {
        Some(block) => block,
        None => {
            let block = next.fetch_add(1, Ordering::Relaxed);
            home.set(Some(block));
            block
        }
    })
}

/// A task's completion ticket: its block and request-ring position (free-running), never 0.
fn encode_ticket(block: u32, position: u32) -> u64 {
    ((u64::from(block) + 1) << 32) | u64::from(position)
}

/// The block and ring position of a ticket of [`encode_ticket`].
fn decode_ticket(ticket: u64) -> Option<(u32, u32)> {
    let block = u32::try_from(ticket >> 32).ok()?.checked_sub(1)?;
    Some((block, ticket as u32))
}

/// Buffers one drain pass of a block uses, kept between passes (a pass allocates nothing once they have grown).
#[derive(Debug, Default)]
struct DrainScratch {
    entries: Vec<DcqEntry>,
    /// Index into `entries`, and the transfer it completes.
    finished: Vec<(usize, InFlight)>,
}

#[derive(Debug, Default)]
struct Producer {
    tail: u32,
    backlog: VecDeque<(RequestEntry, InFlight)>,
}

#[derive(Debug)]
struct InFlight {
    slot: Arc<TaskSlot>,
    /// The [`Peer::id`] of the peer the transfer reaches, if not this device's own memory.
    peer: Option<u64>,
    length: u64,
    host_device_api_calls: u64,
}

impl HostBlock {
    fn header(memory: &SharedMemory) -> *mut RingHeader {
        memory.host_ptr().cast()
    }
    fn request_tail(&self) -> &AtomicU32 {
        // SAFETY: the ring header is at the start of a page-aligned shared mapping owned by this block; the kernel
        // accesses the word only atomically.
        unsafe { atomic_word(std::ptr::addr_of_mut!((*Self::header(&self.requests)).tail)) }
    }
    fn request_head(&self) -> &AtomicU32 {
        // SAFETY: as `request_tail`.
        unsafe { atomic_word(std::ptr::addr_of_mut!((*Self::header(&self.requests)).head)) }
    }
    fn dcq_tail(&self) -> &AtomicU32 {
        // SAFETY: as `request_tail`, for the DCQ mapping.
        unsafe { atomic_word(std::ptr::addr_of_mut!((*Self::header(&self.dcq)).tail)) }
    }
    fn dcq_head(&self) -> &AtomicU32 {
        // SAFETY: as `dcq_tail`.
        unsafe { atomic_word(std::ptr::addr_of_mut!((*Self::header(&self.dcq)).head)) }
    }
    fn control_word(&self, offset: usize) -> &AtomicU32 {
        let word = self.control.host_ptr().wrapping_add(offset).cast::<u32>();
        // SAFETY: `offset` is a u32 field offset of the ControlBlock at the start of this block's page-aligned shared
        // mapping (valid while the block lives); the kernel accesses its words only atomically.
        unsafe { atomic_word(word) }
    }
    fn stop_word(&self) -> &AtomicU32 {
        self.control_word(std::mem::offset_of!(ControlBlock, stop))
    }
    fn abort_word(&self) -> &AtomicU32 {
        self.control_word(std::mem::offset_of!(ControlBlock, abort_epoch))
    }
    fn resume_word(&self) -> &AtomicU32 {
        self.control_word(std::mem::offset_of!(ControlBlock, resume_count))
    }
    fn halt_word(&self) -> &AtomicU32 {
        self.control_word(std::mem::offset_of!(ControlBlock, halt_count))
    }

    /// Writes backlog entries while the ring (and so the DCQ) has room; returns how many were published.
    fn pump(&self, producer: &mut Producer) -> usize {
        let drained = self.drained.load(Ordering::Acquire);
        let mut published = 0;
        if producer.backlog.is_empty() {
            return 0;
        }
        let mut table = self.inflight_map();
        while self.ring.free(drained, producer.tail) > 0 {
            let Some((entry, inflight)) = producer.backlog.pop_front() else { break };
            let slot = self.ring.slot(producer.tail) as usize;
            inflight.slot.set_ticket(encode_ticket(self.index, producer.tail));
            table.insert(slot, entry.transfer_id.get(), inflight);
            // SAFETY: slot < depth, so the entry lies inside the ring mapping (header + depth entries); the kernel
            // reads it only after acquiring a tail past it, which is published below.
            unsafe {
                let entries = self.requests.host_ptr().add(RING_HEADER_BYTES as usize).cast::<RequestEntry>();
                entries.add(slot).write(entry);
            }
            producer.tail = producer.tail.wrapping_add(1);
            published += 1;
        }
        drop(table);
        if published > 0 {
            // Release: the entries written above are visible to a kernel that acquires this tail.
            publish(self.request_tail(), producer.tail);
        }
        published
    }

    /// Whether no request of this block is in flight (every published request's completion has been drained). A
    /// hint: a submit may publish right after.
    fn is_idle(&self) -> bool {
        self.request_tail().load(Ordering::Acquire) == self.drained.load(Ordering::Acquire)
    }

    fn inflight_map(&self) -> std::sync::MutexGuard<'_, InFlightTable> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The drain lock if no other thread holds it (a pass that panicked does not stop later ones).
    fn try_drain_lock(&self) -> Option<std::sync::MutexGuard<'_, DrainScratch>> {
        match self.drain_lock.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

impl AivTransport {
    /// Sets up rings, channels and kernel arguments on `device` and, in persistent mode, launches the kernel.
    /// `windows` is the device's import cache and peer state; the transport's probe thread keeps its lost state.
    pub fn start(
        device: Arc<dyn DeviceBackend>,
        windows: Arc<PeerWindows>,
        options: &AivOptions,
    ) -> Result<AivTransport, DeviceError> {
        let invalid =
            |reason: String| DeviceError::Invalid { device: device.device_id(), operation: "start aiv", reason };
        let ring = SpscIndex::new(options.request_ring_depth).ok_or_else(|| {
            invalid(format!("request_ring_depth {} is not a power of two", options.request_ring_depth))
        })?;
        if options.aiv_blocks == 0 || options.doorbell_batch == 0 {
            return Err(invalid("aiv_blocks and doorbell_batch must be positive".into()));
        }
        let channels = device.open_channels(options.aiv_blocks, options.sq_depth)?;
        let depth = options.request_ring_depth as usize;
        let wait_budget = (options.kernel_wait_budget.as_nanos() * u128::from(device.cycles_per_second())
            / 1_000_000_000)
            .min(u128::from(u64::MAX)) as u64;
        let kernel_args = device.allocate_shared(
            std::mem::size_of::<KernelArgs>() + 64 + channels.len() * std::mem::size_of::<BlockArgs>(),
        )?;
        let mut blocks = Vec::new();
        let mut block_args = Vec::new();
        for channel in &channels {
            let requests = device.allocate_shared(RING_HEADER_BYTES as usize + depth * 64)?;
            let dcq = device.allocate_shared(RING_HEADER_BYTES as usize + depth * 32)?;
            let control = device.allocate_shared(std::mem::size_of::<ControlBlock>())?;
            block_args.push(BlockArgs {
                request_ring: requests.device_addr().into(),
                dcq: dcq.device_addr().into(),
                channel_record: channel.record_addr.into(),
                flag_area: channel.flag_area_addr.into(),
                control: control.device_addr().into(),
                platform_context: channel.platform_context.into(),
                wait_budget: wait_budget.into(),
                request_depth: options.request_ring_depth.into(),
                dcq_depth: options.request_ring_depth.into(),
                doorbell_batch: options.doorbell_batch.into(),
                max_sqe_bytes: SDMA_MAX_SQE_BYTES.into(),
                launch_mode: match options.launch_mode {
                    LaunchMode::Persistent => LAUNCH_PERSISTENT,
                    LaunchMode::PerBatch => LAUNCH_PER_BATCH,
                }
                .into(),
                group_limit: GROUP_MAX_TRANSFERS.into(),
                ..BlockArgs::default()
            });
            blocks.push(HostBlock {
                index: channel.index,
                requests,
                dcq,
                control,
                ring,
                producer: Mutex::new(Producer::default()),
                inflight: Mutex::new(InFlightTable::new(depth)),
                drained: AtomicU32::new(0),
                completions: AtomicU64::new(0),
                drain_lock: Mutex::new(DrainScratch::default()),
            });
        }
        let blocks_offset = 64usize;
        let header = KernelArgs {
            blocks: (kernel_args.device_addr() + blocks_offset as u64).into(),
            block_count: (channels.len() as u32).into(),
            layout_version: LAYOUT_VERSION.into(),
        };
        // SAFETY: the mapping holds the header at 0 and the block array at 64 (sized above); no kernel runs yet.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_bytes().as_ptr(), kernel_args.host_ptr(), 16);
            std::ptr::copy_nonoverlapping(
                block_args.as_bytes().as_ptr(),
                kernel_args.host_ptr().add(blocks_offset),
                block_args.as_bytes().len(),
            );
        }
        let inner = Arc::new(Inner {
            device,
            launch_mode: options.launch_mode,
            blocks,
            kernel_args,
            next_block: AtomicUsize::new(0),
            next_home: AtomicUsize::new(0),
            next_transfer_id: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            launches_in_flight: Mutex::new(Vec::new()),
            launches: AtomicU64::new(0),
            channel_resets: AtomicU64::new(0),
            windows,
            shutdown_wake: (Mutex::new(()), std::sync::Condvar::new()),
            probe_interval: options.peer_probe_interval,
            unattributed_cpu: CpuCarry::default(),
            attached_waiters: AtomicU32::new(0),
            last_detach: Mutex::new(None),
        });
        if inner.launch_mode == LaunchMode::Persistent {
            inner.launch()?;
        }
        let drain_inner = inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("aiv-drain-{}", inner.device.device_id()))
            .spawn(move || drain_inner.drain_loop())
            .map_err(|source| DeviceError::Os { device: inner.device.device_id(), operation: "start drain", source })?;
        let probe_inner = inner.clone();
        let probe = std::thread::Builder::new()
            .name(format!("aiv-probe-{}", inner.device.device_id()))
            .spawn(move || probe_inner.probe_loop())
            .map_err(|source| DeviceError::Os { device: inner.device.device_id(), operation: "start probe", source })?;
        Ok(AivTransport { inner, drain_thread: Mutex::new(Some(thread)), probe_thread: Mutex::new(Some(probe)) })
    }

    /// Raises the abort flag of every block: a kernel waiting for a completion flag gives up now; its transfers
    /// become FAILED ("aborted"), the channel is reset and the block resumes.
    pub fn abort(&self) {
        for block in &self.inner.blocks {
            block.abort_word().fetch_add(1, Ordering::AcqRel);
            self.inner.device.notify_block(block.index);
        }
    }

    /// Transport-wide counters.
    pub fn counters(&self) -> AivCounters {
        AivCounters {
            launches: self.inner.launches.load(Ordering::Relaxed),
            channel_resets: self.inner.channel_resets.load(Ordering::Relaxed),
            completions: self.completions_per_block().iter().sum(),
        }
    }

    /// DCQ entries drained so far on each block, in block order ([`AivCounters::completions`] split by block).
    pub fn completions_per_block(&self) -> Vec<u64> {
        self.inner.blocks.iter().map(|block| block.completions.load(Ordering::Relaxed)).collect()
    }

    /// Device address of the kernel arguments and the block count (for kernel-level benchmarks).
    pub fn kernel_args(&self) -> (u64, u32) {
        (self.inner.kernel_args.device_addr(), self.inner.blocks.len() as u32)
    }
}

impl Inner {
    fn launch(&self) -> Result<(), DeviceError> {
        let launch = self.device.launch(self.kernel_args.device_addr(), self.blocks.len() as u32)?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        let mut launches = self.launches_in_flight.lock().unwrap_or_else(|p| p.into_inner());
        launches.retain(|launch| !launch.wait(Duration::ZERO));
        launches.push(launch);
        Ok(())
    }

    /// Probes every imported peer each probe interval until stop; declares lost the ones that are gone.
    fn probe_loop(self: Arc<Self>) {
        while !self.stop.load(Ordering::Acquire) {
            for peer in self.windows.probe_all() {
                self.fail_pending_to(&peer);
            }
            self.nap(self.probe_interval);
        }
    }

    /// Sleeps for `period`, or until shutdown.
    fn nap(&self, period: Duration) {
        let (lock, wake) = &self.shutdown_wake;
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        let _ = wake.wait_timeout(guard, period);
    }

    /// Fails every transfer still pending to `peer`, just marked lost (the DCQ entries that come later find their
    /// tasks already terminal and change nothing).
    fn fail_pending_to(&self, peer: &Arc<Peer>) {
        let reason = peer.lost_reason().unwrap_or_default();
        tracing::warn!(segment = %peer.name(), %reason, "aiv peer lost");
        let message = format!("aiv: peer segment {:?} lost while the transfer was pending: {reason}", peer.name());
        let reaches = |inflight: &InFlight| inflight.peer == Some(peer.id());
        let mut failed = 0usize;
        // Backlog before the in-flight map: an entry moves from the first to the second, so none is missed.
        for block in &self.blocks {
            {
                let producer = block.producer.lock().unwrap_or_else(|p| p.into_inner());
                for (_, inflight) in producer.backlog.iter().filter(|(_, inflight)| reaches(inflight)) {
                    failed += usize::from(inflight.slot.finish(TransferState::Failed, 0, message.clone()));
                }
            }
            for inflight in block.inflight_map().iter().filter(|inflight| reaches(inflight)) {
                failed += usize::from(inflight.slot.finish(TransferState::Failed, 0, message.clone()));
            }
        }
        tracing::warn!(segment = %peer.name(), failed, "pending transfers to a lost peer failed");
        // Threads waiting through the poller sleep on kernel events, which these failures are not.
        self.device.wake_kernel_waiters();
    }

    fn drain_loop(self: Arc<Self>) {
        // Every CPU nanosecond of this thread (wake-ups and idle checks included) is charged to the transfers drained
        // next, as the baselines charge their Host threads.
        let mut cpu_mark = thread_cpu_time_ns();
        let mut backoff = DRAIN_BACKOFF;
        while !self.stop.load(Ordering::Acquire) {
            let token = self.device.kernel_event_token();
            // Everything this thread spent since the last pass (its wake-up included) goes to the pool first.
            let now = thread_cpu_time_ns();
            self.unattributed_cpu.add(now.saturating_sub(cpu_mark));
            cpu_mark = now;
            let mut progressed = false;
            for block in &self.blocks {
                let Some(mut scratch) = block.try_drain_lock() else { continue };
                progressed |= self.drain_block(block, &mut scratch);
            }
            if progressed {
                backoff = DRAIN_BACKOFF;
                continue;
            }
            if self.waiters_present() {
                // A waiting thread collects the completions; look again after a while in case it stops waiting.
                self.nap(backoff);
                backoff = (backoff * 2).min(DRAIN_BACKOFF_MAX);
            } else {
                backoff = DRAIN_BACKOFF;
                // A safety net only: kernels wake this thread when they publish (Waiter never loses a wake).
                self.device.wait_for_kernel(token, Duration::from_millis(20));
            }
        }
    }

    /// Whether a thread waits through the poller now or did within the last [`DRAIN_BACKOFF`].
    fn waiters_present(&self) -> bool {
        if self.attached_waiters.load(Ordering::Acquire) > 0 {
            return true;
        }
        let last = *self.last_detach.lock().unwrap_or_else(|p| p.into_inner());
        last.is_some_and(|at| at.elapsed() < DRAIN_BACKOFF)
    }

    /// Whether any block's DCQ holds entries not yet drained (a few atomic loads).
    fn completions_ready(&self) -> bool {
        self.blocks.iter().any(|block| load_peer(block.dcq_tail()) != block.dcq_head().load(Ordering::Relaxed))
    }

    /// Drains what is ready on the calling thread (a waiter or a status query). The pass's CPU time goes to the pool,
    /// charged to the transfers drained next. Returns whether
    /// another thread was draining a block meanwhile (it may be finishing the caller's slots right now, without
    /// waking the caller).
    fn poll_inline(&self) -> bool {
        let ready = self.completions_ready();
        // A section that never sleeps (see cpu_time::Section): try-locks and DCQ reads only.
        let section = ready.then(Section::start);
        let mut contended = false;
        for block in &self.blocks {
            match block.try_drain_lock() {
                Some(mut scratch) => {
                    if ready {
                        self.drain_block(block, &mut scratch);
                    }
                }
                None => contended = true,
            }
        }
        if let Some(section) = section {
            self.unattributed_cpu.add(section.elapsed_ns());
        }
        contended
    }

    /// Drains one block's DCQ (the caller holds its drain lock); returns whether anything was drained. The drained
    /// transfers share the pool of Host time not charged yet (submits, earlier drain passes, drain-thread wake-ups).
    fn drain_block(&self, block: &HostBlock, scratch: &mut DrainScratch) -> bool {
        let index = block.ring;
        let head = block.dcq_head().load(Ordering::Relaxed);
        // Acquire pairs with the kernel's release store of the DCQ tail: the entries before it are complete.
        let tail = load_peer(block.dcq_tail());
        if head == tail {
            return false;
        }
        let count = index.len(head, tail).min(index.depth());
        let DrainScratch { entries, finished } = scratch;
        entries.clear();
        finished.clear();
        for i in 0..count {
            let slot = index.slot(head.wrapping_add(i)) as usize;
            let mut raw = [0u8; 32];
            // SAFETY: slot < depth: the entry lies inside the DCQ mapping; it was written before the tail we acquired.
            unsafe {
                let entries_base = block.dcq.host_ptr().add(RING_HEADER_BYTES as usize);
                std::ptr::copy_nonoverlapping(entries_base.add(slot * 32), raw.as_mut_ptr(), 32);
            }
            if let Ok(entry) = DcqEntry::read_from_bytes(&raw) {
                entries.push(entry);
            }
        }
        let new_head = head.wrapping_add(count);
        // Release: the kernel may reuse these DCQ slots once it acquires the new head.
        publish(block.dcq_head(), new_head);
        block.drained.store(new_head, Ordering::Release);
        // Per block (its drainer holds the drain lock): no counter shared by every draining thread.
        block.completions.fetch_add(u64::from(count), Ordering::Relaxed);

        let group_failed = entries
            .iter()
            .any(|entry| matches!(DcqStatus(entry.status.get()), DcqStatus::TIMEOUT | DcqStatus::ABORTED));
        // Read the exception before deciding FAILED vs TIMEOUT, and before the reset clears it.
        let exception = if group_failed { self.device.channel_exception(block.index) } else { None };
        {
            let mut inflight = block.inflight_map();
            for (i, entry) in entries.iter().enumerate() {
                match inflight.take(index.slot(head.wrapping_add(i as u32)) as usize, entry.transfer_id.get()) {
                    Some(transfer) => finished.push((i, transfer)),
                    None => tracing::warn!(
                        block = block.index,
                        transfer_id = entry.transfer_id.get(),
                        "DCQ entry names no transfer in flight; ignored"
                    ),
                }
            }
        }
        // Recover first, so that a caller who sees the failure can submit again at once.
        if group_failed {
            self.recover(block);
        }
        let drain_share = self.unattributed_cpu.take() / u64::from(count.max(1));
        for (i, transfer) in finished.drain(..) {
            self.finish(block, &entries[i], transfer, drain_share, exception.as_ref());
        }
        let pumped = {
            let mut producer = block.producer.lock().unwrap_or_else(|p| p.into_inner());
            let pumped = block.pump(&mut producer);
            if pumped > 0 && self.launch_mode == LaunchMode::PerBatch {
                // A runtime launch call may block (see cpu_time::may_sleep).
                if let Err(error) = crate::cpu_time::may_sleep(|| self.launch()) {
                    tracing::error!(%error, "relaunch for backlog failed");
                }
            }
            pumped
        };
        // The kernel may be waiting for the requests just published. (It never waits for DCQ space: the Host keeps
        // at most ring-depth requests in flight, so undrained entries always fit the DCQ.)
        if pumped > 0 {
            self.device.notify_block(block.index);
        }
        true
    }

    fn finish(
        &self,
        block: &HostBlock,
        entry: &DcqEntry,
        transfer: InFlight,
        drain_share: u64,
        exception: Option<&crate::device::ChannelException>,
    ) {
        let evidence = TransferEvidence {
            path: "aiv",
            descriptor_builder: Actor::AivKernel,
            doorbell_ringer: Actor::AivKernel,
            completion_observer: Actor::AivKernel,
            host_device_api_calls: transfer.host_device_api_calls,
            descriptors: u64::from(entry.sqes.get()),
            doorbells: u64::from(entry.doorbells.get()),
            host_cpu_ns: drain_share,
        };
        let syndrome = Syndrome(entry.syndrome.get());
        let channel = block.index;
        match DcqStatus(entry.status.get()) {
            DcqStatus::COMPLETED if entry.bytes.get() == transfer.length => {
                transfer.slot.complete(transfer.length, evidence);
            }
            DcqStatus::COMPLETED => {
                transfer.slot.fail_with_evidence(
                    TransferState::Failed,
                    format!("aiv: kernel reported {} of {} bytes", entry.bytes.get(), transfer.length),
                    evidence,
                );
            }
            DcqStatus::FAILED => {
                transfer.slot.fail_with_evidence(
                    TransferState::Failed,
                    format!("aiv: kernel rejected the request on block {channel}: {}", syndrome.describe()),
                    evidence,
                );
            }
            status @ (DcqStatus::TIMEOUT | DcqStatus::ABORTED) => match exception {
                Some(exception) => {
                    transfer.slot.fail_with_evidence(TransferState::Failed, format!("aiv: {exception}"), evidence);
                }
                None if status == DcqStatus::TIMEOUT => {
                    transfer.slot.fail_with_evidence(
                        TransferState::Timeout,
                        format!(
                            "aiv: block {channel}: {} (no SDMA exception recorded on the channel)",
                            syndrome.describe()
                        ),
                        evidence,
                    );
                }
                None => {
                    transfer.slot.fail_with_evidence(
                        TransferState::Failed,
                        format!("aiv: block {channel}: aborted: {}", syndrome.describe()),
                        evidence,
                    );
                }
            },
            other => {
                transfer.slot.fail_with_evidence(
                    TransferState::Failed,
                    format!("aiv: block {channel}: device wrote {}", other.name()),
                    evidence,
                );
            }
        }
    }

    /// After a failed group: reset the channel and let the halted block resume.
    fn recover(&self, block: &HostBlock) {
        // The kernel incremented halt_count before publishing the failed entries we drained; if the Host already
        // resumed that halt (entries of one failure seen in two drain passes), the block may be posting again: a
        // second reset now would drop its new SQEs.
        let halted = block.halt_word().load(Ordering::Acquire);
        if halted == block.resume_word().load(Ordering::Acquire) {
            return;
        }
        if let Err(error) = self.device.reset_channel(block.index) {
            tracing::error!(block = block.index, %error, "channel reset failed; the block stays halted");
            return;
        }
        self.channel_resets.fetch_add(1, Ordering::Relaxed);
        // Release: the reset above happens before the kernel sees the resume.
        block.resume_word().store(halted, Ordering::Release);
        self.device.notify_block(block.index);
        if self.launch_mode == LaunchMode::PerBatch {
            let pending = load_peer(block.request_tail()) != load_peer(block.request_head());
            if pending {
                if let Err(error) = self.launch() {
                    tracing::error!(%error, "relaunch after recovery failed");
                }
            }
        }
    }
}

impl CompletionPoller for Inner {
    fn poll(&self) -> bool {
        self.poll_inline()
    }

    fn token(&self) -> u32 {
        self.device.kernel_event_token()
    }

    fn wait(&self, token: u32, timeout: Duration) {
        self.device.wait_for_kernel(token, timeout);
    }

    fn wait_for(&self, tickets: &[u64], token: u32, timeout: Duration) {
        // Per block, the DCQ tail that covers the last of the tasks there (the kernel completes a block's requests
        // in ring order, so DCQ position p is request position p).
        let mut needs: Vec<(u32, u32)> = Vec::with_capacity(self.blocks.len());
        for &ticket in tickets {
            let Some((block, position)) = decode_ticket(ticket) else {
                return self.device.wait_for_kernel(token, timeout);
            };
            let tail = position.wrapping_add(1);
            match needs.iter_mut().find(|(known, _)| *known == block) {
                Some((_, need)) if tail.wrapping_sub(*need) as i32 > 0 => *need = tail,
                Some(_) => {}
                None => needs.push((block, tail)),
            }
        }
        self.device.wait_for_dcq(&needs, token, timeout);
    }

    fn attach(&self) {
        self.attached_waiters.fetch_add(1, Ordering::AcqRel);
    }

    fn detach(&self) {
        if self.attached_waiters.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.last_detach.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
    }
}

impl Transport for AivTransport {
    fn name(&self) -> &'static str {
        "aiv"
    }

    fn completion_poller(&self) -> Option<Arc<dyn CompletionPoller>> {
        Some(self.inner.clone())
    }

    fn submit(&self, transfers: Vec<Transfer>) {
        let inner = &self.inner;
        // A section that never sleeps (see cpu_time::Section): ring writes, on the twin a futex wake of a core. A
        // lock held by a draining thread may make it wait: counted too. The first transfer to a peer imports its
        // memory and a per-batch launch calls the runtime: both may block, and count their CPU time only.
        let section = Section::start();
        let api_calls = u64::from(inner.launch_mode == LaunchMode::PerBatch);
        let blocks = inner.blocks.len();
        // The batch goes to the blocks in equal contiguous runs. The first run goes to the calling thread's home
        // block when nothing is in flight there (a thread that waits for each transfer keeps to one block, and the
        // other blocks' kernels can go idle), else to the other blocks in turn (so back-to-back submits spread over
        // the blocks). Ids are reserved once per submit (the counter is shared by every thread). No staging copy:
        // each run is resolved straight into its block's backlog and published from there.
        let run_length = transfers.len().div_ceil(blocks).max(1);
        let home = home_block(&inner.next_home) % blocks;
        let first_block = if blocks == 1 || inner.blocks[home].is_idle() {
            home
        } else {
            home + 1 + inner.next_block.fetch_add(1, Ordering::Relaxed) % (blocks - 1)
        };
        let mut next_id = inner.next_transfer_id.fetch_add(transfers.len() as u64, Ordering::Relaxed);
        let mut accepted = 0u64;
        let mut last_peer = None;
        let mut transfers = transfers.into_iter().peekable();
        for run in 0..blocks {
            if transfers.peek().is_none() {
                break;
            }
            let block = &inner.blocks[first_block.wrapping_add(run) % blocks];
            let mut producer = block.producer.lock().unwrap_or_else(|p| p.into_inner());
            for transfer in transfers.by_ref().take(run_length) {
                let id = next_id;
                next_id += 1;
                let Resolved { src, dst, peer } = match inner.windows.resolve_with("aiv", &transfer, &mut last_peer) {
                    Ok(resolved) => resolved,
                    Err(error) => {
                        transfer.slot.finish(TransferState::Failed, 0, error.reason().to_owned());
                        continue;
                    }
                };
                let entry = RequestEntry {
                    transfer_id: U64::new(id),
                    src_addr: U64::new(src),
                    dst_addr: U64::new(dst),
                    length: U64::new(transfer.length),
                    opcode: U32::new(match transfer.opcode {
                        Opcode::Read => REQUEST_OPCODE_READ,
                        Opcode::Write => REQUEST_OPCODE_WRITE,
                    }),
                    ..RequestEntry::default()
                };
                let inflight =
                    InFlight { slot: transfer.slot, peer, length: transfer.length, host_device_api_calls: api_calls };
                producer.backlog.push_back((entry, inflight));
                accepted += 1;
            }
            let published = block.pump(&mut producer);
            drop(producer);
            if published > 0 {
                inner.device.notify_block(block.index);
            }
        }
        if accepted > 0 && inner.launch_mode == LaunchMode::PerBatch {
            // A runtime launch call may block (see cpu_time::may_sleep).
            if let Err(error) = crate::cpu_time::may_sleep(|| inner.launch()) {
                tracing::error!(%error, "kernel launch failed; the watchdog will time the transfers out");
            }
        }
        // The whole submit (ring writes, the twin's wake of a sleeping core, a per-batch launch) is charged to the
        // transfers drained next.
        inner.unattributed_cpu.add(section.elapsed_ns());
    }
}

impl Drop for AivTransport {
    fn drop(&mut self) {
        let inner = &self.inner;
        for block in &inner.blocks {
            block.stop_word().store(1, Ordering::Release);
            inner.device.notify_block(block.index);
        }
        let launches = std::mem::take(&mut *inner.launches_in_flight.lock().unwrap_or_else(|p| p.into_inner()));
        let mut all_returned = true;
        for launch in launches {
            all_returned &= launch.wait(Duration::from_secs(3));
        }
        if !all_returned {
            // A kernel still running uses the rings and control blocks: leak them rather than free them under it.
            tracing::error!("a transfer kernel launch did not return within 3 s of stop; leaking its rings");
            std::mem::forget(inner.clone());
        }
        inner.stop.store(true, Ordering::Release);
        {
            let _guard = inner.shutdown_wake.0.lock().unwrap_or_else(|p| p.into_inner());
            inner.shutdown_wake.1.notify_all();
        }
        if let Some(thread) = self.drain_thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
        // Bounded: one probe is bounded by the export service's I/O timeout.
        if let Some(thread) = self.probe_thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
        // Transfers still in flight end now rather than at their deadline.
        for block in &inner.blocks {
            for transfer in block.inflight_map().drain() {
                transfer.slot.finish(TransferState::Failed, 0, "aiv: transport shut down".into());
            }
        }
        inner.device.wake_kernel_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceBuffer;
    // Test-only: the engine's device facade opens a twin device with the transport on it.
    use crate::engine::AivDevice;
    use crate::transfer::CompletionSignal;
    use std::time::Instant;

    /// A twin device with the aiv transport on one block (ring depth 8) and 8 KiB of its HBM.
    fn one_block_device() -> (AivDevice, DeviceBuffer) {
        let options = AivOptions {
            aiv_blocks: 1,
            request_ring_depth: 8,
            sq_depth: 16,
            hbm_size: 4 << 20,
            kernel_wait_budget: Duration::from_millis(500),
            ..AivOptions::default()
        };
        let device = AivDevice::open(&options).expect("twin");
        let buffer = device.allocate(8192).expect("hbm");
        (device, buffer)
    }

    /// Requests the engine would never send (zero length, address overflow, unknown opcode) are refused by the
    /// kernel itself with a bad-request syndrome, without an SQE; a good request in the same group still completes.
    #[test]
    fn the_kernel_rejects_malformed_requests_on_its_own() {
        let (device, buffer) = one_block_device();
        let signal = Arc::new(CompletionSignal::default());
        let deadline = Instant::now() + Duration::from_secs(10);
        let entry = |id: u64, src: u64, length: u64, opcode: u32| RequestEntry {
            transfer_id: U64::new(id),
            src_addr: U64::new(src),
            dst_addr: U64::new(buffer.addr() + 4096),
            length: U64::new(length),
            opcode: U32::new(opcode),
            ..RequestEntry::default()
        };
        let cases = [
            entry(1, buffer.addr(), 0, REQUEST_OPCODE_WRITE),
            entry(2, u64::MAX - 10, 100, REQUEST_OPCODE_WRITE),
            entry(3, buffer.addr(), 100, 7),
            entry(4, buffer.addr(), 100, REQUEST_OPCODE_WRITE),
        ];
        let slots: Vec<Arc<TaskSlot>> =
            cases.iter().map(|_| Arc::new(TaskSlot::new(deadline, signal.clone()))).collect();
        let inner = &device.transport().inner;
        let block = &inner.blocks[0];
        {
            let mut producer = block.producer.lock().expect("producer");
            for (entry, slot) in cases.iter().zip(&slots) {
                let inflight =
                    InFlight { slot: slot.clone(), peer: None, length: entry.length.get(), host_device_api_calls: 0 };
                producer.backlog.push_back((*entry, inflight));
            }
            assert_eq!(block.pump(&mut producer), 4);
        }
        inner.device.notify_block(0);
        signal.wait_for(4, deadline);
        for slot in &slots[..3] {
            assert_eq!(slot.state(), TransferState::Failed);
            let reason = slot.reason().expect("reason");
            assert!(reason.contains("bad request"), "{reason}");
            let evidence = slot.evidence().expect("evidence");
            assert_eq!((evidence.descriptors, evidence.doorbells), (0, 0), "no SQE for a refused request");
        }
        assert_eq!(slots[3].state(), TransferState::Completed, "{:?}", slots[3].reason());
    }

    /// A waiting thread collects completions itself, and is told when another thread holds a block's DCQ (that
    /// thread may finish the waiter's slots without waking it, so the waiter must not sleep long).
    #[test]
    fn tickets_round_trip_and_zero_is_no_ticket() {
        for (block, position) in [(0, 0), (1, 7), (31, u32::MAX)] {
            let ticket = encode_ticket(block, position);
            assert_ne!(ticket, 0);
            assert_eq!(decode_ticket(ticket), Some((block, position)));
        }
        assert_eq!(decode_ticket(0), None);
        assert_eq!(decode_ticket(0x0000_0000_0000_0005), None);
    }

    #[test]
    fn a_poll_drains_in_the_calling_thread_and_reports_a_drain_elsewhere() {
        let (device, buffer) = one_block_device();
        let signal = Arc::new(CompletionSignal::default());
        let deadline = Instant::now() + Duration::from_secs(10);
        let slot = Arc::new(TaskSlot::new(deadline, signal.clone()));
        slot.mark_pending();
        let inner = &device.transport().inner;
        let block = &inner.blocks[0];
        // Stand in for another drainer: neither the drain thread nor the poll may take this block's DCQ.
        let held = block.drain_lock.lock().expect("drain lock");
        {
            let mut producer = block.producer.lock().expect("producer");
            let entry = RequestEntry {
                transfer_id: U64::new(77),
                src_addr: U64::new(buffer.addr()),
                dst_addr: U64::new(buffer.addr() + 4096),
                length: U64::new(4096),
                opcode: U32::new(REQUEST_OPCODE_WRITE),
                ..RequestEntry::default()
            };
            let inflight = InFlight { slot: slot.clone(), peer: None, length: 4096, host_device_api_calls: 0 };
            producer.backlog.push_back((entry, inflight));
            assert_eq!(block.pump(&mut producer), 1);
        }
        inner.device.notify_block(0);
        while !inner.completions_ready() {
            assert!(Instant::now() < deadline, "the kernel never published the completion");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(inner.poll_inline(), "a poll while another thread holds the DCQ must say so");
        assert_eq!(slot.state(), TransferState::Pending, "nobody may drain a DCQ another thread holds");
        drop(held);
        assert!(!inner.poll_inline(), "no other drainer now");
        assert_eq!(slot.state(), TransferState::Completed, "{:?}", slot.reason());
        assert!(!inner.completions_ready());
        assert!(slot.evidence().is_some(), "a finished transfer carries evidence");
        assert!(inner.unattributed_cpu.take() > 0, "the drain pass was timed and pooled for the next transfers");
        assert_eq!(signal.finished(), 1);
    }
}
