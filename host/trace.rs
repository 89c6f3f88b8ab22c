//! Per-stage traces: what the Host, the AIV blocks and the SDMA engines did when, for one run, exported as a
//! Chrome trace event file (the JSON that Perfetto's UI and `chrome://tracing` open; docs/trace.md).
//!
//! Owns: [`Tracer`] (the switch and the events recorded while it is on), the event types, the alignment of the
//! kernel's cycle counter with the Host's clock ([`ClockAlignment`]), and the export ([`chrome_trace`]). It must not
//! read device memory or call a runtime: the aiv transport drains the kernel's trace rings and hands the entries
//! here, the engine adds the twin runtime's engine runs.
//!
//! Off (the default), a recording site costs one relaxed atomic load ([`Tracer::is_enabled`]); nothing else runs.
//! Every Host timestamp is [`now_ns`]: nanoseconds on this process's monotonic clock since its first reading.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Instant;

use serde_json::{json, Value};

use crate::kernel_abi::{
    TraceEntry, TRACE_STAGE_COMPLETION_OBSERVED, TRACE_STAGE_DCQ_PUBLISHED, TRACE_STAGE_DOORBELL,
    TRACE_STAGE_REQUEST_SEEN, TRACE_STAGE_SQES_POSTED,
};

/// Events kept at most per kind between two [`Tracer::take`]s; later ones are counted as dropped.
pub const HOST_EVENT_CAPACITY: usize = 1 << 20;

/// Nanoseconds on the process's monotonic clock since its first reading (the Host's trace clock).
pub fn now_ns() -> u64 {
    static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
    EPOCH.elapsed().as_nanos() as u64
}

/// The calling thread as a trace names it: its OS thread id and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadTag {
    pub tid: u64,
    pub name: std::sync::Arc<str>,
}

impl ThreadTag {
    /// The calling thread (looked up once per thread, then a reference count).
    pub fn current() -> ThreadTag {
        std::thread_local! {
            static TAG: ThreadTag = {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() } as u64;
                let name = std::thread::current().name().map(str::to_owned).unwrap_or_else(|| format!("thread {tid}"));
                ThreadTag { tid, name: name.into() }
            };
        }
        TAG.with(ThreadTag::clone)
    }
}

/// What a Host event marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostStage {
    /// `submit_transfer` handing a batch's transfers to one path (a span).
    Submit,
    /// A pass that collected completions (aiv's DCQ drain; a span, `transfers` collected).
    Drain,
    /// The last task of a batch reached its terminal state (an instant, on the thread that finished it).
    CompletionSeen,
    /// `wait_batch` from its call to its return (a span).
    Wait,
    /// `wait_batch` returning to its caller (an instant).
    Woken,
}

impl HostStage {
    /// The event's name in the trace.
    pub fn name(self) -> &'static str {
        match self {
            HostStage::Submit => "submit",
            HostStage::Drain => "completion seen (drain)",
            HostStage::CompletionSeen => "completion seen",
            HostStage::Wait => "wait_batch",
            HostStage::Woken => "caller woken",
        }
    }
}

/// One Host event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostEvent {
    /// The path (`aiv`, `adxl`, `adxl-fabric`, `ubshmem`, `tcp`, `local`; `mixed` for a batch wait over several).
    pub path: String,
    pub stage: HostStage,
    pub thread: ThreadTag,
    pub start_ns: u64,
    /// Equal to `start_ns` for an instant.
    pub end_ns: u64,
    /// The engine's batch id (0 where the event is not about one batch: a drain pass).
    pub batch: u64,
    pub transfers: u64,
}

/// One entry of a block's trace ring, with where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceEvent {
    pub device: i32,
    pub block: u32,
    pub entry: TraceEntry,
}

impl DeviceEvent {
    pub fn stage(&self) -> u32 {
        self.entry.stage.get()
    }
    pub fn cycles(&self) -> u64 {
        self.entry.cycles.get()
    }
    pub fn transfer_id(&self) -> u64 {
        self.entry.transfer_id.get()
    }
}

/// The name of a trace stage of the kernel.
pub fn device_stage_name(stage: u32) -> &'static str {
    match stage {
        TRACE_STAGE_REQUEST_SEEN => "request seen",
        TRACE_STAGE_SQES_POSTED => "SQEs posted",
        TRACE_STAGE_DOORBELL => "doorbell",
        TRACE_STAGE_COMPLETION_OBSERVED => "completion observed",
        TRACE_STAGE_DCQ_PUBLISHED => "DCQ published",
        _ => "unknown stage",
    }
}

/// One run of an SDMA engine (twin runtime only), on the Host's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineRunEvent {
    pub device: i32,
    pub channel: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub sqes: u64,
}

/// Everything recorded between two [`Tracer::take`]s.
#[derive(Clone, Debug, Default)]
pub struct TraceLog {
    pub host: Vec<HostEvent>,
    pub device: Vec<DeviceEvent>,
    pub engine: Vec<EngineRunEvent>,
    /// Kernel trace entries dropped because a block's ring was full (the kernels' counts, summed).
    pub device_dropped: u64,
    /// Host events and engine runs dropped because [`HOST_EVENT_CAPACITY`] was reached.
    pub host_dropped: u64,
    /// When the Host published the request of `(device, transfer id)` (read just before the tail store): the
    /// kernel saw it later.
    pub request_published_ns: HashMap<(i32, u64), u64>,
    /// When the Host first saw the DCQ entry of `(device, transfer id)` (read just after the tail's load): the
    /// kernel published it earlier.
    pub completion_seen_ns: HashMap<(i32, u64), u64>,
    /// The system counter's rate per device (`KernelChannels::cycles_per_second`).
    pub cycles_per_second: BTreeMap<i32, u64>,
    /// Notes for the trace's metadata (runtime, what is not recorded and why).
    pub notes: BTreeMap<String, String>,
}

impl TraceLog {
    /// Adds `other`'s events to this log.
    pub fn merge(&mut self, other: TraceLog) {
        self.host.extend(other.host);
        self.device.extend(other.device);
        self.engine.extend(other.engine);
        self.device_dropped += other.device_dropped;
        self.host_dropped += other.host_dropped;
        self.request_published_ns.extend(other.request_published_ns);
        self.completion_seen_ns.extend(other.completion_seen_ns);
        self.cycles_per_second.extend(other.cycles_per_second);
        self.notes.extend(other.notes);
    }

    /// Events of every kind.
    pub fn events(&self) -> usize {
        self.host.len() + self.device.len() + self.engine.len()
    }
}

/// The switch and the events of one engine's trace.
#[derive(Debug, Default)]
pub struct Tracer {
    enabled: AtomicBool,
    log: Mutex<TraceLog>,
}

impl Tracer {
    /// Whether tracing is on (a relaxed load: the whole cost of a recording site when off).
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turns tracing on or off. Events recorded so far stay until [`Self::take`].
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    fn log(&self) -> MutexGuard<'_, TraceLog> {
        self.log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a Host event on the calling thread (nothing when off).
    pub fn host(&self, path: &str, stage: HostStage, start_ns: u64, end_ns: u64, batch: u64, transfers: u64) {
        if !self.is_enabled() {
            return;
        }
        self.host_on(ThreadTag::current(), path, stage, start_ns, end_ns, batch, transfers);
    }

    /// Records a Host event on `thread` (nothing when off).
    #[allow(clippy::too_many_arguments)]
    pub fn host_on(
        &self,
        thread: ThreadTag,
        path: &str,
        stage: HostStage,
        start_ns: u64,
        end_ns: u64,
        batch: u64,
        transfers: u64,
    ) {
        if !self.is_enabled() {
            return;
        }
        let mut log = self.log();
        if log.host.len() >= HOST_EVENT_CAPACITY {
            log.host_dropped += 1;
            return;
        }
        log.host.push(HostEvent { path: path.to_owned(), stage, thread, start_ns, end_ns, batch, transfers });
    }

    /// Records when the Host published the requests of `ids` on `device` (recorded even after the switch went off,
    /// so that an alignment pair is never half-recorded; the caller checks the switch).
    pub fn requests_published(&self, device: i32, ids: impl IntoIterator<Item = u64>, at_ns: u64) {
        let mut log = self.log();
        for id in ids {
            if log.request_published_ns.len() >= HOST_EVENT_CAPACITY {
                log.host_dropped += 1;
                continue;
            }
            log.request_published_ns.insert((device, id), at_ns);
        }
    }

    /// Records when the Host first saw the DCQ entries of `ids` on `device`.
    pub fn completions_seen(&self, device: i32, ids: impl IntoIterator<Item = u64>, at_ns: u64) {
        let mut log = self.log();
        for id in ids {
            if log.completion_seen_ns.len() >= HOST_EVENT_CAPACITY {
                log.host_dropped += 1;
                continue;
            }
            log.completion_seen_ns.entry((device, id)).or_insert(at_ns);
        }
    }

    /// Adds entries drained from the trace ring of `block` on `device`, and the entries the kernel dropped since the
    /// last drain (the increase of the ring's free-running count).
    pub fn device_entries(&self, device: i32, block: u32, entries: &[TraceEntry], dropped_since: u64) {
        let mut log = self.log();
        let room = HOST_EVENT_CAPACITY.saturating_sub(log.device.len()).min(entries.len());
        log.device.extend(entries[..room].iter().map(|&entry| DeviceEvent { device, block, entry }));
        log.device_dropped += dropped_since + (entries.len() - room) as u64;
    }

    /// Adds SDMA engine runs (already on the Host's clock) and runs the runtime dropped.
    pub fn engine_runs(&self, runs: impl IntoIterator<Item = EngineRunEvent>, dropped: u64) {
        let mut log = self.log();
        for run in runs {
            if log.engine.len() >= HOST_EVENT_CAPACITY {
                log.host_dropped += 1;
            } else {
                log.engine.push(run);
            }
        }
        log.host_dropped += dropped;
    }

    /// Records the counter rate of `device`.
    pub fn cycles_per_second(&self, device: i32, hz: u64) {
        self.log().cycles_per_second.insert(device, hz);
    }

    /// Adds a note to the trace's metadata.
    pub fn note(&self, key: &str, value: impl Into<String>) {
        self.log().notes.insert(key.to_owned(), value.into());
    }

    /// Everything recorded so far; the tracer starts empty again (the switch is unchanged).
    pub fn take(&self) -> TraceLog {
        std::mem::take(&mut *self.log())
    }
}

/// How device cycles become Host time on one device: `host_ns = cycles * 1e9 / hz + offset_ns`.
///
/// The rate is the one the device backend reports (the AscendC system counter, 50 MHz). The offset is bounded from
/// both sides by the aiv path's own handshakes: the kernel saw a group's requests after the Host published them
/// (`offset >= published - seen`), and published its DCQ entries before the Host saw them (`offset <= seen -
/// published`). The estimate is the middle of the tightest interval, its error half the interval's width.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockAlignment {
    pub device: i32,
    pub hz: u64,
    pub offset_ns: f64,
    /// Half the width of the interval; `None` without a pair on both sides (offset 0: device times are raw).
    pub error_ns: Option<f64>,
    /// The lower and upper bounds, when both sides had pairs (`lower > upper` would mean the rate is wrong).
    pub bounds_ns: Option<(f64, f64)>,
    /// Pairs used: (request seen, DCQ published).
    pub pairs: (usize, usize),
}

impl ClockAlignment {
    /// Host nanoseconds of a device counter value.
    pub fn host_ns(&self, cycles: u64) -> f64 {
        cycles as f64 * 1e9 / self.hz.max(1) as f64 + self.offset_ns
    }
}

/// The alignment of every device with kernel trace entries in `log`.
pub fn align_clocks(log: &TraceLog) -> Vec<ClockAlignment> {
    let mut per_device: BTreeMap<i32, (f64, f64, usize, usize)> = BTreeMap::new();
    for event in &log.device {
        let hz = log.cycles_per_second.get(&event.device).copied().unwrap_or(50_000_000).max(1);
        let device_ns = event.cycles() as f64 * 1e9 / hz as f64;
        let bounds = per_device.entry(event.device).or_insert((f64::NEG_INFINITY, f64::INFINITY, 0, 0));
        let key = (event.device, event.transfer_id());
        match event.stage() {
            TRACE_STAGE_REQUEST_SEEN => {
                if let Some(&published) = log.request_published_ns.get(&key) {
                    bounds.0 = bounds.0.max(published as f64 - device_ns);
                    bounds.2 += 1;
                }
            }
            TRACE_STAGE_DCQ_PUBLISHED => {
                if let Some(&seen) = log.completion_seen_ns.get(&key) {
                    bounds.1 = bounds.1.min(seen as f64 - device_ns);
                    bounds.3 += 1;
                }
            }
            _ => {}
        }
    }
    per_device
        .into_iter()
        .map(|(device, (lower, upper, seen_pairs, published_pairs))| {
            let hz = log.cycles_per_second.get(&device).copied().unwrap_or(50_000_000);
            let (offset_ns, error_ns, bounds_ns) = match (seen_pairs > 0, published_pairs > 0) {
                (true, true) => ((lower + upper) / 2.0, Some(((upper - lower) / 2.0).abs()), Some((lower, upper))),
                (true, false) => (lower, None, None),
                (false, true) => (upper, None, None),
                (false, false) => (0.0, None, None),
            };
            ClockAlignment { device, hz, offset_ns, error_ns, bounds_ns, pairs: (seen_pairs, published_pairs) }
        })
        .collect()
}

/// Process ids of the trace: one per path, in this order (others after).
const PATH_ORDER: [&str; 6] = ["aiv", "adxl", "adxl-fabric", "ubshmem", "tcp", "local"];
/// Thread ids of the device tracks (above any Linux tid, below 2^53).
const BLOCK_TRACK_BASE: u64 = 1 << 40;
const ENGINE_TRACK_BASE: u64 = 1 << 41;

fn us(ns: f64) -> f64 {
    ns / 1000.0
}

/// The Chrome trace event document of `log`: `{"traceEvents": [...], "displayTimeUnit": "ns", "metadata": {...}}`
/// with one process per path (named by "M" events), a thread per Host thread, per AIV block ("aiv block N (device
/// D)") and per SDMA channel engine; spans as "X" events and stages as "i" events, `ts` in microseconds since the
/// first event. Device tracks and engine runs go to the process of `device_path` (the path whose kernel and engines
/// they are).
pub fn chrome_trace(log: &TraceLog, device_path: &str, metadata: &BTreeMap<String, Value>) -> Value {
    let alignments = align_clocks(log);
    let alignment_of = |device: i32| alignments.iter().find(|a| a.device == device).copied();
    let mut paths: Vec<String> = PATH_ORDER.iter().map(|p| p.to_string()).collect();
    for event in &log.host {
        if !paths.contains(&event.path) {
            paths.push(event.path.clone());
        }
    }
    if !paths.iter().any(|p| p == device_path) {
        paths.push(device_path.to_owned());
    }
    let pid_of = |path: &str| paths.iter().position(|p| p == path).unwrap_or(0) as u64 + 1;
    let device_pid = pid_of(device_path);
    // The origin: the earliest timestamp of any event, on the Host's clock.
    let mut origin = f64::INFINITY;
    for event in &log.host {
        origin = origin.min(event.start_ns as f64);
    }
    for event in &log.engine {
        origin = origin.min(event.start_ns as f64);
    }
    for event in &log.device {
        if let Some(alignment) = alignment_of(event.device) {
            origin = origin.min(alignment.host_ns(event.cycles()));
        }
    }
    if !origin.is_finite() {
        origin = 0.0;
    }
    let ts = |ns: f64| us(ns - origin);
    let mut events = Vec::new();
    let mut used_pids = std::collections::BTreeSet::new();
    let mut threads: BTreeMap<(u64, u64), String> = BTreeMap::new();
    for event in &log.host {
        let pid = pid_of(&event.path);
        used_pids.insert(pid);
        threads.insert((pid, event.thread.tid), event.thread.name.to_string());
        let args = json!({"batch": event.batch, "transfers": event.transfers});
        let mut value = json!({
            "name": event.stage.name(), "cat": "host", "pid": pid, "tid": event.thread.tid,
            "ts": ts(event.start_ns as f64), "args": args,
        });
        if matches!(event.stage, HostStage::CompletionSeen | HostStage::Woken) {
            value["ph"] = json!("i");
            value["s"] = json!("t");
        } else {
            value["ph"] = json!("X");
            value["dur"] = json!(us(event.end_ns.saturating_sub(event.start_ns) as f64));
        }
        events.push(value);
    }
    // Device stages: instants, and one span per group from request seen to DCQ published.
    let mut group_start: HashMap<(i32, u32, u64), f64> = HashMap::new();
    for event in &log.device {
        let alignment = alignment_of(event.device).unwrap_or(ClockAlignment {
            device: event.device,
            hz: 50_000_000,
            offset_ns: 0.0,
            error_ns: None,
            bounds_ns: None,
            pairs: (0, 0),
        });
        let tid = BLOCK_TRACK_BASE + (event.device.max(0) as u64) * 4096 + u64::from(event.block);
        used_pids.insert(device_pid);
        threads.insert((device_pid, tid), format!("aiv block {} (device {})", event.block, event.device));
        let at = alignment.host_ns(event.cycles());
        let key = (event.device, event.block, event.transfer_id());
        let args = json!({
            "first_transfer_id": event.transfer_id(), "count": event.entry.count.get(), "aux": event.entry.aux.get(),
            "cycles": event.cycles(),
        });
        events.push(json!({
            "name": device_stage_name(event.stage()), "cat": "device", "ph": "i", "s": "t", "pid": device_pid,
            "tid": tid, "ts": ts(at), "args": args,
        }));
        match event.stage() {
            TRACE_STAGE_REQUEST_SEEN => {
                group_start.insert(key, at);
            }
            TRACE_STAGE_DCQ_PUBLISHED => {
                if let Some(start) = group_start.remove(&key) {
                    events.push(json!({
                        "name": "group", "cat": "device", "ph": "X", "pid": device_pid, "tid": tid, "ts": ts(start),
                        "dur": us((at - start).max(0.0)),
                        "args": {"first_transfer_id": event.transfer_id(), "transfers": event.entry.count.get()},
                    }));
                }
            }
            _ => {}
        }
    }
    for run in &log.engine {
        let tid = ENGINE_TRACK_BASE + (run.device.max(0) as u64) * 4096 + u64::from(run.channel);
        used_pids.insert(device_pid);
        threads.insert((device_pid, tid), format!("sdma channel {} (device {})", run.channel, run.device));
        events.push(json!({
            "name": "engine run", "cat": "engine", "ph": "X", "pid": device_pid, "tid": tid,
            "ts": ts(run.start_ns as f64), "dur": us(run.end_ns.saturating_sub(run.start_ns) as f64),
            "args": {"sqes": run.sqes},
        }));
    }
    let mut named = Vec::new();
    for &pid in &used_pids {
        named.push(json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": paths[(pid - 1) as usize]}}));
    }
    for ((pid, tid), name) in &threads {
        named.push(json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}));
    }
    named.extend(events);
    let mut meta: serde_json::Map<String, Value> = metadata.clone().into_iter().collect();
    meta.insert("origin_host_ns".into(), json!(origin));
    meta.insert("host_clock".into(), json!("the Host process's monotonic clock, ns since its first trace reading"));
    meta.insert("device_dropped".into(), json!(log.device_dropped));
    meta.insert("host_dropped".into(), json!(log.host_dropped));
    meta.insert(
        "clock_alignment".into(),
        Value::Array(
            alignments
                .iter()
                .map(|a| {
                    json!({
                        "device": a.device, "cycles_per_second": a.hz, "offset_ns": a.offset_ns,
                        "error_ns": a.error_ns, "bounds_ns": a.bounds_ns.map(|(l, u)| [l, u]),
                        "request_seen_pairs": a.pairs.0, "dcq_published_pairs": a.pairs.1,
                        "method": "host_ns = cycles * 1e9 / cycles_per_second + offset_ns; offset bounded below by \
                                   (Host request publish - kernel request seen) and above by (Host completion seen - \
                                   kernel DCQ published); estimate the middle, error half the width",
                    })
                })
                .collect(),
        ),
    );
    for (key, value) in &log.notes {
        meta.insert(key.clone(), json!(value));
    }
    json!({"traceEvents": named, "displayTimeUnit": "ns", "metadata": meta})
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::little_endian::{U32, U64};

    fn entry(stage: u32, cycles: u64, id: u64) -> TraceEntry {
        TraceEntry {
            cycles: U64::new(cycles),
            transfer_id: U64::new(id),
            stage: U32::new(stage),
            count: U32::new(1),
            ..TraceEntry::default()
        }
    }

    #[test]
    fn off_records_nothing_and_on_records_on_the_calling_thread() {
        let tracer = Tracer::default();
        tracer.host("aiv", HostStage::Submit, 1, 2, 7, 3);
        assert_eq!(tracer.take().events(), 0);
        tracer.set_enabled(true);
        tracer.host("aiv", HostStage::Submit, 1, 2, 7, 3);
        let log = tracer.take();
        assert_eq!(log.host.len(), 1);
        assert_eq!(log.host[0].thread, ThreadTag::current());
    }

    #[test]
    fn alignment_takes_the_middle_of_both_bounds() {
        let mut log = TraceLog::default();
        log.cycles_per_second.insert(0, 50_000_000);
        // Device: request seen at cycle 100 (2000 ns), published at cycle 200 (4000 ns).
        log.device.push(DeviceEvent { device: 0, block: 0, entry: entry(TRACE_STAGE_REQUEST_SEEN, 100, 9) });
        log.device.push(DeviceEvent { device: 0, block: 0, entry: entry(TRACE_STAGE_DCQ_PUBLISHED, 200, 9) });
        // Host: published at 10_000, seen at 12_500: offset in [8000, 8500].
        log.request_published_ns.insert((0, 9), 10_000);
        log.completion_seen_ns.insert((0, 9), 12_500);
        let alignment = align_clocks(&log)[0];
        assert_eq!(alignment.bounds_ns, Some((8000.0, 8500.0)));
        assert_eq!(alignment.offset_ns, 8250.0);
        assert_eq!(alignment.error_ns, Some(250.0));
        let trace = chrome_trace(&log, "aiv", &BTreeMap::new());
        let events = trace["traceEvents"].as_array().expect("traceEvents");
        assert!(events.iter().any(|e| e["args"]["name"] == "aiv block 0 (device 0)"));
        assert!(events.iter().any(|e| e["name"] == "group" && e["ph"] == "X"));
    }
}
