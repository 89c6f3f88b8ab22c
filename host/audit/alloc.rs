//! The audit's allocation success: how much of a requested heap could be had, per memory kind, and how long
//! registering it took.
//!
//! Device memory: the device paths share one HBM heap per device (aiv, adxl and ubshmem all allocate through
//! [`crate::engine::AivDevice::allocate`], and `register_memory` exports a range once for the three; adxl registers
//! the exported ranges with HiXL later, when it first connects to a peer, which is not measured here). Host memory:
//! tcp's, registered as `cpu:0`. Each is requested in chunks of 64 MiB, a refused chunk halved down to 1 MiB, until
//! the request is reached, a 1 MiB chunk is refused, or 10 s have passed; what was obtained is registered with one
//! engine, then withdrawn and freed. Never more than the request is allocated. Pages are not touched: the twin's
//! HBM is a sparse memfd and Host chunks are reserved, not written, so "obtained" means granted, not resident.

use std::time::{Duration, Instant};

use super::report::{size_name, Allocation};
use crate::config::EngineConfig;
use crate::transfer::Protocol;
use crate::TransferEngine;

/// The first chunk requested.
pub const CHUNK: u64 = 64 << 20;
/// The smallest chunk: a refusal at this size ends the allocation.
pub const MIN_CHUNK: u64 = 1 << 20;
/// The most time one memory kind's allocation and registration may take.
pub const TIME_CAP: Duration = Duration::from_secs(10);

/// One memory kind's chunks, freed when dropped.
trait Chunk {
    fn addr(&self) -> u64;
    fn len(&self) -> u64;
}

impl Chunk for crate::device::DeviceBuffer {
    fn addr(&self) -> u64 {
        crate::device::DeviceBuffer::addr(self)
    }
    fn len(&self) -> u64 {
        crate::device::DeviceBuffer::len(self)
    }
}

impl Chunk for Vec<u8> {
    fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }
    fn len(&self) -> u64 {
        self.capacity() as u64
    }
}

/// Allocation success for the memory kinds `paths` use, `request` bytes each, on a fresh engine of `config` (the
/// audit runs it after its rig has gone, so the device's heap is whole).
pub fn measure(config: &EngineConfig, paths: &[Protocol], request: u64) -> Vec<Allocation> {
    let device_paths: Vec<String> =
        paths.iter().filter(|p| p.is_device_path()).map(|p| p.as_str().to_owned()).collect();
    let host_paths: Vec<String> = paths.iter().filter(|p| !p.is_device_path()).map(|p| p.as_str().to_owned()).collect();
    if device_paths.is_empty() && host_paths.is_empty() {
        return Vec::new();
    }
    let failed = |memory: &str, paths: Vec<String>, reason: String| Allocation {
        first_refusal: Some(reason),
        ended: "the engine to register with did not start".into(),
        ..Allocation::empty(memory, paths, request)
    };
    let engine = match TransferEngine::new(config.clone()) {
        Ok(engine) => engine,
        Err(e) => {
            let reason = format!("starting an engine: {e}");
            let mut out = Vec::new();
            if !device_paths.is_empty() {
                out.push(failed("device", device_paths, reason.clone()));
            }
            if !host_paths.is_empty() {
                out.push(failed("host", host_paths, reason));
            }
            return out;
        }
    };
    let mut out = Vec::new();
    if !device_paths.is_empty() {
        match engine.device() {
            Ok(device) => {
                let location = device.location();
                out.push(probe(&engine, "device", device_paths, request, &location, |length| {
                    device.allocate(length).map_err(|e| e.to_string())
                }));
            }
            Err(e) => out.push(failed("device", device_paths, format!("the engine has no device: {e}"))),
        }
    }
    if !host_paths.is_empty() {
        out.push(probe(&engine, "host", host_paths, request, "cpu:0", |length| {
            let length = usize::try_from(length).map_err(|_| "the chunk exceeds usize".to_owned())?;
            let mut chunk = Vec::new();
            chunk.try_reserve_exact(length).map_err(|e| format!("cannot reserve {}: {e}", size_name(length as u64)))?;
            Ok(chunk)
        }));
    }
    out
}

/// Allocates `request` bytes in chunks with `allocate`, registers them with `engine` at `location`, then withdraws
/// and frees them.
fn probe<C: Chunk>(
    engine: &TransferEngine,
    memory: &str,
    paths: Vec<String>,
    request: u64,
    location: &str,
    allocate: impl Fn(u64) -> Result<C, String>,
) -> Allocation {
    let mut record = Allocation::empty(memory, paths, request);
    let started = Instant::now();
    let mut chunks: Vec<C> = Vec::new();
    let mut chunk = CHUNK.min(request);
    let mut ended = None;
    while record.obtained_bytes < request {
        if started.elapsed() > TIME_CAP {
            ended = Some(format!("the {} s cap passed", TIME_CAP.as_secs()));
            break;
        }
        let want = chunk.min(request - record.obtained_bytes);
        match allocate(want) {
            Ok(buffer) => {
                record.obtained_bytes += want;
                chunks.push(buffer);
            }
            Err(reason) => {
                if record.first_refusal.is_none() {
                    record.first_refusal = Some(format!("{} chunk refused: {reason}", size_name(want)));
                }
                if want <= MIN_CHUNK {
                    ended = Some(format!("a chunk of {} was refused", size_name(want)));
                    break;
                }
                chunk = (want / 2).max(MIN_CHUNK);
            }
        }
    }
    record.chunks = chunks.len();
    record.ended = ended.unwrap_or_else(|| "the request was reached".into());
    record.allocation_s = started.elapsed().as_secs_f64();
    let registering = Instant::now();
    let mut registered = Vec::new();
    for buffer in &chunks {
        if started.elapsed() > TIME_CAP {
            record.registration_error = Some(format!("the {} s cap passed while registering", TIME_CAP.as_secs()));
            break;
        }
        // SAFETY: the chunk lives in `chunks` until after its registration is withdrawn below; nothing transfers
        // to or from it meanwhile (no segment names it to a peer that would).
        match unsafe { engine.register_memory(buffer.addr(), buffer.len(), location) } {
            Ok(()) => {
                record.registered_bytes += buffer.len();
                registered.push(buffer.addr());
            }
            Err(e) => {
                record.registration_error = Some(e.to_string());
                break;
            }
        }
    }
    let took = registering.elapsed();
    record.registration_s = took.as_secs_f64();
    if record.registered_bytes > 0 {
        record.registration_s_per_gib =
            Some(took.as_secs_f64() / (record.registered_bytes as f64 / (1u64 << 30) as f64));
    }
    for addr in registered {
        let _ = engine.unregister_memory(addr);
    }
    drop(chunks);
    record
}
