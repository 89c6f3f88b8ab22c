//! The `adxl-fabric` baseline: Ascend Direct with HiXL's FabricMem engine, **on the twin runtime only**. The vendor's
//! FabricMem engine has no C API (it is reached only through ADXL's C++ engine, `adxl::AdxlEngine` with
//! `EnableUseFabricMem`), so this path drives the twin runtime's FabricMem functions ([`FabricMemApi`], twin-only, not
//! a CANN API) through [`HixlAccess::fabric_mem_api`]; on the vendor's runtime every transfer fails saying so.
//!
//! - **Engine** (one per device, created with the transport on a thread bound to the device): its control server
//!   listens at `aiv.hixl_host` (the adxl baseline's HiXL host) : `aiv.fabric_mem_port` (0: a port the OS reports
//!   free, tried again with a new one up to 8 times), advertised in the device's `aiv` object as
//!   `fabric_mem_server`. AI-CPU unfold or Host unfold and the Host unfold's streams are `aiv.fabric_memory`
//!   ([`crate::config::FabricMemoryOptions`]). Every region the device exports (on `cann`: its VMM heap) is
//!   registered with it. An engine that cannot start is logged and not advertised: its transfers, and peers'
//!   transfers to it, fail NOT_CONNECTED naming that.
//! - **Connect**: on the first transfer to a peer (by its advertised server), bounded by `baseline_timeout`; a
//!   failure is NOT_CONNECTED and the next transfer tries again. A transfer the engine failed forgets the peer (the
//!   engine forgets a peer whose control connection closed): the next one connects again.
//! - **Transfers**: consecutive queued transfers to one peer with one direction become one list of `[local, remote,
//!   len]` (addresses as both engines registered them: the engine relocates), submitted with
//!   `cannTwinFabricMemTransfer` (Async) and polled with `cannTwinFabricMemQuery` until a final status or
//!   `baseline_timeout`. Statuses map as the adxl baseline's ([`AdxlStatus`]): completed, FAILED 503900, TIMEOUT
//!   103901 (also when still waiting at the deadline), a refused call its code. Failures name the path
//!   `adxl-fabric`.
//! - **Peer loss**: as adxl, a peer the device's probe found gone is refused at once (NOT_CONNECTED); a peer whose
//!   control connection closed fails its batch (FAILED) within the timeout.
//!
//! Evidence (docs/evidence.md): the engine's twin-only records (`cannTwinFabricMemEvidence`) read before the submit
//! and after the final status, as the adxl baseline reads a HiXL client's: SQEs, doorbells and flags of its AI-CPU
//! launches by who did each (`by_aicpu`, ...), each Host runtime copy (`aclrtMemcpyAsync` of the Host unfold) a
//! descriptor, a doorbell and a completion by the Host, the AI-CPU launches as `host_launches` (1/k per transfer of a
//! batch of k). The verdict comes from those counts, never from the option.

use std::collections::HashSet;
use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::{CannTwinHixlEvidence, FabricMemApi};

use super::hixl::BatchActs;
use super::jobs::{batches, JobQueue};
use super::{AdxlCounters, AdxlStatus, Counters};
use crate::config::{AivOptions, FabricMemoryOptions};
use crate::cpu_time::{thread_cpu_time_ns, CpuCarry, Section};
use crate::device::{DeviceAdvertisement, HixlAccess, MemorySharing};
use crate::evidence::TransferEvidence;
use crate::transfer::{FailureKind, Opcode, TaskSlot, Transfer};
use crate::transport::window::PeerWindows;
use crate::transport::Transport;

/// The path name of evidence and failures.
pub const PATH: &str = "adxl-fabric";
/// Most operations in one batch.
pub const MAX_BATCH_ENTRIES: usize = 1024;
/// Attempts at a port the OS reported free before the engine gives up.
const FREE_PORT_ATTEMPTS: u32 = 8;
/// `adxl::TransferStatus` values of `cannTwinFabricMemQuery`.
const STATUS_WAITING: i32 = 0;
const STATUS_COMPLETED: i32 = 1;
const STATUS_TIMEOUT: i32 = 2;
const STATUS_FAILED: i32 = 3;

/// The device's FabricMem engine.
#[derive(Debug)]
struct Engine {
    api: &'static FabricMemApi,
    handle: u64,
    address: String,
}

#[derive(Debug)]
struct Job {
    slot: Arc<TaskSlot>,
    opcode: Opcode,
    local: u64,
    remote: u64,
    length: u64,
    /// The peer engine's advertised control server.
    server: String,
    submit_cpu_ns: u64,
}

#[derive(Debug)]
struct Shared {
    /// The device's memory: what the engine registers and transfers may name.
    device: Arc<dyn MemorySharing>,
    windows: Arc<PeerWindows>,
    timeout: Duration,
    /// Host unfold (`aiv.fabric_memory.enable_aicpu_unfold` false): only to explain a refused batch.
    host_unfold: bool,
    counters: Counters,
    carry: CpuCarry,
    /// The engine, or why there is none.
    engine: Result<Engine, String>,
    queue: JobQueue<Job>,
}

/// The adxl-fabric transport of one device.
#[derive(Debug)]
pub struct AdxlFabricTransport {
    shared: Arc<Shared>,
    worker: Mutex<Option<Result<JoinHandle<()>, String>>>,
}

/// Creates the device's engine (its control server listening) and registers the device's exported regions.
fn start_engine(
    api: &'static FabricMemApi,
    device: &dyn MemorySharing,
    options: &AivOptions,
    fabric: FabricMemoryOptions,
) -> Result<Engine, String> {
    let host = match &options.hixl_host {
        Some(host) => host.clone(),
        None => std::env::var("AIV_HIXL_HOST").unwrap_or_else(|_| "127.0.0.1".into()),
    };
    // The engine is named by a literal address.
    let ip = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), 0))
        .ok()
        .and_then(|mut addresses| addresses.next())
        .map(|address| address.ip())
        .ok_or_else(|| format!("the HiXL host {host:?} does not resolve to an address"))?;
    device.bind_thread().map_err(|error| error.to_string())?;
    let configured = (options.fabric_mem_port != 0).then_some(options.fabric_mem_port);
    let attempts = if configured.is_some() { 1 } else { FREE_PORT_ATTEMPTS };
    let mut last = String::new();
    for _ in 0..attempts {
        let port = match configured {
            Some(port) => port,
            None => std::net::TcpListener::bind((ip, 0))
                .and_then(|listener| listener.local_addr())
                .map_err(|error| format!("find a free port on {ip} for the FabricMem engine: {error}"))?
                .port(),
        };
        let address = std::net::SocketAddr::new(ip, port).to_string();
        let name = CString::new(address.clone()).map_err(|_| "the engine's address has a NUL".to_owned())?;
        let mut handle = 0u64;
        // SAFETY: a live NUL-terminated name and a writable handle.
        let code = unsafe {
            api.cannTwinFabricMemCreate(
                name.as_ptr(),
                u32::from(fabric.enable_aicpu_unfold),
                fabric.task_stream_num,
                &mut handle,
            )
        };
        if code != 0 {
            last = format!("create the FabricMem engine at {address}: {}", AdxlStatus(code as i32).name());
            continue;
        }
        let engine = Engine { api, handle, address };
        for region in &device.advertisement().regions {
            let mut registration = 0u64;
            // SAFETY: the region is the device's exported memory, mapped while the device lives (the transport holds
            // the device and destroys the engine first).
            let code =
                unsafe { api.cannTwinFabricMemRegister(handle, region.addr, region.length, 0, &mut registration) };
            if code != 0 {
                let status = AdxlStatus(code as i32).name();
                return Err(format!(
                    "register [{:#x}, +{}) with the FabricMem engine: {status}",
                    region.addr, region.length
                ));
            }
        }
        return Ok(engine);
    }
    if attempts > 1 {
        last.push_str(&format!(" (the last of {attempts} ports the OS reported free)"));
    }
    Err(last)
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: the engine's own handle, destroyed once.
        let _ = unsafe { self.api.cannTwinFabricMemDestroy(self.handle) };
    }
}

impl AdxlFabricTransport {
    /// The transport for `device`: its FabricMem engine starts now (twin runtime), its connections with the first
    /// transfer to each peer.
    pub fn new(
        device: Arc<dyn MemorySharing>,
        hixl: Option<&dyn HixlAccess>,
        windows: Arc<PeerWindows>,
        options: &AivOptions,
    ) -> Self {
        let engine = match hixl.map(HixlAccess::fabric_mem_api) {
            None => Err(format!(
                "device {} ({}) has no FabricMem engine for the adxl-fabric baseline",
                device.device_id(),
                device.backend_name()
            )),
            Some(Err(reason)) => Err(reason),
            Some(Ok(api)) => start_engine(api, device.as_ref(), options, options.fabric_memory),
        };
        if let Err(reason) = &engine {
            tracing::info!(device = device.device_id(), %reason, "adxl-fabric unavailable");
        }
        let shared = Arc::new(Shared {
            device,
            windows,
            timeout: options.baseline_timeout,
            host_unfold: !options.fabric_memory.enable_aicpu_unfold,
            counters: Counters::default(),
            carry: CpuCarry::default(),
            engine,
            queue: JobQueue::new(),
        });
        AdxlFabricTransport { shared, worker: Mutex::new(None) }
    }

    /// Where this device's FabricMem control server listens (`"ip:port"`), advertised to peers.
    pub fn server_address(&self) -> Option<String> {
        self.shared.engine.as_ref().ok().map(|engine| engine.address.clone())
    }

    /// Transport-wide counters (FabricMem engines connected, batches, timeouts, failures).
    pub fn counters(&self) -> AdxlCounters {
        self.shared.counters.snapshot()
    }

    fn ensure_worker(&self) -> Result<(), String> {
        self.shared.engine.as_ref().map_err(Clone::clone)?;
        let mut worker = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        if worker.is_none() {
            let shared = self.shared.clone();
            // Once: starts a thread (may block; see cpu_time::may_sleep).
            *worker = Some(crate::cpu_time::may_sleep(|| {
                std::thread::Builder::new()
                    .name(format!("adxl-fabric-{}", shared.device.device_id()))
                    .spawn(move || Worker { shared, connected: HashSet::new(), abandoned: Vec::new() }.run())
                    .map_err(|e| format!("start the adxl-fabric Host thread: {e}"))
            }));
        }
        match worker.as_ref() {
            Some(Ok(_)) => Ok(()),
            Some(Err(reason)) => Err(reason.clone()),
            None => Err("adxl-fabric Host thread not started".into()),
        }
    }
}

impl Transport for AdxlFabricTransport {
    fn name(&self) -> &'static str {
        PATH
    }

    /// Checks each transfer and queues it for the Host thread.
    fn submit(&self, transfers: Vec<Transfer>) {
        let section = Section::start();
        if let Err(reason) = self.ensure_worker() {
            for transfer in transfers {
                transfer.slot.fail(AdxlStatus::FAILED.failure_at(PATH, reason.clone()));
            }
            return;
        }
        let device = &self.shared.device;
        let mut jobs = Vec::with_capacity(transfers.len());
        for transfer in transfers {
            let refuse = |status: AdxlStatus, detail: String| transfer.slot.fail(status.failure_at(PATH, detail));
            if !device.is_own_memory(transfer.local_addr, transfer.length) {
                refuse(
                    AdxlStatus::PARAM_INVALID,
                    format!(
                        "local range [{:#x}, +{}) is not memory registered with the FabricMem engine of device {}",
                        transfer.local_addr,
                        transfer.length,
                        device.device_id()
                    ),
                );
                continue;
            }
            if let Some(reason) = self.shared.windows.lost_reason_of(&transfer.target) {
                transfer.slot.fail(AdxlStatus::NOT_CONNECTED.failure_on(PATH, FailureKind::PeerLost, reason));
                continue;
            }
            let advertisement = transfer
                .target
                .descriptor
                .aiv
                .clone()
                .and_then(|value| serde_json::from_value::<DeviceAdvertisement>(value).ok());
            let Some(advertisement) = advertisement else {
                refuse(
                    AdxlStatus::NOT_CONNECTED,
                    format!("segment {:?} advertises no device (no aiv object)", transfer.target.name),
                );
                continue;
            };
            let Some(server) = advertisement.fabric_mem_server.clone() else {
                refuse(
                    AdxlStatus::NOT_CONNECTED,
                    format!(
                        "segment {:?} advertises no FabricMem engine (its device is not on the twin runtime, its engine \
                         did not start, or it runs an older version: see its log)",
                        transfer.target.name
                    ),
                );
                continue;
            };
            let inside = advertisement.regions.iter().any(|region| {
                transfer.remote_addr >= region.addr
                    && transfer
                        .remote_addr
                        .checked_add(transfer.length)
                        .is_some_and(|end| end <= region.addr.saturating_add(region.length))
            });
            if !inside {
                refuse(
                    AdxlStatus::PARAM_INVALID,
                    format!(
                        "remote range [{:#x}, +{}) is outside the memory segment {:?} registered with its FabricMem \
                         engine",
                        transfer.remote_addr, transfer.length, transfer.target.name
                    ),
                );
                continue;
            }
            jobs.push(Job {
                opcode: transfer.opcode,
                local: transfer.local_addr,
                remote: transfer.remote_addr,
                length: transfer.length,
                server,
                slot: transfer.slot,
                submit_cpu_ns: 0,
            });
        }
        let share_mark = section.elapsed_ns();
        let share = share_mark / jobs.len().max(1) as u64;
        for job in &mut jobs {
            job.submit_cpu_ns = share;
        }
        self.shared.queue.push(jobs);
        self.shared.carry.add(section.elapsed_ns().saturating_sub(share_mark));
    }
}

impl Drop for AdxlFabricTransport {
    fn drop(&mut self) {
        self.shared.queue.stop();
        if let Some(Ok(thread)) = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // Bounded: the thread's longest wait is one connect or one batch poll of `baseline_timeout`.
            let _ = thread.join();
        }
        for job in self.shared.queue.drain() {
            job.slot.fail(AdxlStatus::FAILED.failure_on(PATH, FailureKind::Shutdown, "transport shut down"));
        }
        // The engine is destroyed with `shared` (its last holder was the thread, joined above).
        let _ = self.shared.device.bind_thread();
    }
}

/// The engine's twin-only records, when the table has the function and the engine answers.
fn records(engine: &Engine) -> Option<CannTwinHixlEvidence> {
    let mut out = CannTwinHixlEvidence::new();
    // SAFETY: a whole structure whose header says so.
    match unsafe { engine.api.cannTwinFabricMemEvidence(engine.handle, &mut out) } {
        Ok(0) => Some(out),
        _ => None,
    }
}

/// What the Host thread owns: the peers connected, the requests abandoned at their deadline.
struct Worker {
    shared: Arc<Shared>,
    connected: HashSet<String>,
    abandoned: Vec<u64>,
}

impl Worker {
    fn run(mut self) {
        if let Err(error) = self.shared.device.bind_thread() {
            tracing::error!(%error, "adxl-fabric: Host thread cannot bind the device");
        }
        let mut cpu_mark = thread_cpu_time_ns();
        while let Some(jobs) = self.shared.queue.wait() {
            self.reap_abandoned();
            let together = |first: &Job, next: &Job| next.server == first.server && next.opcode == first.opcode;
            for batch in batches(jobs, MAX_BATCH_ENTRIES, together) {
                self.run_batch(batch, &mut cpu_mark);
            }
        }
    }

    /// Queries requests abandoned at their deadline once more, so final ones are released (the engine ends each by
    /// its own deadline).
    fn reap_abandoned(&mut self) {
        let Ok(engine) = self.shared.engine.as_ref() else { return };
        self.abandoned.retain(|&request| {
            let mut status = STATUS_WAITING;
            // SAFETY: the engine's request; a writable status.
            let code = unsafe { engine.api.cannTwinFabricMemQuery(engine.handle, request, &mut status) };
            code == 0 && status == STATUS_WAITING
        });
    }

    /// Connects the engine to the peer at `server` unless it is connected.
    fn connect(&mut self, engine: &Engine, server: &str) -> Result<(), (AdxlStatus, String)> {
        if self.connected.contains(server) {
            return Ok(());
        }
        let name = CString::new(server).map_err(|_| (AdxlStatus::PARAM_INVALID, "the server has a NUL".into()))?;
        let timeout_ms = u32::try_from(self.shared.timeout.as_millis()).unwrap_or(u32::MAX).max(1);
        // SAFETY: a live NUL-terminated name.
        let code = unsafe { engine.api.cannTwinFabricMemConnect(engine.handle, name.as_ptr(), timeout_ms) };
        // ALREADY_CONNECTED (103903): the engine still knows the peer.
        if code != 0 && code != 103_903 {
            let status = AdxlStatus(code as i32);
            return Err((
                AdxlStatus::NOT_CONNECTED,
                format!("connect to the FabricMem engine at {server} within {timeout_ms} ms: {}", status.name()),
            ));
        }
        self.shared.counters.connects.fetch_add(1, Ordering::Relaxed);
        self.connected.insert(server.to_owned());
        Ok(())
    }

    /// Forgets the peer at `server` (the engine too), so the next transfer to it connects again.
    fn forget(&mut self, engine: &Engine, server: &str) {
        self.connected.remove(server);
        if let Ok(name) = CString::new(server) {
            // SAFETY: a live NUL-terminated name.
            let _ = unsafe { engine.api.cannTwinFabricMemDisconnect(engine.handle, name.as_ptr()) };
        }
    }

    /// Submits one batch, polls it to a final status or the deadline, finishes every task.
    fn run_batch(&mut self, group: Vec<Job>, cpu_mark: &mut u64) {
        let shared = self.shared.clone();
        let Ok(engine) = shared.engine.as_ref() else { return };
        shared.counters.groups.fetch_add(1, Ordering::Relaxed);
        let server = group[0].server.clone();
        let connect_before = ascendcl_sys::calls::thread_total();
        let connected = self.connect(engine, &server);
        let connect_calls = ascendcl_sys::calls::thread_total().saturating_sub(connect_before);
        let before = records(engine);
        let batch_before = ascendcl_sys::calls::thread_total();
        let outcome = connected.and_then(|()| self.transfer(engine, &group));
        let batch_calls = ascendcl_sys::calls::thread_total().saturating_sub(batch_before);
        match &outcome {
            Ok(()) => {}
            Err((status, _)) => {
                let counter =
                    if *status == AdxlStatus::TIMEOUT { &shared.counters.timeouts } else { &shared.counters.failures };
                counter.fetch_add(1, Ordering::Relaxed);
                if *status == AdxlStatus::FAILED || *status == AdxlStatus::NOT_CONNECTED {
                    self.forget(engine, &server);
                }
            }
        }
        let acts = match (&outcome, before) {
            // Nothing was handed to the engine: no act.
            (Err((AdxlStatus::NOT_CONNECTED, _)), _) if !self.connected.contains(&server) => {
                BatchActs::observed(Some(CannTwinHixlEvidence::new()), Some(CannTwinHixlEvidence::new()))
            }
            (_, before) => BatchActs::observed(before, records(engine)),
        };
        let now = thread_cpu_time_ns();
        let k = group.len() as u64;
        let share = (now.saturating_sub(*cpu_mark) + shared.carry.take()) / k;
        *cpu_mark = now;
        let per_job = batch_calls.div_ceil(k);
        for (index, job) in group.into_iter().enumerate() {
            let mut evidence = TransferEvidence::new(PATH, shared.device.runtime_label());
            evidence.window = u32::try_from(k).unwrap_or(u32::MAX);
            evidence.descriptors_written = acts.descriptors;
            evidence.doorbells_rung = acts.doorbells;
            evidence.completion_seen = acts.completion;
            evidence.host_device_api_calls = per_job + if index == 0 { connect_calls } else { 0 };
            evidence.host_launches = acts.launches as f64 / k as f64;
            evidence.descriptors = acts.descriptor_count.div_ceil(k);
            evidence.doorbells = acts.doorbell_count.div_ceil(k);
            evidence.host_cpu_ns = job.submit_cpu_ns + share;
            match &outcome {
                Ok(()) => {
                    job.slot.complete(job.length, evidence);
                }
                Err((status, detail)) => {
                    job.slot.fail_with_evidence(status.failure_at(PATH, detail.clone()), evidence);
                }
            }
        }
    }

    /// `cannTwinFabricMemTransfer` (Async) of the group, then `cannTwinFabricMemQuery` until a final status or
    /// `baseline_timeout`.
    fn transfer(&mut self, engine: &Engine, group: &[Job]) -> Result<(), (AdxlStatus, String)> {
        let timeout = self.shared.timeout;
        let name = CString::new(group[0].server.as_str())
            .map_err(|_| (AdxlStatus::PARAM_INVALID, "the server has a NUL".to_owned()))?;
        let ops: Vec<u64> = group.iter().flat_map(|job| [job.local, job.remote, job.length]).collect();
        let write = i32::from(group[0].opcode == Opcode::Write);
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        let mut request = 0u64;
        // SAFETY: `3 len` readable words, a live name, a writable request id.
        let code = unsafe {
            engine.api.cannTwinFabricMemTransfer(
                engine.handle,
                name.as_ptr(),
                write,
                ops.as_ptr(),
                group.len() as u64,
                timeout_ms,
                &mut request,
            )
        };
        if code != 0 {
            let status = AdxlStatus(code as i32);
            let detail = if status == AdxlStatus::PARAM_INVALID {
                let (first, last) = (&group[0], &group[group.len() - 1]);
                format!(
                    "the FabricMem engine refused the batch of {} (local [{:#x}, +{}) .. [{:#x}, +{}), remote \
                     [{:#x}, +{}) ..): a range outside the memory registered with the engines",
                    group.len(),
                    first.local,
                    first.length,
                    last.local,
                    last.length,
                    first.remote,
                    first.length
                )
            } else {
                let unaligned = group.iter().any(|job| job.local % 64 != 0 || job.remote % 64 != 0);
                let hint = if self.shared.host_unfold && unaligned {
                    " (the Host unfold's stream copies, device to device, need 64-byte-aligned addresses; a batch has \
                     an unaligned one)"
                } else {
                    ""
                };
                format!("the FabricMem engine refused the batch (peer {}): {}{hint}", group[0].server, status.name())
            };
            return Err((status, detail));
        }
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            let mut status = STATUS_WAITING;
            // SAFETY: the engine's request, not yet seen final; a writable status.
            let code = unsafe { engine.api.cannTwinFabricMemQuery(engine.handle, request, &mut status) };
            if code != 0 {
                let status = AdxlStatus(code as i32);
                return Err((status, format!("status query failed: {}", status.name())));
            }
            match status {
                STATUS_COMPLETED => return Ok(()),
                STATUS_FAILED => {
                    return Err((AdxlStatus::FAILED, "the FabricMem engine reported the batch FAILED".into()))
                }
                STATUS_TIMEOUT => {
                    return Err((AdxlStatus::TIMEOUT, "the FabricMem engine reported the batch TIMEOUT".into()))
                }
                STATUS_WAITING => {}
                other => return Err((AdxlStatus::FAILED, format!("the FabricMem engine reported status {other}"))),
            }
            if Instant::now() >= deadline {
                self.abandoned.push(request);
                return Err((AdxlStatus::TIMEOUT, format!("the FabricMem batch did not complete within {timeout:?}")));
            }
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_the_path_and_keep_the_adxl_code() {
        let failure = AdxlStatus::PARAM_INVALID.failure_at(PATH, "range");
        assert_eq!(failure.to_string(), "adxl-fabric: PARAM_INVALID (103900): range");
        assert_eq!(AdxlStatus::of_failure(&failure), AdxlStatus::PARAM_INVALID);
        assert_eq!(AdxlStatus::TIMEOUT.failure_at(PATH, "late").state(), AdxlStatus::TIMEOUT.task_state());
    }
}
