//! `TransferEngine`, `TransferOpcode` and `TransferNotify` with Mooncake's Python names, positional order, defaults
//! and return conventions (docs/python.md has the table and every difference).
//!
//! Every method that can block releases the GIL, and runs inside [`guarded`], so that an internal panic becomes the
//! method's failure value (logged) instead of an exception or an abort. Failures are ints, as Mooncake returns them;
//! the engine's error text goes to the log (stderr, `RUST_LOG`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use aiv_transport::Opcode;
use pyo3::exceptions::{PyMemoryError, PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::{PyBackedBytes, PyBackedStr};
use pyo3::types::PyBytes;

use crate::config;
use crate::inner::{read_bytes, write_bytes, Inner, ReadError};

/// Mooncake's `TransferOpcode` (`Read` = 0, `Write` = 1).
#[pyclass(eq, eq_int, frozen, hash, from_py_object, module = "aiv_transport._native")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferOpcode {
    /// Copy from the target segment into local memory.
    Read = 0,
    /// Copy from local memory into the target segment.
    Write = 1,
}

#[pymethods]
impl TransferOpcode {
    /// The member's name, as Mooncake's enum has it.
    #[getter]
    fn name(&self) -> &'static str {
        match self {
            TransferOpcode::Read => "Read",
            TransferOpcode::Write => "Write",
        }
    }

    /// The member's integer value.
    #[getter]
    fn value(&self) -> u32 {
        *self as u32
    }
}

impl From<TransferOpcode> for Opcode {
    fn from(opcode: TransferOpcode) -> Opcode {
        match opcode {
            TransferOpcode::Read => Opcode::Read,
            TransferOpcode::Write => Opcode::Write,
        }
    }
}

/// Mooncake's `TransferNotify`: a message sent to the target after a transfer completed (`get_notifies` there).
#[pyclass(get_all, set_all, from_py_object, module = "aiv_transport._native")]
#[derive(Clone, Debug, Default)]
pub struct TransferNotify {
    /// The `name` field the receiver sees.
    pub name: String,
    /// The message.
    pub msg: String,
}

#[pymethods]
impl TransferNotify {
    #[new]
    #[pyo3(signature = (name = String::new(), msg = String::new()))]
    fn new(name: String, msg: String) -> Self {
        TransferNotify { name, msg }
    }

    fn __repr__(&self) -> String {
        format!("TransferNotify(name={:?}, msg={:?})", self.name, self.msg)
    }
}

/// A Mooncake-compatible transfer engine (`mooncake.engine.TransferEngine`).
#[pyclass(frozen, module = "aiv_transport._native")]
#[derive(Debug)]
pub struct TransferEngine {
    /// The device this engine drives, when the constructor named one (else `aiv.device_id`).
    device_id: Option<u32>,
    /// Set by the first `initialize` (cleared again if it fails): a second one is refused without waiting.
    starting: AtomicBool,
    state: RwLock<Option<Arc<Inner>>>,
}

#[pymethods]
impl TransferEngine {
    /// `TransferEngine()` as in Mooncake; `device_id` (an extension, keyword only) picks the device of this engine,
    /// e.g. a second twin device for a second engine in the same process.
    #[new]
    #[pyo3(signature = (*, device_id = None))]
    fn new(device_id: Option<u32>) -> Self {
        TransferEngine { device_id, starting: AtomicBool::new(false), state: RwLock::new(None) }
    }

    /// Mooncake's `TransferOpcode`, also reachable as `TransferEngine.TransferOpcode`.
    #[classattr]
    #[pyo3(name = "TransferOpcode")]
    fn transfer_opcode_type(py: Python<'_>) -> Py<pyo3::types::PyType> {
        py.get_type::<TransferOpcode>().unbind()
    }

    /// Starts the engine. 0 on success, -1 on failure (also when already initialized).
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: String,
        metadata_server: String,
        protocol: String,
        device_name: String,
    ) -> i32 {
        self.start(py, local_hostname, metadata_server, protocol, device_name)
    }

    /// `initialize` with the metadata backend type given apart (`metadata_type://metadata_server`). 0 or -1.
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: String,
        metadata_server: String,
        protocol: String,
        device_name: String,
        metadata_type: String,
    ) -> i32 {
        let server = config::connection_string(&metadata_server, &metadata_type);
        self.start(py, local_hostname, server, protocol, device_name)
    }

    /// The port of the engine's handshake server (-1 before `initialize`).
    fn get_rpc_port(&self) -> i32 {
        self.inner().map_or(-1, |inner| guarded("get_rpc_port", -1, || i32::from(inner.engine.rpc_port())))
    }

    /// The engine's segment name, what peers pass as `target_hostname` (extension).
    fn get_segment_name(&self) -> Option<String> {
        self.inner().and_then(|inner| guarded("get_segment_name", None, || Some(inner.engine.name().to_owned())))
    }

    /// Registers `[buffer_addr, buffer_addr + capacity)`. 0, or Mooncake's negated code (-1 invalid, -7 overlap).
    #[pyo3(signature = (buffer_addr, capacity, location = "*".to_owned()))]
    fn register_memory(&self, py: Python<'_>, buffer_addr: u64, capacity: u64, location: String) -> i32 {
        self.call(py, "register_memory", -1, move |inner| inner.register(buffer_addr, capacity, &location))
    }

    /// Unregisters the buffer that starts at `buffer_addr`. 0, or -3 when none does.
    fn unregister_memory(&self, py: Python<'_>, buffer_addr: u64) -> i32 {
        self.call(py, "unregister_memory", -1, move |inner| inner.unregister(buffer_addr))
    }

    /// Registers several buffers, all or nothing, publishing the descriptor once: 0 when all succeed, else the code
    /// of the first one refused (and none of them stays registered).
    #[pyo3(signature = (buffer_addresses, capacities, location = "*".to_owned()))]
    fn batch_register_memory(
        &self,
        py: Python<'_>,
        buffer_addresses: Vec<u64>,
        capacities: Vec<u64>,
        location: String,
    ) -> i32 {
        self.call(py, "batch_register_memory", -1, move |inner| {
            if buffer_addresses.len() != capacities.len() {
                limited!(
                    warn,
                    addresses = buffer_addresses.len(),
                    capacities = capacities.len(),
                    "batch_register_memory: the lists differ in length"
                );
                return -1;
            }
            inner.register_batch(&buffer_addresses, &capacities, &location)
        })
    }

    /// Unregisters several buffers, publishing the descriptor once; every one is tried, the first failure's code is
    /// returned (0 when none fails).
    fn batch_unregister_memory(&self, py: Python<'_>, buffer_addresses: Vec<u64>) -> i32 {
        self.call(py, "batch_unregister_memory", -1, move |inner| inner.unregister_batch(&buffer_addresses))
    }

    /// Writes `length` bytes of local `buffer` to `peer_buffer_address` of segment `target_hostname`. 0 or -1.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = String::new()))]
    fn transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: String,
    ) -> i32 {
        self.call(py, "transfer_sync_write", -1, move |inner| {
            inner.sync(
                Opcode::Write,
                &target_hostname,
                &[buffer],
                &[peer_buffer_address],
                &[length],
                None,
                &transport_hint,
            )
        })
    }

    /// Reads `length` bytes at `peer_buffer_address` of segment `target_hostname` into local `buffer`. 0 or -1.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = String::new()))]
    fn transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: String,
    ) -> i32 {
        self.call(py, "transfer_sync_read", -1, move |inner| {
            inner.sync(
                Opcode::Read,
                &target_hostname,
                &[buffer],
                &[peer_buffer_address],
                &[length],
                None,
                &transport_hint,
            )
        })
    }

    /// One transfer in either direction, then `notify` sent to the target when given. 0 or -1.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify = None,
                        transport_hint = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        opcode: TransferOpcode,
        notify: Option<TransferNotify>,
        transport_hint: String,
    ) -> i32 {
        self.call(py, "transfer_sync", -1, move |inner| {
            let notify = notify.map(|notify| (notify.name, notify.msg));
            inner.sync(
                opcode.into(),
                &target_hostname,
                &[buffer],
                &[peer_buffer_address],
                &[length],
                notify,
                &transport_hint,
            )
        })
    }

    /// Writes several ranges and waits for all. 0 or -1 (empty lists: 0, nothing to do).
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new()))]
    fn batch_transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: String,
    ) -> i32 {
        self.call(py, "batch_transfer_sync_write", -1, move |inner| {
            inner.sync(
                Opcode::Write,
                &target_hostname,
                &buffers,
                &peer_buffer_addresses,
                &lengths,
                None,
                &transport_hint,
            )
        })
    }

    /// Reads several ranges and waits for all. 0 or -1 (empty lists: 0, nothing to do).
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new()))]
    fn batch_transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: String,
    ) -> i32 {
        self.call(py, "batch_transfer_sync_read", -1, move |inner| {
            inner.sync(
                Opcode::Read,
                &target_hostname,
                &buffers,
                &peer_buffer_addresses,
                &lengths,
                None,
                &transport_hint,
            )
        })
    }

    /// Several ranges in one direction, then `notify` sent to the target when given. 0 or -1.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify = None,
                        transport_hint = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: TransferOpcode,
        notify: Option<TransferNotify>,
        transport_hint: String,
    ) -> i32 {
        self.call(py, "batch_transfer_sync", -1, move |inner| {
            let notify = notify.map(|notify| (notify.name, notify.msg));
            inner.sync(
                opcode.into(),
                &target_hostname,
                &buffers,
                &peer_buffer_addresses,
                &lengths,
                notify,
                &transport_hint,
            )
        })
    }

    /// Starts writing several ranges: a batch id for `get_batch_transfer_status`, 0 on failure.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new()))]
    fn batch_transfer_async_write(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: String,
    ) -> u64 {
        self.call(py, "batch_transfer_async_write", 0, move |inner| {
            inner.start_batch(
                Opcode::Write,
                &target_hostname,
                &buffers,
                &peer_buffer_addresses,
                &lengths,
                &transport_hint,
            )
        })
    }

    /// Starts reading several ranges: a batch id for `get_batch_transfer_status`, 0 on failure.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = String::new()))]
    fn batch_transfer_async_read(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: String,
    ) -> u64 {
        self.call(py, "batch_transfer_async_read", 0, move |inner| {
            inner.start_batch(
                Opcode::Read,
                &target_hostname,
                &buffers,
                &peer_buffer_addresses,
                &lengths,
                &transport_hint,
            )
        })
    }

    /// Starts several ranges in one direction: a batch id, 0 on failure.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_async(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: TransferOpcode,
        transport_hint: String,
    ) -> u64 {
        self.call(py, "batch_transfer_async", 0, move |inner| {
            inner.start_batch(
                opcode.into(),
                &target_hostname,
                &buffers,
                &peer_buffer_addresses,
                &lengths,
                &transport_hint,
            )
        })
    }

    /// Blocks until every batch is finished (bounded by the transfer timeout) and frees them all: 0 when every one
    /// completed, -1 otherwise (also for an unknown id).
    fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<u64>) -> i32 {
        self.call(py, "get_batch_transfer_status", -1, move |inner| inner.wait_batches(&batch_ids))
    }

    /// Starts one write: a batch id for `transfer_check_status`, 0 on failure.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = String::new()))]
    fn transfer_submit_write(
        &self,
        py: Python<'_>,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: String,
    ) -> u64 {
        self.call(py, "transfer_submit_write", 0, move |inner| {
            inner.start_batch(
                Opcode::Write,
                &target_hostname,
                &[buffer],
                &[peer_buffer_address],
                &[length],
                &transport_hint,
            )
        })
    }

    /// The state of the first transfer of a batch, without waiting: 1 completed (batch freed), 0 pending, -1 failed
    /// (batch freed; also for an unknown id), -2 timed out (batch kept, as Mooncake does).
    fn transfer_check_status(&self, py: Python<'_>, batch_id: u64) -> i32 {
        self.call(py, "transfer_check_status", -1, move |inner| inner.check(batch_id))
    }

    /// Allocates `length` bytes of zeroed, page-aligned Host memory registered with this engine: its address, 0 on
    /// failure.
    fn allocate_managed_buffer(&self, py: Python<'_>, length: u64) -> u64 {
        self.call(py, "allocate_managed_buffer", 0, move |inner| inner.allocate_managed(length))
    }

    /// Unregisters and frees a buffer of `allocate_managed_buffer`. 0, or -1 for an address it did not return.
    fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: u64, length: u64) -> i32 {
        self.call(py, "free_managed_buffer", -1, move |inner| inner.free_managed(buffer_addr, length))
    }

    /// Allocates `length` bytes of device memory on this engine's device (the twin runtime's by default), kept
    /// alive by this object: its address, 0 on failure (extension).
    fn allocate_device_buffer(&self, py: Python<'_>, length: u64) -> u64 {
        self.call(py, "allocate_device_buffer", 0, move |inner| inner.allocate_device(length))
    }

    /// Frees a buffer of `allocate_device_buffer` (unregistering it first if it is registered). 0, or -1 for an
    /// address it did not return (extension).
    fn free_device_buffer(&self, py: Python<'_>, buffer_addr: u64) -> i32 {
        self.call(py, "free_device_buffer", -1, move |inner| inner.free_device(buffer_addr))
    }

    /// The location string of this engine's device memory (`"npu:<id>"`), opening the device (extension); None when
    /// it cannot be opened.
    fn get_device_location(&self, py: Python<'_>) -> Option<String> {
        self.call(py, "get_device_location", None, move |inner| {
            inner.open_device().ok().map(|device| device.location())
        })
    }

    /// Copies `length` bytes of `src` (bytes, bytearray or str) to `dest_address`: device memory through the
    /// device, Host memory directly. 0, or -1 when refused.
    fn write_bytes_to_buffer(
        &self,
        py: Python<'_>,
        dest_address: u64,
        src: &Bound<'_, PyAny>,
        length: u64,
    ) -> PyResult<i32> {
        let data: Vec<u8> = if let Ok(bytes) = src.extract::<PyBackedBytes>() {
            bytes.as_ref().to_vec()
        } else {
            let text = src.extract::<PyBackedStr>()?;
            let text: &str = text.as_ref();
            text.as_bytes().to_vec()
        };
        let inner = self.inner();
        Ok(py.detach(move || {
            guarded("write_bytes_to_buffer", -1, || write_bytes(inner.as_deref(), dest_address, &data, length))
        }))
    }

    /// `length` bytes at `source_address` (device memory through the device, Host memory directly). Raises
    /// ValueError for address 0, MemoryError when `length` bytes cannot be allocated and RuntimeError when the device
    /// refuses the copy.
    fn read_bytes_from_buffer<'py>(
        &self,
        py: Python<'py>,
        source_address: u64,
        length: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let inner = self.inner();
        let result = py.detach(move || {
            guarded("read_bytes_from_buffer", Err("internal error (a panic), see the log".into()), || {
                read_bytes(inner.as_deref(), source_address, length)
            })
        });
        match result {
            Ok(data) => Ok(PyBytes::new(py, &data)),
            Err(ReadError::Argument(message)) => Err(PyValueError::new_err(message)),
            Err(ReadError::Memory(message)) => Err(PyMemoryError::new_err(message)),
            Err(ReadError::Device(message)) => Err(PyRuntimeError::new_err(message)),
        }
    }

    /// The address of the first buffer of a segment (0 when it cannot be opened or has none).
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: String) -> u64 {
        self.call(py, "get_first_buffer_address", 0, move |inner| {
            inner.engine.get_first_buffer_address(&segment_name).unwrap_or_else(|error| {
                limited!(warn, segment = %segment_name, %error, "get_first_buffer_address failed");
                0
            })
        })
    }

    /// Mooncake's topology JSON. This engine uses no RDMA NICs, so it lists one CPU node with no NICs, as Mooncake
    /// does on a machine without them.
    #[pyo3(signature = (device_name = None))]
    fn get_local_topology(&self, device_name: Option<String>) -> String {
        let _ = device_name;
        "{\"cpu:0\": [[], []]}".to_owned()
    }

    /// Notify messages peers sent to this engine since the last call, oldest first.
    fn get_notifies(&self) -> Vec<TransferNotify> {
        let Some(inner) = self.inner() else { return Vec::new() };
        guarded("get_notifies", Vec::new(), || {
            inner
                .engine
                .metadata()
                .take_notifications()
                .into_iter()
                .map(|notification| TransferNotify { name: notification.name, msg: notification.message })
                .collect()
        })
    }

    /// Asks whether the handshake server of segment `peer_server_name` answers: 0, or a negative code.
    fn send_probe(&self, py: Python<'_>, peer_server_name: String) -> i32 {
        self.call(py, "send_probe", -1, move |inner| inner.probe(&peer_server_name))
    }

    /// Mooncake's EFA warm-up; there is no EFA transport here, so it does nothing and returns 0 (as Mooncake does
    /// when EFA is not installed).
    fn warmup_efa_segment(&self, segment_name: String) -> i32 {
        let _ = segment_name;
        0
    }

    /// Mooncake returns its C++ engine object (what Mooncake Store's `setup(engine=...)` takes). There is none
    /// here: raises NotImplementedError.
    fn get_engine(&self) -> PyResult<Py<PyAny>> {
        Err(no_cpp_engine("get_engine"))
    }

    /// Mooncake returns the address of its C++ engine. There is none here: raises NotImplementedError.
    fn get_engine_ptr(&self) -> PyResult<u64> {
        Err(no_cpp_engine("get_engine_ptr"))
    }

    /// Mooncake's CUDA-stream transfer (CUDA builds only): raises RuntimeError, there is no CUDA here.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, stream_ptr = 0, transport_hint = String::new()))]
    fn transfer_write_on_cuda(
        &self,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        stream_ptr: u64,
        transport_hint: String,
    ) -> PyResult<()> {
        let _ = (target_hostname, buffer, peer_buffer_address, length, stream_ptr, transport_hint);
        Err(no_cuda("transfer_write_on_cuda"))
    }

    /// Mooncake's CUDA-stream transfer (CUDA builds only): raises RuntimeError, there is no CUDA here.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, stream_ptr = 0, transport_hint = String::new()))]
    fn transfer_read_on_cuda(
        &self,
        target_hostname: String,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        stream_ptr: u64,
        transport_hint: String,
    ) -> PyResult<()> {
        let _ = (target_hostname, buffer, peer_buffer_address, length, stream_ptr, transport_hint);
        Err(no_cuda("transfer_read_on_cuda"))
    }

    /// Mooncake's CUDA-stream transfer (CUDA builds only): raises RuntimeError, there is no CUDA here.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr = 0, transport_hint = String::new()))]
    fn batch_transfer_write_on_cuda(
        &self,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        stream_ptr: u64,
        transport_hint: String,
    ) -> PyResult<()> {
        let _ = (target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr, transport_hint);
        Err(no_cuda("batch_transfer_write_on_cuda"))
    }

    /// Mooncake's CUDA-stream transfer (CUDA builds only): raises RuntimeError, there is no CUDA here.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr = 0, transport_hint = String::new()))]
    fn batch_transfer_read_on_cuda(
        &self,
        target_hostname: String,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        stream_ptr: u64,
        transport_hint: String,
    ) -> PyResult<()> {
        let _ = (target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr, transport_hint);
        Err(no_cuda("batch_transfer_read_on_cuda"))
    }
}

impl TransferEngine {
    fn inner(&self) -> Option<Arc<Inner>> {
        self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Runs `f` on the started engine with the GIL released, `failure` if the engine is not started or `f` panics.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        operation: &'static str,
        failure: T,
        f: impl FnOnce(&Inner) -> T + Send,
    ) -> T {
        let Some(inner) = self.inner() else {
            limited!(warn, operation, "the engine is not initialized: call initialize() first");
            return failure;
        };
        py.detach(move || guarded(operation, failure, || f(&inner)))
    }

    fn start(
        &self,
        py: Python<'_>,
        local_hostname: String,
        server: String,
        protocol: String,
        device_name: String,
    ) -> i32 {
        let device_id = self.device_id;
        if self.starting.swap(true, Ordering::AcqRel) {
            limited!(warn, "initialize: this TransferEngine is already initialized; create another one instead");
            return -1;
        }
        let started = py.detach(move || {
            guarded("initialize", None, || {
                match Inner::start(&local_hostname, &server, &protocol, &device_name, device_id) {
                    Ok(inner) => Some(inner),
                    Err(error) => {
                        limited!(error,
                            local_hostname = %local_hostname, metadata_server = %server, protocol = %protocol, %error,
                            "initialize failed"
                        );
                        None
                    }
                }
            })
        });
        match started {
            Some(inner) => {
                *self.state.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Arc::new(inner));
                0
            }
            None => {
                self.starting.store(false, Ordering::Release);
                -1
            }
        }
    }
}

/// Runs `f`; a panic inside becomes `failure`, logged, so that it never reaches Python.
fn guarded<T>(operation: &'static str, failure: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => value,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            limited!(error, operation, panic = %message, "internal error, reported as this call's failure");
            failure
        }
    }
}

fn no_cpp_engine(method: &str) -> PyErr {
    PyNotImplementedError::new_err(format!(
        "{method}(): aiv_transport has no Mooncake C++ TransferEngine object to return. Mooncake Store \
         (MooncakeDistributedStore.setup(engine=...)) needs Mooncake's own engine: use mooncake.engine.TransferEngine \
         from the mooncake wheel for the store (see docs/python.md)"
    ))
}

fn no_cuda(method: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "{method}(): CUDA-stream transfers need Mooncake built with CUDA; aiv_transport has no CUDA (SUPPORT_CUDA is \
         False)"
    ))
}
