//! Kernel-level microbenchmarks of the aiv path on the CPU twin, and the idle cost of two twin devices.
//!
//! - `post_cost/doorbell_batch/{1,4,32}`: CPU time of the emulated AIV core per SQE inside the kernel's post path
//!   (SQE write + doorbell every N SQEs, the doorbell's wake-up of the engine thread included), with the SDMA engine
//!   thread running and consuming 64-byte copies, run as the kernel `aiv_bench_post_kernel` of the twin runtime's
//!   kernel object; flag drains are excluded (CANN SHMEM's `postsend_cost` analogue).
//!   CPU time rather than wall time, so that preemption by the other threads of a loaded 2-core machine does not
//!   count as post cost.
//! - `request_to_dcq/64B`: one 64-byte WRITE between two twin devices through the engine API (submit -> request ring
//!   -> kernel -> SQE -> doorbell -> SDMA -> flag -> DCQ -> Host drain -> wait_batch returns).
//! - `throughput/{aiv,memcpy}/<block>`: 32 MiB per iteration moved as 32 MiB / block transfers of one batch over
//!   the aiv transport (2 AIV blocks, 2 SDMA channels), next to plain memcpy of the same blocks at the same addresses
//!   on 2 long-lived threads, in the same run.
//!
//! Run: `cargo bench --bench kernel`; `AIV_PAIRED_ROUNDS` and `AIV_PAIRED_BLOCKS` (comma-separated byte counts) set
//! the paired comparison's rounds and block sizes. The twin's provenance records are on, as the engine's default
//! (`aiv.record_provenance`); `AIV_BENCH_RECORD_PROVENANCE=0` turns them off. A group sets up its devices (and
//! `throughput` runs the paired comparison) only when the filter selects one of its benchmarks: `-- post_cost` opens
//! no engine pair and `--list` opens nothing.
//!
//! With `AIV_BENCH_REPORT=FILE` the bench first measures the idle cost (two twin devices with persistent kernels and
//! nothing to do: the process's CPU over a window after a settling time, and per kind of thread) and after the
//! benchmarks writes FILE, the report the results pages render (`aiv_transport::audit::kernel_bench`): where it ran,
//! as the audit records it, criterion's median and its confidence interval of each benchmark that ran (read from
//! criterion's `estimates.json`), the paired comparison and the idle cost. Without it nothing is written but
//! criterion's own output.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use aiv_transport::audit::kernel_bench::{
    BenchEstimate, IdleCost, KernelReport, PairedBlock, ThreadKindCpu, KERNEL_SCHEMA,
};
use aiv_transport::audit::report::{utc_now, Environment};

use aiv_transport::config::{AivOptions, LaunchMode};
use aiv_transport::device::DeviceBuffer;
use aiv_transport::engine::AivDevice;
use aiv_transport::occupancy::{DeviceReport, OccupancySnapshot, RoleCpu};
use aiv_transport::{EngineConfig, Opcode, Protocol, SegmentId, TransferEngine, TransferRequest, TransferState};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};

fn options(device_id: u32, mode: LaunchMode, doorbell_batch: u32) -> AivOptions {
    AivOptions {
        device_id,
        aiv_blocks: 2,
        doorbell_batch,
        launch_mode: mode,
        sq_depth: 4096,
        request_ring_depth: 1024,
        hbm_size: 256 << 20,
        // A loaded 2-core machine can starve the engine threads for a while; a benchmark must not fail for that.
        kernel_wait_budget: Duration::from_secs(10),
        transfer_timeout: Duration::from_secs(60),
        // The engine's default (on); `AIV_BENCH_RECORD_PROVENANCE=0` measures without the twin's provenance records.
        record_provenance: std::env::var("AIV_BENCH_RECORD_PROVENANCE").map_or(true, |v| v != "0"),
        ..AivOptions::default()
    }
}

/// One run of `aiv_bench_post_kernel` (kernels/cpu/host_hooks.cpp) on block 0 of the device's transport: `count` copy
/// SQEs of `length` bytes through the kernel's real post path on an emulated core of the twin runtime; the CPU time of
/// that core's thread inside the post path.
fn post_on_runtime(device: &AivDevice, params: &DeviceBuffer, src: u64, dst: u64, length: u32, count: u32) -> Duration {
    let (kernel_args, _) = device.transport().kernel_args();
    let mut bytes = [0u8; 64];
    bytes[0..8].copy_from_slice(&kernel_args.to_le_bytes());
    bytes[8..16].copy_from_slice(&src.to_le_bytes());
    bytes[16..24].copy_from_slice(&dst.to_le_bytes());
    bytes[28..32].copy_from_slice(&length.to_le_bytes());
    bytes[32..36].copy_from_slice(&count.to_le_bytes());
    device.write(params.addr(), &bytes).expect("H2D parameters");
    let launch =
        device.backend().launch_function("aiv_bench_post_kernel", params.addr(), 1).expect("launch the bench kernel");
    assert!(launch.wait(Duration::from_secs(120)), "the bench kernel did not return");
    device.read(params.addr(), &mut bytes).expect("D2H results");
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    assert_eq!(u32::from_le_bytes(bytes[36..40].try_into().expect("4 bytes")), 0, "a drain failed");
    Duration::from_nanos(word(48))
}

fn post_cost(c: &mut Criterion) {
    let mut group = c.benchmark_group("post_cost");
    group.sample_size(20).measurement_time(Duration::from_secs(3));
    for batch in [1u32, 4, 32] {
        // Opened on the first call of the routine: criterion calls it only when the filter selects the benchmark.
        // Per-batch mode: no kernel is resident, so the bench kernel has block 0's channel to itself.
        let setup = OnceCell::new();
        group.throughput(Throughput::Elements(1));
        group.bench_function(BenchmarkId::new("doorbell_batch", batch), |b| {
            let (device, buffer, params) = setup.get_or_init(|| {
                let device = AivDevice::open(&options(0, LaunchMode::PerBatch, batch)).expect("twin device");
                let buffer = device.allocate(1 << 20).expect("hbm");
                let params = device.allocate(64).expect("parameters");
                (device, buffer, params)
            });
            let (src, dst) = (buffer.addr(), buffer.addr() + 4096);
            b.iter_custom(|iters| {
                let mut posting = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let count = left.min(1 << 20) as u32;
                    posting += post_on_runtime(device, params, src, dst, 64, count);
                    left -= u64::from(count);
                }
                posting
            })
        });
    }
    group.finish();
}

struct Pair {
    initiator: TransferEngine,
    /// Kept alive: it serves the initiator's transfers.
    _target: TransferEngine,
    devices: (std::sync::Arc<AivDevice>, std::sync::Arc<AivDevice>),
    local: DeviceBuffer,
    remote: DeviceBuffer,
    segment: SegmentId,
}

fn pair(length: u64) -> Pair {
    let engine = |id: u32| {
        let mut config = EngineConfig::new("127.0.0.1");
        config.protocol = Protocol::Aiv;
        config.aiv = options(id, LaunchMode::Persistent, 8);
        TransferEngine::new(config).expect("engine")
    };
    let (initiator, target) = (engine(0), engine(1));
    let (a, b) = (initiator.device().expect("device 0"), target.device().expect("device 1"));
    let local = a.allocate(length).expect("hbm 0");
    let remote = b.allocate(length).expect("hbm 1");
    // SAFETY: both buffers live in the Pair next to the engines; every batch is waited for before they drop.
    unsafe {
        initiator.register_memory(local.addr(), local.len(), &a.location()).expect("register 0");
        target.register_memory(remote.addr(), remote.len(), &b.location()).expect("register 1");
    }
    let segment = initiator.open_segment(target.name()).expect("open peer");
    Pair { initiator, _target: target, devices: (a, b), local, remote, segment }
}

impl Pair {
    fn run(&self, block: u64, count: u64) {
        let requests: Vec<TransferRequest> = (0..count)
            .map(|i| TransferRequest {
                opcode: Opcode::Write,
                source: self.local.addr() + i * block,
                target_id: self.segment,
                target_offset: self.remote.addr() + i * block,
                length: block,
                protocol: None,
            })
            .collect();
        let batch = self.initiator.allocate_batch(requests.len()).expect("batch");
        self.initiator.submit_transfer(batch, &requests).expect("submit");
        let status = self.initiator.wait_batch(batch).expect("wait");
        assert_eq!(status.state, TransferState::Completed, "{:?}", self.initiator.task_reason(batch, 0));
        self.initiator.free_batch(batch).expect("free");
    }
}

fn request_to_dcq(c: &mut Criterion) {
    // Built on the first call of the routine: criterion calls it only when the filter selects the benchmark.
    let pair = OnceCell::new();
    let mut group = c.benchmark_group("request_to_dcq");
    group.sample_size(50).measurement_time(Duration::from_secs(3));
    group.bench_function("64B", |b| {
        let pair = pair.get_or_init(|| self::pair(1 << 20));
        b.iter(|| pair.run(64, 1))
    });
    group.finish();
}

/// The throughput benchmarks' engines, buffers and memcpy threads.
struct Throughputs {
    pair: Pair,
    pool: MemcpyPool,
    /// The memcpy reference's Host buffers, and their addresses (taken once, `dst`'s from a unique borrow).
    _buffers: (Vec<u8>, Vec<u8>),
    src: usize,
    dst: usize,
}

/// Bytes per iteration of the throughput benchmarks, and their block sizes.
const THROUGHPUT_TOTAL: u64 = 32 << 20;
const THROUGHPUT_BLOCKS: [u64; 5] = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];

fn throughput(c: &mut Criterion) {
    const TOTAL: u64 = THROUGHPUT_TOTAL;
    // Set up, and the paired comparison run, on the first call of a selected routine: a filter that selects no
    // throughput benchmark (`-- post_cost`) costs neither the engines nor the paired rounds.
    let setup = OnceCell::new();
    let state = || {
        setup.get_or_init(|| {
            let pair = pair(TOTAL);
            // Device memory is filled through the device's copy path (first touch outside the measurement); the
            // memcpy reference copies the same sizes between two Host buffers, as device memory is not the Host's to
            // memcpy.
            pair.devices.0.write(pair.local.addr(), &vec![1u8; TOTAL as usize]).expect("fill local HBM");
            pair.devices.1.write(pair.remote.addr(), &vec![2u8; TOTAL as usize]).expect("fill remote HBM");
            let (src, mut dst) = (vec![1u8; TOTAL as usize], vec![2u8; TOTAL as usize]);
            let (src_addr, dst_addr) = (src.as_ptr() as usize, dst.as_mut_ptr() as usize);
            let state =
                Throughputs { pair, pool: MemcpyPool::new(), _buffers: (src, dst), src: src_addr, dst: dst_addr };
            paired_ratios(&state.pair, &state.pool, state.src, state.dst, TOTAL);
            state
        })
    };
    let mut group = c.benchmark_group("throughput");
    group.sample_size(10).measurement_time(Duration::from_secs(3)).throughput(Throughput::Bytes(TOTAL));
    for block in THROUGHPUT_BLOCKS {
        let count = TOTAL / block;
        group.bench_function(BenchmarkId::new("aiv", block), |b| {
            let state = state();
            b.iter(|| state.pair.run(block, count))
        });
        group.bench_function(BenchmarkId::new("memcpy", block), |b| {
            let state = state();
            b.iter(|| state.pool.copy(state.src, state.dst, block as usize, count as usize))
        });
    }
    group.finish();
}

/// The block sizes of the paired comparison: 64 KiB to 16 MiB, or the comma-separated byte counts in
/// `AIV_PAIRED_BLOCKS` (each a power of two from 4 KiB to 32 MiB; anything else stops the bench naming it).
fn paired_blocks() -> Vec<u64> {
    let Ok(list) = std::env::var("AIV_PAIRED_BLOCKS") else {
        return vec![64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];
    };
    list.split(',')
        .map(|item| match item.trim().parse::<u64>() {
            Ok(block) if block.is_power_of_two() && (4 << 10..=32 << 20).contains(&block) => block,
            _ => panic!("AIV_PAIRED_BLOCKS: {item:?} is not a power of two from 4096 to 33554432"),
        })
        .collect()
}

/// Rounds of the paired comparison per block size (after one warm-up round); `AIV_PAIRED_ROUNDS` overrides. A round
/// of 32 MiB takes ~1.5 ms, so 201 rounds span ~0.6 s per block size: long enough that one descheduling of a thread
/// moves a few rounds, not the median.
const PAIRED_ROUNDS: usize = 201;

/// The same-window comparison: for each block size, [`PAIRED_ROUNDS`] rounds that each time one aiv batch and one
/// memcpy of the same blocks back to back (order alternating), and the median of the per-round ratios. Robust to the
/// machine's load changing between criterion's separate aiv and memcpy measurements.
fn paired_ratios(pair: &Pair, pool: &MemcpyPool, src: usize, dst: usize, total: u64) {
    let rounds = std::env::var("AIV_PAIRED_ROUNDS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(PAIRED_ROUNDS);
    let rounds = rounds.max(1);
    eprintln!("paired (same-window) aiv vs memcpy, {} MiB per round, median of {rounds} rounds:", total >> 20);
    for block in paired_blocks() {
        let count = total / block;
        let mut ratios = Vec::new();
        let (mut aiv_total, mut memcpy_total) = (Duration::ZERO, Duration::ZERO);
        let before = OccupancySnapshot::take(&[0, 1], true);
        for round in 0..=rounds {
            let time = |f: &dyn Fn()| {
                let started = std::time::Instant::now();
                f();
                started.elapsed()
            };
            let aiv = || pair.run(block, count);
            let memcpy = || pool.copy(src, dst, block as usize, count as usize);
            let (a, m) = if round % 2 == 0 { (time(&aiv), time(&memcpy)) } else { (time(&memcpy), time(&aiv)) };
            let (a, m) = if round % 2 == 0 { (a, m) } else { (m, a) };
            if round == 0 {
                continue; // warm-up
            }
            aiv_total += a;
            memcpy_total += m;
            ratios.push(m.as_secs_f64() / a.as_secs_f64());
        }
        let occupancy = OccupancySnapshot::take(&[0, 1], true).since(&before);
        ratios.sort_by(f64::total_cmp);
        let rate = |d: Duration| (total * rounds as u64) as f64 / d.as_secs_f64();
        PAIRED.lock().unwrap_or_else(|e| e.into_inner()).push(PairedBlock {
            block,
            rounds,
            aiv_bytes_per_second: rate(aiv_total),
            memcpy_bytes_per_second: rate(memcpy_total),
            ratio_median: ratios[ratios.len() / 2],
            ratio_min: ratios[0],
            ratio_max: ratios[ratios.len() - 1],
        });
        let gbps = |d: Duration| rate(d) / 1e9;
        eprintln!(
            "  block {:>8} B: aiv {:6.2} GB/s, memcpy {:6.2} GB/s, median ratio aiv/memcpy {:.3} (min {:.3}, max {:.3})",
            block,
            gbps(aiv_total),
            gbps(memcpy_total),
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1]
        );
        print_per_round(&occupancy, rounds as u64 + 1);
    }
}

/// Where the CPU of the machine went in the paired rounds of one block size, per round (aiv and memcpy together, the
/// warm-up included: `rounds` of each), and what the twin's cores and engines did: the device model's threads share
/// the CPUs with the Host's, so a µs its cores spend is a µs its engines do not copy.
fn print_per_round(occupancy: &aiv_transport::occupancy::Occupancy, rounds: u64) {
    let per_round = |roles: &Option<Vec<RoleCpu>>| -> Vec<String> {
        roles.iter().flatten().map(|r| format!("{} {} µs", r.role.label(), r.cpu_ns / 1000 / rounds)).collect()
    };
    let cpu = [per_round(&occupancy.device_model_cpu), per_round(&occupancy.host_cpu)].concat();
    eprintln!("    CPU per round: {}", cpu.join(", "));
    let DeviceReport::TwinModel { devices } = &occupancy.device else { return };
    for device in devices {
        let cores = device.cores.iter().map(|c| {
            let (executing, polling) = (c.executing_ns / 1000 / rounds, c.polling_ns / 1000 / rounds);
            format!("block {} executing {executing} µs, polling {polling} µs", c.block)
        });
        let channels = device.channels.iter().filter(|c| c.sqes > 0).map(|c| {
            let (busy, runs, sqes) = (c.busy_ns / 1000 / rounds, c.runs / rounds, c.sqes / rounds);
            format!("channel {} busy {busy} µs in {runs} runs of {sqes} SQEs", c.index)
        });
        let all: Vec<String> = cores.chain(channels).collect();
        eprintln!("    device {} per round: {}", device.device, all.join("; "));
    }
}

/// Two long-lived memcpy threads (like the two SDMA engine threads, which also sleep between batches), so the
/// reference pays no thread start-up per round.
struct MemcpyPool {
    jobs: Vec<std::sync::mpsc::Sender<(usize, usize, usize, usize)>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl MemcpyPool {
    fn new() -> MemcpyPool {
        let (done_tx, done) = std::sync::mpsc::channel();
        let jobs = (0..2)
            .map(|thread| {
                let (tx, rx) = std::sync::mpsc::channel::<(usize, usize, usize, usize)>();
                let done_tx = done_tx.clone();
                std::thread::spawn(move || {
                    for (src, dst, block, count) in rx {
                        for i in (thread..count).step_by(2) {
                            // SAFETY: block i lies inside both buffers (count * block == their length) and the two
                            // threads copy disjoint blocks; the caller waits for both before touching the buffers.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    (src + i * block) as *const u8,
                                    (dst + i * block) as *mut u8,
                                    block,
                                )
                            };
                        }
                        let _ = done_tx.send(());
                    }
                });
                tx
            })
            .collect();
        MemcpyPool { jobs, done }
    }

    /// Copies `count` blocks on the 2 threads (thread t takes blocks t, t + 2, ...), as 2 channels would.
    fn copy(&self, src: usize, dst: usize, block: usize, count: usize) {
        for job in &self.jobs {
            job.send((src, dst, block, count)).expect("memcpy thread alive");
        }
        for _ in &self.jobs {
            self.done.recv().expect("memcpy thread alive");
        }
    }
}

/// The paired comparison's figures of this run, for the report.
static PAIRED: Mutex<Vec<PairedBlock>> = Mutex::new(Vec::new());

/// Idle time before the idle window (the devices' first transfers and the kernels' start-up settle), and the window.
const IDLE_SETTLE: Duration = Duration::from_secs(3);
const IDLE_WINDOW: Duration = Duration::from_secs(10);

/// User + system CPU time of the whole process (`getrusage`), threads that exited included.
fn process_cpu() -> Duration {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct, which getrusage fills.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage for the call's duration.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Two twin devices with persistent kernels (the throughput benchmarks' engine pair) and nothing to do: the
/// process's CPU over [`IDLE_WINDOW`] after [`IDLE_SETTLE`], and per kind of thread.
fn idle_cost() -> IdleCost {
    let pair = pair(1 << 20);
    // A few transfers first: the persistent kernels are resident and every thread has started.
    for _ in 0..8 {
        pair.run(64, 1);
    }
    std::thread::sleep(IDLE_SETTLE);
    let (threads_before, cpu_before) = (OccupancySnapshot::take(&[0, 1], true), process_cpu());
    std::thread::sleep(IDLE_WINDOW);
    let cpu = process_cpu() - cpu_before;
    let occupancy = OccupancySnapshot::take(&[0, 1], true).since(&threads_before);
    drop(pair);
    let threads = [occupancy.device_model_cpu, occupancy.host_cpu]
        .into_iter()
        .flatten()
        .flatten()
        .filter(|r| r.cpu_ns > 0)
        .map(|r| ThreadKindCpu {
            kind: if r.role.is_device_model() {
                format!("twin device model: {}", r.role.label())
            } else {
                format!("Host: {}", r.role.label())
            },
            threads: r.threads,
            cpu_ns: r.cpu_ns,
        })
        .collect();
    let cpu_ns = cpu.as_nanos() as u64;
    IdleCost {
        devices: 2,
        settle_s: IDLE_SETTLE.as_secs_f64(),
        window_s: IDLE_WINDOW.as_secs_f64(),
        cpu_ns,
        share_of_core: cpu.as_secs_f64() / IDLE_WINDOW.as_secs_f64(),
        threads,
    }
}

/// Criterion's output directory, as criterion chooses it.
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from).join("criterion")
}

/// The bench's benchmarks with the bytes each iteration moves, in its order.
fn benchmark_ids() -> Vec<(String, Option<u64>)> {
    let mut ids: Vec<(String, Option<u64>)> =
        [1, 4, 32].iter().map(|batch| (format!("post_cost/doorbell_batch/{batch}"), None)).collect();
    ids.push(("request_to_dcq/64B".into(), Some(64)));
    for block in THROUGHPUT_BLOCKS {
        for kind in ["aiv", "memcpy"] {
            ids.push((format!("throughput/{kind}/{block}"), Some(THROUGHPUT_TOTAL)));
        }
    }
    ids
}

/// The estimates of the benchmarks this run measured: those whose `estimates.json` was written since `started`.
fn estimates(criterion: &Path, started: SystemTime) -> Vec<BenchEstimate> {
    benchmark_ids()
        .into_iter()
        .filter(|(id, _)| {
            let file = criterion.join(id).join("new").join("estimates.json");
            std::fs::metadata(file).and_then(|m| m.modified()).is_ok_and(|modified| modified >= started)
        })
        .map(|(id, bytes)| BenchEstimate::from_criterion(criterion, &id, bytes).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// The command as run: the variables that change what it measures, `cargo bench --bench kernel` and criterion's
/// arguments.
fn command() -> Vec<String> {
    let mut command: Vec<String> = ["AIV_PAIRED_ROUNDS", "AIV_PAIRED_BLOCKS", "AIV_BENCH_RECORD_PROVENANCE"]
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|value| format!("{name}={value}")))
        .collect();
    command.extend(["cargo", "bench", "--bench", "kernel"].map(String::from));
    let args: Vec<String> = std::env::args().skip(1).filter(|arg| arg != "--bench").collect();
    if !args.is_empty() {
        command.push("--".into());
        command.extend(args);
    }
    command
}

criterion_group!(benches, post_cost, request_to_dcq, throughput);

fn main() {
    let report = std::env::var_os("AIV_BENCH_REPORT").map(PathBuf::from).filter(|_| {
        // Listing runs nothing, so it reports nothing.
        !std::env::args().any(|arg| arg == "--list")
    });
    let (started, started_utc) = (Instant::now(), utc_now());
    let started_at = SystemTime::now();
    let backend = format!("{:?}", AivOptions::default().device_backend).to_lowercase();
    let environment = Environment::of_this_machine(&backend);
    let idle = report.as_ref().map(|_| idle_cost());
    benches();
    Criterion::default().configure_from_args().final_summary();
    let Some(path) = report else { return };
    let report = KernelReport {
        schema: KERNEL_SCHEMA.into(),
        command: command(),
        started_utc,
        elapsed_s: started.elapsed().as_secs_f64(),
        environment,
        benchmarks: estimates(&criterion_dir(), started_at),
        paired: std::mem::take(&mut *PAIRED.lock().unwrap_or_else(|e| e.into_inner())),
        idle,
    };
    let text = serde_json::to_string_pretty(&report).expect("the report serialises");
    std::fs::write(&path, text + "\n").unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    eprintln!("kernel bench: report written to {}", path.display());
}
