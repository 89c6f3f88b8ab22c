#!/usr/bin/env python3
"""A Mooncake peer for the tcp interop tests, driving the real wheel's Python `TransferEngine`.

    mooncake_peer.py initiator --metadata URL --name HOST:PORT --target SEGMENT --size N --expect SEED --write SEED
        Reads the target's first buffer and checks it holds pattern(--expect), writes pattern(--write) over it
        (one whole-range write, then a batch of 4 KiB writes over the first 64 KiB), reads it back and checks.
        Exit 0 only if every transfer returned 0 and every byte matched.
    mooncake_peer.py target --metadata URL --name HOST:PORT --size N --fill SEED
        Registers N bytes holding pattern(--fill), prints "READY <segment> <addr> <size>" (under P2PHANDSHAKE the
        segment is host:<actual RPC port>), then waits for one line
        on stdin: "verify SEED" checks the buffer holds pattern(SEED) and prints "VERIFY ok" or "VERIFY bad <index>".

pattern(seed)[i] = ((i % 251) + seed) % 256, the same on the Rust side. Talks only to the addresses it is given
(loopback in the tests). Bounded: the target exits when stdin closes or after --timeout seconds.
"""
import argparse
import ctypes
import select
import sys

from mooncake.engine import TransferEngine


def pattern(seed: int, size: int) -> bytes:
    cycle = bytes(((i % 251) + seed) % 256 for i in range(251))
    return (cycle * (size // 251 + 1))[:size]


def first_difference(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def start_engine(args) -> TransferEngine:
    engine = TransferEngine()
    rc = engine.initialize(args.name, args.metadata, "tcp", "")
    if rc != 0:
        print(f"initialize failed: {rc}", flush=True)
        sys.exit(2)
    return engine


def segment_name(engine: TransferEngine, args) -> str:
    """The name peers open: under P2PHANDSHAKE Mooncake renames the segment host:<actual RPC port>."""
    if args.metadata.upper() == "P2PHANDSHAKE":
        host = args.name.rsplit(":", 1)[0]
        return f"{host}:{engine.get_rpc_port()}"
    return args.name


def initiator(args) -> int:
    engine = start_engine(args)
    size = args.size
    local = ctypes.create_string_buffer(2 * size)
    base = ctypes.addressof(local)
    if engine.register_memory(base, 2 * size) != 0:
        print("register_memory failed", flush=True)
        return 2
    remote = engine.get_first_buffer_address(args.target)
    print(f"target {args.target} first buffer {remote:#x}", flush=True)
    failures = 0
    rc = engine.transfer_sync_read(args.target, base, remote, size)
    got = ctypes.string_at(base, size)
    diff = first_difference(got, pattern(args.expect, size))
    print(f"read rc={rc} first_difference={diff}", flush=True)
    failures += rc != 0 or diff != -1
    ctypes.memmove(base + size, pattern(args.write, size), size)
    rc = engine.transfer_sync_write(args.target, base + size, remote, size)
    print(f"write rc={rc}", flush=True)
    failures += rc != 0
    block = 4096
    count = min(16, size // block)
    rc = engine.batch_transfer_sync_write(
        args.target,
        [base + size + i * block for i in range(count)],
        [remote + i * block for i in range(count)],
        [block] * count,
    )
    print(f"batch write rc={rc} ({count} x {block} B)", flush=True)
    failures += rc != 0
    ctypes.memset(base, 0, size)
    rc = engine.transfer_sync_read(args.target, base, remote, size)
    diff = first_difference(ctypes.string_at(base, size), pattern(args.write, size))
    print(f"read back rc={rc} first_difference={diff}", flush=True)
    failures += rc != 0 or diff != -1
    print("INITIATOR ok" if failures == 0 else f"INITIATOR failed ({failures})", flush=True)
    return 0 if failures == 0 else 1


def target(args) -> int:
    engine = start_engine(args)
    size = args.size
    buffer = ctypes.create_string_buffer(pattern(args.fill, size), size)
    base = ctypes.addressof(buffer)
    if engine.register_memory(base, size) != 0:
        print("register_memory failed", flush=True)
        return 2
    print(f"READY {segment_name(engine, args)} {base} {size}", flush=True)
    ready, _, _ = select.select([sys.stdin], [], [], args.timeout)
    line = sys.stdin.readline().split() if ready else []
    if len(line) == 2 and line[0] == "verify":
        diff = first_difference(ctypes.string_at(base, size), pattern(int(line[1]), size))
        print("VERIFY ok" if diff == -1 else f"VERIFY bad {diff}", flush=True)
    engine.unregister_memory(base)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["initiator", "target"])
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--target")
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--expect", type=int, default=0)
    parser.add_argument("--write", type=int, default=0)
    parser.add_argument("--fill", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    return initiator(args) if args.role == "initiator" else target(args)


if __name__ == "__main__":
    sys.exit(main())
