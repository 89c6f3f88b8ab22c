"""Interop with the real Mooncake Python engine over tcp, both directions.

The Mooncake side is tests/python/peer.py run by the interpreter of AIV_TEST_MOONCAKE_VENV with
AIV_PYTEST_ENGINE=mooncake (tests/support/mooncake.sh makes that virtualenv). The other side is the engine under test
(under AIV_PYTEST_ENGINE=mooncake both sides are Mooncake, which checks the harness itself). Each test runs over
P2PHANDSHAKE, HTTP and etcd metadata.

    - engine under test initiates, the Mooncake process is the target: sync and batch writes and reads, data checked
      on both sides;
    - a Mooncake process initiates (peer.py's put/get/bput/bget), a process of the engine under test is the target.
"""

import pytest

from conftest import METADATA_KINDS, HostArena, assert_bytes, mooncake_python, new_engine, pattern

MiB = 1 << 20
SPAN = 3 * MiB


@pytest.mark.parametrize("metadata", METADATA_KINDS)
def test_ours_initiates_against_mooncake_target(te, peers, metadata_for, rng, metadata):
    conn = metadata_for(metadata)
    target = peers(conn, size=SPAN, fill=11, python=mooncake_python(), engine="mooncake")
    engine = new_engine(te, conn)
    local = HostArena(SPAN)
    assert engine.register_memory(local.addr, SPAN) == 0
    assert engine.get_first_buffer_address(target.session) == target.addr

    # Read everything the Mooncake target holds, at an unaligned offset.
    n, roff, loff = SPAN - 4099, 4097, 13
    assert engine.transfer_sync_read(target.session, local.addr + loff, target.addr + roff, n) == 0
    assert_bytes(local.read(loff, n), pattern(11, SPAN)[roff : roff + n], "read from the Mooncake target")

    # Write a large range, then a batch of scattered small pieces, and let the target check them.
    seed = rng.randrange(1 << 30)
    n, roff = 2 * MiB + 3, 5
    local.write(0, pattern(seed, n))
    assert engine.transfer_sync_write(target.session, local.addr, target.addr + roff, n) == 0
    target.verify(seed, roff, n, "large write into the Mooncake target")
    target.same(11, 0, roff, "target bytes before the large write")
    target.same(11, roff + n, SPAN - roff - n, "target bytes after the large write")

    pieces = [(i * 9000 + rng.randrange(100), rng.randrange(1, 4000)) for i in range(32)]
    seeds = [rng.randrange(1 << 30) for _ in pieces]
    base = 2 * MiB + 64
    for (off, size), s in zip(pieces, seeds):
        local.write(off, pattern(s, size))
    rc = engine.batch_transfer_sync_write(
        target.session,
        [local.addr + o for o, _ in pieces],
        [target.addr + base + o for o, _ in pieces],
        [s for _, s in pieces],
    )
    assert rc == 0
    for (off, size), s in zip(pieces, seeds):
        target.verify(s, base + off, size, f"batch piece at {base + off}")

    # And read the pieces back with one batch read into fresh local memory.
    local.write(0, bytes(SPAN))
    rc = engine.batch_transfer_sync_read(
        target.session,
        [local.addr + o for o, _ in pieces],
        [target.addr + base + o for o, _ in pieces],
        [s for _, s in pieces],
    )
    assert rc == 0
    for (off, size), s in zip(pieces, seeds):
        assert_bytes(local.read(off, size), pattern(s, size), f"batch read of the piece at {base + off}")


@pytest.mark.parametrize("metadata", METADATA_KINDS)
def test_mooncake_initiates_against_our_target(te, peers, metadata_for, rng, metadata):
    conn = metadata_for(metadata)
    target = peers(conn, size=SPAN, fill=21)
    mooncake = peers(conn, size=SPAN, fill=22, python=mooncake_python(), engine="mooncake")

    # Mooncake reads our target: its arena[loff:loff+n] must then hold our target's fill at the same offset.
    n, off = SPAN - 10, 7
    assert mooncake.rc(f"get {target.session} {target.addr + off} {off} {n}") == 0
    mooncake.same(21, off, n, "what the Mooncake initiator read from our target")
    mooncake.same(22, 0, off, "the Mooncake initiator's bytes before the read range")

    # Mooncake writes a refilled range (one call, then a batch of 16) into our target.
    seed = rng.randrange(1 << 30)
    mooncake.fill(seed)
    n, off = 2 * MiB + 1, 3
    assert mooncake.rc(f"put {target.session} {target.addr + off} {off} {n}") == 0
    target.same(seed, off, n, "what the Mooncake initiator wrote into our target")
    target.same(21, 0, off, "our target's bytes before the written range")
    target.same(21, off + n, SPAN - off - n, "our target's bytes after the written range")

    seed = rng.randrange(1 << 30)
    mooncake.fill(seed)
    n, off = 64 * 1024 + 17, 2 * MiB + 100
    assert mooncake.rc(f"bput {target.session} {target.addr + off} {off} {n} 16") == 0
    target.same(seed, off, n, "a batch the Mooncake initiator wrote into our target")
    # Refilled, the Mooncake side must get the batch-written range back by a batch read to hold it again.
    mooncake.fill(seed + 1)
    assert mooncake.rc(f"bget {target.session} {target.addr + off} {off} {n} 16") == 0
    mooncake.same(seed, off, n, "a batch the Mooncake initiator read from our target")
    mooncake.same(seed + 1, off + n, 64, "the Mooncake initiator's bytes after the batch read")
