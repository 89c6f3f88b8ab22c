"""Type stubs of aiv_transport._native (the PyO3 extension). Results follow Mooncake: ints, 0 success, negative
failure; batch ids are positive, 0 means failure. See docs/python.md."""

from typing import List, Optional, Union

__version__: str
ASCEND_PROTOCOL_ENV: str
SUPPORT_CUDA: bool
SUPPORT_EFA: bool
SUPPORT_HIP: bool
SUPPORT_MNNVL: bool
SUPPORT_INTRA_NVLINK: bool
SUPPORT_MUSA: bool

class TransferOpcode:
    Read: "TransferOpcode"
    Write: "TransferOpcode"
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __int__(self) -> int: ...

Read: TransferOpcode
Write: TransferOpcode

class TransferNotify:
    name: str
    msg: str
    def __init__(self, name: str = "", msg: str = "") -> None: ...

class TransferEngine:
    TransferOpcode: type
    def __init__(self, *, device_id: Optional[int] = None) -> None: ...
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int: ...
    def initialize_ext(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, metadata_type: str
    ) -> int: ...
    def get_rpc_port(self) -> int: ...
    def get_segment_name(self) -> Optional[str]: ...
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int: ...
    def unregister_memory(self, buffer_addr: int) -> int: ...
    def batch_register_memory(self, buffer_addresses: List[int], capacities: List[int], location: str = "*") -> int: ...
    def batch_unregister_memory(self, buffer_addresses: List[int]) -> int: ...
    def transfer_sync_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int: ...
    def transfer_sync_read(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int: ...
    def transfer_sync(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        opcode: TransferOpcode,
        notify: Optional[TransferNotify] = None,
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        opcode: TransferOpcode,
        notify: Optional[TransferNotify] = None,
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_async_write(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_async_read(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_async(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        opcode: TransferOpcode,
        transport_hint: str = "",
    ) -> int: ...
    def get_batch_transfer_status(self, batch_ids: List[int]) -> int: ...
    def transfer_submit_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int: ...
    def transfer_check_status(self, batch_id: int) -> int: ...
    def allocate_managed_buffer(self, length: int) -> int: ...
    def free_managed_buffer(self, buffer_addr: int, length: int) -> int: ...
    def allocate_device_buffer(self, length: int) -> int: ...
    def free_device_buffer(self, buffer_addr: int) -> int: ...
    def get_device_location(self) -> Optional[str]: ...
    def write_bytes_to_buffer(self, dest_address: int, src: Union[bytes, bytearray, str], length: int) -> int: ...
    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes: ...
    def get_first_buffer_address(self, segment_name: str) -> int: ...
    def get_local_topology(self, device_name: Optional[str] = None) -> str: ...
    def get_notifies(self) -> List[TransferNotify]: ...
    def send_probe(self, peer_server_name: str) -> int: ...
    def warmup_efa_segment(self, segment_name: str) -> int: ...
    def get_engine(self) -> object: ...
    def get_engine_ptr(self) -> int: ...
    def transfer_write_on_cuda(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        stream_ptr: int = 0,
        transport_hint: str = "",
    ) -> None: ...
    def transfer_read_on_cuda(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        stream_ptr: int = 0,
        transport_hint: str = "",
    ) -> None: ...
    def batch_transfer_write_on_cuda(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        stream_ptr: int = 0,
        transport_hint: str = "",
    ) -> None: ...
    def batch_transfer_read_on_cuda(
        self,
        target_hostname: str,
        buffers: List[int],
        peer_buffer_addresses: List[int],
        lengths: List[int],
        stream_ptr: int = 0,
        transport_hint: str = "",
    ) -> None: ...
