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
//! Files, one concern each: [`block`] (a block's mappings, ring views and state), [`setup`] (rings, control blocks,
//! kernel arguments, threads), [`submit`] (block placement and the one sequence that posts requests), [`drain`] (DCQ
//! drain, outcome mapping, recovery, the waiting thread's poller), [`fault_probe`] (the hardware tier's deliberate
//! device fault, test-only), [`observe`] (each drained transfer's observed
//! acts, for the evidence), [`probe`] (peer loss), [`inflight`] (the per-block table of transfers in flight),
//! [`trace`] (the optional per-block trace rings and their drain, docs/trace.md); this
//! file holds the transport's state, its public controls and shutdown.
//!
//! Nothing hangs: the kernel gives up a completion wait after `kernel_wait_budget` (DCQ status TIMEOUT) or when the
//! abort flag changes ([`AivTransport::abort`]); the engine's watchdog turns any slot still pending at its deadline
//! into TIMEOUT; every wait of the drain thread and of shutdown is bounded.
//!
//! Peer loss (docs/device.md, "Peer loss"): a probe thread calls [`PeerWindows::probe_all`], which asks every
//! imported peer's device whether it still serves its memory ([`MemorySharing::probe_peer`], every
//! `peer_probe_interval_ms`, default 50 ms). A peer proven gone (not merely slow or busy) is marked lost there: this
//! transport fails its pending transfers at once, and new ones (on every path of the device, the windows being
//! shared) fail until the peer answers a probe again or the segment is refreshed or reopened. On the twin a dead
//! exporter's pages stay mapped here, so without this check transfers to it would "complete" into orphaned memory;
//! a real NPU would see a link or HBM error instead.

mod block;
mod drain;
mod fault_probe;
mod inflight;
mod observe;
mod pace;
mod probe;
mod rdma;
mod setup;
mod submit;
#[cfg(test)]
mod tests;
mod trace;

pub use rdma::{ConnectionSender, InitiatorResolver, HANDSHAKE_RETRY};
pub use trace::DEFAULT_TRACE_DEPTH;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::window::PeerWindows;
use super::Transport;
use crate::config::LaunchMode;
use crate::cpu_time::CpuCarry;
use crate::device::{DeviceError, KernelChannels, Launch, MemorySharing, Observation, SharedMemory};
use crate::transfer::{CompletionPoller, FailureKind, Transfer, TransferFailure};
use block::HostBlock;

/// Counters of the transport as a whole (not per transfer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AivCounters {
    /// Kernel launches (per-batch mode: one per submit; plus the persistent launch and relaunches after recovery).
    pub launches: u64,
    /// Channel resets after a failed group.
    pub channel_resets: u64,
    /// DCQ entries drained.
    pub completions: u64,
    /// DCQ entries that named no transfer in flight (ignored after counting).
    pub unmatched_completions: u64,
    /// DCQ entries whose status word the kernel never writes (their transfers failed).
    pub undecodable_completions: u64,
    /// Drain passes that found a DCQ tail more than a ring's depth past its head (only a ring's depth was read).
    pub corrupt_dcq_tails: u64,
}

/// The aiv transport.
#[derive(Debug)]
pub struct AivTransport {
    inner: Arc<Inner>,
    drain_thread: Mutex<Option<JoinHandle<()>>>,
    probe_thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Inner {
    /// The kernel's launches and SDMA channels.
    device: Arc<dyn KernelChannels>,
    /// Memory shared with the kernel (rings, trace rings) and the exported memory the NIC registers.
    memory: Arc<dyn MemorySharing>,
    /// The runtime's provenance logs, where it keeps them.
    observation: Option<Arc<dyn Observation>>,
    /// Whether transfers take Host marks (`observe::HostMark`): where their acts are self-reported.
    host_marks: bool,
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
    /// Device-runtime calls made for transfers not yet drained (submits' imports and launches, drain passes' channel
    /// queries, resets and relaunches), counted by the loader tables; shared by the transfers drained next.
    unattributed_calls: CpuCarry,
    /// Kernel launches made for transfers not yet drained (per-batch launches, relaunches for a backlog or after
    /// recovery; not the persistent kernel's launch at start): shared by the transfers drained next.
    uncharged_launches: CpuCarry,
    /// Threads waiting through the [`CompletionPoller`].
    attached_waiters: AtomicU32,
    /// When the last of them detached.
    last_detach: Mutex<Option<Instant>>,
    /// Bumped whenever the Host itself finished transfers (peer loss, shutdown): a waiter polling for DCQ tails looks
    /// at it too, since those transfers will never appear in a DCQ.
    host_finished: AtomicU32,
    /// The pace the batch waits learned (`pace::WaitPace`).
    wait_pace: pace::WaitPace,
    /// The engine's tracer, from the first [`AivTransport::set_trace`] (docs/trace.md).
    tracer: OnceLock<Arc<crate::trace::Tracer>>,
    /// The RDMA route: NIC, registrations, QP tables (docs/rdma.md section 7).
    rdma: rdma::Rdma,
}

impl AivTransport {
    /// Raises the abort flag of every block: a kernel waiting for a completion flag gives up now; its transfers
    /// become FAILED ("aborted"), the channel is reset and the block resumes.
    pub fn abort(&self) {
        for block in &self.inner.blocks {
            block.control().abort_epoch.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Transport-wide counters.
    pub fn counters(&self) -> AivCounters {
        AivCounters {
            launches: self.inner.launches.load(Ordering::Relaxed),
            channel_resets: self.inner.channel_resets.load(Ordering::Relaxed),
            completions: self.completions_per_block().iter().sum(),
            unmatched_completions: self.sum_blocks(|block| &block.unmatched),
            undecodable_completions: self.sum_blocks(|block| &block.undecodable),
            corrupt_dcq_tails: self.sum_blocks(|block| &block.corrupt_tails),
        }
    }

    fn sum_blocks(&self, counter: impl Fn(&HostBlock) -> &AtomicU64) -> u64 {
        self.inner.blocks.iter().map(|block| counter(block).load(Ordering::Relaxed)).sum()
    }

    /// DCQ entries drained so far on each block, in block order ([`AivCounters::completions`] split by block).
    pub fn completions_per_block(&self) -> Vec<u64> {
        self.inner.blocks.iter().map(|block| block.completions.load(Ordering::Relaxed)).collect()
    }

    /// Whether the RDMA route is available (the device's NIC is open).
    pub fn rdma_available(&self) -> bool {
        self.inner.rdma.available()
    }

    /// The `rdma` object of the device's advertisement (`None`: no RDMA route here).
    pub fn rdma_advertisement(&self) -> Option<crate::device::RdmaAdvertisement> {
        self.inner.rdma.advertisement()
    }

    /// Where this transport's device is (what its advertisement's `host` says).
    pub fn host_identity(&self) -> crate::device::HostIdentity {
        self.inner.rdma.identity().clone()
    }

    /// The device memory registered with the NIC and each registration's lkey.
    pub fn rdma_registrations(&self) -> Vec<(crate::device::RdmaRegion, u32)> {
        self.inner.rdma.registrations()
    }

    /// Registers the device memory with the NIC again (new keys; the old registrations are withdrawn). The engine
    /// republishes its descriptor after this; peers learn the new rkeys when they refresh the segment.
    pub fn rdma_reregister(&self) -> Result<(), DeviceError> {
        self.inner.rdma.reregister()
    }

    /// Test-only: holds the lock of every RDMA QP slot until the returned guard drops, as a submit holds its slot's
    /// while it checks or sets its QP up (a QP handshake can take seconds). Draining must not wait for it: the
    /// transfers in flight complete with their evidence meanwhile (`tests/aiv_rdma.rs`).
    #[doc(hidden)]
    pub fn hold_rdma_slots_for_tests(&self) -> impl Sized + '_ {
        self.inner.rdma.hold_slots()
    }

    /// Sets how the initiator side sends its QP handshakes (the engine's metadata service; once).
    pub fn set_connection_sender(&self, sender: Arc<ConnectionSender>) {
        self.inner.rdma.set_sender(sender);
    }

    /// Sets how the target side resolves a handshake's initiator (the engine's metadata service; once). Without
    /// one every RDMA Connection request is refused.
    pub fn set_initiator_resolver(&self, resolver: Arc<InitiatorResolver>) {
        self.inner.rdma.set_resolver(resolver);
    }

    /// The target side of the QP handshake, for the engine's handshake server (holds the transport weakly).
    pub fn connection_handler(&self) -> Arc<crate::metadata::handshake::ConnectionHandler> {
        let inner = Arc::downgrade(&self.inner);
        Arc::new(move |request: &serde_json::Value, source: std::net::SocketAddr| match inner.upgrade() {
            Some(inner) => inner.rdma.answer_connection(request, source),
            None => Err("the aiv transport has shut down".into()),
        })
    }

    /// Device address of the kernel arguments and the block count (for kernel-level benchmarks).
    pub fn kernel_args(&self) -> (u64, u32) {
        (self.inner.kernel_args.device_addr(), self.inner.blocks.len() as u32)
    }
}

impl Inner {
    /// Launches the transfer kernel. The launch and the waits on earlier launches are this transport's own work, not
    /// Host acts on the transfers in flight (`ascendcl_sys::calls::own_work`; counted in `host_launches` and
    /// `host_device_api_calls`).
    fn launch(&self) -> Result<(), DeviceError> {
        ascendcl_sys::calls::own_work(|| {
            let launch = self.device.launch(self.kernel_args.device_addr(), self.blocks.len() as u32)?;
            self.launches.fetch_add(1, Ordering::Relaxed);
            self.uncharged_launches.add(1);
            let mut launches = self.launches_in_flight.lock().unwrap_or_else(|p| p.into_inner());
            launches.retain(|launch| !launch.wait(Duration::ZERO));
            launches.push(launch);
            Ok(())
        })
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
}

impl Transport for AivTransport {
    fn name(&self) -> &'static str {
        "aiv"
    }

    fn completion_poller(&self) -> Option<Arc<dyn CompletionPoller>> {
        Some(self.inner.clone())
    }

    fn submit(&self, transfers: Vec<Transfer>) {
        self.inner.submit(transfers);
    }
}

impl Drop for AivTransport {
    fn drop(&mut self) {
        let inner = &self.inner;
        for block in &inner.blocks {
            block.control().stop.store(1, Ordering::Release);
        }
        let launches = std::mem::take(&mut *inner.launches_in_flight.lock().unwrap_or_else(|p| p.into_inner()));
        let mut all_returned = true;
        for launch in launches {
            all_returned &= ascendcl_sys::calls::own_work(|| launch.wait(Duration::from_secs(3)));
        }
        if !all_returned {
            // A kernel still running uses the rings and control blocks: leak them rather than free them under it.
            tracing::error!("a transfer kernel launch did not return within 3 s of stop; leaking its rings");
            std::mem::forget(inner.clone());
        }
        // The kernels have returned (or their rings leak): the QPs and the NIC go, within the NIC's bound.
        inner.rdma.close();
        inner.stop.store(true, Ordering::Release);
        {
            let _guard = inner.shutdown_wake.0.lock().unwrap_or_else(|p| p.into_inner());
            inner.shutdown_wake.1.notify_all();
        }
        if let Some(thread) = self.drain_thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
        // Bounded: one probe is bounded by the runtime's import deadline (2 s on the twin runtime).
        if let Some(thread) = self.probe_thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
        // Transfers still in flight end now rather than at their deadline.
        for block in &inner.blocks {
            for transfer in block.inflight_map().drain() {
                transfer.slot.fail(TransferFailure::new("aiv", FailureKind::Shutdown, "transport shut down"));
            }
        }
        inner.host_finished.fetch_add(1, Ordering::AcqRel);
    }
}
