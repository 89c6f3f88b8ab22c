"""One side of the two-process test of Mooncake's Ascend wheel on the CPU twin runtime
(shmem-bindings/cann-twin/tests/mooncake_wheel.rs).

Run with the twin's libraries (tests/support/twin_cann_libs.sh) on LD_LIBRARY_PATH, in the wheel's virtualenv
(tests/support/mooncake_npu.sh). Each process does what torch_npu does before Mooncake runs: aclInit and
aclrtSetDevice(0) on the Python thread, then allocates device memory with aclrtMalloc, registers it with
TransferEngine.register_memory and reaches its contents only through aclrtMemcpy.

  target SEED SIZE             fills SIZE bytes of device memory with pattern(SEED), prints
                               "READY <engine name> <address> <size>", then serves: stdin "CHECK <sha256>" compares
                               its memory (read back with aclrtMemcpy) and prints "CHECKED ok" or "CHECKED mismatch";
                               "QUIT" (or end of input) ends it.
  initiator NAME ADDR SIZE SEED
                               reads, writes and batch-reads/writes the target's memory at random offsets and sizes,
                               verifies every byte, checks that out-of-bounds transfers are refused, and prints
                               "EXPECT <sha256>" of what the target's memory must now hold. Exit 0 means every check
                               passed.
"""

import ctypes
import hashlib
import random
import sys

ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2

acl = ctypes.CDLL("libascendcl.so")
acl.aclrtMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
acl.aclrtMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int]
acl.aclrtFree.argtypes = [ctypes.c_void_p]
acl.aclrtMallocHost.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]


def log(*parts):
    print("mooncake_npu_twin.py:", *parts, file=sys.stderr, flush=True)


def check(code, what):
    if code != 0:
        raise SystemExit(f"{what} failed with {code}")


def setup_device():
    check(acl.aclInit(None), "aclInit")
    check(acl.aclrtSetDevice(0), "aclrtSetDevice(0)")


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
        if words[:1] == ["CHECK"] and len(words) == 2:
            actual = hashlib.sha256(from_device(memory, size)).hexdigest()
            print("CHECKED ok" if actual == words[1] else "CHECKED mismatch", flush=True)
        elif words[:1] == ["QUIT"]:
            break
    check(te.unregister_memory(memory), "unregister_memory")


def initiator(name, remote, remote_size, seed):
    rng = random.Random(seed ^ 0x5EED)
    setup_device()
    local_size = remote_size
    local = device_alloc(local_size)
    te = engine()
    check(te.register_memory(local, local_size), "register_memory")
    model = bytearray(pattern(seed, remote_size))  # what the target's memory holds

    def some_range(limit, most):
        length = rng.randint(1, min(most, limit))
        return rng.randrange(0, limit - length + 1), length

    # Reads of random sizes (up to past one ADXL chunk) and offsets, verified against the target's pattern.
    for _ in range(12):
        roff, length = some_range(remote_size, 3 << 20)
        loff = rng.randrange(0, local_size - length + 1)
        check(te.transfer_sync_read(name, local + loff, remote + roff, length), "transfer_sync_read")
        if from_device(local + loff, length) != bytes(model[roff : roff + length]):
            raise SystemExit(f"transfer_sync_read of {length} bytes at {roff} returned wrong data")
    log("12 reads verified")

    # Writes of random data, then the whole remote memory read back and compared with the model.
    for _ in range(12):
        roff, length = some_range(remote_size, 3 << 20)
        loff = rng.randrange(0, local_size - length + 1)
        data = rng.randbytes(length)
        to_device(local + loff, data)
        check(te.transfer_sync_write(name, local + loff, remote + roff, length), "transfer_sync_write")
        model[roff : roff + length] = data
    check(te.transfer_sync_read(name, local, remote, remote_size), "transfer_sync_read (all)")
    if from_device(local, remote_size) != bytes(model):
        raise SystemExit("the target's memory after 12 writes differs from what was written")
    log("12 writes verified by a full read back")

    # Batches: disjoint random ranges on both sides.
    def disjoint(count, limit):
        cuts = sorted(rng.sample(range(0, limit, 64), 2 * count))
        return [(cuts[2 * i], cuts[2 * i + 1] - cuts[2 * i]) for i in range(count)]

    for round_ in range(3):
        count = rng.randint(2, 16)
        remote_ranges = disjoint(count, remote_size)
        lengths = [length for _, length in remote_ranges]
        local_offsets, cursor = [], 0
        for length in lengths:
            local_offsets.append(cursor)
            cursor += length
        datas = [rng.randbytes(length) for length in lengths]
        for offset, data in zip(local_offsets, datas):
            to_device(local + offset, data)
        check(
            te.batch_transfer_sync_write(
                name, [local + o for o in local_offsets], [remote + r for r, _ in remote_ranges], lengths
            ),
            "batch_transfer_sync_write",
        )
        for (roff, length), data in zip(remote_ranges, datas):
            model[roff : roff + length] = data
        # Read the same ranges back into a shifted local layout and compare.
        shift = rng.randrange(0, local_size - sum(lengths) + 1)
        check(
            te.batch_transfer_sync_read(
                name, [local + shift + o for o in local_offsets], [remote + r for r, _ in remote_ranges], lengths
            ),
            "batch_transfer_sync_read",
        )
        for offset, (roff, length) in zip(local_offsets, remote_ranges):
            if from_device(local + shift + offset, length) != bytes(model[roff : roff + length]):
                raise SystemExit(f"batch round {round_}: range at {roff} of {length} bytes differs")
    log("3 batches of writes and reads verified")

    # Out of bounds: past the end of the target's registered memory, and past the end of the local one.
    before = from_device(local, 4096)
    if te.transfer_sync_write(name, local, remote + remote_size - 100, 4096) == 0:
        raise SystemExit("a write running past the target's registered memory was accepted")
    if te.transfer_sync_read(name, local, remote + remote_size - 100, 4096) == 0:
        raise SystemExit("a read running past the target's registered memory was accepted")
    if te.transfer_sync_read(name, local + local_size - 100, remote, 4096) == 0:
        raise SystemExit("a read running past the local registered memory was accepted")
    if from_device(local, 4096) != before:
        raise SystemExit("a refused read changed local memory")
    log("3 out-of-bounds transfers refused")

    # Host memory (aclrtMallocHost) registered too: the wheel classifies it HOST and ADXL gets MEM_HOST; it moves
    # to and from the target's device memory like device memory does.
    host_size = 1 << 20
    host = ctypes.c_void_p()
    check(acl.aclrtMallocHost(ctypes.byref(host), ctypes.c_size_t(host_size)), "aclrtMallocHost")
    check(te.register_memory(host.value, host_size), "register_memory (Host)")
    data = rng.randbytes(host_size // 2)
    ctypes.memmove(host.value, data, len(data))
    roff = rng.randrange(0, remote_size - len(data) + 1)
    check(te.transfer_sync_write(name, host.value, remote + roff, len(data)), "transfer_sync_write from Host memory")
    model[roff : roff + len(data)] = data
    check(
        te.transfer_sync_read(name, host.value + host_size // 2, remote + roff, len(data)),
        "transfer_sync_read into Host memory",
    )
    if ctypes.string_at(host.value + host_size // 2, len(data)) != data:
        raise SystemExit("Host memory read back differs")
    check(te.unregister_memory(host.value), "unregister_memory (Host)")
    log("a write from and a read into Host memory verified")

    # The engine still works after the refusals.
    check(te.transfer_sync_read(name, local, remote, 4096), "transfer_sync_read after refusals")
    if from_device(local, 4096) != bytes(model[:4096]):
        raise SystemExit("read after refusals returned wrong data")
    print(f"EXPECT {hashlib.sha256(bytes(model)).hexdigest()}", flush=True)
    check(te.unregister_memory(local), "unregister_memory")


def main(argv):
    if argv[:1] == ["target"] and len(argv) == 3:
        target(int(argv[1]), int(argv[2]))
    elif argv[:1] == ["initiator"] and len(argv) == 5:
        initiator(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
