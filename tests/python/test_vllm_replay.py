"""A replay of vLLM-Ascend's Mooncake connector call sequences (docs/mooncake.md section 7).

The shapes are vLLM-Ascend's; the sizes are shrunk for CI. Both nodes hold a paged KV cache: LAYERS layers, each a K
and a V tensor of BLOCKS blocks of BLOCK_BYTES = tokens_per_block x kv_heads x head_dim x dtype bytes, each tensor at a
2 MiB-aligned address and registered once with register_memory(ptr, size) (which must return 0). pytest plays the
decode node with a fresh engine: TransferEngine(); initialize(host, "P2PHANDSHAKE", protocol, ""); get_rpc_port();
the prefill node (peer.py) is reached by the session id f"{host}:{port}" built from its RPC port.

    - whole-request pull (P2P connector): one batch_transfer_sync_read(session, src_list, dst_list, length_list)
      bringing seeded-random, non-contiguous remote blocks of every layer's K and V into other local blocks;
    - layerwise push (layerwise connector): per layer a 128-byte "pre-link" write (to the remote layer's K block 0,
      which the pushed blocks avoid), then batch_transfer_sync_write(session, src, dst, lengths) of that layer's
      blocks.

Run on Host memory over tcp (both engines) and, for aiv_transport, on twin-runtime device memory over "ascend" (the
peer allocates its cache with allocate_device_buffer and checks it with read_bytes_from_buffer).
"""

import socket

import pytest

from conftest import HOST, DeviceArena, HostArena, assert_bytes, ours_only, pattern

TWO_MIB = 2 << 20
LAYERS = 4
BLOCKS = 16
TOKENS_PER_BLOCK, KV_HEADS, HEAD_DIM, DTYPE_BYTES = 16, 4, 64, 2  # bf16
BLOCK_BYTES = TOKENS_PER_BLOCK * KV_HEADS * HEAD_DIM * DTYPE_BYTES  # 8 KiB
TENSOR_BYTES = BLOCKS * BLOCK_BYTES
STRIDE = -(-TENSOR_BYTES // TWO_MIB) * TWO_MIB
TENSORS = 2 * LAYERS  # tensor 2*layer is K, 2*layer+1 is V
SPAN = TENSORS * STRIDE
PRELINK = 128


def tensor_offset(layer: int, kv: int) -> int:
    return (2 * layer + kv) * STRIDE


def block_offset(layer: int, kv: int, block: int) -> int:
    return tensor_offset(layer, kv) + block * BLOCK_BYTES


class KvCache:
    """The decode node's KV cache: host (mmap) or twin device memory, each tensor registered once."""

    def __init__(self, engine, memory: str):
        self.arena = HostArena(SPAN, TWO_MIB) if memory == "host" else DeviceArena(engine, SPAN, TWO_MIB)
        self.ptrs = [self.arena.addr + t * STRIDE for t in range(TENSORS)]
        assert all(p % TWO_MIB == 0 for p in self.ptrs), "KV tensors must sit at 2 MiB-aligned addresses"
        for t, ptr in enumerate(self.ptrs):
            rc = engine.register_memory(ptr, TENSOR_BYTES)
            assert rc == 0, f"register_memory(KV tensor {t}) returned {rc}"


CASES = [
    pytest.param("host", "tcp", id="host-tcp"),
    pytest.param("device", "ascend", id="device-ascend"),
]


@pytest.mark.parametrize("memory,protocol", CASES)
def test_vllm_ascend_connector_sequences(te, peers, rng, memory, protocol):
    if memory == "device":
        ours_only("twin device memory (allocate_device_buffer) and the 'ascend' protocol")
    # The prefill node: its cache filled with pattern(FILL, span).
    fill = rng.randrange(1 << 30)
    prefill = peers(
        "P2PHANDSHAKE", size=TENSOR_BYTES, regions=TENSORS, align=TWO_MIB, memory=memory, protocol=protocol, fill=fill
    )
    assert prefill.span == SPAN and prefill.addr % TWO_MIB == 0

    # The decode node, as vLLM-Ascend's shared engine sets it up.
    engine = te.TransferEngine()
    rc = engine.initialize(HOST, "P2PHANDSHAKE", protocol, "")
    assert rc == 0, f"initialize({HOST!r}, 'P2PHANDSHAKE', {protocol!r}, '') returned {rc}"
    rpc_port = engine.get_rpc_port()
    assert isinstance(rpc_port, int) and 0 < rpc_port < 65536, f"get_rpc_port() returned {rpc_port!r}"
    with socket.create_connection((HOST, rpc_port), timeout=5):
        pass  # the RPC port listens: peers can handshake with f"{host}:{rpc_port}"
    cache = KvCache(engine, memory)
    remote_port = int(prefill.session.rsplit(":", 1)[1])
    session = f"{HOST}:{remote_port}"
    assert session == prefill.session

    # Whole-request pull: non-contiguous remote blocks of every layer into shuffled local blocks, one batch.
    guard = rng.randrange(1 << 30)
    cache.arena.write(0, pattern(guard, SPAN))
    count = BLOCKS // 2
    remote_ids = sorted(rng.sample(range(BLOCKS), count))
    local_ids = rng.sample(range(BLOCKS), count)
    assert any(b - a > 1 for a, b in zip(remote_ids, remote_ids[1:])), "the pulled blocks must not be contiguous"
    src, dst, lengths, expect = [], [], [], []
    for layer in range(LAYERS):
        for kv in (0, 1):
            for rid, lid in zip(remote_ids, local_ids):
                src.append(cache.arena.addr + block_offset(layer, kv, lid))
                dst.append(prefill.addr + block_offset(layer, kv, rid))
                lengths.append(BLOCK_BYTES)
                expect.append((block_offset(layer, kv, lid), block_offset(layer, kv, rid)))
    ret = engine.batch_transfer_sync_read(session, src, dst, lengths)
    assert ret == 0, f"whole-request batch_transfer_sync_read of {len(src)} blocks returned {ret}"
    remote_image = pattern(fill, SPAN)
    local_image = pattern(guard, SPAN)
    for loff, roff in expect:
        assert_bytes(
            cache.arena.read(loff, BLOCK_BYTES),
            remote_image[roff : roff + BLOCK_BYTES],
            f"pulled block: local offset {loff} from remote offset {roff}",
        )
    untouched = [b for b in range(BLOCKS) if b not in local_ids]
    for layer in range(LAYERS):
        for kv in (0, 1):
            for b in untouched[:2]:
                off = block_offset(layer, kv, b)
                assert_bytes(
                    cache.arena.read(off, BLOCK_BYTES),
                    local_image[off : off + BLOCK_BYTES],
                    f"a local block the pull must not touch (layer {layer}, kv {kv}, block {b})",
                )

    # Layerwise push: every local block gets its own pattern; per layer a 128-byte pre-link write, then the layer.
    def block_seed(layer, kv, block):
        return (fill ^ 0x5A5A5A) * 1000 + layer * 100 + kv * 50 + block

    for layer in range(LAYERS):
        for kv in (0, 1):
            for b in range(BLOCKS):
                cache.arena.write(block_offset(layer, kv, b), pattern(block_seed(layer, kv, b), BLOCK_BYTES))
    push_remote = sorted(rng.sample(range(1, BLOCKS), count))  # block 0 of each K tensor takes the pre-link bytes
    push_local = rng.sample(range(BLOCKS), count)
    for layer in range(LAYERS):
        prelink_src = cache.arena.addr + block_offset(layer, 1, push_local[0])
        ret = engine.transfer_sync_write(session, prelink_src, prefill.addr + block_offset(layer, 0, 0), PRELINK)
        assert ret == 0, f"layer {layer}: the 128-byte pre-link write returned {ret}"
        src, dst, lengths = [], [], []
        for kv in (0, 1):
            for rid, lid in zip(push_remote, push_local):
                src.append(cache.arena.addr + block_offset(layer, kv, lid))
                dst.append(prefill.addr + block_offset(layer, kv, rid))
                lengths.append(BLOCK_BYTES)
        ret = engine.batch_transfer_sync_write(session, src, dst, lengths)
        assert ret == 0, f"layer {layer}: batch_transfer_sync_write of {len(src)} blocks returned {ret}"
    for layer in range(LAYERS):
        prelink_seed = block_seed(layer, 1, push_local[0])
        prefill.verify(prelink_seed, block_offset(layer, 0, 0), PRELINK, f"layer {layer}: pre-link bytes")
        prefill.same(
            fill,
            block_offset(layer, 0, 0) + PRELINK,
            BLOCK_BYTES - PRELINK,
            f"layer {layer}: K block 0 after the pre-link bytes",
        )
        for kv in (0, 1):
            for rid, lid in zip(push_remote, push_local):
                prefill.verify(
                    block_seed(layer, kv, lid),
                    block_offset(layer, kv, rid),
                    BLOCK_BYTES,
                    f"layer {layer} kv {kv}: pushed local block {lid} into remote block {rid}",
                )
            for b in [b for b in range(1, BLOCKS) if b not in push_remote][:2]:
                prefill.same(
                    fill,
                    block_offset(layer, kv, b),
                    BLOCK_BYTES,
                    f"layer {layer} kv {kv}: remote block {b} that no push targets",
                )
