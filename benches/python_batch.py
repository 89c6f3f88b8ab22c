#!/usr/bin/env python3
"""`aiv bench`'s workload through the Python package, to set beside `aiv bench` itself: what the binding
costs.

Two engines in one process, as `aiv bench` runs without --segment_id: the initiator and an in-process target, each
on its own twin-runtime device (or both on the Host for tcp), one registered buffer each. Every thread t submits
batch after batch of `batch_size` requests of `block_size` bytes, request i at offset block_size * (i * threads + t)
of both buffers (transfer_engine_bench's layout), with `batch_transfer_sync_read/write`, until the duration ends.
Prints `transfer_engine_bench`'s result line, the p50/p99 batch latency, and the per-call overhead of the binding
(a call that crosses into Rust and back without moving data).

    python benches/python_batch.py --protocol aiv --threads 1 --batch_size 32 --block_size 4096 --duration 5
    target/release/aiv bench --protocol aiv --threads 1 --batch_size 32 --block_size 4096 --duration 5 \\
        --buffer_size 64mb                                   # the reference, same process layout

Run both with the same build profile (`AIV_PYTHON_RELEASE=1 bash tests/support/python.sh` builds a release wheel).
"""

import argparse
import ctypes
import statistics
import sys
import threading
import time

from aiv_transport import TransferEngine


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", default="aiv", choices=["aiv", "adxl", "adxl-fabric", "ubshmem", "tcp", "ascend"])
    parser.add_argument("--operation", default="read", choices=["read", "write"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--block_size", type=int, default=4096)
    parser.add_argument("--buffer_size", type=int, default=64 << 20)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    if args.threads < 1 or args.batch_size < 1 or args.block_size < 1 or args.duration <= 0:
        parser.error("--threads, --batch_size, --block_size and --duration must be positive")
    span = args.block_size * args.batch_size * args.threads
    if span > args.buffer_size:
        parser.error(f"one round spans {span} bytes, more than --buffer_size {args.buffer_size}")
    return args


def start(protocol, device_id):
    engine = TransferEngine(device_id=device_id)
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") != 0:
        sys.exit(f"initialize({protocol!r}) failed")
    return engine


def buffer(engine, protocol, size, keep):
    if protocol == "tcp":
        block = ctypes.create_string_buffer(size)
        keep.append(block)
        address = ctypes.addressof(block)
    else:
        address = engine.allocate_device_buffer(size)
        if address == 0:
            sys.exit(f"allocate_device_buffer({size}) failed")
    if engine.register_memory(address, size) != 0:
        sys.exit("register_memory failed")
    return address


def main():
    args = parse_args()
    keep = []
    initiator, target = start(args.protocol, 0), start(args.protocol, 1)
    local = buffer(initiator, args.protocol, args.buffer_size, keep)
    remote = buffer(target, args.protocol, args.buffer_size, keep)
    session = f"127.0.0.1:{target.get_rpc_port()}"
    call = initiator.batch_transfer_sync_read if args.operation == "read" else initiator.batch_transfer_sync_write
    # Warm-up: opens the segment and the path.
    if call(session, [local], [remote], [args.block_size]) != 0:
        sys.exit("the warm-up transfer failed")

    stop = threading.Event()
    latencies, failures, batches = [], [0], [0]
    lock = threading.Lock()

    def worker(t):
        offsets = [args.block_size * (i * args.threads + t) for i in range(args.batch_size)]
        sources = [local + offset for offset in offsets]
        targets = [remote + offset for offset in offsets]
        lengths = [args.block_size] * args.batch_size
        mine, bad, count = [], 0, 0
        while not stop.is_set():
            begin = time.perf_counter()
            if call(session, sources, targets, lengths) != 0:
                bad += 1
            mine.append(time.perf_counter() - begin)
            count += 1
        with lock:
            latencies.extend(mine)
            failures[0] += bad
            batches[0] += count

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(args.threads)]
    begin = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(args.duration)
    stop.set()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - begin

    # The binding's own cost per call: a call into Rust and back that moves nothing.
    calls = 20000
    probe = time.perf_counter()
    for _ in range(calls):
        initiator.get_rpc_port()
    per_call = (time.perf_counter() - probe) / calls

    latencies.sort()
    p50 = statistics.median(latencies) * 1e6
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e6
    throughput = batches[0] * args.batch_size * args.block_size / wall / 1e9
    print(f"python batch: protocol {args.protocol}, {args.operation} {args.batch_size} x {args.block_size} B per "
          f"batch, {args.threads} thread(s), failed batches {failures[0]}")
    print(f"latency per batch: p50 {p50:.1f} us, p99 {p99:.1f} us over {len(latencies)} batches")
    print(f"binding overhead: {per_call * 1e9:.0f} ns per call (get_rpc_port, {calls} calls)")
    print(f"Test completed: duration {wall:.2f}, batch count {batches[0]}, throughput {throughput:.2f} GB/s")
    for engine, address in ((initiator, local), (target, remote)):
        engine.unregister_memory(address)
    return 1 if failures[0] else 0


if __name__ == "__main__":
    sys.exit(main())
