"""Data-verified transfers between two Python processes over each metadata kind.

pytest is the initiator; tests/python/peer.py is the target. Sizes run from 1 B to 4 MiB at unaligned offsets on both
sides; every write is checked on the peer (the written range holds the data, the bytes either side still hold the
fill) and every read locally (the range holds the peer's bytes, the bytes either side are untouched). One target and
one initiator engine per metadata kind serve all tests of the module.
"""

import time

import pytest

from conftest import METADATA_KINDS, HostArena, assert_bytes, new_engine, pattern, Peer

MiB = 1 << 20
SPAN = 5 * MiB  # the peer's registered arena
LOCAL = 5 * MiB  # the initiator's registered buffer
GUARD = 16  # bytes checked on either side of a transferred range


class Link:
    def __init__(self, te, conn):
        self.te = te
        self.peer = Peer(conn, size=SPAN, fill=1)
        self.engine = new_engine(te, conn)
        self.local = HostArena(LOCAL)
        rc = self.engine.register_memory(self.local.addr, LOCAL)
        assert rc == 0, f"register_memory(local) returned {rc}"
        self.session = self.peer.session
        self.remote = self.peer.addr

    def close(self):
        self.peer.close()


@pytest.fixture(scope="module", params=METADATA_KINDS)
def link(request, te, metadata_for):
    conn = metadata_for(request.param)
    link = Link(te, conn)
    yield link
    link.close()


def random_size(rng, largest=4 * MiB):
    """Log-uniform from 1 B to `largest`, so small and large sizes both occur."""
    return max(1, min(largest, int(2 ** rng.uniform(0, largest.bit_length() - 1))))


def cases(rng, count, largest=4 * MiB):
    """(size, local offset, remote offset) triples: 1 B, `largest` and random sizes, at random unaligned offsets."""
    sizes = [1, largest] + [random_size(rng, largest) for _ in range(count - 2)]
    out = []
    for n in sizes:
        out.append((n, rng.randrange(GUARD, LOCAL - n - GUARD + 1), rng.randrange(GUARD, SPAN - n - GUARD + 1)))
    return out


def check_write(link, seed, fill, n, roff):
    """The peer holds pattern(seed, n) at roff and its fill on either side."""
    link.peer.verify(seed, roff, n, f"written range [{roff}, {roff + n})")
    link.peer.same(fill, roff - GUARD, GUARD, "bytes before the written range")
    link.peer.same(fill, roff + n, GUARD, "bytes after the written range")


def check_read(link, fill, n, loff, roff, guard_seed):
    """The local buffer holds the peer's fill slice at loff and its own guard pattern on either side."""
    want = pattern(fill, SPAN)[roff : roff + n]
    assert_bytes(link.local.read(loff, n), want, f"read range local [{loff}, {loff + n}) from remote {roff}")
    guard = pattern(guard_seed, LOCAL)
    assert_bytes(link.local.read(loff - GUARD, GUARD), guard[loff - GUARD : loff], "local bytes before the read range")
    assert_bytes(
        link.local.read(loff + n, GUARD), guard[loff + n : loff + n + GUARD], "local bytes after the read range"
    )


def test_transfer_sync_write_then_read(link, rng):
    for i, (n, loff, roff) in enumerate(cases(rng, 8)):
        fill, seed = rng.randrange(1 << 30), rng.randrange(1 << 30)
        link.peer.fill(fill)
        link.local.write(loff, pattern(seed, n))
        rc = link.engine.transfer_sync_write(link.session, link.local.addr + loff, link.remote + roff, n)
        assert rc == 0, f"case {i}: transfer_sync_write of {n} B returned {rc}"
        check_write(link, seed, fill, n, roff)

        guard_seed = rng.randrange(1 << 30)
        link.local.write(0, pattern(guard_seed, LOCAL))
        rc = link.engine.transfer_sync_read(link.session, link.local.addr + loff, link.remote + roff, n)
        assert rc == 0, f"case {i}: transfer_sync_read of {n} B returned {rc}"
        # The read brings back what the write put there; the local bytes either side keep the guard pattern.
        assert_bytes(link.local.read(loff, n), pattern(seed, n), f"case {i}: read back {n} B")
        guard = pattern(guard_seed, LOCAL)
        assert_bytes(link.local.read(loff - GUARD, GUARD), guard[loff - GUARD : loff], "local bytes before the read")
        assert_bytes(link.local.read(loff + n, GUARD), guard[loff + n : loff + n + GUARD], "local bytes after the read")


def test_transfer_sync_with_opcode(link, te, rng):
    for n, loff, roff in cases(rng, 4, largest=MiB):
        fill, seed = rng.randrange(1 << 30), rng.randrange(1 << 30)
        link.peer.fill(fill)
        link.local.write(loff, pattern(seed, n))
        rc = link.engine.transfer_sync(
            link.session, link.local.addr + loff, link.remote + roff, n, te.TransferOpcode.Write
        )
        assert rc == 0, f"transfer_sync(Write) of {n} B returned {rc}"
        check_write(link, seed, fill, n, roff)

        fill = rng.randrange(1 << 30)
        link.peer.fill(fill)
        guard_seed = rng.randrange(1 << 30)
        link.local.write(0, pattern(guard_seed, LOCAL))
        rc = link.engine.transfer_sync(
            link.session, link.local.addr + loff, link.remote + roff, n, te.TransferOpcode.Read
        )
        assert rc == 0, f"transfer_sync(Read) of {n} B returned {rc}"
        check_read(link, fill, n, loff, roff, guard_seed)


def scattered(rng, count, largest):
    """`count` disjoint (local offset, remote offset, size) pieces in shuffled order, offsets unaligned."""
    slot_l, slot_r = (LOCAL - 2 * GUARD) // count, (SPAN - 2 * GUARD) // count
    sizes = [random_size(rng, min(largest, slot_l - 2 * GUARD, slot_r - 2 * GUARD)) for _ in range(count)]
    local_slots, remote_slots = list(range(count)), list(range(count))
    rng.shuffle(local_slots)
    rng.shuffle(remote_slots)
    pieces = []
    for n, ls, rs in zip(sizes, local_slots, remote_slots):
        loff = GUARD + ls * slot_l + rng.randrange(GUARD, slot_l - n - GUARD + 1)
        roff = GUARD + rs * slot_r + rng.randrange(GUARD, slot_r - n - GUARD + 1)
        pieces.append((loff, roff, n))
    return pieces


def batch_write_then_read(link, rng, write, read):
    """write(pieces) / read(pieces) return the engine's result; the data of every piece is checked both ways."""
    pieces = scattered(rng, 12, 256 << 10)
    fill = rng.randrange(1 << 30)
    link.peer.fill(fill)
    seeds = [rng.randrange(1 << 30) for _ in pieces]
    for (loff, _, n), seed in zip(pieces, seeds):
        link.local.write(loff, pattern(seed, n))
    rc = write(pieces)
    assert rc == 0, f"batch write of {len(pieces)} pieces returned {rc}"
    for (_, roff, n), seed in zip(pieces, seeds):
        check_write(link, seed, fill, n, roff)

    fill = rng.randrange(1 << 30)
    link.peer.fill(fill)
    guard_seed = rng.randrange(1 << 30)
    link.local.write(0, pattern(guard_seed, LOCAL))
    rc = read(pieces)
    assert rc == 0, f"batch read of {len(pieces)} pieces returned {rc}"
    for loff, roff, n in pieces:
        check_read(link, fill, n, loff, roff, guard_seed)


def lists(link, pieces):
    return (
        [link.local.addr + lo for lo, _, _ in pieces],
        [link.remote + r for _, r, _ in pieces],
        [n for _, _, n in pieces],
    )


def test_batch_transfer_sync_write_read(link, rng):
    e = link.engine
    batch_write_then_read(
        link,
        rng,
        lambda p: e.batch_transfer_sync_write(link.session, *lists(link, p)),
        lambda p: e.batch_transfer_sync_read(link.session, *lists(link, p)),
    )


def test_batch_transfer_sync_with_opcode(link, te, rng):
    e, op = link.engine, te.TransferOpcode
    batch_write_then_read(
        link,
        rng,
        lambda p: e.batch_transfer_sync(link.session, *lists(link, p), op.Write),
        lambda p: e.batch_transfer_sync(link.session, *lists(link, p), op.Read),
    )


def async_then_wait(submit, link, pieces):
    """Two batches submitted (halves of `pieces`), then one blocking get_batch_transfer_status over both ids."""
    half = len(pieces) // 2
    ids = [submit(*lists(link, pieces[:half])), submit(*lists(link, pieces[half:]))]
    assert all(isinstance(i, int) and i != 0 for i in ids), f"batch ids {ids} (0 is Mooncake's failure)"
    return link.engine.get_batch_transfer_status(ids)


def test_batch_transfer_async_write_read(link, rng):
    e = link.engine
    batch_write_then_read(
        link,
        rng,
        lambda p: async_then_wait(lambda *a: e.batch_transfer_async_write(link.session, *a), link, p),
        lambda p: async_then_wait(lambda *a: e.batch_transfer_async_read(link.session, *a), link, p),
    )


def test_batch_transfer_async_with_opcode(link, te, rng):
    e, op = link.engine, te.TransferOpcode
    batch_write_then_read(
        link,
        rng,
        lambda p: async_then_wait(lambda *a: e.batch_transfer_async(link.session, *a, op.Write), link, p),
        lambda p: async_then_wait(lambda *a: e.batch_transfer_async(link.session, *a, op.Read), link, p),
    )


def test_get_batch_transfer_status_blocks_until_done(link, rng):
    """Right after get_batch_transfer_status returns 0, a 4 MiB batch's data is on the peer (no polling needed)."""
    n = 4 * MiB
    fill, seed = rng.randrange(1 << 30), rng.randrange(1 << 30)
    link.peer.fill(fill)
    link.local.write(0, pattern(seed, n))
    piece = n // 8
    bid = link.engine.batch_transfer_async_write(
        link.session,
        [link.local.addr + i * piece for i in range(8)],
        [link.remote + GUARD + i * piece for i in range(8)],
        [piece] * 8,
    )
    assert bid != 0, "batch_transfer_async_write returned 0 (failure)"
    assert link.engine.get_batch_transfer_status([bid]) == 0
    check_write(link, seed, fill, n, GUARD)


def test_transfer_submit_write_and_check_status(link, rng):
    for n, loff, roff in cases(rng, 4, largest=2 * MiB):
        fill, seed = rng.randrange(1 << 30), rng.randrange(1 << 30)
        link.peer.fill(fill)
        link.local.write(loff, pattern(seed, n))
        bid = link.engine.transfer_submit_write(link.session, link.local.addr + loff, link.remote + roff, n)
        assert isinstance(bid, int) and bid not in (0, -1), f"transfer_submit_write returned {bid}"
        deadline = time.monotonic() + 2 * 5  # twice the smallest transfer timeout Mooncake allows
        states = []
        while True:
            status = link.engine.transfer_check_status(bid)
            if not states or states[-1] != status:
                states.append(status)
            if status != 0 or time.monotonic() > deadline:
                break
            time.sleep(0.0005)
        assert status == 1, f"transfer_check_status went {states} for {n} B (1 done, 0 pending, -1 failed, -2 timeout)"
        assert set(states) <= {0, 1}, f"transfer_check_status went {states}"
        check_write(link, seed, fill, n, roff)
