//! Finding SHMEM's SDMA workspace on a CANN device (step 5 of the `cann` module doc): the override
//! `AIV_SDMA_WORKSPACE_ADDR`, else the host copy of SHMEM's state (`g_state`), else its device copy; a state copy
//! counts only if its layout version is the mirrored one and its PE is this process's.
//!
//! Reads only (the settings, SHMEM's host state, device memory); must not read or write the channel records
//! (`open_channels` does, at the address found here).

use cann_shmem_sys::device_state::{self, StateHeader};
use cann_shmem_sys::result as shmem;

use super::CannDevice;
use crate::device::DeviceError;

impl CannDevice {
    /// Finds the device address of SHMEM's SDMA workspace and names where it came from (`cann` module doc, step 5): the
    /// override, else SHMEM's host state `g_state`, else the device copy of the state. When every source fails, the
    /// error lists each with its reason. *Unverified on hardware*: the two state sources follow SHMEM's source.
    pub(super) fn discover_workspace(&self) -> Result<(u64, &'static str), DeviceError> {
        let found = |address: u64, source: &'static str| {
            tracing::info!(device = self.id, source, workspace = %format_args!("{address:#x}"), "SDMA workspace found");
            Ok((address, source))
        };
        if let Some(address) = self.settings.workspace_addr {
            return found(address, "AIV_SDMA_WORKSPACE_ADDR");
        }
        let mut tried = vec!["AIV_SDMA_WORKSPACE_ADDR: not set".to_string()];
        match self.workspace_from_host_state() {
            Ok(address) => return found(address, device_state::HOST_STATE_SYMBOL),
            Err(reason) => tried.push(format!("{}: {reason}", device_state::HOST_STATE_SYMBOL)),
        }
        match self.workspace_from_device_state() {
            Ok(address) => return found(address, "the device state copy"),
            Err(reason) => tried.push(format!("device state at {:#x}: {reason}", device_state::DEVICE_STATE_ADDR)),
        }
        Err(DeviceError::Unavailable {
            backend: "cann",
            reason: format!(
                "device {}: the address of SHMEM's SDMA workspace was not found; tried {}. Set \
                 AIV_SDMA_WORKSPACE_ADDR (hex) to it (see docs/HARDWARE_TESTING.md)",
                self.id,
                tried.join("; ")
            ),
        })
    }

    /// The workspace address in `libshmem.so`'s `g_state`, or why it cannot be used.
    fn workspace_from_host_state(&self) -> Result<u64, String> {
        match shmem::state::host_state(self.shmem) {
            Ok(state) => self.accept_state(state.header, state.sdma_workspace_addr),
            Err(cann_shmem_sys::Error::MissingSymbol(missing)) => {
                Err(format!("symbol not exported by {}", missing.path.display()))
            }
            Err(cann_shmem_sys::Error::StateLayout { detail, .. }) => Err(detail),
            Err(other) => Err(other.to_string()),
        }
    }

    /// The workspace address in the device copy of SHMEM's state (two `aclrtMemcpy` D2H: the header, then the
    /// address word once the header is accepted), or why it cannot be used.
    fn workspace_from_device_state(&self) -> Result<u64, String> {
        let detail = |error: DeviceError| match error {
            DeviceError::Runtime { detail, .. } => detail,
            other => other.to_string(),
        };
        let mut header = [0u8; device_state::HEADER_BYTES];
        self.read_device(device_state::DEVICE_STATE_ADDR, &mut header, "read SHMEM's device state").map_err(detail)?;
        let header = StateHeader::from_bytes(&header);
        device_state::check_version(header.version)?;
        let mut word = [0u8; 8];
        let address = device_state::DEVICE_STATE_ADDR + device_state::SDMA_WORKSPACE_ADDR_OFFSET as u64;
        self.read_device(address, &mut word, "read SHMEM's device state").map_err(detail)?;
        self.accept_state(header, u64::from_ne_bytes(word))
    }

    /// Checks that a state copy (version already accepted) belongs to this process's PE and has a workspace.
    fn accept_state(&self, header: StateHeader, workspace: u64) -> Result<u64, String> {
        if header.mype != self.settings.shmem_pe || header.npes != self.settings.shmem_pes {
            return Err(format!(
                "mype {} of npes {} is not this process's PE {} of {}",
                header.mype, header.npes, self.settings.shmem_pe, self.settings.shmem_pes
            ));
        }
        if workspace == 0 {
            return Err("sdma_workspace_addr is 0 (SHMEM set up no SDMA transport)".into());
        }
        Ok(workspace)
    }
}
