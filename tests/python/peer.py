#!/usr/bin/env python3
"""The target process of the Python tests: one TransferEngine, one registered arena, driven over stdin/stdout.

    peer.py --metadata CONN [--protocol tcp] [--host 127.0.0.1] [--name NAME] [--size N] [--memory host|managed|device]
            [--regions R] [--align A] [--fill SEED] [--timeout S]

The engine module comes from env AIV_PYTEST_ENGINE: `aiv_transport` (default; `aiv_transport.TransferEngine`) or
`mooncake` (`mooncake.engine.TransferEngine`, the real wheel). The arena is R regions of N bytes each, every region
starting on an A-byte boundary (stride = N rounded up to A), each registered with its own `register_memory` call, as
vLLM-Ascend registers one KV-cache tensor per call. Memory kinds: `host` (anonymous mmap), `managed`
(`allocate_managed_buffer`, which registers it itself; one region only), `device` (this project's
`allocate_device_buffer`, twin-runtime device memory; `write_bytes_to_buffer`/`read_bytes_from_buffer` reach it).

Prints one line `READY <session> <addr> <span>` once registered: the segment name initiators open (under
P2PHANDSHAKE `host:<get_rpc_port()>`, otherwise NAME), the address of the first region and the arena's span in bytes
(R * stride). Then answers one line per command:
    fill SEED                   the whole span := pattern(SEED, span)                      -> ok
    verify SEED OFFSET LEN      span[OFFSET:OFFSET+LEN] == pattern(SEED, LEN)               -> ok | bad <index>
    same SEED OFFSET LEN        span[OFFSET:OFFSET+LEN] == pattern(SEED, span)[OFFSET:...]  -> ok | bad <index>
    put SESSION RADDR OFFSET LEN   transfer_sync_write(SESSION, base+OFFSET, RADDR, LEN)          -> rc <n>
    get SESSION RADDR OFFSET LEN   transfer_sync_read(SESSION, base+OFFSET, RADDR, LEN)           -> rc <n>
    bput / bget SESSION RADDR OFFSET LEN COUNT   the same range as a batch_transfer_sync_write/read of COUNT
                                pieces                                                     -> rc <n>
    quit                        exits
(put/get make the peer the initiator, with its arena as the local buffer: the interop tests use them.)
(<index> counts from OFFSET.) Exits when stdin closes or --timeout seconds after start, whichever comes first.
A failure before READY prints `FAILED <what>` and exits 2.

pattern(seed, n) = random.Random(seed).randbytes(n), the same in every interpreter the tests use (CPython >= 3.9).
Standard library only: the interop tests run this file under the Mooncake virtualenv's interpreter.
"""

import argparse
import ctypes
import mmap
import os
import random
import select
import sys
import time


def pattern(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


_last_pattern = (None, None, b"")


def cached_pattern(seed: int, n: int) -> bytes:
    """pattern(seed, n), remembering the last one (`same` asks for slices of the same span-sized fill often)."""
    global _last_pattern
    if _last_pattern[:2] != (seed, n):
        _last_pattern = (seed, n, pattern(seed, n))
    return _last_pattern[2]


def first_difference(got: bytes, want: bytes) -> int:
    """Index of the first differing byte, -1 when equal (lengths included)."""
    if got == want:
        return -1
    lo, hi = 0, min(len(got), len(want))
    if got[:hi] == want[:hi]:
        return hi
    # Narrow down by halves: got[:lo] == want[:lo] and got[:hi] != want[:hi].
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if got[lo:mid] == want[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def engine_class():
    name = os.environ.get("AIV_PYTEST_ENGINE", "aiv_transport")
    if name == "mooncake":
        from mooncake.engine import TransferEngine
    elif name == "aiv_transport":
        from aiv_transport import TransferEngine
    else:
        raise SystemExit(f"AIV_PYTEST_ENGINE={name!r}: expected aiv_transport or mooncake")
    return TransferEngine


def fail(what: str) -> None:
    print(f"FAILED {what}", flush=True)
    sys.exit(2)


class Arena:
    def __init__(self, engine, args):
        self.engine = engine
        self.kind = args.memory
        self.region = args.size
        self.stride = -(-args.size // args.align) * args.align
        self.span = self.stride * args.regions
        self.keep = None
        if self.kind == "host":
            self.keep = mmap.mmap(-1, self.span + args.align)
            raw = ctypes.addressof(ctypes.c_char.from_buffer(self.keep))
        elif self.kind == "managed":
            if args.regions != 1:
                fail("managed memory is one region")
            raw = engine.allocate_managed_buffer(self.span)
            if not raw:
                fail(f"allocate_managed_buffer({self.span}) returned 0")
        elif self.kind == "device":
            raw = engine.allocate_device_buffer(self.span + args.align)
            if not raw:
                fail(f"allocate_device_buffer({self.span + args.align}) returned 0")
        else:
            fail(f"unknown memory kind {self.kind}")
        self.base = raw if self.kind == "managed" else -(-raw // args.align) * args.align
        if self.kind != "managed":  # allocate_managed_buffer registers its memory itself
            for r in range(args.regions):
                rc = engine.register_memory(self.base + r * self.stride, self.region)
                if rc != 0:
                    fail(f"register_memory(region {r}) returned {rc}")

    def write(self, offset: int, data: bytes) -> None:
        if self.kind == "host":
            ctypes.memmove(self.base + offset, data, len(data))
        else:
            rc = self.engine.write_bytes_to_buffer(self.base + offset, data, len(data))
            if rc != 0:
                raise RuntimeError(f"write_bytes_to_buffer returned {rc}")

    def read(self, offset: int, length: int) -> bytes:
        if self.kind == "host":
            return ctypes.string_at(self.base + offset, length)
        return bytes(self.engine.read_bytes_from_buffer(self.base + offset, length))


def initiate(engine, arena, words) -> int:
    session, raddr, offset, length = words[1], int(words[2]), int(words[3]), int(words[4])
    if offset < 0 or length < 0 or offset + length > arena.span:
        raise ValueError(f"[{offset}, {offset + length}) is outside the span {arena.span}")
    local = arena.base + offset
    if words[0] == "put":
        return engine.transfer_sync_write(session, local, raddr, length)
    if words[0] == "get":
        return engine.transfer_sync_read(session, local, raddr, length)
    count = int(words[5])
    cuts = [length * i // count for i in range(count + 1)]
    pieces = [(cuts[i], cuts[i + 1] - cuts[i]) for i in range(count)]
    call = engine.batch_transfer_sync_write if words[0] == "bput" else engine.batch_transfer_sync_read
    return call(session, [local + o for o, _ in pieces], [raddr + o for o, _ in pieces], [n for _, n in pieces])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--protocol", default="tcp")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--name", help="local_hostname (segment name) when the metadata is not P2PHANDSHAKE")
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--memory", default="host", choices=["host", "managed", "device"])
    parser.add_argument("--regions", type=int, default=1)
    parser.add_argument("--align", type=int, default=4096)
    parser.add_argument("--fill", type=int)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout

    p2p = args.metadata.upper() == "P2PHANDSHAKE"
    engine = engine_class()()
    rc = engine.initialize(args.host if p2p else args.name or args.host, args.metadata, args.protocol, "")
    if rc != 0:
        fail(f"initialize returned {rc}")
    arena = Arena(engine, args)
    if args.fill is not None:
        arena.write(0, pattern(args.fill, arena.span))
    session = f"{args.host}:{engine.get_rpc_port()}" if p2p else args.name
    print(f"READY {session} {arena.base} {arena.span}", flush=True)

    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sys.stdin], [], [], left)[0]:
            print("timeout", flush=True)
            return 1
        line = sys.stdin.readline()
        if not line:
            return 0
        words = line.split()
        try:
            if words[:1] == ["fill"]:
                arena.write(0, cached_pattern(int(words[1]), arena.span))
                print("ok", flush=True)
            elif words[:1] in (["verify"], ["same"]):
                seed, offset, length = (int(w) for w in words[1:4])
                if offset < 0 or length < 0 or offset + length > arena.span:
                    raise ValueError(f"[{offset}, {offset + length}) is outside the span {arena.span}")
                if words[0] == "verify":
                    want = pattern(seed, length)
                else:
                    want = cached_pattern(seed, arena.span)[offset : offset + length]
                diff = first_difference(arena.read(offset, length), want)
                print("ok" if diff < 0 else f"bad {diff}", flush=True)
            elif words[:1] in (["put"], ["get"], ["bput"], ["bget"]):
                print(f"rc {initiate(engine, arena, words)}", flush=True)
            elif words[:1] == ["quit"]:
                return 0
            else:
                print(f"error unknown command {line.strip()!r}", flush=True)
        except Exception as error:  # report, keep serving
            print(f"error {error}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
