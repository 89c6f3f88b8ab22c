//! The engine's device: opened on first use with the `aiv` transport and the device baselines installed, its RDMA
//! registration renewed, and SHMEM's unique id carried between PEs through the segment descriptor.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{deadline_after, lock, AivDevice, TransferEngine};
use crate::config::ProcessEnvironment;
use crate::error::{EngineError, Result};
use crate::transfer::Protocol;

impl TransferEngine {
    // ----- Device memory and the aiv transport (see docs/device.md). -----

    /// The device of this engine (created on first call from `config.aiv`: the twin runtime by default), with the `aiv`
    /// transport and the baselines `adxl` (through HiXL) and `ubshmem` (Host-submitted) installed and the device's
    /// exported memory advertised in this engine's descriptor.
    ///
    /// Allocate device memory with `device.allocate(len)`, then `register_memory(buf.addr(), buf.len(),
    /// &device.location())`.
    pub fn device(&self) -> Result<Arc<AivDevice>> {
        let mut slot = lock(&self.device);
        if let Some(device) = &*slot {
            return Ok(device.clone());
        }
        let start_error = |reason: String| EngineError::TransportStart { protocol: Protocol::Aiv, reason };
        let exchange = DescriptorUidExchange { engine: self };
        let mut options = self.config.aiv.clone();
        if options.hixl_host.is_none() {
            options.hixl_host =
                Some(crate::transport::adxl::default_hixl_host(&ProcessEnvironment, &self.config.local_hostname));
        }
        if options.rdma_host.is_none() {
            options.rdma_host = Some(default_rdma_host(&self.config.local_hostname));
        }
        let device = Arc::new(
            AivDevice::open_with_exchange(&options, Some(&exchange)).map_err(|error| start_error(error.to_string()))?,
        );
        let mut advertisement =
            serde_json::to_value(device.advertisement()).map_err(|error| start_error(error.to_string()))?;
        // Keep a published SHMEM unique id: PEs that join later still find it.
        let published = self.local_descriptor().aiv.and_then(|aiv| aiv.get("shmem_uid").cloned());
        if let (Some(uid), Some(object)) = (published, advertisement.as_object_mut()) {
            object.insert("shmem_uid".into(), uid);
        }
        self.set_descriptor_extension(advertisement)?;
        if self.tracer.is_enabled() {
            device
                .transport()
                .set_trace(&self.tracer, true, self.trace_depth.load(Ordering::Relaxed))
                .map_err(|error| start_error(error.to_string()))?;
        }
        // The RDMA route's QP handshake (docs/rdma.md section 7): sent through the metadata service to the peer's
        // handshake server, answered by this transport on ours (every metadata mode runs one).
        let metadata = Arc::downgrade(&self.metadata);
        device.transport().set_connection_sender(Arc::new(move |segment: &str, payload: &serde_json::Value| {
            let metadata = metadata.upgrade().ok_or("the engine's metadata service has shut down")?;
            metadata.send_connection(segment, payload).map_err(|error| error.to_string())
        }));
        // The target side connects only to NICs the initiator's descriptor lists, resolved through this engine's
        // own metadata (docs/rdma.md section 7).
        let metadata = Arc::downgrade(&self.metadata);
        device.transport().set_initiator_resolver(Arc::new(move |name: &str, source, fresh| {
            let metadata = metadata.upgrade().ok_or("the engine's metadata service has shut down")?;
            let descriptor = metadata.resolve_initiator(name, source, fresh)?;
            Ok((descriptor, metadata.is_p2p().then(|| crate::metadata::canonical_ip(source.ip()))))
        }));
        self.metadata.set_connection_handler(Some(device.transport().connection_handler()));
        self.install_transport(Protocol::Aiv, device.transport().clone());
        self.install_transport(Protocol::Adxl, device.adxl().clone());
        self.install_transport(Protocol::AdxlFabric, device.adxl_fabric().clone());
        self.install_transport(Protocol::Ubshmem, device.ubshmem().clone());
        *slot = Some(device.clone());
        Ok(device)
    }

    /// Registers the device memory with the NIC again (new keys, the old registrations withdrawn) and republishes
    /// the descriptor with the new rkeys; peers use them once they refresh the segment. Fails when the device has no
    /// RDMA route.
    pub fn refresh_rdma_registration(&self) -> Result<()> {
        let device = self.device()?;
        device
            .transport()
            .rdma_reregister()
            .map_err(|error| EngineError::TransportStart { protocol: Protocol::Aiv, reason: error.to_string() })?;
        self.republish_local_segment()
    }

    /// The `shmem_uid` another engine published in its descriptor's `aiv` object (see [`DescriptorUidExchange`]), or
    /// why there is none yet: the fetch's error, or what the descriptor lacked.
    fn published_shmem_uid(&self, segment: &str) -> std::result::Result<[u8; 136], String> {
        use base64::Engine as _;
        let descriptor = self.metadata.fetch(segment).map_err(|error| format!("the fetch failed: {error}"))?;
        let aiv = descriptor.aiv.as_ref().ok_or("the descriptor has no aiv object")?;
        let text = aiv.get("shmem_uid").ok_or("its aiv object has no shmem_uid")?;
        let text = text.as_str().ok_or("its shmem_uid is not a string")?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|error| format!("its shmem_uid is not base64: {error}"))?;
        let length = bytes.len();
        bytes.try_into().map_err(|_| format!("its shmem_uid holds {length} bytes, not 136"))
    }
}

/// SHMEM's unique id carried over the metadata channel (CANN backend with more than one PE): PE 0 publishes it as
/// `"aiv": {"shmem_uid": "<base64 of 136 bytes>"}` in its own segment descriptor before `aclshmemx_init_attr`; the
/// other PEs poll the descriptor of the segment named by `AIV_SHMEM_ROOT_SEGMENT` until it appears. The `aiv` object
/// is replaced by the device advertisement once the device is up.
struct DescriptorUidExchange<'a> {
    engine: &'a TransferEngine,
}

impl crate::device::UniqueIdExchange for DescriptorUidExchange<'_> {
    fn publish(&self, uid: &[u8; 136]) -> std::result::Result<(), String> {
        use base64::Engine as _;
        let text = base64::engine::general_purpose::STANDARD.encode(uid);
        self.engine
            .set_descriptor_extension(serde_json::json!({ "shmem_uid": text }))
            .map_err(|error| error.to_string())
    }

    fn fetch(&self, timeout: std::time::Duration) -> std::result::Result<[u8; 136], String> {
        let root = std::env::var("AIV_SHMEM_ROOT_SEGMENT")
            .map_err(|_| "AIV_SHMEM_ROOT_SEGMENT (the segment name of SHMEM PE 0's engine) is not set".to_string())?;
        let deadline = deadline_after(timeout);
        let mut polls = 0u64;
        loop {
            polls += 1;
            let why = match self.engine.published_shmem_uid(&root) {
                Ok(uid) => return Ok(uid),
                Err(why) => why,
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "segment {root:?} published no aiv.shmem_uid within {timeout:?} ({polls} polls; the last: {why})"
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// The IP address the device's NIC listens on by default: the host part of `local_hostname` if it is an IP address,
/// else the first IPv4 address it resolves to, else 127.0.0.1.
fn default_rdma_host(local_hostname: &str) -> String {
    let host = crate::metadata::SegmentName::parse(local_hostname)
        .map(|name| name.host)
        .unwrap_or_else(|_| local_hostname.trim().to_owned());
    if host.parse::<std::net::IpAddr>().is_ok() {
        return host;
    }
    use std::net::ToSocketAddrs;
    (host.as_str(), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.find(|address| address.is_ipv4()))
        .map_or_else(|| "127.0.0.1".to_owned(), |address| address.ip().to_string())
}
