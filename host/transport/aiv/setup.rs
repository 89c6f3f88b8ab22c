//! Setup of a device for the aiv path: each block's request ring, DCQ and control block in shared memory, the
//! kernel arguments that point the kernel at them, and the transport's threads.
//!
//! Owns: [`AivTransport::start`]. It must not submit or drain transfers.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use zerocopy::IntoBytes;

use super::block::{DrainScratch, HostBlock, Producer};
use super::inflight::InFlightTable;
use super::{AivTransport, Inner};
use crate::config::{AivOptions, LaunchMode};
use crate::cpu_time::CpuCarry;
use crate::device::{DeviceError, KernelChannels, MemorySharing, Observation, Rdma};
use crate::kernel_abi::{
    dcq_bytes, kernel_args_bytes, request_ring_bytes, BlockArgs, CompletionRing, ControlBlock, KernelArgs, RequestRing,
    SpscIndex, GROUP_MAX_TRANSFERS, KERNEL_ARGS_BLOCKS_OFFSET, LAUNCH_PERSISTENT, LAUNCH_PER_BATCH, LAYOUT_VERSION,
    RDMA_MAX_WQE_BYTES, SDMA_MAX_SQE_BYTES,
};
use crate::transport::window::PeerWindows;

impl AivTransport {
    /// Sets up rings, channels and kernel arguments on `device` and, in persistent mode, launches the kernel.
    /// `memory` holds the rings and the exported memory the NIC registers; `observation` is the runtime's logs, where
    /// it keeps them; `rdma` the device's NIC, or why it has none. `windows` is the device's import cache and peer
    /// state; the transport's probe thread keeps its lost state.
    pub fn start(
        device: Arc<dyn KernelChannels>,
        memory: Arc<dyn MemorySharing>,
        observation: Option<Arc<dyn Observation>>,
        rdma: Result<&dyn Rdma, DeviceError>,
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
        // The kernel cuts pieces with shifts (its scalar unit has no divider) and refuses any other size.
        if !options.rdma_max_wqe_bytes.is_power_of_two() || options.rdma_max_wqe_bytes > RDMA_MAX_WQE_BYTES {
            return Err(invalid(format!(
                "rdma_max_wqe_bytes {} is not a power of two from 1 to {RDMA_MAX_WQE_BYTES}",
                options.rdma_max_wqe_bytes
            )));
        }
        let channels = device.open_channels(options.aiv_blocks, options.sq_depth)?;
        let depth = options.request_ring_depth;
        let kernel_args = memory.allocate_shared(kernel_args_bytes(channels.len()))?;
        let rdma = super::rdma::Rdma::start(memory.as_ref(), rdma, options, channels.len() as u32)?;
        let budget = kernel_wait_budget(options, rdma.available());
        let wait_budget = (budget.as_nanos() * u128::from(device.cycles_per_second()) / 1_000_000_000)
            .min(u128::from(u64::MAX)) as u64;
        let mut blocks = Vec::new();
        let mut block_args = Vec::new();
        for channel in &channels {
            let requests = memory.allocate_shared(request_ring_bytes(depth))?;
            let dcq = memory.allocate_shared(dcq_bytes(depth))?;
            let control = memory.allocate_shared(std::mem::size_of::<ControlBlock>())?;
            block_args.push(BlockArgs {
                request_ring: requests.device_addr().into(),
                dcq: dcq.device_addr().into(),
                channel_record: channel.record_addr.into(),
                flag_area: channel.flag_area_addr.into(),
                control: control.device_addr().into(),
                platform_context: channel.platform_context.into(),
                wait_budget: wait_budget.into(),
                request_depth: depth.into(),
                dcq_depth: depth.into(),
                doorbell_batch: options.doorbell_batch.into(),
                max_sqe_bytes: SDMA_MAX_SQE_BYTES.into(),
                launch_mode: match options.launch_mode {
                    LaunchMode::Persistent => LAUNCH_PERSISTENT,
                    LaunchMode::PerBatch => LAUNCH_PER_BATCH,
                }
                .into(),
                group_limit: GROUP_MAX_TRANSFERS.into(),
                qp_count: rdma.table(blocks.len()).1.into(),
                qp_table: rdma.table(blocks.len()).0.into(),
                max_wqe_bytes: if rdma.available() { options.rdma_max_wqe_bytes } else { 0 }.into(),
                ..BlockArgs::default()
            });
            // SAFETY: each mapping was allocated above with the size its view needs, is page-aligned and lives in
            // the block beside its view; the kernel follows the ring protocol (atomic header words, entries read or
            // written only on the right side of the tail).
            let (request_ring, completion_ring) =
                unsafe { (RequestRing::new(requests.host_ptr(), ring), CompletionRing::new(dcq.host_ptr(), ring)) };
            blocks.push(HostBlock {
                index: channel.index,
                request_ring,
                completion_ring,
                control,
                _request_mapping: requests,
                _dcq_mapping: dcq,
                producer: Mutex::new(Producer::default()),
                inflight: Mutex::new(InFlightTable::new(depth as usize)),
                drained: AtomicU32::new(0),
                completions: AtomicU64::new(0),
                unmatched: AtomicU64::new(0),
                undecodable: AtomicU64::new(0),
                corrupt_tails: AtomicU64::new(0),
                drain_lock: Mutex::new({
                    // The SQE log walk starts where the channel's log stands before the block posts anything.
                    let mut scratch = DrainScratch::default();
                    scratch.records.start_at(observation.as_deref(), channel.index);
                    scratch
                }),
                trace: Mutex::new(None),
            });
        }
        let header = KernelArgs {
            blocks: (kernel_args.device_addr() + KERNEL_ARGS_BLOCKS_OFFSET as u64).into(),
            block_count: (channels.len() as u32).into(),
            layout_version: LAYOUT_VERSION.into(),
        };
        // SAFETY: the mapping holds the header at 0 and the block array at KERNEL_ARGS_BLOCKS_OFFSET (sized by
        // kernel_args_bytes above); no kernel runs yet.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_bytes().as_ptr(), kernel_args.host_ptr(), header.as_bytes().len());
            std::ptr::copy_nonoverlapping(
                block_args.as_bytes().as_ptr(),
                kernel_args.host_ptr().add(KERNEL_ARGS_BLOCKS_OFFSET),
                block_args.as_bytes().len(),
            );
        }
        // Where no device log shows who did the acts (the vendor's runtime), the acts are self-reported and every
        // transfer takes Host marks at submit and drain (`observe::HostMark`).
        let host_marks = observation.as_ref().and_then(|logs| logs.channel_log_position(0)).is_none();
        let inner = Arc::new(Inner {
            device,
            memory,
            observation,
            host_marks,
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
            unattributed_calls: CpuCarry::default(),
            uncharged_launches: CpuCarry::default(),
            attached_waiters: AtomicU32::new(0),
            last_detach: Mutex::new(None),
            host_finished: AtomicU32::new(0),
            wait_pace: super::pace::WaitPace::default(),
            tracer: std::sync::OnceLock::new(),
            rdma,
        });
        if inner.launch_mode == LaunchMode::Persistent {
            inner.launch()?;
            // The persistent kernel's one launch is made for the whole run, not for any transfer.
            inner.uncharged_launches.take();
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
}

/// Slack the kernel's wait budget keeps beyond the NIC's retry schedule.
const RDMA_BUDGET_SLACK: std::time::Duration = std::time::Duration::from_millis(100);

/// The kernel's completion wait budget: `kernel_wait_budget`, and with the RDMA route at least the NIC's whole retry
/// schedule (`(rdma_retry_count + 1) x rdma_timeout`, plus [`RDMA_BUDGET_SLACK`]), so that a peer that stops
/// answering shows as the NIC's "transport retry count exceeded" CQE rather than as a kernel timeout.
pub(super) fn kernel_wait_budget(options: &AivOptions, rdma: bool) -> std::time::Duration {
    if !rdma {
        return options.kernel_wait_budget;
    }
    let schedule = options.rdma_timeout * (u32::from(options.rdma_retry_count) + 1) + RDMA_BUDGET_SLACK;
    options.kernel_wait_budget.max(schedule)
}
