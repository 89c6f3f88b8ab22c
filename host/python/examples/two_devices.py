"""Two twin-runtime devices in one process: a 5-byte aiv write through the Python package (docs/usage.md)."""

from aiv_transport import TransferEngine

a, b = TransferEngine(device_id=0), TransferEngine(device_id=1)    # two twin-runtime devices in one process
for engine in (a, b):
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "ascend", "") == 0   # "ascend" runs on aiv here
src, dst = a.allocate_device_buffer(1 << 20), b.allocate_device_buffer(1 << 20)   # device memory (extension)
a.register_memory(src, 1 << 20)
b.register_memory(dst, 1 << 20)
a.write_bytes_to_buffer(src, b"hello", 5)
print(a.transfer_sync_write(f"127.0.0.1:{b.get_rpc_port()}", src, dst, 5), b.read_bytes_from_buffer(dst, 5))
