//! Occupancy of a run: how busy the AIV cores and SDMA engines were, and which Host threads used the CPU, so that a
//! researcher can compare paths by their CPU, AI CPU and AIV occupancy. Take an [`OccupancySnapshot`] before
//! and after the run; [`OccupancySnapshot::since`] gives the [`Occupancy`] between them (serialisable, and readable
//! through `Display`). docs/occupancy.md says what each figure is and how far it can be trusted.
//!
//! Owns: the snapshot, the difference and the naming of Host thread roles. It must not know about paths or
//! evidence records; it reads the device's counters only through `cann_twin::control::occupancy` and the Host's
//! threads through [`crate::cpu_time::process_threads`].
//!
//! - **Device**: on the twin runtime linked into this process, per device: per block index, nanoseconds executing
//!   and polling on its emulated AIV core; per SDMA channel, nanoseconds busy and SQEs executed; the emulated AI
//!   CPU's threads: nanoseconds executing, polling and idle, and its tasks; the runtime's copies (stream copy tasks,
//!   synchronous copies): busy nanoseconds, counts and bytes (a CPU model's figures, unverified on hardware). On any other runtime (the vendor's, or the twin loaded as a library, whose
//!   counters live in that library's copy of the twin) the device part is [`DeviceReport::NotExposed`], with the
//!   reason: never zeros.
//! - **Host CPU by role**: on-CPU time of this process's threads (`/proc/self/task/*/schedstat`), grouped by
//!   thread name into the roles of [`ThreadRole`]. The twin's own threads (`cann-twin-*`: the device model) are
//!   reported apart and are never part of the Host figures.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Instant;

use serde::Serialize;

use crate::cpu_time::ThreadCpu;
use crate::device::cann::CannRuntime;

pub use cann_twin::control::AiCpuOccupancy as TwinAiCpuOccupancy;
pub use cann_twin::control::DeviceOccupancy as TwinDeviceOccupancy;
pub use cann_twin::control::StreamOccupancy as TwinStreamOccupancy;

/// What a thread of this process does, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadRole {
    /// The aiv transport's completion drain (`aiv-drain-<device>`).
    AivDrain,
    /// The aiv transport's kernel liveness probe (`aiv-probe-<device>`).
    AivProbe,
    /// The adxl transport's HiXL worker (`adxl-hixl-<device>`).
    AdxlHixl,
    /// The ubshmem transport's workers (`ubshmem-<device>.<n>`).
    Ubshmem,
    /// The tcp transport's lanes, reply readers and server threads (`tcp-*`).
    Tcp,
    /// Every other thread of the process: the caller's own threads (the one that submits and waits), the async
    /// runtime's, the metadata service's.
    Caller,
    /// The twin's emulated AIV cores (`cann-twin-aiv-*`): device model, not Host.
    DeviceModelAivCores,
    /// The twin's SDMA channel engines (`cann-twin-sdma-*`): device model, not Host.
    DeviceModelSdmaEngines,
    /// The twin's emulated AI CPU (`cann-twin-aicpu*`): device model, not Host.
    DeviceModelAiCpu,
    /// The twin's other threads (stream workers, HiXL and VMM services): device model, not Host.
    DeviceModelOther,
}

impl ThreadRole {
    /// The role of a thread called `name` (as `/proc` shows it: at most 15 bytes).
    pub fn of(name: &str) -> ThreadRole {
        const AIV_CORES: &str = "cann-twin-aiv";
        const SDMA_ENGINES: &str = "cann-twin-sdma";
        const AI_CPU: &str = "cann-twin-aicpu";
        if name.starts_with(AIV_CORES) {
            ThreadRole::DeviceModelAivCores
        } else if name.starts_with(SDMA_ENGINES) {
            ThreadRole::DeviceModelSdmaEngines
        } else if name.starts_with(AI_CPU) {
            ThreadRole::DeviceModelAiCpu
        } else if crate::device::DEVICE_THREAD_PREFIXES.iter().any(|prefix| name.starts_with(prefix)) {
            ThreadRole::DeviceModelOther
        } else if name.starts_with("aiv-drain") {
            ThreadRole::AivDrain
        } else if name.starts_with("aiv-probe") {
            ThreadRole::AivProbe
        } else if name.starts_with("adxl-hixl") {
            ThreadRole::AdxlHixl
        } else if name.starts_with("ubshmem-") {
            ThreadRole::Ubshmem
        } else if name.starts_with("tcp-") {
            ThreadRole::Tcp
        } else {
            ThreadRole::Caller
        }
    }

    /// Whether the role is the device model's (the twin's threads), not the Host's.
    pub fn is_device_model(self) -> bool {
        matches!(
            self,
            ThreadRole::DeviceModelAivCores
                | ThreadRole::DeviceModelSdmaEngines
                | ThreadRole::DeviceModelAiCpu
                | ThreadRole::DeviceModelOther
        )
    }

    /// The short name `Display` uses.
    pub fn label(self) -> &'static str {
        match self {
            ThreadRole::AivDrain => "aiv-drain",
            ThreadRole::AivProbe => "aiv-probe",
            ThreadRole::AdxlHixl => "adxl-hixl",
            ThreadRole::Ubshmem => "ubshmem",
            ThreadRole::Tcp => "tcp",
            ThreadRole::Caller => "caller/other",
            ThreadRole::DeviceModelAivCores => "aiv cores",
            ThreadRole::DeviceModelSdmaEngines => "sdma engines",
            ThreadRole::DeviceModelAiCpu => "ai cpu",
            ThreadRole::DeviceModelOther => "other",
        }
    }
}

/// Where the device's counters come from.
#[derive(Clone, Debug)]
enum DeviceSource {
    /// The linked-in twin's counters, per device asked for.
    Twin(Vec<TwinDeviceOccupancy>),
    /// None: why.
    NotExposed(&'static str),
}

/// Why the device part is missing on the vendor's runtime.
pub const VENDOR_NOT_EXPOSED: &str = "not exposed by this runtime: the vendor's CANN runtime gives this process no \
    per-core executing/polling time or SDMA engine busy time through the ACL/SHMEM calls aiv-transport makes (its \
    profiling tools are not used here)";
/// Why the device part is missing on the twin loaded as a library.
pub const LOADED_TWIN_NOT_EXPOSED: &str =
    "not exposed by this runtime: the twin runtime loaded as a library keeps its \
    counters in that library, which this process does not query (only the twin linked in is read)";

/// The state of the device counters and of every thread of the process at one moment.
#[derive(Clone, Debug)]
pub struct OccupancySnapshot {
    taken: Instant,
    device: DeviceSource,
    /// `None`: the task list could not be read.
    threads: Option<Vec<ThreadCpu>>,
}

impl OccupancySnapshot {
    /// A snapshot now. `twin`: the devices run on the twin runtime linked into this process
    /// ([`CannRuntime::Twin`]), whose counters for `device_ids` (the engines' device ids) are read; otherwise the
    /// device part is labelled not exposed (the vendor's runtime).
    pub fn take(device_ids: &[i32], twin: bool) -> Self {
        let device = if twin {
            DeviceSource::Twin(device_ids.iter().map(|&device| cann_twin::control::occupancy(device)).collect())
        } else {
            DeviceSource::NotExposed(VENDOR_NOT_EXPOSED)
        };
        Self::with_device(device)
    }

    /// A snapshot now for devices on `runtime` (as [`crate::device::cann::CannDevice::runtime`] reports it).
    pub fn take_on(device_ids: &[i32], runtime: CannRuntime) -> Self {
        match runtime {
            CannRuntime::Twin => Self::take(device_ids, true),
            CannRuntime::LoadedTwin => Self::with_device(DeviceSource::NotExposed(LOADED_TWIN_NOT_EXPOSED)),
            CannRuntime::Vendor => Self::take(device_ids, false),
        }
    }

    fn with_device(device: DeviceSource) -> Self {
        OccupancySnapshot { taken: Instant::now(), device, threads: crate::cpu_time::process_threads() }
    }

    /// What happened between `earlier` and this snapshot. Counters that went backwards (a snapshot pair taken the
    /// wrong way round) give zero, not a wrap.
    pub fn since(&self, earlier: &OccupancySnapshot) -> Occupancy {
        let wall_ns = self.taken.saturating_duration_since(earlier.taken).as_nanos() as u64;
        let device = match (&self.device, &earlier.device) {
            (DeviceSource::Twin(later), DeviceSource::Twin(before)) => DeviceReport::TwinModel {
                devices: later
                    .iter()
                    .map(|now| device_since(now, before.iter().find(|then| then.device == now.device)))
                    .collect(),
            },
            (DeviceSource::NotExposed(reason), _) | (_, DeviceSource::NotExposed(reason)) => {
                DeviceReport::NotExposed { reason: (*reason).to_string() }
            }
        };
        let (host_cpu, device_model_cpu, threads_exited) = match (&self.threads, &earlier.threads) {
            (Some(later), Some(before)) => {
                let (host, model, exited) = threads_since(later, before);
                (Some(host), Some(model), exited)
            }
            _ => (None, None, 0),
        };
        let host_cpu_ns = host_cpu.as_ref().map(|roles: &Vec<RoleCpu>| roles.iter().map(|role| role.cpu_ns).sum());
        Occupancy { wall_ns, device, host_cpu_ns, host_cpu, device_model_cpu, threads_exited }
    }
}

fn device_since(now: &TwinDeviceOccupancy, then: Option<&TwinDeviceOccupancy>) -> DeviceFigures {
    let wall_ns = then.map_or(now.wall_ns(), |then| now.taken_at_ns.saturating_sub(then.taken_at_ns));
    let cores = now
        .cores
        .iter()
        .map(|core| {
            let before = then.and_then(|then| then.cores.iter().find(|other| other.block == core.block));
            let executing_ns = core.executing_ns.saturating_sub(before.map_or(0, |before| before.executing_ns));
            let polling_ns = core.polling_ns.saturating_sub(before.map_or(0, |before| before.polling_ns));
            CoreFigures {
                block: core.block,
                executing_ns,
                polling_ns,
                busy_fraction: fraction(executing_ns, executing_ns + polling_ns),
                polls: core.polls.saturating_sub(before.map_or(0, |before| before.polls)),
            }
        })
        .filter(|core| core.executing_ns + core.polling_ns > 0)
        .collect();
    let channels = now
        .channels
        .iter()
        .map(|channel| {
            let before = then.and_then(|then| then.channels.iter().find(|other| other.index == channel.index));
            let busy_ns = channel.busy_ns.saturating_sub(before.map_or(0, |before| before.busy_ns));
            ChannelFigures {
                index: channel.index,
                busy_ns,
                busy_fraction: fraction(busy_ns, wall_ns),
                runs: channel.runs.saturating_sub(before.map_or(0, |before| before.runs)),
                sqes: channel.sqes.saturating_sub(before.map_or(0, |before| before.sqes)),
            }
        })
        .collect();
    let streams = stream_since(&now.streams, then.map(|then| &then.streams), wall_ns);
    let aicpu = aicpu_since(&now.aicpu, then.map(|then| &then.aicpu));
    DeviceFigures { device: now.device, wall_ns, cores, channels, streams, aicpu }
}

fn aicpu_since(now: &TwinAiCpuOccupancy, then: Option<&TwinAiCpuOccupancy>) -> AiCpuFigures {
    let since = |figure: fn(&TwinAiCpuOccupancy) -> u64| figure(now).saturating_sub(then.map_or(0, figure));
    let (executing_ns, polling_ns, idle_ns) =
        (since(|a| a.executing_ns), since(|a| a.polling_ns), since(|a| a.idle_ns));
    AiCpuFigures {
        threads: now.threads,
        executing_ns,
        polling_ns,
        idle_ns,
        busy_fraction: fraction(executing_ns + polling_ns, executing_ns + polling_ns + idle_ns),
        tasks_launched: since(|a| a.tasks_launched),
        tasks_run: since(|a| a.tasks_run),
        tasks_failed: since(|a| a.tasks_failed),
    }
}

fn stream_since(now: &TwinStreamOccupancy, then: Option<&TwinStreamOccupancy>, wall_ns: u64) -> StreamFigures {
    let since = |figure: fn(&TwinStreamOccupancy) -> u64| figure(now).saturating_sub(then.map_or(0, figure));
    let copy_busy_ns = since(|streams| streams.copy_busy_ns);
    let sync_copy_busy_ns = since(|streams| streams.sync_copy_busy_ns);
    StreamFigures {
        copy_busy_ns,
        copy_busy_fraction: fraction(copy_busy_ns, wall_ns),
        copies: since(|streams| streams.copies),
        copy_bytes: since(|streams| streams.copy_bytes),
        failed_copies: since(|streams| streams.failed_copies),
        sync_copy_busy_ns,
        sync_copy_busy_fraction: fraction(sync_copy_busy_ns, wall_ns),
        sync_copies: since(|streams| streams.sync_copies),
        sync_copy_bytes: since(|streams| streams.sync_copy_bytes),
        kernel_task_ns: since(|streams| streams.kernel_task_ns),
        kernel_tasks: since(|streams| streams.kernel_tasks),
        kernel_tasks_running: now.kernel_tasks_running,
    }
}

fn fraction(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// The CPU by role between two thread lists: (Host roles, device-model roles, threads that exited meanwhile). A
/// thread id seen with another name is a new thread (the id was reused).
fn threads_since(later: &[ThreadCpu], before: &[ThreadCpu]) -> (Vec<RoleCpu>, Vec<RoleCpu>, u32) {
    let before: HashMap<u64, &ThreadCpu> = before.iter().map(|thread| (thread.tid, thread)).collect();
    let mut roles: BTreeMap<ThreadRole, RoleCpu> = BTreeMap::new();
    let mut still_there = 0u32;
    for thread in later {
        let earlier = before.get(&thread.tid).filter(|earlier| earlier.name == thread.name);
        still_there += u32::from(earlier.is_some());
        let cpu_ns = thread.on_cpu_ns.saturating_sub(earlier.map_or(0, |earlier| earlier.on_cpu_ns));
        let role = ThreadRole::of(&thread.name);
        let entry = roles.entry(role).or_insert(RoleCpu { role, cpu_ns: 0, threads: 0 });
        entry.cpu_ns += cpu_ns;
        entry.threads += 1;
    }
    let exited = (before.len() as u32).saturating_sub(still_there);
    let (model, host): (Vec<RoleCpu>, Vec<RoleCpu>) = roles.into_values().partition(|role| role.role.is_device_model());
    (host, model, exited)
}

/// Occupancy between two snapshots.
#[derive(Clone, Debug, Serialize)]
pub struct Occupancy {
    /// Wall time between the snapshots.
    pub wall_ns: u64,
    /// The device's cores and copy engines.
    pub device: DeviceReport,
    /// Host CPU of every Host role (the device model's threads left out); `None` if the threads could not be read.
    pub host_cpu_ns: Option<u64>,
    /// Host CPU by role, device model left out.
    pub host_cpu: Option<Vec<RoleCpu>>,
    /// CPU of the twin's device-model threads by kind: the cost of the CPU model, never Host figures.
    pub device_model_cpu: Option<Vec<RoleCpu>>,
    /// Threads seen at the first snapshot and gone at the second: their CPU time between the two is not counted.
    pub threads_exited: u32,
}

impl Occupancy {
    /// Adds the CPU time of `threads` Host threads of `role` that started after the first snapshot and ended before
    /// the second (so neither saw them), as measured by the threads themselves (e.g. a benchmark's caller threads).
    pub fn add_unseen_threads(&mut self, role: ThreadRole, threads: u32, cpu_ns: u64) {
        debug_assert!(!role.is_device_model());
        if let Some(total) = &mut self.host_cpu_ns {
            *total = total.saturating_add(cpu_ns);
        }
        if let Some(roles) = &mut self.host_cpu {
            match roles.iter_mut().find(|known| known.role == role) {
                Some(known) => {
                    known.cpu_ns = known.cpu_ns.saturating_add(cpu_ns);
                    known.threads = known.threads.saturating_add(threads);
                }
                None => roles.push(RoleCpu { role, cpu_ns, threads }),
            }
            roles.sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.role.cmp(&b.role)));
        }
    }
}

/// The device part of an [`Occupancy`].
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum DeviceReport {
    /// Measured by the twin runtime's CPU model (unverified on hardware).
    TwinModel { devices: Vec<DeviceFigures> },
    /// The runtime does not expose these figures: why.
    NotExposed { reason: String },
}

/// One device's figures between two snapshots.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceFigures {
    pub device: i32,
    /// Wall time between the device's two counter snapshots (the base of the channels' `busy_fraction`).
    pub wall_ns: u64,
    /// Per block index that ran meanwhile.
    pub cores: Vec<CoreFigures>,
    /// Per SDMA channel the device has (idle ones included).
    pub channels: Vec<ChannelFigures>,
    /// The runtime's copies (stream copy tasks, synchronous copies) and the streams' kernel-launch tasks.
    pub streams: StreamFigures,
    /// The emulated AI CPU's threads and tasks.
    pub aicpu: AiCpuFigures,
}

/// The emulated AI CPU of one device between two snapshots (docs/occupancy.md: executing, polling, idle).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct AiCpuFigures {
    /// Its threads at the later snapshot.
    pub threads: u32,
    /// Running tasks, their polling left out.
    pub executing_ns: u64,
    /// Tasks polling device memory (room in their SDMA ring, their completion word).
    pub polling_ns: u64,
    /// Threads waiting for a task.
    pub idle_ns: u64,
    /// `(executing + polling) / (executing + polling + idle)`: the share of its threads' time spent on tasks.
    pub busy_fraction: Option<f64>,
    /// AI-CPU kernel launches queued, tasks finished, tasks failed.
    pub tasks_launched: u64,
    pub tasks_run: u64,
    pub tasks_failed: u64,
}

impl fmt::Display for AiCpuFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tasks_launched == 0 && self.tasks_run == 0 && self.executing_ns + self.polling_ns == 0 {
            return write!(f, "AI CPU: no task");
        }
        write!(
            f,
            "AI CPU: {} threads executing {}, polling {}, idle {} ({} busy; {} tasks",
            self.threads,
            Ns(self.executing_ns),
            Ns(self.polling_ns),
            Ns(self.idle_ns),
            percent(self.busy_fraction),
            self.tasks_run
        )?;
        if self.tasks_failed > 0 {
            write!(f, ", {} failed", self.tasks_failed)?;
        }
        write!(f, ")")
    }
}

/// The runtime's copy work on one device between two snapshots (docs/occupancy.md: what is timed). Busy times are
/// summed over copies: copies of several streams at once each count, so a fraction can exceed 1.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct StreamFigures {
    /// Stream copy tasks (`aclrtMemcpyAsync`), from the stream worker taking the task to its end.
    pub copy_busy_ns: u64,
    /// `copy_busy / wall` of the device.
    pub copy_busy_fraction: Option<f64>,
    /// Stream copy tasks finished (done or failed).
    pub copies: u64,
    /// Bytes of the stream copy tasks that succeeded.
    pub copy_bytes: u64,
    pub failed_copies: u64,
    /// Synchronous copies (`aclrtMemcpy` with device memory on a side, charged to the caller's current device).
    pub sync_copy_busy_ns: u64,
    /// `sync_copy_busy / wall` of the device.
    pub sync_copy_busy_fraction: Option<f64>,
    pub sync_copies: u64,
    pub sync_copy_bytes: u64,
    /// Stream kernel-launch tasks, from the worker taking the task to its end: not copy-engine time (the blocks'
    /// own time is in `cores`).
    pub kernel_task_ns: u64,
    /// Kernel-launch tasks finished.
    pub kernel_tasks: u64,
    /// Kernel-launch tasks still running at the later snapshot (a persistent kernel's launch): their time so far is
    /// in `kernel_task_ns`.
    pub kernel_tasks_running: u32,
}

/// One block index's emulated-core time between two snapshots.
#[derive(Clone, Debug, Serialize)]
pub struct CoreFigures {
    pub block: u32,
    pub executing_ns: u64,
    pub polling_ns: u64,
    /// `executing / (executing + polling)`: the share of its core time the block did work.
    pub busy_fraction: Option<f64>,
    /// Poll intervals started.
    pub polls: u64,
}

/// One SDMA channel engine's time between two snapshots.
#[derive(Clone, Debug, Serialize)]
pub struct ChannelFigures {
    pub index: u32,
    pub busy_ns: u64,
    /// `busy / wall` of the device.
    pub busy_fraction: Option<f64>,
    /// Runs of work finished (the SQEs up to one tail).
    pub runs: u64,
    pub sqes: u64,
}

/// The CPU of one thread role between two snapshots.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RoleCpu {
    pub role: ThreadRole,
    pub cpu_ns: u64,
    /// Threads of the role alive at the later snapshot.
    pub threads: u32,
}

/// Nanoseconds as the shortest readable unit.
struct Ns(u64);

impl fmt::Display for Ns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0 as f64;
        match self.0 {
            0..1_000 => write!(f, "{} ns", self.0),
            1_000..1_000_000 => write!(f, "{:.1} us", ns / 1e3),
            1_000_000..1_000_000_000 => write!(f, "{:.1} ms", ns / 1e6),
            _ => write!(f, "{:.2} s", ns / 1e9),
        }
    }
}

/// Bytes in binary units, one decimal where it is not whole.
struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if value.fract() == 0.0 {
            write!(f, "{value:.0} {}", UNITS[unit])
        } else {
            write!(f, "{value:.1} {}", UNITS[unit])
        }
    }
}

fn percent(fraction: Option<f64>) -> String {
    fraction.map_or_else(|| "-".to_string(), |fraction| format!("{:.1}%", fraction * 100.0))
}

/// Blocks listed one by one up to this many; more are summed (with the busiest named).
const BLOCKS_LISTED: usize = 4;

impl fmt::Display for DeviceFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}: AIV cores: ", self.device)?;
        if self.cores.is_empty() {
            write!(f, "none ran")?;
        } else if self.cores.len() <= BLOCKS_LISTED {
            for (i, core) in self.cores.iter().enumerate() {
                let separator = if i == 0 { "" } else { "; " };
                write!(
                    f,
                    "{separator}block {} executing {}, polling {} ({} busy)",
                    core.block,
                    Ns(core.executing_ns),
                    Ns(core.polling_ns),
                    percent(core.busy_fraction)
                )?;
            }
        } else {
            let executing: u64 = self.cores.iter().map(|core| core.executing_ns).sum();
            let polling: u64 = self.cores.iter().map(|core| core.polling_ns).sum();
            write!(
                f,
                "{} blocks executing {}, polling {} in all ({} busy)",
                self.cores.len(),
                Ns(executing),
                Ns(polling),
                percent(fraction(executing, executing + polling))
            )?;
            let busiest = self
                .cores
                .iter()
                .max_by(|a, b| a.busy_fraction.unwrap_or(0.0).total_cmp(&b.busy_fraction.unwrap_or(0.0)));
            if let Some(busiest) = busiest {
                write!(f, ", busiest block {} ({})", busiest.block, percent(busiest.busy_fraction))?;
            }
        }
        write!(f, "; SDMA: ")?;
        let busy: Vec<&ChannelFigures> = self.channels.iter().filter(|channel| channel.busy_ns > 0).collect();
        if busy.is_empty() {
            write!(f, "no channel busy")?;
        }
        for (i, channel) in busy.iter().enumerate() {
            let separator = if i == 0 { "" } else { ", " };
            write!(
                f,
                "{separator}channel {} busy {} ({}, {} SQEs)",
                channel.index,
                Ns(channel.busy_ns),
                percent(channel.busy_fraction),
                channel.sqes
            )?;
        }
        let idle = self.channels.len() - busy.len();
        if idle > 0 && !busy.is_empty() {
            write!(f, "; {idle} channels idle")?;
        }
        write!(f, "; {}; {}", self.aicpu, self.streams)
    }
}

impl fmt::Display for StreamFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.copies == 0 && self.copy_busy_ns == 0 {
            write!(f, "no stream copies")?;
        } else {
            write!(
                f,
                "stream copies busy {} ({}, {} copies, {}",
                Ns(self.copy_busy_ns),
                percent(self.copy_busy_fraction),
                self.copies,
                Bytes(self.copy_bytes)
            )?;
            if self.failed_copies > 0 {
                write!(f, ", {} failed", self.failed_copies)?;
            }
            write!(f, ")")?;
        }
        if self.sync_copies > 0 || self.sync_copy_busy_ns > 0 {
            write!(
                f,
                "; synchronous copies busy {} ({}, {} copies, {})",
                Ns(self.sync_copy_busy_ns),
                percent(self.sync_copy_busy_fraction),
                self.sync_copies,
                Bytes(self.sync_copy_bytes)
            )?;
        }
        if self.kernel_tasks > 0 || self.kernel_task_ns > 0 || self.kernel_tasks_running > 0 {
            write!(f, "; stream kernel launches {} ({}", self.kernel_tasks, Ns(self.kernel_task_ns))?;
            if self.kernel_tasks_running > 0 {
                write!(f, ", {} running", self.kernel_tasks_running)?;
            }
            write!(f, ")")?;
        }
        Ok(())
    }
}

fn write_roles(f: &mut fmt::Formatter<'_>, roles: &[RoleCpu]) -> fmt::Result {
    let mut roles: Vec<&RoleCpu> = roles.iter().collect();
    roles.sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.role.cmp(&b.role)));
    for (i, role) in roles.iter().enumerate() {
        let separator = if i == 0 { "" } else { ", " };
        write!(f, "{separator}{} {}", role.role.label(), Ns(role.cpu_ns))?;
    }
    Ok(())
}

impl fmt::Display for Occupancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "occupancy over {} wall:", Ns(self.wall_ns))?;
        match &self.device {
            DeviceReport::TwinModel { devices } => {
                for device in devices {
                    writeln!(f, "  {device} [twin CPU model, unverified on hardware]")?;
                }
            }
            DeviceReport::NotExposed { reason } => writeln!(f, "  device: {reason}")?,
        }
        match (&self.host_cpu, self.host_cpu_ns) {
            (Some(roles), Some(total)) => {
                write!(f, "  Host CPU by role ({} in all): ", Ns(total))?;
                write_roles(f, roles)?;
                writeln!(f)?;
            }
            _ => writeln!(f, "  Host CPU by role: the process's threads could not be read")?,
        }
        if let Some(model) = self.device_model_cpu.as_ref().filter(|model| !model.is_empty()) {
            write!(f, "  device model CPU (not Host): ")?;
            write_roles(f, model)?;
            writeln!(f)?;
        }
        if self.threads_exited > 0 {
            writeln!(f, "  ({} threads exited in between; their CPU is not counted)", self.threads_exited)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(tid: u64, name: &str, on_cpu_ns: u64) -> ThreadCpu {
        ThreadCpu { tid, name: name.to_string(), on_cpu_ns }
    }

    #[test]
    fn thread_names_map_to_their_roles_and_the_twin_is_the_device_model() {
        let cases = [
            ("aiv-drain-0", ThreadRole::AivDrain),
            ("aiv-probe-3", ThreadRole::AivProbe),
            ("adxl-hixl-1", ThreadRole::AdxlHixl),
            ("ubshmem-0.2", ThreadRole::Ubshmem),
            ("tcp-lane-4", ThreadRole::Tcp),
            ("tcp-accept", ThreadRole::Tcp),
            ("cann-twin-aiv-d", ThreadRole::DeviceModelAivCores),
            ("cann-twin-sdma-", ThreadRole::DeviceModelSdmaEngines),
            ("cann-twin-aicpu", ThreadRole::DeviceModelAiCpu),
            ("cann-twin-strea", ThreadRole::DeviceModelOther),
            ("main", ThreadRole::Caller),
            ("tokio-runtime-w", ThreadRole::Caller),
            ("", ThreadRole::Caller),
        ];
        for (name, role) in cases {
            assert_eq!(ThreadRole::of(name), role, "{name:?}");
            assert_eq!(role.is_device_model(), name.starts_with(cann_twin::THREAD_PREFIX), "{name:?}");
        }
    }

    #[test]
    fn host_cpu_is_the_difference_per_thread_by_role_without_the_device_model() {
        let before = [thread(1, "main", 1_000), thread(2, "aiv-drain-0", 500), thread(3, "cann-twin-aiv-d", 10)];
        let later = [
            thread(1, "main", 4_000),
            thread(2, "aiv-drain-0", 800),
            thread(3, "cann-twin-aiv-d", 9_010),
            // New since: all of its time counts.
            thread(4, "tcp-lane-0", 70),
        ];
        let (host, model, exited) = threads_since(&later, &before);
        let cpu = |roles: &[RoleCpu], role| roles.iter().find(|r| r.role == role).map(|r| r.cpu_ns);
        assert_eq!(cpu(&host, ThreadRole::Caller), Some(3_000));
        assert_eq!(cpu(&host, ThreadRole::AivDrain), Some(300));
        assert_eq!(cpu(&host, ThreadRole::Tcp), Some(70));
        assert_eq!(cpu(&host, ThreadRole::DeviceModelAivCores), None, "the device model is not Host");
        assert_eq!(cpu(&model, ThreadRole::DeviceModelAivCores), Some(9_000));
        assert_eq!(exited, 0);
    }

    #[test]
    fn an_exited_thread_and_a_reused_id_are_not_taken_for_the_same_thread() {
        let before = [thread(1, "main", 1_000), thread(2, "aiv-probe-0", 900), thread(5, "tcp-serve", 50)];
        // Thread 2 exited; id 5 now names another thread (below its old count: a wrong diff would give 0).
        let later = [thread(1, "main", 1_500), thread(5, "aiv-drain-1", 40)];
        let (host, _, exited) = threads_since(&later, &before);
        assert_eq!(exited, 2);
        let drain = host.iter().find(|role| role.role == ThreadRole::AivDrain).expect("the new thread");
        assert_eq!(drain.cpu_ns, 40);
        assert!(host.iter().all(|role| role.role != ThreadRole::AivProbe && role.role != ThreadRole::Tcp));
    }

    #[test]
    fn on_the_vendor_runtime_the_device_part_is_labelled_not_exposed_not_zero() {
        let before = OccupancySnapshot::take(&[0], false);
        let after = OccupancySnapshot::take(&[0], false);
        let occupancy = after.since(&before);
        let DeviceReport::NotExposed { reason } = &occupancy.device else {
            panic!("the vendor runtime reported device figures: {occupancy:?}")
        };
        assert!(reason.starts_with("not exposed by this runtime"), "{reason}");
        let json = serde_json::to_value(&occupancy).expect("serialises");
        assert_eq!(json["device"]["status"], "not_exposed");
        assert!(json["device"].get("devices").is_none(), "{json}");
        let loaded = OccupancySnapshot::take_on(&[0], CannRuntime::LoadedTwin);
        assert!(matches!(loaded.since(&loaded).device, DeviceReport::NotExposed { .. }));
        assert!(occupancy.to_string().contains("not exposed by this runtime"), "{occupancy}");
    }

    /// The Host part measures this thread's own work: spinning ~30 ms on the calling thread shows in "caller".
    #[test]
    fn a_busy_caller_thread_shows_in_the_caller_role() {
        let before = OccupancySnapshot::take(&[], true);
        // 30 ms of this thread's own CPU time (not of wall time: on a loaded machine the thread may wait for a CPU),
        // within 10 s.
        let (started, cpu_started) = (Instant::now(), crate::cpu_time::thread_cpu_time_ns());
        while crate::cpu_time::thread_cpu_time_ns().saturating_sub(cpu_started) < 30_000_000
            && started.elapsed() < std::time::Duration::from_secs(10)
        {
            std::hint::black_box(started.elapsed());
        }
        let occupancy = OccupancySnapshot::take(&[], true).since(&before);
        let Some(host) = occupancy.host_cpu.as_ref() else {
            // Without /proc there is nothing to check; the report says so.
            assert!(occupancy.to_string().contains("could not be read"));
            return;
        };
        let caller = host.iter().find(|role| role.role == ThreadRole::Caller).expect("the test thread is a caller");
        assert!(caller.cpu_ns >= 25_000_000, "{caller:?}");
        assert!(occupancy.host_cpu_ns >= Some(caller.cpu_ns));
        assert!(occupancy.wall_ns >= 30_000_000);
    }

    #[test]
    fn twin_figures_are_differences_with_fractions_and_read_as_text() {
        let device = 7_301;
        let before = OccupancySnapshot::take(&[device], true);
        let after = OccupancySnapshot::take(&[device], true);
        let occupancy = after.since(&before);
        let DeviceReport::TwinModel { devices } = &occupancy.device else { panic!("{occupancy:?}") };
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].device, device);
        assert!(devices[0].cores.is_empty() && devices[0].channels.is_empty(), "nothing ran on it: {devices:?}");
        let json = serde_json::to_value(&occupancy).expect("serialises");
        assert_eq!(json["device"]["status"], "twin_model");
        assert_eq!(json["device"]["devices"][0]["device"], device);
        let streams = &json["device"]["devices"][0]["streams"];
        for field in [
            "copy_busy_ns",
            "copy_busy_fraction",
            "copies",
            "copy_bytes",
            "failed_copies",
            "sync_copy_busy_ns",
            "sync_copy_busy_fraction",
            "sync_copies",
            "sync_copy_bytes",
            "kernel_task_ns",
            "kernel_tasks",
            "kernel_tasks_running",
        ] {
            assert!(streams.get(field).is_some(), "{field} is serialised: {streams}");
        }
        assert_eq!(streams["copies"], 0, "nothing ran on it: {streams}");
        let text = occupancy.to_string();
        assert!(text.contains("none ran") && text.contains("twin CPU model"), "{text}");
        assert!(text.contains("no stream copies"), "{text}");
    }

    #[test]
    fn stream_copy_counters_are_diffed_with_their_share_of_the_device_wall_time() {
        let streams = |copy_busy_ns, copies, copy_bytes, sync_copies, kernel_tasks| {
            let mut streams = TwinStreamOccupancy::default();
            (streams.copy_busy_ns, streams.copies, streams.copy_bytes) = (copy_busy_ns, copies, copy_bytes);
            (streams.sync_copy_busy_ns, streams.sync_copies, streams.sync_copy_bytes) =
                (sync_copies * 1_000, sync_copies, sync_copies * 4096);
            (streams.kernel_task_ns, streams.kernel_tasks) = (kernel_tasks * 50, kernel_tasks);
            streams
        };
        let mut then = TwinDeviceOccupancy::default();
        (then.device, then.taken_at_ns, then.since_ns) = (3, 2_000_000, 0);
        then.streams = streams(700, 2, 8192, 1, 1);
        let mut now = then.clone();
        now.taken_at_ns = 6_000_000;
        now.streams = streams(1_000_700, 6, 8192 + 4 * (1 << 20), 3, 1);
        now.streams.failed_copies = 1;
        let figures = device_since(&now, Some(&then)).streams;
        assert_eq!(
            (figures.copy_busy_ns, figures.copies, figures.copy_bytes, figures.failed_copies),
            (1_000_000, 4, 4 << 20, 1)
        );
        assert_eq!(figures.copy_busy_fraction, Some(0.25), "1 ms of copies over 4 ms of device wall time");
        assert_eq!((figures.sync_copy_busy_ns, figures.sync_copies, figures.sync_copy_bytes), (2_000, 2, 8192));
        assert_eq!((figures.kernel_task_ns, figures.kernel_tasks), (0, 0), "no kernel task meanwhile");
        let text = figures.to_string();
        assert!(text.starts_with("stream copies busy 1.0 ms (25.0%, 4 copies, 4 MiB, 1 failed)"), "{text}");
        assert!(text.contains("synchronous copies busy 2.0 us (0.1%, 2 copies, 8 KiB)"), "{text}");
        // The wrong way round: zeros, not wrapped counts.
        let backwards = device_since(&then, Some(&now)).streams;
        assert_eq!((backwards.copy_busy_ns, backwards.copies, backwards.sync_copies), (0, 0, 0));
        // No earlier snapshot: everything since the counters started, over the device's whole wall time.
        let whole = device_since(&now, None).streams;
        assert_eq!((whole.copies, whole.kernel_tasks), (6, 1));
        assert_eq!(whole.copy_busy_fraction, Some(1_000_700.0 / 6_000_000.0));
    }

    #[test]
    fn device_figures_read_as_text_with_their_busy_share() {
        let figures = DeviceFigures {
            device: 0,
            wall_ns: 50_000_000,
            cores: vec![CoreFigures {
                block: 0,
                executing_ns: 1_200_000,
                polling_ns: 48_800_000,
                busy_fraction: fraction(1_200_000, 50_000_000),
                polls: 3,
            }],
            channels: vec![
                ChannelFigures {
                    index: 0,
                    busy_ns: 3_000_000,
                    busy_fraction: fraction(3_000_000, 50_000_000),
                    runs: 2,
                    sqes: 9,
                },
                ChannelFigures { index: 1, busy_ns: 0, busy_fraction: Some(0.0), runs: 0, sqes: 0 },
            ],
            streams: StreamFigures {
                copy_busy_ns: 12_300_000,
                copy_busy_fraction: fraction(12_300_000, 50_000_000),
                copies: 4096,
                copy_bytes: 16 << 20,
                sync_copies: 2,
                sync_copy_busy_ns: 40_000,
                sync_copy_busy_fraction: fraction(40_000, 50_000_000),
                sync_copy_bytes: 1536,
                ..StreamFigures::default()
            },
            aicpu: AiCpuFigures {
                threads: 4,
                executing_ns: 2_000_000,
                polling_ns: 3_000_000,
                idle_ns: 195_000_000,
                busy_fraction: fraction(5_000_000, 200_000_000),
                tasks_launched: 7,
                tasks_run: 7,
                tasks_failed: 0,
            },
        };
        let text = figures.to_string();
        assert!(
            text.contains("; AI CPU: 4 threads executing 2.0 ms, polling 3.0 ms, idle 195.0 ms (2.5% busy; 7 tasks)"),
            "{text}"
        );
        assert_eq!(AiCpuFigures::default().to_string(), "AI CPU: no task");
        let failed = AiCpuFigures { tasks_run: 2, tasks_failed: 1, ..figures.aicpu };
        assert!(failed.to_string().ends_with("(2.5% busy; 2 tasks, 1 failed)"), "{failed}");
        assert!(text.contains("block 0 executing 1.2 ms, polling 48.8 ms (2.4% busy)"), "{text}");
        assert!(text.contains("channel 0 busy 3.0 ms (6.0%, 9 SQEs)") && text.contains("1 channels idle"), "{text}");
        assert!(text.contains("; stream copies busy 12.3 ms (24.6%, 4096 copies, 16 MiB)"), "{text}");
        assert!(text.contains("; synchronous copies busy 40.0 us (0.1%, 2 copies, 1.5 KiB)"), "{text}");
        assert!(!text.contains("failed") && !text.contains("kernel launches"), "{text}");
        let none = StreamFigures::default().to_string();
        assert_eq!(none, "no stream copies");
        let persistent =
            StreamFigures { kernel_task_ns: 5_800_000, kernel_tasks_running: 1, ..StreamFigures::default() };
        assert_eq!(persistent.to_string(), "no stream copies; stream kernel launches 0 (5.8 ms, 1 running)");
        assert_eq!(fraction(1, 0), None, "no time, no fraction");
    }

    #[test]
    fn twin_counters_are_diffed_by_block_and_channel_and_what_is_new_counts_whole() {
        let core = |block, executing_ns, polling_ns| {
            let mut core = cann_twin::control::CoreOccupancy::default();
            (core.block, core.executing_ns, core.polling_ns, core.polls) = (block, executing_ns, polling_ns, 1);
            core
        };
        let channel = |index, busy_ns, sqes| {
            let mut channel = cann_twin::control::ChannelOccupancy::default();
            (channel.index, channel.busy_ns, channel.sqes, channel.runs) = (index, busy_ns, sqes, 1);
            channel
        };
        let mut then = TwinDeviceOccupancy::default();
        (then.device, then.taken_at_ns, then.since_ns) = (2, 1_000_000, 0);
        then.cores = vec![core(0, 100, 900), core(1, 5, 5)];
        then.channels = vec![channel(0, 400, 4), channel(1, 0, 0)];
        let mut now = then.clone();
        now.taken_at_ns = 11_000_000;
        now.cores = vec![core(0, 1_100, 9_900), core(1, 5, 5), core(7, 30, 70)];
        now.channels = vec![channel(0, 5_000_400, 14), channel(1, 0, 0)];
        let figures = device_since(&now, Some(&then));
        assert_eq!(figures.wall_ns, 10_000_000);
        let blocks: Vec<(u32, u64, u64)> =
            figures.cores.iter().map(|core| (core.block, core.executing_ns, core.polling_ns)).collect();
        // Block 1 did nothing meanwhile (left out); block 7 is new (all of it counts).
        assert_eq!(blocks, [(0, 1_000, 9_000), (7, 30, 70)]);
        assert_eq!(figures.cores[0].busy_fraction, Some(0.1));
        assert_eq!((figures.channels[0].busy_ns, figures.channels[0].sqes), (5_000_000, 10));
        assert_eq!(figures.channels[0].busy_fraction, Some(0.5));
        assert_eq!((figures.channels[1].busy_ns, figures.channels[1].busy_fraction), (0, Some(0.0)));
        // The wrong way round: zeros, not wrapped counts.
        let backwards = device_since(&then, Some(&now));
        assert!(backwards.cores.is_empty() && backwards.channels.iter().all(|channel| channel.busy_ns == 0));
        // No earlier snapshot of the device: everything since its counters started.
        assert_eq!(device_since(&now, None).wall_ns, 11_000_000);
    }
}
