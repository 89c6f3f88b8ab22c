"""Local buffers of every kind users hand the engine.

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
def host_side(te):
    """(engine, peer) over tcp with Host memory, shared by the Host buffer kinds."""
    peer = Peer("P2PHANDSHAKE", size=SPAN, memory="host", protocol="tcp", fill=31)
    yield new_engine(te, "P2PHANDSHAKE", "tcp"), peer
    peer.close()


@pytest.fixture
def sides(request, te):
    """sides(memory) -> (engine, peer): 'host' the module's tcp pair; 'device' a pair over ascend made for this test
    alone (aiv_transport opens one device per process: a second live engine on a device protocol fails initialize,
    so no device engine outlives its test)."""
    peers = []

    def get(memory):
        if memory == "host":
            return request.getfixturevalue("host_side")
        peer = Peer("P2PHANDSHAKE", size=SPAN, memory=memory, protocol="ascend", fill=31)
        peers.append(peer)
        return new_engine(te, "P2PHANDSHAKE", "ascend"), peer

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


@pytest.mark.parametrize(
    "choice,memory", [("aiv", "device"), ("adxl", "device"), ("ubshmem", "device"), ("tcp", "host")]
)
def test_ascend_protocol_choice(te, rng, monkeypatch, choice, memory):
    """initialize(..., "ascend", ...) as vLLM-Ascend calls it, with AIV_ASCEND_PROTOCOL choosing the data path on both
    sides: the device paths move twin device memory, tcp moves Host memory; data checked both ways."""
    ours_only("the 'ascend' protocol mapping (AIV_ASCEND_PROTOCOL) and twin device memory")
    monkeypatch.setenv("AIV_ASCEND_PROTOCOL", choice)
    peer = Peer("P2PHANDSHAKE", size=SPAN, memory=memory, protocol="ascend", fill=41)
    try:
        engine = new_engine(te, "P2PHANDSHAKE", "ascend")
        size = 256 << 10
        if memory == "device":
            addr = engine.allocate_device_buffer(size)
            assert addr != 0
            write = lambda off, data: engine.write_bytes_to_buffer(addr + off, data, len(data))  # noqa: E731
            read = lambda off, n: bytes(engine.read_bytes_from_buffer(addr + off, n))  # noqa: E731
        else:
            host = bytearray(size)
            addr = ctypes.addressof((ctypes.c_char * size).from_buffer(host))
            write = lambda off, data: host.__setitem__(slice(off, off + len(data)), data) or 0  # noqa: E731
            read = lambda off, n: bytes(host[off : off + n])  # noqa: E731
        assert engine.register_memory(addr, size) == 0
        n, roff, seed = size - 3, rng.randrange(0, SPAN - size), rng.randrange(1 << 30)
        assert write(3, pattern(seed, n)) == 0
        assert engine.transfer_sync_write(peer.session, addr + 3, peer.addr + roff, n) == 0
        peer.verify(seed, roff, n, f"AIV_ASCEND_PROTOCOL={choice}: written data")
        peer.fill(41)
        roff = rng.randrange(0, SPAN - size)
        assert (
            engine.batch_transfer_sync_read(
                peer.session, [addr, addr + n // 2], [peer.addr + roff, peer.addr + roff + n // 2], [n // 2, n - n // 2]
            )
            == 0
        )
        assert_bytes(read(0, n), pattern(41, SPAN)[roff : roff + n], f"AIV_ASCEND_PROTOCOL={choice}: read data")
        assert engine.unregister_memory(addr) == 0
        if memory == "device":
            engine.free_device_buffer(addr)
    finally:
        peer.close()
