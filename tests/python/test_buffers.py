"""Local buffers of every kind users hand the engine (issue 17 item 4, buffer part).

bytearray (address through ctypes' from_buffer), a ctypes array, a numpy array (arr.ctypes.data), a managed buffer
(allocate_managed_buffer, reached with write_bytes_to_buffer / read_bytes_from_buffer) and, for aiv_transport, twin
device memory (allocate_device_buffer, transferred over "ascend" to a peer whose arena is device memory too). Each is
registered (managed buffers come registered), written to a P2PHANDSHAKE peer and read back into, data checked through
the buffer's own interface, then unregistered or freed.
"""
import ctypes

import pytest

from conftest import assert_bytes, missing, new_engine, ours_only, pattern, Peer, close_all

SIZE = (1 << 20) + 7  # the local buffer
SPAN = 2 << 20  # the peer's arena


class ByteArrayBuffer:
    def __init__(self, engine):
        self.buf = bytearray(SIZE)
        self.addr = ctypes.addressof((ctypes.c_char * SIZE).from_buffer(self.buf))

    def write(self, off, data):
        self.buf[off : off + len(data)] = data

    def read(self, off, n):
        return bytes(self.buf[off : off + n])


class CtypesBuffer:
    def __init__(self, engine):
        self.arr = (ctypes.c_uint8 * SIZE)()
        self.addr = ctypes.addressof(self.arr)
        self.view = memoryview(self.arr).cast("B")

    def write(self, off, data):
        self.view[off : off + len(data)] = data

    def read(self, off, n):
        return bytes(self.view[off : off + n])


class NumpyBuffer:
    """A float16 tensor-like array; its bytes are reached through a uint8 view of the same memory."""

    def __init__(self, engine):
        try:
            import numpy as np
        except ImportError:
            missing("numpy in the interpreter running pytest", "pip install numpy into that virtualenv")
        self.np = np
        self.arr = np.zeros(((SIZE + 1) // 2,), dtype=np.float16)
        self.bytes = self.arr.view(np.uint8)
        self.addr = self.arr.ctypes.data

    def write(self, off, data):
        self.bytes[off : off + len(data)] = self.np.frombuffer(data, dtype=self.np.uint8)

    def read(self, off, n):
        return self.bytes[off : off + n].tobytes()


class ManagedBuffer:
    registered = True  # allocate_managed_buffer registers what it returns

    def __init__(self, engine):
        self.engine = engine
        self.addr = engine.allocate_managed_buffer(SIZE)
        assert self.addr != 0, f"allocate_managed_buffer({SIZE}) returned 0"

    def write(self, off, data):
        assert self.engine.write_bytes_to_buffer(self.addr + off, data, len(data)) == 0

    def read(self, off, n):
        return bytes(self.engine.read_bytes_from_buffer(self.addr + off, n))

    def release(self):
        assert self.engine.free_managed_buffer(self.addr, SIZE) == 0


class DeviceBuffer:
    def __init__(self, engine):
        self.engine = engine
        self.addr = engine.allocate_device_buffer(SIZE)
        assert self.addr != 0, f"allocate_device_buffer({SIZE}) returned 0"

    def write(self, off, data):
        assert self.engine.write_bytes_to_buffer(self.addr + off, data, len(data)) == 0

    def read(self, off, n):
        return bytes(self.engine.read_bytes_from_buffer(self.addr + off, n))

    def release(self):
        assert self.engine.unregister_memory(self.addr) == 0
        self.engine.free_device_buffer(self.addr)


KINDS = {
    "bytearray": ByteArrayBuffer,
    "ctypes": CtypesBuffer,
    "numpy": NumpyBuffer,
    "managed": ManagedBuffer,
    "device": DeviceBuffer,
}


@pytest.fixture(scope="module")
def sides(te):
    """(engine, peer) per memory class, made on first use: 'host' over tcp, 'device' over ascend."""
    made, peers = {}, []

    def get(memory):
        if memory not in made:
            protocol = "tcp" if memory == "host" else "ascend"
            peer = Peer("P2PHANDSHAKE", size=SPAN, memory=memory, protocol=protocol, fill=31)
            peers.append(peer)
            made[memory] = (new_engine(te, "P2PHANDSHAKE", protocol), peer)
        return made[memory]

    yield get
    close_all(peers)


@pytest.mark.parametrize("kind", list(KINDS))
def test_buffer_kind_round_trip(sides, rng, kind):
    if kind == "device":
        ours_only("twin device memory (allocate_device_buffer, free_device_buffer) and the 'ascend' protocol")
    engine, peer = sides("device" if kind == "device" else "host")
    buf = KINDS[kind](engine)
    if not getattr(buf, "registered", False):
        rc = engine.register_memory(buf.addr, SIZE)
        assert rc == 0, f"register_memory({kind} buffer) returned {rc}"

    # Write: the buffer's bytes reach the peer.
    n, loff, roff = SIZE - 1000, 1, rng.randrange(0, SPAN - SIZE)
    seed = rng.randrange(1 << 30)
    buf.write(loff, pattern(seed, n))
    rc = engine.transfer_sync_write(peer.session, buf.addr + loff, peer.addr + roff, n)
    assert rc == 0, f"transfer_sync_write from a {kind} buffer returned {rc}"
    peer.verify(seed, roff, n, f"data written from a {kind} buffer")

    # Read: the peer's fill lands in the buffer, its neighbours untouched.
    fill = rng.randrange(1 << 30)
    peer.fill(fill)
    buf.write(0, bytes(SIZE))
    n, loff, roff = 300_001, 999, rng.randrange(0, SPAN - 300_001)
    rc = engine.transfer_sync_read(peer.session, buf.addr + loff, peer.addr + roff, n)
    assert rc == 0, f"transfer_sync_read into a {kind} buffer returned {rc}"
    assert_bytes(buf.read(loff, n), pattern(fill, SPAN)[roff : roff + n], f"data read into a {kind} buffer")
    assert_bytes(buf.read(loff - 8, 8) + buf.read(loff + n, 8), bytes(16), f"{kind} bytes next to the read range")

    if hasattr(buf, "release"):
        buf.release()
    else:
        assert engine.unregister_memory(buf.addr) == 0, f"unregister_memory({kind} buffer)"
