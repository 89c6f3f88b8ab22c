//! Bring-up settings of the CANN backend that are not in mooncake.json: [`CannSettings`], read from the `AIV_*`
//! variables by [`CannSettings::from_env`], and the AIV counter rate assumed without one ([`DEFAULT_COUNTER_HZ`]).
//!
//! Reads the environment (and the kernel object file `AIV_NPU_KERNEL_OBJECT` names); must not call the runtime: the
//! settings are read before a device is opened, and on the twin runtime the opening replaces the kernel object and
//! the counter rate with the twin's.

use crate::device::DeviceError;

/// Rate of the AIV system counter, the unit of the kernel's wait budget: 50 MHz on Atlas A2/A3 per AscendC's
/// `GetSystemCycle` documentation (docs/hardware.md section 8; *unverified on hardware*); override with
/// `AIV_NPU_COUNTER_HZ`.
pub const DEFAULT_COUNTER_HZ: u64 = 50_000_000;

/// Bring-up settings of the CANN backend that are not in mooncake.json.
#[derive(Clone, Debug)]
pub struct CannSettings {
    /// This process's SHMEM PE (`AIV_SHMEM_PE`, default 0).
    pub shmem_pe: i32,
    /// Number of SHMEM PEs (`AIV_SHMEM_N_PES`, default 1).
    pub shmem_pes: i32,
    /// Device address of SHMEM's SDMA workspace (`AIV_SDMA_WORKSPACE_ADDR`, hex with or without `0x`): an explicit
    /// override; without it `open_channels` finds the address in SHMEM's state (`cann` module doc, step 5).
    pub workspace_addr: Option<u64>,
    /// The NPU kernel object (`AIV_NPU_KERNEL_OBJECT`, a file path; default: the one embedded in this build, if any).
    pub kernel_object: Option<&'static [u8]>,
    /// AIV counter rate (`AIV_NPU_COUNTER_HZ`, default [`DEFAULT_COUNTER_HZ`]).
    pub counter_hz: u64,
}

impl CannSettings {
    /// Reads the `AIV_*` variables above; a malformed value is an error naming it.
    pub fn from_env(device: u32) -> Result<CannSettings, DeviceError> {
        let invalid = |name: &str, value: &str, expected: &str| DeviceError::Invalid {
            device,
            operation: "read CANN settings",
            reason: format!("{name}={value:?} is not {expected}"),
        };
        let integer = |name: &str, default: i64| -> Result<i64, DeviceError> {
            match std::env::var(name) {
                Ok(value) => value.trim().parse().map_err(|_| invalid(name, &value, "an integer")),
                Err(_) => Ok(default),
            }
        };
        let shmem_pe = integer("AIV_SHMEM_PE", 0)?;
        let shmem_pes = integer("AIV_SHMEM_N_PES", 1)?;
        let counter_hz = integer("AIV_NPU_COUNTER_HZ", DEFAULT_COUNTER_HZ as i64)?;
        let workspace_addr = match std::env::var("AIV_SDMA_WORKSPACE_ADDR") {
            Ok(value) => Some(
                u64::from_str_radix(value.trim().trim_start_matches("0x"), 16)
                    .map_err(|_| invalid("AIV_SDMA_WORKSPACE_ADDR", &value, "a hexadecimal address"))?,
            ),
            Err(_) => None,
        };
        if shmem_pes < 1 || shmem_pe < 0 || shmem_pe >= shmem_pes || counter_hz <= 0 {
            return Err(DeviceError::Invalid {
                device,
                operation: "read CANN settings",
                reason: format!(
                    "need 0 <= AIV_SHMEM_PE ({shmem_pe}) < AIV_SHMEM_N_PES ({shmem_pes}) and AIV_NPU_COUNTER_HZ > 0"
                ),
            });
        }
        // A kernel object built separately (e.g. by hand with the flags of docs/hardware.md section 3) replaces the
        // embedded one; read once and kept for the life of the process, as the runtime may point into it.
        let kernel_object = match std::env::var_os("AIV_NPU_KERNEL_OBJECT") {
            Some(path) => Some(&*Box::leak(
                std::fs::read(&path)
                    .map_err(|source| DeviceError::Os { device, operation: "read AIV_NPU_KERNEL_OBJECT", source })?
                    .into_boxed_slice(),
            )),
            None => crate::device::kernel_image::NPU_KERNEL_OBJECT,
        };
        Ok(CannSettings {
            shmem_pe: shmem_pe as i32,
            shmem_pes: shmem_pes as i32,
            workspace_addr,
            kernel_object,
            counter_hz: counter_hz as u64,
        })
    }
}
