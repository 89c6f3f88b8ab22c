"""Mooncake's calling conventions outside the data path: results of registration calls, the
opcode enum, get_first_buffer_address, and methods that make no sense on an engine without CUDA or EFA
(warmup_efa_segment, the CUDA-stream variants, get_engine).

Every expectation below is the real Mooncake wheel's (0.3.13.post1, non-CUDA), measured with AIV_PYTEST_ENGINE=mooncake,
except where the drop-in deliberately differs (said at the check).
"""

import os
import subprocess
import sys

import pytest

from conftest import IS_MOONCAKE, HostArena, Peer, new_engine, ours_only

CUDA_METHODS = [
    "transfer_write_on_cuda",
    "transfer_read_on_cuda",
    "batch_transfer_write_on_cuda",
    "batch_transfer_read_on_cuda",
]


@pytest.fixture(scope="module")
def engine(te):
    return new_engine(te, "P2PHANDSHAKE")


@pytest.fixture(scope="module")
def peer(te):
    """A target with three registered regions 1 MiB apart."""
    peer = Peer("P2PHANDSHAKE", size=1 << 16, regions=3, align=1 << 20)
    yield peer
    peer.close()


def test_opcode_values(te):
    assert int(te.TransferOpcode.Read) == 0 and int(te.TransferOpcode.Write) == 1
    assert te.module.Read == te.TransferOpcode.Read and te.module.Write == te.TransferOpcode.Write


def test_registration_results(engine):
    arena = HostArena(1 << 16)
    a = arena.addr
    assert engine.register_memory(a, 8192) == 0
    assert engine.register_memory(a + 100, 10) == -7, "an overlapping registration is AddressOverlapped (-7)"
    assert engine.register_memory(a + 8192, 0) == -1, "a zero-length registration is InvalidArgument (-1)"
    assert engine.unregister_memory(a) == 0
    assert engine.unregister_memory(a) == -3, "unregistering what is not registered is AddressNotRegistered (-3)"
    assert engine.register_memory(a, 4096, "cpu:0") == 0, "a location string is accepted"
    assert engine.unregister_memory(a) == 0
    assert engine.batch_register_memory([a, a + 8192], [4096, 4096]) == 0
    assert engine.batch_register_memory([a + 100], [10]) == -7
    assert engine.batch_unregister_memory([a, a + 8192]) == 0
    assert engine.batch_unregister_memory([a]) == -3


def test_get_first_buffer_address(engine, peer):
    assert engine.get_first_buffer_address(peer.session) == peer.addr


def test_managed_buffer_bytes(engine):
    addr = engine.allocate_managed_buffer(4096)
    assert addr != 0
    data = b"hello\x00world\xff"
    assert engine.write_bytes_to_buffer(addr + 5, data, len(data)) == 0
    assert engine.read_bytes_from_buffer(addr + 5, len(data)) == data
    assert engine.read_bytes_from_buffer(addr + 6, 4) == data[1:5]
    assert engine.free_managed_buffer(addr, 4096) == 0


def test_warmup_efa_segment_is_a_no_op(engine):
    """Mooncake without EFA returns 0 from warmup_efa_segment and does nothing (no such segment is needed)."""
    assert engine.warmup_efa_segment("127.0.0.1:1") == 0


def test_cuda_stream_methods_are_unsupported(te, engine):
    """The real non-CUDA wheel has no CUDA-stream methods (AttributeError) and says SUPPORT_CUDA False; the drop-in
    has them, so that code written for the CUDA build finds them: there they raise RuntimeError, as Mooncake's CUDA build raises when a transfer cannot be
    set up."""
    assert te.module.SUPPORT_CUDA is False
    for name in CUDA_METHODS:
        if IS_MOONCAKE:
            assert not hasattr(engine, name), f"the non-CUDA Mooncake wheel has {name}"
        else:
            with pytest.raises(RuntimeError):
                getattr(engine, name)("127.0.0.1:1", 0, 0, 8) if "batch" not in name else getattr(engine, name)(
                    "127.0.0.1:1", [0], [0], [8]
                )


def test_get_engine(engine):
    """Mooncake returns its C++ engine object (Mooncake Store's setup(engine=...) takes it); aiv_transport has none
    and raises NotImplementedError naming Mooncake Store, so a caller learns why it cannot have one."""
    if IS_MOONCAKE:
        assert engine.get_engine() is not None
    else:
        with pytest.raises(NotImplementedError, match="Store"):
            engine.get_engine()


def test_empty_batches(engine, peer):
    """Empty lists are no transfer at all: the sync calls return 0; Mooncake's async calls return a batch id
    (non-zero) whose get_batch_transfer_status is 0, and get_batch_transfer_status([]) is 0."""
    assert engine.batch_transfer_sync_write(peer.session, [], [], []) == 0
    assert engine.batch_transfer_sync_read(peer.session, [], [], []) == 0
    bid = engine.batch_transfer_async_read(peer.session, [], [], [])
    assert bid != 0, "Mooncake returns a batch id for an empty async batch"
    assert engine.get_batch_transfer_status([bid]) == 0
    assert engine.get_batch_transfer_status([]) == 0


def test_mismatched_lists(engine, peer):
    """Lists of different lengths: -1 from the sync batch calls, 0 (no batch) from the async ones."""
    local = HostArena(4096)
    assert engine.register_memory(local.addr, 4096) == 0
    a, r = local.addr, peer.addr
    assert engine.batch_transfer_sync_read(peer.session, [a], [r, r + 8], [8]) == -1
    assert engine.batch_transfer_sync_write(peer.session, [a, a + 8], [r], [8, 8]) == -1
    assert engine.batch_transfer_async_read(peer.session, [a], [r], [8, 8]) == 0
    assert engine.unregister_memory(local.addr) == 0


def test_drop_in_import_resolves_here():
    """vLLM-Ascend imports `from mooncake.engine import TransferEngine`. With AIV_TRANSPORT_AS_MOONCAKE=1 (the
    opt-in drop-in) that import gives aiv_transport's engine in a fresh interpreter, which initializes like
    vLLM-Ascend's shared engine does (host memory: protocol tcp); without the variable it does not."""
    ours_only("the opt-in drop-in (AIV_TRANSPORT_AS_MOONCAKE=1)")
    script = (
        "from mooncake.engine import TransferEngine\n"
        "import aiv_transport\n"
        "assert TransferEngine is aiv_transport.TransferEngine, TransferEngine\n"
        "e = TransferEngine()\n"
        "print('rc', e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', ''), e.get_rpc_port() > 0)\n"
    )
    env = dict(os.environ, AIV_TRANSPORT_AS_MOONCAKE="1")
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and run.stdout.split() == ["rc", "0", "True"], (run.stdout, run.stderr[-2000:])
    env.pop("AIV_TRANSPORT_AS_MOONCAKE")
    check = "import aiv_transport, sys\ntry:\n    import mooncake.engine as m\nexcept ImportError:\n    sys.exit(0)\n"
    check += "sys.exit(1 if m.TransferEngine is aiv_transport.TransferEngine else 0)\n"
    run = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, f"without AIV_TRANSPORT_AS_MOONCAKE the drop-in is active: {run.stderr[-2000:]}"
