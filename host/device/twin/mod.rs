//! The CPU twin of an Ascend NPU: memfd-backed HBM, STARS-like SDMA engine threads, emulated AIV cores running the
//! transfer kernel's NPU code (kernels/npu/entry.cpp and platform/npu.h) compiled for the host against the strict
//! CPU model of AscendC (kernels/cpu; [`core_ops`]).
//!
//! Owns its memory (user HBM heap + a workspace for SQ rings, channel records and flag areas, as SHMEM's SDMA
//! workspace), its windows (own memory + imported peer heaps; the only addresses an SQE may name), its channels and
//! cores. Test and fault-injection controls are grouped in [`TwinDevice::faults`] and [`TwinDevice::stall_channel`];
//! nothing else in the product calls them.

pub mod core_ops;
pub mod cores;
pub mod export_service;
pub mod kernel_bench;
pub mod memory;
pub mod sdma;
pub mod stream;
mod threads;
pub mod wake;

pub use self::threads::{
    CORE_THREAD_PREFIX, DEVICE_THREAD_PREFIXES, EXPORT_THREAD_PREFIX, SDMA_THREAD_PREFIX, STREAM_THREAD_PREFIX,
};

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use self::core_ops::{BlockContext, KernelMemory};
use self::cores::CorePool;
use self::memory::{Heap, MemfdRegion};
use self::sdma::{SdmaChannel, Windows};
use crate::config::AivOptions;
use crate::device::{
    ChannelException, ChannelInfo, CopyStream, DeviceAdvertisement, DeviceBackend, DeviceBuffer, DeviceError,
    ExportedRegion, HostChannel, ImportedWindow, Launch, SharedMemory,
};
use crate::kernel_abi::{ChannelRecord, FlagArea, SQE_BYTES};

/// Bytes of the workspace per channel beyond its SQ ring: the channel record and the flag area, a page each.
const WORKSPACE_PER_CHANNEL: u64 = 2 * memory::ALLOCATION_ALIGN;

/// Test and fault-injection controls of a twin device. Not used by the product path.
#[derive(Debug, Default)]
pub struct FaultInjection {
    corrupt_translations: AtomicU32,
    stall_streams: Arc<AtomicBool>,
}

impl FaultInjection {
    /// The next `count` peer-address translations return an address outside every window (so the SDMA engine
    /// rejects the SQE that names it).
    pub fn corrupt_next_translations(&self, count: u32) {
        self.corrupt_translations.store(count, Ordering::Release);
    }

    /// Stalls (or releases) every copy stream of the device: queued copies wait, synchronisations time out.
    pub fn stall_streams(&self, stalled: bool) {
        self.stall_streams.store(stalled, Ordering::Release);
    }
}

/// The Host-owned SDMA channel of the `adxl` baseline.
#[derive(Debug)]
struct TwinHostChannel {
    info: ChannelInfo,
    channel: Arc<SdmaChannel>,
}

impl HostChannel for TwinHostChannel {
    fn info(&self) -> ChannelInfo {
        self.info
    }
    fn doorbell_rung(&self) {
        self.channel.doorbell.notify();
    }
    fn progress_token(&self) -> u32 {
        self.channel.progress.token()
    }
    fn wait_progress(&self, token: u32, timeout: Duration) {
        self.channel.progress.sleep(token, timeout);
    }
}

/// Whether no process `pid` exists (kill(2) with signal 0 says ESRCH; EPERM means it exists under another uid).
fn process_is_gone(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 sends nothing; kill only checks that the process exists and may be signalled.
    let result = unsafe { libc::kill(pid, 0) };
    result != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// An address no twin window ever contains (page zero).
pub const UNMAPPED_ADDRESS: u64 = 0x100;

/// Identifies an imported region: (exporting device identity, export id). Export ids are unique per process only.
type ImportKey = (String, u64);

/// One twin device.
#[derive(Debug)]
pub struct TwinDevice {
    id: u32,
    identity: String,
    heap: Arc<Heap>,
    workspace: Heap,
    /// Registered ranges offered to peers, by address.
    exports: Mutex<BTreeMap<u64, ExportedRegion>>,
    /// Hands exported ranges of the heap's memfd to authenticated peers.
    export_service: export_service::ExportService,
    /// The deadline of each import and ping this device makes through a peer's export service.
    export_client_timeout: Duration,
    /// Exporting devices whose advertised `process_id` matched the pid SO_PEERCRED showed at import (so this
    /// process's pid namespace names the exporter by that pid, and a vanished pid is evidence it is gone).
    exporter_pids: Mutex<HashMap<String, u32>>,
    windows: Windows,
    /// What the device's cores may reach (`core_ops::translate`).
    kernel_memory: Arc<KernelMemory>,
    /// Imported peer regions by (exporting device identity, export id).
    imports: Mutex<HashMap<ImportKey, (ImportedWindow, Arc<MemfdRegion>)>>,
    channels: RwLock<Vec<Arc<SdmaChannel>>>,
    // Boxed: kernels hold raw pointers to each context, which must not move when the vector grows.
    #[allow(clippy::vec_box)]
    /// Set once, when the channels open (the Host reads it on every submit, so no lock).
    contexts: OnceLock<Vec<BlockContext>>,
    engine_threads: Mutex<Vec<JoinHandle<()>>>,
    cores: OnceLock<CorePool>,
    /// Fault-injection controls (tests only).
    pub faults: FaultInjection,
}

impl TwinDevice {
    /// The context of block `block`'s core, once channels are open.
    pub(crate) fn block_context(&self, block: u32) -> Option<&BlockContext> {
        self.contexts.get()?.get(block as usize)
    }

    /// Refuses a Host copy that does not lie inside memory this device maps.
    fn check_copy(&self, addr: u64, length: usize, operation: &'static str) -> Result<(), DeviceError> {
        if self.is_mapped(addr, length as u64) {
            return Ok(());
        }
        Err(DeviceError::Invalid {
            device: self.id,
            operation,
            reason: format!("[{addr:#x}, +{length}) is not device memory of this backend"),
        })
    }

    /// Starts SDMA channel `index`: its SQ ring, channel record and flag area in the workspace, and its engine
    /// thread (named `aiv-sdma-<device>.<label>`, pushed onto `threads`). Returns the channel and the device
    /// addresses of its record and flag area.
    fn start_channel(
        &self,
        index: u32,
        sq_depth: u32,
        label: String,
        threads: &mut Vec<std::thread::JoinHandle<()>>,
    ) -> Result<(Arc<SdmaChannel>, u64, u64), DeviceError> {
        let sq_base = self.workspace.allocate(self.id, u64::from(sq_depth) * SQE_BYTES)?;
        let record = self.workspace.allocate(self.id, std::mem::size_of::<ChannelRecord>() as u64)?;
        let flag_area = self.workspace.allocate(self.id, std::mem::size_of::<FlagArea>() as u64)?;
        // SAFETY: `record` and `sq_base` are fresh zeroed workspace allocations that live as long as the device,
        // which joins the engine threads before dropping the workspace.
        let channel = unsafe {
            SdmaChannel::new(index, self.id, record as *mut ChannelRecord, sq_base, sq_depth, self.windows.clone())?
        };
        let engine = channel.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{SDMA_THREAD_PREFIX}{}.{label}", self.id))
            .spawn(move || engine.run())
            .map_err(|source| DeviceError::Os { device: self.id, operation: "start SDMA engine", source })?;
        threads.push(thread);
        Ok((channel, record, flag_area))
    }

    /// Creates a twin device with `options.hbm_size` bytes of HBM.
    pub fn open(options: &AivOptions) -> Result<Arc<TwinDevice>, DeviceError> {
        static INSTANCE: AtomicU64 = AtomicU64::new(0);
        let id = options.device_id;
        let instance = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let identity = format!("twin-{}-{id}-{instance}", std::process::id());
        let heap_region = Arc::new(MemfdRegion::create(id, &format!("aiv-twin-hbm-{id}"), options.hbm_size)?);
        let sq_bytes =
            (u64::from(options.sq_depth) * SQE_BYTES).div_ceil(memory::ALLOCATION_ALIGN) * memory::ALLOCATION_ALIGN;
        // One channel per AIV block plus the Host-owned channel of the adxl baseline.
        let workspace_bytes = (u64::from(options.aiv_blocks) + 1) * (sq_bytes + WORKSPACE_PER_CHANNEL);
        let workspace_region =
            Arc::new(MemfdRegion::create(id, &format!("aiv-twin-workspace-{id}"), workspace_bytes.max(4096))?);
        let windows: Windows = Arc::new(RwLock::new(vec![
            (heap_region.base(), heap_region.len()),
            (workspace_region.base(), workspace_region.len()),
        ]));
        let export_service = export_service::ExportService::start_with(&identity, options.export.clone())
            .map_err(|source| DeviceError::Os { device: id, operation: "start the export service", source })?;
        tracing::debug!(device = id, identity = %identity, hbm = options.hbm_size, "twin device opened");
        Ok(Arc::new(TwinDevice {
            id,
            identity,
            heap: Arc::new(Heap::new(heap_region)),
            workspace: Heap::new(workspace_region),
            exports: Mutex::new(BTreeMap::new()),
            export_service,
            export_client_timeout: options.export.client_timeout,
            exporter_pids: Mutex::new(HashMap::new()),
            kernel_memory: Arc::new(KernelMemory { windows: windows.clone(), shared: RwLock::new(Vec::new()) }),
            windows,
            imports: Mutex::new(HashMap::new()),
            channels: RwLock::new(Vec::new()),
            contexts: OnceLock::new(),
            engine_threads: Mutex::new(Vec::new()),
            cores: OnceLock::new(),
            faults: FaultInjection::default(),
        }))
    }

    /// The unique identity advertised to peers.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Fault injection: closes this device's export socket (`false`: peers' connections are refused, as when the
    /// process is gone) or listens on the same name again (`true`).
    pub fn set_export_listening(&self, listening: bool) -> std::io::Result<()> {
        self.export_service.set_listening(listening)
    }

    /// What this device's export service has done so far (admissions, refusals, evictions).
    pub fn export_stats(&self) -> export_service::ExportStats {
        self.export_service.stats()
    }

    /// The name of this device's export socket (`@` + abstract name), as advertised.
    pub fn export_endpoint(&self) -> &str {
        self.export_service.endpoint()
    }

    /// Fault injection: stall (or release) a channel's SDMA engine thread.
    pub fn stall_channel(&self, channel: u32, stalled: bool) {
        if let Some(channel) = self.channel(channel) {
            channel.set_stalled(stalled);
        }
    }

    /// SQEs a channel has executed (for tests and tools).
    pub fn executed_sqes(&self, channel: u32) -> u64 {
        self.channel(channel).map(|c| c.executed()).unwrap_or(0)
    }

    fn channel(&self, index: u32) -> Option<Arc<SdmaChannel>> {
        self.channels.read().unwrap_or_else(|p| p.into_inner()).get(index as usize).cloned()
    }
}

impl DeviceBackend for TwinDevice {
    fn backend_name(&self) -> &'static str {
        "twin"
    }

    fn device_id(&self) -> u32 {
        self.id
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn allocate(&self, length: u64) -> Result<DeviceBuffer, DeviceError> {
        let addr = self.heap.allocate(self.id, length)?;
        // The buffer keeps the heap (and so the mapping) alive: it may outlive the device handle.
        let heap = self.heap.clone();
        Ok(DeviceBuffer::new(
            addr,
            length,
            Box::new(move || {
                heap.free(addr);
            }),
        ))
    }

    fn is_mapped(&self, addr: u64, length: u64) -> bool {
        let windows = self.windows.read().unwrap_or_else(|p| p.into_inner());
        let Some(end) = addr.checked_add(length) else { return false };
        windows.iter().any(|&(base, len)| addr >= base && end <= base + len)
    }

    fn is_own_memory(&self, addr: u64, length: u64) -> bool {
        self.heap.region().contains(addr, length)
    }

    /// A copy through the twin's HBM mapping (the Host side of the twin's DMA).
    fn copy_to_device(&self, addr: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.check_copy(addr, data.len(), "copy to device")?;
        // SAFETY: `[addr, +len)` lies in a window this device maps (checked above), which stays mapped while the
        // device lives; `data` is live Host memory that cannot overlap device memory handed out by the twin.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
        Ok(())
    }

    fn copy_from_device(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        self.check_copy(addr, out.len(), "copy from device")?;
        // SAFETY: as in `copy_to_device`, with the roles swapped.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn advertisement(&self) -> DeviceAdvertisement {
        DeviceAdvertisement {
            device: self.identity.clone(),
            device_id: self.id,
            backend: "twin".into(),
            regions: self.exports.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect(),
            export_endpoint: Some(self.export_service.endpoint().to_owned()),
            export_secret: Some(self.export_service.secret().to_owned()),
            process_id: Some(std::process::id()),
            hixl_server: None,
        }
    }

    fn import(&self, exporter: &DeviceAdvertisement, region: &ExportedRegion) -> Result<ImportedWindow, DeviceError> {
        let invalid = |reason: String| DeviceError::Invalid { device: self.id, operation: "import", reason };
        let key = (exporter.device.clone(), region.export_id);
        let mut imports = self.imports.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((window, _)) = imports.get(&key) {
            return Ok(*window);
        }
        // One path for peers in this process and in others: the exporter's export service.
        let (Some(endpoint), Some(secret)) = (&exporter.export_endpoint, &exporter.export_secret) else {
            return Err(invalid(format!("{:?} advertises no export endpoint and secret", exporter.device)));
        };
        let imported = export_service::import(endpoint, secret, region.export_id, self.export_client_timeout).map_err(
            |source| DeviceError::Os {
                device: self.id,
                operation: "import through the exporter's export service",
                source,
            },
        )?;
        if imported.device != exporter.device || imported.length != region.length {
            return Err(invalid(format!(
                "export {} belongs to {:?} ({} bytes), not {:?} ({} bytes)",
                region.export_id, imported.device, imported.length, exporter.device, region.length
            )));
        }
        // mmap needs a page-aligned offset: map from the page holding the region's first byte.
        let delta = imported.offset % memory::ALLOCATION_ALIGN;
        let mapping = Arc::new(MemfdRegion::map_at(
            self.id,
            Arc::new(imported.fd),
            imported.offset - delta,
            imported.length + delta,
        )?);
        let local_base = mapping.base() + delta;
        let window = ImportedWindow { local_base, remote_base: region.addr, length: region.length };
        // The SDMA engine validates every SQE address against these windows: exactly the exported range.
        self.windows.write().unwrap_or_else(|p| p.into_inner()).push((local_base, region.length));
        imports.insert(key, (window, mapping));
        if exporter.process_id == u32::try_from(imported.server_pid).ok() {
            if let Some(pid) = exporter.process_id {
                self.exporter_pids.lock().unwrap_or_else(|p| p.into_inner()).insert(exporter.device.clone(), pid);
            }
        }
        tracing::debug!(device = self.id, exporter = %exporter.device, local = window.local_base, "peer heap imported");
        Ok(window)
    }

    fn export_range(&self, addr: u64, length: u64) -> Result<ExportedRegion, DeviceError> {
        if !self.heap.region().contains(addr, length) || length == 0 {
            return Err(DeviceError::Invalid {
                device: self.id,
                operation: "export",
                reason: format!("[{addr:#x}, +{length}) is not inside this device's HBM"),
            });
        }
        static NEXT_EXPORT: AtomicU64 = AtomicU64::new(1);
        let export_id = NEXT_EXPORT.fetch_add(1, Ordering::Relaxed);
        let offset = addr - self.heap.region().base();
        self.export_service.offer(export_id, export_service::Offer { fd: self.heap.region().fd(), offset, length });
        let region = ExportedRegion { addr, length, export_id };
        self.exports.lock().unwrap_or_else(|p| p.into_inner()).insert(addr, region.clone());
        Ok(region)
    }

    fn withdraw_range(&self, addr: u64) -> bool {
        let Some(region) = self.exports.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr) else { return false };
        self.export_service.withdraw(region.export_id)
    }

    fn probe_peer(&self, exporter: &DeviceAdvertisement) -> Option<std::io::Result<()>> {
        let (endpoint, secret) = (exporter.export_endpoint.as_ref()?, exporter.export_secret.as_ref()?);
        let outcome = export_service::ping(endpoint, secret, &exporter.device, self.export_client_timeout);
        let Err(error) = outcome else { return Some(Ok(())) };
        // A refused connection or another device answering already proves the exporter gone. A timeout or a busy
        // service does not; then the exporter's pid, where it is known to name the exporter here, may.
        if matches!(error.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound) {
            return Some(Err(error));
        }
        let pid = self.exporter_pids.lock().unwrap_or_else(|p| p.into_inner()).get(&exporter.device).copied();
        if let Some(pid) = pid.filter(|&pid| process_is_gone(pid)) {
            return Some(Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("exporter process {pid} no longer exists (probe: {error})"),
            )));
        }
        Some(Err(error))
    }

    fn translate(&self, window: &ImportedWindow, remote: u64, length: u64) -> Option<u64> {
        let corrupt = self
            .faults
            .corrupt_translations
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if corrupt {
            tracing::warn!(device = self.id, remote, "fault injection: corrupted a translated address");
            return Some(UNMAPPED_ADDRESS);
        }
        window.translate(remote, length)
    }

    fn allocate_shared(&self, length: usize) -> Result<SharedMemory, DeviceError> {
        let (host, length) = super::map_anonymous_pages(self.id, length, "map shared memory")?;
        let addr = host as usize;
        let range = (addr as u64, length as u64);
        self.kernel_memory.shared.write().unwrap_or_else(|p| p.into_inner()).push(range);
        let memory = self.kernel_memory.clone();
        let release = Box::new(move || {
            memory.shared.write().unwrap_or_else(|p| p.into_inner()).retain(|&known| known != range);
            // SAFETY: unmaps the mapping created above, once, when its owner drops.
            unsafe { libc::munmap(addr as *mut libc::c_void, length) };
        });
        // SAFETY: anonymous mappings are zeroed and page aligned; the release closure unmaps exactly this mapping.
        Ok(unsafe { SharedMemory::from_raw(host.cast(), host as u64, length, release) })
    }

    fn open_channels(&self, count: u32, sq_depth: u32) -> Result<Vec<ChannelInfo>, DeviceError> {
        let mut channels = self.channels.write().unwrap_or_else(|p| p.into_inner());
        if !channels.is_empty() {
            return Err(DeviceError::Invalid {
                device: self.id,
                operation: "open channels",
                reason: "channels are already open on this device".into(),
            });
        }
        let cores = CorePool::start(self.id, count).map_err(|source| DeviceError::Os {
            device: self.id,
            operation: "start AIV cores",
            source,
        })?;
        let _ = self.cores.set(cores);
        let mut contexts = Vec::with_capacity(count as usize);
        let mut threads = self.engine_threads.lock().unwrap_or_else(|p| p.into_inner());
        let mut started = Vec::with_capacity(count as usize);
        for index in 0..count {
            let (channel, record, flag_area) = self.start_channel(index, sq_depth, format!("{index}"), &mut threads)?;
            contexts.push(BlockContext { channel: channel.clone(), memory: self.kernel_memory.clone() });
            channels.push(channel);
            started.push((record, flag_area));
        }
        // The channels-open check above runs under the channel lock, so these are the only setters. The contexts'
        // addresses, handed to the kernel, are taken where they stay: in the vector owned by the device.
        let contexts = self.contexts.get_or_init(|| contexts);
        Ok((0..count)
            .zip(started)
            .zip(contexts)
            .map(|((index, (record, flag_area)), context)| ChannelInfo {
                index,
                record_addr: record,
                flag_area_addr: flag_area,
                platform_context: context as *const BlockContext as u64,
            })
            .collect())
    }

    fn open_host_channel(&self, sq_depth: u32) -> Result<Arc<dyn HostChannel>, DeviceError> {
        let mut channels = self.channels.write().unwrap_or_else(|p| p.into_inner());
        let index = channels.len() as u32;
        let mut threads = self.engine_threads.lock().unwrap_or_else(|p| p.into_inner());
        let (channel, record, flag_area) = self.start_channel(index, sq_depth, format!("host{index}"), &mut threads)?;
        drop(threads);
        channels.push(channel.clone());
        let info = ChannelInfo { index, record_addr: record, flag_area_addr: flag_area, platform_context: 0 };
        Ok(Arc::new(TwinHostChannel { info, channel }))
    }

    fn create_stream(&self) -> Result<Arc<dyn CopyStream>, DeviceError> {
        static STREAMS: AtomicU32 = AtomicU32::new(0);
        let index = STREAMS.fetch_add(1, Ordering::Relaxed);
        let stream =
            stream::TwinStream::start(self.id, index, self.windows.clone(), self.faults.stall_streams.clone())?;
        Ok(Arc::new(stream))
    }

    fn channel_exception(&self, channel: u32) -> Option<ChannelException> {
        self.channel(channel)?.exception()
    }

    fn reset_channel(&self, channel: u32) -> Result<(), DeviceError> {
        let Some(channel) = self.channel(channel) else {
            return Err(DeviceError::Invalid {
                device: self.id,
                operation: "reset channel",
                reason: "no such channel".into(),
            });
        };
        channel.reset(self.id)
    }

    fn launch(&self, kernel_args: u64, block_dim: u32) -> Result<Arc<dyn Launch>, DeviceError> {
        let cores = self.cores.get().ok_or_else(|| DeviceError::Invalid {
            device: self.id,
            operation: "launch",
            reason: "no channels are open (open_channels starts the cores)".into(),
        })?;
        if block_dim == 0 || block_dim > cores.len() {
            return Err(DeviceError::Invalid {
                device: self.id,
                operation: "launch",
                reason: format!("block_dim {block_dim} is not within 1..={}", cores.len()),
            });
        }
        let contexts = self.contexts.get().ok_or_else(|| DeviceError::Invalid {
            device: self.id,
            operation: "launch",
            reason: "no channels are open".into(),
        })?;
        Ok(cores.launch(kernel_args, block_dim, contexts))
    }

    fn cycles_per_second(&self) -> u64 {
        1_000_000_000
    }

    fn notify_block(&self, block: u32) {
        if let Some(context) = self.contexts.get().and_then(|contexts| contexts.get(block as usize)) {
            // The core's idle wake word (it polls memory; this only ends a nap early).
            context.channel.progress.notify();
        }
    }
}

impl Drop for TwinDevice {
    fn drop(&mut self) {
        if let Some(cores) = self.cores.get() {
            cores.shut_down(Duration::from_secs(2));
        }
        for channel in self.channels.read().unwrap_or_else(|p| p.into_inner()).iter() {
            channel.shut_down();
        }
        for thread in std::mem::take(&mut *self.engine_threads.lock().unwrap_or_else(|p| p.into_inner())) {
            let _ = thread.join();
        }
    }
}
