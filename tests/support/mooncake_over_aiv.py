"""One side of the two-process test of Mooncake's unmodified Ascend wheel over aiv (tests/mooncake_over_aiv.rs).

Run in the wheel's virtualenv (tests/support/mooncake_npu.sh) with the directory tests/support/mooncake_over_aiv.sh
prints on LD_LIBRARY_PATH: Mooncake's TransferEngine then reaches the device through libllm_datadist.so over aiv.
Each process does what torch_npu does before Mooncake runs: aclInit and aclrtSetDevice(0) on the Python thread,
device memory from aclrtMalloc, registered with TransferEngine.register_memory and reached only through aclrtMemcpy.
The twin runtime's provenance records are turned on first (cannTwinRecordProvenance), so its evidence counts
(cannTwinEvidence version 2, read from the process's libascendcl.so) attribute every SQE and doorbell.

  target SEED SIZE             fills SIZE bytes of device memory with pattern(SEED), prints
                               "READY <segment name> <address> <size>", then serves stdin: "SNAPSHOT" prints
                               "EVIDENCE <json counts>"; "CHECK <sha256>" compares its memory (read back with
                               aclrtMemcpy) and prints "CHECKED ok" or "CHECKED mismatch"; "QUIT" (or end of input)
                               ends it.
  initiator NAME ADDR SIZE SEED
                               transfer_sync_write/read and batch_transfer_sync_write/read of random sizes and
                               offsets against the target's memory, with a model of both memories; between two
                               evidence snapshots only the transfers run (no copy of its own); then its own memory is
                               read back and compared with the model by hash, and it prints "EXPECT <sha256>" of what
                               the target's memory must hold, "OPS <n>" (transfers made) and "EVIDENCE <json delta>".
                               Exit 0 means every check passed.
  killed NAME ADDR SIZE        one 64-byte write (connecting), then batch_transfer_sync_write of the whole buffer in
                               256 KiB requests, back to back; before each prints "BATCH <i>" (the test kills the
                               target when it sees "BATCH 0"); prints "RESULT <i> <return code> <milliseconds>" per
                               batch, and stops after the first that fails and one more batch after it (the peer
                               lost), or after 40 batches.
"""

import ctypes
import hashlib
import json
import random
import sys
import time

import twin_evidence

ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2

acl = ctypes.CDLL("libascendcl.so")
acl.aclrtMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
acl.aclrtMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int]
acl.cannTwinRecordProvenance.argtypes = [ctypes.c_uint32]

# cannTwinEvidence version 2 in the layout the library exports (twin_evidence.py): no list of the counts here.
EVIDENCE = twin_evidence.Reader(acl)
COUNTS = EVIDENCE.counts


def log(*parts):
    print("mooncake_over_aiv.py:", *parts, file=sys.stderr, flush=True)


def check(code, what):
    if code != 0:
        raise SystemExit(f"{what} failed with {code}")


def evidence():
    return EVIDENCE.read()


def setup_device():
    check(acl.aclInit(None), "aclInit")
    check(acl.aclrtSetDevice(0), "aclrtSetDevice(0)")
    if acl.cannTwinRecordProvenance(1) != 1:
        raise SystemExit("the twin runtime's provenance records did not turn on")


def device_alloc(size):
    pointer = ctypes.c_void_p()
    check(acl.aclrtMalloc(ctypes.byref(pointer), size, 0), "aclrtMalloc")
    return pointer.value


def to_device(address, data):
    buffer = ctypes.create_string_buffer(bytes(data), len(data))
    check(acl.aclrtMemcpy(address, len(data), buffer, len(data), ACL_MEMCPY_HOST_TO_DEVICE), "aclrtMemcpy H2D")


def from_device(address, size):
    buffer = ctypes.create_string_buffer(size)
    check(acl.aclrtMemcpy(buffer, size, address, size, ACL_MEMCPY_DEVICE_TO_HOST), "aclrtMemcpy D2H")
    return buffer.raw


def pattern(seed, size):
    return random.Random(seed).randbytes(size)


def engine():
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    check(te.initialize("127.0.0.1", "P2PHANDSHAKE", "ascend", ""), "TransferEngine.initialize")
    return te


def target(seed, size):
    setup_device()
    memory = device_alloc(size)
    to_device(memory, pattern(seed, size))
    te = engine()
    check(te.register_memory(memory, size), "register_memory")
    print(f"READY 127.0.0.1:{te.get_rpc_port()} {memory} {size}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["SNAPSHOT"]:
            print("EVIDENCE " + json.dumps(evidence()), flush=True)
        elif words[:1] == ["CHECK"] and len(words) == 2:
            actual = hashlib.sha256(from_device(memory, size)).hexdigest()
            print("CHECKED ok" if actual == words[1] else "CHECKED mismatch", flush=True)
        elif words[:1] == ["QUIT"]:
            break
    check(te.unregister_memory(memory), "unregister_memory")


def initiator(name, remote, size, seed):
    rng = random.Random(seed ^ 0x5EED)
    setup_device()
    local = device_alloc(size)
    local_model = bytearray(pattern(seed + 1, size))
    to_device(local, local_model)
    remote_model = bytearray(pattern(seed, size))
    te = engine()
    check(te.register_memory(local, size), "register_memory")

    def some_range(most):
        length = rng.randint(1, most)
        return rng.randrange(0, size - length + 1), length

    def disjoint(count):
        cuts = sorted(rng.sample(range(0, size, 64), 2 * count))
        return [(cuts[2 * i], cuts[2 * i + 1] - cuts[2 * i]) for i in range(count)]

    # One transfer on the model: what the bytes are after it.
    def apply(op, loff, roff, length):
        if op == "write":
            remote_model[roff : roff + length] = local_model[loff : loff + length]
        else:
            local_model[loff : loff + length] = remote_model[roff : roff + length]

    before = evidence()
    started = time.monotonic()
    ops = 0
    for round_ in range(8):
        op = "write" if round_ % 2 == 0 else "read"
        for _ in range(3):
            loff, length = some_range(2 << 20)
            roff = rng.randrange(0, size - length + 1)
            call = te.transfer_sync_write if op == "write" else te.transfer_sync_read
            check(call(name, local + loff, remote + roff, length), f"transfer_sync_{op} of {length} bytes")
            apply(op, loff, roff, length)
            ops += 1
        count = rng.randint(2, 12)
        remotes = disjoint(count)
        locals_ = disjoint(count)
        lengths = [min(a[1], b[1]) for a, b in zip(remotes, locals_)]
        call = te.batch_transfer_sync_write if op == "write" else te.batch_transfer_sync_read
        code = call(name, [local + l[0] for l in locals_], [remote + r[0] for r in remotes], lengths)
        check(code, f"batch_transfer_sync_{op} of {count} requests")
        for (loff, _), (roff, _), length in zip(locals_, remotes, lengths):
            apply(op, loff, roff, length)
        ops += count
    elapsed = time.monotonic() - started
    after = evidence()
    delta = {name: after[name] - before[name] for name in COUNTS}
    delta["provenance_recorded"] = after["provenance_recorded"]
    log(f"{ops} transfers in {elapsed:.2f} s")
    # Only now a copy of its own: the local memory read back and compared with the model.
    if hashlib.sha256(from_device(local, size)).hexdigest() != hashlib.sha256(local_model).hexdigest():
        raise SystemExit("the initiator's memory differs from the model of what the transfers made it")
    print(f"OPS {ops}", flush=True)
    print("EVIDENCE " + json.dumps(delta), flush=True)
    print(f"EXPECT {hashlib.sha256(remote_model).hexdigest()}", flush=True)
    check(te.unregister_memory(local), "unregister_memory")


def killed(name, remote, size):
    setup_device()
    local = device_alloc(size)
    te = engine()
    check(te.register_memory(local, size), "register_memory")
    chunk = 256 << 10
    offsets = list(range(0, size - chunk + 1, chunk))
    # Connected first (the wheel's auto-connect: the handshake and the segment), so that the kill hits a transfer.
    check(te.transfer_sync_write(name, local, remote, 64), "transfer_sync_write (connect)")
    failed_at = None
    for i in range(40):
        print(f"BATCH {i}", flush=True)
        started = time.monotonic()
        code = te.batch_transfer_sync_write(
            name, [local + o for o in offsets], [remote + o for o in offsets], [chunk] * len(offsets)
        )
        print(f"RESULT {i} {code} {(time.monotonic() - started) * 1000:.0f}", flush=True)
        if code != 0 and failed_at is None:
            failed_at = i
        elif failed_at is not None:
            break


def main():
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role == "target" and len(sys.argv) == 4:
        target(int(sys.argv[2]), int(sys.argv[3]))
    elif role == "initiator" and len(sys.argv) == 6:
        initiator(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif role == "killed" and len(sys.argv) == 5:
        killed(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
