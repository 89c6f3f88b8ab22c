//! Where segment descriptors are published and found.
//!
//! [`MetadataBackend`] is the seam; the connection string in mooncake.json picks the backend. This module owns the
//! descriptor format and the backends; it never touches registered memory.

pub mod descriptor;
pub mod handshake;
pub mod name;
pub mod runtime;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

pub use descriptor::{BufferDescriptor, DescriptorError, ProtocolList, SegmentDescriptor};
pub use name::{SegmentName, SegmentNameError};

use crate::error::{EngineError, Result};

/// Publishes this engine's descriptor and fetches peers'.
pub trait MetadataBackend: Send + Sync + fmt::Debug {
    /// Publishes (or replaces) the descriptor of a segment this process owns.
    fn publish(&self, descriptor: &SegmentDescriptor) -> Result<()>;
    /// Fetches a peer's descriptor by segment name.
    fn fetch(&self, name: &str) -> Result<SegmentDescriptor>;
    /// Withdraws a descriptor this process published (clean shutdown).
    fn remove(&self, name: &str) -> Result<()>;
}

/// Descriptors of the engines living in this process, found by name without any network.
///
/// Used when several engines share one process (one per twin device, or initiator and target of an in-process
/// `aiv bench`). Every engine in the process sees the same directory.
#[derive(Debug, Default)]
pub struct InProcessDirectory {
    descriptors: Mutex<HashMap<String, SegmentDescriptor>>,
}

impl InProcessDirectory {
    /// The directory shared by every engine of this process.
    pub fn global() -> &'static InProcessDirectory {
        static DIRECTORY: OnceLock<InProcessDirectory> = OnceLock::new();
        DIRECTORY.get_or_init(InProcessDirectory::default)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SegmentDescriptor>> {
        self.descriptors.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Claims `name` for a new engine; fails if an engine of this process already holds it.
    pub fn claim(&self, descriptor: &SegmentDescriptor) -> Result<()> {
        let mut map = self.lock();
        if map.contains_key(&descriptor.name) {
            return Err(EngineError::Metadata {
                operation: "claim segment name",
                reason: format!("an engine of this process already serves segment {:?}", descriptor.name),
            });
        }
        map.insert(descriptor.name.clone(), descriptor.clone());
        Ok(())
    }
}

impl MetadataBackend for &'static InProcessDirectory {
    fn publish(&self, descriptor: &SegmentDescriptor) -> Result<()> {
        self.lock().insert(descriptor.name.clone(), descriptor.clone());
        Ok(())
    }

    fn fetch(&self, name: &str) -> Result<SegmentDescriptor> {
        self.lock().get(name).cloned().ok_or_else(|| EngineError::SegmentNotFound {
            name: name.to_owned(),
            reason: "no engine of this process serves it".into(),
        })
    }

    fn remove(&self, name: &str) -> Result<()> {
        self.lock().remove(name);
        Ok(())
    }
}
