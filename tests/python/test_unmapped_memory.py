"""Memory that is not memory, through the Python binding: registration of address 0, of the never-mapped page at
0x1000 and of unmapped Host ranges is refused; memory unmapped after registration makes transfers and byte copies
fail with an error instead of killing the interpreter; batch registration is all or nothing.

The real Mooncake registers such ranges and crashes (SIGSEGV) on the first copy through them, so these are checks of
this binding only (`ours_only`). The copies run in a child interpreter, so that a crash fails the test instead of
ending the suite.
"""

import os
import subprocess
import sys
import textwrap

from conftest import HOST, HostArena, new_engine, ours_only

# A child interpreter: an engine, a buffer mmap'd and registered, then unmapped; every copy through it must fail
# with -1 / ValueError, and the engine must still serve a mapped buffer afterwards.
CHILD = textwrap.dedent(
    """
    import ctypes, mmap, sys
    import aiv_transport

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    SIZE = 1 << 17

    def new_mapping():
        addr = libc.mmap(None, SIZE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), "mmap"
        return addr

    engine = aiv_transport.TransferEngine()
    assert engine.initialize("HOST", "P2PHANDSHAKE", "tcp", "") == 0
    own = f"HOST:{engine.get_rpc_port()}"
    assert engine.register_memory(0x1000, 4096) == -1, "the page at 0x1000 is never mapped"
    assert engine.transfer_sync_read(own, 0x1000, 0x1000, 16) == -1
    gone, kept = new_mapping(), new_mapping()
    assert engine.register_memory(gone, SIZE) == 0
    assert engine.register_memory(kept, SIZE) == 0
    ctypes.memset(kept, 0x5A, SIZE)
    assert libc.munmap(gone, SIZE) == 0
    for length in (16, 1 << 16):
        assert engine.transfer_sync_read(own, kept, gone, length) == -1, "READ from unmapped"
        assert engine.transfer_sync_write(own, kept, gone, length) == -1, "WRITE to unmapped"
        assert engine.transfer_sync_write(own, gone, kept, length) == -1, "WRITE from unmapped"
        assert engine.write_bytes_to_buffer(gone, b"x" * length, length) == -1, "write_bytes_to_buffer"
        try:
            engine.read_bytes_from_buffer(gone, length)
        except ValueError as error:
            assert "not mapped" in str(error) or "not readable" in str(error), error
        else:
            raise AssertionError("read_bytes_from_buffer of unmapped memory returned")
    assert engine.transfer_sync_write(own, kept, kept + 8, 1 << 16) == 0, "a mapped copy still works"
    assert ctypes.string_at(kept, SIZE) == b"\\x5a" * SIZE
    print("survived")
    """
).replace("HOST", HOST)


def test_unmapped_registered_memory_fails_cleanly(te):
    ours_only("refusing unmapped memory (Mooncake crashes on it)")
    env = dict(os.environ)
    for pipe in (False, True):
        if pipe:
            env["AIV_HOST_COPY"] = "pipe"
        run = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and run.stdout.split() == ["survived"], (
            f"pipe copy: {pipe}; exit {run.returncode} (negative: killed by that signal)",
            run.stdout[-2000:],
            run.stderr[-4000:],
        )


def test_registration_refuses_what_cannot_be_memory(te):
    ours_only("refusing unmapped memory at registration (Mooncake registers it)")
    engine = new_engine(te, "P2PHANDSHAKE")
    assert engine.register_memory(0, 4096) == -1, "address 0"
    assert engine.register_memory(0x1000, 4096) == -1, "the null page / a page never mapped"
    arena = HostArena(3 * 4096)
    assert engine.batch_register_memory([arena.addr, 0, arena.addr + 8192], [4096, 4096, 4096]) == -1
    # All or nothing: the first region was rolled back, so registering it again succeeds.
    assert engine.register_memory(arena.addr, 4096) == 0
    assert engine.unregister_memory(arena.addr) == 0


def test_batch_registration_of_many_regions(te):
    ours_only("a linear batch registration")
    engine = new_engine(te, "P2PHANDSHAKE")
    count = 5000
    arena = HostArena(count * 512)
    addrs = [arena.addr + 512 * i for i in range(count)]
    assert engine.batch_register_memory(addrs, [256] * count) == 0
    assert engine.get_first_buffer_address(f"{HOST}:{engine.get_rpc_port()}") == arena.addr
    assert engine.batch_unregister_memory(addrs) == 0
