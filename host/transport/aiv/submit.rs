//! Submit: placing a batch on the blocks, and the one sequence that hands requests to a block (write the backlog
//! into the ring, publish the tail; the kernel polls it).
//!
//! Owns: block placement (a thread's home block, contiguous runs), the per-block backlog and the completion tickets.
//! It must not drain completions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::MutexGuard;

use zerocopy::little_endian::{U32, U64};

use super::block::{HostBlock, Producer};
use super::inflight::{InFlight, PostedOn};
use super::observe::HostMark;
use super::rdma::Route;
use super::Inner;
use crate::config::LaunchMode;
use crate::cpu_time::Section;
use crate::kernel_abi::{RequestEntry, REQUEST_OPCODE_READ, REQUEST_OPCODE_WRITE};
use crate::trace::{now_ns, Tracer};
use crate::transfer::{FailureKind, Opcode, SegmentId, Transfer, TransferFailure};
use crate::transport::window::Resolved;

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
pub(super) fn encode_ticket(block: u32, position: u32) -> u64 {
    ((u64::from(block) + 1) << 32) | u64::from(position)
}

/// The block and ring position of a ticket of [`encode_ticket`].
pub(super) fn decode_ticket(ticket: u64) -> Option<(u32, u32)> {
    let block = u32::try_from(ticket >> 32).ok()?.checked_sub(1)?;
    Some((block, ticket as u32))
}

impl HostBlock {
    /// Hands the backlog to the kernel as far as the ring has room: writes the entries, records each transfer in
    /// flight with its ticket, publishes the tail once and releases the producer lock (the kernel polls its ring:
    /// nothing wakes it). Returns how many requests were published. The only place requests enter a ring.
    /// `trace`: the tracer and device id while tracing is on: the publish moment of each request is recorded, read
    /// just before the tail's release store (the kernel sees the requests after it).
    pub(super) fn post_backlog(&self, mut producer: MutexGuard<'_, Producer>, trace: Option<(&Tracer, i32)>) -> u32 {
        if producer.backlog.is_empty() {
            return 0;
        }
        let mut traced_ids = Vec::new();
        let Producer { tail, backlog } = &mut *producer;
        let mut batch = self.request_ring.batch(tail, self.drained.load(Ordering::Acquire));
        let mut table = self.inflight_map();
        while let Some((entry, inflight)) = backlog.pop_front() {
            match batch.push(entry) {
                Ok(position) => {
                    inflight.slot.set_ticket(encode_ticket(self.index, position));
                    table.insert(self.request_ring.index().slot(position) as usize, entry.transfer_id.get(), inflight);
                    if trace.is_some() {
                        traced_ids.push(entry.transfer_id.get());
                    }
                }
                Err(entry) => {
                    backlog.push_front((entry, inflight));
                    break;
                }
            }
        }
        drop(table);
        if let Some((tracer, device)) = trace {
            tracer.requests_published(device, traced_ids, now_ns());
        }
        let published = batch.commit();
        drop(producer);
        // The kernel polls its ring: publishing is all the Host does.
        published
    }
}

/// The request entry of `transfer` with id `id` between device addresses `src` and `dst` (route SDMA: no flags).
fn request_entry(id: u64, src: u64, dst: u64, transfer: &Transfer) -> RequestEntry {
    RequestEntry {
        transfer_id: U64::new(id),
        src_addr: U64::new(src),
        dst_addr: U64::new(dst),
        length: U64::new(transfer.length),
        opcode: U32::new(match transfer.opcode {
            Opcode::Read => REQUEST_OPCODE_READ,
            Opcode::Write => REQUEST_OPCODE_WRITE,
        }),
        ..RequestEntry::default()
    }
}

impl Inner {
    /// The request entry of one transfer on block `block`, by the route its peer takes; `None` after failing the
    /// transfer (it cannot be resolved or has no route).
    fn resolve_entry(
        &self,
        block: usize,
        id: u64,
        host_mark: HostMark,
        transfer: Transfer,
        last_peer: &mut Option<(
            std::sync::Arc<crate::transfer::Segment>,
            std::sync::Arc<crate::transport::window::Peer>,
        )>,
    ) -> Option<(RequestEntry, InFlight)> {
        if transfer.target.id != SegmentId::LOCAL {
            let peer = match self.windows.peer_with(&transfer.target, last_peer) {
                Ok(peer) => peer,
                Err(error) => {
                    transfer.slot.fail(error.failure("aiv"));
                    return None;
                }
            };
            match self.rdma.route(&transfer.target.name, peer.advertisement()) {
                Err(reason) => {
                    transfer.slot.fail(TransferFailure::new("aiv", FailureKind::Unreachable, reason));
                    return None;
                }
                Ok(Route::Rdma) => {
                    let prepared = self.rdma.prepare(
                        block,
                        &transfer.target.name,
                        peer.advertisement(),
                        transfer.local_addr,
                        transfer.remote_addr,
                        transfer.length,
                    );
                    let request = match prepared {
                        Ok(request) => request,
                        Err((kind, reason)) => {
                            transfer.slot.fail(TransferFailure::new("aiv", kind, reason));
                            return None;
                        }
                    };
                    // The remote side is the target's own address (not translated).
                    let (src, dst) = match transfer.opcode {
                        Opcode::Read => (transfer.remote_addr, transfer.local_addr),
                        Opcode::Write => (transfer.local_addr, transfer.remote_addr),
                    };
                    let entry = RequestEntry {
                        flags: U32::new(request.flags),
                        lkey: U32::new(request.lkey),
                        rkey: U32::new(request.rkey),
                        ..request_entry(id, src, dst, &transfer)
                    };
                    let inflight = InFlight {
                        slot: transfer.slot,
                        peer: Some(peer.id()),
                        length: transfer.length,
                        rdma: Some(PostedOn { slot: request.slot, qpn: request.qpn }),
                        host_mark,
                    };
                    return Some((entry, inflight));
                }
                Ok(Route::Sdma) => {}
            }
        }
        let Resolved { src, dst, peer } = match self.windows.resolve_with(&transfer, last_peer) {
            Ok(resolved) => resolved,
            Err(error) => {
                transfer.slot.fail(error.failure("aiv"));
                return None;
            }
        };
        let entry = request_entry(id, src, dst, &transfer);
        Some((entry, InFlight { slot: transfer.slot, peer, length: transfer.length, rdma: None, host_mark }))
    }

    /// Resolves the batch's transfers into request entries, spreads them over the blocks and posts them.
    pub(super) fn submit(&self, transfers: Vec<Transfer>) {
        // A section that never sleeps (see cpu_time::Section): ring writes (the kernel polls them: no wake-up). A
        // lock held by a draining thread may make it wait: counted too. The first transfer to a peer imports its
        // memory and a per-batch launch calls the runtime: both may block, and count their CPU time only.
        let section = Section::start();
        // Device-runtime calls this submit makes (a first import, a per-batch launch), counted by the loader tables.
        let calls = ascendcl_sys::calls::thread_total();
        // Where the acts are self-reported: every Host act from here to the drain counts against these transfers.
        let host_mark = if self.host_marks { HostMark::now() } else { HostMark::default() };
        let blocks = self.blocks.len();
        // The batch goes to the blocks in equal contiguous runs. The first run goes to the calling thread's home
        // block when nothing is in flight there (a thread that waits for each transfer keeps to one block, and the
        // other blocks' kernels can go idle), else to the other blocks in turn (so back-to-back submits spread over
        // the blocks). Ids are reserved once per submit (the counter is shared by every thread). No staging copy:
        // each run is resolved straight into its block's backlog and published from there.
        let run_length = transfers.len().div_ceil(blocks).max(1);
        let home = home_block(&self.next_home) % blocks;
        let first_block = if blocks == 1 || self.blocks[home].is_idle() {
            home
        } else {
            home + 1 + self.next_block.fetch_add(1, Ordering::Relaxed) % (blocks - 1)
        };
        let mut next_id = self.next_transfer_id.fetch_add(transfers.len() as u64, Ordering::Relaxed);
        let mut accepted = 0u64;
        let mut last_peer = None;
        let mut transfers = transfers.into_iter().peekable();
        let mut resolved = Vec::with_capacity(run_length);
        for run in 0..blocks {
            if transfers.peek().is_none() {
                break;
            }
            let block_index = first_block.wrapping_add(run) % blocks;
            let block = &self.blocks[block_index];
            // Resolved before the producer lock is taken: a first transfer to an RDMA peer sets its QP up (a bounded
            // handshake), which must not hold the block's producer.
            resolved.clear();
            for transfer in transfers.by_ref().take(run_length) {
                let id = next_id;
                next_id += 1;
                if let Some(entry) = self.resolve_entry(block_index, id, host_mark, transfer, &mut last_peer) {
                    resolved.push(entry);
                }
            }
            accepted += resolved.len() as u64;
            let mut producer = block.producer.lock().unwrap_or_else(|p| p.into_inner());
            producer.backlog.extend(resolved.drain(..));
            block.post_backlog(producer, self.active_tracer().map(|tracer| (tracer, self.trace_device())));
        }
        if accepted > 0 && self.launch_mode == LaunchMode::PerBatch {
            // A runtime launch call may block (see cpu_time::may_sleep).
            if let Err(error) = crate::cpu_time::may_sleep(|| self.launch()) {
                tracing::error!(%error, "kernel launch failed; the watchdog will time the transfers out");
            }
        }
        // The whole submit (ring writes, a per-batch launch) is charged to the
        // transfers drained next, its device-runtime calls too.
        self.unattributed_cpu.add(section.elapsed_ns());
        self.unattributed_calls.add(ascendcl_sys::calls::thread_total().saturating_sub(calls));
    }
}
