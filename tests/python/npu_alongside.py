"""Mooncake's real Ascend build and this project's engine in one process, on the same twin-runtime device memory.

Run by tests/python/test_npu_alongside.py with the interpreter of Mooncake's Ascend virtualenv
(tests/support/mooncake_npu.sh), the twin runtime's CANN libraries on LD_LIBRARY_PATH (tests/support/twin_cann_libs.sh),
aiv_transport importable, and this project's engine told to load those same libraries ("device_backend": "cann").
Both engines then run over one loaded copy of the twin runtime: one device 0, one device memory.

  host SEED SIZE
      The process with both engines. Allocates two device buffers X and Y through aiv_transport (SHMEM heap memory of
      device 0), registers both with both engines, fills X with pattern(SEED) through aiv_transport, and prints
      "READY <mooncake engine name> <X> <Y> <SIZE>". Then serves one command per stdin line:
        "EXPECT X <sha256>"  X, read through aiv_transport's device copy, has that digest: "EXPECTED ok" / "mismatch"
        "MOVE"               aiv_transport's aiv path (the AIV kernel on the twin) copies X to Y within the device:
                             "MOVED 0" (the transfer's result)
        "QUIT"               ends it.
  peer NAME X Y SIZE SEED
      A second process with Mooncake's engine only: checks X holds pattern(SEED) (a Mooncake ascend read of memory
      that aiv_transport allocated and filled), writes random data over X with Mooncake, prints "WROTE <sha256>",
      waits for "CHECK Y" on stdin, reads Y with Mooncake and checks it equals what it wrote (so the bytes aiv moved
      inside the other process are what Mooncake sees), prints "PEER ok". Exit 0 only if every check passed.
"""

import hashlib
import os
import random
import sys
from pathlib import Path

# The device helpers of the two-process test of the wheel (aclInit and aclrtSetDevice as torch_npu does, aclrtMalloc,
# aclrtMemcpy both ways): the same ctypes calls on the same libascendcl.so.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))
from mooncake_npu_twin import check, device_alloc, from_device, pattern, setup_device, to_device  # noqa: E402
from mooncake_npu_twin import engine as mooncake_engine  # noqa: E402  (initialize(..., "ascend", ""), checked)


def log(*parts):
    print("npu_alongside.py:", *parts, file=sys.stderr, flush=True)


def host(seed, size):
    setup_device()
    import aiv_transport

    ours = aiv_transport.TransferEngine()
    check(ours.initialize("127.0.0.1", "P2PHANDSHAKE", "aiv", ""), "aiv_transport initialize")
    mooncake = mooncake_engine()
    x, y = ours.allocate_device_buffer(size), ours.allocate_device_buffer(size)
    if not x or not y:
        raise SystemExit("aiv_transport could not allocate device memory")
    for address in (x, y):
        check(ours.register_memory(address, size), "aiv_transport register_memory")
        check(mooncake.register_memory(address, size), "mooncake register_memory")
    check(ours.write_bytes_to_buffer(x, pattern(seed, size), size), "aiv_transport write_bytes_to_buffer")
    log("device", ours.get_device_location(), "buffers", hex(x), hex(y), "runtime", os.environ.get("AIV_ASCENDCL_LIB"))
    print(f"READY 127.0.0.1:{mooncake.get_rpc_port()} {x} {y} {size}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:2] == ["EXPECT", "X"] and len(words) == 3:
            actual = hashlib.sha256(ours.read_bytes_from_buffer(x, size)).hexdigest()
            print("EXPECTED ok" if actual == words[2] else "EXPECTED mismatch", flush=True)
        elif words == ["MOVE"]:
            session = ours.get_segment_name()
            print(f"MOVED {ours.transfer_sync_write(session, x, y, size)}", flush=True)
        elif words == ["QUIT"]:
            break
    for address in (x, y):
        check(mooncake.unregister_memory(address), "mooncake unregister_memory")
        check(ours.unregister_memory(address), "aiv_transport unregister_memory")


def peer(name, x, y, size, seed):
    setup_device()
    mooncake = mooncake_engine()
    local = device_alloc(size)
    check(mooncake.register_memory(local, size), "mooncake register_memory")
    check(mooncake.transfer_sync_read(name, local, x, size), "mooncake read of X")
    if from_device(local, size) != pattern(seed, size):
        raise SystemExit("X, filled by aiv_transport, read by Mooncake, differs from the pattern")
    log("X read by Mooncake holds what aiv_transport wrote")
    data = random.Random(seed ^ 0xA1).randbytes(size)
    to_device(local, data)
    check(mooncake.transfer_sync_write(name, local, x, size), "mooncake write of X")
    print(f"WROTE {hashlib.sha256(data).hexdigest()}", flush=True)
    if sys.stdin.readline().split() != ["CHECK", "Y"]:
        raise SystemExit("expected CHECK Y")
    to_device(local, bytes(size))
    check(mooncake.transfer_sync_read(name, local, y, size), "mooncake read of Y")
    if from_device(local, size) != data:
        raise SystemExit("Y, moved from X by aiv_transport's aiv path, read by Mooncake, differs from what was written")
    print("PEER ok", flush=True)
    check(mooncake.unregister_memory(local), "mooncake unregister_memory")


if __name__ == "__main__":
    if sys.argv[1:2] == ["host"] and len(sys.argv) == 4:
        host(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1:2] == ["peer"] and len(sys.argv) == 7:
        peer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    else:
        raise SystemExit(__doc__)
