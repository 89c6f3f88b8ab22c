//! The `adxl` baseline's submission backend on the `cann` device backend: the real HiXL library
//! (`libcann_hixl.so`, or the twin runtime's HiXL: [`crate::device::HixlAccess::hixl_api`]) through its plain C
//! client/server API ([`ascendcl_sys::hixl`]).
//!
//! - **Server** (one per device, started with the transport): `HixlCSServerCreate` with this device's endpoint at
//!   `aiv.hixl_host` (default `AIV_HIXL_HOST`, else the host of `local_hostname`; `127.0.0.1` for a device opened
//!   without an engine) : `aiv.hixl_port` (default `AIV_HIXL_PORT`, else a port the OS reports free, tried again with a new one up to 8
//!   times if another socket took it first), then
//!   `HixlCSServerRegMem` of every region the device exports (on `cann`: its whole VMM heap), then
//!   `HixlCSServerListen`. Its `"ip:port"` is advertised in the device's `aiv` object (`hixl_server`). A server that
//!   cannot start is logged and not advertised: peers then fail NOT_CONNECTED naming that.
//! - **Client** (per remote engine and server address, on the adxl Host thread, cached): `HixlCSClientCreate(this
//!   device's endpoint -> the peer device's endpoint at its advertised server)`, `HixlCSClientRegMem` of this device's
//!   exported regions, `HixlCSClientConnect(baseline_timeout)`. A failure is NOT_CONNECTED with the HiXL code; the
//!   next transfer tries again.
//! - **Peer loss**: the device's peer state is shared with its other paths ([`crate::transport::window::PeerWindows`]):
//!   a transfer to a peer their probe found gone fails at once, NOT_CONNECTED naming the loss.
//! - **Transfers**: consecutive queued transfers to one peer with one direction become one list of
//!   `{remote_buf, local_buf, len}` (remote addresses as the peer's engine registered them: HiXL relocates, no
//!   import here), submitted with `HixlCSClientBatchPutAsync` (WRITE) or `...GetAsync` (READ), then polled with
//!   `HixlCSClientQueryCompleteStatus` until a final state or `baseline_timeout` (spin briefly, then 50 µs sleeps).
//!   Statuses: COMPLETED -> COMPLETED; FAILED -> FAILED 503900; TIMEOUT or still WAITING at the deadline -> TIMEOUT
//!   103901; a call that returns a code -> that code (PARAM_INVALID 103900 and others FAILED, TIMEOUT 103901 TIMEOUT).
//!   A batch abandoned at its deadline is queried again before later batches, so its handle is released.
//!
//! Evidence (docs/evidence.md, "The Host paths", adxl): the acts of one batch are shared by its k transfers (`window` k).
//! - **When the library keeps per-client records** (the twin runtime's HiXL exports the twin-only, optional
//!   `cannTwinHixlClientEvidence`; [`HixlApi`] resolves it or not): the batch's acts are the difference of the client's
//!   counts read before the submit and after the final status (`Source::TwinModel`): `descriptors_written` the SQEs
//!   its AI-CPU tasks had executed, by who wrote each (`by_aicpu`, ...); `doorbells_rung` the doorbells that exposed
//!   them, by ringer; `completion_seen` their flags, by first reader; for a batch the library moved over its wire path
//!   instead, each client-side runtime copy of its data is a descriptor, a doorbell and a completion by the Host.
//!   `host_launches`: the AI-CPU launches the library made for the batch (one per 128 entries), 1/k of them per
//!   transfer. Records that were off (`Source::NotRecorded`) or that the library could not read (`Source::Lost`)
//!   leave the acts unknown. A batch abandoned at its deadline may finish later: its acts then count in the next
//!   batch of that client.
//! - **When it does not** (the vendor's HiXL): who wrote the descriptors and rang the doorbells is not observable
//!   (`Source::NotObservable`; the vendor's HiXL runs a device endpoint's batches on AI-CPU kernels, which this
//!   process cannot see); `completion_seen` is the status queries (`HixlCSClientQueryCompleteStatus`) that returned
//!   the batch's final state (`Source::HostCalls`, 0 when the batch was abandoned at its deadline or a query failed);
//!   `host_launches` 0 (the library's launches are made inside it, through no table of this process).
//!
//! Host device-API calls per transfer: its share (1/k, rounded up) of every counted call made for the batch (submit
//! and all its status queries), plus, for the first transfer of the batch, every counted call made getting its client
//! (create, registrations and connect when the client is new, counted even when the connect fails). Not charged to any
//! transfer: the queries that reap batches abandoned earlier (their transfers were already finished), the thread's
//! device binding, and the twin-only evidence reads. `descriptors` and `doorbells` are the transfer's share (1/k,
//! rounded up) of the batch's counts (0 when not observable).
//!
//! Endpoints are [`EndpointDesc::device`] (HCCS, the device id as address and physical id): *unverified on
//! hardware*, like everything here; checked against the fake `libcann_hixl.so` only.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ascendcl_sys::hixl::{
    self, safe, CannTwinHixlEvidence, CommMem, CompleteHandle, EndpointDesc, HixlApi, HixlClientHandle,
    HixlOneSideOpDesc,
};

use super::jobs::{batches, JobQueue};
use super::{AdxlStatus, Shared};
use crate::cpu_time::{thread_cpu_time_ns, Section};
use crate::device::DeviceAdvertisement;
use crate::evidence::{Act, Source, TransferEvidence};
use crate::transfer::{Opcode, TaskSlot};
use crate::transport::Transfer;

/// Most entries in one HiXL batch (the library allows 4096 unqueried transfers per client).
pub const MAX_BATCH_ENTRIES: usize = 1024;
/// The protocol of the endpoints this backend describes (*assumed*: HCCS between NPUs of one server).
pub const ENDPOINT_PROTOCOL: hixl::CommProtocol = hixl::COMM_PROTOCOL_HCCS;

fn memory_tag(device: u32, index: usize) -> CString {
    CString::new(format!("aiv-npu{device}-region{index}")).unwrap_or_default()
}

/// The regions a device exports, as HiXL memory descriptions.
fn regions(advertisement: &DeviceAdvertisement) -> Vec<(CString, CommMem)> {
    advertisement
        .regions
        .iter()
        .enumerate()
        .map(|(index, region)| {
            let mem = CommMem { r#type: hixl::COMM_MEM_TYPE_DEVICE, addr: region.addr as *mut _, size: region.length };
            (memory_tag(advertisement.device_id, index), mem)
        })
        .collect()
}

/// This device's HiXL server.
struct Server {
    _server: safe::Server<'static>,
    address: String,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HixlServer").field("address", &self.address).finish()
    }
}

/// Attempts at a port the OS reported free before the server gives up: another socket (often an outgoing
/// connection's ephemeral port) can take it between the probe and `HixlCSServerListen`.
const FREE_PORT_ATTEMPTS: u32 = 8;

fn start_server(api: &'static HixlApi, shared: &Shared) -> Result<Server, String> {
    let device = shared.device.as_ref();
    let host = match &shared.hixl_host {
        Some(host) => host.clone(),
        None => std::env::var("AIV_HIXL_HOST").unwrap_or_else(|_| "127.0.0.1".into()),
    };
    let configured = match (shared.hixl_port, std::env::var("AIV_HIXL_PORT")) {
        (port, _) if port != 0 => Some(port),
        (_, Ok(value)) => {
            Some(value.trim().parse::<u16>().map_err(|_| format!("AIV_HIXL_PORT={value:?} is not a port number"))?)
        }
        (_, Err(_)) => None,
    };
    device.bind_thread().map_err(|error| error.to_string())?;
    let ip = CString::new(host.clone()).map_err(|_| format!("AIV_HIXL_HOST={host:?} has a NUL"))?;
    let endpoint = EndpointDesc::device(ENDPOINT_PROTOCOL, device.device_id());
    let memory = regions(&device.advertisement());
    let borrowed: Vec<(&std::ffi::CStr, CommMem)> = memory.iter().map(|(tag, mem)| (tag.as_c_str(), *mem)).collect();
    let attempts = if configured.is_some() { 1 } else { FREE_PORT_ATTEMPTS };
    let mut last = String::new();
    for _ in 0..attempts {
        let port = match configured {
            Some(port) => port,
            None => std::net::TcpListener::bind((host.as_str(), 0))
                .and_then(|listener| listener.local_addr())
                .map_err(|error| format!("find a free port on {host} for the HiXL server: {error}"))?
                .port(),
        };
        // SAFETY: the regions are the device's exported memory, mapped until the device drops; the transport (which
        // owns the server) holds the device, and drops the server first.
        match unsafe { safe::Server::start(api, &[endpoint], &ip, u32::from(port), &borrowed, 64) } {
            Ok(server) => return Ok(Server { _server: server, address: format!("{host}:{port}") }),
            Err(error) => last = format!("start the HiXL server at {host}:{port}: {error}"),
        }
    }
    if attempts > 1 {
        last.push_str(&format!(" (the last of {attempts} ports the OS reported free)"));
    }
    Err(last)
}

/// A connected client to one peer, with what its description points to.
struct Client {
    // Dropped first: unregisters and destroys before the data below goes.
    client: safe::Client<'static>,
    _endpoints: Box<[EndpointDesc; 2]>,
    _ip: CString,
}

#[derive(Debug)]
struct Job {
    slot: Arc<TaskSlot>,
    opcode: Opcode,
    local: u64,
    remote: u64,
    length: u64,
    /// The peer's segment name and its advertisement's server and device id.
    peer: String,
    server: String,
    peer_device: u32,
    submit_cpu_ns: u64,
}

impl Job {
    /// Clients are cached per peer segment and server address: a peer that restarted elsewhere gets a new client.
    fn client_key(&self) -> String {
        format!("{}@{}", self.peer, self.server)
    }
}

/// The HiXL loader-table counters the evidence reads (`None` only if `HixlApi` stopped declaring a name: then 0).
#[derive(Clone, Copy, Debug)]
struct HixlCounters {
    query: Option<ascendcl_sys::calls::Counter>,
}

fn read(counter: Option<ascendcl_sys::calls::Counter>) -> u64 {
    counter.map_or(0, |counter| counter.thread())
}

impl HixlCounters {
    fn new() -> Self {
        HixlCounters { query: HixlApi::counter("HixlCSClientQueryCompleteStatus") }
    }
}

/// The twin-only per-client counts of the HiXL library (`cannTwinHixlClientEvidence`), when it has the function and
/// answers for the client.
fn client_tallies(api: &HixlApi, client: HixlClientHandle) -> Option<CannTwinHixlEvidence> {
    let mut out = CannTwinHixlEvidence::new();
    // SAFETY: the client is live; `out` is a whole structure whose header says so.
    match unsafe { api.cannTwinHixlClientEvidence(client, &mut out) } {
        Ok(status) if status == hixl::HIXL_SUCCESS => Some(out),
        _ => None,
    }
}

/// The three acts of one batch (shared by its k transfers), the launches it cost and its descriptor and doorbell
/// counts.
#[derive(Clone, Copy, Debug)]
pub(super) struct BatchActs {
    pub(super) descriptors: Act,
    pub(super) doorbells: Act,
    pub(super) completion: Act,
    pub(super) launches: u64,
    pub(super) descriptor_count: u64,
    pub(super) doorbell_count: u64,
}

impl BatchActs {
    /// The acts the library's records show between `before` and `after` (the twin's HiXL: `Source::TwinModel`): the
    /// AI-CPU ops' SQEs by writer, the doorbells that exposed them by ringer, their flags by first reader; and for a
    /// batch the library moved over its wire path, each of its client-side runtime copies (written, submitted and
    /// seen complete by the Host). `None` for either: the records could not be read (`Source::Lost`).
    pub(super) fn observed(before: Option<CannTwinHixlEvidence>, after: Option<CannTwinHixlEvidence>) -> BatchActs {
        let (Some(before), Some(after)) = (before, after) else {
            return BatchActs::unknown(Source::Lost);
        };
        let d = |f: fn(&CannTwinHixlEvidence) -> u64| f(&after).saturating_sub(f(&before));
        let launches = d(|e| e.launches);
        if d(|e| e.unrecorded_launches) > 0 {
            return BatchActs { launches, ..BatchActs::unknown(Source::NotRecorded) };
        }
        if d(|e| e.log_entries_lost) > 0 {
            return BatchActs { launches, ..BatchActs::unknown(Source::Lost) };
        }
        let copies = d(|e| e.host_copies);
        let act = |aicpu: u64, host: u64, aiv: u64, unattributed: u64| Act {
            source: Source::TwinModel,
            by_aiv: aiv,
            aiv_blocks: None,
            by_aicpu: aicpu,
            by_host: host + copies,
            unattributed,
        };
        let descriptors =
            act(d(|e| e.sqes_by_aicpu), d(|e| e.sqes_by_host), d(|e| e.sqes_by_aiv), d(|e| e.sqes_unattributed));
        let doorbells = act(
            d(|e| e.doorbells_by_aicpu),
            d(|e| e.doorbells_by_host),
            d(|e| e.doorbells_by_aiv),
            d(|e| e.doorbells_unattributed),
        );
        let completion =
            act(d(|e| e.flags_by_aicpu), d(|e| e.flags_by_host), d(|e| e.flags_by_aiv), d(|e| e.flags_unread));
        BatchActs {
            descriptor_count: descriptors.total(),
            doorbell_count: doorbells.total(),
            descriptors,
            doorbells,
            completion,
            launches,
        }
    }

    /// A library without the records (the vendor's HiXL): who wrote the descriptors and rang the doorbells is not
    /// observable; the Host's status queries that returned the batch's final state are its completion, as counted.
    fn vendor(calls: &BatchCalls) -> BatchActs {
        BatchActs {
            completion: Act::host(Source::HostCalls, calls.completions),
            ..BatchActs::unknown(Source::NotObservable)
        }
    }

    pub(super) fn unknown(source: Source) -> BatchActs {
        BatchActs {
            descriptors: Act::unknown(source),
            doorbells: Act::unknown(source),
            completion: Act::unknown(source),
            launches: 0,
            descriptor_count: 0,
            doorbell_count: 0,
        }
    }
}

/// What the loader tables counted for one batch.
#[derive(Clone, Copy, Debug, Default)]
struct BatchCalls {
    /// Every counted call made getting the batch's client (charged to its first transfer).
    connect: u64,
    /// Every counted call made for the batch itself: submit and status queries (shared by its transfers).
    batch: u64,
    /// Status queries that returned the batch's final state.
    completions: u64,
}

#[derive(Debug)]
struct State {
    shared: Arc<Shared>,
    api: Result<&'static HixlApi, String>,
    queue: JobQueue<Job>,
}

/// The HiXL submission backend of one device's adxl transport.
#[derive(Debug)]
pub(super) struct HixlPath {
    state: Arc<State>,
    server: Mutex<Option<Server>>,
    worker: Mutex<Option<Result<JoinHandle<()>, String>>>,
}

impl HixlPath {
    /// Loads HiXL and starts this device's server; a failure is remembered and reported by every transfer.
    pub(super) fn new(shared: Arc<Shared>, api: Result<&'static HixlApi, String>) -> HixlPath {
        let server = match &api {
            Ok(api) => match start_server(api, &shared) {
                Ok(server) => Some(server),
                Err(reason) => {
                    tracing::warn!(device = shared.device.device_id(), %reason, "adxl: no HiXL server");
                    None
                }
            },
            Err(reason) => {
                tracing::info!(device = shared.device.device_id(), %reason, "adxl on cann unavailable");
                None
            }
        };
        let state = Arc::new(State { shared, api, queue: JobQueue::new() });
        HixlPath { state, server: Mutex::new(server), worker: Mutex::new(None) }
    }

    /// The advertised server address, if the server runs.
    pub(super) fn server_address(&self) -> Option<String> {
        self.server.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|server| server.address.clone())
    }

    fn ensure_worker(&self) -> Result<(), String> {
        let api = *self.state.api.as_ref().map_err(Clone::clone)?;
        let mut worker = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        if worker.is_none() {
            let state = self.state.clone();
            // Once: starts a thread (may block; see cpu_time::may_sleep).
            *worker = Some(crate::cpu_time::may_sleep(|| {
                std::thread::Builder::new()
                    .name(format!("adxl-hixl-{}", state.shared.device.device_id()))
                    .spawn(move || {
                        let counters = HixlCounters::new();
                        Worker { api, state, clients: HashMap::new(), abandoned: Vec::new(), counters }.run()
                    })
                    .map_err(|e| format!("start the adxl Host thread: {e}"))
            }));
        }
        match worker.as_ref() {
            Some(Ok(_)) => Ok(()),
            Some(Err(reason)) => Err(reason.clone()),
            None => Err("adxl Host thread not started".into()),
        }
    }

    /// Checks each transfer and queues it for the Host thread.
    pub(super) fn submit(&self, transfers: Vec<Transfer>) {
        // A section that never sleeps (see cpu_time::Section): checks, a queue write and a wake-up.
        let section = Section::start();
        if let Err(reason) = self.ensure_worker() {
            for transfer in transfers {
                transfer.slot.fail(AdxlStatus::FAILED.failure(reason.clone()));
            }
            return;
        }
        let device = &self.state.shared.device;
        let mut jobs = Vec::with_capacity(transfers.len());
        for transfer in transfers {
            let refuse = |status: AdxlStatus, detail: String| {
                transfer.slot.fail(status.failure(detail));
            };
            if !device.is_own_memory(transfer.local_addr, transfer.length) {
                refuse(
                    AdxlStatus::PARAM_INVALID,
                    format!(
                        "local range [{:#x}, +{}) is not device memory of cann device {}",
                        transfer.local_addr,
                        transfer.length,
                        device.device_id()
                    ),
                );
                continue;
            }
            // The device's peer state is shared with its other paths: a peer their probe found gone is refused here
            // too, at once, instead of waiting for HiXL's connection to fail.
            if let Some(reason) = self.state.shared.windows.lost_reason_of(&transfer.target) {
                transfer
                    .slot
                    .fail(AdxlStatus::NOT_CONNECTED.failure_of(crate::transfer::FailureKind::PeerLost, reason));
                continue;
            }
            let advertisement = transfer
                .target
                .descriptor
                .aiv
                .clone()
                .and_then(|value| serde_json::from_value::<DeviceAdvertisement>(value).ok());
            let Some((server, peer_device)) =
                advertisement.and_then(|advertisement| Some((advertisement.hixl_server?, advertisement.device_id)))
            else {
                refuse(
                    AdxlStatus::NOT_CONNECTED,
                    format!(
                        "segment {:?} advertises no HiXL server (its device is not on cann, or its server did not \
                         start: see its log)",
                        transfer.target.name
                    ),
                );
                continue;
            };
            jobs.push(Job {
                opcode: transfer.opcode,
                local: transfer.local_addr,
                remote: transfer.remote_addr,
                length: transfer.length,
                peer: transfer.target.name.clone(),
                server,
                peer_device,
                slot: transfer.slot,
                submit_cpu_ns: 0,
            });
        }
        let share_mark = section.elapsed_ns();
        let share = share_mark / jobs.len().max(1) as u64;
        for job in &mut jobs {
            job.submit_cpu_ns = share;
        }
        self.state.queue.push(jobs);
        // The hand-off to the Host thread is charged too.
        self.state.shared.carry.add(section.elapsed_ns().saturating_sub(share_mark));
    }
}

impl Drop for HixlPath {
    fn drop(&mut self) {
        self.state.queue.stop();
        if let Some(Ok(thread)) = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // Bounded: the thread's longest wait is one connect or one batch poll of `baseline_timeout`.
            let _ = thread.join();
        }
        for job in self.state.queue.drain() {
            job.slot.fail(AdxlStatus::FAILED.failure_of(crate::transfer::FailureKind::Shutdown, "transport shut down"));
        }
        let _ = self.state.shared.device.bind_thread();
        drop(self.server.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// What the Host thread owns: the connected clients and the batches abandoned at their deadline.
struct Worker {
    api: &'static HixlApi,
    state: Arc<State>,
    clients: HashMap<String, Client>,
    /// (client key, batch handle) of batches abandoned at their deadline.
    abandoned: Vec<(String, usize)>,
    /// The loader-table counters the evidence is read from.
    counters: HixlCounters,
}

impl Worker {
    fn api(&self) -> &'static HixlApi {
        self.api
    }

    fn run(mut self) {
        if let Err(error) = self.state.shared.device.bind_thread() {
            tracing::error!(%error, "adxl: HiXL Host thread cannot bind the device");
        }
        let mut cpu_mark = thread_cpu_time_ns();
        while let Some(jobs) = self.state.queue.wait() {
            self.reap_abandoned();
            let together = |first: &Job, next: &Job| {
                next.peer == first.peer && next.server == first.server && next.opcode == first.opcode
            };
            for batch in batches(jobs, MAX_BATCH_ENTRIES, together) {
                self.run_batch(batch, &mut cpu_mark);
            }
        }
        // Clients are destroyed here, on the thread bound to the device.
        self.clients.clear();
    }

    /// Queries batches abandoned at their deadline once more, so final ones release their handles.
    fn reap_abandoned(&mut self) {
        let api = self.api();
        let abandoned = std::mem::take(&mut self.abandoned);
        for (peer, handle) in abandoned {
            let Some(client) = self.clients.get(&peer) else { continue };
            // SAFETY: the client is live and the handle one of its batches not yet seen final.
            match unsafe {
                hixl::result::client_query_complete_status(api, client.client.as_raw(), handle as CompleteHandle)
            } {
                Ok(status) if status == hixl::HIXL_COMPLETE_STATUS_WAITING => self.abandoned.push((peer, handle)),
                _ => {}
            }
        }
    }

    /// The client for `job`'s peer: cached, or created, registered and connected now.
    fn client(&mut self, job: &Job) -> Result<&Client, String> {
        let key = job.client_key();
        if self.clients.contains_key(&key) {
            return Ok(&self.clients[&key]);
        }
        let api = self.api();
        let device = &self.state.shared.device;
        let (host, port) = job
            .server
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host.to_owned(), port.parse::<u32>().ok()?)))
            .ok_or_else(|| format!("the advertised HiXL server {:?} is not ip:port", job.server))?;
        let ip = CString::new(host).map_err(|_| "the advertised HiXL server has a NUL".to_owned())?;
        let endpoints = Box::new([
            EndpointDesc::device(ENDPOINT_PROTOCOL, device.device_id()),
            EndpointDesc::device(ENDPOINT_PROTOCOL, job.peer_device),
        ]);
        let memory = regions(&device.advertisement());
        let borrowed: Vec<(&std::ffi::CStr, CommMem)> =
            memory.iter().map(|(tag, mem)| (tag.as_c_str(), *mem)).collect();
        let timeout_ms = u32::try_from(self.state.shared.timeout.as_millis()).unwrap_or(u32::MAX).max(1);
        // SAFETY: the registered regions are this device's exported memory, mapped while the device lives (the
        // transport holds it; clients are destroyed before the transport finishes dropping). The endpoints and the
        // ip are kept with the client.
        let client =
            unsafe { safe::Client::connect(api, &endpoints[0], &endpoints[1], &ip, port, &borrowed, timeout_ms) }
                .map_err(|error| {
                    format!("connect to the HiXL server {} of segment {:?}: {error}", job.server, job.peer)
                })?;
        self.state.shared.counters.connects.fetch_add(1, Ordering::Relaxed);
        self.clients.insert(key.clone(), Client { client, _endpoints: endpoints, _ip: ip });
        Ok(&self.clients[&key])
    }

    /// Submits one batch, polls it to a final state or the deadline, finishes every task.
    fn run_batch(&mut self, group: Vec<Job>, cpu_mark: &mut u64) {
        let shared = self.state.shared.clone();
        let api = self.api();
        let timeout = shared.timeout;
        // The library's own records of who did each act (the twin's HiXL), or none (the vendor's).
        let records = api.is_resolved("cannTwinHixlClientEvidence");
        // The batch's acts are shared by its transfers: window k, each act's counts the batch's.
        let evidence = |job: &Job, acts: &BatchActs, api_calls: u64, k: u64, cpu: u64| {
            let mut evidence = TransferEvidence::new("adxl", shared.device.runtime_label());
            evidence.window = u32::try_from(k).unwrap_or(u32::MAX);
            evidence.descriptors_written = acts.descriptors;
            evidence.doorbells_rung = acts.doorbells;
            evidence.completion_seen = acts.completion;
            evidence.host_device_api_calls = api_calls;
            // Its share of the batch's AI-CPU launches, descriptors and doorbells.
            evidence.host_launches = acts.launches as f64 / k as f64;
            evidence.descriptors = acts.descriptor_count.div_ceil(k);
            evidence.doorbells = acts.doorbell_count.div_ceil(k);
            evidence.host_cpu_ns = job.submit_cpu_ns + cpu;
            evidence
        };
        let finish_all = |group: Vec<Job>,
                          outcome: Result<(), (AdxlStatus, String)>,
                          calls: BatchCalls,
                          acts: BatchActs,
                          cpu_mark: &mut u64| {
            let now = thread_cpu_time_ns();
            let k = group.len() as u64;
            let share = (now.saturating_sub(*cpu_mark) + shared.carry.take()) / k;
            *cpu_mark = now;
            let per_job = calls.batch.div_ceil(k);
            for (index, job) in group.into_iter().enumerate() {
                let api_calls = per_job + if index == 0 { calls.connect } else { 0 };
                let evidence = evidence(&job, &acts, api_calls, k, share);
                match &outcome {
                    Ok(()) => {
                        job.slot.complete(job.length, evidence);
                    }
                    Err((status, detail)) => {
                        job.slot.fail_with_evidence(status.failure(detail.clone()), evidence);
                    }
                }
            }
        };
        shared.counters.groups.fetch_add(1, Ordering::Relaxed);
        let mut calls = BatchCalls::default();
        let connect_before = ascendcl_sys::calls::thread_total();
        let client = self.client(&group[0]).map(|client| client.client.as_raw());
        calls.connect = ascendcl_sys::calls::thread_total().saturating_sub(connect_before);
        // Nothing was handed to the library yet: no act.
        let nothing = if records {
            BatchActs::observed(Some(CannTwinHixlEvidence::new()), Some(CannTwinHixlEvidence::new()))
        } else {
            BatchActs::vendor(&calls)
        };
        let raw = match client {
            Ok(raw) => raw,
            Err(detail) => {
                shared.counters.failures.fetch_add(1, Ordering::Relaxed);
                finish_all(group, Err((AdxlStatus::NOT_CONNECTED, detail)), calls, nothing, cpu_mark);
                return;
            }
        };
        // Read before the batch's own calls are counted: the evidence reads are charged to nobody.
        let tallies_before = if records { client_tallies(api, raw) } else { None };
        let batch_before = ascendcl_sys::calls::thread_total();
        let list: Vec<HixlOneSideOpDesc> = group
            .iter()
            .map(|job| HixlOneSideOpDesc {
                remote_buf: job.remote as *mut _,
                local_buf: job.local as *mut _,
                len: job.length,
            })
            .collect();
        let put = group[0].opcode == Opcode::Write;
        let counters = self.counters;
        // SAFETY: the client is connected; local ranges are this device's registered heap (checked at submit),
        // remote ranges lie in the peer's registered buffers (checked by the engine); HiXL checks both again.
        let submitted = unsafe {
            if put {
                hixl::result::client_batch_put_async(api, raw, &list)
            } else {
                hixl::result::client_batch_get_async(api, raw, &list)
            }
        };
        let handle = match submitted {
            Ok(handle) => handle,
            Err(error) => {
                let status = error.code().map_or(AdxlStatus::FAILED, |code| AdxlStatus(code.0 as i32));
                let status = if status == AdxlStatus::SUCCESS { AdxlStatus::FAILED } else { status };
                shared.counters.failures.fetch_add(1, Ordering::Relaxed);
                calls.batch = ascendcl_sys::calls::thread_total().saturating_sub(batch_before);
                let acts = if records {
                    BatchActs::observed(tallies_before, client_tallies(api, raw))
                } else {
                    BatchActs::vendor(&calls)
                };
                finish_all(group, Err((status, format!("HiXL refused the batch: {error}"))), calls, acts, cpu_mark);
                return;
            }
        };
        // Poll to a final state, bounded by the baseline timeout.
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        let outcome = loop {
            let queries_before = read(counters.query);
            // SAFETY: the client is live and the handle its batch, not yet seen final.
            let status = unsafe { hixl::result::client_query_complete_status(api, raw, handle) };
            if matches!(
                status,
                Ok(status) if status != hixl::HIXL_COMPLETE_STATUS_WAITING
            ) {
                // The query (as the table counted it) that saw the batch's final state.
                calls.completions += read(counters.query).saturating_sub(queries_before);
            }
            match status {
                Ok(status) if status == hixl::HIXL_COMPLETE_STATUS_COMPLETED => break Ok(()),
                Ok(status) if status == hixl::HIXL_COMPLETE_STATUS_FAILED => {
                    break Err((AdxlStatus::FAILED, "HiXL reported HIXL_COMPLETE_STATUS_FAILED for the batch".into()))
                }
                Ok(status) if status == hixl::HIXL_COMPLETE_STATUS_TIMEOUT => {
                    break Err((AdxlStatus::TIMEOUT, "HiXL reported HIXL_COMPLETE_STATUS_TIMEOUT for the batch".into()))
                }
                Ok(status) if status == hixl::HIXL_COMPLETE_STATUS_WAITING => {}
                Ok(status) => break Err((AdxlStatus::FAILED, format!("HiXL reported an unknown status {status:?}"))),
                Err(error) => {
                    let status = error.code().map_or(AdxlStatus::FAILED, |code| AdxlStatus(code.0 as i32));
                    break Err((status, format!("status query failed: {error}")));
                }
            }
            if Instant::now() >= deadline {
                self.abandoned.push((group[0].client_key(), handle as usize));
                break Err((AdxlStatus::TIMEOUT, format!("the HiXL batch did not complete within {timeout:?}")));
            }
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        };
        match &outcome {
            Ok(()) => {}
            Err((status, _)) if *status == AdxlStatus::TIMEOUT => {
                shared.counters.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                shared.counters.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        calls.batch = ascendcl_sys::calls::thread_total().saturating_sub(batch_before);
        let acts = if records {
            BatchActs::observed(tallies_before, client_tallies(api, raw))
        } else {
            BatchActs::vendor(&calls)
        };
        finish_all(group, outcome, calls, acts, cpu_mark);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_the_evidence_reads_is_declared_by_the_hixl_table() {
        let counters = HixlCounters::new();
        assert_eq!(counters.query.map(|counter| counter.function()), Some("HixlCSClientQueryCompleteStatus"));
    }
}
