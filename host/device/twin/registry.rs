//! The process-wide export registry of the twin: exported memfds by export id.
//!
//! Stands in for the out-of-band handle exchange while both devices live in one process; the import side takes a
//! plain descriptor, so a memfd received over a Unix socket (next issue) imports the same way.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// One exported region.
#[derive(Clone, Debug)]
pub struct ExportRecord {
    /// The memfd holding the region (the region starts at offset 0).
    pub fd: Arc<OwnedFd>,
    /// Bytes.
    pub length: u64,
    /// Identity of the exporting device.
    pub device: String,
}

fn table() -> &'static Mutex<HashMap<u64, ExportRecord>> {
    static TABLE: OnceLock<Mutex<HashMap<u64, ExportRecord>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// Registers an export and returns its id.
pub fn export(record: ExportRecord) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    table().lock().unwrap_or_else(|p| p.into_inner()).insert(id, record);
    id
}

/// The export registered under `id`.
pub fn lookup(id: u64) -> Option<ExportRecord> {
    table().lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
}

/// Withdraws an export (importers keep their mappings).
pub fn withdraw(id: u64) {
    table().lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
}
