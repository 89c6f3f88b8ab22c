"""One Mooncake Store client of the test of Mooncake Store over aiv (tests/mooncake_store_over_aiv.rs).

Run in the wheel's virtualenv (tests/support/mooncake_npu.sh) with the directory tests/support/mooncake_over_aiv.sh
prints on LD_LIBRARY_PATH, so that Mooncake's TransferEngine reaches the device through libllm_datadist.so over aiv
and libascendcl.so is the twin runtime. Set up as vLLM-Ascend's KV pool sets up its Mooncake backend (protocol
"ascend", no fabric memory): aclInit and aclrtSetDevice(0) as torch_npu does, one TransferEngine initialized with
("<ip>", "P2PHANDSHAKE", "ascend", ""), then MooncakeDistributedStore().setup("<ip>:<rpc port>", "P2PHANDSHAKE",
global segment size, local buffer size, "ascend", "", master address, engine.get_engine()), and the KV cache (a K and a
V region of device memory from aclrtMalloc, BLOCKS blocks of BLOCK bytes each) registered with the engine's
register_memory. A key's value is the key's block in both regions (batch_put_from_multi_buffers /
batch_get_into_multi_buffers with two buffers per key). The twin runtime's provenance records are on
(cannTwinRecordProvenance), so its counts (cannTwinEvidence version 2) attribute every SQE and doorbell.

  client MASTER_ADDR BLOCKS BLOCK
      prints "READY <segment name>", then serves stdin, one command a line, one answer line each (JSON after the
      word); between the two evidence snapshots of PUT and GET only the store's call runs:

      FILL FIRST COUNT              blocks FIRST.. get random bytes (written with aclrtMemcpy) -> "FILLED"
      ZERO FIRST COUNT              blocks FIRST.. are zeroed (aclrtMemcpy) -> "ZEROED <hash of a zeroed block>"
      PUT PREFIX FIRST COUNT SEG    batch_put_from_multi_buffers of keys PREFIX-<i> from blocks FIRST+i, with
                                    ReplicateConfig preferred_segment SEG -> "PUT {results, evidence, hashes, ms}"
      GET PREFIX FIRST COUNT        batch_get_into_multi_buffers of keys PREFIX-<i> into blocks FIRST+i
                                    -> "GET {results, evidence, hashes, ms}"
      EXIST KEY...                  batch_is_exist -> "EXIST [..]"
      PUTBYTES KEY SIZE SEG         put(KEY, SIZE random bytes) preferring SEG -> "PUTBYTES {code, hash, ms}"
      GETBYTES KEY                  get(KEY) -> "GETBYTES {size, hash, ms}"
      REMOVE KEY                    remove(KEY) -> "REMOVE {code, ms}"
      SNAPSHOT                      -> "EVIDENCE {counts}"
      QUIT                          close() and exit

  A block's hash is the sha256 of its K block followed by its V block, read back with aclrtMemcpy after the second
  snapshot. Exit 0 after QUIT or the end of input.
"""

import ctypes
import hashlib
import json
import os
import sys
import time

import twin_evidence

ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2

GLOBAL_SEGMENT_SIZE = 64 << 20
LOCAL_BUFFER_SIZE = 16 << 20

acl = ctypes.CDLL("libascendcl.so")
acl.aclrtMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
acl.aclrtMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int]
acl.cannTwinRecordProvenance.argtypes = [ctypes.c_uint32]

# cannTwinEvidence version 2 in the layout the library exports (twin_evidence.py): no list of the counts here.
EVIDENCE = twin_evidence.Reader(acl)
COUNTS = EVIDENCE.counts


def check(code, what):
    if code != 0:
        raise SystemExit(f"{what} failed with {code}")


def evidence():
    return EVIDENCE.read()


def delta(before, after):
    out = {name: after[name] - before[name] for name in COUNTS}
    out["provenance_recorded"] = after["provenance_recorded"]
    return out


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


def answer(word, value):
    print(f"{word} {json.dumps(value)}", flush=True)


def client(master, blocks, block):
    check(acl.aclInit(None), "aclInit")
    check(acl.aclrtSetDevice(0), "aclrtSetDevice(0)")
    if acl.cannTwinRecordProvenance(1) != 1:
        raise SystemExit("the twin runtime's provenance records did not turn on")
    from mooncake.engine import TransferEngine
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    engine = TransferEngine()
    check(engine.initialize("127.0.0.1", "P2PHANDSHAKE", "ascend", ""), "TransferEngine.initialize")
    segment = f"127.0.0.1:{engine.get_rpc_port()}"
    store = MooncakeDistributedStore()
    code = store.setup(
        segment, "P2PHANDSHAKE", GLOBAL_SEGMENT_SIZE, LOCAL_BUFFER_SIZE, "ascend", "", master, engine.get_engine()
    )
    check(code, "MooncakeDistributedStore.setup")
    regions = [device_alloc(blocks * block), device_alloc(blocks * block)]
    for region in regions:
        check(engine.register_memory(region, blocks * block), "register_memory")

    def addresses(index):
        return [region + index * block for region in regions]

    def block_hash(index):
        return hashlib.sha256(b"".join(from_device(address, block) for address in addresses(index))).hexdigest()

    def span(words):
        first, count = int(words[0]), int(words[1])
        if first < 0 or count < 1 or first + count > blocks:
            raise ValueError(f"blocks {first}..{first + count} outside 0..{blocks}")
        return first, count

    def preferring(seg):
        config = ReplicateConfig()
        config.replica_num = 1
        config.preferred_segment = seg
        return config

    print(f"READY {segment}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        command, args = words[0], words[1:]
        try:
            if command == "FILL" and len(args) == 2:
                first, count = span(args)
                for index in range(first, first + count):
                    for address in addresses(index):
                        to_device(address, os.urandom(block))
                print("FILLED", flush=True)
            elif command == "ZERO" and len(args) == 2:
                first, count = span(args)
                for index in range(first, first + count):
                    for address in addresses(index):
                        to_device(address, bytes(block))
                answer("ZEROED", hashlib.sha256(bytes(2 * block)).hexdigest())
            elif command in ("PUT", "GET") and len(args) == (4 if command == "PUT" else 3):
                prefix = args[0]
                first, count = span(args[1:3])
                keys = [f"{prefix}-{i}" for i in range(count)]
                buffers = [addresses(first + i) for i in range(count)]
                sizes = [[block, block] for _ in range(count)]
                before = evidence()
                started = time.monotonic()
                if command == "PUT":
                    results = store.batch_put_from_multi_buffers(keys, buffers, sizes, preferring(args[3]))
                else:
                    results = store.batch_get_into_multi_buffers(keys, buffers, sizes)
                ms = (time.monotonic() - started) * 1000
                after = evidence()
                hashes = [block_hash(first + i) for i in range(count)]
                answer(command, {"results": list(results), "evidence": delta(before, after), "hashes": hashes,
                                 "ms": round(ms, 1)})
            elif command == "EXIST" and args:
                answer("EXIST", list(store.batch_is_exist(args)))
            elif command == "PUTBYTES" and len(args) == 3:
                data = os.urandom(int(args[1]))
                started = time.monotonic()
                code = store.put(args[0], data, preferring(args[2]))
                ms = (time.monotonic() - started) * 1000
                answer("PUTBYTES", {"code": code, "hash": hashlib.sha256(data).hexdigest(), "ms": round(ms, 1)})
            elif command == "GETBYTES" and len(args) == 1:
                started = time.monotonic()
                data = store.get(args[0])
                ms = (time.monotonic() - started) * 1000
                answer("GETBYTES", {"size": len(data), "hash": hashlib.sha256(data).hexdigest(), "ms": round(ms, 1)})
            elif command == "REMOVE" and len(args) == 1:
                started = time.monotonic()
                code = store.remove(args[0])
                answer("REMOVE", {"code": code, "ms": round((time.monotonic() - started) * 1000, 1)})
            elif command == "SNAPSHOT" and not args:
                answer("EVIDENCE", evidence())
            elif command == "QUIT":
                break
            else:
                answer("ERROR", f"unknown command or arguments: {line.strip()}")
        except (ValueError, RuntimeError) as error:
            answer("ERROR", f"{command}: {error}")
    check(store.close(), "MooncakeDistributedStore.close")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "client":
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
